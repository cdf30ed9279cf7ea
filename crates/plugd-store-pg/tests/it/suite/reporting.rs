//! Events written in the transaction of the state they report, on both backends: a run's end with its `run.completed`, a compaction's derived chain with its `chain.compacted`; when the event cannot be written, the state change is not either.

use plugd_control::chains::{BlockKind, NewBlock, Run, RunPatch, RunStatus};
use plugd_control::store::outbox::{NewEvent, Subscriber};
use serde_json::json;

use super::backends;
use super::chains::{compaction, run};

fn subscribers() -> Vec<Subscriber> {
    vec![Subscriber {
        plugin_id: "acme/hooks".into(),
        export_id: "on_event".into(),
    }]
}

fn completed(run: &Run) -> NewEvent {
    NewEvent {
        event_type: "run.completed".into(),
        subject: json!({"kind": "run", "id": run.id}),
        summary: json!({"status": run.status.as_str()}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_with_its_event_or_not_at_all() {
    for be in backends().await {
        let (name, store) = (be.name, &be.a);
        store.session_open("s", None, None).await.unwrap();
        store.run_create(&run("r1", "s", None)).await.unwrap();
        store.run_create(&run("r2", "s", None)).await.unwrap();
        let ok = RunPatch {
            status: Some(RunStatus::Succeeded),
            summary: Some(json!({"text": "done"})),
            ..RunPatch::default()
        };
        let (ended, queued) = store
            .run_finish("r1", &ok, &completed, &subscribers())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ended.status, RunStatus::Succeeded, "{name}");
        assert_eq!(queued.deliveries.len(), 1, "{name}");
        let events = store.outbox_events("run.completed").await.unwrap();
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        assert_eq!(events[0]["subject"]["id"], "r1", "{name}");
        assert_eq!(
            events[0]["summary"]["status"], "succeeded",
            "{name}: the event saw the run as it ended"
        );

        // An event that cannot be written (its type is not a name): the
        // run does not end either.
        let bad = |run: &Run| NewEvent {
            event_type: "Not A Name".into(),
            subject: json!({"id": run.id}),
            summary: json!({}),
        };
        assert!(
            store
                .run_finish("r2", &ok, &bad, &subscribers())
                .await
                .is_err(),
            "{name}"
        );
        let r2 = store.run("r2").await.unwrap().unwrap();
        assert_eq!(
            r2.status,
            RunStatus::Running,
            "{name}: the run ended without its event"
        );
        assert!(r2.ended_at.is_none(), "{name}");
        assert_eq!(
            store.outbox_events("run.completed").await.unwrap().len(),
            1,
            "{name}"
        );
        // No such run: nothing, no event.
        assert!(
            store
                .run_finish("nope", &ok, &completed, &subscribers())
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
        assert_eq!(
            store.outbox_events("run.completed").await.unwrap().len(),
            1,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_derives_its_chain_with_its_event_or_not_at_all() {
    for be in backends().await {
        let (name, store) = (be.name, &be.a);
        let (s, _) = store.session_open("s1", None, None).await.unwrap();
        let head = s.head_chain_id.unwrap();
        store
            .chain_append(&head, &[NewBlock::text(BlockKind::Input, "hello")], "t")
            .await
            .unwrap();
        let bad = |_: &plugd_control::chains::Chain| NewEvent {
            event_type: "".into(),
            subject: json!({}),
            summary: json!({}),
        };
        let seed = [NewBlock::text(BlockKind::System, "seed")];
        assert!(
            store
                .chain_derive_reporting(
                    &head,
                    &seed,
                    &compaction("s1", &head, 0),
                    &bad,
                    &subscribers()
                )
                .await
                .is_err(),
            "{name}"
        );
        let info = store.session_info("s1").await.unwrap().unwrap();
        assert_eq!(
            info.head_chain_id.as_deref(),
            Some(head.as_str()),
            "{name}: the chain was derived without its event"
        );
        assert!(
            store
                .outbox_events("chain.compacted")
                .await
                .unwrap()
                .is_empty(),
            "{name}"
        );

        let report = |chain: &plugd_control::chains::Chain| NewEvent {
            event_type: "chain.compacted".into(),
            subject: json!({"kind": "chain", "id": chain.id}),
            summary: json!({"source_chain_id": chain.parent_chain_id}),
        };
        let (derived, queued) = store
            .chain_derive_reporting(
                &head,
                &seed,
                &compaction("s1", &head, 1),
                &report,
                &subscribers(),
            )
            .await
            .unwrap();
        assert_eq!(queued.deliveries.len(), 1, "{name}");
        let events = store.outbox_events("chain.compacted").await.unwrap();
        assert_eq!(events.len(), 1, "{name}");
        assert_eq!(events[0]["subject"]["id"], json!(derived.id), "{name}");
        assert_eq!(
            events[0]["summary"]["source_chain_id"],
            json!(head),
            "{name}"
        );
        let info = store.session_info("s1").await.unwrap().unwrap();
        assert_eq!(
            info.head_chain_id.as_deref(),
            Some(derived.id.as_str()),
            "{name}"
        );
    }
}
