//! pvswitch: a userspace poll-mode virtual switch for hosts that run many VMs.
//! See DESIGN.md for the thread model and how a frame travels.

pub mod config;
pub mod control;
pub mod ctl;
pub mod ctl_flows;
pub mod ctl_stats;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod flow;
pub mod flow_table;
pub mod idle;
pub mod mac_table;
pub mod mem;
pub mod metrics_http;
pub mod nic;
pub mod placement;
pub mod plan;
pub mod pmd;
pub mod port;
pub mod rebalance;
pub mod reload;
pub mod sched;
pub mod stats;
pub mod topology;
pub mod vhost_port;
pub mod vring;
pub mod wire;
