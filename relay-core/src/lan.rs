//! LAN discovery of relay proxies over mDNS / DNS-SD.
//!
//! A proxy calls [`announce`] once it listens; it then answers mDNS queries for
//! [`SERVICE_TYPE`] until the returned [`Announcement`] is stopped or dropped. A worker (or
//! the desktop app) calls [`browse`] to list the proxies that answer within a time window.
//!
//! Both sides run a `mdns-sd` [`ServiceDaemon`]: one OS thread named `mDNS_daemon` each, bound
//! to UDP port 5353 with address reuse, so they coexist with Avahi, Bonjour and with each other
//! in one process. [`browse`] starts its own daemon and shuts it down before returning; an
//! [`Announcement`] owns its daemon for as long as it lives.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mdns_sd::{IfKind, ResolvedService, ServiceDaemon, ServiceEvent, ServiceInfo};

/// Service type proxies announce.
pub const SERVICE_TYPE: &str = "_modelrelay._tcp.local.";

/// DNS caps a label, and so an instance name, at 63 bytes. `mdns-sd` only finds out when it
/// writes a packet, and then drops the packet without telling us, so we check up front.
const MAX_INSTANCE_NAME_BYTES: usize = 63;

/// Host name used when the machine's own cannot be read or has nothing usable in it.
const FALLBACK_HOST_NAME: &str = "modelrelay";

/// How long [`Announcement::stop`] waits for the daemon to confirm it has shut down.
const STOP_ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// A proxy found on the LAN.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct LanProxy {
    /// Instance name the proxy announced (usually its machine's host name).
    pub name: String,
    /// Base URL to reach the proxy, e.g. `http://192.168.1.20:8080`.
    pub url: String,
    /// The proxy machine's mDNS host name, without the trailing dot, e.g. `box.local`.
    pub host: String,
    /// TCP port the proxy listens on.
    pub port: u16,
    /// The proxy's ModelRelay version (TXT `version`), if it said.
    pub version: Option<String>,
    /// The model provider behind the proxy (TXT `provider`), if it said.
    pub provider: Option<String>,
    /// The SHA-256 fingerprint of the proxy's TLS certificate (TXT `fingerprint`): join it
    /// pinned to this. Only as trustworthy as the LAN it came from; the join code from the
    /// proxy's own dashboard is the authoritative copy.
    #[cfg_attr(test, ts(type = "string | null"))]
    pub fingerprint: Option<crate::fingerprint::Fingerprint>,
}

/// What went wrong while announcing a proxy on the LAN.
#[derive(Debug, thiserror::Error)]
pub enum LanError {
    /// The instance name cannot be announced as given.
    #[error("cannot announce the LAN name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Port 0 means "any port", which a peer cannot connect to.
    #[error("cannot announce port 0 on the LAN: announce the port the proxy actually listens on")]
    InvalidPort,
    /// The mDNS daemon (its thread or its event poller) could not be started.
    #[error("could not start the mDNS daemon: {0}")]
    Daemon(#[source] mdns_sd::Error),
    /// `mdns-sd` rejected the service description (name, host name or TXT records).
    #[error("could not describe {name:?} as an mDNS service: {source}")]
    ServiceInfo {
        /// The instance name being announced.
        name: String,
        /// What `mdns-sd` objected to.
        source: mdns_sd::Error,
    },
    /// The running daemon refused the registration or an interface setting.
    #[error("the mDNS daemon refused to announce {fullname:?}: {source}")]
    Register {
        /// Full DNS-SD name of the service being announced.
        fullname: String,
        /// What the daemon said.
        source: mdns_sd::Error,
    },
}

/// Where the daemons listen and talk. Production uses the real mDNS port on every interface;
/// the tests use a private port on loopback only, so they send no mDNS packet to a real
/// network and neither see nor disturb other mDNS software on this machine. (The daemon still
/// joins the multicast group on every interface when it starts, before our interface choice
/// reaches it, so the kernel sends its usual IGMP/MLD membership reports there.)
#[derive(Debug, Clone, Copy)]
struct Scope {
    port: u16,
    loopback_only: bool,
}

impl Scope {
    const LAN: Scope = Scope {
        port: mdns_sd::MDNS_PORT,
        loopback_only: false,
    };

