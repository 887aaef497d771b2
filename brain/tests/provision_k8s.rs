//! The k8s provider against a fake kube-apiserver over real HTTPS (`testkit::fake_kube`: the
//! core/v1 wire format for pods and secrets, bearer-token auth, and a fake kubelet that runs
//! each Pod as a real worker process with the pod's arguments, environment and mounted join
//! secret). Every Pod and Secret the brain sends is checked against Kubernetes' published
//! schemas with `kubernetes-validate --strict`. Pods reach the brain by the Service name the
//! deployment in `deploy/k8s/` gives it, which the fake cluster's DNS maps to loopback.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::fake_kube::FakeKube;
use testkit::{BrainOptions, Cluster, assert_stdout_says, text, wait_until};

/// The brain's Service name in `deploy/k8s/`.
const SERVICE: &str = "tether-brain.tether.svc";
const IMAGE: &str = "tether-worker:test";

/// The fake cluster and a brain configured for it (`extra` under `[provision]`), or None
/// (the test is skipped, saying why) where they cannot run here.
fn setup(extra: &str) -> Option<(FakeKube, Cluster)> {
    setup_with(extra, "", None)
}

/// `setup`, with more of `[provision.k8s]` and, if given, another kubeconfig.
fn setup_with(
    extra: &str,
    k8s_extra: &str,
    kubeconfig: Option<&dyn Fn(&FakeKube) -> std::path::PathBuf>,
) -> Option<(FakeKube, Cluster)> {
    try_setup(extra, k8s_extra, kubeconfig)
        .map_err(|why| testkit::skip("user", &why))
        .ok()
}

fn try_setup(
    extra: &str,
    k8s_extra: &str,
    kubeconfig: Option<&dyn Fn(&FakeKube) -> std::path::PathBuf>,
) -> Result<(FakeKube, Cluster), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("the fake kubelet gives each pod its own /etc/hosts in a mount namespace, which needs root".into());
    }
    let bins = testkit::Bins::locate();
    let fake = FakeKube::start(&bins.worker).map_err(|e| e.to_string())?;
    fake.add_dns(SERVICE, "127.0.0.1");
    let kubeconfig = match kubeconfig {
        Some(make) => make(&fake),
        None => fake.kubeconfig("tether"),
    };
    let c = Cluster::start_with(BrainOptions {
        init_args: vec!["--host".into(), SERVICE.into()],
        config: Some(format!(
            "[provision]\nreaper_every = \"200ms\"\nreconcile_every = \"300ms\"\n{extra}\n[provision.k8s]\nkubeconfig = \"{}\"\nimage = \"{IMAGE}\"\n{k8s_extra}\n",
            kubeconfig.display()
        )),
        ..BrainOptions::default()
    });
    Ok((fake, c))
}

/// `brain provision k8s … --json`: the machine.
fn provision(c: &Cluster, extra: &[&str]) -> (std::process::Output, Value) {
    let url = format!("https://{SERVICE}:{}", c.port);
    let mut args = vec!["provision", "k8s", "--brain-url", &url, "--json"];
    args.extend_from_slice(extra);
    let o = c.brain_cli(&args);
    let m: Value = serde_json::from_slice(&o.stdout)
        .map(|v: Value| v[0].clone())
        .unwrap_or_default();
    (o, m)
}

