//! The parent's decisions, as a table of situations.

use super::*;
use crate::model::agent::{AgentSpec, Budget, Permission};
use crate::model::task::Status;

fn spec(count: u32, pick: Pick) -> Attempts {
    Attempts::new(
        AttemptsSpec {
            count,
            pick,
            temperature: Some(0.9),
            models: vec![],
            escalate: vec![],
            worker: String::new(),
        },
        AgentSpec {
            model: "openai:small".into(),
            permission: Permission::Full,
            budget: Budget::default(),
            allow_commands: vec![],
            allow_paths: vec![],
            repeat_limit: 3,
            transcript: String::new(),
            check: None,
            egress: None,
            sampling: None,
            no_agents_md: false,
            assists: None,
        },
    )
}

fn start(a: &mut Attempts, index: u32) {
    a.on_started(Attempt {
        index,
        task: TaskId(100 + u64::from(index)),
        model: "openai:small".into(),
        escalation: false,
        end: None,
    });
}

fn end(a: &mut Attempts, index: u32, verified: bool, lines: u64) {
    a.on_ended(
        index,
        AttemptEnd {
            status: if verified {
                Status::Finished
            } else {
                Status::Stuck
            },
            verified,
            reason: if verified {
                ""
            } else {
                "went round in circles"
            }
            .into(),
            root: format!("root{index}"),
            check: if verified { "passes" } else { "exit code 1" }.into(),
            check_output: format!("output of {index}"),
            files_changed: 1,
            lines_changed: lines,
            steps: 3,
            tokens: 100,
            usd: 0.0,
        },
    );
}

fn child(index: u32, stopped: bool) -> Child {
    Child {
        index,
        task: TaskId(100 + u64::from(index)),
        stopped,
        tokens: 0,
        usd: 0.0,
    }
}

fn next(a: &Attempts, children: &[Child]) -> Next {
    decide(a, children, false, Spend::default(), Spend::default())
}

#[test]
fn attempts_start_one_by_one_until_all_have() {
    let mut a = spec(3, Pick::First);
    for i in 0..3 {
        assert_eq!(
            next(&a, &[]),
            Next::Start {
                index: i,
                model: "openai:small".into(),
                escalation: false
            }
        );
        start(&mut a, i);
    }
    let kids: Vec<Child> = (0..3).map(|i| child(i, false)).collect();
    assert_eq!(next(&a, &kids), Next::Wait);
}

