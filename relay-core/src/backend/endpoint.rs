//! Where on its backend a worker sends a request, and which client headers go with it.
//!
//! The proxy names the route (`endpoint_path`), but anyone who knows the worker secret can run a
//! proxy, so the worker trusts the path no more than network input: it must be an absolute path
//! on the backend — no scheme, no authority, no `@`, no backslash, no `..` segment, plainly or
//! percent-encoded — and it is joined onto the parsed backend URL, never concatenated to it. A
//! path like `@169.254.169.254/x` or `//evil.example/x` would otherwise turn into a request to
//! another host.

use std::cell::RefCell;

use reqwest::Url;

use crate::endpoint::Endpoint;
use crate::protocol::{WireHeaders, CLIENT_AUTH_HEADERS, FORWARDED_HEADERS};

/// Why an `endpoint_path` was refused.
pub fn check_path(path: &str) -> Result<(), String> {
    let refuse = |why: &str| Err(format!("endpoint_path {path:?} refused: {why}"));
    let route = path.split('?').next().unwrap_or(path);
    if !route.starts_with('/') {
        return refuse("it must be an absolute path on the backend, starting with /");
    }
    if route.starts_with("//") {
        return refuse("it names another host (//)");
    }
    if path
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '\\' | '@' | '#'))
    {
        return refuse("it contains a control character, whitespace, \\, @ or #");
    }
    let lower = route.to_ascii_lowercase();
    if lower.contains("%2f") || lower.contains("%5c") || lower.contains("%00") {
        return refuse("it contains an encoded / or \\ or NUL");
    }
    let decoded_dots = lower.replace("%2e", ".");
    if decoded_dots
        .split('/')
        .any(|segment| segment == ".." || segment == ".")
    {
        return refuse("it contains a . or .. segment");
    }
    Ok(())
}

