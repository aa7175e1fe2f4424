//! Command line: what each VM sends, and how the generator runs.

use std::path::PathBuf;

/// Where a VM's frames go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dst {
    /// Unicast to the VM of this name (its MAC, learned by the switch from its hello).
    Vm(String),
    /// To ff:ff:ff:ff:ff:ff: every other port.
    Bcast,
    /// Nothing: the VM only receives.
    None,
}

/// One VM: a vhost-user socket and the stream it sends.
#[derive(Clone, Debug)]
pub struct VmSpec {
    pub name: String,
    pub socket: PathBuf,
    pub dst: Dst,
    /// Ethernet frame length in bytes (no virtio-net header, no FCS), 60 to 9000 (to 65535
    /// with `driver.tso`).
    pub size: usize,
    /// Frames per second, or None: as fast as the ring allows.
    pub rate: Option<f64>,
    /// How its virtio-net driver behaves.
    pub driver: Driver,
}

/// Which free descriptor a driver uses next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reuse {
    /// The one freed last (what a stack of free ids gives).
    #[default]
    Lifo,
    /// The one freed first.
    Fifo,
    /// Any.
    Random,
}

/// The ways real virtio-net drivers differ, as knobs. The default is the generator's fast
/// driver: one descriptor per frame, polling with interrupts suppressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Driver {
    /// Negotiate EVENT_IDX (used_event / avail_event instead of the flags).
    pub event_idx: bool,
    /// Negotiate INDIRECT_DESC and send every frame through an indirect table.
    pub indirect: bool,
    /// Negotiate IN_ORDER (and check the switch uses buffers in order).
    pub in_order: bool,
    /// Negotiate MRG_RXBUF: a frame may span several receive buffers.
    pub mrg_rxbuf: bool,
    /// Ask for interrupts and look at the used rings only when interrupted (else: poll with
    /// interrupts suppressed).
    pub interrupts: bool,
    pub reuse: Reuse,
    /// Descriptors per frame: 1 (header and frame together), 2 (header apart), 3 (the frame in
    /// two pieces as well). Receive buffers without MRG_RXBUF are chained the same way.
    pub chain: u8,
    /// Ring size for this VM (None: `--qsize`).
    pub qsize: Option<u16>,
    /// Receive buffer size in bytes (None: room for the largest frame).
    pub rx_buf: Option<u32>,
    /// Fill every frame's payload with a pattern and check it on arrival.
    pub verify: bool,
    /// A hostile driver's TX chains: this many zero-length descriptors in every frame's
    /// indirect table (needs `indirect`), to make each frame more descriptors to walk.
    pub pad: u8,
    /// A hostile driver's source MACs: data frames cycle through this many (0: its own only),
    /// to fill the switch's MAC table.
    pub src_macs: u32,
    /// A hostile driver's interrupts: once set up, it raises its RX call eventfd's counter to
    /// the maximum, clears O_NONBLOCK on it and asks for interrupts, so that the switch's next
    /// write to it would block.
    pub block_call: bool,
    /// Never takes what arrives in its RX ring (`drain=0`): the ring fills and stays full, as a
    /// guest's that stopped reading (what a flood meets at a thousand idle VMs).
    pub no_drain: bool,
    /// Descriptors per receive buffer (0 or 1: as `chain` says): each posted buffer is a chain
    /// of this many device-writable descriptors, its `rx_buf` bytes in the first and the
    /// others of length zero (the switch takes a chain of up to 256 descriptors, of which at
    /// most 64 with bytes). With small buffers, a hostile receiver whose frames take many
    /// descriptors to write.
    pub rx_chain: u16,
    /// A hostile receiver's claims (0: honest): every receive descriptor says it holds this
    /// many bytes (up to 4 GiB - 1), all of them starting at its buffer, and guest memory is
    /// made large enough (sparse) for the claims to be valid. With `log`, the buffers a
    /// migrating VM's switch must mark are as large as it says (issue 48's F1).
    pub rx_claim: u32,
    /// TCP segmentation (0: off): negotiate CSUM and HOST_TSO4 and send every data frame as
    /// TCP/IPv4 with a virtio-net header asking for TSO with this MSS (88..65535). The
    /// generator never negotiates GUEST_TSO4, so a receiving VM gets the segments the switch
    /// cuts; the probe fields follow the TCP header and arrive in the first segment.
    pub tso: u16,
    /// Ack LOG_ALL and give the switch a dirty log, as a VMM does while it migrates the VM;
    /// the generator syncs (reads and clears) it every 10 ms, as QEMU's migration does.
    pub dirty_log: bool,
}

