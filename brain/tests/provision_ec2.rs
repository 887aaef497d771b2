//! The ec2 provider against moto's EC2 server in its strictest mode: every call signed with
//! a key made through IAM and checked against its policies (the brain's own key holds only
//! the policy the README gives), AMI, instance-type and key-pair validation on. boto3, an
//! independent client, reads back what the brain made.
//!
//! - a launch: tags, the instance type, shutdown-means-terminate, user data gzipped under
//!   EC2's 16 KiB (which moto does not check) and accepted by `cloud-init schema` unpacked;
//! - failures: a wrong secret ends the record `failed` with AWS's reason and frees the quota;
//!   a request no configured type fits is refused before anything is recorded; a loopback
//!   brain URL is refused;
//! - credentials from a profile file, a `credential_process`, an assumed role (STS), and the
//!   instance profile over IMDSv2 (a loopback server speaking its token protocol), refreshed
//!   before they expire;
//! - the join deadline, and a brain SIGKILLed between RunInstances and its record;
//! - the AWS secret in no log.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared::locks::Lock;
use testkit::moto::{AMI, BRAIN_POLICY, Key, Moto};
use testkit::{BrainOptions, Cluster, assert_failed_saying, text};

/// An address no loopback: machines dial it (none boots here, so none dials).
const BRAIN_URL: &str = "https://10.11.12.13:7443";

fn moto() -> Option<Moto> {
    match Moto::start() {
        Ok(m) => Some(m),
        Err(why) => {
            testkit::skip("moto", &why);
            None
        }
    }
}

/// `[provision]` and `[provision.ec2]` for moto, with `extra` lines in `[provision]`.
fn config(m: &Moto, extra: &str, ec2_extra: &str) -> String {
    format!(
        "[provision]\nreaper_every = \"200ms\"\nbrain_url = \"{BRAIN_URL}\"\n{extra}\n[provision.ec2]\nendpoint = \"{}\"\nregion = \"us-east-1\"\nami = \"{AMI}\"\ninstance_type = \"t3.micro\"\nworker_url = \"https://downloads.invalid/tether/worker\"\nworker_sha256 = \"{}\"\n{ec2_extra}\n",
        m.url,
        "ab".repeat(32)
    )
}

