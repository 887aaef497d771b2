//! The AWS Query protocol's common parts, below every client here: form POSTs signed with
//! SigV4 (`aws-sigv4`), and error answers (`<Response><Errors>…` from EC2, `<ErrorResponse>`
//! from STS) read with `roxmltree`.

use std::time::SystemTime;

use roxmltree::{Document, Node};

pub const CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// A request SigV4 cannot sign (nothing was sent).
#[derive(Debug, thiserror::Error)]
#[error("signing: {0}")]
pub struct SignError(#[source] Box<dyn std::error::Error + Send + Sync>);

impl SignError {
    fn new(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(e.into())
    }
}

/// SigV4 headers for a form POST of `body` to `url`, signed with `key` (access key id,
/// secret, session token).
pub fn sign(
    key: (&str, &str, Option<&str>),
    region: &str,
    service: &str,
    url: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<(String, String)>, SignError> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let (access_key_id, secret_access_key, session_token) = key;
    let identity = aws_credential_types::Credentials::new(
        access_key_id,
        secret_access_key,
        session_token.map(str::to_string),
        None,
        "tether",
    )
    .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(now)
        .settings(SigningSettings::default())
        .build()
        .map_err(SignError::new)?
        .into();
    let req = SignableRequest::new(
        "POST",
        url,
        [("content-type", CONTENT_TYPE)].into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(SignError::new)?;
    let (instructions, _) = sign(req, &params).map_err(SignError::new)?.into_parts();
    Ok(instructions
        .headers()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

pub fn child<'a, 'i>(n: Node<'a, 'i>, tag: &str) -> Option<Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(tag))
}

pub fn text(n: Node, tag: &str) -> Option<String> {
    child(n, tag).and_then(|c| c.text()).map(str::to_string)
}

/// An error answer: its code and message where it has them.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub code: Option<String>,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.code {
            Some(c) => write!(f, "{c}: {} (HTTP {})", self.message, self.status),
            None => write!(f, "HTTP {}: {}", self.status, self.message),
        }
    }
}

/// `<Response><Errors><Error><Code/><Message/>` (EC2) or `<ErrorResponse>` (STS).
pub fn api_error(status: u16, body: &str) -> ApiError {
    let parsed = Document::parse(body).ok().and_then(|d| {
        let err = d.descendants().find(|n| n.has_tag_name("Error"))?;
        Some(ApiError {
            status,
            code: Some(text(err, "Code")?),
            message: text(err, "Message").unwrap_or_default(),
        })
    });
    parsed.unwrap_or_else(|| ApiError {
        status,
        code: None,
        message: body.chars().take(300).collect(),
    })
}
