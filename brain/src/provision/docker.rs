//! The `docker` provider: a worker container per machine, through the Docker Engine API
//! (`bollard`; the local socket, or `DOCKER_HOST=unix://…`).
//!
//! Each container runs the worker image's `worker join` as an unprivileged user, with CPU,
//! memory (no swap) and pids limits from the request, a read-only root filesystem, a volume
//! `tether-<machine>` for its state and workspaces and a tmpfs for `/tmp`, no host mounts, every
//! capability dropped, `no-new-privileges`, and the network the config names. Labels name this
//! brain, the machine and its task; `list` finds containers by them. The one-time join token is
//! uploaded into the volume before the container starts, as a 0600 file the worker deletes
//! when it reads it: it is in no image, environment, command line or log.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptions,
    StartContainerOptions, UploadToContainerOptionsBuilder,
};
use serde::Deserialize;

use super::error::ProviderError;
use super::provider::{Created, Join, Provisioner, Seen, no_params};
use super::records::{Machine, Spec};

/// `[provision.docker]` in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DockerConfig {
    /// The worker image (`deploy/Dockerfile.worker`).
    pub image: String,
    /// The network containers join; they must reach the brain's URL from it.
    pub network: String,
    /// Limits when a request names none.
    pub cpu: u32,
    pub memory_gb: u32,
    pub pids_limit: i64,
    /// Size of the `/tmp` tmpfs, in MiB.
    pub tmp_mb: u32,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            image: "tether-worker".into(),
            network: "bridge".into(),
            cpu: 1,
            memory_gb: 1,
            pids_limit: 512,
            tmp_mb: 256,
        }
    }
}

/// The label keys on containers and volumes.
const BRAIN: &str = "tether.brain";
const MACHINE: &str = "tether.machine";
const TASK: &str = "tether.task";
/// The unprivileged user the worker runs as.
const USER: u64 = 65534;

/// Worker containers on the local Docker engine.
pub struct DockerProvider {
    cfg: DockerConfig,
    /// Names this brain on containers.
    tag: String,
}

fn name(id: &str) -> String {
    format!("tether-{id}")
}

fn err(doing: &str, e: bollard::errors::Error) -> ProviderError {
    ProviderError::new(format!("docker: {doing}: {e}"))
}

fn not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// A tar archive holding one file, owned by the worker's user, mode 0600.
fn one_file_tar(name: &str, data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(data.len() as u64);
    h.set_mode(0o600);
    h.set_uid(USER);
    h.set_gid(USER);
    h.set_mtime(0);
    b.append_data(&mut h, name, data)?;
    b.into_inner()
}

impl DockerProvider {
    pub fn new(cfg: &DockerConfig, tag: &str) -> Self {
        Self {
            cfg: cfg.clone(),
            tag: tag.to_string(),
        }
    }

    async fn docker(&self) -> Result<Docker, ProviderError> {
        let d = Docker::connect_with_local_defaults().map_err(|e| {
            ProviderError::untouched(format!(
                "cannot reach the Docker engine ({e}); is it running, and may this user use its socket?"
            ))
        })?;
        d.negotiate_version()
            .await
            .map_err(|e| ProviderError::untouched(format!("cannot talk to the Docker engine: {e}")))
    }

    fn labels(&self, m: &Machine) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (BRAIN.to_string(), self.tag.clone()),
            (MACHINE.to_string(), m.id.clone()),
        ]);
        if let Some(t) = &m.task {
            l.insert(TASK.to_string(), t.clone());
        }
        l
    }
}

#[async_trait::async_trait]
impl Provisioner for DockerProvider {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn remote(&self, _params: &serde_json::Value) -> bool {
        // Only the host's own network reaches the host's loopback.
        self.cfg.network != "host"
    }

    fn check(&self, params: &serde_json::Value, _spec: &Spec) -> Result<(), ProviderError> {
        no_params(
            "docker",
            params,
            "the image and network are in [provision.docker]",
        )
    }

