//! The chain against files, a credential process, and small servers on loopback that speak
//! the IMDSv2 and SSO portal protocols (STS's AssumeRole is tested against moto in
//! `brain/tests/provision_ec2.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

fn opts() -> Options {
    Options {
        region: "us-east-1".into(),
        sts_endpoint: None,
    }
}

/// A `HOME` with `.aws/credentials` and `.aws/config`.
fn home(credentials: &str, config: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join(".aws")).unwrap();
    std::fs::write(t.path().join(".aws/credentials"), credentials).unwrap();
    std::fs::write(t.path().join(".aws/config"), config).unwrap();
    t
}

fn chain(vars: &[(&str, &str)]) -> Chain {
    Chain::new(opts(), Env::of(vars)).unwrap()
}

#[tokio::test]
async fn the_environment_comes_first_then_the_named_profile() {
    let h = home(
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n[work]\naws_access_key_id = AKIDWORK\naws_secret_access_key = s2\naws_session_token = t2\n",
        "[default]\nregion = eu-west-1\n",
    );
    let home = h.path().to_str().unwrap();
    let c = chain(&[
        ("HOME", home),
        ("AWS_ACCESS_KEY_ID", "AKIDENV"),
        ("AWS_SECRET_ACCESS_KEY", "s0"),
    ])
    .get()
    .await
    .unwrap();
    assert_eq!(c.access_key_id, "AKIDENV");
    let c = chain(&[("HOME", home)]).get().await.unwrap();
    assert_eq!(c.access_key_id, "AKIDDEFAULT");
    let c = chain(&[("HOME", home), ("AWS_PROFILE", "work")])
        .get()
        .await
        .unwrap();
    assert_eq!(c.access_key_id, "AKIDWORK");
    assert_eq!(c.session_token.as_deref(), Some("t2"));
    // A profile asked for by name that is not there is an error, not a fall-through.
    let e = chain(&[("HOME", home), ("AWS_PROFILE", "nope")])
        .get()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("profile nope") && e.contains("no such profile"),
        "{e}"
    );
}

#[tokio::test]
async fn nothing_anywhere_says_what_was_tried_and_what_to_do() {
    let h = home("", "");
    let e = chain(&[
        ("HOME", h.path().to_str().unwrap()),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ])
    .get()
    .await
    .unwrap_err();
    let shown = e.to_string();
    assert!(matches!(e, Error::None { .. }), "{shown}");
    assert!(shown.contains("instance metadata turned off"), "{shown}");
    assert!(shown.contains("AWS_ACCESS_KEY_ID"), "{shown}");
    let e = chain(&[
        ("HOME", h.path().to_str().unwrap()),
        // Nothing listens there: no instance metadata service.
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9"),
    ])
    .get()
    .await
    .unwrap_err();
    assert!(matches!(e, Error::None { .. }), "{e}");
}

#[tokio::test]
async fn a_profile_with_an_id_but_no_secret_is_named() {
    let h = home("[default]\naws_access_key_id = AKID\n", "");
    let e = chain(&[("HOME", h.path().to_str().unwrap())])
        .get()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no aws_secret_access_key"), "{e}");
}

/// A credential process: a script that counts its runs and prints credentials expiring
/// `expires_in` from now.
fn process_script(dir: &std::path::Path, expires_in: &str) -> String {
    let script = dir.join("creds tool.sh");
    let count = dir.join("count");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho x >> '{}'\nn=$(wc -l < '{}' | tr -d ' ')\nexp=$(date -u -d '{expires_in}' +%Y-%m-%dT%H:%M:%SZ)\nprintf '{{\"Version\": 1, \"AccessKeyId\": \"AKIDPROC%s\", \"SecretAccessKey\": \"sekrit\", \"SessionToken\": \"tok\", \"Expiration\": \"%s\"}}' \"$n\" \"$exp\"\n",
            count.display(),
            count.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("\"{}\" --profile x", script.display())
}

