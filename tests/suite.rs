//! pvswitch's integration tests, one test binary (`cargo test --test suite`; one file's tests:
//! `cargo test --test suite vm::`). One binary, not one per file: each binary links the switch
//! and the harness again, and 34 of them took about 10 minutes of the suite's CPU to build
//! where one takes a fraction (BENCHMARKS.md, "The suite"). Each file below is a module; the
//! harness (`common`) and the vhost-user test frontend (`frontend`) are shared, so `serial()`
//! holds the machine for one test of the whole suite at a time.

mod common;
mod frontend;

mod adaptive;
mod capture;
mod cli;
mod conformance;
mod dpdk;
mod evpn;
mod fairness;
mod flows;
mod hostile;
mod hostile_memory;
mod ipfix;
mod isolation;
mod layering;
mod libvirt;
mod memtable;
mod migration;
mod mirrors;
mod nic;
mod offloads;
mod placement;
mod portcmds;
mod pvsgen;
mod reconnect;
mod reload;
mod reload_settings;
mod restart;
mod rewrites;
mod routing;
mod scale;
mod secgroups;
mod service;
mod sockpaths;
mod stats;
mod testpmd;
mod trace_live;
mod unsafe_map;
mod vlans;
mod vm;
mod vxlan;
