use std::time::Duration;

use super::*;
use crate::protocol::BRIDGE_PROTOCOL_VERSION;

fn proxy(file: &FileConfig, overrides: &Overrides) -> Result<ProxySettings, ConfigError> {
    ProxySettings::resolve(file, overrides)
}

fn proxy_of(text: &str) -> Result<ProxySettings, ConfigError> {
    proxy(&parse_file(text).unwrap(), &Overrides::default())
}

fn worker_of(text: &str) -> Result<WorkerSettings, ConfigError> {
    let file = parse_file(text).map_err(ConfigError::Invalid)?;
    WorkerSettings::resolve(&file, &Overrides::default())
}

#[test]
fn models_star_or_empty_means_ask_the_backend() {
    assert_eq!(parse_models("*"), None);
    assert_eq!(parse_models(""), None);
    assert_eq!(
        parse_models(" a, b ,,c"),
        Some(vec!["a".into(), "b".into(), "c".into()])
    );
}

#[test]
fn file_values_apply_and_overrides_win_over_them() {
    let file = parse_file(
        r#"
        log_level = "debug"
        [proxy]
        listen = "0.0.0.0:9000"
        max_queue_len = 7
        queue_timeout_secs = 12
        worker_secret = "from-file"
        [[proxy.providers]]
        name = "lab"
        worker_secret = "lab-secret"
        enabled = false
        [worker]
        proxy_url = "https://relay.example.com"
        models = ["a", "b"]
        max_concurrency = 2
        worker_secret = "worker-file"
        "#,
    )
    .unwrap();
    let settings = proxy(&file, &Overrides::default()).unwrap();
    assert_eq!(settings.limits.max_queue_len, 7);
    assert_eq!(settings.limits.queue_timeout, Duration::from_secs(12));
    assert_eq!(settings.extra_providers[0].name, "lab");
    assert!(!settings.extra_providers[0].limits.enabled);
    assert_eq!(
        settings.extra_providers[0].limits.max_queue_len, 7,
        "inherits the proxy-wide value"
    );
    assert_eq!(
        (settings.listen.as_str(), settings.listen_explicit),
        ("0.0.0.0:9000", true)
    );
    assert_eq!(settings.worker_secret.as_deref(), Some("from-file"));
    let overrides = Overrides {
        max_queue_len: Some(3),
        worker_secret: Some("from-flag".into()),
        ..Overrides::default()
    };
    let settings = proxy(&file, &overrides).unwrap();
    assert_eq!(settings.limits.max_queue_len, 3);
    assert_eq!(settings.worker_secret.as_deref(), Some("from-flag"));
    let worker = WorkerSettings::resolve(&file, &Overrides::default()).unwrap();
    assert_eq!(
        worker.proxy_url.as_deref(),
        Some("https://relay.example.com")
    );
    assert_eq!(worker.models, Some(vec!["a".to_string(), "b".to_string()]));
    assert_eq!(worker.max_concurrent, 2);
    assert_eq!(worker.worker_secret.as_deref(), Some("worker-file"));
    assert_eq!(
        worker.protocol_version.as_deref(),
        Some(BRIDGE_PROTOCOL_VERSION)
    );
    let worker = WorkerSettings::resolve(&file, &overrides).unwrap();
    assert_eq!(
        worker.worker_secret.as_deref(),
        Some("from-flag"),
        "the flag wins over the file, for a worker too"
    );
}

#[test]
fn defaults_match_the_documented_ones() {
    let file = FileConfig::default();
    let settings = proxy(&file, &Overrides::default()).unwrap();
    assert_eq!(settings.provider, "local");
    assert_eq!(settings.limits.max_queue_len, 100);
    assert_eq!(settings.limits.queue_timeout, Duration::from_secs(30));
    assert_eq!(settings.limits.request_timeout, Duration::from_secs(300));
    assert_eq!(settings.heartbeat_interval, Duration::from_secs(15));
    assert_eq!(settings.heartbeat_timeout, Duration::from_secs(45));
    assert_eq!(
        (settings.listen.as_str(), settings.listen_explicit),
        ("127.0.0.1:8080", false)
    );
    assert_eq!(settings.tls, TlsSetting::Off);
    assert_eq!(settings.worker_secret, None);
    assert!(!settings.metrics_public, "/metrics is guarded like /api");
    let worker = WorkerSettings::resolve(&file, &Overrides::default()).unwrap();
    assert_eq!(worker.proxy_url, None, "the caller's default applies");
    assert_eq!(worker.backend_urls, None);
    assert_eq!(worker.max_concurrent, 4);
    assert_eq!(worker.provider, "local");
    assert_eq!(worker.model_refresh_interval, Duration::from_secs(30));
}

