//! `[[mirror]]` on a running pvswitchd, with pvsgen VMs: a mirror added by a reload gives a
//! third VM both directions of a pair, byte for byte, and nothing else; what the third VM sends
//! goes nowhere; a mirror whose output takes nothing drops its copies, counted on the mirror,
//! while the pair loses nothing; `pvswitchctl mirrors` says so.

use crate::common;
use common::vms::*;
use common::*;

const NEEDS: &[Need] = &[Need::Root, Need::Hugepages(64)];

/// The bench's configuration (good1, good2, evil) with `mirror` after it, applied by a reload.
fn reload_with(b: &Bench, mirror: &str) -> String {
    let ports = [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
    let text = Switch::config_text(&b.sw.dir, &[1], &ports, "") + mirror;
    b.sw.write_config(&text);
    b.sw.ctl("reload")["summary"].as_str().unwrap().to_string()
}

fn mirror_info(sw: &Switch) -> serde_json::Value {
    let m = sw.ctl("mirrors");
    assert_eq!(m.as_array().map(Vec::len), Some(1), "{m}");
    m[0].clone()
}

const PROBE: &str = "[[mirror]]\nname = \"probe\"\noutput_port = \"evil\"\n\
                     select_src_port = [\"good1\"]\nselect_dst_port = [\"good1\"]\n";

#[test]
fn a_mirror_gives_a_third_vm_both_directions_of_a_pair_and_nothing_else() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("mirror-pair");
    let summary = reload_with(&b, PROBE);
    assert!(summary.contains("mirrors changed"), "{summary}");
    let mut probe = b.connect_evil();
    probe.post_rx_buffers(256, RX_BUF);
    // good1 -> good2, then good2 -> good1 (MAC_A learned when good1 sent).
    let n = 40;
    let there: Vec<Vec<u8>> = (0..n).map(|i| frame(MAC_B, MAC_A, 60 + (i * 331) % 1455, 1, i as u32)).collect();
    let back: Vec<Vec<u8>> = (0..n).map(|i| frame(MAC_A, MAC_B, 60 + (i * 197) % 1455, 2, i as u32)).collect();
    for f in &there {
        b.good1.send(f);
    }
    assert_delivered(&there, &recv_n(&mut b.good2, n));
    for f in &back {
        b.good2.send(f);
    }
    assert_delivered(&back, &recv_n(&mut b.good1, n));
    // The probe got each frame once, as it went: what good1 sent, then what it was given.
    let copies = recv_n(&mut probe, 2 * n);
    assert_eq!(copies[..n], there[..], "the copies of what good1 sent");
    assert_eq!(copies[n..], back[..], "the copies of what good1 was given");
    // What the probe sends goes nowhere: the next frame good2 gets is good1's.
    probe.send(&frame(BCAST, MAC_C, 100, 3, 0));
    let after = frame(MAC_B, MAC_A, 100, 4, 0);
    b.good1.send(&after);
    assert_eq!(recv_n(&mut b.good2, 1), vec![after.clone()]);
    assert_eq!(recv_n(&mut probe, 1), vec![after], "the copy of good1's last frame");
    let m = mirror_info(&b.sw);
    assert_eq!(
        (m["active"].clone(), m["copies"].clone(), m["dropped"].clone()),
        (true.into(), (2 * n + 1).into(), 0.into()),
        "{m}"
    );
    assert_eq!(b.sw.port("evil")["drops"]["mirror_output"], 1);
    // The operator's view.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .arg("--control")
        .arg(&b.sw.ctl)
        .arg("mirrors")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("mirror probe: from good1 to good1 -> evil") && text.contains("dropped 0"), "{text}");
    // A reload without the mirror: the probe gets nothing more, and is a port as any other.
    let summary = reload_with(&b, "");
    assert!(summary.contains("mirrors changed"), "{summary}");
    b.check_forwarding(10);
    b.evil_broadcasts(&mut probe);
    assert!(probe.recv().is_empty(), "the probe still got copies");
}

#[test]
fn a_mirror_whose_output_takes_nothing_costs_the_pair_nothing() {
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("mirror-full");
    let mirror = PROBE.replace("select_dst_port = [\"good1\"]\n", "snaplen = 64\n");
    reload_with(&b, &mirror);
    // The probe posts 16 receive buffers and never reads them.
    let mut probe = b.connect_evil();
    probe.post_rx_buffers(16, RX_BUF);
    let n = 3000u32;
    let mut got = 0;
    for chunk in 0..(n / 100) {
        let sent: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC_B, MAC_A, 300, 5, chunk * 100 + i)).collect();
        for f in &sent {
            b.good1.send(f);
        }
        let out = recv_n(&mut b.good2, 100);
        assert_delivered(&sent, &out);
        got += out.len() as u32;
    }
    assert_eq!(got, n);
    let m = mirror_info(&b.sw);
    assert_eq!(m["copies"], 16, "{m}");
    assert_eq!(m["dropped"].as_u64(), Some(n as u64 - 16), "{m}");
    assert_eq!(b.sw.port("evil")["drops"]["rx_ring_full"].as_u64(), Some(n as u64 - 16));
    b.assert_good_ports_clean();
    for p in ["good1", "good2"] {
        let drops = b.sw.port(p)["drops"].clone();
        assert!(drops.as_object().unwrap().values().all(|v| v == 0), "{p} dropped: {drops}");
    }
    // The copies it took were cut to 64 bytes.
    let copies = probe.recv();
    assert_eq!(copies.len(), 16);
    assert!(copies.iter().all(|c| c.len() == 64), "{:?}", copies.iter().map(Vec::len).collect::<Vec<_>>());
}

