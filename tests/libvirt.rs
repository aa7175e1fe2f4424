//! libvirt, for real (README "libvirt"): Debian's libvirtd runs two TCG domains whose
//! `<interface type='vhostuser'>` and `<memoryBacking>` are the README's XML, one per port
//! mode; their ports come from the project's qemu hook (dist/libvirt-qemu-hook) calling
//! pvswitchctl add-port/del-port; QEMU runs as libvirt's unprivileged user and pvswitchd under
//! the shipped unit's capability set. One guest pings the other through pvswitchd, across
//! `virsh destroy`/`start` of each domain and a pvswitchd restart.

use crate::common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const HOOK: &str = "/etc/libvirt/hooks/qemu.d/pvswitch";
const HOOK_CONF: &str = "/etc/pvswitch/libvirt-hook.conf";
/// The README's paths, moved to the test's directory.
const README_DIR: &str = "/run/pvswitch";
const MARK: &str = "PVS-LV-PING-OK";
/// The ports the hook makes for the two domains' interfaces: each domain's name and the
/// interface's index.
const A: &str = "pvs-lva-0";
const B: &str = "pvs-lvb-0";

fn virsh(args: &[&str]) -> Result<String, String> {
    let out = Command::new("virsh").args(["-q", "-c", "qemu:///system"]).args(args).output().expect("run virsh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() { Ok(text) } else { Err(format!("virsh {}: {text}", args.join(" "))) }
}

/// The README's XML block after `<!-- libvirt: NAME -->`.
fn readme_xml(name: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let at = readme.find(&format!("<!-- libvirt: {name} -->")).unwrap_or_else(|| panic!("README: no {name} XML"));
    let block = &readme[at..];
    let start = block.find("```xml\n").unwrap() + "```xml\n".len();
    let end = start + block[start..].find("```").unwrap();
    block[start..end].to_string()
}

/// A domain booting the test guest (its job appended to the initramfs, as scripts/run-vm.sh
/// does), with the README's memory backing and the interface `iface`.
fn domain_xml(dir: &Path, name: &str, ip: &str, job: &str, iface: &str) -> String {
    let guest = guest_dir();
    let kernel = dir.join("vmlinuz");
    std::fs::copy(guest.join("vmlinuz"), &kernel).unwrap();
    let initrd = dir.join(format!("{name}.initrd"));
    let jobdir = dir.join(format!("{name}-job"));
    std::fs::create_dir_all(&jobdir).unwrap();
    std::fs::write(jobdir.join("job.sh"), job).unwrap();
    std::fs::set_permissions(jobdir.join("job.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sh = format!(
        "cat {base} > {initrd} && cd {jobdir} && echo job.sh | busybox cpio -o -H newc 2>/dev/null | gzip -n >> {initrd}",
        base = guest.join("initrd.img").display(),
        initrd = initrd.display(),
        jobdir = jobdir.display()
    );
    assert!(Command::new("sh").args(["-c", &sh]).status().unwrap().success(), "{sh}");
    format!(
        "<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  {memory}
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 pvs.name={name} pvs.ip={ip}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <serial type='file'><source path='{serial}' append='off'/><target port='0'/></serial>
    {iface}
  </devices>
</domain>
",
        memory = readme_xml("memory").trim(),
        kernel = kernel.display(),
        initrd = initrd.display(),
        serial = dir.join(format!("{name}.serial")).display(),
    )
}

/// Starts domain `d`, failing with pvswitchd's log.
fn start(sw: &Switch, d: &str) {
    virsh(&["start", d]).unwrap_or_else(|e| panic!("{e}\npvswitchd:\n{}", sw.log()));
}

/// Defines domain `name` from `xml` (written to the test's directory).
fn define(dir: &Path, name: &str, xml: &str) {
    let f = dir.join(format!("{name}.xml"));
    std::fs::write(&f, xml).unwrap();
    virsh(&["define", f.to_str().unwrap()]).unwrap();
}

/// Destroys and undefines the test's domains and removes the hook's settings, however the
/// test ends.
struct Cleanup(Vec<&'static str>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = virsh(&["destroy", d]);
            let _ = virsh(&["undefine", d]);
        }
        let _ = std::fs::remove_file(HOOK_CONF);
    }
}

