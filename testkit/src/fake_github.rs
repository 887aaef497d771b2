//! A fake GitHub REST API for delivery tests: plain HTTP/1.1 on 127.0.0.1 speaking GitHub's
//! wire format for "Create a pull request" (`POST /repos/{owner}/{repo}/pulls`, operation
//! `pulls/create`) and "List pull requests" (`GET /repos/{owner}/{repo}/pulls`). It checks
//! every request against the published description (github/rest-api-description,
//! api.github.com.json) and GitHub's required headers, answers the way GitHub does (201 and
//! a pull-request object; 422 `Validation Failed`; 401 `Bad credentials`; 403 rate limits),
//! and records each broken rule in words, so tests can assert there were none.
//!
//! Stricter than GitHub in one place: the description does not say
//! `additionalProperties: false`, and GitHub ignores keys it does not know; here an unknown
//! key is a violation and a 422, because a key the API does not read is a client bug.
//!
//! ```no_run
//! use testkit::fake_github::FakeGithub;
//! let gh = FakeGithub::start("ghp_test");
//! // point the brain at gh.url() as its GitHub API base, deliver, then:
//! assert!(gh.violations().is_empty(), "{:?}", gh.violations());
//! assert_eq!(gh.pulls()[0].head_ref, "tether/t-1");
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};
use shared::locks::Lock;

use crate::git_server::git;
use crate::http::{Options, Response, Server};

/// The login of the token's user: the author of every pull request.
pub const LOGIN: &str = "tether-bot";
/// Largest request body accepted.
const MAX_BODY: usize = 1 << 20;
/// The REST API versions GitHub offers (`X-GitHub-Api-Version`).
const API_VERSIONS: &[&str] = &["2022-11-28", "2026-03-10"];
const DOCS: &str = "https://docs.github.com/rest";
const CREATE_DOCS: &str = "https://docs.github.com/rest/pulls/pulls#create-a-pull-request";
const LIST_DOCS: &str = "https://docs.github.com/rest/pulls/pulls#list-pull-requests";
/// The request body of `pulls/create`: its properties by JSON type, and all their names.
const STRINGS: &[&str] = &["title", "head", "head_repo", "base", "body"];
const BOOLEANS: &[&str] = &["maintainer_can_modify", "draft"];
const INTEGERS: &[&str] = &["issue"];
const FIELDS: &str = "title, head, head_repo, base, body, maintainer_can_modify, draft, issue";
/// The query parameters of `pulls/list`.
const LIST_PARAMS: &[&str] = &[
    "state",
    "head",
    "base",
    "sort",
    "direction",
    "per_page",
    "page",
];
const JSON: &str = "application/json; charset=utf-8";

/// A failure to answer the next request with, instead of serving it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 401 `Bad credentials` (a revoked or expired token).
    Unauthorized,
    /// 403 `API rate limit exceeded`, with `Retry-After`, `x-ratelimit-remaining: 0` and
    /// `x-ratelimit-reset`.
    RateLimited { retry_after_secs: u64 },
    /// 500 `Server Error`.
    ServerError,
    /// 200 and an empty list (GitHub's lists can lag behind a pull request just opened).
    StaleList,
}

/// A pull request the fake holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pull {
    /// 1 for the first pull request this fake created, 2 for the next…
    pub number: u64,
    pub owner: String,
    pub repo: String,
    /// `head` as the request gave it: `branch` or `user:branch`.
    pub head: String,
    /// The branch name.
    pub head_ref: String,
    /// `user:branch`.
    pub head_label: String,
    /// The head commit, if the repository is linked ([`FakeGithub::link_repo`]).
    pub head_sha: Option<String>,
    pub base: String,
    pub title: String,
    pub body: Option<String>,
    pub draft: bool,
    pub maintainer_can_modify: bool,
    /// `open` or `closed`.
    pub state: String,
    /// `{url}/{owner}/{repo}/pull/{number}`.
    pub html_url: String,
    pub created_at: String,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct GithubRequest {
    pub method: String,
    /// E.g. `/repos/acme/app/pulls`.
    pub path: String,
    /// The raw query string, without `?`.
    pub query: String,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`Null` if empty or not JSON).
    pub body: Value,
    /// The HTTP status answered.
    pub status: u16,
}

