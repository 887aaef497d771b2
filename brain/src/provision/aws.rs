//! A minimal EC2 Query API client (version 2016-11-15): form POSTs signed with SigV4
//! (`aws-sigv4`), XML answers read with `roxmltree`. Credentials come from the usual places —
//! `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, else the profile
//! (`AWS_PROFILE`, default `default`) in `~/.aws/credentials` — and are used only here, in the
//! brain: never sent to a worker, never logged (their `Debug` is redacted).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use roxmltree::{Document, Node};

/// AWS credentials. `Debug` shows only the key id.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

fn profile() -> String {
    var("AWS_PROFILE").unwrap_or_else(|| "default".into())
}

fn aws_file(override_var: &str, name: &str) -> Option<PathBuf> {
    var(override_var)
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".aws").join(name)))
}

/// One section of an INI file (`[section]`, `key = value`, `#`/`;` comments).
fn ini_section(text: &str, want: &str) -> Option<HashMap<String, String>> {
    let (mut cur, mut out): (Option<String>, Option<HashMap<String, String>>) = (None, None);
    for l in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
    {
        if let Some(s) = l.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            cur = Some(s.trim().to_string());
            if s.trim() == want {
                out.get_or_insert_with(HashMap::new);
            }
        } else if cur.as_deref() == Some(want)
            && let Some((k, v)) = l.split_once('=')
        {
            out.get_or_insert_with(HashMap::new)
                .insert(k.trim().to_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// The credentials, from the environment or the shared credentials file.
pub fn credentials() -> Result<Credentials, String> {
    if let (Some(a), Some(s)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        return Ok(Credentials {
            access_key_id: a,
            secret_access_key: s,
            session_token: var("AWS_SESSION_TOKEN"),
        });
    }
    let p = profile();
    let path = aws_file("AWS_SHARED_CREDENTIALS_FILE", "credentials")
        .ok_or("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "no AWS credentials: AWS_ACCESS_KEY_ID is unset and {} cannot be read ({e})",
            path.display()
        )
    })?;
    let sec =
        ini_section(&text, &p).ok_or_else(|| format!("no [{p}] profile in {}", path.display()))?;
    let get = |k: &str| sec.get(k).filter(|v| !v.is_empty()).cloned();
    Ok(Credentials {
        access_key_id: get("aws_access_key_id")
            .ok_or_else(|| format!("[{p}] in {} has no aws_access_key_id", path.display()))?,
        secret_access_key: get("aws_secret_access_key")
            .ok_or_else(|| format!("[{p}] in {} has no aws_secret_access_key", path.display()))?,
        session_token: get("aws_session_token"),
    })
}

/// `AWS_REGION`, `AWS_DEFAULT_REGION`, then `region` for the profile in `~/.aws/config`.
pub fn region() -> Result<String, String> {
    if let Some(r) = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")) {
        return Ok(r);
    }
    let p = profile();
    let text = aws_file("AWS_CONFIG_FILE", "config")
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default();
    [format!("profile {p}"), p.clone()]
        .iter()
        .find_map(|s| ini_section(&text, s).and_then(|m| m.get("region").cloned()))
        .ok_or_else(|| {
            format!("no AWS region: set provision.ec2.region, AWS_REGION, or `region` for profile {p} in ~/.aws/config")
        })
}

const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
const TIMEOUT: Duration = Duration::from_secs(30);
/// Answers larger than this are refused.
const MAX_ANSWER: usize = 8 << 20;

/// An instance as DescribeInstances, RunInstances and TerminateInstances show it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: String,
    pub state: String,
    pub private_ip: String,
    pub tags: HashMap<String, String>,
}

/// A client for one region and endpoint.
pub struct Ec2 {
    http: reqwest::Client,
    endpoint: String,
    region: String,
}

