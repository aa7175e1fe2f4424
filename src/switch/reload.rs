//! Live reload of the configuration file (`pvswitchctl reload`, SIGHUP).
//!
//! A reload is checked whole before anything changes (a bad file leaves the switch as it was).
//! It is then applied in two plan swaps, so no poll thread ever sees a port that is going away
//! after its connection is closed, and frames on unchanged ports never stop:
//! 1. the poll threads get a plan without the removed (or replaced) ports; once every thread has
//!    adopted it, those ports' connections and sockets are closed;
//! 2. new ports are opened and the threads get the final plan: new ports, their queues, the
//!    new flow table and policies.

use std::sync::Arc;

use crate::config::{Config, PortConfig};
use crate::flow::table::FlowTable;

use super::{Endpoints, Switch};

impl Switch {
    /// Re-reads the configuration file and applies it. On error nothing changes.
    pub fn reload(&mut self, ep: &mut dyn Endpoints) -> Result<String, String> {
        let path = self.config_path.clone().ok_or("pvswitchd was started without a configuration file")?;
        let new = Config::load(&path).map_err(|e| e.to_string())?;
        let failed: Vec<String> = new.dropin_errors.iter().map(|e| e.to_string()).collect();
        for e in &failed {
            log::error!("{e}; that port is not started");
        }
        let mut summary = self.apply_config(ep, new)?;
        if !failed.is_empty() {
            summary.push_str(&format!("; {} port files failed: {}", failed.len(), failed.join("; ")));
        }
        Ok(summary)
    }

    /// Applies `new` in place of the running configuration (reload, and the port commands).
    /// It must have been checked whole; only opening new ports may still fail.
    pub fn apply_config(&mut self, ep: &mut dyn Endpoints, mut new: Config) -> Result<String, String> {
        // Tunnel ports: the file's remotes and those learned at run time (`vtep-sync`).
        new.set_remotes(&self.learned.remotes);
        let result = self.apply_ports(ep, new);
        self.install_remote_macs();
        result
    }

