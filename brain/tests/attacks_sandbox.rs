//! The threat model's commands route, tried as an attacker would: what a task's own command
//! can do to the kernel, to another task's commands on the same worker, and where it can
//! send a credential. Real brain and worker processes; each attack is a command a model could
//! write. Where the host lacks what a test needs, the test says why it is skipped.

use testkit::tasks::try_set_secret;
use testkit::{Cluster, text};

/// A secret may not be bound to every name under a public suffix: anyone can register a name
/// under `herokuapp.com`, `github.io` or `co.uk` and receive the credential there.
#[test]
fn a_secret_cannot_be_bound_to_a_whole_public_suffix() {
    let c = Cluster::start();
    for host in [
        "*.herokuapp.com",
        "*.co.uk",
        "*.github.io",
        "*.s3.amazonaws.com",
    ] {
        let out = try_set_secret(&c, "wide", "value", &["--host", host]);
        assert!(!out.status.success(), "{host} was accepted: {}", text(&out));
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.contains(host) && e.contains("public suffix"),
            "{host}: {e}"
        );
    }
    // A registrable domain's names are fine, at any depth.
    for host in [
        "*.example.com",
        "*.myapp.herokuapp.com",
        "*.example.co.uk",
        "api.github.io",
    ] {
        let out = try_set_secret(&c, "narrow", "value", &["--host", host]);
        assert!(out.status.success(), "{host}: {}", text(&out));
    }
}
