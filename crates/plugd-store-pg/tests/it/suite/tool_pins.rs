//! Pinned tool definitions on both backends: first pins hold, revocation
//! and re-approval clear them, the withheld list replaces itself, both are
//! bounded, and two nodes pinning at once keep one set.

use std::collections::BTreeMap;

use plugd_control::store::tool_pins::{
    MAX_PINNED_TOOLS, MAX_WITHHELD_TOOLS, PinnedTool, WithheldReason, WithheldTool,
};
use plugd_store::Approval;
use serde_json::json;

use super::backends;

fn approval(id: &str, digest: &str, at: &str) -> Approval {
    Approval {
        plugin_id: id.into(),
        digest: digest.into(),
        approved_by: "ana".into(),
        approved_at: at.into(),
        catalog: json!([]),
    }
}

fn pins(defs: &[(&str, &str)]) -> BTreeMap<String, PinnedTool> {
    defs.iter()
        .map(|(n, d)| {
            (
                (*n).to_owned(),
                PinnedTool {
                    sha256: format!("sha256:{d}"),
                    definition: Some(json!({"description": d})),
                },
            )
        })
        .collect()
}

fn withheld(name: &str) -> WithheldTool {
    WithheldTool {
        name: name.into(),
        reason: WithheldReason::Changed,
        sha256: "sha256:new".into(),
        pinned_sha256: Some("sha256:old".into()),
        diff: "- a\n+ b".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_pins_hold_until_the_approval_changes() {
    for be in backends().await {
        let s = &be.a;
        let t1 = "2026-01-01T00:00:00Z";
        // No approval: nothing is pinned.
        assert_eq!(
            s.pin_tools("p", "sha256:1", &pins(&[("a", "1")]))
                .await
                .unwrap(),
            None,
            "{}",
            be.name
        );
        s.approve(&approval("p", "sha256:1", t1)).await.unwrap();
        // Another digest than the approval's: refused.
        assert_eq!(
            s.pin_tools("p", "sha256:0", &pins(&[("a", "1")]))
                .await
                .unwrap(),
            None
        );
        let first = s
            .pin_tools("p", "sha256:1", &pins(&[("a", "1"), ("b", "1")]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first.tools, pins(&[("a", "1"), ("b", "1")]), "{}", be.name);
        // A later write adds only what is new; a pin is never replaced.
        let later = s
            .pin_tools("p", "sha256:1", &pins(&[("a", "2"), ("c", "2")]))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(later.tools, pins(&[("a", "1"), ("b", "1"), ("c", "2")]));
        // The withheld list replaces itself, and needs the pins' digest.
        assert!(
            s.set_withheld_tools("p", "sha256:1", &[withheld("a")])
                .await
                .unwrap()
        );
        assert!(
            !s.set_withheld_tools("p", "sha256:0", &[withheld("b")])
                .await
                .unwrap()
        );
        let read = be.b.tool_pins("p").await.unwrap().unwrap();
        assert_eq!(read.withheld, vec![withheld("a")], "{}", be.name);
        assert_eq!(read.digest, "sha256:1");
        // The catalog cache is not an approval: the pins stay.
        assert!(
            s.update_catalog("p", "sha256:1", &json!([1]))
                .await
                .unwrap()
        );
        assert!(s.tool_pins("p").await.unwrap().is_some(), "{}", be.name);
        // Re-approval, even of the same content, clears them.
        s.approve(&approval("p", "sha256:1", "2026-01-01T00:00:01Z"))
            .await
            .unwrap();
        assert_eq!(s.tool_pins("p").await.unwrap(), None, "{}", be.name);
        s.pin_tools("p", "sha256:1", &pins(&[("a", "2")]))
            .await
            .unwrap();
        assert_eq!(
            s.tool_pins("p").await.unwrap().unwrap().tools,
            pins(&[("a", "2")])
        );
        // So does a revocation.
        assert!(s.revoke("p").await.unwrap());
        assert_eq!(s.tool_pins("p").await.unwrap(), None, "{}", be.name);
        // And a rolled-back approval.
        let a = approval("p", "sha256:1", t1);
        s.approve_clearing_failure(&a).await.unwrap();
        s.pin_tools("p", "sha256:1", &pins(&[("a", "1")]))
            .await
            .unwrap();
        assert!(s.revoke_exact(&a).await.unwrap());
        assert_eq!(s.tool_pins("p").await.unwrap(), None, "{}", be.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_tools_stays_bounded() {
    for be in backends().await {
        let s = &be.a;
        s.approve(&approval("f", "sha256:1", "2026-01-01T00:00:00Z"))
            .await
            .unwrap();
        for round in 0..3 {
            let add: BTreeMap<String, PinnedTool> = (0..MAX_PINNED_TOOLS)
                .map(|i| {
                    (
                        format!("r{round}_t{i:05}"),
                        PinnedTool {
                            sha256: format!("sha256:{i}"),
                            definition: Some(json!({"description": "x".repeat(4000)})),
                        },
                    )
                })
                .collect();
            let stored = s.pin_tools("f", "sha256:1", &add).await.unwrap().unwrap();
            assert_eq!(stored.tools.len(), MAX_PINNED_TOOLS, "{}", be.name);
        }
        let many: Vec<WithheldTool> = (0..MAX_WITHHELD_TOOLS * 4)
            .map(|i| withheld(&format!("w{i}")))
            .collect();
        s.set_withheld_tools("f", "sha256:1", &many).await.unwrap();
        let read = s.tool_pins("f").await.unwrap().unwrap();
        assert_eq!(read.withheld.len(), MAX_WITHHELD_TOOLS, "{}", be.name);
        assert_eq!(read.tools.len(), MAX_PINNED_TOOLS);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_pinning_one_first_catalog_keep_one_set() {
    for be in backends().await {
        be.a.approve(&approval("r", "sha256:1", "2026-01-01T00:00:00Z"))
            .await
            .unwrap();
        let (pa, pb) = (pins(&[("t", "a")]), pins(&[("t", "b")]));
        let (x, y) = tokio::join!(
            be.a.pin_tools("r", "sha256:1", &pa),
            be.b.pin_tools("r", "sha256:1", &pb),
        );
        let (x, y) = (x.unwrap().unwrap(), y.unwrap().unwrap());
        let stored = be.a.tool_pins("r").await.unwrap().unwrap();
        assert_eq!(stored.tools.len(), 1, "{}", be.name);
        // Whoever came second was answered with the first one's pin.
        assert!(x.tools == stored.tools || y.tools == stored.tools);
        assert_eq!(
            [&x, &y].iter().filter(|p| p.tools != stored.tools).count(),
            0,
            "{}: both answers name the stored pin",
            be.name
        );
    }
}
