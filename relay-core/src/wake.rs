//! Wake-on-LAN: MAC addresses as workers announce them, the magic packet that wakes a sleeping
//! box, and finding this machine's own MAC. Used by the proxy (which sends the packet) and the
//! worker (which announces its address); imports nothing else of the crate.
//!
//! The magic packet is six 0xFF bytes followed by the target MAC sixteen times (102 bytes),
//! sent as a UDP datagram, by convention to the broadcast address on port 9 (discard). The
//! network card of a suspended machine with Wake-on-LAN armed scans every frame for that
//! pattern, whatever the protocol and port, so the destination only needs to reach its segment.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// Length of a magic packet: 6 bytes of 0xFF, then 16 copies of the 6-byte MAC.
pub const MAGIC_PACKET_LEN: usize = 6 + 16 * 6;

/// Where magic packets go unless configured: the limited broadcast on the discard port.
pub const DEFAULT_WAKE_TARGET: &str = "255.255.255.255:9";

/// Longest text accepted as a MAC address ("aa:bb:cc:dd:ee:ff" is 17): longer input is refused
/// before it is looked at, and never echoed whole.
const MAX_MAC_TEXT: usize = 17;

/// A unicast Ethernet MAC address (the only kind a network card wakes for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddress([u8; 6]);

/// Why a text is not a usable MAC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MacError {
    /// Not six two-digit hex octets separated by one kind of `:` or `-`.
    Format,
    /// All zeros: what a virtual or absent interface reports.
    Zero,
    /// A group (multicast or broadcast) address: no single card has it.
    Group,
}

impl fmt::Display for MacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MacError::Format => {
                "not a MAC address: expected six two-digit hex octets separated by ':' or '-' \
                 (e.g. 3c:7c:3f:1e:22:90)"
            }
            MacError::Zero => "00:00:00:00:00:00 is no network card's address",
            MacError::Group => {
                "a multicast or broadcast address (lowest bit of the first octet set) is no \
                 network card's address"
            }
        })
    }
}

impl std::error::Error for MacError {}

impl MacAddress {
    /// The six octets.
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// A MAC from octets, refused when no single card can have it.
    pub fn from_octets(octets: [u8; 6]) -> Result<MacAddress, MacError> {
        if octets == [0; 6] {
            return Err(MacError::Zero);
        }
        if octets[0] & 1 == 1 {
            return Err(MacError::Group);
        }
        Ok(MacAddress(octets))
    }

    /// The 102-byte magic packet that wakes the card with this address.
    pub fn magic_packet(&self) -> [u8; MAGIC_PACKET_LEN] {
        let mut packet = [0xFF; MAGIC_PACKET_LEN];
        for copy in packet[6..].chunks_exact_mut(6) {
            copy.copy_from_slice(&self.0);
        }
        packet
    }

    /// Whether `bytes` is exactly a magic packet for this address.
    pub fn is_magic_packet(&self, bytes: &[u8]) -> bool {
        bytes == self.magic_packet()
    }
}

impl FromStr for MacAddress {
    type Err = MacError;

