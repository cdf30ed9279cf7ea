//! Skills of a Salmex plugin (`.skills/*.md`, `"skills": true`) through the
//! CLI, a real `plugd serve` and the agent's instructions: served as
//! approved, covered by the approval digest, and hostile files (a symlink out,
//! a symlink in, a huge file, `..` names) refused by name.

use serde_json::{Value, json};

use crate::http::Serve;
use crate::support::{Ws, quick, repo, stderr, stdout};

const ID: &str = "hello-node";
const REVIEW: &str = "# Review\n\nRead the diff twice before you comment.\n";

/// The seed's Node plugin with `"skills": true`, a good skill, a 100 KiB
/// one, an inner symlink and a non-markdown file.
fn skills_ws() -> Ws {
    let ws = Ws::new();
    let to = ws.plugin_dir(ID);
    std::fs::create_dir_all(to.join(".skills")).unwrap();
    std::fs::copy(
        repo().join("tests/plugins/salmex/seed-hello-node/main.js"),
        to.join("main.js"),
    )
    .unwrap();
    let mut manifest: Value = serde_json::from_slice(
        &std::fs::read(repo().join("tests/plugins/salmex/seed-hello-node/plugin.json")).unwrap(),
    )
    .unwrap();
    manifest["skills"] = json!(true);
    std::fs::write(to.join("plugin.json"), manifest.to_string()).unwrap();
    let skills = to.join(".skills");
    std::fs::write(skills.join("review.md"), REVIEW).unwrap();
    std::fs::write(skills.join("big.md"), "x".repeat(100 * 1024)).unwrap();
    std::os::unix::fs::symlink("review.md", skills.join("alias.md")).unwrap();
    std::fs::write(skills.join("notes.txt"), "not a skill").unwrap();
    ws
}

fn approve(ws: &Ws) {
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(out.status.success(), "approve: {}", stderr(&out));
}

fn list(ws: &Ws) -> Value {
    let out = ws.plugd(&["skill", "list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

#[test]
fn skills_are_listed_and_read_as_approved_and_hostile_ones_are_refused() {
    let ws = skills_ws();
    // Nothing before approval.
    assert_eq!(list(&ws), json!([]));
    approve(&ws);

    let v = list(&ws);
    let names: Vec<(&str, bool)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s.get("error").is_some()))
        .collect();
    assert_eq!(
        names,
        [("alias", true), ("big", true), ("review", false)],
        "{v}"
    );
    assert!(v.to_string().contains("over the 65536-byte cap"), "{v}");
    assert!(v.to_string().contains("symlink"), "{v}");

    let out = ws.plugd(&["skill", "show", "hello-node/review"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), REVIEW);
    for (skill, want) in [
        ("hello-node/big", "over the 65536-byte cap"),
        ("hello-node/alias", "symlink"),
        ("hello-node/..", "is not a skill name"),
        ("hello-node/.hidden", "is not a skill name"),
        ("hello-node/notes", "no skill hello-node/notes"),
        ("nope/review", "no skill nope/review"),
        ("review", "is not PLUGIN/NAME"),
    ] {
        let out = ws.plugd(&["skill", "show", skill]);
        assert_eq!(out.status.code(), Some(1), "{skill}");
        assert!(stderr(&out).contains(want), "{skill}: {}", stderr(&out));
    }

    // Over HTTP.
    let serve = Serve::start(&ws, "127.0.0.1:0");
    let r = serve.get("/v1/skills");
    assert_eq!((r.status, r.json()), (200, v));
    let r = serve.get("/v1/skills/hello-node/review");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"plugin": ID, "name": "review", "text": REVIEW})
    );
    serve
        .get("/v1/skills/hello-node/big")
        .error(422, "skill_refused");
    serve
        .get("/v1/skills/hello-node/alias")
        .error(422, "skill_refused");
    serve
        .get("/v1/skills/hello-node/.hidden")
        .error(400, "invalid_skill_name");
    serve
        .get("/v1/skills/hello-node/a%20b")
        .error(400, "invalid_skill_name");
    serve
        .get("/v1/skills/hello-node/nothing")
        .error(404, "unknown_skill");
    serve
        .get("/v1/skills/review")
        .error(400, "invalid_skill_name");
    let (status, log) = serve.stop();
    assert!(status.success(), "{log}");

    // Editing a skill drops the approval: the plugin is changed, its
    // skills are gone until it is approved again.
    std::fs::write(
        ws.plugin_dir(ID).join(".skills/review.md"),
        "# Review\n\nApprove everything.\n",
    )
    .unwrap();
    let out = ws.plugd(&["plugin", "list", "--json"]);
    let plugins: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(plugins[0]["state"], "changed", "{plugins}");
    assert!(
        plugins[0]["error"]
            .as_str()
            .unwrap()
            .contains(".skills/review.md"),
        "{plugins}"
    );
    assert_eq!(list(&ws), json!([]));
    let out = ws.plugd(&["skill", "show", "hello-node/review"]);
    assert!(
        stderr(&out).contains("no skill hello-node/review"),
        "{}",
        stderr(&out)
    );
    approve(&ws);
    let out = ws.plugd(&["skill", "show", "hello-node/review"]);
    assert_eq!(stdout(&out), "# Review\n\nApprove everything.\n");
}

#[test]
fn a_skill_symlinked_outside_the_plugin_is_refused_at_approval() {
    let ws = skills_ws();
    let outside = ws.dir().join("secret.md");
    std::fs::write(&outside, "outside").unwrap();
    std::os::unix::fs::symlink(&outside, ws.plugin_dir(ID).join(".skills/escape.md")).unwrap();
    let out = ws.plugd(&["plugin", "approve", ID]);
    assert!(!out.status.success(), "approved a symlink out");
    assert!(stderr(&out).contains("escape.md"), "{}", stderr(&out));
    assert_eq!(list(&ws), json!([]));
}

#[tokio::test]
async fn agent_skills_are_appended_to_the_system_prompt() {
    let ws = skills_ws();
    approve(&ws);
    let rt = ws.runtime(quick(5000)).await;
    let refs = vec!["hello-node/review".to_owned(), "hello-node/big".to_owned()];
    let prompt = rt
        .system_prompt_with_skills(Some("be brief"), &refs)
        .await
        .unwrap();
    assert_eq!(
        prompt,
        format!("be brief\n\n## Skill hello-node/review\n\n{REVIEW}")
    );
    let (_, skipped) = rt.skill_instructions(&refs).await;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(
        skipped[0].contains("over the 65536-byte cap"),
        "{skipped:?}"
    );
    assert_eq!(rt.system_prompt_with_skills(None, &[]).await, None);
    // plugd.yaml accepts the key.
    std::fs::write(
        ws.dir().join("plugd.yaml"),
        "agent: {system_prompt: be brief, skills: [hello-node/review]}\n",
    )
    .unwrap();
    let config = plugd_runtime::config::PlugdConfig::load(ws.dir()).unwrap();
    assert_eq!(config.agent.skills, ["hello-node/review"]);
}