#[test]
fn metrics_public_comes_from_the_override_over_the_file() {
    let file = parse_file("[proxy]\nmetrics_public = true\n").unwrap();
    assert!(proxy(&file, &Overrides::default()).unwrap().metrics_public);
    let closed = Overrides {
        metrics_public: Some(false),
        ..Overrides::default()
    };
    assert!(!proxy(&file, &closed).unwrap().metrics_public);
}

#[test]
fn cost_routing_is_on_unless_the_file_or_an_override_turns_it_off() {
    let defaults = FileConfig::default();
    assert!(
        proxy(&defaults, &Overrides::default())
            .unwrap()
            .cost_routing
    );
    let file = parse_file("[proxy]\ncost_routing = false\n").unwrap();
    assert!(!proxy(&file, &Overrides::default()).unwrap().cost_routing);
    let on = Overrides {
        cost_routing: Some(true),
        ..Overrides::default()
    };
    assert!(proxy(&file, &on).unwrap().cost_routing, "the override wins");
}

#[test]
fn unknown_keys_and_bad_values_are_reported_with_their_location() {
    let error = parse_file("[proxy]\nlisten_addr = \"x\"\n").unwrap_err();
    assert!(error.contains("listen_addr"), "{error}");
    let error = parse_file("[proxy]\nmax_queue_len = \"many\"\n").unwrap_err();
    assert!(error.contains("max_queue_len"), "{error}");
}

#[test]
fn inconsistent_values_are_rejected_with_the_setting_named() {
    let overrides = Overrides {
        queue_timeout_secs: Some(0),
        ..Overrides::default()
    };
    let error = proxy(&FileConfig::default(), &overrides).unwrap_err();
    assert!(error.to_string().contains("QUEUE_TIMEOUT_SECS"));
    let error =
        proxy_of("[[proxy.providers]]\nname = \"local\"\nworker_secret = \"x\"\n").unwrap_err();
    assert!(error.to_string().contains("twice"));
    let error = proxy_of("[proxy]\nheartbeat_interval_secs = 10\nheartbeat_timeout_secs = 5\n")
        .unwrap_err();
    assert!(error.to_string().contains("HEARTBEAT_TIMEOUT_SECS"));
    let error = proxy_of("[proxy]\nmax_workers = 0\n").unwrap_err();
    assert!(error.to_string().contains("max_workers"));
    assert_eq!(
        proxy_of("[proxy]\nmax_workers = 9\n").unwrap().max_workers,
        9
    );
    let error = worker_of("[worker]\nproxy_silence_timeout_secs = 0\n").unwrap_err();
    assert!(error.to_string().contains("PROXY_SILENCE_TIMEOUT_SECS"));
    let quiet = worker_of("[worker]\nproxy_silence_timeout_secs = 9\n").unwrap();
    assert_eq!(quiet.proxy_silence_timeout, Duration::from_secs(9));
    let error = worker_of("[worker]\nmax_concurrency = 0\n").unwrap_err();
    assert!(error.to_string().contains("MAX_CONCURRENCY"));
}

#[test]
fn a_worker_model_map_resolves_to_a_lifecycle_config() {
    let worker = worker_of(
        r#"
        [worker.lifecycle]
        max_loaded_models = 2
        session_restart = true
        [worker.model_map."qwen2.5:7b"]
        llama_server = "/opt/llama-server"
        model_file = "/models/q.gguf"
        idle_timeout_secs = 60
        "#,
    )
    .unwrap();
    let lifecycle = worker
        .lifecycle
        .expect("a model map gives a lifecycle config");
    assert_eq!(lifecycle.model_names(), ["qwen2.5:7b"]);
    assert_eq!(lifecycle.max_loaded_models, Some(2));
    assert!(lifecycle.session_restart);
    let without_map = worker_of("[worker.lifecycle]\nmax_loaded_models = 2\n").unwrap();
    assert!(
        without_map.lifecycle.is_none(),
        "no model map, no lifecycle"
    );
    let with_backends = worker_of("[worker]\nbackend_url = \"http://b:1/, http://c:2\"\n").unwrap();
    assert_eq!(
        with_backends.backend_urls,
        Some(vec!["http://b:1".to_string(), "http://c:2".to_string()])
    );
}

#[test]
fn an_invalid_model_map_is_rejected_with_the_entry_named() {
    let error = worker_of("[worker.model_map.m]\nllama_server = \"x\"\n").unwrap_err();
    assert!(error.to_string().contains("needs a model_file"), "{error}");
    let error = worker_of("[worker.model_map.m]\nstart_script = \"s\"\nbogus = 1\n").unwrap_err();
    assert!(error.to_string().contains("bogus"), "{error}");
}

