//! Resource limits set between fork and exec: CPU time (SIGXCPU a second before the hard
//! limit), address space, file size, processes.

#[derive(Clone, Copy)]
pub(super) struct Rlimits {
    pub(super) cpu: Option<u64>,
    pub(super) address_space: Option<u64>,
    pub(super) file_size: u64,
    pub(super) nproc: Option<u64>,
}

impl Rlimits {
    pub(super) fn apply(&self) -> std::io::Result<()> {
        use rustix::process::{Resource, Rlimit, setrlimit};
        let set = |res, v: u64| {
            setrlimit(
                res,
                Rlimit {
                    current: Some(v),
                    maximum: Some(v),
                },
            )
        };
        if let Some(v) = self.cpu {
            // The hard limit a second later: SIGXCPU ends the command at the soft one (at
            // equal limits the kernel sends SIGKILL, which says nothing).
            setrlimit(
                Resource::Cpu,
                Rlimit {
                    current: Some(v),
                    maximum: Some(v.saturating_add(1)),
                },
            )?;
        }
        if let Some(v) = self.address_space {
            set(Resource::As, v)?;
        }
        set(Resource::Fsize, self.file_size)?;
        if let Some(v) = self.nproc {
            set(Resource::Nproc, v)?;
        }
        Ok(())
    }
}
