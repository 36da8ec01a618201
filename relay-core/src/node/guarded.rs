//! Which settings a change may touch without the admin token or a dashboard session: an
//! allow-list of the few that can neither let anyone in, nor send prompts, keys or secrets
//! elsewhere, nor run anything (timeouts, bounds, the log level, harmless model-map fields).
//! Every other setting — including any added later, by default — is guarded.
//!
//! Every control request that changes settings already needs a credential (a request from this
//! machine is not a login, see `proxy/control/auth.rs`); this rule is the second wall: should a
//! route ever let a change through without one, it still cannot touch a guarded setting. The
//! rule compares the file before and after a save, so it holds whichever way the change arrives
//! (form, whole file, join) and whatever else the same save changes.

use std::collections::BTreeMap;

/// Settings that need no credential, as paths in the file: `*` matches one key of a table (a
/// model's name) or one entry of an array of tables (named by its `name`, else its index).
const HARMLESS: &[&str] = &[
    "log_level",
    // Which roles run: the proxy's listener and the worker's destination stay as configured.
    "roles.proxy",
    "roles.worker",
    "proxy.max_queue_len",
    "proxy.queue_timeout_secs",
    "proxy.request_timeout_secs",
    "proxy.max_body_bytes",
    "proxy.max_connections",
    "proxy.max_workers",
    "proxy.body_read_timeout_secs",
    "proxy.max_request_bytes_in_flight",
    "proxy.header_read_timeout_secs",
    "proxy.max_stream_bytes",
    "proxy.max_buffered_stream_bytes",
    "proxy.heartbeat_interval_secs",
    "proxy.heartbeat_timeout_secs",
    "proxy.drain_timeout_secs",
    "proxy.cancel_grace_secs",
    "proxy.max_models_per_worker",
    "proxy.responses_store_ttl_secs",
    "proxy.responses_store_max_entries",
    "proxy.responses_store_max_bytes",
    "proxy.affinity",
    "proxy.cost_routing",
    "proxy.sleepers_remembered_secs",
    "proxy.max_sleepers",
    "proxy.wake_retry_secs",
    "worker.worker_name",
    "worker.max_concurrency",
    "worker.model_refresh_secs",
    "worker.drain_timeout_secs",
    "worker.proxy_silence_timeout_secs",
    "worker.sleeps_when_idle",
    "worker.slot_hints",
    "worker.context_window",
    "worker.mac_address",
    "worker.native_messages",
    "worker.native_responses",
    "worker.lifecycle.max_loaded_models",
    "worker.lifecycle.vram_budget_mb",
    "worker.lifecycle.startup_timeout_secs",
    "worker.lifecycle.stop_grace_secs",
    "worker.lifecycle.session_restart",
    "worker.lifecycle.session_headers",
    "worker.lifecycle.breaker_max_failures",
    "worker.lifecycle.breaker_window_secs",
    "worker.lifecycle.breaker_backoff_secs",
    "worker.model_map.*.ctx_size",
    "worker.model_map.*.idle_timeout_secs",
    "worker.model_map.*.group",
    "worker.model_map.*.vram_mb",
];

/// The guarded settings that differ between the file texts `old` and `new` (set, changed or
/// removed), as dotted paths; empty when none does. A text that does not parse counts as empty
/// (the save validates it anyway).
pub fn changed(old: &str, new: &str) -> Vec<String> {
    let before = leaves(old);
    let after = leaves(new);
    let mut paths: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .filter(|path| !harmless(path))
        .cloned()
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

fn harmless(path: &str) -> bool {
    let segments: Vec<&str> = path.split('.').collect();
    HARMLESS.iter().any(|pattern| {
        let wanted: Vec<&str> = pattern.split('.').collect();
        wanted.len() == segments.len()
            && wanted
                .iter()
                .zip(&segments)
                .all(|(want, got)| *want == "*" || want == got)
    })
}

/// Every leaf value of `text`, by path (an array of scalars is one leaf).
fn leaves(text: &str) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        collect(&toml::Value::Table(table), String::new(), &mut found);
    }
    found
}

