//! The web UI, built by Vite into `ui/dist` and embedded in the binary, so one file serves it.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "../ui/dist"]
struct Ui;

/// The embedded file at `path` (`""` and `"/"` mean `index.html`), or `None`.
pub fn serve(path: &str) -> Option<Response> {
    let path = path.trim_start_matches('/');
    let path = if path.is_empty() { "index.html" } else { path };
    let file = Ui::get(path)?;
    let mut response = Response::new(Body::from(file.data.into_owned()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    if let Ok(mime) = HeaderValue::from_str(file.metadata.mimetype()) {
        headers.insert(header::CONTENT_TYPE, mime);
    }
    // Vite names bundles by content hash, so they never change; the page itself must be
    // re-read to pick up a new build.
    let cache = if path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_page_is_embedded_and_served_at_the_root() {
        let response = serve("/").expect("ui/dist/index.html is embedded");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "text/html",
            "{:?}",
            response.headers()
        );
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-cache");
    }

    #[test]
    fn missing_files_are_none() {
        assert!(serve("/no/such/file.js").is_none());
    }
}
