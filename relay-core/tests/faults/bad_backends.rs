//! Backends that misbehave at the TCP level, each on its own loopback port: one that crashes in
//! the middle of a stream, one that accepts and never answers, one that answers bytes that are
//! not HTTP. Workers in front of them advertise their models with `MODELS` (none of these can
//! list models).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// How a [`BadBackend`] misbehaves.
#[derive(Debug, Clone, Copy)]
pub enum Misbehaviour {
    /// Starts an SSE stream, sends one event, then closes the connection mid-body.
    CrashMidStream,
    /// Reads the request and never writes a byte (the connection stays open).
    NeverAnswers,
    /// Answers with bytes that are not HTTP, then closes.
    Garbage,
}

/// A misbehaving backend; its listener thread stops when the test process ends.
pub struct BadBackend {
    pub url: String,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
}

impl BadBackend {
    pub fn start(misbehaviour: Misbehaviour) -> BadBackend {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a bad backend");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                counter.fetch_add(1, Ordering::SeqCst);
                thread::spawn(move || misbehave(stream, misbehaviour));
            }
        });
        BadBackend { url, accepted }
    }
}

fn misbehave(mut stream: TcpStream, misbehaviour: Misbehaviour) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    read_head(&mut stream);
    match misbehaviour {
        Misbehaviour::CrashMidStream => {
            let event = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n",
                event.len()
            );
            let _ = stream.flush();
            thread::sleep(Duration::from_millis(100));
            // Dropped without the last chunk: the body ends in the middle.
        }
        Misbehaviour::NeverAnswers => {
            // Hold the connection until the worker gives up on it.
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        }
        Misbehaviour::Garbage => {
            let _ = stream.write_all(b"\x00\x13\xffGARBAGE not http\r\n\r\n\x7f");
        }
    }
}

/// Reads until the end of the request head (the body, if any, is left unread).
fn read_head(stream: &mut TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
}
