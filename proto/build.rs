//! Compiles the wire contract with protox (pure Rust), so building Tether never needs `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=build.rs");
    let files = ["proto/tether/v1/tether.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // Messages are JSON too: the HTTP API (`brain/src/web`) speaks them, and its OpenAPI
    // document carries their JSON Schemas. Absent fields take their proto defaults, as on the
    // wire.
    tonic_prost_build::configure()
        .message_attribute(
            ".tether.v1",
            "#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)] #[serde(default)]",
        )
        .enum_attribute(
            ".tether.v1",
            "#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]",
        )
        .compile_fds(fds)?;
    Ok(())
}
