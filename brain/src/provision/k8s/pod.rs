//! What the `k8s` provider sends and reads: the worker Pod and its join Secret as the core/v1
//! API takes them, the pod's NetworkPolicy as networking.k8s.io/v1 takes it, the names and
//! labels on all three, and a pod's status in words (the reason a machine failed).

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Value, json};

use super::K8sConfig;
use crate::provision::provider::Join;
use crate::provision::records::Machine;

/// Why a pod or its NetworkPolicy cannot be written as configured.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not a DNS-1123 label (at most 63 of a-z, 0-9 and -, not at either end)")]
    Name(String),
    #[error("{0:?} cannot be a Kubernetes label value")]
    LabelValue(String),
    #[error("the brain URL for the pod's NetworkPolicy: {0}")]
    BrainUrl(#[source] shared::tls::Error),
    #[error(
        "the brain URL names a host ({0}), which a NetworkPolicy cannot name: set provision.k8s.brain_pod_labels (the brain's pods) or provision.k8s.brain_cidrs (its addresses)"
    )]
    BrainHost(String),
    #[error("provision.k8s.brain_cidrs: {0:?} is not ADDRESS/BITS (e.g. 10.0.0.5/32)")]
    Cidr(String),
    /// A setting of `[provision.k8s]` (named in full) holds a bad name or label value.
    #[error("{setting}: {source}")]
    Setting {
        setting: String,
        #[source]
        source: Box<Error>,
    },
}

/// Label keys on pods and secrets.
pub const BRAIN: &str = "tether.brain";
pub const MACHINE: &str = "tether.machine";
pub const TASK: &str = "tether.task";
/// The unprivileged user the worker runs as (the worker image's `nobody`).
const USER: i64 = 65534;
/// Where the join secret is mounted.
const JOIN_DIR: &str = "/var/run/tether/join";

pub fn pod_name(machine: &str) -> String {
    format!("tether-{machine}")
}

pub fn secret_name(machine: &str) -> String {
    format!("tether-{machine}-join")
}

/// The pod's own NetworkPolicy (another kind of object: the pod's name is free for it).
pub fn policy_name(machine: &str) -> String {
    pod_name(machine)
}

/// A DNS-1123 label: what namespaces and pod names must be.
pub fn check_name(n: &str) -> Result<(), Error> {
    let ok = !n.is_empty()
        && n.len() <= 63
        && n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !n.starts_with('-')
        && !n.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Name(n.to_string()))
    }
}

/// What a label value may be: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at the ends.
pub fn check_label_value(v: &str) -> Result<(), Error> {
    let ok = v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(Error::LabelValue(v.to_string()))
    }
}

fn labels(m: &Machine, tag: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::from([
        (BRAIN.to_string(), tag.to_string()),
        (MACHINE.to_string(), m.id.clone()),
    ]);
    if let Some(t) = &m.task
        && check_label_value(t).is_ok()
    {
        l.insert(TASK.to_string(), t.clone());
    }
    l
}

/// The Secret holding the one-time join token.
pub fn secret(m: &Machine, tag: &str, token: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name(&m.id), "labels": labels(m, tag)},
        "type": "Opaque",
        "immutable": true,
        "data": {"token": base64::engine::general_purpose::STANDARD.encode(format!("{token}\n"))},
    })
}

/// The NetworkPolicy that confines `m`'s pod: no connection in, and out only to the brain
/// (TCP, the brain URL's port) and the cluster DNS (kube-dns, UDP and TCP 53). The brain is
/// named by `cfg.brain_cidrs` when set, else by the brain URL's host when it is an address,
/// else as the brain's pods (`brain_pod_labels`, in `brain_namespace` when set): a policy
/// cannot name a host, and a Service's cluster IP is not what a policy sees.
pub fn network_policy(
    m: &Machine,
    tag: &str,
    cfg: &K8sConfig,
    brain_url: &str,
) -> Result<Value, Error> {
    let addr = shared::tls::BrainAddr::parse(brain_url).map_err(Error::BrainUrl)?;
    let host = addr.host.trim_start_matches('[').trim_end_matches(']');
    let brain: Vec<Value> = if !cfg.brain_cidrs.is_empty() {
        for c in &cfg.brain_cidrs {
            check_cidr(c)?;
        }
        cfg.brain_cidrs
            .iter()
            .map(|c| json!({"ipBlock": {"cidr": c}}))
            .collect()
    } else if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        let bits = if ip.is_ipv4() { 32 } else { 128 };
        vec![json!({"ipBlock": {"cidr": format!("{ip}/{bits}")}})]
    } else {
        if cfg.brain_pod_labels.is_empty() {
            return Err(Error::BrainHost(host.to_string()));
        }
        let setting = |setting: String| {
            move |e| Error::Setting {
                setting,
                source: Box::new(e),
            }
        };
        for (k, v) in &cfg.brain_pod_labels {
            check_label_value(v).map_err(setting(format!("provision.k8s.brain_pod_labels.{k}")))?;
        }
        let mut peer = json!({"podSelector": {"matchLabels": cfg.brain_pod_labels}});
        if let Some(ns) = &cfg.brain_namespace {
            check_name(ns).map_err(setting("provision.k8s.brain_namespace".into()))?;
            peer["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
        }
        vec![peer]
    };
    Ok(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": policy_name(&m.id), "labels": labels(m, tag)},
        "spec": {
            // Exactly this pod: its machine's label, and this brain's.
            "podSelector": {"matchLabels": {BRAIN: tag, MACHINE: m.id}},
            // Ingress listed with no rule: nothing may connect to the pod.
            "policyTypes": ["Ingress", "Egress"],
            "egress": [
                {"to": brain, "ports": [{"protocol": "TCP", "port": addr.port}]},
                {
                    "to": [{
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }],
                    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                },
            ],
        },
    }))
}

