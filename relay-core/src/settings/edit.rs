//! What the dashboard's settings form shows, and edits to the config file that keep its
//! comments and every key the form does not know.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value};
use toml_edit::{value, Array, DocumentMut, InlineTable, Item, Table};

use super::{defaults, FileConfig, Overrides, ProxySettings, Roles, WorkerSettings};

/// The settings the form edits, with defaults filled in.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct SettingsValues {
    /// Which roles run.
    pub roles: Roles,
    /// `[proxy]`.
    pub proxy: ProxyValues,
    /// `[worker]`.
    pub worker: WorkerValues,
}

/// `[proxy]` settings of the form.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct ProxyValues {
    listen: String,
    provider: String,
    max_queue_len: usize,
    queue_timeout_secs: u64,
    request_timeout_secs: u64,
    aliases: BTreeMap<String, String>,
    default_model: Option<String>,
}

/// `[worker]` settings of the form; the secret is only said to be set, never shown.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct WorkerValues {
    proxy_url: Option<String>,
    worker_secret_set: bool,
    worker_name: String,
    backend_url: Option<String>,
    models: Option<Vec<String>>,
    max_concurrency: u32,
    confirmed_backends: Vec<String>,
}

impl SettingsValues {
    /// The values `file` sets, defaults elsewhere.
    pub fn of(file: &FileConfig) -> Self {
        let p = &file.proxy;
        let w = &file.worker;
        SettingsValues {
            roles: Roles {
                proxy: file.roles.proxy.unwrap_or(true),
                worker: file.roles.worker.unwrap_or(true),
            },
            proxy: ProxyValues {
                listen: p
                    .listen
                    .clone()
                    .unwrap_or_else(|| defaults::LISTEN.to_string()),
                provider: p
                    .provider
                    .clone()
                    .unwrap_or_else(|| defaults::PROVIDER.to_string()),
                max_queue_len: p.max_queue_len.unwrap_or(defaults::MAX_QUEUE_LEN),
                queue_timeout_secs: p
                    .queue_timeout_secs
                    .unwrap_or(defaults::QUEUE_TIMEOUT.as_secs()),
                request_timeout_secs: p
                    .request_timeout_secs
                    .unwrap_or(defaults::REQUEST_TIMEOUT.as_secs()),
                aliases: p.aliases.clone(),
                default_model: p.default_model.clone(),
            },
            worker: WorkerValues {
                proxy_url: w.proxy_url.clone(),
                worker_secret_set: w.worker_secret.is_some(),
                worker_name: w
                    .worker_name
                    .clone()
                    .unwrap_or_else(super::default_worker_name),
                backend_url: w.backend_url.clone(),
                models: w.models.clone(),
                max_concurrency: w.max_concurrency.unwrap_or(defaults::MAX_CONCURRENCY),
                confirmed_backends: w.confirmed_backends.clone().unwrap_or_default(),
            },
        }
    }
}

/// The type a form field must have.
#[derive(Clone, Copy)]
enum Kind {
    Bool,
    Count,
    Text,
    TextList,
    TextMap,
}

/// Every key the form may set, by section.
const FIELDS: &[(&str, &str, Kind)] = &[
    ("roles", "proxy", Kind::Bool),
    ("roles", "worker", Kind::Bool),
    ("proxy", "listen", Kind::Text),
    ("proxy", "provider", Kind::Text),
    ("proxy", "max_queue_len", Kind::Count),
    ("proxy", "queue_timeout_secs", Kind::Count),
    ("proxy", "request_timeout_secs", Kind::Count),
    ("proxy", "aliases", Kind::TextMap),
    ("proxy", "default_model", Kind::Text),
    ("worker", "proxy_url", Kind::Text),
    ("worker", "proxy_fingerprint", Kind::Text),
    ("worker", "worker_secret", Kind::Text),
    ("worker", "worker_name", Kind::Text),
    ("worker", "backend_url", Kind::Text),
    ("worker", "models", Kind::TextList),
    ("worker", "max_concurrency", Kind::Count),
    ("worker", "confirmed_backends", Kind::TextList),
];

