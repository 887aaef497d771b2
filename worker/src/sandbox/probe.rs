//! Probing what this host can confine with: each mechanism looked at (or tried in a forked
//! child) once, when the worker starts, into the [`Sandbox`] and its report.

use super::*;

impl Sandbox {
    pub(super) fn probe_as(
        state_dir: &Path,
        deny_read: &[PathBuf],
        task_uids: TaskUids,
        commit: bool,
    ) -> Self {
        let mut report = Report::default();
        let landlock = match landlock_abi() {
            Some(v) if v >= 3 => {
                report.mechanisms.push(Mechanism {
                    name: "landlock",
                    active: true,
                    detail: format!("ABI {v} (kernel {}): writes confined to the workspace and temp dir; state dir and home secrets unreadable", kernel()),
                });
                true
            }
            Some(v) => {
                report.mechanisms.push(Mechanism {
                    name: "landlock",
                    active: false,
                    detail: format!("kernel {} offers ABI {v}; ABI 3 (truncate control) is required, so none is enforced rather than less", kernel()),
                });
                false
            }
            None => {
                report.mechanisms.push(Mechanism {
                    name: "landlock",
                    active: false,
                    detail: format!(
                        "not available in kernel {} (needs 5.19+ with landlock in the lsm= list)",
                        kernel()
                    ),
                });
                false
            }
        };
        report.mechanisms.push(Mechanism {
            name: "rlimits",
            active: true,
            detail: "file size always; CPU time and address space when the policy sets them (address space also when there is no cgroup); processes when commands run as a dedicated user without a cgroup; no_new_privs; own session".into(),
        });
        let cgroup = probe_cgroup(&mut report, commit);
        // A worker that will run commands tidies what a killed predecessor left.
        if commit && let Some(cg) = &cgroup {
            let gone: usize = cg
                .bases()
                .into_iter()
                .map(|b| super::cgroup::sweep_stale(b))
                .sum();
            if gone > 0 {
                tracing::info!(
                    leaves = gone,
                    "removed cgroup leaves an earlier worker left behind"
                );
            }
        }
        let root = rustix::process::geteuid().is_root();
        let netns = if root {
            report.mechanisms.push(Mechanism {
                name: "netns",
                active: true,
                detail: "network off per policy: a fresh network namespace with no interfaces up"
                    .into(),
            });
            true
        } else {
            report.mechanisms.push(Mechanism {
                name: "netns",
                active: false,
                detail: "the worker is not root, so it cannot create network namespaces; network-off calls are refused".into(),
            });
            false
        };
        report.mechanisms.push(if netns {
            Mechanism {
                name: "egress",
                active: true,
                detail: "tasks with secrets or an allow-list reach the network only through the worker's egress proxy, placed in each command's own network namespace".into(),
            }
        } else {
            Mechanism {
                name: "egress",
                active: false,
                detail: "the proxy cannot be enforced without network namespaces; commands of tasks with secrets or an allow-list are refused here".into(),
            }
        });
        let mountns = probe_mountns(root, &mut report);
        let users = if root {
            report.mechanisms.push(Mechanism {
                name: "user",
                active: true,
                detail: format!("the worker runs as root; each task's commands run as a user of its own, a uid from {task_uids} (--task-uids) kept as its workspace's owner: tasks cannot signal, trace or read each other's processes and files"),
            });
            Some(task_uids)
        } else {
            report.mechanisms.push(Mechanism {
                name: "user",
                active: true,
                detail: "the worker is unprivileged; commands run as the worker's user".into(),
            });
            None
        };
        probe_proc(users.is_some(), &mut report);
        let seccomp = seccomp::probe(&mut report).map(std::sync::Arc::new);
        let mut denied: Vec<PathBuf> = vec![state_dir.to_path_buf()];
        if let Some(home) = std::env::var_os("HOME") {
            for s in HOME_SECRETS {
                denied.push(Path::new(&home).join(s));
            }
        }
        denied.extend(deny_read.iter().cloned());
        let denied = denied
            .into_iter()
            .map(|p| p.canonicalize().unwrap_or(p))
            .collect();
        Self {
            report,
            landlock,
            cgroup,
            netns,
            mountns,
            users,
            allocating: Default::default(),
            seccomp,
            denied,
            import_roots: Vec::new(),
            state_dir: state_dir.to_path_buf(),
            rules: Default::default(),
            pool: Default::default(),
            next_leaf: Default::default(),
            spawners: spawners_wanted().then(Default::default),
        }
    }
}
