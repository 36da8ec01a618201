//! A request's place in the queue's turns: who asks and how urgent it is.
//!
//! Who: the client key's id; without a key, the peer's IP address (each machine takes its own
//! turns; behind a reverse proxy every request shares the proxy's address, which is one client,
//! the anonymous client of old). How urgent: the key's priority, which the
//! `x-modelrelay-priority` header may lower to `batch` but never raise. A key marked batch is
//! an administrator's decision about shared capacity (an agent's key, an evaluation's), and the
//! agent sending the requests must not be able to undo it with a header; a client lowering its
//! own request costs nobody anything, so any client may.

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};

use crate::dialect::ApiError;
use crate::proxy::dispatch::scheduler::{Placement, Priority};
use crate::store::{ApiKey, KeyPriority};

/// The request header that asks for a priority: `interactive` or `batch`.
pub const PRIORITY_HEADER: &str = "x-modelrelay-priority";

/// Header values quoted back in an error at most this long; longer ones are described.
const QUOTED_VALUE_BYTES: usize = 32;

/// Who takes turns in the queue: the key's id (`key_…`), else `addr:` and the peer's IP, else
/// nobody known (one shared client).
pub fn client_of(key: Option<&ApiKey>, peer: Option<IpAddr>) -> Option<Arc<str>> {
    match (key, peer) {
        (Some(key), _) => Some(Arc::from(key.id.as_str())),
        (None, Some(ip)) => Some(Arc::from(format!("addr:{ip}"))),
        (None, None) => None,
    }
}

/// The request's client and priority, or a 400 naming what is wrong with its priority header.
pub fn placement_of(
    key: Option<&ApiKey>,
    client: Option<Arc<str>>,
    headers: &HeaderMap,
) -> Result<Placement, ApiError> {
    let ceiling = match key.map(|k| k.priority) {
        Some(KeyPriority::Batch) => Priority::Batch,
        Some(KeyPriority::Interactive) | None => Priority::Interactive,
    };
    let asked = requested(headers)?.unwrap_or(ceiling);
    Ok(Placement {
        client,
        priority: asked.min(ceiling),
        weight: key.and_then(|k| k.weight).unwrap_or(1),
        ..Placement::default()
    })
}

/// The priority the header asks for, if it is there.
fn requested(headers: &HeaderMap) -> Result<Option<Priority>, ApiError> {
    let mut values = headers.get_all(PRIORITY_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(invalid(format!(
            "`{PRIORITY_HEADER}` was sent more than once; send it once, as `interactive` or `batch`"
        )));
    }
    let text = value.to_str().unwrap_or_default().trim();
    if text.eq_ignore_ascii_case("interactive") {
        Ok(Some(Priority::Interactive))
    } else if text.eq_ignore_ascii_case("batch") {
        Ok(Some(Priority::Batch))
    } else {
        let shown = if value.to_str().is_err() {
            format!("a value of {} bytes that is not visible ASCII", value.len())
        } else if text.len() > QUOTED_VALUE_BYTES {
            format!("a value of {} bytes", text.len())
        } else {
            format!("{text:?}")
        };
        Err(invalid(format!(
            "`{PRIORITY_HEADER}` must be `interactive` or `batch`, got {shown}"
        )))
    }
}

fn invalid(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_priority", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn key(priority: KeyPriority) -> ApiKey {
        ApiKey {
            id: "key_00000000000000aa".into(),
            name: "agent".into(),
            prefix: "mr-AbCdE".into(),
            created_at: 0,
            revoked_at: None,
            last_used_at: None,
            models: None,
            max_concurrent: None,
            requests_per_minute: None,
            priority,
            weight: None,
        }
    }

    fn with_header(values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(PRIORITY_HEADER, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    fn priority(key: Option<&ApiKey>, headers: &HeaderMap) -> Result<Priority, ApiError> {
        placement_of(key, None, headers).map(|p| p.priority)
    }

    #[test]
    fn without_a_header_a_request_has_its_keys_priority_and_interactive_without_a_key() {
        let none = HeaderMap::new();
        assert_eq!(priority(None, &none).unwrap(), Priority::Interactive);
        let batch = key(KeyPriority::Batch);
        assert_eq!(priority(Some(&batch), &none).unwrap(), Priority::Batch);
        let interactive = key(KeyPriority::Interactive);
        assert_eq!(
            priority(Some(&interactive), &none).unwrap(),
            Priority::Interactive
        );
    }

    #[test]
    fn the_header_lowers_a_request_to_batch_but_never_raises_a_batch_key() {
        let interactive = key(KeyPriority::Interactive);
        let batch = key(KeyPriority::Batch);
        let lower = with_header(&[b" Batch "]);
        let raise = with_header(&[b"INTERACTIVE"]);
        assert_eq!(priority(None, &lower).unwrap(), Priority::Batch);
        assert_eq!(
            priority(Some(&interactive), &lower).unwrap(),
            Priority::Batch
        );
        assert_eq!(priority(Some(&batch), &raise).unwrap(), Priority::Batch);
        assert_eq!(
            priority(Some(&interactive), &raise).unwrap(),
            Priority::Interactive
        );
    }

    #[test]
    fn a_bad_priority_header_is_refused_with_what_was_wrong() {
        let long = "b".repeat(5000);
        let cases: [(&[&[u8]], &str); 6] = [
            (&[b"urgent"], "got \"urgent\""),
            (&[b""], "got \"\""),
            (&[long.as_bytes()], "got a value of 5000 bytes"),
            (&[b"batch\xff"], "not visible ASCII"),
            (&[b"batch", b"batch"], "more than once"),
            (&[b"batch,interactive"], "must be `interactive` or `batch`"),
        ];
        for (values, expected) in cases {
            let refused = priority(None, &with_header(values)).unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_REQUEST);
            assert_eq!(refused.code, "invalid_priority");
            assert!(refused.message.contains(expected), "{}", refused.message);
            assert!(refused.message.len() < 200, "the value is not echoed whole");
        }
    }

    #[test]
    fn a_key_is_its_own_client_and_without_one_each_address_is() {
        let key = key(KeyPriority::Interactive);
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            client_of(Some(&key), Some(ip)).as_deref(),
            Some("key_00000000000000aa")
        );
        assert_eq!(client_of(None, Some(ip)).as_deref(), Some("addr:10.1.2.3"));
        assert_eq!(client_of(None, None), None);
    }
}
