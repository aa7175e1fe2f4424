//! The model of the running switch: its ports, its poll threads, the flow table and what the
//! threads are told to work from. It holds no socket and no frontend's file descriptor: the
//! control loop (`control`) owns those and reports what happens on them here (a frontend
//! connected, a vhost-user request changed the port's rings, a connection closed). The control
//! commands (`ctl`) read and change the switch through this model.
//!
//! - this file: [`Switch`], [`PortState`], [`ThreadSlot`]; building plans and publishing them
//!   to the poll threads; adding and removing ports; starting and stopping threads.
//! - [`reload`]: applying a changed configuration file live.
//! - [`rebalance`]: moving receive queues between threads (`rebalance`, `move`, automatic).
//! - [`placement`]: the pure function that decides which thread polls which queue.
//! - [`samples`]: once-a-second samples of the counters, for rates and loads.
#![forbid(unsafe_code)]

pub mod captures;
pub mod exports;
pub mod mirrors;
pub mod placement;
pub mod portcmd;
pub mod rebalance;
pub mod reload;
pub mod samples;
pub mod secgroups;
pub mod vrfs;
pub mod vtep;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};

use crate::config::{Config, PortConfig, SocketMode};
use crate::datapath::counters::{PortTotals, RxqStats, ThreadStats, Total};
use crate::datapath::mac_table::MacTable;
use crate::datapath::mailbox::{Mailbox, Spawner, ThreadStart};
use crate::datapath::plan::{Learning, Plan, PortPolicy, PortTable, RxqSpec, Tuning};
use crate::flow::table::FlowTable;
use crate::port::nic::NicPort;
use crate::port::tunnel::Tunnel;
use crate::port::vhost::Status;
use crate::port::{Port, PortKind};
use crate::topology::Numa;
use placement::QueueId;

/// How long the control thread waits for a poll thread to adopt a plan before it warns.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(2);
/// A call eventfd write lasting this long is stuck (a normal one takes microseconds).
pub const CALL_STUCK: Duration = Duration::from_millis(5);
/// How often the watchdog looks while a poll thread is awake.
pub const WATCHDOG_EVERY: Duration = Duration::from_millis(5);

/// What the control loop does on the OS side of a port: listen on (or connect to) its
/// vhost-user socket, and close that again. The switch calls it when ports come and go
/// (start-up, reload); the control loop implements it.
pub trait Endpoints {
    /// Starts listening on or connecting to the port's socket (nothing for a dpdk port).
    fn open(&mut self, port: &PortState) -> std::io::Result<()>;
    /// Closes the port's connection and socket. Its rings are stopped when this returns.
    fn close(&mut self, id: u16);
    /// Applies the port's changed socket permissions to its bound socket, in place.
    fn update(&mut self, port: &PortState) -> std::io::Result<()>;
}

/// A connected frontend, as the control loop last saw it.
#[derive(Debug, Clone)]
pub struct Link {
    pub since: Instant,
    pub status: Status,
}

/// Everything the switch knows about one port.
pub struct PortState {
    pub port: Arc<Port>,
    /// The port's configuration as last applied (MTU, weights and port security change in place).
    pub cfg: PortConfig,
    /// The frontend connected now, if any (vhost-user ports).
    pub link: Option<Link>,
    pub connects: u64,
    pub last_error: Option<String>,
    /// Its endpoint (a server-mode socket) could not be made: the port is "failed", the
    /// reason in `last_error`.
    pub endpoint_failed: bool,
}

impl PortState {
    pub fn id(&self) -> u16 {
        self.port.id
    }

    pub fn name(&self) -> &str {
        self.port.name()
    }

    /// The NUMA node of the port's memory: a NIC's socket, or the node of the guest memory
    /// holding the rings (None until connected).
    pub fn numa_node(&self) -> Option<usize> {
        match &self.port.kind {
            PortKind::Nic(n) => n.socket_id().map(|s| s as usize),
            PortKind::VhostUser(_) => self.link.as_ref().and_then(|l| l.status.numa_node),
            PortKind::Failed | PortKind::Tunnel(_) => None,
        }
    }

