//! Zero-configuration discovery adopts only what the box's owner runs (issue "Trust, round
//! 2"): another local user's server on a lower well-known port, listing the same model, gets
//! no prompt — not as the first server found, not as the fallback for names nobody lists —
//! until the owner confirms it on the dashboard.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binary::*;

/// A model server listing `m1` and answering "from the attacker", run as user `nobody`; it
/// prints `PROMPT` for every request it is sent. (The system Python: a user-installed one, as
/// on this machine under /root, is out of `nobody`'s reach.)
const ATTACKER: &str = r#"
import http.server, json, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer({"object": "list", "data": [{"id": "m1", "object": "model", "owned_by": "attacker"}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        print("PROMPT", flush=True)
        self.answer({"id": "x", "object": "chat.completion", "model": "m1", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "from the attacker"}, "finish_reason": "stop"}]})
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"#;

/// The attacker's server, killed on drop.
struct Attacker {
    child: std::process::Child,
    prompts: Arc<Mutex<usize>>,
}

impl Attacker {
    /// Starts it as `nobody` on a free port below `below` (discovery tries lower ports first).
    fn start(below: u16) -> (Attacker, u16) {
        let port = (below.saturating_sub(400)..below)
            .rev()
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free port below the owner's");
        let mut child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
            ])
            .arg(ATTACKER)
            .arg(port.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the attacker's server starts");
        let prompts = Arc::new(Mutex::new(0));
        let counter = prompts.clone();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "PROMPT" {
                    *counter.lock().unwrap() += 1;
                }
            }
        });
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the attacker's server never listened"
            );
            thread::sleep(Duration::from_millis(50));
        }
        (Attacker { child, prompts }, port)
    }

    fn prompts(&self) -> usize {
        *self.prompts.lock().unwrap()
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ask(url: &str, model: &str) -> (u16, String) {
    http(
        "POST",
        &format!("{url}/v1/chat/completions"),
        Some(&format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"my secret plans"}}]}}"#
        )),
    )
}

#[test]
fn another_users_server_on_a_lower_port_gets_no_prompt_until_the_owner_confirms_it() {
    let owners_port = model_server("127.0.0.1", "from the owner");
    let (attacker, attackers_port) = Attacker::start(owners_port);
    let attackers_url = format!("http://127.0.0.1:{attackers_port}");

    let data = TempDir::new("discovery-owner");
    let config = data.path().join("config.toml");
    std::fs::write(&config, "[proxy]\nqueue_timeout_secs = 2\n").unwrap();
    let mut command = modelrelay(data.path());
    command
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env(
            "MODELRELAY_DISCOVERY_PORTS",
            format!("{attackers_port},{owners_port}"),
        );
    let mut relay = Running::spawn(command);
    let url = relay.relay_url();
    eventually("the node's worker serves m1", &relay, || {
        get_json(&format!("{url}/api/status"))["models"]
            .as_array()
            .is_some_and(|models| models.iter().any(|m| m["name"] == "m1"))
    });

    for _ in 0..5 {
        let (status, body) = ask(&url, "m1");
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("from the owner"), "{body}");
    }
    // A name nobody lists is not handed to the first server found either.
    let (status, body) = ask(&url, "some-other-model");
    assert_ne!(status, 200, "{body}");
    assert_eq!(attacker.prompts(), 0, "the attacker's server got a prompt");

    // The dashboard shows it, whose it is, and that it is not used.
    let found = owner_get_json(&format!("{url}/api/discovery"), data.path());
    let listed = found["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["url"] == attackers_url.as_str())
        .unwrap_or_else(|| panic!("{found}"))
        .clone();
    assert_eq!(listed["owner"]["user"], "other_user", "{listed}");
    assert_eq!(listed["owner"]["uid"], 65534, "{listed}");
    assert_eq!(listed["usable"], false, "{listed}");
    let own = found["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["url"] == format!("http://127.0.0.1:{owners_port}").as_str())
        .unwrap_or_else(|| panic!("{found}"))
        .clone();
    assert_eq!(own["owner"]["user"], "this_user", "{own}");

    // Another local process cannot confirm it.
    let body = format!(r#"{{"worker":{{"confirmed_backends":["{attackers_url}"]}}}}"#);
    let (status, _) = http("PUT", &format!("{url}/api/settings"), Some(&body));
    assert_eq!(status, 401);
    assert!(!std::fs::read_to_string(&config)
        .unwrap()
        .contains("confirmed_backends"));

    // The owner confirms it: from then on it is used like the owner's own.
    let (status, saved) = owner_http(
        "PUT",
        &format!("{url}/api/settings"),
        data.path(),
        Some(&body),
    );
    assert_eq!(status, 200, "{saved}");
    let found: Value = owner_get_json(&format!("{url}/api/discovery"), data.path());
    let listed = found["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["url"] == attackers_url.as_str())
        .cloned()
        .unwrap();
    assert_eq!(
        (listed["confirmed"].as_bool(), listed["usable"].as_bool()),
        (Some(true), Some(true)),
        "{listed}"
    );
    eventually("the confirmed server serves m1", &relay, || {
        ask(&url, "m1").1.contains("from the attacker")
    });
    relay.terminate_cleanly();
}
