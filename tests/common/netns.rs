//! Network namespaces for the tests that need a second network stack (Linux behind a NIC port,
//! a VXLAN peer, an FRR host): each made fresh under a name of its own, IPv6 off (no router
//! solicitations or MLD reports among the frames a test counts), and removed on drop, with the
//! host-side links it made, even when the test fails.

use std::process::{Command, Stdio};

/// Runs `args`; its stdout. Panics, with the command and its stderr, if it fails.
pub fn sh(args: &[&str]) -> String {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Turns IPv6 off on interface `dev` of the host's namespace.
pub fn no_ipv6(dev: &str) {
    sh(&["sysctl", "-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]);
}

/// A network namespace with its loopback up and IPv6 off on every interface made in it.
pub struct Netns {
    pub ns: String,
    /// Links in the host's namespace this one made (`veth`), removed with it.
    links: Vec<String>,
}

impl Netns {
    /// Namespace `name`, a stale one of that name (from a killed run) removed first.
    pub fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).stderr(Stdio::null()).status();
        sh(&["ip", "netns", "add", name]);
        let n = Netns { ns: name.to_string(), links: Vec::new() };
        n.ex(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]);
        n.ex(&["ip", "link", "set", "lo", "up"]);
        n
    }

    /// Runs `args` inside the namespace; its stdout (panics if it fails).
    pub fn ex(&self, args: &[&str]) -> String {
        sh(&[&["ip", "netns", "exec", &self.ns], args].concat())
    }

    /// A veth pair: `host` in the host's namespace, IPv6 off and up (a stale link of that name
    /// removed first; this one removed with the namespace), and `inner` in this namespace, down,
    /// for the caller to configure.
    pub fn veth(&mut self, host: &str, inner: &str) {
        let _ = Command::new("ip").args(["link", "del", host]).stderr(Stdio::null()).status();
        sh(&["ip", "link", "add", host, "type", "veth", "peer", "name", inner, "netns", &self.ns]);
        self.links.push(host.to_string());
        no_ipv6(host);
        sh(&["ip", "link", "set", host, "up"]);
    }

    /// Linux at the far end of a link: namespace `name` behind a veth whose host end is
    /// `host_if` (bare, for a switch's port) and whose end inside, `pvsns0`, has `addr` (a
    /// prefix) and computes checksums in software (a veth would otherwise hand TCP and UDP
    /// frames to af_packet with their checksums still to be filled in, and a guest would drop
    /// them).
    pub fn behind_veth(name: &str, host_if: &str, addr: &str) -> Netns {
        let mut n = Netns::new(name);
        n.veth(host_if, "pvsns0");
        n.ex(&["ethtool", "-K", "pvsns0", "tx", "off"]);
        n.ex(&["ip", "addr", "add", addr, "dev", "pvsns0"]);
        n.ex(&["ip", "link", "set", "pvsns0", "up"]);
        n
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = Command::new("ip").args(["link", "del", l]).stderr(Stdio::null()).status();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}
