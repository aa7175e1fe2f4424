//! A generator VM's receive side: posting buffers, draining the RX ring, and checking each
//! frame (its flow's sequence, payload and latency) as it arrives.

use super::*;

impl Port {
    /// Posts receive buffers while free descriptors last (publish with `raw_rx().publish()`).
    pub(super) fn post_rx(&mut self) {
        let l = *self.vm.layout();
        let n = self.rx_descs();
        while self.rx_free.len() >= n {
            let ids: Vec<u16> = (0..n).map(|_| self.rx_free.take().unwrap()).collect();
            let head = ids[0];
            let at = l.rx_buf(head);
            let mut rx = self.vm.raw_rx();
            if self.driver.rx_chain > 1 {
                // A long chain: the buffer's bytes in its first descriptor, then n - 1 of
                // length zero (a chain may have 256 descriptors, but only 64 with bytes).
                for k in 0..n {
                    let last = k + 1 == n;
                    let len = match (k, self.driver.rx_claim) {
                        (_, claim) if claim > 0 => claim,
                        (0, _) => self.rx_buf,
                        _ => 0,
                    };
                    let next = if last { 0 } else { ids[k + 1] };
                    let flags = if last { F_WRITE } else { F_WRITE | F_NEXT };
                    rx.desc(ids[k], Desc { addr: at, len, flags, next });
                }
                rx.stage(head);
                if self.driver.in_order {
                    self.rx_order.push_back(head);
                }
                self.rx_long[head as usize] = ids;
                continue;
            }
            if n == 1 {
                let len = if self.driver.rx_claim > 0 { self.driver.rx_claim } else { self.rx_buf };
                rx.desc(head, Desc { addr: at, len, flags: F_WRITE, next: 0 });
            } else {
                rx.desc(head, Desc { addr: at, len: HDR_LEN as u32, flags: F_WRITE | F_NEXT, next: ids[1] });
                let rest = if self.driver.rx_claim > 0 { self.driver.rx_claim } else { self.rx_buf - HDR_LEN as u32 };
                rx.desc(ids[1], Desc { addr: at + HDR_LEN as u64, len: rest, flags: F_WRITE, next: 0 });
            }
            rx.stage(head);
            self.rx_chain[head as usize][..n].copy_from_slice(&ids);
            if self.driver.in_order {
                self.rx_order.push_back(head);
            }
        }
        self.vm.raw_rx().publish();
    }

    /// Drains the RX ring, handles every frame, and gives the buffers back.
    pub(super) fn poll_rx(&mut self, phase: Phase) {
        if self.driver.no_drain {
            return;
        }
        let now = now_ns();
        if !self.look_at(0, now) {
            return;
        }
        let mut echoed = false;
        let mut any = false;
        loop {
            let used = self.vm.raw_rx().used_idx();
            while let Some((id, len)) = self.vm.raw_rx().next_used(used) {
                any = true;
                echoed |= self.rx_buffer(id, len as usize, phase, now);
            }
            if !self.driver.interrupts {
                break;
            }
            let mut rx = self.vm.raw_rx();
            rx.want_interrupts(true);
            if rx.used_idx() == rx.last_used() {
                break;
            }
        }
        if any {
            self.post_rx();
        }
        if echoed {
            self.vm.raw_tx().publish();
        }
    }

