//! The vhost-user backend of one port: the control-plane half. It answers the frontend's
//! requests, one whole message at a time (`msg` parses them; the control loop, which owns the
//! socket, frames them), and starts, stops and remaps the port's rings, which the poll threads
//! then serve.
//!
//! One `PortBackend` lives for one connection; a reconnect gets a fresh one, so no state from
//! an earlier VM survives into the next.
#![forbid(unsafe_code)]

pub mod msg;

use std::fs::File;
use std::sync::Arc;

use crate::mem::{GuestMem, MemLimits, RegionDesc};
use crate::port::Port;
use crate::vring::call::is_eventfd;
use crate::vring::log::DirtyLog;
use crate::vring::{CallFd, MAX_QUEUE_SIZE, ring_addrs};
use crate::wire::MacAddr;
use crate::wire::virtio_net::Negotiated;
use crate::wire::virtio_net::{self, feature};
use msg::{Header, Request, VringFd};

/// The vhost-user transport's own feature bit: the protocol-features handshake is offered.
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// vhost's own feature bit: log every write to guest memory in the dirty log (live migration).
pub const VHOST_F_LOG_ALL: u64 = 1 << 26;

/// What pvswitchd offers every frontend. IN_ORDER: chains are popped, and completed, strictly
/// in ring order on both queues. CTRL_VQ is offered because MQ requires it; the frontend
/// (QEMU) serves the control queue itself and never hands it to a backend. LOG_ALL: live
/// migration (the dirty log); GUEST_ANNOUNCE: a migrated guest announces its own addresses
/// (through the control queue, which the frontend serves).
pub const OFFERED_FEATURES: u64 = feature::VERSION_1
    | VHOST_F_LOG_ALL
    | feature::GUEST_ANNOUNCE
    | feature::IN_ORDER
    | feature::MRG_RXBUF
    | feature::CTRL_VQ
    | feature::MQ
    | feature::RING_INDIRECT_DESC
    | feature::RING_EVENT_IDX
    | VHOST_USER_F_PROTOCOL_FEATURES;

/// Checksum and TCP segmentation offloads, both directions (with `offloads = true`, the
/// default). UFO/USO are not offered: pvswitchd does not segment UDP.
pub const OFFLOAD_FEATURES: u64 = feature::CSUM
    | feature::GUEST_CSUM
    | feature::HOST_TSO4
    | feature::HOST_TSO6
    | feature::HOST_ECN
    | feature::GUEST_TSO4
    | feature::GUEST_TSO6
    | feature::GUEST_ECN;

/// The protocol features offered: multi-queue, acks for requests that ask for one, and live
/// migration's: the dirty log as a shared-memory fd, and announcing the guest (SEND_RARP).
pub const OFFERED_PROTOCOL_FEATURES: u64 =
    msg::protocol::MQ | msg::protocol::REPLY_ACK | msg::protocol::LOG_SHMFD | msg::protocol::RARP;

/// For tests only: `PVSWITCH_TEST_NO_DIRTY_LOG=1` in pvswitchd's environment accepts the
/// dirty log but marks nothing in it, so a migration test can show that it notices the pages
/// a migration then misses. Read once.
fn marks_disabled() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("PVSWITCH_TEST_NO_DIRTY_LOG").is_some_and(|v| v == "1"))
}

/// Names of negotiated feature bits, for `pvswitchctl ports`.
pub fn feature_names(f: u64) -> Vec<String> {
    let mut v = virtio_net::feature_names(f & !(VHOST_USER_F_PROTOCOL_FEATURES | VHOST_F_LOG_ALL));
    if f & VHOST_F_LOG_ALL != 0 {
        v.push("LOG_ALL".into());
    }
    if f & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        v.push("PROTOCOL_FEATURES".into());
    }
    v
}

/// One virtqueue as the frontend set it up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VringStatus {
    pub size: u16,
    pub enabled: bool,
    /// Whether the data path serves it now.
    pub running: bool,
}

/// What one connection's frontend has negotiated and set up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    pub features: u64,
    pub memory_regions: usize,
    pub memory_bytes: u64,
    /// The NUMA node of the memory holding the first ring (None until known).
    pub numa_node: Option<usize>,
    /// By vhost-user queue index.
    pub vrings: Vec<VringStatus>,
    /// The dirty log's size while the rings log into it (LOG_ALL negotiated and a log mapped).
    pub logging: Option<u64>,
    /// SEND_RARP requests taken on this connection.
    pub rarp_requests: u64,
}