#[tokio::test]
async fn credential_process_is_run_and_run_again_only_near_expiry() {
    let t = tempfile::tempdir().unwrap();
    let far = process_script(t.path(), "+1 hour");
    let h = home("", &format!("[profile p]\ncredential_process = {far}\n"));
    let c = chain(&[("HOME", h.path().to_str().unwrap()), ("AWS_PROFILE", "p")]);
    assert_eq!(c.get().await.unwrap().access_key_id, "AKIDPROC1");
    assert_eq!(c.get().await.unwrap().access_key_id, "AKIDPROC1", "cached");
    assert!(c.get().await.unwrap().expires.is_some());

    // Credentials inside the refresh window are fetched again at the next use.
    let t2 = tempfile::tempdir().unwrap();
    let near = process_script(t2.path(), "+2 minutes");
    let h2 = home("", &format!("[profile p]\ncredential_process = {near}\n"));
    let c = chain(&[("HOME", h2.path().to_str().unwrap()), ("AWS_PROFILE", "p")]);
    assert_eq!(c.get().await.unwrap().access_key_id, "AKIDPROC1");
    assert_eq!(c.get().await.unwrap().access_key_id, "AKIDPROC2");
}

#[tokio::test]
async fn a_failing_or_babbling_credential_process_is_explained_without_its_secret() {
    let t = tempfile::tempdir().unwrap();
    let bad = t.path().join("bad.sh");
    std::fs::write(
        &bad,
        "#!/bin/sh\necho 'token expired, log in again' >&2\nexit 3\n",
    )
    .unwrap();
    let junk = t.path().join("junk.sh");
    std::fs::write(
        &junk,
        "#!/bin/sh\necho '{\"Version\": 1, \"AccessKeyId\": \"A\", \"SecretAccessKey\": \"topsecret\", \"Expiration\": 5}'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in [&bad, &junk] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let h = home(
        "",
        &format!(
            "[profile bad]\ncredential_process = {}\n[profile junk]\ncredential_process = {}\n",
            bad.display(),
            junk.display()
        ),
    );
    let home = h.path().to_str().unwrap();
    let e = chain(&[("HOME", home), ("AWS_PROFILE", "bad")])
        .get()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("token expired, log in again") && e.contains("exit status: 3"),
        "{e}"
    );
    let e = chain(&[("HOME", home), ("AWS_PROFILE", "junk")])
        .get()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("wrong type") && !e.contains("topsecret"), "{e}");
}

