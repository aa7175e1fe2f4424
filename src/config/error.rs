//! Positioned errors: `ConfigError`, and `Ctx`, the text being read, which turns a toml span
//! into file, line and column. Every section validator takes a `Ctx`.

use std::ops::Range;

use toml::Spanned;

/// A config error with its position, printed as `file:line:col: message` plus the line.
#[derive(Debug, Clone)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
    pub snippet: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.message)?;
        if !self.snippet.is_empty() {
            write!(f, "\n  | {}\n  | {}^", self.snippet, " ".repeat(self.col.saturating_sub(1)))?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// The position context: the text being read and the name errors give it (a file's path, or
/// what a control request's text is called).
pub(super) struct Ctx<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Ctx<'_> {
    /// An error at the start of `span` (None: the start of the text).
    pub fn err(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let off = span.map(|s| s.start).unwrap_or(0).min(self.text.len());
        let before = &self.text[..off];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let col = self.text[line_start..off].chars().count() + 1;
        let snippet = self.text[line_start..].lines().next().unwrap_or("").to_string();
        ConfigError { file: self.file.to_string(), line, col, message: message.into(), snippet }
    }

    /// A table's `name` (a mirror's, a security group's, a VRF's): 1-64 characters of
    /// A-Z a-z 0-9 - _ ., and none that `taken` already says is a `kind`'s.
    pub fn name(
        &self,
        name: &Spanned<String>,
        kind: &str,
        taken: impl Fn(&str) -> bool,
    ) -> Result<String, ConfigError> {
        let n = name.get_ref();
        if n.is_empty() || n.len() > 64 || !n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(self.err(Some(name.span()), "name: expected 1-64 characters of A-Z a-z 0-9 - _ ."));
        }
        if taken(n) {
            return Err(self.err(Some(name.span()), format!("duplicate {kind} \"{n}\"")));
        }
        Ok(n.clone())
    }

    /// A number key from `lo` to `hi` inclusive, `dflt` when absent.
    pub fn range(&self, v: &Option<Spanned<u32>>, name: &str, lo: u32, hi: u32, dflt: u32) -> Result<u32, ConfigError> {
        match v {
            None => Ok(dflt),
            Some(s) if (lo..=hi).contains(s.get_ref()) => Ok(*s.get_ref()),
            Some(s) => Err(self.err(Some(s.span()), format!("{name}: expected a value from {lo} to {hi}"))),
        }
    }
}