/// `add-mirror`/`del-mirror`: a mirror added while pvswitchd runs copies at once, is checked as
/// the file's are (bad keys and values, a name or an output taken, an output selected: refused,
/// nothing changed), survives a reload, and `del-mirror` ends it; the file's mirrors are not
/// the command's to remove.
#[test]
fn a_mirror_added_at_run_time_copies_until_it_is_removed() {
    use pvswitch::proto::{PortReply, Request};
    let Some(_g) = run_alone(NEEDS) else { return };
    let mut b = Bench::start("mirror-cmd");
    let mut probe = b.connect_evil();
    probe.post_rx_buffers(256, RX_BUF);
    let add = |name: &str, settings: &[(&str, &str)]| Request::AddMirror {
        name: name.into(),
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let good = [("output_port", "evil"), ("select_src_port", "good1"), ("snaplen", "64")];
    // Refused, each with its reason, and nothing runs.
    let refused: &[(Request, &str)] = &[
        (add("tap", &[("output_port", "evil"), ("colour", "red")]), "unknown key \"colour\""),
        (add("tap", &[("output_port", "evil"), ("select_vlan", "ten")]), "select_vlan: expected VLAN ids"),
        (add("tap", &[("output_port", "evil"), ("select_all", "yes")]), "select_all: expected true or false"),
        (add("tap", &[("output_port", "evil"), ("select_src_port", "good1"), ("snaplen", "10")]), "snaplen"),
        (add("tap", &[("output_port", "evil")]), "selects nothing"),
        (add("tap", &[("output_port", "good1"), ("select_src_port", "good1")]), "never mirrored"),
        (add("bad name", &good), "name: expected 1-64 characters"),
        (Request::DelMirror { name: "nope".into(), if_exists: false }, "no mirror \"nope\""),
    ];
    for (req, want) in refused {
        let e = b.sw.try_ask::<PortReply>(req).expect_err(want);
        assert!(e.contains(want), "{req:?}: {e}");
    }
    assert_eq!(b.sw.ctl("mirrors").as_array().map(Vec::len), Some(0));
    // Added: copies of what good1 sends, cut to 64 bytes, at once.
    let r: PortReply = b.sw.ask(&add("tap", &good));
    assert_eq!(r.summary, "mirror tap added: copies to evil");
    let e = b.sw.try_ask::<PortReply>(&add("tap", &good)).unwrap_err();
    assert!(e.contains("mirror \"tap\" exists"), "{e}");
    let e = b.sw.try_ask::<PortReply>(&add("tap2", &good)).unwrap_err();
    assert!(e.contains("is already mirror \"tap\"'s output"), "{e}");
    let f = frame(MAC_B, MAC_A, 300, 1, 0);
    b.good1.send(&f);
    assert_delivered(std::slice::from_ref(&f), &recv_n(&mut b.good2, 1));
    assert_eq!(recv_n(&mut probe, 1), vec![f[..64].to_vec()]);
    // A reload keeps it (the file has no mirrors), and it still copies.
    let summary = reload_with(&b, "");
    assert!(!summary.contains("mirror"), "{summary}");
    b.good1.send(&f);
    recv_n(&mut b.good2, 1);
    assert_eq!(recv_n(&mut probe, 1), vec![f[..64].to_vec()]);
    // Removed: nothing more, and removing it again is an error unless --if-exists.
    let r: PortReply = b.sw.ask(&Request::DelMirror { name: "tap".into(), if_exists: false });
    assert_eq!(r.summary, "mirror tap removed");
    let r: PortReply = b.sw.ask(&Request::DelMirror { name: "tap".into(), if_exists: true });
    assert!(r.summary.contains("nothing to do"), "{}", r.summary);
    b.check_forwarding(10);
    assert!(probe.recv().is_empty(), "the probe still got copies");
    // The file's mirror is the file's.
    reload_with(&b, PROBE);
    let e = b.sw.try_ask::<PortReply>(&Request::DelMirror { name: "probe".into(), if_exists: false }).unwrap_err();
    assert!(e.contains("is the configuration file's"), "{e}");
}
