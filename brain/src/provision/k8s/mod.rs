//! The `k8s` provider: a bare Pod per machine (`restartPolicy: Never`: a Job would run the
//! worker again from scratch) in the configured namespace, through the Kubernetes REST API
//! (`reqwest`, JSON; auth in [`auth`]).
//!
//! The pod runs the worker image's `worker join` as an unprivileged user with the request's
//! CPU, memory, ephemeral storage and GPU as requests and limits, `runAsNonRoot`, every
//! capability dropped, the `RuntimeDefault` seccomp profile, a read-only root, an `emptyDir`
//! for its state and workspaces and one for `/tmp`, and no service-account token. Labels
//! `tether.brain`, `tether.machine` and `tether.task` name it; `list` finds pods (and stray
//! join secrets) by label selector. The one-time join token is a Secret mounted as a file,
//! deleted once the worker has joined. A pod that failed (OOMKilled, evicted, an image that
//! cannot be pulled, the worker gave up on its brain) is reported with Kubernetes' reason, and
//! reconcile ends its machine `failed` with it.
//!
//! Each pod gets a NetworkPolicy of its own, made before the pod and deleted with it
//! (`network_policy = "per-pod"`, the default): nothing connects in, and out it reaches only
//! the brain and the cluster DNS. With `network_policy = "namespace"` the namespace's own
//! policy does that (deploy/k8s/30-network-policy.yaml), and the brain checks before each
//! pod that the namespace has a policy limiting egress. A kubeconfig that turns TLS
//! verification off is refused unless `allow_insecure_skip_tls_verify` says otherwise.

pub mod auth;
pub mod pod;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use shared::locks::Lock;

use super::error::ProviderError;
use super::provider::{Created, Join, Provisioner, Seen, no_params};
use super::records::{Machine, Spec};
use auth::Cluster;

/// `[provision.k8s]` in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct K8sConfig {
    /// The kubeconfig (default: `$KUBECONFIG`, else `~/.kube/config`; inside a pod with
    /// neither, the pod's service account).
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig's context (default: its current context).
    pub context: Option<String>,
    /// Use the pod's service account even where a kubeconfig exists.
    pub in_cluster: bool,
    /// Where worker pods go (default: the context's namespace, else `default`).
    pub namespace: Option<String>,
    /// The worker image (`deploy/Dockerfile.worker`), pulled by the cluster.
    pub image: String,
    pub image_pull_policy: String,
    /// Defaults when a request names none.
    pub cpu: u32,
    pub memory_gb: u32,
    pub disk_gb: u32,
    /// The extended resource a GPU is requested as.
    pub gpu_resource: String,
    /// Size of the `/tmp` emptyDir (in memory), in MiB.
    pub tmp_mb: u32,
    /// Node selector for worker pods.
    pub node_selector: std::collections::BTreeMap<String, String>,
    /// What confines worker pods' network: a NetworkPolicy per pod made by the brain
    /// (`per-pod`), or the namespace's own (`namespace`: the brain makes none, and refuses
    /// to start a pod while no policy of the namespace limits egress).
    pub network_policy: NetworkPolicyMode,
    /// The brain, as a pod's policy lets it be reached when the brain URL names a host:
    /// the labels of its pods (deploy/k8s's `tether.role: brain`) ...
    pub brain_pod_labels: std::collections::BTreeMap<String, String>,
    /// ... in this namespace (default: the worker pods').
    pub brain_namespace: Option<String>,
    /// The brain's addresses (`ADDRESS/BITS`), for a brain outside the cluster reached by a
    /// host name; they win over the pod labels.
    pub brain_cidrs: Vec<String>,
    /// Use a kubeconfig whose cluster has `insecure-skip-tls-verify: true` (the API
    /// server's certificate is not checked, so anyone on the path gets the credentials).
    pub allow_insecure_skip_tls_verify: bool,
}

/// `[provision.k8s] network_policy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkPolicyMode {
    #[default]
    PerPod,
    Namespace,
}

impl Default for K8sConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            in_cluster: false,
            namespace: None,
            image: "tether-worker".into(),
            image_pull_policy: "IfNotPresent".into(),
            cpu: 1,
            memory_gb: 1,
            disk_gb: 10,
            gpu_resource: "nvidia.com/gpu".into(),
            tmp_mb: 256,
            node_selector: Default::default(),
            network_policy: NetworkPolicyMode::PerPod,
            brain_pod_labels: [("tether.role".to_string(), "brain".to_string())].into(),
            brain_namespace: None,
            brain_cidrs: vec![],
            allow_insecure_skip_tls_verify: false,
        }
    }
}

