//! A headless Chromium driven through W3C WebDriver (Debian's `chromium` and
//! `chromium-driver`): `chromedriver` on a loopback port, one browser session, and the few
//! commands the web tests use (navigate, find, click, type, run a script, screenshot). The
//! protocol is JSON over HTTP/1.1 ([`crate::http::request`]).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// One request to chromedriver on `127.0.0.1:port`: the status and the JSON answer.
fn http(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let (status, out) = crate::http::request(
        port,
        method,
        path,
        "application/json",
        body.into_bytes(),
        Duration::from_secs(60),
    )
    .map_err(|e| e.to_string())?;
    Ok((status, serde_json::from_slice(&out).unwrap_or(Value::Null)))
}

/// A browser session on its own chromedriver; both end when this is dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium. Err says what is missing.
    pub fn start() -> Result<Self, String> {
        let driver_bin = ["chromedriver", "/usr/bin/chromedriver"]
            .into_iter()
            .find(|b| {
                Command::new(b)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .ok_or("chromedriver is not installed (apt-get install chromium chromium-driver)")?;
        let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .ok_or("chromium is not installed (apt-get install chromium)")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start chromedriver: {e}"))?;
        let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut b = Self {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok((200, v)) = http(port, "GET", "/status", None)
                && v["value"]["ready"] == true
            {
                break;
            }
            if Instant::now() > deadline {
                return Err("chromedriver did not become ready in 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000", format!("--user-data-dir={}", b._profile.path().display())],
            },
        }}});
        let (status, v) = http(port, "POST", "/session", Some(&caps))?;
        if status != 200 {
            return Err(format!("no browser session: {v}"));
        }
        b.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok(b)
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let (status, v) = http(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body.as_ref(),
        )?;
        if status == 200 {
            Ok(v["value"].clone())
        } else {
            Err(format!(
                "{method} {path}: {status} {}",
                v["value"]["message"]
            ))
        }
    }

    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })))
            .expect("navigate");
    }

    /// The first element matching a CSS selector.
    pub fn find(&self, css: &str) -> Option<String> {
        let v = self
            .cmd(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .ok()?;
        v[ELEMENT].as_str().map(str::to_string)
    }

    /// Clicks the element (a real click: WebDriver moves the pointer there).
    pub fn click(&self, css: &str) -> Result<(), String> {
        let id = self
            .find(css)
            .ok_or_else(|| format!("no {css} on the page"))?;
        self.cmd("POST", &format!("/element/{id}/click"), Some(json!({})))
            .map(drop)
    }

    /// Types into an input.
    pub fn type_into(&self, css: &str, text: &str) -> Result<(), String> {
        let id = self
            .find(css)
            .ok_or_else(|| format!("no {css} on the page"))?;
        self.cmd(
            "POST",
            &format!("/element/{id}/value"),
            Some(json!({ "text": text })),
        )
        .map(drop)
    }

    /// Runs a script in the page and returns what it returns.
    pub fn exec(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .unwrap_or(Value::Null)
    }

    /// The text of the first element matching a selector (empty when there is none).
    pub fn text(&self, css: &str) -> String {
        self.exec(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
            json!([css]),
        )
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// The text of the first element matching a selector as rendered: what a person sees,
    /// without what is hidden (empty when there is none).
    pub fn visible_text(&self, css: &str) -> String {
        self.exec(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
            json!([css]),
        )
        .as_str()
        .unwrap_or_default()
        .to_string()
    }

    /// Resizes the browser's window to `width` × `height` CSS pixels.
    pub fn set_size(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        )
        .expect("resize the window");
    }

    /// Whether the page is wider than its window: a horizontal scroll bar, or content cut.
    pub fn overflows(&self) -> bool {
        self.exec(
            "return document.documentElement.scrollWidth > document.documentElement.clientWidth",
            json!([]),
        ) == json!(true)
    }

    /// The page as a PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let v = self.cmd("GET", "/screenshot", None).expect("screenshot");
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .expect("a base64 PNG")
    }

    /// Waits until `f` holds, checking every 50 ms; panics with `what` after `timeout`.
    pub fn wait(&self, what: &str, timeout: Duration, mut f: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + timeout;
        while !f(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http(
                self.port,
                "DELETE",
                &format!("/session/{}", self.session),
                None,
            );
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
