//! A capture as pcapng (what `tcpdump -r` and `tshark -r` read), written by the `pcap-file`
//! crate: a section, one interface per captured port (named after it, nanosecond times), an
//! enhanced packet block per record (its direction in the flags, a drop's reason as its
//! comment), and at the end each interface's statistics (frames seen, matched, lost).
#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::time::Duration;

use pcap_file::DataLink;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::blocks::interface_statistics::{InterfaceStatisticsBlock, InterfaceStatisticsOption};

use super::{Counts, Record, Way};

/// pcapng's `epb_flags` direction: inbound, outbound.
const INBOUND: u32 = 1;
const OUTBOUND: u32 = 2;

/// pcapng bytes, built in memory and taken as they are made.
pub struct PcapNg {
    w: PcapNgWriter<Vec<u8>>,
}

impl PcapNg {
    /// A section with one interface per name in `ifaces` (each `(name, description)`).
    pub fn new(ifaces: &[(String, String)], snaplen: u32) -> Result<PcapNg, String> {
        let mut w = PcapNgWriter::new(Vec::new()).map_err(|e| e.to_string())?;
        for (name, desc) in ifaces {
            let idb = InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen,
                options: vec![
                    InterfaceDescriptionOption::IfName(Cow::Borrowed(name)),
                    InterfaceDescriptionOption::IfDescription(Cow::Borrowed(desc)),
                    InterfaceDescriptionOption::IfTsResol(9),
                ],
            };
            w.write_pcapng_block(idb).map_err(|e| e.to_string())?;
        }
        Ok(PcapNg { w })
    }

    /// One record; `drop`: the name of the reason it was dropped for.
    pub fn packet(&mut self, r: &Record, drop: Option<&str>) -> Result<(), String> {
        let mut options = vec![EnhancedPacketOption::Flags(match r.way {
            Way::In => INBOUND,
            Way::Out => OUTBOUND,
        })];
        if let Some(why) = drop {
            options.push(EnhancedPacketOption::Comment(Cow::Owned(format!("dropped: {why}"))));
        }
        let epb = EnhancedPacketBlock {
            interface_id: r.iface,
            timestamp: Duration::from_nanos(r.time_ns),
            original_len: r.len,
            data: Cow::Borrowed(r.data),
            options,
        };
        self.w.write_pcapng_block(epb).map(|_| ()).map_err(|e| e.to_string())
    }

    /// Interface `iface`'s statistics at `time_ns`: frames it saw, the filter took, were lost.
    pub fn stats(&mut self, iface: u32, time_ns: u64, Counts { seen, matched, lost }: Counts) -> Result<(), String> {
        let isb = InterfaceStatisticsBlock {
            interface_id: iface,
            timestamp: time_ns,
            options: vec![
                InterfaceStatisticsOption::IsbIfRecv(seen),
                InterfaceStatisticsOption::IsbFilterAccept(matched),
                InterfaceStatisticsOption::IsbOsDrop(lost),
                InterfaceStatisticsOption::IsbUsrDeliv(matched - lost.min(matched)),
            ],
        };
        self.w.write_pcapng_block(isb).map(|_| ()).map_err(|e| e.to_string())
    }

    /// The bytes made since the last call.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.w.get_mut())
    }

    /// How many bytes wait to be taken.
    pub fn pending(&self) -> usize {
        self.w.get_ref().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::{Block, PcapNgReader};

    #[test]
    fn what_is_written_reads_back() {
        let mut p = PcapNg::new(&[("vm1".into(), "pvswitch port vm1".into())], 1500).unwrap();
        let data = [0xaau8; 60];
        let r =
            Record { iface: 0, way: Way::Out, drop: None, len: 70, time_ns: 1_500_000_123, verdict: None, data: &data };
        p.packet(&r, Some("port_security")).unwrap();
        p.stats(0, 1_600_000_000, Counts { seen: 5, matched: 1, lost: 0 }).unwrap();
        let bytes = p.take();
        assert_eq!(p.pending(), 0);
        let mut rd = PcapNgReader::new(&bytes[..]).unwrap();
        let mut epbs = 0;
        while let Some(b) = rd.next_block() {
            if let Block::EnhancedPacket(e) = b.unwrap() {
                assert_eq!((e.original_len, e.data.len(), e.timestamp.as_nanos()), (70, 60, 1_500_000_123));
                assert!(e.options.contains(&EnhancedPacketOption::Flags(OUTBOUND)));
                assert!(
                    e.options
                        .iter()
                        .any(|o| matches!(o, EnhancedPacketOption::Comment(c) if c.contains("port_security")))
                );
                epbs += 1;
            }
        }
        assert_eq!(epbs, 1);
    }
}
