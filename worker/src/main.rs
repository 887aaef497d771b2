//! The `worker` binary.

fn main() -> anyhow::Result<()> {
    worker::cli::main_with(std::env::args_os())
}
