//! Changing a running switch: opening and closing ports, publishing plans to the poll threads,
//! and live reload of the configuration file.
//!
//! A reload is checked whole before anything changes (a bad file leaves the switch as it was).
//! It is then applied in two plan swaps, so no poll thread ever sees a port that is going away
//! after its connection is closed, and frames on unchanged ports never stop:
//! 1. the poll threads get a plan without the removed (or replaced) ports; once every thread has
//!    adopted it, those ports' connections and sockets are closed;
//! 2. new ports are opened and the threads get the final plan: new ports, their queues, the
//!    new flow table and policies.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use vhost::vhost_user::Listener;

use crate::config::{Config, PortConfig, SocketMode};
use crate::control::{Control, PortCtl, RECONNECT_MIN, TOK_PORT_LISTEN, epoll_add, epoll_del};
use crate::datapath::plan::{Plan, PortPolicy, PortTable, RxqSpec};
use crate::flow::table::FlowTable;
use crate::port::Port;

/// How long the control thread waits for a poll thread to adopt a plan before it warns.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(2);

impl Control {
    /// Creates port `id` and starts listening on (or connecting to) its socket. The poll
    /// threads see it after the next `publish`.
    pub(crate) fn open_port(&mut self, id: u16, cfg: PortConfig) -> std::io::Result<()> {
        let mut failed = None;
        let port = match &cfg.dpdk {
            None => Arc::new(Port::new(id, cfg.clone())),
            Some(d) => {
                let nic = crate::port::nic::NicPort::open(d, cfg.mtu, self.threads.len(), &self.cfg.dpdk)
                    .inspect_err(|e| log::error!("port {}: {e}; the switch runs on without it", cfg.name))
                    .map_err(|e| failed = Some(e))
                    .ok();
                Arc::new(Port::with_nic(id, cfg.clone(), nic))
            }
        };
        let mut pc = PortCtl {
            port: port.clone(),
            cfg,
            listener: None,
            conn: None,
            retry_at: None,
            backoff: RECONNECT_MIN,
            connects: 0,
            last_error: failed,
        };
        match port.cfg.mode {
            _ if port.is_dpdk() => {}
            SocketMode::Server => {
                if let Some(dir) = port.cfg.socket.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let l = Listener::new(&port.cfg.socket, true).map_err(|e| {
                    std::io::Error::other(format!("port {}: socket {}: {e}", port.name(), port.cfg.socket.display()))
                })?;
                l.set_nonblocking(true).map_err(|e| std::io::Error::other(e.to_string()))?;
                epoll_add(self.epoll, l.as_raw_fd(), (TOK_PORT_LISTEN << 32) | id as u64);
                info!("port {}: listening on {}", port.name(), port.cfg.socket.display());
                pc.listener = Some(l);
            }
            SocketMode::Client => pc.retry_at = Some(Instant::now()),
        }
        let i = id as usize;
        if self.ports.len() <= i {
            self.ports.resize_with(i + 1, || None);
        }
        self.ports[i] = Some(pc);
        // New queues go to their pinned core's thread, else to the thread with the fewest
        // (round robin from a fresh start); `rebalance` applies the configured policy.
        for q in 0..port.queue_pairs() {
            self.rxq_stats.insert((id, q), Default::default());
            let t = self.initial_thread(port.cfg.queue_cfg[q].affinity);
            self.thread_queues[t].push((id, q));
        }
        Ok(())
    }

    /// Closes port `id`, which the poll threads must no longer have in their plans: stops its
    /// rings, closes its connection and socket, forgets its MACs and frees its id.
    fn close_port(&mut self, id: u16) {
        self.detach(id as usize);
        let Some(pc) = self.ports[id as usize].take() else { return };
        if let Some(l) = &pc.listener {
            epoll_del(self.epoll, l.as_raw_fd());
            let _ = std::fs::remove_file(&pc.port.cfg.socket);
        }
        self.mac.flush_port(id);
        self.rxq_stats.retain(|(p, _), _| *p != id);
        for th in &self.threads {
            th.ports[id as usize].reset();
        }
        info!("port {}: removed", pc.port.name());
    }