    /// Starts a daemon limited to this scope.
    fn start_daemon(self) -> Result<ServiceDaemon, LanError> {
        let daemon = ServiceDaemon::new_with_port(self.port).map_err(LanError::Daemon)?;
        if self.loopback_only {
            // Commands run in order on the daemon thread, so these apply before any later
            // register or browse sends a packet.
            let limited = daemon
                .disable_interface(IfKind::All)
                .and_then(|()| daemon.enable_interface(IfKind::LoopbackV4));
            if let Err(e) = limited {
                // Best effort: the thread is already running and would otherwise outlive us.
                let _ = daemon.shutdown();
                return Err(LanError::Daemon(e));
            }
        }
        Ok(daemon)
    }
}

/// Keeps the announcement alive; dropping it (or `stop()`) unregisters and shuts the daemon down.
///
/// Both send mDNS "goodbye" packets so peers forget the proxy at once instead of when its
/// records expire. [`stop`](Self::stop) also waits (up to a second) for the daemon thread to
/// confirm, so call it rather than relying on drop just before the process exits: a drop only
/// queues the goodbyes, and an exiting process may kill the daemon thread before they leave.
pub struct Announcement {
    /// `None` once shut down, so stop-then-drop does not shut down twice.
    daemon: Option<ServiceDaemon>,
    fullname: String,
}

impl std::fmt::Debug for Announcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Announcement")
            .field("fullname", &self.fullname)
            .field("active", &self.daemon.is_some())
            .finish()
    }
}

impl Announcement {
    /// Full DNS-SD name being announced, e.g. `box._modelrelay._tcp.local.`.
    pub fn fullname(&self) -> &str {
        &self.fullname
    }

    /// Unregisters the proxy and shuts the daemon down, waiting up to a second for the daemon
    /// to confirm. Blocks the calling thread for that long at most (normally a few
    /// milliseconds).
    pub fn stop(mut self) {
        if let Some(ack) = self.shut_down() {
            if ack.recv_timeout(STOP_ACK_TIMEOUT).is_err() {
                tracing::debug!(fullname = %self.fullname, "mDNS daemon did not confirm shutdown in time");
            }
        }
    }

    /// Queues the unregistration and the shutdown; returns the receiver of the shutdown
    /// confirmation, or `None` if there is nothing to wait for.
    fn shut_down(&mut self) -> Option<mdns_sd::Receiver<mdns_sd::DaemonStatus>> {
        let daemon = self.daemon.take()?;
        // Unregistering explicitly sends the goodbyes now. The shutdown below would send them
        // too, and also covers the case where a name conflict made the daemon rename the
        // service, so that this name is no longer found.
        if let Err(e) = daemon.unregister(&self.fullname) {
            tracing::debug!(fullname = %self.fullname, error = %e, "mDNS unregister failed");
        }
        match daemon.shutdown() {
            Ok(ack) => {
                tracing::info!(fullname = %self.fullname, "stopped announcing on the LAN");
                Some(ack)
            }
            Err(e) => {
                tracing::debug!(fullname = %self.fullname, error = %e, "mDNS daemon shutdown failed");
                None
            }
        }
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        // Do not wait for the confirmation: drop may run on an async runtime thread.
        let _ = self.shut_down();
    }
}