    /// One used receive buffer: the start of a frame, or (MRG_RXBUF) more of one. Returns
    /// whether a pong was staged.
    #[inline]
    fn rx_buffer(&mut self, id: u32, len: usize, phase: Phase, now: u64) -> bool {
        let l = *self.vm.layout();
        assert!(id < l.qsize as u32, "the switch returned RX descriptor {id}");
        let head = id as u16;
        if self.driver.in_order && self.rx_order.pop_front() != Some(head) {
            self.c.misordered += 1;
        }
        if self.driver.rx_chain > 1 {
            for &d in &self.rx_long[head as usize] {
                self.rx_free.give(d);
            }
        } else {
            let n = self.rx_descs();
            for &d in &self.rx_chain[head as usize][..n] {
                self.rx_free.give(d);
            }
        }
        let at = l.rx_buf(head);
        if let Some(mut p) = self.rx_partial.take() {
            // More of a frame spread over buffers: check its bytes, count them.
            if self.driver.verify {
                let seq = u64::from_le_bytes(p.h[24..32].try_into().unwrap());
                let got = self.vm.mem.read(at, len);
                p.corrupt |= got.iter().enumerate().any(|(i, &b)| b != pattern(seq, p.len + i));
            }
            p.len += len;
            p.left -= 1;
            if p.left > 0 {
                self.rx_partial = Some(p);
                return false;
            }
            return self.rx_frame(p, phase, now);
        }
        self.c.rx_frames += 1;
        if len == 0 {
            // A buffer given back unused (a frame did not fit it).
            return false;
        }
        let mut hdr = [0u8; HDR_LEN];
        self.vm.mem.read_into(at, &mut hdr[..len.min(HDR_LEN)]);
        let nbufs = if self.driver.mrg_rxbuf { u16::from_le_bytes([hdr[10], hdr[11]]) } else { 1 };
        let flen = len.saturating_sub(HDR_LEN);
        let mut p = Partial {
            h: [0u8; PROBE_LEN],
            len: flen,
            left: nbufs.saturating_sub(1),
            corrupt: nbufs == 0,
            segment: false,
        };
        if flen >= PROBE_LEN {
            self.vm.mem.read_into(at + HDR_LEN as u64, &mut p.h);
            if p.h[12..14] == [0x08, 0x00] && p.h[23] == 6 {
                // TCP/IPv4: a segment of a TSO sender's frame. Its probe fields, if it is the
                // first segment, follow the TCP header (within the first buffer: a receive
                // buffer has room for 80 bytes of frame).
                p.segment = true;
                let tail = TSO_PROBE_END - TSO_HDRS;
                if flen >= TSO_PROBE_END && len >= HDR_LEN + TSO_PROBE_END {
                    let mut f = [0u8; TSO_PROBE_END - TSO_HDRS];
                    self.vm.mem.read_into(at + (HDR_LEN + TSO_HDRS) as u64, &mut f);
                    p.h[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
                    p.h[14..14 + tail].copy_from_slice(&f);
                } else {
                    p.h[14..18].fill(0);
                }
            }
            if self.driver.verify && flen > PROBE_LEN {
                let seq = u64::from_le_bytes(p.h[24..32].try_into().unwrap());
                let got = self.vm.mem.read(at + (HDR_LEN + PROBE_LEN) as u64, flen - PROBE_LEN);
                p.corrupt |= got.iter().enumerate().any(|(i, &b)| b != pattern(seq, PROBE_LEN + i));
            }
        }
        if p.left > 0 {
            self.rx_partial = Some(p);
            return false;
        }
        self.rx_frame(p, phase, now)
    }

    /// One whole received frame. Returns whether a pong was staged.
    fn rx_frame(&mut self, p: Partial, phase: Phase, now: u64) -> bool {
        let (h, len) = (p.h, p.len);
        if p.corrupt {
            self.c.corrupt += 1;
        }
        if p.segment {
            self.c.segments += 1;
            self.c.received_bytes += len as u64;
            if h[14..18] != MAGIC.to_le_bytes() {
                // A later segment: no probe fields.
                return false;
            }
        }
        let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        let src = u16_at(20) as usize;
        if len < PROBE_LEN
            || h[12..14] != ETHERTYPE.to_be_bytes()
            || h[14..18] != MAGIC.to_le_bytes()
            || src >= self.flows.len()
            || (h[0..6] != self.mac && h[0..6] != BCAST)
        {
            self.c.foreign += 1;
            return false;
        }
        let (seq, ts) = (u64_at(24), u64_at(32));
        match h[18] {
            KIND_DATA => match &mut self.flows[src] {
                Some(f) => {
                    f.record(seq);
                    self.c.received += 1;
                    if !p.segment {
                        self.c.received_bytes += len as u64;
                    }
                    self.latency.record(now.saturating_sub(ts));
                }
                None => self.c.foreign += 1,
            },
            KIND_HELLO => {
                self.c.hellos_received += 1;
                self.have_hello[src] = true;
            }
            KIND_PING if self.role == Role::Pong => {
                self.c.pings_received += 1;
                if phase == Phase::Measure {
                    let to: [u8; 6] = h[6..12].try_into().unwrap();
                    if self.put(to, KIND_PONG, seq, ts) {
                        self.c.pongs_sent += 1;
                        return true;
                    }
                }
            }
            KIND_PONG if self.role == Role::Ping => {
                self.c.pongs_received += 1;
                if self.ping.is_some_and(|(s, _)| s == seq) {
                    self.rtt.record(now_ns().saturating_sub(ts));
                    self.ping = None;
                }
            }
            _ => self.c.foreign += 1,
        }
        false
    }
}
