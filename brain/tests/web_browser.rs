//! The web page in a real browser: headless Chromium through WebDriver against a real brain,
//! two real workers and the fake LLM. A person logs in with a one-time link, starts a task
//! from the form, approves a call and sees its output appear without a reload (as text: the
//! markup in it never runs), denies one with a reason the model is told, moves the task to
//! the second worker and sees it in the lane picture, and reads the diff. A screenshot of
//! the task page is kept as a test artifact (`target/web-artifacts/task-page.png`).

use std::time::Duration;

use serde_json::json;
use testkit::fake_llm::{FakeLlm, FakeReply, FakeRequest};
use testkit::webdriver::Browser;
use testkit::{BrainOptions, Cluster, skip};

const REASON: &str = "notes stay out of this repository";

fn cluster(llm: &FakeLlm) -> Cluster {
    Cluster::start_with(BrainOptions::web_with_llm(llm, "sk-web-test"))
}

/// Follows a one-time link as ann, an operator: the page says who is logged in, and the
/// code is not left in its address.
fn log_in(browser: &Browser, c: &Cluster, t: Duration) {
    browser.goto(&c.web_login("ann", "operator"));
    browser.wait("the page to say who is logged in", t, |b| {
        b.text("#who").contains("ann (operator)")
    });
    let url = browser.exec("return location.href", json!([]));
    assert!(!url.as_str().unwrap().contains("code="), "{url}");
}

/// Submits the new-task form (filled by `fill`), and waits for the page of task t-1.
fn start_from_the_form(browser: &Browser, c: &Cluster, t: Duration, fill: impl Fn(&Browser)) {
    browser.goto(&format!("{}/#/new", c.web_url()));
    browser.wait("the form", t, |b| {
        b.find("form.new #goal").is_some() && b.find("form.new #attempts").is_some()
    });
    fill(browser);
    browser.click("form.new button[type=submit]").unwrap();
    browser.wait("the task page", t, |b| {
        b.exec("return location.hash", json!([])) == "#/task/t-1"
    });
}

/// The lane picture's `attr` (`data-lanes`: the workers it shows; `textContent`: its
/// labels), or nothing while there is none.
fn lanes(b: &Browser, what: &str) -> String {
    let lanes = b.exec(
        &format!("const s = document.querySelector('svg.lanes'); return s ? s.{what} : ''"),
        json!([]),
    );
    lanes.as_str().unwrap_or_default().to_string()
}

/// Keeps a screenshot of the page as `target/web-artifacts/NAME`.
fn keep_screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        std::path::PathBuf::from,
    );
    let dir = target.join("web-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), &png).unwrap();
    eprintln!("screenshot: {}", dir.join(name).display());
}

