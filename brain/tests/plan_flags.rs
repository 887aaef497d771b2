//! `brain run --plan FILE` and the flags of `brain run`: every flag either applies to the
//! plan's task or is refused with the flag named, never dropped. The egress flags (`--secret`,
//! `--allow`, `--egress`) put a plan's commands behind the egress proxy exactly as an agent
//! task's; checked against the real brain and worker binaries and an HTTPS upstream on
//! loopback. Those tests need a root worker (network namespaces); where there is none they
//! say so.

use std::sync::Arc;
use std::time::Duration;

use testkit::https::{Received, TestCa, Upstream};
use testkit::tasks::{Ran, egress_cluster, have_netns, results, set_api_secret};
use testkit::{Cluster, assert_failed_stderr_says, text};

const SECRET: &str = "sk-plan-0c94d2e7a1b35f68";
const API: &str = "api.plan.test";
const OTHER: &str = "other.plan.test";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes a plan of `steps` (each one `sh -c` command) and gives its path.
fn plan_file(c: &Cluster, name: &str, steps: &[String]) -> String {
    let steps: Vec<serde_json::Value> = steps
        .iter()
        .map(|s| serde_json::json!({"run": ["sh", "-c", s], "timeout": "1m"}))
        .collect();
    let file = c.dir.join(format!("{name}.json"));
    std::fs::write(&file, serde_json::json!({ "steps": steps }).to_string()).unwrap();
    file.display().to_string()
}