/// How long one API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of an API answer read.
const MAX_ANSWER: usize = 8 << 20;

/// Worker pods on a Kubernetes cluster.
pub struct K8sProvider {
    cfg: K8sConfig,
    tag: String,
    /// Made on first use (a brain that never provisions pods needs no kubeconfig).
    api: std::sync::Mutex<Option<Arc<Api>>>,
}

impl K8sProvider {
    pub fn new(cfg: &K8sConfig, tag: &str) -> Self {
        Self {
            cfg: cfg.clone(),
            tag: tag.to_string(),
            api: std::sync::Mutex::new(None),
        }
    }

    fn api(&self) -> Result<Arc<Api>, ProviderError> {
        let mut a = self.api.locked();
        if let Some(a) = a.as_ref() {
            return Ok(a.clone());
        }
        let env = |k: &str| std::env::var(k).ok();
        let in_pod = env("KUBERNETES_SERVICE_HOST").is_some();
        let cluster = if self.cfg.in_cluster {
            auth::in_cluster(&env, std::path::Path::new(auth::IN_CLUSTER_DIR))
        } else {
            let path = self
                .cfg
                .kubeconfig
                .clone()
                .or_else(|| auth::default_path(&env));
            match path {
                Some(p) if p.exists() || self.cfg.kubeconfig.is_some() || !in_pod => {
                    auth::from_kubeconfig(&p, self.cfg.context.as_deref())
                }
                _ => auth::in_cluster(&env, std::path::Path::new(auth::IN_CLUSTER_DIR)),
            }
        }
        .map_err(|e| ProviderError::untouched(format!("k8s: {e}")))?;
        if cluster.insecure && !self.cfg.allow_insecure_skip_tls_verify {
            return Err(ProviderError::untouched(format!(
                "k8s: {} says insecure-skip-tls-verify: true, so the API server's certificate would not be checked and anyone on the path could take the brain's credentials; give the cluster's CA (certificate-authority-data) instead, or, for a throw-away cluster, set allow_insecure_skip_tls_verify = true under [provision.k8s]",
                cluster.source
            )));
        }
        let made = Arc::new(Api::new(cluster, self.cfg.namespace.clone())?);
        *a = Some(made.clone());
        Ok(made)
    }

    fn selector(&self) -> String {
        format!("{}={}", pod::BRAIN, self.tag)
    }
}