#[test]
fn a_person_steers_a_task_from_the_page() {
    let browser = match Browser::start() {
        Ok(b) => b,
        Err(why) => return skip("chromium", &why),
    };
    let llm = FakeLlm::script(vec![
        FakeReply::run(
            "echo first > a.txt; printf '%s\\n' '<img src=x onerror=\"window.__pwned=1\">' '<script>window.__pwned=2</script>'",
        ),
        FakeReply::write("notes.txt", "x"),
        FakeReply::run("echo second >> a.txt"),
        FakeReply::finish("done"),
    ]);
    let mut c = cluster(&llm);
    let laptop = c.join_worker("laptop");
    let bigbox = c.join_worker("bigbox");
    let t = Duration::from_secs(30);

    // The link logs the browser in and leaves the code behind; a new task from the form.
    log_in(&browser, &c, t);
    start_from_the_form(&browser, &c, t, |b| {
        b.type_into("#goal", "write a.txt").unwrap();
        b.type_into("#worker", "laptop").unwrap();
        b.type_into("#model", "openai:gpt-4.1").unwrap();
        b.click("#permission option[value=ask]").unwrap();
    });

    an_approved_commands_output_shows_as_text(&browser, t);
    a_denial_after_a_brain_restart_reaches_the_page_and_the_model(&browser, &mut c, &llm, t);

    // Move to the second worker while the third call waits, then approve it there.
    browser.wait("the third approval", t, |b| {
        b.text(".approval-box").contains("echo second")
    });
    let option = format!("#move-to option[value='{}']", bigbox.id);
    browser.wait("the worker list", t, |b| b.find(&option).is_some());
    browser.click(&option).unwrap();
    browser.click("#move").unwrap();
    browser.wait("the move in the timeline, by the worker's name", t, |b| {
        b.text("#timeline").contains("moved to bigbox")
    });
    browser.wait("the approval after the move", t, |b| {
        b.find(".approval-box .always").is_some()
    });
    browser.click(".approval-box .always").unwrap();
    c.wait_status("t-1", &["finished"], t);
    let decided = c
        .task_log_json("t-1")
        .into_iter()
        .rfind(|r| r["kind"] == "approval_decided")
        .unwrap();
    assert_eq!(decided["always"], json!(true), "{decided}");
    browser.wait("the standing approval in the timeline", t, |b| {
        b.text("#timeline")
            .contains("approved for the rest of the task by web:ann")
    });

    each_calls_output_shows_under_its_logged_id(&browser, &c);
    the_lanes_show_both_workers_and_the_move(&browser, t, &[&laptop.id, &bigbox.id]);

    // The diff against the base.
    browser.click("#show-diff").unwrap();
    browser.wait("the diff", t, |b| b.text("#diff").contains("+second"));
    assert!(browser.text("#diff").contains("+first"));
    assert!(browser.text("#summary").contains("finished"));
    // A finished task offers what applies to it: no Move, Cancel or Resume.
    let hidden = |css: &str| {
        browser.exec(
            "const e = document.querySelector(arguments[0]); return !e || e.offsetParent === null",
            json!([css]),
        ) == json!(true)
    };
    browser.wait("the actions of a finished task", t, |_| {
        ["#move", "#move-to", "#cancel", "#resume", "#more-steps"]
            .iter()
            .all(|css| hidden(css))
    });
    assert!(!hidden("#show-diff"), "the diff stays one click away");
    keep_screenshot(&browser, "task-page.png");
    the_timeline_reads_at_a_glance(&browser);
    the_page_fits_a_phone(&browser, &c, t);
}

/// The timeline shows what a person reads: a command once, its exit on its own line, no
/// status changes, syncs or requests to the model; "show every record" brings those back,
/// and each line's record number opens the raw record.
fn the_timeline_reads_at_a_glance(browser: &Browser) {
    let seen = browser.visible_text("#timeline");
    // A command's output is under it: what the model was told of it ("exit code 0 …") is not
    // shown again.
    for hidden in [
        "status running",
        "workspace synced",
        "asked openai",
        "exit code 0",
    ] {
        assert!(!seen.contains(hidden), "{hidden:?} shown:\n{seen}");
    }
    let first = browser.visible_text("#timeline li[data-kind=tool_call_issued]");
    assert!(
        first.contains("$ echo first > a.txt") && first.contains("→ exit 0"),
        "the command and its exit on one line: {first}"
    );
    // The output once, though it came live and then in its record.
    let out = browser.text("#timeline li[data-kind=tool_call_issued] pre.output");
    assert_eq!(out.matches("<script>").count(), 1, "{out}");
    // Each record keeps its line, folded.
    let lines = browser.exec(
        "return document.querySelectorAll('#timeline li').length",
        json!([]),
    );
    assert!(lines.as_u64() > Some(10), "{lines}");
    browser.click("#every").unwrap();
    let every = browser.visible_text("#timeline");
    assert!(
        every.contains("workspace synced") && every.contains("status running"),
        "{every}"
    );
    browser.click("#every").unwrap();
    let icon = browser.exec(
        "const x = new XMLHttpRequest(); x.open('GET', document.querySelector('link[rel=icon]').href, false); x.send(); return [x.status, x.getResponseHeader('content-type'), x.responseText.startsWith('<svg')]",
        json!([]),
    );
    assert_eq!(icon, json!([200, "image/svg+xml", true]), "the favicon");
}

/// At 420 px (a phone) the task page and the task list fit the screen: nothing wider than
/// it, the goal still shown. Screenshots of both widths are kept for docs/web.md.
fn the_page_fits_a_phone(browser: &Browser, c: &Cluster, t: Duration) {
    browser.set_size(420, 900);
    browser.wait("the narrow layout", t, |b| {
        b.exec("return window.innerWidth <= 420", json!([])) == json!(true)
    });
    assert!(!browser.overflows(), "the task page is wider than 420 px");
    keep_screenshot(browser, "task-page-420.png");
    browser.goto(&format!("{}/#/", c.web_url()));
    browser.wait("the task list", t, |b| {
        b.find("#tasks tr[data-task=t-1]").is_some()
    });
    assert!(!browser.overflows(), "the task list is wider than 420 px");
    let row = browser.visible_text("#tasks tr[data-task=t-1]");
    assert!(row.contains("t-1") && row.contains("write a.txt"), "{row}");
    keep_screenshot(browser, "tasks-420.png");
    browser.set_size(1400, 900);
    browser.wait("the wide layout", t, |b| {
        b.visible_text("#tasks tr[data-task=t-1]")
            .contains("bigbox")
    });
    assert!(!browser.overflows(), "the task list is wider than 1400 px");
}