#[test]
fn flags_that_do_not_apply_to_a_plan_are_refused_by_name() {
    let c = Cluster::start();
    let w = c.join_worker("plan-refusals");
    let plan = plan_file(&c, "refused", &["true".to_string()]);
    let record = c.dir.join("transcript.jsonl").display().to_string();
    // Each refused flag (with its value), and what the refusal must say about it.
    let cases: Vec<(Vec<&str>, &[&str], &str)> = vec![
        (
            vec!["--model", "openai:gpt-4.1"],
            &["--model"],
            "runs no model",
        ),
        (
            vec!["--permission", "full"],
            &["--permission"],
            "runs no model",
        ),
        (vec!["--record", &record], &["--record"], "runs no model"),
        (vec!["--budget-usd", "1"], &["--budget-usd"], "\"timeout\""),
        (
            vec!["--max-tokens", "1000"],
            &["--max-tokens"],
            "\"timeout\"",
        ),
        (vec!["--max-steps", "3"], &["--max-steps"], "\"timeout\""),
        (vec!["--max-wall", "5m"], &["--max-wall"], "\"timeout\""),
        (vec!["--check", "true"], &["--check"], "last step"),
        (
            vec!["--check-timeout", "1m"],
            &["--check-timeout"],
            "last step",
        ),
        (vec!["--protect", "*.py"], &["--protect"], "last step"),
        (
            vec!["--git", "https://example.invalid/r.git"],
            &["--git"],
            "empty workspace",
        ),
        (
            vec!["--git", "https://example.invalid/r.git", "--git-ref", "v1"],
            &["--git", "--git-ref"],
            "empty workspace",
        ),
        (
            vec!["--git", "https://example.invalid/r.git", "--deliver", "pr"],
            &["--git", "--deliver"],
            "brain task patch",
        ),
        (vec!["--dir", "/tmp"], &["--dir"], "empty workspace"),
        (vec!["--include-git"], &["--include-git"], "empty workspace"),
        (
            vec!["--exclude", "build"],
            &["--exclude"],
            "empty workspace",
        ),
        (
            vec!["--no-default-excludes"],
            &["--no-default-excludes"],
            "empty workspace",
        ),
    ];
    for (flags, named, why) in &cases {
        let mut args = vec!["run", "--plan", &plan, "--worker", &w.id];
        args.extend_from_slice(flags);
        let out = c.brain_cli(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", text(&out));
        assert!(
            err.contains("brain run --plan does not take"),
            "{flags:?}: {err}"
        );
        for flag in *named {
            assert!(
                err.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{flag}:"))),
                "{flags:?} must name {flag}: {err}"
            );
        }
        assert!(err.contains(why), "{flags:?} must say why ({why}): {err}");
        assert!(
            out.stdout.is_empty(),
            "{flags:?}: a refused run prints no task id: {}",
            text(&out)
        );
    }
    // Nothing was started by any of them.
    let tasks = c.brain_cli(&["tasks", "--json"]);
    assert!(tasks.status.success(), "{}", text(&tasks));
    let list: serde_json::Value = serde_json::from_slice(&tasks.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(0), "{list}");

    // The flags that do apply still run the plan.
    let ok = c.brain_cli(&[
        "run",
        "--plan",
        &plan,
        "--worker",
        &w.id,
        "--detach",
        "--goal",
        "a plan",
        "--require-label",
        "k=v",
    ]);
    // The worker has no label k=v: the brain refuses to place it (the label applied).
    assert_failed_stderr_says(&ok, "k=v");
    let ok = c.brain_cli(&["run", "--plan", &plan, "--worker", &w.id, "--detach"]);
    assert!(ok.status.success(), "{}", text(&ok));
    let task = String::from_utf8_lossy(&ok.stdout).trim().to_string();
    c.wait_status(&task, &["finished"], Duration::from_secs(60));
}

/// Runs a plan with `flags` on `worker`, waits for it to end, and gives its end status, each
/// command's result in order and its whole log.
fn run_plan(
    c: &Cluster,
    worker: &str,
    name: &str,
    flags: &[&str],
    steps: &[String],
) -> (String, Vec<Ran>, Vec<serde_json::Value>) {
    let plan = plan_file(c, name, steps);
    let mut args = vec!["run", "--plan", &plan, "--worker", worker];
    args.extend_from_slice(flags);
    let out = c.brain_cli(&args);
    assert!(out.status.success(), "brain run: {}", text(&out));
    let task = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let end = c.wait_status(
        &task,
        &["finished", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    let log = c.task_log_json(&task);
    (end, results(c, &task), log)
}

#[test]
fn a_plan_with_egress_none_cannot_reach_the_network() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    let api = Upstream::answering(&ca, &[API], "reached").unwrap();
    let c = egress_cluster(&ca, &[API, OTHER], "");
    let w = c.join_worker("plan-egress-none");
    let pa = api.port;
    let curl = "curl -sS --connect-timeout 5 --max-time 20";
    let steps = vec![
        // Around the proxy, straight to the upstream on loopback.
        format!("{curl} --noproxy '*' -k https://127.0.0.1:{pa}/direct; echo \" rc=$?\""),
        // Through the proxy, to a host no rule allows.
        format!("{curl} https://{API}:{pa}/proxied; echo \" rc=$?\""),
    ];
    let (end, ran, log) = run_plan(&c, &w.id, "none", &["--egress", "none"], &steps);
    assert_eq!(end, "finished", "{}", c.brain_log());
    assert_eq!(ran.len(), 2, "{ran:#?}");
    for (i, r) in ran.iter().enumerate() {
        assert!(!r.stdout.contains("reached"), "step {i}: {r:#?}");
        assert!(!r.stdout.contains(" rc=0"), "step {i}: {r:#?}");
    }
    assert!(api.seen().is_empty(), "the upstream saw a request");
    assert!(
        log.iter()
            .any(|e| e["kind"] == "egress_refused" && e["host"] == API),
        "the proxy's refusal is in the plan's log: {log:#?}"
    );
}

#[test]
fn a_plan_uses_its_secret_and_allow_list_through_the_proxy() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    let api = Upstream::start(
        &ca,
        &[API],
        Arc::new(|r: &Received| {
            if r.header("authorization") == Some(&format!("Bearer {SECRET}")) {
                (200, b"granted".to_vec())
            } else {
                (401, b"no".to_vec())
            }
        }),
    )
    .unwrap();
    let other = Upstream::answering(&ca, &[OTHER], "other says hi").unwrap();
    let c = egress_cluster(&ca, &[API, OTHER], "");
    let w = c.join_worker("plan-egress");
    set_api_secret(&c, SECRET, API, api.port);

    let (pa, pb) = (api.port, other.port);
    let curl = "curl -sS --connect-timeout 5 --max-time 20";
    let steps = vec![
        // The placeholder in the environment, the value put in on the way out.
        format!(
            "printf 'env=%s ' \"$API_TOKEN\"; {curl} -H \"Authorization: Bearer $API_TOKEN\" https://{API}:{pa}/ok"
        ),
        // On the allow-list (GET only, so seen through the brain, which resolves the name).
        format!("{curl} https://{OTHER}:{pb}/get"),
        // Off it.
        format!("{curl} https://off.plan.test:{pa}/; echo \" rc=$?\""),
    ];
    let allow = format!("{OTHER}:{pb} GET");
    let (end, ran, log) = run_plan(
        &c,
        &w.id,
        "secret",
        &["--secret", "api", "--allow", &allow],
        &steps,
    );
    assert_eq!(end, "finished", "{ran:#?}\n{}", c.brain_log());
    assert_eq!(ran.len(), 3, "{ran:#?}");
    assert!(
        ran[0].stdout.starts_with("env=tether-secret:api:") && ran[0].stdout.ends_with("granted"),
        "{:#?}",
        ran[0]
    );
    assert!(!ran[0].stdout.contains(SECRET), "{:#?}", ran[0]);
    assert_eq!(ran[1].stdout, "other says hi", "{:#?}", ran[1]);
    assert!(
        !ran[2].stdout.contains(" rc=0"),
        "off the allow-list: {:#?}",
        ran[2]
    );
    assert!(
        log.iter()
            .any(|e| e["kind"] == "egress_refused" && e["host"] == "off.plan.test"),
        "{log:#?}"
    );
}
