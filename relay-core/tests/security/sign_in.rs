//! Loopback is not a login (issue "Trust, round 2"). Any local process — another user, a
//! container, a sandboxed app — reaches the node on 127.0.0.1 like its owner does. So from this
//! machine only the live status answers without a credential; secrets and changes need the
//! admin token or a dashboard session, which the owner gets without a manual token step: the
//! banner's one-time link on a terminal, `modelrelay dashboard`, the tray's *Open dashboard*.
//! Each test attacks the real binary and checks that nothing was revealed or changed.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::binary::*;
use crate::control_plane::{error_code, Relay};

/// Every route that reveals a secret or changes something, as another local process would try
/// it (no credential, the right Host, no Origin).
const GUARDED_ROUTES: &[(&str, &str, Option<&str>)] = &[
    ("GET", "/api/join-code", None),
    ("GET", "/api/settings", None),
    ("GET", "/api/keys", None),
    ("GET", "/api/usage", None),
    ("GET", "/api/discovery", None),
    ("GET", "/api/start-on-login", None),
    (
        "PUT",
        "/api/settings",
        Some(r#"{"proxy":{"max_queue_len":7}}"#),
    ),
    (
        "PUT",
        "/api/config",
        Some(r#"{"toml":"[proxy]\nmax_queue_len = 7\n"}"#),
    ),
    ("POST", "/api/keys", Some(r#"{"name":"mine"}"#)),
    (
        "POST",
        "/api/join",
        Some(r#"{"proxy_url":"http://127.0.0.1:1","secret":"x"}"#),
    ),
    (
        "POST",
        "/api/join/test",
        Some(r#"{"proxy_url":"http://127.0.0.1:1","secret":"x"}"#),
    ),
    ("POST", "/api/models/refresh", None),
    ("POST", "/api/worker/rejoin", None),
];

/// `modelrelay dashboard --print` for the relay whose data directory is `data`, run through
/// `wrap` (e.g. as another user); its exit status and output.
fn dashboard_link(data: &std::path::Path, wrap: &[&str]) -> (bool, String, String) {
    let template = modelrelay(data);
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(template.get_program());
            for (name, value) in template.get_envs() {
                match value {
                    Some(value) => command.env(name, value),
                    None => command.env_remove(name),
                };
            }
            command
        }
        None => template,
    };
    let output = command
        .args(["dashboard", "--print"])
        .output()
        .expect("modelrelay dashboard runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).trim().to_string(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The `name=value` part of a `Set-Cookie` header of `reply`.
fn session_cookie(reply: &Reply) -> String {
    let set_cookie = reply
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no cookie: {reply:?}"));
    set_cookie.split(';').next().unwrap().to_string()
}

#[test]
fn another_local_process_reads_the_live_status_and_nothing_else() {
    let relay = Relay::start(|_| {});
    let before = relay.config_bytes();
    let status = exchange("GET", &format!("{}/api/status", relay.url), &[], None);
    assert_eq!(status.status, 200, "{status:?}");
    // The page itself loads, so it can offer to sign in.
    let page = exchange("GET", &format!("{}/", relay.url), &[], None);
    assert_eq!(page.status, 200);
    for (method, path, body) in GUARDED_ROUTES {
        let reply = exchange(
            method,
            &format!("{}{path}", relay.url),
            &[("content-type", "application/json")],
            *body,
        );
        assert_eq!(reply.status, 401, "{method} {path}: {reply:?}");
        assert_eq!(error_code(&reply), "admin_token_required", "{path}");
        assert!(!reply.body.contains(&relay.secret()), "{path}: {reply:?}");
        assert!(!reply.body.contains(&relay.admin_token()), "{path}");
    }
    relay.assert_untouched(&before);
    let keys = exchange(
        "GET",
        &format!("{}/api/keys", relay.url),
        &[("Authorization", &relay.owner_auth())],
        None,
    );
    assert_eq!(keys.status, 200, "{keys:?}");
    let keys: Value = serde_json::from_str(&keys.body).unwrap();
    assert_eq!(keys["keys"], serde_json::json!([]), "no key was made");
}

#[test]
fn another_user_cannot_mint_a_login_link() {
    let relay = Relay::start(|_| {});
    // The owner's token file is theirs alone (0600), so another user's `modelrelay dashboard`
    // pointed at the same data directory has nothing to sign a link with.
    let (ok, link, said) = dashboard_link(
        relay.data_dir(),
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
    );
    assert!(!ok, "another user made a link: {link}");
    assert!(!link.contains("/login?code="), "{link}");
    assert!(said.contains("Permission denied"), "{said}");
    // The owner's works.
    let (ok, link, said) = dashboard_link(relay.data_dir(), &[]);
    assert!(ok, "{said}");
    assert!(
        link.starts_with(&format!("{}/login?code=", relay.url)),
        "{link}"
    );
}

#[test]
fn modelrelay_dashboard_signs_the_browser_in_once() {
    let relay = Relay::start(|_| {});
    let (ok, link, said) = dashboard_link(relay.data_dir(), &[]);
    assert!(ok, "{said}");
    // What a browser does with the link: one redirect to the dashboard, with the session.
    let signed_in = exchange("GET", &link, &[], None);
    assert_eq!(signed_in.status, 303, "{signed_in:?}");
    assert_eq!(signed_in.header("location").as_deref(), Some("/"));
    let set_cookie = signed_in.header("set-cookie").unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert_eq!(
        signed_in.header("cache-control").as_deref(),
        Some("no-store")
    );
    assert_eq!(
        signed_in.header("referrer-policy").as_deref(),
        Some("no-referrer")
    );
    let cookie = session_cookie(&signed_in);
    let join = exchange(
        "GET",
        &format!("{}/api/join-code", relay.url),
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(join.status, 200, "{join:?}");
    assert!(join.body.contains(&relay.secret()));
    // The session is a login: a change goes through.
    let saved = exchange(
        "PUT",
        &format!("{}/api/settings", relay.url),
        &[("Cookie", &cookie), ("content-type", "application/json")],
        Some(r#"{"proxy":{"max_queue_len":9}}"#),
    );
    assert_eq!(saved.status, 200, "{saved:?}");

    // A link works once; a copy (a shell history, a log) is spent.
    let again = exchange("GET", &link, &[], None);
    assert_eq!(again.status, 403, "{again:?}");
    assert!(again.header("set-cookie").is_none());
    assert!(
        again.body.contains("modelrelay dashboard"),
        "{}",
        again.body
    );
    // Signing out ends this browser's cookie.
    let out = exchange(
        "POST",
        &format!("{}/api/logout", relay.url),
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(out.status, 200);
    assert!(out
        .header("set-cookie")
        .is_some_and(|c| c.contains("Max-Age=0")));
}

#[test]
fn a_forged_link_or_cookie_gets_nothing_and_guessing_locks_the_address_out() {
    let relay = Relay::start(|_| {});
    let forged_cookie = format!("modelrelay_session_{}=AAAA", relay.port());
    let refused = exchange(
        "GET",
        &format!("{}/api/join-code", relay.url),
        &[("Cookie", &forged_cookie)],
        None,
    );
    assert_eq!(refused.status, 401, "{refused:?}");
    // A good link, made before the guessing (so the lockout window is not spent making it).
    let (ok, link, said) = dashboard_link(relay.data_dir(), &[]);
    assert!(ok, "{said}");
    for guess in [
        "nope",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "%00",
    ] {
        let reply = exchange(
            "GET",
            &format!("{}/login?code={guess}", relay.url),
            &[],
            None,
        );
        assert_eq!(reply.status, 403, "{guess}: {reply:?}");
        assert!(reply.header("set-cookie").is_none());
    }
    // Three wrong codes from one address: even a good link waits now.
    let locked = exchange("GET", &link, &[], None);
    assert_eq!(locked.status, 429, "{locked:?}");
    assert!(locked.header("set-cookie").is_none());
}

#[test]
fn the_sign_in_page_trades_the_token_for_a_session() {
    let relay = Relay::start(|_| {});
    let login = format!("{}/api/login", relay.url);
    let json = [("content-type", "application/json")];
    let wrong = exchange("POST", &login, &json, Some(r#"{"token":"not-it"}"#));
    assert_eq!(wrong.status, 401, "{wrong:?}");
    assert!(wrong.header("set-cookie").is_none());
    let body = serde_json::json!({ "token": relay.admin_token() }).to_string();
    let right = exchange("POST", &login, &json, Some(&body));
    assert_eq!(right.status, 200, "{right:?}");
    assert!(!right.body.contains(&relay.admin_token()));
    let cookie = session_cookie(&right);
    let settings = exchange(
        "GET",
        &format!("{}/api/settings", relay.url),
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(settings.status, 200, "{settings:?}");
    // A page elsewhere cannot post a token it guessed: the cross-site rule covers the route.
    let cross_site = exchange(
        "POST",
        &login,
        &[
            ("Origin", "http://evil.example"),
            ("content-type", "text/plain"),
        ],
        Some(&body),
    );
    assert_eq!(cross_site.status, 403, "{cross_site:?}");
    assert!(cross_site.header("set-cookie").is_none());
}

#[test]
fn the_banner_prints_a_one_time_link_on_a_terminal_only() {
    // Piped (journald, `docker logs`): no link, only how to get one.
    let mut piped = Relay::start(|_| {});
    let line = piped.running.wait_for_stdout_line("Dashboard:");
    assert!(!line.contains("code="), "{line}");
    assert!(line.contains("modelrelay dashboard"), "{line}");
    piped.running.terminate_cleanly();

    // On a terminal (script(1) gives it a pseudo-terminal): a link that signs in once.
    let data = TempDir::new("banner-tty");
    let template = modelrelay(data.path());
    let mut command = Command::new("script");
    command.args(["-qfec"]).arg(format!(
        "{} --listen 127.0.0.1:0 --config {}",
        template.get_program().to_string_lossy(),
        data.path().join("config.toml").display()
    ));
    command.arg("/dev/null");
    for (name, value) in template.get_envs() {
        match value {
            Some(value) => command.env(name, value),
            None => command.env_remove(name),
        };
    }
    command.stdin(std::process::Stdio::null());
    let mut on_tty = Running::spawn(command);
    let line = on_tty.wait_for_stdout_line("/login?code=");
    let link = line
        .split_whitespace()
        .find(|word| word.contains("/login?code="))
        .expect("a link")
        .to_string();
    let signed_in = exchange("GET", &link, &[], None);
    assert_eq!(signed_in.status, 303, "{signed_in:?}");
    assert!(signed_in.header("set-cookie").is_some());
    assert_eq!(exchange("GET", &link, &[], None).status, 403, "once");
    drop(on_tty);
    std::thread::sleep(Duration::from_millis(100));
}
