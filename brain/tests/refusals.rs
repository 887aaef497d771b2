//! Every refusal the foundation promises, each asserted against real processes: missing or
//! foreign certificates, revoked identities, spent and expired tokens, a wrong CA pin, a
//! worker certificate used as an admin, and paths that try to leave the workspace.

use std::path::Path;
use std::time::Duration;

use brain::trust::ca::Ca;
use proto::admin_client::AdminClient;
use proto::worker_session_client::WorkerSessionClient;
use shared::pki::{self, IdentityFiles, Role};
use shared::tls::{BrainAddr, DialOptions};
use testkit::{Cluster, assert_failed_stderr_says, assert_stderr_says, assert_stdout_says, text};

/// `worker join --no-run` as `name` with `token`, pinning the CA to `ca_hash`.
fn try_join(c: &Cluster, name: &str, token: &str, ca_hash: &str) -> std::process::Output {
    c.join_cmd(name, token, ca_hash)
        .arg("--no-run")
        .output()
        .unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A TLS client that trusts the brain's CA but presents no certificate.
fn anonymous_config(c: &Cluster) -> rustls::ClientConfig {
    let ca = pki::read_text(&c.data.join("ca.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in pki::certs_from_pem(&ca, Path::new("ca.pem")).unwrap() {
        roots.add(cert).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(pki::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_client_certificate_are_refused() {
    let c = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let addr = BrainAddr::parse(&c.url()).unwrap();
    let ch = shared::tls::dial(&addr, anonymous_config(&c), DialOptions::default())
        .await
        .expect("server-authenticated TLS alone must connect (enrolment needs it)");

    let err = AdminClient::new(ch.clone())
        .list_workers(proto::ListWorkersRequest {})
        .await
        .expect_err("admin call without a certificate");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("no client certificate"), "{err:?}");

    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(proto::WorkerMessage {
        msg: Some(proto::worker_message::Msg::Hello(proto::Hello::default())),
    })
    .await
    .unwrap();
    let err = WorkerSessionClient::new(ch)
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("worker session without a certificate");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused_at_the_handshake() {
    let c = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    // A perfectly formed admin identity, signed by a CA this brain never saw.
    let rogue = Ca::generate().unwrap();
    let (key, csr) = pki::new_key_and_csr("admin").unwrap();
    let cert_pem = rogue.sign_client(&csr, Role::Admin, "admin").unwrap();
    let dir = c.dir.join("rogue");
    IdentityFiles {
        // Trust the real brain's CA so only *our* certificate is at fault.
        ca_pem: pki::read_text(&c.data.join("ca.pem")).unwrap(),
        cert_pem,
        key_pem: key.serialize_pem(),
    }
    .save(&dir)
    .unwrap();
    let result = match brain::admin::client::connect_channel(&c.url(), &dir).await {
        Err(e) => Err(e.to_string()),
        Ok(ch) => AdminClient::new(ch)
            .list_workers(proto::ListWorkersRequest {})
            .await
            .map(|_| ())
            .map_err(|s| s.to_string()),
    };
    let err = result.expect_err("a foreign CA certificate must be refused");
    // TLS 1.3 reports a refused client certificate after the client's side of the handshake,
    // so the client sees the alert or the connection closing under it: a transport error,
    // never an answer from the brain's services.
    assert!(err.contains("tonic::transport::Error"), "{err}");
    // The same through the CLI: a clear failure, non-zero exit.
    let out = c.brain_cli(&["--identity", dir.to_str().unwrap(), "workers"]);
    assert_failed_stderr_says(&out, "refused our certificate");
}

#[test]
fn a_revoked_worker_is_cut_off_mid_session_and_refused_afterwards() {
    let c = Cluster::start();
    let mut w = c.join_worker("doomed");
    let out = c.brain_cli(&["worker", "revoke", "doomed"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_stdout_says(&out, "open session closed");
    assert_eq!(c.worker_state(&w.id).as_deref(), Some("revoked"));
    // The worker hears it at once, says so plainly, and exits: retrying cannot help, and a
    // service manager must not restart it (78, EX_CONFIG).
    let status = w.proc.as_mut().unwrap().wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.code()), Some(78), "{}", w.log_text());
    for says in [
        "certificate revoked",
        "no longer takes this worker",
        "worker join --force",
    ] {
        assert!(w.log_text().contains(says), "{says}: {}", w.log_text());
    }
    assert!(
        !w.log_text().contains("stack backtrace"),
        "{}",
        w.log_text()
    );
    let out = c.brain_cli(&["exec", &w.id, "--", "true"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));

    // Restarted with the same certificate: refused again at once, and it never shows
    // connected.
    let said = w.log_text().matches("no longer takes this worker").count();
    c.restart_worker(&mut w);
    let status = w.proc.as_mut().unwrap().wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.code()), Some(78), "{}", w.log_text());
    assert!(w.log_text().matches("no longer takes this worker").count() > said);
    assert_eq!(c.worker_state(&w.id).as_deref(), Some("revoked"));
}

/// `brain worker remove NAME` revokes and forgets a worker: the process exits saying so,
/// the brain lists it no more, and its name is free for the next worker to join with it.
#[test]
fn a_removed_workers_name_is_free_and_the_worker_exits() {
    let c = Cluster::start();
    let mut old = c.join_worker("laptop");
    let out = c.brain_cli(&["worker", "remove", "laptop"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_stdout_says(&out, &format!("removed {}", old.id));
    let status = old
        .proc
        .as_mut()
        .unwrap()
        .wait_exit(Duration::from_secs(20));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(78),
        "{}",
        old.log_text()
    );
    assert!(
        old.log_text().contains("is not enrolled here")
            || old.log_text().contains("certificate revoked"),
        "{}",
        old.log_text()
    );
    assert!(c.workers().iter().all(|w| w["id"] != old.id.as_str()));
    // A new worker (a fresh state dir, as on another machine) takes the name, and the name
    // finds it.
    std::fs::remove_dir_all(&old.state).unwrap();
    let mut new = c.join_worker("laptop");
    let out = c.brain_cli(&["exec", "laptop", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out));
    // Revoked (not removed), a worker's name still goes to the one that is not revoked.
    let out = c.brain_cli(&["worker", "revoke", "laptop"]);
    assert!(out.status.success(), "{}", text(&out));
    new.proc
        .as_mut()
        .unwrap()
        .wait_exit(Duration::from_secs(20));
    std::fs::remove_dir_all(&new.state).unwrap();
    let newer = c.join_worker("laptop");
    assert_ne!(new.id, newer.id);
    let out = c.brain_cli(&["exec", "laptop", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out));
    // A name nobody has is said so.
    let out = c.brain_cli(&["worker", "remove", "nobody"]);
    assert_failed_stderr_says(&out, "nobody");
}

#[test]
fn tokens_are_one_time_and_expire() {
    let c = Cluster::start();
    let (token, ca_hash) = c.token(&[]);
    let first = try_join(&c, "one", &token, &ca_hash);
    assert!(first.status.success(), "{}", text(&first));
    let second = try_join(&c, "two", &token, &ca_hash);
    assert_failed_stderr_says(&second, "already used");

    let (short, ca_hash) = c.token(&["--ttl", "1s"]);
    // The TTL is wall-clock time, so it is waited out here; the exact boundary is tested
    // in the registry on an explicit clock.
    std::thread::sleep(Duration::from_millis(1300));
    let late = try_join(&c, "late", &short, &ca_hash);
    assert_failed_stderr_says(&late, "expired");

    let bogus = try_join(&c, "bogus", "tj_made_up", &ca_hash);
    assert_stderr_says(&bogus, "never issued");
    // Only the first join enrolled anyone.
    assert_eq!(c.workers().len(), 1);
}

#[test]
fn a_wrong_ca_hash_is_refused_before_the_token_is_sent() {
    let c = Cluster::start();
    let (token, real_hash) = c.token(&[]);
    let wrong = format!("sha256:{}", "0".repeat(64));
    let out = try_join(&c, "pinned", &token, &wrong);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("CA hash mismatch"), "{}", text(&out));
    assert!(
        e.contains(&real_hash),
        "the error should name the CA actually presented: {e}"
    );
    // The token was never presented, so it still works with the right pin.
    let ok = try_join(&c, "pinned", &token, &real_hash);
    assert!(ok.status.success(), "{}", text(&ok));

    let garbage = try_join(&c, "x", &token, "sha256:xyz");
    assert_stderr_says(&garbage, "invalid CA hash");
}

#[test]
fn a_worker_certificate_cannot_act_as_an_admin() {
    let c = Cluster::start();
    let w = c.join_worker("sneaky");
    let identity = w.state.join("identity");
    let out = c.brain_cli(&["--identity", identity.to_str().unwrap(), "workers"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("needs a admin certificate")
            || stderr(&out).contains("needs an admin certificate"),
        "{}",
        text(&out)
    );
    let out = c.brain_cli(&["--identity", identity.to_str().unwrap(), "token", "create"]);
    assert!(!out.status.success(), "{}", text(&out));
}

#[test]
fn admin_identities_can_be_issued_and_revoked() {
    let c = Cluster::start();
    let dir = c.dir.join("laptop-admin");
    let out = c.brain_cli(&["admin", "issue", "laptop", "--out", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.join("key.pem"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    // From "another machine": only the identity dir and the URL, no data dir.
    let as_laptop = |args: &[&str]| {
        std::process::Command::new(&c.bins.brain)
            .arg("--brain")
            .arg(c.url())
            .arg("--identity")
            .arg(&dir)
            .arg("--data")
            .arg(c.dir.join("no-data-here"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_laptop(&["workers"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = c.brain_cli(&["admin", "revoke", "laptop"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = as_laptop(&["workers"]);
    assert_failed_stderr_says(&out, "revoked");
    let out = c.brain_cli(&["admin", "revoke", "admin"]);
    assert!(
        !out.status.success(),
        "revoking oneself is refused: {}",
        text(&out)
    );
}

#[test]
fn paths_that_leave_the_workspace_are_refused_and_nothing_outside_changes() {
    let c = Cluster::start();
    let w = c.join_worker("jail");
    let outside = c.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"untouched").unwrap();
    std::fs::create_dir_all(w.workspace()).unwrap();
    std::os::unix::fs::symlink("/", w.workspace().join("root")).unwrap();
    std::os::unix::fs::symlink(&outside, w.workspace().join("out")).unwrap();

    for path in [
        "../x",
        "../../outside/victim",
        "/etc/passwd",
        "root/etc/passwd",
        "out/victim",
    ] {
        let out = c.brain_cli(&["file", "read", &w.id, path]);
        assert!(!out.status.success(), "read {path}: {}", text(&out));
        assert!(
            stderr(&out).contains(path),
            "the error must name {path}: {}",
            text(&out)
        );
    }
    for path in [
        "../victim",
        "out/victim",
        "root/tmp/tether-escape",
        "/tmp/tether-escape",
    ] {
        let mut child = c
            .brain_cli_cmd(&["file", "write", &w.id, path])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"pwned").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "write {path}: {}", text(&out));
        assert_stderr_says(&out, path);
    }
    for path in ["out/victim", "out", "../outside"] {
        let out = c.brain_cli(&["file", "rm", &w.id, path, "-r"]);
        if path == "out" {
            // Removing the link itself is fine: it lives inside the workspace.
            assert!(out.status.success(), "{}", text(&out));
        } else {
            assert!(!out.status.success(), "rm {path}: {}", text(&out));
        }
    }
    let out = c.brain_cli(&["exec", &w.id, "--cwd", "root/tmp", "--", "pwd"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert_stderr_says(&out, "root/tmp");

    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"untouched");
    assert!(!Path::new("/tmp/tether-escape").exists());
    assert!(
        !w.workspace().join("out").exists(),
        "the link itself was removed"
    );
}

#[test]
fn a_revoked_init_admin_stays_revoked_across_restarts() {
    let mut c = Cluster::start();
    let ops = c.dir.join("ops");
    let out = c.brain_cli(&["admin", "issue", "ops", "--out", ops.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let ops_arg = ops.to_str().unwrap().to_string();
    let out = c.brain_cli(&["--identity", &ops_arg, "admin", "revoke", "admin"]);
    assert!(out.status.success(), "{}", text(&out));
    // A new identity named `admin`, issued through the API, replaces the revoked one.
    let fresh = c.dir.join("fresh-admin");
    let fresh_arg = fresh.to_str().unwrap().to_string();
    let out = c.brain_cli(&[
        "--identity",
        &ops_arg,
        "admin",
        "issue",
        "admin",
        "--out",
        &fresh_arg,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    c.kill_brain();
    c.start_brain().unwrap();
    let out = c.brain_cli(&["workers"]);
    assert!(
        !out.status.success(),
        "the data dir's admin must stay revoked: {}",
        text(&out)
    );
    assert_stderr_says(&out, "revoked");
    let out = c.brain_cli(&["--identity", &fresh_arg, "workers"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// The line `brain token create` prints runs as printed (with a name put in), and the token
/// rides in the worker's environment, not on its command line, where `ps` shows it to every
/// user of the machine.
#[test]
fn the_join_line_runs_as_printed_and_ps_does_not_show_the_token() {
    let c = Cluster::start();
    let out = c.brain_cli(&["token", "create"]);
    assert!(out.status.success(), "{}", text(&out));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let line = stderr
        .lines()
        .find(|l| l.contains("worker join"))
        .unwrap_or_else(|| panic!("no join line: {stderr}"))
        .trim()
        .replace("NAME", "printed");
    assert!(
        line.starts_with(&format!("TETHER_JOIN_TOKEN={token} ")),
        "{line}"
    );
    let bin_dir = c.bins.worker.parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let state = c.dir.join("printed");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("exec env {line} --state {}", state.display()))
        .env("PATH", path)
        .env_remove("TETHER_JOIN_TOKEN");
    let w = c.spawn_worker("printed", cmd);
    let pid = w.proc.as_ref().unwrap().pid();
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
    assert!(argv.contains("worker join"), "{argv}");
    assert!(
        !argv.contains(&token),
        "the token is on the command line: {argv}"
    );
}