#[async_trait::async_trait]
impl Provisioner for K8sProvider {
    fn name(&self) -> &'static str {
        "k8s"
    }

    fn remote(&self, _params: &serde_json::Value) -> bool {
        true
    }

    fn check(&self, params: &serde_json::Value, _spec: &Spec) -> Result<(), ProviderError> {
        no_params("k8s", params, "they are in [provision.k8s]")?;
        pod::check_label_value(&self.tag).map_err(|e| ProviderError::new(e.to_string()))
    }

    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError> {
        let api = self.api()?;
        let secret = pod::secret(m, &self.tag, &join.token);
        let p = pod::pod(m, &self.tag, &self.cfg, join)
            .map_err(|e| ProviderError::untouched(e.to_string()))?;
        let per_pod = self.cfg.network_policy == NetworkPolicyMode::PerPod;
        if per_pod {
            let policy = pod::network_policy(m, &self.tag, &self.cfg, &join.brain_url)
                .map_err(|e| ProviderError::untouched(format!("k8s: {e}")))?;
            // Made first, so the pod never runs unconfined; a retried create replaces what
            // the first try left.
            api.delete(POLICIES, &pod::policy_name(&m.id)).await?;
            api.create(POLICIES, &policy)
                .await
                .map_err(|e| e.untouched_if_refused())?;
        } else {
            self.check_namespace_policy(&api).await?;
        }
        // What this create made, taken back when a later step fails.
        let undo = async |secret: bool| {
            if secret {
                let _ = api.delete("secrets", &pod::secret_name(&m.id)).await;
            }
            if per_pod {
                let _ = api.delete(POLICIES, &pod::policy_name(&m.id)).await;
            }
        };
        // A retried create of the same machine replaces what the first try left.
        if let Err(e) = api.delete("secrets", &pod::secret_name(&m.id)).await {
            undo(false).await;
            return Err(e.into());
        }
        if let Err(e) = api.create("secrets", &secret).await {
            undo(false).await;
            return Err(e.untouched_if_refused());
        }
        if let Err(e) = api.create("pods", &p).await {
            // Nothing runs: take the token back, and say what the cluster said.
            undo(true).await;
            return Err(e.untouched_if_refused());
        }
        Ok(Created {
            handle: format!("{}/{}", api.namespace, pod::pod_name(&m.id)),
            address: format!("pod/{}", pod::pod_name(&m.id)),
        })
    }

    async fn joined(&self, m: &Machine) -> Result<(), ProviderError> {
        // The token was one-time and is spent: the secret need not outlive the join.
        self.api()?
            .delete("secrets", &pod::secret_name(&m.id))
            .await
            .map_err(Into::into)
    }

    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError> {
        let api = self.api()?;
        api.delete("pods", &pod::pod_name(&m.id)).await?;
        api.delete("secrets", &pod::secret_name(&m.id)).await?;
        // After the pod: a pod is never left without its policy.
        if self.cfg.network_policy == NetworkPolicyMode::PerPod {
            api.delete(POLICIES, &pod::policy_name(&m.id)).await?;
        }
        Ok(())
    }

    async fn list(&self, records: &[Machine]) -> Result<Vec<Seen>, ProviderError> {
        let api = self.api()?;
        let pods = api.list("pods", &self.selector()).await?;
        let mut seen: Vec<Seen> = pods
            .iter()
            .filter_map(|p| {
                let machine = p["metadata"]["labels"][pod::MACHINE].as_str()?.to_string();
                Some(Seen {
                    handle: format!(
                        "{}/{}",
                        api.namespace,
                        p["metadata"]["name"].as_str().unwrap_or_default()
                    ),
                    failure: pod::failure(p),
                    machine,
                })
            })
            .collect();
        // A join secret or a pod's policy whose pod is gone and that no live record names is
        // left over (a brain that died between making it and making the pod, or before
        // deleting it): destroying its machine deletes it.
        let mut leftovers: Vec<(&str, serde_json::Value)> = api
            .list("secrets", &self.selector())
            .await?
            .into_iter()
            .map(|s| ("secret", s))
            .collect();
        if self.cfg.network_policy == NetworkPolicyMode::PerPod {
            leftovers.extend(
                api.list(POLICIES, &self.selector())
                    .await?
                    .into_iter()
                    .map(|p| ("networkpolicy", p)),
            );
        }
        for (what, s) in leftovers {
            if let Some(machine) = s["metadata"]["labels"][pod::MACHINE].as_str()
                && !seen.iter().any(|x| x.machine == machine)
                && !records.iter().any(|r| r.id == machine)
            {
                seen.push(Seen {
                    machine: machine.to_string(),
                    handle: format!("{what} {}", s["metadata"]["name"].as_str().unwrap_or("")),
                    failure: None,
                });
            }
        }
        Ok(seen)
    }
}

impl K8sProvider {
    /// With `network_policy = "namespace"`: the namespace must have a NetworkPolicy that
    /// limits egress, or no pod is started.
    async fn check_namespace_policy(&self, api: &Api) -> Result<(), ProviderError> {
        let policies = api
            .list(POLICIES, "")
            .await
            .map_err(|e| e.untouched_if_refused())?;
        let limits_egress = policies.iter().any(|p| {
            p["spec"]["policyTypes"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == "Egress"))
        });
        if limits_egress {
            return Ok(());
        }
        Err(ProviderError::untouched(format!(
            "k8s: provision.k8s.network_policy = \"namespace\" says namespace {} confines worker pods, but none of its NetworkPolicies limits egress: apply deploy/k8s/30-network-policy.yaml there, or set network_policy = \"per-pod\" for a policy per pod",
            api.namespace
        )))
    }
}

/// The NetworkPolicies' resource (networking.k8s.io/v1).
const POLICIES: &str = "networkpolicies";

/// A failed API call.
#[derive(Debug)]
struct ApiError {
    message: String,
    /// The server answered and refused (4xx): nothing was made.
    refused: bool,
}

impl ApiError {
    fn untouched_if_refused(self) -> ProviderError {
        if self.refused {
            ProviderError::untouched(self.message)
        } else {
            ProviderError::new(self.message)
        }
    }
}

impl From<ApiError> for ProviderError {
    fn from(e: ApiError) -> Self {
        ProviderError::new(e.message)
    }
}

/// The namespaced API of one cluster: core/v1, and networking.k8s.io/v1 for policies.
struct Api {
    cluster: Cluster,
    namespace: String,
    http: reqwest::Client,
}

