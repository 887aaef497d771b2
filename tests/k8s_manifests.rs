//! The Kubernetes manifests in `deploy/k8s/`: `kubernetes-validate --strict` accepts every
//! file against the API's schemas (skipped where the tool is not installed), and, read with a
//! small YAML reader of our own, they keep their promises: every pod runs as non-root on a
//! read-only root filesystem with every capability dropped, the brain's Role grants verbs on
//! pods, pods/log, secrets and networkpolicies only and nothing is cluster-wide, the worker gets its join token
//! as a file and no API credentials, worker pods reach only the brain and DNS, and every flag
//! the pods pass to `brain` and `worker` is one those programs have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

mod k8s_yaml;

use k8s_yaml::{NONE, Yaml, parse_documents};

fn k8s_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s")
}

/// The YAML files of `deploy/k8s`, sorted (the order they are applied in), then those of
/// `deploy/k8s/replicas` (the brain as replicas on PostgreSQL, applied instead of its one).
fn manifest_files() -> Vec<PathBuf> {
    let yaml_in = |dir: PathBuf| {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("the manifests' directory exists")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        files
    };
    let mut files = yaml_in(k8s_dir());
    files.extend(yaml_in(k8s_dir().join("replicas")));
    assert!(
        files.len() >= 5,
        "too few manifests in deploy/k8s: {files:?}"
    );
    files
}

#[test]
fn kubernetes_validate_accepts_every_manifest_strictly() {
    let files = manifest_files();
    let names: Vec<String> = files.iter().map(|f| relative(f)).collect();
    // Through the interpreter it was installed for (`.ci/run` installs it with pip), which a
    // PATH without pip's scripts directory still finds.
    let installed = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        testkit::skip(
            "kubernetes-validate",
            "the schema check of deploy/k8s needs it (pip install kubernetes-validate==1.37.0)",
        );
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .args(&names)
        .current_dir(k8s_dir())
        .output()
        .expect("run python3 -m kubernetes_validate");
    assert!(
        out.status.success(),
        "kubernetes-validate --strict --quiet {} failed ({}):\n{}",
        names.join(" "),
        out.status,
        testkit::text(&out)
    );
}

/// A manifest's path under `deploy/k8s`.
fn relative(f: &Path) -> String {
    f.strip_prefix(k8s_dir())
        .unwrap_or(f)
        .to_string_lossy()
        .into_owned()
}

/// Every document of every manifest, with the file it came from.
fn documents() -> Vec<(String, Yaml)> {
    let mut all = Vec::new();
    for f in manifest_files() {
        let name = relative(&f);
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in parse_documents(&text) {
            assert!(
                doc.str_at(&["kind"]).is_some(),
                "{name}: a document without a kind: {doc:?}"
            );
            all.push((name.clone(), doc));
        }
    }
    all
}

fn kind(doc: &Yaml) -> &str {
    doc.str_at(&["kind"]).unwrap_or("")
}

fn name(doc: &Yaml) -> &str {
    doc.str_at(&["metadata", "name"]).unwrap_or("")
}

// --- What the manifests promise ---------------------------------------------------------------

/// The pod templates of the workloads: (file, workload, template).
fn pod_templates(docs: &[(String, Yaml)]) -> Vec<(String, String, &Yaml)> {
    docs.iter()
        .filter_map(|(file, d)| {
            let t = match kind(d) {
                "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => {
                    d.at(&["spec", "template"])?
                }
                "CronJob" => d.at(&["spec", "jobTemplate", "spec", "template"])?,
                "Pod" => d,
                _ => return None,
            };
            Some((file.clone(), format!("{}/{}", kind(d), name(d)), t))
        })
        .collect()
}

fn worker_deployment(docs: &[(String, Yaml)]) -> &Yaml {
    let found: Vec<&Yaml> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| {
            kind(d) == "Deployment"
                && d.str_at(&["spec", "template", "metadata", "labels", "tether.role"])
                    == Some("worker")
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "exactly one Deployment of worker pods (tether.role: worker)"
    );
    found[0]
}

