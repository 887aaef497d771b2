//! The `ec2` provider: an EC2 instance per machine through the EC2 Query API (`aws.rs`:
//! RunInstances, DescribeInstances, TerminateInstances, SigV4-signed). The instance is tagged
//! with this brain and the machine (reconcile finds it by those tags) and launched with a
//! client token equal to the machine id, so a retried launch is the same launch. Its user data
//! is the cloud-init document that installs the worker and joins this brain
//! (`deploy/cloud-init.yaml.tmpl`, with `deploy/install-worker.sh` inside). Every value put
//! into it is checked to be shell-safe, so no quoting is needed and none can be broken. AWS
//! credentials stay in the brain.

use std::sync::Arc;

use serde::Deserialize;
use shared::locks::Lock;

use super::aws::{self, Ec2, Env};
use super::error::ProviderError;
use super::provider::{Created, Join, Provisioner, Seen, no_params};
use super::records::{Machine, Spec};

/// `[provision.ec2]` in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ec2Config {
    /// Default: AWS_REGION, AWS_DEFAULT_REGION or ~/.aws/config.
    pub region: Option<String>,
    /// Default: AWS_ENDPOINT_URL_EC2, AWS_ENDPOINT_URL or the region's endpoint in its
    /// partition (`ec2.REGION.amazonaws.com`, `….amazonaws.com.cn`).
    pub endpoint: Option<String>,
    /// The image instances boot (with cloud-init).
    pub ami: String,
    /// The instance type when `instance_types` is empty.
    pub instance_type: String,
    /// Types to choose from: the cheapest that fits a request (by `usd_per_hour`, else the
    /// smallest). Types named here or as `instance_type` that are not listed are known by
    /// their family's sizes (t3, t3a, m5, m6i, m7i, c5, c6i, c7i, r5, r6i, r7i).
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

/// Why no instance can be launched as asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the size of instance type {0} is not known: list it with its cpu and memory_gb in [[provision.ec2.instance_types]]"
    )]
    UnknownSize(String),
    #[error(
        "no configured instance type has {} CPUs, {} GB of memory{}: the brain may launch {}; add a bigger type to [[provision.ec2.instance_types]] or ask for less",
        .spec.cpu,
        .spec.memory_gb,
        and_gpus(.spec.gpu),
        describe(.have)
    )]
    NoFit { spec: Spec, have: Vec<InstanceType> },
    #[error("compressing the user data: {0}")]
    Compress(#[source] std::io::Error),
    #[error(
        "the user data is {0} bytes gzipped and EC2 takes at most {max}: shorten the labels or the worker URL",
        max = MAX_USER_DATA
    )]
    TooLarge(usize),
    #[error("{what} {value:?} cannot go into user data: use letters, digits and ._/:=@+%-,")]
    Unsafe { what: &'static str, value: String },
    #[error("worker URL {0:?} must be http(s)://")]
    WorkerUrl(String),
    #[error("worker SHA-256 {0:?} must be 64 hex digits")]
    WorkerSha256(String),
}

/// " and N GPUs" when GPUs are asked for.
fn and_gpus(n: u32) -> String {
    if n > 0 {
        format!(" and {n} GPUs")
    } else {
        String::new()
    }
}

