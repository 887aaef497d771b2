//! The seccomp filter every confined command runs under, in the spirit of Docker's default
//! profile: a deny-list of the kernel interfaces a build or a test has no use for and an
//! escape would (other processes' memory, mounts, new namespaces, keyrings, BPF, perf, kernel
//! modules, kexec, reboot, swap, file handles, userfaultfd, io_uring). A refused call fails
//! with EPERM and the program goes on; `clone3`, whose flags live in memory a filter cannot
//! read, fails with ENOSYS so the C library falls back to `clone`, whose flags the filter
//! checks.
//!
//! The filter is installed as the last step before exec, after the namespaces, mounts,
//! Landlock and the change of user that need some of these calls: a spawner is confined the
//! same way, so the commands it starts inherit it.
//!
//! Programs for other ABIs of the same machine (i386 and x32 on x86-64) are not served: x32
//! calls fail with ENOSYS, and a call under another architecture ends the process.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::report::{Mechanism, Report};
use super::sys::{describe_errno, errno, errno_of, in_child};

/// Calls refused outright (EPERM).
const DENIED: &[(&str, i64)] = &[
    // Other processes' memory and registers.
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    // Mounts, old and new API.
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    // Namespaces: joining or making any (user namespaces open the rest of the kernel).
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    // Kernel keyrings.
    ("add_key", libc::SYS_add_key),
    ("keyctl", libc::SYS_keyctl),
    ("request_key", libc::SYS_request_key),
    // BPF programs and performance counters.
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    // The kernel itself.
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    // File handles walk around the paths Landlock and the mounts guard.
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    // A page-fault handler in user space: the classic way to win a kernel race.
    ("userfaultfd", libc::SYS_userfaultfd),
    // io_uring: a second system call interface the filter cannot see into, and a frequent
    // source of kernel bugs (Docker's profile refuses it too); libuv and others fall back.
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
];

/// `clone` flags that make a namespace: a `clone` with any of them is refused like `unshare`.
const CLONE_NEW: [u64; 7] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// x86-64's marker of an x32 system call number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Why a filter could not be built here.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no seccomp filter for the {0} architecture: {1}")]
    Arch(&'static str, String),
    #[error("cannot build the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
}

/// The compiled filters, in the order they are installed: the deny-list (EPERM), then the
/// ENOSYS one (`clone3`, and x32 calls on x86-64).
#[derive(Debug, Clone)]
pub(super) struct Filters {
    programs: [BpfProgram; 2],
}