#[test]
fn responses_store_bounds_come_from_the_proxy_section() {
    let defaults = proxy_of("").unwrap().responses_store;
    assert_eq!(defaults.ttl, Duration::from_secs(3600));
    assert_eq!((defaults.max_entries, defaults.max_bytes), (1000, 64 << 20));
    let limits = proxy_of(
        "[proxy]\nresponses_store_ttl_secs = 60\nresponses_store_max_entries = 5\nresponses_store_max_bytes = 1024\n",
    )
    .unwrap()
    .responses_store;
    assert_eq!(limits.ttl, Duration::from_secs(60));
    assert_eq!((limits.max_entries, limits.max_bytes), (5, 1024));
}

#[test]
fn native_route_overrides_come_from_the_worker_section() {
    let worker = worker_of("[worker]\nnative_messages = false\n").unwrap();
    assert_eq!(worker.native_routes.messages, Some(false));
    assert_eq!(worker.native_routes.responses, None, "absent means probe");
}

#[test]
fn model_aliases_and_the_default_model_come_from_the_proxy_section() {
    let settings =
        proxy_of("[proxy]\ndefault_model = \"qwen\"\n[proxy.aliases]\n\"claude-*\" = \"coder\"\n")
            .unwrap();
    assert_eq!(settings.aliases["claude-*"], "coder");
    assert_eq!(settings.default_model.as_deref(), Some("qwen"));
    let error = proxy_of("[proxy.aliases]\nx = \"\"\n").unwrap_err();
    assert!(error.to_string().contains("empty model name"), "{error}");
}

#[test]
fn tls_comes_from_overrides_over_the_file_and_conflicts_are_named() {
    let tls = |file: &FileConfig, overrides: &Overrides| proxy(file, overrides).map(|s| s.tls);
    let none = FileConfig::default();
    let no_overrides = Overrides::default();
    assert_eq!(tls(&none, &no_overrides).unwrap(), TlsSetting::Off);
    let file = parse_file("[proxy]\ntls = \"self-signed\"\n").unwrap();
    assert_eq!(tls(&file, &no_overrides).unwrap(), TlsSetting::SelfSigned);
    let files = Overrides {
        tls_cert: Some("c.pem".into()),
        tls_key: Some("k.pem".into()),
        ..Overrides::default()
    };
    assert_eq!(
        tls(&file, &files).unwrap(),
        TlsSetting::Files {
            cert: "c.pem".into(),
            key: "k.pem".into()
        },
        "overrides win over the file"
    );
    let off = Overrides {
        tls: Some(TlsMode::Off),
        ..Overrides::default()
    };
    assert_eq!(tls(&file, &off).unwrap(), TlsSetting::Off);
    let both = Overrides {
        tls: Some(TlsMode::SelfSigned),
        ..files.clone()
    };
    let error = tls(&none, &both).unwrap_err().to_string();
    assert!(error.contains("not both"), "{error}");
    let cert_only = Overrides {
        tls_cert: Some("c.pem".into()),
        ..Overrides::default()
    };
    let error = tls(&none, &cert_only).unwrap_err().to_string();
    assert!(error.contains("TLS_KEY"), "{error}");
    let key_only = parse_file("[proxy]\ntls_key = \"k.pem\"\n").unwrap();
    let error = tls(&key_only, &no_overrides).unwrap_err().to_string();
    assert!(error.contains("[proxy] tls_cert"), "{error}");
    assert!(parse_file("[proxy]\ntls = \"maybe\"\n")
        .unwrap_err()
        .contains("self-signed"));
}

#[test]
fn the_worker_pin_comes_from_the_file_or_the_override() {
    let fingerprint = crate::fingerprint::Fingerprint::of_der(b"cert");
    let file = parse_file(&format!(
        "[worker]\nproxy_fingerprint = \"{fingerprint}\"\n"
    ))
    .unwrap();
    let worker = WorkerSettings::resolve(&file, &Overrides::default()).unwrap();
    assert_eq!(worker.proxy_fingerprint, Some(fingerprint));
    let other = crate::fingerprint::Fingerprint::of_der(b"other");
    let overrides = Overrides {
        proxy_fingerprint: Some(other),
        ..Overrides::default()
    };
    let worker = WorkerSettings::resolve(&file, &overrides).unwrap();
    assert_eq!(worker.proxy_fingerprint, Some(other));
    let error = parse_file("[worker]\nproxy_fingerprint = \"abc\"\n").unwrap_err();
    assert!(error.contains("64 hex digits"), "{error}");
}

