//! `trace --live`: a real frame's record (its bytes and the data path's [`Verdict`]) told in
//! words, stage by stage, as the described-frame `trace` (`flows.rs`) tells a described one.
//!
//! The record says what the poll thread decided: the VLAN, the table-0 flow and the flows a
//! walk met, what the connection tracker said of it (a `ct` action's or a security group's
//! zone and `ct_state`), where the frame went or why it was dropped, what its offload header
//! asked. The
//! words need the switch's names for those numbers: an [`Explainer`] is a snapshot of them
//! (ports, their VLANs, the flow table, mirror outputs) taken on the control thread when the
//! trace starts, so the capture's thread tells records without touching the switch. A reload
//! or a port added while a trace runs is not seen by it: the flows' texts are those of the
//! table the trace began with (their numbers are the data path's, of the table it runs now).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::capture::{self, Record, Verdict};
use crate::config::vlan::PortVlan;
use crate::datapath::counters::DROP_REASONS;
use crate::datapath::vlan::header_for;
use crate::flow::table::{FlowTable, NO_MATCH};
use crate::flow::{Emit, Field, FlowKey, Match, ct_state_string, execute_path};
use crate::proto::LiveTrace;
use crate::switch::Switch;
use crate::wire::EthernetRepr;

/// One port as the trace began.
struct Member {
    id: u16,
    name: String,
    vlan: PortVlan,
    /// A mirror's output: in no flood.
    mirror_output: bool,
}

/// The switch's names for what a record holds, as the trace began.
pub struct Explainer {
    in_port: u16,
    port: String,
    ports: Vec<Member>,
    /// Some port has a VLAN config: NORMAL switches by VLAN.
    vlans: bool,
    flows: Arc<FlowTable>,
}

impl Explainer {
    /// A snapshot of `c` for tracing port `in_port`.
    pub fn new(c: &Switch, in_port: u16) -> Explainer {
        let outputs: Vec<String> = c.cfg.mirrors.iter().map(|m| m.output_port.clone()).collect();
        let ports: Vec<Member> = c
            .ports
            .iter()
            .flatten()
            .map(|p| Member {
                id: p.id(),
                name: p.name().to_string(),
                vlan: p.cfg.vlan.clone(),
                mirror_output: outputs.iter().any(|o| o == p.name()),
            })
            .collect();
        Explainer {
            in_port,
            port: c.port_name(in_port),
            vlans: ports.iter().any(|p| !p.vlan.is_default()),
            ports,
            flows: c.flows.clone(),
        }
    }

    fn name(&self, id: u16) -> String {
        self.ports.iter().find(|p| p.id == id).map_or_else(|| format!("#{id}"), |p| p.name.clone())
    }

    /// How the frame (header `h`) leaves port `p` in VLAN `vid`: None if `p` does not carry it.
    fn leaves(&self, p: u16, vid: u16, h: &EthernetRepr) -> Option<String> {
        if !self.vlans || vid == Verdict::NO_VLAN {
            return Some(self.name(p));
        }
        let m = self.ports.iter().find(|m| m.id == p)?;
        let out = header_for(&m.vlan, vid, h)?;
        Some(match out.tags[..out.ntags as usize].first() {
            Some(t) => format!("{} (tagged {})", m.name, t.vid()),
            None => format!("{} (untagged)", m.name),
        })
    }

    /// The flood's outputs from this port in VLAN `vid`.
    fn flood(&self, vid: u16, h: &EthernetRepr) -> Vec<String> {
        let members = self.ports.iter().filter(|m| m.id != self.in_port && !m.mirror_output);
        members.filter_map(|m| self.leaves(m.id, vid, h)).collect()
    }

    fn flow_text(&self, i: u32) -> String {
        let name = |id: u16| self.name(id);
        match self.flows.entries().get(i as usize) {
            Some(e) => e.flow.to_ovs_string(&name),
            None => format!("flow #{i} (the table changed since the trace began)"),
        }
    }

    /// Record `r` in words: what the frame is, the flows it hit, where it went.
    pub fn explain(&self, r: &Record) -> LiveTrace {
        let v = r.verdict.unwrap_or_default();
        let mut steps = self.frame_steps(r, &v);
        let flow = self.flow_steps(&v, &mut steps);
        if let Some((zone, state)) = v.ct {
            steps.push(format!("conntrack: zone {zone}, ct_state={}", ct_state_string(state, state)));
        }
        let h = EthernetRepr::parse(r.data).map(|(h, _)| h).unwrap_or_default();
        let (outputs, dropped) = self.outcome(&v, &h, flow.as_deref(), &mut steps);
        if dropped.is_none() {
            steps.push(if outputs.is_empty() {
                "result: delivered nowhere".into()
            } else {
                format!("result: output to {}", outputs.join(", "))
            });
        }
        LiveTrace { port: self.port.clone(), time_ns: r.time_ns, len: r.len, flow, outputs, dropped, steps }
    }

