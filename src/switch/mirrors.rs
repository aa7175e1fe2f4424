//! `mirrors`: each `[[mirror]]` of the configuration as it runs. The data path's part is made
//! with every plan (`PortTable::with_mirrors`, from `cfg.mirrors`); what a mirror did is its
//! output's counters, since the output receives nothing else.

use super::Switch;
use crate::datapath::counters::DropReason;
use crate::proto::MirrorInfo;

impl Switch {
    pub fn mirrors(&self) -> Vec<MirrorInfo> {
        let find = |name: &str| self.ports.iter().flatten().find(|ps| ps.name() == name);
        self.cfg
            .mirrors
            .iter()
            .map(|m| {
                let named = std::iter::once(&m.output_port).chain(&m.select_src_port).chain(&m.select_dst_port);
                let mut absent: Vec<String> = named.filter(|n| find(n).is_none()).cloned().collect();
                absent.dedup();
                let mut info = MirrorInfo {
                    name: m.name.clone(),
                    output_port: m.output_port.clone(),
                    select_src_port: m.select_src_port.clone(),
                    select_dst_port: m.select_dst_port.clone(),
                    select_all: m.select_all,
                    select_vlan: m.select_vlan.clone(),
                    snaplen: m.snaplen,
                    absent,
                    ..MirrorInfo::default()
                };
                if let Some(out) = find(&m.output_port) {
                    let t = self.port_totals(out.id());
                    info.active = true;
                    info.copies = t.tx_packets;
                    info.copy_bytes = t.tx_bytes;
                    // What the output sent itself is no copy it lost.
                    info.dropped = t.drops.0.iter().sum::<u64>() - t.drops.get(DropReason::MirrorOutput);
                }
                info
            })
            .collect()
    }
}