impl GithubRequest {
    /// A header's value, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// A query parameter, percent-decoded (the last one if repeated).
    pub fn query_param(&self, name: &str) -> Option<String> {
        parse_query(&self.query)
            .into_iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

#[derive(Default)]
struct State {
    pulls: Vec<Pull>,
    faults: VecDeque<Fault>,
    requests: Vec<GithubRequest>,
    violations: Vec<String>,
    /// (owner, repo) lowercased → a bare repository whose branches are the truth.
    repos: BTreeMap<(String, String), PathBuf>,
}

struct Shared {
    token: String,
    /// `http://127.0.0.1:PORT`, set once the server listens (before any request can come).
    base: OnceLock<String>,
    state: Mutex<State>,
}

impl Shared {
    fn base(&self) -> &str {
        self.base.get().map_or("", String::as_str)
    }
}

/// A running fake GitHub API; stops when dropped.
pub struct FakeGithub {
    _server: Server,
    shared: Arc<Shared>,
}

impl FakeGithub {
    /// Starts the fake on an ephemeral loopback port; `token` is the one valid token.
    pub fn start(token: &str) -> FakeGithub {
        let shared = Arc::new(Shared {
            token: token.to_string(),
            base: OnceLock::new(),
            state: Mutex::new(State::default()),
        });
        let s = shared.clone();
        let opts = Options {
            max_body: MAX_BODY,
            ..Options::plain("fake GitHub")
        };
        let server =
            Server::start(opts, move |req| serve(&req, &s)).expect("start the fake GitHub");
        let _ = shared.base.set(format!("http://{}", server.addr()));
        FakeGithub {
            shared,
            _server: server,
        }
    }

    /// The API base, like `https://api.github.com`: `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.shared.base().to_string()
    }

    /// Queues a fault: the next request not yet given one is answered with it (FIFO).
    pub fn fail_next(&self, fault: Fault) {
        self.shared.state.locked().faults.push_back(fault);
    }

    /// Makes the bare repository `bare` (e.g. [`crate::git_server::GitServer::repo_path`])
    /// the truth for `owner/repo`: a pull request's base and head must then be branches of
    /// it with different commits (else 422, as GitHub answers), and its head sha is filled.
    pub fn link_repo(&self, owner: &str, repo: &str, bare: impl Into<PathBuf>) {
        let key = (owner.to_lowercase(), repo.to_lowercase());
        self.shared.state.locked().repos.insert(key, bare.into());
    }

    /// Closes pull request `number` (as if someone closed it on GitHub); false if none.
    pub fn close_pull(&self, number: u64) -> bool {
        let mut st = self.shared.state.locked();
        let pull = st.pulls.iter_mut().find(|p| p.number == number);
        pull.map(|p| p.state = "closed".into()).is_some()
    }

    /// The pull requests created so far, in order.
    pub fn pulls(&self) -> Vec<Pull> {
        self.shared.state.locked().pulls.clone()
    }

    /// Every request received so far, in the order they were answered.
    pub fn requests(&self) -> Vec<GithubRequest> {
        self.shared.state.locked().requests.clone()
    }

    /// Every broken rule so far, in words: `METHOD TARGET: what was wrong`.
    pub fn violations(&self) -> Vec<String> {
        self.shared.state.locked().violations.clone()
    }
}

/// A status, extra headers and a JSON body.
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Value,
}

impl Answer {
    fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body,
        }
    }
}

/// GitHub's error shape: message, documentation_url, status (a string).
fn error(status: u16, message: &str, docs: &str) -> Answer {
    Answer::json(
        status,
        json!({"message": message, "documentation_url": docs, "status": status.to_string()}),
    )
}

/// 422 `Validation Failed`: `field` of the pull request is invalid.
fn invalid_field(field: &str) -> Answer {
    validation_failed(
        json!({"resource": "PullRequest", "field": field, "code": "invalid"}),
        CREATE_DOCS,
    )
}

/// 422 `Validation Failed` with one error object.
fn validation_failed(err: Value, docs: &str) -> Answer {
    Answer::json(
        422,
        json!({"message": "Validation Failed", "errors": [err], "documentation_url": docs,
               "status": "422"}),
    )
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Rate-limit headers as GitHub sends them on every answer.
fn rate_headers(remaining: u64, reset_in: u64) -> Vec<(&'static str, String)> {
    vec![
        ("x-ratelimit-limit", "5000".into()),
        ("x-ratelimit-remaining", remaining.to_string()),
        ("x-ratelimit-used", (5000 - remaining).to_string()),
        ("x-ratelimit-reset", (now_secs() + reset_in).to_string()),
        ("x-ratelimit-resource", "core".into()),
    ]
}

/// One request as the handlers see it.
struct Req<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    headers: &'a BTreeMap<String, String>,
    raw: &'a [u8],
}

