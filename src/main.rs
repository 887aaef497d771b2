//! `tether`: one binary for trying Tether out. `tether demo` runs a brain and two local
//! workers; `tether brain ...` and `tether worker ...` are the two programs themselves.

use std::ffi::OsString;

const USAGE: &str = "tether — a coding-agent runtime split into a brain and workers

Usage:
  tether demo [--keep] [--model M]
                           a temporary brain and two local workers, end to end; the agent
                           replays a recorded transcript unless --model names a real one
                           (e.g. anthropic:claude-sonnet-4-5, key in ANTHROPIC_API_KEY)
  tether brain ARGS...     the brain (same as the `brain` binary; try `tether brain --help`)
  tether worker ARGS...    a worker (same as the `worker` binary)
  tether --version         the version
";

fn main() {
    let args: Vec<OsString> = std::env::args_os().collect();
    let sub = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let code = match sub {
        "demo" => {
            let rest: Vec<&str> = args.iter().skip(2).filter_map(|a| a.to_str()).collect();
            let keep = rest.contains(&"--keep");
            let model = rest
                .iter()
                .position(|a| *a == "--model")
                .and_then(|i| rest.get(i + 1))
                .map(|m| m.to_string());
            if rest.contains(&"--model") && model.is_none() {
                eprintln!("error: --model needs a value, e.g. --model anthropic:claude-sonnet-4-5");
                std::process::exit(2);
            }
            brain::admin::cli::run_demo(keep, model)
        }
        "brain" => brain::admin::cli::main_with(args[1..].iter().cloned()),
        "worker" => match worker::cli::main_with(args[1..].iter().cloned()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("Error: {e:#}");
                worker::exit_code(&e).code()
            }
        },
        "-V" | "--version" | "version" => {
            shared::outln!("tether {}", env!("CARGO_PKG_VERSION"));
            0
        }
        "-h" | "--help" | "help" => {
            shared::outp!("{USAGE}");
            0
        }
        _ => {
            eprint!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}