    pub fn state(&self) -> &'static str {
        match (&self.port.kind, &self.link, self.cfg.vhost_user().map(|v| v.mode)) {
            (PortKind::Nic(_) | PortKind::Tunnel(_), ..) => "running",
            (PortKind::Failed, ..) => "failed",
            _ if self.endpoint_failed => "failed",
            (_, Some(_), _) => "connected",
            (_, None, Some(SocketMode::Client)) => "connecting",
            (_, None, _) => "listening",
        }
    }

    /// The data path's policy for the port (port security, VLANs, what NORMAL learns).
    fn policy(&self) -> PortPolicy {
        let learning = match self.cfg.vxlan() {
            None => Learning::Any,
            Some(v) if v.learning => Learning::NotOwned,
            Some(_) => Learning::Off,
        };
        PortPolicy {
            allowed_macs: self.cfg.allowed_macs.clone(),
            allowed_ips: self.cfg.allowed_ips.clone(),
            // Compiled against the other ports (`secgroups.rs`) as plans are made.
            rules: None,
            vlan: self.cfg.vlan.clone(),
            learning,
            // Added as plans are made (`captures.rs`, `PortTable::with_mirrors`).
            taps: Default::default(),
            mirrors: Default::default(),
            watched_src: false,
            watched_dst: false,
            traced: false,
        }
    }
}

/// One poll thread slot. A slot whose core a reload removed stays (not live), so thread indices
/// into per-thread counters never shift.
pub struct ThreadSlot {
    pub stats: Arc<ThreadStats>,
    pub mailbox: Arc<Mailbox>,
    /// Whether the slot's thread runs.
    pub live: bool,
    handle: Option<std::thread::JoinHandle<()>>,
    /// Its receive queues as (port id, queue pair).
    pub queues: Vec<QueueId>,
}

impl ThreadSlot {
    fn new(core: usize, numa: &Numa) -> ThreadSlot {
        ThreadSlot {
            stats: Arc::new(ThreadStats::new(core, numa.node_of_cpu(core), crate::config::MAX_PORTS)),
            mailbox: Arc::new(Mailbox::default()),
            live: true,
            handle: None,
            queues: Vec::new(),
        }
    }

    pub fn core(&self) -> usize {
        self.stats.core
    }
}

pub struct Switch {
    pub cfg: Config,
    /// Where `cfg` came from, re-read by reload.
    pub config_path: Option<PathBuf>,
    /// Ports by id; a removed port's slot is empty until a new port reuses it.
    pub ports: Vec<Option<PortState>>,
    pub threads: Vec<ThreadSlot>,
    pub flows: Arc<FlowTable>,
    /// Counters of every receive queue, by (port id, queue pair); they follow the queue.
    pub rxq_stats: HashMap<QueueId, Arc<RxqStats>>,
    /// Once-a-second samples for rates, and the baseline `stats --clear` set.
    pub samples: samples::Samples,
    /// When queues were last rebalanced automatically (or the switch started).
    pub last_rebalance: Instant,
    pub mac: Arc<MacTable>,
    pub started: Instant,
    /// Starts a poll thread (set by pvswitchd's main).
    pub spawner: Option<Spawner>,
    /// What VTEPs learned at run time from their control plane (`vtep-sync`).
    pub learned: vtep::Learned,
    /// Connection tracking for security groups (`secgroups.rs`), made at its first use.
    pub conntrack: std::sync::OnceLock<Arc<crate::conntrack::Conntrack>>,
    /// Each port's rules as the threads last took them (by port id).
    published_rules: std::sync::Mutex<Vec<Option<Arc<crate::secgroup::PortRules>>>>,
    /// Where the expiry sweep goes on.
    ct_cursor: usize,
    /// Connection tracking for flows' `ct` actions (a table apart from security groups'),
    /// made when a flow first has one.
    pub flow_conntrack: std::sync::OnceLock<Arc<crate::conntrack::Conntrack>>,
    flow_ct_cursor: usize,
    /// Captures running (`captures.rs`), tapped into the plans.
    captures: Vec<captures::Hooked>,
    /// Flow export (`[ipfix]`, `exports.rs`), in the plans while configured.
    pub export: Option<Arc<crate::export::FlowExport>>,
    /// The mirrors of `cfg.mirrors` added at run time (`add-mirror`, `mirrors.rs`), by name:
    /// a reload keeps them beside the file's.
    runtime_mirrors: Vec<String>,
}