fn pod_of(fake: &FakeKube, machine: &str) -> Option<Value> {
    fake.pods()
        .into_iter()
        .find(|p| p["metadata"]["labels"]["tether.machine"] == machine)
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Everything the brain sent, checked against the published schemas.
fn validate(fake: &FakeKube) {
    let sent = fake.received();
    assert!(!sent.is_empty(), "nothing was sent");
    // Through the interpreter it was installed for, which a PATH without pip's scripts
    // directory still finds.
    let kv = || {
        let mut c = std::process::Command::new("python3");
        c.args(["-m", "kubernetes_validate"]);
        c
    };
    if !kv()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        testkit::skip(
            "kubernetes-validate",
            "kubernetes-validate is not installed (pip install kubernetes-validate)",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<String> = sent
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let f = dir
                .path()
                .join(format!("{i}-{}.json", o["kind"].as_str().unwrap_or("x")));
            std::fs::write(&f, o.to_string()).unwrap();
            f.display().to_string()
        })
        .collect();
    let o = kv()
        .args(["--strict", "--quiet"])
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    assert!(
        o.status.success(),
        "kubernetes-validate refused what the brain sent: {}\n{}",
        text(&o),
        sent.iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn pods_join_run_a_task_that_moves_between_them_and_are_released_without_a_trace() {
    let Some((fake, c)) = setup("") else {
        return;
    };
    let (o, m1) = provision(&c, &["--cpu", "2", "--memory-gb", "3", "--disk-gb", "5"]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    assert_eq!(m1["state"], "ready", "{m1}");
    let id1 = m1["id"].as_str().unwrap().to_string();
    let w1 = m1["worker_id"].as_str().unwrap().to_string();

    // What the cluster was asked for.
    let pod = pod_of(&fake, &id1).expect("a pod for the machine");
    assert_eq!(pod["metadata"]["namespace"], "tether");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    let ctr = &pod["spec"]["containers"][0];
    assert_eq!(ctr["image"], IMAGE);
    assert_eq!(
        ctr["resources"]["limits"],
        json!({"cpu": "2", "memory": "3Gi", "ephemeral-storage": "5Gi"})
    );
    assert_eq!(ctr["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    let tag = pod["metadata"]["labels"]["tether.brain"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!tag.is_empty());
    assert!(
        !pod.to_string().contains("tj_"),
        "the join token is in the pod spec"
    );
    // The token's secret goes once the worker has joined.
    assert!(
        wait_until(Duration::from_secs(10), || fake.secrets().is_empty()),
        "the join secret outlived the join: {:?}",
        fake.secrets()
    );
    // The provider found pods by label selector.
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.contains("labelSelector=tether.brain%3D")),
        "{:?}",
        fake.requests()
    );

    let (o, m2) = provision(&c, &["--gpu", "1"]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let id2 = m2["id"].as_str().unwrap().to_string();
    let limits = &pod_of(&fake, &id2).unwrap()["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpu"], "1", "{limits}");
    assert_eq!(limits["cpu"], "1", "the configured default: {limits}");
    let w2 = m2["worker_id"].as_str().unwrap().to_string();

    // A task runs on the first pod and moves to the second.
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let steps: Vec<Value> = (0..8)
        .map(|i| json!({"run": ["sh", "-c", format!("echo line-{i} >> out.txt; sleep 0.3")]}))
        .collect();
    std::fs::write(&plan, json!({ "steps": steps }).to_string()).unwrap();
    let task = c.run_plan(&plan, &w1);
    c.wait_records(&task, "tool_call_completed", 2, Duration::from_secs(30));
    let o = c.brain_cli(&["task", "move", &task, "--to", &w2, "--wait", "60s"]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    c.wait_status(&task, &["finished"], Duration::from_secs(60));
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let o = c.brain_cli(&["file", "read", &w2, "out.txt", "--workspace", &ws]);
    assert!(o.status.success(), "{}", text(&o));
    let lines: Vec<String> = (0..8).map(|i| format!("line-{i}")).collect();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .collect::<Vec<_>>(),
        lines
    );

    // Release deletes the pod (its process ends) and leaves no secret.
    let pids: Vec<u32> = [&id1, &id2]
        .iter()
        .filter_map(|id| fake.pid(&format!("tether-{id}")))
        .collect();
    assert_eq!(pids.len(), 2, "both pods run a process");
    for id in [&id1, &id2] {
        let o = c.brain_cli(&["machines", "release", id]);
        assert!(o.status.success(), "{}", text(&o));
    }
    assert!(fake.pods().is_empty(), "{:?}", fake.pods());
    assert!(fake.secrets().is_empty(), "{:?}", fake.secrets());
    assert!(
        fake.network_policies().is_empty(),
        "{:?}",
        fake.network_policies()
    );
    assert!(
        wait_until(Duration::from_secs(10), || !pids.iter().any(|p| alive(*p))),
        "a pod's process outlived its pod"
    );
    assert_eq!(c.machine(&id1)["state"], "released");
    validate(&fake);
}

#[test]
fn oomkilled_unpullable_orphaned_and_abandoned_pods_end_with_their_reasons() {
    let Some((fake, mut c)) = setup("worker_exit_after = \"2s\"") else {
        return;
    };
    // OOMKilled: the machine fails with Kubernetes' reason, and the pod is deleted.
    let (o, m) = provision(&c, &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let id = m["id"].as_str().unwrap().to_string();
    assert!(fake.oom_kill(&format!("tether-{id}")));
    c.wait_machine_state(&id, "failed", Duration::from_secs(20));
    let note = c.machine(&id)["note"].as_str().unwrap().to_string();
    assert!(note.contains("OOMKilled"), "{note}");
    assert!(
        wait_until(Duration::from_secs(10), || pod_of(&fake, &id).is_none()),
        "the failed pod was not deleted"
    );
    // `brain machines` shows the reason too.
    let o = c.brain_cli(&["machines", "--all"]);
    assert_stdout_says(&o, "OOMKilled");

    // An orphan: a pod with this brain's label that no record names is deleted.
    let tag = fake
        .received()
        .iter()
        .find_map(|o| {
            o["metadata"]["labels"]["tether.brain"]
                .as_str()
                .map(String::from)
        })
        .unwrap();
    let orphan = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tether-m-00000000dead",
            "labels": {"tether.brain": tag, "tether.machine": "m-00000000dead"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "worker", "image": IMAGE,
            "command": ["/usr/local/bin/worker"], "args": ["--help"]}]}});
    assert_eq!(fake.create("tether", &orphan), 201);
    assert!(
        wait_until(Duration::from_secs(10), || pod_of(&fake, "m-00000000dead")
            .is_none()),
        "reconcile left the orphan pod"
    );

    // The dead-man switch: the brain SIGKILLed and kept away past worker_exit_after, the
    // worker gives up and its pod ends; back, the brain records why and deletes the pod.
    let (o, m) = provision(&c, &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let id = m["id"].as_str().unwrap().to_string();
    c.kill_brain();
    assert!(
        wait_until(Duration::from_secs(30), || pod_of(&fake, &id)
            .is_some_and(|p| p["status"]["phase"] == "Failed")),
        "the pod's worker did not give up: {:?}",
        pod_of(&fake, &id)
    );
    let p = pod_of(&fake, &id).unwrap();
    assert_eq!(
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 69,
        "{p}"
    );
    c.start_brain().unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || c.machine(&id)["state"]
            == "failed"
            && pod_of(&fake, &id).is_none()),
        "{}",
        c.machine(&id)
    );
    let note = c.machine(&id)["note"].as_str().unwrap().to_string();
    assert!(note.contains("gave up on its brain"), "{note}");

    // An image the cluster cannot pull: the machine fails with the reason, before its deadline.
    fake.refuse_image(IMAGE);
    let (o, m) = provision(&c, &["--wait", "0s"]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let id = m["id"].as_str().unwrap().to_string();
    c.wait_machine_state(&id, "failed", Duration::from_secs(20));
    let note = c.machine(&id)["note"].as_str().unwrap().to_string();
    assert!(note.contains("ImagePullBackOff"), "{note}");
    assert!(wait_until(Duration::from_secs(10), || fake
        .pods()
        .is_empty()
        && fake.secrets().is_empty()));
    validate(&fake);
}