#[derive(Default)]
struct VringConf {
    size: u16,
    addrs: Option<(u64, u64, u64)>,
    base: u16,
    kicked: bool,
    kick: Option<Arc<File>>,
    enabled: bool,
    call: Option<Arc<CallFd>>,
    /// Whether the data path is serving this ring now.
    running: bool,
    /// Where its used ring is logged (SET_VRING_ADDR with VRING_F_LOG).
    log_addr: Option<u64>,
}

pub struct PortBackend {
    port: Arc<Port>,
    owner: bool,
    features: u64,
    protocol: u64,
    mem: Option<Arc<GuestMem>>,
    /// What the next memory table may map (the port's configuration, as of the last message).
    limits: MemLimits,
    /// The virtio features offered (OFFERED_FEATURES, with OFFLOAD_FEATURES unless the port
    /// turned offloads off).
    offer: u64,
    vrings: Vec<VringConf>,
    /// The dirty log (SET_LOG_BASE); used while LOG_ALL is negotiated.
    log: Option<Arc<DirtyLog>>,
    rarp_requests: u64,
}

/// The port's virtqueues (a backend only exists for a vhost-user port).
fn rings(port: &Port) -> &[crate::vring::VringLock] {
    port.queues().map_or(&[], |q| q.all())
}

impl PortBackend {
    pub fn new(port: Arc<Port>) -> PortBackend {
        let n = port.queues().map_or(0, |q| q.all().len());
        PortBackend {
            port,
            owner: false,
            features: 0,
            protocol: 0,
            mem: None,
            limits: MemLimits::NONE,
            offer: OFFERED_FEATURES | OFFLOAD_FEATURES,
            vrings: (0..n).map(|_| VringConf::default()).collect(),
            log: None,
            rarp_requests: 0,
        }
    }

    /// Sets the limits the next memory table is checked against (a table already mapped stays).
    pub fn set_limits(&mut self, limits: MemLimits) {
        self.limits = limits;
    }

    /// Whether offloads are offered (before GET_FEATURES: a connection keeps what it was offered).
    pub fn set_offloads(&mut self, on: bool) {
        self.offer = OFFERED_FEATURES | if on { OFFLOAD_FEATURES } else { 0 };
    }

    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether `addr` lies in this connection's mappings of the frontend's files: its guest
    /// memory, or its dirty log.
    pub fn mem_contains(&self, addr: usize) -> bool {
        self.mem.as_ref().is_some_and(|m| m.contains_host(addr))
            || self.log.as_ref().is_some_and(|l| l.contains_host(addr))
    }

    /// The NUMA node of the memory holding the port's first configured ring.
    fn numa_node(&self) -> Option<usize> {
        let mem = self.mem.as_ref()?;
        let (desc, _, _) = self.vrings.iter().find_map(|v| v.addrs)?;
        mem.numa_node_of(desc)
    }

    /// What the frontend has set up so far, for the switch model (`pvswitchctl ports`).
    pub fn status(&self) -> Status {
        Status {
            features: self.features,
            memory_regions: self.mem.as_ref().map_or(0, |m| m.region_count()),
            memory_bytes: self.mem.as_ref().map_or(0, |m| m.total_size()),
            numa_node: self.numa_node(),
            vrings: self
                .vrings
                .iter()
                .map(|v| VringStatus { size: v.size, enabled: v.enabled, running: v.running })
                .collect(),
            logging: self.log.as_ref().filter(|_| self.features & VHOST_F_LOG_ALL != 0).map(|l| l.len()),
            rarp_requests: self.rarp_requests,
        }
    }

    fn vring(&mut self, index: u32) -> Result<&mut VringConf, Refusal> {
        let n = self.vrings.len();
        self.vrings.get_mut(index as usize).ok_or_else(|| format!("vring index {index} out of range (port has {n})"))
    }

    fn hdr_len(&self) -> u32 {
        virtio_net::hdr_len(self.features) as u32
    }

    /// Like `reconcile`, for requests that must be refused (and the connection closed) when the
    /// ring's addresses are not in guest memory.
    fn reconcile_or_refuse(&mut self, i: usize) -> Result<(), Refusal> {
        self.reconcile(i)
    }

