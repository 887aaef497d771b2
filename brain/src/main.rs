//! The `brain` binary.

fn main() {
    std::process::exit(brain::cli::main_with(std::env::args_os()));
}
