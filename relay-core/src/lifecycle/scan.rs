//! `modelrelay models scan DIR`: finds `.gguf` model files and prints model-map entries to paste
//! into the config file.
//!
//! Skipped: multimodal projectors (`mmproj-*`, or architecture `clip`) and the second and later
//! shards of a split model (`-00002-of-00003.gguf`): llama-server is given the first shard.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::gguf::{self, GgufInfo};

/// Directories deeper than this below DIR are not visited.
const MAX_DEPTH: usize = 16;
/// The proposed `ctx_size` at most: a model's trained context (often 128k or more) would need
/// far more KV-cache memory than a home GPU has.
pub const PROPOSED_CTX_CAP: u64 = 32768;

/// A model file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundModel {
    /// The proposed model name (the file name without `.gguf` and shard suffix).
    pub name: String,
    /// The file (the first shard of a split model).
    pub path: PathBuf,
    /// The number of shards of a split model.
    pub shards: Option<u32>,
    /// Its size in bytes (of this file only, for a split model).
    pub size_bytes: u64,
    /// The header, or why it could not be read.
    pub info: Result<GgufInfo, String>,
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// DIR could not be read.
    #[error("cannot read directory {}: {source}", path.display())]
    Read {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a file name says: skip it, or the model name and shard count.
fn classify(file_name: &str) -> Option<(String, Option<u32>)> {
    let lower = file_name.to_ascii_lowercase();
    let stem_len = file_name.len().checked_sub(".gguf".len())?;
    if !lower.ends_with(".gguf") || lower.contains("mmproj") {
        return None;
    }
    let stem = &file_name[..stem_len];
    // "name-00001-of-00003": 6 + 3 + 6 characters of suffix.
    let split_at = stem
        .len()
        .checked_sub(15)
        .filter(|&at| stem.is_char_boundary(at));
    if let Some(prefix_len) = split_at.filter(|&at| stem[at..].is_ascii()) {
        let (prefix, suffix) = stem.split_at(prefix_len);
        let bytes = suffix.as_bytes();
        let digits = |range: std::ops::Range<usize>| {
            bytes[range.clone()]
                .iter()
                .all(u8::is_ascii_digit)
                .then(|| suffix[range].parse::<u32>().ok())
                .flatten()
        };
        if bytes[0] == b'-' && &suffix[6..10] == "-of-" {
            if let (Some(index), Some(total)) = (digits(1..6), digits(10..15)) {
                return (index == 1 && !prefix.is_empty())
                    .then(|| (prefix.to_string(), Some(total)));
            }
        }
    }
    (!stem.is_empty()).then(|| (stem.to_string(), None))
}

/// Finds the model files under `dir`, sorted by path, with unique names.
pub fn scan(dir: &Path) -> Result<Vec<FoundModel>, ScanError> {
    let mut files = Vec::new();
    std::fs::read_dir(dir).map_err(|source| ScanError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    walk(dir, 0, &mut files);
    files.sort();
    let mut taken = BTreeSet::new();
    let mut found = Vec::new();
    for path in files {
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some((base, shards)) = classify(file_name) else {
            continue;
        };
        let info = gguf::read_info(&path);
        if info
            .as_ref()
            .is_ok_and(|i| i.architecture.as_deref() == Some("clip"))
        {
            continue; // a projector with an unusual name
        }
        // The same file name in two directories: the second gets a suffix.
        let mut name = base.clone();
        let mut n = 2;
        while !taken.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        found.push(FoundModel {
            name,
            size_bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
            path,
            shards,
            info,
        });
    }
    Ok(found)
}

/// Collects files below `dir`. Symlinked directories are not followed (no cycles); symlinked
/// files are (model caches link to their blobs). Unreadable subdirectories are reported and
/// skipped.
fn walk(dir: &Path, depth: usize, files: &mut Vec<PathBuf>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            eprintln!("skipping {}: {error}", dir.display());
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if depth < MAX_DEPTH {
                walk(&path, depth + 1, files);
            }
        } else if path.is_file() {
            files.push(path);
        }
    }
}