/// Waiting for approval: the box appears; Approve lets it go on, and the command's output
/// shows up without a reload, as text (the markup in it neither runs nor renders).
fn an_approved_commands_output_shows_as_text(browser: &Browser, t: Duration) {
    browser.wait("the approval", t, |b| {
        b.find(".approval-box .approve").is_some()
    });
    assert!(browser.text(".approval-box").contains("echo first"));
    browser.click(".approval-box .approve").unwrap();
    browser.wait("the command's output", t, |b| {
        b.text("#timeline pre.output")
            .contains("<img src=x onerror")
    });
    let ran = browser.exec(
        "return [typeof window.__pwned, document.querySelectorAll('#timeline img, #timeline script').length]",
        json!([]),
    );
    assert_eq!(
        ran,
        json!(["undefined", 0]),
        "markup from a command ran or rendered"
    );
}

/// The write is asked for next. The brain is SIGKILLed and comes back: the page reconnects
/// by itself (no reload: a marker set before survives) and its timeline goes on from where
/// it was, without a gap or a repeat. The write is denied with a reason after the restart;
/// the decision reaches the timeline and the model is told the reason.
fn a_denial_after_a_brain_restart_reaches_the_page_and_the_model(
    browser: &Browser,
    c: &mut Cluster,
    llm: &FakeLlm,
    t: Duration,
) {
    browser.wait("the second approval", t, |b| {
        b.text(".approval-box").contains("notes.txt")
    });
    browser.exec("window.__marker = 'same page'", json!([]));
    let before = browser.exec(
        "return document.querySelectorAll('#timeline li').length",
        json!([]),
    );
    c.kill_brain();
    c.start_brain().unwrap();
    browser
        .type_into(".approval-box .deny-reason", REASON)
        .unwrap();
    browser.click(".approval-box .deny").unwrap();
    browser.wait("the denial in the timeline", t, |b| {
        b.text("#timeline").contains("denied by web:ann")
    });
    assert_eq!(
        browser.exec("return window.__marker", json!([])),
        "same page"
    );
    let seqs = browser.exec(
        "return [...document.querySelectorAll('#timeline li')].map(li => Number(li.dataset.seq))",
        json!([]),
    );
    let seqs: Vec<u64> = serde_json::from_value(seqs).unwrap();
    assert!(seqs.len() as u64 > before.as_u64().unwrap());
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1) && seqs[0] == 1,
        "the timeline has a gap or a repeat across the restart: {seqs:?}"
    );
    browser.wait("the model to hear the denial", t, |_| {
        llm.requests()
            .iter()
            .filter_map(FakeRequest::last_tool_result_text)
            .any(|o| o.contains(REASON))
    });
}

/// Each call's output sits under its own id, to the digit the log has: ids are above 2^53
/// (JavaScript's numbers would round neighbours to one value), so the API writes them as
/// strings.
fn each_calls_output_shows_under_its_logged_id(browser: &Browser, c: &Cluster) {
    let logged: Vec<String> = c
        .task_log_json("t-1")
        .iter()
        .filter(|r| r["kind"] == "tool_call_issued")
        .map(|r| {
            r["call_id"]
                .as_str()
                .expect("a call id is a string")
                .to_string()
        })
        .collect();
    assert!(logged.len() >= 2, "{logged:?}");
    assert!(
        logged.iter().all(|id| id.parse::<u64>().unwrap() > 1 << 53),
        "{logged:?}"
    );
    let shown = || -> Vec<String> {
        let v = browser.exec(
            "return [...document.querySelectorAll('#timeline pre.output')].map(p => p.dataset.call)",
            json!([]),
        );
        serde_json::from_value(v).unwrap()
    };
    // The page draws records as they stream in: wait until it has drawn them all.
    browser.wait(
        "every call's output on the page",
        Duration::from_secs(20),
        |_| shown().len() >= logged.len(),
    );
    let shown = shown();
    assert_eq!(shown, logged, "the page's call ids are the log's");
    let distinct: std::collections::HashSet<&String> = shown.iter().collect();
    assert_eq!(
        distinct.len(),
        shown.len(),
        "two calls share an id: {shown:?}"
    );
}