/// Environment that leaves the chain nothing but what `vars` give: no keys, an empty home,
/// no instance metadata.
fn env(home: &std::path::Path, vars: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = [
        ("AWS_ACCESS_KEY_ID", ""),
        ("AWS_SECRET_ACCESS_KEY", ""),
        ("AWS_SESSION_TOKEN", ""),
        ("AWS_PROFILE", ""),
        ("AWS_CONFIG_FILE", ""),
        ("AWS_SHARED_CREDENTIALS_FILE", ""),
        ("AWS_ENDPOINT_URL", ""),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("HOME", home.to_str().unwrap()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, val) in vars {
        v.retain(|(x, _)| x != k);
        v.push((k.to_string(), val.to_string()));
    }
    v
}

fn keys(k: &Key) -> [(&str, &str); 2] {
    [
        ("AWS_ACCESS_KEY_ID", k.id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", k.secret.as_str()),
    ]
}

/// The brain's own AWS user (the brain's policy), with moto enforcing policies from now on:
/// its key, and the environment that gives the brain the key (HOME being `home`).
fn as_the_brain(m: &Moto, home: &std::path::Path) -> (Key, Vec<(String, String)>) {
    let brain_key = m.user("tether-brain", BRAIN_POLICY);
    m.enforce();
    let vars = env(home, &keys(&brain_key));
    (brain_key, vars)
}

fn cluster(m: &Moto, extra: &str, env: Vec<(String, String)>) -> Cluster {
    cluster_with(m, extra, "", env)
}

fn cluster_with(m: &Moto, extra: &str, ec2_extra: &str, env: Vec<(String, String)>) -> Cluster {
    let mut opts = BrainOptions {
        config: Some(config(m, extra, ec2_extra)),
        ..BrainOptions::default()
    };
    opts.env = env;
    Cluster::start_with(opts)
}

fn provision(c: &Cluster, cpu: &str) -> std::process::Output {
    c.brain_cli(&["provision", "ec2", "--wait", "0s", "--cpu", cpu])
}

/// EC2 shows `instance` terminated (or on its way there).
fn assert_terminated(m: &Moto, instance: &str) {
    let i = m
        .instances()
        .into_iter()
        .find(|i| i["id"] == instance)
        .unwrap_or_else(|| panic!("no instance {instance}"));
    assert!(
        i["state"] == "terminated" || i["state"] == "shutting-down",
        "{i}"
    );
}

fn gunzip(bytes: &[u8]) -> String {
    let mut child = std::process::Command::new("gzip")
        .args(["-dc"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the user data is not gzip");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn an_instance_is_launched_as_aws_takes_it_and_terminated() {
    let Some(m) = moto() else { return };
    let home = tempfile::tempdir().unwrap();
    let (brain_key, vars) = as_the_brain(&m, home.path());
    let c = cluster(
        &m,
        "join_timeout = \"1h\"\nworker_exit_after = \"7m\"\n[provision.providers.ec2]\nmax_machines = 1",
        vars,
    );
    let o = provision(&c, "2");
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let rec = c.machines(true).remove(0);
    let id = rec["id"].as_str().unwrap().to_string();
    assert_eq!(rec["state"], "joining");
    let instance = rec["handle"].as_str().unwrap().to_string();
    assert!(instance.starts_with("i-"), "{rec}");

    let i = m
        .instances()
        .into_iter()
        .find(|i| i["id"] == instance.as_str())
        .expect("launched");
    assert_eq!(i["state"], "running");
    assert_eq!(i["type"], "t3.micro");
    assert_eq!(i["tags"]["tether.machine"], id.as_str());
    assert!(
        i["tags"]["tether.brain"]
            .as_str()
            .is_some_and(|t| t.len() == 16)
    );
    // It terminates itself when its worker powers it off.
    assert_eq!(
        m.attribute(&instance, "instanceInitiatedShutdownBehavior"),
        "terminate"
    );
    // The instance metadata service: on at launch (cloud-init reads the user data from it),
    // IMDSv2 only.
    let md = m.metadata_options(&instance);
    assert_eq!(md["HttpEndpoint"], "enabled", "{md}");
    assert_eq!(md["HttpTokens"], "required", "{md}");
    // The user data, as EC2 holds it: gzip, under the 16 KiB EC2 takes (moto does not check).
    let raw: Vec<u8> = m
        .attribute(&instance, "userData")
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    assert!(raw.len() <= 16_384, "{} bytes of user data", raw.len());
    assert_eq!(&raw[..2], &[0x1f, 0x8b], "gzipped");
    let ud = gunzip(&raw);
    assert!(ud.starts_with("#cloud-config\n"), "{ud}");
    assert!(ud.contains(&format!("machine {id}")));
    assert!(ud.contains("--url https://downloads.invalid/tether/worker"));
    assert!(ud.contains(&format!("--brain {BRAIN_URL}")));
    assert!(
        ud.contains("--ephemeral 420s"),
        "worker_exit_after reaches the machine"
    );
    assert!(ud.contains("content: tj_"), "the join token");
    // cloud-init itself accepts it.
    let file = c.dir.join("user-data.yaml");
    std::fs::write(&file, &ud).unwrap();
    match std::process::Command::new("cloud-init")
        .args(["schema", "-c"])
        .arg(&file)
        .output()
    {
        Ok(o) => assert!(o.status.success(), "cloud-init schema: {}", text(&o)),
        Err(e) => testkit::skip("cloud-init", &format!("cannot run cloud-init: {e}")),
    }

    // Its worker joins (a local worker with the machine's label stands in for the one on
    // the instance): from then on nothing on the machine needs the metadata service, and
    // the brain turns it off, so a command cannot read the instance's role credentials or
    // its user data there.
    let _w = c.join_worker_labeled("ec2-stand-in", &[&format!("tether.machine={id}")]);
    c.wait_machine_state(&id, "ready", Duration::from_secs(20));
    assert!(
        testkit::wait_until(Duration::from_secs(20), || {
            m.metadata_options(&instance)["HttpEndpoint"] == "disabled"
        }),
        "the metadata service is still on after the join: {}\n{}",
        m.metadata_options(&instance),
        c.brain_log()
    );
    assert_eq!(m.metadata_options(&instance)["HttpTokens"], "required");

    // The quota counts it.
    let o = provision(&c, "1");
    assert_failed_saying(&o, "at most 1 machine");

    // Release terminates it.
    let o = c.brain_cli(&["machines", "release", &id]);
    assert!(o.status.success(), "{}", text(&o));
    assert_terminated(&m, &instance);
    assert_eq!(c.machine(&id)["state"], "released");
    assert!(!c.brain_log().contains(&brain_key.secret));
}

#[test]
fn failures_end_the_record_with_the_reason_and_free_the_quota() {
    let Some(m) = moto() else { return };
    let brain_key = m.user("tether-brain", BRAIN_POLICY);
    m.enforce();
    let home = tempfile::tempdir().unwrap();
    let wrong = Key {
        id: brain_key.id.clone(),
        secret: "not-the-secret-0000000000000000000000000".into(),
    };
    let c = cluster(
        &m,
        "[provision.providers.ec2]\nmax_machines = 1",
        env(home.path(), &keys(&wrong)),
    );
    for _ in 0..2 {
        // Each attempt is refused for what it is, not for the quota: the first one's record
        // does not count.
        let o = provision(&c, "1");
        assert!(!o.status.success());
        let t = text(&o);
        assert!(t.contains("ec2") && t.contains("AuthFailure"), "{t}");
        assert!(!t.contains("at most 1 machine"), "{t}");
        assert!(!t.contains("brain unavailable"), "{t}");
    }
    let recs = c.machines(true);
    assert_eq!(recs.len(), 2, "{recs:?}");
    for r in &recs {
        assert_eq!(r["state"], "failed", "{r}");
        assert!(r["note"].as_str().unwrap().contains("AuthFailure"), "{r}");
    }
    assert!(m.instances().is_empty());
    assert!(!c.brain_log().contains(&wrong.secret));

    // No configured type fits: refused before anything is recorded.
    let o = provision(&c, "64");
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("no configured instance type has 64 CPUs") && t.contains("t3.micro (2 CPUs"),
        "{t}"
    );
    assert_eq!(c.machines(true).len(), 2);
    drop(c);

    // Without provision.brain_url an instance would dial the brain's loopback address.
    let mut opts = BrainOptions {
        config: Some(config(&m, "", "").replace(&format!("brain_url = \"{BRAIN_URL}\"\n"), "")),
        ..BrainOptions::default()
    };
    opts.env = env(home.path(), &keys(&brain_key));
    let c = Cluster::start_with(opts);
    let o = provision(&c, "1");
    assert_failed_saying(&o, "set provision.brain_url");
    assert!(c.machines(true).is_empty());
    assert!(m.instances().is_empty());
}

#[test]
fn credentials_come_from_profiles_a_process_and_an_assumed_role() {
    let Some(m) = moto() else { return };
    let brain_key = m.user("tether-brain", BRAIN_POLICY);
    // This user may do nothing but assume the role that may launch.
    let assumer = m.user(
        "tether-assumer",
        r#"{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}"#,
    );
    let role = m.role("tether-launcher", "tether-assumer", BRAIN_POLICY);
    m.enforce();
    let home = tempfile::tempdir().unwrap();
    let aws = home.path().join("aws");
    std::fs::create_dir_all(&aws).unwrap();
    let tool = aws.join("creds tool");
    std::fs::write(
        &tool,
        format!(
            "#!/bin/sh\nprintf '{{\"Version\": 1, \"AccessKeyId\": \"%s\", \"SecretAccessKey\": \"%s\"}}' '{}' '{}'\n",
            brain_key.id, brain_key.secret
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        aws.join("credentials"),
        format!(
            "[static]\naws_access_key_id = {}\naws_secret_access_key = {}\n[base]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            brain_key.id, brain_key.secret, assumer.id, assumer.secret
        ),
    )
    .unwrap();
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile static]\nregion = us-east-1\n[profile process]\ncredential_process = \"{}\"\n[profile deploy]\nrole_arn = {role}\nsource_profile = base\nrole_session_name = tether-test\n",
            tool.display()
        ),
    )
    .unwrap();
    let files = [
        ("AWS_SHARED_CREDENTIALS_FILE", aws.join("credentials")),
        ("AWS_CONFIG_FILE", aws.join("config")),
    ];
    for profile in ["static", "process", "deploy"] {
        let mut vars: Vec<(&str, &str)> = files
            .iter()
            .map(|(k, p)| (*k, p.to_str().unwrap()))
            .collect();
        vars.push(("AWS_PROFILE", profile));
        // STS is moto too.
        vars.push(("AWS_ENDPOINT_URL_STS", &m.url));
        let c = cluster(&m, "", env(home.path(), &vars));
        let o = provision(&c, "1");
        assert!(
            o.status.success(),
            "profile {profile}: {}\n{}",
            text(&o),
            c.brain_log()
        );
        let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
        let o = c.brain_cli(&["machines", "release", &id]);
        assert!(o.status.success(), "profile {profile}: {}", text(&o));
        let log = c.brain_log();
        for secret in [&brain_key.secret, &assumer.secret] {
            assert!(!log.contains(secret.as_str()), "profile {profile}");
        }
    }
    // Three launched, three terminated.
    let all = m.instances();
    assert_eq!(all.len(), 3, "{all:?}");
    for i in &all {
        assert!(
            i["state"] == "terminated" || i["state"] == "shutting-down",
            "{i}"
        );
    }
}

/// A loopback server speaking IMDSv2: a session token from `PUT /latest/api/token`, then the
/// role and its credentials, handed out in turn from `keys`, each expiring in four minutes
/// (inside the brain's five-minute refresh window, so each use fetches them again).
struct Imds {
    url: String,
    fetched: Arc<AtomicUsize>,
}

fn imds(keys: Vec<Key>) -> Imds {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let fetched = Arc::new(AtomicUsize::new(0));
    let (n, keys) = (fetched.clone(), Arc::new(Mutex::new(keys)));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut buf = vec![0u8; 8192];
            let mut got = 0;
            let head = loop {
                let Ok(k) = s.read(&mut buf[got..]) else {
                    break String::new();
                };
                if k == 0 {
                    break String::new();
                }
                got += k;
                if let Some(e) = buf[..got].windows(4).position(|w| w == b"\r\n\r\n") {
                    break String::from_utf8_lossy(&buf[..e]).to_ascii_lowercase();
                }
            };
            let first = head.lines().next().unwrap_or_default().to_string();
            let token_ok = head.contains("x-aws-ec2-metadata-token: t0ken");
            let (status, body) = if first.starts_with("put /latest/api/token ")
                && head.contains("x-aws-ec2-metadata-token-ttl-seconds:")
            {
                (200, "T0KEN".to_string())
            } else if !token_ok {
                (401, String::new())
            } else if first.starts_with("get /latest/meta-data/iam/security-credentials/ ") {
                (200, "tether-instance\n".to_string())
            } else if first
                .starts_with("get /latest/meta-data/iam/security-credentials/tether-instance ")
            {
                let i = n.fetch_add(1, Ordering::SeqCst);
                let ks = keys.locked();
                let k = &ks[i.min(ks.len() - 1)];
                let exp = std::process::Command::new("date")
                    .args(["-u", "-d", "+4 minutes", "+%Y-%m-%dT%H:%M:%SZ"])
                    .output()
                    .unwrap();
                (
                    200,
                    format!(
                        r#"{{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"{}","SecretAccessKey":"{}","Token":"","Expiration":"{}"}}"#,
                        k.id,
                        k.secret,
                        String::from_utf8_lossy(&exp.stdout).trim()
                    ),
                )
            } else {
                (404, String::new())
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Imds { url, fetched }
}

#[test]
fn the_instance_profile_is_read_over_imdsv2_and_refreshed_before_expiry() {
    let Some(m) = moto() else { return };
    let first = m.user("tether-instance", BRAIN_POLICY);
    let second = m.another_key("tether-instance");
    m.enforce();
    let server = imds(vec![first.clone(), second]);
    let home = tempfile::tempdir().unwrap();
    let c = cluster(
        &m,
        "",
        env(
            home.path(),
            &[
                ("AWS_EC2_METADATA_DISABLED", ""),
                ("AWS_EC2_METADATA_SERVICE_ENDPOINT", &server.url),
            ],
        ),
    );
    let o = provision(&c, "1");
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    assert!(server.fetched.load(Ordering::SeqCst) >= 1);
    // The first credentials stop working (as expired ones do); near their expiry the brain
    // has fetched the next ones, so it can still release what it launched.
    m.delete_key("tether-instance", &first);
    let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
    let o = c.brain_cli(&["machines", "release", &id]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    assert_eq!(c.machine(&id)["state"], "released");
    assert!(server.fetched.load(Ordering::SeqCst) >= 2);
    // Fetched again because they were about to expire, not after AWS refused them.
    assert!(
        !c.brain_log().contains("AWS refused the credentials"),
        "{}",
        c.brain_log()
    );
    let instance = c.machine(&id)["handle"].as_str().unwrap().to_string();
    assert_terminated(&m, &instance);
}

#[test]
fn an_instance_whose_worker_never_joins_is_terminated_at_the_deadline() {
    let Some(m) = moto() else { return };
    let home = tempfile::tempdir().unwrap();
    let (_, vars) = as_the_brain(&m, home.path());
    let c = cluster(&m, "join_timeout = \"3s\"", vars);
    let o = provision(&c, "1");
    assert!(o.status.success(), "{}", text(&o));
    let rec = c.machines(true).remove(0);
    let id = rec["id"].as_str().unwrap().to_string();
    let instance = rec["handle"].as_str().unwrap().to_string();
    c.wait_machine_state(&id, "released", Duration::from_secs(30));
    assert!(
        c.machine(&id)["note"]
            .as_str()
            .unwrap()
            .contains("did not join")
    );
    assert_terminated(&m, &instance);
}

#[test]
fn a_brain_killed_between_run_instances_and_the_record_terminates_it_after_restart() {
    let Some(m) = moto() else { return };
    let home = tempfile::tempdir().unwrap();
    let (brain_key, vars) = as_the_brain(&m, home.path());
    let mut c = cluster(&m, "join_timeout = \"3s\"", vars.clone());
    c.kill_brain();
    c.opts.env = vars.clone();
    c.opts
        .env
        .push(("TETHER_FAILPOINT".into(), "provision-created".into()));
    c.start_brain().unwrap();
    let o = provision(&c, "1");
    assert!(!o.status.success(), "the brain should have died");
    c.kill_brain();
    let launched = m.instances();
    assert_eq!(launched.len(), 1, "{launched:?}");
    assert_eq!(launched[0]["state"], "running");
    let instance = launched[0]["id"].as_str().unwrap().to_string();

    c.opts.env = vars;
    c.start_brain().unwrap();
    let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
    // Found by its tags and adopted; it never joins, so the deadline terminates it.
    c.wait_machine_state(&id, "released", Duration::from_secs(30));
    assert_terminated(&m, &instance);
    let log = c.brain_log();
    assert!(
        log.contains("machine adopted"),
        "not found by tag after the restart"
    );
    assert!(!log.contains(&brain_key.secret));
}