/// A TOML string literal (quoted and escaped).
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// The proposed config text for `found`.
pub fn render(dir: &Path, found: &[FoundModel]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Model-map entries proposed by `modelrelay models scan {}` ({} found).",
        dir.display(),
        found.len()
    );
    out.push_str(
        "# Paste them into the config file (--config, or ~/.config/modelrelay/config.toml) and\n\
         # check llama_server (the binary), ctx_size and args (e.g. \"-ngl\", \"999\") for your GPU.\n",
    );
    for model in found {
        out.push('\n');
        let _ = writeln!(out, "[worker.model_map.{}]", toml_string(&model.name));
        let _ = writeln!(out, "llama_server = \"llama-server\"");
        let _ = writeln!(
            out,
            "model_file = {}",
            toml_string(&model.path.display().to_string())
        );
        let size = model.size_bytes as f64;
        let mut notes = vec![if size >= 1e9 {
            format!("{:.1} GB", size / 1e9)
        } else {
            format!("{:.0} MB", size / 1e6)
        }];
        if let Some(shards) = model.shards {
            notes.push(format!("first of {shards} shards"));
        }
        match &model.info {
            Ok(info) => {
                if let Some(arch) = &info.architecture {
                    notes.push(format!("architecture {arch}"));
                }
                if let Some(name) = &info.name {
                    notes.push(format!("\"{name}\""));
                }
                match info.context_length {
                    Some(ctx) if ctx > PROPOSED_CTX_CAP => {
                        let _ = writeln!(
                            out,
                            "ctx_size = {PROPOSED_CTX_CAP}  # trained context {ctx}; raise it if memory allows"
                        );
                    }
                    Some(ctx) => {
                        let _ = writeln!(out, "ctx_size = {ctx}  # the trained context");
                    }
                    None => notes.push("context length not in the header".to_string()),
                }
            }
            Err(error) => notes.push(format!("header unreadable: {error}")),
        }
        let _ = writeln!(out, "# {}", notes.join("; "));
    }
    out
}

/// Runs the command: prints the proposal to stdout.
pub fn run(dir: &Path) -> Result<(), ScanError> {
    let found = scan(dir)?;
    if found.is_empty() {
        println!(
            "# No .gguf model files found under {} (projectors and extra shards are skipped).",
            dir.display()
        );
        return Ok(());
    }
    print!("{}", render(dir, &found));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::config::{LifecycleConfig, LifecycleSection};
    use super::super::gguf::testing::{gguf, Value};
    use super::*;

    #[test]
    fn file_names_are_classified() {
        assert_eq!(
            classify("Qwen-7B.Q4_K_M.gguf"),
            Some(("Qwen-7B.Q4_K_M".into(), None))
        );
        assert_eq!(
            classify("Big-00001-of-00003.gguf"),
            Some(("Big".into(), Some(3)))
        );
        assert_eq!(classify("Big-00002-of-00003.gguf"), None);
        assert_eq!(classify("mmproj-model-f16.gguf"), None);
        assert_eq!(classify("model-MMPROJ.GGUF"), None);
        assert_eq!(classify("notes.txt"), None);
        assert_eq!(classify(".gguf"), None);
        assert_eq!(classify("x.GGUF"), Some(("x".into(), None)));
    }

    #[test]
    fn a_scan_proposes_entries_that_parse_as_a_model_map() {
        let dir = std::env::temp_dir().join(format!("relay-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        let header = |arch: &str, ctx: u32| {
            gguf(
                3,
                &[
                    ("general.architecture", Value::Str(arch)),
                    (&format!("{arch}.context_length"), Value::U32(ctx)),
                ],
            )
        };
        std::fs::write(dir.join("small.gguf"), header("llama", 4096)).unwrap();
        std::fs::write(dir.join("sub/huge \"q\".gguf"), header("qwen3", 262144)).unwrap();
        std::fs::write(dir.join("sub/deeper/small.gguf"), header("llama", 2048)).unwrap();
        std::fs::write(
            dir.join("sub/split-00001-of-00002.gguf"),
            header("llama", 8192),
        )
        .unwrap();
        std::fs::write(dir.join("sub/split-00002-of-00002.gguf"), b"GGUF").unwrap();
        std::fs::write(dir.join("mmproj-small-f16.gguf"), header("clip", 0)).unwrap();
        std::fs::write(dir.join("sub/vision-proj.gguf"), header("clip", 0)).unwrap();
        std::fs::write(dir.join("broken.gguf"), b"not a model").unwrap();
        std::fs::write(dir.join("readme.md"), b"hi").unwrap();

        let found = scan(&dir).unwrap();
        let names: Vec<&str> = found.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["broken", "small", "small-2", "huge \"q\"", "split"]);
        assert_eq!(found[4].shards, Some(2));
        let text = render(&dir, &found);
        assert!(
            text.contains("ctx_size = 32768  # trained context 262144"),
            "{text}"
        );
        assert!(text.contains("ctx_size = 4096"), "{text}");
        assert!(text.contains("header unreadable"), "{text}");
        let section = LifecycleSection::from_config_text(&text).unwrap();
        let config = LifecycleConfig::resolve(&section).unwrap();
        assert_eq!(config.models.len(), 5);
        assert_eq!(config.models["small-2"].ctx_size, Some(2048));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(scan(&dir).is_err(), "a missing directory is an error");
    }
}