impl Api {
    fn new(cluster: Cluster, namespace: Option<String>) -> Result<Self, ProviderError> {
        let bad = |e: String| ProviderError::untouched(format!("k8s: {e}"));
        if !cluster.server.starts_with("https://") {
            return Err(bad(format!(
                "the API server {} is not https: the brain sends credentials only over TLS",
                cluster.server
            )));
        }
        let mut b = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("tether-brain/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = &cluster.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| bad(format!("the cluster's CA ({}): {e}", cluster.source)))?;
            b = b.tls_built_in_root_certs(false);
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if cluster.insecure {
            b = b.danger_accept_invalid_certs(true);
        }
        if let auth::Credential::ClientCert(pem) = &cluster.credential {
            let id = reqwest::Identity::from_pem(pem)
                .map_err(|e| bad(format!("the client certificate ({}): {e}", cluster.source)))?;
            b = b.identity(id);
        }
        let http = b
            .build()
            .map_err(|e| bad(format!("making the HTTP client: {e}")))?;
        let namespace = namespace
            .or_else(|| cluster.namespace.clone())
            .unwrap_or_else(|| "default".into());
        pod::check_name(&namespace).map_err(|e| bad(format!("namespace: {e}")))?;
        Ok(Self {
            cluster,
            namespace,
            http,
        })
    }

    fn url(&self, kind: &str, name: Option<&str>) -> String {
        let group = if kind == POLICIES {
            "apis/networking.k8s.io/v1"
        } else {
            "api/v1"
        };
        let mut u = format!(
            "{}/{group}/namespaces/{}/{kind}",
            self.cluster.server, self.namespace
        );
        if let Some(n) = name {
            u.push('/');
            u.push_str(n);
        }
        u
    }

    async fn send(
        &self,
        doing: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<(u16, serde_json::Value), ApiError> {
        let fail = |message: String, refused: bool| ApiError { message, refused };
        let token = self
            .cluster
            .bearer()
            .map_err(|e| fail(format!("k8s: {doing}: {e}"), true))?;
        let req = match token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| {
                fail(
                    format!("k8s: {doing}: cannot reach {}: {e}", self.cluster.server),
                    e.is_connect(),
                )
            })?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| fail(format!("k8s: {doing}: reading the answer: {e}"), false))?;
        if body.len() > MAX_ANSWER {
            return Err(fail(
                format!("k8s: {doing}: an answer over {MAX_ANSWER} bytes"),
                false,
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        Ok((status, v))
    }

    /// The API's own words for a failed call (a `Status` object), with what to do for the
    /// common ones.
    fn refusal(&self, doing: &str, status: u16, v: &serde_json::Value) -> ApiError {
        let said = v["message"].as_str().unwrap_or("").to_string();
        let hint = match status {
            401 => "; the kubeconfig's credentials are not accepted (expired token?)",
            403 => "; give the brain's account the Role in deploy/k8s/10-rbac.yaml",
            404 if v["details"]["kind"] == "namespaces" || said.contains("namespace") => {
                "; create the namespace or set provision.k8s.namespace"
            }
            _ => "",
        };
        ApiError {
            message: format!(
                "k8s: {doing}: {status} {}: {said}{hint}",
                v["reason"].as_str().unwrap_or("")
            ),
            refused: (400..500).contains(&status),
        }
    }

    async fn create(&self, kind: &str, body: &serde_json::Value) -> Result<(), ApiError> {
        let doing = format!("creating {kind} {}", body["metadata"]["name"]);
        let (status, v) = self
            .send(
                &doing,
                self.http
                    .post(self.url(kind, None))
                    .header("Content-Type", "application/json")
                    .body(body.to_string()),
            )
            .await?;
        match status {
            200..=202 => Ok(()),
            _ => Err(self.refusal(&doing, status, &v)),
        }
    }

    /// Deletes `name`; one that is not there is fine.
    async fn delete(&self, kind: &str, name: &str) -> Result<(), ApiError> {
        let doing = format!("deleting {kind} {name}");
        let (status, v) = self
            .send(
                &doing,
                self.http
                    .delete(self.url(kind, Some(name)))
                    .query(&[("gracePeriodSeconds", "5")]),
            )
            .await?;
        match status {
            200 | 202 | 404 => Ok(()),
            _ => Err(self.refusal(&doing, status, &v)),
        }
    }

    async fn list(&self, kind: &str, selector: &str) -> Result<Vec<serde_json::Value>, ApiError> {
        let doing = format!("listing {kind} with {selector}");
        let mut req = self.http.get(self.url(kind, None));
        if !selector.is_empty() {
            req = req.query(&[("labelSelector", selector)]);
        }
        let (status, v) = self.send(&doing, req).await?;
        if status != 200 {
            return Err(self.refusal(&doing, status, &v));
        }
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }
}
