//! The port drop-in directory (`dropin.rs`): read after the main file, each file alone.

use std::path::{Path, PathBuf};

use crate::config::{Config, dropin};

/// A fresh directory with `pvswitch.toml` holding `main` and `ports.d` holding `files`.
fn setup(name: &str, main: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pvs-dropins-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("ports.d")).unwrap();
    std::fs::write(dir.join("pvswitch.toml"), main).unwrap();
    for (f, text) in files {
        std::fs::write(dir.join("ports.d").join(f), text).unwrap();
    }
    dir
}

const MAIN: &str = "flows = [\"in_port=vm2,actions=output:vm1\"]\n[switch]\npoll_cores = [0]\nsocket_dir = \"/tmp/x\"\n\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\n";

/// The main file without its flow.
const PLAIN: &str = "[switch]\npoll_cores = [0]\nsocket_dir = \"/tmp/x\"\n\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\n";

fn names(c: &Config) -> Vec<&str> {
    c.ports.iter().map(|p| p.name.as_str()).collect()
}

#[test]
fn drop_ins_load_after_the_main_file_and_fail_alone() {
    let dir = setup(
        "alone",
        MAIN,
        &[
            ("vm2.toml", "name = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"vm2.sock\"\nmac_limit = 3\n"),
            ("vm3.toml", "name = \"vm3\"\ntype = \"vhost-user\"\nsocket = \"vm3.sock\"\nmac_limit = 0\n"),
            ("vm1.toml", "name = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"other.sock\"\n"),
            ("vm5.toml", "name = \"vm4\"\ntype = \"vhost-user\"\nsocket = \"vm4.sock\"\n"),
            (".vm6.toml.123", "half a file"),
            ("README", "not a port"),
        ],
    );
    std::os::unix::fs::symlink(dir.join("ports.d/vm2.toml"), dir.join("ports.d/vm7.toml")).unwrap();
    let c = Config::load(&dir.join("pvswitch.toml")).unwrap();
    // vm2 loads (and the main file's flow may name it); the others fail, each with its reason.
    assert_eq!(names(&c), ["vm1", "vm2"]);
    assert_eq!(c.ports[1].mac_limit, 3);
    assert_eq!(c.ports[1].origin.as_deref(), Some(dir.join("ports.d/vm2.toml").as_path()));
    assert_eq!(c.ports[0].origin, None);
    assert_eq!(c.ports_dir.as_deref(), Some(dir.join("ports.d").as_path()));
    let errors: Vec<String> = c.dropin_errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 4, "{errors:#?}");
    let has = |file: &str, text: &str| {
        assert!(
            errors.iter().any(|e| e.contains(&format!("ports.d/{file}")) && e.contains(text)),
            "no error for {file} saying {text:?}: {errors:#?}"
        )
    };
    has("vm3.toml:4:13", "mac_limit");
    has("vm1.toml:1:8", "port \"vm1\" is defined in the main file too, whose definition is used");
    has("vm5.toml:1:8", "the file must be vm4.toml");
    has("vm7.toml", "is a symbolic link; not followed");
}

#[test]
fn no_directory_is_no_drop_ins_and_ports_dir_moves_it() {
    let dir = setup("none", MAIN.replace("in_port=vm2", "in_port=vm1").as_str(), &[]);
    std::fs::remove_dir(dir.join("ports.d")).unwrap();
    let c = Config::load(&dir.join("pvswitch.toml")).unwrap();
    assert_eq!(names(&c), ["vm1"]);
    assert!(c.dropin_errors.is_empty());
    let moved =
        MAIN.replace("in_port=vm2", "in_port=vm1").replace("[switch]\n", "[switch]\nports_dir = \"run-ports\"\n");
    std::fs::write(dir.join("pvswitch.toml"), moved).unwrap();
    let c = Config::load(&dir.join("pvswitch.toml")).unwrap();
    assert_eq!(c.ports_dir.as_deref(), Some(dir.join("run-ports").as_path()));
    // A configuration from text alone keeps no ports.
    assert_eq!(Config::parse("x", "[switch]\npoll_cores = [0]\n").unwrap().ports_dir, None);
}

