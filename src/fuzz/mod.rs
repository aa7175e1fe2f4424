//! Fuzzing on stable Rust, under plain `cargo test`: a small mutation engine and one target per
//! surface a frontend or an operator controls (DESIGN.md, "Fuzzing").
//!
//! No libFuzzer, no sanitizers, no coverage instrumentation (none of that works on stable):
//! each target is a `#[test]` that runs inputs for a bounded time (`PVS_FUZZ_SECS`, default 4
//! s) and a bounded number of iterations (`PVS_FUZZ_ITERS`), starting from the corpus committed
//! in `fuzz/corpus/<target>/` and the inputs that once failed, in `fuzz/regressions/<target>/`.
//! Inputs are mutated blindly (bit flips, interesting values, splices, inserted and deleted
//! ranges, dictionary tokens) and built by structure-aware generators where blind bytes could
//! not get deep (a valid message header, a consistent TCP frame, a ring whose descriptors point
//! into guest memory). Instead of coverage, each run returns a *signature* of how far the input
//! got, 64 bits each standing for one outcome (a request answered or refused, the error that
//! stopped a walk, a segment count): an input that sets a bit no input set before joins the
//! pool that mutations start from; one with a new combination of bits, now and then.
//!
//! A panic (a failed assertion included) is caught per input; the input is saved to
//! `target/fuzz-findings/<target>-<seed>-<iteration>.bin` and the test fails naming it. An input
//! that runs longer than `PVS_FUZZ_HANG_MS` (default 5000) is saved the same way by a watchdog,
//! which then aborts the process (a loop cannot be interrupted). `PVS_FUZZ_SEED` repeats a run;
//! `PVS_FUZZ_REPLAY=path` runs one saved input (the target whose name the path contains).

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod gso;
mod parsers;
mod underlay;
mod vhost;
mod vring;

/// A seeded xorshift64* generator: the same seed makes the same run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability 1/n.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Values that sit on boundaries: zero, one, sign bits, all ones, powers of two.
pub const INTERESTING: [u64; 16] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    u64::MAX,
];

/// One fuzz target.
pub struct Target {
    pub name: &'static str,
    /// Inputs are cut to this length.
    pub max_len: usize,
    /// Runs one input; panics if the code under test misbehaved. Returns the input's signature
    /// (how far it got): inputs with a new one join the pool.
    pub run: fn(&[u8]) -> u64,
    /// Builds a well-formed input from scratch.
    pub generate: Option<fn(&mut Rng) -> Vec<u8>>,
    /// A mutation that knows the input's structure.
    pub mutate: Option<fn(&mut Rng, &mut Vec<u8>)>,
    /// Tokens worth inserting (keywords, separators).
    pub dict: &'static [&'static [u8]],
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

fn repo_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(sub)
}

fn findings_dir() -> PathBuf {
    repo_dir("target/fuzz-findings")
}

/// The files of `dir`, sorted by name (none if it does not exist).
pub fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .map(|p| {
                    let b = std::fs::read(&p).unwrap();
                    (p, b)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".into()
    }
}

fn save(name: &str, tag: &str, input: &[u8]) -> PathBuf {
    let dir = findings_dir();
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{name}-{tag}.bin"));
    std::fs::write(&path, input).unwrap_or_else(|e| eprintln!("fuzz: cannot save {}: {e}", path.display()));
    path
}

/// Runs `input`, turning a panic into Err(message). Should it fault instead (SIGSEGV: a read
/// outside memory, such as a fenced-off page next to guest memory), `crash` gets the input.
fn run_one(t: &Target, input: &[u8]) -> Result<u64, String> {
    crash::arm(input, t.name);
    let r = catch_unwind(AssertUnwindSafe(|| (t.run)(input))).map_err(|e| panic_message(&*e));
    crash::disarm();
    r
}

/// A SIGSEGV while an input runs: the input is written to
/// `target/fuzz-findings/<target>-crash.bin` before the process dies. The handler then puts the
/// previous one back (Rust's stack-overflow handler, or the default) and returns, so the
/// faulting access faults again into it.
mod crash {
    use std::cell::Cell;
    use std::ffi::CString;
    use std::sync::OnceLock;

    thread_local! {
        /// The running input (pointer, length) and where to save it.
        static CUR: Cell<(*const u8, usize, *const libc::c_char)> =
            const { Cell::new((std::ptr::null(), 0, std::ptr::null())) };
    }
    static OLD: OnceLock<libc::sigaction> = OnceLock::new();
    static PATHS: std::sync::Mutex<Vec<(&'static str, &'static CString)>> = std::sync::Mutex::new(Vec::new());