/// Answers one request and records it.
fn serve(http: &crate::http::Request, s: &Shared) -> Response {
    let headers: BTreeMap<String, String> = http.headers.iter().cloned().collect();
    let req = Req {
        method: &http.method,
        path: http.path(),
        query: http.query(),
        headers: &headers,
        raw: &http.body,
    };
    let mut violations = Vec::new();
    let answer = answer(s, &req, &mut violations);
    let mut st = s.state.locked();
    let (method, target) = (&http.method, &http.target);
    let said = violations
        .into_iter()
        .map(|v| format!("{method} {target}: {v}"));
    st.violations.extend(said);
    st.requests.push(GithubRequest {
        method: method.clone(),
        path: req.path.to_string(),
        query: req.query.to_string(),
        body: serde_json::from_slice(&http.body).unwrap_or(Value::Null),
        headers: headers.clone(),
        status: answer.status,
    });
    drop(st);
    let mut out = Response::new(answer.status, answer.body.to_string())
        .header("Content-Type", JSON)
        .header("X-GitHub-Media-Type", "github.v3; format=json")
        .header("X-GitHub-Request-Id", format!("FAKE:{}", now_secs()));
    let limited = answer
        .headers
        .iter()
        .any(|(k, _)| k.starts_with("x-ratelimit"));
    if !limited {
        for (k, v) in rate_headers(4999, 3600) {
            out = out.header(k, v);
        }
    }
    for (k, v) in answer.headers {
        out = out.header(k, v);
    }
    out
}

/// Decides the answer to a request; pushes what it broke onto `v`.
fn answer(s: &Shared, req: &Req, v: &mut Vec<String>) -> Answer {
    let headers = req.headers;
    let no_agent = headers.get("user-agent").is_none_or(|a| a.is_empty());
    if no_agent {
        v.push("no User-Agent header: GitHub refuses requests without one (403)".into());
    }
    let versions = API_VERSIONS.join(", ");
    let version = headers.get("x-github-api-version");
    let bad_version = version.filter(|ver| !API_VERSIONS.contains(&ver.as_str()));
    if let Some(ver) = bad_version {
        v.push(format!(
            "X-GitHub-Api-Version {ver:?} is none of {versions}"
        ));
    }
    let accepted = ["application/vnd.github", "application/json", "*/*"];
    if let Some(accept) = headers.get("accept")
        && !accepted.iter().any(|a| accept.contains(a))
    {
        v.push(format!("Accept {accept:?} takes no JSON"));
    }
    if let Some(fault) = s.state.locked().faults.pop_front() {
        return fault_answer(fault);
    }
    if no_agent {
        return error(
            403,
            "Request forbidden by administrative rules. Please make sure your request has a \
             User-Agent header (https://docs.github.com/rest/overview/resources-in-the-rest-api#user-agent-required). \
             Check https://developer.github.com for other possible causes.",
            DOCS,
        );
    }
    if let Some(ver) = bad_version {
        let msg = format!(
            "Unsupported 'X-GitHub-Api-Version' header: '{ver}'. The supported versions are: \
             {versions}"
        );
        return error(
            400,
            &msg,
            "https://docs.github.com/rest/about-the-rest-api/api-versions",
        );
    }
    match headers.get("authorization").map(|a| token_of(a)) {
        None => return error(401, "Requires authentication", DOCS),
        Some(t) if t != Some(s.token.as_str()) => return error(401, "Bad credentials", DOCS),
        Some(_) => {}
    }
    let segs: Vec<&str> = req.path.trim_start_matches('/').split('/').collect();
    match (req.method, segs.as_slice()) {
        ("POST", ["repos", owner, repo, "pulls"]) => create(s, owner, repo, req, v),
        ("GET", ["repos", owner, repo, "pulls"]) => list(s, owner, repo, req.query, v),
        _ => error(404, "Not Found", DOCS),
    }
}

