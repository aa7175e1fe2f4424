//! `[[mirror]]`: copies of chosen frames sent to a port, as OVS's Mirror table means them
//! (its column names are the keys): the frames some ports send (`select_src_port`), the frames
//! some ports are given (`select_dst_port`), or every port's (`select_all`), optionally only
//! those in some VLANs (`select_vlan`) and cut to `snaplen` bytes, go to `output_port`, which
//! then receives nothing else (no flood, no NORMAL, no flow reaches it, and what it sends is
//! dropped). A mirror may name ports that do not exist yet (a VM's port added later by
//! libvirt's hook): it mirrors them once they do, and `pvswitchctl mirrors` says which are
//! absent.
#![forbid(unsafe_code)]

use super::error::{ConfigError, Ctx};
use super::port::{PORT_NAME, is_port_name};
use super::raw::RawMirror;

/// The most mirrors (each is one bit of a port's mirror set in the data path).
pub const MAX_MIRRORS: usize = 64;
/// The most ports a mirror selects by name, each way.
pub const MAX_SELECTED: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorConfig {
    pub name: String,
    pub output_port: String,
    pub select_src_port: Vec<String>,
    pub select_dst_port: Vec<String>,
    /// Every port's frames, as they are sent (so each frame once).
    pub select_all: bool,
    /// Only frames in these VLANs (empty: any frame, tagged or not).
    pub select_vlan: Vec<u16>,
    /// Copies cut to this many bytes (None: whole).
    pub snaplen: Option<u32>,
}

impl MirrorConfig {
    /// Whether the mirror names `port` in any role.
    pub fn names(&self, port: &str) -> bool {
        self.output_port == port || self.select_src_port.iter().chain(&self.select_dst_port).any(|p| p == port)
    }
}

/// The file's `[[mirror]]` tables: names unique, ports well formed, no output port selected
/// by any mirror or the output of two.
pub(super) fn validate(raw: &[RawMirror], cx: &Ctx) -> Result<Vec<MirrorConfig>, ConfigError> {
    if raw.len() > MAX_MIRRORS {
        return Err(cx.err(None, format!("{} mirrors: at most {MAX_MIRRORS}", raw.len())));
    }
    let mut mirrors: Vec<MirrorConfig> = Vec::new();
    for m in raw {
        let name = &cx.name(&m.name, "mirror", |n| mirrors.iter().any(|o| o.name == n))?;
        let ports = |v: &[toml::Spanned<String>], key: &str| -> Result<Vec<String>, ConfigError> {
            if v.len() > MAX_SELECTED {
                return Err(cx.err(Some(m.name.span()), format!("{key}: at most {MAX_SELECTED} ports")));
            }
            let mut out: Vec<String> = Vec::new();
            for p in v {
                if !is_port_name(p.get_ref()) {
                    return Err(cx.err(Some(p.span()), format!("{key}: a port name is {PORT_NAME}")));
                }
                if !out.contains(p.get_ref()) {
                    out.push(p.get_ref().clone());
                }
            }
            Ok(out)
        };
        let output = m.output_port.get_ref();
        if !is_port_name(output) {
            return Err(cx.err(Some(m.output_port.span()), format!("output_port: a port name is {PORT_NAME}")));
        }
        let select_src_port = ports(&m.select_src_port, "select_src_port")?;
        let select_dst_port = ports(&m.select_dst_port, "select_dst_port")?;
        let select_all = m.select_all.unwrap_or(false);
        if !select_all && select_src_port.is_empty() && select_dst_port.is_empty() {
            return Err(cx.err(
                Some(m.name.span()),
                format!(
                    "mirror \"{name}\" selects nothing: name select_src_port, select_dst_port, or select_all = true"
                ),
            ));
        }
        let mut select_vlan = Vec::new();
        for v in &m.select_vlan {
            if !(1..=4094).contains(v.get_ref()) {
                return Err(cx.err(Some(v.span()), "select_vlan: expected VLAN ids from 1 to 4094"));
            }
            select_vlan.push(*v.get_ref() as u16);
        }
        select_vlan.sort_unstable();
        select_vlan.dedup();
        let snaplen = match &m.snaplen {
            None => None,
            Some(s) => Some(cx.range(&Some(s.clone()), "snaplen", 64, 65535, 0)?),
        };
        mirrors.push(MirrorConfig {
            name: name.clone(),
            output_port: output.clone(),
            select_src_port,
            select_dst_port,
            select_all,
            select_vlan,
            snaplen,
        });
    }
    // An output receives the copies and nothing else: no mirror selects it, none shares it.
    for (i, (m, r)) in mirrors.iter().zip(raw).enumerate() {
        let at = Some(r.output_port.span());
        if let Some(o) = mirrors[..i].iter().find(|o| o.output_port == m.output_port) {
            let msg = format!("output_port: \"{}\" is already mirror \"{}\"'s output", m.output_port, o.name);
            return Err(cx.err(at, msg));
        }
        for o in &mirrors {
            if o.select_src_port.contains(&m.output_port) || o.select_dst_port.contains(&m.output_port) {
                let msg = format!(
                    "output_port: mirror \"{}\" selects \"{}\": a mirror's output receives its copies only, and is \
                     never mirrored",
                    o.name, m.output_port
                );
                return Err(cx.err(at, msg));
            }
        }
    }
    Ok(mirrors)
}

