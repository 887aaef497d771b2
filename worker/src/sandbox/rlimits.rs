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
        let set = |res, v: u64| {
            let lim = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            // SAFETY: plain syscall with a valid struct.
            if unsafe { libc::setrlimit(res, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        if let Some(v) = self.cpu {
            // The hard limit a second later: SIGXCPU ends the command at the soft one (at
            // equal limits the kernel sends SIGKILL, which says nothing).
            let lim = libc::rlimit {
                rlim_cur: v,
                rlim_max: v.saturating_add(1),
            };
            // SAFETY: plain syscall with a valid struct.
            if unsafe { libc::setrlimit(libc::RLIMIT_CPU, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if let Some(v) = self.address_space {
            set(libc::RLIMIT_AS, v)?;
        }
        set(libc::RLIMIT_FSIZE, self.file_size)?;
        if let Some(v) = self.nproc {
            set(libc::RLIMIT_NPROC, v)?;
        }
        Ok(())
    }
}
