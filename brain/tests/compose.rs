//! `deploy/compose.yaml` and `deploy/compose.replicas.yaml` for real: images from
//! `deploy/Dockerfile.*` (on scratch bases: no registry), `docker-compose up`, both workers
//! enrol by themselves; a task runs on one and moves to the other, and a task outlives the
//! replica driving it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{docker, out, rand_tag};
use testkit::{replay_turn, text, wait_until};

struct Project {
    name: String,
    /// The compose file under deploy/.
    file: &'static str,
    /// The brain's image, the worker's, then any others to remove afterwards.
    images: Vec<String>,
    /// More of the compose file's variables.
    vars: Vec<(&'static str, String)>,
}

impl Project {
    fn command(&self, args: &[&str]) -> Command {
        let file = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy")
            .join(self.file);
        let mut c = Command::new("docker-compose");
        c.arg("-p")
            .arg(&self.name)
            .arg("-f")
            .arg(file)
            .args(args)
            .env("TETHER_BRAIN_IMAGE", &self.images[0])
            .env("TETHER_WORKER_IMAGE", &self.images[1])
            .envs(self.vars.iter().map(|(k, v)| (k, v)));
        c
    }

    fn compose(&self, args: &[&str]) -> std::process::Output {
        self.command(args).output().expect("run docker-compose")
    }

    /// `brain ARGS` inside the `service` container, as its admin.
    fn brain_on(&self, service: &str, args: &[&str]) -> std::process::Output {
        let mut all = vec![
            "exec",
            "-T",
            service,
            "brain",
            "--brain",
            "https://127.0.0.1:7443",
        ];
        all.extend_from_slice(args);
        self.compose(&all)
    }

    fn brain(&self, args: &[&str]) -> std::process::Output {
        self.brain_on("brain", args)
    }

