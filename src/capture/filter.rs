//! A capture's filter: a pcap-filter(7) expression (what tcpdump takes), compiled to classic
//! BPF by libpcap's own compiler (through the `pcap` crate) and run by libpcap's interpreter
//! over the frame where it is, on the poll thread. No filter language of our own.
#![forbid(unsafe_code)]

/// A compiled filter, for Ethernet frames.
pub struct Filter(pcap::BpfProgram);

impl Filter {
    /// Compiles `expr` (`tcp port 5201`, `icmp or arp`, `vlan 100 and host 10.0.0.1`).
    pub fn compile(expr: &str) -> Result<Filter, String> {
        if expr.contains('\0') {
            return Err("filter: a NUL byte in the expression".into());
        }
        let dead = pcap::Capture::dead(pcap::Linktype::ETHERNET).map_err(|e| format!("filter: libpcap: {e}"))?;
        dead.compile(expr, true).map(Filter).map_err(|e| format!("filter \"{expr}\": {e}"))
    }

    /// Whether the frame whose first bytes are `data` matches (a filter on the length, such
    /// as `greater 1000`, sees the bytes kept: the pcap crate passes no other).
    #[inline]
    pub fn matches(&self, data: &[u8]) -> bool {
        self.0.filter(data)
    }
}