    async fn create(&self, m: &Machine, join: &Join) -> Result<Created, ProviderError> {
        let d = self.docker().await?;
        if let Err(e) = d.inspect_image(&self.cfg.image).await {
            return Err(ProviderError::untouched(if not_found(&e) {
                format!(
                    "docker: no image {:?}: build it (deploy/Dockerfile.worker) or set provision.docker.image",
                    self.cfg.image
                )
            } else {
                format!("docker: inspecting image {:?}: {e}", self.cfg.image)
            }));
        }
        let labels = self.labels(m);
        d.create_volume(VolumeCreateRequest {
            name: Some(name(&m.id)),
            labels: Some(labels.clone()),
            ..Default::default()
        })
        .await
        .map_err(|e| err("creating the state volume", e))?;
        let cpu = if m.spec.cpu > 0 {
            m.spec.cpu
        } else {
            self.cfg.cpu
        };
        let gb = if m.spec.memory_gb > 0 {
            m.spec.memory_gb
        } else {
            self.cfg.memory_gb
        };
        let memory = i64::from(gb) << 30;
        let mut cmd = join.args();
        cmd.extend(
            [
                "--token-file",
                "/state/token",
                "--state",
                "/state/worker",
                "--remove-on-give-up",
                "/state/worker",
            ]
            .map(String::from),
        );
        let body = ContainerCreateBody {
            image: Some(self.cfg.image.clone()),
            entrypoint: Some(vec!["/usr/local/bin/worker".into()]),
            cmd: Some(cmd),
            user: Some(format!("{USER}:{USER}")),
            env: Some(vec!["HOME=/state".into()]),
            labels: Some(labels),
            host_config: Some(HostConfig {
                nano_cpus: Some(i64::from(cpu) * 1_000_000_000),
                memory: Some(memory),
                memory_swap: Some(memory),
                pids_limit: Some(self.cfg.pids_limit),
                readonly_rootfs: Some(true),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_string(),
                    format!("rw,nosuid,nodev,size={}m", self.cfg.tmp_mb),
                )])),
                mounts: Some(vec![Mount {
                    typ: Some(MountType::VOLUME),
                    source: Some(name(&m.id)),
                    target: Some("/state".into()),
                    read_only: Some(false),
                    ..Default::default()
                }]),
                network_mode: Some(self.cfg.network.clone()),
                init: Some(true),
                // A worker that gives up on its brain exits, and its container goes with it.
                auto_remove: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default()
            .name(&name(&m.id))
            .build();
        let id = d
            .create_container(Some(opts), body)
            .await
            .map_err(|e| err("creating the container", e))?
            .id;
        let tar = one_file_tar("token", format!("{}\n", join.token).as_bytes())
            .map_err(|e| ProviderError::new(format!("packing the join token: {e}")))?;
        let up = UploadToContainerOptionsBuilder::default()
            .path("/state")
            .build();
        d.upload_to_container(&id, Some(up), bollard::body_full(tar.into()))
            .await
            .map_err(|e| err("handing the join token over", e))?;
        d.start_container(&id, None::<StartContainerOptions>)
            .await
            .map_err(|e| err("starting the container", e))?;
        let ip = d
            .inspect_container(&id, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.network_settings)
            .and_then(|n| n.networks)
            .and_then(|n| n.get(&self.cfg.network).and_then(|e| e.ip_address.clone()))
            .filter(|ip| !ip.is_empty());
        Ok(Created {
            handle: id.chars().take(12).collect(),
            address: ip.unwrap_or_else(|| name(&m.id)),
        })
    }

    async fn destroy(&self, m: &Machine) -> Result<(), ProviderError> {
        let d = self
            .docker()
            .await
            .map_err(|e| ProviderError::new(e.message))?;
        let rm = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match d.remove_container(&name(&m.id), Some(rm)).await {
            Ok(()) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(err("removing the container", e)),
        }
        match d
            .remove_volume(&name(&m.id), None::<RemoveVolumeOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(err("removing the state volume", e)),
        }
    }

    async fn list(&self, records: &[Machine]) -> Result<Vec<Seen>, ProviderError> {
        let d = self
            .docker()
            .await
            .map_err(|e| ProviderError::new(e.message))?;
        let filters = HashMap::from([("label".to_string(), vec![format!("{BRAIN}={}", self.tag)])]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let found = d
            .list_containers(Some(opts))
            .await
            .map_err(|e| err("listing containers", e))?;
        let mut seen: Vec<Seen> = found
            .into_iter()
            .filter_map(|c| {
                let machine = c.labels.as_ref()?.get(MACHINE)?.clone();
                Some(Seen {
                    machine,
                    handle: c.id.unwrap_or_default().chars().take(12).collect(),
                    failure: None,
                })
            })
            .collect();
        // A volume whose container is gone (it exited and was removed) and that no live
        // record names is an orphan to remove; one a record names goes with that record.
        let volumes = d
            .list_volumes(Some(
                ListVolumesOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| err("listing volumes", e))?;
        for v in volumes.volumes.unwrap_or_default() {
            if let Some(machine) = v.labels.get(MACHINE)
                && !seen.iter().any(|s| &s.machine == machine)
                && !records.iter().any(|r| &r.id == machine)
            {
                seen.push(Seen {
                    machine: machine.clone(),
                    handle: format!("volume {}", v.name),
                    failure: None,
                });
            }
        }
        Ok(seen)
    }
}
