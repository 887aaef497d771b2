//! The choice of a worker, pure: given each connected worker's numbers now ([`Slot`]) and
//! what a task needs ([`Want`]), the least loaded that may take it, or in words why none
//! may ([`NoRoom`]). Table-tested below.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::Arc;

use rand::Rng;

/// The labels a worker must have.
pub type Labels = BTreeMap<String, String>;

/// One worker's numbers at the moment of a choice.
#[derive(Debug, Clone, Default)]
pub struct Slot {
    pub id: Arc<str>,
    pub labels: Arc<Labels>,
    pub sandbox: Arc<Vec<String>>,
    pub capacity: u32,
    pub running: u32,
    pub moving_in: u32,
    /// Free memory, when reported.
    pub memory_free: Option<u64>,
    pub cpu_busy_permille: u32,
    /// Dropped repeatedly and not yet steady again.
    pub held: bool,
}

/// What a task needs of a worker.
#[derive(Debug, Clone, Default)]
pub struct Want {
    pub labels: Labels,
    pub require_sandbox: Vec<String>,
    /// The memory one of its commands may use (0: no limit asked).
    pub memory_bytes: u64,
    /// Not this worker (the one a failover leaves).
    pub exclude: Option<String>,
    /// A move: bounded by `moves_per_worker` on the target.
    pub moving: bool,
    pub moves_per_worker: u32,
    /// Workers holding the task's siblings (attempts of one task), one entry per sibling:
    /// a worker with fewer comes first, whatever its load.
    pub apart: Vec<String>,
}

/// Why no worker was chosen: how many workers were looked at and what ruled each out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoRoom {
    pub workers: usize,
    pub excluded: usize,
    pub labels: usize,
    /// Lacking a mechanism the brain's policy requires: (workers, what they lack).
    pub policy: usize,
    pub missing: Vec<String>,
    pub full: usize,
    pub memory: usize,
    pub held: usize,
    pub moves: usize,
}

impl NoRoom {
    /// Whether waiting could help: some worker has the labels and what the policy needs and
    /// is only busy, short of memory, held, or taking other moves now.
    pub fn transient(&self) -> bool {
        self.full + self.memory + self.held + self.moves > 0
    }
}

impl fmt::Display for NoRoom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.workers - self.excluded;
        if n == 0 {
            return f.write_str(
                "no worker is connected: start one (`worker join ...`) or name one with --worker",
            );
        }
        if self.labels == n {
            return f.write_str("no connected worker has the labels the task requires");
        }
        let plural =
            |k: usize, one: &str, many: &str| format!("{k} {}", if k == 1 { one } else { many });
        let mut why = vec![];
        for (k, one, many) in [
            (self.full, "at capacity", "at capacity"),
            (self.moves, "taking other moves", "taking other moves"),
            (self.memory, "short of memory", "short of memory"),
            (
                self.held,
                "held after dropping repeatedly",
                "held after dropping repeatedly",
            ),
            (self.labels, "without the labels", "without the labels"),
        ] {
            if k > 0 {
                why.push((k, if k == 1 { one } else { many }.to_string()));
            }
        }
        if self.policy > 0 {
            why.push((
                self.policy,
                format!(
                    "lacking {} (the brain's policy; see `worker doctor`)",
                    self.missing.join(", ")
                ),
            ));
        }
        let head = plural(n, "worker", "workers");
        if why.len() == 1 {
            let (k, what) = &why[0];
            let all = if *k == 1 { "it is" } else { "all" };
            return write!(f, "no worker with room: {head}, {all} {what}");
        }
        let parts: Vec<String> = why.iter().map(|(k, w)| format!("{k} {w}")).collect();
        write!(f, "no worker with room: {head}: {}", parts.join(", "))
    }
}

