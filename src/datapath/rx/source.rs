//! Where a visit's frames come from: the `Source` trait every kind of receive queue implements
//! (a guest's TX ring, `guest`; a NIC queue, `nic`; an announcement, `announce`; a VTEP's
//! underlay, `vxlan`). Only a guest's ring can hold frames back; the others default what they
//! do not need (no virtio-net header, no offloads, no descriptors walked, nothing given back).

use crate::datapath::frame::Frame;
use crate::datapath::tx::delivery::Delivery;
use crate::vring::RingError;
use crate::wire::virtio_net::Negotiated;

/// Where a visit's frames come from, borrowed for `'a` (a guest's ring through its lock guard).
pub(in crate::datapath) trait Source<'a> {
    /// Whether frames delivery cannot place yet may stay in the source (backpressure): a
    /// guest's ring; not a NIC's burst (its frames are off the wire).
    const CAN_WAIT: bool = false;
    /// Bytes in front of each frame (the sender's virtio-net header; 0 for a NIC).
    #[inline]
    fn hdr_len(&self) -> u32 {
        0
    }
    /// The offloads its frames may ask for (a guest's CSUM/HOST_TSO; none for a NIC).
    #[inline]
    fn offloads(&self) -> Negotiated {
        Negotiated::default()
    }
    /// How many frames (at most `max`) the next `take` will find; an error if the source broke.
    fn ready(&mut self, max: usize) -> Result<usize, RingError>;
    /// Takes as many frames as `frames` holds (`ready` said they are there) into `frames`
    /// (their `segs` and `head`); returns how many, and the error that broke the source after
    /// them, if one did.
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's;
    /// Puts back the last `n` frames taken: delivery could not place them yet. Only a source
    /// that can wait (`CAN_WAIT`) is asked to.
    fn give_back(&mut self, _n: usize) {
        unreachable!("only a source that can wait is given frames back")
    }
    /// Completes the frames delivery consumed (`frames` is every frame taken, in order); an
    /// interrupt the guest asked for is owed in `dv.irqs`.
    fn complete(&mut self, frames: &[Frame<'_>], consumed: usize, dv: &mut Delivery);
    /// Descriptors walked since the last call.
    #[inline]
    fn walked(&mut self) -> u32 {
        0
    }
    /// The source broke with `e`; it is not visited again until reset.
    fn broke(&mut self, _e: RingError) {}
    /// The port the frames `ready` found come from, if not the queue's own (a VTEP's underlay
    /// hands out runs of frames from each remote endpoint's tunnel port).
    #[inline]
    fn sender(&self) -> Option<u16> {
        None
    }
}
