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

use crate::protocol::{HeaderMap, CLIENT_AUTH_HEADERS};

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
pub fn strip_client_auth(headers: &mut HeaderMap) {
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
    fn client_credentials_are_stripped_whatever_their_case() {
        let mut headers: HeaderMap = [
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