/// The least loaded slot that may take `want`: fewer of its siblings (`want.apart`), then
/// tasks against capacity, then more free memory (in 256 MiB steps), then less CPU in use
/// (in 10% steps); ties at random.
pub fn choose(slots: &[Slot], want: &Want, rng: &mut impl Rng) -> Result<usize, NoRoom> {
    const MEMORY_STEP: u64 = 256 << 20;
    let mut no = NoRoom {
        workers: slots.len(),
        ..Default::default()
    };
    let mut missing: HashSet<&str> = HashSet::new();
    // (index, key) of the best so far, and how many share its key (reservoir sampling).
    let mut best: Option<(usize, (u32, u32, u64, u32))> = None;
    let mut ties = 0u32;
    for (i, s) in slots.iter().enumerate() {
        if want.exclude.as_deref() == Some(&*s.id) {
            no.excluded += 1;
            continue;
        }
        if !want.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)) {
            no.labels += 1;
            continue;
        }
        let lacks: Vec<&str> = want
            .require_sandbox
            .iter()
            .filter(|m| !s.sandbox.contains(m))
            .map(String::as_str)
            .collect();
        if !lacks.is_empty() {
            no.policy += 1;
            missing.extend(lacks);
            continue;
        }
        if s.running >= s.capacity {
            no.full += 1;
            continue;
        }
        if want.moving && s.moving_in >= want.moves_per_worker.max(1) {
            no.moves += 1;
            continue;
        }
        if want.memory_bytes > 0 && s.memory_free.is_some_and(|m| m < want.memory_bytes) {
            no.memory += 1;
            continue;
        }
        if s.held {
            no.held += 1;
            continue;
        }
        // Lower is better. Load as a fraction compared exactly: running/capacity scaled.
        let load = ((s.running as u64 * 1_000_000) / s.capacity.max(1) as u64) as u32;
        let mem_short = u64::MAX - s.memory_free.unwrap_or(0) / MEMORY_STEP;
        let siblings = want.apart.iter().filter(|w| **w == *s.id).count() as u32;
        let key = (siblings, load, mem_short, s.cpu_busy_permille / 100);
        match &best {
            Some((_, b)) if key > *b => {}
            Some((_, b)) if key == *b => {
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = Some((i, key));
                }
            }
            _ => {
                best = Some((i, key));
                ties = 1;
            }
        }
    }
    if let Some((i, _)) = best {
        return Ok(i);
    }
    no.missing = missing.into_iter().map(String::from).collect();
    no.missing.sort();
    Err(no)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn slot(id: &str, running: u32, capacity: u32) -> Slot {
        Slot {
            id: Arc::from(id),
            capacity,
            running,
            ..Default::default()
        }
    }

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "a table of cases, one row each: its length is the rows'"
    )]
    fn the_choice_table() {
        let gpu = labels(&[("gpu", "yes")]);
        let with = |mut s: Slot, f: &dyn Fn(&mut Slot)| {
            f(&mut s);
            s
        };
        struct Case {
            name: &'static str,
            slots: Vec<Slot>,
            want: Want,
            expect: Result<&'static str, &'static str>,
        }
        let cases = vec![
            Case {
                name: "least loaded by tasks against capacity",
                slots: vec![slot("a", 3, 4), slot("b", 1, 4), slot("c", 2, 4)],
                want: Want::default(),
                expect: Ok("b"),
            },
            Case {
                name: "load is a fraction: 2 of 8 beats 1 of 2",
                slots: vec![slot("a", 1, 2), slot("b", 2, 8)],
                want: Want::default(),
                expect: Ok("b"),
            },
            Case {
                name: "a full worker is never chosen",
                slots: vec![slot("a", 4, 4), slot("b", 7, 8)],
                want: Want::default(),
                expect: Ok("b"),
            },
            Case {
                name: "all full: the reason counts them",
                slots: vec![slot("a", 4, 4), slot("b", 2, 2)],
                want: Want::default(),
                expect: Err("no worker with room: 2 workers, all at capacity"),
            },
            Case {
                name: "a worker without the task's siblings first, whatever its load",
                slots: vec![slot("a", 0, 4), slot("b", 3, 4)],
                want: Want {
                    apart: vec!["a".into()],
                    ..Default::default()
                },
                expect: Ok("b"),
            },
            Case {
                name: "with siblings everywhere, the fewest",
                slots: vec![slot("a", 1, 4), slot("b", 0, 4)],
                want: Want {
                    apart: vec!["a".into(), "b".into(), "b".into()],
                    ..Default::default()
                },
                expect: Ok("a"),
            },
            Case {
                name: "labels filter before load",
                slots: vec![
                    slot("a", 0, 4),
                    with(slot("b", 3, 4), &|s| s.labels = Arc::new(gpu.clone())),
                ],
                want: Want {
                    labels: gpu.clone(),
                    ..Default::default()
                },
                expect: Ok("b"),
            },
            Case {
                name: "no worker with the labels",
                slots: vec![slot("a", 0, 4)],
                want: Want {
                    labels: gpu.clone(),
                    ..Default::default()
                },
                expect: Err("no connected worker has the labels the task requires"),
            },
            Case {
                name: "the policy's mechanisms",
                slots: vec![
                    slot("a", 0, 4),
                    with(slot("b", 0, 4), &|s| {
                        s.sandbox = Arc::new(vec!["landlock".into()])
                    }),
                ],
                want: Want {
                    require_sandbox: vec!["landlock".into()],
                    ..Default::default()
                },
                expect: Ok("b"),
            },
            Case {
                name: "policy refusal in words",
                slots: vec![slot("a", 0, 4)],
                want: Want {
                    require_sandbox: vec!["landlock".into()],
                    ..Default::default()
                },
                expect: Err(
                    "no worker with room: 1 worker, it is lacking landlock (the brain's policy; see `worker doctor`)",
                ),
            },
            Case {
                name: "the task's memory against what is free",
                slots: vec![
                    with(slot("a", 0, 4), &|s| s.memory_free = Some(1 << 30)),
                    with(slot("b", 1, 4), &|s| s.memory_free = Some(8 << 30)),
                ],
                want: Want {
                    memory_bytes: 2 << 30,
                    ..Default::default()
                },
                expect: Ok("b"),
            },
            Case {
                name: "equal load: more free memory",
                slots: vec![
                    with(slot("a", 1, 4), &|s| s.memory_free = Some(1 << 30)),
                    with(slot("b", 1, 4), &|s| s.memory_free = Some(8 << 30)),
                ],
                want: Want::default(),
                expect: Ok("b"),
            },
            Case {
                name: "equal load and memory: less CPU in use",
                slots: vec![
                    with(slot("a", 1, 4), &|s| s.cpu_busy_permille = 900),
                    with(slot("b", 1, 4), &|s| s.cpu_busy_permille = 100),
                ],
                want: Want::default(),
                expect: Ok("b"),
            },
            Case {
                name: "a held worker gets nothing new",
                slots: vec![with(slot("a", 0, 4), &|s| s.held = true), slot("b", 3, 4)],
                want: Want::default(),
                expect: Ok("b"),
            },
            Case {
                name: "failover excludes the lost worker and bounds moves per target",
                slots: vec![
                    slot("lost", 0, 4),
                    with(slot("a", 0, 4), &|s| s.moving_in = 2),
                    slot("b", 2, 4),
                ],
                want: Want {
                    exclude: Some("lost".into()),
                    moving: true,
                    moves_per_worker: 2,
                    ..Default::default()
                },
                expect: Ok("b"),
            },
            Case {
                name: "mixed reasons",
                slots: vec![
                    slot("a", 4, 4),
                    with(slot("b", 0, 4), &|s| s.held = true),
                    with(slot("c", 0, 4), &|s| s.labels = Arc::new(gpu.clone())),
                ],
                want: Want::default(),
                expect: Ok("c"),
            },
            Case {
                name: "mixed refusals",
                slots: vec![slot("a", 4, 4), with(slot("b", 0, 4), &|s| s.held = true)],
                want: Want::default(),
                expect: Err(
                    "no worker with room: 2 workers: 1 at capacity, 1 held after dropping repeatedly",
                ),
            },
            Case {
                name: "nobody connected",
                slots: vec![],
                want: Want::default(),
                expect: Err(
                    "no worker is connected: start one (`worker join ...`) or name one with --worker",
                ),
            },
        ];
        for c in cases {
            let got = choose(&c.slots, &c.want, &mut rng())
                .map(|i| &*c.slots[i].id)
                .map_err(|e| e.to_string());
            assert_eq!(got, c.expect.map_err(String::from), "{}", c.name);
        }
    }

    #[test]
    fn ties_are_broken_at_random_over_all_tied() {
        let slots: Vec<Slot> = (0..4).map(|i| slot(&format!("w{i}"), 1, 4)).collect();
        let mut seen = HashSet::new();
        let mut r = rng();
        for _ in 0..200 {
            seen.insert(choose(&slots, &Want::default(), &mut r).unwrap());
        }
        assert_eq!(seen.len(), 4, "every tied worker is chosen sometimes");
    }
}
