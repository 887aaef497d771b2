//! Where the Kubernetes API is and how to prove who we are to it: a kubeconfig (its current
//! or a named context: the cluster's server and CA, the user's bearer token, token file or
//! client certificate and key, inline `*-data` or as files), or, inside a pod, the service
//! account Kubernetes mounts (`/var/run/secrets/kubernetes.io/serviceaccount`). Token files
//! are read again for every call, since bound service-account tokens rotate. Nothing here is
//! logged: `Debug` shows the server and the kind of credential only.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// Why the cluster or the proof of who we are cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `what`: "the kubeconfig", "the token file", "client-key", …
    #[error("reading {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the kubeconfig {path} is not valid: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: serde_norway::Error,
    },
    #[error("the kubeconfig {0} has no current-context: set provision.k8s.context")]
    NoCurrentContext(PathBuf),
    #[error("the kubeconfig {path} has no context {context:?}")]
    NoContext { path: PathBuf, context: String },
    #[error("context {context:?} names cluster {cluster:?}, which the kubeconfig does not have")]
    NoCluster { context: String, cluster: String },
    #[error("{what} in the kubeconfig is not base64: {source}")]
    Base64 {
        what: &'static str,
        #[source]
        source: base64::DecodeError,
    },
    #[error(
        "user {0:?} in the kubeconfig authenticates through an exec plugin or auth provider, which the brain does not run: give it a token (a service account's) or a client certificate"
    )]
    Plugin(String),
    #[error("user {0:?} in the kubeconfig has a client certificate or key without the other")]
    HalfCertificate(String),
    #[error("cluster {0:?} has no server")]
    NoServer(String),
    #[error("not inside a pod (no KUBERNETES_SERVICE_HOST): set provision.k8s.kubeconfig")]
    NotInPod,
    #[error(
        "no service-account token at {0}: is automountServiceAccountToken off for the brain's pod?"
    )]
    NoToken(PathBuf),
    #[error("reading {path}: {source}")]
    ReadMounted {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The mounted service account of a pod.
pub const IN_CLUSTER_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How to reach and authenticate to one cluster.
#[derive(Clone)]
pub struct Cluster {
    /// `https://HOST:PORT`, without a trailing slash.
    pub server: String,
    /// The context's namespace, if it names one.
    pub namespace: Option<String>,
    /// PEM of the CA that signs the API server's certificate (else the system's roots).
    pub ca_pem: Option<Vec<u8>>,
    pub insecure: bool,
    pub credential: Credential,
    /// Where this came from, for errors.
    pub source: String,
}

/// The user's proof.
#[derive(Clone)]
pub enum Credential {
    Token(String),
    /// Read again for every call.
    TokenFile(PathBuf),
    /// PEM of the client certificate followed by its key.
    ClientCert(Vec<u8>),
    None,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.credential {
            Credential::Token(_) => "token",
            Credential::TokenFile(_) => "token file",
            Credential::ClientCert(_) => "client certificate",
            Credential::None => "none",
        };
        f.debug_struct("Cluster")
            .field("server", &self.server)
            .field("credential", &kind)
            .field("source", &self.source)
            .finish()
    }
}

impl Cluster {
    /// The bearer token for the next call, if the credential is one.
    pub fn bearer(&self) -> Result<Option<String>, Error> {
        match &self.credential {
            Credential::Token(t) => Ok(Some(t.clone())),
            Credential::TokenFile(p) => std::fs::read_to_string(p)
                .map(|t| Some(t.trim().to_string()))
                .map_err(|source| Error::Read {
                    what: "the token file",
                    path: p.clone(),
                    source,
                }),
            _ => Ok(None),
        }
    }
}

/// The parts of a kubeconfig the provider uses.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "kebab-case", default)]
struct KubeConfig {
    current_context: String,
    clusters: Vec<NamedCluster>,
    users: Vec<NamedUser>,
    contexts: Vec<NamedContext>,
}

#[derive(Debug, Deserialize)]
struct NamedCluster {
    name: String,
    #[serde(default)]
    cluster: ClusterEntry,
}