#[test]
fn every_pod_runs_unprivileged_on_a_read_only_root_filesystem() {
    let docs = documents();
    let templates = pod_templates(&docs);
    let names: Vec<&str> = templates.iter().map(|(_, w, _)| w.as_str()).collect();
    assert!(
        names.contains(&"StatefulSet/tether-brain") && names.contains(&"Deployment/tether-worker"),
        "the brain's StatefulSet and the worker's Deployment: {names:?}"
    );
    // The worker's template is the one this test exists for: make sure it is among them.
    let worker = worker_deployment(&docs);
    assert!(std::ptr::eq(
        worker.at(&["spec", "template"]).unwrap(),
        templates
            .iter()
            .find(|(_, w, _)| w == "Deployment/tether-worker")
            .unwrap()
            .2
    ));
    let mut bad = Vec::new();
    for (file, workload, t) in &templates {
        let pod = t.at(&["spec"]).unwrap_or(NONE);
        let pod_sc = |k: &str| pod.str_at(&["securityContext", k]);
        for k in ["hostNetwork", "hostPID", "hostIPC"] {
            if pod.str_at(&[k]) == Some("true") {
                bad.push(format!("{file} {workload}: {k}: true"));
            }
        }
        let containers = pod
            .seq_at(&["initContainers"])
            .iter()
            .chain(pod.seq_at(&["containers"]));
        let mut n = 0;
        for c in containers {
            n += 1;
            let who = format!(
                "{file} {workload} container {}",
                c.str_at(&["name"]).unwrap_or("?")
            );
            let sc = |k: &str| c.str_at(&["securityContext", k]);
            let mut want = |ok: bool, what: &str| {
                if !ok {
                    bad.push(format!("{who}: {what}"));
                }
            };
            want(
                sc("readOnlyRootFilesystem") == Some("true"),
                "readOnlyRootFilesystem: true",
            );
            // runAsNonRoot at the container's level, or the pod's without a container saying
            // otherwise.
            want(
                sc("runAsNonRoot") == Some("true")
                    || (pod_sc("runAsNonRoot") == Some("true") && sc("runAsNonRoot").is_none()),
                "runAsNonRoot: true",
            );
            want(
                sc("allowPrivilegeEscalation") == Some("false"),
                "allowPrivilegeEscalation: false",
            );
            want(sc("privileged") != Some("true"), "not privileged");
            want(
                c.strs_at(&["securityContext", "capabilities", "drop"])
                    .contains(&"ALL"),
                "capabilities: drop: [ALL]",
            );
            want(
                c.at(&["securityContext", "capabilities", "add"]).is_none(),
                "no capabilities added",
            );
            let seccomp = c
                .str_at(&["securityContext", "seccompProfile", "type"])
                .or(pod.str_at(&["securityContext", "seccompProfile", "type"]));
            want(
                seccomp == Some("RuntimeDefault"),
                "seccompProfile: RuntimeDefault",
            );
            for r in ["cpu", "memory"] {
                want(
                    c.str_at(&["resources", "limits", r]).is_some()
                        && c.str_at(&["resources", "requests", r]).is_some(),
                    &format!("resources: requests and limits of {r}"),
                );
            }
        }
        if n == 0 {
            bad.push(format!("{file} {workload}: no containers read"));
        }
    }
    assert!(bad.is_empty(), "pods that break the rules: {bad:#?}");
}

#[test]
fn the_brain_may_do_only_what_a_provisioner_of_worker_pods_needs_in_its_namespace() {
    let docs = documents();
    for (file, d) in &docs {
        assert!(
            !matches!(kind(d), "ClusterRole" | "ClusterRoleBinding"),
            "{file}: {} {}: nothing cluster-wide",
            kind(d),
            name(d)
        );
    }
    let allowed: BTreeMap<&str, BTreeSet<&str>> = [
        (
            "pods",
            BTreeSet::from(["create", "get", "list", "watch", "delete"]),
        ),
        ("pods/log", BTreeSet::from(["get"])),
        (
            "secrets",
            BTreeSet::from(["create", "get", "list", "delete"]),
        ),
        (
            "networkpolicies",
            BTreeSet::from(["create", "list", "delete"]),
        ),
    ]
    .into();
    // Each resource in its own API group.
    let group = |res: &str| {
        if res == "networkpolicies" {
            "networking.k8s.io"
        } else {
            ""
        }
    };
    let roles: Vec<&(String, Yaml)> = docs.iter().filter(|(_, d)| kind(d) == "Role").collect();
    assert_eq!(roles.len(), 1, "one Role");
    let (file, role) = roles[0];
    assert_eq!(role.str_at(&["metadata", "namespace"]), Some("tether"));
    let mut granted: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for rule in role.seq_at(&["rules"]) {
        for k in ["resourceNames", "nonResourceURLs"] {
            assert!(rule.get(k).is_none(), "{file}: {k} in {rule:?}");
        }
        let verbs = rule.strs_at(&["verbs"]);
        for res in rule.strs_at(&["resources"]) {
            assert_eq!(
                rule.strs_at(&["apiGroups"]),
                [group(res)],
                "{file}: {res} only in its own API group: {rule:?}"
            );
            let Some(ok) = allowed.get(res) else {
                panic!(
                    "{file}: the Role grants {verbs:?} on {res:?}, which is none of pods, pods/log, secrets, networkpolicies"
                );
            };
            for v in &verbs {
                assert!(
                    ok.contains(v),
                    "{file}: verb {v:?} on {res:?} is more than a provisioner calls"
                );
                granted.entry(res).or_default().insert(*v);
            }
        }
    }
    assert_eq!(granted, allowed, "{file}: the Role grants what it is for");

    let bindings: Vec<&Yaml> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| kind(d) == "RoleBinding")
        .collect();
    assert_eq!(bindings.len(), 1, "one RoleBinding");
    let b = bindings[0];
    assert_eq!(b.str_at(&["roleRef", "kind"]), Some("Role"));
    assert_eq!(b.str_at(&["roleRef", "name"]), Some(name(role)));
    let subjects = b.seq_at(&["subjects"]);
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0].str_at(&["kind"]), Some("ServiceAccount"));
    assert_eq!(subjects[0].str_at(&["name"]), Some("tether-brain"));
    assert_eq!(subjects[0].str_at(&["namespace"]), Some("tether"));
    // ... which is the brain's.
    let brain = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| kind(d) == "StatefulSet" && name(d) == "tether-brain")
        .expect("the brain's StatefulSet");
    assert_eq!(
        brain.str_at(&["spec", "template", "spec", "serviceAccountName"]),
        Some("tether-brain")
    );
}

