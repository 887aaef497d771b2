//! The `ec2` provider: an EC2 instance per machine through the EC2 Query API (`aws.rs`:
//! RunInstances, DescribeInstances, TerminateInstances, SigV4-signed). The instance is tagged
//! with this brain and the machine (reconcile finds it by those tags) and launched with a
//! client token equal to the machine id, so a retried launch is the same launch. Its user data
//! is the cloud-init document that installs the worker and joins this brain
//! (`deploy/cloud-init.yaml.tmpl`, with `deploy/install-worker.sh` inside). Every value put
//! into it is checked to be shell-safe, so no quoting is needed and none can be broken. AWS
//! credentials stay in the brain.

use base64::Engine as _;
use serde::Deserialize;

use super::aws::Ec2;
use super::error::ProviderError;
use super::provider::{Created, Join, Provisioner, Seen};
use super::records::Machine;

/// `[provision.ec2]` in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ec2Config {
    /// Default: AWS_REGION, AWS_DEFAULT_REGION or ~/.aws/config.
    pub region: Option<String>,
    /// Default: AWS_ENDPOINT_URL_EC2, AWS_ENDPOINT_URL or the region's public endpoint.
    pub endpoint: Option<String>,
    /// The image instances boot (with cloud-init).
    pub ami: String,
    /// The instance type when no entry of `instance_types` fits better.
    pub instance_type: String,
    /// Types to choose from by the request's cpu and memory: the first that fits.
    pub instance_types: Vec<InstanceType>,
    /// Where instances download the worker binary, and its SHA-256.
    pub worker_url: String,
    pub worker_sha256: String,
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    pub key_name: Option<String>,
}

impl Default for Ec2Config {
    fn default() -> Self {
        Self {
            region: None,
            endpoint: None,
            ami: String::new(),
            instance_type: "t3.small".into(),
            instance_types: Vec::new(),
            worker_url: String::new(),
            worker_sha256: String::new(),
            subnet_id: None,
            security_group_ids: Vec::new(),
            key_name: None,
        }
    }
}

/// An instance type and what it offers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceType {
    pub name: String,
    pub cpu: u32,
    pub memory_gb: u32,
}

/// The tags on instances.
const BRAIN: &str = "tether.brain";
const MACHINE: &str = "tether.machine";

/// EC2 instances.
pub struct Ec2Provider {
    cfg: Ec2Config,
    tag: String,
}

impl Ec2Provider {
    pub fn new(cfg: &Ec2Config, tag: &str) -> Self {
        Self {
            cfg: cfg.clone(),
            tag: tag.to_string(),
        }
    }

    fn client(&self) -> Result<Ec2, ProviderError> {
        Ec2::new(self.cfg.endpoint.as_deref(), self.cfg.region.as_deref())
            .map_err(ProviderError::untouched)
    }

    fn instance_type(&self, m: &Machine) -> String {
        self.cfg
            .instance_types
            .iter()
            .find(|t| t.cpu >= m.spec.cpu && t.memory_gb >= m.spec.memory_gb)
            .map(|t| t.name.clone())
            .unwrap_or_else(|| self.cfg.instance_type.clone())
    }

    /// This brain's live instances for machine `id`.
    async fn instances_of(&self, c: &Ec2, id: &str) -> Result<Vec<String>, ProviderError> {
        Ok(c.live_by_tag(MACHINE, id)
            .await
            .map_err(ProviderError::new)?
            .into_iter()
            .filter(|i| i.tags.get(BRAIN) == Some(&self.tag))
            .map(|i| i.id)
            .collect())
    }
}