#[test]
fn the_first_verified_attempt_wins_and_the_others_are_cancelled_before_the_parent_ends() {
    let mut a = spec(3, Pick::First);
    (0..3).for_each(|i| start(&mut a, i));
    // Attempt 2 stops first; ends are recorded before anything is decided.
    assert_eq!(
        next(&a, &[child(0, false), child(1, true), child(2, false)]),
        Next::Record(vec![1])
    );
    end(&mut a, 1, false, 0);
    assert_eq!(
        next(&a, &[child(0, false), child(1, true), child(2, true)]),
        Next::Record(vec![2])
    );
    end(&mut a, 2, true, 7);
    assert_eq!(
        next(&a, &[child(0, false), child(1, true), child(2, true)]),
        Next::Pick {
            index: 2,
            why: "the check passed on it first".into()
        }
    );
    a.picked = Some(Picked {
        index: 2,
        task: TaskId(102),
        why: "the check passed on it first".into(),
    });
    match next(&a, &[child(0, false), child(1, true), child(2, true)]) {
        Next::Cancel { tasks, why } => {
            assert_eq!(tasks, vec![TaskId(100)]);
            assert!(why.contains("attempt 3 (t-102) won"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // A verified attempt that ends after the pick never changes it.
    assert_eq!(
        next(&a, &[child(0, true), child(1, true), child(2, true)]),
        Next::Record(vec![0])
    );
    end(&mut a, 0, true, 1);
    match next(&a, &[child(0, true), child(1, true), child(2, true)]) {
        Next::Finish { outcome, reason } => {
            assert_eq!(outcome, Outcome::Finished);
            assert!(reason.contains("attempt 3"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn smallest_waits_for_all_and_takes_the_fewest_changed_lines() {
    let mut a = spec(3, Pick::Smallest);
    (0..3).for_each(|i| start(&mut a, i));
    end(&mut a, 0, true, 40);
    end(&mut a, 1, false, 2);
    // One still runs: a verified attempt does not end the wait.
    assert_eq!(
        next(&a, &[child(0, true), child(1, true), child(2, false)]),
        Next::Wait
    );
    end(&mut a, 2, true, 6);
    match next(&a, &[child(0, true), child(1, true), child(2, true)]) {
        Next::Pick { index, why } => {
            assert_eq!(index, 2);
            assert!(why.contains("6 lines"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn with_none_verified_it_escalates_in_order_then_fails_with_each_reason() {
    let mut a = spec(2, Pick::First);
    a.spec.escalate = vec!["anthropic:big".into()];
    (0..2).for_each(|i| start(&mut a, i));
    end(&mut a, 0, false, 3);
    end(&mut a, 1, false, 3);
    let kids = [child(0, true), child(1, true)];
    assert_eq!(
        next(&a, &kids),
        Next::Start {
            index: 2,
            model: "anthropic:big".into(),
            escalation: true
        }
    );
    let goal = a.escalation_goal("fix it");
    assert!(goal.starts_with("fix it\n\n"), "{goal}");
    assert!(
        goal.contains("output of 0") && goal.contains("output of 1"),
        "{goal}"
    );
    a.on_started(Attempt {
        index: 2,
        task: TaskId(102),
        model: "anthropic:big".into(),
        escalation: true,
        end: None,
    });
    let kids = [child(0, true), child(1, true), child(2, false)];
    assert_eq!(next(&a, &kids), Next::Wait);
    end(&mut a, 2, false, 1);
    match next(&a, &[child(0, true), child(1, true), child(2, true)]) {
        Next::Finish { outcome, reason } => {
            assert_eq!(outcome, Outcome::Failed);
            for t in ["t-100", "t-101", "t-102", "went round in circles"] {
                assert!(reason.contains(t), "{t} in {reason}");
            }
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_cancelled_parent_cancels_what_runs_then_ends_cancelled() {
    let mut a = spec(2, Pick::First);
    (0..2).for_each(|i| start(&mut a, i));
    let kids = [child(0, false), child(1, false)];
    match decide(&a, &kids, true, Spend::default(), Spend::default()) {
        Next::Cancel { tasks, .. } => assert_eq!(tasks, vec![TaskId(100), TaskId(101)]),
        other => panic!("{other:?}"),
    }
    end(&mut a, 0, false, 0);
    end(&mut a, 1, false, 0);
    let kids = [child(0, true), child(1, true)];
    assert!(matches!(
        decide(&a, &kids, true, Spend::default(), Spend::default()),
        Next::Finish {
            outcome: Outcome::Cancelled,
            ..
        }
    ));
}

#[test]
fn one_budget_covers_all_attempts() {
    let mut a = spec(3, Pick::Smallest);
    (0..3).for_each(|i| start(&mut a, i));
    let kids: Vec<Child> = (0..3).map(|i| child(i, false)).collect();
    let budget = Spend {
        tokens: 1000,
        ..Spend::default()
    };
    let under = Spend {
        tokens: 999,
        ..Spend::default()
    };
    let at = Spend {
        tokens: 1000,
        ..Spend::default()
    };
    assert_eq!(decide(&a, &kids, false, under, budget), Next::Wait);
    match decide(&a, &kids, false, at, budget) {
        Next::Cancel { tasks, why } => {
            assert_eq!(tasks.len(), 3);
            assert!(why.contains("1000 of 1000 tokens"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    // What passed already wins when the budget runs out.
    end(&mut a, 1, true, 4);
    let kids = [child(0, false), child(1, true), child(2, false)];
    assert!(matches!(
        decide(&a, &kids, false, at, budget),
        Next::Pick { index: 1, .. }
    ));
}

#[test]
fn on_wall_time_the_parent_gives_its_attempts_a_grace_to_stop_by_themselves() {
    let mut a = spec(2, Pick::First);
    (0..2).for_each(|i| start(&mut a, i));
    let kids = [child(0, false), child(1, false)];
    let budget = Spend {
        wall_ms: 600_000,
        ..Spend::default()
    };
    let at = |wall_ms| Spend {
        wall_ms,
        ..Spend::default()
    };
    // Each attempt's own wall budget ends with the parent's: it stops, checks its last
    // change and ends by itself, so the parent waits rather than cutting that short.
    assert_eq!(decide(&a, &kids, false, at(600_000), budget), Next::Wait);
    assert_eq!(
        decide(&a, &kids, false, at(600_000 + WALL_GRACE_MS - 1), budget),
        Next::Wait
    );
    // One ended verified in the grace: it wins.
    let mut won = a.clone();
    end(&mut won, 1, true, 3);
    let ended = [child(0, false), child(1, true)];
    assert!(matches!(
        decide(&won, &ended, false, at(600_000 + 1), budget),
        Next::Pick { index: 1, .. }
    ));
    // Past the grace the parent stops what still runs, and says why.
    match decide(&a, &kids, false, at(600_000 + WALL_GRACE_MS), budget) {
        Next::Cancel { tasks, why } => {
            assert_eq!(tasks.len(), 2);
            assert!(why.contains("600s of wall time"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn attempts_that_sample_alike_start_together() {
    let mut a = spec(4, Pick::First);
    let p = TaskId(7);
    let together =
        |a: &Attempts| -> Vec<u32> { (0..5).map(|i| a.spec.sampling_of(p, i).together).collect() };
    // The first at the server's temperature, the other three at the attempts'; the fifth is
    // an escalation, which starts alone.
    assert_eq!(together(&a), [1, 3, 3, 3, 1]);
    a.spec.temperature = None;
    assert_eq!(together(&a), [4, 4, 4, 4, 1]);
    a.spec.models = vec!["openai:other".into()];
    assert_eq!(together(&a), [2, 2, 2, 2, 1]);
}

#[test]
fn attempts_differ_in_seed_and_later_ones_in_temperature_and_model() {
    let mut a = spec(4, Pick::First);
    a.spec.models = vec!["openai:other".into()];
    let p = TaskId(7);
    let seeds: std::collections::HashSet<u64> =
        (0..4).map(|i| a.spec.sampling_of(p, i).seed).collect();
    assert_eq!(seeds.len(), 4);
    assert_eq!(a.spec.sampling_of(p, 0).temperature, None);
    assert_eq!(a.spec.sampling_of(p, 1).temperature, Some(0.9));
    assert_eq!(a.spec.sampling_of(p, 2), a.spec.sampling_of(p, 2));
    assert_ne!(
        a.spec.sampling_of(p, 0).seed,
        a.spec.sampling_of(TaskId(8), 0).seed
    );
    let models: Vec<String> = (0..4).map(|i| a.spec.model_of(i, "openai:small")).collect();
    assert_eq!(
        models,
        [
            "openai:small",
            "openai:other",
            "openai:small",
            "openai:other"
        ]
    );
    // Every started attempt gets the model of its place in the first round.
    start(&mut a, 0);
    assert_eq!(
        next(&a, &[child(0, false)]),
        Next::Start {
            index: 1,
            model: "openai:other".into(),
            escalation: false
        }
    );
}

#[test]
fn the_parents_records_round_trip_beside_the_records_own_fields() {
    use crate::model::event::{Event, Record};
    for event in [
        Event::AttemptStarted {
            index: 1,
            attempt: TaskId(9),
            model: "openai:small".into(),
            escalation: false,
        },
        Event::AttemptPicked {
            index: 1,
            attempt: TaskId(9),
            why: "first".into(),
            root_hash: "r".into(),
            check: Default::default(),
        },
    ] {
        let r = Record {
            v: 1,
            task: TaskId(3),
            seq: 4,
            at_ms: 5,
            event,
        };
        let json = serde_json::to_string(&r).unwrap();
        let back: Record = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r, "{json}");
    }
}
