//! Wake-on-LAN packets a proxy asks its worker to send on the worker's LAN (`ping.wake_macs`).

/// Cards a single `ping` may ask this worker to wake: a proxy cannot make it flood the LAN.
const MAX_RELAYED_WAKES: usize = 16;

/// Sends the Wake-on-LAN packets the proxy asked for (`ping.wake_macs`), off the session's
/// loop. Only well-formed unicast addresses, at most [`MAX_RELAYED_WAKES`]; the rest is logged
/// and dropped, because the proxy is trusted with the LAN's broadcast no further than that.
pub(super) fn relay_wake_packets(macs: &[String], target: std::net::SocketAddr) {
    let cards: Vec<crate::wake::MacAddress> = macs
        .iter()
        .take(MAX_RELAYED_WAKES)
        .filter_map(|text| match text.parse() {
            Ok(mac) => Some(mac),
            Err(error) => {
                tracing::warn!("ignored a Wake-on-LAN request from the proxy: {error}");
                None
            }
        })
        .collect();
    if cards.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for mac in cards {
            match crate::wake::send_magic_packet(mac, target).await {
                Ok(()) => {
                    tracing::info!(%mac, %target, "Wake-on-LAN packet sent for the proxy")
                }
                Err(error) => {
                    tracing::warn!(%mac, %target, "Wake-on-LAN packet not sent: {error}")
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A hostile or confused proxy gets at most [`MAX_RELAYED_WAKES`] well-formed packets out
    /// of a worker per `ping`, and nothing for malformed or broadcast addresses.
    #[tokio::test]
    async fn a_worker_relays_only_well_formed_cards_and_at_most_sixteen_per_ping() {
        let card = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut asked: Vec<String> = (0..40).map(|i| format!("02:00:00:00:00:{i:02x}")).collect();
        asked.insert(0, "ff:ff:ff:ff:ff:ff".to_string());
        asked.insert(1, "not a mac".to_string());
        asked.insert(2, "x".repeat(100_000));
        relay_wake_packets(&asked, card.local_addr().unwrap());
        let mut valid = 0;
        let mut buf = [0u8; 256];
        while let Ok(Ok((len, _))) =
            tokio::time::timeout(Duration::from_millis(500), card.recv_from(&mut buf)).await
        {
            let packet = &buf[..len];
            assert!(
                asked[3..].iter().any(|m| m
                    .parse::<crate::wake::MacAddress>()
                    .unwrap()
                    .is_magic_packet(packet)),
                "only magic packets for the cards asked"
            );
            valid += 1;
        }
        // The first sixteen entries, of which three are refused.
        assert_eq!(valid, MAX_RELAYED_WAKES - 3);
    }
}
