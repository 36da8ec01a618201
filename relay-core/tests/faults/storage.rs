//! Day two (issue 28): the proxy's storage gives out under it — its disk fills up, or its data
//! directory is read-only (a full root partition, a container's read-only volume, a mistaken
//! mount). The relay keeps serving and checking client keys from memory, says so on the dashboard
//! and in `/metrics`, counts every usage record it could not store, and heals by itself when
//! space comes back; with keys required and no key store it can read, it does not start.
//!
//! The proxy runs in a mount namespace of its own (`unshare -m`), where a small tmpfs or a
//! read-only bind mount covers its data directory: nothing is mounted on the machine itself, and
//! the mounts go away with the process. The test reaches the proxy's view of the directory
//! through `/proc/PID/root`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::binary::{unused_port, Running, TempDir};
use super::support::MockBackend;
use super::*;

/// `command` run in a new mount namespace after `setup` (a shell line; `$DATA` is `data`).
fn in_mount_namespace(command: Command, setup: &str, data: &Path) -> Command {
    let mut wrapped = Command::new("unshare");
    wrapped
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!("set -e; {setup}; exec \"$@\""))
        .arg("sh")
        .arg(command.get_program())
        .args(command.get_args())
        .env("DATA", data);
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(name, value),
            None => wrapped.env_remove(name),
        };
    }
    wrapped
}

/// The proxy's data directory as the proxy (in its own mount namespace) sees it.
fn seen_by(proxy: &Running, data: &Path) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root", proxy.child.id())).join(data.strip_prefix("/").unwrap())
}

/// `/api/status`'s `storage`.
async fn storage(url: &str) -> Value {
    admin_json(url, "/api/status").await["storage"].clone()
}

