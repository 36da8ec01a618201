//! Following a proxy that moved. Home routers hand out new addresses, so a proxy restarted (or
//! a box rebooted) may come back elsewhere on the LAN. A worker joined with a certificate pin
//! that has not reached its proxy for [`SEARCH_AFTER`] looks for it on the LAN (mDNS, the
//! proxies' own announcements) and follows the one announcing the pinned fingerprint to its
//! new address. The pin is what makes following safe: the TLS handshake at the new address
//! still has to present that certificate, so an impostor announcing a copied fingerprint gets
//! nothing. Without a pin (plain `http://`) nothing identifies the proxy, and nothing is
//! followed.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::lan::LanProxy;

/// How long without reaching the proxy before looking for it elsewhere (a restart in place is
/// back well within this).
pub const SEARCH_AFTER: Duration = Duration::from_secs(10);

/// How often to look again while it stays away.
pub const SEARCH_EVERY: Duration = Duration::from_secs(10);

/// How long each look listens for announcements.
const LISTEN_FOR: Duration = Duration::from_secs(3);

/// Where the proxy pinned to `pin` is now, if the LAN says it moved from `current`.
pub async fn moved_proxy(pin: Fingerprint, current: &str) -> Option<String> {
    let found = crate::lan::browse(LISTEN_FOR).await;
    pick(&found, pin, current)
}

/// Of the proxies `found`, the address of the first announcing `pin` at another URL than
/// `current`.
pub fn pick(found: &[LanProxy], pin: Fingerprint, current: &str) -> Option<String> {
    let same = |a: &str, b: &str| {
        a.trim_end_matches('/')
            .eq_ignore_ascii_case(b.trim_end_matches('/'))
    };
    found
        .iter()
        .filter(|proxy| proxy.fingerprint == Some(pin))
        .map(|proxy| proxy.url.clone())
        .find(|url| !same(url, current))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy(url: &str, fingerprint: Option<Fingerprint>) -> LanProxy {
        LanProxy {
            name: "studio".into(),
            url: url.into(),
            host: "studio.local".into(),
            port: 8080,
            version: None,
            provider: None,
            fingerprint,
        }
    }

    #[test]
    fn only_the_proxy_with_the_pinned_certificate_at_another_address_is_followed() {
        let pin = Fingerprint::of_der(b"ours");
        let other = Fingerprint::of_der(b"theirs");
        let found = [
            proxy("https://192.168.1.9:8080", Some(other)),
            proxy("https://192.168.1.5:8080", None),
            proxy("https://192.168.1.5:8080/", Some(pin)),
            proxy("https://192.168.1.7:8080", Some(pin)),
        ];
        assert_eq!(
            pick(&found, pin, "https://192.168.1.5:8080").as_deref(),
            Some("https://192.168.1.7:8080"),
            "not the address it already tries, not another certificate"
        );
        assert_eq!(pick(&found[..3], pin, "https://192.168.1.5:8080"), None);
        assert_eq!(pick(&[], pin, "https://192.168.1.5:8080"), None);
    }
}
