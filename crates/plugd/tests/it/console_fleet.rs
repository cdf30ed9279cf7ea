//! The console for an operator with a fleet (issue 30), in a real headless
//! Chromium against a real `plugd serve`: 300 plugins (Salmex manifests,
//! never started) and 10,000 invocation records written to the workspace's
//! store before serve starts, beside the approved Salmex fixture whose real
//! calls the overview must count. Search finds one plugin and one record
//! within a second of the last key; the URL holds the view; pages reach the
//! last one; bulk approval names what it allows; tokens are created and
//! revoked from the page; the audit trail lists it.

use std::time::Duration;

use plugd_control::invocations::InvocationRecord;
use serde_json::json;

use crate::console::{Console, FIXTURE, invoke, workspace};
use crate::http::{Serve, make_token, request_as};
use crate::support::{Ws, eventually_blocking, repo};

/// Plugins beside the fixture.
const PLUGINS: usize = 300;
/// Records written before serve starts.
const RECORDS: usize = 10_000;
/// The one record a search must find among them.
const NEEDLE: &str = "token:needle-finder";
/// Its trace id.
const NEEDLE_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn fleet_id(i: usize) -> String {
    format!("fleet-{i:03}")
}

/// The fixture's workspace plus 300 Salmex plugins, each the Bash example
/// `hello-salmex-bash` under another name (none runs until approved).
fn fleet() -> Ws {
    let ws = workspace(true);
    // Trace ids link to a trace viewer.
    let yaml = ws.dir().join("plugd.yaml");
    let mut text = std::fs::read_to_string(&yaml).unwrap_or_default();
    text.push_str("\nconsole:\n  trace_url: https://traces.example/trace/{trace_id}\n");
    std::fs::write(&yaml, text).unwrap();
    let main = std::fs::read(repo().join("examples/workspace/.plugins/hello-salmex-bash/main.sh"))
        .unwrap();
    for i in 1..=PLUGINS {
        let id = fleet_id(i);
        let dir = ws.plugin_dir(&id);
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = json!({
            "name": id,
            "version": format!("1.{}.0", i % 7),
            "description": format!("Fleet plugin number {i}"),
            "protocolVersion": "1.0",
            "interpreter": "bash",
            "main": "main.sh",
            "capabilities": {"tools": [{
                "name": "say_hello",
                "description": "Greet someone by name",
                "risk_level": if i % 50 == 0 { "high" } else { "low" },
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
            }]}
        });
        std::fs::write(dir.join("plugin.json"), manifest.to_string()).unwrap();
        std::fs::write(dir.join("main.sh"), &main).unwrap();
    }
    ws
}

/// 10,000 records spread over the two days before the last hour (so the
/// overview's last 15 minutes hold only the test's own calls), one of them
/// by [`NEEDLE`]; every 10th failed.
async fn seed_records(ws: &Ws) -> (String, String) {
    let store = ws.state().await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let span = 48 * 3600 * 1000i64;
    let base = now - 3600 * 1000 - span;
    let mut batch = Vec::with_capacity(1000);
    let (mut needle, mut oldest) = (String::new(), String::new());
    for n in 0..RECORDS {
        let ms = base + (n as i64) * span / RECORDS as i64;
        let plugin = fleet_id(n % PLUGINS + 1);
        let failed = n % 10 == 3;
        let id = format!("inv_seed{n:05}");
        let caller = if n == 7_777 {
            needle = id.clone();
            NEEDLE.to_owned()
        } else {
            format!("token:bot-{}", n % 13)
        };
        if n == 0 {
            oldest = id.clone();
        }
        let at = time_of;
        let r: InvocationRecord = serde_json::from_value(json!({
            "invocation_id": id,
            "export_kind": "tool",
            "export_id": "ping",
            "tool": format!("{plugin}/ping"),
            "plugin_id": plugin,
            "dialect": "salmex",
            "binding_id": null, "package_id": null, "package_version": null,
            "execution_class": null,
            "started_at": at(ms),
            "ended_at": at(ms + 4),
            "started_ms": ms,
            "duration_ms": 4 + (n % 30) as u64,
            "status": if failed { "failed" } else { "succeeded" },
            "retry_count": 0,
            "error_code": if failed { Some("tool_failed") } else { None },
            "caller": caller,
            "org_id": null, "project_id": null, "session_id": null, "chain_id": null,
            "run_id": null, "trace_id": if n == 7_777 { Some(NEEDLE_TRACE) } else { None }, "execution_id": null,
            "surface": "http"
        }))
        .unwrap();
        batch.push(r);
        if batch.len() == 1000 {
            store.append_invocations(&batch).await.unwrap();
            batch.clear();
        }
    }
    (needle, oldest)
}

