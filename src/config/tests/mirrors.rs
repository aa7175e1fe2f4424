//! `[[mirror]]`: OVS's mirror columns as keys; each bad value refused at its line and column,
//! and no flow, other mirror or selection may reach a mirror's output.

use super::super::*;

/// Three vhost-user ports, a flow, then `rest`.
fn file(rest: &str, flows: &str) -> String {
    let port = |n: &str| format!("[[port]]\nname = \"{n}\"\ntype = \"vhost-user\"\nsocket = \"{n}.sock\"\n");
    format!("flows = [{flows}]\n{}{}{}{rest}", port("a"), port("b"), port("tap"))
}

fn err(rest: &str) -> (usize, usize, String) {
    let e = Config::parse("t.toml", &file(rest, "")).unwrap_err();
    (e.line, e.col, e.message)
}

#[test]
fn a_mirror_reads_as_ovs_names_it_and_may_name_ports_to_come() {
    let text = "[[mirror]]\nname = \"span\"\noutput_port = \"tap\"\nselect_src_port = [\"a\", \"later\", \"a\"]\n\
                select_dst_port = [\"a\"]\nselect_vlan = [20, 10, 20]\nsnaplen = 128\n";
    let c = Config::parse("t.toml", &file(text, "")).unwrap();
    let m = &c.mirrors[0];
    assert_eq!((m.name.as_str(), m.output_port.as_str()), ("span", "tap"));
    assert_eq!(m.select_src_port, ["a", "later"], "a port not there yet is kept; duplicates go");
    assert_eq!((m.select_dst_port.clone(), m.select_vlan.clone()), (vec!["a".to_string()], vec![10, 20]));
    assert_eq!((m.select_all, m.snaplen), (false, Some(128)));
}

#[test]
fn bad_mirrors_are_refused_where_they_are_wrong() {
    // Lines: 1 flows, 2-13 the three ports, 14 [[mirror]], 15 name, 16 output_port, 17 on.
    let m = |keys: &str| format!("[[mirror]]\nname = \"m\"\noutput_port = \"tap\"\n{keys}");
    let (line, _, msg) = err(&m(""));
    assert_eq!(line, 15);
    assert!(msg.contains("selects nothing"), "{msg}");
    let (line, col, msg) = err(&m("select_src_port = [\"a\", \"-x\"]\n"));
    assert_eq!((line, col), (17, 25));
    assert!(msg.contains("select_src_port: a port name is"), "{msg}");
    let (line, _, msg) = err(&m("select_all = true\nselect_vlan = [0]\n"));
    assert_eq!(line, 18);
    assert!(msg.contains("select_vlan: expected VLAN ids from 1 to 4094"), "{msg}");
    let (line, _, msg) = err(&m("select_all = true\nsnaplen = 10\n"));
    assert_eq!(line, 18);
    assert!(msg.contains("snaplen: expected a value from 64 to 65535"), "{msg}");
    let (line, _, msg) = err(&m("select_all = true\nbogus = 1\n"));
    assert!(line >= 14 && msg.contains("unknown field"), "{line} {msg}");
    // The output selected (by itself or another), or the output of two mirrors.
    let (line, _, msg) = err(&m("select_src_port = [\"tap\"]\n"));
    assert_eq!(line, 16);
    assert!(msg.contains("mirror \"m\" selects \"tap\""), "{msg}");
    let two =
        format!("{}[[mirror]]\nname = \"n\"\noutput_port = \"tap\"\nselect_all = true\n", m("select_all = true\n"));
    let (line, _, msg) = err(&two);
    assert_eq!(line, 20);
    assert!(msg.contains("\"tap\" is already mirror \"m\"'s output"), "{msg}");
    let dup = format!("{}[[mirror]]\nname = \"m\"\noutput_port = \"b\"\nselect_all = true\n", m("select_all = true\n"));
    assert!(err(&dup).2.contains("duplicate mirror \"m\""));
}

/// A flow may not name a mirror's output, to match or to send to.
#[test]
fn no_flow_reaches_a_mirrors_output() {
    let m = "[[mirror]]\nname = \"m\"\noutput_port = \"tap\"\nselect_all = true\n";
    for flow in ["\"in_port=a actions=output:tap\"", "\"in_port=tap actions=output:a\""] {
        let e = Config::parse("t.toml", &file(m, flow)).unwrap_err();
        assert_eq!(e.line, 1, "{e}");
        assert!(e.message.contains("port \"tap\" is mirror \"m\"'s output"), "{e}");
    }
    Config::parse("t.toml", &file(m, "\"in_port=a actions=output:b\"")).unwrap();
}
