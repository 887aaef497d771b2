//! A fake kube-apiserver with a fake kubelet, for the `k8s` provider's tests: no API server
//! can run on these machines. It speaks the core/v1 REST wire format over real HTTPS (its
//! own CA, which the test's kubeconfig carries) for what the provider uses: pods and secrets
//! (core/v1) and NetworkPolicies (networking.k8s.io/v1, stored, not enforced) created, read,
//! listed with equality label selectors and deleted, each answer a real object or a
//! `Status`; bearer-token authentication. The kubelet half turns a created Pod
//! into a real local process: the container's command with the worker binary for the
//! image's, its arguments and environment, its secret volumes as files and its `emptyDir`s
//! as directories; it reports the pod's phase and container state as a kubelet does
//! (`Pending`, `Running`, `Failed` with `Error`/`OOMKilled` and the exit code, an image
//! that cannot be pulled as `ImagePullBackOff`). Everything the provider sends is kept, to
//! be checked against Kubernetes' published schemas. Watches are not served: the provider
//! does not use them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::http::{Options, Response, Server};

/// The most of a request body read.
const MAX_BODY: usize = 4 << 20;

struct Pod {
    obj: Value,
    child: Option<Child>,
    dir: PathBuf,
    oom: bool,
}

#[derive(Default)]
struct State {
    namespaces: BTreeSet<String>,
    pods: BTreeMap<(String, String), Pod>,
    secrets: BTreeMap<(String, String), Value>,
    /// NetworkPolicies: kept as sent (the fake kubelet's processes are not confined by them).
    policies: BTreeMap<(String, String), Value>,
    /// Every Pod, Secret and NetworkPolicy body a client sent, as sent.
    received: Vec<Value>,
    /// `METHOD path?query` of every request.
    requests: Vec<String>,
    unpullable: BTreeSet<String>,
    /// The cluster's DNS: names pods resolve (through their own `/etc/hosts`).
    dns: BTreeMap<String, String>,
    version: u64,
}

/// A running fake API server and kubelet.
pub struct FakeKube {
    listener: Option<Server>,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    kubelet: Option<std::thread::JoinHandle<()>>,
    dir: tempfile::TempDir,
    ca_pem: String,
    token: String,
}

fn lock(s: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    use shared::locks::Lock;
    s.locked()
}

impl FakeKube {
    /// Starts it on an ephemeral loopback port with namespaces `default` and `tether`; pods'
    /// `/usr/local/bin/worker` runs `worker`.
    pub fn start(worker: &Path) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("fake-kube").tempdir()?;
        let (ca_pem, server_config) = tls()?;
        let token = format!("kt-{}", hex(&rand_bytes()));
        let state = Arc::new(Mutex::new(State {
            namespaces: ["default", "tether"].map(String::from).into(),
            ..State::default()
        }));
        let (st, want, cfg) = (state.clone(), token.clone(), Arc::new(server_config));
        let opts = Options {
            max_body: MAX_BODY,
            tls: Some(cfg),
            ..Options::plain("fake kube-apiserver")
        };
        let listener = Server::start(opts, move |req| serve(&req, &st, &want))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (st, halt, worker, root) = (
            state.clone(),
            stop.clone(),
            worker.to_path_buf(),
            dir.path().to_path_buf(),
        );
        let kubelet = std::thread::spawn(move || {
            while !halt.load(Ordering::SeqCst) {
                kubelet_pass(&st, &worker, &root);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Ok(Self {
            listener: Some(listener),
            state,
            stop,
            kubelet: Some(kubelet),
            dir,
            ca_pem,
            token,
        })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!(
            "https://127.0.0.1:{}",
            self.listener.as_ref().map(|l| l.addr().port()).unwrap_or(0)
        )
    }

    /// The bearer token it accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Writes a kubeconfig for this server (context `fake`, namespace `namespace`, the CA
    /// inline, the token) and returns its path.
    pub fn kubeconfig(&self, namespace: &str) -> PathBuf {
        let p = self.dir.path().join("kubeconfig");
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: brain\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: brain\n    namespace: {namespace}\n",
            self.server(),
            self.token
        );
        std::fs::write(&p, text).expect("write the kubeconfig");
        p
    }

    /// The pods there are now, as the API shows them.
    pub fn pods(&self) -> Vec<Value> {
        lock(&self.state)
            .pods
            .values()
            .map(|p| p.obj.clone())
            .collect()
    }

    /// The secrets there are now.
    pub fn secrets(&self) -> Vec<Value> {
        lock(&self.state).secrets.values().cloned().collect()
    }

    /// The NetworkPolicies there are now.
    pub fn network_policies(&self) -> Vec<Value> {
        lock(&self.state).policies.values().cloned().collect()
    }

    /// Every Pod, Secret and NetworkPolicy a client sent, as sent.
    pub fn received(&self) -> Vec<Value> {
        lock(&self.state).received.clone()
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }

    /// The process of pod `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        let s = lock(&self.state);
        let p = s.pods.iter().find(|((_, n), _)| n == name)?.1;
        p.child.as_ref().map(Child::id)
    }