impl Switch {
    /// The switch of a configuration: one thread slot per poll core (not started yet), every
    /// port created (dpdk devices opened), queues placed round robin. The control loop then
    /// opens each port's endpoint and starts the threads.
    pub fn new(cfg: Config, config_path: Option<PathBuf>, mac: Arc<MacTable>) -> Result<Switch, String> {
        let numa = Numa::discover();
        let threads: Vec<ThreadSlot> = cfg.poll_cores.iter().map(|&c| ThreadSlot::new(c, &numa)).collect();
        let ids = |name: &str| cfg.ports.iter().position(|p| p.name == name).map(|i| i as u16);
        let flows = FlowTable::build(cfg.flows.iter().map(|f| f.text.as_str()), &ids, threads.len(), None)?;
        crate::mem::guest::set_total_limit((cfg.max_total_guest_memory_mib as u64) << 20);
        let mut sw = Switch {
            cfg,
            config_path,
            ports: Vec::new(),
            threads,
            flows: Arc::new(flows),
            rxq_stats: HashMap::new(),
            samples: Default::default(),
            last_rebalance: Instant::now(),
            mac,
            started: Instant::now(),
            spawner: None,
            learned: Default::default(),
            conntrack: Default::default(),
            published_rules: Default::default(),
            ct_cursor: 0,
            flow_conntrack: Default::default(),
            flow_ct_cursor: 0,
            captures: Vec::new(),
            export: None,
            runtime_mirrors: Vec::new(),
        };
        sw.export = sw.new_export();
        for (id, p) in sw.cfg.ports.clone().into_iter().enumerate() {
            sw.add_port(id as u16, p);
        }
        Ok(sw)
    }

    /// The port with id `i`, if there is one.
    pub fn port(&self, i: usize) -> Option<&PortState> {
        self.ports.get(i).and_then(|p| p.as_ref())
    }

    pub fn port_mut(&mut self, i: usize) -> Option<&mut PortState> {
        self.ports.get_mut(i).and_then(|p| p.as_mut())
    }

    pub fn port_by_name(&self, name: &str) -> Option<&PortState> {
        self.ports.iter().flatten().find(|p| p.name() == name)
    }

    /// A port's name, or `#id` for an id without a port.
    pub fn port_name(&self, id: u16) -> String {
        self.port(id as usize).map_or_else(|| format!("#{id}"), |p| p.name().to_string())
    }

    /// A port's counters summed over every poll thread.
    /// One line on what runs, for the service manager's STATUS=: vhost-user ports connected,
    /// NIC ports open, poll threads.
    pub fn status_line(&self) -> String {
        let (mut vhost, mut connected, mut nics, mut up) = (0, 0, 0, 0);
        for ps in self.ports.iter().flatten() {
            match &ps.port.kind {
                PortKind::VhostUser(_) => {
                    vhost += 1;
                    connected += ps.link.is_some() as usize;
                }
                PortKind::Nic(_) => {
                    nics += 1;
                    up += 1;
                }
                PortKind::Failed if ps.cfg.vhost_user().is_some() => vhost += 1,
                PortKind::Failed => nics += 1,
                PortKind::Tunnel(_) => {}
            }
        }
        let threads = self.threads.iter().filter(|t| t.live).count();
        let mut line = format!("{connected} of {vhost} vhost-user ports connected");
        if nics > 0 {
            line += &format!(", {up} of {nics} dpdk ports open");
        }
        line + &format!(", {threads} poll threads")
    }

    pub fn port_totals(&self, id: u16) -> PortTotals {
        let mut t = PortTotals::default();
        for th in &self.threads {
            t.add(&th.stats.ports[id as usize].read());
        }
        t
    }

    /// The thread that polls a receive queue.
    pub fn owner(&self, q: QueueId) -> Option<usize> {
        self.threads.iter().position(|t| t.queues.contains(&q))
    }

    /// Wakes the poll threads that own queues of port `id`, in case they sleep (adaptive
    /// polling) and must look at a ring that started or stopped.
    pub fn wake_owners(&self, id: u16) {
        for t in self.threads.iter().filter(|t| t.queues.iter().any(|&(p, _)| p == id)) {
            t.mailbox.wake();
        }
    }

    /// Creates port `id`, opening its device if it is a dpdk port (a failure leaves the port
    /// "failed" and the switch runs on), and places its receive queues. The poll threads see
    /// it after the next `publish`; its socket is the control loop's (`Endpoints::open`).
    pub(crate) fn add_port(&mut self, id: u16, cfg: PortConfig) {
        let mut last_error = None;
        let port = match (cfg.vhost_user(), cfg.dpdk()) {
            (Some(v), _) => Port::vhost_user(id, &cfg.name, cfg.mtu, v.queue_pairs),
            (_, Some(d)) => {
                let nic = NicPort::open(d, cfg.mtu, self.threads.len(), &self.cfg.dpdk)
                    .inspect_err(|e| log::error!("port {}: {e}; the switch runs on without it", cfg.name))
                    .map_err(|e| last_error = Some(e))
                    .ok();
                Port::dpdk(id, &cfg.name, cfg.mtu, nic)
            }
            (None, None) => match cfg.vxlan() {
                Some(v) => Port::vxlan(id, &cfg.name, cfg.mtu, Tunnel::new(v.clone())),
                None => unreachable!("a port is vhost-user, dpdk or vxlan"),
            },
        };
        port.rates.apply(&cfg.rates);
        let port = Arc::new(port);
        self.mac.set_limit(id, cfg.mac_limit);
        // New queues go to their pinned core's thread, else to the thread with the fewest
        // (round robin from a fresh start); `rebalance` applies the configured policy.
        for q in 0..port.rx_queues() {
            self.rxq_stats.insert((id, q), Default::default());
            let t = self.initial_thread(cfg.queue_cfg[q].affinity);
            self.threads[t].queues.push((id, q));
        }
        let i = id as usize;
        if self.ports.len() <= i {
            self.ports.resize_with(i + 1, || None);
        }
        self.ports[i] = Some(PortState { port, cfg, link: None, connects: 0, last_error, endpoint_failed: false });
    }

