//! The CLI at a terminal, as a person uses it: `brain run` asks for each approval inline
//! (`[y]es / [n]o / [a]lways for this command / show [d]iff`). Real brain and worker
//! processes; the CLI runs on a pseudo-terminal (util-linux's `script`) and the test types.

use std::time::Duration;

use testkit::fake_llm::{FakeLlm, FakeReply};
use testkit::terminal::Terminal;
use testkit::{BrainOptions, Cluster, text};

const T: Duration = Duration::from_secs(60);

#[test]
fn brain_run_on_a_terminal_asks_for_each_approval_inline() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("echo one >> log.txt"),
        // Approved "always" above: not asked again.
        FakeReply::run("echo one >> log.txt"),
        FakeReply::write("notes.txt", "hello\nworld\n"),
        FakeReply::run("rm -f log.txt"),
        FakeReply::finish("noted"),
    ]);
    let c = Cluster::start_with(BrainOptions::with_llm(&llm, "sk-terminal", ""));
    let _w = c.join_worker("laptop");
    let line = format!(
        "{} --data {} run --model openai:gpt-4.1 --permission ask --worker laptop 'take notes'",
        c.bins.brain.display(),
        c.data.display()
    );
    let mut t = Terminal::start(&line);
    let question = "[y]es / [n]o / [a]lways for this command / show [d]iff";

    t.wait_for("approve #1?", 1, T);
    t.type_line("a");
    // The same command ran unasked; the file write is asked, and its change shown on `d`.
    t.wait_for("approve #2?", 1, T);
    t.type_line("d");
    t.wait_for("+hello", 1, T);
    t.wait_for("approve #2?", 2, T);
    t.type_line("y");
    t.wait_for("approve #3?", 1, T);
    t.type_line("n");
    t.wait_for("why?", 1, T);
    t.type_line("keep the log");
    let (code, shown) = t.wait(T);
    assert_eq!(code, Some(0), "brain run did not end finished:\n{shown}");
    assert!(shown.contains(question), "{shown}");
    assert!(
        !shown.contains("approve #4?"),
        "the command approved always was asked again:\n{shown}"
    );

    // The log holds the decisions as made, and the command approved always ran twice.
    let id = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("following "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the task's id")
        .to_string();
    let out = c.brain_cli(&["task", "log", &id, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let records: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect();
    let events = |kind: &str| -> Vec<&serde_json::Value> {
        records.iter().filter(|e| e["kind"] == kind).collect()
    };
    let decided = events("approval_decided");
    assert_eq!(decided.len(), 3, "{decided:?}");
    assert_eq!(decided[0]["approved"], true);
    assert_eq!(decided[0]["always"], true);
    assert_eq!(decided[1]["approved"], true);
    assert!(decided[1].get("always").is_none(), "{:?}", decided[1]);
    assert_eq!(decided[2]["approved"], false);
    assert_eq!(decided[2]["reason"], "keep the log");
    let ran = events("tool_call_issued")
        .iter()
        .filter(|e| e.to_string().contains("echo one >> log.txt"))
        .count();
    assert_eq!(ran, 2, "the command approved always ran {ran} times");
    assert!(
        shown.contains("approval #1 granted by")
            && shown.contains("(and from now on in this task)"),
        "{shown}"
    );
}

#[test]
fn brain_run_off_a_terminal_asks_nothing_and_waits_for_brain_approve() {
    let llm = FakeLlm::script(vec![
        FakeReply::run("echo hi > a.txt"),
        FakeReply::finish("done"),
    ]);
    let c = Cluster::start_with(BrainOptions::with_llm(&llm, "sk-terminal", ""));
    let _w = c.join_worker("laptop");
    // Followed from a pipe, with stdin a pipe holding a "y" nobody typed at a prompt.
    let mut run = c.brain_cli_cmd(&[
        "run",
        "--model",
        "openai:gpt-4.1",
        "--permission",
        "ask",
        "--worker",
        "laptop",
        "hello",
    ]);
    run.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = run.spawn().expect("brain run");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"y\n").expect("write stdin");
    }
    let mut first = String::new();
    {
        use std::io::BufRead;
        let stdout = child.stdout.as_mut().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut first)
            .expect("the task's id");
    }
    let id = first.trim().to_string();
    c.wait_status(&id, &["waiting"], T);
    let out = c.brain_cli(&["approve", &id]);
    assert!(out.status.success(), "{}", text(&out));
    let out = child.wait_with_output().expect("brain run");
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!said.contains("approve #1?"), "{said}");
    let log = c.brain_cli(&["task", "log", &id, "--json"]);
    let decisions = String::from_utf8_lossy(&log.stdout)
        .matches("\"approval_decided\"")
        .count();
    assert_eq!(decisions, 1, "{}", text(&log));
}
