//! The data path in-process: test VMs (pvsgen's `Guest`: memfd guest memory and split rings
//! it lays out itself) attached straight to their ports' vhost-user backends (the requests a
//! frontend would send, as calls), and poll threads the test steps one loop iteration at a
//! time. No socket, no root, no hugepages, no testpmd: ring walking, MRG_RXBUF, backpressure,
//! floods, plan swaps and queue moves run under plain `cargo test`.

mod attacks;
mod ct_flows;
mod flows;
mod harness;
mod insn;
mod migration;
mod mirrors;
mod offloads;
mod park;
mod rewrites;
mod routing;
mod routing6;
mod secgroups;
mod switching;
mod vlans;

pub(crate) use harness::*;
