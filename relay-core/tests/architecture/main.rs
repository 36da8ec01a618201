//! The dependency rules of ARCHITECTURE.md ("Dependency rules"), checked on the sources as the
//! compiler reads them (`model.rs`): every path the code names, resolved to its module; a rule
//! broken by new code fails here with the file, the module and the path. The rules listed here
//! and in ARCHITECTURE.md are the same list; every module and file a rule names exists; the
//! module graphs have no cycles; and each kind of rule is shown to fail on a planted violation,
//! so a rule cannot pass by seeing nothing.
//!
//! `DEBT` lists what still breaks a rule today, each with the change that removes it; an entry
//! no longer needed fails the test too, so the list only ever shrinks.

mod model;
mod rules;

use std::path::{Path, PathBuf};

use model::{names_exist, CrateModel};
use rules::{check, cycles, Rule, Violation, ACYCLIC};

/// The rules, in the order ARCHITECTURE.md lists them.
const RULES: &[Rule] = &[
    // Wire types, request paths, dialects, translations and pure policy know nothing else of
    // the crate (the dialect and the translations know what endpoint a path is).
    Rule::SelfContained("protocol"),
    Rule::SelfContained("endpoint"),
    Rule::SelfContainedBut("dialect", "endpoint"),
    Rule::SelfContainedBut("adapter", "endpoint"),
    Rule::SelfContained("lifecycle"),
    Rule::SelfContained("discovery"),
    Rule::SelfContained("paths"),
    // Keys and usage in SQLite/PostgreSQL: the proxy calls in, the store knows nothing of it.
    Rule::SelfContained("store"),
    // Wake-on-LAN packets and MAC addresses, for the proxy and the worker alike.
    Rule::SelfContained("wake"),
    // Conversation → home (the proxy's workers, a worker's llama-server slots).
    Rule::SelfContained("affinity"),
    // A certificate's fingerprint is data: settings hold it, TLS computes and checks it.
    Rule::SelfContained("fingerprint"),
    // Binding the listen address, for the node and the command line alike.
    Rule::SelfContained("listen"),
    // One request to one model API knows neither side that uses it.
    Rule::Never("backend", "proxy"),
    Rule::Never("backend", "worker"),
    Rule::Never("backend", "node"),
    Rule::Never("backend", "cli"),
    Rule::Never("backend", "app"),
    Rule::Never("proxy", "worker"),
    Rule::Never("worker", "proxy"),
    Rule::Never("worker", "node"),
    Rule::Never("proxy", "node"),
    // The box's sampler knows only the wire types it fills.
    Rule::Never("hardware", "proxy"),
    Rule::Never("hardware", "worker"),
    Rule::Never("hardware", "node"),
    Rule::Never("hardware", "lifecycle"),
    Rule::Never("tls", "proxy"),
    Rule::Never("tls", "worker"),
    // Settings are data: nothing that runs.
    Rule::Never("settings", "proxy"),
    Rule::Never("settings", "worker"),
    Rule::Never("settings", "node"),
    Rule::Never("settings", "backend"),
    Rule::Never("settings", "app"),
    Rule::Never("settings", "cli"),
    Rule::Never("settings", "store"),
    Rule::Never("settings", "tls"),
    // The command line's run modes sit on top; nothing below reaches up to them.
    Rule::Never("proxy", "app"),
    Rule::Never("worker", "app"),
    Rule::Never("tls", "app"),
    Rule::Never("lan", "app"),
    Rule::Never("node", "app"),
    Rule::Never("node", "cli"),
    Rule::Never("open_dashboard", "app"),
    // Pure code: what it does follows from its arguments.
    Rule::Pure("adapter"),
    Rule::Pure("protocol"),
    Rule::Pure("endpoint"),
    Rule::Pure("dialect"),
    Rule::Pure("affinity"),
    Rule::Pure("fingerprint"),
    Rule::Pure("proxy::dispatch::scheduler"),
    Rule::Pure("proxy/dispatch/sleepers.rs"),
    Rule::Pure("proxy/serving/responses_store.rs"),
    Rule::Pure("worker/slot_pins/table.rs"),
    Rule::Pure("worker/slot_pins/body.rs"),
    // The proxy's folders follow a request: the edge, access, serving, dispatch; observation
    // watches. Dispatch knows no HTTP framework and nothing above it; the client API reaches it
    // only through the hub.
    Rule::NoWebFramework("proxy::dispatch"),
    Rule::Never("proxy::dispatch", "proxy::serving"),
    Rule::Never("proxy::dispatch", "proxy::edge"),
    Rule::Never("proxy::dispatch", "proxy::access"),
    Rule::Never("proxy::dispatch", "proxy::observation"),
    Rule::OnlyThrough("proxy::serving", "proxy::dispatch", "proxy::dispatch::hub"),
    Rule::Never("proxy::access", "proxy::serving"),
    Rule::Never("proxy::access", "proxy::observation"),
    Rule::Never("proxy::edge", "proxy::access"),
    Rule::Never("proxy::edge", "proxy::dispatch"),
    Rule::Never("proxy::edge", "proxy::serving"),
    Rule::Never("proxy::edge", "proxy::observation"),
];