impl Driver {
    /// The virtio features it acks.
    pub fn features(&self) -> u64 {
        use crate::frontend::{CSUM, EVENT_IDX, HOST_TSO4, IN_ORDER, INDIRECT, MRG_RXBUF};
        let mut f = crate::frontend::FEATURES & !INDIRECT;
        for (on, bit) in [
            (self.event_idx, EVENT_IDX),
            (self.indirect, INDIRECT),
            (self.in_order, IN_ORDER),
            (self.mrg_rxbuf, MRG_RXBUF),
            (self.tso > 0, CSUM | HOST_TSO4),
            (self.dirty_log, crate::frontend::LOG_ALL),
        ] {
            if on {
                f |= bit;
            }
        }
        f
    }

    /// Descriptors per frame (at least 1).
    pub fn chain(&self) -> u16 {
        self.chain.max(1) as u16
    }

    /// Descriptors per receive buffer: `rx_chain` if set, else one with MRG_RXBUF, else header
    /// and data apart when the driver chains (at most two).
    pub fn rx_descs(&self) -> u16 {
        if self.rx_chain > 1 {
            self.rx_chain
        } else if self.mrg_rxbuf {
            1
        } else {
            self.chain().min(2)
        }
    }

    /// Bytes of a frame's indirect table (its pieces and padding), rounded up to 64.
    pub fn table_len(&self) -> u64 {
        (16 * (self.chain() as u64 + self.pad as u64)).div_ceil(64) * 64
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    /// One generator thread per listed CPU, pinned to it; VM i is served by thread i mod n.
    pub cpus: Vec<usize>,
    /// Measurement time after every VM has announced itself.
    pub seconds: f64,
    pub vms: Vec<VmSpec>,
    /// (pinger, ponger): the first sends one frame, the second echoes it, one in flight.
    pub pingpong: Option<(String, String)>,
    /// Entries per virtqueue.
    pub qsize: u16,
    /// Most frames put on a TX ring per poll.
    pub burst: u16,
    /// A thread's pass over its VMs that moved no frame is followed by a sleep this long (0:
    /// none): a thread of a thousand quiet VMs need not take its CPU.
    pub idle_sleep_us: u32,
    pub json: Option<PathBuf>,
    /// Don't print the table.
    pub quiet: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            cpus: vec![0],
            seconds: 5.0,
            vms: Vec::new(),
            pingpong: None,
            qsize: 256,
            burst: 32,
            idle_sleep_us: 0,
            json: None,
            quiet: false,
        }
    }
}

pub const USAGE: &str = "\
usage: pvsgen [--cpus LIST] [--seconds S] [--qsize N] [--burst N] [--json FILE] [--quiet]
              [--pingpong VM_A,VM_B] --vm SPEC [--vm SPEC ...]

One process acting as many VMs, each a vhost-user frontend of one of the switch's sockets.
  --cpus LIST      CPUs for generator threads, e.g. 0 or 0,2 or 0-3 (default 0); one thread
                   per CPU serves VMs round robin (VM i on thread i mod n)
  --seconds S      measurement time (default 5), after every VM announced its MAC
  --qsize N        virtqueue size (default 256)
  --burst N        frames put on a TX ring per poll (default 32)
  --idle-sleep-us N  after a pass over a thread's VMs that moved no frame, sleep N us (default
                   0: poll busily); for many quiet VMs (rate=) that should not take a CPU
  --json FILE      also write the report as JSON
  --pingpong A,B   A sends one frame to B, B echoes it back, A measures the round trip; one
                   frame in flight; A's rate, if given, spaces the pings 1/rate apart. A's dst and B's
                   dst/rate are ignored; other VMs run as given
  --vm SPEC        name=NAME,socket=PATH[,dst=VM|bcast|none][,size=BYTES][,rate=PPS][,DRIVER]
                   size: Ethernet frame bytes, 60..9000 (default 64; to 65535 with tso); rate: frames per second
                   (default: unlimited, as fast as the ring takes them); dst default none
                   DRIVER (how its virtio-net driver behaves; default: one descriptor per
                   frame, polling): features=event_idx+indirect+in_order+mrg,
                   notify=poll|interrupt, reuse=lifo|fifo|random, chain=1|2|3 (descriptors per
                   frame), qsize=N, rxbuf=BYTES, verify=1 (pattern-fill and check payloads),
                   log=1 (dirty logging on, as while its VMM migrates it: LOG_ALL and a
                   dirty log the generator syncs every 10 ms; pages marked are reported),
                   tso=MSS (negotiate CSUM and HOST_TSO4, send TCP/IPv4 data frames asking
                   for TSO with this MSS, 88..65535; receivers get the switch's segments)
                   HOSTILE: pad=N (N zero-length descriptors in every indirect table, 0..253;
                   needs features=indirect), srcmacs=N (data frames from N source MACs),
                   rxbuf=0 (zero-length receive buffers; needs features=mrg),
                   hostile=block-call (its RX call eventfd saturated and made blocking),
                   drain=0 (never takes what arrives: its RX ring fills and stays full),
                   rxchain=N (every receive buffer a chain of N descriptors, 1..256: rxbuf
                   bytes in the first, zero in the others; many descriptors to walk a frame),
                   rxclaim=BYTES (every receive descriptor claims BYTES from its buffer on,
                   up to 4 GiB - 1, guest memory made that large; with log=1, huge buffers
                   for the switch to mark)
";

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| format!("bad CPU list {s:?}"));
        match part.split_once('-') {
            Some((a, b)) => v.extend(num(a)?..=num(b)?),
            None => v.push(num(part)?),
        }
    }
    if v.is_empty() {
        return Err("empty CPU list".into());
    }
    Ok(v)
}

