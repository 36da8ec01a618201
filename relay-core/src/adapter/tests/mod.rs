//! Tests of the adapter as a whole: golden conversions, recorded streams, round trips, and bad
//! input. Fixtures live in `relay-core/tests/fixtures/adapter/`; run with `ADAPTER_BLESS=1` to
//! rewrite the expected files after an intended change (then review the diff).

mod errors;
mod golden;
mod history;
mod roundtrip;
mod streams;
mod upstream_anthropic;

use std::path::{Path, PathBuf};

use super::Identity;

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