/// Why a request for `path` is not forwarded: only the inference routes the protocol carries
/// ([`Endpoint::INFERENCE`]) and the routes the box's owner added (`extra`, `[worker] extra_routes`)
/// are. Anyone with the worker secret can run a proxy; without this, one could make the worker
/// call any route of its backend (Ollama's `/api/pull`, `/api/delete`, llama-server's `/slots`).
pub fn check_route(path: &str, extra: &[String]) -> Result<(), String> {
    let route = path.split('?').next().unwrap_or(path);
    let route = match route.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    };
    if Endpoint::of(route).is_inference() || extra.iter().any(|r| r.trim_end_matches('/') == route)
    {
        return Ok(());
    }
    Err(format!(
        "endpoint_path {path:?} refused: this worker forwards only the inference routes ({}) \
         and those its owner adds with `extra_routes` in its [worker] settings",
        Endpoint::INFERENCE
            .iter()
            .filter_map(|e| e.path())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Keeps only the headers a proxy forwards ([`FORWARDED_HEADERS`] and the client's
/// credentials, which [`strip_client_auth`] handles): whatever else a proxy sends (`cookie`,
/// `host`, `x-forwarded-for`, ...) never reaches the backend.
pub fn keep_forwarded_headers(headers: &mut WireHeaders) {
    headers.retain(|name, _| {
        FORWARDED_HEADERS
            .iter()
            .chain(CLIENT_AUTH_HEADERS)
            .any(|kept| name.eq_ignore_ascii_case(kept))
    });
}

/// The URL of `path` on the backend at `base` (whose own path, if any, is kept as a prefix).
pub fn join(base: &str, path: &str) -> Result<Url, String> {
    check_path(path)?;
    let base_url = parsed(base)?;
    let (route, query) = match path.split_once('?') {
        Some((route, query)) => (route, Some(query)),
        None => (path, None),
    };
    let mut url = base_url.clone();
    url.set_path(&format!("{}{route}", base_url.path().trim_end_matches('/')));
    url.set_query(query);
    url.set_fragment(None);
    // The join can only have changed the path and query; checked anyway, since a request to
    // another host is exactly what this module exists to prevent.
    if url.scheme() != base_url.scheme()
        || url.host() != base_url.host()
        || url.port_or_known_default() != base_url.port_or_known_default()
        || !url.username().is_empty()
    {
        return Err(format!(
            "endpoint_path {path:?} refused: it would leave the backend {base}"
        ));
    }
    Ok(url)
}

/// Backend URLs parsed on this thread lately, most recent first.
const PARSED_REMEMBERED: usize = 8;

thread_local! {
    static PARSED: RefCell<Vec<(Box<str>, Url)>> = const { RefCell::new(Vec::new()) };
}

/// `base` parsed, from this thread's memo when it was parsed lately. Parsing a URL (its host
/// through IDNA mapping) for every request was 4.5% of the worker's CPU in the round-2 profile
/// (BENCHMARKS.md); a worker has a handful of backends, so a few entries per runtime thread
/// catch them all. The memo is pure: the same text always parses to the same URL.
fn parsed(base: &str) -> Result<Url, String> {
    PARSED.with(|memo| {
        let mut memo = memo.borrow_mut();
        if let Some(at) = memo.iter().position(|(text, _)| &**text == base) {
            let entry = memo.remove(at);
            let url = entry.1.clone();
            memo.insert(0, entry);
            return Ok(url);
        }
        let url = Url::parse(base).map_err(|e| format!("backend URL {base:?} is invalid: {e}"))?;
        memo.truncate(PARSED_REMEMBERED - 1);
        memo.insert(0, (base.into(), url.clone()));
        Ok(url)
    })
}

/// Removes the client's credentials from `headers` (see [`CLIENT_AUTH_HEADERS`]): the backend
/// gets them only when the worker opts in.
pub fn strip_client_auth(headers: &mut WireHeaders) {
    headers.retain(|name, _| {
        !CLIENT_AUTH_HEADERS
            .iter()
            .any(|auth| name.eq_ignore_ascii_case(auth))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parse_memo_gives_each_base_its_own_url_and_remembers_a_bounded_few() {
        for round in 0..2 {
            for n in 0..(PARSED_REMEMBERED + 3) {
                let base = format!("http://10.0.0.{n}:8000/p{n}");
                let url = join(&base, "/v1/models").unwrap();
                assert_eq!(url.as_str(), format!("{base}/v1/models"), "round {round}");
            }
        }
        assert_eq!(PARSED.with(|memo| memo.borrow().len()), PARSED_REMEMBERED);
        assert!(join("not a url", "/v1/models")
            .unwrap_err()
            .contains("invalid"));
        assert!(join("not a url", "/v1/models")
            .unwrap_err()
            .contains("invalid"));
    }

    #[test]
    fn api_paths_join_onto_the_backend_keeping_its_prefix_and_the_query() {
        assert_eq!(
            join("http://127.0.0.1:8000", "/v1/chat/completions")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        assert_eq!(
            join("http://10.0.0.5:8000/prefix/", "/v1/messages?beta=true")
                .unwrap()
                .as_str(),
            "http://10.0.0.5:8000/prefix/v1/messages?beta=true"
        );
        assert_eq!(
            join("http://h:1", "/v1/models/org%2Dname").unwrap().path(),
            "/v1/models/org%2Dname"
        );
    }

    #[test]
    fn paths_that_leave_the_backend_are_refused() {
        for path in [
            "@169.254.169.254/x",
            "/@169.254.169.254/x",
            "//evil.example/x",
            "http://evil.example/x",
            "evil.example/x",
            "",
            "/../x",
            "/v1/../../etc/passwd",
            "/v1/%2e%2e/x",
            "/v1/.%2E/x",
            "/v1/%2E./x",
            "/v1/./x",
            "/v1%2f..%2fx",
            "/v1\\..\\x",
            "/v1/x#frag",
            "/v1/x y",
            "/v1/\nHost: evil",
            "/v1/x%00",
        ] {
            assert!(check_path(path).is_err(), "{path:?} accepted");
            assert!(
                join("http://127.0.0.1:8000", path).is_err(),
                "{path:?} joined"
            );
        }
    }

    #[test]
    fn only_inference_routes_and_the_owners_extra_routes_are_forwarded() {
        for path in [
            "/v1/chat/completions",
            "/v1/chat/completions/",
            "/v1/messages?beta=true",
            "/v1/messages/count_tokens",
            "/v1/responses",
            "/v1/embeddings",
            "/v1/completions",
        ] {
            assert!(check_route(path, &[]).is_ok(), "{path}");
        }
        for path in [
            "/api/pull",
            "/api/delete",
            "/slots",
            "/props",
            "/v1/models",
            "/",
            "/v1/chat/completions/../x",
            "/v1/chat",
            "/v1/responses/resp_1",
        ] {
            let refused = check_route(path, &[]).unwrap_err();
            assert!(refused.contains("extra_routes"), "{path}: {refused}");
        }
        let extra = vec!["/api/generate".to_string()];
        assert!(check_route("/api/generate", &extra).is_ok());
        assert!(check_route("/api/pull", &extra).is_err());
    }

    #[test]
    fn only_the_headers_a_proxy_forwards_reach_the_backend() {
        let mut headers: WireHeaders = [
            ("Content-Type", "application/json"),
            ("anthropic-version", "2023-06-01"),
            ("Authorization", "Bearer sk"),
            ("cookie", "session=stolen"),
            ("x-injected", "1"),
            ("host", "evil.example"),
            ("x-forwarded-for", "203.0.113.9"),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        keep_forwarded_headers(&mut headers);
        let names: Vec<&str> = headers.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["Authorization", "Content-Type", "anthropic-version"]
        );
    }

    #[test]
    fn client_credentials_are_stripped_whatever_their_case() {
        let mut headers: WireHeaders = [
            ("Authorization".to_string(), "Bearer sk".to_string()),
            ("x-api-key".to_string(), "k".to_string()),
            ("anthropic-version".to_string(), "2023-06-01".to_string()),
        ]
        .into();
        strip_client_auth(&mut headers);
        let names: Vec<&str> = headers.keys().map(String::as_str).collect();
        assert_eq!(names, ["anthropic-version"]);
    }

    proptest::proptest! {
        /// Whatever the path, a joined URL never points anywhere but the backend.
        #[test]
        fn no_path_reaches_another_host(path in "\\PC{0,60}") {
            if let Ok(url) = join("http://127.0.0.1:8000/base", &path) {
                proptest::prop_assert_eq!(url.host_str(), Some("127.0.0.1"));
                proptest::prop_assert_eq!(url.port(), Some(8000));
                proptest::prop_assert!(url.path().starts_with("/base/"), "{}", url);
                proptest::prop_assert!(!url.path().contains("/../"), "{}", url);
            }
        }
    }
}