    /// The frame's headers as a match, its offloads, its VLAN.
    fn frame_steps(&self, r: &Record, v: &Verdict) -> Vec<String> {
        let name = |id: u16| self.name(id);
        let key = FlowKey::extract(self.in_port, r.data);
        // The frame's headers: the tracker's fields are none, and a field a frame does not
        // carry (0 past its Ethernet header, the TCI of an untagged one) is left out.
        let absent =
            [Field::VlanTci, Field::NwSrc, Field::NwDst, Field::NwProto, Field::NwTos, Field::TpSrc, Field::TpDst];
        let headers = [Field::CtState, Field::CtZone, Field::CtMark]
            .into_iter()
            .chain(absent.into_iter().filter(|&f| key.get(f) == 0))
            .fold(FlowKey::EXACT, |m, f| m.with(f, 0));
        let mut steps = vec![format!("frame: {} ({} bytes)", Match::new(key, headers).to_ovs_string(&name), r.len)];
        if v.mss > 0 {
            let ip = if v.v6 { "IPv6" } else { "IPv4" };
            steps.push(format!(
                "offload: TSO over {ip}, segments of {} bytes (segmented for a port that cannot take it whole)",
                v.mss
            ));
        } else if v.csum {
            steps.push("offload: partial checksum (completed for a port that cannot take it partial)".into());
        }
        if v.vlan != Verdict::NO_VLAN {
            let came = match v.tag {
                Some(tci) => format!("tagged {}", tci & 0xfff),
                None => "untagged".into(),
            };
            steps.push(format!("vlan: VLAN {} (it came {came})", v.vlan));
        }
        steps
    }

    /// The flows the frame hit (none without flows), and the first one's text.
    fn flow_steps(&self, v: &Verdict, steps: &mut Vec<String>) -> Option<String> {
        let mut flow = None;
        if self.flows.is_normal() {
            steps.push("no flows configured: actions=normal".into());
        } else {
            match v.flow {
                Some(NO_MATCH) => steps.push("no flow matches".into()),
                Some(i) => {
                    let text = self.flow_text(i);
                    steps.push(format!("flow: {text}"));
                    flow = Some(text);
                }
                None => {}
            }
            for (n, &i) in v.path().iter().enumerate().skip(1) {
                match i {
                    NO_MATCH => steps.push(format!("  walk {n}: a table had no flow for it")),
                    _ => steps.push(format!("  walk {n}: {}", self.flow_text(i))),
                }
            }
        }
        flow
    }

    /// Where the frame went: its outputs, or its drop reason.
    fn outcome(
        &self,
        v: &Verdict,
        h: &EthernetRepr,
        flow: Option<&str>,
        steps: &mut Vec<String>,
    ) -> (Vec<String>, Option<String>) {
        let name = |id: u16| self.name(id);
        let (mut outputs, mut dropped) = (Vec::new(), None);
        let vid = v.vlan;
        let in_vlan = if vid != Verdict::NO_VLAN && self.vlans { format!(" in VLAN {vid}") } else { String::new() };
        match v.out {
            capture::OUT_DROP => {
                let (reason, why) = DROP_REASONS.get(v.value as usize).copied().unwrap_or(("?", ""));
                steps.push(format!("dropped: {reason} ({})", why.trim()));
                dropped = Some(reason.to_string());
            }
            capture::OUT_NOWHERE => steps.push("goes nowhere: its destination is the port it came from".into()),
            capture::OUT_PORT => {
                let p = v.value as u16;
                let out = self.leaves(p, vid, h).unwrap_or_else(|| self.name(p));
                if self.flows.is_normal() || flow.is_some_and(|f| f.contains("NORMAL")) {
                    steps.push(format!("normal: {} learned on {}{in_vlan}", h.dst, self.name(p)));
                }
                outputs.push(out);
            }
            capture::OUT_ROUTED => {
                let p = v.value as u16;
                steps.push(format!("routed: to {} in VLAN {vid} (TTL one less, from the gateway's MAC)", self.name(p)));
                outputs.push(self.name(p));
            }
            capture::OUT_ANSWER => {
                steps.push(format!("answered by the switch: the gateway of VLAN {vid}"));
                outputs.push(self.name(self.in_port));
            }
            capture::OUT_FLOOD => {
                let why = if h.dst.is_multicast() { "broadcast/multicast" } else { "destination not learned" };
                steps.push(format!("normal: {why}: flood{in_vlan}"));
                outputs = self.flood(vid, h);
            }
            _ => {
                // Actions run at delivery (rewrites, several outputs): what they do to it.
                let first = [v.value];
                let path = if v.out == capture::OUT_PATH { v.path() } else { &first[..] };
                let t = &self.flows;
                let found = path.iter().all(|&i| i == NO_MATCH || (i as usize) < t.entries().len());
                if found {
                    execute_path(path, &|i| t.actions(i), h, |emit, hh| match emit {
                        Emit::Port(p) if p == self.in_port => {
                            steps.push(format!("output:{} skipped: input port", name(p)))
                        }
                        Emit::Port(p) => outputs.push(self.leaves(p, vid, hh).unwrap_or_else(|| name(p))),
                        Emit::InPort => outputs.push(name(self.in_port)),
                        Emit::Flood | Emit::All => outputs.extend(self.flood(vid, hh)),
                        Emit::Normal => steps.push(format!("normal: as the MAC table says when delivered{in_vlan}")),
                    });
                } else {
                    steps.push("actions: of a table that changed since the trace began".into());
                }
            }
        }
        // Decided, but not written: its one destination could not take it.
        if let Some((p, why)) = v.missed
            && matches!(v.out, capture::OUT_PORT | capture::OUT_ROUTED)
        {
            let (reason, text) = DROP_REASONS.get(why as usize).copied().unwrap_or(("?", ""));
            steps.push(format!("not delivered to {}: {reason} ({})", self.name(p), text.trim()));
            outputs.clear();
            dropped = Some(reason.to_string());
        }
        (outputs, dropped)
    }
}