fn collect(value: &toml::Value, path: String, found: &mut BTreeMap<String, String>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        toml::Value::Table(table) => {
            for (key, child) in table {
                collect(child, join(key), found);
            }
        }
        toml::Value::Array(items)
            if !items.is_empty() && items.iter().all(toml::Value::is_table) =>
        {
            for (index, child) in items.iter().enumerate() {
                let name = child
                    .get("name")
                    .and_then(toml::Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| index.to_string());
                collect(child, join(&name), found);
            }
        }
        leaf => {
            found.insert(path, leaf.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_start_script_is_a_guarded_change() {
        let new = "[worker.model_map.x]\nstart_script = \"/usr/bin/touch\"\nargs = [\"pwned\"]\n";
        assert_eq!(
            changed("", new),
            ["worker.model_map.x.args", "worker.model_map.x.start_script"]
        );
    }

    #[test]
    fn harmless_settings_and_comments_are_not_guarded() {
        let old = "[proxy]\nmax_queue_len = 10\n[worker.model_map.x]\nllama_server = \"/opt/ls\"\nidle_timeout_secs = 5\n";
        let new = "# tuned\nlog_level = \"debug\"\n[roles]\nworker = false\n[proxy]\nmax_queue_len = 20\n[worker.model_map.x]\nllama_server = \"/opt/ls\"\nidle_timeout_secs = 60\nvram_mb = 100\n[worker.lifecycle]\nsession_headers = [\"x-session\"]\n";
        assert!(changed(old, new).is_empty(), "{:?}", changed(old, new));
    }

    #[test]
    fn where_prompts_go_is_guarded() {
        // Each of these sends a real model's prompts to a worker or upstream of the attacker's,
        // or lets another worker in (the attack list).
        let new = "[proxy]\ndefault_model = \"evil\"\nworker_secret = \"attacker\"\nlisten = \"0.0.0.0:8080\"\nfallback_upstream = \"evil\"\n[proxy.aliases]\nllama3 = \"evil\"\n[[proxy.providers]]\nname = \"p\"\nworker_secret = \"x\"\n";
        assert_eq!(
            changed("", new),
            [
                "proxy.aliases.llama3",
                "proxy.default_model",
                "proxy.fallback_upstream",
                "proxy.listen",
                "proxy.providers.p.name",
                "proxy.providers.p.worker_secret",
                "proxy.worker_secret",
            ]
        );
    }

    #[test]
    fn a_setting_not_on_the_allow_list_is_guarded() {
        assert_eq!(
            changed("", "[proxy]\nsome_future_setting = 1\n"),
            ["proxy.some_future_setting"]
        );
        assert_eq!(
            changed("", "[worker.model_map.x]\nport = 22\n"),
            ["worker.model_map.x.port"]
        );
    }

    #[test]
    fn upstreams_are_compared_by_name_and_removal_counts() {
        let old = "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"https://api.example\"\n";
        let moved = "[[proxy.upstreams]]\nname = \"b\"\nbase_url = \"https://x\"\n[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"https://api.example\"\n";
        assert_eq!(
            changed(old, moved),
            ["proxy.upstreams.b.base_url", "proxy.upstreams.b.name"]
        );
        assert_eq!(
            changed(old, ""),
            ["proxy.upstreams.a.base_url", "proxy.upstreams.a.name"]
        );
        let key_env = "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"https://api.example\"\napi_key_env = \"HOME\"\n";
        assert_eq!(changed(old, key_env), ["proxy.upstreams.a.api_key_env"]);
    }

    #[test]
    fn the_worker_destination_and_the_protection_itself_are_guarded() {
        let new = "[proxy]\nadmin_token = \"x\"\nallowed_hosts = [\"evil.example\"]\ncors_origins = [\"*\"]\nmetrics_public = true\nrequire_api_keys = false\ndatabase_url = \"postgres://evil.example/db\"\n[worker]\nproxy_url = \"http://evil.example\"\nbackend_url = \"http://evil.example\"\n";
        assert_eq!(
            changed("", new),
            [
                "proxy.admin_token",
                "proxy.allowed_hosts",
                "proxy.cors_origins",
                "proxy.database_url",
                "proxy.metrics_public",
                "proxy.require_api_keys",
                "worker.backend_url",
                "worker.proxy_url"
            ]
        );
    }

    #[test]
    fn where_wake_on_lan_datagrams_go_is_guarded_for_both_roles() {
        let new =
            "[proxy]\nwake_target = \"203.0.113.9:9\"\n[worker]\nwake_target = \"203.0.113.9:9\"\n";
        assert_eq!(
            changed("", new),
            ["proxy.wake_target", "worker.wake_target"]
        );
    }

    #[test]
    fn every_allow_listed_path_names_a_real_setting() {
        // A renamed setting would silently fall off the list (and become guarded): each entry
        // is set in a file the format reads (a wrong type is fine here, an unknown key is not).
        for pattern in HARMLESS {
            let path = pattern.replace('*', "m");
            let (table, key) = path.rsplit_once('.').unwrap_or(("", &path));
            let text = if table.is_empty() {
                format!("{key} = 1\n")
            } else {
                format!("[{table}]\n{key} = 1\n")
            };
            if let Err(error) = toml::from_str::<crate::settings::FileConfig>(&text) {
                assert!(
                    !error.to_string().contains("unknown field"),
                    "{pattern}: {error}"
                );
            }
        }
    }
}
