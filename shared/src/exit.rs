//! Exit statuses of the `brain`, `worker` and `tether` programs, in one place, and how an
//! error that reached the top of a program picks one.
//!
//! Each library error type that knows some of its variants call for a particular status
//! implements [`Classify`]; a program lists the types it may see ([`by`]) and [`classify`]
//! walks the error's chain. The systemd units in deploy/ rely on [`ExitCode::Config`]:
//! `RestartPreventExitStatus=78` stops a restart loop on a configuration problem.

/// An exit status with a meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    Success,
    /// Anything else that went wrong.
    Failure,
    /// Bad flags or arguments.
    Usage,
    /// sysexits.h `EX_UNAVAILABLE`: a worker gave up on a brain that stayed unreachable for
    /// as long as it was told to wait (a provisioned machine then releases itself; its unit
    /// does not restart it).
    GaveUp,
    /// sysexits.h `EX_TEMPFAIL`: the worker was lost or is not connected; trying later may
    /// work.
    WorkerLost,
    /// sysexits.h `EX_CONFIG`: a configuration problem that running again will not fix.
    Config,
    /// The command ran out of time and was killed (as `timeout(1)`).
    TimedOut,
    /// Tether itself could not run the command (bad request, refused path, brain
    /// unreachable), as `env(1)` and `timeout(1)` use 125.
    Tether,
    /// The command was found but is not executable.
    NotExecutable,
    /// The command was not found.
    NotFound,
}

impl ExitCode {
    /// The number the process exits with.
    pub const fn code(self) -> i32 {
        match self {
            ExitCode::Success => 0,
            ExitCode::Failure => 1,
            ExitCode::Usage => 2,
            ExitCode::GaveUp => 69,
            ExitCode::WorkerLost => 75,
            ExitCode::Config => 78,
            ExitCode::TimedOut => 124,
            ExitCode::Tether => 125,
            ExitCode::NotExecutable => 126,
            ExitCode::NotFound => 127,
        }
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(c: ExitCode) -> Self {
        std::process::ExitCode::from(c.code() as u8)
    }
}

/// What exit status an error calls for, when it knows. `None`: it has no say (the next error
/// in the chain may).
pub trait Classify {
    fn exit_code(&self) -> Option<ExitCode>;
}

/// Recognises one error type in a chain.
pub type Classifier = fn(&(dyn std::error::Error + 'static)) -> Option<ExitCode>;

/// The classifier for the error type `T`.
pub fn by<T: Classify + std::error::Error + 'static>(
    e: &(dyn std::error::Error + 'static),
) -> Option<ExitCode> {
    e.downcast_ref::<T>().and_then(T::exit_code)
}

/// The exit status for an error that reached the top of a program: the first error in its
/// chain that one of `known` has a say about decides; otherwise [`ExitCode::Failure`]. List
/// every library error type the program may see, `shared`'s (`pki::Error`, `tls::Error`)
/// among them.
pub fn classify(e: &anyhow::Error, known: &[Classifier]) -> ExitCode {
    e.chain()
        .find_map(|c| known.iter().find_map(|k| k(c)))
        .unwrap_or(ExitCode::Failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] crate::pki::Error);

    #[test]
    fn the_chain_decides_and_unknown_errors_are_failures() {
        let read = crate::pki::Error::Read {
            path: "/x".into(),
            source: std::io::Error::other("gone"),
        };
        let known: [Classifier; 1] = [by::<crate::pki::Error>];
        let e = anyhow::Error::new(Outer(read)).context("starting");
        assert_eq!(classify(&e, &known), ExitCode::Config);
        assert_eq!(classify(&e, &[]), ExitCode::Failure);
        let e = anyhow::anyhow!("something else");
        assert_eq!(classify(&e, &known), ExitCode::Failure);
        assert_eq!(ExitCode::Config.code(), 78);
        assert_eq!(ExitCode::TimedOut.code(), 124);
    }
}
