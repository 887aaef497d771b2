//! The docker provider against the machine's Docker engine: the worker image is built from
//! `deploy/Dockerfile.worker` on a base made FROM scratch (no registry is needed), containers
//! join the brain over a network the test creates, run confined and within their limits, and
//! leave nothing behind; a brain SIGKILLed mid-create finds its container by label.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{docker, out, rand_tag};

use testkit::{BrainOptions, Cluster, text, wait_until};

/// A worker image and a network of this test's own; removed on drop.
struct Engine {
    image: String,
    base: String,
    network: String,
    gateway: String,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Whatever this test's brains left (they name the network's containers by label).
        let ids = out(&docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("network={}", self.network),
        ]));
        for id in ids.split_whitespace() {
            let vols = out(&docker(&[
                "inspect",
                "-f",
                "{{range .Mounts}}{{.Name}} {{end}}",
                id,
            ]));
            docker(&["rm", "-f", "-v", id]);
            for v in vols.split_whitespace() {
                docker(&["volume", "rm", v]);
            }
        }
        docker(&["network", "rm", &self.network]);
        docker(&["rmi", "-f", &self.image, &self.base]);
    }
}

/// Builds the image and the network, or says why the engine cannot be used here.
/// The engine with this build's worker image, or None (the test is skipped, saying why)
/// where docker cannot be used here.
fn engine() -> Option<Engine> {
    build_engine(&testkit::Bins::locate().worker)
        .map_err(|why| testkit::skip("docker", &why))
        .ok()
}

fn build_engine(worker: &Path) -> Result<Engine, String> {
    if let Some(why) = common::unusable() {
        return Err(why);
    }
    let t = rand_tag();
    let mut e = Engine {
        image: format!("tether-test-worker:{t}"),
        base: format!("tether-test-base:{t}"),
        network: format!("tether-test-{t}"),
        gateway: String::new(),
    };
    common::build("worker", &e.base, &e.image, &[worker])?;
    let net = docker(&["network", "create", &e.network]);
    assert!(net.status.success(), "{}", text(&net));
    let gw = docker(&[
        "network",
        "inspect",
        "-f",
        "{{(index .IPAM.Config 0).Gateway}}",
        &e.network,
    ]);
    e.gateway = out(&gw);
    Ok(e)
}

fn cluster(e: &Engine) -> Cluster {
    Cluster::start_with(BrainOptions {
        listen_host: "0.0.0.0".into(),
        init_args: vec!["--host".into(), e.gateway.clone()],
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\n[provision.docker]\nimage = \"{}\"\nnetwork = \"{}\"\n",
            e.image, e.network
        )),
        ..BrainOptions::default()
    })
}

fn provision(c: &Cluster, e: &Engine, extra: &[&str]) -> std::process::Output {
    let url = format!("https://{}:{}", e.gateway, c.port);
    let mut args = vec!["provision", "docker", "--brain-url", &url, "--wait", "60s"];
    args.extend_from_slice(extra);
    c.brain_cli(&args)
}

fn exec(c: &Cluster, worker: &str, argv: &[&str]) -> std::process::Output {
    let mut args = vec!["exec", "--workspace", "w", worker, "--"];
    args.extend_from_slice(argv);
    c.brain_cli(&args)
}

/// Containers and volumes labelled with machine `id`.
fn left_of(id: &str) -> (String, String) {
    let f = format!("label=tether.machine={id}");
    (
        out(&docker(&["ps", "-aq", "--filter", &f])),
        out(&docker(&["volume", "ls", "-q", "--filter", &f])),
    )
}