    extern "C" fn on_fault(sig: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        let (p, n, path) = CUR.with(|c| c.get());
        if !p.is_null() {
            const MSG: &[u8] = b"\nfuzz: SIGSEGV while running an input; saved to ";
            // SAFETY: async-signal-safe calls on a path and an input that outlive the run.
            unsafe {
                let fd = libc::open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
                if fd >= 0 {
                    libc::write(fd, p as *const libc::c_void, n);
                    libc::close(fd);
                }
                libc::write(2, MSG.as_ptr() as *const libc::c_void, MSG.len());
                libc::write(2, path as *const libc::c_void, libc::strlen(path));
                libc::write(2, b"\n".as_ptr() as *const libc::c_void, 1);
            }
        }
        if let Some(old) = OLD.get() {
            // SAFETY: puts back the action that was there before ours.
            unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
        }
    }

    fn install() {
        OLD.get_or_init(|| {
            // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_fault as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGSEGV, &sa, &mut old);
                old
            }
        });
    }

    fn path(name: &'static str) -> *const libc::c_char {
        let mut v = PATHS.lock().unwrap();
        if let Some((_, p)) = v.iter().find(|(n, _)| *n == name) {
            return p.as_ptr();
        }
        let dir = super::findings_dir();
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join(format!("{name}-crash.bin"));
        let c: &'static CString = Box::leak(Box::new(CString::new(p.to_string_lossy().as_bytes()).unwrap()));
        v.push((name, c));
        c.as_ptr()
    }

    pub fn arm(input: &[u8], name: &'static str) {
        install();
        let p = path(name);
        CUR.with(|c| c.set((input.as_ptr(), input.len(), p)));
    }

    pub fn disarm() {
        CUR.with(|c| c.set((std::ptr::null(), 0, std::ptr::null())));
    }
}

/// Runs every file in `fuzz/regressions/<target>/`: inputs that once failed.
pub fn regressions(t: &Target) {
    for (path, input) in files(&repo_dir("fuzz/regressions").join(t.name)) {
        if let Err(m) = run_one(t, &input) {
            panic!("fuzz target {}: regression {} fails again: {m}", t.name, path.display());
        }
    }
}

/// The watchdog: while an input runs, its start and a copy of it; an input that runs for
/// longer than the limit is saved and the process aborted.
struct Watch {
    started: AtomicU64,
    input: Mutex<Vec<u8>>,
    done: AtomicBool,
}

fn now_ms(base: Instant) -> u64 {
    base.elapsed().as_millis() as u64 + 1
}

fn watchdog(name: &'static str, tag: String, w: Arc<Watch>, base: Instant, limit_ms: u64) {
    while !w.done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        let s = w.started.load(Ordering::Relaxed);
        if s != 0 && now_ms(base).saturating_sub(s) > limit_ms {
            let input = w.input.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let path = save(name, &format!("{tag}-hang"), &input);
            // Straight to stderr: the test harness's capture would die with the process.
            let _ = writeln!(
                std::io::stderr(),
                "fuzz target {name}: an input ran for more than {limit_ms} ms (a hang); saved to {}; replay with \
                 PVS_FUZZ_REPLAY={} cargo test --release --lib fuzz::{name}",
                path.display(),
                path.display()
            );
            std::process::abort();
        }
    }
}