    /// Starts ring `i` in the data path if everything it needs has arrived, or stops it if
    /// it should no longer run. Fails only when the ring's addresses are outside guest memory
    /// (or misaligned), or its call eventfd cannot be duplicated; the ring is stopped then.
    fn reconcile(&mut self, i: usize) -> Result<(), String> {
        let protocol_negotiated = self.features & VHOST_USER_F_PROTOCOL_FEATURES != 0;
        let hdr_len = self.hdr_len();
        let mrg = self.features & feature::MRG_RXBUF != 0;
        let event_idx = self.features & feature::RING_EVENT_IDX != 0;
        let v = &self.vrings[i];
        let want = v.kicked && (v.enabled || !protocol_negotiated) && v.addrs.is_some() && v.size > 0;
        let lock = &rings(&self.port)[i];
        let mut g = lock.lock();
        if let Some(base) = g.stop() {
            self.vrings[i].base = base;
        }
        self.vrings[i].running = false;
        if !want {
            return Ok(());
        }
        let Some(mem) = self.mem.clone() else { return Ok(()) };
        let v = &self.vrings[i];
        let (d, u, a) = v.addrs.unwrap();
        let Some(addrs) = ring_addrs(&mem, v.size, d, a, u) else {
            return Err(format!("vring {i} addresses outside guest memory or misaligned"));
        };
        let call = v.call.clone();
        let kick = v.kick.clone();
        g.hdr_len = hdr_len;
        g.mrg_rxbuf = mrg;
        g.log = self
            .log
            .clone()
            .filter(|_| self.features & VHOST_F_LOG_ALL != 0 && !marks_disabled())
            .map(|l| (l, v.log_addr));
        // A guest's TX queues (odd) carry what it may send, its RX queues what it can take.
        g.offloads = if i % 2 == 1 { Negotiated::host(self.features) } else { Negotiated::guest(self.features) };
        g.start(addrs, v.base, event_idx, (call, kick), mem);
        drop(g);
        self.vrings[i].running = true;
        Ok(())
    }

    fn reconcile_all(&mut self) -> Result<(), Refusal> {
        for i in 0..self.vrings.len() {
            self.reconcile_or_refuse(i)?;
        }
        Ok(())
    }

    /// Stops every ring (the connection ended or the device was reset).
    pub fn stop_all(&mut self) {
        for (i, v) in self.vrings.iter_mut().enumerate() {
            let mut g = rings(&self.port)[i].lock();
            g.stop();
            g.broken = None;
            v.running = false;
        }
    }

    fn reset(&mut self) {
        self.stop_all();
        let (port, limits, offer) = (self.port.clone(), self.limits, self.offer);
        *self = PortBackend::new(port);
        self.limits = limits;
        self.offer = offer;
    }
}

/// A refused request: the connection closes, and the message becomes the port's last error.
type Refusal = String;

/// What `handle` makes of a message: the reply to send, if any; or the refusal, with the
/// failed ack to send first if the frontend asked for one.
pub type Handled = Result<Option<Vec<u8>>, (Refusal, Option<Vec<u8>>)>;

impl PortBackend {
    /// Answers one whole message: applies it, and returns the reply to send, if any (the
    /// request's own reply, or REPLY_ACK's when the frontend asked for one). An error refuses
    /// the request: the caller sends the reply it gets with it (a failed ack) and closes the
    /// connection.
    pub fn handle(&mut self, h: &Header, payload: &[u8], mut fds: Vec<File>) -> Handled {
        let ack = h.need_reply() && self.protocol & msg::protocol::REPLY_ACK != 0;
        let res =
            msg::parse(h, payload, fds.len()).map_err(|e| e.to_string()).and_then(|req| self.apply(req, &mut fds));
        match res {
            Ok(Some(body)) => Ok(Some(msg::reply(h, &body))),
            Ok(None) if ack => Ok(Some(msg::reply(h, &0u64.to_le_bytes()))),
            Ok(None) => Ok(None),
            Err(e) => {
                crate::frontend_log!(self.port, warn, "{}: vhost-user: {e}", self.port.name());
                Err((e, ack.then(|| msg::reply(h, &1u64.to_le_bytes()))))
            }
        }
    }