#[async_trait::async_trait]
impl Provisioner for Ec2Provider {
    fn name(&self) -> &'static str {
        "ec2"
    }

    fn check(&self, params: &serde_json::Value) -> Result<(), ProviderError> {
        if !(params.is_null() || params.as_object().is_some_and(|o| o.is_empty())) {
            return Err(ProviderError::new(
                "the ec2 provider takes no parameters (they are in [provision.ec2])",
            ));
        }
        for (what, v) in [
            ("ami", &self.cfg.ami),
            ("worker_url", &self.cfg.worker_url),
            ("worker_sha256", &self.cfg.worker_sha256),
        ] {
            if v.is_empty() {
                return Err(ProviderError::new(format!(
                    "set provision.ec2.{what} in the brain's config to use the ec2 provider"
                )));
            }
        }
        Ok(())
    }

    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError> {
        let c = self.client()?;
        let user_data = render(&UserData {
            machine: &m.id,
            brain_url: &join.brain_url,
            ca_hash: &join.ca_hash,
            token: &join.token,
            name: &join.name,
            labels: &join.labels,
            worker_url: &self.cfg.worker_url,
            worker_sha256: &self.cfg.worker_sha256,
        })
        .map_err(ProviderError::untouched)?;
        let mut tags = vec![
            (BRAIN.to_string(), self.tag.clone()),
            (MACHINE.to_string(), m.id.clone()),
            ("Name".to_string(), format!("tether-{}", m.id)),
        ];
        if let Some(t) = &m.task {
            tags.push(("tether.task".into(), t.clone()));
        }
        let mut extra = Vec::new();
        if let Some(s) = &self.cfg.subnet_id {
            extra.push(("SubnetId".to_string(), s.clone()));
        }
        for (i, g) in self.cfg.security_group_ids.iter().enumerate() {
            extra.push((format!("SecurityGroupId.{}", i + 1), g.clone()));
        }
        if let Some(k) = &self.cfg.key_name {
            extra.push(("KeyName".to_string(), k.clone()));
        }
        let i = c
            .run_instance(
                &self.cfg.ami,
                &self.instance_type(m),
                &user_data,
                &tags,
                &m.id,
                &extra,
            )
            .await
            .map_err(ProviderError::new)?;
        Ok(Created {
            address: if i.private_ip.is_empty() {
                i.id.clone()
            } else {
                i.private_ip.clone()
            },
            handle: i.id,
        })
    }

    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError> {
        let c = self.client().map_err(|e| ProviderError::new(e.message))?;
        let ids = self.instances_of(&c, &m.id).await?;
        c.terminate(&ids).await.map_err(ProviderError::new)
    }

    async fn list(&self, _records: &[Machine]) -> Result<Vec<Seen>, ProviderError> {
        let c = self.client().map_err(|e| ProviderError::new(e.message))?;
        Ok(c.live_by_tag(BRAIN, &self.tag)
            .await
            .map_err(ProviderError::new)?
            .into_iter()
            .filter_map(|i| {
                Some(Seen {
                    machine: i.tags.get(MACHINE)?.clone(),
                    handle: i.id,
                })
            })
            .collect())
    }
}

const TEMPLATE: &str = include_str!("../../../deploy/cloud-init.yaml.tmpl");
const INSTALL_SCRIPT: &[u8] = include_bytes!("../../../deploy/install-worker.sh");

/// What an instance needs to join.
#[derive(Debug, Clone)]
pub struct UserData<'a> {
    pub machine: &'a str,
    pub brain_url: &'a str,
    pub ca_hash: &'a str,
    pub token: &'a str,
    pub name: &'a str,
    pub labels: &'a std::collections::BTreeMap<String, String>,
    /// Where the instance downloads the worker binary, and its SHA-256.
    pub worker_url: &'a str,
    pub worker_sha256: &'a str,
}

/// Characters a value may have to go into the document unquoted.
fn safe(what: &str, v: &str) -> Result<(), String> {
    let ok = !v.is_empty()
        && v.len() <= 2048
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:=@+%-,".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {v:?} cannot go into user data: use letters, digits and ._/:=@+%-,"
        ))
    }
}