    /// The kernel's OOM killer, as the kubelet reports it: pod `name`'s process is killed
    /// and its container ends `OOMKilled` with 137.
    pub fn oom_kill(&self, name: &str) -> bool {
        let mut s = lock(&self.state);
        let Some(p) = s.pods.iter_mut().find(|((_, n), _)| n == name).map(|e| e.1) else {
            return false;
        };
        let Some(c) = p.child.as_mut() else {
            return false;
        };
        p.oom = true;
        c.kill().is_ok()
    }

    /// Pods resolve `name` (a Service's, say `tether-brain.tether.svc`) to `ip`, as cluster
    /// DNS would: each pod's process gets an `/etc/hosts` of its own (a mount namespace;
    /// needs root).
    pub fn add_dns(&self, name: &str, ip: &str) {
        lock(&self.state)
            .dns
            .insert(name.to_string(), ip.to_string());
    }

    /// Creates `obj` (a Pod, Secret or NetworkPolicy) in `ns` as another client of the API
    /// would; the answer's status code.
    pub fn create(&self, ns: &str, obj: &Value) -> u16 {
        let path = match obj["kind"].as_str() {
            Some("Pod") => format!("/api/v1/namespaces/{ns}/pods"),
            Some("NetworkPolicy") => {
                format!("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies")
            }
            _ => format!("/api/v1/namespaces/{ns}/secrets"),
        };
        let (code, _) = route(&self.state, "POST", &path, obj.to_string().as_bytes());
        // Not the provider's: kept out of what it sent.
        lock(&self.state).received.pop();
        code
    }

    /// Pulls of `image` fail from now on (`ImagePullBackOff`).
    pub fn refuse_image(&self, image: &str) {
        lock(&self.state).unpullable.insert(image.to_string());
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(k) = self.kubelet.take() {
            let _ = k.join();
        }
        self.listener.take();
        let mut s = lock(&self.state);
        for p in s.pods.values_mut() {
            stop_process(p);
        }
    }
}

fn rand_bytes() -> [u8; 16] {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A CA and a server certificate for 127.0.0.1 and localhost signed by it.
fn tls() -> anyhow::Result<(String, rustls::ServerConfig)> {
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "fake kubernetes CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let key = rcgen::KeyPair::generate()?;
    let params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    let cert = params.signed_by(&key, &ca)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone(), ca.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?;
    Ok((ca.pem(), cfg))
}

/// A `Status` object, as the API answers a failed call.
fn status(code: u16, reason: &str, message: String, kind: &str, name: &str) -> (u16, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason,
            "details": {"name": name, "kind": kind}, "code": code,
        }),
    )
}

