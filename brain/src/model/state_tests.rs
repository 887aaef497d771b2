//! The tests of `apply`: the state a log rebuilds.

use super::*;
use crate::model::event::{RECORD_VERSION, ToolResult};

fn rec(seq: u64, event: Event) -> Record {
    Record {
        v: RECORD_VERSION,
        task: TaskId(1),
        seq,
        at_ms: seq as i64,
        event,
    }
}

fn issued(seq: u64, call_id: u64, step: u32, purpose: Purpose) -> Record {
    rec(
        seq,
        Event::ToolCallIssued {
            call_id,
            step,
            purpose,
            worker: "w".into(),
            call: ToolCall::RunCommand {
                argv: vec!["true".into()],
                timeout_ms: 1,
                cwd: String::new(),
            },
        },
    )
}

fn interrupted(seq: u64, call_id: u64, reason: &str) -> Record {
    rec(
        seq,
        Event::ToolCallInterrupted {
            call_id,
            reason: reason.into(),
        },
    )
}

fn done(seq: u64, call_id: u64, code: i32) -> Record {
    rec(
        seq,
        Event::ToolCallCompleted {
            call_id,
            result: ToolResult {
                exit_code: Some(code),
                ..Default::default()
            },
        },
    )
}

#[test]
fn a_delivery_is_rebuilt_from_its_records_and_a_failure_before_its_start_ends_it() {
    use crate::model::delivery::Mode;
    let mut st = TaskState::new(TaskId(1));
    let seeded = Event::WorkspaceSeeded {
        root_hash: "r0".into(),
        source: "https://example.com/o/r.git".into(),
        files: 1,
        bytes: 1,
        commit: "c".repeat(40),
        branch: "main".into(),
    };
    for (i, e) in [seeded, Event::DeliveryPlanned { mode: Mode::Pr }]
        .into_iter()
        .enumerate()
    {
        apply(&mut st, &rec(i as u64 + 1, e));
    }
    assert_eq!(st.origin.as_ref().unwrap().branch, "main");
    assert_eq!(st.deliver, Mode::Pr);
    let mut started = st.clone();
    for (i, e) in [
        Event::DeliveryStarted {
            mode: Mode::Pr,
            wip: false,
            branch: "tether/t-1".into(),
            root: "r1".into(),
            commit: "d".repeat(40),
            date_s: 7,
        },
        Event::DeliveryPushed {
            branch: "tether/t-1".into(),
            commit: "d".repeat(40),
        },
    ]
    .into_iter()
    .enumerate()
    {
        apply(&mut started, &rec(i as u64 + 3, e));
    }
    let d = started.delivery.clone().unwrap();
    assert!(d.pushed && !d.done && d.pr_url.is_empty());
    assert!(
        d.describe().contains("pull request pending"),
        "{}",
        d.describe()
    );
    apply(
        &mut started,
        &rec(
            5,
            Event::PullRequestOpened {
                url: "https://example.com/o/r/pull/1".into(),
                number: 1,
            },
        ),
    );
    apply(
        &mut started,
        &rec(
            6,
            Event::Delivered {
                branch: "tether/t-1".into(),
            },
        ),
    );
    assert!(started.delivery.as_ref().unwrap().delivered());
    apply(
        &mut st,
        &rec(
            3,
            Event::DeliveryFailed {
                reason: "no objects".into(),
            },
        ),
    );
    let d = st.delivery.unwrap();
    assert!(d.done && !d.delivered());
    assert_eq!(d.describe(), "failed: no objects");
}

#[test]
fn steps_advance_on_success_and_interruptions_need_a_check() {
    let mut st = TaskState::new(TaskId(1));
    for r in [
        issued(1, 10, 0, Purpose::Step),
        done(2, 10, 0),
        issued(3, 11, 1, Purpose::Step),
        interrupted(4, 11, "x"),
    ] {
        apply(&mut st, &r);
    }
    assert_eq!(st.next_step, 1);
    assert_eq!(st.unsure_step, Some(1));
    assert!(st.pending.is_none());
    // The check fails: the step has to run again.
    apply(&mut st, &issued(5, 12, 1, Purpose::Check));
    apply(&mut st, &done(6, 12, 1));
    assert_eq!((st.next_step, st.unsure_step), (1, None));
    // This time it is interrupted again, and the check passes.
    apply(&mut st, &issued(7, 13, 1, Purpose::Step));
    apply(&mut st, &interrupted(8, 13, "x"));
    apply(&mut st, &issued(9, 14, 1, Purpose::Check));
    apply(&mut st, &done(10, 14, 0));
    assert_eq!((st.next_step, st.unsure_step), (2, None));
    assert_eq!((st.calls_completed, st.calls_interrupted), (3, 2));
}

#[test]
fn replay_is_deterministic_and_ignores_overlap() {
    let log: Vec<Record> = (0..50u64)
        .flat_map(|i| {
            [
                issued(2 * i + 1, 100 + i, i as u32, Purpose::Step),
                done(2 * i + 2, 100 + i, 0),
            ]
        })
        .collect();
    let mut a = TaskState::new(TaskId(1));
    log.iter().for_each(|r| apply(&mut a, r));
    // From a snapshot taken half-way, replaying an overlapping tail.
    let mut b = TaskState::new(TaskId(1));
    log[..40].iter().for_each(|r| apply(&mut b, r));
    let mut c: TaskState = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
    log[30..].iter().for_each(|r| apply(&mut c, r));
    assert_eq!(a, c);
    assert_eq!(a.next_step, 50);
}

#[test]
fn a_failover_reruns_what_ran_after_the_last_barrier() {
    let mut st = TaskState::new(TaskId(1));
    let barrier = |seq| {
        rec(
            seq,
            Event::Barrier {
                version: seq,
                root_hash: format!("r{seq}"),
                files: 0,
                bytes: 0,
                wire_bytes: 0,
                tmp_bytes: 0,
                tmp_files: 0,
            },
        )
    };
    for r in [
        issued(1, 10, 0, Purpose::Step),
        done(2, 10, 0),
        barrier(3),
        issued(4, 11, 1, Purpose::Step),
        done(5, 11, 0),
        // No barrier: the worker died. Step 2 is interrupted.
        issued(6, 12, 2, Purpose::Step),
        interrupted(7, 12, "lost"),
    ] {
        apply(&mut st, &r);
    }
    assert_eq!((st.next_step, st.unsure_step), (2, Some(2)));
    apply(
        &mut st,
        &rec(
            8,
            Event::MoveStarted {
                from: "w".into(),
                to: "v".into(),
            },
        ),
    );
    apply(
        &mut st,
        &rec(
            9,
            Event::MoveCompleted {
                to: "v".into(),
                files: 0,
                wire_bytes: 0,
            },
        ),
    );
    // The target holds barrier 3: steps 1 and 2 run again there.
    assert_eq!((st.next_step, st.unsure_step), (1, None));
    assert_eq!(
        (st.worker.as_deref(), st.moving_to.as_deref()),
        (Some("v"), None)
    );
}

#[test]
fn results_for_calls_not_pending_are_ignored() {
    let mut st = TaskState::new(TaskId(1));
    apply(&mut st, &issued(1, 10, 0, Purpose::Step));
    apply(&mut st, &done(2, 99, 0));
    assert!(st.pending.is_some());
    assert_eq!(st.next_step, 0);
}
