//! Progress of a long wait (provisioning, a join, a move, a delivery) on a terminal: one line
//! on stderr, redrawn in place with what is being waited for and for how long, wiped when
//! the wait ends. Nothing at all when stderr is not a terminal or the answer is `--json`,
//! so programs and logs see only the answer.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shared::locks::Lock;

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(200);
const SPINNER: [char; 4] = ['|', '/', '-', '\\'];

/// A progress line; dropping it (or `done`) wipes it.
pub struct Progress {
    what: Arc<Mutex<String>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// Starts showing `what` unless `quiet` (`--json`) or stderr is not a terminal.
    pub fn start(what: impl Into<String>, quiet: bool) -> Self {
        let what = Arc::new(Mutex::new(what.into()));
        if quiet || !std::io::stderr().is_terminal() {
            return Self {
                what,
                stop: None,
                ticker: None,
            };
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let shown = what.clone();
        let ticker = tokio::spawn(async move {
            let started = Instant::now();
            let mut i = 0usize;
            loop {
                let line = line(
                    &shown.locked(),
                    SPINNER[i % SPINNER.len()],
                    started.elapsed(),
                );
                {
                    let mut err = std::io::stderr().lock();
                    // A terminal that went away is not worth failing the command for.
                    let _ = write!(err, "\r\x1b[2K{}", shared::visible::visible(&line))
                        .and_then(|()| err.flush());
                }
                i += 1;
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep(TICK) => {}
                }
            }
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K").and_then(|()| err.flush());
        });
        Self {
            what,
            stop: Some(stop),
            ticker: Some(ticker),
        }
    }

    /// Whether the line is on a terminal (not quiet, not a pipe).
    pub fn shown(&self) -> bool {
        self.ticker.is_some()
    }

    /// Changes what the line says is being waited for.
    pub fn set(&self, what: impl Into<String>) {
        *self.what.locked() = what.into();
    }

    /// Wipes the line and waits until it is wiped, so what is printed next starts clean.
    pub async fn done(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.ticker.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The line for `what` after `elapsed`: `| provisioning a docker machine… 12s`.
fn line(what: &str, spin: char, elapsed: Duration) -> String {
    format!("{spin} {what}… {}s", elapsed.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_what_and_how_long() {
        assert_eq!(
            line(
                "waiting for m-3 to join",
                '/',
                Duration::from_millis(12_400)
            ),
            "/ waiting for m-3 to join… 12s"
        );
    }

    #[tokio::test]
    async fn quiet_or_not_a_terminal_starts_nothing() {
        let p = Progress::start("x", true);
        assert!(p.ticker.is_none());
        p.set("y");
        assert_eq!(*p.what.locked(), "y");
        p.done().await;
    }
}
