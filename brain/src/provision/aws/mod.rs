//! A minimal EC2 Query API client (version 2016-11-15): form POSTs signed with SigV4
//! (`aws-sigv4`), XML answers read with `roxmltree`. Credentials come from the standard chain
//! ([`credentials`]); the endpoint from the region's partition ([`endpoint`]). Credentials
//! are used only here, in the brain: never sent to a worker, never logged.

pub mod credentials;
pub mod endpoint;
pub mod query;

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use roxmltree::{Document, Node};

pub use credentials::{Chain, Credentials, Env};
pub use query::ApiError;
use query::{CONTENT_TYPE, api_error, child, text};

/// Why an EC2 call failed, and so whether it can have changed anything.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing was sent: no usable credentials.
    #[error(transparent)]
    Credentials(#[from] credentials::Error),
    /// Nothing was sent: the region or endpoint is wrong.
    #[error("{0}")]
    Config(String),
    /// Nothing was sent: the request cannot be signed.
    #[error(transparent)]
    Sign(#[from] query::SignError),
    /// AWS answered with an error: a 4xx refused the call, so it changed nothing.
    #[error("EC2 {action}: {code}: {message} (HTTP {status})")]
    Api {
        action: String,
        status: u16,
        code: String,
        message: String,
    },
    /// No answer, or one that cannot be read: the call may or may not have taken effect.
    #[error("EC2 {action}: {reason}")]
    Transport { action: String, reason: String },
}

impl Error {
    /// The call certainly changed nothing.
    pub fn refused(&self) -> bool {
        match self {
            Error::Credentials(_) | Error::Config(_) | Error::Sign(_) => true,
            Error::Api { status, .. } => (400..500).contains(status),
            Error::Transport { .. } => false,
        }
    }

    /// AWS did not accept the credentials (so a cached set should be fetched again).
    fn auth_failure(&self) -> bool {
        matches!(self, Error::Api { code, .. } if matches!(code.as_str(), "AuthFailure" | "ExpiredToken" | "RequestExpired" | "InvalidClientTokenId" | "UnrecognizedClientException"))
    }
}

/// `AWS_REGION`, `AWS_DEFAULT_REGION`, then `region` for the profile in `~/.aws/config`.
pub fn region(env: &Env) -> Result<String, Error> {
    if let Some(r) = env
        .var("AWS_REGION")
        .or_else(|| env.var("AWS_DEFAULT_REGION"))
    {
        return Ok(r);
    }
    let p = env.var("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let text = env
        .var("AWS_CONFIG_FILE")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            env.var("HOME")
                .map(|h| std::path::Path::new(&h).join(".aws/config"))
        })
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default();
    let sections = credentials::ini(&text);
    [format!("profile {p}"), p.clone()]
        .iter()
        .find_map(|s| sections.get(s).and_then(|m| m.get("region").cloned()))
        .ok_or_else(|| {
            Error::Config(format!("no AWS region: set provision.ec2.region, AWS_REGION, or `region` for profile {p} in ~/.aws/config"))
        })
}

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
    chain: Chain,
}

impl Ec2 {
    /// `endpoint` and `region` as configured, or from the environment (`AWS_ENDPOINT_URL_EC2`,
    /// `AWS_ENDPOINT_URL`, else the region's endpoint in its partition). An endpoint of AWS's
    /// own for another region than the one requests are signed for is refused.
    pub fn new(endpoint: Option<&str>, region: Option<&str>, env: Env) -> Result<Self, Error> {
        let region = match region {
            Some(r) => r.to_string(),
            None => self::region(&env)?,
        };
        endpoint::partition(&region).map_err(|e| Error::Config(e.to_string()))?;
        let endpoint = match endpoint
            .map(str::to_string)
            .or_else(|| env.var("AWS_ENDPOINT_URL_EC2"))
            .or_else(|| env.var("AWS_ENDPOINT_URL"))
        {
            Some(e) => {
                endpoint::check_agree(&e, &region).map_err(|e| Error::Config(e.to_string()))?;
                e
            }
            None => {
                endpoint::service_url("ec2", &region).map_err(|e| Error::Config(e.to_string()))?
            }
        };
        let endpoint = if endpoint.ends_with('/') {
            endpoint
        } else {
            format!("{endpoint}/")
        };
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        let chain = Chain::new(
            credentials::Options {
                region: region.clone(),
                sts_endpoint: None,
            },
            env,
        )
        .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Self {
            http,
            endpoint,
            region,
            chain,
        })
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// Credentials good for a few minutes more (checks them without calling EC2).
    pub async fn credentials(&self) -> Result<Credentials, Error> {
        Ok(self.chain.get().await?)
    }

    /// One call; the answer's XML, or the API's error. Credentials AWS refuses are fetched
    /// again once (they may have been rotated or refreshed meanwhile).
    pub async fn call(&self, action: &str, params: &[(String, String)]) -> Result<String, Error> {
        match self.call_once(action, params).await {
            Err(e) if e.auth_failure() => {
                tracing::info!(error = %e, "AWS refused the credentials; fetching them again");
                self.chain.forget().await;
                self.call_once(action, params).await
            }
            r => r,
        }
    }

