//! A certificate's SHA-256 fingerprint: what a join code, the banner and the LAN announcement carry
//! so a worker can trust exactly one certificate without a certificate authority.
//!
//! Printed as `sha256:` + 64 lowercase hex digits. Parsed from that, from bare hex, and from the
//! colon-separated upper-case form browsers and `openssl x509 -fingerprint` show, since people
//! copy whichever they have at hand.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const PREFIX: &str = "sha256:";

/// The SHA-256 of a DER-encoded certificate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of the DER-encoded certificate `der`.
    pub fn of_der(der: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        Fingerprint(bytes)
    }

    /// Compares in constant time: the pin is not secret, but there is no reason to leak how
    /// much of it a forged certificate matched.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        use subtle::ConstantTimeEq;
        self.0.ct_eq(&other.0).into()
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a text is not a fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a certificate fingerprint: expected sha256: followed by 64 hex digits (colons between pairs allowed), as the proxy's banner or join code shows it")]
pub struct BadFingerprint(pub String);

impl FromStr for Fingerprint {
    type Err = BadFingerprint;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadFingerprint(text.to_string());
        let trimmed = text.trim();
        let hex = match trimmed.get(..PREFIX.len()) {
            Some(head) if head.eq_ignore_ascii_case(PREFIX) => &trimmed[PREFIX.len()..],
            _ => trimmed,
        };
        // Colons only between pairs ("AB:CD:…"), or none at all.
        let digits: Vec<u8> = if hex.contains(':') {
            let pairs: Vec<&str> = hex.split(':').collect();
            if pairs.iter().any(|pair| pair.len() != 2) {
                return Err(bad());
            }
            pairs.concat().into_bytes()
        } else {
            hex.as_bytes().to_vec()
        };
        if digits.len() != 64 {
            return Err(bad());
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Fingerprint(bytes))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn it_is_the_sha256_of_the_der_bytes_printed_with_a_prefix() {
        // SHA-256("test"), a published test vector.
        let fingerprint = Fingerprint::of_der(b"test");
        assert_eq!(fingerprint.to_string(), format!("sha256:{HEX}"));
    }

    #[test]
    fn the_printed_form_bare_hex_and_colon_separated_upper_case_all_parse() {
        let expected = Fingerprint::of_der(b"test");
        let colons = HEX
            .as_bytes()
            .chunks(2)
            .map(|pair| std::str::from_utf8(pair).unwrap().to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join(":");
        for text in [
            format!("sha256:{HEX}"),
            format!("  SHA256:{}\n", HEX.to_ascii_uppercase()),
            HEX.to_string(),
            colons.clone(),
            format!("sha256:{colons}"),
        ] {
            assert_eq!(text.parse::<Fingerprint>(), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn wrong_lengths_misplaced_colons_and_non_hex_are_refused_with_what_is_expected() {
        for text in [
            "",
            "sha256:",
            &HEX[..62],
            &format!("{HEX}00"),
            &format!("sha1:{HEX}"),
            &HEX.replace('9', "g"),
            "9:f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "\u{e9}\u{e9}86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a",
        ] {
            let error = text.parse::<Fingerprint>().unwrap_err();
            assert!(error.to_string().contains("64 hex digits"), "{error}");
        }
    }

    #[test]
    fn serde_uses_the_printed_form_and_checks_it() {
        let fingerprint = Fingerprint::of_der(b"test");
        let json = serde_json::to_string(&fingerprint).unwrap();
        assert_eq!(json, format!("\"sha256:{HEX}\""));
        assert_eq!(
            serde_json::from_str::<Fingerprint>(&json).unwrap(),
            fingerprint
        );
        assert!(serde_json::from_str::<Fingerprint>("\"sha256:00\"").is_err());
    }

    #[test]
    fn matching_compares_every_byte() {
        let a = Fingerprint::of_der(b"a");
        assert!(a.matches(&a));
        assert!(!a.matches(&Fingerprint::of_der(b"b")));
    }
}