/// The lane picture shows both workers (`ids`), the move between them as one arrow (no
/// failover), and each approval wait shaded.
fn the_lanes_show_both_workers_and_the_move(browser: &Browser, t: Duration, ids: &[&str]) {
    browser.wait("both lanes", t, |b| {
        let lanes = lanes(b, "getAttribute('data-lanes')");
        ids.iter().all(|id| lanes.contains(id))
    });
    let arrow = browser.exec(
        "return document.querySelectorAll('svg.lanes line[data-move]').length",
        json!([]),
    );
    assert_eq!(arrow, json!(1), "one move arrow");
    let marks = browser.exec(
        "return [document.querySelector('svg.lanes line[data-move]').dataset.failover, document.querySelectorAll('svg.lanes rect[data-wait=approval]').length, document.querySelector('svg.lanes').textContent]",
        json!([]),
    );
    assert_eq!(marks[0], "no", "a move a person asked for is no failover");
    assert!(
        marks[1].as_u64() >= Some(3),
        "each approval wait is shaded: {marks}"
    );
    let labels = marks[2].as_str().unwrap();
    assert!(
        labels.contains("laptop") && labels.contains("bigbox"),
        "{labels}"
    );
}

/// A task run as attempts, from the form: its page shows the attempts side by side (status,
/// check, diff on demand), the winner marked, one lane per worker, and a timeline a person
/// reads (a command with its exit code, a write as the lines it wrote, the check's verdict)
/// with each raw record one click away. The screenshot is the README's.
#[test]
fn a_task_run_as_attempts_shows_them_side_by_side() {
    let browser = match Browser::start() {
        Ok(b) => b,
        Err(why) => return skip("chromium", &why),
    };
    let seeds = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let s = seeds.clone();
    let llm = FakeLlm::start(move |req| {
        let seed = req.body["seed"].as_u64().unwrap_or(0);
        let first = {
            let mut v = shared::locks::Lock::locked(&*s);
            if !v.contains(&seed) {
                v.push(seed);
            }
            v[0] == seed
        };
        // The first attempt to ask writes the wrong answer; the other the right one.
        let answer = if first { "41\n" } else { "42\n" };
        match req.assistant_turns() {
            0 => FakeReply::run("ls"),
            1 => FakeReply::tool_call(
                "write_file",
                json!({"path": "answer.txt", "content": answer}),
            ),
            _ => FakeReply::finish("wrote the answer"),
        }
    });
    let c = cluster(&llm);
    let one = c.join_worker("one");
    let two = c.join_worker("two");
    let t = Duration::from_secs(60);
    log_in(&browser, &c, t);
    start_from_the_form(&browser, &c, t, |b| {
        b.type_into("#goal", "write the answer to answer.txt")
            .unwrap();
        b.type_into("#model", "openai:gpt-4.1").unwrap();
        b.click("#permission option[value=full]").unwrap();
        b.type_into("#check", "test \"$(cat answer.txt)\" = 42")
            .unwrap();
        b.exec("document.querySelector('#attempts').value = '2'", json!([]));
        b.click("#pick option[value=smallest]").unwrap();
        b.click("#no_agents_md").unwrap();
    });
    c.wait_status("t-1", &["finished"], t);
    // The form's AGENTS.md switch reached the task.
    let created = c
        .task_log_json("t-1")
        .into_iter()
        .find(|r| r["kind"] == "created")
        .unwrap();
    assert_eq!(created["agent"]["no_agents_md"], json!(true), "{created}");

    // Side by side: two attempts, the winner marked and its check passing.
    browser.wait("both attempts, the winner marked", t, |b| {
        b.exec(
            "return document.querySelectorAll('#attempts .attempt').length",
            json!([]),
        ) == json!(2)
            && b.find("#attempts .attempt.won").is_some()
    });
    let won = browser.text("#attempts .attempt.won");
    assert!(
        won.contains("check: passes") && won.contains("won"),
        "{won}"
    );
    let all = browser.text("#attempts");
    assert!(all.contains("2 attempts (pick smallest)"), "{all}");
    assert!(all.contains("fails (exit code 1)"), "{all}");
    // Each attempt's diff, on demand: the winner's is the right answer.
    browser
        .click("#attempts .attempt.won .attempt-show-diff")
        .unwrap();
    browser.wait("the winner's diff", t, |b| {
        b.text("#attempts .attempt.won .attempt-diff")
            .contains("+42")
    });
    // One lane per worker.
    browser.wait("a lane per worker", t, |b| {
        let l = lanes(b, "getAttribute('data-lanes')");
        l.contains(&one.id) && l.contains(&two.id)
    });

    // An attempt's timeline in words: the command and its exit, the write as its lines, the
    // check's verdict; no JSON inline, the raw record behind a click.
    let winner = browser.exec(
        "return document.querySelector('#attempts .attempt.won').dataset.attempt",
        json!([]),
    );
    let winner = winner.as_str().unwrap().to_string();
    browser.goto(&format!("{}/#/task/{winner}", c.web_url()));
    browser.wait("the attempt's timeline", t, |b| {
        b.text("#timeline").contains("the check passes")
    });
    let tl = browser.text("#timeline");
    for want in [
        "$ ls",
        "→ exit 0",
        "wrote answer.txt (1 lines)",
        "+42",
        "the acceptance check:",
    ] {
        assert!(tl.contains(want), "{want:?} in the timeline:\n{tl}");
    }
    assert!(
        !tl.contains("{\"tool\""),
        "JSON inline in the timeline:\n{tl}"
    );
    // The summary loads beside the timeline: wait for it, not for a moment.
    browser.wait("the summary to name the attempts", t, |b| {
        b.text("#summary").contains("attempt ")
    });
    let raw = browser.exec(
        "const d = document.querySelector('#timeline li[data-kind=tool_call_issued] details.raw'); d.open = true; return d.querySelector('pre').textContent",
        json!([]),
    );
    let raw: serde_json::Value = serde_json::from_str(raw.as_str().unwrap()).unwrap();
    assert_eq!(raw["kind"], "tool_call_issued", "{raw}");

    the_list_groups_attempts_under_their_parent(&browser, &c, t);

    // The parent's page again, for the picture.
    browser.goto(&format!("{}/#/task/t-1", c.web_url()));
    browser.wait("the attempts, their lanes and the timeline again", t, |b| {
        let l = lanes(b, "textContent");
        b.find("#attempts .attempt.won").is_some()
            && l.contains("one")
            && l.contains("two")
            && b.text("#timeline").contains("won:")
    });
    keep_screenshot(&browser, "attempts-page.png");
}

