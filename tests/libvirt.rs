//! libvirt, for real (README "libvirt"): Debian's libvirtd runs two TCG domains whose
//! `<interface type='vhostuser'>` and `<memoryBacking>` are the README's XML, one per port
//! mode; their ports come from the project's qemu hook (dist/libvirt-qemu-hook) calling
//! pvswitchctl add-port/del-port; QEMU runs as libvirt's unprivileged user and pvswitchd under
//! the shipped unit's capability set. One guest pings the other through pvswitchd, across
//! `virsh destroy`/`start` of each domain and a pvswitchd restart.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const HOOK: &str = "/etc/libvirt/hooks/qemu.d/pvswitch";
const HOOK_CONF: &str = "/etc/pvswitch/libvirt-hook.conf";
/// The README's paths, moved to the test's directory.
const README_DIR: &str = "/run/pvswitch";
const MARK: &str = "PVS-LV-PING-OK";

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
            sw.try_ctl("ports").map(|v| v.to_string()).unwrap_or_default(),
            sw.log()
        );
    }
}

/// The port's state, None when there is no such port.
fn port_state(sw: &Switch, name: &str) -> Option<String> {
    let ports = sw.ctl("ports");
    let p = ports.as_array().unwrap().iter().find(|p| p["name"] == name)?;
    p["state"].as_str().map(str::to_string)
}

fn wait_connected(sw: &Switch, name: &str) {
    wait_for(&format!("port {name} connected"), || {
        (port_state(sw, name).as_deref() == Some("connected")).then_some(())
    });
}

#[test]
fn libvirt_domains_in_both_port_modes_through_the_hook() {
    if !require(&[&[Need::Root, Need::Libvirtd, Need::Cmd("setpriv")], QEMU].concat()) {
        return;
    }
    let _g = serial();
    assert!(
        Path::new(HOOK).exists(),
        "{HOOK} is missing: scripts/install-deps.sh installs it before it starts libvirtd"
    );
    let dir = test_dir("libvirt");
    let _clean = Cleanup(vec!["pvs-lva", "pvs-lvb"]);
    for d in ["pvs-lva", "pvs-lvb"] {
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
        let f = dir.join(format!("{name}.xml"));
        std::fs::write(&f, xml).unwrap();
        virsh(&["define", f.to_str().unwrap()]).unwrap();
    }
    let start = |d: &str| virsh(&["start", d]).unwrap_or_else(|e| panic!("{e}\npvswitchd:\n{}", sw.log()));
    start("pvs-lvb");
    start("pvs-lva");

    // The hook made both ports, kept in the port directory; vm1's socket is for group kvm.
    for p in ["vm1", "vm2"] {
        assert!(dir.join("ports.d").join(format!("{p}.toml")).exists(), "no ports.d file for {p}\n{}", sw.log());
    }
    let m = std::fs::metadata(dir.join("vm1.sock")).unwrap();
    assert_eq!((m.gid(), m.mode() & 0o777), (gid_of("kvm"), 0o660), "vm1.sock's group and mode");
    let v1 = sw.port("vm1");
    assert_eq!(v1["mode"], "server", "{v1}");
    assert_eq!(sw.port("vm2")["mode"], "client");
    wait_connected(&sw, "vm1");
    wait_connected(&sw, "vm2");
    wait_pings(&sw, "pvs-lva", 0, 3, "first boot");

    // The peer goes and comes back: its port is removed and made again by the hook.
    virsh(&["destroy", "pvs-lvb"]).unwrap();
    wait_for("vm2 removed by the hook", || port_state(&sw, "vm2").is_none().then_some(()));
    assert!(!dir.join("ports.d/vm2.toml").exists());
    start("pvs-lvb");
    let n = pings(&dir, "pvs-lva");
    wait_pings(&sw, "pvs-lva", n, 3, "after virsh destroy/start of the peer");

    // The pinging guest goes and comes back (its serial file starts again).
    virsh(&["destroy", "pvs-lva"]).unwrap();
    wait_for("vm1 removed by the hook", || port_state(&sw, "vm1").is_none().then_some(()));
    start("pvs-lva");
    wait_pings(&sw, "pvs-lva", 0, 3, "after virsh destroy/start of the pinging guest");

    // pvswitchd restarts: the ports come back from ports.d, both guests reconnect.
    sw.restart(false);
    wait_connected(&sw, "vm1");
    wait_connected(&sw, "vm2");
    let n = pings(&dir, "pvs-lva");
    wait_pings(&sw, "pvs-lva", n, 3, "after a pvswitchd restart");
    for p in ["vm1", "vm2"] {
        let s = sw.port(p);
        assert_eq!(s["drops"]["malformed"], 0, "{s}");
    }

    // Both domains gone: so are their ports.
    virsh(&["destroy", "pvs-lva"]).unwrap();
    virsh(&["destroy", "pvs-lvb"]).unwrap();
    wait_for("both ports removed", || {
        (port_state(&sw, "vm1").is_none() && port_state(&sw, "vm2").is_none()).then_some(())
    });
    let left: Vec<PathBuf> = std::fs::read_dir(dir.join("ports.d")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "port files left: {left:?}");
}

/// The unit's capabilities without CAP_CHOWN: a socket_group cannot be given, and the port
/// says so (failed, naming the capability) while the rest of the switch runs.
#[test]
fn socket_group_without_cap_chown_fails_the_port_and_says_why() {
    if !require(&[Need::Root, Need::Cmd("setpriv")]) {
        return;
    }
    let _g = serial();
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
    let p = sw.port("vm1");
    assert_eq!(p["state"], "failed", "{p}");
    assert!(p["last_error"].as_str().unwrap_or("").contains("CAP_CHOWN"), "{p}");
    assert_eq!(sw.port("vm2")["state"], "connecting");
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