    async fn call_once(&self, action: &str, params: &[(String, String)]) -> Result<String, Error> {
        let creds = self.chain.get().await?;
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("Action", action)
            .append_pair("Version", "2016-11-15")
            .extend_pairs(params)
            .finish();
        let headers = creds.sign(
            &self.region,
            "ec2",
            &self.endpoint,
            body.as_bytes(),
            SystemTime::now(),
        )?;
        let mut req = self
            .http
            .post(&self.endpoint)
            .header("content-type", CONTENT_TYPE);
        for (k, v) in &headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let transport = |reason: String| Error::Transport {
            action: action.to_string(),
            reason,
        };
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|e| transport(format!("cannot reach {}: {e}", self.endpoint)))?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| transport(format!("reading the answer: {e}")))?;
        if bytes.len() > MAX_ANSWER {
            return Err(transport(format!("answer over {MAX_ANSWER} bytes")));
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if !status.is_success() {
            let e = api_error(status.as_u16(), &text);
            return Err(match e.code {
                Some(code) => Error::Api {
                    action: action.to_string(),
                    status: status.as_u16(),
                    code,
                    message: e.message,
                },
                None => transport(e.to_string()),
            });
        }
        Ok(text)
    }

    /// Launches one instance; `client_token` makes a retried launch the same launch.
    pub async fn run_instance(
        &self,
        ami: &str,
        instance_type: &str,
        user_data: &[u8],
        tags: &[(String, String)],
        client_token: &str,
        extra: &[(String, String)],
    ) -> Result<Instance, Error> {
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
            // A worker that gives up on its brain powers off: that ends the instance.
            kv("InstanceInitiatedShutdownBehavior", "terminate"),
            // IMDSv2 only: nothing on the instance reads its metadata without a session. The
            // service stays on until the worker joins (cloud-init reads the user data from
            // it); then `disable_metadata` turns it off.
            kv("MetadataOptions.HttpTokens", "required"),
            kv("MetadataOptions.HttpPutResponseHopLimit", "1"),
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
        let unreadable = |reason: String| Error::Transport {
            action: "RunInstances".into(),
            reason,
        };
        parse_instances(&xml)
            .map_err(|e| unreadable(e.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| unreadable("the answer names no instance".into()))
    }

    /// Instances not yet terminated whose tag `key` is `value` (every page).
    pub async fn live_by_tag(&self, key: &str, value: &str) -> Result<Vec<Instance>, Error> {
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
            let unreadable = |reason: String| Error::Transport {
                action: "DescribeInstances".into(),
                reason,
            };
            out.extend(parse_instances(&xml).map_err(|e| unreadable(e.to_string()))?);
            let doc = Document::parse(&xml).map_err(|e| unreadable(format!("EC2 answer: {e}")))?;
            token = text(doc.root_element(), "nextToken").filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// Turns instance `id`'s metadata service off (ModifyInstanceMetadataOptions), IMDSv2
    /// only should it be turned on again.
    pub async fn disable_metadata(&self, id: &str) -> Result<(), Error> {
        let p = [
            kv("InstanceId", id),
            kv("HttpEndpoint", "disabled"),
            kv("HttpTokens", "required"),
        ];
        self.call("ModifyInstanceMetadataOptions", &p)
            .await
            .map(drop)
    }

    pub async fn terminate(&self, ids: &[String]) -> Result<(), Error> {
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

fn items<'a, 'i>(n: Node<'a, 'i>) -> impl Iterator<Item = Node<'a, 'i>> {
    n.children().filter(|c| c.has_tag_name("item"))
}

/// An EC2 answer that is not XML.
#[derive(Debug, thiserror::Error)]
#[error("EC2 answer: {0}")]
pub struct NotXml(#[from] roxmltree::Error);

/// The instances in any `instancesSet` of an answer.
pub fn parse_instances(xml: &str) -> Result<Vec<Instance>, NotXml> {
    let doc = Document::parse(xml)?;
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
            api_error(400, err).to_string(),
            "InvalidAMIID.NotFound: The image id '[ami-x]' does not exist (HTTP 400)"
        );
        assert!(api_error(502, "<html>").to_string().starts_with("HTTP 502"));
        assert_eq!(api_error(502, "<html>").code, None);
        assert!(parse_instances("not xml").is_err());
    }

    #[test]
    fn credentials_never_show_their_secret() {
        let c = Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI".into(),
            session_token: Some("tok".into()),
            expires: None,
            source: "test".into(),
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("AKIDEXAMPLE")
                && !shown.contains("wJalrXUtnFEMI")
                && !shown.contains("tok\"")
        );
    }

    #[test]
    fn only_a_refusal_is_known_to_have_changed_nothing() {
        let api = |status| Error::Api {
            action: "RunInstances".into(),
            status,
            code: "X".into(),
            message: String::new(),
        };
        assert!(api(401).refused());
        assert!(api(400).refused());
        assert!(!api(503).refused(), "a 5xx may have launched it");
        assert!(
            !Error::Transport {
                action: "RunInstances".into(),
                reason: "timed out".into()
            }
            .refused()
        );
        assert!(Error::Config("no region".into()).refused());
    }
}
