//! The agent benchmark's report: the per-task table of claims and independent checks, the
//! summary row of each harness (medians of calls, tokens and wall time), and the comparisons
//! printed after it.

use super::*;

pub(super) fn median_u64(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

pub(super) fn median_dur(mut v: Vec<Duration>) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    v[v.len() / 2]
}

fn summary_row(name: &str, a: &[Attempt]) -> String {
    if a.is_empty() {
        return format!("{name:<16} (not run)");
    }
    let solved = a.iter().filter(|x| x.solved).count();
    let claimed = a.iter().filter(|x| x.claimed).count();
    let fs = a.iter().filter(|x| x.false_success()).count();
    format!(
        "{name:<16} {:>8} {:>9} {:>8} {:>13} {:>10} {:>11} {:>11.1}s",
        a.len(),
        format!("{solved}/{}", a.len()),
        claimed,
        fs,
        median_u64(a.iter().map(|x| x.calls).collect()),
        median_u64(a.iter().map(|x| x.tokens).collect()),
        median_dur(a.iter().map(|x| x.wall).collect()).as_secs_f64(),
    )
}

pub(super) fn report(tasks: &[Task], n: usize, rows: &[(&str, &Vec<Attempt>)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nper task ({n} attempt(s) each): claim → solved by the independent check (+ yes, - no, ! false success)"
    );
    let mut head = format!("{:<10}", "task");
    for (h, _) in rows {
        let _ = write!(head, " | {h:<40}");
    }
    let _ = writeln!(s, "{head}");
    for t in tasks {
        let mut line = format!("{:<10}", t.name);
        for (_, atts) in rows {
            let cell: Vec<String> = atts
                .iter()
                .filter(|a| a.task == t.name)
                .map(|a| {
                    let mark = if a.false_success() {
                        '!'
                    } else if a.solved {
                        '+'
                    } else {
                        '-'
                    };
                    format!("{}{mark}", a.claim)
                })
                .collect();
            let _ = write!(line, " | {:<40}", cell.join(" "));
        }
        let _ = writeln!(s, "{line}");
    }
    let _ = writeln!(
        s,
        "\n{:<16} {:>8} {:>9} {:>8} {:>13} {:>10} {:>11} {:>12}",
        "harness",
        "attempts",
        "solved",
        "claimed",
        "false success",
        "med calls",
        "med tokens",
        "med wall"
    );
    for (h, atts) in rows {
        let _ = writeln!(s, "{}", summary_row(h, atts));
    }
    s
}

/// The attempts of each row, in the order of the (task, attempt) units.
pub(super) struct Results {
    pub(super) before: Vec<Attempt>,
    pub(super) tether: Vec<Attempt>,
    pub(super) json: Vec<Attempt>,
    pub(super) attempts: Vec<Attempt>,
    pub(super) msa: Vec<Attempt>,
    pub(super) oneshot: Vec<Attempt>,
}

impl Results {
    /// From (unit, row, attempt), sorted by unit.
    pub(super) fn of(done: &[(usize, &str, Attempt)]) -> Self {
        let row = |name: &str| -> Vec<Attempt> {
            done.iter()
                .filter(|(_, r, _)| *r == name)
                .map(|(_, _, a)| a.clone())
                .collect()
        };
        Self {
            before: row("before"),
            tether: row("tether"),
            json: row("json"),
            attempts: row("attempts"),
            msa: row("msa"),
            oneshot: row("oneshot"),
        }
    }
}

/// The per-task table and the summary of the rows that ran, then what one-shot fixed.
pub(super) fn print_report(
    s: &Settings,
    tasks: &[Task],
    fleet: &Fleet,
    msa_ran: bool,
    r: &Results,
) {
    let mut rows: Vec<(&str, &Vec<Attempt>)> = Vec::new();
    if fleet.baseline.is_some() {
        rows.push(("tether (before)", &r.before));
    }
    if fleet.cluster.is_some() && s.wants("tether") {
        rows.push(("tether", &r.tether));
    }
    if fleet.cluster.is_some() && s.wants("tether-json") {
        rows.push(("tether json", &r.json));
    }
    let attempts_row = format!("tether ×{}", s.attempts);
    if fleet.cluster.is_some() && s.wants("tether-attempts") {
        rows.push((&attempts_row, &r.attempts));
    }
    if msa_ran {
        rows.push(("mini-swe-agent", &r.msa));
    }
    if s.wants("oneshot") {
        rows.push(("one-shot", &r.oneshot));
    }
    print!("{}", report(tasks, s.n, &rows));
    if s.wants("oneshot") {
        println!(
            "one-shot: fixed {} of {}",
            r.oneshot.iter().filter(|a| a.solved).count(),
            r.oneshot.len()
        );
    }
}

/// The same tasks once and as attempts, in this run: what N attempts on N workers cost in
/// wall time against one.
pub(super) fn print_attempts_against_once(s: &Settings, r: &Results) {
    let (a_rows, t_rows) = (&r.attempts, &r.tether);
    if a_rows.is_empty() || t_rows.is_empty() {
        return;
    }
    let (one, many) = (
        median_dur(t_rows.iter().map(|a| a.wall).collect()),
        median_dur(a_rows.iter().map(|a| a.wall).collect()),
    );
    println!(
        "tether ×{}: solved {} of {} ({:.0}%), against {} of {} once; median wall {:.1}s against {:.1}s once ({:.2}×)",
        s.attempts,
        a_rows.iter().filter(|a| a.solved).count(),
        a_rows.len(),
        100.0 * a_rows.iter().filter(|a| a.solved).count() as f64 / a_rows.len() as f64,
        t_rows.iter().filter(|a| a.solved).count(),
        t_rows.len(),
        many.as_secs_f64(),
        one.as_secs_f64(),
        many.as_secs_f64() / one.as_secs_f64().max(1e-9)
    );
}

/// Tether's claims of success whose files fail the independent check, if any.
pub(super) fn print_false_successes(s: &Settings, r: &Results) {
    let fs: Vec<&Attempt> = r
        .tether
        .iter()
        .chain(&r.json)
        .chain(&r.attempts)
        .filter(|a| a.false_success())
        .collect();
    if !fs.is_empty() {
        println!(
            "\nTETHER FALSE SUCCESS ({}): {} — a harness bug; see the logs in {}",
            fs.len(),
            fs.iter()
                .map(|a| a.task.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            s.out.display()
        );
    }
}
