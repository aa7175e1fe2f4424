//! `[ipfix]`: flow export (RFC 7011) to a collector over UDP, as OVS's IPFIX table means it:
//! where to send, one frame in `sampling` observed, and when a flow's record goes (after
//! `active_timeout_s` of activity, or `idle_timeout_s` without a frame).
#![forbid(unsafe_code)]

use std::net::SocketAddr;

use super::error::{ConfigError, Ctx};
use super::raw::RawIpfix;

pub const DEFAULT_ACTIVE_TIMEOUT_S: u32 = 60;
pub const DEFAULT_IDLE_TIMEOUT_S: u32 = 15;
pub const DEFAULT_MAX_FLOWS: u32 = 65536;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpfixConfig {
    pub collector: SocketAddr,
    /// One frame in this many is observed (1: every frame).
    pub sampling: u32,
    pub active_timeout_s: u32,
    pub idle_timeout_s: u32,
    /// Flows each poll thread keeps at once; a new flow beyond them is not recorded (counted).
    pub max_flows: u32,
    pub observation_domain_id: u32,
}

pub(super) fn validate(raw: Option<RawIpfix>, cx: &Ctx) -> Result<Option<IpfixConfig>, ConfigError> {
    let Some(r) = raw else { return Ok(None) };
    let collector = r.collector.get_ref().parse::<SocketAddr>().map_err(|_| {
        cx.err(Some(r.collector.span()), "collector: expected an address and UDP port, such as \"192.0.2.10:4739\"")
    })?;
    if collector.port() == 0 {
        return Err(cx.err(Some(r.collector.span()), "collector: port 0"));
    }
    let active_timeout_s = cx.range(&r.active_timeout_s, "active_timeout_s", 1, 3600, DEFAULT_ACTIVE_TIMEOUT_S)?;
    let idle_timeout_s = cx.range(&r.idle_timeout_s, "idle_timeout_s", 1, 3600, DEFAULT_IDLE_TIMEOUT_S)?;
    Ok(Some(IpfixConfig {
        collector,
        sampling: cx.range(&r.sampling, "sampling", 1, 1 << 24, 1)?,
        active_timeout_s,
        idle_timeout_s,
        max_flows: cx.range(&r.max_flows, "max_flows", 16, 1 << 20, DEFAULT_MAX_FLOWS)?,
        observation_domain_id: cx.range(&r.observation_domain_id, "observation_domain_id", 0, u32::MAX, 0)?,
    }))
}