#[test]
fn a_docker_worker_joins_runs_confined_within_its_limits_and_leaves_nothing() {
    let Some(e) = engine() else { return };
    let c = cluster(&e);
    let o = provision(&c, &e, &["--cpu", "1", "--memory-gb", "1"]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let (id, worker) = c.ready_machine();
    // It reports its container's limits, not the host's.
    let w = c
        .workers()
        .into_iter()
        .find(|w| w["id"] == worker.as_str())
        .expect("the worker is listed");
    assert!(
        w["memory_bytes"]
            .as_u64()
            .is_some_and(|b| b > 0 && b <= 1 << 30),
        "{w}"
    );
    assert_eq!(w["cpus"], 1, "{w}");

    // What the engine was asked for, read back through its API.
    let inspect = docker(&["inspect", &format!("tether-{id}")]);
    assert!(inspect.status.success(), "{}", text(&inspect));
    let raw = out(&inspect);
    let j: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let hc = &j[0]["HostConfig"];
    assert_eq!(hc["Memory"], 1i64 << 30, "{hc}");
    assert_eq!(hc["MemorySwap"], 1i64 << 30, "no swap: {hc}");
    assert_eq!(hc["NanoCpus"], 1_000_000_000i64);
    assert_eq!(hc["PidsLimit"], 512);
    assert_eq!(hc["ReadonlyRootfs"], true);
    assert_eq!(hc["CapDrop"], serde_json::json!(["ALL"]));
    assert!(
        hc["Binds"].is_null() || hc["Binds"] == serde_json::json!([]),
        "host mounts: {hc}"
    );
    assert_eq!(j[0]["Config"]["User"], "65534:65534");
    assert_eq!(j[0]["Config"]["Labels"]["tether.machine"], id.as_str());
    assert!(
        !raw.contains("tj_"),
        "the join token is visible in docker inspect"
    );

    // Observed from inside.
    let o = exec(&c, &worker, &["id", "-u"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(out(&o), "65534");
    let o = exec(&c, &worker, &["sh", "-c", "grep CapEff /proc/self/status"]);
    assert!(out(&o).ends_with("0000000000000000"), "{}", text(&o));
    let o = exec(&c, &worker, &["sh", "-c", "touch /usr/x"]);
    assert!(!o.status.success(), "the root filesystem is writable");
    // A memory hog over the 1 GiB limit is killed; the worker lives on.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 1;
    let o = exec(
        &c,
        &worker,
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=1600M", "count=1"],
    );
    assert!(
        text(&o).contains("killed by signal 9"),
        "the hog was not killed: {}",
        text(&o)
    );
    // The kernel's OOM killer did it inside the container's memory cgroup: the engine
    // reports an `oom` event (delivered asynchronously, so it is polled for), and on a
    // cgroup v1 host the container's `memory.oom_control` counts the kill.
    let full_id = out(&docker(&[
        "inspect",
        "-f",
        "{{.Id}}",
        &format!("tether-{id}"),
    ]));
    let oom_kills = || {
        std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory/docker/{full_id}/memory.oom_control"
        ))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
    };
    let engine_event = || {
        let until = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let oom = docker(&[
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &until.to_string(),
            "--filter",
            &format!("container=tether-{id}"),
            "--filter",
            "event=oom",
            "--format",
            "{{.Status}}",
        ]);
        out(&oom).contains("oom")
    };
    assert!(
        wait_until(Duration::from_secs(20), || oom_kills()
            .is_some_and(|n| n > 0)
            || engine_event()),
        "neither the engine nor the container's cgroup saw an OOM kill (oom_kill {:?})",
        oom_kills()
    );
    let o = exec(&c, &worker, &["echo", "still-here"]);
    assert!(
        o.status.success() && out(&o) == "still-here",
        "{}",
        text(&o)
    );

    // Release leaves no container and no volume.
    let o = c.brain_cli(&["machines", "release", &id]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(left_of(&id), (String::new(), String::new()));
}

#[test]
fn a_brain_killed_mid_create_finds_its_container_by_label() {
    let Some(e) = engine() else { return };
    let mut c = cluster(&e);
    c.kill_brain();
    c.opts.env = vec![("TETHER_FAILPOINT".into(), "provision-created".into())];
    c.start_brain().unwrap();
    let o = provision(&c, &e, &[]);
    assert!(!o.status.success(), "the brain should have died");
    c.kill_brain();
    // The container was made before the brain died.
    let made = out(&docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("network={}", e.network),
    ]));
    assert_eq!(
        made.split_whitespace().count(),
        1,
        "one container: {made:?}"
    );
    c.start_brain().unwrap();
    let m = c.machines(true).remove(0);
    let id = m["id"].as_str().unwrap().to_string();
    // The container exists; after the restart it is adopted (its worker joins) or released.
    let m = c.wait_settled(&id, Duration::from_secs(60));
    if m["state"] == "ready" {
        assert!(m["note"].as_str().unwrap().contains("adopted"), "{m}");
        let o = exec(&c, m["worker_id"].as_str().unwrap(), &["true"]);
        assert!(o.status.success(), "{}", text(&o));
        let o = c.brain_cli(&["machines", "release", &id]);
        assert!(o.status.success(), "{}", text(&o));
    } else {
        eprintln!("the interrupted container was released: {}", m["note"]);
    }
    assert!(
        wait_until(Duration::from_secs(20), || left_of(&id)
            == (String::new(), String::new())),
        "left: {:?}",
        left_of(&id)
    );
}

/// The dead-man switch in a container: the brain SIGKILLed and kept down past
/// `worker_exit_after`, the worker exits and its container is removed with it; the brain,
/// back, removes the state volume the container left.
#[test]
fn a_container_whose_brain_stays_away_exits_and_is_removed() {
    let Some(e) = engine() else { return };
    let mut c = Cluster::start_with(BrainOptions {
        listen_host: "0.0.0.0".into(),
        init_args: vec!["--host".into(), e.gateway.clone()],
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\nworker_exit_after = \"2s\"\n[provision.docker]\nimage = \"{}\"\nnetwork = \"{}\"\n",
            e.image, e.network
        )),
        ..BrainOptions::default()
    });
    let o = provision(&c, &e, &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
    assert!(!left_of(&id).0.is_empty(), "the container runs");
    c.kill_brain();
    assert!(
        wait_until(Duration::from_secs(60), || left_of(&id).0.is_empty()),
        "the container outlived its brain: {}",
        out(&docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label=tether.machine={id}")
        ]))
    );
    // Back, the brain finds the machine gone and removes what is left of it.
    c.start_brain().unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || {
            c.machine(&id)["state"] == "released" && left_of(&id) == (String::new(), String::new())
        }),
        "{} {:?}",
        c.machine(&id),
        left_of(&id)
    );
}