pub fn parse_vm(s: &str) -> Result<VmSpec, String> {
    let mut vm = VmSpec {
        name: String::new(),
        socket: PathBuf::new(),
        dst: Dst::None,
        size: 64,
        rate: None,
        driver: Driver::default(),
    };
    for kv in s.split(',') {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("--vm {s:?}: expected key=value, got {kv:?}"))?;
        match k {
            "name" => vm.name = v.to_string(),
            "socket" => vm.socket = PathBuf::from(v),
            "dst" => {
                vm.dst = match v {
                    "bcast" | "broadcast" => Dst::Bcast,
                    "none" => Dst::None,
                    name => Dst::Vm(name.to_string()),
                }
            }
            "size" => vm.size = v.parse().map_err(|_| format!("--vm {s:?}: bad size {v:?}"))?,
            "rate" => {
                vm.rate = match v {
                    "max" | "unlimited" => None,
                    _ => Some(v.parse::<f64>().ok().filter(|r| *r > 0.0).ok_or(format!("--vm {s:?}: bad rate {v:?}"))?),
                }
            }
            "features" => {
                for f in v.split('+').filter(|f| !f.is_empty()) {
                    match f {
                        "event_idx" => vm.driver.event_idx = true,
                        "indirect" => vm.driver.indirect = true,
                        "in_order" => vm.driver.in_order = true,
                        "mrg" | "mrg_rxbuf" => vm.driver.mrg_rxbuf = true,
                        _ => {
                            return Err(format!(
                                "--vm {s:?}: unknown feature {f:?} (event_idx, indirect, in_order, mrg)"
                            ));
                        }
                    }
                }
            }
            "notify" => {
                vm.driver.interrupts = match v {
                    "poll" => false,
                    "interrupt" | "interrupts" => true,
                    _ => return Err(format!("--vm {s:?}: notify is poll or interrupt")),
                }
            }
            "reuse" => {
                vm.driver.reuse = match v {
                    "lifo" => Reuse::Lifo,
                    "fifo" => Reuse::Fifo,
                    "random" => Reuse::Random,
                    _ => return Err(format!("--vm {s:?}: reuse is lifo, fifo or random")),
                }
            }
            "chain" => {
                vm.driver.chain =
                    v.parse().ok().filter(|c| (1..=3).contains(c)).ok_or(format!("--vm {s:?}: chain is 1, 2 or 3"))?
            }
            "qsize" => {
                let q: u16 = v.parse().map_err(|_| format!("--vm {s:?}: bad qsize {v:?}"))?;
                vm.driver.qsize = Some(q);
            }
            "rxbuf" => {
                let b: u32 = v
                    .parse()
                    .ok()
                    .filter(|b| *b == 0 || (64..=65536).contains(b))
                    .ok_or(format!("--vm {s:?}: rxbuf is 64..65536 (or 0, hostile, with features=mrg)"))?;
                vm.driver.rx_buf = Some(b);
            }
            "verify" => vm.driver.verify = v != "0",
            "log" => vm.driver.dirty_log = v != "0",
            "pad" => {
                vm.driver.pad = v.parse().ok().filter(|p| *p <= 253).ok_or(format!("--vm {s:?}: pad is 0..253"))?
            }
            "hostile" => match v {
                "block-call" => vm.driver.block_call = true,
                _ => return Err(format!("--vm {s:?}: hostile is block-call")),
            },
            "drain" => match v {
                "0" => vm.driver.no_drain = true,
                "1" => vm.driver.no_drain = false,
                _ => return Err(format!("--vm {s:?}: drain is 0 or 1")),
            },
            "rxchain" => {
                vm.driver.rx_chain =
                    v.parse().ok().filter(|c| (1..=256).contains(c)).ok_or(format!("--vm {s:?}: rxchain is 1..256"))?
            }
            "rxclaim" => {
                vm.driver.rx_claim =
                    v.parse().ok().filter(|c| *c > 0).ok_or(format!("--vm {s:?}: rxclaim is bytes, 1..4294967295"))?
            }
            "tso" => {
                vm.driver.tso =
                    v.parse().ok().filter(|m| *m >= 88).ok_or(format!("--vm {s:?}: tso is an MSS, 88..65535"))?
            }
            "srcmacs" => vm.driver.src_macs = v.parse().map_err(|_| format!("--vm {s:?}: bad srcmacs {v:?}"))?,
            _ => return Err(format!("--vm {s:?}: unknown key {k:?}")),
        }
    }
    if vm.name.is_empty() || vm.socket.as_os_str().is_empty() {
        return Err(format!("--vm {s:?}: name and socket are required"));
    }
    if vm.driver.tso > 0 {
        // Ethernet, IPv4 and TCP headers and the probe fields; IPv4's total length is 16 bits.
        if !(TSO_PROBE_END..=65535).contains(&vm.size) {
            return Err(format!("--vm {s:?}: size must be {TSO_PROBE_END}..65535 with tso"));
        }
        if vm.driver.verify {
            return Err(format!("--vm {s:?}: verify and tso do not go together"));
        }
    } else if !(60..=9000).contains(&vm.size) {
        return Err(format!("--vm {s:?}: size must be 60..9000"));
    }
    if vm.driver.rx_buf == Some(0) && !vm.driver.mrg_rxbuf {
        return Err(format!("--vm {s:?}: rxbuf=0 needs features=mrg"));
    }
    if vm.driver.pad > 0 && !vm.driver.indirect {
        return Err(format!("--vm {s:?}: pad needs features=indirect"));
    }
    Ok(vm)
}

