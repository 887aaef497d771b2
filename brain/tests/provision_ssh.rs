//! The ssh provider against a real OpenSSH server on a "remote host": a network namespace
//! with its own address (a loopback port where namespaces are unavailable), a throw-away user
//! and keys. The brain's ssh config decides about host keys, as a user's would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use testkit::sshd::SshHost;
use testkit::{
    BrainOptions, Cluster, assert_said, pids_mentioning, processes_started_in, stdout, text,
    wait_until,
};

type Host = SshHost;

/// The ssh host, or None (the test is skipped, saying why) where sshd cannot run here.
fn host() -> Option<Host> {
    SshHost::start()
        .map_err(|why| testkit::skip("sshd", &why))
        .ok()
}

/// A brain the host can reach, with `config` (TOML) if given.
fn cluster(h: &Host, config: Option<String>) -> Cluster {
    Cluster::start_with(BrainOptions {
        config,
        listen_host: "0.0.0.0".into(),
        init_args: vec!["--host".into(), h.brain_host.clone()],
        ..BrainOptions::default()
    })
}

/// The brain's config for ssh provisioning through `cfg`, with `more` under `[provision]`.
fn ssh_config(cfg: &Path, more: &str) -> Option<String> {
    Some(format!(
        "[provision]\nreaper_every = \"200ms\"\n{more}[provision.ssh]\nconfig_file = \"{}\"\n",
        cfg.display()
    ))
}

/// Makes the host's real key the one `known_hosts` holds.
fn trust(h: &Host) {
    std::fs::write(
        h.tmp.join("known_hosts"),
        format!("{}\n", h.sshd.known_hosts_line),
    )
    .unwrap();
}

/// Waits for no process of the host's user's `dir` to be left; panics saying `what`.
fn none_left_in(dir: &Path, what: &str) {
    assert!(
        wait_until(Duration::from_secs(10), || pids_mentioning(dir).is_empty()),
        "{what}"
    );
}

fn provision(c: &Cluster, h: &Host) -> std::process::Output {
    let url = format!("https://{}:{}", h.brain_host, c.port);
    c.brain_cli(&[
        "provision",
        "ssh",
        &h.sshd.host,
        "--brain-url",
        &url,
        "--wait",
        "60s",
    ])
}

