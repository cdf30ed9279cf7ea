//! The API a console needs for a large fleet, through the router: tokens,
//! the audit trail, invocation search, order and statistics, and the paged
//! lists served from memory (issue 30).

use plugd_control::invocations::{InvocationRecord, TerminalStatus, rfc3339_ms};
use plugd_store::tokens::{Role, Tenancy};

use super::*;

/// A request as `token` over TCP.
fn as_token(req: Request<Body>, token: &str) -> Request<Body> {
    over_tcp(req, Some(token))
}

/// A workspace, its router and a second connection to its state database.
async fn fleet() -> (tempfile::TempDir, Router, plugd_store::Store) {
    let (tmp, app) = app("", DEFAULT_BODY_LIMIT).await;
    let store = plugd_store::Store::open(&tmp.path().join(".plugd")).unwrap();
    (tmp, app, store)
}

/// Record `inv_NNNNN` of `plugin`/`tool`, started at `ms`, `dur` ms long.
fn record(n: usize, ms: i64, plugin: &str, dur: u64, ok: bool, org: &str) -> InvocationRecord {
    let status = if ok {
        TerminalStatus::Succeeded
    } else {
        TerminalStatus::Failed
    };
    let mut r: InvocationRecord = serde_json::from_value(json!({
        "invocation_id": format!("inv_{n:05}"), "export_kind": "tool", "export_id": "t",
        "tool": format!("{plugin}/t"), "plugin_id": plugin, "dialect": "native",
        "started_at": rfc3339_ms(ms), "ended_at": rfc3339_ms(ms + dur as i64),
        "started_ms": ms, "duration_ms": dur, "status": status, "retry_count": 0
    }))
    .unwrap();
    r.caller = Some(format!("token:c{}", n % 10));
    r.error_code = (!ok).then(|| "tool_failed".to_owned());
    r.org_id = Some(org.to_owned());
    r
}