    /// Applies one request; returns its reply body, if it has one.
    fn apply(&mut self, req: Request, fds: &mut Vec<File>) -> Result<Option<Vec<u8>>, Refusal> {
        let u64_reply = |v: u64| Ok(Some(v.to_le_bytes().to_vec()));
        match req {
            Request::GetFeatures => return u64_reply(self.offer),
            Request::SetFeatures(f) => self.set_features(f)?,
            Request::SetOwner => self.set_owner()?,
            Request::ResetOwner => self.reset(),
            Request::SetMemTable(regions) => self.set_mem_table(&regions, std::mem::take(fds))?,
            Request::SetVringNum { index, num } => self.set_vring_num(index, num)?,
            Request::SetVringAddr { index, desc, used, avail, log } => {
                self.set_vring_addr(index, desc, used, avail, log)?
            }
            Request::SetLogBase { size, offset } => {
                self.set_log_base(size, offset, fds.pop())?;
                // Always answered, whether or not acks were negotiated: with the log's own
                // size and offset, which rust-vmm's frontend (cloud-hypervisor) requires and
                // QEMU, which reads any payload, accepts (DPDK answers with none, which the
                // former refuses).
                let mut body = size.to_le_bytes().to_vec();
                body.extend_from_slice(&offset.to_le_bytes());
                return Ok(Some(body));
            }
            Request::SetVringBase { index, base } => self.set_vring_base(index, base)?,
            Request::GetVringBase { index } => {
                let base = self.get_vring_base(index)?;
                return Ok(Some(msg::vring_state(index, base as u32).to_vec()));
            }
            Request::SetVringFd { which, index, fd: _ } => {
                let fd = fds.pop();
                match which {
                    VringFd::Kick => self.set_vring_kick(index, fd)?,
                    VringFd::Call => self.set_vring_call(index, fd)?,
                    VringFd::Err => {
                        self.vring(index as u32)?;
                    }
                }
            }
            Request::GetProtocolFeatures => return u64_reply(OFFERED_PROTOCOL_FEATURES),
            Request::SetProtocolFeatures(f) => {
                if f & !OFFERED_PROTOCOL_FEATURES != 0 {
                    return Err(format!("frontend acked protocol features {f:#x} we did not offer"));
                }
                self.protocol = f;
            }
            Request::GetQueueNum => return u64_reply(self.port.rx_queues() as u64),
            Request::SendRarp(mac) => self.send_rarp(MacAddr(mac))?,
            Request::SetVringEnable { index, enable } => self.set_vring_enable(index, enable)?,
            Request::Unsupported(code) => return Err(format!("request {code} is not supported")),
        }
        Ok(None)
    }

    pub fn set_owner(&mut self) -> Result<(), Refusal> {
        if self.owner {
            return Err("SET_OWNER twice".into());
        }
        self.owner = true;
        Ok(())
    }

    pub fn set_features(&mut self, features: u64) -> Result<(), Refusal> {
        if features & !self.offer != 0 {
            return Err(format!("frontend acked features {features:#x} we did not offer"));
        }
        self.features = features;
        crate::frontend_log!(self.port, info, "{}: features {}", self.port.name(), feature_names(features).join(" "));
        // Header length and notification style depend on features: restart running rings.
        self.reconcile_all()
    }

    pub fn set_mem_table(&mut self, regions: &[RegionDesc], files: Vec<File>) -> Result<(), Refusal> {
        let mem = GuestMem::map(regions, files, &self.limits).map_err(|e| e.to_string())?;
        crate::frontend_log!(
            self.port,
            info,
            "{}: memory table: {} regions, {} MiB",
            self.port.name(),
            mem.region_count(),
            mem.total_size() >> 20
        );
        // Each running ring is stopped and restarted on the new table under its lock, so no
        // poll thread ever uses the old mapping after this; the old one is unmapped when the
        // last ring lets go of it.
        self.mem = Some(Arc::new(mem));
        // A frontend that moved its memory to new addresses re-sends SET_VRING_ADDR next; until
        // then a ring whose old addresses are not in the new table stays stopped.
        for i in 0..self.vrings.len() {
            if let Err(e) = self.reconcile(i) {
                crate::frontend_log!(
                    self.port,
                    info,
                    "{}: {e}; the ring waits for its addresses in the new memory table",
                    self.port.name()
                );
            }
        }
        Ok(())
    }

    pub fn set_vring_num(&mut self, index: u32, num: u32) -> Result<(), Refusal> {
        if num == 0 || num > MAX_QUEUE_SIZE as u32 || !num.is_power_of_two() {
            return Err(format!("vring {index}: size {num} is not a power of two up to 32768"));
        }
        self.vring(index)?.size = num as u16;
        Ok(())
    }