    /// Forgets port `id`, which no poll thread's plan holds any more and whose endpoint is
    /// closed: its MACs, its queue counters, its per-thread counters; its id becomes free.
    pub(crate) fn remove_port(&mut self, id: u16) {
        let Some(ps) = self.ports[id as usize].take() else { return };
        self.mac.flush_port(id);
        self.rxq_stats.retain(|(p, _), _| *p != id);
        for th in &self.threads {
            th.stats.ports[id as usize].reset();
        }
        info!("port {}: removed", ps.name());
    }

    /// Port `id`'s endpoint could not be opened (`Endpoints::open`): it shows as failed, for
    /// this reason.
    pub fn endpoint_failed(&mut self, id: u16, why: String) {
        if let Some(ps) = self.port_mut(id as usize) {
            ps.endpoint_failed = true;
            ps.last_error = Some(why);
        }
    }

    /// A frontend connected to port `id`.
    pub fn connected(&mut self, id: u16, status: Status) {
        if let Some(ps) = self.port_mut(id as usize) {
            ps.connects += 1;
            ps.link = Some(Link { since: Instant::now(), status });
        }
    }

    /// What the frontend of port `id` has set up so far changed (a vhost-user request).
    pub fn link_changed(&mut self, id: u16, status: Status) {
        if let Some(l) = self.port_mut(id as usize).and_then(|ps| ps.link.as_mut()) {
            l.status = status;
        }
        self.wake_owners(id);
    }

    /// Port `id`'s frontend is gone (its rings are stopped): its MACs are forgotten.
    pub fn disconnected(&mut self, id: u16, why: String) {
        self.mac.flush_port(id);
        if let Some(ps) = self.port_mut(id as usize) {
            ps.link = None;
            ps.last_error = Some(why);
        }
        self.wake_owners(id);
    }

    /// How the poll thread on `core` polls, as the configuration says now.
    pub fn tuning(&self, core: usize) -> Tuning {
        Tuning {
            burst: self.cfg.burst,
            retry_cycles: self.cfg.rx_retry_us as u64 * crate::counter::cycles_per_sec() / 1_000_000,
            sleep_after_us: self.cfg.sleep_after_us(core),
            nic_poll_interval_us: self.cfg.dpdk.nic_poll_interval_us,
            nic_poll_max_us: self.cfg.dpdk.nic_poll_max_us,
            park_after_us: self.cfg.park_after_us,
            park_check_us: self.cfg.park_check_us,
        }
    }

    /// Each poll thread's plan as things stand.
    pub fn plans(&self) -> Vec<Plan> {
        let all: Vec<&PortConfig> = self.ports.iter().flatten().map(|p| &p.cfg).collect();
        let entries: Vec<(Arc<Port>, PortPolicy)> = self
            .ports
            .iter()
            .flatten()
            .map(|ps| {
                let mut policy = ps.policy();
                self.compile_rules(ps.port.id, &all, &mut policy);
                (ps.port.clone(), policy)
            })
            .collect();
        let ct = entries.iter().any(|(_, p)| p.rules.is_some()).then(|| self.conntrack());
        let flow_ct = self.flows.uses_ct().then(|| self.flow_conntrack());
        let table = Arc::new(
            PortTable::new(&entries, &self.cfg.vteps)
                .with_conntrack(ct)
                .with_flow_conntrack(flow_ct)
                .with_taps(self.taps())
                .with_mirrors(&self.cfg.mirrors)
                .with_routes(&self.cfg.vrfs, &self.remote_neighbours())
                .with_export(self.export.clone()),
        );
        self.threads
            .iter()
            .map(|t| Plan {
                ports: table.clone(),
                flows: self.flows.clone(),
                tuning: Some(self.tuning(t.core())),
                rxqs: t
                    .queues
                    .iter()
                    .filter_map(|&(id, qpair)| {
                        let ps = self.port(id as usize)?;
                        let qc = ps.cfg.queue_cfg.get(qpair)?;
                        Some(RxqSpec {
                            port: ps.port.clone(),
                            qpair,
                            weight_packets: qc.weight_packets,
                            weight_bytes: qc.weight_bytes,
                            stats: self.rxq_stats.get(&(id, qpair))?.clone(),
                        })
                    })
                    .collect(),
            })
            .collect()
    }

