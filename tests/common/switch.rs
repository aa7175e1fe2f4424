//! The switch under test: pvswitchd as a process of the test's (`Switch`), its configuration
//! (`PortSpec`), and asking it through the protocol's client: typed (`ask`, `port_info`,
//! `ports`, `stats`, `rxq`, `fdb`, ...: each reply as its own type from `pvswitch::proto`), or
//! as JSON (`ctl`, `try_ctl`: for tests of the wire format itself and of error messages).

#[allow(unused_imports)]
use super::*;
#[allow(unused_imports)]
pub use pvswitch::datapath::counters::DropReason;
#[allow(unused_imports)]
use pvswitch::proto::{
    ConntrackReply, Counters, Drops, FdbEntry, FlowsReply, MirrorInfo, PortInfo, ReloadReply, Request, RxqInfo,
    StatsReply, ThreadStats, TraceReply, VtepInfo,
};
#[allow(unused_imports)]
use serde_json::{Value, json};
#[allow(unused_imports)]
use std::io::{Read, Write};
#[allow(unused_imports)]
use std::path::{Path, PathBuf};
#[allow(unused_imports)]
use std::process::{Child, ChildStdin, Command, Stdio};
#[allow(unused_imports)]
use std::sync::{Arc, Mutex};
#[allow(unused_imports)]
use std::time::{Duration, Instant};

#[derive(Clone)]
pub struct PortSpec {
    pub name: String,
    pub mode: &'static str,
    pub queues: u16,
    pub mtu: u32,
}

impl PortSpec {
    pub fn server(name: &str) -> PortSpec {
        PortSpec { name: name.into(), mode: "server", queues: 1, mtu: 1500 }
    }
    pub fn queues(mut self, q: u16) -> PortSpec {
        self.queues = q;
        self
    }
    pub fn mtu(mut self, m: u32) -> PortSpec {
        self.mtu = m;
        self
    }
    pub fn client(mut self) -> PortSpec {
        self.mode = "client";
        self
    }
}

pub struct Switch {
    pub child: Child,
    pub dir: PathBuf,
    pub ctl: PathBuf,
    /// A command pvswitchd runs under (e.g. `setpriv` with the unit's capabilities), at every
    /// start and restart; empty: none.
    pub wrap: Vec<String>,
}

