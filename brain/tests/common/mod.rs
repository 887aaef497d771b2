//! Docker helpers shared by the container tests: images built from `deploy/Dockerfile.*` on a
//! base made FROM scratch (no registry is needed), and the docker CLI.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::text;

pub fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("run docker")
}

pub fn out(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn rand_tag() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{}-{:x}", std::process::id(), t & 0xffffff)
}

/// Why the engine cannot be used here, if it cannot.
pub fn unusable() -> Option<String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Err(e) => return Some(format!("no docker CLI: {e}")),
        Ok(o) if !o.status.success() => {
            return Some(format!(
                "the Docker engine does not answer: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(_) => {}
    }
    if !Path::new("/bin/busybox").exists() {
        return Some(
            "no static busybox for the scratch base (apt-get install busybox-static)".into(),
        );
    }
    None
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Builds `deploy/Dockerfile.<which>` (brain, worker or postgres) as `tag`, on a scratch base
/// `base` made from `bins` (binaries, whose libraries go in, or directories copied whole); the
/// one of `bins` named `which`, if any, is this build's binary the Dockerfile copies.
pub fn build(which: &str, base: &str, tag: &str, bins: &[&Path]) -> Result<(), String> {
    let ctx = std::env::temp_dir().join(format!("tether-docker-ctx-{}", rand_tag()));
    let result = (|| {
        std::fs::create_dir_all(ctx.join("target/release")).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(ctx.join("deploy/docker")).map_err(|e| e.to_string())?;
        if let Some(bin) = bins
            .iter()
            .find(|b| b.file_name().is_some_and(|n| n == which))
        {
            std::fs::copy(bin, ctx.join("target/release").join(which))
                .map_err(|e| e.to_string())?;
        }
        for f in [
            format!("Dockerfile.{which}"),
            format!("docker/{which}-entrypoint.sh"),
        ] {
            std::fs::copy(repo().join("deploy").join(&f), ctx.join("deploy").join(&f))
                .map_err(|e| e.to_string())?;
        }
        if Command::new("docker")
            .args(["image", "inspect", base])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            let made = Command::new("sh")
                .arg(repo().join("deploy/docker/scratch-base.sh"))
                .arg(base)
                .args(bins)
                .output()
                .map_err(|e| e.to_string())?;
            if !made.status.success() {
                return Err(format!("building the scratch base failed: {}", text(&made)));
            }
        }
        let built = Command::new("docker")
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "-q", "-f"])
            .arg(ctx.join(format!("deploy/Dockerfile.{which}")))
            .args(["--build-arg", &format!("BASE={base}"), "-t", tag])
            .arg(&ctx)
            .output()
            .map_err(|e| e.to_string())?;
        if !built.status.success() {
            return Err(format!("docker build: {}", text(&built)));
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&ctx);
    result
}
