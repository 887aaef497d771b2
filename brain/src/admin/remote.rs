//! Admin commands that act on a worker through the brain: `exec` (streamed, with the
//! command's exit status), `file` operations, and `provision`.

use std::io::Write;

use anyhow::{Context, bail};
use proto::{FileCall, exec_event, file_call, file_response};
use shared::exit::ExitCode;

use super::args::{ExecArgs, FileCmd, ProvisionCmd};
use super::client::{Target, status};
use super::progress::Progress;

/// Exit statuses of `brain exec` beside the command's own.
const EXIT_TIMEOUT: i32 = ExitCode::TimedOut.code();
const EXIT_TETHER_ERROR: i32 = ExitCode::Tether.code();
const EXIT_WORKER_LOST: i32 = ExitCode::WorkerLost.code();

pub async fn exec(target: &Target, args: ExecArgs) -> i32 {
    let fail = |code: i32, msg: String| {
        err!("brain exec: {msg}");
        code
    };
    let mut c = match target.connect().await {
        Ok(c) => c,
        Err(e) => return fail(EXIT_TETHER_ERROR, e.to_string()),
    };
    let req = proto::AdminExecRequest {
        worker: args.worker.clone(),
        workspace: args.workspace,
        argv: args.argv,
        cwd: args.cwd,
        timeout_ms: args.timeout.as_millis() as u64,
        output_cap_bytes: args.output_cap,
        limits: Some(args.limits.to_proto(args.network_off)),
    };
    let mut stream = match c.exec(req).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
            return fail(EXIT_WORKER_LOST, s.message().to_string());
        }
        Err(s) => {
            return fail(
                EXIT_TETHER_ERROR,
                shared::tls::explain_status(&s, &target.url),
            );
        }
    };
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    loop {
        let ev = match stream.message().await {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                return fail(
                    EXIT_WORKER_LOST,
                    "the brain ended the stream before the command finished".into(),
                );
            }
            Err(s) => {
                return fail(
                    EXIT_WORKER_LOST,
                    format!("lost contact during the command: {}", s.message()),
                );
            }
        };
        match ev.event {
            Some(exec_event::Event::Output(o)) => {
                let res = if o.stream == proto::OutputStream::Stderr as i32 {
                    stderr.write_all(&o.data).and_then(|_| stderr.flush())
                } else {
                    stdout.write_all(&o.data).and_then(|_| stdout.flush())
                };
                if res.is_err() {
                    // Our output pipe closed (`| head`): quietly, as SIGPIPE would; dropping
                    // the stream cancels the command.
                    return shared::stdout::CLOSED_PIPE;
                }
            }
            Some(exec_event::Event::Exit(x)) => {
                if x.dropped_bytes > 0 {
                    err!(
                        "[tether: {} bytes of output dropped past the {}-byte cap]",
                        x.dropped_bytes,
                        args.output_cap
                    );
                }
                if x.worker_lost {
                    return fail(
                        EXIT_WORKER_LOST,
                        format!(
                            "worker {} was lost before the command finished",
                            args.worker
                        ),
                    );
                }
                if x.timed_out {
                    return fail(
                        EXIT_TIMEOUT,
                        format!(
                            "timed out after {}; the command's process group was killed",
                            humantime::format_duration(args.timeout)
                        ),
                    );
                }
                if !x.error.is_empty() {
                    err!("brain exec: {}", x.error);
                }
                if !x.limit.is_empty() {
                    err!("brain exec: {}", x.limit);
                }
                if let Some(code) = x.code {
                    return code;
                }
                if let Some(sig) = x.signal {
                    err!("brain exec: killed by signal {sig}");
                    return 128 + sig;
                }
                return EXIT_TETHER_ERROR;
            }
            None => {}
        }
    }
}

pub async fn file(target: &Target, cmd: FileCmd) -> anyhow::Result<i32> {
    let (worker, workspace, op) = match cmd {
        FileCmd::Read {
            worker,
            path,
            offset,
            length,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Read(proto::ReadFile {
                path,
                offset,
                length,
            }),
        ),
        FileCmd::Write {
            worker,
            path,
            from,
            mode,
            parents,
            workspace,
        } => {
            let data = match from {
                Some(p) => std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?,
                None => {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                        .context("reading stdin")?;
                    buf
                }
            };
            let mode = u32::from_str_radix(&mode, 8)
                .with_context(|| format!("invalid --mode {mode:?}: expected octal like 644"))?;
            (
                worker,
                workspace,
                file_call::Op::Write(proto::WriteFile {
                    path,
                    data,
                    mode,
                    create_dirs: parents,
                }),
            )
        }
        FileCmd::Ls {
            worker,
            path,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::List(proto::ListDir { path }),
        ),
        FileCmd::Stat {
            worker,
            path,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Stat(proto::StatPath { path }),
        ),
        FileCmd::Find {
            worker,
            glob,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Find(proto::FindFiles {
                glob,
                max_results: 0,
            }),
        ),
        FileCmd::Search {
            worker,
            pattern,
            glob,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Search(proto::SearchFiles {
                pattern,
                glob,
                max_matches: 0,
            }),
        ),
        FileCmd::Rm {
            worker,
            path,
            recursive,
            workspace,
        } => (
            worker,
            workspace,
            file_call::Op::Remove(proto::RemovePath { path, recursive }),
        ),
    };
    let resp = target
        .rpc(async |mut c| {
            c.file(proto::AdminFileRequest {
                worker,
                call: Some(FileCall {
                    call_id: 0,
                    workspace,
                    op: Some(op),
                }),
            })
            .await
        })
        .await?;
    match resp.result {
        Some(file_response::Result::Data(d)) => {
            shared::stdout::write_or_exit(&d.data);
        }
        Some(file_response::Result::Done(_)) => {}
        Some(file_response::Result::Listing(l)) => {
            for e in l.entries {
                out!("{}", format_stat(&e));
            }
        }
        Some(file_response::Result::Stat(s)) => out!("{}", format_stat(&s)),
        Some(file_response::Result::Paths(p)) => {
            for path in &p.paths {
                out!("{path}");
            }
            if p.truncated {
                err!("(more matched; only the first {} are shown)", p.paths.len());
            }
        }
        Some(file_response::Result::Matches(x)) => {
            for h in &x.matches {
                out!("{}:{}: {}", h.path, h.line, h.text);
            }
            if x.truncated {
                err!(
                    "(more matched; only the first {} are shown)",
                    x.matches.len()
                );
            }
        }
        Some(file_response::Result::Error(e)) => bail!("{}", e.message),
        None => bail!("the worker sent an empty answer"),
    }
    Ok(0)
}

