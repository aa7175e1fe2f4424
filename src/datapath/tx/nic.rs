//! A poll thread's transmit bursts toward NIC ports (`TxBatches`): one pending burst per NIC
//! port, flushed with one `tx_burst` when full, at the end of each delivery and of each loop
//! iteration; `NicDest` names one destination. Without the cargo feature `dpdk` `TxBatches` is
//! empty and no NIC port exists.

use crate::datapath::counters::PortCounters;
use crate::port::nic::NicPort;

/// A NIC port frames are written to, from one poll thread: its id, the port, the thread's index
/// and the thread's counters for the port.
#[derive(Clone, Copy)]
pub struct NicDest<'a> {
    pub id: u16,
    pub nic: &'a NicPort,
    pub thread: usize,
    pub pc: &'a PortCounters,
}

#[cfg(feature = "dpdk")]
pub use imp::*;
#[cfg(not(feature = "dpdk"))]
pub use stub::*;

#[cfg(feature = "dpdk")]
mod imp {
    use super::NicDest;
    use crate::datapath::counters::{DropReason, PortCounters, ThreadStats, bump};
    use crate::datapath::frame::{Frame, Shape};
    use crate::datapath::plan::PortTable;
    use crate::port::dpdk::{self, MbufBurst};
    use crate::port::nic::NicPort;
    use crate::wire::gso::DeviceJob;

    /// One NIC port's pending transmit burst, and fresh mbufs for it.
    #[derive(Default)]
    struct Batch {
        burst: MbufBurst,
        spare: MbufBurst,
        /// Some frame in `burst` asks the device for offloads (the driver prepares the burst).
        offloaded: bool,
    }

    impl Batch {
        /// A fresh mbuf, from the pool a burst at a time.
        #[inline]
        fn mbuf(&mut self, pool: &dpdk::Mempool) -> Option<dpdk::Mbuf> {
            if self.spare.is_empty() && self.spare.alloc(pool, dpdk::BURST).is_err() {
                return None;
            }
            self.spare.pop()
        }
    }

    /// A poll thread's pending transmit bursts, one per NIC port (by port id).
    #[derive(Default)]
    pub struct TxBatches {
        batches: Vec<Option<Box<Batch>>>,
        /// Ports with frames waiting.
        dirty: Vec<u16>,
    }

    impl TxBatches {
        /// Copies frame `src` as shape `e` has it into a new mbuf and queues it for the NIC
        /// port `to`; a full batch is sent at once.
        #[inline]
        pub(in crate::datapath) fn write(&mut self, to: &NicDest, src: &Frame, e: Shape) -> Result<u32, DropReason> {
            self.write_under(to, 0, |_| {}, src, e)
        }

        /// `write` with `outer` bytes in front of the frame, written by `fill` straight into
        /// the mbuf (a tunnel's headers; `e.patch` is at an offset in the frame after them).
        #[inline(always)]
        pub(in crate::datapath) fn write_under(
            &mut self,
            to: &NicDest,
            outer: usize,
            fill: impl FnOnce(&mut [u8]),
            src: &Frame,
            e: Shape,
        ) -> Result<u32, DropReason> {
            let NicDest { id, nic, thread, pc } = *to;
            let (prefix, off, patch) = (e.prefix, e.skip, e.patch);
            let total = outer + prefix.len() + e.body_len(src) as usize;
            let batch = self.batch(id);
            let Some(mut m) = batch.mbuf(nic.pool()) else { return Err(DropReason::NicTxFull) };
            let Some(room) = u16::try_from(total).ok().and_then(|t| m.append(t)) else {
                let _ = batch.spare.push(m);
                return Err(DropReason::Mtu);
            };
            let (head, room) = room.split_at_mut(outer);
            fill(head);
            if !prefix.is_empty() {
                room[..prefix.len()].copy_from_slice(prefix);
            }
            src.read_at(off, &mut room[prefix.len()..]);
            if let Some((at, v)) = patch
                && let Some(field) = room.get_mut(at as usize..at as usize + 2)
            {
                field.copy_from_slice(&v.to_be_bytes());
            }
            self.queue(id, m, false, nic, thread, pc);
            Ok(total as u32)
        }

