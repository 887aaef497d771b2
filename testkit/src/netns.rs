//! A "remote host" for tests: a network namespace with its own address, reached from the
//! test's namespace over a veth pair. Needs root and `ip`; [`Netns::create`] says why when it
//! cannot. [`Netns::cut`] takes the link down (a network partition); everything is removed on
//! drop.

use std::process::Command;

pub struct Netns {
    pub name: String,
    /// Our end of the link.
    pub host_ip: String,
    /// The namespace's address.
    pub ns_ip: String,
    veth: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (apt-get install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    pub fn create() -> Result<Self, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("network namespaces need root".into());
        }
        let n = crate::rand_u32() & 0xffffff;
        let name = format!("tt{n:06x}");
        let veth = format!("vt{n:06x}");
        let peer = format!("vp{n:06x}");
        let (a, b) = (200 + (n >> 16) % 50, (n >> 8) & 0xff);
        let c = (n & 0x3f) * 4;
        let host_ip = format!("10.{a}.{b}.{}", c + 1);
        let ns_ip = format!("10.{a}.{b}.{}", c + 2);
        ip(&["netns", "add", &name])?;
        let me = Self {
            name: name.clone(),
            host_ip: host_ip.clone(),
            ns_ip: ns_ip.clone(),
            veth: veth.clone(),
        };
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer])?;
        ip(&["link", "set", &peer, "netns", &name])?;
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &veth])?;
        ip(&["link", "set", &veth, "up"])?;
        let inside = |args: &[&str]| {
            let mut v = vec!["netns", "exec", &name, "ip"];
            v.extend_from_slice(args);
            ip(&v)
        };
        inside(&["addr", "add", &format!("{ns_ip}/30"), "dev", &peer])?;
        inside(&["link", "set", &peer, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(me)
    }

    /// `program` run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Takes the link down: the namespace can no longer be reached, nor reach out.
    pub fn cut(&self) -> Result<(), String> {
        ip(&["link", "set", &self.veth, "down"])
    }

    /// Brings the link back.
    pub fn restore(&self) -> Result<(), String> {
        ip(&["link", "set", &self.veth, "up"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.veth]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}
