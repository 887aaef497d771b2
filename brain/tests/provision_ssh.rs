//! The ssh provider against a real OpenSSH server on a "remote host": a network namespace
//! with its own address (a loopback port where namespaces are unavailable), a throw-away user
//! and keys. The brain's ssh config decides about host keys, as a user's would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use testkit::netns::Netns;
use testkit::sshd::Sshd;
use testkit::{BrainOptions, Cluster, pids_mentioning, text, wait_until};

struct Host {
    sshd: Sshd,
    // Dropped after sshd.
    _ns: Option<Netns>,
    tmp: PathBuf,
    /// The address the host reaches the brain on.
    brain_host: String,
}

impl Drop for Host {
    fn drop(&mut self) {
        for pid in pids_mentioning(&self.sshd.home) {
            // SAFETY: kill(2) has no memory-safety requirements.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// A host with sshd, or why there cannot be one.
fn host() -> Result<Host, String> {
    let tmp = std::env::temp_dir().join(format!("tether-ssh-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| e.to_string())?;
    // The throw-away user must reach its home inside.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let ns = match Netns::create() {
        Ok(ns) => Some(ns),
        Err(why) => {
            eprintln!("no network namespace ({why}); the host is a loopback port instead");
            None
        }
    };
    let sshd = Sshd::start_in(&tmp, ns.as_ref())?;
    let brain_host = ns
        .as_ref()
        .map(|n| n.host_ip.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    Ok(Host {
        sshd,
        _ns: ns,
        tmp,
        brain_host,
    })
}

fn write_ssh_config(h: &Host, strict: &str) -> PathBuf {
    let cfg = h.tmp.join("ssh_config");
    std::fs::write(
        &cfg,
        format!(
            "Host {host}\n  User {user}\n  Port {port}\n  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n  StrictHostKeyChecking {strict}\n  LogLevel ERROR\n",
            host = h.sshd.host,
            user = h.sshd.user,
            port = h.sshd.port,
            key = h.sshd.key.display(),
            kh = h.tmp.join("known_hosts").display(),
        ),
    )
    .unwrap();
    cfg
}

fn machines(c: &Cluster) -> Vec<serde_json::Value> {
    let out = c.brain_cli(&["machines", "--json", "--all"]);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
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
    let h = match host() {
        Ok(h) => h,
        Err(why) => {
            eprintln!("SKIPPED: no ssh host can run here: {why}");
            return;
        }
    };
    let cfg = write_ssh_config(&h, "yes");
    let mut c = Cluster::start_with(BrainOptions {
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\n[provision.ssh]\nconfig_file = \"{}\"\n",
            cfg.display()
        )),
        listen_host: "0.0.0.0".into(),
        init_args: vec!["--host".into(), h.brain_host.clone()],
        ..BrainOptions::default()
    });
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
    assert!(text(&out).contains("CHANGED"), "{}", text(&out));
    assert!(
        machines(&c).iter().all(|m| m["state"] == "failed"),
        "{:?}",
        machines(&c)
    );

    // The right key: the worker is installed, joins and runs commands there.
    std::fs::write(
        h.tmp.join("known_hosts"),
        format!("{}\n", h.sshd.known_hosts_line),
    )
    .unwrap();
    let out = provision(&c, &h);
    assert!(out.status.success(), "{}", text(&out));
    let m = machines(&c)
        .into_iter()
        .find(|m| m["state"] == "ready")
        .expect("a ready machine");
    let id = m["id"].as_str().unwrap().to_string();
    let worker = m["worker_id"].as_str().unwrap().to_string();
    assert_eq!(m["connected"], true);
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
    let pids = pids_mentioning(&home.join(".tether"));
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
    assert!(
        wait_until(Duration::from_secs(10), || pids_mentioning(&home)
            .is_empty()),
        "a worker process is left on the host"
    );
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
    let id = machines(&c)[0]["id"].as_str().unwrap().to_string();
    // Either outcome is clean: adopted (it joins with its token and serves), or, when the
    // crash also cost it its token (used by an enrolment whose answer never arrived), closed
    // with nothing left on the host.
    let settled = |m: &serde_json::Value| {
        (m["state"] == "ready" && m["connected"] == true)
            || m["state"] == "failed"
            || m["state"] == "released"
    };
    assert!(
        wait_until(Duration::from_secs(30), || machines(&c)
            .iter()
            .any(|m| m["id"] == id.as_str() && settled(m))),
        "not settled: {:?}",
        machines(&c)
    );
    let m = machines(&c)
        .into_iter()
        .find(|m| m["id"] == id.as_str())
        .unwrap();
    if m["state"] == "ready" {
        eprintln!("the interrupted machine was adopted");
        assert_eq!(pids_mentioning(&home.join(".tether")).len(), 1);
        let out = c.brain_cli(&["machines", "release", &id]);
        assert!(out.status.success(), "{}", text(&out));
    } else {
        eprintln!("the interrupted machine was closed: {}", m["note"]);
    }
    assert!(wait_until(Duration::from_secs(10), || pids_mentioning(
        &home
    )
    .is_empty()));
    assert!(!home.join(".tether").exists());
}