fn serve(req: &crate::http::Request, state: &Mutex<State>, token: &str) -> Response {
    lock(state)
        .requests
        .push(format!("{} {}", req.method, req.target));
    let authed = req
        .header("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .is_some_and(|t| t == token);
    let (code, answer) = if authed {
        route(state, &req.method, &req.target, &req.body)
    } else {
        status(401, "Unauthorized", "Unauthorized".into(), "", "")
    };
    Response::json(code, &answer)
}

/// `k=v,k2=v2` against an object's labels.
fn selects(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        let v = v.trim_start_matches('=');
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(x) = u8::from_str_radix(s.get(i + 1..i + 3).unwrap_or(""), 16)
        {
            out.push(x);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a request's path names: the API group, the namespace, the kind (as in the path and
/// as in a body), and the object's name if one.
struct Target<'a> {
    group: &'static str,
    ns: &'a str,
    kind: &'a str,
    kind_name: &'static str,
    api_kind: &'static str,
    name: Option<&'a str>,
}

impl Target<'_> {
    fn key(&self, name: &str) -> (String, String) {
        (self.ns.to_string(), name.to_string())
    }

    fn not_found(&self, name: &str) -> (u16, Value) {
        let kind = self.kind_name;
        status(
            404,
            "NotFound",
            format!("{kind} \"{name}\" not found"),
            kind,
            name,
        )
    }

    fn refused(&self, code: u16, reason: &str, message: String, name: &str) -> (u16, Value) {
        status(code, reason, message, self.kind_name, name)
    }
}

/// The resource `path` names, or the API server's 404.
fn target(path: &str) -> Result<Target<'_>, (u16, Value)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let not_found = |what: &str| {
        status(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({what})"),
            "",
            "",
        )
    };
    let (group, ns, kind, name) = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, kind] => ("v1", *ns, *kind, None),
        ["api", "v1", "namespaces", ns, kind, name] => ("v1", *ns, *kind, Some(*name)),
        ["apis", "networking.k8s.io", "v1", "namespaces", ns, kind] => {
            ("networking.k8s.io/v1", *ns, *kind, None)
        }
        [
            "apis",
            "networking.k8s.io",
            "v1",
            "namespaces",
            ns,
            kind,
            name,
        ] => ("networking.k8s.io/v1", *ns, *kind, Some(*name)),
        _ => return Err(not_found(path)),
    };
    let (kind_name, api_kind) = match (group, kind) {
        ("v1", "pods") => ("pods", "Pod"),
        ("v1", "secrets") => ("secrets", "Secret"),
        ("networking.k8s.io/v1", "networkpolicies") => ("networkpolicies", "NetworkPolicy"),
        _ => return Err(not_found(kind)),
    };
    Ok(Target {
        group,
        ns,
        kind,
        kind_name,
        api_kind,
        name,
    })
}

fn route(state: &Mutex<State>, method: &str, target_path: &str, body: &[u8]) -> (u16, Value) {
    let (path, query) = target_path.split_once('?').unwrap_or((target_path, ""));
    let q: BTreeMap<String, String> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect();
    let t = match target(path) {
        Ok(t) => t,
        Err(answer) => return answer,
    };
    let mut s = lock(state);
    if !s.namespaces.contains(t.ns) {
        let ns = t.ns;
        return status(
            404,
            "NotFound",
            format!("namespaces \"{ns}\" not found"),
            "namespaces",
            ns,
        );
    }
    match (method, t.name) {
        ("GET", None) => list(&s, &t, &q),
        ("GET", Some(n)) => {
            let found = match t.kind {
                "pods" => s.pods.get(&t.key(n)).map(|p| p.obj.clone()),
                "networkpolicies" => s.policies.get(&t.key(n)).cloned(),
                _ => s.secrets.get(&t.key(n)).cloned(),
            };
            found.map_or_else(|| t.not_found(n), |o| (200, o))
        }
        ("POST", None) => create(&mut s, &t, body),
        ("DELETE", Some(n)) => {
            let gone = match t.kind {
                "pods" => s.pods.remove(&t.key(n)).map(|mut p| {
                    stop_process(&mut p);
                    p.obj
                }),
                "networkpolicies" => s.policies.remove(&t.key(n)),
                _ => s.secrets.remove(&t.key(n)),
            };
            gone.map_or_else(|| t.not_found(n), |o| (200, o))
        }
        _ => t.refused(
            405,
            "MethodNotAllowed",
            format!("{method} is not served on {path}"),
            t.name.unwrap_or(""),
        ),
    }
}

/// `GET` of a kind in a namespace: the objects its `labelSelector` selects.
fn list(s: &State, t: &Target, q: &BTreeMap<String, String>) -> (u16, Value) {
    if q.contains_key("watch") {
        return t.refused(400, "BadRequest", "this fake serves no watches".into(), "");
    }
    let sel = q.get("labelSelector").cloned().unwrap_or_default();
    let items: Vec<Value> = match t.kind {
        "pods" => s
            .pods
            .iter()
            .filter(|((n, _), _)| n == t.ns)
            .map(|(_, p)| p.obj.clone())
            .collect(),
        "networkpolicies" => s
            .policies
            .iter()
            .filter(|((n, _), _)| n == t.ns)
            .map(|(_, v)| v.clone())
            .collect(),
        _ => s
            .secrets
            .iter()
            .filter(|((n, _), _)| n == t.ns)
            .map(|(_, v)| v.clone())
            .collect(),
    };
    let items: Vec<Value> = items.into_iter().filter(|o| selects(&sel, o)).collect();
    (
        200,
        json!({"kind": format!("{}List", t.api_kind), "apiVersion": t.group,
        "metadata": {"resourceVersion": s.version.to_string()}, "items": items}),
    )
}