#[tokio::test]
async fn tokens_are_the_admins_made_once_shown_once_and_revoked() {
    let (_tmp, app, store) = fleet().await;
    let admin = store
        .token_create("a", Role::Admin, None, "t")
        .unwrap()
        .token;
    let viewer = store
        .token_create("v", Role::Viewer, None, "t")
        .unwrap()
        .token;
    let operator = store
        .token_create("o", Role::Operator, None, "t")
        .unwrap()
        .token;
    let tenant = Tenancy {
        org_id: "org_a".into(),
        project_ids: vec![],
    };
    let org_admin = store
        .token_create_scoped("oa", Role::Admin, None, "t", None, Some(&tenant))
        .unwrap()
        .token;
    // Only an admin lists or makes tokens or reads the audit trail.
    for tok in [&viewer, &operator] {
        for req in [
            get("/v1/tokens"),
            get("/v1/audit"),
            post_json("/v1/tokens", json!({"name": "x", "role": "viewer"})),
            post_json("/v1/tokens/a:revoke", json!({})),
        ] {
            let what = format!("{} {}", req.method(), req.uri());
            let got = call(&app, as_token(req, tok)).await;
            assert_error(&got, StatusCode::FORBIDDEN, "forbidden");
            assert!(
                got.1["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("needs the admin role"),
                "{what}: {}",
                got.1
            );
        }
    }
    // An org token, admin or not, finds no such routes.
    let got = call(&app, as_token(get("/v1/tokens"), &org_admin)).await;
    assert_error(&got, StatusCode::NOT_FOUND, "not_found");
    let got = call(&app, as_token(get("/v1/audit"), &org_admin)).await;
    assert_error(&got, StatusCode::NOT_FOUND, "not_found");

    // Refusals name the field.
    for (body, field) in [
        (json!({"role": "viewer"}), "name"),
        (json!({"name": "", "role": "viewer"}), "name"),
        (json!({"name": "x\ny", "role": "viewer"}), "name"),
        (json!({"name": "x"}), "role"),
        (json!({"name": "x", "role": "root"}), "role"),
        (
            json!({"name": "x", "role": "agent", "expires_in": "5y"}),
            "expires_in",
        ),
        (
            json!({"name": "x", "role": "agent", "expires_in": "0h"}),
            "expires_in",
        ),
        (
            json!({"name": "x", "role": "agent", "org": "no way"}),
            "org",
        ),
        (
            json!({"name": "x", "role": "agent", "projects": ["p"]}),
            "projects",
        ),
    ] {
        let got = call(
            &app,
            as_token(post_json("/v1/tokens", body.clone()), &admin),
        )
        .await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
        assert_eq!(
            got.1["error"]["details"]["field"], field,
            "{body}: {}",
            got.1
        );
    }
    let got = call(
        &app,
        as_token(
            post_json(
                "/v1/tokens",
                json!({"name": "x", "role": "agent", "by": "eve"}),
            ),
            &admin,
        ),
    )
    .await;
    assert_error(&got, StatusCode::UNPROCESSABLE_ENTITY, "invalid_body");

    // Made: 201 with the secret, once.
    let (s, made) = call(
        &app,
        as_token(
            post_json(
                "/v1/tokens",
                json!({"name": "ci bot", "role": "agent", "expires_in": "30d"}),
            ),
            &admin,
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{made}");
    let mut keys: Vec<&str> = made
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(keys, ["expires_at", "id", "name", "role", "token"]);
    assert_eq!(
        (made["name"].clone(), made["role"].clone()),
        (json!("ci bot"), json!("agent"))
    );
    let expires = made["expires_at"].as_str().unwrap();
    let in_30d = plugd_store::outbox::now_ms() + 30 * 86_400_000;
    let at = plugd_control::invocations::parse_rfc3339_ms(expires).unwrap();
    assert!((in_30d - at).abs() < 60_000, "{expires}");
    let secret = made["token"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    // It authenticates, as the agent it is.
    let (s, _) = call(&app, as_token(get("/v1/plugins"), &secret)).await;
    assert_eq!(s, StatusCode::OK);
    let got = call(&app, as_token(get("/v1/tokens"), &secret)).await;
    assert_error(&got, StatusCode::FORBIDDEN, "forbidden");
    // A second live token of that name is a conflict.
    let got = call(
        &app,
        as_token(
            post_json("/v1/tokens", json!({"name": "ci bot", "role": "viewer"})),
            &admin,
        ),
    )
    .await;
    assert_error(&got, StatusCode::CONFLICT, "token_exists");
    // An org token made over HTTP is bound to its org.
    let (s, org_tok) = call(
        &app,
        as_token(
            post_json(
                "/v1/tokens",
                json!({"name": "tenant", "role": "viewer", "org": "org_b", "projects": ["p1"]}),
            ),
            &admin,
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{org_tok}");
    assert_eq!(org_tok["expires_at"], Value::Null);

    // Listed, without secrets, made by the caller.
    let (s, list) = call(&app, as_token(get("/v1/tokens"), &admin)).await;
    assert_eq!(s, StatusCode::OK);
    let text = list.to_string();
    assert!(
        !text.contains(&secret[secret.len() - 64..]),
        "a secret listed: {text}"
    );
    assert!(!text.contains("plugd_"), "{text}");
    let ours = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.as_str())
        .unwrap();
    assert_eq!(ours["created_by"], "token:a");
    assert_eq!(ours["revoked_at"], Value::Null);
    let tenant_row = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "tenant")
        .unwrap();
    assert_eq!(
        (
            tenant_row["org_id"].clone(),
            tenant_row["project_ids"].clone()
        ),
        (json!("org_b"), json!(["p1"]))
    );

    // Revoked by name (percent-encoded space) or id: it stops working.
    let (s, revoked) = call(
        &app,
        as_token(post_json("/v1/tokens/ci%20bot:revoke", json!({})), &admin),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["id"], id.as_str());
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    let (s, v) = call(&app, as_token(get("/v1/plugins"), &secret)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let got = call(
        &app,
        as_token(post_json("/v1/tokens/nope:revoke", json!({})), &admin),
    )
    .await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_token");
    let got = call(
        &app,
        as_token(
            post_json(&format!("/v1/tokens/{id}:frobnicate"), json!({})),
            &admin,
        ),
    )
    .await;
    assert_error(&got, StatusCode::NOT_FOUND, "not_found");

    // The audit trail has the writes, never the secret nor the reads.
    let mut entries = Vec::new();
    for _ in 0..200 {
        let (s, page) = call(&app, as_token(get("/v1/audit?limit=500"), &admin)).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        entries = page["entries"].as_array().unwrap().clone();
        if entries
            .iter()
            .any(|e| e["path"] == "/v1/tokens/ci%20bot:revoke")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let text = Value::Array(entries.clone()).to_string();
    assert!(
        entries
            .iter()
            .any(|e| e["path"] == "/v1/tokens" && e["identity"] == "token:a" && e["status"] == 201),
        "{text}"
    );
    assert!(!text.contains(&secret[secret.len() - 64..]), "{text}");
    assert!(!text.contains("\"GET\""), "reads audited: {text}");
}

#[tokio::test]
async fn the_audit_trail_pages_newest_first_and_filters() {
    let (_tmp, app, store) = fleet().await;
    let admin = store
        .token_create("a", Role::Admin, None, "t")
        .unwrap()
        .token;
    let viewer = store
        .token_create("v", Role::Viewer, None, "t")
        .unwrap()
        .token;
    for i in 0..300u16 {
        let who = if i == 217 { "token:needle" } else { "token:ci" };
        let status = [200, 201, 404, 409, 503][usize::from(i % 5)];
        store
            .audit_record(who, Role::Agent, "POST", &format!("/v1/x/{i}"), status)
            .unwrap();
    }
    let got = call(&app, as_token(get("/v1/audit"), &viewer)).await;
    assert_error(&got, StatusCode::FORBIDDEN, "forbidden");
    // Every entry once, newest first, the last page exactly once.
    let mut seqs = Vec::new();
    let mut url = "/v1/audit?limit=7".to_owned();
    let mut pages = 0;
    loop {
        let (s, page) = call(&app, as_token(get(&url), &admin)).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        pages += 1;
        seqs.extend(
            page["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["seq"].as_i64().unwrap()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => url = format!("/v1/audit?limit=7&cursor={c}"),
            None => break,
        }
    }
    assert_eq!((seqs.len(), pages), (300, 300_usize.div_ceil(7)));
    assert!(seqs.windows(2).all(|w| w[0] > w[1]), "newest first");
    // One among many: by identity, by q (any case), by status.
    let (_, page) = call(
        &app,
        as_token(get("/v1/audit?identity=token%3Aneedle"), &admin),
    )
    .await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["entries"][0]["path"], "/v1/x/217");
    let (_, page) = call(&app, as_token(get("/v1/audit?q=NEEDLE"), &admin)).await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1, "{page}");
    let (_, page) = call(
        &app,
        as_token(get("/v1/audit?q=/v1/x/21&limit=500"), &admin),
    )
    .await;
    // /v1/x/21 and /v1/x/210..219.
    assert_eq!(page["entries"].as_array().unwrap().len(), 11, "{page}");
    let (_, page) = call(
        &app,
        as_token(get("/v1/audit?status=4xx&limit=500"), &admin),
    )
    .await;
    let got = page["entries"].as_array().unwrap();
    assert_eq!(got.len(), 120);
    assert!(
        got.iter()
            .all(|e| [404, 409].contains(&e["status"].as_u64().unwrap()))
    );
    let (_, page) = call(
        &app,
        as_token(get("/v1/audit?status=503&limit=500"), &admin),
    )
    .await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 60);
    let (_, page) = call(
        &app,
        as_token(get("/v1/audit?since=2999-01-01T00:00:00Z"), &admin),
    )
    .await;
    assert_eq!(page["entries"], json!([]));
    let (_, page) = call(
        &app,
        as_token(get("/v1/audit?until=2999-01-01T00:00:00Z&limit=1"), &admin),
    )
    .await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1);
    for bad in [
        "cursor=zz",
        "cursor=a",
        "status=2xy",
        "limit=0",
        "since=never",
        "who=1",
    ] {
        let got = call(&app, as_token(get(&format!("/v1/audit?{bad}")), &admin)).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
    }
}

#[tokio::test]
async fn ten_thousand_records_are_searched_ordered_and_paged_both_ways() {
    let (_tmp, app, store) = fleet().await;
    let viewer = store
        .token_create("v", Role::Viewer, None, "t")
        .unwrap()
        .token;
    let base = 1_700_000_000_000;
    let batch: Vec<InvocationRecord> = (0..10_000)
        .map(|n| {
            let mut r = record(
                n,
                base + (n as i64 / 3),
                ["alpha", "beta"][n % 2],
                10,
                n % 50 != 0,
                "org_a",
            );
            if n == 4242 {
                r.caller = Some("cli:needle".into());
                r.error_code = Some("quota_BURST".into());
            }
            r
        })
        .collect();
    for chunk in batch.chunks(1000) {
        store.append_invocations(chunk).unwrap();
    }
    let list = |q: String| {
        let app = app.clone();
        let viewer = viewer.clone();
        async move {
            call(
                &app,
                as_token(get(&format!("/v1/invocations?{q}")), &viewer),
            )
            .await
        }
    };
    // q and caller find the one record, in any case.
    for q in ["q=NEEDLE", "q=burst", "caller=cli%3Aneedle", "q=inv_04242"] {
        let (s, page) = list(q.to_owned()).await;
        assert_eq!(s, StatusCode::OK, "{page}");
        let ids: Vec<&Value> = page["invocations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["invocation_id"])
            .collect();
        assert_eq!(ids, [&json!("inv_04242")], "{q}");
    }
    let (_, page) = list("caller=cli%3ANEEDLE".into()).await;
    assert_eq!(page["invocations"], json!([]), "caller is exact");
    let (_, page) = list("q=tool_failed&plugin=alpha&limit=500".into()).await;
    assert_eq!(page["invocations"].as_array().unwrap().len(), 200);
    // Every record once in each order, the last page exactly once.
    for (order, newest_first) in [("asc", false), ("desc", true), ("", true)] {
        let mut keys: Vec<(i64, String)> = Vec::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut q = format!("limit=500&order={order}");
            if order.is_empty() {
                q = "limit=500".into();
            }
            if let Some(c) = &cursor {
                q.push_str(&format!("&cursor={c}"));
            }
            let (s, page) = list(q).await;
            assert_eq!(s, StatusCode::OK);
            pages += 1;
            keys.extend(page["invocations"].as_array().unwrap().iter().map(|r| {
                (
                    r["started_ms"].as_i64().unwrap(),
                    r["invocation_id"].as_str().unwrap().to_owned(),
                )
            }));
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
        }
        assert_eq!((keys.len(), pages), (10_000, 20), "order {order:?}");
        let mut sorted = keys.clone();
        sorted.sort();
        if newest_first {
            sorted.reverse();
        }
        assert_eq!(keys, sorted, "order {order:?}");
    }
    for bad in ["order=up", "nope=1", "q=a&q=b", "cursor=zz"] {
        let got = list(bad.into()).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
    }
}

#[tokio::test]
async fn stats_count_the_window_per_bucket_plugin_and_tool_within_the_callers_org() {
    let (_tmp, app, store) = fleet().await;
    let viewer = store
        .token_create("v", Role::Viewer, None, "t")
        .unwrap()
        .token;
    let org_a = store
        .token_create_scoped(
            "ta",
            Role::Viewer,
            None,
            "t",
            None,
            Some(&Tenancy {
                org_id: "org_a".into(),
                project_ids: vec![],
            }),
        )
        .unwrap()
        .token;
    let now = plugd_store::outbox::now_ms();
    // In the last hour: 120 calls of org_a's plugin a (every 4th failed,
    // 1..=120 ms) and 30 of org_b's plugin b; an hour and a half ago, 50 more.
    let mut batch: Vec<InvocationRecord> = (0..120)
        .map(|n| {
            record(
                n,
                now - 3_000_000 + n as i64 * 1000,
                "a",
                n as u64 + 1,
                n % 4 != 0,
                "org_a",
            )
        })
        .collect();
    batch.extend((120..150).map(|n| record(n, now - 600_000, "b", 7, true, "org_b")));
    batch.extend((150..200).map(|n| record(n, now - 5_400_000, "a", 1, true, "org_a")));
    store.append_invocations(&batch).unwrap();
    let stats = |q: &str, tok: &str| {
        let app = app.clone();
        let req = as_token(get(&format!("/v1/invocations/stats{q}")), tok);
        async move { call(&app, req).await }
    };
    let (s, all) = stats("", &viewer).await;
    assert_eq!(s, StatusCode::OK, "{all}");
    assert_eq!(
        (all["scanned"].clone(), all["truncated"].clone()),
        (json!(150), json!(false))
    );
    assert_eq!(
        (
            all["bucket_ms"].clone(),
            all["series"].as_array().unwrap().len()
        ),
        (json!(60_000), 60)
    );
    let calls: u64 = all["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["calls"].as_u64().unwrap())
        .sum();
    let errors: u64 = all["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["errors"].as_u64().unwrap())
        .sum();
    assert_eq!((calls, errors), (150, 30));
    assert_eq!(
        all["plugins"][0],
        json!({"plugin": "a", "calls": 120, "errors": 30, "p50_ms": 60, "p99_ms": 119})
    );
    assert_eq!(all["plugins"][1]["plugin"], "b");
    assert_eq!(all["tools"][0]["tool"], "a/t");
    // An org token counts its org's records only.
    let (s, mine) = stats("", &org_a).await;
    assert_eq!(s, StatusCode::OK, "{mine}");
    assert_eq!(mine["scanned"], 120);
    assert_eq!(mine["plugins"].as_array().unwrap().len(), 1);
    assert!(!mine.to_string().contains("\"b\""), "{mine}");
    // A plugin, a wider window with fewer buckets.
    let since = rfc3339_ms(now - 3 * 3_600_000);
    let (_, wide) = stats(&format!("?since={since}&buckets=3&plugin=a"), &viewer).await;
    assert_eq!(
        (
            wide["scanned"].clone(),
            wide["series"].as_array().unwrap().len()
        ),
        (json!(170), 3)
    );
    assert_eq!(wide["series"][1]["calls"], 50);
    // Not a record id; bad queries are 400.
    for bad in [
        "?buckets=0",
        "?buckets=201",
        "?since=x",
        "?order=asc",
        "?since=2030-01-02&until=2030-01-01",
    ] {
        let got = stats(bad, &viewer).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
    }
    let got = call(&app, as_token(get("/v1/invocations/inv_nope"), &viewer)).await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_invocation");
}

#[tokio::test]
async fn lists_from_memory_keep_their_bare_shape_unless_paged() {
    let (_tmp, app, store) = fleet().await;
    let now = plugd_store::outbox::now_ms();
    for i in 0..30 {
        store
            .call_approval_request(&plugd_store::tool_state::NewCallApproval {
                tool: format!("p{}/t{i:02}", i % 3),
                plugin_id: format!("p{}", i % 3),
                risk: if i % 10 == 7 { "critical" } else { "high" }.into(),
                args_preview: if i == 13 {
                    "{\"q\":\"NeedleArg\"}".into()
                } else {
                    "{}".into()
                },
                expires_at_ms: now + 60_000,
                ..Default::default()
            })
            .unwrap();
    }
    // Bare: arrays, as before.
    for path in [
        "/v1/plugins",
        "/v1/tools",
        "/v1/tools?all=true",
        "/v1/approvals",
        "/v1/plugin-packages",
        "/v1/plugin-bindings",
        "/v1/plugin-bindings?status=active",
    ] {
        let (s, v) = call(&app, get(path)).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        assert!(v.is_array(), "{path}: {v}");
    }
    assert_eq!(
        call(&app, get("/v1/approvals"))
            .await
            .1
            .as_array()
            .unwrap()
            .len(),
        30
    );
    // Paged: {items, next_cursor, total}.
    for path in [
        "/v1/plugins?limit=5",
        "/v1/tools?all=true&sort=-name",
        "/v1/tools?enabled=false",
        "/v1/plugin-packages?org=org_a",
        "/v1/plugin-bindings?q=x",
        "/v1/plugin-bindings?status=active&org=o",
    ] {
        let (s, v) = call(&app, get(path)).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        assert_eq!(
            (
                v["items"].clone(),
                v["total"].clone(),
                v["next_cursor"].clone()
            ),
            (json!([]), json!(0), Value::Null),
            "{path}"
        );
    }
    // Approvals: pages cover every row once; q and filters find one.
    let mut ids = Vec::new();
    let mut url = "/v1/approvals?limit=4&sort=-requested_at".to_owned();
    loop {
        let (s, v) = call(&app, get(&url)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["total"], 30);
        ids.extend(
            v["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["id"].as_str().unwrap().to_owned()),
        );
        match v["next_cursor"].as_str() {
            Some(c) => url = format!("/v1/approvals?limit=4&sort=-requested_at&cursor={c}"),
            None => break,
        }
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((ids.len(), unique.len()), (30, 30));
    let (_, v) = call(&app, get("/v1/approvals?q=needlearg")).await;
    assert_eq!(
        (v["total"].clone(), v["items"][0]["tool"].clone()),
        (json!(1), json!("p1/t13"))
    );
    let (_, v) = call(&app, get("/v1/approvals?risk=critical&plugin=p1")).await;
    // i in {7, 17, 27} are critical; of those, i % 3 == 1: 7.
    assert_eq!(
        (v["total"].clone(), v["items"][0]["tool"].clone()),
        (json!(1), json!("p1/t07"))
    );
    // A tampered cursor, a foreign one, unknown sort keys and parameters: 400.
    let (_, first) = call(&app, get("/v1/approvals?limit=4&risk=high")).await;
    let c = first["next_cursor"].as_str().unwrap().to_owned();
    let mut tampered = c.clone().into_bytes();
    tampered[3] = if tampered[3] == b'f' { b'e' } else { b'f' };
    let tampered = String::from_utf8(tampered).unwrap();
    for bad in [
        format!("/v1/approvals?limit=4&risk=high&cursor={tampered}"),
        format!("/v1/approvals?limit=4&cursor={c}"),
        "/v1/approvals?sort=color".to_owned(),
        "/v1/plugins?sort=-nope".to_owned(),
        "/v1/plugins?approved=maybe".to_owned(),
        "/v1/plugins?limit=501".to_owned(),
        "/v1/tools?colour=red".to_owned(),
        "/v1/plugin-bindings?status=active&bogus=1".to_owned(),
        "/v1/plugin-packages?state=x".to_owned(),
    ] {
        let got = call(&app, get(&bad)).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (s, _) = call(
        &app,
        get(&format!("/v1/approvals?limit=4&risk=high&cursor={c}")),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
}
