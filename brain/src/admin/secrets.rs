//! `brain secret set|list|rm`: the secrets tasks' commands may use through the egress proxy.
//! A value is read from standard input (without echo on a terminal) or a file, never from
//! the command line, where other users and shell histories could see it.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};

use super::args::SecretCmd;
use super::client::Target;

/// Largest value read (the brain refuses more).
const MAX_VALUE: usize = 16 * 1024;

/// Reads a secret's value from `file` or standard input; one trailing newline is dropped.
fn read_value(name: &str, file: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    let mut v = match file {
        Some(f) => {
            let meta = std::fs::metadata(f).with_context(|| format!("reading {}", f.display()))?;
            if meta.len() > MAX_VALUE as u64 + 2 {
                bail!(
                    "{} is {} bytes; a secret is at most {MAX_VALUE}",
                    f.display(),
                    meta.len()
                );
            }
            std::fs::read(f).with_context(|| format!("reading {}", f.display()))?
        }
        None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => prompt(name)?,
        None => {
            let mut v = Vec::new();
            std::io::stdin()
                .take(MAX_VALUE as u64 + 3)
                .read_to_end(&mut v)
                .context("reading the value from standard input")?;
            v
        }
    };
    if v.ends_with(b"\n") {
        v.pop();
        if v.ends_with(b"\r") {
            v.pop();
        }
    }
    if v.is_empty() {
        bail!(
            "the value is empty: pipe it in (`printf %s \"$TOKEN\" | brain secret set {name} ...`) or pass --file"
        );
    }
    Ok(v)
}

/// Asks for the value on the terminal with echo off.
fn prompt(name: &str) -> anyhow::Result<Vec<u8>> {
    eprint!("value of secret {name} (not shown; Enter ends it): ");
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let stdin = std::io::stdin();
    let old =
        tcgetattr(&stdin).map_err(|_| anyhow::anyhow!("cannot read the terminal's settings"))?;
    let mut quiet = old.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    let _ = tcsetattr(&stdin, OptionalActions::Now, &quiet);
    let mut line = String::new();
    let r = stdin.read_line(&mut line);
    let _ = tcsetattr(&stdin, OptionalActions::Now, &old);
    eprintln!();
    r.context("reading the value")?;
    Ok(line.into_bytes())
}

pub async fn run(target: &Target, cmd: SecretCmd) -> anyhow::Result<i32> {
    match cmd {
        SecretCmd::Set {
            name,
            hosts,
            port,
            inject,
            env,
            file,
            provider,
        } => {
            if !provider && hosts.is_empty() {
                bail!(
                    "say where {name} may be sent: --host HOST (repeatable; *.suffix matches names under it)"
                );
            }
            let value = read_value(&name, file.as_deref())?;
            let req = proto::SetSecretRequest {
                name: name.clone(),
                value,
                hosts: hosts.clone(),
                port: u32::from(port),
                inject: inject.clone(),
                env: env.clone().unwrap_or_default(),
                provider,
            };
            let r = target.rpc(async |mut c| c.set_secret(req).await).await?;
            let verb = if r.replaced { "replaced" } else { "stored" };
            if provider {
                out!("{verb} secret {name} (provider tier: the brain's own, never a command's)");
            } else {
                out!(
                    "{verb} secret {name}: sent only to {} on port {port} as {inject}; a task run with --secret {name} finds its placeholder in ${}",
                    hosts.join(", "),
                    env.unwrap_or_else(|| name.to_ascii_uppercase().replace('-', "_"))
                );
            }
            Ok(0)
        }
        SecretCmd::List { json } => {
            let req = proto::ListSecretsRequest {};
            let list = target
                .rpc(async |mut c| c.list_secrets(req).await)
                .await?
                .secrets;
            if json {
                out!(
                    "{}",
                    serde_json::to_string(&list).expect("secrets serialise")
                );
                return Ok(0);
            }
            if list.is_empty() {
                out!("no secrets (`brain secret set NAME --host HOST < file` stores one)");
                return Ok(0);
            }
            out!(
                "{:<20} {:<9} {:<18} {:<6} {:<32} HOSTS",
                "NAME",
                "TIER",
                "INJECT",
                "PORT",
                "ENV"
            );
            for s in list {
                out!(
                    "{:<20} {:<9} {:<18} {:<6} {:<32} {}",
                    s.name,
                    s.tier,
                    s.inject,
                    s.port,
                    s.env,
                    s.hosts.join(",")
                );
            }
            Ok(0)
        }
        SecretCmd::Rm { name } => {
            let req = proto::RemoveSecretRequest { name: name.clone() };
            let r = target.rpc(async |mut c| c.remove_secret(req).await).await?;
            if !r.removed {
                bail!("no secret named {name} (see `brain secret list`)");
            }
            out!("removed secret {name}; tasks that named it can no longer use it");
            Ok(0)
        }
    }
}
