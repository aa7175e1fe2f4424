//! A guest's TX virtqueue as a source of frames: popped under the ring's lock, completed with
//! one used-index store and at most one interrupt, given back when delivery must wait.

use super::source::Source;
use crate::datapath::frame::Frame;
use crate::datapath::ring_broke;
use crate::datapath::tx::delivery::Delivery;
use crate::port::Port;
use crate::vring::{Ahead, RingError, RingLoan};
use crate::wire::virtio_net::Negotiated;

/// A guest's TX virtqueue, locked for the visit.
pub(in crate::datapath) struct GuestTx<'a> {
    pub port: &'a Port,
    pub vq_index: usize,
    pub ring: RingLoan<'a>,
    pub broken: &'a mut Option<RingError>,
    pub hdr_len: u32,
    pub offloads: Negotiated,
}

impl<'a> Source<'a> for GuestTx<'a> {
    const CAN_WAIT: bool = true;

    fn hdr_len(&self) -> u32 {
        self.hdr_len
    }

    fn offloads(&self) -> Negotiated {
        self.offloads
    }

    #[inline]
    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        Ok((self.ring.avail()? as usize).min(max))
    }

    #[inline]
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        // A header that is never read (no offloads negotiated) is not fetched either.
        let ahead = Ahead::Read(if self.offloads.any() { 0 } else { self.hdr_len });
        for (got, f) in frames.iter_mut().enumerate() {
            self.ring.prefetch_ahead(ahead);
            match self.ring.pop(f.source_mut(), false) {
                Ok(head) => f.head = head,
                Err(e) => return (got, Some(e)),
            }
            f.valid = false;
        }
        (frames.len(), None)
    }

    fn give_back(&mut self, n: usize) {
        self.ring.unpop(n as u16);
    }

    #[inline]
    fn complete(&mut self, frames: &[Frame<'_>], consumed: usize, dv: &mut Delivery) {
        for f in &frames[..consumed] {
            self.ring.push_used(f.head, 0);
        }
        if self.ring.publish()
            && let Some(call) = self.ring.call()
        {
            if call.is_stuck() {
                ring_broke(self.port, self.vq_index, self.broken, RingError::CallBlocked);
            } else {
                dv.irqs.owe(call);
            }
        }
    }

    #[inline]
    fn walked(&mut self) -> u32 {
        self.ring.take_walked()
    }

    fn broke(&mut self, e: RingError) {
        ring_broke(self.port, self.vq_index, self.broken, e);
    }
}
