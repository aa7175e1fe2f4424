//! The source layout is the map of the architecture, and its dependencies point one way: no
//! source file under src/ imports (`use`) from a file that, directly or through others, imports
//! back from it. Each file is a node; an edge is a `use` of `crate::...`, `super::...` or
//! `self::...` that lands in another file (the longest module path that is a file: an item
//! imported from `datapath::counters` is an edge to `datapath/counters.rs`). Module
//! declarations (`mod x;`) are not imports: a parent holds its children without depending on
//! them. Test-only code (each file's `#[cfg(test)] mod tests`, `src/**/tests/`, `src/fuzz/`) and
//! the binaries (`src/bin/`, which only use the library) are not counted. Runs without root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every library source file, by module path (`datapath::rx::guest`).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(src).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if rel != "bin" && rel != "fuzz" && !rel.ends_with("tests") {
                    dirs.push(p);
                }
                continue;
            }
            let Some(stem) = rel.strip_suffix(".rs") else { continue };
            let path = match stem {
                "lib" => String::new(),
                s => s.strip_suffix("/mod").unwrap_or(s).replace('/', "::"),
            };
            if path != "tests" && !path.ends_with("::tests") {
                out.insert(path, p);
            }
        }
    }
    out
}

/// The `use` paths of a file's code (its unit tests aside), each as written (groups expanded),
/// and whether it is a re-export (`pub use`).
fn uses(text: &str) -> Vec<(String, bool)> {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    let mut out = Vec::new();
    let mut stmt = String::new();
    let (mut inside, mut public) = (false, false);
    // Inline modules (`mod imp { ... }`): inside one, `super::` is the file itself.
    let (mut depth, mut inline): (i32, Vec<i32>) = (0, Vec::new());
    let mut lines = Vec::new();
    for line in code.lines().map(str::trim) {
        let opens_mod = (line.starts_with("mod ") || line.starts_with("pub mod ")) && line.ends_with('{');
        if opens_mod {
            inline.push(depth);
        }
        lines.push((line, inline.len()));
        if !line.starts_with("//") {
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
        }
        while inline.last().is_some_and(|&d| depth <= d) {
            inline.pop();
        }
    }
    let local = |p: String, n: usize| -> String {
        let mut p = p.as_str();
        let mut k = 0;
        while k < n && p.starts_with("super::") {
            p = &p["super::".len()..];
            k += 1;
        }
        if k > 0 && !p.starts_with("super::") { format!("self::{p}") } else { p.to_string() }
    };
    let mut stmt_n = 0;
    for &(line, n) in &lines {
        if line.starts_with("//") {
            continue;
        }
        if !inside {
            stmt_n = n;
            let rest = ["pub ", "pub(crate) ", "pub(super) "].iter().find_map(|p| line.strip_prefix(p));
            public = rest.is_some();
            let line = rest.unwrap_or(line);
            if !line.starts_with("use ") {
                continue;
            }
            inside = true;
            stmt.clear();
            stmt.push_str(line);
        } else {
            stmt.push_str(line);
        }
        if stmt.ends_with(';') {
            inside = false;
            let mut paths = Vec::new();
            expand(stmt.trim_start_matches("use ").trim_end_matches(';'), "", &mut paths);
            out.extend(paths.into_iter().map(|p| (local(p, stmt_n), public)));
        }
    }
    // Paths written out in the code (`crate::x::Y`, `super::z::f(...)`) are uses too.
    for &(line, n) in lines.iter().filter(|(l, _)| !l.starts_with("//") && !l.contains("use ")) {
        for start in ["crate::", "super::"] {
            let mut rest = line;
            while let Some(i) = rest.find(start) {
                let before = rest[..i].chars().last();
                let tail = &rest[i..];
                let end = tail.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    out.push((local(tail[..end].trim_end_matches(':').to_string(), n), false));
                }
                rest = &tail[end.max(1)..];
            }
        }
    }
    out
}

/// `a::{b, c::{d}}` into `a::b`, `a::c::d`.
fn expand(s: &str, prefix: &str, out: &mut Vec<String>) {
    let s = s.trim();
    match s.find('{') {
        None => out.push(format!("{prefix}{}", s.split(" as ").next().unwrap().trim())),
        Some(open) => {
            let head = &s[..open];
            let body = &s[open + 1..s.rfind('}').unwrap()];
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&body[start..i], &format!("{prefix}{head}"), out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            if !body[start..].trim().is_empty() {
                expand(&body[start..], &format!("{prefix}{head}"), out);
            }
        }
    }
}

/// Where `name` of module `m` really is, if `m` only re-exports it (`pub use x::name`), as a
/// path usable from `m`.
type Reexports = BTreeMap<String, BTreeMap<String, String>>;