fn installed(home: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(home)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn an_ssh_host_gets_a_worker_that_runs_commands_and_is_left_clean_on_release() {
    let Some(h) = host() else { return };
    let cfg = h.write_ssh_config("yes");
    let mut c = cluster(&h, ssh_config(&cfg, ""));
    let home = h.sshd.home.clone();

    // An unknown host key is refused, and nothing is left behind.
    std::fs::write(h.tmp.join("known_hosts"), "").unwrap();
    let out = provision(&c, &h);
    assert!(!out.status.success(), "an unknown host key was accepted");
    let msg = text(&out);
    assert!(
        msg.contains("host key") && msg.contains("not in known_hosts"),
        "{msg}"
    );
    assert!(installed(&home).iter().all(|p| !p.ends_with(".tether")));

    // A changed one too.
    let other = h.tmp.join("other_host_key");
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&other)
            .status()
            .unwrap()
            .success()
    );
    let wrong = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let mut f = wrong.split_whitespace();
    let name = h.sshd.known_hosts_line.split_whitespace().next().unwrap();
    std::fs::write(
        h.tmp.join("known_hosts"),
        format!("{name} {} {}\n", f.next().unwrap(), f.next().unwrap()),
    )
    .unwrap();
    let out = provision(&c, &h);
    assert!(!out.status.success(), "a changed host key was accepted");
    assert_said(&out, "CHANGED");
    assert!(
        c.machines(true).iter().all(|m| m["state"] == "failed"),
        "{:?}",
        c.machines(true)
    );

    // The right key: the worker is installed, joins and runs commands there.
    trust(&h);
    let out = provision(&c, &h);
    assert!(out.status.success(), "{}", text(&out));
    let (id, worker) = c.ready_machine();
    let out = c.brain_cli(&[
        "exec",
        "--workspace",
        "w",
        &worker,
        "--",
        "sh",
        "-c",
        "id -un; echo $((6*7))",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&h.sshd.user) && stdout.contains("42"),
        "{stdout}"
    );
    let pids = processes_started_in(&home.join(".tether"));
    assert_eq!(pids.len(), 1, "one worker process on the host");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pids[0])).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("tj_"));
    let dir = std::fs::read_dir(home.join(".tether"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
        .join(&id);
    assert!(dir.join("worker").exists(), "the binary was copied");
    assert!(!dir.join("token").exists(), "the token file was left");

    // Release: no process, no files.
    let out = c.brain_cli(&["machines", "release", &id]);
    assert!(out.status.success(), "{}", text(&out));
    none_left_in(&home, "a worker process is left on the host");
    assert!(!home.join(".tether").exists(), "{:?}", installed(&home));

    // The brain is SIGKILLed after the host started the worker, before the record says so:
    // after a restart the machine is found over ssh and adopted.
    c.kill_brain();
    c.opts.env = vec![("TETHER_FAILPOINT".into(), "provision-created".into())];
    c.start_brain().unwrap();
    let out = provision(&c, &h);
    assert!(!out.status.success(), "the brain should have died");
    c.kill_brain();
    c.start_brain().unwrap();
    // Which record it was: the newest.
    let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
    // Either outcome is clean: adopted (it joins with its token and serves), or, when the
    // crash also cost it its token (used by an enrolment whose answer never arrived), closed
    // with nothing left on the host.
    let m = c.wait_settled(&id, Duration::from_secs(30));
    if m["state"] == "ready" {
        eprintln!("the interrupted machine was adopted");
        assert_eq!(processes_started_in(&home.join(".tether")).len(), 1);
        let out = c.brain_cli(&["machines", "release", &id]);
        assert!(out.status.success(), "{}", text(&out));
    } else {
        eprintln!("the interrupted machine was closed: {}", m["note"]);
    }
    none_left_in(&home, "a worker process is left on the host");
    assert!(!home.join(".tether").exists());
}

/// The agent asks for a bigger machine: it needs approval (the offer costs more than the
/// threshold), gets an ssh-provisioned worker, moves there with its workspace, finishes
/// there, and the small ephemeral machine it left is released.
#[test]
fn request_environment_moves_a_task_to_an_ssh_machine_and_releases_the_old_one() {
    let Some(h) = host() else { return };
    let cfg = h.write_ssh_config("yes");
    trust(&h);
    let mut c = cluster(&h, None);
    // The offer names the brain's address as the host sees it, port included.
    c.kill_brain();
    std::fs::write(
        c.data.join("config.toml"),
        format!(
            "[provision]\nreaper_every = \"200ms\"\napproval_above_usd_per_hour = 1.0\n\
             [provision.ssh]\nconfig_file = \"{cfg}\"\n\
             [[provision.offers]]\nprovider = \"ssh\"\ndestination = \"{host}\"\ncpu = 8\nmemory_gb = 1\n\
             usd_per_hour = 1.5\nbrain_url = \"https://{bh}:{port}\"\nlabels = {{ size = \"large\" }}\n",
            cfg = cfg.display(),
            host = h.sshd.host,
            bh = h.brain_host,
            port = c.port
        ),
    )
    .unwrap();
    c.start_brain().unwrap();

    // The task starts on a small ephemeral machine.
    let out = c.brain_cli(&["provision", "local", "--name", "small"]);
    assert!(out.status.success(), "{}", text(&out));
    let small: serde_json::Value = c
        .machines(true)
        .into_iter()
        .find(|m| m["provider"] == "local")
        .unwrap();
    let small_id = small["id"].as_str().unwrap().to_string();
    let small_worker = small["worker_id"].as_str().unwrap().to_string();

    let task = c
        .agent()
        .replay(&[
            ("run_command", serde_json::json!({"command": "echo started-here > where.txt"})),
            ("request_environment", serde_json::json!({"cpu": 8, "labels": {"size": "large"}, "reason": "the build needs 8 cores"})),
            ("run_command", serde_json::json!({"command": "id -un > who.txt; cat where.txt >> who.txt"})),
            ("finish", serde_json::json!({"summary": "built on the big box"})),
        ])
        .worker(&small_worker)
        .start("build it");

    // $1.50/h is over the $1.00/h threshold: a person approves.
    c.wait_status(&task, &["waiting"], Duration::from_secs(60));
    let out = c.brain_cli(&["task", "show", &task]);
    assert!(
        stdout(&out).contains("a new machine at $1.50/h"),
        "{}",
        stdout(&out)
    );
    let out = c.brain_cli(&["approve", &task]);
    assert!(out.status.success(), "{}", text(&out));
    c.wait_status(&task, &["finished"], Duration::from_secs(120));

    // It finished on the ssh machine, created for this task.
    let big = c
        .machines(true)
        .into_iter()
        .find(|m| m["provider"] == "ssh" && m["state"] == "ready")
        .expect("an ssh machine");
    assert_eq!(big["task_id"], task.as_str());
    assert_eq!(big["labels"]["size"], "large");
    let big_worker = big["worker_id"].as_str().unwrap();
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let out = c.brain_cli(&["file", "read", big_worker, "who.txt", "--workspace", &ws]);
    assert!(out.status.success(), "{}", text(&out));
    let who = stdout(&out);
    assert!(
        who.contains(&h.sshd.user) && who.contains("started-here"),
        "the last command ran elsewhere, or the workspace did not come along: {who}"
    );
    let log = stdout(&c.brain_cli(&["task", "log", &task, "--json"]));
    assert!(
        log.contains("MoveCompleted") || log.contains("move_completed"),
        "{log}"
    );
    assert!(log.contains("now running on machine"), "{log}");
    assert!(log.contains("was released"), "{log}");

    // The small machine is gone.
    let small = c
        .machines(true)
        .into_iter()
        .find(|m| m["id"] == small_id.as_str())
        .unwrap();
    assert_eq!(small["state"], "released", "{small}");
    let small_dir = c.data.join("machines").join(&small_id);
    none_left_in(&small_dir, "the old worker process is left");
    assert!(!small_dir.exists());

    let out = c.brain_cli(&["machines", "release", big["id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    none_left_in(&h.sshd.home, "a worker process is left on the host");
}

/// Runs `command` on the host over ssh, with `stdin` fed from a file if given.
fn on_host(h: &Host, command: &str, stdin: Option<&Path>) -> std::process::Output {
    let mut cmd = h.sshd.ssh(&[&h.sshd.dest(), command]);
    if let Some(f) = stdin {
        cmd.stdin(std::fs::File::open(f).unwrap());
    }
    cmd.output().unwrap()
}

/// Copies `deploy/install-worker.sh` and the worker binary to the host: the command that
/// installs it there, joining with a fresh token (its flags after it), and the binary's
/// SHA-256 it names.
fn installer(h: &Host, c: &Cluster) -> (String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/install-worker.sh");
    let out = on_host(h, "cat > install-worker.sh", Some(&script));
    assert!(out.status.success(), "{}", text(&out));
    let out = on_host(h, "cat > worker.bin", Some(&c.bins.worker));
    assert!(out.status.success(), "{}", text(&out));
    let sum = std::process::Command::new("sha256sum")
        .arg(&c.bins.worker)
        .output()
        .unwrap();
    let sum = stdout(&sum).split_whitespace().next().unwrap().to_string();
    let (token, ca_hash) = c.token(&[]);
    let url = format!("https://{}:{}", h.brain_host, c.port);
    let install = format!(
        "sh install-worker.sh --brain {url} --token {token} --ca-hash {ca_hash} --binary ./worker.bin --sha256 {sum}"
    );
    (install, sum)
}

/// `deploy/install-worker.sh`, run over ssh on the host as its (unprivileged) user, installs
/// a worker that joins and runs commands; a second run changes nothing; uninstall removes it.
#[test]
fn install_worker_sh_over_ssh_installs_a_worker_that_joins_and_runs_commands() {
    let Some(h) = host() else { return };
    let c = cluster(&h, None);
    let (install, sum) = installer(&h, &c);
    let install = format!("{install} --name inst --label via=script");

    // A wrong checksum installs nothing.
    let bad = install.replace(&sum, &"0".repeat(64));
    let out = on_host(&h, &bad, None);
    assert!(!out.status.success(), "a bad checksum was accepted");
    assert!(!h.sshd.home.join(".local/bin/tether-worker").exists());

    let out = on_host(&h, &install, None);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("enrolled"), "{said}");
    assert!(
        wait_until(Duration::from_secs(30), || c
            .worker_state("inst")
            .as_deref()
            == Some("connected")),
        "the installed worker did not connect: {said}"
    );
    let w = c
        .workers()
        .into_iter()
        .find(|w| w["name"] == "inst")
        .unwrap();
    assert_eq!(w["labels"]["via"], "script");
    let id = w["id"].as_str().unwrap().to_string();
    let out = c.brain_cli(&["exec", "--workspace", "w", &id, "--", "id", "-un"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(stdout(&out).trim(), h.sshd.user);

    // Again: nothing to do, no second enrolment (the token is spent anyway).
    let out = on_host(&h, &install, None);
    assert!(out.status.success(), "{}", text(&out));
    assert_said(&out, "unchanged");
    assert_eq!(
        c.workers().iter().filter(|w| w["name"] == "inst").count(),
        1,
        "enrolled twice"
    );

    let out = on_host(&h, "sh install-worker.sh --uninstall --purge", None);
    assert!(out.status.success(), "{}", text(&out));
    none_left_in(&h.sshd.home, "a worker process is left on the host");
    assert!(!h.sshd.home.join(".local/bin/tether-worker").exists());
    assert!(!h.sshd.home.join(".local/share/tether-worker").exists());
}

/// The dead-man switch on an ssh host: the brain SIGKILLed and kept down past
/// `worker_exit_after`, the worker there exits and removes everything installed for it.
#[test]
fn an_ssh_worker_whose_brain_stays_away_exits_and_removes_what_was_installed() {
    let Some(h) = host() else { return };
    let cfg = h.write_ssh_config("no");
    let mut c = cluster(&h, ssh_config(&cfg, "worker_exit_after = \"2s\"\n"));
    let out = provision(&c, &h);
    assert!(out.status.success(), "{}", text(&out));
    let home = h.sshd.home.clone();
    let dot = home.join(".tether");
    let machine_dirs = || -> Vec<PathBuf> {
        std::fs::read_dir(&dot)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|brain| {
                std::fs::read_dir(brain.path())
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .map(|e| e.path())
            .collect()
    };
    let dirs = machine_dirs();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(
        !processes_started_in(&dirs[0]).is_empty(),
        "the worker runs"
    );
    c.kill_brain();
    assert!(
        wait_until(Duration::from_secs(30), || processes_started_in(&dirs[0])
            .is_empty()),
        "the worker on the host kept running without its brain"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !dirs[0].exists()),
        "what was installed for the machine is left: {:?}",
        installed(&dirs[0])
    );
}

/// An EC2 instance's dead-man switch, on the ssh host standing in for it: the worker as the
/// instance's user data installs it (`install-worker.sh --ephemeral`) gives up on a brain
/// that stays away and runs its power-off step (here a `poweroff` on the user's PATH that
/// records being called; on EC2 the instance, launched with shutdown-means-terminate, ends).
#[test]
fn an_ephemeral_worker_powers_its_machine_off_when_its_brain_stays_away() {
    let Some(h) = host() else { return };
    let mut c = cluster(&h, None);
    let (install, _) = installer(&h, &c);
    let stub = h.tmp.join("poweroff");
    std::fs::write(
        &stub,
        "#!/bin/sh\necho \"powered off by $(id -un)\" > \"$HOME/powered-off\"\n",
    )
    .unwrap();
    assert!(
        on_host(
            &h,
            "mkdir -p stub && cat > stub/poweroff && chmod 755 stub/poweroff",
            Some(&stub)
        )
        .status
        .success()
    );
    let out = on_host(
        &h,
        &format!("PATH=\"$HOME/stub:$PATH\" {install} --name eph --ephemeral 2s"),
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        wait_until(Duration::from_secs(30), || c.worker_state("eph").as_deref()
            == Some("connected")),
        "the installed worker did not connect"
    );
    let marker = h.sshd.home.join("powered-off");
    assert!(!marker.exists());
    c.kill_brain();
    assert!(
        wait_until(Duration::from_secs(30), || marker.exists()),
        "the worker did not run its power-off step"
    );
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap().trim(),
        format!("powered off by {}", h.sshd.user)
    );
    none_left_in(&h.sshd.home, "the worker kept running");
}