    /// Hands every poll thread its current plan and waits until all have adopted it.
    pub fn publish(&self) {
        let plans = self.plans();
        let rules = rules_of(&plans);
        let outputs: Vec<u16> = plans.first().map(|p| p.ports.mirror_outputs().collect()).unwrap_or_default();
        let generations: Vec<u64> = self.threads.iter().zip(plans).map(|(t, p)| t.mailbox.post(p)).collect();
        for (i, (t, generation)) in self.threads.iter().zip(generations).enumerate() {
            if t.live && !t.mailbox.wait(generation, ADOPT_TIMEOUT) {
                warn!("poll thread {i} has not adopted a new plan after {ADOPT_TIMEOUT:?}");
            }
        }
        self.rules_published(rules);
        // A mirror's output sends nothing the switch takes: what NORMAL learned of it before
        // goes (it cannot learn again, its frames are dropped before).
        for id in outputs.into_iter().filter(|&id| self.mac.learned(id) > 0) {
            self.mac.flush_port(id);
        }
    }

    /// Starts every configured poll thread with its plan.
    pub fn start_threads(&mut self) -> std::io::Result<()> {
        let plans = self.plans();
        self.rules_published(rules_of(&plans));
        for (i, plan) in plans.into_iter().enumerate() {
            self.spawn(i, plan)?;
        }
        Ok(())
    }

    fn spawn(&mut self, index: usize, plan: Plan) -> std::io::Result<()> {
        let t = &self.threads[index];
        let start = ThreadStart {
            index,
            core: t.core(),
            stats: t.stats.clone(),
            mailbox: t.mailbox.clone(),
            plan,
            sleep_after_us: self.cfg.sleep_after_us(t.core()),
        };
        let spawner = self.spawner.as_mut().ok_or_else(|| std::io::Error::other("no thread spawner"))?;
        self.threads[index].handle = Some(spawner(start)?);
        Ok(())
    }

    /// Whether some poll thread is awake (then the watchdog must look every `WATCHDOG_EVERY`).
    pub fn threads_awake(&self) -> bool {
        self.threads.iter().any(|t| t.live && t.stats.sleeping.load(std::sync::atomic::Ordering::Relaxed) == 0)
    }

    /// Interrupts a poll thread stuck writing a guest's call eventfd for longer than
    /// `CALL_STUCK` (the frontend saturated the eventfd and cleared O_NONBLOCK): its write
    /// returns EINTR and the ring is stopped (`vring::call`).
    pub fn watchdog(&self) {
        use std::os::unix::thread::JoinHandleExt;
        let stuck = CALL_STUCK.as_micros() as u64 * crate::counter::cycles_per_sec() / 1_000_000;
        let now = crate::counter::cycles();
        for (i, t) in self.threads.iter().enumerate() {
            let since = t.stats.in_call.load(std::sync::atomic::Ordering::Relaxed);
            if since != 0
                && now.wrapping_sub(since) > stuck
                && let Some(h) = &t.handle
            {
                warn!("poll thread {i}: stuck in a guest's call eventfd write; interrupting it");
                crate::vring::call::interrupt_thread(h.as_pthread_t());
            }
        }
    }

    /// Stops the thread of slot `i` and waits for it.
    fn stop_thread(&mut self, i: usize) {
        let t = &mut self.threads[i];
        t.mailbox.retire();
        if let Some(h) = t.handle.take() {
            let _ = h.join();
        }
    }

    /// Stops every poll thread and waits for them.
    pub fn stop_threads(&mut self) {
        for t in &self.threads {
            t.mailbox.retire();
        }
        for i in 0..self.threads.len() {
            self.stop_thread(i);
        }
    }
}

/// Each port's security-group rules in `plans` (the same table in every plan), by port id.
fn rules_of(plans: &[Plan]) -> Vec<Option<Arc<crate::secgroup::PortRules>>> {
    plans.first().map(|p| p.ports.policy.iter().map(|p| p.rules.clone()).collect()).unwrap_or_default()
}
