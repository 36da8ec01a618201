//! Day two for cost routing, with the real binary (issue 29): a proxy restarted the ways a home
//! restarts it — killed outright (a power cut, `kill -9`) and stopped with SIGTERM (an upgrade,
//! a reboot) — knows the speed of a box on another machine before that box answers again. The
//! box is a worker in a network namespace joined to this one by a veth pair; it comes back to
//! the proxy by itself after each restart. Needs root (the namespace); elsewhere the test says
//! why it is skipped.

#[path = "common/binary.rs"]
mod binary;
#[path = "common/netns.rs"]
mod netns;

use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;

use binary::*;
use netns::FarSide;

/// Prompt tokens in each answer's timings: above the least a speed is learnt from.
const PROMPT_TOKENS: u32 = 1000;

/// A llama-server stand-in on `ip`: lists `m1`, and answers each chat completion with
/// llama-server's `timings` of [`PROMPT_TOKENS`] evaluated at the prompt speed in `speed`
/// (tokens/s, read per answer). Counts the answers in `answered`. Its port.
fn timed_model_server(ip: &str, speed: Arc<AtomicU32>, answered: Arc<AtomicU32>) -> u16 {
    let listener = TcpListener::bind(format!("{ip}:0")).expect("bind the model server");
    let port = listener.local_addr().expect("its address").port();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let (speed, answered) = (speed.clone(), answered.clone());
            thread::spawn(move || {
                let Some(head) = read_request(&mut stream) else {
                    return;
                };
                if !head.starts_with("POST") {
                    write_json(&mut stream, M1_MODELS);
                    return;
                }
                let prompt_ms =
                    f64::from(PROMPT_TOKENS) * 1000.0 / f64::from(speed.load(Ordering::SeqCst));
                let answer = format!(
                    r#"{{"id":"chatcmpl-1","object":"chat.completion","model":"m1","choices":[{{"index":0,"message":{{"role":"assistant","content":"measured"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{PROMPT_TOKENS},"completion_tokens":20,"total_tokens":{}}},"timings":{{"prompt_n":{PROMPT_TOKENS},"prompt_ms":{prompt_ms:.1},"predicted_n":20,"predicted_ms":400.0}}}}"#,
                    PROMPT_TOKENS + 20
                );
                answered.fetch_add(1, Ordering::SeqCst);
                write_json(&mut stream, &answer);
            });
        }
    });
    port
}

/// The prompt speed on `m1` the proxy's dashboard shows for the box named `far-box`, once that
/// box is connected (`None`: connected, nothing known of its speed).
fn far_box_speed(url: &str, data: &Path, proxy: &Running) -> Option<f64> {
    let mut shown = None;
    eventually("the far box is connected to the proxy", proxy, || {
        let status = owner_get_json(&format!("{url}/api/status"), data);
        let workers = status["workers"].as_array().cloned().unwrap_or_default();
        match workers.iter().find(|w| w["name"] == "far-box") {
            Some(far) => {
                shown = Some(far["speeds"]["m1"]["prompt_tps"].as_f64());
                true
            }
            None => false,
        }
    });
    shown.expect("checked above")
}

/// One chat completion through the proxy at `url`, answered by the far box.
fn ask(url: &str) {
    let (code, answer) = http(
        "POST",
        &format!("{url}/v1/chat/completions"),
        Some(r#"{"model":"m1","messages":[{"role":"user","content":"measure me"}]}"#),
    );
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains("measured"), "{answer}");
}

/// The prompt speed the proxy's store holds for `far-box` (`None` until it is written).
fn stored_speed(data: &Path) -> Option<f64> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let setting =
            relay_core::store::DatabaseSetting::Sqlite(data.join(relay_core::paths::DATABASE_FILE));
        let db = relay_core::store::Database::open(&setting).await.ok()?;
        let boxes = relay_core::store::box_speeds::load(&db).await.ok()?;
        let far = boxes.into_iter().find(|b| b.name == "far-box")?;
        far.speeds.get("m1")?.prompt_tps
    })
}

#[test]
fn a_proxy_killed_or_stopped_knows_a_far_boxs_speed_before_the_box_answers_again() {
    let far = match FarSide::create("speed", 218) {
        Ok(far) => far,
        Err(why) => {
            println!("a restarted proxy's box speeds: skipped: {why}");
            return;
        }
    };
    let speed = Arc::new(AtomicU32::new(2000));
    let answered = Arc::new(AtomicU32::new(0));
    // The far box's model server; the far worker reaches it over the link.
    let backend = timed_model_server(&far.host_ip, speed.clone(), answered.clone());

    // The proxy on this machine, on every address, its store in its data directory.
    let proxy_data = TempDir::new("speeds-proxy");
    let port = unused_port();
    let proxy_command = || {
        let mut command = modelrelay(proxy_data.path());
        command
            .args(["serve", "--listen", &format!("0.0.0.0:{port}")])
            .env("WORKER_SECRET", "speed-secret");
        command
    };
    let start_proxy = || {
        let mut proxy = Running::spawn(proxy_command());
        proxy.wait_for_stdout_line("ModelRelay is serving at");
        proxy
    };
    let local = format!("http://127.0.0.1:{port}");
    let mut proxy = start_proxy();

    // The worker on the other machine, joined over the link.
    let worker_data = TempDir::new("speeds-far-worker");
    let mut inner = modelrelay(worker_data.path());
    inner.args([
        "worker",
        "--proxy-url",
        &format!("http://{}:{port}", far.host_ip),
        "--worker-secret",
        "speed-secret",
        "--backend-url",
        &format!("http://{}:{backend}", far.host_ip),
        "--models",
        "m1",
        "--worker-name",
        "far-box",
    ]);
    let worker = Running::spawn(far.command(&inner));
    assert_eq!(
        far_box_speed(&local, proxy_data.path(), &proxy),
        None,
        "a box not measured yet"
    );
    ask(&local);
    assert_eq!(
        far_box_speed(&local, proxy_data.path(), &proxy),
        Some(2000.0)
    );
    // A first measurement is stored at once: wait for it, then cut the power.
    eventually("the first measurement is stored", &proxy, || {
        stored_speed(proxy_data.path()) == Some(2000.0)
    });
    proxy.child.kill().expect("kill -9 the proxy");
    let _ = proxy.child.wait();

    // The proxy started again: once the far worker is back by itself, the box's speed is shown
    // before the box has answered anything more (`answered` answers so far).
    let restarted = |how: &str, speed: f64, answered_so_far: u32| {
        let proxy = start_proxy();
        assert_eq!(
            far_box_speed(&local, proxy_data.path(), &proxy),
            Some(speed),
            "after {how}: known once the box is back, before it answers again\n{}",
            worker.output()
        );
        assert_eq!(
            answered.load(Ordering::SeqCst),
            answered_so_far,
            "nothing answered since"
        );
        proxy
    };
    let mut proxy = restarted("kill -9", 2000.0, 1);

    // Two answers at half the speed: 1,700 then 1,490 tokens/s (a moving average). The second
    // comes within the store's write interval, so only the graceful stop writes it.
    speed.store(1000, Ordering::SeqCst);
    ask(&local);
    ask(&local);
    assert_eq!(
        far_box_speed(&local, proxy_data.path(), &proxy),
        Some(1490.0)
    );
    proxy.terminate_cleanly();

    // The latest measurement, kept by the graceful stop.
    let mut proxy = restarted("SIGTERM", 1490.0, 3);
    proxy.terminate_cleanly();
}