/// Applies one blind mutation to `v`, `pool` being the inputs to splice from. Long because it
/// is one arm per mutation kind, a table of them.
fn mutate_bytes(rng: &mut Rng, v: &mut Vec<u8>, pool: &[Vec<u8>], dict: &[&[u8]], max_len: usize) {
    let len = v.len();
    match rng.below(11) {
        0 if len > 0 => {
            let i = rng.below(len);
            v[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            v[i] = rng.next() as u8;
        }
        2 | 3 if len > 0 => {
            // An interesting value, 1, 2, 4 or 8 bytes wide, either byte order.
            let w = 1 << rng.below(4);
            let mut x = *rng.pick(&INTERESTING);
            if rng.one_in(3) {
                x = x.wrapping_sub(1);
            }
            // The low `w` bytes of x, in either order.
            let b: Vec<u8> =
                if rng.one_in(2) { x.to_le_bytes()[..w].to_vec() } else { x.to_be_bytes()[8 - w..].to_vec() };
            let at = rng.below(len);
            let n = w.min(len - at);
            v[at..at + n].copy_from_slice(&b[..n]);
        }
        4 if len > 0 => {
            // Add or subtract a small amount to a byte or a little-endian u16/u32.
            let w = [1, 2, 4][rng.below(3)];
            if len >= w {
                let at = rng.below(len - w + 1);
                let mut b = [0u8; 8];
                b[..w].copy_from_slice(&v[at..at + w]);
                let d = rng.below(33) as u64;
                let x = u64::from_le_bytes(b);
                let x = if rng.one_in(2) { x.wrapping_add(d) } else { x.wrapping_sub(d) };
                v[at..at + w].copy_from_slice(&x.to_le_bytes()[..w]);
            }
        }
        5 if !pool.is_empty() => {
            // Splice: a range of another input, inserted or written over.
            let o = rng.pick(pool);
            if !o.is_empty() {
                let s = rng.below(o.len());
                let n = 1 + rng.below((o.len() - s).min(256));
                let at = rng.below(len + 1);
                if rng.one_in(2) {
                    v.splice(at..at, o[s..s + n].iter().copied());
                } else {
                    let end = (at + n).min(len);
                    v.splice(at..end, o[s..s + n].iter().copied());
                }
            }
        }
        6 => {
            // Insert random bytes, or a copy of a range of this input.
            let at = rng.below(len + 1);
            let ins = if len > 0 && rng.one_in(2) {
                let s = rng.below(len);
                let n = 1 + rng.below((len - s).min(128));
                v[s..s + n].to_vec()
            } else {
                let n = 1 + rng.below(16);
                rng.bytes(n)
            };
            v.splice(at..at, ins);
        }
        7 if len > 0 => {
            let s = rng.below(len);
            let n = 1 + rng.below((len - s).min(64));
            v.drain(s..s + n);
        }
        8 | 9 if !dict.is_empty() => {
            let tok = rng.pick(dict);
            let at = rng.below(len + 1);
            if rng.one_in(3) && at < len {
                let end = (at + tok.len()).min(len);
                v.splice(at..end, tok.iter().copied());
            } else {
                v.splice(at..at, tok.iter().copied());
            }
        }
        10 if len > 1 => {
            // Truncate.
            v.truncate(rng.below(len));
        }
        _ => {
            let at = rng.below(len + 1);
            v.insert(at, rng.next() as u8);
        }
    }
    v.truncate(max_len);
}

/// Runs target `t`: the replay file if `PVS_FUZZ_REPLAY` names one of this target's, else the
/// corpus, the regressions and then mutated and generated inputs until the time or the
/// iterations run out. Panics, naming the saved input, on the first input that fails.
/// Long because it is the engine's one loop and its phases share the corpus and coverage.
pub fn fuzz(t: &Target) {
    if let Ok(path) = std::env::var("PVS_FUZZ_REPLAY") {
        let p = Path::new(&path);
        let mine = p.file_name().is_some_and(|f| f.to_string_lossy().starts_with(&format!("{}-", t.name)))
            || p.components().any(|c| c.as_os_str() == t.name);
        if !mine {
            eprintln!("fuzz target {}: PVS_FUZZ_REPLAY={path} is not one of this target's inputs; skipped", t.name);
            return;
        }
        let input = std::fs::read(p).unwrap_or_else(|e| panic!("PVS_FUZZ_REPLAY={path}: {e}"));
        match run_one(t, &input) {
            Ok(sig) => eprintln!("fuzz target {}: {path} ran without failure (signature {sig:#x})", t.name),
            Err(m) => panic!("fuzz target {}: {path} fails: {m}", t.name),
        }
        return;
    }
    let secs = env_u64("PVS_FUZZ_SECS").unwrap_or(4);
    let max_iters = env_u64("PVS_FUZZ_ITERS").unwrap_or(u64::MAX);
    let hang_ms = env_u64("PVS_FUZZ_HANG_MS").unwrap_or(5000);
    let seed = env_u64("PVS_FUZZ_SEED").unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    });
    eprintln!("fuzz target {}: seed {seed:#x} (PVS_FUZZ_SEED={seed:#x} repeats this run), {secs} s", t.name);
    let mut rng = Rng::new(seed);
    let mut pool: Vec<Vec<u8>> = files(&repo_dir("fuzz/corpus").join(t.name)).into_iter().map(|(_, b)| b).collect();
    let seeds = pool.len();
    pool.extend(files(&repo_dir("fuzz/regressions").join(t.name)).into_iter().map(|(_, b)| b));
    assert!(!pool.is_empty() || t.generate.is_some(), "fuzz target {}: no corpus and no generator", t.name);
    let base = Instant::now();
    let watch =
        Arc::new(Watch { started: AtomicU64::new(0), input: Mutex::new(Vec::new()), done: AtomicBool::new(false) });
    let dog = {
        let (w, tag, name) = (watch.clone(), format!("{seed:x}"), t.name);
        std::thread::spawn(move || watchdog(name, tag, w, base, hang_ms))
    };
    let (mut seen, mut bits) = (std::collections::HashSet::new(), 0u64);
    let deadline = base + Duration::from_secs(secs);
    let (mut iters, mut first) = (0u64, 0usize);
    let failure = loop {
        if iters >= max_iters || (first >= pool.len() && Instant::now() >= deadline) {
            break None;
        }
        // The corpus and regressions first, as they are; then mutants and generated inputs.
        let input = if first < pool.len() {
            first += 1;
            pool[first - 1].clone()
        } else if let Some(g) = t.generate.filter(|_| pool.is_empty() || rng.one_in(8)) {
            g(&mut rng)
        } else {
            let mut v = rng.pick(&pool).clone();
            let most = if rng.one_in(4) { 16 } else { 4 };
            for _ in 0..1 + rng.below(most) {
                match t.mutate {
                    Some(m) if rng.one_in(2) => m(&mut rng, &mut v),
                    _ => mutate_bytes(&mut rng, &mut v, &pool, t.dict, t.max_len),
                }
            }
            v.truncate(t.max_len);
            v
        };
        {
            let mut w = watch.input.lock().unwrap();
            w.clear();
            w.extend_from_slice(&input);
        }
        watch.started.store(now_ms(base), Ordering::Relaxed);
        let r = run_one(t, &input);
        watch.started.store(0, Ordering::Relaxed);
        iters += 1;
        match r {
            Ok(sig) => {
                let new_bits = sig & !bits != 0;
                bits |= sig;
                if (new_bits || seen.insert(sig) && rng.one_in(16)) && first >= pool.len() && pool.len() < 1024 {
                    pool.push(input);
                    first = pool.len();
                }
            }
            Err(m) => break Some((input, m)),
        }
    };
    watch.done.store(true, Ordering::Relaxed);
    let _ = dog.join();
    let el = base.elapsed().as_secs_f64();
    eprintln!(
        "fuzz target {}: {iters} inputs in {el:.1} s ({:.0}/s), {seeds} seeds, pool {}, {} outcomes, {} signatures",
        t.name,
        iters as f64 / el,
        pool.len(),
        bits.count_ones(),
        seen.len()
    );
    if let Some((input, m)) = failure {
        let path = save(t.name, &format!("{seed:x}-{iters}"), &input);
        panic!(
            "fuzz target {} failed (seed {seed:#x}, input {iters}): {m}\n  input saved to {}\n  replay: \
             PVS_FUZZ_REPLAY={} cargo test --release --lib fuzz::{}",
            t.name,
            path.display(),
            path.display(),
            t.name
        );
    }
}