/// `ADDRESS/BITS`, as an `ipBlock` takes it.
fn check_cidr(c: &str) -> Result<(), Error> {
    let bad = || Error::Cidr(c.to_string());
    let (ip, bits) = c.split_once('/').ok_or_else(bad)?;
    let ip: std::net::IpAddr = ip.parse().map_err(|_| bad())?;
    let bits: u8 = bits.parse().map_err(|_| bad())?;
    if bits > if ip.is_ipv4() { 32 } else { 128 } {
        return Err(bad());
    }
    Ok(())
}

/// The worker Pod for `m`.
pub fn pod(m: &Machine, tag: &str, cfg: &K8sConfig, join: &Join) -> Result<Value, Error> {
    check_name(&pod_name(&m.id))?;
    check_label_value(tag)?;
    let or = |asked: u32, default: u32| if asked > 0 { asked } else { default };
    let mut resources = serde_json::Map::new();
    resources.insert("cpu".into(), json!(or(m.spec.cpu, cfg.cpu).to_string()));
    resources.insert(
        "memory".into(),
        json!(format!("{}Gi", or(m.spec.memory_gb, cfg.memory_gb))),
    );
    resources.insert(
        "ephemeral-storage".into(),
        json!(format!("{}Gi", or(m.spec.disk_gb, cfg.disk_gb))),
    );
    if m.spec.gpu > 0 {
        resources.insert(cfg.gpu_resource.clone(), json!(m.spec.gpu.to_string()));
    }
    let mut args = join.args();
    args.extend([
        "--token-file".to_string(),
        format!("{JOIN_DIR}/token"),
        "--state".into(),
        "/state/worker".into(),
        // The spent token stays in the mounted volume: commands may not read it.
        "--deny-read".into(),
        JOIN_DIR.into(),
    ]);
    let disk = or(m.spec.disk_gb, cfg.disk_gb);
    let mut spec = json!({
        "restartPolicy": "Never",
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": USER,
            "runAsGroup": USER,
            "fsGroup": USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "worker",
            "image": cfg.image,
            "imagePullPolicy": cfg.image_pull_policy,
            "command": ["/usr/local/bin/worker"],
            "args": args,
            "env": [{"name": "HOME", "value": "/state"}],
            "resources": {"requests": resources.clone(), "limits": resources},
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "runAsNonRoot": true,
                "privileged": false,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [
                {"name": "state", "mountPath": "/state"},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "join", "mountPath": JOIN_DIR, "readOnly": true},
            ],
        }],
        "volumes": [
            {"name": "state", "emptyDir": {"sizeLimit": format!("{disk}Gi")}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": format!("{}Mi", cfg.tmp_mb)}},
            {"name": "join", "secret": {"secretName": secret_name(&m.id), "defaultMode": 0o400}},
        ],
    });
    if !cfg.node_selector.is_empty() {
        spec["nodeSelector"] = json!(cfg.node_selector);
    }
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name(&m.id), "labels": labels(m, tag)},
        "spec": spec,
    }))
}