#[test]
fn a_brain_killed_between_create_and_record_adopts_its_pod() {
    let Some((fake, mut c)) = setup("") else {
        return;
    };
    c.kill_brain();
    c.opts.env = vec![("TETHER_FAILPOINT".into(), "provision-created".into())];
    c.start_brain().unwrap();
    let (o, _) = provision(&c, &[]);
    assert!(!o.status.success(), "the brain should have died");
    c.kill_brain();
    assert_eq!(
        fake.pods().len(),
        1,
        "the pod was made before the brain died"
    );
    c.start_brain().unwrap();
    let id = c.machines(true)[0]["id"].as_str().unwrap().to_string();
    let m = c.wait_settled(&id, Duration::from_secs(60));
    assert_eq!(m["state"], "ready", "{m}\n{}", c.brain_log());
    assert!(m["note"].as_str().unwrap().contains("adopted"), "{m}");
    let o = c.brain_cli(&["machines", "release", &id]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(fake.pods().is_empty() && fake.secrets().is_empty());
}

/// The agent's `request_environment` provisions a pod from a `k8s` offer, labelled with its
/// task, and the task goes on there.
#[test]
fn request_environment_moves_a_task_to_a_pod_from_a_k8s_offer() {
    let Some((fake, mut c)) = setup("") else {
        return;
    };
    // The offer names the brain's Service, port included.
    c.kill_brain();
    let cfg = std::fs::read_to_string(c.data.join("config.toml")).unwrap();
    std::fs::write(
        c.data.join("config.toml"),
        format!(
            "{cfg}\n[[provision.offers]]\nprovider = \"k8s\"\ncpu = 4\nmemory_gb = 2\nbrain_url = \"https://{SERVICE}:{}\"\nlabels = {{ size = \"pod\" }}\n",
            c.port
        ),
    )
    .unwrap();
    c.start_brain().unwrap();
    let small = c.join_worker("small");
    let task = c
        .agent()
        .replay(&[
            (
                "request_environment",
                json!({"cpu": 4, "labels": {"size": "pod"}, "reason": "needs 4 cores"}),
            ),
            (
                "run_command",
                json!({"command": "echo built-in-a-pod > where.txt"}),
            ),
            ("finish", json!({"summary": "built in a pod"})),
        ])
        .worker(&small.id)
        .start("build it");
    c.wait_status(&task, &["finished"], Duration::from_secs(90));
    let m = c
        .machines(true)
        .into_iter()
        .find(|m| m["provider"] == "k8s")
        .expect("a k8s machine");
    let pod = pod_of(&fake, m["id"].as_str().unwrap()).expect("its pod");
    assert_eq!(pod["metadata"]["labels"]["tether.task"], task.as_str());
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["cpu"],
        "4"
    );
    let ws = format!("task-{}", task.trim_start_matches("t-"));
    let o = c.brain_cli(&[
        "file",
        "read",
        m["worker_id"].as_str().unwrap(),
        "where.txt",
        "--workspace",
        &ws,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "built-in-a-pod\n",
        "{}",
        text(&o)
    );
    validate(&fake);
}

fn policy_of(fake: &FakeKube, machine: &str) -> Option<Value> {
    fake.network_policies()
        .into_iter()
        .find(|p| p["metadata"]["labels"]["tether.machine"] == machine)
}

/// What the policy must say besides the brain's peers: no ingress, DNS to the cluster's DNS.
fn assert_confines(policy: &Value, pod: &Value, brain: Value) {
    let spec = &policy["spec"];
    // It selects exactly this pod: every label it matches is on the pod.
    let sel = spec["podSelector"]["matchLabels"].as_object().unwrap();
    assert!(sel.contains_key("tether.machine"), "{policy}");
    for (k, v) in sel {
        assert_eq!(&pod["metadata"]["labels"][k], v, "{policy}\n{pod}");
    }
    assert_eq!(
        spec["policyTypes"],
        json!(["Ingress", "Egress"]),
        "{policy}"
    );
    assert!(
        spec["ingress"].as_array().is_none_or(Vec::is_empty),
        "{policy}"
    );
    let dns = json!({
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    });
    assert_eq!(spec["egress"], json!([brain, dns]), "{policy}");
}

#[test]
fn each_pod_gets_a_network_policy_that_lets_it_reach_only_the_brain_and_dns() {
    let Some((fake, c)) = setup("") else {
        return;
    };
    // The brain by the Service name: its pods, as deploy/k8s labels them.
    let (o, m) = provision(&c, &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    assert_eq!(m["state"], "ready", "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let policy = policy_of(&fake, &id).expect("a NetworkPolicy for the pod");
    assert_eq!(policy["metadata"]["namespace"], "tether");
    assert_eq!(policy["apiVersion"], "networking.k8s.io/v1");
    let pod = pod_of(&fake, &id).unwrap();
    assert_confines(
        &policy,
        &pod,
        json!({"to": [{"podSelector": {"matchLabels": {"tether.role": "brain"}}}],
               "ports": [{"protocol": "TCP", "port": c.port}]}),
    );
    // The policy was there before the pod: the worker never ran unconfined.
    let reqs = fake.requests();
    let at = |what: &str| reqs.iter().position(|r| r.starts_with(what)).unwrap();
    assert!(
        at("POST /apis/networking.k8s.io/v1/namespaces/tether/networkpolicies")
            < at("POST /api/v1/namespaces/tether/pods"),
        "{reqs:?}"
    );

    // The brain by address: the address itself.
    let url = format!("https://10.11.12.13:{}", c.port);
    let o = c.brain_cli(&[
        "provision",
        "k8s",
        "--brain-url",
        &url,
        "--wait",
        "0s",
        "--json",
    ]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    let m2: Value = serde_json::from_slice::<Value>(&o.stdout).unwrap()[0].clone();
    let id2 = m2["id"].as_str().unwrap().to_string();
    assert_confines(
        &policy_of(&fake, &id2).expect("a NetworkPolicy for the second pod"),
        &pod_of(&fake, &id2).unwrap(),
        json!({"to": [{"ipBlock": {"cidr": "10.11.12.13/32"}}],
               "ports": [{"protocol": "TCP", "port": c.port}]}),
    );

    // Release deletes each pod's policy.
    for id in [&id, &id2] {
        let o = c.brain_cli(&["machines", "release", id]);
        assert!(o.status.success(), "{}", text(&o));
    }
    assert!(
        fake.network_policies().is_empty(),
        "{:?}",
        fake.network_policies()
    );

    // A policy of this brain's that no record names (left by a brain that died) goes at
    // the next reconcile.
    let tag = pod["metadata"]["labels"]["tether.brain"].as_str().unwrap();
    let stray = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "tether-m-00000000beef",
            "labels": {"tether.brain": tag, "tether.machine": "m-00000000beef"}},
        "spec": {"podSelector": {"matchLabels": {"tether.machine": "m-00000000beef"}},
            "policyTypes": ["Ingress", "Egress"]}});
    assert_eq!(fake.create("tether", &stray), 201);
    assert!(
        wait_until(Duration::from_secs(10), || fake
            .network_policies()
            .is_empty()),
        "reconcile left the stray policy: {:?}",
        fake.network_policies()
    );
    validate(&fake);
}

#[test]
fn with_network_policy_namespace_the_namespace_must_have_one_that_limits_egress() {
    let Some((fake, c)) = setup_with("", "network_policy = \"namespace\"", None) else {
        return;
    };
    let (o, _) = provision(&c, &["--wait", "0s"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains("network_policy = \"namespace\"") && err.contains("tether"),
        "{err}"
    );
    assert!(fake.pods().is_empty(), "{:?}", fake.pods());
    // The namespace's own policy (as deploy/k8s/30-network-policy.yaml has it).
    let ns_policy = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "tether-provisioned-worker"},
        "spec": {"podSelector": {"matchExpressions": [{"key": "tether.machine", "operator": "Exists"}]},
            "policyTypes": ["Ingress", "Egress"]}});
    assert_eq!(fake.create("tether", &ns_policy), 201);
    let (o, m) = provision(&c, &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    assert_eq!(m["state"], "ready", "{m}");
    // The brain made none of its own.
    assert_eq!(
        fake.network_policies().len(),
        1,
        "{:?}",
        fake.network_policies()
    );
    let id = m["id"].as_str().unwrap();
    let o = c.brain_cli(&["machines", "release", id]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        fake.network_policies().len(),
        1,
        "{:?}",
        fake.network_policies()
    );
}

