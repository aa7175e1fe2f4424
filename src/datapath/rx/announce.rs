//! An announcement the switch sends on a port's behalf (a migrated guest's RARP): a one-frame
//! source of the switch's own bytes, entering as if the port had sent it.

use super::source::Source;
use crate::datapath::frame::Frame;
use crate::datapath::tx::delivery::Delivery;
use crate::vring::RingError;

/// An announcement the switch sends on a port's behalf (the RARP of a migrated guest): one
/// frame of the switch's own, entering as if the port had sent it.
pub(in crate::datapath) struct Announcement<'a> {
    pub frame: &'a [u8],
    pub sent: bool,
}

impl<'a> Source<'a> for Announcement<'a> {
    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        Ok(if self.sent { 0 } else { max.min(1) })
    }

    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        frames[0].source_bytes(self.frame);
        frames[0].head = 0;
        frames[0].valid = false;
        (1, None)
    }

    fn complete(&mut self, _: &[Frame<'_>], consumed: usize, _: &mut Delivery) {
        self.sent |= consumed > 0;
    }
}
