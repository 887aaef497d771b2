//! Compiles the wire contract with protox (pure Rust), so building Tether never needs `protoc`.

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

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
    let mut config = tonic_prost_build::configure()
        .message_attribute(
            ".tether.v1",
            "#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)] #[serde(default)]",
        )
        .enum_attribute(
            ".tether.v1",
            "#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)]",
        );
    // Proto3's JSON mapping: 64-bit integers are strings (JavaScript's numbers are exact only
    // up to 2^53, so ids above it would be rounded).
    for path in wide_fields(&fds)? {
        config = config.field_attribute(
            path,
            r#"#[serde(with = "crate::json64")] #[schemars(with = "crate::json64::Int64")]"#,
        );
    }
    config.compile_fds(fds)?;
    Ok(())
}

/// The paths (`.tether.v1.Message.field`) of every 64-bit integer field.
fn wide_fields(fds: &FileDescriptorSet) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for file in &fds.file {
        for m in &file.message_type {
            walk(&format!(".{}", file.package()), m, &mut out)?;
        }
    }
    Ok(out)
}

fn walk(scope: &str, m: &DescriptorProto, out: &mut Vec<String>) -> Result<(), String> {
    let name = format!("{scope}.{}", m.name());
    let map_entry = m.options.as_ref().is_some_and(|o| o.map_entry());
    for f in &m.field {
        let wide = matches!(
            f.r#type(),
            Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64
        );
        if !wide {
            continue;
        }
        // Only plain fields are handled; another shape needs its own serde module, and a
        // silent number in the JSON would be the bug this avoids.
        if map_entry
            || f.label() == Label::Repeated
            || f.oneof_index.is_some()
            || f.proto3_optional()
        {
            return Err(format!(
                "{name}.{}: a repeated, optional, oneof or map 64-bit field has no JSON mapping here yet (add one in proto/src/lib.rs)",
                f.name()
            ));
        }
        out.push(format!("{name}.{}", f.name()));
    }
    for nested in &m.nested_type {
        walk(&name, nested, out)?;
    }
    Ok(())
}