/// The token of `Bearer X` or `token X`; None for any other scheme.
fn token_of(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
        .then(|| token.trim())
}

fn fault_answer(fault: Fault) -> Answer {
    match fault {
        Fault::Unauthorized => error(401, "Bad credentials", DOCS),
        Fault::ServerError => error(500, "Server Error", DOCS),
        Fault::StaleList => Answer::json(200, json!([])),
        Fault::RateLimited { retry_after_secs } => {
            let mut a = error(
                403,
                "API rate limit exceeded for user ID 1. If you reach out to GitHub Support for \
                 help, please include the request ID FAKE and timestamp now.",
                "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
            );
            a.headers = rate_headers(0, retry_after_secs);
            a.headers
                .push(("Retry-After", retry_after_secs.to_string()));
            a
        }
    }
}

/// The JSON type of a `pulls/create` property; None for a key it does not have.
fn field_type(key: &str) -> Option<&'static str> {
    [
        (STRINGS, "string"),
        (BOOLEANS, "boolean"),
        (INTEGERS, "integer"),
    ]
    .into_iter()
    .find_map(|(keys, ty)| keys.contains(&key).then_some(ty))
}

/// Whether `value` has the JSON-schema type `ty`.
fn has_type(value: &Value, ty: &str) -> bool {
    match ty {
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => {
            value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// The body of a `pulls/create`, checked against its schema as GitHub checks it (what is
/// wrong goes to `v`, the violations): the object, or GitHub's answer refusing it.
fn create_body(req: &Req, v: &mut Vec<String>) -> Result<serde_json::Map<String, Value>, Answer> {
    if let Some(ct) = req.headers.get("content-type")
        && !ct.starts_with("application/json")
    {
        v.push(format!("Content-Type {ct:?} is not JSON"));
    }
    let obj = match serde_json::from_slice::<Value>(req.raw) {
        Ok(Value::Object(o)) => o,
        wrong => {
            v.push(match wrong {
                Ok(other) => format!("the body is not a JSON object: {other}"),
                Err(e) => format!("the body is not JSON ({e})"),
            });
            return Err(error(400, "Problems parsing JSON", CREATE_DOCS));
        }
    };
    let mut problems = Vec::new();
    for (k, val) in &obj {
        match field_type(k) {
            None => {
                v.push(format!("unknown field {k:?}: pulls/create takes {FIELDS}"));
                problems.push(format!("\"{k}\" is not a permitted key."));
            }
            Some(ty) if !has_type(val, ty) => {
                let shown = match val {
                    Value::Null => "nil".to_string(),
                    other => other.to_string(),
                };
                v.push(format!("field {k:?} is {shown}, the schema wants a {ty}"));
                problems.push(format!("For 'properties/{k}', {shown} is not a {ty}."));
            }
            Some(_) => {}
        }
    }
    let missing: Vec<&str> = ["head", "base"]
        .into_iter()
        .filter(|k| !obj.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        v.push(format!("required field(s) missing: {}", missing.join(", ")));
        let quoted: Vec<String> = missing.iter().map(|k| format!("\"{k}\"")).collect();
        problems.push(if quoted.len() == 1 {
            format!("{} wasn't supplied.", quoted[0])
        } else {
            format!("{} weren't supplied.", quoted.join(", "))
        });
    }
    if let Some(hr) = obj.get("head_repo").and_then(Value::as_str)
        && hr.split('/').filter(|p| !p.is_empty()).count() != 2
    {
        v.push(format!("head_repo {hr:?} is not owner/name"));
        problems.push(format!("\"{hr}\" is not a repo.nwo."));
    }
    if !problems.is_empty() {
        return Err(error(
            422,
            &format!("Invalid request.\n\n{}", problems.join("\n")),
            CREATE_DOCS,
        ));
    }
    Ok(obj)
}

/// `POST /repos/{owner}/{repo}/pulls`.
fn create(s: &Shared, owner: &str, repo: &str, req: &Req, v: &mut Vec<String>) -> Answer {
    let obj = match create_body(req, v) {
        Ok(obj) => obj,
        Err(answer) => return answer,
    };
    let str_of = |k: &str| obj.get(k).and_then(Value::as_str);
    let issue = obj.get("issue").and_then(Value::as_f64);
    let title = match (str_of("title"), issue) {
        (Some(t), _) => t.to_string(),
        (None, Some(n)) => format!("issue #{n}"),
        (None, None) => {
            v.push(
                "no title and no issue: pulls/create needs a title unless issue is given".into(),
            );
            return validation_failed(
                json!({"resource": "PullRequest", "code": "missing_field", "field": "title"}),
                CREATE_DOCS,
            );
        }
    };
    let head = str_of("head").unwrap_or_default();
    let base = str_of("base").unwrap_or_default();
    let (head_owner, head_ref) = head.split_once(':').unwrap_or((owner, head));
    let label = format!("{head_owner}:{head_ref}");
    for (field, value) in [("head", head_ref), ("base", base)] {
        if value.is_empty() {
            return invalid_field(field);
        }
    }
    let same_repo = head_owner.eq_ignore_ascii_case(owner);
    let linked = s
        .state
        .locked()
        .repos
        .get(&(owner.to_lowercase(), repo.to_lowercase()))
        .cloned();
    let mut head_sha = None;
    if let Some(bare) = &linked {
        let Some(base_sha) = branch_sha(bare, base) else {
            return invalid_field("base");
        };
        if same_repo {
            let Some(sha) = branch_sha(bare, head_ref) else {
                return invalid_field("head");
            };
            if sha == base_sha {
                return no_commits(base, &label);
            }
            head_sha = Some(sha);
        }
    } else if same_repo && head_ref == base {
        return no_commits(base, &label);
    }
    let mut st = s.state.locked();
    let same = |p: &&Pull| {
        p.owner.eq_ignore_ascii_case(owner)
            && p.repo.eq_ignore_ascii_case(repo)
            && p.head_label.eq_ignore_ascii_case(&label)
            && p.base == base
            && p.state == "open"
    };
    if st.pulls.iter().any(|p| same(&p)) {
        return validation_failed(
            json!({"resource": "PullRequest", "code": "custom",
                   "message": format!("A pull request already exists for {label}.")}),
            CREATE_DOCS,
        );
    }
    let number = st.pulls.len() as u64 + 1;
    let pull = Pull {
        number,
        owner: owner.to_string(),
        repo: repo.to_string(),
        head: head.to_string(),
        head_ref: head_ref.to_string(),
        head_label: label,
        head_sha,
        base: base.to_string(),
        title,
        body: str_of("body").map(str::to_string),
        draft: obj.get("draft").and_then(Value::as_bool).unwrap_or(false),
        maintainer_can_modify: obj
            .get("maintainer_can_modify")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        state: "open".into(),
        html_url: format!("{}/{owner}/{repo}/pull/{number}", s.base()),
        created_at: iso_time(now_secs()),
    };
    st.pulls.push(pull.clone());
    let mut a = Answer::json(201, pull_json(s.base(), &pull));
    a.headers.push((
        "Location",
        format!("{}/repos/{owner}/{repo}/pulls/{number}", s.base()),
    ));
    a
}

fn no_commits(base: &str, label: &str) -> Answer {
    let head_ref = label.split_once(':').map_or(label, |(_, r)| r);
    validation_failed(
        json!({"resource": "PullRequest", "code": "custom",
               "message": format!("No commits between {base} and {head_ref}")}),
        CREATE_DOCS,
    )
}

/// `GET /repos/{owner}/{repo}/pulls`: filtered by state, head (`user:ref-name`) and base;
/// newest first unless `direction=asc`; paged by `per_page` (default 30, at most 100).
fn list(s: &Shared, owner: &str, repo: &str, query: &str, v: &mut Vec<String>) -> Answer {
    let params = parse_query(query);
    for (k, _) in &params {
        if !LIST_PARAMS.contains(&k.as_str()) {
            v.push(format!("unknown query parameter {k:?}"));
        }
    }
    let get = |k: &str| {
        params
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, val)| val.as_str())
    };
    let state = get("state").unwrap_or("open");
    if !["open", "closed", "all"].contains(&state) {
        v.push(format!("state {state:?} is not open, closed or all"));
        return validation_failed(
            json!({"value": state, "resource": "Issue", "field": "state", "code": "invalid"}),
            LIST_DOCS,
        );
    }
    let head = match get("head") {
        Some(h) if h.contains(':') => Some(h),
        Some(h) => {
            v.push(format!(
                "head filter {h:?} is not user:ref-name: GitHub ignores it and lists every pull request"
            ));
            None
        }
        None => None,
    };
    let base = get("base");
    let num = |k: &str, default: usize| get(k).and_then(|n| n.parse().ok()).unwrap_or(default);
    let (per_page, page) = (num("per_page", 30).clamp(1, 100), num("page", 1).max(1));
    let st = s.state.locked();
    let mut found: Vec<&Pull> = st
        .pulls
        .iter()
        .filter(|p| p.owner.eq_ignore_ascii_case(owner) && p.repo.eq_ignore_ascii_case(repo))
        .filter(|p| state == "all" || p.state == state)
        .filter(|p| {
            head.is_none_or(|h| {
                let (u, r) = h.split_once(':').unwrap_or_default();
                let (pu, pr) = p.head_label.split_once(':').unwrap_or_default();
                u.eq_ignore_ascii_case(pu) && r == pr
            })
        })
        .filter(|p| base.is_none_or(|b| p.base == b))
        .collect();
    if get("direction") != Some("asc") {
        found.reverse();
    }
    let items: Vec<Value> = found
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|p| pull_json(s.base(), p))
        .collect();
    Answer::json(200, Value::Array(items))
}

