//! The top-level `flows` array: each entry one flow in ovs-ofctl syntax, parsed here so that an
//! error points into the string, and its port names checked against the file's ports.

use toml::Spanned;

use super::error::{ConfigError, Ctx};
use super::port::PortConfig;

/// One entry of the top-level `flows` array: the text and where it starts in the file.
#[derive(Debug, Clone)]
pub struct FlowSource {
    pub text: String,
    /// Byte offset of the text's first character in the file (inside the quotes).
    pub offset: usize,
}

/// Every flow, each parsed against `ports`' names (a port's id is its index). A flow may not
/// name a port of `reserved` (its name, and why): a VTEP's underlay (its frames are the
/// VTEP's, and a tunnel port stands for each remote), a mirror's output.
pub(super) fn validate(
    raw: Vec<Spanned<String>>,
    ports: &[PortConfig],
    reserved: &[(&str, String)],
    cx: &Ctx,
) -> Result<Vec<FlowSource>, ConfigError> {
    // The first reserved port the flow names, and the address of the name: the parser hands
    // out slices of the flow's text, so that address less the text's is the name's column.
    let named = std::cell::Cell::new(None);
    let id = |name: &str| {
        if let Some(i) = reserved.iter().position(|r| r.0 == name)
            && named.get().is_none()
        {
            named.set(Some((i, name.as_ptr() as usize)));
        }
        ports.iter().position(|p| p.name == name).map(|i| i as u16)
    };
    let mut flows = Vec::new();
    for f in raw {
        // The span covers the quotes (one, or three for a multi-line string).
        let span = f.span();
        let rest = &cx.text[span.start..];
        let quote = if rest.starts_with("\"\"\"") || rest.starts_with("'''") { 3 } else { 1 };
        let offset = span.start + quote;
        let text = f.into_inner();
        if let Err(e) = crate::flow::parse_flow(&text, &id) {
            return Err(cx.err(Some(offset + e.offset..offset + e.offset), format!("flow: {}", e.message)));
        }
        if let Some((i, addr)) = named.take() {
            let at = offset + addr.checked_sub(text.as_ptr() as usize).filter(|&d| d < text.len()).unwrap_or(0);
            let (port, why) = &reserved[i];
            return Err(cx.err(Some(at..at), format!("flow: port \"{port}\" is {why}")));
        }
        flows.push(FlowSource { text, offset });
    }
    Ok(flows)
}
