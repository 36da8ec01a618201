//! The worker's own backend client against raw TCP backends: what it puts on the wire, how it
//! reads every body framing, when it reuses a connection, and how a burst connects.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::*;
use crate::backend::testing::read_request;

const REUSE: Duration = Duration::from_secs(4);

fn local() -> HttpClient {
    HttpClient::Local {
        local: LocalClient::new(64, REUSE),
        general: reqwest::Client::new(),
    }
}

/// A backend on 127.0.0.1:0 whose connections each run `answer(connection number)`, which
/// reads requests and writes whatever it likes. Its address and the connections accepted.
async fn raw_backend<F, Fut>(answer: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(usize, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            // Each write its own segment, as a server flushing each event does.
            socket.set_nodelay(true).unwrap();
            let number = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(number, socket));
        }
    });
    (address, accepted)
}

/// Answers every request on a connection with `answer`, keeping it open.
async fn answer_each(mut socket: TcpStream, answer: &'static [u8]) {
    while read_request(&mut socket).await {
        if socket.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// A backend that reads one request per connection, writes `answer` and closes it.
async fn answer_once(answer: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    raw_backend(move |_, mut socket| async move {
        read_request(&mut socket).await;
        let _ = socket.write_all(answer).await;
    })
    .await
}

async fn post(client: &HttpClient, address: &str) -> Result<Response, HttpError> {
    let url = reqwest::Url::parse(&format!("http://{address}/v1/chat/completions")).unwrap();
    client
        .post(url, &WireHeaders::new(), Bytes::from_static(b"{}"))
        .await
}

async fn pieces(mut response: Response) -> Result<Vec<Vec<u8>>, HttpError> {
    let mut pieces = Vec::new();
    while let Some(piece) = response.chunk().await {
        pieces.push(piece?.to_vec());
    }
    Ok(pieces)
}

#[tokio::test]
async fn the_request_on_the_wire_is_a_post_with_host_length_and_the_callers_headers() {
    let (sent, mut seen) = watch::channel(Vec::new());
    let sent = Arc::new(sent);
    let (address, _) = raw_backend(move |_, mut socket| {
        let sent = sent.clone();
        async move {
            let mut bytes = vec![0u8; 4096];
            let n = socket.read(&mut bytes).await.unwrap();
            sent.send_replace(bytes[..n].to_vec());
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
        }
    })
    .await;
    let url = reqwest::Url::parse(&format!("http://{address}/v1/x?stream=1")).unwrap();
    let headers = WireHeaders::from([
        ("authorization".to_string(), "Bearer k".to_string()),
        ("host".to_string(), "elsewhere".to_string()),
        ("content-length".to_string(), "999".to_string()),
    ]);
    let response = local()
        .post(url, &headers, Bytes::from_static(b"{\"a\":1}"))
        .await
        .unwrap();
    assert_eq!(response.text(1024).await.unwrap(), "ok");
    seen.wait_for(|bytes| !bytes.is_empty()).await.unwrap();
    let request = String::from_utf8(seen.borrow().clone()).unwrap();
    assert_eq!(
        request,
        format!(
            "POST /v1/x?stream=1 HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer k\r\n\
             content-length: 7\r\n\r\n{{\"a\":1}}"
        )
    );
}

#[tokio::test]
async fn a_chunked_stream_arrives_piece_by_piece_and_its_connection_is_reused() {
    let (address, accepted) = raw_backend(|_, mut socket| async move {
        while read_request(&mut socket).await {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                        transfer-encoding: chunked\r\n\r\n";
            socket.write_all(head.as_bytes()).await.unwrap();
            for event in ["data: 1\n\n", "data: 2\n\n"] {
                let chunk = format!("{:x}\r\n{event}\r\n", event.len());
                socket.write_all(chunk.as_bytes()).await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            socket.write_all(b"0\r\n\r\n").await.unwrap();
        }
    })
    .await;
    let client = local();
    for _ in 0..3 {
        let response = post(&client, &address).await.unwrap();
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let pieces = pieces(response).await.unwrap();
        assert_eq!(pieces, [b"data: 1\n\n".to_vec(), b"data: 2\n\n".to_vec()]);
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection for all three"
    );
}

#[tokio::test]
async fn bodies_of_every_framing_are_read_whole() {
    let answers: [&'static [u8]; 4] = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nhello",
    ];
    for answer in answers {
        let (address, _) = raw_backend(move |_, mut socket| async move {
            read_request(&mut socket).await;
            // Byte by byte: every framing must survive any split.
            for byte in answer {
                if socket.write_all(&[*byte]).await.is_err() {
                    return;
                }
            }
        })
        .await;
        let response = post(&local(), &address).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.text(1024).await.unwrap(), "hello");
    }
}

#[tokio::test]
async fn an_answer_that_says_close_or_runs_to_the_close_is_not_reused() {
    let close: &'static [u8] =
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
    let (address, accepted) = raw_backend(move |_, socket| answer_each(socket, close)).await;
    let client = local();
    for _ in 0..2 {
        let response = post(&client, &address).await.unwrap();
        assert_eq!(response.text(1024).await.unwrap(), "ok");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_idle_connection_the_backend_closed_is_not_used_again() {
    // One answer, then the backend's own idle timeout closes the connection.
    let (address, accepted) = answer_once(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let client = local();
    let first = post(&client, &address).await.unwrap();
    assert_eq!(first.text(1024).await.unwrap(), "ok");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = post(&client, &address).await.unwrap();
    assert_eq!(second.text(1024).await.unwrap(), "ok");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_body_cut_off_or_malformed_is_an_error_not_a_short_answer() {
    let answers: [&'static [u8]; 4] = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\nhello",
    ];
    for answer in answers {
        let (address, _) = answer_once(answer).await;
        let outcome = match post(&local(), &address).await {
            Ok(response) => response.text(1024).await.map(|_| ()),
            Err(error) => Err(error),
        };
        assert!(outcome.is_err(), "{}", String::from_utf8_lossy(answer));
    }
}

#[tokio::test]
async fn an_answer_that_is_not_http_is_an_error_and_the_connection_is_dropped() {
    let (address, _) = answer_once(b"\x00\x13\xffGARBAGE not http\r\n\r\n").await;
    let error = post(&local(), &address).await.unwrap_err();
    assert!(
        error.to_string().contains("not an HTTP/1.1 response"),
        "{error}"
    );
    assert!(!error.closed_unanswered());
}

/// A backend that answers each request `delay` after reading it, counting the connections it
/// has accepted and not yet answered on (the listen queue's view of a slow accept loop).
async fn slow_backend(delay: Duration) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let waiting = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (now, peak) = (waiting.clone(), most.clone());
    let (address, _) = raw_backend(move |_, mut socket| {
        let (now, peak) = (now.clone(), peak.clone());
        async move {
            let waiting = now.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(waiting, Ordering::SeqCst);
            let mut answered = false;
            while read_request(&mut socket).await {
                let mut probe = [0u8; 1];
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    // The client closed the connection (it gave up on the request).
                    _ = socket.read(&mut probe) => break,
                }
                if !answered {
                    now.fetch_sub(1, Ordering::SeqCst);
                    answered = true;
                }
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if socket.write_all(answer).await.is_err() {
                    return;
                }
            }
            if !answered {
                now.fetch_sub(1, Ordering::SeqCst);
            }
        }
    })
    .await;
    (address, waiting, most)
}

#[tokio::test]
async fn a_burst_keeps_at_most_the_bound_of_new_connections_waiting_for_a_first_byte() {
    let (address, _, most) = slow_backend(Duration::from_millis(30)).await;
    let client = local();
    let requests: Vec<_> = (0..300)
        .map(|_| {
            let (client, address) = (client.clone(), address.clone());
            tokio::spawn(async move { post(&client, &address).await?.text(64).await })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap().unwrap(), "ok");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (2..=CONNECTS_PER_BACKEND).contains(&most),
        "{most} connections waited for their first byte at once"
    );
}

#[tokio::test]
async fn a_backend_that_answers_only_when_done_still_gets_every_request_at_once() {
    // Non-streamed answers come whole: more requests than the bound are all accepted within
    // about a second (the grace), not one bound's worth per answer time.
    let (address, _, most) = slow_backend(Duration::from_secs(3)).await;
    let client = local();
    let started = std::time::Instant::now();
    let requests: Vec<_> = (0..CONNECTS_PER_BACKEND + 8)
        .map(|_| {
            let (client, address) = (client.clone(), address.clone());
            tokio::spawn(async move { post(&client, &address).await?.text(64).await })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap().unwrap(), "ok");
    }
    assert_eq!(most.load(Ordering::SeqCst), CONNECTS_PER_BACKEND + 8);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn requests_cancelled_while_waiting_to_connect_leave_nothing_held() {
    let (address, waiting, _) = slow_backend(Duration::from_secs(30)).await;
    let client = local();
    let requests: Vec<_> = (0..100)
        .map(|_| {
            let (client, address) = (client.clone(), address.clone());
            tokio::spawn(async move { post(&client, &address).await.map(|_| ()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for request in &requests {
        request.abort();
    }
    for request in requests {
        let _ = request.await;
    }
    // The backend sees every connection closed, and a new request connects at once.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while waiting.load(Ordering::SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "connections left open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let quick: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let (other, _) = raw_backend(move |_, socket| answer_each(socket, quick)).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), post(&client, &other))
        .await
        .expect("connects after the cancelled burst")
        .unwrap();
    assert_eq!(answer.text(64).await.unwrap(), "ok");
}

#[tokio::test]
async fn idle_connections_are_closed_when_they_expire_and_no_task_is_left() {
    let quick: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    let (address, _) = raw_backend(move |_, socket| answer_each(socket, quick)).await;
    let local = LocalClient::new(8, Duration::from_millis(200));
    let client = HttpClient::Local {
        local: local.clone(),
        general: reqwest::Client::new(),
    };
    let responses: Vec<_> = (0..4).map(|_| post(&client, &address)).collect();
    for response in futures_util::future::join_all(responses).await {
        assert_eq!(response.unwrap().text(64).await.unwrap(), "ok");
    }
    assert!(local.idle_connections(&address) >= 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(local.idle_connections(&address), 0);
}

#[tokio::test]
async fn a_dropped_stream_closes_its_connection_so_the_backend_sees_the_cancel() {
    let (closed, mut seen_closed) = watch::channel(false);
    let closed = Arc::new(closed);
    let (address, _) = raw_backend(move |_, mut socket| {
        let closed = closed.clone();
        async move {
            read_request(&mut socket).await;
            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
            socket.write_all(head.as_bytes()).await.unwrap();
            let mut rest = [0u8; 16];
            // The client writes nothing more: a read returns only at the close.
            let _ = socket.read(&mut rest).await;
            closed.send_replace(true);
        }
    })
    .await;
    let mut response = post(&local(), &address).await.unwrap();
    assert_eq!(&response.chunk().await.unwrap().unwrap()[..], b"first");
    drop(response);
    tokio::time::timeout(
        Duration::from_secs(5),
        seen_closed.wait_for(|closed| *closed),
    )
    .await
    .expect("the backend saw the close")
    .unwrap();
}