    /// `log`: the used ring's guest address, if its writes are to be logged (VRING_F_LOG).
    pub fn set_vring_addr(
        &mut self,
        index: u32,
        desc: u64,
        used: u64,
        avail: u64,
        log: Option<u64>,
    ) -> Result<(), Refusal> {
        let v = self.vring(index)?;
        v.addrs = Some((desc, used, avail));
        v.log_addr = log;
        // Restarts a running ring at the new addresses, or starts one that waited for them.
        self.reconcile_or_refuse(index as usize)
    }

    pub fn set_vring_base(&mut self, index: u32, base: u32) -> Result<(), Refusal> {
        let v = self.vring(index)?;
        if base > u16::MAX as u32 {
            return Err(format!("vring {index}: base {base} out of range"));
        }
        v.base = base as u16;
        Ok(())
    }

    /// Stops ring `index` and returns where the next backend should start from.
    pub fn get_vring_base(&mut self, index: u32) -> Result<u16, Refusal> {
        self.vring(index)?;
        let i = index as usize;
        if let Some(base) = rings(&self.port)[i].lock().stop() {
            self.vrings[i].base = base;
        }
        let v = &mut self.vrings[i];
        v.running = false;
        v.kicked = false;
        Ok(v.base)
    }

    pub fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<(), Refusal> {
        // Kicks are suppressed in the ring while it is polled; a poll thread that goes to
        // sleep (adaptive polling) re-enables them and waits on this fd.
        if fd.as_ref().is_some_and(|f| !is_eventfd(f)) {
            return Err(format!("vring {index}: kick fd is not an eventfd"));
        }
        let v = self.vring(index as u32)?;
        v.kicked = true;
        v.kick = fd.map(Arc::new);
        self.reconcile_or_refuse(index as usize)
    }

    pub fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<(), Refusal> {
        self.vring(index as u32)?;
        let call = match fd {
            Some(f) => Some(Arc::new(CallFd::new(f, self.port.id).map_err(|e| format!("vring {index}: {e}"))?)),
            None => None,
        };
        self.vrings[index as usize].call = call.clone();
        rings(&self.port)[index as usize].lock().set_call(call);
        Ok(())
    }

    /// Maps the dirty log and restarts the rings on it (if LOG_ALL is on). A log too small for
    /// the guest's memory, or that cannot be mapped, refuses the request.
    pub fn set_log_base(&mut self, size: u64, offset: u64, fd: Option<File>) -> Result<(), Refusal> {
        if self.protocol & msg::protocol::LOG_SHMFD == 0 {
            return Err("SET_LOG_BASE without the LOG_SHMFD protocol feature".into());
        }
        let fd = fd.ok_or("SET_LOG_BASE without a log fd")?;
        let log = DirtyLog::map(size, offset, fd, &self.limits)?;
        if let Some(mem) = &self.mem
            && !log.covers(mem.gpa_end())
        {
            return Err(format!(
                "SET_LOG_BASE: a log of {size} bytes cannot cover guest memory up to {:#x}",
                mem.gpa_end()
            ));
        }
        crate::frontend_log!(self.port, info, "{}: dirty log of {} KiB", self.port.name(), size.div_ceil(1024));
        self.log = Some(Arc::new(log));
        self.reconcile_all()
    }

    /// Asks the data path to announce `mac` from this port at once (a RARP into the switch, as
    /// if the guest had sent it: port security and VLANs apply to it like to the guest's own).
    pub fn send_rarp(&mut self, mac: MacAddr) -> Result<(), Refusal> {
        if self.protocol & msg::protocol::RARP == 0 {
            return Err("SEND_RARP without the RARP protocol feature".into());
        }
        if mac.is_multicast() || mac == MacAddr::ZERO {
            return Err(format!("SEND_RARP for {mac}, which no guest can have"));
        }
        let Some(q) = self.port.queues() else { return Err("SEND_RARP on a port without queues".into()) };
        self.rarp_requests += 1;
        // Each announcement is a broadcast into the port's VLAN: a frontend sending SEND_RARP
        // in a loop gets a few, answered all the same.
        if self.port.limits.announce.admit().is_none() {
            return Ok(());
        }
        crate::frontend_log!(self.port, info, "{}: announcing {mac} (SEND_RARP)", self.port.name());
        q.announcer.request(mac);
        Ok(())
    }

    pub fn set_protocol_features(&mut self, features: u64) {
        self.protocol = features;
    }

    pub fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<(), Refusal> {
        self.vring(index)?.enabled = enable;
        self.reconcile_or_refuse(index as usize)
    }
}

impl Drop for PortBackend {
    fn drop(&mut self) {
        self.stop_all();
    }
}
