//! The `ec2` provider's user data: the cloud-init document a new instance runs to install its
//! worker and join this brain (`deploy/cloud-init.yaml.tmpl`, with `deploy/install-worker.sh`
//! inside). Every value put into it is checked to be shell-safe, so no quoting is needed and
//! none can be broken.

use base64::Engine as _;

const TEMPLATE: &str = include_str!("../../../deploy/cloud-init.yaml.tmpl");
const INSTALL_SCRIPT: &[u8] = include_bytes!("../../../deploy/install-worker.sh");

/// What an instance needs to join.
#[derive(Debug, Clone)]
pub struct UserData<'a> {
    pub machine: &'a str,
    pub brain_url: &'a str,
    pub ca_hash: &'a str,
    pub token: &'a str,
    pub name: &'a str,
    pub labels: &'a std::collections::BTreeMap<String, String>,
    /// Where the instance downloads the worker binary, and its SHA-256.
    pub worker_url: &'a str,
    pub worker_sha256: &'a str,
}

/// Characters a value may have to go into the document unquoted.
fn safe(what: &str, v: &str) -> Result<(), String> {
    let ok = !v.is_empty()
        && v.len() <= 2048
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:=@+%-,".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} {v:?} cannot go into user data: use letters, digits and ._/:=@+%-,"
        ))
    }
}

/// Renders the cloud-init document.
pub fn render(u: &UserData<'_>) -> Result<String, String> {
    safe("machine id", u.machine)?;
    safe("brain URL", u.brain_url)?;
    safe("CA hash", u.ca_hash)?;
    safe("join token", u.token)?;
    safe("worker name", u.name)?;
    safe("worker URL", u.worker_url)?;
    if !(u.worker_url.starts_with("https://") || u.worker_url.starts_with("http://")) {
        return Err(format!("worker URL {:?} must be http(s)://", u.worker_url));
    }
    if u.worker_sha256.len() != 64 || !u.worker_sha256.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "worker SHA-256 {:?} must be 64 hex digits",
            u.worker_sha256
        ));
    }
    let mut labels = String::new();
    for (k, v) in u.labels {
        let l = format!("{k}={v}");
        safe("label", &l)?;
        labels.push_str(" --label ");
        labels.push_str(&l);
    }
    let script = base64::engine::general_purpose::STANDARD.encode(INSTALL_SCRIPT);
    Ok(TEMPLATE
        .replace("{{machine}}", u.machine)
        .replace("{{install_script_b64}}", &script)
        .replace("{{token}}", u.token)
        .replace("{{brain_url}}", u.brain_url)
        .replace("{{ca_hash}}", u.ca_hash)
        .replace("{{name}}", u.name)
        .replace("{{labels}}", &labels)
        .replace("{{worker_url}}", u.worker_url)
        .replace("{{worker_sha256}}", u.worker_sha256))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample<'a>(labels: &'a std::collections::BTreeMap<String, String>) -> UserData<'a> {
        UserData {
            machine: "m-0123456789ab",
            brain_url: "https://brain.example:7443",
            ca_hash: "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
            token: "tj_feedfacefeedfacefeedfacefeedfacefeedfacefeedface",
            name: "m-0123456789ab",
            labels,
            worker_url: "https://downloads.example/tether/worker-x86_64",
            worker_sha256: "aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55aa55",
        }
    }

    /// The rendered document, byte for byte, with the embedded script cut out (it has its own
    /// tests and changes on its own). `TETHER_UPDATE_SNAPSHOTS=1` rewrites the snapshot.
    #[test]
    fn user_data_matches_its_snapshot() {
        let labels = [("size".to_string(), "large".to_string())].into();
        let text = render(&sample(&labels)).unwrap();
        let script = base64::engine::general_purpose::STANDARD.encode(INSTALL_SCRIPT);
        assert!(
            text.contains(&script),
            "the install script is embedded whole"
        );
        let shown = text.replace(&script, "<install-worker.sh, base64>");
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/provision/testdata/cloud-init.snap"
        );
        if std::env::var_os("TETHER_UPDATE_SNAPSHOTS").is_some() {
            std::fs::write(path, &shown).unwrap();
        }
        let want = std::fs::read_to_string(path).expect("snapshot file");
        assert_eq!(
            shown, want,
            "the rendered user data changed; check it and update the snapshot"
        );
        assert!(!shown.contains("{{"), "a placeholder was left");
        // It is YAML that cloud-init can read, starting with its marker.
        assert!(shown.starts_with("#cloud-config\n"));
    }

    #[test]
    fn unsafe_values_are_refused() {
        let labels = Default::default();
        for (field, bad) in [
            ("token", "tj_x; rm -rf /"),
            ("url", "https://x/$(id)"),
            ("name", "a b"),
            ("brain", "https://brain:7443\n- evil"),
        ] {
            let mut u = sample(&labels);
            match field {
                "token" => u.token = bad,
                "url" => u.worker_url = bad,
                "name" => u.name = bad,
                _ => u.brain_url = bad,
            }
            assert!(render(&u).is_err(), "{field} {bad:?} was accepted");
        }
        let bad_labels = [("k".to_string(), "v w".to_string())].into();
        assert!(render(&sample(&bad_labels)).is_err());
        let mut u = sample(&labels);
        u.worker_sha256 = "abc";
        assert!(render(&u).is_err());
    }
}
