//! API tokens and the audit trail on both backends: one token format,
//! expiry, limits and tenancy, a revoke seen by the other connection at its
//! next request, one live token per name when two create it at once.

use plugd_control::store::StoreError;
use plugd_store::tokens::{Role, Tenancy, TokenRejection};

use super::now_ms;

use super::backends;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_verifies_only_whole_and_live() {
    for be in backends().await {
        let store = &be.a;
        let t = store
            .token_create("ci", Role::Agent, None, "root")
            .await
            .unwrap();
        let (id, secret) = t.token["plugd_".len()..].split_once('_').unwrap();
        assert_eq!((id.len(), secret.len()), (16, 64), "{}", t.token);
        assert_eq!(t.info.id, id);
        assert_eq!(t.info.created_at.len(), 20, "{}", t.info.created_at);
        let ok = store.token_verify(&t.token).await.unwrap().unwrap();
        assert_eq!((ok.name.as_str(), ok.role), ("ci", Role::Agent));
        let mut bad = t.token.clone();
        let last = bad.pop().unwrap();
        bad.push(if last == '0' { '1' } else { '0' });
        for wrong in [bad.as_str(), &t.token[..t.token.len() - 1], "Bearer x", ""] {
            assert_eq!(
                store.token_verify(wrong).await.unwrap(),
                Err(TokenRejection::Invalid),
                "{wrong:?}"
            );
        }
        let revoked = store.token_revoke("ci").await.unwrap().unwrap();
        assert!(revoked.revoked_at.is_some());
        assert!(matches!(
            store.token_verify(&t.token).await.unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
        let again = store.token_revoke(id).await.unwrap().unwrap();
        assert_eq!(again.revoked_at, revoked.revoked_at, "the first time stays");
        // The name is free again once revoked; a live duplicate is refused.
        let second = store
            .token_create("ci", Role::Viewer, None, "root")
            .await
            .unwrap();
        assert!(matches!(
            store.token_create("ci", Role::Viewer, None, "root").await,
            Err(StoreError::Conflict(_))
        ));
        // By name, the live one is revoked and shown.
        let by_name = store.token_revoke("ci").await.unwrap().unwrap();
        assert_eq!(by_name.id, second.info.id);
        assert!(store.token_revoke("nope").await.unwrap().is_none());
        assert_eq!(store.token_list().await.unwrap().len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused_and_a_use_is_stamped() {
    for be in backends().await {
        let store = &be.a;
        let now = now_ms();
        let old = store
            .token_create("old", Role::Admin, Some(now - 1000), "root")
            .await
            .unwrap();
        assert!(matches!(
            store.token_verify(&old.token).await.unwrap(),
            Err(TokenRejection::Expired(_))
        ));
        let fresh = store
            .token_create("new", Role::Admin, Some(now + 60_000), "root")
            .await
            .unwrap();
        let ok = store.token_verify(&fresh.token).await.unwrap().unwrap();
        assert_eq!(
            ok.last_used_at, None,
            "the record as it was before this use"
        );
        let listed = store.token_list().await.unwrap();
        let used = listed.iter().find(|t| t.name == "new").unwrap();
        assert!(used.last_used_at.is_some(), "{used:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_tenancy_round_trip() {
    for be in backends().await {
        let store = &be.a;
        let profiles = vec!["ops".to_owned()];
        let tenancy = Tenancy {
            org_id: "acme".into(),
            project_ids: vec!["web".into()],
        };
        let t = store
            .token_create_scoped(
                "bot",
                Role::Agent,
                None,
                "root",
                Some(&profiles),
                Some(&tenancy),
            )
            .await
            .unwrap();
        let info = store.token_verify(&t.token).await.unwrap().unwrap();
        assert_eq!(info.mcp_profiles, Some(profiles));
        assert_eq!(info.org_id.as_deref(), Some("acme"));
        assert_eq!(info.project_ids, ["web"]);
        assert_eq!(info, t.info);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_on_one_node_is_refused_by_the_other_at_its_next_request() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        let t = a
            .token_create("ci", Role::Agent, None, "root")
            .await
            .unwrap();
        let other = a
            .token_create("other", Role::Agent, None, "root")
            .await
            .unwrap();
        // b's checks are served from its cache under the control epoch.
        for _ in 0..50 {
            assert!(b.token_verify(&t.token).await.unwrap().is_ok());
            assert!(b.token_verify(&other.token).await.unwrap().is_ok());
        }
        a.token_revoke(&t.info.id).await.unwrap();
        // The next request after the recheck interval (one millisecond).
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        assert!(matches!(
            b.token_verify(&t.token).await.unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
        assert!(b.token_verify(&other.token).await.unwrap().is_ok());
        // The node that revoked it refuses it at once, without waiting.
        let u = b
            .token_create("u", Role::Agent, None, "root")
            .await
            .unwrap();
        assert!(b.token_verify(&u.token).await.unwrap().is_ok());
        b.token_revoke("u").await.unwrap();
        assert!(matches!(
            b.token_verify(&u.token).await.unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
        // Many checks racing a revoke on the other node: once the revoke is in
        // and the interval passed, none succeeds.
        let w = a
            .token_create("w", Role::Agent, None, "root")
            .await
            .unwrap();
        let b = b.clone();
        let checks: Vec<_> = (0..8)
            .map(|_| {
                let (b, token) = (b.clone(), w.token.clone());
                tokio::spawn(async move {
                    for _ in 0..50 {
                        let _ = b.token_verify(&token).await.unwrap();
                    }
                })
            })
            .collect();
        a.token_revoke("w").await.unwrap();
        for c in checks {
            c.await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        assert!(matches!(
            b.token_verify(&w.token).await.unwrap(),
            Err(TokenRejection::Revoked(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_creating_one_name_at_once_make_one_live_token() {
    for be in backends().await {
        let (a, b) = (&be.a, &be.b);
        for round in 0..10 {
            let name = format!("n{round}");
            let (x, y) = tokio::join!(
                a.token_create(&name, Role::Viewer, None, "a"),
                b.token_create(&name, Role::Viewer, None, "b"),
            );
            let made = [x.is_ok(), y.is_ok()];
            assert_eq!(made.iter().filter(|m| **m).count(), 1, "round {round}");
            let err = x.err().or(y.err()).unwrap();
            assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_keeps_order_newest_last() {
    for be in backends().await {
        let store = &be.a;
        for (i, path) in ["/a", "/b", "/c"].iter().enumerate() {
            store
                .audit_record("token:ci", Role::Admin, "POST", path, 200 + i as u16)
                .await
                .unwrap();
        }
        let last_two = store.audit_list(2).await.unwrap();
        let paths: Vec<&str> = last_two.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/b", "/c"]);
        assert_eq!(last_two[1].status, 202);
        assert!(last_two[0].seq < last_two[1].seq);
        assert_eq!(last_two[0].at.len(), 20);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_pages_cover_every_entry_once_newest_first_and_filter_alike() {
    use plugd_control::store::tokens::audit_cursor;
    use plugd_control::store::{AuditFilter, StatusMatch};
    for be in backends().await {
        let store = &be.a;
        let name = be.name;
        for i in 0..120u16 {
            let who = if i == 77 { "token:Needle" } else { "token:ci" };
            let method = if i % 4 == 0 { "PATCH" } else { "POST" };
            let status = [200, 201, 403, 404, 500, 502][usize::from(i % 6)];
            store
                .audit_record(who, Role::Agent, method, &format!("/v1/x/{i}"), status)
                .await
                .unwrap();
        }
        let all = |f: AuditFilter| async move {
            let mut f = AuditFilter { limit: 9, ..f };
            let mut out = Vec::new();
            let mut pages = 0;
            loop {
                let page = store.audit_page(&f).await.unwrap();
                pages += 1;
                assert!(page.entries.len() <= 9);
                out.extend(page.entries);
                match page.next_cursor {
                    Some(c) => {
                        f.before_seq =
                            Some(plugd_control::store::tokens::parse_audit_cursor(&c).unwrap())
                    }
                    None => break,
                }
            }
            (out, pages)
        };
        let (every, pages) = all(AuditFilter::default()).await;
        assert_eq!((every.len(), pages), (120, 14), "{name}");
        assert!(
            every.windows(2).all(|w| w[0].seq > w[1].seq),
            "{name}: newest first"
        );
        assert_eq!(every[0].path, "/v1/x/119");
        // One among many, in any case, on both backends alike.
        for f in [
            AuditFilter {
                q: Some("NEEDLE".into()),
                ..AuditFilter::default()
            },
            AuditFilter {
                identity: Some("token:Needle".into()),
                ..AuditFilter::default()
            },
            AuditFilter {
                q: Some("/x/77".into()),
                ..AuditFilter::default()
            },
        ] {
            let (got, _) = all(f.clone()).await;
            assert_eq!(got.len(), 1, "{name}: {f:?}");
            assert_eq!(got[0].path, "/v1/x/77");
        }
        let (patch, _) = all(AuditFilter {
            q: Some("patch".into()),
            ..AuditFilter::default()
        })
        .await;
        assert_eq!(patch.len(), 30, "{name}");
        let (fives, _) = all(AuditFilter {
            status: Some(StatusMatch::Class(5)),
            ..AuditFilter::default()
        })
        .await;
        assert_eq!(fives.len(), 40, "{name}");
        assert!(fives.iter().all(|e| e.status >= 500));
        let (exact, _) = all(AuditFilter {
            status: Some(StatusMatch::Exact(403)),
            ..AuditFilter::default()
        })
        .await;
        assert_eq!(exact.len(), 20, "{name}");
        // The time window compares with the second each entry is stamped.
        let now = now_ms();
        let (recent, _) = all(AuditFilter {
            since_ms: Some(now - 600_000),
            until_ms: Some(now + 600_000),
            ..AuditFilter::default()
        })
        .await;
        assert_eq!(recent.len(), 120, "{name}");
        let (future, _) = all(AuditFilter {
            since_ms: Some(now + 600_000),
            ..AuditFilter::default()
        })
        .await;
        assert!(future.is_empty(), "{name}");
        let (past, _) = all(AuditFilter {
            until_ms: Some(now - 600_000),
            ..AuditFilter::default()
        })
        .await;
        assert!(past.is_empty(), "{name}");
        // A page after a cursor starts strictly after it.
        let after = store
            .audit_page(&AuditFilter {
                before_seq: Some(every[10].seq),
                limit: 1,
                ..AuditFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(after.entries[0].seq, every[11].seq);
        assert_eq!(after.next_cursor, Some(audit_cursor(every[11].seq)));
        // The old listing is unchanged: newest last.
        let last_two = store.audit_list(2).await.unwrap();
        assert_eq!(last_two[1].path, "/v1/x/119", "{name}");
    }
}
