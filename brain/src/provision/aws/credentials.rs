//! AWS credentials for the brain's own calls, from the standard chain, in the SDKs' order:
//!
//! 1. the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`);
//! 2. the profile (`AWS_PROFILE`, else `default`) in the shared files (`~/.aws/credentials`,
//!    `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE` / `AWS_CONFIG_FILE`): a role to assume
//!    (`role_arn` with `source_profile` or `credential_source`), static keys, a
//!    `credential_process`, or IAM Identity Center (SSO: the token `aws sso login` cached);
//! 3. the instance profile through IMDSv2 (a session token first; `AWS_EC2_METADATA_DISABLED`
//!    turns it off, `AWS_EC2_METADATA_SERVICE_ENDPOINT` moves it).
//!
//! Temporary credentials are cached and fetched again five minutes before they expire, so a
//! long-running brain can still terminate what it launched. Credentials live only in the
//! brain: never sent to a worker, never logged (`Debug` shows the key id alone).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use roxmltree::Document;
use serde::Deserialize;

use super::{endpoint, query};

mod process;
use process::clip;
#[cfg(test)]
use process::split_words;

/// AWS credentials. `Debug` shows only the key id and where they came from.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub(super) secret_access_key: String,
    pub(super) session_token: Option<String>,
    /// When they stop working (`None`: long-term keys).
    pub expires: Option<SystemTime>,
    /// Where they came from, for messages.
    pub source: String,
}

impl Credentials {
    /// SigV4 headers for a form POST of `body` to `url`.
    pub fn sign(
        &self,
        region: &str,
        service: &str,
        url: &str,
        body: &[u8],
        now: SystemTime,
    ) -> Result<Vec<(String, String)>, query::SignError> {
        query::sign(
            (
                &self.access_key_id,
                &self.secret_access_key,
                self.session_token.as_deref(),
            ),
            region,
            service,
            url,
            body,
            now,
        )
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("source", &self.source)
            .field("expires", &self.expires)
            .finish()
    }
}

/// Why no credentials could be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no AWS credentials ({tried}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the brain's environment, or a profile in ~/.aws/credentials or ~/.aws/config (AWS_PROFILE names it), or run the brain where an instance profile answers"
    )]
    None { tried: String },
    #[error("AWS profile {profile}: {reason}")]
    Profile { profile: String, reason: String },
    #[error("AWS credential_process of profile {profile}: {source}")]
    Process {
        profile: String,
        #[source]
        source: process::Error,
    },
    #[error("AWS SSO credentials of profile {profile}: {reason}")]
    Sso { profile: String, reason: String },
    #[error("AWS instance metadata (IMDSv2) at {endpoint}: {reason}")]
    Imds { endpoint: String, reason: String },
    #[error("assuming AWS role {role}: {reason}")]
    AssumeRole { role: String, reason: String },
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Why an answer (of IMDS, the SSO portal, STS) could not be had or read.
#[derive(Debug, thiserror::Error)]
enum AnswerError {
    #[error("no answer ({0})")]
    NoAnswer(#[source] reqwest::Error),
    #[error("reading the answer: {0}")]
    Read(#[source] reqwest::Error),
    #[error("the answer is over {max} bytes", max = MAX_ANSWER)]
    TooLong,
    #[error("this instance has no instance profile (IAM role) attached")]
    NoRole,
    /// `said`: the answer, clipped.
    #[error("HTTP {status}: {said}")]
    Status {
        status: reqwest::StatusCode,
        said: String,
    },
}

/// Credentials this close to their expiry are fetched again.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// How long one credential call (a process, IMDS, SSO, STS) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// IMDS is on the instance itself: if it does not answer at once, there is none.
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);
/// How deep `source_profile` chains may go.
const MAX_CHAIN: usize = 5;
/// What a credential process or a credential endpoint may answer.
const MAX_ANSWER: usize = 64 * 1024;

/// The environment the chain reads: the process's, or (in tests) a map of its own.
#[derive(Debug, Clone, Default)]
pub struct Env(Option<HashMap<String, String>>);

impl Env {
    /// An environment of exactly these variables.
    pub fn of(vars: &[(&str, &str)]) -> Self {
        Self(Some(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ))
    }