/// Announces a proxy listening on `port` under the instance name `name` (e.g. the host
/// name), with TXT records `version=<crate version>`, `provider=<provider>`, `path=/` and
/// `scheme=http`, or with a TLS certificate `scheme=https` and `fingerprint=sha256:<hex>`.
/// The addresses are those of this host's interfaces, filled in by `mdns-sd`
/// (`enable_addr_auto`).
///
/// On each interface the daemon advertises only the addresses of that interface, so a LAN
/// peer sees the LAN address; the loopback address is only ever seen by this machine. The
/// daemon also follows address changes (DHCP renewals, Wi-Fi switches) by itself.
///
/// # Errors
///
/// [`LanError`] if `name` is empty, longer than 63 bytes or has control characters, if `port`
/// is 0, or if the mDNS daemon cannot be started or refuses the service. Name conflicts with
/// another host are found only later, while probing: the daemon then renames this instance
/// (`name (2)`), which is not an error.
pub fn announce(
    name: &str,
    port: u16,
    provider: &str,
    fingerprint: Option<crate::fingerprint::Fingerprint>,
) -> Result<Announcement, LanError> {
    announce_in(Scope::LAN, name, port, provider, fingerprint)
}

fn announce_in(
    scope: Scope,
    name: &str,
    port: u16,
    provider: &str,
    fingerprint: Option<crate::fingerprint::Fingerprint>,
) -> Result<Announcement, LanError> {
    validate_instance_name(name)?;
    if port == 0 {
        return Err(LanError::InvalidPort);
    }
    let info = service_info(
        name,
        &mdns_host_name(&host_name()),
        port,
        provider,
        fingerprint,
    )?;
    let fullname = info.get_fullname().to_string();

    let daemon = scope.start_daemon()?;
    if let Err(source) = daemon.register(info) {
        let _ = daemon.shutdown();
        return Err(LanError::Register { fullname, source });
    }
    tracing::info!(%fullname, port, provider, "announcing the proxy on the LAN");
    Ok(Announcement {
        daemon: Some(daemon),
        fullname,
    })
}

/// Builds the DNS-SD description of this proxy; the addresses are left for the daemon to fill.
fn service_info(
    name: &str,
    mdns_host: &str,
    port: u16,
    provider: &str,
    fingerprint: Option<crate::fingerprint::Fingerprint>,
) -> Result<ServiceInfo, LanError> {
    let fingerprint = fingerprint.map(|f| f.to_string());
    let mut txt = vec![
        ("version", env!("CARGO_PKG_VERSION")),
        ("provider", provider),
        ("path", "/"),
        (
            "scheme",
            if fingerprint.is_some() {
                "https"
            } else {
                "http"
            },
        ),
    ];
    if let Some(fingerprint) = &fingerprint {
        txt.push(("fingerprint", fingerprint));
    }
    ServiceInfo::new(SERVICE_TYPE, name, mdns_host, "", port, &txt[..])
        .map(ServiceInfo::enable_addr_auto)
        .map_err(|source| LanError::ServiceInfo {
            name: name.to_string(),
            source,
        })
}

fn validate_instance_name(name: &str) -> Result<(), LanError> {
    let reason = if name.is_empty() {
        "it is empty"
    } else if name.len() > MAX_INSTANCE_NAME_BYTES {
        "it is longer than 63 bytes, the DNS limit for one label"
    } else if name.chars().any(char::is_control) {
        "it contains control characters"
    } else {
        return Ok(());
    };
    Err(LanError::InvalidName {
        name: name.to_string(),
        reason,
    })
}

/// Browses for `wait`, returning every distinct proxy resolved, sorted by name; never errors
/// (logs and returns what it found, possibly empty) and never takes longer than `wait` + a
/// small margin. Safe to call from inside a tokio runtime: it awaits the daemon's events
/// instead of blocking a runtime thread. Needs a tokio runtime with timers enabled.
///
/// A proxy that says goodbye during the window is left out. Each call starts and stops its own
/// daemon, so nothing is cached between calls.
pub async fn browse(wait: Duration) -> Vec<LanProxy> {
    browse_in(Scope::LAN, wait, None).await
}