/// Renders the cloud-init document.
pub fn render(u: &UserData<'_>) -> Result<String, String> {
    safe("machine id", u.machine)?;
    safe("brain URL", u.brain_url)?;
    safe("CA hash", u.ca_hash)?;
    safe("join token", u.token)?;
    safe("worker name", u.name)?;
    safe("worker URL", u.worker_url)?;
    if !(u.worker_url.starts_with("https://") || u.worker_url.starts_with("http://")) {
        return Err(format!("worker URL {:?} must be http(s)://", u.worker_url));
    }
    if u.worker_sha256.len() != 64 || !u.worker_sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "worker SHA-256 {:?} must be 64 hex digits",
            u.worker_sha256
        ));
    }
    let mut labels = String::new();
    for (k, v) in u.labels {
        let l = format!("{k}={v}");
        safe("label", &l)?;
        labels.push_str(" --label ");
        labels.push_str(&l);
    }
    let script = base64::engine::general_purpose::STANDARD.encode(INSTALL_SCRIPT);
    Ok(TEMPLATE
        .replace("{{machine}}", u.machine)
        .replace("{{install_script_b64}}", &script)
        .replace("{{token}}", u.token)
        .replace("{{brain_url}}", u.brain_url)
        .replace("{{ca_hash}}", u.ca_hash)
        .replace("{{name}}", u.name)
        .replace("{{labels}}", &labels)
        .replace("{{worker_url}}", u.worker_url)
        .replace("{{worker_sha256}}", u.worker_sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(labels: &'a std::collections::BTreeMap<String, String>) -> UserData<'a> {
        UserData {
            machine: "m-0123456789ab",
            brain_url: "https://brain.example:7443",
            ca_hash: "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
            token: "tj_feedfacefeedfacefeedfacefeedfacefeedfacefeedface",
            name: "m-0123456789ab",
            labels,
            worker_url: "https://downloads.example/tether/worker-x86_64",
            worker_sha256: "aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55",
        }
    }

    /// The rendered document, byte for byte, with the embedded script cut out (it has its own
    /// tests and changes on its own). `TETHER_UPDATE_SNAPSHOTS=1` rewrites the snapshot.
    #[test]
    fn user_data_matches_its_snapshot() {
        let labels = [("size".to_string(), "large".to_string())].into();
        let text = render(&sample(&labels)).unwrap();
        let script = base64::engine::general_purpose::STANDARD.encode(INSTALL_SCRIPT);
        assert!(
            text.contains(&script),
            "the install script is embedded whole"
        );
        let shown = text.replace(&script, "<install-worker.sh, base64>");
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/provision/testdata/cloud-init.snap"
        );
        if std::env::var_os("TETHER_UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(path, &shown).unwrap();
        }
        let want = std::fs::read_to_string(path).expect("snapshot file");
        assert_eq!(
            shown, want,
            "the rendered user data changed; check it and update the snapshot"
        );
        assert!(!shown.contains("{{"), "a placeholder was left");
        // It is YAML that cloud-init can read, starting with its marker.
        assert!(shown.starts_with("#cloud-config\n"));
    }

    #[test]
    fn unsafe_values_are_refused() {
        let labels = Default::default();
        for (field, bad) in [
            ("token", "tj_x; rm -rf /"),
            ("url", "https://x/$(id)"),
            ("name", "a b"),
            ("brain", "https://brain:7443\n- evil"),
        ] {
            let mut u = sample(&labels);
            match field {
                "token" => u.token = bad,
                "url" => u.worker_url = bad,
                "name" => u.name = bad,
                _ => u.brain_url = bad,
            }
            assert!(render(&u).is_err(), "{field} {bad:?} was accepted");
        }
        let bad_labels = [("k".to_string(), "v w".to_string())].into();
        assert!(render(&sample(&bad_labels)).is_err());
        let mut u = sample(&labels);
        u.worker_sha256 = "abc";
        assert!(render(&u).is_err());
    }
}