/// The signature bit of an outcome described by a few values.
pub fn bit(parts: &[u64]) -> u64 {
    1 << (sig(parts) % 64)
}

/// A hash of a few values (FNV-1a over their bytes).
pub fn sig(parts: &[u64]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for b in p.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// The signature bit of an error message: its words up to the first value it quotes (a
/// number, a name), so messages that differ only in values share it.
pub fn shape(msg: &str) -> u64 {
    let end = msg.find(|c: char| !(c.is_ascii_alphabetic() || c == ' ' || c == '_')).unwrap_or(msg.len());
    bit(&msg.as_bytes()[..end.min(40)].iter().map(|&b| b as u64).collect::<Vec<_>>())
}

/// Writes inputs made by each target's generator into `fuzz/corpus/<target>/gen-<i>.bin` (run
/// by hand when a generator changes: `cargo test --release --lib fuzz::write_seeds -- --ignored`).
#[test]
#[ignore]
fn write_seeds() {
    for t in [
        &vhost::TARGET,
        &vring::TARGET,
        &gso::TARGET,
        &underlay::UNDERLAY,
        &underlay::FRONT,
        &underlay::VTEP_SYNC,
        &underlay::DROPIN,
    ] {
        let dir = repo_dir("fuzz/corpus").join(t.name);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..6u64 {
            let input = (t.generate.unwrap())(&mut Rng::new(0x5eed + i));
            run_one(t, &input).unwrap_or_else(|m| panic!("{}: generated seed {i} fails: {m}", t.name));
            std::fs::write(dir.join(format!("gen-{i}.bin")), input).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boom(b: &[u8]) -> u64 {
        assert!(!b.windows(2).any(|w| w == b"!!"), "found the bug");
        b.len() as u64
    }

    /// The engine itself finds a planted bug (two bytes in a row), saves the input and fails.
    #[test]
    fn the_engine_finds_a_planted_bug() {
        let t = Target { name: "selftest", max_len: 64, run: boom, generate: None, mutate: None, dict: &[b"!"] };
        let mut rng = Rng::new(1);
        let mut v = b"hello".to_vec();
        let mut found = false;
        for _ in 0..100_000 {
            mutate_bytes(&mut rng, &mut v, &[], t.dict, t.max_len);
            if run_one(&t, &v).is_err() {
                found = true;
                break;
            }
            if v.len() > 32 {
                v = b"hello".to_vec();
            }
        }
        assert!(found);
    }
}
