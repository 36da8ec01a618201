//! Names on the wire: worker and request ids, and the worker and model names a worker may
//! announce (bounded, without control characters, deduplicated, with the warnings it gets).

use super::*;

/// The wire form of a worker id.
pub fn worker_wire_id(id: WorkerId) -> String {
    format!("w-{id}")
}

/// The wire form of a request id.
pub fn request_wire_id(id: RequestId) -> String {
    format!("r-{id}")
}

/// Parses a wire request id back; `None` for anything we did not issue.
pub fn parse_request_wire_id(wire: &str) -> Option<RequestId> {
    wire.strip_prefix("r-")?.parse().ok()
}

/// Parses a worker wire id (`w-N`).
pub fn parse_worker_wire_id(wire: &str) -> Option<WorkerId> {
    wire.strip_prefix("w-")?.parse().ok()
}

/// The longest worker or model name accepted, in bytes. Names travel in every frame, log line
/// and dashboard row: a worker must not be able to make them megabytes long.
pub const MAX_NAME_BYTES: usize = 256;

/// Duplicate names quoted in a warning at most; the rest are counted.
pub(super) const QUOTED_DUPLICATES: usize = 8;

/// Why a worker or model name cannot be used, if it cannot (such a model is never routed).
pub fn unusable_name(name: &str) -> Option<&'static str> {
    if name.len() > MAX_NAME_BYTES {
        Some("longer than 256 bytes")
    } else if name.chars().any(char::is_control) {
        Some("with control characters")
    } else {
        None
    }
}

/// The windows of `models` that `reported` names.
pub(super) fn windows_of(
    models: &[Arc<str>],
    reported: Option<&crate::protocol::ContextWindows>,
) -> HashMap<Arc<str>, u32> {
    let Some(reported) = reported else {
        return HashMap::new();
    };
    models
        .iter()
        .filter_map(|model| Some((model.clone(), *reported.get(model.as_ref())?)))
        .collect()
}

/// The contract's registration sanitization: trim whitespace, drop empty names, drop exact
/// duplicates keeping the first, cap the list at `limit`; each change is reported as a warning.
/// Beyond the contract, names longer than [`MAX_NAME_BYTES`] or with control characters are
/// dropped, and the warnings stay a handful of lines however many names were dropped.
pub fn sanitize_models(models: &[String], limit: usize) -> (Vec<String>, Vec<String>) {
    let mut accepted: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    let mut warnings = Vec::new();
    let mut empty = 0;
    let mut unusable: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut duplicates = 0;
    for raw in models {
        let name = raw.trim();
        if name.is_empty() {
            empty += 1;
            continue;
        }
        if let Some(why) = unusable_name(name) {
            *unusable.entry(why).or_default() += 1;
            continue;
        }
        if !seen.insert(name) {
            duplicates += 1;
            if duplicates <= QUOTED_DUPLICATES {
                warnings.push(format!("duplicate model \"{name}\" dropped"));
            }
            continue;
        }
        accepted.push(name.to_string());
    }
    if duplicates > QUOTED_DUPLICATES {
        warnings.push(format!(
            "{} more duplicate model name(s) dropped",
            duplicates - QUOTED_DUPLICATES
        ));
    }
    if empty > 0 {
        warnings.push(format!("{empty} empty model name(s) dropped"));
    }
    for (why, count) in unusable {
        warnings.push(format!("{count} model name(s) {why} dropped"));
    }
    if accepted.len() > limit {
        let dropped = accepted.len() - limit;
        accepted.truncate(limit);
        warnings.push(format!(
            "model list truncated to {limit} entries; {dropped} model(s) dropped"
        ));
    }
    (accepted, warnings)
}

/// A worker's name as shown and logged: trimmed, control characters replaced, cut to
/// [`MAX_NAME_BYTES`] (at a character boundary); `worker` when nothing is left.
pub(super) fn worker_display_name(raw: &str, warnings: &mut Vec<String>) -> String {
    let trimmed = raw.trim();
    let mut name: String = trimmed
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if name.len() > MAX_NAME_BYTES {
        let mut end = MAX_NAME_BYTES;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        warnings.push(format!(
            "worker name cut to {MAX_NAME_BYTES} bytes ({} given)",
            trimmed.len()
        ));
    }
    if name.is_empty() {
        warnings.push("worker name is blank; shown as \"worker\"".to_string());
        "worker".to_string()
    } else {
        name
    }
}