/// What breaks a rule today: (the start of the violation's place, or the members of a cycle
/// joined by " ⇄ "; what removes it).
const DEBT: &[(&str, &str)] = &[];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The crate's model, read once for every test here.
fn crate_model() -> CrateModel {
    static MODEL: std::sync::OnceLock<CrateModel> = std::sync::OnceLock::new();
    MODEL.get_or_init(|| CrateModel::read(&src())).clone()
}

fn is_debt(violation: &Violation) -> Option<&'static str> {
    DEBT.iter()
        .find(|(place, _)| violation.at.starts_with(place))
        .map(|(place, _)| *place)
}

#[test]
fn the_dependency_rules_of_architecture_md_hold() {
    let model = crate_model();
    assert!(
        model.modules.len() > 100 && model.references.len() > 5_000,
        "the model saw the crate: {} modules, {} paths",
        model.modules.len(),
        model.references.len()
    );
    let violations = check(&model, RULES);
    let broken: Vec<String> = violations
        .iter()
        .filter(|v| is_debt(v).is_none())
        .map(|v| format!("{}\n    rule: {}", v.at, v.rule))
        .collect();
    assert!(
        broken.is_empty(),
        "dependency rules broken:\n{}",
        broken.join("\n")
    );
    let paid: Vec<String> = DEBT
        .iter()
        .filter(|(place, _)| !violations.iter().any(|v| v.at.starts_with(place)))
        .map(|(place, why)| format!("{place}: {why}"))
        .collect();
    assert!(
        paid.is_empty(),
        "these DEBT entries are paid: remove them from tests/architecture/main.rs:\n{}",
        paid.join("\n")
    );
}

