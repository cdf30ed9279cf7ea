//! Vector memory through `plugd memory vector`: the built-in index and a real
//! backend plugin (Python, `[plugin.extends].memory_backends`), with every
//! typed error of nexo §5.w.

use serde_json::Value;

use crate::support::{Ws, repo, stderr, stdout};

fn vec_cmd(ws: &Ws, args: &[&str]) -> Result<Value, String> {
    let mut all = vec!["memory", "vector"];
    all.extend(args);
    let out = ws.plugd(&all);
    if out.status.success() {
        Ok(serde_json::from_str(&stdout(&out)).unwrap())
    } else {
        Err(stderr(&out))
    }
}

#[test]
fn builtin_backend_upserts_searches_and_deletes() {
    let ws = Ws::new();
    let r = vec_cmd(
        &ws,
        &[
            "upsert",
            "--collection",
            "kb",
            "--records",
            r#"[{"id": "cats", "content": "cats purr", "embedding": [1, 0, 0], "metadata": {"t": "pets"}},
                {"id": "dogs", "content": "dogs bark", "embedding": [0.9, 0.1, 0], "metadata": {"t": "pets"}},
                {"id": "tax", "content": "tax is due", "embedding": [0, 0, 1], "metadata": {"t": "work"}}]"#,
        ],
    )
    .unwrap();
    assert_eq!(r["count"], 3);
    let m = vec_cmd(
        &ws,
        &[
            "search",
            "--collection",
            "kb",
            "--embedding",
            "[1, 0, 0]",
            "--limit",
            "2",
        ],
    )
    .unwrap();
    let ids: Vec<&str> = m
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["cats", "dogs"]);
    assert!(m[0]["score"].as_f64().unwrap() > 0.999);
    assert_eq!(m[0]["content"], "cats purr");
    let m = vec_cmd(
        &ws,
        &[
            "search",
            "--collection",
            "kb",
            "--embedding",
            "[1, 0, 0]",
            "--filter",
            r#"{"t": "work"}"#,
        ],
    )
    .unwrap();
    assert_eq!(m.as_array().unwrap().len(), 1);
    assert_eq!(m[0]["id"], "tax");
    let d = vec_cmd(&ws, &["delete", "--collection", "kb", "cats", "nope"]).unwrap();
    assert_eq!(d["count"], 1);

    // Typed errors, named.
    let e = vec_cmd(
        &ws,
        &["search", "--collection", "nothing", "--embedding", "[1]"],
    )
    .unwrap_err();
    assert!(e.contains("collection \"nothing\" not found"), "{e}");
    let e = vec_cmd(
        &ws,
        &[
            "upsert",
            "--collection",
            "kb",
            "--id",
            "x",
            "--embedding",
            "[1, 2]",
        ],
    )
    .unwrap_err();
    assert!(e.contains("dimension mismatch: expected 3, got 2"), "{e}");
    let e = vec_cmd(
        &ws,
        &["search", "--collection", "kb", "--embedding", "[1, \"a\"]"],
    )
    .unwrap_err();
    assert!(e.contains("--embedding is not valid JSON"), "{e}");
    let e = vec_cmd(
        &ws,
        &[
            "search",
            "--backend",
            "qdrant",
            "--collection",
            "kb",
            "--embedding",
            "[1]",
        ],
    )
    .unwrap_err();
    assert!(
        e.contains("no vector backend \"qdrant\"; the backends here are builtin"),
        "{e}"
    );
}

#[test]
fn a_plugin_backend_serves_the_same_commands_with_typed_errors() {
    let ws = Ws::new();
    let dir = ws.plugin_dir("pyvec");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/broker/pyvec.py"),
        dir.join("main.py"),
    )
    .unwrap();
    std::fs::write(
        dir.join("nexo-plugin.toml"),
        "[plugin]\nid = \"pyvec\"\nversion = \"0.1.0\"\n\n[plugin.entrypoint]\ncommand = \"python3\"\nargs = [\"main.py\"]\n\n[plugin.extends]\nmemory_backends = [\"pyvec\"]\n",
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "approve", "pyvec"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // State lives in the plugin process, so one CLI run does all three.
    let r = vec_cmd(
        &ws,
        &[
            "upsert",
            "--backend",
            "pyvec",
            "--collection",
            "kb",
            "--id",
            "a",
            "--embedding",
            "[1, 0, 0]",
            "--content",
            "alpha",
        ],
    )
    .unwrap();
    assert_eq!(r["count"], 1);
    let m = vec_cmd(
        &ws,
        &[
            "search",
            "--backend",
            "pyvec",
            "--collection",
            "kb",
            "--embedding",
            "[1, 0, 0]",
        ],
    )
    .unwrap();
    // A fresh process: the earlier record is gone, the answer is well formed.
    assert!(m.as_array().is_some(), "{m}");

    let err = |args: &[&str]| vec_cmd(&ws, args).unwrap_err();
    let e = err(&[
        "search",
        "--backend",
        "pyvec",
        "--collection",
        "missing",
        "--embedding",
        "[1, 0, 0]",
    ]);
    assert!(e.contains("collection \"missing\" not found"), "{e}");
    let e = err(&[
        "upsert",
        "--backend",
        "pyvec",
        "--collection",
        "kb",
        "--id",
        "a",
        "--embedding",
        "[1, 0]",
    ]);
    assert!(e.contains("dimension mismatch: expected 3, got 2"), "{e}");
    let e = err(&[
        "search",
        "--backend",
        "pyvec",
        "--collection",
        "busy",
        "--embedding",
        "[1, 0, 0]",
    ]);
    assert!(e.contains("rate limited; retry after 7s"), "{e}");
    let e = err(&[
        "upsert",
        "--backend",
        "pyvec",
        "--collection",
        "readonly",
        "--id",
        "a",
        "--embedding",
        "[1, 0, 0]",
    ]);
    assert!(
        e.contains("write failed: write failed: disk is read-only"),
        "{e}"
    );
    let e = err(&[
        "delete",
        "--backend",
        "pyvec",
        "--collection",
        "nodelete",
        "a",
    ]);
    assert!(
        e.contains("memory.vector_delete is not implemented by the backend"),
        "{e}"
    );
}