impl Filters {
    /// Compiles the filters for this machine's architecture.
    pub(super) fn build() -> Result<Self, Error> {
        let arch = std::env::consts::ARCH;
        let target = TargetArch::try_from(arch).map_err(|e| Error::Arch(arch, e.to_string()))?;
        let mut denied: BTreeMap<i64, Vec<SeccompRule>> =
            DENIED.iter().map(|&(_, nr)| (nr, Vec::new())).collect();
        let clone_new = CLONE_NEW
            .iter()
            .map(|&flag| {
                SeccompRule::new(vec![SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(flag),
                    flag,
                )?])
            })
            .collect::<Result<Vec<_>, _>>()?;
        denied.insert(libc::SYS_clone, clone_new);
        let deny: BpfProgram = SeccompFilter::new(
            denied,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            target,
        )?
        .try_into()?;
        let mut nosys: BpfProgram = SeccompFilter::new(
            [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            target,
        )?
        .try_into()?;
        #[cfg(target_arch = "x86_64")]
        {
            // x32 numbers carry the same arch as x86-64 ones and would miss every rule: refuse
            // them all before the rules are read (relative jumps after this stay valid).
            const LD_W_ABS: u16 = 0x20;
            const JGE_K: u16 = 0x05 | 0x30;
            const RET_K: u16 = 0x06;
            let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
            let prefix = [
                ins(LD_W_ABS, 0, 0, 0),
                ins(JGE_K, 0, 1, X32_SYSCALL_BIT),
                ins(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
            ];
            nosys.splice(0..0, prefix);
        }
        Ok(Self {
            programs: [deny, nosys],
        })
    }

    /// Installs the filters on the calling thread (and so on what it executes). Safe between
    /// fork and exec: a prctl and two system calls on programs built beforehand, no
    /// allocation. `no_new_privs` must be set, or the caller must hold CAP_SYS_ADMIN.
    pub(super) fn install(&self) -> std::io::Result<()> {
        for p in &self.programs {
            seccompiler::apply_filter(p).map_err(|e| match e {
                seccompiler::Error::Prctl(e) | seccompiler::Error::Seccomp(e) => e,
                _ => std::io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        }
        Ok(())
    }
}

/// Builds the filters and proves them in a forked child: installed there, a keyring call
/// must fail with EPERM. Reports the `seccomp` mechanism either way.
pub(super) fn probe(report: &mut Report) -> Option<Filters> {
    let (filters, detail) = match Filters::build() {
        Err(e) => (None, e.to_string()),
        Ok(f) => {
            let proved = in_child(&|| {
                // The filter is installed in this forked child only.
                rustix::thread::set_no_new_privs(true).map_err(errno_of)?;
                f.install()
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                // KEYCTL_GET_KEYRING_ID of the session keyring, without creating it (a raw
                // system call: rustix has no keyctl).
                // SAFETY: a system call with plain integer arguments.
                let r = unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 0) };
                if r >= 0 {
                    return Err(libc::EEXIST);
                }
                match errno() {
                    libc::EPERM => Ok(()),
                    e => Err(e),
                }
            });
            match proved {
                Ok(()) => (
                    Some(f),
                    format!(
                        "a deny-list filter (Docker's default profile in spirit) refuses with EPERM: {}, and clone with namespace flags; clone3 gets ENOSYS",
                        DENIED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                    ),
                ),
                Err(libc::EEXIST) => (
                    None,
                    "a filter installed in a test child did not refuse keyctl: seccomp filters do not work here".into(),
                ),
                Err(e) => (
                    None,
                    format!(
                        "the kernel refused to install a filter in a test child: {} (needs CONFIG_SECCOMP_FILTER)",
                        describe_errno(e)
                    ),
                ),
            }
        }
    };
    report.mechanisms.push(Mechanism {
        name: "seccomp",
        active: filters.is_some(),
        detail,
    });
    filters
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The filters refuse what they list and let the rest through, in a forked child.
    #[test]
    fn the_filter_refuses_its_calls_and_allows_the_rest() {
        let f = Filters::build().unwrap();
        let verdict = in_child(&|| {
            if rustix::thread::set_no_new_privs(true).is_err() {
                return Err(100);
            }
            if f.install().is_err() {
                return Err(101);
            }
            // The calls the filter judges stay on libc: each is checked by its raw return
            // value and errno, as the filter answers them (rustix's getpid, for one, cannot
            // report an error).
            // SAFETY: the filter is installed in this forked child only; each call below
            // takes plain integer arguments or none, and the grandchild only `_exit`s.
            unsafe {
                let refused = |r: libc::c_long, want: i32, code: i32| {
                    if r == -1 && errno() == want {
                        Ok(())
                    } else {
                        Err(code)
                    }
                };
                refused(libc::unshare(libc::CLONE_NEWUSER) as _, libc::EPERM, 10)?;
                refused(libc::syscall(libc::SYS_keyctl, 0, -3, 0), libc::EPERM, 11)?;
                refused(libc::syscall(libc::SYS_ptrace, 0, 0, 0, 0), libc::EPERM, 12)?;
                refused(
                    libc::syscall(
                        libc::SYS_clone,
                        libc::CLONE_NEWNS | libc::SIGCHLD,
                        0,
                        0,
                        0,
                        0,
                    ),
                    libc::EPERM,
                    13,
                )?;
                refused(libc::syscall(libc::SYS_clone3, 0, 0), libc::ENOSYS, 14)?;
                #[cfg(target_arch = "x86_64")]
                refused(
                    libc::syscall(X32_SYSCALL_BIT as libc::c_long | libc::SYS_getpid),
                    libc::ENOSYS,
                    15,
                )?;
                // Allowed: an ordinary call, and a clone without namespace flags.
                if libc::getpid() <= 0 {
                    return Err(20);
                }
                let pid = libc::fork();
                if pid == 0 {
                    libc::_exit(0);
                }
                if pid < 0 || libc::waitpid(pid, std::ptr::null_mut(), 0) != pid {
                    return Err(21);
                }
            }
            Ok(())
        });
        assert_eq!(verdict, Ok(()), "see the codes in the child above");
    }

    #[test]
    fn doctor_names_the_mechanism() {
        let mut r = Report::default();
        let f = probe(&mut r);
        let m = &r.mechanisms[0];
        assert_eq!(m.name, "seccomp");
        assert_eq!(m.active, f.is_some(), "{}", m.detail);
        if m.active {
            assert!(
                m.detail.contains("EPERM") && m.detail.contains("keyctl"),
                "{}",
                m.detail
            );
        }
    }
}