fn pings(dir: &Path, dom: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("{dom}.serial"))).unwrap_or_default().matches(MARK).count()
}

/// Waits until the pinging guest has reached its peer `n` more times than `from`.
fn wait_pings(sw: &Switch, dom: &str, from: usize, n: usize, what: &str) {
    let dir = &sw.dir;
    // A TCG guest boots in seconds here; allow for a slow, loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while pings(dir, dom) < from + n && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if pings(dir, dom) < from + n {
        let serial = std::fs::read_to_string(dir.join(format!("{dom}.serial"))).unwrap_or_default();
        let qlog = std::fs::read_to_string(format!("/var/log/libvirt/qemu/{dom}.log")).unwrap_or_default();
        panic!(
            "{what}: {dom} reached its peer {} times, wanted {}\nserial:\n{serial}\nqemu log:\n{qlog}\nports:\n{}\npvswitchd:\n{}",
            pings(dir, dom),
            from + n,
            sw.try_ask::<Vec<pvswitch::proto::PortInfo>>(&pvswitch::proto::Request::Ports)
                .map(|v| v.json().to_string())
                .unwrap_or_default(),
            sw.log()
        );
    }
}

/// The port's state, None when there is no such port.
fn port_state(sw: &Switch, name: &str) -> Option<String> {
    sw.ports().into_iter().find(|p| p.name == name).map(|p| p.state)
}

fn wait_connected(sw: &Switch, name: &str) {
    wait_for(&format!("port {name} connected"), || {
        (port_state(sw, name).as_deref() == Some("connected")).then_some(())
    });
}