#[test]
fn settings_become_typed_toml_and_an_empty_value_drops_a_key() {
    let s = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
    let text = dropin::port_text(
        "vm9",
        None,
        &s(&[
            ("type", "vhost-user"),
            ("socket", "/run/vm9.sock"),
            ("mode", "client"),
            ("mac_limit", "4"),
            ("offloads", "false"),
            ("trunks", "[10, \"20-29\"]"),
        ]),
    )
    .unwrap();
    let c = Config::parse("x", "[switch]\npoll_cores = [0]\n").unwrap();
    let p = c.parse_port("x", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!((p.name.as_str(), p.mac_limit), ("vm9", 4));
    assert!(text.lines().nth(1).unwrap().starts_with("name = \"vm9\""), "{text}");
    let again = dropin::port_text("vm9", Some(&text), &s(&[("mac_limit", ""), ("mtu", "9000")])).unwrap();
    let p = c.parse_port("x", &again).unwrap();
    assert_eq!((p.mac_limit, p.mtu), (crate::config::DEFAULT_MAC_LIMIT, 9000));
    for (kv, e) in [
        (("mac limit", "4"), "\"mac limit\" is not a setting's name"),
        (("name", "other"), "name=other: a port's name is not changed"),
    ] {
        let got = dropin::port_text("vm9", None, &s(&[kv])).unwrap_err();
        assert!(got.starts_with(e), "{got}");
    }
}

#[test]
fn a_written_drop_in_replaces_the_old_whole_and_leaves_no_temporary() {
    let dir = setup("write", MAIN, &[]).join("made/ports.d");
    let p = dropin::write(&dir, "vm2", "name = \"vm2\"\n").unwrap();
    dropin::write(&dir, "vm2", "name = \"vm2\"\nmtu = 9000\n").unwrap();
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "name = \"vm2\"\nmtu = 9000\n");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(files, [std::ffi::OsString::from("vm2.toml")]);
    dropin::remove(&dir, "vm2").unwrap();
    dropin::remove(&dir, "vm2").unwrap();
    assert!(!Path::new(&p).exists());
}

/// A drop-in is held to what a port added at run time may do: a DPDK device that names a
/// file, a socket or a host interface is refused unless the main file grants it
/// (`[dpdk] runtime_vdevs`), and fails alone, the file it names untouched.
#[cfg(feature = "dpdk")]
#[test]
fn drop_ins_may_use_only_devices_the_main_file_grants() {
    let pcap = "name = \"cap\"\ntype = \"dpdk\"\ndevice = \"net_pcap1,tx_pcap=/etc/shadow\"\n";
    let null = "name = \"nul\"\ntype = \"dpdk\"\ndevice = \"net_null3\"\n";
    let pci = "name = \"pci\"\ntype = \"dpdk\"\ndevice = \"0000:03:00.0\"\n";
    let dir = setup("devices", PLAIN, &[("cap.toml", pcap), ("nul.toml", null), ("pci.toml", pci)]);
    let c = Config::load(&dir.join("pvswitch.toml")).unwrap();
    assert_eq!(names(&c), ["vm1", "pci"], "only the PCI address needs no grant");
    let errors: Vec<String> = c.dropin_errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors.iter().any(|e| e.contains("cap.toml:3:10") && e.contains("runtime_vdevs")), "{errors:#?}");
    // The main file grants net_null's instances: nul loads; a pcap device only if granted whole.
    let granted = format!("{PLAIN}[dpdk]\nruntime_vdevs = [\"net_null\"]\n");
    std::fs::write(dir.join("pvswitch.toml"), &granted).unwrap();
    let c = Config::load(&dir.join("pvswitch.toml")).unwrap();
    assert_eq!(names(&c), ["vm1", "nul", "pci"]);
    assert_eq!(c.dropin_errors.len(), 1);
}

/// A port name a drop-in cannot carry (hidden files are never read back) or a command line
/// would take for an option is refused wherever it is written.
#[test]
fn port_names_begin_with_a_letter_digit_or_underscore() {
    let dir = setup("names", PLAIN, &[]);
    let c = Config::load(&dir.join("pvswitch.toml")).unwrap();
    for bad in [".vm9", "-vm9", "--help", "..", "."] {
        let text = format!("name = \"{bad}\"\ntype = \"vhost-user\"\nsocket = \"x.sock\"\n");
        let e = c.parse_port("add-port", &text).unwrap_err();
        assert!(e.message.contains("beginning with a letter, a digit or _"), "{bad}: {e}");
    }
    for good in ["_vm9", "9vm", "vm.9", "vm-9"] {
        let text = format!("name = \"{good}\"\ntype = \"vhost-user\"\nsocket = \"{good}.sock\"\n");
        c.parse_port("add-port", &text).unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}