/// `[proxy]` settings a running node applies at once (model aliases, queue bound and
/// timeouts); the others (listen address, provider name) need a restart.
pub const LIVE_PROXY_FIELDS: &[&str] = &[
    "proxy.aliases",
    "proxy.default_model",
    "proxy.max_queue_len",
    "proxy.queue_timeout_secs",
    "proxy.request_timeout_secs",
];

/// What a patch changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// `section.key` of every changed field.
    pub fields: Vec<String>,
}

impl Changes {
    /// Whether any field of `section` changed.
    pub fn touches(&self, section: &str) -> bool {
        self.fields
            .iter()
            .any(|f| f.split('.').next() == Some(section))
    }

    /// Whether any of `fields` (`section.key`) changed.
    pub fn touches_any(&self, fields: &[&str]) -> bool {
        self.fields.iter().any(|f| fields.contains(&f.as_str()))
    }

    /// Changed fields that only take effect after a restart: the proxy's, which a running
    /// node read when it started, except those it applies live.
    pub fn needing_restart(&self) -> Vec<String> {
        self.fields
            .iter()
            .filter(|f| f.starts_with("proxy.") && !LIVE_PROXY_FIELDS.contains(&f.as_str()))
            .cloned()
            .collect()
    }
}

/// Applies a JSON patch (`{"roles":{..},"proxy":{..},"worker":{..}}`; `null` removes a key) to
/// the config text. Errors name the field.
pub fn patch(text: &str, patch: &Value) -> Result<(String, Changes), String> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| format!("the config file is not valid TOML: {e}"))?;
    let sections = patch
        .as_object()
        .ok_or("settings must be a JSON object like {\"roles\":{\"worker\":true}}")?;
    for (section, fields) in sections {
        let fields = fields
            .as_object()
            .ok_or_else(|| format!("`{section}` must be an object"))?;
        for (key, new) in fields {
            let kind = FIELDS
                .iter()
                .find(|(s, k, _)| s == section && k == key)
                .map(|(_, _, kind)| *kind)
                .ok_or_else(|| format!("unknown setting `{section}.{key}`"))?;
            let table = doc
                .entry(section)
                .or_insert_with(|| Item::Table(Table::new()))
                .as_table_mut()
                .ok_or_else(|| format!("`{section}` in the config file is not a table"))?;
            if new.is_null() {
                table.remove(key);
            } else {
                // Through the entry, so an existing key keeps the comments above it.
                *table.entry(key).or_insert(Item::None) = to_item(section, key, kind, new)?;
            }
        }
    }
    let new_text = doc.to_string();
    validate(&new_text)?;
    let changes = diff(text, &new_text);
    Ok((new_text, changes))
}

/// The fields that differ in meaning (not formatting) between two versions of the config file;
/// a difference outside the form's fields shows as `section.other`.
pub fn diff(old: &str, new: &str) -> Changes {
    let parse = |text: &str| text.parse::<toml::Table>().unwrap_or_default();
    let (old, new) = (parse(old), parse(new));
    let mut changes = Changes::default();
    for section in ["roles", "proxy", "worker"] {
        let (before, after) = (old.get(section), new.get(section));
        let field = |table: Option<&toml::Value>, key: &str| table?.get(key).cloned();
        let mut found = false;
        for (_, key, _) in FIELDS.iter().filter(|(s, _, _)| *s == section) {
            if field(before, key) != field(after, key) {
                changes.fields.push(format!("{section}.{key}"));
                found = true;
            }
        }
        if !found && before != after {
            changes.fields.push(format!("{section}.other"));
        }
    }
    changes
}