#[test]
fn libvirt_domains_in_both_port_modes_through_the_hook() {
    let Some(_g) = run_alone(&[&[Need::Root, Need::Libvirtd, Need::Cmd("setpriv")], QEMU].concat()) else { return };
    assert!(
        Path::new(HOOK).exists(),
        "{HOOK} is missing: scripts/install-deps.sh installs it before it starts libvirtd"
    );
    let dir = test_dir("libvirt");
    const DOMAINS: [&str; 5] = ["pvs-lva", "pvs-lvb", "pvs-lvc", "pvs-lvd", "pvs-lve"];
    let _clean = Cleanup(DOMAINS.to_vec());
    for d in DOMAINS {
        let _ = virsh(&["destroy", d]);
        let _ = virsh(&["undefine", d]);
    }
    // The hook as this tree has it; its settings point at this test's pvswitchd.
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/dist/libvirt-qemu-hook"), HOOK).unwrap();
    std::fs::create_dir_all("/etc/pvswitch").unwrap();
    std::fs::write(
        HOOK_CONF,
        format!(
            "# tests/libvirt.rs\ndirs = {d}\ncontrol = {d}/ctl.sock\npvswitchctl = {ctl}\n",
            d = dir.display(),
            ctl = env!("CARGO_BIN_EXE_pvswitchctl")
        ),
    )
    .unwrap();
    // QEMU's own directory for the sockets it listens on (README): set-group-ID, group root.
    let vms = dir.join("vms");
    std::fs::create_dir(&vms).unwrap();
    let qemu_uid = uid_of("libvirt-qemu");
    std::os::unix::fs::chown(&vms, Some(qemu_uid), Some(0)).unwrap();
    std::fs::set_permissions(&vms, std::fs::Permissions::from_mode(0o2770)).unwrap();

    let text = Switch::config_text(&dir, &[1], &[], "socket_group = \"kvm\"\nsocket_mode = \"0660\"\n");
    let mut sw = Switch::start_wrapped(dir.clone(), &text, unit_capabilities());
    let moved = |xml: String| xml.replace(README_DIR, &dir.display().to_string());
    // lva pings lvb forever, counting its answers on the serial console; lvb answers.
    let job_a = format!("while true; do ping -c 1 -W 1 10.10.0.2 >/dev/null 2>&1 && echo {MARK}; sleep 0.3; done\n");
    let a = domain_xml(&dir, "pvs-lva", "10.10.0.1/24", &job_a, &moved(readme_xml("server-port")));
    let b = domain_xml(
        &dir,
        "pvs-lvb",
        "10.10.0.2/24",
        "while true; do sleep 1000; done\n",
        &moved(readme_xml("client-port")),
    );
    for (name, xml) in [("pvs-lva", &a), ("pvs-lvb", &b)] {
        define(&dir, name, xml);
    }

    start(&sw, "pvs-lvb");
    start(&sw, "pvs-lva");

    // The hook made both ports, named after their domains, kept in the port directory; the
    // server-mode port's socket is for group kvm.
    for p in [A, B] {
        assert!(dir.join("ports.d").join(format!("{p}.toml")).exists(), "no ports.d file for {p}\n{}", sw.log());
    }
    let m = std::fs::metadata(dir.join("vm1.sock")).unwrap();
    assert_eq!((m.gid(), m.mode() & 0o777), (gid_of("kvm"), 0o660), "vm1.sock's group and mode");
    let v1 = sw.port_info(A);
    assert_eq!(v1.mode, "server", "{}", v1.json());
    assert_eq!(sw.port_info(B).mode, "client");
    wait_connected(&sw, A);
    wait_connected(&sw, B);
    wait_pings(&sw, "pvs-lva", 0, 3, "first boot");

    // The peer goes and comes back: its port is removed and made again by the hook.
    virsh(&["destroy", "pvs-lvb"]).unwrap();
    wait_for("lvb's port removed by the hook", || port_state(&sw, B).is_none().then_some(()));
    assert!(!dir.join("ports.d").join(format!("{B}.toml")).exists());
    start(&sw, "pvs-lvb");
    let n = pings(&dir, "pvs-lva");
    wait_pings(&sw, "pvs-lva", n, 3, "after virsh destroy/start of the peer");

    // The pinging guest goes and comes back (its serial file starts again).
    virsh(&["destroy", "pvs-lva"]).unwrap();
    wait_for("lva's port removed by the hook", || port_state(&sw, A).is_none().then_some(()));
    start(&sw, "pvs-lva");
    wait_pings(&sw, "pvs-lva", 0, 3, "after virsh destroy/start of the pinging guest");

    // pvswitchd restarts: the ports come back from ports.d, both guests reconnect.
    sw.restart(false);
    wait_connected(&sw, A);
    wait_connected(&sw, B);
    let n = pings(&dir, "pvs-lva");
    wait_pings(&sw, "pvs-lva", n, 3, "after a pvswitchd restart");
    for p in [A, B] {
        let s = sw.port_info(p);
        assert_eq!(s.counters.drops.get(DropReason::Malformed), 0, "{}", s.json());
    }

    // The hook as an orchestrator's front door (issue 55), beside the two pinging domains.
    // A third domain whose socket has lva's file name, in another directory of the hook's: a
    // port of its own; destroying it leaves lva's alone.
    std::fs::create_dir(dir.join("other")).unwrap();
    let c_iface = moved(readme_xml("server-port"))
        .replace("/vm1.sock'", "/other/vm1.sock'")
        .replace("52:54:00:00:00:01", "52:54:00:00:00:03");
    let idle = "while true; do sleep 1000; done\n";
    let c = domain_xml(&dir, "pvs-lvc", "10.10.0.3/24", idle, &c_iface);
    define(&dir, "pvs-lvc", &c);
    start(&sw, "pvs-lvc");
    let pc = sw.port_info("pvs-lvc-0");
    assert_eq!(Some(pc.socket.as_str()), dir.join("other/vm1.sock").to_str(), "{}", pc.json());
    assert_eq!(pc.allowed_macs, ["52:54:00:00:00:03"], "ports shows what the hook set: {}", pc.json());
    assert_eq!(Some(sw.port_info(A).socket.as_str()), dir.join("vm1.sock").to_str());
    wait_connected(&sw, "pvs-lvc-0");
    virsh(&["destroy", "pvs-lvc"]).unwrap();
    wait_for("lvc's port removed", || port_state(&sw, "pvs-lvc-0").is_none().then_some(()));
    assert_eq!(port_state(&sw, A).as_deref(), Some("connected"), "lva's port went with lvc");
    let n = pings(&dir, "pvs-lva");
    wait_pings(&sw, "pvs-lva", n, 2, "after a domain with the same socket file name came and went");
    // A socket outside the hook's directories: the start fails at once, naming the interface,
    // instead of QEMU waiting for a socket nobody serves.
    let outside = format!("/tmp/pvs-outside-{}.sock", std::process::id());
    let d = domain_xml(
        &dir,
        "pvs-lvd",
        "10.10.0.4/24",
        idle,
        &c_iface.replace(&dir.join("other/vm1.sock").display().to_string(), &outside),
    );
    define(&dir, "pvs-lvd", &d);
    let t0 = std::time::Instant::now();
    let e = virsh(&["start", "pvs-lvd"]).unwrap_err();
    assert!(e.contains("interface 0") && e.contains("outside the hook's dirs"), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(20), "the refused start took {:?}", t0.elapsed());
    assert_eq!(virsh(&["domstate", "pvs-lvd"]).unwrap().trim(), "shut off");
    // A broken line in the hook's settings refuses pvswitch domains only, naming file and line.
    let conf = std::fs::read_to_string(HOOK_CONF).unwrap();
    std::fs::write(HOOK_CONF, format!("{conf}port_security = on\n")).unwrap();
    let e = virsh(&["start", "pvs-lvc"]).unwrap_err();
    assert!(e.contains(&format!("{HOOK_CONF}:5")) && e.contains("port_security"), "{e}");
    let plain = domain_xml(&dir, "pvs-lve", "10.10.0.5/24", idle, "");
    define(&dir, "pvs-lve", &plain);
    start(&sw, "pvs-lve");
    virsh(&["destroy", "pvs-lve"]).unwrap();
    std::fs::write(HOOK_CONF, conf).unwrap();
    let n = pings(&dir, "pvs-lva");
    wait_pings(&sw, "pvs-lva", n, 2, "after the refused domains");

    // Both domains gone: so are their ports.
    virsh(&["destroy", "pvs-lva"]).unwrap();
    virsh(&["destroy", "pvs-lvb"]).unwrap();
    wait_for("both ports removed", || (port_state(&sw, A).is_none() && port_state(&sw, B).is_none()).then_some(()));
    let left: Vec<PathBuf> = std::fs::read_dir(dir.join("ports.d")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "port files left: {left:?}");
}

