//! The relay's listen address: bound with a deep accept queue, and moved to the next free port
//! when the default one is taken (a llama-server often holds 8080).

use std::io::ErrorKind;
use std::net::SocketAddr;

use tokio::net::TcpListener;

/// How many ports after the default one are tried when it is taken.
const PORT_SEARCH: u16 = 20;

/// The listen address could not be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address}: {reason}")]
pub struct ListenError {
    /// The address.
    pub address: String,
    /// Why, and what to do.
    pub reason: String,
}

/// Connections the kernel may hold for the relay before it accepts them (capped by the
/// kernel's `net.core.somaxconn`, 4,096 on current Linux). tokio and the standard library
/// listen with 128: a burst of more clients connecting at once than that overflows the queue,
/// the kernel drops their SYNs, and each waits a second for its SYN to be sent again
/// (BENCHMARKS.md, "burst").
pub const LISTEN_BACKLOG: u32 = 1024;

/// Listens on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR` on Unix, as
/// `TcpListener::bind` sets it, so a restarted relay rebinds its port at once).
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds the listen address. The default address moves to the next free port when taken (a
/// llama-server often holds 8080); an explicit one that is taken is an error.
pub async fn bind(address: &str, explicit: bool) -> Result<TcpListener, ListenError> {
    let parsed: SocketAddr = address.parse().map_err(|e| ListenError {
        address: address.to_string(),
        reason: format!("not an IP:port address ({e}); example: 0.0.0.0:8080"),
    })?;
    let in_use = |addr: SocketAddr| ListenError {
        address: addr.to_string(),
        reason: "the port is in use; choose another with --listen or LISTEN_ADDR".to_string(),
    };
    match listen(parsed) {
        Ok(listener) => return Ok(listener),
        Err(e) if e.kind() == ErrorKind::AddrInUse && !explicit => {}
        Err(e) if e.kind() == ErrorKind::AddrInUse => return Err(in_use(parsed)),
        Err(e) => {
            return Err(ListenError {
                address: address.to_string(),
                reason: e.to_string(),
            })
        }
    }
    for offset in 1..=PORT_SEARCH {
        let candidate = SocketAddr::new(parsed.ip(), parsed.port().saturating_add(offset));
        if let Ok(listener) = listen(candidate) {
            println!(
                "Port {} is in use (probably a model server); serving on port {} instead.",
                parsed.port(),
                candidate.port()
            );
            return Ok(listener);
        }
    }
    Err(in_use(parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connects nobody accepts yet complete only while the listen queue has room; beyond it the
    /// kernel drops the SYN and the connect waits a second to send it again.
    #[tokio::test]
    async fn the_listener_holds_a_burst_of_connects_far_beyond_the_default_128() {
        let listener = bind("127.0.0.1:0", true).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connects: Vec<_> = (0..400)
            .map(|_| {
                tokio::spawn(tokio::time::timeout(
                    std::time::Duration::from_millis(800),
                    tokio::net::TcpStream::connect(addr),
                ))
            })
            .collect();
        let mut connected = Vec::new();
        for connect in connects {
            if let Ok(Ok(Ok(stream))) = connect.await {
                connected.push(stream);
            }
        }
        assert_eq!(
            connected.len(),
            400,
            "connects left waiting for a SYN resend"
        );
        drop(listener);
    }
}
