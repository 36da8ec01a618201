//! Model aliases: client-facing model names mapped to models the workers serve.
//!
//! Claude Code asks for Claude models (`claude-opus-5-5`, `claude-haiku-...`) that no local
//! worker serves; `[proxy.aliases]` maps them, by exact name or by glob pattern
//! (`"claude-*" = "qwen2.5-coder"`), and `default_model` catches every other name nobody
//! serves. The rewrite happens before dispatch: the worker (and its backend) see the served
//! model's name in the request and in the body.
//!
//! Resolution order: an exact alias always applies; a name some worker serves (or a provider
//! lists) is kept; otherwise the most specific matching pattern (most literal characters)
//! applies, then `default_model`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The configured aliases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelAliases {
    exact: HashMap<String, String>,
    /// Glob patterns and their targets, most specific first.
    patterns: Vec<(String, String)>,
    default_model: Option<String>,
}

impl ModelAliases {
    /// Aliases from (name or pattern, served model) pairs, and the model for names nobody
    /// serves. A name with `*` (any run of characters) or `?` (one character) is a pattern.
    pub fn new(
        aliases: impl IntoIterator<Item = (String, String)>,
        default_model: Option<String>,
    ) -> Self {
        let mut exact = HashMap::new();
        let mut patterns = Vec::new();
        for (name, target) in aliases {
            if is_pattern(&name) {
                patterns.push((name, target));
            } else {
                exact.insert(name, target);
            }
        }
        patterns.sort_by(|(a, _), (b, _)| literal_len(b).cmp(&literal_len(a)).then(a.cmp(b)));
        ModelAliases {
            exact,
            patterns,
            default_model: default_model.filter(|m| !m.is_empty()),
        }
    }

    /// Whether nothing is configured (then requests are not looked at).
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.patterns.is_empty() && self.default_model.is_none()
    }

    /// The served model a request for `model` goes to, or `None` to keep `model`. `served`
    /// tells whether a name is routable as it is.
    pub fn resolve(&self, model: &str, served: impl Fn(&str) -> bool) -> Option<&str> {
        if let Some(target) = self.exact.get(model) {
            return Some(target);
        }
        if served(model) {
            return None;
        }
        self.patterns
            .iter()
            .find(|(pattern, _)| glob_match(pattern, model))
            .map(|(_, target)| target.as_str())
            .or(self.default_model.as_deref())
            .filter(|target| *target != model)
    }
}

fn literal_len(pattern: &str) -> usize {
    pattern.chars().filter(|c| !matches!(c, '*' | '?')).count()
}

/// Whether a configured model name is a glob pattern (has `*` or `?`) rather than a name.
/// The aliases a running proxy applies, replaceable while it runs: the dashboard's settings
/// change them without a restart. Requests read a snapshot (one uncontended read lock and an
/// `Arc` clone), so a change never tears a request's resolution.
#[derive(Debug, Default)]
pub struct LiveAliases(RwLock<Arc<ModelAliases>>);

impl LiveAliases {
    /// Starts with `aliases`.
    pub fn new(aliases: ModelAliases) -> Self {
        LiveAliases(RwLock::new(Arc::new(aliases)))
    }

    /// The aliases now.
    pub fn current(&self) -> Arc<ModelAliases> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies `aliases` to every later request.
    pub fn replace(&self, aliases: ModelAliases) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(aliases);
    }
}

pub fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and `?` one character.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut p, mut n) = (0, 0);
    // Where the last `*` was, and where in `name` it is currently taken to end.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(c) if *c == '?' || *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                // Let the last `*` take one more character and try again.
                Some((star_p, star_n)) => {
                    star = Some((star_p, star_n + 1));
                    p = star_p + 1;
                    n = star_n + 1;
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aliases(pairs: &[(&str, &str)], default_model: Option<&str>) -> ModelAliases {
        ModelAliases::new(
            pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())),
            default_model.map(str::to_string),
        )
    }

    #[test]
    fn glob_patterns_match_runs_and_single_characters() {
        assert!(glob_match("claude-*", "claude-opus-5-5"));
        assert!(glob_match("claude-*", "claude-"));
        assert!(!glob_match("claude-*", "claud"));
        assert!(glob_match("*-haiku-*", "claude-haiku-4-5"));
        assert!(glob_match("gpt-4?", "gpt-4o"));
        assert!(!glob_match("gpt-4?", "gpt-4o-mini"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn aliases_resolve_exact_then_served_then_most_specific_pattern_then_default() {
        let aliases = aliases(
            &[
                ("claude-*", "coder"),
                ("claude-haiku-*", "small"),
                ("gpt-4o", "chat"),
            ],
            Some("fallback"),
        );
        let served = |m: &str| ["claude-local", "gpt-4o", "coder"].contains(&m);
        assert_eq!(
            aliases.resolve("gpt-4o", served),
            Some("chat"),
            "exact wins"
        );
        assert_eq!(aliases.resolve("claude-local", served), None, "served");
        assert_eq!(aliases.resolve("claude-opus-5-5", served), Some("coder"));
        assert_eq!(
            aliases.resolve("claude-haiku-4-5", served),
            Some("small"),
            "the more specific pattern"
        );
        assert_eq!(aliases.resolve("llama3", served), Some("fallback"));
        assert_eq!(aliases.resolve("coder", served), None);
    }

    #[test]
    fn no_aliases_change_nothing() {
        let none = aliases(&[], None);
        assert!(none.is_empty());
        assert_eq!(none.resolve("x", |_| false), None);
        let only_default = aliases(&[], Some("m"));
        assert!(!only_default.is_empty());
        assert_eq!(
            only_default.resolve("m", |_| false),
            None,
            "not onto itself"
        );
    }
}
