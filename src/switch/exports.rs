//! Flow export's switch side (`[ipfix]`): made from the configuration, handed to every plan,
//! ticked once a second (`samples.rs`: expired flows to the collector), replaced by a reload
//! that changes it (the old one's flows sent first, `reload.rs`).

use std::sync::Arc;

use super::Switch;
use crate::export::FlowExport;

/// Poll thread slots a flow export has: a reload may add threads, up to the machine's CPUs.
fn thread_slots(configured: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    configured.max(cpus)
}

impl Switch {
    /// The flow export the configuration asks for (None: none).
    pub(super) fn new_export(&self) -> Option<Arc<FlowExport>> {
        let cfg = self.cfg.ipfix.clone()?;
        log::info!(
            "ipfix: exporting flows to {} (1 frame in {} observed, active {} s, idle {} s)",
            cfg.collector,
            cfg.sampling,
            cfg.active_timeout_s,
            cfg.idle_timeout_s
        );
        let n = self.threads.len();
        let x = FlowExport::new(cfg, n, thread_slots(n));
        self.export_vnis(&x);
        Some(Arc::new(x))
    }

    /// Tells flow export the VNIs the VTEPs carry the VLANs in (at its start and each reload).
    pub(super) fn export_vnis(&self, x: &FlowExport) {
        x.set_vnis(self.cfg.vteps.iter().flat_map(|t| t.vnis.iter().map(|v| (v.vlan, v.vni))));
    }
}