#[test]
fn the_module_graphs_have_no_cycles() {
    let model = crate_model();
    let found: Vec<String> = cycles(&model)
        .into_iter()
        .map(|members| members.join(" ⇄ "))
        .filter(|cycle| !DEBT.iter().any(|(place, _)| cycle.starts_with(place)))
        .collect();
    let graphs = rules::graphs(&model);
    let edges: usize = graphs
        .values()
        .flat_map(|graph| graph.values())
        .map(|targets| targets.len())
        .sum();
    eprintln!(
        "cycle check: {} module graphs, {edges} import edges, {} cycles",
        graphs.len(),
        found.len()
    );
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn every_module_and_file_a_rule_names_exists() {
    let model = crate_model();
    let missing: Vec<String> = RULES
        .iter()
        .flat_map(|rule| rule.names().into_iter().map(move |name| (rule, name)))
        .filter(|(_, name)| !names_exist(&model, name))
        .map(|(rule, name)| format!("{name} (in: {})", rule.sentence()))
        .collect();
    assert!(
        missing.is_empty(),
        "rules name what does not exist (renamed? update the rule):\n{}",
        missing.join("\n")
    );
}

/// The rule sentences in ARCHITECTURE.md's "Dependency rules" section: its `- ` bullets that
/// start with a backtick, or state the cycle rule.
fn documented_rules() -> Vec<String> {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ARCHITECTURE.md"))
            .expect("ARCHITECTURE.md");
    let section = text
        .split("\n## Dependency rules")
        .nth(1)
        .expect("a \"Dependency rules\" section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    // A bullet may wrap: join its lines.
    let mut bullets: Vec<String> = Vec::new();
    for line in section.lines() {
        if let Some(start) = line.strip_prefix("- ") {
            bullets.push(start.trim().to_string());
        } else if line.starts_with("  ") && !line.trim().is_empty() {
            if let Some(last) = bullets.last_mut() {
                last.push(' ');
                last.push_str(line.trim());
            }
        } else {
            bullets.push(String::new());
        }
    }
    bullets
        .into_iter()
        .filter(|b| b.starts_with('`') || b.starts_with("no two modules"))
        .map(|b| b.trim_end_matches('.').to_string())
        .collect()
}

#[test]
fn the_rules_here_are_the_rules_in_architecture_md() {
    let documented = documented_rules();
    let mut checked: Vec<String> = RULES.iter().map(Rule::sentence).collect();
    checked.push(ACYCLIC.to_string());
    let missing_in_doc: Vec<&String> = checked.iter().filter(|r| !documented.contains(r)).collect();
    let missing_in_test: Vec<&String> =
        documented.iter().filter(|r| !checked.contains(r)).collect();
    assert!(
        missing_in_doc.is_empty() && missing_in_test.is_empty(),
        "checked here, not listed in ARCHITECTURE.md:\n{}\nlisted there, not checked here:\n{}",
        missing_in_doc
            .iter()
            .map(|r| format!("- {r}."))
            .collect::<Vec<_>>()
            .join("\n"),
        missing_in_test
            .iter()
            .map(|r| format!("- {r}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

/// The violations a planted file adds to the real crate.
fn planted(file: &str, module: &str, code: &str) -> Vec<Violation> {
    let mut model = crate_model();
    let before = check(&model, RULES);
    model.add_file(file, module, false, code);
    check(&model, RULES)
        .into_iter()
        .filter(|v| !before.contains(v))
        .collect()
}

fn assert_breaks(violations: &[Violation], rule: &Rule, naming: &str) {
    let sentence = rule.sentence();
    assert!(
        violations
            .iter()
            .any(|v| v.rule == sentence && v.at.contains(naming)),
        "expected a violation of \"{sentence}\" naming {naming}, got {violations:#?}"
    );
}

#[test]
fn each_rule_fails_on_a_planted_violation() {
    let never = Rule::Never("backend", "proxy");
    // A grouped import.
    let found = planted(
        "backend/planted.rs",
        "backend::planted",
        "use crate::{dialect::Dialect, proxy::dispatch::hub::Hub};",
    );
    assert_breaks(&found, &never, "crate::proxy::dispatch::hub::Hub");
    // `super::super::` up to the crate root.
    let found = planted(
        "backend/planted.rs",
        "backend::planted",
        "fn f() -> super::super::proxy::dispatch::hub::Hub { todo!() }",
    );
    assert_breaks(&found, &never, "crate::proxy::dispatch::hub::Hub");
    // A path in code after a URL literal on the same line, and one inside a macro.
    let found = planted(
        "backend/planted.rs",
        "backend::planted",
        r#"fn f() { let _u = "http://example.org/x"; let _h = crate::proxy::dispatch::hub::Hub::new; }
           fn g() { tracing::info!("{}", crate::proxy::serving::aliases::ModelAliases::default()); }"#,
    );
    assert_breaks(&found, &never, "crate::proxy::dispatch::hub::Hub::new");
    assert_breaks(
        &found,
        &never,
        "crate::proxy::serving::aliases::ModelAliases::default",
    );
    // A renamed import used later.
    let found = planted(
        "backend/planted.rs",
        "backend::planted",
        "use crate::proxy as p; fn f() -> p::hub::Hub { todo!() }",
    );
    assert_breaks(&found, &never, "crate::proxy");

    let contained = Rule::SelfContained("protocol");
    let found = planted(
        "protocol/planted.rs",
        "protocol::planted",
        "use crate::worker::WorkerConfig;",
    );
    assert_breaks(&found, &contained, "crate::worker::WorkerConfig");

    // Pure files: a task, a timer through a renamed import, a clock, the environment, a file.
    let pure = Rule::Pure("proxy::dispatch::scheduler");
    for (code, naming) in [
        ("fn f() { tokio::spawn(async {}); }", "tokio::spawn"),
        (
            "use tokio::time::sleep as nap; async fn f() { nap(std::time::Duration::ZERO).await }",
            "tokio::time::sleep",
        ),
        (
            "use std::time::Instant; fn f() -> Instant { Instant::now() }",
            "std::time::Instant::now",
        ),
        (
            "fn f() -> bool { std::env::var(\"X\").is_ok() }",
            "std::env::var",
        ),
        (
            "use std::fs; fn f() { let _ = fs::read(\"x\"); }",
            "std::fs::read",
        ),
    ] {
        let found = planted(
            "proxy/dispatch/scheduler.rs",
            "proxy::dispatch::scheduler::planted",
            code,
        );
        assert_breaks(&found, &pure, naming);
    }

    let web = Rule::NoWebFramework("proxy::dispatch");
    let found = planted(
        "proxy/dispatch/planted.rs",
        "proxy::dispatch::planted",
        "use axum::{extract::State, routing::get};",
    );
    assert_breaks(&found, &web, "axum::routing::get");
    assert_breaks(&found, &web, "axum::extract::State");

    // The client API past the hub.
    let through = Rule::OnlyThrough("proxy::serving", "proxy::dispatch", "proxy::dispatch::hub");
    let found = planted(
        "proxy/serving/planted.rs",
        "proxy::serving::planted",
        "use crate::proxy::dispatch::scheduler::Scheduler; use crate::proxy::dispatch::hub::Hub;",
    );
    assert_breaks(
        &found,
        &through,
        "crate::proxy::dispatch::scheduler::Scheduler",
    );
    assert!(
        !found.iter().any(|v| v.at.contains("hub::Hub")),
        "{found:#?}"
    );

    // Test code may cross any line.
    let found = planted(
        "backend/planted.rs",
        "backend::planted",
        "#[cfg(test)] mod tests { use crate::proxy::dispatch::hub::Hub; }",
    );
    assert!(found.is_empty(), "{found:#?}");

    // A cycle.
    let mut model = crate_model();
    model.add_file(
        "planted_a.rs",
        "planted_a",
        false,
        "use crate::planted_b::B; pub struct A;",
    );
    model.add_file(
        "planted_b.rs",
        "planted_b",
        false,
        "use crate::planted_a::A; pub struct B;",
    );
    assert!(
        check(&model, RULES)
            .iter()
            .any(|v| v.rule == ACYCLIC && v.at == "planted_a ⇄ planted_b"),
        "the planted cycle is found"
    );

    // A rule naming a file that is not there.
    let model = crate_model();
    assert!(!names_exist(&model, "proxy/scheduler.rs"));
    assert!(names_exist(&model, "proxy/dispatch/sleepers.rs"));
    assert!(names_exist(&model, "proxy::dispatch::scheduler::turns"));
}

/// The most lines of code (a file's inline tests aside) a source file may have.
const MAX_LINES: usize = 800;

/// The most files directly in `proxy/`: its `mod.rs` and what ties the folders together.
const MAX_PROXY_ROOT_FILES: usize = 8;

#[test]
fn files_stay_small_and_the_proxy_keeps_to_its_folders() {
    let mut files = Vec::new();
    let mut pending = vec![src()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut too_long = Vec::new();
    for file in &files {
        let relative = file
            .strip_prefix(src())
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let name = relative.rsplit('/').next().unwrap_or_default();
        if relative.contains("/tests/") || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let lines = text
            .lines()
            .take_while(|line| !line.starts_with("#[cfg(test)]"))
            .count();
        if lines > MAX_LINES {
            too_long.push(format!("{relative}: {lines} lines (at most {MAX_LINES})"));
        }
    }
    assert!(
        too_long.is_empty(),
        "files too long:\n{}",
        too_long.join("\n")
    );
    let proxy_root = std::fs::read_dir(src().join("proxy"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .count();
    assert!(
        proxy_root <= MAX_PROXY_ROOT_FILES,
        "{proxy_root} files directly in proxy/: its folders hold the rest"
    );
}

/// The `[dependencies]` of the workspace crate in `dir` (a folder beside `relay-core`).
fn dependencies_of(dir: &str) -> Vec<String> {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(dir)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let manifest: toml::Table = text.parse().unwrap();
    let mut names: Vec<String> = manifest
        .get("dependencies")
        .and_then(toml::Value::as_table)
        .map(|table| table.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The library preloaded into WebKit's processes runs in programs that are not ours: it links
/// `relay-resident` alone, and that nothing but libc (ARCHITECTURE.md, "Workspace").
#[test]
fn the_library_preloaded_into_webkit_links_nothing_but_relay_resident_and_libc() {
    assert_eq!(dependencies_of("webkit-trim"), ["relay-resident"]);
    assert_eq!(dependencies_of("resident"), ["libc"]);
}