fn format_stat(s: &proto::FileStat) -> String {
    let kind = match proto::FileKind::try_from(s.kind).unwrap_or(proto::FileKind::Unspecified) {
        proto::FileKind::Dir => 'd',
        proto::FileKind::Symlink => 'l',
        proto::FileKind::File => '-',
        _ => '?',
    };
    format!("{kind} {:04o} {:>10} {}", s.mode & 0o7777, s.size, s.path)
}

pub async fn provision(target: &Target, cmd: ProvisionCmd) -> anyhow::Result<i32> {
    let (provider, ssh, opts) = match cmd {
        ProvisionCmd::Local(opts) => ("local", None, opts),
        ProvisionCmd::Docker(opts) => ("docker", None, opts),
        ProvisionCmd::Ec2(opts) => ("ec2", None, opts),
        ProvisionCmd::K8s(opts) => ("k8s", None, opts),
        ProvisionCmd::Ssh {
            destination,
            port,
            identity,
            opts,
        } => (
            "ssh",
            Some(proto::SshTarget {
                destination,
                port: port.map(u32::from).unwrap_or(0),
                identity_file: identity.unwrap_or_default(),
            }),
            opts,
        ),
    };
    let mut c = target.connect().await?;
    let wait = opts.wait.as_secs().min(3600) as u32;
    let json = opts.json;
    let what = if wait > 0 {
        format!("provisioning a {provider} machine (waiting up to {wait}s for its worker to join)")
    } else {
        format!("provisioning a {provider} machine")
    };
    let progress = Progress::start(what.clone(), json);
    if !json && !progress.shown() {
        err!("{what}…");
    }
    // The machines there were before, so the new one can be told apart while it is made.
    let before: std::collections::HashSet<String> = if progress.shown() {
        c.list_machines(proto::ListMachinesRequest { all: true })
            .await
            .map(|r| r.into_inner().machines.into_iter().map(|m| m.id).collect())
            .unwrap_or_default()
    } else {
        Default::default()
    };
    let mut caller = c.clone();
    let call = caller.provision(proto::ProvisionRequest {
        provider: provider.into(),
        spec: Some(proto::MachineSpec {
            cpu: opts.cpu,
            memory_gb: opts.memory_gb,
            disk_gb: opts.disk_gb,
            gpu: opts.gpu,
        }),
        labels: opts.labels.into_iter().collect(),
        name: opts.name.unwrap_or_default(),
        ssh,
        wait_seconds: wait,
        brain_url: opts.brain_url.unwrap_or_default(),
    });
    tokio::pin!(call);
    let answer = loop {
        tokio::select! {
            r = &mut call => break r,
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)), if progress.shown() => {
                let Ok(list) = c.list_machines(proto::ListMachinesRequest { all: true }).await else {
                    continue;
                };
                if let Some(m) = list.into_inner().machines.into_iter().find(|m| !before.contains(&m.id) && m.provider == provider) {
                    progress.set(match m.state.as_str() {
                        "creating" => format!("{}: creating the {provider} machine", m.id),
                        "joining" => format!("{}: created at {}; waiting for its worker to join", m.id, m.address),
                        s => format!("{}: {s}", m.id),
                    });
                }
            }
        }
    };
    progress.done().await;
    let m = answer
        .map_err(|s| status(s, &target.url))?
        .into_inner()
        .machine
        .unwrap_or_default();
    if json {
        super::render::print_machines(std::slice::from_ref(&m), true);
        return Ok(
            if m.state == "ready" || (m.state == "joining" && wait == 0) {
                0
            } else {
                1
            },
        );
    }
    match m.state.as_str() {
        "ready" => {
            out!(
                "{} is ready: worker {} at {} ({})",
                m.id,
                m.worker_id,
                m.address,
                m.handle
            );
            Ok(0)
        }
        "joining" if wait == 0 => {
            out!(
                "{} created at {}; its worker is joining (see `brain machines`)",
                m.id,
                m.address
            );
            Ok(0)
        }
        state => {
            err!(
                "error: {} is {state}{}; see `brain machines --all`",
                m.id,
                if m.note.is_empty() {
                    String::new()
                } else {
                    format!(": {}", m.note)
                }
            );
            Ok(1)
        }
    }
}
