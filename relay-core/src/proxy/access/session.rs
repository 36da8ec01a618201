//! Dashboard sign-in: one-time login links and the session cookie they set.
//!
//! Being on this machine is not a login (any local user, container or sandboxed app is on it
//! too), so the dashboard's secrets and changes need the admin token or a session. The token
//! holder — the person who started the node (its terminal, its tray, its files) — gets a
//! session the way notebook servers do it: a one-time link (`/login?code=…`) printed in the
//! start-up banner, opened by the tray's *Open dashboard* or by `modelrelay dashboard`, sets an
//! `HttpOnly`, `SameSite=Strict` cookie and is spent. Pasting the token on the sign-in page
//! does the same (`POST /api/login`); the page never keeps the token.
//!
//! Links and cookies are both stateless: an expiry and a random nonce, signed with keys derived
//! from the admin token (one for links, one for cookies). So whoever can read the token mints a
//! link without asking the node — `modelrelay dashboard` never sends the token anywhere, not
//! even to whatever might squat the node's port while it is down — sessions survive a restart
//! (the tray's node restarts at every login), and a new admin token ends every session and
//! link. The node remembers only the links spent, until they expire, so each works once.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, HeaderValue};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;
use ring::hmac;

/// How long a session lasts from sign-in.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a login link minted on request (`modelrelay dashboard`, the tray) stays valid: long
/// enough for a browser to start, short enough that a copy in a shell history is stale.
pub const LINK_LIFETIME: Duration = Duration::from_secs(120);

/// How long the start-up banner's link stays valid: a person may read the banner a while later.
pub const BANNER_LINK_LIFETIME: Duration = Duration::from_secs(3600);

/// Spent links remembered at most (each until it expires); beyond that, links are refused
/// until some expire, rather than forgetting one that could then be used again.
const MAX_SPENT: usize = 4096;

const NONCE_BYTES: usize = 16;
const TAG_BYTES: usize = 32;
const SIGNED_BYTES: usize = 8 + NONCE_BYTES + TAG_BYTES;

/// The sign-in state of one node: its keys and the links spent.
pub struct Sessions {
    /// Signs session cookies.
    key: hmac::Key,
    /// Signs login links.
    link_key: hmac::Key,
    /// The node's port: a link names it in its signature, so a link minted for this node is
    /// of no use to whatever listens on another port.
    port: u16,
    cookie_name: String,
    /// Add `Secure` to the cookie (the node serves HTTPS).
    secure: bool,
    /// Nonces of the links spent, with their expiry (unix seconds).
    spent: Mutex<VecDeque<([u8; NONCE_BYTES], u64)>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("cookie_name", &self.cookie_name)
            .field("secure", &self.secure)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Sessions of the node whose admin token is `token`, listening on `port` (cookies are per
    /// host, not per port: two nodes on one machine must not overwrite each other's), over
    /// HTTPS or not.
    pub fn new(token: &str, port: u16, secure: bool) -> Self {
        // A key of its own for cookies, so a cookie never reveals anything about the token.
        let root = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
        let derive =
            |purpose: &[u8]| hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&root, purpose).as_ref());
        Sessions {
            key: derive(b"modelrelay dashboard session key v1"),
            link_key: derive(b"modelrelay dashboard login link key v1"),
            port,
            cookie_name: format!("modelrelay_session_{port}"),
            secure,
            spent: Mutex::new(VecDeque::new()),
        }
    }

    /// A new one-time login code, valid for `lifetime`.
    pub fn mint_code(&self, lifetime: Duration) -> String {
        let expiry = unix_secs(SystemTime::now()) + lifetime.as_secs();
        URL_SAFE_NO_PAD.encode(signed(&self.link_key, expiry, &self.port.to_be_bytes()))
    }

    /// Spends `code`: true when it was signed for this node, has not expired and was not spent.
    pub fn redeem(&self, code: &str) -> bool {
        let now = unix_secs(SystemTime::now());
        let Some((nonce, expiry)) = verified(&self.link_key, code, now, &self.port.to_be_bytes())
        else {
            return false;
        };
        let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        spent.retain(|(_, until)| *until >= now);
        if spent.iter().any(|(known, _)| *known == nonce) || spent.len() >= MAX_SPENT {
            return false;
        }
        spent.push_back((nonce, expiry));
        true
    }

    /// The `Set-Cookie` value that starts a session now.
    pub fn start(&self) -> HeaderValue {
        let expiry = unix_secs(SystemTime::now()) + SESSION_LIFETIME.as_secs();
        self.set_cookie(
            &URL_SAFE_NO_PAD.encode(signed(&self.key, expiry, b"")),
            SESSION_LIFETIME.as_secs(),
        )
    }

    /// The `Set-Cookie` value that ends this browser's session.
    pub fn end(&self) -> HeaderValue {
        self.set_cookie("", 0)
    }

    fn set_cookie(&self, value: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!(
            "{}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
            self.cookie_name
        );
        HeaderValue::from_str(&cookie).expect("the cookie is ASCII")
    }

    /// Whether `headers` carry a session cookie this node signed and that has not expired.
    pub fn signed_in(&self, headers: &HeaderMap) -> bool {
        let now = unix_secs(SystemTime::now());
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .filter(|(name, _)| *name == self.cookie_name)
            .any(|(_, value)| self.valid(value, now))
    }

    fn valid(&self, value: &str, now: u64) -> bool {
        verified(&self.key, value, now, b"").is_some()
    }
}