    /// Each poll thread's plan as things stand.
    pub fn plans(&self) -> Vec<Plan> {
        let entries: Vec<(Arc<Port>, PortPolicy)> = self
            .ports
            .iter()
            .flatten()
            .map(|pc| (pc.port.clone(), PortPolicy { allowed_macs: pc.cfg.allowed_macs.clone() }))
            .collect();
        let table = Arc::new(PortTable::new(&entries));
        self.thread_queues
            .iter()
            .map(|qs| Plan {
                ports: table.clone(),
                flows: self.flows.clone(),
                rxqs: qs
                    .iter()
                    .filter_map(|&(id, qpair)| {
                        let pc = self.port(id as usize)?;
                        let qc = pc.cfg.queue_cfg.get(qpair)?;
                        Some(RxqSpec {
                            port: pc.port.clone(),
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
        let generations: Vec<u64> = self.mailboxes.iter().zip(self.plans()).map(|(mb, plan)| mb.post(plan)).collect();
        for (i, (mb, generation)) in self.mailboxes.iter().zip(generations).enumerate() {
            if !self.live[i] {
                continue;
            }
            if !mb.wait(generation, ADOPT_TIMEOUT) {
                warn!("poll thread {i} has not adopted a new plan after {ADOPT_TIMEOUT:?}");
            }
        }
    }

    /// Re-reads the configuration file and applies it. On error nothing changes.
    pub fn reload(&mut self) -> Result<String, String> {
        let path = self.config_path.clone().ok_or("pvswitchd was started without a configuration file")?;
        let new = Config::load(&path).map_err(|e| e.to_string())?;

        // Ids for the new port set: kept ports keep theirs, new ones take free slots.
        let mut removed = Vec::new();
        let mut updated = Vec::new();
        for pc in self.ports.iter().flatten() {
            match new.ports.iter().find(|p| p.name == pc.cfg.name) {
                Some(p) if p.same_endpoint(&pc.cfg) => updated.push((pc.port.id, p.clone())),
                _ => removed.push(pc.port.id),
            }
        }
        let mut free: Vec<u16> =
            (0..self.ports.len() as u16).filter(|&i| self.port(i as usize).is_none() || removed.contains(&i)).collect();
        free.reverse();
        let mut next = self.ports.len() as u16;
        let mut added = Vec::new();
        for p in &new.ports {
            if updated.iter().all(|(_, u)| u.name != p.name) {
                let id = free.pop().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
                added.push((id, p.clone()));
            }
        }
        let ids = |name: &str| -> Option<u16> {
            updated.iter().chain(&added).find(|(_, p)| p.name == name).map(|(id, _)| *id)
        };
        let threads_after = self.threads.len()
            + new
                .poll_cores
                .iter()
                .filter(|c| !(0..self.threads.len()).any(|i| self.live[i] && self.threads[i].core == **c))
                .count();
        let flows = FlowTable::build(&new, &ids, threads_after, Some(&self.flows))?;

        let mut notes = Vec::new();
        if new.control_socket != self.cfg.control_socket || new.control_socket_mode != self.cfg.control_socket_mode {
            notes.push("control socket changes take effect at restart".to_string());
        }

        // Step 1: retire removed and replaced ports.
        if !removed.is_empty() {
            for t in &mut self.thread_queues {
                t.retain(|(id, _)| !removed.contains(id));
            }
            let hidden: Vec<PortCtl> = removed.iter().filter_map(|&id| self.ports[id as usize].take()).collect();
            self.publish();
            for pc in hidden {
                let id = pc.port.id;
                self.ports[id as usize] = Some(pc);
                self.close_port(id);
            }
        }
        // Step 2: in-place changes, new ports, new flows.
        for (id, p) in &updated {
            if let Some(pc) = self.ports[*id as usize].as_mut() {
                pc.port.set_mtu(p.mtu);
                pc.cfg = p.clone();
            }
        }
        let mut errors = Vec::new();
        for (id, p) in &added {
            if let Err(e) = self.open_port(*id, p.clone()) {
                errors.push(e.to_string());
            }
        }
        self.flows = Arc::new(flows);
        self.publish();
        let (ctl, mode) = (self.cfg.control_socket.clone(), self.cfg.control_socket_mode);
        let cores = new.poll_cores.clone();
        self.cfg = new;
        (self.cfg.control_socket, self.cfg.control_socket_mode) = (ctl, mode);
        // Step 3: poll threads started or stopped, queues moved onto and off them.
        match self.set_poll_cores(&cores) {
            Ok(s) if !s.is_empty() => notes.push(s),
            Ok(_) => {}
            Err(e) => errors.push(e),
        }

        let names = |v: &[(u16, PortConfig)]| v.iter().map(|(_, p)| p.name.clone()).collect::<Vec<_>>().join(" ");
        let mut summary = format!(
            "{} ports ({} added{}{}), {} flows",
            self.ports.iter().flatten().count(),
            added.len(),
            if added.is_empty() { String::new() } else { format!(": {}", names(&added)) },
            if removed.is_empty() { String::new() } else { format!(", {} removed or replaced", removed.len()) },
            self.flows.len(),
        );
        for n in notes {
            summary.push_str("; ");
            summary.push_str(&n);
        }
        if !errors.is_empty() {
            return Err(format!("applied, but: {}", errors.join("; ")));
        }
        Ok(summary)
    }
}