/// The task list shows each attempt under its parent, and filters by words and by status
/// (a group stays whole when any of it matches).
fn the_list_groups_attempts_under_their_parent(browser: &Browser, c: &Cluster, t: Duration) {
    browser.goto(&format!("{}/#/", c.web_url()));
    let rows = || -> Vec<String> {
        let v = browser.exec(
            "return [...document.querySelectorAll('#tasks tr')].map(r => r.dataset.task + (r.classList.contains('attempt-row') ? ' attempt' : ''))",
            json!([]),
        );
        serde_json::from_value(v).unwrap()
    };
    browser.wait("the parent and its two attempts", t, |_| rows().len() == 3);
    let r = rows();
    assert_eq!(r[0], "t-1", "{r:?}");
    assert!(
        r[1].ends_with(" attempt") && r[2].ends_with(" attempt"),
        "{r:?}"
    );
    browser.set_size(1400, 900);
    keep_screenshot(browser, "tasks-1400.png");
    browser.type_into("#filter", "no such task").unwrap();
    browser.wait("nothing left by the filter", t, |_| rows().is_empty());
    assert_eq!(browser.text("#count"), "0 of 1 task");
    browser.exec(
        "const f = document.querySelector('#filter'); f.value = 'answer'; f.dispatchEvent(new Event('input'))",
        json!([]),
    );
    browser.wait("the group again", t, |_| rows().len() == 3);
    browser
        .click("#filter-status option[value=active]")
        .unwrap();
    browser.wait("no active task", t, |_| rows().is_empty());
    browser.click("#filter-status option[value=ended]").unwrap();
    browser.wait("the ended group", t, |_| rows().len() == 3);
    browser.set_size(1280, 1000);
}