#[test]
fn command_lines_split_like_the_sdks() {
    assert_eq!(
        split_words(r#""/opt/my tools/creds" --profile "a b"  x"#).unwrap(),
        ["/opt/my tools/creds", "--profile", "a b", "x"]
    );
    assert!(split_words(r#"/bin/x "open"#).is_err());
    assert_eq!(split_words("  ").unwrap(), Vec::<String>::new());
}

#[test]
fn times_are_rfc3339() {
    let t = parse_time("2026-12-01T20:00:00Z").unwrap();
    let t2 = parse_time("2026-12-01T21:00:00.123+01:00").unwrap();
    assert_eq!(t2.duration_since(t).unwrap(), Duration::from_millis(123));
    assert!(parse_time("yesterday").is_none());
}

/// A server on loopback that answers `answer(method, path, headers)` for each request and
/// counts them.
async fn serve(
    answer: impl Fn(&str, &str, &str) -> (u16, String) + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let (answer, n) = (Arc::new(answer), count.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let (answer, n) = (answer.clone(), n.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut got = 0;
                let head = loop {
                    let Ok(k) = s.read(&mut buf[got..]).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    got += k;
                    if let Some(end) = buf[..got].windows(4).position(|w| w == b"\r\n\r\n") {
                        break String::from_utf8_lossy(&buf[..end]).to_string();
                    }
                };
                n.fetch_add(1, Ordering::SeqCst);
                let first = head.lines().next().unwrap_or_default().to_string();
                let mut parts = first.split(' ');
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                let (status, body) = answer(method, path, &head.to_ascii_lowercase());
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, count)
}

#[tokio::test]
async fn imdsv2_needs_its_session_token_and_is_refreshed_before_expiry() {
    let issued = Arc::new(AtomicUsize::new(0));
    let i2 = issued.clone();
    let (url, _) = serve(move |method, path, headers| match (method, path) {
        ("PUT", "/latest/api/token") if headers.contains("x-aws-ec2-metadata-token-ttl-seconds: 21600") => {
            (200, "IMDSTOKEN".into())
        }
        ("GET", _) if !headers.contains("x-aws-ec2-metadata-token: imdstoken") => {
            (401, String::new())
        }
        ("GET", "/latest/meta-data/iam/security-credentials/") => (200, "tether-role\n".into()),
        ("GET", "/latest/meta-data/iam/security-credentials/tether-role") => {
            let n = i2.fetch_add(1, Ordering::SeqCst) + 1;
            // Expires inside the refresh window: fetched again at every use.
            let exp = time::OffsetDateTime::now_utc() + time::Duration::minutes(2);
            let exp = exp
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap();
            (
                200,
                format!(
                    r#"{{"Code":"Success","Type":"AWS-HMAC","AccessKeyId":"ASIAIMDS{n}","SecretAccessKey":"s","Token":"t{n}","Expiration":"{exp}"}}"#
                ),
            )
        }
        _ => (404, String::new()),
    })
    .await;
    let h = home("", "");
    let c = chain(&[
        ("HOME", h.path().to_str().unwrap()),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", &url),
    ]);
    let first = c.get().await.unwrap();
    assert_eq!(first.access_key_id, "ASIAIMDS1");
    assert_eq!(first.session_token.as_deref(), Some("t1"));
    assert!(first.source.contains("tether-role"));
    assert_eq!(c.get().await.unwrap().access_key_id, "ASIAIMDS2");
}

#[tokio::test]
async fn a_profile_with_credential_source_imds_uses_it() {
    let (url, _) = serve(|method, path, _| match (method, path) {
        ("PUT", _) => (200, "T".into()),
        (_, "/latest/meta-data/iam/security-credentials/") => (404, String::new()),
        _ => (404, String::new()),
    })
    .await;
    let h = home(
        "",
        "[profile r]\nrole_arn = arn:aws:iam::123456789012:role/x\ncredential_source = Ec2InstanceMetadata\n",
    );
    let e = chain(&[
        ("HOME", h.path().to_str().unwrap()),
        ("AWS_PROFILE", "r"),
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", &url),
    ])
    .get()
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("no instance profile"), "{e}");
}

#[tokio::test]
async fn sso_trades_the_cached_token_for_role_credentials() {
    let (url, calls) = serve(|method, path, headers| {
        if method == "GET"
            && path == "/federation/credentials?account_id=111122223333&role_name=Dev"
            && headers.contains("x-amz-sso_bearer_token: cached-access-token")
        {
            (
                200,
                r#"{"roleCredentials":{"accessKeyId":"ASIASSO","secretAccessKey":"s","sessionToken":"t","expiration":4102444800000}}"#.into(),
            )
        } else {
            (401, r#"{"message":"Session token not found or invalid"}"#.into())
        }
    })
    .await;
    let h = home(
        "",
        "[profile dev]\nsso_session = corp\nsso_account_id = 111122223333\nsso_role_name = Dev\n[sso-session corp]\nsso_start_url = https://d-123.awsapps.com/start\nsso_region = us-east-1\n",
    );
    let cache = h.path().join(".aws/sso/cache");
    std::fs::create_dir_all(&cache).unwrap();
    // The cache file is named after the SHA-1 of the session name.
    let name = hex::encode(
        ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, b"corp").as_ref(),
    );
    let home = h.path().to_str().unwrap();
    let vars = [
        ("HOME", home),
        ("AWS_PROFILE", "dev"),
        ("AWS_ENDPOINT_URL_SSO", url.as_str()),
    ];
    let e = chain(&vars).get().await.unwrap_err().to_string();
    assert!(e.contains("aws sso login --profile dev"), "{e}");
    std::fs::write(
        cache.join(format!("{name}.json")),
        r#"{"accessToken":"cached-access-token","expiresAt":"2099-01-01T00:00:00Z","region":"us-east-1"}"#,
    )
    .unwrap();
    let c = chain(&vars).get().await.unwrap();
    assert_eq!(c.access_key_id, "ASIASSO");
    assert_eq!(
        c.expires,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(4_102_444_800))
    );
    // An expired login is said as such, without calling the portal.
    let before = calls.load(Ordering::SeqCst);
    std::fs::write(
        cache.join(format!("{name}.json")),
        r#"{"accessToken":"cached-access-token","expiresAt":"2001-01-01T00:00:00Z"}"#,
    )
    .unwrap();
    let e = chain(&vars).get().await.unwrap_err().to_string();
    assert!(e.contains("expired"), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), before);
}

#[tokio::test]
async fn a_source_profile_loop_is_stopped() {
    let h = home(
        "",
        "[profile a]\nrole_arn = arn:aws:iam::1:role/a\nsource_profile = b\n[profile b]\nrole_arn = arn:aws:iam::1:role/b\nsource_profile = a\n",
    );
    let e = chain(&[("HOME", h.path().to_str().unwrap()), ("AWS_PROFILE", "a")])
        .get()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("a loop?"), "{e}");
}
