//! The port drop-in directory: ports added at run time (`pvswitchctl add-port`), one file per
//! port, `NAME.toml`, holding that port's keys at the top level (as a `[[port]]` table holds
//! them). It is `ports_dir` in `[switch]`, by default `ports.d` beside the main file, and is
//! read after the main file on every start and reload.
//!
//! Rules: only `*.toml` files not starting with `.` are read (a write in progress is a hidden
//! temporary file); a symbolic link is not followed; a file's name must be its port's name; a
//! name the main file defines too is the main file's (the drop-in is reported, not used). A
//! drop-in with an error fails alone, with its file, line and column; the others load.
//! pvswitchd owns the directory: files are written whole and renamed into place, so a crash
//! leaves the old file or the new one, never half of one.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::ConfigError;

/// One drop-in file as read.
#[derive(Debug, Clone)]
pub struct DropIn {
    pub path: PathBuf,
    pub text: String,
}

/// The header of every file pvswitchd writes.
const HEADER: &str = "# Written by pvswitchd (pvswitchctl add-port/set-port); changed with pvswitchctl.\n";

fn error(path: &Path, message: String) -> ConfigError {
    ConfigError { file: path.display().to_string(), line: 0, col: 0, message, snippet: String::new() }
}

/// The drop-ins of `dir`, in name order, and the files that could not be read. A missing
/// directory holds none.
pub fn read_dir(dir: &Path) -> (Vec<DropIn>, Vec<ConfigError>) {
    let (mut found, mut errors) = (Vec::new(), Vec::new());
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (found, errors),
        Err(e) => return (found, vec![error(dir, format!("cannot read the port directory: {e}"))]),
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.') && name.ends_with(".toml")
        })
        .collect();
    paths.sort();
    for path in paths {
        match read_nofollow(&path) {
            Ok(text) => found.push(DropIn { path, text }),
            Err(e) => errors.push(error(&path, e)),
        }
    }
    (found, errors)
}

fn read_nofollow(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).map_err(
            |e| match e.raw_os_error() {
                Some(libc::ELOOP) => "is a symbolic link; not followed".to_string(),
                _ => format!("cannot read: {e}"),
            },
        )?;
    if !f.metadata().map_err(|e| format!("cannot read: {e}"))?.is_file() {
        return Err("is not a regular file".into());
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut f, &mut text).map_err(|e| format!("cannot read: {e}"))?;
    Ok(text)
}

/// Where port `name`'s drop-in is in `dir`.
pub fn path_of(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.toml"))
}

/// One port's keys as a drop-in's text: `name` first, then `settings` in order (a later key
/// replaces an earlier one). A value is read as TOML when it is one (`4`, `false`,
/// `[10, 20]`, `"x"`), else taken as a string (`mode=client`, `socket=/run/vm.sock`). An empty
/// value removes the key (its default applies). What a key means is the validator's business.
pub fn port_text(name: &str, base: Option<&str>, settings: &[(String, String)]) -> Result<String, String> {
    let mut table: toml::Table = match base {
        Some(t) => toml::from_str(t).map_err(|e| format!("the port's file does not parse: {}", e.message()))?,
        None => toml::Table::new(),
    };
    table.insert("name".into(), toml::Value::String(name.into()));
    for (k, v) in settings {
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("\"{k}\" is not a setting's name (expected KEY=VALUE, e.g. mac_limit=4)"));
        }
        if k == "name" {
            if v != name {
                return Err(format!("name={v}: a port's name is not changed (del-port, then add-port)"));
            }
            continue;
        }
        if v.is_empty() {
            table.remove(k);
            continue;
        }
        let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(v.clone()));
        table.insert(k.clone(), value);
    }
    // `name` first, as an operator would write it; the others in key order.
    let name = table.remove("name").expect("inserted");
    let body = toml::to_string(&table).map_err(|e| format!("cannot write the settings: {e}"))?;
    Ok(format!("{HEADER}name = {name}\n{body}"))
}

/// Writes `text` as port `name`'s drop-in in `dir` (made if missing): whole, synced, renamed
/// over the old file, the directory synced.
pub fn write(dir: &Path, name: &str, text: &str) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    let path = path_of(dir, name);
    let tmp = dir.join(format!(".{name}.toml.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let done = f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).and_then(|_| std::fs::rename(&tmp, &path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir);
    Ok(path)
}

/// Removes port `name`'s drop-in from `dir` (a missing file is not an error).
pub fn remove(dir: &Path, name: &str) -> std::io::Result<()> {
    match std::fs::remove_file(path_of(dir, name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    sync_dir(dir);
    Ok(())
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}