#[test]
fn upstreams_are_read_checked_and_their_keys_found() {
    std::env::set_var("MODELRELAY_TEST_UPSTREAM_KEY", "sk-from-env");
    let text = r#"
        [proxy]
        fallback_upstream = "claude"
        [[proxy.upstreams]]
        name = "openai"
        base_url = "https://api.openai.com/"
        api_key_env = "MODELRELAY_TEST_UPSTREAM_KEY"
        models = ["gpt-*"]
        [[proxy.upstreams]]
        name = "claude"
        kind = "anthropic"
        base_url = "https://api.anthropic.com"
        api_key = "sk-ant-inline"
        "#;
    let settings = proxy_of(text).unwrap();
    assert_eq!(settings.upstreams.len(), 2);
    assert_eq!(settings.upstreams[0].base_url, "https://api.openai.com");
    assert_eq!(
        settings.upstreams[0].api_key.as_deref(),
        Some("sk-from-env")
    );
    assert_eq!(settings.upstreams[1].kind, UpstreamKind::Anthropic);
    assert_eq!(settings.fallback_upstream.as_deref(), Some("claude"));
    let file = parse_file(text).unwrap();
    assert!(
        !format!("{:?} {file:?}", settings.upstreams).contains("sk-"),
        "keys are redacted"
    );

    let bad = [
        ("[proxy]\nfallback_upstream = \"x\"\n", "names no"),
        (
            "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"api.x.com\"\n",
            "must start with http",
        ),
        (
            "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"http://x\"\napi_key_env = \"MODELRELAY_TEST_UNSET_VAR\"\n",
            "not set",
        ),
        (
            "[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"http://x\"\n[[proxy.upstreams]]\nname = \"a\"\nbase_url = \"http://y\"\n",
            "a name of its own",
        ),
    ];
    for (text, expected) in bad {
        let error = proxy_of(text).unwrap_err();
        assert!(error.to_string().contains(expected), "{text}: {error}");
    }
}

#[test]
fn sleeping_box_settings_come_from_overrides_over_the_file_and_bad_values_are_named() {
    let settings = proxy_of("").unwrap();
    assert_eq!(settings.wake_target, "255.255.255.255:9".parse().unwrap());
    assert_eq!(settings.sleepers, SleeperLimits::default());
    assert_eq!(
        settings.sleepers.remember,
        Duration::from_secs(7 * 24 * 3600)
    );
    let file = parse_file(
        r#"
        [proxy]
        wake_target = "192.168.1.255:9"
        sleepers_remembered_secs = 3600
        max_sleepers = 5
        wake_retry_secs = 3
        [worker]
        sleeps_when_idle = true
        mac_address = "3C-7C-3F-1E-22-90"
        "#,
    )
    .unwrap();
    let settings = proxy(&file, &Overrides::default()).unwrap();
    assert_eq!(settings.wake_target, "192.168.1.255:9".parse().unwrap());
    assert_eq!(settings.sleepers.remember, Duration::from_secs(3600));
    assert_eq!(settings.sleepers.max_boxes, 5);
    assert_eq!(settings.sleepers.retry, Duration::from_secs(3));
    let overrides = Overrides {
        wake_target: Some("127.0.0.1:4009".into()),
        sleepers_remembered_secs: Some(60),
        sleeps_when_idle: Some(false),
        mac_address: Some("02:00:00:00:00:01".into()),
        ..Overrides::default()
    };
    let settings = proxy(&file, &overrides).unwrap();
    assert_eq!(settings.wake_target, "127.0.0.1:4009".parse().unwrap());
    assert_eq!(settings.sleepers.remember, Duration::from_secs(60));
    let worker = WorkerSettings::resolve(&file, &Overrides::default()).unwrap();
    assert!(worker.sleeps_when_idle);
    assert_eq!(worker.mac_address.unwrap().to_string(), "3c:7c:3f:1e:22:90");
    let worker = WorkerSettings::resolve(&file, &overrides).unwrap();
    assert!(!worker.sleeps_when_idle);
    assert_eq!(worker.mac_address.unwrap().to_string(), "02:00:00:00:00:01");
    assert!(!worker_of("").unwrap().sleeps_when_idle);
}

#[test]
fn slot_hints_are_on_unless_the_file_or_an_override_turns_them_off() {
    assert!(worker_of("").unwrap().slot_hints);
    let off = parse_file("[worker]\nslot_hints = false\n").unwrap();
    assert!(
        !WorkerSettings::resolve(&off, &Overrides::default())
            .unwrap()
            .slot_hints
    );
    let on_again = Overrides {
        slot_hints: Some(true),
        ..Overrides::default()
    };
    assert!(WorkerSettings::resolve(&off, &on_again).unwrap().slot_hints);

    for (text, named) in [
        ("[proxy]\nwake_target = \"broadcast\"", "wake_target"),
        ("[proxy]\nwake_target = \"host.lan:9\"", "wake_target"),
        ("[proxy]\nwake_retry_secs = 0", "wake_retry_secs"),
    ] {
        let error = proxy_of(text).unwrap_err().to_string();
        assert!(error.contains(named), "{text}: {error}");
    }
    let error = worker_of("[worker]\nmac_address = \"ff:ff:ff:ff:ff:ff\"")
        .unwrap_err()
        .to_string();
    assert!(error.contains("mac_address"), "{error}");
}
