//! The rules of ARCHITECTURE.md ("Dependency rules") as data, and the check of a crate model
//! against them. Each rule reads as the sentence ARCHITECTURE.md lists it with.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{top_level, within, CrateModel, Reference};

/// One rule about what code may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The module imports nothing else of the crate.
    SelfContained(&'static str),
    /// The module imports nothing else of the crate but the second.
    SelfContainedBut(&'static str, &'static str),
    /// The first module never imports the second.
    Never(&'static str, &'static str),
    /// The first module reaches the second only through the third (a module inside it).
    OnlyThrough(&'static str, &'static str, &'static str),
    /// The module (or file, `….rs`) starts no task or thread, sleeps on no timer, reads no
    /// clock, environment, file, socket or process, and sends no HTTP request: what it does
    /// follows from its arguments alone.
    Pure(&'static str),
    /// The module never names axum's routing, extractors or responses (its WebSocket type
    /// aside): HTTP is the edge's business.
    NoWebFramework(&'static str),
}

impl Rule {
    /// The sentence ARCHITECTURE.md lists the rule with.
    pub fn sentence(&self) -> String {
        match self {
            Rule::SelfContained(m) => format!("`{m}` imports nothing else of the crate"),
            Rule::SelfContainedBut(m, but) => {
                format!("`{m}` imports nothing else of the crate but `{but}`")
            }
            Rule::Never(a, b) => format!("`{a}` never imports `{b}`"),
            Rule::OnlyThrough(a, b, via) => format!("`{a}` reaches `{b}` only through `{via}`"),
            Rule::Pure(m) => format!(
                "`{m}` is pure: no task, timer, clock, environment, file, socket, process or HTTP client"
            ),
            Rule::NoWebFramework(m) => {
                format!("`{m}` never sees axum's routing, extractors or responses")
            }
        }
    }

    /// The modules and files the rule names.
    pub fn names(&self) -> Vec<&'static str> {
        match *self {
            Rule::SelfContained(m) | Rule::Pure(m) | Rule::NoWebFramework(m) => vec![m],
            Rule::Never(a, b) | Rule::SelfContainedBut(a, b) => vec![a, b],
            Rule::OnlyThrough(a, b, via) => vec![a, b, via],
        }
    }
}

/// The sentence of the rule every module keeps: no cycles.
pub const ACYCLIC: &str = "no two modules import each other, directly or through others: \
                           neither the crate's top-level modules nor the modules inside one";

/// A rule broken, and where.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Violation {
    pub rule: String,
    pub at: String,
}

/// Paths that start work, wait on time, read the clock or the world outside the arguments.
const IMPURE_PREFIXES: &[&str] = &[
    "tokio::spawn",
    "tokio::task",
    "tokio::time::sleep",
    "tokio::time::sleep_until",
    "tokio::time::interval",
    "tokio::time::interval_at",
    "tokio::time::timeout",
    "tokio::time::timeout_at",
    "tokio::net",
    "tokio::fs",
    "tokio::process",
    "tokio::signal",
    "std::thread",
    "std::env",
    "std::fs",
    // Addresses are data; sockets are not.
    "std::net::TcpStream",
    "std::net::TcpListener",
    "std::net::UdpSocket",
    "std::net::ToSocketAddrs",
    "std::process",
    "reqwest",
    "hyper",
    "rusqlite",
    "sqlx",
    "axum::serve",
];

/// Calls that read a clock, whatever the path to their type.
const CLOCKS: &[&str] = &["Instant::now", "SystemTime::now", "Utc::now", "Local::now"];

/// What of axum a module without the web framework may not name.
const WEB_FRAMEWORK: &[&str] = &[
    "axum::routing",
    "axum::Router",
    "axum::response",
    "axum::Json",
    "axum::Extension",
    "axum::middleware",
    "axum::extract",
];

/// …except the WebSocket a worker connects with.
const WEB_FRAMEWORK_ALLOWED: &[&str] = &["axum::extract::ws"];

fn starts_with_any(path: &str, prefixes: &[&str]) -> bool {
    prefixes
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}::")))
}

fn is_impure(path: &str) -> bool {
    starts_with_any(path, IMPURE_PREFIXES)
        || CLOCKS
            .iter()
            .any(|clock| path == *clock || path.ends_with(&format!("::{clock}")))
}