/// [`browse`] in `scope`. With `until`, returns as soon as that full name has resolved: the
/// tests use it to wait generously for the announcement yet finish as soon as it shows up.
async fn browse_in(scope: Scope, wait: Duration, until: Option<&str>) -> Vec<LanProxy> {
    let deadline = tokio::time::Instant::now() + wait;
    let daemon = match scope.start_daemon() {
        Ok(daemon) => daemon,
        Err(e) => {
            tracing::warn!(error = %e, "LAN discovery unavailable");
            return Vec::new();
        }
    };
    let events = match daemon.browse(SERVICE_TYPE) {
        Ok(events) => events,
        Err(e) => {
            tracing::warn!(error = %e, "could not browse the LAN for proxies");
            let _ = daemon.shutdown();
            return Vec::new();
        }
    };

    // Keyed by the lower-cased full name: DNS names are case-insensitive, and a proxy
    // re-resolves (new address, updated TXT) under the same name.
    let mut found: HashMap<String, ResolvedService> = HashMap::new();
    while let Ok(received) = tokio::time::timeout_at(deadline, events.recv_async()).await {
        let Ok(event) = received else {
            // The daemon thread is gone; nothing more will come.
            tracing::debug!("mDNS daemon stopped while browsing");
            break;
        };
        match event {
            ServiceEvent::ServiceResolved(service) => {
                let key = service.get_fullname().to_lowercase();
                tracing::debug!(fullname = %key, "LAN proxy resolved");
                let done = until.is_some_and(|name| name.eq_ignore_ascii_case(&key));
                found.insert(key, *service);
                if done {
                    break;
                }
            }
            ServiceEvent::ServiceRemoved(_, fullname) => {
                tracing::debug!(%fullname, "LAN proxy said goodbye");
                found.remove(&fullname.to_lowercase());
            }
            other => tracing::trace!(event = ?other, "mDNS browse event"),
        }
    }

    // Fire and forget: the daemon thread exits on its own, and waiting here would only delay
    // the caller past `wait`.
    if let Err(e) = daemon.shutdown() {
        tracing::debug!(error = %e, "mDNS daemon shutdown failed");
    }

    let mut proxies: Vec<LanProxy> = found.values().map(lan_proxy).collect();
    proxies.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.url.cmp(&b.url)));
    proxies
}

/// Maps a resolved DNS-SD service to the proxy it describes.
fn lan_proxy(service: &ResolvedService) -> LanProxy {
    let host = service.get_hostname().trim_end_matches('.').to_string();
    let port = service.get_port();
    let addresses: Vec<IpAddr> = service
        .get_addresses()
        .iter()
        .map(|scoped| scoped.to_ip_addr())
        .collect();
    // An empty TXT value says as much as a missing one.
    let txt = |key: &str| {
        service
            .get_property_val_str(key)
            .filter(|value| !value.is_empty())
            .map(str::to_string)
    };
    // A fingerprint that does not parse is dropped: the wizard then offers a plain join,
    // which the proxy's TLS refuses, rather than a pin nobody can satisfy.
    let fingerprint = txt("fingerprint").and_then(|f| f.parse().ok());
    let mut url = proxy_url(&addresses, &host, port);
    if fingerprint.is_some() || txt("scheme").as_deref() == Some("https") {
        url = url.replacen("http://", "https://", 1);
    }
    LanProxy {
        name: instance_name(service.get_fullname()),
        url,
        host,
        port,
        version: txt("version"),
        provider: txt("provider"),
        fingerprint,
    }
}

/// The instance part of `fullname` (`box._modelrelay._tcp.local.` → `box`). Names arrive
/// unescaped from the wire, so a dot inside the instance name stays a plain dot.
fn instance_name(fullname: &str) -> String {
    let suffix = format!(".{SERVICE_TYPE}");
    let cut = fullname.len().checked_sub(suffix.len()).filter(|&cut| {
        fullname.is_char_boundary(cut) && fullname[cut..].eq_ignore_ascii_case(&suffix)
    });
    match cut {
        Some(cut) => fullname[..cut].to_string(),
        None => fullname.trim_end_matches('.').to_string(),
    }
}

