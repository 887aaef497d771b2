//! Compiles the wire contract with protox (pure Rust), so building Tether never needs `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/tether/v1/tether.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