fn to_item(section: &str, key: &str, kind: Kind, new: &Value) -> Result<Item, String> {
    let field = format!("{section}.{key}");
    let item = match kind {
        Kind::Bool => value(
            new.as_bool()
                .ok_or_else(|| format!("`{field}` must be true or false"))?,
        ),
        Kind::Count => {
            let n = new
                .as_i64()
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("`{field}` must be a whole number of 0 or more"))?;
            value(n)
        }
        Kind::Text => {
            let text = new
                .as_str()
                .ok_or_else(|| format!("`{field}` must be a string"))?
                .trim();
            if text.is_empty() {
                return Err(format!(
                    "`{field}` must not be empty (use null to unset it)"
                ));
            }
            value(text)
        }
        Kind::TextList => {
            let list = new
                .as_array()
                .ok_or_else(|| format!("`{field}` must be a list of strings"))?;
            let mut array = Array::new();
            for entry in list {
                array.push(
                    entry
                        .as_str()
                        .ok_or_else(|| format!("`{field}` must be a list of strings"))?
                        .trim(),
                );
            }
            value(array)
        }
        Kind::TextMap => {
            let map: &Map<String, Value> = new
                .as_object()
                .ok_or_else(|| format!("`{field}` must be an object of strings"))?;
            let mut table = InlineTable::new();
            for (name, target) in map {
                let target = target
                    .as_str()
                    .filter(|t| !t.trim().is_empty())
                    .ok_or_else(|| format!("`{field}.{name}` must be a model name"))?;
                table.insert(name.trim(), target.trim().into());
            }
            let mut table = table.into_table();
            table.set_implicit(false);
            Item::Table(table)
        }
    };
    Ok(item)
}

/// Checks config text the way the node will use it: it parses, and the proxy and worker it
/// describes can be built.
pub fn validate(text: &str) -> Result<FileConfig, String> {
    let file = super::parse_file(text)?;
    let none = Overrides::default();
    ProxySettings::resolve(&file, &none).map_err(|e| e.to_string())?;
    WorkerSettings::resolve(&file, &none).map_err(|e| e.to_string())?;
    if let Some(listen) = &file.proxy.listen {
        listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| format!("`proxy.listen` {listen:?} is not an IP:port address ({e})"))?;
    }
    Ok(file)
}

/// Shown instead of secrets in the config text the API returns.
pub const REDACTED: &str = "********";

/// Keys whose values are secrets.
const SECRET_KEYS: &[&str] = &["worker_secret", "admin_token", "api_key"];

/// Where a table sits, for the values that are secrets only there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Other,
    /// `[worker.model_map]`: its tables are models.
    ModelMap,
    /// One model of the map: its `env` values and `args` often carry keys and tokens.
    Model,
}

/// Visits every secret value in `table` (nested tables and arrays of tables too), with its
/// dotted path: the values of [`SECRET_KEYS`], and each model's `env` values and `args`.
fn each_secret(
    table: &mut dyn toml_edit::TableLike,
    place: Place,
    visit: &mut dyn FnMut(&str, &mut toml_edit::Value),
) {
    for (key, item) in table.iter_mut() {
        let key = key.get().to_string();
        if place == Place::Model && key == "env" {
            if let Some(env) = item.as_table_like_mut() {
                for (name, value) in env.iter_mut() {
                    if let Some(value) = value.as_value_mut().filter(|v| v.is_str()) {
                        visit(&format!("env.{}", name.get()), value);
                    }
                }
                continue;
            }
        }
        if place == Place::Model && key == "args" {
            if let Some(args) = item.as_array_mut() {
                for (n, value) in args.iter_mut().enumerate() {
                    if value.is_str() {
                        visit(&format!("args.{n}"), value);
                    }
                }
                continue;
            }
        }
        if SECRET_KEYS.contains(&key.as_str()) && item.is_str() {
            if let Some(value) = item.as_value_mut() {
                visit(&key, value);
            }
        } else if let Some(inner) = item.as_table_like_mut() {
            let inner_place = match (place, key.as_str()) {
                (Place::ModelMap, _) => Place::Model,
                (_, "model_map") => Place::ModelMap,
                _ => Place::Other,
            };
            each_secret(inner, inner_place, &mut |k, v| {
                visit(&format!("{key}.{k}"), v)
            });
        } else if let Some(array) = item.as_array_of_tables_mut() {
            for (n, inner) in array.iter_mut().enumerate() {
                each_secret(inner, Place::Other, &mut |k, v| {
                    visit(&format!("{key}.{n}.{k}"), v)
                });
            }
        }
    }
}