/// The URL to reach a proxy at one of `addresses`, in order of preference:
/// 1. a non-loopback IPv4 address (the lowest, so the choice does not depend on set order);
/// 2. a routable IPv6 address: link-local ones need a zone (`%eth0`) that is only meaningful
///    on the receiving machine and that browsers reject in URLs;
/// 3. a loopback IPv4 address: loopback packets never leave a machine, so the proxy is on
///    this one and the address works;
/// 4. the host name, which needs an mDNS-aware resolver to work.
fn proxy_url(addresses: &[IpAddr], host: &str, port: u16) -> String {
    let lowest_v4 = |loopback: bool| {
        addresses
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) if !v4.is_unspecified() && v4.is_loopback() == loopback => Some(*v4),
                _ => None,
            })
            .min()
    };
    let routable_v6 = addresses
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(v6)
                if !v6.is_loopback()
                    && !v6.is_unspecified()
                    && !v6.is_unicast_link_local()
                    && !v6.is_multicast() =>
            {
                Some(*v6)
            }
            _ => None,
        })
        .min();

    if let Some(v4) = lowest_v4(false) {
        format!("http://{v4}:{port}")
    } else if let Some(v6) = routable_v6 {
        format!("http://[{v6}]:{port}")
    } else if let Some(v4) = lowest_v4(true) {
        format!("http://{v4}:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// The URLs other machines can reach a proxy listening on `bound` at, best first: for a
/// wildcard listener (`0.0.0.0`, `::`) this machine's current LAN addresses, then its mDNS name
/// (`HOST.local`, published while the proxy announces itself, and stable when the router hands
/// out a new address); for a specific address, that address, then the name. Never a wildcard
/// address (on another box `0.0.0.0` is that box itself); a loopback listener is reachable
/// from this machine only, so its one URL is its own.
pub fn reachable_urls(bound: SocketAddr, https: bool) -> Vec<String> {
    let interfaces: Vec<(String, IpAddr)> = if_addrs::get_if_addrs()
        .map(|list| list.into_iter().map(|i| (i.name.clone(), i.ip())).collect())
        .unwrap_or_default();
    reachable_urls_from(bound, https, &interfaces, &host_name())
}

/// Interface name prefixes of bridges, containers and tunnels: their addresses come after the
/// LAN's (another box on the LAN rarely reaches a Docker bridge).
const VIRTUAL_INTERFACES: &[&str] = &[
    "docker",
    "br-",
    "veth",
    "virbr",
    "lxc",
    "lxd",
    "cni",
    "flannel",
    "cali",
    "podman",
    "tun",
    "tap",
    "wg",
    "zt",
    "tailscale",
];

fn reachable_urls_from(
    bound: SocketAddr,
    https: bool,
    interfaces: &[(String, IpAddr)],
    host: &str,
) -> Vec<String> {
    let scheme = if https { "https" } else { "http" };
    let port = bound.port();
    let url = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
        IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
    };
    if bound.ip().is_loopback() {
        return vec![url(bound.ip())];
    }
    let name = format!(
        "{scheme}://{}:{port}",
        mdns_host_name(host).trim_end_matches('.')
    );
    if !bound.ip().is_unspecified() {
        return vec![url(bound.ip()), name];
    }
    let with_v6 = bound.is_ipv6();
    let mut found: Vec<(bool, bool, IpAddr)> = interfaces
        .iter()
        .filter(|(_, ip)| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_unspecified() && !v4.is_link_local(),
            // Link-local IPv6 needs a zone that only means something on the receiving machine.
            IpAddr::V6(v6) => {
                with_v6
                    && !v6.is_loopback()
                    && !v6.is_unspecified()
                    && !v6.is_unicast_link_local()
                    && !v6.is_multicast()
            }
        })
        .map(|(interface, ip)| {
            let virtual_one = VIRTUAL_INTERFACES.iter().any(|p| interface.starts_with(p));
            (virtual_one, ip.is_ipv6(), *ip)
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    let mut urls: Vec<String> = found.into_iter().map(|(_, _, ip)| url(ip)).collect();
    urls.push(name);
    urls
}

/// This machine's host name, for the instance name (libc gethostname or /etc/hostname
/// fallback; "modelrelay" if unknown).
pub fn host_name() -> String {
    system_host_name()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|text| text.trim().to_string())
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| FALLBACK_HOST_NAME.to_string())
}

