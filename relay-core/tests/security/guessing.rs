//! Tokens cannot be guessed at network speed (issue 25): one failure limiter counts wrong
//! credentials of every kind from an address — the control API's admin token, `/metrics`'
//! bearer token, `/admin`'s, client API keys — so three wrong ones lock that address out
//! everywhere (429, or `/admin`'s published 403), even with the right token, until the lockout
//! ends. An address holding a live authenticated worker stays open to workers.

use crate::binary::*;

const TOKEN: &str = "the-right-admin-token-0123456789";

fn with_token(token: &str) -> String {
    format!("Bearer {token}")
}

fn status_with(url: &str, path: &str, token: &str) -> u16 {
    let bearer = with_token(token);
    exchange(
        "GET",
        &format!("{url}{path}"),
        &[("authorization", &bearer)],
        None,
    )
    .status
}

#[test]
fn three_wrong_tokens_anywhere_lock_the_address_out_of_every_credential_check() {
    let backend = model_server("127.0.0.1", "ok");
    let data = TempDir::new("guessing");
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("MODELRELAY_ADMIN_TOKEN", TOKEN);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let secret = std::fs::read_to_string(data.path().join("worker-secret")).expect("secret");
    let worker = |name: &str, dir: &TempDir| {
        let mut command = headless_worker(dir.path(), &url, &secret, backend);
        command.args(["--worker-name", name]);
        Running::spawn(command)
    };
    let first_dir = TempDir::new("guessing-w1");
    let first = worker("box-1", &first_dir);
    eventually("the first worker joins", &first, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });

    // Guesses on the control API and on /metrics: ordinary refusals, counted together.
    assert_eq!(status_with(&url, "/api/status", "guess-1"), 401);
    assert_eq!(status_with(&url, "/metrics", "guess-2"), 401);
    assert_eq!(status_with(&url, "/api/status", "guess-3"), 401);
    // Now the address waits, whatever it presents and wherever.
    assert_eq!(status_with(&url, "/api/status", TOKEN), 429);
    assert_eq!(status_with(&url, "/metrics", TOKEN), 429);
    assert_eq!(status_with(&url, "/api/keys", TOKEN), 429);
    let admin = exchange(
        "GET",
        &format!("{url}/admin/stats"),
        &[("authorization", &with_token(TOKEN))],
        None,
    );
    assert_eq!(admin.status, 403, "{admin:?}");
    assert!(admin.body.contains("admin_locked_out"), "{admin:?}");
    // A request with no credential is not a guess: the page and /health still answer.
    assert_eq!(http("GET", &format!("{url}/health"), None).0, 200);

    // The house's workers are not cut off: the live one stays, and another joins from the
    // same address.
    let second_dir = TempDir::new("guessing-w2");
    let second = worker("box-2", &second_dir);
    eventually("a second worker joins despite the lockout", &second, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 2
    });
    drop(second);
    drop(first);
    proxy.terminate_cleanly();
}
