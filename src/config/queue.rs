//! A port's receive queues: each takes the port's weights and `affinity`, then its own
//! `[[port.queue]]` overrides (`index`, `weight_packets`, `weight_bytes`, `affinity`).

use super::error::{ConfigError, Ctx};
use super::raw::RawPort;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    pub weight_packets: u32,
    pub weight_bytes: u32,
    /// The poll core the queue is pinned to (None: placed by `rxq_assign`).
    pub affinity: Option<usize>,
}

/// One entry per receive queue of the port (`nrxq`, at least one). Whether an affinity names a
/// poll core is checked against `[switch]` by `Config::check_port`.
pub(super) fn validate(p: &RawPort, nrxq: u16, port: QueueConfig, cx: &Ctx) -> Result<Vec<QueueConfig>, ConfigError> {
    let mut queues = vec![port; nrxq as usize];
    for q in &p.queue {
        let i = *q.index.get_ref();
        let Some(slot) = queues.get_mut(i as usize) else {
            return Err(cx.err(
                Some(q.index.span()),
                format!("queue index {i}: the port has {nrxq} receive queues (0 to {})", nrxq - 1),
            ));
        };
        slot.weight_packets = cx.range(&q.weight_packets, "weight_packets", 1, 1 << 20, slot.weight_packets)?;
        slot.weight_bytes = cx.range(&q.weight_bytes, "weight_bytes", 64, 1 << 30, slot.weight_bytes)?;
        if let Some(a) = &q.affinity {
            slot.affinity = Some(*a.get_ref());
        }
    }
    Ok(queues)
}