/// The unit's capabilities without CAP_CHOWN: a socket_group cannot be given, and the port
/// says so (failed, naming the capability) while the rest of the switch runs.
#[test]
fn socket_group_without_cap_chown_fails_the_port_and_says_why() {
    let Some(_g) = run_alone(&[Need::Root, Need::Cmd("setpriv")]) else { return };
    let dir = test_dir("no-chown");
    let text = Switch::config_text(
        &dir,
        &[1],
        &[PortSpec::server("vm1"), PortSpec::server("vm2").client()],
        "socket_group = \"kvm\"\nsocket_mode = \"0660\"\n",
    );
    let wrap: Vec<String> =
        unit_capabilities().into_iter().map(|a| a.replace(",+chown", "").replace("+chown,", "")).collect();
    assert!(!wrap.iter().any(|a| a.contains("chown")), "{wrap:?}");
    let sw = Switch::start_wrapped(dir, &text, wrap);
    let p = sw.port_info("vm1");
    assert_eq!(p.state, "failed", "{}", p.json());
    assert!(p.last_error.as_deref().unwrap_or("").contains("CAP_CHOWN"), "{}", p.json());
    assert_eq!(sw.port_info("vm2").state, "connecting");
}

fn id_of(file: &str, name: &str) -> u32 {
    let text = std::fs::read_to_string(file).unwrap();
    let line =
        text.lines().find(|l| l.split(':').next() == Some(name)).unwrap_or_else(|| panic!("no {name} in {file}"));
    line.split(':').nth(2).unwrap().parse().unwrap()
}