#[derive(Debug, Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: UserEntry,
}

#[derive(Debug, Deserialize)]
struct NamedContext {
    name: String,
    #[serde(default)]
    context: ContextEntry,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "kebab-case", default)]
struct ClusterEntry {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "kebab-case", default)]
struct UserEntry {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    exec: Option<serde_json::Value>,
    auth_provider: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct ContextEntry {
    cluster: String,
    user: String,
    namespace: Option<String>,
}

/// The kubeconfig path when none is configured: the first of `$KUBECONFIG`, else
/// `~/.kube/config`.
pub fn default_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(k) = env("KUBECONFIG").filter(|k| !k.is_empty()) {
        return k.split(':').find(|p| !p.is_empty()).map(PathBuf::from);
    }
    env("HOME").map(|h| Path::new(&h).join(".kube/config"))
}

/// Reads the kubeconfig at `path` for `context` (else its current context).
pub fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<Cluster, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        what: "the kubeconfig",
        path: path.to_path_buf(),
        source,
    })?;
    let cfg: KubeConfig = serde_norway::from_str(&text).map_err(|source| Error::Invalid {
        path: path.to_path_buf(),
        source,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let relative = |p: &PathBuf| {
        if p.is_absolute() {
            p.clone()
        } else {
            base.join(p)
        }
    };
    let want = context.unwrap_or(&cfg.current_context);
    if want.is_empty() {
        return Err(Error::NoCurrentContext(path.to_path_buf()));
    }
    let ctx = cfg
        .contexts
        .iter()
        .find(|c| c.name == want)
        .map(|c| &c.context)
        .ok_or_else(|| Error::NoContext {
            path: path.to_path_buf(),
            context: want.to_string(),
        })?;
    let cl = cfg
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .map(|c| &c.cluster)
        .ok_or_else(|| Error::NoCluster {
            context: want.to_string(),
            cluster: ctx.cluster.clone(),
        })?;
    let user = cfg
        .users
        .iter()
        .find(|u| u.name == ctx.user)
        .map(|u| &u.user);
    let b64 = |what: &'static str, s: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|source| Error::Base64 { what, source })
    };
    let read = |what: &'static str, p: &PathBuf| {
        let path = relative(p);
        std::fs::read(&path).map_err(|source| Error::Read { what, path, source })
    };
    let ca_pem = match (&cl.certificate_authority_data, &cl.certificate_authority) {
        (Some(d), _) => Some(b64("certificate-authority-data", d)?),
        (None, Some(p)) => Some(read("certificate-authority", p)?),
        _ => None,
    };
    let credential = match user {
        None => Credential::None,
        Some(u) => {
            if u.exec.is_some() || u.auth_provider.is_some() {
                return Err(Error::Plugin(ctx.user.clone()));
            }
            let cert = match (&u.client_certificate_data, &u.client_certificate) {
                (Some(d), _) => Some(b64("client-certificate-data", d)?),
                (None, Some(p)) => Some(read("client-certificate", p)?),
                _ => None,
            };
            let key = match (&u.client_key_data, &u.client_key) {
                (Some(d), _) => Some(b64("client-key-data", d)?),
                (None, Some(p)) => Some(read("client-key", p)?),
                _ => None,
            };
            match (&u.token, &u.token_file, cert, key) {
                (Some(t), _, _, _) => Credential::Token(t.clone()),
                (None, Some(f), _, _) => Credential::TokenFile(relative(f)),
                (None, None, Some(mut c), Some(k)) => {
                    c.push(b'\n');
                    c.extend_from_slice(&k);
                    Credential::ClientCert(c)
                }
                (None, None, Some(_), None) | (None, None, None, Some(_)) => {
                    return Err(Error::HalfCertificate(ctx.user.clone()));
                }
                _ => Credential::None,
            }
        }
    };
    if cl.server.is_empty() {
        return Err(Error::NoServer(ctx.cluster.clone()));
    }
    Ok(Cluster {
        server: cl.server.trim_end_matches('/').to_string(),
        namespace: ctx.namespace.clone(),
        ca_pem,
        insecure: cl.insecure_skip_tls_verify,
        credential,
        source: format!("{} (context {want})", path.display()),
    })
}

