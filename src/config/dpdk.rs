//! The `[dpdk]` section: EAL arguments and the mbuf pools, for `type = "dpdk"` ports.

use super::error::{ConfigError, Ctx};
use super::raw::RawDpdk;

pub const DEFAULT_MBUFS: u32 = 16383;
pub const DEFAULT_NIC_POLL_INTERVAL_US: u32 = 100;
pub const DEFAULT_NIC_POLL_MAX_US: u32 = 2000;

/// The `[dpdk]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpdkConfig {
    /// Extra EAL arguments; None: pvswitchd picks them (see `nic::eal_args`).
    pub eal_args: Option<Vec<String>>,
    /// Mbufs per pool (one pool per NUMA socket used).
    pub mbufs: u32,
    /// Adaptive polling: a thread with NIC queues that cannot wake it (no receive interrupt)
    /// sleeps this long first, then twice as long each time it woke to nothing...
    pub nic_poll_interval_us: u32,
    /// ... up to this long (OVS's `pmd-sleep-max`); a frame starts it over.
    pub nic_poll_max_us: u32,
    /// The DPDK virtual devices a port added at run time (or read from the port directory)
    /// may use: whole device strings, or a driver's name for its instances without arguments
    /// (see [`DpdkConfig::runtime_device`]).
    pub runtime_vdevs: Vec<String>,
}

impl Default for DpdkConfig {
    fn default() -> Self {
        DpdkConfig {
            eal_args: None,
            mbufs: DEFAULT_MBUFS,
            nic_poll_interval_us: DEFAULT_NIC_POLL_INTERVAL_US,
            nic_poll_max_us: DEFAULT_NIC_POLL_MAX_US,
            runtime_vdevs: Vec::new(),
        }
    }
}

/// Whether `s` is a PCI address, `DDDD:BB:DD.F` or `BB:DD.F` (hexadecimal).
fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    let parts: Vec<&str> = s.split(':').collect();
    let (bus, rest) = match parts.as_slice() {
        [dom, bus, rest] if hex(dom, 4) => (*bus, *rest),
        [bus, rest] => (*bus, *rest),
        _ => return false,
    };
    matches!(rest.split_once('.'), Some((dev, f)) if hex(bus, 2) && hex(dev, 2) && hex(f, 1))
}

/// A device argument that names nothing of the host: `key=value` of letters, digits and
/// `_ - . :` (no path, no `/`), or a bare key.
fn harmless_arg(a: &str) -> bool {
    !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "_-.:=".contains(c))
}

impl DpdkConfig {
    /// Whether a port added or changed at run time, or read from the port directory, may use
    /// DPDK device `device`. A device string is DPDK's to interpret, and several drivers take
    /// arguments that name files (`net_pcap`'s `tx_pcap` truncates one), sockets
    /// (`net_vhost`'s `iface` listens anywhere) or host interfaces (`net_af_packet`,
    /// `net_tap`): whoever may add ports at run time (an orchestrator's hook) must not reach
    /// the host through them. So: a PCI address, with arguments that name no path; or a
    /// virtual device the main file grants in `[dpdk] runtime_vdevs`, either as the whole
    /// device string, or, for a grant of a bare driver name (`"net_null"`), an instance of
    /// that driver (`net_null3`) without arguments.
    pub fn runtime_device(&self, device: &str) -> Result<(), String> {
        let (name, args) = match device.split_once(',') {
            Some((n, a)) => (n.trim(), Some(a)),
            None => (device.trim(), None),
        };
        if is_pci_address(name) {
            return match args.into_iter().flat_map(|a| a.split(',')).find(|a| !harmless_arg(a.trim())) {
                Some(bad) => Err(format!(
                    "device \"{device}\": argument \"{bad}\" is not allowed at run time (arguments of letters, digits and _ - . : only)"
                )),
                None => Ok(()),
            };
        }
        let driver = name.trim_end_matches(|c: char| c.is_ascii_digit());
        let granted = self.runtime_vdevs.iter().any(|g| {
            let g = g.trim();
            g == device.trim() || (!g.contains(',') && g == driver && args.is_none() && driver.len() < name.len())
        });
        if granted {
            return Ok(());
        }
        let grants = match self.runtime_vdevs.is_empty() {
            true => "none is granted".to_string(),
            false => format!("granted: {}", self.runtime_vdevs.join(", ")),
        };
        Err(format!(
            "device \"{device}\": a port added at run time may use a PCI address, or a virtual device the main configuration file grants in [dpdk] runtime_vdevs ({grants})"
        ))
    }
}

/// The section, or its defaults when the file has none.
pub(super) fn validate(raw: Option<RawDpdk>, cx: &Ctx) -> Result<DpdkConfig, ConfigError> {
    let Some(d) = raw else {
        return Ok(DpdkConfig::default());
    };
    let nic_poll_interval_us =
        cx.range(&d.nic_poll_interval_us, "nic_poll_interval_us", 1, 1_000_000, DEFAULT_NIC_POLL_INTERVAL_US)?;
    let nic_poll_max_us = cx.range(
        &d.nic_poll_max_us,
        "nic_poll_max_us",
        nic_poll_interval_us,
        1_000_000,
        DEFAULT_NIC_POLL_MAX_US.max(nic_poll_interval_us),
    )?;
    Ok(DpdkConfig {
        mbufs: cx.range(&d.mbufs, "mbufs", 1023, 1 << 24, DEFAULT_MBUFS)?,
        nic_poll_interval_us,
        nic_poll_max_us,
        eal_args: d.eal_args,
        runtime_vdevs: runtime_vdevs(d.runtime_vdevs, cx)?,
    })
}

/// `runtime_vdevs`: virtual device strings or driver names, never a PCI address (those need
/// no grant).
fn runtime_vdevs(raw: Option<Vec<toml::Spanned<String>>>, cx: &Ctx) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for v in raw.unwrap_or_default() {
        let s = v.get_ref().trim();
        let name = s.split(',').next().unwrap_or("").trim();
        if name.is_empty() || is_pci_address(name) {
            return Err(cx.err(
                Some(v.span()),
                format!("runtime_vdevs: expected a virtual device (\"net_null\", \"net_af_packet1,iface=eth1\"), found \"{s}\""),
            ));
        }
        out.push(s.to_string());
    }
    Ok(out)
}