    /// Long because it is one reload in the order it must take: ids for the new port set,
    /// (1) removed and replaced ports retired, (2) in-place changes, new ports and flows,
    /// (3) poll threads started or stopped and queues moved; each step reads what the ones
    /// before it decided.
    fn apply_ports(&mut self, ep: &mut dyn Endpoints, mut new: Config) -> Result<String, String> {
        // Ids for the new port set: kept ports keep theirs, new ones take free slots.
        let mut removed = Vec::new();
        let mut updated = Vec::new();
        let mut replaced = Vec::new();
        for ps in self.ports.iter().flatten() {
            match new.ports.iter().find(|p| p.name == ps.cfg.name) {
                Some(p) if ps.cfg.same_endpoint(p) => updated.push((ps.id(), p.clone())),
                Some(p) => {
                    replaced.push(format!("{} ({})", p.name, ps.cfg.replacing_keys(p).join(", ")));
                    removed.push(ps.id());
                }
                None => removed.push(ps.id()),
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
            + new.poll_cores.iter().filter(|c| !self.threads.iter().any(|t| t.live && t.core() == **c)).count();
        let flows =
            FlowTable::build(new.flows.iter().map(|f| f.text.as_str()), &ids, threads_after, Some(&self.flows))?;

        let mut notes = Vec::new();
        let later = restart_only(&self.cfg, &new);
        if !later.is_empty() {
            notes.push(format!("{} take effect at restart", later.join(", ")));
        }

        // Step 1: retire removed and replaced ports.
        if !removed.is_empty() {
            for t in &mut self.threads {
                t.queues.retain(|(id, _)| !removed.contains(id));
            }
            let hidden: Vec<_> = removed.iter().filter_map(|&id| self.ports[id as usize].take()).collect();
            self.publish();
            for ps in hidden {
                let id = ps.id();
                self.ports[id as usize] = Some(ps);
                ep.close(id);
                self.remove_port(id);
            }
        }
        // Step 2: in-place changes, new ports, new flows.
        let mut changed = Vec::new();
        let mut revlanned = Vec::new();
        let mut errors = Vec::new();
        for (id, p) in &updated {
            if let Some(ps) = self.port_mut(*id as usize) {
                let what = ps.cfg.changed_settings(p);
                if !what.is_empty() {
                    changed.push(format!("{} ({})", p.name, what.join(", ")));
                }
                if ps.cfg.vlan != p.vlan {
                    revlanned.push(*id);
                }
                let reperm = ps.cfg.vhost_user().map(|v| v.socket_perms) != p.vhost_user().map(|v| v.socket_perms);
                ps.port.set_mtu(p.mtu);
                ps.port.rates.apply(&p.rates);
                ps.cfg = p.clone();
                self.mac.set_limit(*id, p.mac_limit);
                if reperm && let Err(e) = ep.update(self.port(*id as usize).expect("updated")) {
                    log::error!("{e}");
                    errors.push(e.to_string());
                }
            }
        }
        for (id, p) in &added {
            self.add_port(*id, p.clone());
            if let Err(e) = ep.open(self.port(*id as usize).expect("just added")) {
                log::error!("{e}");
                self.endpoint_failed(*id, e.to_string());
                errors.push(e.to_string());
            }
        }
        self.flows = Arc::new(flows);
        // The groups the plans are compiled against (`secgroups.rs`): the new ones.
        if self.cfg.security_groups != new.security_groups {
            self.cfg.security_groups = new.security_groups.clone();
            notes.push("security groups changed".into());
        }
        // Mirrors added at run time stay beside the file's (unless the file's now conflict).
        new.mirrors = self.with_runtime_mirrors(std::mem::take(&mut new.mirrors), &mut notes);
        if self.cfg.mirrors != new.mirrors {
            self.cfg.mirrors = new.mirrors.clone();
            notes.push("mirrors changed".into());
        }
        // VRFs are made with each plan (`PortTable::with_routes`), as mirrors are.
        if self.cfg.vrfs != new.vrfs {
            self.cfg.vrfs = new.vrfs.clone();
            notes.push("vrfs changed".into());
        }
        let old_export = (self.cfg.ipfix != new.ipfix).then(|| {
            self.cfg.ipfix = new.ipfix.clone();
            notes.push("flow export changed".into());
            let next = self.new_export();
            std::mem::replace(&mut self.export, next)
        });
        self.publish();
        // No thread observes the old export now: what its tables hold goes to its collector.
        if let Some(Some(x)) = old_export {
            x.tick(crate::export::now_ms(), true);
        }
        // What a port learned on the VLANs it had is not where its stations are now (OVS
        // flushes a port's entries the same way when its VLAN config changes).
        for id in revlanned {
            self.mac.flush_port(id);
        }
        let (ctl, mode) = (self.cfg.control_socket.clone(), self.cfg.control_socket_mode);
        let cores = new.poll_cores.clone();
        crate::mem::guest::set_total_limit((new.max_total_guest_memory_mib as u64) << 20);
        let retune = self.threads.iter().any(|t| {
            t.live && {
                let core = t.core();
                let (a, b) = (&self.cfg, &new);
                let tuning = |c: &crate::config::Config| {
                    let nic = (c.dpdk.nic_poll_interval_us, c.dpdk.nic_poll_max_us);
                    let t = (c.burst, c.rx_retry_us, c.sleep_after_us(core), nic);
                    (t, c.park_after_us, c.park_check_us)
                };
                tuning(a) != tuning(b)
            }
        });
        self.cfg = new;
        (self.cfg.control_socket, self.cfg.control_socket_mode) = (ctl, mode);
        // Records name the VNIs of the VTEPs the file has now.
        if let Some(x) = &self.export {
            self.export_vnis(x);
        }
        // Burst, retry time and polling mode reach running threads with their next plan.
        if retune {
            self.publish();
            notes.push("poll threads retuned".into());
        }
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
        if !replaced.is_empty() {
            notes.insert(0, format!("replaced: {}", replaced.join(", ")));
        }
        if !changed.is_empty() {
            notes.insert(0, format!("changed: {}", changed.join(", ")));
        }
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

/// The settings that differ between `old` and `new` but that a running pvswitchd reads only at
/// start (the control and metrics sockets; DPDK's EAL and pools): a reload says so rather than
/// ignore them. A poll thread's burst, retry time and polling mode are in every plan
/// (`Tuning`), so they change live.
fn restart_only(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut later = Vec::new();
    if new.control_socket != old.control_socket || new.control_socket_mode != old.control_socket_mode {
        later.push("control socket changes");
    }
    if new.metrics_listen != old.metrics_listen {
        later.push("metrics_listen");
    }
    if (&new.dpdk.eal_args, new.dpdk.mbufs) != (&old.dpdk.eal_args, old.dpdk.mbufs) {
        later.push("[dpdk] eal_args and mbufs");
    }
    // The table is sized once, at its first use.
    if (new.ct_max_connections, new.ct_max_per_port) != (old.ct_max_connections, old.ct_max_per_port) {
        later.push("ct_max_connections and ct_max_per_port");
    }
    later
}