/// Why a pod's machine is gone or can never join, in Kubernetes' words, or `None` while it
/// runs or is still starting.
pub fn failure(p: &Value) -> Option<String> {
    let status = &p["status"];
    let phase = status["phase"].as_str().unwrap_or("");
    let container = status["containerStatuses"]
        .as_array()
        .and_then(|c| c.first())
        .cloned()
        .unwrap_or_default();
    let words = |reason: &str, message: &str| {
        if message.is_empty() {
            reason.to_string()
        } else {
            format!("{reason}: {message}")
        }
    };
    match phase {
        "Failed" | "Succeeded" => {
            let t = &container["state"]["terminated"];
            let said = if let Some(reason) = status["reason"].as_str() {
                // Evicted, DeadlineExceeded, …: the kubelet's reason for the whole pod.
                words(reason, status["message"].as_str().unwrap_or(""))
            } else if let Some(reason) = t["reason"].as_str() {
                let code = t["exitCode"].as_i64().unwrap_or(-1);
                let what = match (reason, code) {
                    ("OOMKilled", _) => "the worker went over its memory limit".to_string(),
                    (_, 69) => "the worker gave up on its brain".to_string(),
                    (_, c) => format!("the worker exited with {c}"),
                };
                words(reason, &what)
            } else {
                format!("the pod is {phase}")
            };
            Some(format!("pod {phase}: {said}"))
        }
        _ => {
            let w = &container["state"]["waiting"];
            let reason = w["reason"].as_str()?;
            matches!(
                reason,
                "ImagePullBackOff"
                    | "ErrImagePull"
                    | "InvalidImageName"
                    | "ErrImageNeverPull"
                    | "CreateContainerConfigError"
                    | "CreateContainerError"
            )
            .then(|| {
                format!(
                    "pod cannot start: {}",
                    words(reason, w["message"].as_str().unwrap_or(""))
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::records::{Spec, State};

    fn machine() -> Machine {
        Machine {
            v: crate::provision::records::V,
            id: "m-0a1b2c3d4e5f".into(),
            provider: "k8s".into(),
            spec: Spec {
                cpu: 2,
                memory_gb: 4,
                disk_gb: 0,
                gpu: 1,
            },
            params: Value::Null,
            labels: BTreeMap::new(),
            state: State::Creating,
            handle: String::new(),
            address: String::new(),
            worker: None,
            task: Some("t-7".into()),
            usd_per_hour: 0.0,
            created_ms: 0,
            joined_ms: 0,
            ended_ms: 0,
            note: String::new(),
        }
    }

    fn join() -> Join {
        Join {
            brain_url: "https://brain.example:7443".into(),
            ca_hash: "sha256:ab".into(),
            token: "tj_secret".into(),
            name: "m-0a1b2c3d4e5f".into(),
            labels: BTreeMap::new(),
            exit_after_unreachable: std::time::Duration::from_secs(600),
        }
    }

    #[test]
    fn the_pod_asks_for_the_request_and_is_locked_down() {
        let p = pod(&machine(), "abc123", &K8sConfig::default(), &join()).unwrap();
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        let c = &p["spec"]["containers"][0];
        let limits = &c["resources"]["limits"];
        assert_eq!(limits["cpu"], "2");
        assert_eq!(limits["memory"], "4Gi");
        assert_eq!(limits["ephemeral-storage"], "10Gi");
        assert_eq!(limits["nvidia.com/gpu"], "1");
        assert_eq!(c["resources"]["requests"], *limits);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(p["spec"]["securityContext"]["runAsNonRoot"], true);
        assert_eq!(
            p["spec"]["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(p["metadata"]["labels"][TASK], "t-7");
        assert_eq!(p["metadata"]["labels"][BRAIN], "abc123");
        // The token goes by the mounted secret, never in the pod.
        assert!(!p.to_string().contains("tj_secret"));
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.windows(2)
                .any(|w| w == ["--token-file", "/var/run/tether/join/token"])
        );
        assert!(
            args.windows(2)
                .any(|w| w == ["--exit-after-unreachable", "600s"])
        );
        let s = secret(&machine(), "abc123", "tj_secret");
        assert_eq!(s["data"]["token"], "dGpfc2VjcmV0Cg==");
    }

    #[test]
    fn statuses_become_reasons() {
        let running = json!({"status": {"phase": "Running"}});
        assert_eq!(failure(&running), None);
        let pending = json!({"status": {"phase": "Pending", "containerStatuses": [
            {"state": {"waiting": {"reason": "ContainerCreating"}}}]}});
        assert_eq!(failure(&pending), None);
        let pull = json!({"status": {"phase": "Pending", "containerStatuses": [
            {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}}}]}});
        assert!(
            failure(&pull)
                .unwrap()
                .contains("ImagePullBackOff: Back-off")
        );
        let oom = json!({"status": {"phase": "Failed", "containerStatuses": [
            {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}});
        assert!(
            failure(&oom)
                .unwrap()
                .contains("OOMKilled: the worker went over its memory limit")
        );
        let evicted = json!({"status": {"phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: ephemeral-storage."}});
        assert!(
            failure(&evicted)
                .unwrap()
                .contains("Evicted: The node was low")
        );
        let gave_up = json!({"status": {"phase": "Failed", "containerStatuses": [
            {"state": {"terminated": {"reason": "Error", "exitCode": 69}}}]}});
        assert!(failure(&gave_up).unwrap().contains("gave up on its brain"));
    }

    #[test]
    fn names_and_label_values_are_checked() {
        assert!(check_name("tether").is_ok());
        assert!(check_name("Tether").is_err());
        assert!(check_name("-x").is_err());
        assert!(check_label_value("t-3").is_ok());
        assert!(check_label_value("a b").is_err());
        assert!(check_label_value(&"x".repeat(64)).is_err());
    }
}