    fn from_str(text: &str) -> Result<MacAddress, MacError> {
        if text.len() != MAX_MAC_TEXT || !text.is_ascii() {
            return Err(MacError::Format);
        }
        let bytes = text.as_bytes();
        let separator = bytes[2];
        if separator != b':' && separator != b'-' {
            return Err(MacError::Format);
        }
        let mut octets = [0u8; 6];
        for (i, octet) in octets.iter_mut().enumerate() {
            let start = i * 3;
            if i > 0 && bytes[start - 1] != separator {
                return Err(MacError::Format);
            }
            let pair = &text[start..start + 2];
            if !pair.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(MacError::Format);
            }
            *octet = u8::from_str_radix(pair, 16).map_err(|_| MacError::Format)?;
        }
        MacAddress::from_octets(octets)
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl serde::Serialize for MacAddress {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Sends one magic packet for `mac` to `target` (broadcast allowed).
pub async fn send_magic_packet(mac: MacAddress, target: SocketAddr) -> std::io::Result<()> {
    let bind: SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = tokio::net::UdpSocket::bind(bind).await?;
    // Without SO_BROADCAST the kernel refuses a datagram to a broadcast address (EACCES).
    socket.set_broadcast(true)?;
    let sent = socket.send_to(&mac.magic_packet(), target).await?;
    if sent != MAGIC_PACKET_LEN {
        return Err(std::io::Error::other("magic packet sent in part"));
    }
    Ok(())
}

/// This machine's MAC address as Wake-on-LAN needs it: the card of the interface carrying the
/// default route (the one that reaches the proxy in the usual setup), else the first physical
/// one with an address. Linux reads `/proc/net/route` and `/sys/class/net`; elsewhere `None`
/// (the worker's `mac_address` setting names it instead).
pub fn local_mac() -> Option<MacAddress> {
    #[cfg(target_os = "linux")]
    {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let address = |iface: &str| {
            read(&format!("/sys/class/net/{iface}/address"))
                .and_then(|text| text.trim().parse::<MacAddress>().ok())
        };
        if let Some(iface) = read("/proc/net/route")
            .as_deref()
            .and_then(default_route_interface)
        {
            if let Some(mac) = address(&iface) {
                return Some(mac);
            }
        }
        let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name != "lo")
            .collect();
        names.sort();
        names.iter().find_map(|name| address(name))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// The interface of the default route in the text of `/proc/net/route` (destination and mask
/// 0; the lowest metric wins).
pub fn default_route_interface(table: &str) -> Option<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (iface, destination, metric, mask) = (
                fields.first()?,
                fields.get(1)?,
                fields.get(6)?,
                fields.get(7)?,
            );
            (*destination == "00000000" && *mask == "00000000")
                .then(|| (metric.parse::<u64>().unwrap_or(u64::MAX), iface.to_string()))
        })
        .min()
        .map(|(_, iface)| iface)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_magic_packet_is_six_ff_then_the_mac_sixteen_times() {
        let mac: MacAddress = "3c:7c:3f:1e:22:90".parse().unwrap();
        let packet = mac.magic_packet();
        assert_eq!(packet.len(), 102);
        assert_eq!(&packet[..6], &[0xFF; 6]);
        for copy in packet[6..].chunks(6) {
            assert_eq!(copy, &[0x3c, 0x7c, 0x3f, 0x1e, 0x22, 0x90]);
        }
        assert!(mac.is_magic_packet(&packet));
        let other: MacAddress = "3c:7c:3f:1e:22:91".parse().unwrap();
        assert!(!other.is_magic_packet(&packet));
        assert!(!mac.is_magic_packet(&packet[..101]));
    }

    #[test]
    fn macs_parse_strictly_and_print_lower_case_with_colons() {
        let mac: MacAddress = "3C-7C-3F-1E-22-90".parse().unwrap();
        assert_eq!(mac.to_string(), "3c:7c:3f:1e:22:90");
        for bad in [
            "",
            "3c:7c:3f:1e:22",
            "3c:7c:3f:1e:22:90:00",
            "3c:7c:3f-1e:22:90",
            "3c7c3f1e2290",
            "3c:7c:3f:1e:22:9g",
            "3c:7c:3f:1e:22:+9",
            " 3c:7c:3f:1e:22:9",
            "3c:7c:3f:1e:22:é",
            "3c.7c.3f.1e.22.90",
        ] {
            assert_eq!(bad.parse::<MacAddress>(), Err(MacError::Format), "{bad:?}");
        }
        assert_eq!(
            "00:00:00:00:00:00".parse::<MacAddress>(),
            Err(MacError::Zero)
        );
        assert_eq!(
            "ff:ff:ff:ff:ff:ff".parse::<MacAddress>(),
            Err(MacError::Group)
        );
        assert_eq!(
            "01:00:5e:00:00:01".parse::<MacAddress>(),
            Err(MacError::Group)
        );
        let long = "a".repeat(1 << 20);
        assert_eq!(long.parse::<MacAddress>(), Err(MacError::Format));
    }

    #[test]
    fn the_default_route_interface_is_read_from_the_route_table() {
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
                     eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
                     eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(default_route_interface(table).as_deref(), Some("eth0"));
        assert_eq!(default_route_interface("Iface\n"), None);
        assert_eq!(default_route_interface("garbage\nx y\n"), None);
    }

    #[tokio::test]
    async fn a_magic_packet_arrives_at_a_loopback_listener() {
        let listener = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mac: MacAddress = "02:00:00:aa:bb:cc".parse().unwrap();
        send_magic_packet(mac, listener.local_addr().unwrap())
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let (len, _) = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            listener.recv_from(&mut buf),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(mac.is_magic_packet(&buf[..len]));
    }
}
