//! pvswitch: a userspace poll-mode virtual switch for hosts that run many VMs.
//! See DESIGN.md for the thread model and how a frame travels.

pub mod capture;
pub mod config;
pub mod conntrack;
pub mod control;
pub mod counter;
pub mod ctl;
pub mod datapath;
pub mod export;
pub mod flow;
#[cfg(test)]
mod fuzz;
pub mod mem;
pub mod port;
pub mod proto;
pub mod secgroup;
pub mod switch;
pub mod topology;
pub mod vring;
pub mod wire;