/// A mirror added at run time (`pvswitchctl add-mirror NAME KEY=VALUE...`): the settings are
/// `[[mirror]]`'s keys (lists comma-separated: `select_src_port=vm1,vm2`), checked as the file's
/// are and against the mirrors running (`existing`: a name or an output taken, an output
/// another selects, the most mirrors).
pub fn from_settings(
    name: &str,
    settings: &[(String, String)],
    existing: &[MirrorConfig],
) -> Result<MirrorConfig, String> {
    let quoted = |v: &str| toml::Value::String(v.to_string()).to_string();
    let mut text = String::new();
    for m in existing {
        text += &to_toml(m);
    }
    text += &format!("[[mirror]]\nname = {}\n", quoted(name));
    for (k, v) in settings {
        let value = match k.as_str() {
            "select_src_port" | "select_dst_port" => {
                format!("[{}]", v.split(',').filter(|p| !p.is_empty()).map(quoted).collect::<Vec<_>>().join(", "))
            }
            "select_vlan" => {
                let ids: Vec<&str> = v.split(',').filter(|p| !p.is_empty()).collect();
                if !ids.iter().all(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) && i.len() <= 5) {
                    return Err(format!("select_vlan: expected VLAN ids from 1 to 4094, found \"{v}\""));
                }
                format!("[{}]", ids.join(", "))
            }
            "select_all" if v == "true" || v == "false" => v.clone(),
            "select_all" => return Err(format!("select_all: expected true or false, found \"{v}\"")),
            "snaplen" if !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit()) => v.clone(),
            "snaplen" => return Err(format!("snaplen: expected a number from 64 to 65535, found \"{v}\"")),
            "output_port" => quoted(v),
            _ => {
                return Err(format!(
                    "unknown key \"{k}\": expected output_port, select_src_port, select_dst_port, select_all, select_vlan or snaplen"
                ));
            }
        };
        text += &format!("{k} = {value}\n");
    }
    let mut all = validate_text(&text)?;
    all.pop().ok_or_else(|| "no mirror".to_string())
}

/// Whether mirrors `all` may run together (as a file's would be checked).
pub fn check_together(all: &[MirrorConfig]) -> Result<(), String> {
    validate_text(&all.iter().map(to_toml).collect::<String>()).map(|_| ())
}

/// The `[[mirror]]` tables of `text`, checked.
fn validate_text(text: &str) -> Result<Vec<MirrorConfig>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Mirrors {
        #[serde(default)]
        mirror: Vec<RawMirror>,
    }
    let raw: Mirrors = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let cx = Ctx { file: "add-mirror", text };
    validate(&raw.mirror, &cx).map_err(|e| e.message)
}

/// A mirror as the file's `[[mirror]]` table says it.
fn to_toml(m: &MirrorConfig) -> String {
    let list =
        |v: &[String]| v.iter().map(|p| toml::Value::String(p.clone()).to_string()).collect::<Vec<_>>().join(", ");
    let mut s = format!(
        "[[mirror]]\nname = {}\noutput_port = {}\nselect_src_port = [{}]\nselect_dst_port = [{}]\nselect_all = {}\n",
        toml::Value::String(m.name.clone()),
        toml::Value::String(m.output_port.clone()),
        list(&m.select_src_port),
        list(&m.select_dst_port),
        m.select_all
    );
    let vlans: Vec<String> = m.select_vlan.iter().map(|v| v.to_string()).collect();
    s += &format!("select_vlan = [{}]\n", vlans.join(", "));
    if let Some(n) = m.snaplen {
        s += &format!("snaplen = {n}\n");
    }
    s
}
