//! The DPDK wrapper against real DPDK vdevs (no NIC needed). EAL initializes once per process,
//! so everything runs in one test function, in order.
//!
//! Hugepages are used (`--in-memory`) when at least 256 MB of them are free on a mounted
//! hugetlbfs; otherwise, or with PVSWITCH_DPDK_NO_HUGE=1, the EAL runs with `--no-huge`.
#![cfg(feature = "dpdk")]

use std::time::{Duration, Instant};

use pvswitch::port::dpdk::{self, BURST, DEFAULT_DATA_ROOM, Eal, EthPort, Mbuf, MbufBurst, Mempool, PortSetup};

fn hugepages_usable() -> bool {
    if std::env::var_os("PVSWITCH_DPDK_NO_HUGE").is_some_and(|v| v != "0") {
        return false;
    }
    dpdk::hugepages_free_kb() >= 256 * 1024
}

fn eal_args() -> Vec<String> {
    let mut a: Vec<String> =
        ["pvswitch-dpdk-test", "--no-pci", "--no-telemetry", "--lcores=0@(0,1)", "--log-level=*:notice"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    if hugepages_usable() {
        a.push("--in-memory".into());
    } else {
        eprintln!("dpdk test: no usable hugepages, running EAL with --no-huge");
        a.extend(["--no-huge", "-m", "256", "--no-shconf"].map(String::from));
    }
    a
}

/// A frame of `len` bytes that encodes its sequence number, so corruption and reordering show.
fn frame(seq: usize, len: usize) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| (i.wrapping_mul(7) ^ seq) as u8).collect();
    f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // dst: locally administered unicast
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f[12..14].copy_from_slice(&[0x88, 0xb5]); // local experimental ethertype
    f[14..22].copy_from_slice(&(seq as u64).to_be_bytes());
    f
}

fn sizes(n: usize) -> Vec<usize> {
    // 64..=1500, spread out, with both ends included.
    (0..n)
        .map(|i| {
            if i == 0 {
                64
            } else if i == 1 {
                1500
            } else {
                64 + (i * 389) % (1500 - 64 + 1)
            }
        })
        .collect()
}

/// Receives until `want` frames arrived or 5 s passed.
fn rx_all(port: &mut EthPort, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::with_capacity(want);
    let mut burst = MbufBurst::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < want && Instant::now() < deadline {
        if port.rx(0, &mut burst) == 0 {
            std::thread::yield_now();
        }
        got.extend(burst.frames().map(<[u8]>::to_vec));
        burst.clear();
    }
    got
}