#[test]
fn a_kubeconfig_that_skips_tls_verification_is_refused_unless_the_config_allows_it() {
    let insecure = |fake: &FakeKube| {
        let p = fake
            .kubeconfig("tether")
            .with_file_name("kubeconfig-insecure");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: brain\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: brain\n    namespace: tether\n",
            fake.server(),
            fake.token()
        );
        std::fs::write(&p, text).unwrap();
        p
    };
    let Some((fake, c)) = setup_with("", "", Some(&insecure)) else {
        return;
    };
    let (o, _) = provision(&c, &["--wait", "0s"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains("insecure-skip-tls-verify")
            && err.contains("allow_insecure_skip_tls_verify = true"),
        "{err}"
    );
    assert!(
        fake.requests().is_empty(),
        "nothing may be sent to an unverified server: {:?}",
        fake.requests()
    );
    drop(c);
    drop(fake);

    // Said explicitly in the config, it is used.
    let (fake, c) =
        setup_with("", "allow_insecure_skip_tls_verify = true", Some(&insecure)).unwrap();
    let (o, m) = provision(&c, &[]);
    assert!(o.status.success(), "{}\n{}", text(&o), c.brain_log());
    assert_eq!(m["state"], "ready", "{m}");
    assert!(pod_of(&fake, m["id"].as_str().unwrap()).is_some());
}