/// Replaces `value` with `text`, keeping its comments and spacing.
fn replace_keeping_decor(value: &mut toml_edit::Value, text: &str) {
    let decor = value.decor().clone();
    *value = text.into();
    *value.decor_mut() = decor;
}

/// The config text with every secret value replaced by [`REDACTED`].
pub fn redact(text: &str) -> String {
    let Ok(mut doc) = text.parse::<DocumentMut>() else {
        return String::new();
    };
    each_secret(doc.as_table_mut(), Place::Other, &mut |_, value| {
        replace_keeping_decor(value, REDACTED)
    });
    doc.to_string()
}

/// `new` with each [`REDACTED`] placeholder put back to the secret `old` had at the same place,
/// so a file read through the API and saved back keeps its secrets.
pub fn restore_secrets(new: &str, old: &str) -> Result<String, String> {
    let mut secrets = std::collections::HashMap::new();
    if let Ok(mut doc) = old.parse::<DocumentMut>() {
        each_secret(doc.as_table_mut(), Place::Other, &mut |path, value| {
            if let Some(v) = value.as_str() {
                secrets.insert(path.to_string(), v.to_string());
            }
        });
    }
    let mut doc: DocumentMut = new
        .parse()
        .map_err(|e| format!("the config file is not valid TOML: {e}"))?;
    let mut missing = None;
    each_secret(doc.as_table_mut(), Place::Other, &mut |path, value| {
        if value.as_str() == Some(REDACTED) {
            match secrets.get(path) {
                Some(secret) => replace_keeping_decor(value, secret),
                None => missing = Some(path.to_string()),
            }
        }
    });
    match missing {
        Some(path) => Err(format!(
            "`{path}` is {REDACTED:?} but there is no saved secret at that place to keep: write the secret itself"
        )),
        None => Ok(doc.to_string()),
    }
}

/// Reads the config file; a missing one is empty.
pub fn read(path: &Path) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e),
    }
}