        /// Copies a frame as `write` does, whole, into a chain of mbufs as long as it needs,
        /// and asks the device to finish it as `job` says (segment it, compute its checksums).
        pub(in crate::datapath) fn write_for_device(
            &mut self,
            to: &NicDest,
            src: &Frame,
            e: Shape,
            job: &DeviceJob,
        ) -> Result<u32, DropReason> {
            let NicDest { id, nic, thread, pc } = *to;
            let (prefix, off) = (e.prefix, e.skip);
            let total = prefix.len() + e.body_len(src) as usize;
            let batch = self.batch(id);
            let mut head: Option<dpdk::Mbuf> = None;
            let (mut done, mut segs) = (0usize, 0u16);
            while done < total {
                // Dropping `head` on the way out frees the chain built so far.
                if segs == nic.max_segs() {
                    return Err(DropReason::NicRefused);
                }
                let Some(mut m) = batch.mbuf(nic.pool()) else { return Err(DropReason::NicTxFull) };
                let n = m.tailroom().min(total - done).min(u16::MAX as usize);
                let Some(room) = m.append(n as u16) else { return Err(DropReason::NicTxFull) };
                // The prefix's part of this segment, then the sender's bytes.
                let p = prefix.get(done..).unwrap_or(&[]);
                let from_prefix = p.len().min(n);
                room[..from_prefix].copy_from_slice(&p[..from_prefix]);
                if from_prefix < n {
                    let body_at = (done + from_prefix - prefix.len()) as u32;
                    src.read_at(off + body_at, &mut room[from_prefix..]);
                }
                done += n;
                segs += 1;
                match head.as_mut() {
                    None => head = Some(m),
                    Some(h) => h.chain(m).map_err(|_| DropReason::NicRefused)?,
                }
            }
            let Some(mut m) = head else { return Err(DropReason::Runt) };
            let first = m.data_mut();
            for (at, v) in job.fields {
                if let Some(field) = first.get_mut(at as usize..at as usize + 2) {
                    field.copy_from_slice(&v.to_be_bytes());
                }
            }
            m.set_tx_offload(tx_flags(job), job.l2, job.l3, job.l4, job.tso.unwrap_or(0));
            self.queue(id, m, true, nic, thread, pc);
            Ok(total as u32)
        }

        /// Queues a frame of the switch's own (`bytes`: an ARP reply or request) on port `to`.
        pub(in crate::datapath) fn write_bytes(&mut self, to: &NicDest, bytes: &[u8]) -> Result<(), DropReason> {
            let NicDest { id, nic, thread, pc } = *to;
            let batch = self.batch(id);
            let Some(mut m) = batch.mbuf(nic.pool()) else { return Err(DropReason::NicTxFull) };
            let Some(room) = m.append(bytes.len() as u16) else {
                let _ = batch.spare.push(m);
                return Err(DropReason::Mtu);
            };
            room.copy_from_slice(bytes);
            self.queue(id, m, false, nic, thread, pc);
            Ok(())
        }

        /// NIC port `id`'s batch (made on first use).
        #[inline]
        fn batch(&mut self, id: u16) -> &mut Batch {
            let i = id as usize;
            if self.batches.len() <= i {
                self.batches.resize_with(i + 1, || None);
            }
            self.batches[i].get_or_insert_with(Default::default)
        }

        /// Queues a written mbuf (`offloaded`: it asks the device for offloads) on port `id`'s
        /// batch; a full batch is sent at once. Inlined into each write (once a frame); the
        /// send is not.
        #[inline(always)]
        fn queue(&mut self, id: u16, m: dpdk::Mbuf, offloaded: bool, nic: &NicPort, thread: usize, pc: &PortCounters) {
            let Some(Batch { burst: b, offloaded: any, .. }) = self.batches[id as usize].as_deref_mut() else {
                return;
            };
            if b.is_empty() {
                self.dirty.push(id);
            }
            *any |= offloaded;
            let _ = b.push(m);
            if b.is_full() {
                flush_one(b, any, nic, thread, pc);
                self.dirty.retain(|&d| d != id);
            }
        }