/// `POST /api/keys`: the status and the answer.
async fn make_key(url: &str, name: &str) -> (u16, Value) {
    let answer = inprocess::http()
        .post(format!("{url}/api/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(json!({ "name": name }).to_string())
        .send()
        .await
        .expect("POST /api/keys");
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// One chat request with the client key `key`; how it ended.
async fn call_with_key(url: &str, key: &str) -> Outcome {
    let answer = inprocess::http()
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(json!({"model": "m", "messages": [], "mock": {"delay_ms": 0}}).to_string())
        .send();
    match tokio::time::timeout(BOUND, answer).await {
        Err(_) => Outcome::Hung,
        Ok(Err(error)) => Outcome::Lost(format!("send: {error}")),
        Ok(Ok(answer)) => {
            let status = answer.status().as_u16();
            let text = answer.text().await.unwrap_or_default();
            classify(false, status, &text)
        }
    }
}

/// The usage records' request count (`/api/usage`).
async fn stored_requests(url: &str) -> u64 {
    admin_json(url, "/api/usage").await["totals"]["requests"]
        .as_u64()
        .unwrap_or(0)
}

/// A `/metrics` sample's value.
async fn metric(url: &str, name: &str) -> Option<f64> {
    let text = inprocess::http()
        .get(format!("{url}/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
}

/// Fills the filesystem holding `dir` with a file `filler` until it refuses more; the bytes
/// written.
fn fill(dir: &Path) -> u64 {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("filler")).expect("create the filler");
    let block = vec![0x5a_u8; 64 * 1024];
    let mut written = 0;
    loop {
        match file.write(&block) {
            Ok(0) | Err(_) => break,
            Ok(n) => written += n as u64,
        }
    }
    let _ = file.flush();
    written
}

/// Requests with `key` until `storage.writable` is `want` or `bound` passes: the answered count
/// and whether it turned.
async fn traffic_until_writable_is(
    url: &str,
    key: &str,
    want: bool,
    bound: Duration,
) -> (Tally, bool) {
    let mut tally = Tally::default();
    let started = Instant::now();
    while started.elapsed() < bound {
        for _ in 0..20 {
            tally.outcomes.push(call_with_key(url, key).await);
        }
        // The usage writer stores every 500 ms: its outcome shows soon after.
        tokio::time::sleep(Duration::from_millis(600)).await;
        if storage(url).await["writable"].as_bool() == Some(want) {
            return (tally, true);
        }
    }
    (tally, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_keeps_serving_counts_what_it_could_not_store_and_heals() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-full-disk");
    let listen = format!("127.0.0.1:{}", unused_port());
    let command = proxy_command(&data, &listen, &[("MODELRELAY_REQUIRE_API_KEYS", "true")]);
    // 4 MB: room for the database, then filled by the test.
    let setup = "mount -t tmpfs -o size=4m,mode=0700 modelrelay-full-disk \"$DATA\"";
    let (proxy, url) = spawn_proxy(in_mount_namespace(command, setup, data.path()));
    let _worker = start_worker(&data, "a", &url, &backend.url(), &[]);
    wait_for_workers(&url, 1).await;
    let (status, made) = make_key(&url, "before").await;
    assert_eq!(status, 201, "{made}");
    let key = made["key"]
        .as_str()
        .expect("the new key's secret")
        .to_string();
    assert_eq!(call_with_key(&url, &key).await, Outcome::Answered);
    assert_eq!(storage(&url).await["writable"], true);

    let dir = seen_by(&proxy, data.path());
    let filled = fill(&dir);
    assert!(filled > 0, "the tmpfs took some bytes before it was full");
    let (mut tally, turned) =
        traffic_until_writable_is(&url, &key, false, Duration::from_secs(60)).await;
    assert!(turned, "the full disk was never noticed");
    let full = storage(&url).await;
    println!("faults full_disk: storage while full: {full}");
    let problem = full["problem"].as_str().unwrap_or_default();
    assert!(
        problem.contains("full") && problem.contains("free"),
        "{full}"
    );
    assert!(
        full["usage_records_not_stored"].as_u64() > Some(0),
        "{full}"
    );
    assert_eq!(metric(&url, "modelrelay_storage_writable").await, Some(0.0));
    // Keys keep guarding it from memory; changing them says why it cannot.
    assert_eq!(call_with_key(&url, &key).await, Outcome::Answered);
    tally.outcomes.push(Outcome::Answered);
    let stranger = call_with_key(&url, "mr-not-a-key-0000000000000000").await;
    assert_eq!(
        stranger,
        Outcome::CleanError(401),
        "an unknown key is refused"
    );
    let (status, refused) = make_key(&url, "while-full").await;
    assert_eq!(status, 503, "{refused}");
    assert!(refused.to_string().contains("full"), "{refused}");

    // Space comes back: writes resume by themselves, the dashboard clears.
    std::fs::remove_file(dir.join("filler")).expect("remove the filler");
    let (after, healed) =
        traffic_until_writable_is(&url, &key, true, Duration::from_secs(30)).await;
    assert!(healed, "writes never resumed: {}", storage(&url).await);
    tally.outcomes.extend(after.outcomes);
    let (status, made) = make_key(&url, "after").await;
    assert_eq!(status, 201, "{made}");
    let key_after = made["key"].as_str().expect("a secret").to_string();
    assert_eq!(call_with_key(&url, &key_after).await, Outcome::Answered);
    tally.outcomes.push(Outcome::Answered);

    // Every answered request is either in the usage records or counted as not stored.
    let answered = tally.answered() as u64 + 1; // and the one before the disk filled
    let started = Instant::now();
    let (stored, not_stored) = loop {
        let stored = stored_requests(&url).await;
        let not_stored = storage(&url).await["usage_records_not_stored"]
            .as_u64()
            .unwrap_or(0);
        if stored + not_stored >= answered || started.elapsed() > Duration::from_secs(10) {
            break (stored, not_stored);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "faults full_disk: {answered} answered, {stored} in the usage records, {not_stored} \
         counted as not stored while the disk was full ({} MB filled)",
        filled / (1024 * 1024)
    );
    tally.report("full_disk", 0);
    assert_eq!(
        stored + not_stored,
        answered,
        "every answered request is stored or counted"
    );
}

/// A data directory made by a proxy that ran normally: a database with the key `kept` and the
/// revoked key `revoked` (their secrets), the proxy stopped with SIGTERM.
async fn data_dir_with_keys(data: &TempDir) -> (String, String) {
    let (mut proxy, url) = start_proxy(
        data,
        unused_port(),
        &[("MODELRELAY_REQUIRE_API_KEYS", "true")],
    );
    let (_, kept) = make_key(&url, "kept").await;
    let (_, revoked) = make_key(&url, "revoked").await;
    let id = revoked["id"].as_str().expect("an id");
    let gone = inprocess::http()
        .delete(format!("{url}/api/keys/{id}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("revoke");
    assert_eq!(gone.status().as_u16(), 200);
    assert!(proxy.terminate().success());
    (
        kept["key"].as_str().expect("secret").to_string(),
        revoked["key"].as_str().expect("secret").to_string(),
    )
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push((path.clone(), std::fs::read(&path).unwrap_or_default()));
            }
        }
    }
    files.sort();
    files
}

const READ_ONLY: &str = "mount --bind \"$DATA\" \"$DATA\"; mount -o remount,bind,ro \"$DATA\"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_data_dir_serves_with_the_keys_it_can_read_and_changes_nothing() {
    let backend = MockBackend::start(&["m"]).await;
    let data = TempDir::new("faults-read-only");
    let (kept, revoked) = data_dir_with_keys(&data).await;
    let before = snapshot(data.path());

    let listen = format!("127.0.0.1:{}", unused_port());
    let command = proxy_command(&data, &listen, &[("MODELRELAY_REQUIRE_API_KEYS", "true")]);
    let (mut proxy, url) = spawn_proxy(in_mount_namespace(command, READ_ONLY, data.path()));
    let workers = TempDir::new("faults-read-only-worker");
    let _worker = start_worker(&workers, "a", &url, &backend.url(), &[]);
    wait_for_workers(&url, 1).await;

    let mut tally = Tally::default();
    for _ in 0..10 {
        tally.outcomes.push(call_with_key(&url, &kept).await);
    }
    assert_eq!(tally.answered(), 10, "{:?}", tally.outcomes);
    assert_eq!(
        call_with_key(&url, &revoked).await,
        Outcome::CleanError(401),
        "a key revoked before stays revoked"
    );
    assert_eq!(
        call_with_key(&url, "mr-not-a-key-0000000000000000").await,
        Outcome::CleanError(401)
    );
    let (status, refused) = make_key(&url, "new").await;
    assert_eq!(status, 503, "{refused}");
    let shown = storage(&url).await;
    println!("faults read_only_data_dir: storage {shown}");
    assert_eq!(shown["writable"], false);
    assert!(
        shown["problem"]
            .as_str()
            .unwrap_or_default()
            .contains("read-only"),
        "{shown}"
    );
    // The answered requests' usage is counted as not stored once the writer has tried.
    let started = Instant::now();
    while storage(&url).await["usage_records_not_stored"].as_u64() < Some(10) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            storage(&url).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(proxy.terminate().success(), "{}", proxy.output());
    let log = proxy.output();
    assert!(log.contains("read-only"), "the log says so: {log}");
    tally.report("read_only_data_dir", 0);
    assert!(
        before == snapshot(data.path()),
        "nothing in the data directory changed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_data_dir_without_a_key_store_fails_closed_when_keys_are_required() {
    let data = TempDir::new("faults-read-only-empty");
    let listen = format!("127.0.0.1:{}", unused_port());

    // Keys required and no key store to read: it does not start, and says what to do.
    let command = proxy_command(&data, &listen, &[("MODELRELAY_REQUIRE_API_KEYS", "true")]);
    let mut refused = Running::spawn(in_mount_namespace(command, READ_ONLY, data.path()));
    let status = refused.wait_exit(Duration::from_secs(30));
    let said = refused.output();
    println!("faults read_only_data_dir (keys required, no key store): exit {status}\n{said}");
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("client API keys are required") && said.contains("--data-dir"),
        "{said}"
    );
    assert!(!said.contains("ModelRelay is serving"), "{said}");

    // Keys not required: it serves, keeping what it must in memory, and says so.
    let backend = MockBackend::start(&["m"]).await;
    let command = proxy_command(&data, &listen, &[]);
    let (_proxy, url) = spawn_proxy(in_mount_namespace(command, READ_ONLY, data.path()));
    let workers = TempDir::new("faults-read-only-empty-worker");
    let _worker = start_worker(&workers, "a", &url, &backend.url(), &[]);
    wait_for_workers(&url, 1).await;
    let answered = call(
        &inprocess::http(),
        &url,
        json!({"model": "m", "messages": []}),
    )
    .await;
    assert_eq!(answered, Outcome::Answered);
    let shown = storage(&url).await;
    assert_eq!(shown["writable"], false);
    assert!(
        shown["problem"]
            .as_str()
            .unwrap_or_default()
            .contains("memory"),
        "{shown}"
    );
    assert!(
        std::fs::read_dir(data.path()).unwrap().next().is_none(),
        "nothing was written into the read-only directory"
    );
}