/// Replaces the config file atomically (it may hold secrets: owner-only).
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let temporary = path.with_extension("toml.tmp");
    crate::paths::write_private(&temporary, text)?;
    std::fs::rename(&temporary, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str =
        "# my relay\n[proxy]\n# keep me\nmax_queue_len = 50\nfallback_upstream_unused = 1\n";

    #[test]
    fn model_env_values_and_args_are_redacted_and_restored() {
        let text = "[worker.model_map.x]\nllama_server = \"/opt/ls\"\nargs = [\"--api-key\", \"sk-live\"] # keys\nenv = { HF_TOKEN = \"hf-secret\" }\n";
        let shown = redact(text);
        assert!(
            !shown.contains("sk-live") && !shown.contains("hf-secret"),
            "{shown}"
        );
        assert!(
            shown.contains("HF_TOKEN") && shown.contains("/opt/ls") && shown.contains("# keys"),
            "{shown}"
        );
        assert_eq!(restore_secrets(&shown, text).unwrap(), text);
    }

    #[test]
    fn model_aliases_are_applied_live_and_other_proxy_settings_need_a_restart() {
        let (_, changes) = patch(
            "[proxy]\nmax_queue_len = 50\n",
            &json!({"proxy": {"aliases": {"claude-*": "qwen"}, "default_model": "qwen", "listen": "0.0.0.0:9000"}}),
        )
        .unwrap();
        assert!(changes.touches_any(LIVE_PROXY_FIELDS));
        assert_eq!(changes.needing_restart(), vec!["proxy.listen"]);
    }

    #[test]
    fn a_patch_keeps_comments_and_reports_what_changed() {
        let text = "# my relay\n[proxy]\n# keep me\nmax_queue_len = 50\n";
        let (out, changes) = patch(
            text,
            &json!({"proxy": {"max_queue_len": 10}, "roles": {"worker": false}}),
        )
        .unwrap();
        assert!(out.contains("# keep me"), "{out}");
        assert!(out.contains("max_queue_len = 10"), "{out}");
        assert!(out.contains("[roles]\nworker = false"), "{out}");
        assert_eq!(changes.fields, vec!["roles.worker", "proxy.max_queue_len"]);
        assert!(
            changes.needing_restart().is_empty(),
            "the queue bound applies live"
        );
        assert!(changes.touches("roles"));
        assert!(!changes.touches("worker"));
    }

    #[test]
    fn a_whole_file_diff_lists_form_fields_and_other_changes() {
        let old = "[proxy]\nmax_queue_len = 5\n[worker]\n";
        let new = "[proxy]\nmax_queue_len = 6\n[worker]\n[worker.model_map.a]\nscript = \"x\"\n";
        let changes = diff(old, new);
        assert_eq!(changes.fields, vec!["proxy.max_queue_len", "worker.other"]);
        assert!(diff(old, old).fields.is_empty());
    }

    #[test]
    fn secrets_are_redacted_and_restored_on_save() {
        let text = "[worker]\nworker_secret = \"s3\" # mine\n[[proxy.upstreams]]\nname = \"c\"\napi_key = \"k1\"\n";
        let shown = redact(text);
        assert!(!shown.contains("s3") && !shown.contains("k1"), "{shown}");
        assert!(shown.contains("# mine"), "{shown}");
        let edited = shown.replace("[worker]", "log_level = \"debug\"\n[worker]");
        let saved = restore_secrets(&edited, text).unwrap();
        assert!(
            saved.contains("worker_secret = \"s3\"") && saved.contains("api_key = \"k1\""),
            "{saved}"
        );
        let error = restore_secrets("[proxy]\nadmin_token = \"********\"\n", text).unwrap_err();
        assert!(error.contains("proxy.admin_token"), "{error}");
    }

    #[test]
    fn setting_the_same_value_changes_nothing() {
        let text = "[proxy]\nmax_queue_len = 50\n";
        let (_, changes) = patch(text, &json!({"proxy": {"max_queue_len": 50}})).unwrap();
        assert!(changes.fields.is_empty());
    }

    #[test]
    fn null_removes_a_key_and_aliases_become_a_table() {
        let text = "[worker]\nbackend_url = \"http://x:1\"\n";
        let (out, _) = patch(
            text,
            &json!({"worker": {"backend_url": null}, "proxy": {"aliases": {"claude-*": "qwen"}}}),
        )
        .unwrap();
        assert!(!out.contains("backend_url"), "{out}");
        let file = crate::settings::parse_file(&out).unwrap();
        assert_eq!(file.proxy.aliases["claude-*"], "qwen");
    }

    #[test]
    fn bad_input_names_the_field() {
        let cases = [
            (
                json!({"proxy": {"max_queue_len": -1}}),
                "proxy.max_queue_len",
            ),
            (
                json!({"proxy": {"nope": 1}}),
                "unknown setting `proxy.nope`",
            ),
            (json!({"roles": {"proxy": "yes"}}), "roles.proxy"),
            (json!({"worker": {"models": [1]}}), "worker.models"),
            (json!({"proxy": {"listen": "localhost"}}), "proxy.listen"),
            (json!({"worker": {"max_concurrency": 0}}), "MAX_CONCURRENCY"),
            (json!([1]), "JSON object"),
        ];
        for (input, expected) in cases {
            let error = patch(
                FILE.replace("fallback_upstream_unused = 1\n", "").as_str(),
                &input,
            )
            .unwrap_err();
            assert!(error.contains(expected), "{input}: {error}");
        }
    }

    #[test]
    fn values_fill_in_defaults_and_never_show_the_secret() {
        let file = crate::settings::parse_file("[worker]\nworker_secret = \"s3\"\n").unwrap();
        let shown = serde_json::to_string(&SettingsValues::of(&file)).unwrap();
        assert!(!shown.contains("s3\""), "{shown}");
        assert!(shown.contains("\"worker_secret_set\":true"), "{shown}");
        assert!(shown.contains("\"max_queue_len\":100"), "{shown}");
    }

    #[test]
    fn files_are_written_atomically_and_privately() {
        let dir = std::env::temp_dir().join(format!("mr-settings-{}", std::process::id()));
        let path = dir.join("nested/config.toml");
        write(&path, "[roles]\nproxy = true\n").unwrap();
        assert_eq!(read(&path).unwrap(), "[roles]\nproxy = true\n");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(read(&dir.join("missing.toml")).unwrap(), "");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
