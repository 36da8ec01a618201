//! Tests of the adapter as a whole: golden conversions, recorded streams, round trips, and bad
//! input. Fixtures live in `relay-core/tests/fixtures/adapter/`; run with `ADAPTER_BLESS=1` to
//! rewrite the expected files after an intended change (then review the diff).

mod billing;
mod errors;
mod golden;
mod history;
mod roundtrip;
mod streams;
mod upstream_anthropic;

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{ClientApi, Identity, StreamTranslator};

/// The fixture directory `sub`.
fn fixtures(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/adapter")
        .join(sub)
}

/// Whether expected files are to be rewritten instead of compared.
fn bless() -> bool {
    std::env::var_os("ADAPTER_BLESS").is_some()
}

/// Fixed client-facing ids, so expected outputs are stable.
fn identity() -> Identity {
    Identity {
        id: "test".into(),
        created: 1_760_000_000,
    }
}

/// The files in `dir` whose names end with `suffix`, sorted, as (stem, path).
fn files(dir: &Path, suffix: &str) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("dir entry").path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_string();
            let stem = name.strip_suffix(suffix)?.to_string();
            Some((stem, path))
        })
        .collect();
    found.sort();
    found
}

/// `text` cut before every character.
fn by_char(text: &str) -> Vec<&str> {
    let mut cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    cuts.push(text.len());
    cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

/// An SSE event as a client sees it: its `event:` name and its data (JSON where it parses).
type Event = (Option<String>, Value);

/// The events of a client's SSE text.
fn events(text: &str) -> Vec<Event> {
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data.push(d);
            } else if !line.starts_with(':') {
                panic!("unexpected SSE line {line:?} in {text}");
            }
        }
        if data.is_empty() && name.is_none() {
            continue; // a comment-only block (keep-alive): clients skip it
        }
        let data = data.join("\n");
        let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
        out.push((name, value));
    }
    out
}

/// The client's SSE text from `translator` fed `pieces` of backend text, then finished.
fn translate_pieces<'a>(
    mut translator: StreamTranslator,
    pieces: impl IntoIterator<Item = &'a str>,
) -> String {
    let mut out = String::new();
    for piece in pieces {
        out.push_str(&translator.push(piece));
    }
    out.push_str(&translator.finish());
    assert_eq!(translator.finish(), "", "finish is idempotent");
    out
}

/// Runs every recorded backend stream of fixture directory `sub` (`<name>.sse`, at least `least`
/// of them) through `translate` for each of `apis`, fed whole and one character at a time: both
/// must give the same events, pass `check`, and match the expected `<name>.<api>.sse` (which is
/// rewritten instead when blessing).
fn check_recorded_streams(
    sub: &str,
    least: usize,
    apis: &[(ClientApi, &str)],
    translate: impl Fn(ClientApi, &[&str]) -> String,
    check: impl Fn(ClientApi, &[Event], &str),
) {
    let dir = fixtures(sub);
    let inputs: Vec<_> = files(&dir, ".sse")
        .into_iter()
        .filter(|(stem, _)| !stem.contains('.'))
        .collect();
    assert!(inputs.len() >= least, "transcripts missing");
    let mut failures = Vec::new();
    for (name, path) in inputs {
        let input = std::fs::read_to_string(&path).expect("transcript");
        for &(api, api_name) in apis {
            let case = format!("{name}/{api_name}");
            let whole = translate(api, &[input.as_str()]);
            let piecewise = translate(api, &by_char(&input));
            assert_eq!(
                events(&whole),
                events(&piecewise),
                "{case}: the result depends on how the backend's text was cut"
            );
            check(api, &events(&whole), &case);
            let expected_path = dir.join(format!("{name}.{api_name}.sse"));
            if bless() {
                std::fs::write(&expected_path, &whole).expect("write");
                continue;
            }
            let expected = std::fs::read_to_string(&expected_path)
                .unwrap_or_else(|_| panic!("missing {}", expected_path.display()));
            if events(&expected) != events(&whole) {
                failures.push(format!("{case}:\nexpected:\n{expected}\nactual:\n{whole}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
