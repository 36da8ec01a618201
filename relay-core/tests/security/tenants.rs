//! A key is a tenant (issue 25): with client keys required, what one key stored in the
//! Responses store — the response and the prompt it was made from — is invisible to another
//! key: `GET`, `input_items`, `DELETE` and `previous_response_id` all answer 404, as if it did
//! not exist, and nothing is deleted. Real `modelrelay serve` and `modelrelay worker` binaries,
//! a chat-only model server (the worker's adapter makes the Responses answer).

use serde_json::Value;

use crate::binary::*;

const ADMIN_TOKEN: &str = "a-configured-admin-token-of-some-length";

fn create_key(url: &str, name: &str) -> String {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let reply = exchange(
        "POST",
        &format!("{url}/admin/keys"),
        &[
            ("authorization", &bearer),
            ("content-type", "application/json"),
        ],
        Some(&format!(r#"{{"name":"{name}"}}"#)),
    );
    assert_eq!(reply.status, 201, "{reply:?}");
    let body: Value = serde_json::from_str(&reply.body).expect("JSON");
    body["key"].as_str().expect("the new key").to_string()
}

fn with_key(bearer: &str) -> Vec<(&str, &str)> {
    vec![
        ("authorization", bearer),
        ("content-type", "application/json"),
    ]
}

#[test]
fn one_keys_stored_responses_are_invisible_to_another_key() {
    let backend = model_server("127.0.0.1", "the answer for tenant a");
    let data = TempDir::new("tenants");
    let mut command = modelrelay(data.path());
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--require-api-keys"])
        .env("MODELRELAY_ADMIN_TOKEN", ADMIN_TOKEN);
    let mut proxy = Running::spawn(command);
    let url = proxy.relay_url();
    let secret = std::fs::read_to_string(data.path().join("worker-secret")).expect("secret");
    let worker_data = TempDir::new("tenants-worker");
    // The model server speaks chat only: the worker's adapter answers the Responses API.
    let config = worker_data.path().join("config.toml");
    std::fs::write(&config, "[worker]\nnative_responses = false\n").expect("config");
    let mut command = headless_worker(worker_data.path(), &url, &secret, backend);
    command.arg("--config").arg(&config);
    let worker = Running::spawn(command);
    eventually("the worker joins", &worker, || {
        get_json(&format!("{url}/health"))["workers_connected"] == 1
    });
    let (a, b) = (create_key(&url, "tenant-a"), create_key(&url, "tenant-b"));
    let (bearer_a, bearer_b) = (format!("Bearer {a}"), format!("Bearer {b}"));

    let made = exchange(
        "POST",
        &format!("{url}/v1/responses"),
        &with_key(&bearer_a),
        Some(r#"{"model":"m1","input":"the private prompt of tenant a"}"#),
    );
    assert_eq!(made.status, 200, "{made:?}");
    let id = serde_json::from_str::<Value>(&made.body).expect("JSON")["id"]
        .as_str()
        .expect("an id")
        .to_string();

    // Tenant b: nothing there, whichever way it asks.
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("GET", format!("/v1/responses/{id}/input_items")),
        ("DELETE", format!("/v1/responses/{id}")),
    ] {
        let refused = exchange(method, &format!("{url}{path}"), &with_key(&bearer_b), None);
        assert_eq!(refused.status, 404, "{method} {path}: {refused:?}");
        assert!(!refused.body.contains("private prompt"), "{refused:?}");
    }
    let continued = exchange(
        "POST",
        &format!("{url}/v1/responses"),
        &with_key(&bearer_b),
        Some(&format!(
            r#"{{"model":"m1","input":"and then?","previous_response_id":"{id}"}}"#
        )),
    );
    assert_eq!(continued.status, 404, "{continued:?}");
    assert!(!continued.body.contains("private prompt"), "{continued:?}");

    // Tenant a still has all of it (b's DELETE deleted nothing), and may delete it.
    let items = exchange(
        "GET",
        &format!("{url}/v1/responses/{id}/input_items"),
        &with_key(&bearer_a),
        None,
    );
    assert_eq!(items.status, 200, "{items:?}");
    assert!(
        items.body.contains("the private prompt of tenant a"),
        "{items:?}"
    );
    let deleted = exchange(
        "DELETE",
        &format!("{url}/v1/responses/{id}"),
        &with_key(&bearer_a),
        None,
    );
    assert_eq!(deleted.status, 200, "{deleted:?}");
    proxy.terminate_cleanly();
}
