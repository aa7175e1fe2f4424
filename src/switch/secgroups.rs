//! Security groups on the switch: each port's groups compiled into the rules its plans carry
//! (`secgroup::compile`, zone = port id + 1), the connection-tracking table the poll threads
//! share (made when a port first has a group, with `ct_max_connections` and
//! `ct_max_per_port`), what a rule change does to the connections it tracks (those the new
//! rules no longer allow are cut, the rest kept), and the table's once-a-second clock and
//! expiry sweep. All of it the control thread's.

use std::sync::Arc;

use log::info;

use super::Switch;
use crate::config::PortConfig;
use crate::conntrack::{Conntrack, Limits, Timeouts};
use crate::datapath::plan::PortPolicy;
use crate::secgroup::{self, PortRules};

/// Slots the once-a-second sweep visits: the whole table every `SWEEP_PASS_S` seconds.
const SWEEP_PASS_S: usize = 8;

/// A port's connection-tracking zone.
pub fn zone_of(id: u16) -> u16 {
    id + 1
}

impl Switch {
    /// Sets `policy.rules` for port `id`: its security groups compiled, if it has any, against
    /// `all` ports (the members of remote groups).
    pub(super) fn compile_rules(&self, id: u16, all: &[&PortConfig], policy: &mut PortPolicy) {
        let Some(ps) = self.port(id as usize) else { return };
        if ps.cfg.security_groups.is_empty() {
            return;
        }
        policy.rules = secgroup::compile(&ps.cfg, &self.cfg.security_groups, all, zone_of(id)).map(Arc::new);
    }

    /// The connection-tracking table, made at its first use.
    pub fn conntrack(&self) -> Arc<Conntrack> {
        self.conntrack.get_or_init(|| self.new_conntrack("security groups", "a port")).clone()
    }

    /// The flows' connection-tracking table (`ct` actions), made at its first use: a table of
    /// its own, so zones named in flows never meet the ports' zones above.
    pub fn flow_conntrack(&self) -> Arc<Conntrack> {
        self.flow_conntrack.get_or_init(|| self.new_conntrack("flows' ct()", "a zone")).clone()
    }

    fn new_conntrack(&self, whose: &str, each: &str) -> Arc<Conntrack> {
        let limits = Limits { total: self.cfg.ct_max_connections, per_zone: self.cfg.ct_max_per_port };
        let ct = Conntrack::new(limits, Timeouts::default());
        info!(
            "connection tracking for {whose}: up to {} connections, {} {each} ({} MiB)",
            limits.total,
            limits.per_zone,
            (ct.slots() * crate::conntrack::table::SLOT_BYTES) >> 20
        );
        Arc::new(ct)
    }

    /// After the threads took plans whose rules are `rules` (by port id): the connections of each
    /// port whose rules changed are checked against its new ones, and those they do not allow
    /// are cut (`firewall::rules_changed`); a port that has no rules any more, or is gone,
    /// loses its tracked connections.
    pub(super) fn rules_published(&self, rules: Vec<Option<Arc<PortRules>>>) {
        let mut last = self.published_rules.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ct) = self.conntrack.get() else {
            *last = rules;
            return;
        };
        let n = rules.len().max(last.len());
        for id in 0..n {
            let (old, new) = (last.get(id).cloned().flatten(), rules.get(id).cloned().flatten());
            if old.as_deref() == new.as_deref() || old.is_none() {
                continue;
            }
            let cut = crate::datapath::firewall::rules_changed(ct, zone_of(id as u16), new.as_deref());
            if cut > 0 {
                info!(
                    "security groups: port {id}'s rules changed: {cut} of its connections cut, let through again or forgotten"
                );
            }
        }
        *last = rules;
    }

    /// Once a second: each table's clock, and a slice of its expiry sweep.
    pub(super) fn conntrack_tick(&mut self) {
        for (ct, cursor) in [(&self.conntrack, &mut self.ct_cursor), (&self.flow_conntrack, &mut self.flow_ct_cursor)] {
            let Some(ct) = ct.get() else { continue };
            let now = ct.tick();
            let budget = ct.slots().div_ceil(SWEEP_PASS_S);
            ct.sweep(cursor, budget, now);
        }
    }
}