/// Bytes of a TSO data frame the generator writes: Ethernet, IPv4 and TCP headers (54), then
/// the probe fields (26).
pub const TSO_PROBE_END: usize = 80;

/// Parses the arguments after the program name. `Ok(None)`: help was asked for.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<Config>, String> {
    let mut c = Config::default();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--cpus" => c.cpus = parse_cpus(&val("--cpus")?)?,
            "--seconds" => {
                c.seconds = val("--seconds")?.parse().ok().filter(|s: &f64| *s > 0.0).ok_or("--seconds: bad value")?
            }
            "--qsize" => c.qsize = val("--qsize")?.parse().map_err(|_| "--qsize: bad value")?,
            "--burst" => c.burst = val("--burst")?.parse().map_err(|_| "--burst: bad value")?,
            "--idle-sleep-us" => {
                c.idle_sleep_us = val("--idle-sleep-us")?.parse().map_err(|_| "--idle-sleep-us: bad value")?
            }
            "--json" => c.json = Some(PathBuf::from(val("--json")?)),
            "--quiet" => c.quiet = true,
            "--pingpong" => {
                let v = val("--pingpong")?;
                let (a, b) = v.split_once(',').ok_or("--pingpong: expected VM_A,VM_B")?;
                c.pingpong = Some((a.to_string(), b.to_string()));
            }
            "--vm" => c.vms.push(parse_vm(&val("--vm")?)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    c.validate()?;
    Ok(Some(c))
}