/// `POST` of an object: checked as the API server checks it, then stored (a pod pending).
fn create(s: &mut State, t: &Target, body: &[u8]) -> (u16, Value) {
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return t.refused(400, "BadRequest", "the body is not JSON".into(), "");
    };
    s.received.push(obj.clone());
    let (group, api_kind, kind_name) = (t.group, t.api_kind, t.kind_name);
    if obj["kind"] != api_kind || obj["apiVersion"] != group {
        let message = format!(
            "the body is not a {group} {api_kind}: kind {} apiVersion {}",
            obj["kind"], obj["apiVersion"]
        );
        return t.refused(400, "BadRequest", message, "");
    }
    let Some(n) = obj["metadata"]["name"].as_str().map(String::from) else {
        let message = format!("{api_kind} is invalid: metadata.name: Required value");
        return t.refused(422, "Invalid", message, "");
    };
    if obj["metadata"]["namespace"]
        .as_str()
        .is_some_and(|x| x != t.ns)
    {
        return t.refused(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
            &n,
        );
    }
    let exists = match t.kind {
        "pods" => s.pods.contains_key(&t.key(&n)),
        "networkpolicies" => s.policies.contains_key(&t.key(&n)),
        _ => s.secrets.contains_key(&t.key(&n)),
    };
    if exists {
        let message = format!("{kind_name} \"{n}\" already exists");
        return t.refused(409, "AlreadyExists", message, &n);
    }
    s.version += 1;
    obj["metadata"]["namespace"] = json!(t.ns);
    obj["metadata"]["uid"] = json!(format!("uid-{}", s.version));
    obj["metadata"]["resourceVersion"] = json!(s.version.to_string());
    obj["metadata"]["creationTimestamp"] = json!("2026-12-02T00:00:00Z");
    if t.kind == "pods" {
        obj["status"] = json!({"phase": "Pending"});
        let pod = Pod {
            obj: obj.clone(),
            child: None,
            dir: PathBuf::new(),
            oom: false,
        };
        s.pods.insert(t.key(&n), pod);
    } else if t.kind == "networkpolicies" {
        s.policies.insert(t.key(&n), obj.clone());
    } else {
        s.secrets.insert(t.key(&n), obj.clone());
    }
    (201, obj)
}