#[test]
fn everything_is_in_the_tether_namespace_made_by_a_file_of_its_own() {
    let docs = documents();
    let ns: Vec<&(String, Yaml)> = docs
        .iter()
        .filter(|(_, d)| kind(d) == "Namespace")
        .collect();
    assert_eq!(ns.len(), 1);
    let (ns_file, ns_doc) = ns[0];
    assert_eq!(name(ns_doc), "tether");
    assert_eq!(
        docs.iter().filter(|(f, _)| f == ns_file).count(),
        1,
        "{ns_file} holds the Namespace alone"
    );
    assert_eq!(
        manifest_files()[0].file_name().unwrap().to_string_lossy(),
        ns_file.as_str(),
        "the Namespace's file sorts first, so `kubectl apply -f deploy/k8s/` makes it first"
    );
    for (file, d) in &docs {
        if kind(d) != "Namespace" {
            assert_eq!(
                d.str_at(&["metadata", "namespace"]),
                Some("tether"),
                "{file}: {} {}",
                kind(d),
                name(d)
            );
        }
    }
}

#[test]
fn the_worker_gets_its_token_as_a_file_and_no_api_credentials() {
    let docs = documents();
    let d = worker_deployment(&docs);
    assert_eq!(
        d.str_at(&["spec", "replicas"]),
        Some("1"),
        "one pod per Deployment: a join token enrols one worker"
    );
    let pod = d.at(&["spec", "template", "spec"]).unwrap();
    assert_eq!(pod.str_at(&["automountServiceAccountToken"]), Some("false"));
    let secret_volumes: Vec<&str> = pod
        .seq_at(&["volumes"])
        .iter()
        .filter(|v| v.str_at(&["secret", "secretName"]) == Some("tether-join"))
        .filter_map(|v| v.str_at(&["name"]))
        .collect();
    assert_eq!(
        secret_volumes.len(),
        1,
        "the tether-join Secret as a volume"
    );
    let containers = pod.seq_at(&["containers"]);
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let mount = c
        .seq_at(&["volumeMounts"])
        .iter()
        .find(|m| m.str_at(&["name"]) == Some(secret_volumes[0]))
        .expect("the Secret is mounted");
    assert_eq!(mount.str_at(&["mountPath"]), Some("/var/run/tether/join"));
    assert_eq!(mount.str_at(&["readOnly"]), Some("true"));
    assert!(c.get("envFrom").is_none(), "no envFrom");
    for e in c.seq_at(&["env"]) {
        assert!(
            e.at(&["valueFrom", "secretKeyRef"]).is_none(),
            "the token is a file, not an environment variable: {e:?}"
        );
    }
    let script = c.strs_at(&["args"]).join("\n");
    for want in [
        "worker join",
        "--token-file \"$join/token\"",
        "join=/var/run/tether/join",
        "--brain https://tether-brain.tether.svc:7443",
        "worker run",
    ] {
        assert!(
            script.contains(want),
            "the worker's script has {want:?}:\n{script}"
        );
    }
    let secret = docs
        .iter()
        .map(|(_, d)| d)
        .find(|d| kind(d) == "Secret" && name(d) == "tether-join")
        .expect("the tether-join Secret");
    for key in ["token", "ca-hash"] {
        assert!(
            secret.str_at(&["stringData", key]).is_some(),
            "tether-join has a {key} placeholder"
        );
    }
}

