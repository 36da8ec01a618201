//! One-line join codes: a proxy URL, its worker secret and provider in one pasteable string.
//!
//! Format: `mrj1.` followed by the base64url (no padding) of `{"url","secret","provider"}`, plus
//! `"fingerprint"` when the proxy serves TLS with its own certificate. The field is optional, so
//! codes made before it existed still decode; the version prefix lets a later, incompatible
//! format be told apart from this one.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};

const PREFIX: &str = "mrj1.";

/// What a join code carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct JoinDetails {
    /// The proxy's base URL.
    pub url: String,
    /// Its worker secret.
    pub secret: String,
    /// The provider to join.
    #[serde(default = "default_provider")]
    pub provider: String,
    /// The SHA-256 fingerprint of the proxy's certificate: the worker connects over `wss://` and
    /// trusts that certificate only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, ts(type = "string", optional))]
    pub fingerprint: Option<crate::fingerprint::Fingerprint>,
    /// Every URL the proxy may be reached at, best first (`url` is the first): its LAN
    /// addresses and its `HOST.local` name. A joining box uses the first that answers.
    /// Optional, so older codes (and older decoders) go on working with `url` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

impl JoinDetails {
    /// The URLs to try, in order: `url`, then the others of `urls`.
    pub fn candidates(&self) -> Vec<String> {
        let mut all = vec![self.url.clone()];
        for url in &self.urls {
            if !all.contains(url) {
                all.push(url.clone());
            }
        }
        all
    }
}

fn default_provider() -> String {
    crate::settings::defaults::PROVIDER.to_string()
}

/// Encodes `details` as a join code.
pub fn encode(details: &JoinDetails) -> String {
    let json = serde_json::to_vec(details).expect("plain strings always serialize");
    format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
}

/// Decodes a join code, saying what is wrong with a bad one.
pub fn decode(code: &str) -> Result<JoinDetails, String> {
    let body = code.trim().strip_prefix(PREFIX).ok_or_else(|| {
        format!(
            "a join code starts with `{PREFIX}`; copy the whole line from the proxy's dashboard"
        )
    })?;
    let json = URL_SAFE_NO_PAD
        .decode(body.trim_end_matches('='))
        .map_err(|_| "the join code is damaged (not base64url); copy it again".to_string())?;
    let details: JoinDetails = serde_json::from_slice(&json)
        .map_err(|e| format!("the join code's contents are not valid: {e}"))?;
    for url in details.candidates() {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "the join code's proxy URL {url:?} must start with http:// or https://"
            ));
        }
    }
    if details.secret.is_empty() {
        return Err("the join code carries no secret".to_string());
    }
    Ok(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details() -> JoinDetails {
        JoinDetails {
            url: "http://192.168.1.20:8080".into(),
            secret: "abc/+=secret".into(),
            provider: "lab".into(),
            fingerprint: None,
            urls: Vec::new(),
        }
    }

    #[test]
    fn a_code_round_trips_and_is_one_url_safe_line() {
        let code = encode(&details());
        assert!(code.starts_with("mrj1."));
        assert!(code
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
        assert_eq!(decode(&code).unwrap(), details());
        assert_eq!(decode(&format!("  {code}\n")).unwrap(), details());
    }

    #[test]
    fn a_code_carries_the_certificate_fingerprint_when_there_is_one() {
        let pinned = JoinDetails {
            url: "https://192.168.1.20:8080".into(),
            fingerprint: Some(crate::fingerprint::Fingerprint::of_der(b"certificate")),
            ..details()
        };
        let code = encode(&pinned);
        assert_eq!(decode(&code).unwrap(), pinned);
        let json = URL_SAFE_NO_PAD.decode(&code[PREFIX.len()..]).unwrap();
        let json = String::from_utf8(json).unwrap();
        assert!(
            json.contains(&format!(
                "\"fingerprint\":\"{}\"",
                pinned.fingerprint.unwrap()
            )),
            "{json}"
        );
        // Without TLS the field is left out, so the code is what older versions made.
        assert!(
            !String::from_utf8(URL_SAFE_NO_PAD.decode(&encode(&details())[5..]).unwrap())
                .unwrap()
                .contains("fingerprint")
        );
    }

    #[test]
    fn a_code_from_before_fingerprints_still_decodes() {
        let old = format!(
            "{PREFIX}{}",
            URL_SAFE_NO_PAD
                .encode(r#"{"url":"http://10.0.0.2:8080","secret":"s","provider":"local"}"#)
        );
        let details = decode(&old).unwrap();
        assert_eq!(details.url, "http://10.0.0.2:8080");
        assert_eq!(details.fingerprint, None);
    }

    #[test]
    fn a_code_names_every_address_to_try_in_order_and_every_one_must_be_a_url() {
        let several = JoinDetails {
            urls: vec![
                "http://192.168.1.20:8080".into(),
                "http://10.8.0.1:8080".into(),
                "http://gpu-box.local:8080".into(),
            ],
            ..details()
        };
        let decoded = decode(&encode(&several)).unwrap();
        assert_eq!(decoded, several);
        assert_eq!(
            decoded.candidates(),
            vec![
                "http://192.168.1.20:8080",
                "http://10.8.0.1:8080",
                "http://gpu-box.local:8080"
            ]
        );
        // A code with one URL leaves the field out (what older versions made and read).
        assert!(
            !String::from_utf8(URL_SAFE_NO_PAD.decode(&encode(&details())[5..]).unwrap())
                .unwrap()
                .contains("urls")
        );
        let bad = JoinDetails {
            urls: vec!["gpu-box.local:8080".into()],
            ..details()
        };
        assert!(decode(&encode(&bad)).unwrap_err().contains("http://"));
    }

    #[test]
    fn a_damaged_fingerprint_is_refused() {
        let bad = format!(
            "{PREFIX}{}",
            URL_SAFE_NO_PAD.encode(
                r#"{"url":"https://10.0.0.2:8080","secret":"s","fingerprint":"sha256:abc"}"#
            )
        );
        assert!(decode(&bad).unwrap_err().contains("fingerprint"));
    }

    #[test]
    fn bad_codes_say_what_is_wrong() {
        assert!(decode("hello").unwrap_err().contains("starts with"));
        assert!(decode("mrj1.!!!").unwrap_err().contains("damaged"));
        let no_scheme = encode(&JoinDetails {
            url: "proxy:8080".into(),
            ..details()
        });
        assert!(decode(&no_scheme).unwrap_err().contains("http://"));
    }
}