fn uid_of(user: &str) -> u32 {
    id_of("/etc/passwd", user)
}

fn gid_of(group: &str) -> u32 {
    id_of("/etc/group", group)
}

/// Runs the hook as libvirt would (`pvswitch DOMAIN OP SUB -` with the domain XML on stdin)
/// with settings `conf`: (exit status, stderr).
fn run_hook(conf: &Path, domain: &str, op: &str, xml: &str) -> (i32, String) {
    use std::io::Write;
    let (a, b) = op.split_once(' ').unwrap();
    let mut c = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/dist/libvirt-qemu-hook"))
        .args([domain, a, b, "-"])
        .env("PVSWITCH_HOOK_CONF", conf)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(xml.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A domain's XML with these vhost-user interfaces: (socket path, libvirt mode, MAC).
fn hook_xml(uuid: &str, ifaces: &[(&str, &str, &str)]) -> String {
    let ifs: String = ifaces
        .iter()
        .map(|(path, mode, mac)| {
            format!(
                "<interface type='vhostuser'><mac address=\"{mac}\"/><source type='unix' path='{path}' mode='{mode}'/><model type='virtio'/></interface>"
            )
        })
        .collect();
    format!("<domain type='qemu'><name>x</name><uuid>{uuid}</uuid><devices>{ifs}</devices></domain>")
}

/// The hook against hostile or odd domain XML (issue 55), run by hand against a pvswitchd
/// (what libvirt would run; tests/libvirt.rs's first test has libvirtd run it for real):
/// ports named per domain and interface, so two domains (or two interfaces of one) whose
/// sockets share a file name get a port each, and releasing one removes only its own; names
/// and arguments a command line could misread are refused or cannot arise; `..` through a
/// symbolic link and a socket outside `dirs` fail the start with the interface named; a MAC
/// with a quote in it never reaches a port's settings; a broken settings line refuses only
/// pvswitch domains, naming file and line; `ports` shows the MAC the hook allowed.
#[test]
fn the_hook_refuses_hostile_domains_and_keeps_each_domains_ports_its_own() {
    let Some(_g) = run_alone(&[Need::Cmd("python3")]) else { return };
    let dir = test_dir("hook");
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &[], ""));
    let conf = dir.join("hook.conf");
    let d = dir.display().to_string();
    let settings = format!(
        "dirs = {d}/a {d}/b\nforeign_dirs = {d}/ovs\ncontrol = {}\npvswitchctl = {}\n",
        sw.ctl.display(),
        env!("CARGO_BIN_EXE_pvswitchctl")
    );
    std::fs::write(&conf, &settings).unwrap();
    for sub in ["a", "b", "a/real", "ovs"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::os::unix::fs::symlink(dir.join("a/real"), dir.join("a/lnk")).unwrap();
    let (u1, u2) = ("11111111-0000-0000-0000-000000000001", "22222222-0000-0000-0000-000000000002");
    let (s_a, s_b) = (format!("{d}/a/vm.sock"), format!("{d}/b/vm.sock"));
    let socket_of = |p: &str| sw.port_info(p).socket;
    // Two domains, sockets of the same file name in two directories: a port each.
    let one = hook_xml(u1, &[(&s_a, "client", "52:54:00:00:00:01")]);
    let two = hook_xml(
        u2,
        &[(&s_b, "client", "52:54:00:00:00:02"), (&s_a.replace("/a/", "/b/x"), "server", "52:54:00:00:00:03")],
    );
    assert_eq!(run_hook(&conf, "one", "prepare begin", &one), (0, String::new()));
    assert_eq!(run_hook(&conf, "two", "prepare begin", &two), (0, String::new()));
    assert_eq!((socket_of("one-0"), socket_of("two-0")), (s_a.clone(), s_b.clone()));
    assert_eq!(sw.port_info("two-1").mode, "client");
    assert_eq!(sw.port_info("one-0").allowed_macs, ["52:54:00:00:00:01"]);
    let text = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), "ports", "one-0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("allowed_macs: 52:54:00:00:00:01"), "{text:?}");
    // Preparing again (a restart of the same domain) is "unchanged"; a domain called "one"
    // with another socket (another libvirt's, or a redefined one) is not given one-0.
    assert_eq!(run_hook(&conf, "one", "prepare begin", &one).0, 0);
    let (code, err) = run_hook(
        &conf,
        "one",
        "prepare begin",
        &hook_xml(u1, &[(&s_b.replace("vm.", "vx."), "client", "52:54:00:00:00:01")]),
    );
    assert!(code != 0 && err.contains("with another socket"), "{code} {err}");
    // Releasing a domain removes its ports only, and only while they are its own.
    assert_eq!(run_hook(&conf, "two", "release end", &two).0, 0);
    assert!(sw.try_port_info("two-0").is_err() && sw.try_port_info("two-1").is_err());
    assert_eq!(socket_of("one-0"), s_a, "another domain's release took one-0");
    assert_eq!(run_hook(&conf, "one", "release end", &hook_xml(u1, &[(&s_b, "client", "52:54:00:00:00:01")])).0, 0);
    assert_eq!(socket_of("one-0"), s_a, "a release for another socket removed one-0");
    // Names and paths a command line or a directory check could misread.
    let names = hook_xml(u1, &[(&format!("{d}/a/--help.sock"), "client", "52:54:00:00:00:04")]);
    assert_eq!(run_hook(&conf, "-x --help", "prepare begin", &names), (0, String::new()), "a dashed domain name");
    let made: Vec<String> = sw.ports().into_iter().map(|p| p.name).collect();
    assert!(made.iter().any(|n| n.starts_with("_x_--help-") && n.ends_with("-0")), "{made:?}");
    for (path, why) in [
        (format!("{d}/a/lnk/../vm9.sock"), "'..'"),
        (format!("{d}/a/lnk/vm9.sock"), "symbolic link"),
        (format!("{d}/elsewhere/vm9.sock"), "outside the hook's dirs"),
        ("vm9.sock".to_string(), "not an absolute path"),
    ] {
        let (code, err) =
            run_hook(&conf, "bad", "prepare begin", &hook_xml(u2, &[(&path, "client", "52:54:00:00:00:05")]));
        assert!(code == 1 && err.contains("interface 0") && err.contains(why), "{path}: {code} {err}");
    }
    let quoted =
        hook_xml(u2, &[(&format!("{d}/a/q.sock"), "client", "52:54:00:00:00:06&quot;, &quot;00:00:00:00:00:00")]);
    let (code, err) = run_hook(&conf, "quoted", "prepare begin", &quoted);
    assert!(code == 1 && err.contains("is not a MAC address"), "{code} {err}");
    assert!(sw.try_port_info("quoted-0").is_err(), "a port was made with a forged MAC list");
    // Another switch's interface is left alone; a domain with none of pvswitch's too.
    let ovs = hook_xml(u2, &[(&format!("{d}/ovs/vhu1"), "client", "52:54:00:00:00:07")]);
    assert_eq!(run_hook(&conf, "ovs", "prepare begin", &ovs), (0, String::new()));
    assert!(sw.try_port_info("ovs-0").is_err());
    // A broken line refuses pvswitch domains, naming file and line; the others start.
    std::fs::write(&conf, format!("{settings}port_security = on\n")).unwrap();
    let (code, err) = run_hook(&conf, "one", "prepare begin", &one);
    assert!(code == 1 && err.contains(&format!("{}:5", conf.display())), "{code} {err}");
    assert_eq!(run_hook(&conf, "plain", "prepare begin", &hook_xml(u2, &[])), (0, String::new()));
}