#[test]
fn worker_pods_reach_only_the_brain_and_dns_and_accept_nothing() {
    let docs = documents();
    let policies: Vec<&Yaml> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| kind(d) == "NetworkPolicy")
        .collect();
    let worker_policies: Vec<&&Yaml> = policies
        .iter()
        .filter(|p| {
            p.str_at(&["spec", "podSelector", "matchLabels", "tether.role"]) == Some("worker")
                || p.seq_at(&["spec", "podSelector", "matchExpressions"])
                    .iter()
                    .any(|e| {
                        e.str_at(&["key"]) == Some("tether.machine")
                            && e.str_at(&["operator"]) == Some("Exists")
                    })
        })
        .collect();
    assert_eq!(
        worker_policies.len(),
        2,
        "one policy for tether.role=worker and one for tether.machine pods"
    );
    for p in worker_policies {
        let n = name(p);
        assert_eq!(
            p.strs_at(&["spec", "policyTypes"]),
            ["Ingress", "Egress"],
            "{n}"
        );
        assert!(
            p.seq_at(&["spec", "ingress"]).is_empty(),
            "{n}: no ingress at all"
        );
        let mut ports = BTreeSet::new();
        for rule in p.seq_at(&["spec", "egress"]) {
            let to = rule.seq_at(&["to"]);
            assert!(!to.is_empty(), "{n}: an egress rule to anywhere: {rule:?}");
            for peer in to {
                assert!(peer.get("ipBlock").is_none(), "{n}: an ipBlock: {rule:?}");
            }
            let rule_ports: Vec<(String, String)> = rule
                .seq_at(&["ports"])
                .iter()
                .map(|p| {
                    (
                        p.str_at(&["protocol"]).unwrap_or("TCP").to_string(),
                        p.str_at(&["port"]).unwrap_or("any").to_string(),
                    )
                })
                .collect();
            assert!(!rule_ports.is_empty(), "{n}: an egress rule on any port");
            let to_brain = to.iter().any(|peer| {
                peer.str_at(&["podSelector", "matchLabels", "tether.role"]) == Some("brain")
            });
            for (proto, port) in rule_ports {
                match (proto.as_str(), port.as_str(), to_brain) {
                    ("TCP", "7443", true) => {}
                    ("UDP" | "TCP", "53", false) => {}
                    other => panic!("{n}: egress {other:?} is neither the brain nor DNS"),
                }
                ports.insert(format!("{proto}/{port}"));
            }
        }
        assert_eq!(
            ports,
            BTreeSet::from(["TCP/7443".into(), "TCP/53".into(), "UDP/53".into()]),
            "{n}"
        );
    }
}

/// `brain` and `worker` command lines in a pod's command, args and scripts: (program, its
/// subcommand, the `--flags` given).
fn command_lines(c: &Yaml) -> Vec<(String, String, Vec<String>)> {
    let mut text = c.strs_at(&["command"]).join(" ");
    text.push('\n');
    text.push_str(&c.strs_at(&["args"]).join("\n"));
    let text = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let words = match words.first() {
            Some(&"exec") => &words[1..],
            _ => &words[..],
        };
        if let [prog @ ("brain" | "worker"), sub, rest @ ..] = words {
            let flags = rest
                .iter()
                .filter(|w| w.starts_with("--"))
                .map(|w| w.split('=').next().unwrap().to_string())
                .collect();
            out.push((prog.to_string(), sub.to_string(), flags));
        }
    }
    out
}

#[test]
fn every_flag_the_pods_pass_is_one_brain_and_worker_have() {
    let docs = documents();
    let mut seen = BTreeSet::new();
    for (file, _, t) in pod_templates(&docs) {
        let pod = t.at(&["spec"]).unwrap();
        for c in pod
            .seq_at(&["initContainers"])
            .iter()
            .chain(pod.seq_at(&["containers"]))
        {
            for (prog, sub, flags) in command_lines(c) {
                let out = Command::new(env!("CARGO_BIN_EXE_tether"))
                    .args([prog.as_str(), sub.as_str(), "--help"])
                    .output()
                    .expect("run tether");
                let help = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "{file}: `{prog} {sub}` is not a command: {}",
                    testkit::text(&out)
                );
                for f in flags {
                    assert!(
                        help.contains(&format!("{f} ")) || help.contains(&format!("{f}\n")),
                        "{file}: `{prog} {sub}` has no {f}:\n{help}"
                    );
                }
                seen.insert(format!("{prog} {sub}"));
            }
        }
    }
    for want in ["brain init", "brain serve", "worker join", "worker run"] {
        assert!(
            seen.contains(want),
            "the pods run `{want}` (seen: {seen:?})"
        );
    }
}
