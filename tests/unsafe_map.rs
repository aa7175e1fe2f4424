//! DESIGN.md's table of where `unsafe` lives is the map a reviewer audits: it must name every
//! source file that holds `unsafe` code (test-only code aside), and nothing that holds none.
//! Runs without root.

use std::path::{Path, PathBuf};

/// The paths the table's first column names (`mem/segs.rs`, `port/dpdk/`, ...), relative to
/// src/.
fn table_paths(design: &str) -> Vec<String> {
    let start = design.find("## Where `unsafe` lives").expect("DESIGN.md has its `unsafe` section");
    let section = &design[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |i| i + 3);
    let mut paths = Vec::new();
    for line in section[..end].lines().filter(|l| l.starts_with("| `")) {
        let first = line.split('|').nth(1).unwrap_or("");
        for (i, part) in first.split('`').enumerate() {
            // Backticked names are the odd parts; a path has a slash or ends in .rs.
            if i % 2 == 1 && (part.contains('/') || part.ends_with(".rs")) {
                paths.push(part.split_whitespace().next().unwrap_or(part).to_string());
            }
        }
    }
    paths
}

/// Source files under src/ holding `unsafe` outside comments, relative to src/; test-only
/// code (the in-process test harness, the fuzz targets) aside.
fn files_with_unsafe(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p: PathBuf = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if rel != "fuzz" && !rel.ends_with("/tests") {
                    dirs.push(p);
                }
                continue;
            }
            if !rel.ends_with(".rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            // The file's code before its unit tests.
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
            let uses = code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")).any(|l| {
                l.contains("unsafe {")
                    || l.contains("unsafe fn")
                    || l.contains("unsafe impl")
                    || l.contains("unsafe extern")
            });
            if uses {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn design_names_every_file_that_holds_unsafe() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = std::fs::read_to_string(root.join("DESIGN.md")).unwrap();
    let listed = table_paths(&design);
    assert!(!listed.is_empty(), "no paths found in DESIGN.md's `unsafe` table");
    let files = files_with_unsafe(&root.join("src"));
    let missing: Vec<&String> = files.iter().filter(|f| !listed.iter().any(|l| f.starts_with(l.as_str()))).collect();
    assert!(missing.is_empty(), "files with `unsafe` that DESIGN.md's table does not name: {missing:?}");
    let stale: Vec<&String> = listed
        .iter()
        .filter(|l| !l.starts_with("dpdk-sys") && !files.iter().any(|f| f.starts_with(l.as_str())))
        .collect();
    assert!(stale.is_empty(), "DESIGN.md's `unsafe` table names paths with no `unsafe` code: {stale:?}");
}