/// `expiry`, a random nonce, and their signature with `key` (over them and `bound`, which the
/// value does not carry: the verifier supplies its own).
fn signed(key: &hmac::Key, expiry: u64, bound: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::rng().fill_bytes(&mut nonce);
    let mut value = Vec::with_capacity(SIGNED_BYTES);
    value.extend_from_slice(&expiry.to_be_bytes());
    value.extend_from_slice(&nonce);
    let signature = tag(key, &value, bound);
    value.extend_from_slice(signature.as_ref());
    value
}

fn tag(key: &hmac::Key, value: &[u8], bound: &[u8]) -> hmac::Tag {
    let mut context = hmac::Context::with_key(key);
    context.update(value);
    context.update(bound);
    context.sign()
}

/// The nonce and expiry of `text` when it is a value [`signed`] with `key` and `bound` that
/// expires after `now`.
fn verified(
    key: &hmac::Key,
    text: &str,
    now: u64,
    bound: &[u8],
) -> Option<([u8; NONCE_BYTES], u64)> {
    let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
    if bytes.len() != SIGNED_BYTES {
        return None;
    }
    let (value, tag) = bytes.split_at(8 + NONCE_BYTES);
    let mut signed_part = value.to_vec();
    signed_part.extend_from_slice(bound);
    hmac::verify(key, &signed_part, tag).ok()?;
    let expiry = u64::from_be_bytes(value[..8].try_into().ok()?);
    (expiry > now).then(|| (value[8..].try_into().expect("16 bytes"), expiry))
}

fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn cookie_pair(set_cookie: &HeaderValue) -> String {
        set_cookie
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    }

    #[test]
    fn a_code_is_spent_once() {
        let sessions = Sessions::new("token-0123456789abcdef", 8080, false);
        let code = sessions.mint_code(LINK_LIFETIME);
        assert!(!sessions.redeem("not-a-code"));
        assert!(sessions.redeem(&code));
        assert!(!sessions.redeem(&code), "a second use is refused");
    }

    #[test]
    fn an_expired_code_is_refused() {
        let sessions = Sessions::new("token-0123456789abcdef", 8080, false);
        let code = sessions.mint_code(Duration::ZERO);
        assert!(!sessions.redeem(&code));
    }

    #[test]
    fn a_code_is_good_only_for_the_token_that_signed_it() {
        let minted_elsewhere =
            Sessions::new("token-0123456789abcdef", 8080, false).mint_code(LINK_LIFETIME);
        // Another process holding the token (modelrelay dashboard) mints for the node.
        let node = Sessions::new("token-0123456789abcdef", 8080, false);
        assert!(node.redeem(&minted_elsewhere));
        let other = Sessions::new("another-token-0123456789", 8080, false);
        let code = node.mint_code(LINK_LIFETIME);
        assert!(!other.redeem(&code));
        let other_port = Sessions::new("token-0123456789abcdef", 9090, false);
        assert!(!other_port.redeem(&code), "a link names its node's port");
        // A cookie is not a link, nor the reverse: each has its own key.
        let cookie = cookie_pair(&node.start());
        assert!(!node.redeem(cookie.split_once('=').unwrap().1));
        assert!(!node.signed_in(&with_cookie(&format!("modelrelay_session_8080={code}"))));
    }

    #[test]
    fn the_cookie_is_http_only_strict_and_signed_by_this_token() {
        let sessions = Sessions::new("token-0123456789abcdef", 8080, true);
        let set = sessions.start();
        let text = set.to_str().unwrap();
        for attribute in [
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Path=/",
            "Max-Age=604800",
        ] {
            assert!(text.contains(attribute), "{text}");
        }
        let pair = cookie_pair(&set);
        assert!(pair.starts_with("modelrelay_session_8080="));
        assert!(sessions.signed_in(&with_cookie(&format!("theme=dark; {pair}"))));
        let other_token = Sessions::new("another-token-0123456789", 8080, true);
        assert!(
            !other_token.signed_in(&with_cookie(&pair)),
            "a new token ends sessions"
        );
        let other_port = Sessions::new("token-0123456789abcdef", 9090, true);
        assert!(!other_port.signed_in(&with_cookie(&pair)));
        assert!(!sessions.signed_in(&HeaderMap::new()));
    }

    #[test]
    fn a_forged_or_altered_cookie_is_refused() {
        let sessions = Sessions::new("token-0123456789abcdef", 8080, false);
        let pair = cookie_pair(&sessions.start());
        let (name, value) = pair.split_once('=').unwrap();
        let mut bytes = URL_SAFE_NO_PAD.decode(value).unwrap();
        // Pushing the expiry forward breaks the signature.
        bytes[0] ^= 0x01;
        let altered = format!("{name}={}", URL_SAFE_NO_PAD.encode(&bytes));
        assert!(!sessions.signed_in(&with_cookie(&altered)));
        for junk in ["", "x", "%%%", &"A".repeat(4096)] {
            assert!(!sessions.signed_in(&with_cookie(&format!("{name}={junk}"))));
        }
        assert!(!sessions.signed_in(&with_cookie(
            &sessions.end().to_str().unwrap().replace("; ", ";")
        )));
    }

    #[test]
    fn an_expired_cookie_is_refused() {
        let sessions = Sessions::new("token-0123456789abcdef", 8080, false);
        let value = signed(&sessions.key, 1, b"");
        let cookie = format!("modelrelay_session_8080={}", URL_SAFE_NO_PAD.encode(value));
        assert!(!sessions.signed_in(&with_cookie(&cookie)));
    }
}
