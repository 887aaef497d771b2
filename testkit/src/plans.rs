//! Plans whose every effect can be counted: each step appends its own line, so a test can
//! check after kills and failovers that every step ran exactly once, in order.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use crate::{Cluster, Worker};

/// A plan of `n` steps, each running the shell `hold` (`sleep 0.4`, a gate's wait) and then
/// appending its own line (with a check that the line is there).
pub fn line_plan(c: &Cluster, n: usize, hold: &str) -> PathBuf {
    let steps: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "run": ["sh", "-c", format!("{hold}; echo line-{i} >> out.txt")],
                "check": ["grep", "-qx", format!("line-{i}"), "out.txt"],
            })
        })
        .collect();
    let path = c.dir.join(format!("plan-{n}.json"));
    std::fs::write(&path, serde_json::json!({ "steps": steps }).to_string()).unwrap();
    path
}

/// Checks that every line of [`line_plan`] is in worker `w`'s workspace of task `id` once
/// and in order, and that the task's log has no gap and every call one outcome; returns
/// how many calls were interrupted.
pub fn assert_exactly_once(c: &Cluster, w: &Worker, id: &str, n: usize) -> usize {
    let num = id.trim_start_matches("t-");
    let out =
        std::fs::read_to_string(w.state.join(format!("workspaces/task-{num}/out.txt"))).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let want: Vec<String> = (0..n).map(|i| format!("line-{i}")).collect();
    assert_eq!(lines, want, "every line exactly once and in order");

    let log = c.task_log_json(id);
    let mut seqs = log.iter().map(|r| crate::json_u64(&r["seq"]).unwrap());
    let first = seqs.next().unwrap();
    assert_eq!(first, 1);
    assert!(
        log.windows(2)
            .all(|p| crate::json_u64(&p[1]["seq"]) == crate::json_u64(&p[0]["seq"]).map(|s| s + 1)),
        "sequence numbers have no gaps"
    );
    // Each call: issued once, then exactly one outcome, and nothing about it before it was issued.
    let mut issued: HashMap<u64, (u64, String)> = HashMap::new();
    let mut outcome: HashSet<u64> = HashSet::new();
    let mut interrupted = 0;
    for r in &log {
        let kind = r["kind"].as_str().unwrap();
        let call = crate::json_u64(&r["call_id"]);
        match kind {
            "tool_call_issued" => {
                let id = call.unwrap();
                assert!(
                    issued
                        .insert(
                            id,
                            (
                                r["step"].as_u64().unwrap(),
                                r["purpose"].as_str().unwrap().into()
                            )
                        )
                        .is_none(),
                    "call {id} issued twice"
                );
            }
            "tool_call_completed" | "tool_call_interrupted" => {
                let id = call.unwrap();
                assert!(
                    issued.contains_key(&id),
                    "outcome of call {id} before it was issued"
                );
                assert!(outcome.insert(id), "call {id} has two outcomes");
                if kind == "tool_call_interrupted" {
                    interrupted += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        issued.len(),
        outcome.len(),
        "every issued call has an outcome"
    );
    let steps_run = issued.values().filter(|(_, p)| p == "step").count();
    assert!(steps_run >= n);
    assert_eq!(log.last().unwrap()["kind"], "finished");
    assert_eq!(log.last().unwrap()["outcome"], "finished");
    interrupted
}