    /// A variable that is set and not blank.
    pub fn var(&self, k: &str) -> Option<String> {
        match &self.0 {
            Some(m) => m.get(k).cloned(),
            None => std::env::var(k).ok(),
        }
        .filter(|v| !v.trim().is_empty())
    }

    fn home_file(&self, override_var: &str, name: &str) -> Option<PathBuf> {
        self.var(override_var).map(PathBuf::from).or_else(|| {
            self.var("HOME")
                .map(|h| PathBuf::from(h).join(".aws").join(name))
        })
    }
}

/// Sections of an INI file (`[section]`, `key = value`, `#`/`;` comments), keys lowercased.
pub(super) fn ini(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut cur: Option<String> = None;
    for l in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
    {
        if let Some(s) = l.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            // `[profile  x]` and `[profile x]` are one section.
            let name = s.split_whitespace().collect::<Vec<_>>().join(" ");
            out.entry(name.clone()).or_default();
            cur = Some(name);
        } else if let (Some(c), Some((k, v))) = (&cur, l.split_once('=')) {
            out.entry(c.clone())
                .or_default()
                .insert(k.trim().to_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// The shared config and credentials files, read once per resolution.
struct Files {
    config: HashMap<String, HashMap<String, String>>,
    credentials: HashMap<String, HashMap<String, String>>,
    shown: String,
}

impl Files {
    fn read(env: &Env) -> Self {
        let read = |p: &Option<PathBuf>| {
            p.as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|t| ini(&t))
                .unwrap_or_default()
        };
        let (cfg, creds) = (
            env.home_file("AWS_CONFIG_FILE", "config"),
            env.home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        );
        let shown = [&creds, &cfg]
            .iter()
            .filter_map(|p| p.as_ref().map(|p| p.display().to_string()))
            .collect::<Vec<_>>()
            .join(" and ");
        Self {
            config: read(&cfg),
            credentials: read(&creds),
            shown,
        }
    }

    /// A profile's settings: `[profile NAME]` (or `[default]`) of the config file, with the
    /// credentials file's `[NAME]` winning where both set a key.
    fn profile(&self, name: &str) -> Option<HashMap<String, String>> {
        let in_config = if name == "default" {
            self.config
                .get("default")
                .or_else(|| self.config.get("profile default"))
        } else {
            self.config.get(&format!("profile {name}"))
        };
        let in_creds = self.credentials.get(name);
        if in_config.is_none() && in_creds.is_none() {
            return None;
        }
        let mut p = in_config.cloned().unwrap_or_default();
        p.extend(in_creds.cloned().unwrap_or_default());
        Some(p)
    }
}

/// Where credentials are looked for; the endpoints are settable for tests and private
/// partitions.
#[derive(Debug, Clone)]
pub struct Options {
    /// The region STS is called in (its regional endpoint) when a role is assumed.
    pub region: String,
    /// STS's endpoint (default: `AWS_ENDPOINT_URL_STS`, `AWS_ENDPOINT_URL`, else the region's).
    pub sts_endpoint: Option<String>,
}

/// The credential chain, with a cache of what it found.
pub struct Chain {
    opts: Options,
    env: Env,
    http: reqwest::Client,
    cache: tokio::sync::Mutex<Option<Credentials>>,
}

impl Chain {
    pub fn new(opts: Options, env: Env) -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(Error::Client)?;
        Ok(Self {
            opts,
            env,
            http,
            cache: tokio::sync::Mutex::new(None),
        })
    }

    /// Credentials that are good for at least a few minutes more.
    pub async fn get(&self) -> Result<Credentials, Error> {
        let mut cache = self.cache.lock().await;
        let now = SystemTime::now();
        if let Some(c) = cache.as_ref()
            && c.expires.is_none_or(|e| e > now + REFRESH_BEFORE)
        {
            return Ok(c.clone());
        }
        match self.resolve().await {
            Ok(c) => {
                if c.expires.is_some() {
                    tracing::debug!(source = %c.source, expires = ?c.expires, "AWS credentials fetched");
                }
                *cache = Some(c.clone());
                Ok(c)
            }
            // A failed refresh keeps what still works.
            Err(e) => match cache.as_ref() {
                Some(c) if c.expires.is_some_and(|x| x > now) => {
                    tracing::warn!(error = %e, "refreshing AWS credentials failed; using the current ones until they expire");
                    Ok(c.clone())
                }
                _ => Err(e),
            },
        }
    }

    /// Forgets the cached credentials (after AWS refused them).
    pub async fn forget(&self) {
        *self.cache.lock().await = None;
    }

    async fn resolve(&self) -> Result<Credentials, Error> {
        if let Some(c) = from_env(&self.env) {
            return Ok(c);
        }
        let files = Files::read(&self.env);
        let named = self.env.var("AWS_PROFILE");
        let profile = named.clone().unwrap_or_else(|| "default".into());
        if files.profile(&profile).is_some() {
            return self.profile(&files, &profile, 0).await;
        }
        if named.is_some() {
            return Err(Error::Profile {
                profile,
                reason: format!("no such profile in {}", files.shown),
            });
        }
        let imds_off = self
            .env
            .var("AWS_EC2_METADATA_DISABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if !imds_off {
            match self.imds().await {
                Ok(c) => return Ok(c),
                Err(Error::Imds { reason, .. }) if reason.starts_with("no answer") => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::None {
            tried: format!(
                "none in the environment, no profile {profile} in {}{}",
                files.shown,
                if imds_off {
                    ", instance metadata turned off"
                } else {
                    ", no instance metadata service answered"
                }
            ),
        })
    }

    /// One profile's credentials (`depth`: how far down a `source_profile` chain).
    fn profile<'a>(
        &'a self,
        files: &'a Files,
        name: &'a str,
        depth: usize,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Credentials, Error>> + Send + 'a>> {
        Box::pin(async move {
            let perr = |reason: String| Error::Profile {
                profile: name.to_string(),
                reason,
            };
            if depth >= MAX_CHAIN {
                return Err(perr(format!(
                    "source_profile goes {MAX_CHAIN} profiles deep (a loop?)"
                )));
            }
            let p = files
                .profile(name)
                .ok_or_else(|| perr(format!("no such profile in {}", files.shown)))?;
            let get = |k: &str| p.get(k).filter(|v| !v.is_empty()).cloned();
            let statics = || -> Option<Credentials> {
                Some(Credentials {
                    access_key_id: get("aws_access_key_id")?,
                    secret_access_key: get("aws_secret_access_key")?,
                    session_token: get("aws_session_token"),
                    expires: None,
                    source: format!("profile {name}"),
                })
            };
            if let Some(role) = get("role_arn") {
                let source = match (get("source_profile"), get("credential_source")) {
                    (Some(_), Some(_)) => {
                        return Err(perr(
                            "set source_profile or credential_source, not both".into(),
                        ));
                    }
                    // A profile may name itself: its own keys assume its role.
                    (Some(src), None) if src == name => statics().ok_or_else(|| {
                        perr("names itself as source_profile but has no keys".into())
                    })?,
                    (Some(src), None) => self.profile(files, &src, depth + 1).await?,
                    (None, Some(cs)) => match cs.as_str() {
                        "Environment" => from_env(&self.env).ok_or_else(|| {
                            perr("credential_source = Environment but AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set".into())
                        })?,
                        "Ec2InstanceMetadata" => self.imds().await?,
                        other => {
                            return Err(perr(format!(
                                "credential_source = {other} is not supported here (use Environment or Ec2InstanceMetadata)"
                            )));
                        }
                    },
                    (None, None) => {
                        return Err(perr(
                            "has role_arn but neither source_profile nor credential_source"
                                .into(),
                        ));
                    }
                };
                let region = get("region").unwrap_or_else(|| self.opts.region.clone());
                return self
                    .assume_role(&source, &role, &p, &region)
                    .await
                    .map(|mut c| {
                        c.source = format!("profile {name} (role {role})");
                        c
                    });
            }
            if let Some(c) = statics() {
                return Ok(c);
            }
            if get("aws_access_key_id").is_some() {
                return Err(perr(
                    "has aws_access_key_id but no aws_secret_access_key".into(),
                ));
            }
            if let Some(cmd) = get("credential_process") {
                return credential_process(name, &cmd).await;
            }
            if get("sso_session").is_some() || get("sso_start_url").is_some() {
                return self.sso(files, name, &p).await;
            }
            Err(perr(format!(
                "has no credentials: give it aws_access_key_id and aws_secret_access_key, credential_process, sso_session, or role_arn (in {})",
                files.shown
            )))
        })
    }

    /// IAM Identity Center: the token `aws sso login` cached, exchanged for role credentials.
    async fn sso(
        &self,
        files: &Files,
        name: &str,
        p: &HashMap<String, String>,
    ) -> Result<Credentials, Error> {
        let serr = |reason: String| Error::Sso {
            profile: name.to_string(),
            reason,
        };
        let get = |k: &str| p.get(k).filter(|v| !v.is_empty()).cloned();
        // The newer form names an [sso-session]; the cache file is named after the session
        // name then, after the start URL in the older form.
        let (cache_key, region) = match get("sso_session") {
            Some(session) => {
                let s = files
                    .config
                    .get(&format!("sso-session {session}"))
                    .ok_or_else(|| {
                        serr(format!("no [sso-session {session}] in the config file"))
                    })?;
                let region = s
                    .get("sso_region")
                    .cloned()
                    .ok_or_else(|| serr(format!("[sso-session {session}] has no sso_region")))?;
                (session, region)
            }
            None => (
                get("sso_start_url").expect("checked by the caller"),
                get("sso_region")
                    .ok_or_else(|| serr("has sso_start_url but no sso_region".into()))?,
            ),
        };
        let account = get("sso_account_id").ok_or_else(|| serr("has no sso_account_id".into()))?;
        let role = get("sso_role_name").ok_or_else(|| serr("has no sso_role_name".into()))?;
        let digest = ring::digest::digest(
            &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
            cache_key.as_bytes(),
        );
        let dir = self
            .env
            .var("HOME")
            .map(|h| PathBuf::from(h).join(".aws/sso/cache"))
            .ok_or_else(|| {
                serr("HOME is not set, so the SSO token cache cannot be found".into())
            })?;
        let file = dir.join(format!("{}.json", hex::encode(digest.as_ref())));
        let login = format!("run `aws sso login --profile {name}` on the brain's machine");
        let text = std::fs::read_to_string(&file).map_err(|e| {
            serr(format!(
                "no cached SSO token at {} ({e}): {login}",
                file.display()
            ))
        })?;
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Token {
            access_token: String,
            expires_at: String,
        }
        let t: Token = serde_json::from_str(&text)
            .map_err(|e| serr(format!("{} cannot be read ({e}): {login}", file.display())))?;
        let expires = parse_time(&t.expires_at).ok_or_else(|| {
            serr(format!(
                "{}: expiresAt {:?} is not a time",
                file.display(),
                t.expires_at
            ))
        })?;
        if expires <= SystemTime::now() {
            return Err(serr(format!("the SSO session expired: {login}")));
        }
        let base = self
            .env
            .var("AWS_ENDPOINT_URL_SSO")
            .map(|u| u.trim_end_matches('/').to_string())
            .map(Ok)
            .unwrap_or_else(|| {
                endpoint::partition(&region)
                    .map(|p| format!("https://portal.sso.{region}.{}", p.dns_suffix))
                    .map_err(|e| serr(e.to_string()))
            })?;
        let resp = self
            .http
            .get(format!("{base}/federation/credentials"))
            .query(&[("account_id", &account), ("role_name", &role)])
            .header("x-amz-sso_bearer_token", &t.access_token)
            .send()
            .await
            .map_err(|e| serr(format!("cannot reach {base}: {e}")))?;
        let status = resp.status();
        let body = read_capped(resp).await.map_err(|e| serr(e.to_string()))?;
        if status.as_u16() == 401 || status.as_u16() == 403 {
            return Err(serr(format!(
                "the SSO portal refused the cached token (HTTP {status}): {login}"
            )));
        }
        if !status.is_success() {
            return Err(serr(format!("HTTP {status}: {}", clip(&body))));
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Answer {
            role_credentials: RoleCredentials,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct RoleCredentials {
            access_key_id: String,
            secret_access_key: String,
            session_token: Option<String>,
            /// Milliseconds since the epoch.
            expiration: u64,
        }
        let a: Answer = serde_json::from_str(&body)
            .map_err(|e| serr(format!("the portal's answer cannot be read: {e}")))?;
        let r = a.role_credentials;
        Ok(Credentials {
            access_key_id: r.access_key_id,
            secret_access_key: r.secret_access_key,
            session_token: r.session_token.filter(|t| !t.is_empty()),
            expires: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(r.expiration)),
            source: format!("profile {name} (SSO role {role} in {account})"),
        })
    }

    /// The instance profile's credentials through IMDSv2.
    async fn imds(&self) -> Result<Credentials, Error> {
        let base = self
            .env
            .var("AWS_EC2_METADATA_SERVICE_ENDPOINT")
            .unwrap_or_else(|| "http://169.254.169.254".into())
            .trim_end_matches('/')
            .to_string();
        let ierr = |reason: String| Error::Imds {
            endpoint: base.clone(),
            reason,
        };
        let token = self
            .http
            .put(format!("{base}/latest/api/token"))
            .header("x-aws-ec2-metadata-token-ttl-seconds", "21600")
            .timeout(IMDS_TIMEOUT)
            .send()
            .await
            .map_err(|e| ierr(format!("no answer to the token request ({e})")))?;
        if !token.status().is_success() {
            return Err(ierr(format!(
                "the token request was refused (HTTP {}); is IMDSv2 on and the hop limit high enough?",
                token.status()
            )));
        }
        let token = read_capped(token).await.map_err(|e| ierr(e.to_string()))?;
        let get = |path: String| {
            let (http, token) = (self.http.clone(), token.clone());
            async move {
                let r = http
                    .get(path)
                    .header("x-aws-ec2-metadata-token", token.trim())
                    .timeout(IMDS_TIMEOUT)
                    .send()
                    .await
                    .map_err(AnswerError::NoAnswer)?;
                let status = r.status();
                let body = read_capped(r).await?;
                if status.as_u16() == 404 {
                    return Err(AnswerError::NoRole);
                }
                if !status.is_success() {
                    let said = clip(&body);
                    return Err(AnswerError::Status { status, said });
                }
                Ok(body)
            }
        };
        let list = get(format!("{base}/latest/meta-data/iam/security-credentials/"))
            .await
            .map_err(|e| ierr(e.to_string()))?;
        let role = list
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .ok_or_else(|| ierr("no role is listed".into()))?
            .to_string();
        let body = get(format!(
            "{base}/latest/meta-data/iam/security-credentials/{role}"
        ))
        .await
        .map_err(|e| ierr(e.to_string()))?;
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Answer {
            code: String,
            access_key_id: Option<String>,
            secret_access_key: Option<String>,
            token: Option<String>,
            expiration: Option<String>,
        }
        let a: Answer = serde_json::from_str(&body)
            .map_err(|e| ierr(format!("the answer cannot be read: {e}")))?;
        if a.code != "Success" {
            return Err(ierr(format!("the role {role} answers {}", a.code)));
        }
        Ok(Credentials {
            access_key_id: a
                .access_key_id
                .ok_or_else(|| ierr("no AccessKeyId".into()))?,
            secret_access_key: a
                .secret_access_key
                .ok_or_else(|| ierr("no SecretAccessKey".into()))?,
            session_token: a.token.filter(|t| !t.is_empty()),
            expires: a.expiration.as_deref().and_then(parse_time),
            source: format!("instance profile {role}"),
        })
    }

    /// STS AssumeRole with `source`'s credentials.
    async fn assume_role(
        &self,
        source: &Credentials,
        role: &str,
        p: &HashMap<String, String>,
        region: &str,
    ) -> Result<Credentials, Error> {
        let rerr = |reason: String| Error::AssumeRole {
            role: role.to_string(),
            reason,
        };
        let url = self
            .opts
            .sts_endpoint
            .clone()
            .or_else(|| self.env.var("AWS_ENDPOINT_URL_STS"))
            .or_else(|| self.env.var("AWS_ENDPOINT_URL"))
            .map(Ok)
            .unwrap_or_else(|| {
                endpoint::service_url("sts", region).map_err(|e| rerr(e.to_string()))
            })?;
        let url = if url.ends_with('/') {
            url
        } else {
            format!("{url}/")
        };
        let session = p
            .get("role_session_name")
            .cloned()
            .unwrap_or_else(|| format!("tether-{}", shared::now_unix_ms()));
        let duration = p
            .get("duration_seconds")
            .cloned()
            .unwrap_or_else(|| "3600".into());
        let body = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("Action", "AssumeRole")
                .append_pair("Version", "2011-06-15")
                .append_pair("RoleArn", role)
                .append_pair("RoleSessionName", &session)
                .append_pair("DurationSeconds", &duration);
            if let Some(x) = p.get("external_id") {
                form.append_pair("ExternalId", x);
            }
            form.finish()
        };
        let headers = source
            .sign(region, "sts", &url, body.as_bytes(), SystemTime::now())
            .map_err(|e| rerr(e.to_string()))?;
        let mut req = self
            .http
            .post(&url)
            .header("content-type", query::CONTENT_TYPE);
        for (k, v) in &headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|e| rerr(format!("cannot reach STS at {url}: {e}")))?;
        let status = resp.status();
        let text = read_capped(resp).await.map_err(|e| rerr(e.to_string()))?;
        if !status.is_success() {
            return Err(rerr(query::api_error(status.as_u16(), &text).to_string()));
        }
        let doc = Document::parse(&text).map_err(|e| rerr(format!("STS answer: {e}")))?;
        let creds = doc
            .descendants()
            .find(|n| n.has_tag_name("Credentials"))
            .ok_or_else(|| rerr("STS answered no Credentials".into()))?;
        let field = |t: &str| {
            creds
                .children()
                .find(|c| c.has_tag_name(t))
                .and_then(|c| c.text())
                .map(str::to_string)
                .ok_or_else(|| rerr(format!("STS answered no {t}")))
        };
        Ok(Credentials {
            access_key_id: field("AccessKeyId")?,
            secret_access_key: field("SecretAccessKey")?,
            session_token: Some(field("SessionToken")?),
            expires: parse_time(&field("Expiration")?),
            source: format!("role {role}"),
        })
    }
}

fn from_env(env: &Env) -> Option<Credentials> {
    Some(Credentials {
        access_key_id: env.var("AWS_ACCESS_KEY_ID")?,
        secret_access_key: env.var("AWS_SECRET_ACCESS_KEY")?,
        session_token: env.var("AWS_SESSION_TOKEN"),
        expires: None,
        source: "the environment".into(),
    })
}

/// Runs a profile's `credential_process` and takes its answer as credentials.
async fn credential_process(profile: &str, line: &str) -> Result<Credentials, Error> {
    let perr = |source| Error::Process {
        profile: profile.to_string(),
        source,
    };
    let a = process::run(line, CALL_TIMEOUT, MAX_ANSWER)
        .await
        .map_err(perr)?;
    let expires = match a.expiration.as_deref() {
        None => None,
        Some(t) => {
            Some(parse_time(t).ok_or_else(|| perr(process::Error::Expiration(t.to_string())))?)
        }
    };
    Ok(Credentials {
        access_key_id: a.access_key_id,
        secret_access_key: a.secret_access_key,
        session_token: a.session_token.filter(|t| !t.is_empty()),
        expires,
        source: format!("profile {profile} (credential_process)"),
    })
}

/// An RFC 3339 time (`2026-12-01T20:00:00Z`, fractions and offsets too).
pub(super) fn parse_time(t: &str) -> Option<SystemTime> {
    let d = time::OffsetDateTime::parse(t.trim(), &time::format_description::well_known::Rfc3339)
        .ok()?;
    let nanos = d.unix_timestamp_nanos();
    (nanos >= 0).then(|| SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos as u64))
}

async fn read_capped(r: reqwest::Response) -> Result<String, AnswerError> {
    let bytes = r.bytes().await.map_err(AnswerError::Read)?;
    if bytes.len() > MAX_ANSWER {
        return Err(AnswerError::TooLong);
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests;