        #[inline]
        pub fn is_empty(&self) -> bool {
            self.dirty.is_empty()
        }

        /// Sends every pending batch with one tx_burst each.
        #[inline]
        pub fn flush(&mut self, ports: &PortTable, thread: usize, st: &ThreadStats) {
            for id in self.dirty.drain(..) {
                let Some(Batch { burst: b, offloaded, .. }) = self.batches[id as usize].as_deref_mut() else {
                    continue;
                };
                let pc = &st.ports[id as usize];
                match ports.get(id).and_then(|p| p.nic()) {
                    Some(nic) => flush_one(b, offloaded, nic, thread, pc),
                    None => {
                        pc.drop(DropReason::PortDown, b.len() as u64);
                        b.clear();
                        *offloaded = false;
                    }
                }
            }
        }
    }

    /// The mbuf offload flags (`RTE_MBUF_F_TX_*`) asking a device to do `job`.
    fn tx_flags(job: &DeviceJob) -> u64 {
        use dpdk::offload::*;
        let ip = if job.v6 { MBUF_F_TX_IPV6 } else { MBUF_F_TX_IPV4 };
        match job.tso {
            Some(_) if job.v6 => MBUF_F_TX_TCP_SEG | MBUF_F_TX_TCP_CKSUM | ip,
            Some(_) => MBUF_F_TX_TCP_SEG | MBUF_F_TX_TCP_CKSUM | ip | MBUF_F_TX_IP_CKSUM,
            None if job.udp => MBUF_F_TX_UDP_CKSUM | ip,
            None => MBUF_F_TX_TCP_CKSUM | ip,
        }
    }

    /// One tx_burst (after the driver's tx_prepare if a frame asks for offloads); what the
    /// driver refused or did not take is freed and counted (`nic_tx_refused`, `nic_tx_full`).
    #[inline(never)]
    fn flush_one(b: &mut MbufBurst, offloaded: &mut bool, nic: &NicPort, thread: usize, pc: &PortCounters) {
        let bytes: u64 = b.iter().map(|m| m.pkt_len() as u64).sum();
        let (sent, (refused, refused_bytes)) = nic.send(thread, b, std::mem::take(offloaded));
        if refused > 0 {
            pc.drop(DropReason::NicRefused, refused as u64);
        }
        let n = b.len() + sent;
        let left = b.iter().map(|m| m.pkt_len() as u64).sum::<u64>() + refused_bytes;
        b.clear();
        bump(&pc.tx_batches, (sent > 0) as u64);
        bump(&pc.tx_packets, sent as u64);
        bump(&pc.tx_bytes, bytes - left);
        if sent < n {
            pc.drop(DropReason::NicTxFull, (n - sent) as u64);
        }
    }
}

#[cfg(not(feature = "dpdk"))]
mod stub {
    use super::NicDest;
    use crate::datapath::counters::{DropReason, ThreadStats};
    use crate::datapath::frame::{Frame, Shape};
    use crate::datapath::plan::PortTable;

    #[derive(Default)]
    pub struct TxBatches {
        _none: (),
    }

    impl TxBatches {
        pub(in crate::datapath) fn write(&mut self, to: &NicDest, _: &Frame, _: Shape) -> Result<u32, DropReason> {
            match *to.nic {}
        }
        pub(in crate::datapath) fn write_under(
            &mut self,
            to: &NicDest,
            _: usize,
            _: impl FnOnce(&mut [u8]),
            _: &Frame,
            _: Shape,
        ) -> Result<u32, DropReason> {
            match *to.nic {}
        }
        pub(in crate::datapath) fn write_bytes(&mut self, to: &NicDest, _: &[u8]) -> Result<(), DropReason> {
            match *to.nic {}
        }
        pub(in crate::datapath) fn write_for_device(
            &mut self,
            to: &NicDest,
            _: &Frame,
            _: Shape,
            _: &crate::wire::gso::DeviceJob,
        ) -> Result<u32, DropReason> {
            match *to.nic {}
        }
        pub fn is_empty(&self) -> bool {
            true
        }
        pub fn flush(&mut self, _: &PortTable, _: usize, _: &ThreadStats) {}
    }
}