impl Config {
    /// Checks names, destinations and sizes.
    pub fn validate(&self) -> Result<(), String> {
        if self.vms.is_empty() {
            return Err("no --vm given".into());
        }
        if self.vms.len() > u16::MAX as usize {
            return Err("too many VMs".into());
        }
        if !self.qsize.is_power_of_two() || !(16..=32768).contains(&self.qsize) {
            return Err("--qsize must be a power of two, 16..32768".into());
        }
        if self.burst == 0 || self.burst > self.qsize {
            return Err("--burst must be 1..qsize".into());
        }
        for (i, v) in self.vms.iter().enumerate() {
            let q = v.driver.qsize.unwrap_or(self.qsize);
            if !q.is_power_of_two() || !(16..=32768).contains(&q) {
                return Err(format!("VM {:?}: qsize must be a power of two, 16..32768", v.name));
            }
            if q < 4 * v.driver.chain() {
                return Err(format!("VM {:?}: qsize {q} too small for chains of {}", v.name, v.driver.chain()));
            }
            if v.driver.rx_chain > 1 && q < v.driver.rx_chain {
                return Err(format!(
                    "VM {:?}: qsize {q} too small for receive chains of {}",
                    v.name, v.driver.rx_chain
                ));
            }
            if let Some(b) = v.driver.rx_buf
                && !v.driver.mrg_rxbuf
                && (b as usize) < v.size + 12
            {
                return Err(format!("VM {:?}: rxbuf {b} cannot hold a {}-byte frame without mrg", v.name, v.size));
            }
            if self.vms[..i].iter().any(|o| o.name == v.name) {
                return Err(format!("VM name {:?} given twice", v.name));
            }
            if let Dst::Vm(d) = &v.dst {
                if !self.vms.iter().any(|o| &o.name == d) {
                    return Err(format!("VM {:?}: dst {d:?} is not a VM", v.name));
                }
                if d == &v.name {
                    return Err(format!("VM {:?} sends to itself", v.name));
                }
            }
        }
        if let Some((a, b)) = &self.pingpong {
            for n in [a, b] {
                if !self.vms.iter().any(|o| &o.name == n) {
                    return Err(format!("--pingpong: {n:?} is not a VM"));
                }
            }
            if a == b {
                return Err("--pingpong needs two different VMs".into());
            }
        }
        Ok(())
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.vms.iter().position(|v| v.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_the_readme_example() {
        let c = parse_args(args(
            "--cpus 0 --seconds 5 --vm name=a,socket=/run/pvswitch/a.sock,dst=b,size=64 \
             --vm name=b,socket=/run/pvswitch/b.sock,dst=a,size=1500,rate=100000",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(c.cpus, vec![0]);
        assert_eq!(c.vms.len(), 2);
        assert_eq!(c.vms[0].dst, Dst::Vm("b".into()));
        assert_eq!(c.vms[1].rate, Some(100000.0));
        assert_eq!(c.vms[1].size, 1500);
        assert_eq!(parse_cpus("0-2,5").unwrap(), vec![0, 1, 2, 5]);
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "--vm name=a,socket=x,dst=c",
            "--vm name=a,socket=x,size=20",
            "--vm name=a",
            "--vm name=a,socket=x --vm name=a,socket=y",
            "--vm name=a,socket=x --pingpong a,z",
            "--qsize 100 --vm name=a,socket=x",
        ] {
            assert!(parse_args(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_the_attack_knobs() {
        let c = parse_args(args(
            "--vm name=a,socket=x,dst=b,size=65535,tso=88 \
             --vm name=b,socket=y,features=mrg,qsize=2048,rxbuf=64,rxchain=256 \
             --vm name=c,socket=z,log=1,rxchain=64,rxclaim=4294967295",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(c.vms[2].driver.rx_claim, u32::MAX);
        assert_eq!(c.vms[0].driver.tso, 88);
        assert_ne!(c.vms[0].driver.features() & crate::frontend::HOST_TSO4, 0);
        assert_eq!(c.vms[1].driver.rx_descs(), 256);
        for bad in [
            "--vm name=a,socket=x,size=65535",
            "--vm name=a,socket=x,size=65536,tso=88",
            "--vm name=a,socket=x,tso=87",
            "--vm name=a,socket=x,size=1500,tso=1448,verify=1",
            "--vm name=a,socket=x,rxchain=257",
            "--vm name=a,socket=x,rxclaim=0",
            "--vm name=a,socket=x,rxclaim=4294967296",
            "--vm name=a,socket=x,features=mrg,qsize=128,rxchain=256",
        ] {
            assert!(parse_args(args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn tso_headers_are_a_linux_guests() {
        let (vh, f) = crate::probe::tso_headers(88, 65535);
        assert_eq!(vh[..10], [1, 1, 54, 0, 88, 0, 34, 0, 16, 0]);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 65521);
        // The IPv4 header sums to 0xffff with its checksum.
        let mut s: u32 = f[14..34].chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        assert_eq!(s, 0xffff);
    }
}