/// The service account Kubernetes mounts in a pod, and the API server it names.
pub fn in_cluster(env: &dyn Fn(&str) -> Option<String>, dir: &Path) -> Result<Cluster, Error> {
    let host = env("KUBERNETES_SERVICE_HOST").ok_or(Error::NotInPod)?;
    let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".into());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let token = dir.join("token");
    if !token.exists() {
        return Err(Error::NoToken(token));
    }
    let ca = std::fs::read(dir.join("ca.crt")).map_err(|source| Error::ReadMounted {
        path: dir.join("ca.crt"),
        source,
    })?;
    let namespace = std::fs::read_to_string(dir.join("namespace"))
        .ok()
        .map(|n| n.trim().to_string());
    Ok(Cluster {
        server: format!("https://{host}:{port}"),
        namespace,
        ca_pem: Some(ca),
        insecure: false,
        credential: Credential::TokenFile(token),
        source: "the pod's service account".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: c1
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: LS0tLS1CRUdJTg==
contexts:
- name: dev
  context: {cluster: c1, user: u1, namespace: agents}
- name: certs
  context: {cluster: c1, user: u2}
- name: plugin
  context: {cluster: c1, user: u3}
users:
- name: u1
  user: {token: abc}
- name: u2
  user:
    client-certificate: cert.pem
    client-key-data: S0VZ
- name: u3
  user:
    exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}
"#;

    #[test]
    fn contexts_pick_their_cluster_user_and_namespace() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config");
        std::fs::write(&p, CONFIG).unwrap();
        std::fs::write(d.path().join("cert.pem"), "CERT").unwrap();
        let c = from_kubeconfig(&p, None).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.namespace.as_deref(), Some("agents"));
        assert_eq!(c.ca_pem.as_deref(), Some(&b"-----BEGIN"[..]));
        assert_eq!(c.bearer().unwrap().as_deref(), Some("abc"));
        assert!(!format!("{c:?}").contains("abc"), "the token is in Debug");

        let c = from_kubeconfig(&p, Some("certs")).unwrap();
        match c.credential {
            Credential::ClientCert(pem) => assert_eq!(pem, b"CERT\nKEY"),
            _ => panic!("not a client certificate"),
        }
        let e = from_kubeconfig(&p, Some("plugin")).unwrap_err().to_string();
        assert!(e.contains("exec plugin"), "{e}");
        let e = from_kubeconfig(&p, Some("nope")).unwrap_err().to_string();
        assert!(e.contains("no context \"nope\""), "{e}");
    }

    #[test]
    fn in_cluster_reads_the_mounted_service_account() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("token"), "tok\n").unwrap();
        std::fs::write(d.path().join("ca.crt"), "CA").unwrap();
        std::fs::write(d.path().join("namespace"), "tether\n").unwrap();
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_string()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_string()),
            _ => None,
        };
        let c = in_cluster(&env, d.path()).unwrap();
        assert_eq!(c.server, "https://10.96.0.1:443");
        assert_eq!(c.namespace.as_deref(), Some("tether"));
        assert_eq!(c.bearer().unwrap().as_deref(), Some("tok"));
        // Rotated on disk: the next call reads the new one.
        std::fs::write(d.path().join("token"), "tok2").unwrap();
        assert_eq!(c.bearer().unwrap().as_deref(), Some("tok2"));
        let none = |_: &str| None;
        assert!(
            in_cluster(&none, d.path())
                .unwrap_err()
                .to_string()
                .contains("kubeconfig")
        );
    }

    #[test]
    fn kubeconfig_env_takes_the_first_path() {
        let env = |k: &str| match k {
            "KUBECONFIG" => Some("/a/one:/b/two".to_string()),
            _ => None,
        };
        assert_eq!(default_path(&env), Some(PathBuf::from("/a/one")));
        let env = |k: &str| (k == "HOME").then(|| "/home/u".to_string());
        assert_eq!(
            default_path(&env),
            Some(PathBuf::from("/home/u/.kube/config"))
        );
    }
}