/// `ms` since the epoch as RFC 3339 UTC with milliseconds.
fn time_of(ms: i64) -> String {
    plugd_control::invocations::rfc3339_ms(ms)
}

/// The ids of the rows of `table` on the page now.
async fn row_keys(con: &Console<'_>, table: &str, key: &str) -> Vec<String> {
    let v = con
        .b
        .js(
            &format!(
                "return [...document.querySelectorAll('table#{table} tbody tr[data-{key}]')].map(r => r.dataset.{key});"
            ),
            vec![],
        )
        .await;
    serde_json::from_value(v).unwrap_or_default()
}

/// Types `text` into the search box `css`, then measures in the page how
/// long after the last key the table `table` held exactly the rows `want`.
async fn search_ms(
    con: &Console<'_>,
    css: &str,
    text: &str,
    table: &str,
    key: &str,
    want: &[&str],
) -> f64 {
    let b = &con.b;
    // The page notes the last key's time; the test reads when the rows came.
    b.js(
        "window.__lastKey = 0;\
         document.querySelector(arguments[0]).addEventListener('input', () => { window.__lastKey = performance.now(); });",
        vec![json!(css)],
    )
    .await;
    b.type_into(css, text).await;
    let want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
    b.wait_for(&format!("{table} showing {want:?}"), || async {
            let v = b
                .js(
                    &format!(
                        "const ids = [...document.querySelectorAll('table#{table} tbody tr[data-{key}]')].map(r => r.dataset.{key});\
                         return [ids, performance.now() - window.__lastKey];"
                    ),
                    vec![],
                )
                .await;
            let ids: Vec<String> = serde_json::from_value(v[0].clone()).unwrap_or_default();
            (ids == want).then(|| v[1].as_f64().unwrap_or(f64::MAX))
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_finds_pages_and_governs_a_fleet_of_300_plugins_and_10000_records() {
    let ws = fleet();
    let (needle, oldest) = seed_records(&ws).await;
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let agent = make_token(&ws, "agent");
    // Real calls for the overview: five of the fixture's tool, one refused.
    let shout = format!("{FIXTURE}/shout");
    for i in 0..4 {
        let (s, v) = invoke(
            &serve,
            &agent,
            &shout,
            json!({"word": format!("w{i}"), "times": 1}),
        );
        assert_eq!(s, 200, "{v}");
    }
    let (s, v) = invoke(&serve, &agent, &shout, json!({"times": 1}));
    assert_eq!(s, 422, "{v}");

    let con = Console::open(&serve).await;
    let b = &con.b;
    con.login(&serve.token, "admin").await;

    // ---- plugins: 301 listed by pages of 50; the search finds one.
    con.route("#/plugins").await;
    let status = b
        .wait_text(".list-status", |t| t.contains("301 matches"))
        .await;
    assert!(status.contains("showing 1–50"), "{status}");
    assert_eq!(row_keys(&con, "plugins", "plugin").await.len(), 50);
    let ms = search_ms(
        &con,
        "#plugins-q",
        "fleet-137",
        "plugins",
        "plugin",
        &["fleet-137"],
    )
    .await;
    assert!(
        ms < 1000.0,
        "one plugin of 301 found {ms:.0} ms after the last key"
    );
    // The URL holds the view: opened afresh, the same search and row.
    let url = b.c.current_url().await.unwrap();
    assert_eq!(url.fragment(), Some("/plugins?q=fleet-137"), "{url}");
    b.goto(url.as_str()).await;
    b.wait_for("the shared view", || async {
        (row_keys(&con, "plugins", "plugin").await == ["fleet-137"]).then_some(())
    })
    .await;
    let typed = b
        .js("return document.querySelector('#plugins-q').value;", vec![])
        .await;
    assert_eq!(typed, "fleet-137");
    // Sorted by id descending from the column's header.
    con.route("#/plugins").await;
    b.wait_for("the first page again", || async {
        (row_keys(&con, "plugins", "plugin").await.len() == 50).then_some(())
    })
    .await;
    // The header says how it sorts now and what a click does.
    let sort = b
        .find("table#plugins thead th[aria-sort=ascending] button.sort")
        .await;
    assert_eq!(
        sort.attr("aria-label").await.unwrap().as_deref(),
        Some("Sort by Plugin, descending")
    );
    sort.click().await.unwrap();
    b.wait_for("fleet-300 first", || async {
        (row_keys(&con, "plugins", "plugin")
            .await
            .first()
            .map(String::as_str)
            == Some("fleet-300"))
        .then_some(())
    })
    .await;
    assert!(
        b.c.current_url()
            .await
            .unwrap()
            .as_str()
            .contains("sort=-id")
    );
    // Pages to the last one: every plugin once.
    let mut seen = std::collections::BTreeSet::new();
    let mut pages = 1;
    loop {
        for id in row_keys(&con, "plugins", "plugin").await {
            assert!(seen.insert(id.clone()), "{id} on two pages");
        }
        if !b.has_button(".list nav.pager", "Next").await {
            break;
        }
        let first = row_keys(&con, "plugins", "plugin").await[0].clone();
        b.click_button(".list nav.pager", "Next").await;
        b.wait_for("the next page", || async {
            let rows = row_keys(&con, "plugins", "plugin").await;
            (!rows.is_empty() && rows[0] != first).then_some(())
        })
        .await;
        pages += 1;
        assert!(pages <= 7, "more pages than 301 rows need");
    }
    assert_eq!((seen.len(), pages), (PLUGINS + 1, 7));
    assert!(b.has_button(".list nav.pager", "Previous").await);
    b.click_button(".list nav.pager", "First").await;
    b.wait_for("the first page", || async {
        (row_keys(&con, "plugins", "plugin")
            .await
            .first()
            .map(String::as_str)
            == Some("fleet-300"))
        .then_some(())
    })
    .await;
    con.screenshots("plugins").await;

    // ---- bulk approval: the confirmation names each plugin's risky settings.
    con.route("#/plugins?q=fleet-00").await;
    b.wait_for("nine fleet plugins", || async {
        (row_keys(&con, "plugins", "plugin").await.len() == 9).then_some(())
    })
    .await;
    for id in ["fleet-001", "fleet-002", "fleet-003"] {
        b.find(&format!("tr[data-plugin={id}] td.pick input")).await;
        b.js(
            "document.querySelector(`tr[data-plugin=${arguments[0]}] td.pick input`).click();",
            vec![json!(id)],
        )
        .await;
    }
    b.wait_text(".bulk .count", |t| t == "3 selected").await;
    b.click_button(".bulk", "Approve…").await;
    let confirm = b
        .wait_text("#bulk-confirm", |t| {
            t.contains("Approve 3 plugins?") && t.contains("fleet-003")
        })
        .await;
    assert!(
        confirm.contains("bash main.sh") || confirm.contains("main.sh"),
        "{confirm}"
    );
    let risky = b
        .js(
            "return document.querySelectorAll('#bulk-confirm li[data-plugin] ul.risky li').length;",
            vec![],
        )
        .await;
    let sandboxed = serve.get("/v1/plugins/fleet-001").json()["permissions"]["mechanism"].clone();
    if sandboxed.is_null() || sandboxed == "none" {
        assert!(confirm.contains("No sandbox"), "{confirm}");
        assert!(risky.as_u64().unwrap_or(0) >= 3, "{risky}");
    }
    con.screenshots_at("bulk-approve", Some(".bulk")).await;
    b.click_button("#bulk-confirm", "Confirm: approve 3").await;
    b.wait_text("#toast", |t| t.contains("3 of 3 done")).await;
    let approved = serve.get("/v1/plugins?approved=true&limit=500").json();
    let mut ids: Vec<&str> = approved["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, [FIXTURE, "fleet-001", "fleet-002", "fleet-003"]);
    // And revoked together.
    con.route("#/plugins?approved=true&q=fleet").await;
    b.wait_for("the three approved", || async {
        (row_keys(&con, "plugins", "plugin").await.len() == 3).then_some(())
    })
    .await;
    // Clicked in the page in one step: a live redraw may replace the
    // table between finding a box and clicking it (the selection itself
    // outlives redraws).
    b.js(
        "document.querySelector('table#plugins thead th.pick input').click();",
        vec![],
    )
    .await;
    b.wait_text(".bulk .count", |t| t == "3 selected").await;
    b.click_button(".bulk", "Revoke…").await;
    b.click_button("#bulk-confirm", "Confirm: revoke 3").await;
    assert!(
        eventually_blocking(Duration::from_secs(10), || {
            serve.get("/v1/plugins?approved=true&limit=500").json()["total"] == 1
        }),
        "revoked"
    );

    // ---- activity: one record of 10,005 by search; filters; last page.
    con.route("#/activity").await;
    b.wait_for("a page of records", || async {
        (row_keys(&con, "invocations", "invocation").await.len() == 50).then_some(())
    })
    .await;
    let ms = search_ms(
        &con,
        "#invocations-q",
        "needle-finder",
        "invocations",
        "invocation",
        &[needle.as_str()],
    )
    .await;
    assert!(
        ms < 1000.0,
        "one record of 10,005 found {ms:.0} ms after the last key"
    );
    // Opened: its trace id links to the trace viewer plugd.yaml names.
    b.find(&format!("tr[data-invocation={needle}] a"))
        .await
        .click()
        .await
        .unwrap();
    let link = b
        .wait_for("the trace link", || async {
            b.js(
                "const a = document.querySelector('a#trace-link'); return a && a.href;",
                vec![],
            )
            .await
            .as_str()
            .map(str::to_owned)
        })
        .await;
    assert_eq!(link, format!("https://traces.example/trace/{NEEDLE_TRACE}"));
    // Status and a time range with time of day.
    let since = time_of(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - 600_000,
    );
    con.route(&format!("#/activity?status=failed&since={since}"))
        .await;
    let refused = b
        .wait_for("the one refused call of the last 10 minutes", || async {
            let rows = row_keys(&con, "invocations", "invocation").await;
            (rows.len() == 1).then(|| rows[0].clone())
        })
        .await;
    assert!(!refused.starts_with("inv_seed"), "{refused}");
    let shown = b
        .js(
            "return document.querySelector('#flt-invocations-since').value;",
            vec![],
        )
        .await;
    assert!(
        shown.as_str().is_some_and(|s| s.contains('T')),
        "since with a time of day: {shown}"
    );
    // Oldest first, 500 a page: the last page holds the newest.
    con.route("#/activity?sort=started&limit=500").await;
    b.wait_for("the oldest record first", || async {
        (row_keys(&con, "invocations", "invocation").await.first() == Some(&oldest)).then_some(())
    })
    .await;
    let mut total = 0;
    let mut pages = 0;
    loop {
        let rows = row_keys(&con, "invocations", "invocation").await;
        total += rows.len();
        pages += 1;
        if !b.has_button(".list nav.pager", "Next").await {
            break;
        }
        let first = rows[0].clone();
        b.click_button(".list nav.pager", "Next").await;
        b.wait_for("the next page of records", || async {
            let rows = row_keys(&con, "invocations", "invocation").await;
            (!rows.is_empty() && rows[0] != first).then_some(())
        })
        .await;
        assert!(pages <= 21, "more pages than the records need");
    }
    assert_eq!((total, pages), (RECORDS + 5, 21));
    con.route("#/activity").await;
    b.wait_for("records", || async {
        (!row_keys(&con, "invocations", "invocation").await.is_empty()).then_some(())
    })
    .await;
    con.screenshots("activity").await;

    // ---- overview: the test's five calls, one of them refused.
    con.route("#/trends?window=15m").await;
    let calls = b.wait_text("#tile-calls .n", |t| t == "5").await;
    assert_eq!(calls, "5");
    assert_eq!(b.text_of("#tile-errors .n").await.as_deref(), Some("1"));
    let row = b
        .js(
            "const r = document.querySelector(`table#stats-tools tr[data-key='${arguments[0]}']`);\
             return r && [...r.querySelectorAll('td')].map(td => td.textContent);",
            vec![json!(shout)],
        )
        .await;
    assert_eq!(row[0], "5", "{row}");
    assert_eq!(row[1], "1", "{row}");
    let bars = b
        .js(
            "return document.querySelectorAll('svg.chart rect.bar').length;",
            vec![],
        )
        .await;
    assert!(bars.as_u64().unwrap_or(0) >= 1, "{bars}");
    con.screenshots("overview").await;

    // ---- tokens: made on the page, shown once, works, revoked, refused.
    con.route("#/tokens").await;
    b.type_into("#tok-name", "from-console").await;
    b.find("#tok-role")
        .await
        .select_by_value("viewer")
        .await
        .unwrap();
    b.click_button("form#token-create", "Create token").await;
    let secret = b
        .wait_text("#token-value", |t| t.starts_with("plugd_"))
        .await;
    let secret = secret.trim().to_owned();
    let r = request_as(&serve, &secret, "GET", "/v1/plugins", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    con.screenshots("tokens").await;
    b.click_button("#token-secret", "Hide").await;
    b.wait_for("the new token listed", || async {
        row_keys(&con, "tokens", "token")
            .await
            .contains(&"from-console".to_owned())
            .then_some(())
    })
    .await;
    assert!(
        !b.body_text().await.contains(&secret),
        "the secret stays on the page"
    );
    b.click_button("tr[data-token=from-console]", "Revoke…")
        .await;
    b.click_button("tr[data-token=from-console]", "Confirm revoke")
        .await;
    b.wait_text("tr[data-token=from-console] td.token-state", |t| {
        t.starts_with("revoked")
    })
    .await;
    let r = request_as(&serve, &secret, "GET", "/v1/plugins", &[], None);
    assert_eq!(r.status, 401, "{}", r.text());

    // ---- sessions: none yet, said so, no error.
    con.route("#/sessions").await;
    let none = b.wait_text("main", |t| t.contains("No session yet.")).await;
    assert!(none.contains("No run yet."), "{none}");

    // ---- audit: the token's creation and revocation, by the admin.
    con.route("#/audit?q=tokens").await;
    let audit = b
        .wait_text("table#audit tbody", |t| {
            t.contains("POST /v1/tokens") && t.contains(":revoke")
        })
        .await;
    assert!(!audit.contains(&secret), "{audit}");
    con.screenshots("audit").await;
    assert_eq!(b.stray_text().await, Vec::<String>::new());
    con.close().await;
}
