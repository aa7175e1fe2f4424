//! What the match and the action parsers share: tokens, numbers, errors with their place.

use std::fmt;

/// Why a flow string did not parse, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowError {
    /// Byte offset into the parsed string where the problem starts.
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FlowError {}

/// A parse error at byte `offset`.
pub fn err<T>(offset: usize, message: impl Into<String>) -> Result<T, FlowError> {
    Err(FlowError { offset, message: message.into() })
}

fn is_sep(b: u8) -> bool {
    matches!(b, b',' | b' ' | b'\t' | b'\r' | b'\n')
}

/// Splits `s` (which starts at byte `base` of the whole string) into separator-delimited
/// tokens, each with its offset in the whole string. A separator inside parentheses belongs
/// to its token (`ct(commit,table=1)` is one action); an unclosed parenthesis runs to the end.
pub fn tokens(s: &str, base: usize) -> impl Iterator<Item = (usize, &str)> {
    let b = s.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() && is_sep(b[i]) {
            i += 1;
        }
        if i == b.len() {
            return None;
        }
        let (start, mut depth) = (i, 0u32);
        while i < b.len() && (depth > 0 || !is_sep(b[i])) {
            match b[i] {
                b'(' => depth += 1,
                b')' => depth = depth.saturating_sub(1),
                _ => {}
            }
            i += 1;
        }
        Some((base + start, &s[start..i]))
    })
}

/// A decimal or `0x` hexadecimal number no larger than `max`.
pub fn parse_uint(v: &str, max: u64) -> Option<u64> {
    let (digits, radix) = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (v, 10),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok().filter(|&n| n <= max)
}

/// `value` or `value/mask`, each parsed by `one`; a missing mask is `all`.
pub fn masked<T>(v: &str, all: T, one: impl Fn(&str) -> Option<T>) -> Option<(T, T)> {
    match v.split_once('/') {
        Some((a, m)) => Some((one(a)?, one(m)?)),
        None => Some((one(v)?, all)),
    }
}
