//! `brain config reload` and SIGHUP: a changed config applies without a restart where it can
//! ([llm], [agent]: tasks that start from then on), a change elsewhere is named as needing
//! one, and an invalid file changes nothing. Real brain and worker processes; a fake model
//! server records the key each request carries.

use std::time::Duration;

use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::{BrainOptions, Cluster, stdout, text};

const T: Duration = Duration::from_secs(30);

fn config(llm: &FakeLlm, key: &str, extra: &str) -> String {
    format!(
        "[llm.providers.openai]\nbase_url = \"{}\"\napi_key = \"{key}\"\n{extra}",
        llm.url()
    )
}

#[test]
fn a_reload_applies_the_llm_and_agent_sections_names_the_rest_and_refuses_a_bad_file() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("echo $HOME"),
        FakeReply::finish("done"),
    ]);
    let old_key = "sk-before-reload-0001";
    let new_key = "sk-after-reload-0002";
    let c = Cluster::start_with(BrainOptions {
        config: Some(config(&llm, old_key, "")),
        ..BrainOptions::default()
    });
    let _w = c.join_worker("laptop");
    let file = c.data.join("config.toml");

    // Nothing changed: said so.
    let out = c.brain_cli(&["config", "reload"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stdout(&out).contains("nothing changed"), "{}", text(&out));

    // An invalid file: refused with the reason, exit 78, and the brain goes on as it was.
    std::fs::write(&file, "[llm\nbroken").unwrap();
    let out = c.brain_cli(&["config", "reload"]);
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(text(&out).contains("nothing was changed"), "{}", text(&out));

    // A new key, a new default permission, and a web setting: the first two apply, the
    // last needs a restart.
    std::fs::write(
        &file,
        config(
            &llm,
            new_key,
            "[agent]\npermission = \"full\"\n[web]\nmax_connections = 7\n",
        ),
    )
    .unwrap();
    let out = c.brain_cli(&["config", "reload", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["applied"], serde_json::json!(["llm", "agent"]), "{r}");
    assert_eq!(r["need_restart"], serde_json::json!(["web"]), "{r}");

    // A task started now asks the model with the new key, and runs under the new default
    // permission (full: its command is not held for an approval).
    let id = c
        .agent()
        .permission("")
        .worker("laptop")
        .start("say where home is");
    c.wait_status(&id, &["finished", "waiting"], T);
    let log = c.brain_cli(&["task", "log", &id, "--json"]);
    let log = String::from_utf8_lossy(&log.stdout).into_owned();
    assert!(
        !log.contains("approval_requested"),
        "the reloaded default permission (full) did not apply:\n{log}"
    );
    let reqs = llm.requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {new_key}").as_str())
        );
    }
    // The new key is masked like the old one: the brain's log and the task's do not hold it.
    assert!(!c.brain_log().contains(new_key));
    assert!(!log.contains(new_key));
}

#[test]
fn sighup_reloads_the_config() {
    let llm = FakeLlm::script(vec![FakeReply::finish("done")]);
    let c = Cluster::start_with(BrainOptions {
        config: Some(config(&llm, "sk-hangup-0001", "")),
        ..BrainOptions::default()
    });
    let _w = c.join_worker("laptop");
    std::fs::write(
        c.data.join("config.toml"),
        config(&llm, "sk-hangup-0002", ""),
    )
    .unwrap();
    let pid = c.brain.as_ref().expect("the brain").child.id();
    testkit::signal(pid, rustix::process::Signal::HUP);
    assert!(
        testkit::wait_until(T, || c.brain_log().contains("config reloaded")),
        "the brain did not reload on SIGHUP:\n{}",
        c.brain_log()
    );
    let id = c.agent().worker("laptop").start("nothing");
    c.wait_status(&id, &["finished"], T);
    assert_eq!(
        llm.requests()[0].header("authorization"),
        Some("Bearer sk-hangup-0002")
    );
}