/// Whether `reference` comes from `place`: a module (and what is inside it) or a file.
fn from_place(reference: &Reference, place: &str) -> bool {
    if place.ends_with(".rs") {
        reference.file == place
    } else {
        within(&reference.from, place)
    }
}

/// Every rule `model` breaks, and every cycle among its modules.
pub fn check(model: &CrateModel, rules: &[Rule]) -> Vec<Violation> {
    let mut broken = BTreeSet::new();
    for reference in model.references.iter().filter(|r| !r.test) {
        let path = reference.path.join("::");
        let target = reference.internal.then(|| model.module_of(&reference.path));
        for rule in rules {
            let breaks = match (*rule, &target) {
                (Rule::SelfContained(m), Some(target)) => {
                    within(&reference.from, m) && !target.is_empty() && !within(target, m)
                }
                (Rule::SelfContainedBut(m, but), Some(target)) => {
                    within(&reference.from, m)
                        && !target.is_empty()
                        && !within(target, m)
                        && !within(target, but)
                }
                (Rule::Never(a, b), Some(target)) => {
                    within(&reference.from, a) && !within(&reference.from, b) && within(target, b)
                }
                (Rule::OnlyThrough(a, b, via), Some(target)) => {
                    within(&reference.from, a)
                        && !within(&reference.from, b)
                        && within(target, b)
                        && !within(target, via)
                }
                (Rule::Pure(place), None) => from_place(reference, place) && is_impure(&path),
                (Rule::NoWebFramework(m), None) => {
                    within(&reference.from, m)
                        && starts_with_any(&path, WEB_FRAMEWORK)
                        && !starts_with_any(&path, WEB_FRAMEWORK_ALLOWED)
                }
                _ => false,
            };
            if breaks {
                let named = match &target {
                    Some(_) => format!("crate::{path}"),
                    None => path.clone(),
                };
                broken.insert(Violation {
                    rule: rule.sentence(),
                    at: format!("{} ({}): names {named}", reference.file, reference.from),
                });
            }
        }
    }
    for cycle in cycles(model) {
        broken.insert(Violation {
            rule: ACYCLIC.to_string(),
            at: cycle.join(" ⇄ "),
        });
    }
    broken.into_iter().collect()
}

/// The import graphs the cycle check walks: one among the top-level modules, and one among the
/// modules directly inside each (what a module's own `mod.rs` does is the parent tying its
/// children together, not a member).
pub fn graphs(model: &CrateModel) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut graphs: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for module in model.modules.keys() {
        let segments: Vec<&str> = module.split("::").collect();
        if !module.is_empty() {
            graphs
                .entry(String::new())
                .or_default()
                .entry(segments[0].to_string())
                .or_default();
        }
        if segments.len() >= 2 {
            graphs
                .entry(segments[0].to_string())
                .or_default()
                .entry(segments[..2].join("::"))
                .or_default();
        }
    }
    for reference in model.references.iter().filter(|r| r.internal && !r.test) {
        let target = model.module_of(&reference.path);
        let (from, to) = (reference.from.as_str(), target.as_str());
        if from.is_empty() || to.is_empty() {
            continue;
        }
        if top_level(from) != top_level(to) {
            graphs
                .entry(String::new())
                .or_default()
                .entry(top_level(from).to_string())
                .or_default()
                .insert(top_level(to).to_string());
            continue;
        }
        let child = |m: &str| -> Option<String> {
            let segments: Vec<&str> = m.split("::").collect();
            (segments.len() >= 2).then(|| segments[..2].join("::"))
        };
        if let (Some(a), Some(b)) = (child(from), child(to)) {
            if a != b {
                graphs
                    .entry(top_level(from).to_string())
                    .or_default()
                    .entry(a)
                    .or_default()
                    .insert(b);
            }
        }
    }
    graphs
}

/// The cycles of every graph: each strongly connected set of more than one module, sorted.
pub fn cycles(model: &CrateModel) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for graph in graphs(model).values() {
        found.extend(
            strongly_connected(graph)
                .into_iter()
                .filter(|c| c.len() > 1),
        );
    }
    found.sort();
    found
}

/// Tarjan's strongly connected components.
fn strongly_connected(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g str) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        let graph = state.graph;
        for next in graph.get(node).into_iter().flatten() {
            let next = next.as_str();
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.to_string());
                if member == node {
                    break;
                }
            }
            component.sort();
            state.out.push(component);
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.out
}
