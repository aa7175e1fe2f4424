//! The vhost-user test frontend: one "VM" with queue pair 0, rings laid out by hand so a test
//! can write raw descriptors. It lives in the traffic generator (tools/pvsgen/src/frontend.rs),
//! which uses the same code for many VMs per process; this re-exports it.
#![allow(unused_imports)]

pub use pvsgen::frontend::*;