/// The module (file) `path`, as used in module `from`, lands in: the longest prefix that is a
/// file, followed through that file's re-exports (an item `wire` re-exports from `wire::mac`
/// is `wire::mac`'s). None for other crates and the standard library.
fn target(path: &str, from: &str, mods: &BTreeMap<String, PathBuf>, re: &Reexports) -> Option<String> {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    let mut base: Vec<String> = if from.is_empty() { vec![] } else { from.split("::").map(String::from).collect() };
    match parts.first().copied() {
        Some("crate") => {
            base.clear();
            parts.remove(0);
        }
        Some("self") => {
            parts.remove(0);
        }
        Some("super") => {
            while parts.first() == Some(&"super") {
                parts.remove(0);
                base.pop();
            }
        }
        // A child module of this one (`use submodule::Item` in a mod.rs), else an extern crate.
        Some(first) if mods.contains_key(&join(&base, &[first])) => {}
        _ => return None,
    }
    let full: Vec<String> = base.into_iter().chain(parts.iter().map(|s| s.to_string())).collect();
    let n = (0..=full.len()).rev().find(|&n| mods.contains_key(&full[..n].join("::")))?;
    let m = full[..n].join("::");
    if let Some(name) = full.get(n)
        && let Some(to) = re.get(&m).and_then(|r| r.get(name))
        && !to.is_empty()
    {
        let rest = full[n + 1..].iter().fold(to.clone(), |p, s| format!("{p}::{s}"));
        if let Some(t) = target(&rest, &m, mods, re).filter(|t| *t != m) {
            return Some(t);
        }
    }
    Some(m)
}

fn join(base: &[String], more: &[&str]) -> String {
    base.iter().map(String::as_str).chain(more.iter().copied()).collect::<Vec<_>>().join("::")
}

#[test]
fn no_source_file_imports_back_from_what_it_imports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    let texts: BTreeMap<&String, Vec<(String, bool)>> =
        mods.iter().map(|(m, p)| (m, uses(&std::fs::read_to_string(p).unwrap()))).collect();
    // Re-exports: a facade's `pub use` is no use of its own; what is imported through it is
    // the file it comes from's.
    let mut re: Reexports = BTreeMap::new();
    for (m, us) in &texts {
        for (u, public) in us {
            let name = u.rsplit("::").next().unwrap_or("");
            if *public && name != "*" && name != "self" {
                re.entry((*m).clone()).or_default().insert(name.to_string(), u.clone());
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, us) in &texts {
        for (u, public) in us {
            if *public {
                continue;
            }
            if let Some(t) = target(u, m, &mods, &re)
                && &t != *m
            {
                edges.entry((*m).clone()).or_default().insert(t);
            }
        }
    }
    // A cycle, found by depth-first search: its modules in order.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    let mut cycles = Vec::new();
    fn visit<'a>(
        m: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
        cycles: &mut Vec<String>,
    ) {
        state.insert(m, 1);
        stack.push(m);
        for n in edges.get(m).into_iter().flatten() {
            match state.get(n.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|s| *s == n).unwrap();
                    let mut c: Vec<&str> = stack[at..].to_vec();
                    c.push(n);
                    cycles.push(c.join(" -> "));
                }
                Some(_) => {}
                None => visit(n, edges, state, stack, cycles),
            }
        }
        stack.pop();
        state.insert(m, 2);
    }
    for m in mods.keys() {
        if !state.contains_key(m.as_str()) {
            let mut stack = Vec::new();
            visit(m, &edges, &mut state, &mut stack, &mut cycles);
        }
    }
    assert!(cycles.is_empty(), "import circles in src/ (file -> file it uses):\n{}", cycles.join("\n"));
    // The checker sees the imports it should: the data path uses the flow table.
    assert!(edges["datapath::classify"].contains("flow::table"), "{:?}", edges["datapath::classify"]);
}

/// The checker itself: groups, renames, `super`, `self` and re-exports resolve to files.
#[test]
fn the_checker_reads_use_statements() {
    let u = uses(
        "use super::{a, b::{C, d::E}};\npub use crate::x::Y as Z;\n// use crate::no;\nmod imp {\n    use super::Own;\n}\n#[cfg(test)]\nmod tests {\nuse crate::t;\n}",
    );
    let paths: Vec<&str> = u.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["super::a", "super::b::C", "super::b::d::E", "crate::x::Y", "self::Own"]);
    assert_eq!(u.iter().map(|(_, p)| *p).collect::<Vec<_>>(), [false, false, false, true, false]);
    let mods: BTreeMap<String, PathBuf> =
        ["", "a", "a::b", "a::c", "x"].iter().map(|m| (m.to_string(), PathBuf::new())).collect();
    let mut re = Reexports::new();
    re.entry("a".into()).or_default().insert("Thing".into(), "c::Thing".into());
    assert_eq!(target("super::c::Item", "a::b", &mods, &re).as_deref(), Some("a::c"));
    assert_eq!(target("crate::x::Y", "a", &mods, &re).as_deref(), Some("x"));
    assert_eq!(target("self::b::Thing", "a", &mods, &re).as_deref(), Some("a::b"));
    assert_eq!(target("b::Thing", "a", &mods, &re).as_deref(), Some("a::b"));
    assert_eq!(target("super::Thing", "a::b", &mods, &re).as_deref(), Some("a::c"), "through a's re-export");
    assert_eq!(target("std::sync::Arc", "a", &mods, &re), None);
}
