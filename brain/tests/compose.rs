//! `deploy/compose.yaml` for real: images from `deploy/Dockerfile.brain` and
//! `deploy/Dockerfile.worker` (on a scratch base: no registry), `docker-compose up`, both
//! workers enrol by themselves, and a task runs on one and moves to the other.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{docker, out, rand_tag};
use testkit::{replay_turn, text, wait_until};

struct Project {
    name: String,
    images: Vec<String>,
}

impl Project {
    fn compose(&self, args: &[&str]) -> std::process::Output {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose.yaml");
        Command::new("docker-compose")
            .arg("-p")
            .arg(&self.name)
            .arg("-f")
            .arg(file)
            .args(args)
            .env("TETHER_BRAIN_IMAGE", &self.images[0])
            .env("TETHER_WORKER_IMAGE", &self.images[1])
            .output()
            .expect("run docker-compose")
    }

    /// `brain ARGS` inside the brain container, as its admin.
    fn brain(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec![
            "exec",
            "-T",
            "brain",
            "brain",
            "--brain",
            "https://127.0.0.1:7443",
        ];
        all.extend_from_slice(args);
        self.compose(&all)
    }

    fn workers(&self) -> Vec<serde_json::Value> {
        let o = self.brain(&["workers", "--json"]);
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        self.compose(&["down", "-v", "--remove-orphans", "-t", "2"]);
        for i in &self.images {
            docker(&["rmi", "-f", i]);
        }
    }
}

#[test]
fn the_compose_deployment_enrols_two_workers_and_moves_a_task_between_them() {
    if let Some(why) = common::unusable() {
        testkit::skip("docker", &why);
        return;
    }
    if Command::new("docker-compose")
        .arg("version")
        .output()
        .is_err()
    {
        testkit::skip("compose", "docker-compose is not installed");
        return;
    }
    let bins = testkit::Bins::locate();
    let t = rand_tag();
    let base = format!("tether-test-base:{t}");
    let p = Project {
        name: format!("tethertest{}", t.replace('-', "")),
        images: vec![
            format!("tether-test-brain:{t}"),
            format!("tether-test-worker:{t}"),
            base.clone(),
        ],
    };
    let all: [&Path; 2] = [&bins.brain, &bins.worker];
    common::build("brain", &base, &p.images[0], &all).unwrap();
    common::build("worker", &base, &p.images[1], &all).unwrap();
    let up = p.compose(&["up", "-d"]);
    assert!(up.status.success(), "{}", text(&up));

    // Both workers enrol with the tokens the brain container minted for them.
    assert!(
        wait_until(Duration::from_secs(90), || {
            let w = p.workers();
            w.len() == 2 && w.iter().all(|w| w["state"] == "connected")
        }),
        "workers: {:?}\n{}",
        p.workers(),
        text(&p.compose(&["logs", "--no-color", "--tail", "40"]))
    );

    // A task on worker-1 that waits for approval before its second step; it is moved to
    // worker-2 meanwhile and finishes there with the workspace it had.
    let transcript = [
        replay_turn(
            1,
            "write_file",
            serde_json::json!({"path": "a.txt", "content": "made on worker-1\n"}),
        ),
        replay_turn(
            2,
            "run_command",
            serde_json::json!({"command": "cat a.txt > b.txt; echo moved >> b.txt"}),
        ),
        replay_turn(3, "finish", serde_json::json!({"summary": "done"})),
    ]
    .join("\n");
    let mut write = Command::new("docker-compose");
    write
        .args(["-p", &p.name, "-f"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose.yaml"))
        .args(["exec", "-T", "brain", "sh", "-c", "cat > /tmp/t.jsonl"])
        .env("TETHER_BRAIN_IMAGE", &p.images[0])
        .env("TETHER_WORKER_IMAGE", &p.images[1])
        .stdin(std::process::Stdio::piped());
    let mut child = write.spawn().unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(transcript.as_bytes())
            .unwrap();
    }
    assert!(child.wait().unwrap().success());
    let o = p.brain(&[
        "run",
        "--detach",
        "--model",
        "replay:/tmp/t.jsonl",
        "--permission",
        "ask",
        "--worker",
        "worker-1",
        "move me",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let task = out(&o);
    let status = |p: &Project| {
        let o = p.brain(&["task", "show", &task]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let wait_for = |p: &Project, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = status(p);
            if s.contains(what) {
                return s;
            }
            assert!(Instant::now() < deadline, "never {what}: {s}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for(&p, "approval #1");
    assert!(p.brain(&["approve", &task]).status.success());
    wait_for(&p, "approval #2");
    let o = p.brain(&["task", "move", &task, "--to", "worker-2"]);
    assert!(o.status.success(), "{}", text(&o));
    let w2 = p
        .workers()
        .into_iter()
        .find(|w| w["name"] == "worker-2")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !status(&p).contains(&w2) {
        assert!(Instant::now() < deadline, "not moved: {}", status(&p));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(p.brain(&["approve", &task]).status.success());
    wait_for(&p, "finished");
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let o = p.brain(&["file", "read", "worker-2", "b.txt", "--workspace", &ws]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "made on worker-1\nmoved\n"
    );
}
