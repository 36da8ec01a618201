//! The settings whose change needs the admin token even on loopback: those that decide which
//! programs the node runs (model-map launch fields), where it sends secrets and users' data
//! (upstream URLs and key variables, the worker's proxy and backend, passing clients' keys on),
//! and the protection itself (admin token, allowed hosts and origins, TLS, a public `/metrics`).
//!
//! Everything else stays as open on loopback as the dashboard needs. The rule compares the file
//! before and after a save, so it holds whichever way the change arrives (form, whole file,
//! join) and whatever else the same save changes.

use std::collections::BTreeMap;

/// Guarded keys, as paths in the file: `*` matches one key of a table (a model's name) or one
/// entry of an array of tables (named by its `name`, else its index).
const GUARDED: &[&str] = &[
    "proxy.admin_token",
    "proxy.allowed_hosts",
    "proxy.cors_origins",
    "proxy.metrics_public",
    // Turning keys off opens the relay; a database elsewhere receives key hashes and usage.
    "proxy.require_api_keys",
    "proxy.database_url",
    "proxy.tls",
    "proxy.tls_cert",
    "proxy.tls_key",
    "proxy.forward_client_auth",
    "proxy.providers.*.forward_client_auth",
    "proxy.upstreams.*.base_url",
    "proxy.upstreams.*.api_key_env",
    // Where the proxy sends Wake-on-LAN datagrams: any address a page could name otherwise.
    "proxy.wake_target",
    "worker.proxy_url",
    "worker.proxy_fingerprint",
    "worker.backend_url",
    "worker.forward_client_auth",
    // More of the backend a proxy may reach through this worker.
    "worker.extra_routes",
    // Where a worker sends the Wake-on-LAN datagrams its proxy asks it to relay: the same.
    "worker.wake_target",
    "worker.model_map.*.start_script",
    "worker.model_map.*.llama_server",
    "worker.model_map.*.model_file",
    "worker.model_map.*.args",
    "worker.model_map.*.env",
];

/// The guarded settings that differ between the file texts `old` and `new` (set, changed or
/// removed), as dotted paths; empty when none does. A text that does not parse counts as empty
/// (the save validates it anyway).
pub fn changed(old: &str, new: &str) -> Vec<String> {
    let before = guarded_values(old);
    let after = guarded_values(new);
    let mut paths: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .cloned()
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// Every guarded value of `text`, by path.
fn guarded_values(text: &str) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let Ok(table) = text.parse::<toml::Table>() else {
        return found;
    };
    let root = toml::Value::Table(table);
    for pattern in GUARDED {
        let segments: Vec<&str> = pattern.split('.').collect();
        collect(&root, &segments, String::new(), &mut found);
    }
    found
}

fn collect(
    value: &toml::Value,
    segments: &[&str],
    path: String,
    found: &mut BTreeMap<String, String>,
) {
    let Some((first, rest)) = segments.split_first() else {
        found.insert(path, value.to_string());
        return;
    };
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match (value, *first) {
        (toml::Value::Table(table), "*") => {
            for (key, child) in table {
                collect(child, rest, join(key), found);
            }
        }
        (toml::Value::Array(items), "*") => {
            for (index, child) in items.iter().enumerate() {
                let name = child
                    .get("name")
                    .and_then(toml::Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| index.to_string());
                collect(child, rest, join(&name), found);
            }
        }
        (toml::Value::Table(table), key) => {
            if let Some(child) = table.get(key) {
                collect(child, rest, join(key), found);
            }
        }
        _ => {}
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
        let new = "# tuned\n[proxy]\nmax_queue_len = 20\n[proxy.aliases]\n\"claude-*\" = \"x\"\n[worker.model_map.x]\nllama_server = \"/opt/ls\"\nidle_timeout_secs = 60\nvram_mb = 100\n";
        assert!(changed(old, new).is_empty(), "{:?}", changed(old, new));
    }

    #[test]
    fn upstreams_are_compared_by_name_and_removal_counts() {
        let old = "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"https://api.example\"\n";
        let moved = "[[proxy.upstreams]]\nname = \"b\"\nbase_url = \"https://x\"\n[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"https://api.example\"\n";
        assert_eq!(changed(old, moved), ["proxy.upstreams.b.base_url"]);
        assert_eq!(changed(old, ""), ["proxy.upstreams.a.base_url"]);
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
    fn more_backend_routes_for_a_proxy_to_reach_are_guarded() {
        let new = "[worker]\nextra_routes = [\"/api/pull\"]\n";
        assert_eq!(changed("", new), ["worker.extra_routes"]);
    }

    #[test]
    fn unparsable_text_counts_as_empty() {
        assert!(changed("not = [toml", "").is_empty());
    }
}