#[test]
fn dpdk_eal_mempool_ports() {
    let args = eal_args();
    let eal = Eal::init(&args).expect("EAL init");
    assert_eq!(eal.args(), &args[..]);
    // Once per process: same args give the same EAL, other args an error.
    assert!(std::ptr::eq(Eal::init(&args).unwrap(), eal));
    let err = Eal::init(&["other".to_string()]).unwrap_err();
    assert!(err.contains("already initialized"), "{err}");
    assert_eq!(dpdk::lcore_id(), Some(eal.main_lcore()));

    let pool = Mempool::new("pvs_test_pool", 4095, 64, DEFAULT_DATA_ROOM, None).expect("mempool");
    let err = Mempool::new("pvs_test_pool", 511, 0, DEFAULT_DATA_ROOM, None).unwrap_err();
    assert!(err.contains("pvs_test_pool") && err.contains("exists"), "{err}");
    let base_in_use = pool.in_use();

    // Bad devices give clean errors.
    let setup = PortSetup { rxqs: 1, txqs: 1, rx_ring: 512, tx_ring: 512, mtu: Some(1500), offloads: false };
    let err = EthPort::open("net_bogus0", &setup, &pool).unwrap_err();
    eprintln!("net_bogus0: {err}");
    assert!(err.starts_with("dpdk port net_bogus0: device not found"), "{err}");
    let err = EthPort::open("0000:99:00.0", &setup, &pool).unwrap_err();
    eprintln!("0000:99:00.0: {err}");
    assert!(err.starts_with("dpdk port 0000:99:00.0: device not found"), "{err}");
    assert!(EthPort::open("", &setup, &pool).is_err());

    // net_ring0 created as a vdev loops each queue's Tx ring into its Rx ring.
    let mut port = EthPort::open("net_ring0", &setup, &pool).expect("open net_ring0");
    eprintln!(
        "net_ring0: port {} socket {:?} rings {:?} mtu {:?} notes {:?}",
        port.port_id(),
        port.socket_id(),
        port.ring_sizes(),
        port.mtu(),
        port.notes()
    );
    assert_eq!(port.name(), "net_ring0");
    let err = EthPort::open("net_ring0", &setup, &pool).unwrap_err();
    assert!(err.contains("already open"), "{err}");
    port.mac_addr().expect("mac");

    const N: usize = 300;
    let sent: Vec<Vec<u8>> = sizes(N).into_iter().enumerate().map(|(i, len)| frame(i, len)).collect();
    let total_bytes: u64 = sent.iter().map(|f| f.len() as u64).sum();
    let mut burst = MbufBurst::new();
    let mut received = Vec::new();
    for chunk in sent.chunks(BURST) {
        for f in chunk {
            burst.push(Mbuf::from_bytes(&pool, f).unwrap()).unwrap();
        }
        let n = port.tx(0, &mut burst);
        assert_eq!(n, chunk.len(), "ring has room");
        assert!(burst.is_empty());
        received.extend(rx_all(&mut port, chunk.len()));
    }
    assert_eq!(received.len(), N);
    for (i, (a, b)) in sent.iter().zip(&received).enumerate() {
        assert_eq!(a.len(), b.len(), "frame {i} length");
        assert!(a == b, "frame {i} content");
    }
    let st = port.stats().unwrap();
    eprintln!("net_ring0 stats: {st:?}");
    assert_eq!((st.opackets, st.ipackets), (N as u64, N as u64));
    // net_ring counts packets only; other drivers count bytes too.
    assert!(st.obytes == 0 || st.obytes == total_bytes, "{st:?}");
    assert!(st.ibytes == 0 || st.ibytes == total_bytes, "{st:?}");
    assert_eq!((st.oerrors, st.imissed), (0, 0));
    assert_eq!(pool.in_use(), base_in_use, "every mbuf went back to the pool");

    // Partial Tx: fill the loop ring until the driver refuses; unsent mbufs stay in the burst.
    let mut accepted = 0;
    let mut partial = false;
    for round in 0..200 {
        burst.alloc(&pool, burst.room()).unwrap();
        for m in burst.as_mut_slice() {
            m.set_len(60).unwrap();
            m.data_mut().fill(round as u8);
        }
        let before = burst.len();
        let n = port.tx(0, &mut burst);
        accepted += n;
        assert_eq!(burst.len(), before - n);
        if n < before {
            partial = true;
            assert!(burst.iter().all(|m| m.len() == 60), "unsent mbufs are intact");
            break;
        }
    }
    assert!(partial, "net_ring's ring never filled up");
    let unsent = burst.len();
    burst.clear();
    let drained = rx_all(&mut port, accepted);
    eprintln!("partial tx: driver took {accepted}, left {unsent} with the caller; drained {}", drained.len());
    assert_eq!(drained.len(), accepted);
    assert_eq!(pool.in_use(), base_in_use);

    // Queue handles: Tx from a registered plain thread, Rx here.
    port.reset_stats().unwrap();
    {
        let mut txq = port.tx_queue(0).unwrap();
        assert!(port.tx_queue(0).is_err(), "a queue is claimed once");
        assert!(port.rx_queue(1).is_err(), "no such queue");
        let mut rxq = port.rx_queue(0).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                dpdk::thread_register().unwrap();
                assert!(dpdk::lcore_id().is_some());
                let mut b = MbufBurst::new();
                for i in 0..BURST {
                    b.push(Mbuf::from_bytes(&pool, &frame(1000 + i, 64 + i)).unwrap()).unwrap();
                }
                assert_eq!(txq.tx(&mut b), BURST);
                dpdk::thread_unregister();
            });
        });
        let mut b = MbufBurst::new();
        assert_eq!(rxq.rx(&mut b), BURST);
        assert!(b.iter().enumerate().all(|(i, m)| m.data() == frame(1000 + i, 64 + i)));
        assert!(port.stats().unwrap().opackets == BURST as u64);
    }
    assert!(port.tx_queue(0).is_ok(), "claims are released on drop");

    // Closing removes the hot-plugged vdev, so it can be opened again.
    drop(port);
    // (net_ring in DPDK 22.11 does not free its rings on close: the new port re-attaches to
    // them, logging "RING: Cannot reserve memory". They were drained above.)
    let mut port = EthPort::open("net_ring0", &PortSetup::default(), &pool).expect("reopen net_ring0");
    let mut b = MbufBurst::new();
    assert_eq!(port.rx(0, &mut b), 0, "nothing stale in the reopened port");
    b.push(Mbuf::from_bytes(&pool, &frame(7, 64)).unwrap()).unwrap();
    assert_eq!(port.tx(0, &mut b), 1);
    assert_eq!(rx_all(&mut port, 1), vec![frame(7, 64)]);
    drop(port);

    // net_null: Tx-only sink (its Rx would invent packets).
    let mut null = EthPort::open("net_null0", &PortSetup::default(), &pool).expect("open net_null0");
    let mut b = MbufBurst::new();
    for i in 0..BURST {
        b.push(Mbuf::from_bytes(&pool, &frame(i, 100)).unwrap()).unwrap();
    }
    assert_eq!(null.tx(0, &mut b), BURST);
    assert_eq!(null.stats().unwrap().opackets, BURST as u64);
    drop(null);
    assert_eq!(pool.in_use(), base_in_use);
}
