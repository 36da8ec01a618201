//! Whose server listens on a port of this machine.
//!
//! Discovery must not adopt whoever listens first on a well-known port: any local user can start
//! a server on 127.0.0.1:1337 that says it serves `llama3` and collect the prompts. So a found
//! server is used only when its listening socket belongs to the user running the relay, or after
//! the owner confirms it on the dashboard.
//!
//! On Linux the kernel says who owns each socket: `/proc/net/tcp` and `/proc/net/tcp6` list
//! every socket with its state and the uid that created it. Elsewhere the answer is
//! [`Owner::Unknown`], which counts as someone else's until confirmed.

use serde::Serialize;

/// Who owns the socket listening on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "user", content = "uid")]
#[cfg_attr(test, derive(ts_rs::TS))]
pub enum Owner {
    /// The user running the relay.
    ThisUser,
    /// Another user (their uid).
    OtherUser(u32),
    /// Not known (no `/proc`, another network namespace, another OS).
    Unknown,
}

/// TCP state `LISTEN` in `/proc/net/tcp*`.
const LISTEN: &str = "0A";

/// Who listens on `port` on loopback or every address, according to `tables` (the texts of
/// `/proc/net/tcp` and `/proc/net/tcp6`), for a relay running as `me`.
pub fn owner_in(tables: &[String], port: u16, me: u32) -> Owner {
    let mut owners = tables
        .iter()
        .flat_map(|table| table.lines().skip(1))
        .filter_map(|line| listener(line, port));
    let Some(first) = owners.next() else {
        return Owner::Unknown;
    };
    // Every listener on the port must be ours: a second socket of another user (on another
    // address) could answer some of the connections.
    match std::iter::once(first).chain(owners).find(|uid| *uid != me) {
        Some(other) => Owner::OtherUser(other),
        None => Owner::ThisUser,
    }
}

/// The uid of the socket on `line` when it listens on `port` at an address loopback reaches
/// (127.0.0.0/8, `::1`, a wildcard, or an IPv4-mapped loopback).
fn listener(line: &str, port: u16) -> Option<u32> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (local, state, uid) = (fields.get(1)?, fields.get(3)?, fields.get(7)?);
    if *state != LISTEN {
        return None;
    }
    let (address, listening_port) = local.split_once(':')?;
    if u16::from_str_radix(listening_port, 16).ok()? != port || !reaches_loopback(address) {
        return None;
    }
    uid.parse().ok()
}

/// Whether a `/proc/net/tcp*` address (hex, in the kernel's byte order) is one a connection to
/// 127.0.0.1 or ::1 may land on.
fn reaches_loopback(address: &str) -> bool {
    match address.len() {
        // IPv4: one little-endian word; 127.x.y.z has 7F as its last byte.
        8 => address == "00000000" || address.ends_with("7F"),
        // IPv6: four little-endian words. `::` and `::1`, and `::ffff:0:0` / `::ffff:127.x`.
        32 => {
            address == "00000000000000000000000000000000"
                || address == "00000000000000000000000001000000"
                || (address.starts_with("0000000000000000FFFF0000")
                    && (address.ends_with("00000000") || address.ends_with("7F")))
        }
        _ => false,
    }
}

/// Who listens on `port` of this machine.
pub fn owner_of_port(port: u16) -> Owner {
    #[cfg(target_os = "linux")]
    {
        let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .collect();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        owner_in(&tables, port, me)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = port;
        Owner::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode";

    fn table(lines: &[&str]) -> Vec<String> {
        vec![std::iter::once(HEAD)
            .chain(lines.iter().copied())
            .collect::<Vec<_>>()
            .join("\n")]
    }

    // 127.0.0.1:1337 (0x0539) listening, owned by uid 65534.
    const OTHER_1337: &str = "   0: 0100007F:0539 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 4242 1 0000000000000000 100 0 0 10 0";
    // 0.0.0.0:30000 (0x7530) listening, uid 1000.
    const MINE_30000: &str = "   1: 00000000:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4243 1 0000000000000000 100 0 0 10 0";
    // An established connection to 1337, owned by 1000: not a listener.
    const CONNECTED: &str = "   2: 0100007F:0539 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4244 1 0000000000000000 20 4 30 10 -1";

    #[test]
    fn the_listeners_uid_decides() {
        let tables = table(&[OTHER_1337, MINE_30000, CONNECTED]);
        assert_eq!(owner_in(&tables, 1337, 1000), Owner::OtherUser(65534));
        assert_eq!(owner_in(&tables, 30000, 1000), Owner::ThisUser);
        assert_eq!(owner_in(&tables, 8080, 1000), Owner::Unknown);
        assert_eq!(owner_in(&tables, 1337, 65534), Owner::ThisUser);
    }

    #[test]
    fn a_second_listener_of_another_user_makes_it_someone_elses() {
        // [::1]:30000 in tcp6, owned by 65534, next to our 0.0.0.0:30000.
        let v6 = "   0: 00000000000000000000000001000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 5 1 0000000000000000 100 0 0 10 0";
        let tables = vec![table(&[MINE_30000])[0].clone(), table(&[v6])[0].clone()];
        assert_eq!(owner_in(&tables, 30000, 1000), Owner::OtherUser(65534));
    }

    #[test]
    fn a_listener_on_another_address_is_not_reached_by_loopback() {
        // 192.168.1.10:1337 (0A01A8C0).
        let lan = "   0: 0A01A8C0:0539 00000000:0000 0A 00000000:00000000 00:00000000 00000000 65534        0 6 1 0000000000000000 100 0 0 10 0";
        assert_eq!(owner_in(&table(&[lan]), 1337, 1000), Owner::Unknown);
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let tables = table(&["", "x", "0: zz:zz 0A", OTHER_1337]);
        assert_eq!(owner_in(&tables, 1337, 1000), Owner::OtherUser(65534));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_socket_of_this_process_is_this_users() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(owner_of_port(port), Owner::ThisUser);
    }
}
