//! `tether`: one binary for trying Tether out. `tether demo` runs a brain and two local
//! workers; `tether brain ...` and `tether worker ...` are the two programs themselves.

use std::ffi::OsString;

const USAGE: &str = "tether — a coding-agent runtime split into a brain and workers

Usage:
  tether demo [--keep]     a temporary brain and two local workers, end to end
  tether brain ARGS...     the brain (same as the `brain` binary; try `tether brain --help`)
  tether worker ARGS...    a worker (same as the `worker` binary)
";

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let sub = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let code = match sub {
        "demo" => {
            let keep = args.iter().skip(2).any(|a| a == "--keep");
            brain::cli::run_demo(keep)
        }
        "brain" => brain::cli::main_with(args[1..].iter().cloned()),
        "worker" => match worker::cli::main_with(args[1..].iter().cloned()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        },
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            0
        }
        _ => {
            eprint!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}
