//! The `brain` binary.

fn main() {
    std::process::exit(brain::admin::cli::main_with(std::env::args_os()));
}
