//! The HTTP client a [`Backend`](super::Backend) is reached with, and its answer.
//!
//! Two clients behind one small interface: reqwest for the proxy's upstreams (cloud APIs over
//! TLS, perhaps through a proxy) and for backends that are not plain HTTP, and the worker's own
//! [`LocalClient`] for its plain-HTTP backends (why: [`local`]).

pub mod framing;
mod local;
#[cfg(test)]
mod tests;

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;

use crate::protocol::WireHeaders;

pub use local::{LocalClient, CONNECTS_PER_BACKEND};

/// How a backend is reached.
#[derive(Debug, Clone)]
pub enum HttpClient {
    /// reqwest: TLS, system proxies, anything a URL can name.
    General(reqwest::Client),
    /// The worker's client for plain-HTTP backends; `https` URLs still go through `General`.
    Local {
        local: LocalClient,
        general: reqwest::Client,
    },
}

impl From<reqwest::Client> for HttpClient {
    fn from(client: reqwest::Client) -> Self {
        HttpClient::General(client)
    }
}

impl HttpClient {
    /// POSTs `body` with `headers` (less those the client writes itself) to `url`.
    pub async fn post(
        &self,
        url: reqwest::Url,
        headers: &WireHeaders,
        body: Bytes,
    ) -> Result<Response, HttpError> {
        let sent = std::time::Instant::now();
        match self {
            HttpClient::Local { local, .. } if url.scheme() == "http" => {
                // An IPv6 host comes bracketed ("[::1]"), as an authority needs it.
                let authority = match (url.host_str(), url.port_or_known_default()) {
                    (Some(host), Some(port)) => format!("{host}:{port}"),
                    _ => return Err(HttpError::message(format!("{url} names no host"))),
                };
                let target = match url.query() {
                    Some(query) => format!("{}?{query}", url.path()),
                    None => url.path().to_string(),
                };
                let headers = headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
                let request = framing::post_request(&authority, &target, headers, &body)
                    .map_err(HttpError::framing)?;
                let answer = local.send(&authority, &request).await?;
                Ok(Response {
                    status: answer.status,
                    headers: answer.headers,
                    body: Body::Local(answer.body),
                    sent,
                })
            }
            HttpClient::Local { general, .. } | HttpClient::General(general) => {
                let mut builder = general.post(url).body(body);
                for (name, value) in headers {
                    if !framing::written_by_client(name) {
                        builder = builder.header(name.as_str(), value.as_str());
                    }
                }
                let response = builder.send().await.map_err(HttpError::General)?;
                Ok(Response {
                    status: response.status(),
                    headers: response.headers().clone(),
                    body: Body::General(response),
                    sent,
                })
            }
        }
    }
}

/// A backend's answer: status and headers, and the body to read.
#[derive(Debug)]
pub struct Response {
    status: StatusCode,
    headers: HeaderMap,
    body: Body,
    /// When the request went out: what a backend's time to first token counts from.
    sent: std::time::Instant,
}

#[derive(Debug)]
enum Body {
    General(reqwest::Response),
    Local(local::Body),
}

impl Response {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// When its request went out.
    pub fn sent(&self) -> std::time::Instant {
        self.sent
    }

    /// The next piece of the body; `None` at its end. Cancel-safe.
    pub async fn chunk(&mut self) -> Option<Result<Bytes, HttpError>> {
        match &mut self.body {
            Body::General(response) => response
                .chunk()
                .await
                .map_err(HttpError::General)
                .transpose(),
            Body::Local(body) => body.chunk().await,
        }
    }

    /// The whole body as text (invalid UTF-8 replaced), at most `limit` bytes.
    pub async fn text(mut self, limit: usize) -> Result<String, HttpError> {
        let mut bytes = Vec::new();
        while let Some(piece) = self.chunk().await {
            let piece = piece?;
            if bytes.len() + piece.len() > limit {
                return Err(HttpError::message(format!(
                    "the backend's answer exceeds {limit} bytes"
                )));
            }
            bytes.extend_from_slice(&piece);
        }
        Ok(String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }
}

/// Why a backend request failed.
#[derive(Debug)]
pub enum HttpError {
    /// reqwest's.
    General(reqwest::Error),
    /// The local client's.
    Local {
        message: String,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
        /// Closed by the backend before a byte of the answer on a reused connection.
        unanswered: bool,
    },
}

impl HttpError {
    fn message(message: String) -> Self {
        HttpError::Local {
            message,
            source: None,
            unanswered: false,
        }
    }

    fn io(message: String, error: std::io::Error) -> Self {
        HttpError::Local {
            message,
            source: Some(Box::new(error)),
            unanswered: false,
        }
    }

    fn framing(error: framing::FramingError) -> Self {
        HttpError::message(error.0)
    }

    fn unanswered_if(mut self, reused: bool) -> Self {
        if let HttpError::Local { unanswered, .. } = &mut self {
            *unanswered = reused;
        }
        self
    }

    /// Whether the backend closed the connection before any of its answer arrived: an idle
    /// connection it was closing as the request went out (hyper's "connection closed before
    /// message completed"), not a refused connect, a timeout or a reset mid-answer.
    pub fn closed_unanswered(&self) -> bool {
        match self {
            HttpError::Local { unanswered, .. } => *unanswered,
            HttpError::General(error) => {
                let mut source = std::error::Error::source(error);
                while let Some(cause) = source {
                    if let Some(hyper_error) = cause.downcast_ref::<hyper::Error>() {
                        return hyper_error.is_incomplete_message();
                    }
                    source = cause.source();
                }
                false
            }
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::General(error) => error.fmt(f),
            HttpError::Local { message, .. } => f.write_str(message),
        }
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HttpError::General(error) => error.source(),
            HttpError::Local { source, .. } => source
                .as_deref()
                .map(|error| error as &(dyn std::error::Error + 'static)),
        }
    }
}