/// `setpriv` arguments that run a command with exactly the capabilities the shipped unit
/// gives pvswitchd (its `CapabilityBoundingSet=`, read from dist/pvswitchd.service.in).
pub fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dist/pvswitchd.service.in")).unwrap();
    let caps = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("the unit's capabilities");
    let set: Vec<String> =
        caps.split_whitespace().map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())).collect();
    vec![
        "setpriv".into(),
        format!("--bounding-set=-all,{}", set.join(",")),
        "--inh-caps=-all".into(),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

fn pvswitchd_cmd(wrap: &[String]) -> Command {
    let mut c = match wrap.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(env!("CARGO_BIN_EXE_pvswitchd"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_pvswitchd")),
    };
    c.env("RUST_LOG", "info");
    c
}

impl Switch {
    pub fn start(name: &str, cores: &[usize], ports: &[PortSpec]) -> Switch {
        Switch::start_with(name, cores, ports, "")
    }

    /// A configuration file's text: `[switch]` with `extra_switch` appended, then the ports.
    pub fn config_text(dir: &Path, cores: &[usize], ports: &[PortSpec], extra_switch: &str) -> String {
        let mut cfg = format!(
            "[switch]\npoll_cores = {cores:?}\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n{extra_switch}\n",
            dir.display()
        );
        for p in ports {
            cfg += &format!(
                "[[port]]\nname = \"{}\"\ntype = \"vhost-user\"\nsocket = \"{}.sock\"\nmode = \"{}\"\nqueues = {}\nmtu = {}\n",
                p.name, p.name, p.mode, p.queues, p.mtu
            );
        }
        cfg
    }

    pub fn start_with(name: &str, cores: &[usize], ports: &[PortSpec], extra_switch: &str) -> Switch {
        let dir = test_dir(name);
        Switch::start_config(dir.clone(), &Switch::config_text(&dir, cores, ports, extra_switch))
    }

    /// Starts pvswitchd on a configuration file with this text, written to `dir/pvswitch.toml`.
    pub fn start_config(dir: PathBuf, text: &str) -> Switch {
        Switch::start_wrapped(dir, text, Vec::new())
    }

    /// Like `start_config`, pvswitchd running under the command `wrap` (see `Switch::wrap`).
    pub fn start_wrapped(dir: PathBuf, text: &str, wrap: Vec<String>) -> Switch {
        let conf = dir.join("pvswitch.toml");
        std::fs::write(&conf, text).unwrap();
        let log = std::fs::File::create(dir.join("pvswitchd.log")).unwrap();
        let child = pvswitchd_cmd(&wrap)
            .arg("--config")
            .arg(&conf)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn pvswitchd");
        let sw = Switch { child, ctl: dir.join("ctl.sock"), dir, wrap };
        wait_for("pvswitchd control socket", || sw.try_ctl("version").ok());
        sw
    }

    /// Stops this pvswitchd (SIGKILL if `kill`, else SIGTERM and wait for it) and starts a new
    /// one on the same configuration file at once, as a service manager would; the new one's
    /// log is appended to the same file. Returns when its control socket answers.
    pub fn restart(&mut self, kill: bool) {
        if kill {
            let _ = self.child.kill();
        } else {
            // SAFETY: sending SIGTERM to our own child process.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
        let log = std::fs::OpenOptions::new().append(true).open(self.dir.join("pvswitchd.log")).unwrap();
        self.child = pvswitchd_cmd(&self.wrap)
            .arg("--config")
            .arg(self.dir.join("pvswitch.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn pvswitchd");
        wait_for("the new pvswitchd's control socket", || self.try_ctl("version").ok());
    }

    pub fn sock(&self, port: &str) -> String {
        self.dir.join(format!("{port}.sock")).display().to_string()
    }

    /// Rewrites the configuration file (then `ctl("reload")` applies it).
    pub fn write_config(&self, text: &str) {
        std::fs::write(self.dir.join("pvswitch.toml"), text).unwrap();
    }

    pub fn try_ctl(&self, cmd: &str) -> Result<Value, String> {
        self.try_ctl_args(cmd, &[])
    }

    /// Asks `cmd ARGS...` through the protocol's client (`pvswitch::proto::Client`): the reply
    /// as JSON, or the request's error message (the client's own for a request it cannot
    /// make, as pvswitchctl's).
    pub fn try_ctl_args(&self, cmd: &str, args: &[&str]) -> Result<Value, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let req = pvswitch::proto::Request::from_parts(cmd, &args)?;
        pvswitch::proto::Client::new(&self.ctl).ask(&req).map_err(|e| e.message)
    }

    /// Asks `req` and reads the reply as its own type (`PortInfo`, `Stats`, ...).
    pub fn ask<T: serde::de::DeserializeOwned>(&self, req: &pvswitch::proto::Request) -> T {
        self.try_ask(req).unwrap_or_else(|e| panic!("{req:?}: {e}\nlog:\n{}", self.log()))
    }

    /// Asks `req`: the reply as its own type, or the request's error message.
    pub fn try_ask<T: serde::de::DeserializeOwned>(&self, req: &pvswitch::proto::Request) -> Result<T, String> {
        pvswitch::proto::Client::new(&self.ctl).ask(req).map_err(|e| e.message)
    }

    /// Asks `cmd ARGS...` (as pvswitchctl's words): the reply as its own type.
    pub fn ask_args<T: serde::de::DeserializeOwned>(&self, cmd: &str, args: &[&str]) -> T {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let req = Request::from_parts(cmd, &args).unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
        self.ask(&req)
    }

    pub fn ctl(&self, cmd: &str) -> Value {
        self.try_ctl(cmd).unwrap_or_else(|e| panic!("pvswitchctl {cmd}: {e}\nlog:\n{}", self.log()))
    }

    /// One port as JSON (`ports`' entry of that name). Prefer `port_info`.
    pub fn port(&self, name: &str) -> Value {
        let ports = self.ctl("ports");
        ports.as_array().unwrap().iter().find(|p| p["name"] == name).cloned().unwrap()
    }

    /// One counter of a port as JSON names it. Prefer `counters(port).FIELD`.
    pub fn counter(&self, port: &str, field: &str) -> u64 {
        self.port(port)[field].as_u64().unwrap()
    }

    /// `ports NAME`: one port (panics if there is none of that name).
    pub fn port_info(&self, name: &str) -> PortInfo {
        self.ask(&Request::Port { name: name.to_string() })
    }

    /// `ports NAME`: one port, or the error (`no port "NAME"`).
    pub fn try_port_info(&self, name: &str) -> Result<PortInfo, String> {
        self.try_ask(&Request::Port { name: name.to_string() })
    }

    /// `ports`: every port, by id.
    pub fn ports(&self) -> Vec<PortInfo> {
        self.ask(&Request::Ports)
    }

    /// One port's counters (`ports NAME`, summed over the poll threads).
    pub fn counters(&self, port: &str) -> Counters {
        self.port_info(port).counters
    }

    /// `stats`: every poll thread.
    pub fn stats(&self) -> StatsReply {
        self.ask(&Request::Stats { clear: false })
    }

    /// `stats`' entry for poll thread `i` (the `i`th in the reply).
    pub fn thread_stats(&self, i: usize) -> ThreadStats {
        let mut st = self.stats();
        assert!(i < st.threads.len(), "no poll thread {i}: {}", st.json());
        st.threads.swap_remove(i)
    }

    /// `rxq`: every receive queue.
    pub fn rxq(&self) -> Vec<RxqInfo> {
        self.ask(&Request::Rxq)
    }

    /// `fdb`: the learned MAC addresses.
    pub fn fdb(&self) -> Vec<FdbEntry> {
        self.ask(&Request::Fdb)
    }

    /// `flows`: the flow table.
    pub fn flows(&self) -> FlowsReply {
        self.ask(&Request::Flows)
    }

    /// `trace FIELDS`: which flow such a frame hits.
    pub fn trace(&self, fields: &str) -> TraceReply {
        self.ask(&Request::Trace { fields: fields.to_string() })
    }

    /// `vteps`: each VTEP as its control plane reads it.
    pub fn vteps(&self) -> Vec<VtepInfo> {
        self.ask(&Request::Vteps)
    }

    /// `mirrors`: each mirror as it runs.
    pub fn mirrors(&self) -> Vec<MirrorInfo> {
        self.ask(&Request::Mirrors)
    }

    /// `conntrack [PORT]`: the connections tracked.
    pub fn conntrack(&self, port: Option<&str>) -> ConntrackReply {
        self.ask(&Request::Conntrack { port: port.map(String::from) })
    }

    /// `reload`: what changed (panics if refused).
    pub fn reload(&self) -> ReloadReply {
        self.ask(&Request::Reload)
    }

    /// `reload`: what changed, or why it was refused.
    pub fn try_reload(&self) -> Result<ReloadReply, String> {
        self.try_ask(&Request::Reload)
    }

    /// Waits until every queue of `port` that the frontend enabled is running.
    pub fn wait_running(&self, port: &str, queue_pairs: usize) {
        wait_for(&format!("port {port} running {queue_pairs} queue pairs"), || {
            let p = self.port_info(port);
            let running = p.queues.iter().filter(|q| q.running == Some(true)).count();
            (running >= 2 * queue_pairs).then_some(())
        });
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pvswitchd.log")).unwrap_or_default()
    }

    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap().count()
    }

    /// The daemon's open files.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).unwrap().count()
    }

    /// The daemon's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

/// A reply shown as the daemon sends it, for failure messages: JSON (`{:#}`: pretty).
pub struct Shown<'a, T: serde::Serialize + ?Sized>(&'a T);

impl<T: serde::Serialize + ?Sized> std::fmt::Display for Shown<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let v = serde_json::to_value(self.0).map_err(|_| std::fmt::Error)?;
        if f.alternate() { write!(f, "{v:#}") } else { write!(f, "{v}") }
    }
}

/// `.json()`: a typed reply shown as JSON in a failure message (`"{}", port.json()`).
pub trait ShowJson: serde::Serialize {
    fn json(&self) -> Shown<'_, Self> {
        Shown(self)
    }
}

impl<T: serde::Serialize + ?Sized> ShowJson for T {}

/// A drop reason's name on the wire (`rx_ring_full`).
pub fn drop_name(why: DropReason) -> &'static str {
    pvswitch::datapath::counters::DROP_REASONS[why as usize].0
}

/// The drop reasons that counted something, by their names on the wire, in `DropReason` order.
pub fn nonzero_drops(d: &Drops) -> Vec<(&'static str, u64)> {
    pvswitch::datapath::counters::DROP_REASONS
        .iter()
        .zip(d.0)
        .filter(|(_, n)| *n > 0)
        .map(|((k, _), n)| (*k, n))
        .collect()
}

impl Drop for Switch {
    fn drop(&mut self) {
        // SAFETY: sending SIGTERM to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
