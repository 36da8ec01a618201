//! The dependency rules of ARCHITECTURE.md ("Dependency rules"), checked on the sources: every
//! `crate::…` path in a module is an import of another module, and some imports must never
//! happen. A rule broken by new code fails here with the file and the import.
//!
//! `DEBT` lists the imports that still break a rule today, each with the change that removes it
//! (issue 13). An entry no longer needed fails the test too, so the list only ever shrinks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Modules that import nothing else of the crate.
const SELF_CONTAINED: &[&str] = &[
    "protocol",
    "dialect",
    "adapter",
    "lifecycle",
    "discovery",
    "paths",
    // Keys and usage in SQLite/PostgreSQL: the proxy calls in, the store knows nothing of it.
    "store",
    // Wake-on-LAN packets and MAC addresses, for the proxy and the worker alike.
    "wake",
    // Conversation → home (the proxy's workers, a worker's llama-server slots).
    "affinity",
];

/// Pairs (module, module it must never import).
const NEVER: &[(&str, &str)] = &[
    // One request to one model API knows neither side that uses it.
    ("backend", "proxy"),
    ("backend", "worker"),
    ("backend", "node"),
    ("backend", "cli"),
    ("backend", "app"),
    ("proxy", "worker"),
    ("worker", "proxy"),
    ("worker", "node"),
    ("proxy", "node"),
    // The box's sampler knows only the wire types it fills: the worker wires it to the
    // lifecycle and the pong, the proxy reads its reports.
    ("hardware", "proxy"),
    ("hardware", "worker"),
    ("hardware", "node"),
    ("hardware", "lifecycle"),
    ("tls", "proxy"),
    ("tls", "worker"),
    // Settings are data: nothing that runs.
    ("settings", "proxy"),
    ("settings", "worker"),
    ("settings", "node"),
    ("settings", "backend"),
    ("settings", "app"),
    ("settings", "cli"),
    ("settings", "store"),
    // The command line's run modes sit on top; nothing below reaches up to them.
    ("proxy", "app"),
    ("worker", "app"),
    ("tls", "app"),
    ("lan", "app"),
];

/// Crates and paths that do I/O: the pure modules may not name them.
const IO: &[&str] = &[
    "tokio::net",
    "tokio::fs",
    "tokio::process",
    "std::net",
    "std::fs",
    "std::process",
    "reqwest",
    "hyper",
    "axum::serve",
];

/// Files that must stay pure: no I/O at all.
const PURE_FILES: &[&str] = &[
    "proxy/scheduler.rs",
    "proxy/scheduler/turns.rs",
    "affinity.rs",
    "worker/slot_pins/table.rs",
    "worker/slot_pins/body.rs",
    "proxy/responses_store.rs",
];

/// Imports that break a rule today, to be removed by the change named beside each.
const DEBT: &[(&str, &str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A source file: its path under `src/`, its top-level module, its text without comments.
struct Source {
    path: String,
    module: String,
    code: String,
}

fn sources() -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let path = file
                .strip_prefix(src())
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let module = path
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            let text = std::fs::read_to_string(&file).unwrap();
            // Comments may name anything; only code counts.
            let code = text
                .lines()
                .map(|line| line.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            Source { path, module, code }
        })
        .collect()
}

/// The top-level modules a source names as `crate::MODULE`.
fn imports(source: &Source) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = source.code.as_str();
    while let Some(at) = rest.find("crate::") {
        let after = &rest[at + "crate::".len()..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && name != source.module {
            found.insert(name);
        }
        rest = after;
    }
    found
}

fn is_debt(path: &str, target: &str) -> bool {
    DEBT.iter().any(|(p, t, _)| *p == path && *t == target)
}

#[test]
fn the_dependency_rules_of_architecture_md_hold() {
    let mut broken = Vec::new();
    let mut debt_used = BTreeSet::new();
    for source in sources() {
        for target in imports(&source) {
            let rule = if SELF_CONTAINED.contains(&source.module.as_str()) {
                Some(format!(
                    "{} imports nothing else of the crate",
                    source.module
                ))
            } else if NEVER.contains(&(source.module.as_str(), target.as_str())) {
                Some(format!("{} never imports {target}", source.module))
            } else {
                None
            };
            let Some(rule) = rule else { continue };
            if is_debt(&source.path, &target) {
                debt_used.insert((source.path.clone(), target.clone()));
                continue;
            }
            broken.push(format!("{}: imports crate::{target} ({rule})", source.path));
        }
    }
    assert!(
        broken.is_empty(),
        "dependency rules broken:\n{}",
        broken.join("\n")
    );
    let stale: Vec<String> = DEBT
        .iter()
        .filter(|(p, t, _)| !debt_used.contains(&(p.to_string(), t.to_string())))
        .map(|(p, t, why)| format!("{p} -> {t} ({why})"))
        .collect();
    assert!(
        stale.is_empty(),
        "these DEBT entries are paid: remove them from tests/architecture.rs:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_pure_modules_do_no_io() {
    let mut broken = Vec::new();
    for source in sources() {
        let pure = source.module == "adapter"
            || source.module == "protocol"
            || source.module == "dialect"
            || PURE_FILES.contains(&source.path.as_str());
        // Their tests may read fixture files.
        let test_code = source.path.contains("/tests/") || source.path.ends_with("tests.rs");
        if !pure || test_code {
            continue;
        }
        for io in IO {
            if source.code.contains(io) {
                broken.push(format!("{}: names {io}", source.path));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "I/O in a pure module:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_checker_sees_imports_and_ignores_comments() {
    let source = Source {
        path: "proxy/x.rs".into(),
        module: "proxy".into(),
        code:
            "use crate::worker::forward;\nlet a = crate::dialect::Dialect::OpenAi; crate::proxy::x"
                .into(),
    };
    let found: Vec<String> = imports(&source).into_iter().collect();
    assert_eq!(found, ["dialect", "worker"]);
    assert!(sources()
        .iter()
        .any(|s| s.path == "proxy/upstream.rs" && imports(s).contains("backend")));
}