/// A pull request in GitHub's `pull-request` shape (the fields clients read; counters and
/// reviewers at their empty values).
fn pull_json(base: &str, p: &Pull) -> Value {
    let api = format!("{base}/repos/{}/{}", p.owner, p.repo);
    let user = |login: &str| {
        json!({"login": login, "id": 1, "node_id": "U_fake", "type": "User", "site_admin": false,
               "url": format!("{base}/users/{login}"), "html_url": format!("{base}/{login}")})
    };
    let side = |owner: &str, branch: &str, sha: &Option<String>| {
        json!({"label": format!("{owner}:{branch}"), "ref": branch, "sha": sha, "user": user(owner),
               "repo": {"id": 1, "node_id": "R_fake", "name": p.repo, "private": false,
                        "full_name": format!("{owner}/{}", p.repo), "owner": user(owner),
                        "url": format!("{base}/repos/{owner}/{}", p.repo),
                        "html_url": format!("{base}/{owner}/{}", p.repo)}})
    };
    let head_owner = p
        .head_label
        .split_once(':')
        .map_or(p.owner.as_str(), |(u, _)| u);
    let closed_at = (p.state == "closed").then(|| p.created_at.clone());
    let n = p.number;
    json!({
        "url": format!("{api}/pulls/{n}"), "id": 1000 + n, "node_id": format!("PR_fake{n}"),
        "html_url": p.html_url, "diff_url": format!("{}.diff", p.html_url),
        "patch_url": format!("{}.patch", p.html_url), "issue_url": format!("{api}/issues/{n}"),
        "commits_url": format!("{api}/pulls/{n}/commits"),
        "comments_url": format!("{api}/issues/{n}/comments"),
        "number": n, "state": p.state, "locked": false, "title": p.title, "user": user(LOGIN),
        "body": p.body, "labels": [], "milestone": null, "created_at": p.created_at,
        "updated_at": p.created_at, "closed_at": closed_at, "merged_at": null,
        "merge_commit_sha": null, "assignee": null, "assignees": [], "requested_reviewers": [],
        "head": side(head_owner, &p.head_ref, &p.head_sha), "base": side(&p.owner, &p.base, &None),
        "author_association": "OWNER", "auto_merge": null, "draft": p.draft, "merged": false,
        "mergeable": null, "mergeable_state": "unknown", "merged_by": null,
        "maintainer_can_modify": p.maintainer_can_modify, "comments": 0, "commits": 1,
    })
}

/// The commit a branch of a bare repository points at.
fn branch_sha(bare: &std::path::Path, branch: &str) -> Option<String> {
    let out = git()
        .arg("--git-dir")
        .arg(bare)
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("refs/heads/{branch}^{{commit}}"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `a=1&b=x%3Ay` → [("a","1"), ("b","x:y")] (`+` is a space).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, val) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(val))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if let Some(h) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok()) =>
            {
                out.push(h);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Seconds since the epoch as `2024-01-31T12:00:00Z`.
fn iso_time(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_and_queries_read_like_github() {
        assert_eq!(super::iso_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::iso_time(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(
            super::percent_decode("acme%3Atether%2Ft-1+x%2"),
            "acme:tether/t-1 x%2"
        );
    }
}