impl Ec2 {
    /// `endpoint` and `region` as configured, or from the environment (`AWS_ENDPOINT_URL_EC2`,
    /// `AWS_ENDPOINT_URL`, else the region's public endpoint).
    pub fn new(endpoint: Option<&str>, region: Option<&str>) -> Result<Self, String> {
        let region = match region {
            Some(r) => r.to_string(),
            None => self::region()?,
        };
        let endpoint = endpoint
            .map(str::to_string)
            .or_else(|| var("AWS_ENDPOINT_URL_EC2"))
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://ec2.{region}.amazonaws.com/"));
        let endpoint = if endpoint.ends_with('/') {
            endpoint
        } else {
            format!("{endpoint}/")
        };
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self {
            http,
            endpoint,
            region,
        })
    }

    fn sign(
        &self,
        c: &Credentials,
        body: &[u8],
        now: SystemTime,
    ) -> Result<Vec<(String, String)>, String> {
        use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
        let identity = aws_credential_types::Credentials::new(
            &c.access_key_id,
            &c.secret_access_key,
            c.session_token.clone(),
            None,
            "tether",
        )
        .into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("ec2")
            .time(now)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| format!("signing: {e}"))?
            .into();
        let req = SignableRequest::new(
            "POST",
            &self.endpoint,
            [("content-type", CONTENT_TYPE)].into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| format!("signing: {e}"))?;
        let (instructions, _) = sign(req, &params)
            .map_err(|e| format!("signing: {e}"))?
            .into_parts();
        Ok(instructions
            .headers()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// One call; the answer's XML, or the API's error in words.
    pub async fn call(&self, action: &str, params: &[(String, String)]) -> Result<String, String> {
        let creds = credentials()?;
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", action)
            .append_pair("Version", "2016-11-15")
            .extend_pairs(params)
            .finish();
        let headers = self.sign(&creds, body.as_bytes(), SystemTime::now())?;
        let mut req = self
            .http
            .post(&self.endpoint)
            .header("content-type", CONTENT_TYPE);
        for (k, v) in &headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|e| format!("EC2 {action}: cannot reach {}: {e}", self.endpoint))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| format!("EC2 {action}: reading the answer: {e}"))?;
        if bytes.len() > MAX_ANSWER {
            return Err(format!("EC2 {action}: answer over {MAX_ANSWER} bytes"));
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if !status.is_success() {
            return Err(format!(
                "EC2 {action}: {}",
                api_error(status.as_u16(), &text)
            ));
        }
        Ok(text)
    }

    /// Launches one instance; `client_token` makes a retried launch the same launch.
    pub async fn run_instance(
        &self,
        ami: &str,
        instance_type: &str,
        user_data: &str,
        tags: &[(String, String)],
        client_token: &str,
        extra: &[(String, String)],
    ) -> Result<Instance, String> {
        let mut p = vec![
            kv("ImageId", ami),
            kv("InstanceType", instance_type),
            kv("MinCount", "1"),
            kv("MaxCount", "1"),
            kv("ClientToken", client_token),
            kv(
                "UserData",
                &base64::engine::general_purpose::STANDARD.encode(user_data),
            ),
            kv("InstanceInitiatedShutdownBehavior", "terminate"),
        ];
        if !tags.is_empty() {
            p.push(kv("TagSpecification.1.ResourceType", "instance"));
        }
        for (i, (k, v)) in tags.iter().enumerate() {
            p.push(kv(&format!("TagSpecification.1.Tag.{}.Key", i + 1), k));
            p.push(kv(&format!("TagSpecification.1.Tag.{}.Value", i + 1), v));
        }
        p.extend_from_slice(extra);
        let xml = self.call("RunInstances", &p).await?;
        parse_instances(&xml)?
            .into_iter()
            .next()
            .ok_or_else(|| "EC2 RunInstances: the answer names no instance".to_string())
    }

    /// Instances not yet terminated whose tag `key` is `value` (every page).
    pub async fn live_by_tag(&self, key: &str, value: &str) -> Result<Vec<Instance>, String> {
        let (mut out, mut token) = (Vec::new(), None::<String>);
        loop {
            let mut p = vec![
                kv("Filter.1.Name", &format!("tag:{key}")),
                kv("Filter.1.Value.1", value),
                kv("Filter.2.Name", "instance-state-name"),
            ];
            for (i, s) in ["pending", "running", "stopping", "stopped"]
                .iter()
                .enumerate()
            {
                p.push(kv(&format!("Filter.2.Value.{}", i + 1), s));
            }
            if let Some(t) = &token {
                p.push(kv("NextToken", t));
            }
            let xml = self.call("DescribeInstances", &p).await?;
            out.extend(parse_instances(&xml)?);
            let doc = Document::parse(&xml).map_err(|e| format!("EC2 answer: {e}"))?;
            token = text(doc.root_element(), "nextToken").filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    pub async fn terminate(&self, ids: &[String]) -> Result<(), String> {
        if ids.is_empty() {
            return Ok(());
        }
        let p: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| kv(&format!("InstanceId.{}", i + 1), id))
            .collect();
        self.call("TerminateInstances", &p).await.map(drop)
    }
}

fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_string(), v.to_string())
}

fn child<'a, 'i>(n: Node<'a, 'i>, tag: &str) -> Option<Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(tag))
}

fn text(n: Node, tag: &str) -> Option<String> {
    child(n, tag).and_then(|c| c.text()).map(str::to_string)
}

fn items<'a, 'i>(n: Node<'a, 'i>) -> impl Iterator<Item = Node<'a, 'i>> {
    n.children().filter(|c| c.has_tag_name("item"))
}

/// The instances in any `instancesSet` of an answer.
pub fn parse_instances(xml: &str) -> Result<Vec<Instance>, String> {
    let doc = Document::parse(xml).map_err(|e| format!("EC2 answer: {e}"))?;
    Ok(doc
        .descendants()
        .filter(|n| n.has_tag_name("instancesSet"))
        .flat_map(items)
        .map(|i| Instance {
            id: text(i, "instanceId").unwrap_or_default(),
            state: child(i, "instanceState")
                .or_else(|| child(i, "currentState"))
                .and_then(|s| text(s, "name"))
                .unwrap_or_default(),
            private_ip: text(i, "privateIpAddress").unwrap_or_default(),
            tags: child(i, "tagSet")
                .map(|t| {
                    items(t)
                        .map(|it| {
                            (
                                text(it, "key").unwrap_or_default(),
                                text(it, "value").unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
}

/// `<Response><Errors><Error><Code/><Message/>` (EC2) or `<ErrorResponse>` in words.
pub fn api_error(status: u16, body: &str) -> String {
    let parsed = Document::parse(body).ok().and_then(|d| {
        let err = d.descendants().find(|n| n.has_tag_name("Error"))?;
        Some(format!(
            "{}: {} (HTTP {status})",
            text(err, "Code")?,
            text(err, "Message").unwrap_or_default()
        ))
    });
    parsed.unwrap_or_else(|| {
        format!(
            "HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_errors_are_read() {
        let xml = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
          <reservationSet><item><instancesSet><item>
            <instanceId>i-0abc</instanceId><instanceState><code>16</code><name>running</name></instanceState>
            <privateIpAddress>10.0.0.5</privateIpAddress>
            <tagSet><item><key>tether.machine</key><value>m-1</value></item></tagSet>
          </item></instancesSet></item></reservationSet></DescribeInstancesResponse>"#;
        let v = parse_instances(xml).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].id, "i-0abc");
        assert_eq!(v[0].state, "running");
        assert_eq!(v[0].private_ip, "10.0.0.5");
        assert_eq!(v[0].tags["tether.machine"], "m-1");
        let err = r#"<Response><Errors><Error><Code>InvalidAMIID.NotFound</Code><Message>The image id '[ami-x]' does not exist</Message></Error></Errors><RequestID>r</RequestID></Response>"#;
        assert_eq!(
            api_error(400, err),
            "InvalidAMIID.NotFound: The image id '[ami-x]' does not exist (HTTP 400)"
        );
        assert!(api_error(502, "<html>").starts_with("HTTP 502"));
        assert!(parse_instances("not xml").is_err());
    }

    #[test]
    fn credentials_never_show_their_secret() {
        let c = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI".into(),
            session_token: Some("tok".into()),
        };
        let shown = format!("{c:?}");
        assert!(shown.contains("AKIDEXAMPLE") && !shown.contains("wJalrXUtnFEMI"));
        let ini = "[default]\naws_access_key_id = A\naws_secret_access_key = S\n[other]\naws_access_key_id = B\n";
        assert_eq!(ini_section(ini, "other").unwrap()["aws_access_key_id"], "B");
        assert!(ini_section(ini, "missing").is_none());
    }
}
