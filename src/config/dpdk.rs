//! The `[dpdk]` section: EAL arguments and the mbuf pools, for `type = "dpdk"` ports.

use super::error::{ConfigError, Ctx};
use super::raw::RawDpdk;

pub const DEFAULT_MBUFS: u32 = 16383;
pub const DEFAULT_NIC_POLL_INTERVAL_US: u32 = 100;

/// The `[dpdk]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkConfig {
    /// Extra EAL arguments; None: pvswitchd picks them (see `nic::eal_args`).
    pub eal_args: Option<Vec<String>>,
    /// Mbufs per pool (one pool per NUMA socket used).
    pub mbufs: u32,
    /// Adaptive polling: a thread with NIC queues sleeps at most this long.
    pub nic_poll_interval_us: u32,
}

impl Default for DpdkConfig {
    fn default() -> Self {
        DpdkConfig { eal_args: None, mbufs: DEFAULT_MBUFS, nic_poll_interval_us: DEFAULT_NIC_POLL_INTERVAL_US }
    }
}

/// The section, or its defaults when the file has none.
pub(super) fn validate(raw: Option<RawDpdk>, cx: &Ctx) -> Result<DpdkConfig, ConfigError> {
    let Some(d) = raw else {
        return Ok(DpdkConfig::default());
    };
    Ok(DpdkConfig {
        mbufs: cx.range(&d.mbufs, "mbufs", 1023, 1 << 24, DEFAULT_MBUFS)?,
        nic_poll_interval_us: cx.range(
            &d.nic_poll_interval_us,
            "nic_poll_interval_us",
            1,
            1_000_000,
            DEFAULT_NIC_POLL_INTERVAL_US,
        )?,
        eal_args: d.eal_args,
    })
}