/// The types, as a person reads them: `t3.small (2 CPUs, 2 GB)`, ….
fn describe(types: &[InstanceType]) -> String {
    types
        .iter()
        .map(|t| {
            let gpus = if t.gpu > 0 {
                format!(", {} GPUs", t.gpu)
            } else {
                String::new()
            };
            format!("{} ({} CPUs, {} GB{gpus})", t.name, t.cpu, t.memory_gb)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// An instance type and what it offers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceType {
    pub name: String,
    pub cpu: u32,
    pub memory_gb: u32,
    #[serde(default)]
    pub gpu: u32,
    /// Its hourly price where it is launched, for choosing the cheapest that fits.
    #[serde(default)]
    pub usd_per_hour: Option<f64>,
}

/// vCPUs and GiB of memory of the common general-purpose, compute and memory families, so
/// a type named without sizes can still be matched against a request.
fn known_size(name: &str) -> Option<(u32, u32)> {
    let (family, size) = name.split_once('.')?;
    if matches!(family, "t3" | "t3a") {
        return Some(match size {
            "nano" | "micro" | "small" | "medium" | "large" => (
                2,
                match size {
                    "nano" | "micro" => 1,
                    "small" => 2,
                    "medium" => 4,
                    _ => 8,
                },
            ),
            "xlarge" => (4, 16),
            "2xlarge" => (8, 32),
            _ => return None,
        });
    }
    let per_cpu = match family {
        "m5" | "m6i" | "m7i" => 4,
        "c5" | "c6i" | "c7i" => 2,
        "r5" | "r6i" | "r7i" => 8,
        _ => return None,
    };
    let cpu = match size {
        "large" => 2,
        "xlarge" => 4,
        s => s.strip_suffix("xlarge")?.parse::<u32>().ok()? * 4,
    };
    Some((cpu, cpu * per_cpu))
}

/// The tags on instances.
const BRAIN: &str = "tether.brain";
const MACHINE: &str = "tether.machine";
/// What EC2 accepts as user data: 16 KiB before base64.
pub const MAX_USER_DATA: usize = 16 * 1024;

/// EC2 instances.
pub struct Ec2Provider {
    cfg: Ec2Config,
    tag: String,
    env: Env,
    /// One client for the brain's life, so its credentials are cached and refreshed.
    client: std::sync::Mutex<Option<Arc<Ec2>>>,
}

impl Ec2Provider {
    pub fn new(cfg: &Ec2Config, tag: &str) -> Self {
        Self::with_env(cfg, tag, Env::default())
    }

    /// With an environment of its own (for tests).
    pub fn with_env(cfg: &Ec2Config, tag: &str, env: Env) -> Self {
        Self {
            cfg: cfg.clone(),
            tag: tag.to_string(),
            env,
            client: std::sync::Mutex::new(None),
        }
    }

    fn client(&self) -> Result<Arc<Ec2>, ProviderError> {
        let mut c = self.client.locked();
        if let Some(c) = c.as_ref() {
            return Ok(c.clone());
        }
        let made = Arc::new(
            Ec2::new(
                self.cfg.endpoint.as_deref(),
                self.cfg.region.as_deref(),
                self.env.clone(),
            )
            .map_err(|e| ProviderError::untouched(e.to_string()))?,
        );
        *c = Some(made.clone());
        Ok(made)
    }

    /// What may be launched: the configured types with their sizes.
    fn types(&self) -> Result<Vec<InstanceType>, Error> {
        let listed = if self.cfg.instance_types.is_empty() {
            let name = &self.cfg.instance_type;
            let (cpu, memory_gb) =
                known_size(name).ok_or_else(|| Error::UnknownSize(name.clone()))?;
            vec![InstanceType {
                name: name.clone(),
                cpu,
                memory_gb,
                gpu: 0,
                usd_per_hour: None,
            }]
        } else {
            self.cfg.instance_types.clone()
        };
        Ok(listed)
    }

    /// The cheapest configured type that fits (by price where every fitting type has one,
    /// else the smallest), or why none does.
    pub fn instance_type(&self, spec: &Spec) -> Result<InstanceType, Error> {
        let types = self.types()?;
        let mut fits: Vec<&InstanceType> = types
            .iter()
            .filter(|t| t.cpu >= spec.cpu && t.memory_gb >= spec.memory_gb && t.gpu >= spec.gpu)
            .collect();
        let priced = fits.iter().all(|t| t.usd_per_hour.is_some());
        fits.sort_by(|a, b| {
            let price = |t: &InstanceType| t.usd_per_hour.unwrap_or(0.0);
            (if priced {
                price(a).total_cmp(&price(b))
            } else {
                std::cmp::Ordering::Equal
            })
            .then((a.cpu, a.memory_gb, a.gpu).cmp(&(b.cpu, b.memory_gb, b.gpu)))
        });
        match fits.first() {
            Some(t) => Ok((*t).clone()),
            None => Err(Error::NoFit {
                spec: spec.clone(),
                have: types,
            }),
        }
    }

    /// This brain's live instances for machine `id`.
    async fn instances_of(&self, c: &Ec2, id: &str) -> Result<Vec<String>, ProviderError> {
        Ok(c.live_by_tag(MACHINE, id)
            .await
            .map_err(failed)?
            .into_iter()
            .filter(|i| i.tags.get(BRAIN) == Some(&self.tag))
            .map(|i| i.id)
            .collect())
    }
}

/// An EC2 error as a provider's: a call AWS refused (or never got) changed nothing.
fn failed(e: aws::Error) -> ProviderError {
    if e.refused() {
        ProviderError::untouched(e.to_string())
    } else {
        ProviderError::new(e.to_string())
    }
}

#[async_trait::async_trait]
impl Provisioner for Ec2Provider {
    fn name(&self) -> &'static str {
        "ec2"
    }

    fn remote(&self, _params: &serde_json::Value) -> bool {
        true
    }

    fn check(&self, params: &serde_json::Value, spec: &Spec) -> Result<(), ProviderError> {
        no_params("ec2", params, "they are in [provision.ec2]")?;
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
        self.instance_type(spec)
            .map(drop)
            .map_err(|e| ProviderError::new(e.to_string()))
    }

    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError> {
        let c = self.client()?;
        let itype = self
            .instance_type(&m.spec)
            .map_err(|e| ProviderError::untouched(e.to_string()))?;
        let user_data = render(&UserData {
            machine: &m.id,
            brain_url: &join.brain_url,
            ca_hash: &join.ca_hash,
            token: &join.token,
            name: &join.name,
            labels: &join.labels,
            worker_url: &self.cfg.worker_url,
            worker_sha256: &self.cfg.worker_sha256,
            exit_after_unreachable: join.exit_after_unreachable,
        })
        .and_then(|text| compress(&text))
        .map_err(|e| ProviderError::untouched(e.to_string()))?;
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
            .run_instance(&self.cfg.ami, &itype.name, &user_data, &tags, &m.id, &extra)
            .await
            .map_err(failed)?;
        Ok(Created {
            address: if i.private_ip.is_empty() {
                i.id.clone()
            } else {
                i.private_ip.clone()
            },
            handle: i.id,
        })
    }

    async fn joined(&self, m: &Machine) -> Result<(), ProviderError> {
        // The worker never asks the instance metadata service, and cloud-init, which read
        // the user data from it, is done: off, so a command on the machine can read neither
        // the instance's role credentials nor its user data there.
        let c = self.client()?;
        for id in self.instances_of(&c, &m.id).await? {
            c.disable_metadata(&id).await.map_err(|e| {
                ProviderError::new(format!(
                    "instance {id}'s metadata service stays on: {e} (the brain's IAM policy needs ec2:ModifyInstanceMetadataOptions)"
                ))
            })?;
        }
        Ok(())
    }

    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError> {
        let c = self.client()?;
        let ids = self.instances_of(&c, &m.id).await?;
        c.terminate(&ids).await.map_err(failed)
    }

    async fn list(&self, _records: &[Machine]) -> Result<Vec<Seen>, ProviderError> {
        let c = self.client()?;
        Ok(c.live_by_tag(BRAIN, &self.tag)
            .await
            .map_err(failed)?
            .into_iter()
            .filter_map(|i| {
                Some(Seen {
                    machine: i.tags.get(MACHINE)?.clone(),
                    handle: i.id,
                    failure: None,
                })
            })
            .collect())
    }
}

/// The user data as EC2 gets it: the cloud-config gzipped (cloud-init unpacks it), checked
/// against EC2's 16 KiB limit here rather than by a refused launch.
pub fn compress(text: &str) -> Result<Vec<u8>, Error> {
    use std::io::Write;
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(text.as_bytes())
        .and_then(|()| gz.finish())
        .map_err(Error::Compress)
        .and_then(|bytes| {
            if bytes.len() > MAX_USER_DATA {
                Err(Error::TooLarge(bytes.len()))
            } else {
                Ok(bytes)
            }
        })
}

const TEMPLATE: &str = include_str!("../../../deploy/cloud-init.yaml.tmpl");
const INSTALL_SCRIPT: &str = include_str!("../../../deploy/install-worker.sh");

/// The install script as a YAML literal block's lines (indented six spaces): plain text, so
/// the gzipped user data stays small, and readable once unpacked.
fn script_block() -> String {
    INSTALL_SCRIPT
        .lines()
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                format!("      {l}")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

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
    /// The worker powers the instance off once its brain has been unreachable this long.
    pub exit_after_unreachable: std::time::Duration,
}

/// Characters a value may have to go into the document unquoted.
fn safe(what: &'static str, v: &str) -> Result<(), Error> {
    let ok = !v.is_empty()
        && v.len() <= 2048
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:=@+%-,".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::Unsafe {
            what,
            value: v.to_string(),
        })
    }
}