    /// Starts a task on worker-1 through the first of `brains` (each gets the transcript),
    /// asking before each step: it writes `a.txt` with `content`, runs `command`, finishes.
    /// Returns its id.
    fn start_write_then_run(
        &self,
        brains: &[&str],
        content: &str,
        command: &str,
        goal: &str,
    ) -> String {
        let transcript = [
            replay_turn(
                1,
                "write_file",
                serde_json::json!({"path": "a.txt", "content": content}),
            ),
            replay_turn(2, "run_command", serde_json::json!({"command": command})),
            replay_turn(3, "finish", serde_json::json!({"summary": "done"})),
        ]
        .join("\n");
        for b in brains {
            self.write(b, "/tmp/t.jsonl", &transcript);
        }
        let o = self.brain_on(
            brains[0],
            &[
                "run",
                "--detach",
                "--model",
                "replay:/tmp/t.jsonl",
                "--permission",
                "ask",
                "--worker",
                "worker-1",
                goal,
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        out(&o)
    }

    fn workers_on(&self, service: &str) -> Vec<serde_json::Value> {
        let o = self.brain_on(service, &["workers", "--json"]);
        serde_json::from_slice(&o.stdout).unwrap_or_default()
    }

    fn workers(&self) -> Vec<serde_json::Value> {
        self.workers_on("brain")
    }

    /// Writes `content` to `path` inside the `service` container.
    fn write(&self, service: &str, path: &str, content: &str) {
        let script = format!("cat > {path}");
        let mut child = self
            .command(&["exec", "-T", service, "sh", "-c", &script])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(content.as_bytes())
                .unwrap();
        }
        assert!(child.wait().unwrap().success());
    }

    /// `brain task show TASK` through `service` once it contains `what`.
    fn show_until(&self, service: &str, task: &str, what: &str) -> String {
        let mut last = String::new();
        let seen = wait_until(Duration::from_secs(90), || {
            let o = self.brain_on(service, &["task", "show", task]);
            last = String::from_utf8_lossy(&o.stdout).into_owned();
            last.contains(what)
        });
        assert!(
            seen,
            "never {what} through {service}: {last}\n{}",
            self.logs()
        );
        last
    }

    fn logs(&self) -> String {
        text(&self.compose(&["logs", "--no-color", "--tail", "40"]))
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
    if !compose_usable() {
        return;
    }
    let bins = testkit::Bins::locate();
    let t = rand_tag();
    let base = format!("tether-test-base:{t}");
    let p = Project {
        name: format!("tethertest{}", t.replace('-', "")),
        file: "compose.yaml",
        vars: Vec::new(),
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
        p.logs()
    );

    // A task on worker-1 that waits for approval before its second step; it is moved to
    // worker-2 meanwhile and finishes there with the workspace it had.
    let task = p.start_write_then_run(
        &["brain"],
        "made on worker-1\n",
        "cat a.txt > b.txt; echo moved >> b.txt",
        "move me",
    );
    p.show_until("brain", &task, "approval #1");
    assert!(p.brain(&["approve", &task]).status.success());
    p.show_until("brain", &task, "approval #2");
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
    p.show_until("brain", &task, &w2);
    assert!(p.brain(&["approve", &task]).status.success());
    p.show_until("brain", &task, "finished");
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let o = p.brain(&["file", "read", "worker-2", "b.txt", "--workspace", &ws]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "made on worker-1\nmoved\n"
    );
}

/// Whether Docker and docker-compose run here; says why not (a skip, or a failure where CI
/// requires them) when they do not.
fn compose_usable() -> bool {
    if let Some(why) = common::unusable() {
        testkit::skip("docker", &why);
        return false;
    }
    if Command::new("docker-compose")
        .arg("version")
        .output()
        .is_err()
    {
        testkit::skip("compose", "docker-compose is not installed");
        return false;
    }
    true
}

/// A secret of `bytes` random bytes, in hex.
fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

#[test]
fn the_replicas_deployment_keeps_a_task_going_when_the_replica_driving_it_is_killed() {
    if !compose_usable() {
        return;
    }
    let pg_dirs = match testkit::postgres::install_dirs() {
        Ok(d) => d,
        Err(why) => {
            testkit::skip("postgres", &why);
            return;
        }
    };
    let bins = testkit::Bins::locate();
    let t = rand_tag();
    let base = format!("tether-test-base:{t}");
    let pg_base = format!("tether-test-pg-base:{t}");
    let p = Project {
        name: format!("tetherha{}", t.replace('-', "")),
        file: "compose.replicas.yaml",
        images: vec![
            format!("tether-test-brain:{t}"),
            format!("tether-test-worker:{t}"),
            format!("tether-test-postgres:{t}"),
            base.clone(),
            pg_base.clone(),
        ],
        vars: vec![
            ("TETHER_DB_PASSWORD", random_hex(16)),
            ("TETHER_SECRET_KEY", random_hex(32)),
            ("TETHER_POSTGRES_IMAGE", format!("tether-test-postgres:{t}")),
        ],
    };
    let all: [&Path; 2] = [&bins.brain, &bins.worker];
    let pg: Vec<&Path> = pg_dirs.iter().map(PathBuf::as_path).collect();
    // PostgreSQL's image (its base holds the server's whole tree) builds beside ours.
    std::thread::scope(|s| {
        let postgres = s.spawn(|| common::build("postgres", &pg_base, &p.images[2], &pg));
        common::build("brain", &base, &p.images[0], &all).unwrap();
        common::build("worker", &base, &p.images[1], &all).unwrap();
        postgres.join().unwrap().unwrap();
    });
    let up = p.compose(&["up", "-d"]);
    assert!(up.status.success(), "{}", text(&up));

    // Both workers enrol through brain-1, with the tokens it minted; brain-2 reads them from
    // the database.
    assert!(
        wait_until(Duration::from_secs(120), || {
            let w = p.workers_on("brain-2");
            w.len() == 2 && w.iter().all(|w| w["state"] == "connected")
        }),
        "workers through brain-2: {:?}\n{}",
        p.workers_on("brain-2"),
        p.logs()
    );

    // A task started through brain-2 on worker-1 (connected to brain-1, the first it knows),
    // approved through brain-2 and so handed to brain-1, which drives it.
    // The replay file is read by whichever replica drives the task: both have it.
    let task = p.start_write_then_run(
        &["brain-2", "brain-1"],
        "before\n",
        "cat a.txt >> b.txt; echo after >> b.txt",
        "outlive a replica",
    );
    p.show_until("brain-2", &task, "approval #1");
    let o = p.brain_on("brain-2", &["approve", &task]);
    assert!(o.status.success(), "{}", text(&o));
    p.show_until("brain-2", &task, "approval #2");

    // worker-1's session is on brain-1, so brain-1 drives its task.
    let via = |p: &Project| {
        p.workers_on("brain-2")
            .into_iter()
            .find(|w| w["name"] == "worker-1")
            .map(|w| w["replica"].clone())
    };
    assert_eq!(via(&p), Some("brain-1".into()));
    // brain-1 dies (SIGKILL); worker-1 moves to brain-2, which takes the task over and goes on
    // from the second approval.
    let o = p.compose(&["kill", "-s", "SIGKILL", "brain-1"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        wait_until(Duration::from_secs(90), || {
            p.brain_on("brain-2", &["approve", &task]).status.success()
        }),
        "the second approval through brain-2 never went through\n{}",
        p.logs()
    );
    p.show_until("brain-2", &task, "finished");
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let o = p.brain_on(
        "brain-2",
        &["file", "read", "worker-1", "b.txt", "--workspace", &ws],
    );
    assert!(o.status.success(), "{}", text(&o));
    // The command appends: had it run twice across the take-over, b.txt would say so.
    assert_eq!(String::from_utf8_lossy(&o.stdout), "before\nafter\n");
}
