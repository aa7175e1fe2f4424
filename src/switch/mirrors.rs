//! `mirrors`: each `[[mirror]]` of the configuration as it runs, and `add-mirror`/`del-mirror`,
//! mirrors added at run time (an operator's `ovs-tcpdump`: kept until removed or pvswitchd
//! stops, and across reloads, never written to a file). The data path's part is made with
//! every plan (`PortTable::with_mirrors`, from `cfg.mirrors`, which holds both kinds); what a
//! mirror did is its output's counters, since the output receives nothing else.

use super::Switch;
use crate::config::mirror::{self, MirrorConfig};
use crate::datapath::counters::DropReason;
use crate::proto::{CtlError, ErrorCode, MirrorInfo};

impl Switch {
    /// `add-mirror NAME KEY=VALUE...`: a mirror as `[[mirror]]` makes it, running at once.
    pub fn add_mirror_cmd(&mut self, name: &str, settings: &[(String, String)]) -> Result<String, CtlError> {
        if self.cfg.mirrors.iter().any(|m| m.name == name) {
            let message = format!("add-mirror: mirror \"{name}\" exists");
            return Err(CtlError { code: Some(ErrorCode::Exists), message });
        }
        let m = mirror::from_settings(name, settings, &self.cfg.mirrors)
            .map_err(|e| CtlError { code: Some(ErrorCode::Invalid), message: format!("add-mirror {name}: {e}") })?;
        log::info!("mirror {name} added: copies to {}", m.output_port);
        let out = m.output_port.clone();
        self.cfg.mirrors.push(m);
        self.runtime_mirrors.push(name.to_string());
        self.publish();
        Ok(format!("mirror {name} added: copies to {out}"))
    }

    /// `del-mirror NAME`: removes a mirror `add-mirror` added (the file's are the file's).
    pub fn del_mirror_cmd(&mut self, name: &str, if_exists: bool) -> Result<String, CtlError> {
        if !self.runtime_mirrors.iter().any(|n| n == name) {
            if self.cfg.mirrors.iter().any(|m| m.name == name) {
                let message =
                    format!("del-mirror: mirror \"{name}\" is the configuration file's: remove it there and reload");
                return Err(CtlError { code: Some(ErrorCode::Invalid), message });
            }
            if if_exists {
                return Ok(format!("no mirror {name}; nothing to do"));
            }
            return Err(CtlError {
                code: Some(ErrorCode::NotFound),
                message: format!("del-mirror: no mirror \"{name}\""),
            });
        }
        self.runtime_mirrors.retain(|n| n != name);
        self.cfg.mirrors.retain(|m| m.name != name);
        self.publish();
        log::info!("mirror {name} removed");
        Ok(format!("mirror {name} removed"))
    }

    /// The file's mirrors `file` and those added at run time, for a reload: a mirror added at
    /// run time that the new file's no longer allow (its name or output taken, its output
    /// selected) is removed, and `notes` say so.
    pub(super) fn with_runtime_mirrors(
        &mut self,
        file: Vec<MirrorConfig>,
        notes: &mut Vec<String>,
    ) -> Vec<MirrorConfig> {
        let mut all = file;
        let added: Vec<MirrorConfig> =
            self.cfg.mirrors.iter().filter(|m| self.runtime_mirrors.contains(&m.name)).cloned().collect();
        for m in added {
            let again = (!all.iter().any(|o| o.name == m.name)).then(|| all.clone()).and_then(|mut t| {
                t.push(m.clone());
                crate::config::mirror::check_together(&t).ok()
            });
            match again {
                Some(_) => all.push(m),
                None => {
                    self.runtime_mirrors.retain(|n| n != &m.name);
                    notes.push(format!(
                        "mirror {} added at run time removed: the file's mirrors conflict with it",
                        m.name
                    ));
                }
            }
        }
        all
    }

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