/// Renders the cloud-init document.
pub fn render(u: &UserData<'_>) -> Result<String, Error> {
    safe("machine id", u.machine)?;
    safe("brain URL", u.brain_url)?;
    safe("CA hash", u.ca_hash)?;
    safe("join token", u.token)?;
    safe("worker name", u.name)?;
    safe("worker URL", u.worker_url)?;
    if !(u.worker_url.starts_with("https://") || u.worker_url.starts_with("http://")) {
        return Err(Error::WorkerUrl(u.worker_url.to_string()));
    }
    if u.worker_sha256.len() != 64 || !u.worker_sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Error::WorkerSha256(u.worker_sha256.to_string()));
    }
    let mut labels = String::new();
    for (k, v) in u.labels {
        let l = format!("{k}={v}");
        safe("label", &l)?;
        labels.push_str(" --label ");
        labels.push_str(&l);
    }
    let script = script_block();
    Ok(TEMPLATE
        .replace("{{machine}}", u.machine)
        .replace("{{install_script}}", &script)
        .replace("{{token}}", u.token)
        .replace("{{brain_url}}", u.brain_url)
        .replace("{{ca_hash}}", u.ca_hash)
        .replace("{{name}}", u.name)
        .replace("{{labels}}", &labels)
        .replace("{{worker_url}}", u.worker_url)
        .replace("{{worker_sha256}}", u.worker_sha256)
        .replace(
            "{{exit_after}}",
            &format!("{}s", u.exit_after_unreachable.as_secs().max(1)),
        ))
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
            exit_after_unreachable: std::time::Duration::from_secs(600),
        }
    }

    /// The rendered document, byte for byte, with the embedded script cut out (it has its own
    /// tests and changes on its own). `TETHER_UPDATE_SNAPSHOTS=1` rewrites the snapshot.
    #[test]
    fn user_data_matches_its_snapshot() {
        let labels = [("size".to_string(), "large".to_string())].into();
        let text = render(&sample(&labels)).unwrap();
        let script = script_block();
        assert!(
            text.contains(&script),
            "the install script is embedded whole"
        );
        let shown = text.replace(&script, "      <install-worker.sh>");
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

    fn provider(types: Vec<InstanceType>, default: &str) -> Ec2Provider {
        Ec2Provider::new(
            &Ec2Config {
                instance_type: default.into(),
                instance_types: types,
                ..Ec2Config::default()
            },
            "tag",
        )
    }

    fn t(name: &str, cpu: u32, memory_gb: u32, price: Option<f64>) -> InstanceType {
        InstanceType {
            name: name.into(),
            cpu,
            memory_gb,
            gpu: 0,
            usd_per_hour: price,
        }
    }

    fn spec(cpu: u32, memory_gb: u32) -> Spec {
        Spec {
            cpu,
            memory_gb,
            ..Spec::default()
        }
    }

    #[test]
    fn the_cheapest_type_that_fits_is_chosen_or_the_request_is_refused() {
        let p = provider(
            vec![
                t("c6i.2xlarge", 8, 16, Some(0.34)),
                t("m6i.2xlarge", 8, 32, Some(0.384)),
                t("t3.small", 2, 2, Some(0.0208)),
                t("m6i.large", 2, 8, Some(0.096)),
            ],
            "t3.small",
        );
        assert_eq!(p.instance_type(&spec(1, 1)).unwrap().name, "t3.small");
        assert_eq!(p.instance_type(&spec(2, 4)).unwrap().name, "m6i.large");
        assert_eq!(p.instance_type(&spec(4, 8)).unwrap().name, "c6i.2xlarge");
        assert_eq!(p.instance_type(&spec(8, 20)).unwrap().name, "m6i.2xlarge");
        let e = p.instance_type(&spec(64, 1)).unwrap_err().to_string();
        assert!(
            e.contains("64 CPUs") && e.contains("m6i.2xlarge (8 CPUs, 32 GB)"),
            "{e}"
        );
        let gpu = Spec {
            gpu: 1,
            ..Spec::default()
        };
        assert!(
            p.instance_type(&gpu)
                .unwrap_err()
                .to_string()
                .contains("1 GPUs")
        );
        // Without prices, the smallest that fits.
        let p = provider(
            vec![t("m6i.xlarge", 4, 16, None), t("c6i.xlarge", 4, 8, None)],
            "",
        );
        assert_eq!(p.instance_type(&spec(3, 4)).unwrap().name, "c6i.xlarge");
    }

    #[test]
    fn the_default_type_is_known_by_its_family_sizes() {
        let p = provider(vec![], "t3.small");
        assert_eq!(p.instance_type(&spec(2, 2)).unwrap().name, "t3.small");
        let e = p.instance_type(&spec(64, 0)).unwrap_err().to_string();
        assert!(e.contains("t3.small (2 CPUs, 2 GB)"), "{e}");
        assert_eq!(known_size("m7i.4xlarge"), Some((16, 64)));
        assert_eq!(known_size("c6i.large"), Some((2, 4)));
        assert_eq!(known_size("r6i.xlarge"), Some((4, 32)));
        assert_eq!(known_size("x2iedn.metal"), None);
        let unknown = provider(vec![], "p5.48xlarge");
        assert!(
            unknown
                .instance_type(&spec(1, 1))
                .unwrap_err()
                .to_string()
                .contains("list it with its cpu and memory_gb")
        );
    }

    #[test]
    fn user_data_goes_gzipped_well_under_the_limit_and_unpacks_to_the_document() {
        use std::io::Read;
        let labels = [("size".to_string(), "large".to_string())].into();
        let text = render(&sample(&labels)).unwrap();
        assert!(
            text.len() > MAX_USER_DATA,
            "the document alone ({} bytes) no longer needs compressing; drop this check",
            text.len()
        );
        let gz = compress(&text).unwrap();
        assert!(gz.len() <= MAX_USER_DATA / 2, "{} bytes gzipped", gz.len());
        assert_eq!(
            &gz[..2],
            &[0x1f, 0x8b],
            "gzip's magic: cloud-init unpacks it"
        );
        let mut back = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, text);
        assert_eq!(compress(&text).unwrap(), gz, "the same bytes every time");
        // What cannot fit is refused before any launch.
        let noise: String = (0..40_000)
            .map(|_| char::from(b'a' + rand::random_range(0..26u8)))
            .collect();
        let e = compress(&noise).unwrap_err().to_string();
        assert!(e.contains("EC2 takes at most 16384"), "{e}");
    }
}