/// SIGTERM, a grace period, then SIGKILL, as a kubelet stops a container.
fn stop_process(p: &mut Pod) {
    if let Some(mut c) = p.child.take() {
        crate::signal(c.id(), rustix::process::Signal::TERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if matches!(c.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// One pass of the kubelet: start pods that are pending, notice the ones that ended.
fn kubelet_pass(state: &Mutex<State>, worker: &Path, root: &Path) {
    let mut s = lock(state);
    let secrets = s.secrets.clone();
    let unpullable = s.unpullable.clone();
    let dns = s.dns.clone();
    for ((ns, name), p) in s.pods.iter_mut() {
        let phase = p.obj["status"]["phase"].as_str().unwrap_or("").to_string();
        match (phase.as_str(), p.child.as_mut()) {
            ("Pending", None) => {
                let image = p.obj["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                if unpullable.contains(&image) {
                    p.obj["status"] = json!({"phase": "Pending", "containerStatuses": [{
                        "name": "worker", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "ImagePullBackOff",
                            "message": format!("Back-off pulling image \"{image}\"")}}}]});
                    continue;
                }
                match start(p, ns, name, &secrets, &dns, worker, root) {
                    Ok(child) => {
                        p.child = Some(child);
                        p.obj["status"] = json!({"phase": "Running", "podIP": "127.0.0.1",
                            "containerStatuses": [{"name": "worker", "image": image, "imageID": "",
                                "ready": true, "restartCount": 0,
                                "state": {"running": {"startedAt": "2026-12-02T00:00:01Z"}}}]});
                    }
                    Err(why) => {
                        p.obj["status"] = json!({"phase": "Pending", "containerStatuses": [{
                            "name": "worker", "image": image, "imageID": "", "ready": false, "restartCount": 0,
                            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": why}}}]});
                    }
                }
            }
            ("Running", Some(c)) => {
                if let Ok(Some(st)) = c.try_wait() {
                    use std::os::unix::process::ExitStatusExt;
                    let code = st.code().unwrap_or(128 + st.signal().unwrap_or(0));
                    let reason = if p.oom {
                        "OOMKilled"
                    } else if code == 0 {
                        "Completed"
                    } else {
                        "Error"
                    };
                    let image = p.obj["spec"]["containers"][0]["image"].clone();
                    p.obj["status"] = json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
                        "podIP": "127.0.0.1",
                        "containerStatuses": [{"name": "worker", "image": image, "imageID": "",
                            "ready": false, "restartCount": 0,
                            "state": {"terminated": {"exitCode": code, "reason": reason}}}]});
                    p.child = None;
                }
            }
            _ => {}
        }
    }
}

/// Starts pod `p`'s one container as a local process.
fn start(
    p: &mut Pod,
    ns: &str,
    name: &str,
    secrets: &BTreeMap<(String, String), Value>,
    dns: &BTreeMap<String, String>,
    worker: &Path,
    root: &Path,
) -> Result<Child, String> {
    let spec = &p.obj["spec"];
    let c = &spec["containers"][0];
    let dir = root.join(ns).join(name);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // Volumes: mount path → local directory.
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
        let vname = m["name"].as_str().unwrap_or("");
        let mpath = m["mountPath"].as_str().unwrap_or("").to_string();
        let vol = spec["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|x| x["name"] == vname))
            .ok_or_else(|| format!("volume {vname:?} is mounted but not defined"))?;
        let local = dir.join("volumes").join(vname);
        std::fs::create_dir_all(&local).map_err(|e| e.to_string())?;
        if let Some(sname) = vol["secret"]["secretName"].as_str() {
            let sec = secrets
                .get(&(ns.to_string(), sname.to_string()))
                .ok_or_else(|| format!("secret \"{sname}\" not found"))?;
            for (k, v) in sec["data"].as_object().cloned().unwrap_or_default() {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(v.as_str().unwrap_or(""))
                    .map_err(|e| format!("secret {sname} key {k}: {e}"))?;
                let f = local.join(&k);
                std::fs::write(&f, bytes).map_err(|e| e.to_string())?;
                use std::os::unix::fs::PermissionsExt;
                let mode = vol["secret"]["defaultMode"].as_u64().unwrap_or(0o644) as u32;
                let _ = std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode));
            }
        } else if vol.get("emptyDir").is_none() {
            return Err(format!(
                "volume {vname:?} is neither a secret nor an emptyDir"
            ));
        }
        mounts.push((mpath, local));
    }
    // Longest mount path first, so `/state/x` maps under `/state` only when no deeper mount does.
    mounts.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
    let map = |a: &str| -> String {
        for (m, local) in &mounts {
            if a == m {
                return local.display().to_string();
            }
            if let Some(rest) = a.strip_prefix(&format!("{m}/")) {
                return local.join(rest).display().to_string();
            }
        }
        a.to_string()
    };
    let command: Vec<String> = c["command"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if command.first().map(String::as_str) != Some("/usr/local/bin/worker") {
        return Err(format!(
            "this kubelet runs only the worker image's /usr/local/bin/worker, not {command:?}"
        ));
    }
    let args: Vec<String> = command[1..]
        .iter()
        .chain(
            c["args"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
                .iter(),
        )
        .map(|a| map(a))
        .collect();
    let mut cmd = if dns.is_empty() {
        Command::new(worker)
    } else {
        // The pod's own /etc/hosts, bound over the host's in a mount namespace of its own.
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (n, ip) in dns {
            hosts.push_str(&format!("{ip} {n}\n"));
        }
        let f = dir.join("hosts");
        std::fs::write(&f, hosts).map_err(|e| e.to_string())?;
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/hosts && exec \"$@\"")
            .arg(&f)
            .arg(worker);
        c
    };
    cmd.args(&args).env_clear();
    for (k, v) in std::env::vars() {
        if k == "PATH" || k == "RUST_LOG" || k.starts_with("TETHER_TEST") {
            cmd.env(k, v);
        }
    }
    for e in c["env"].as_array().cloned().unwrap_or_default() {
        if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
            cmd.env(k, map(v));
        }
    }
    let log = std::fs::File::create(dir.join("log")).map_err(|e| e.to_string())?;
    let log2 = log.try_clone().map_err(|e| e.to_string())?;
    p.dir = dir;
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", worker.display()))
}