#[cfg(unix)]
fn system_host_name() -> Option<String> {
    // 256 bytes holds any host name: POSIX caps it at 255 (HOST_NAME_MAX is 64 on Linux).
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    // A name that filled the buffer may lack its NUL (POSIX leaves that open), so bound it.
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    (!name.is_empty()).then_some(name)
}

#[cfg(not(unix))]
fn system_host_name() -> Option<String> {
    std::env::var("COMPUTERNAME")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

/// The `<label>.local.` name the A/AAAA records are published under. mDNS host names are one
/// label under `.local`, so only the first label of `host` is kept, and characters that are
/// not letters, digits or `-` (which resolvers reject in host names) become `-`.
fn mdns_host_name(host: &str) -> String {
    let first = host.split('.').next().unwrap_or_default();
    let cleaned: String = first
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let label: String = cleaned.trim_matches('-').chars().take(63).collect();
    let label = if label.is_empty() {
        FALLBACK_HOST_NAME
    } else {
        &label
    };
    format!("{label}.local.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn interfaces(list: &[(&str, &str)]) -> Vec<(String, IpAddr)> {
        list.iter()
            .map(|(name, ip)| (name.to_string(), ip.parse().unwrap()))
            .collect()
    }

    #[test]
    fn a_wildcard_listener_is_reached_at_its_lan_addresses_then_its_name_never_the_wildcard() {
        let found = interfaces(&[
            ("lo", "127.0.0.1"),
            ("docker0", "172.17.0.1"),
            ("wlan0", "192.168.1.30"),
            ("eth0", "192.168.1.20"),
            ("eth0", "169.254.3.4"),
            ("eth0", "fd00::20"),
            ("eth0", "fe80::1"),
        ]);
        let bound: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(
            reachable_urls_from(bound, false, &found, "gpu-box.lan"),
            vec![
                "http://192.168.1.20:8080",
                "http://192.168.1.30:8080",
                "http://172.17.0.1:8080",
                "http://gpu-box.local:8080",
            ]
        );
        // `::` takes IPv6 too (routable ones, after IPv4); TLS makes every URL https.
        let bound: SocketAddr = "[::]:8443".parse().unwrap();
        assert_eq!(
            reachable_urls_from(bound, true, &found, "gpu-box"),
            vec![
                "https://192.168.1.20:8443",
                "https://192.168.1.30:8443",
                "https://[fd00::20]:8443",
                "https://172.17.0.1:8443",
                "https://gpu-box.local:8443",
            ]
        );
        // A machine with no LAN address yet still has its name.
        assert_eq!(
            reachable_urls_from("0.0.0.0:80".parse().unwrap(), false, &[], "box"),
            vec!["http://box.local:80"]
        );
    }

    #[test]
    fn a_specific_listener_is_reached_at_its_address_and_a_loopback_one_only_here() {
        let found = interfaces(&[("eth0", "10.0.0.5")]);
        assert_eq!(
            reachable_urls_from("10.0.0.7:9000".parse().unwrap(), false, &found, "b"),
            vec!["http://10.0.0.7:9000", "http://b.local:9000"]
        );
        assert_eq!(
            reachable_urls_from("127.0.0.1:8080".parse().unwrap(), false, &found, "b"),
            vec!["http://127.0.0.1:8080"]
        );
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|ip| ip.parse().unwrap()).collect()
    }

    fn resolved(name: &str, host: &str, addrs: &str, txt: &[(&str, &str)]) -> ResolvedService {
        ServiceInfo::new(SERVICE_TYPE, name, host, addrs, 8080, txt)
            .unwrap()
            .as_resolved_service()
    }

    #[test]
    fn resolved_service_maps_to_lan_proxy() {
        let service = resolved(
            "studio",
            "studio.local.",
            "192.168.1.20,fe80::1",
            &[("version", "1.2.3"), ("provider", "ollama"), ("path", "/")],
        );
        assert_eq!(
            lan_proxy(&service),
            LanProxy {
                name: "studio".into(),
                url: "http://192.168.1.20:8080".into(),
                host: "studio.local".into(),
                port: 8080,
                version: Some("1.2.3".into()),
                provider: Some("ollama".into()),
                fingerprint: None,
            }
        );
    }

    #[test]
    fn a_tls_proxy_is_found_with_https_and_its_fingerprint() {
        let fingerprint = crate::fingerprint::Fingerprint::of_der(b"certificate");
        let info = service_info("studio", "studio.local.", 9000, "p", Some(fingerprint)).unwrap();
        assert_eq!(info.get_property_val_str("scheme"), Some("https"));
        let text = fingerprint.to_string();
        assert_eq!(
            info.get_property_val_str("fingerprint"),
            Some(text.as_str())
        );
        let service = resolved(
            "studio",
            "studio.local.",
            "192.168.1.20",
            &[("scheme", "https"), ("fingerprint", text.as_str())],
        );
        let proxy = lan_proxy(&service);
        assert_eq!(proxy.url, "https://192.168.1.20:8080");
        assert_eq!(proxy.fingerprint, Some(fingerprint));
        let json = serde_json::to_value(&proxy).unwrap();
        assert_eq!(json["fingerprint"], text.as_str());
        let damaged = resolved("x", "x.local.", "10.0.0.5", &[("fingerprint", "sha256:00")]);
        assert_eq!(lan_proxy(&damaged).fingerprint, None);
    }

    #[test]
    fn missing_or_empty_txt_values_are_none() {
        let service = resolved("bare", "bare.local.", "10.0.0.5", &[("provider", "")]);
        let proxy = lan_proxy(&service);
        assert_eq!(proxy.version, None);
        assert_eq!(proxy.provider, None);
        assert_eq!(proxy.url, "http://10.0.0.5:8080");
    }

    #[test]
    fn instance_name_strips_the_service_type() {
        assert_eq!(instance_name("box._modelrelay._tcp.local."), "box");
        // Names come off the wire unescaped, and DNS is case-insensitive.
        assert_eq!(instance_name("my.box._ModelRelay._TCP.local."), "my.box");
        assert_eq!(
            instance_name("other._http._tcp.local."),
            "other._http._tcp.local"
        );
        assert_eq!(instance_name("é"), "é");
    }

    #[test]
    fn url_prefers_lowest_non_loopback_ipv4() {
        let addrs = ips(&["127.0.0.1", "fd00::2", "192.168.1.9", "10.1.2.3"]);
        assert_eq!(proxy_url(&addrs, "h.local", 80), "http://10.1.2.3:80");
    }

    #[test]
    fn url_falls_back_to_routable_ipv6_then_loopback_then_host() {
        let addrs = ips(&["fe80::1", "127.0.0.1", "fd00::2"]);
        assert_eq!(proxy_url(&addrs, "h.local", 81), "http://[fd00::2]:81");

        let addrs = ips(&["fe80::1", "::1", "127.0.0.1"]);
        assert_eq!(proxy_url(&addrs, "h.local", 82), "http://127.0.0.1:82");

        let addrs = [
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        ];
        assert_eq!(proxy_url(&addrs, "h.local", 83), "http://h.local:83");
        assert_eq!(proxy_url(&[], "h.local", 84), "http://h.local:84");
    }

    #[test]
    fn instance_names_are_validated() {
        assert!(validate_instance_name("studio").is_ok());
        assert!(validate_instance_name("Bob's relay (3.2)").is_ok());
        assert!(validate_instance_name(&"x".repeat(63)).is_ok());
        for bad in [String::new(), "x".repeat(64), "a\nb".to_string()] {
            let err = validate_instance_name(&bad).unwrap_err();
            assert!(matches!(err, LanError::InvalidName { .. }), "{err}");
        }
        let err = announce("", 8080, "ollama", None).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        let err = announce("studio", 0, "ollama", None).unwrap_err();
        assert!(matches!(err, LanError::InvalidPort), "{err}");
    }

    #[test]
    fn mdns_host_name_is_one_clean_label() {
        assert_eq!(mdns_host_name("studio"), "studio.local.");
        assert_eq!(mdns_host_name("My_Box.example.com"), "My-Box.local.");
        assert_eq!(mdns_host_name("--"), "modelrelay.local.");
        assert_eq!(mdns_host_name(""), "modelrelay.local.");
    }

    #[test]
    fn host_name_is_never_empty() {
        let name = host_name();
        assert!(!name.is_empty());
        assert_eq!(name, name.trim());
    }

    #[test]
    fn service_info_carries_the_txt_records() {
        let info = service_info("studio", "studio.local.", 9000, "llama.cpp", None).unwrap();
        assert_eq!(info.get_fullname(), "studio._modelrelay._tcp.local.");
        assert_eq!(info.get_property_val_str("provider"), Some("llama.cpp"));
        assert_eq!(info.get_property_val_str("path"), Some("/"));
        assert_eq!(info.get_property_val_str("scheme"), Some("http"));
        assert_eq!(info.get_property_val_str("fingerprint"), None);
        assert_eq!(
            info.get_property_val_str("version"),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert!(info.is_addr_auto());
    }

    /// Loopback only, on a private port: the test never sends to a real network and never
    /// sees (or is seen by) mDNS software running on this machine.
    const TEST_SCOPE: Scope = Scope {
        port: 53_531,
        loopback_only: true,
    };

    /// Announces and finds the proxy in the same process, then checks that stopping the
    /// announcement makes it disappear.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn announced_proxy_is_found_then_gone_after_stop() {
        let started = std::time::Instant::now();
        let name = format!(
            "lan-test-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let announcement = announce_in(TEST_SCOPE, &name, 47_123, "test-provider", None).unwrap();
        let fullname = announcement.fullname().to_string();

        // Probing delays the announcement by about 750 ms; the bound is only for failure.
        let found = browse_in(TEST_SCOPE, Duration::from_secs(5), Some(&fullname)).await;
        let proxy = found
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} not found over loopback mDNS; found {found:?}"));
        assert_eq!(proxy.port, 47_123);
        assert_eq!(proxy.url, "http://127.0.0.1:47123");
        assert_eq!(
            proxy.host,
            mdns_host_name(&host_name()).trim_end_matches('.')
        );
        assert_eq!(proxy.provider.as_deref(), Some("test-provider"));
        assert_eq!(proxy.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));

        // `stop` waits until the daemon has exited, so nothing can answer the next browse.
        announcement.stop();
        let after = browse_in(TEST_SCOPE, Duration::from_millis(1500), None).await;
        assert!(
            after.iter().all(|p| p.name != name),
            "{name} still answers after stop: {after:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[tokio::test]
    async fn browse_returns_within_its_window() {
        let started = std::time::Instant::now();
        let found = browse_in(TEST_SCOPE, Duration::from_millis(300), None).await;
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(1300), "{elapsed:?}");
        // Only the other test announces in this scope, and never under this name.
        assert!(found.iter().all(|p| !p.name.is_empty()));
    }
}
