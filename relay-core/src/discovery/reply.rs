//! A backend's answer to a probe, read bounded, and the errors that name what went wrong.

use super::*;

/// Model lists are small (a few KiB even for large Ollama libraries); the cap
/// only keeps a misbehaving server from filling memory before the timeout hits.
pub(super) const MAX_BODY: usize = 4 * 1024 * 1024;

/// How much of an error body to quote in [`DiscoveryError::Status`].
pub(super) const MAX_DETAIL_CHARS: usize = 200;

/// One HTTP answer, whatever its status.
pub(super) struct Reply {
    pub(super) status: reqwest::StatusCode,
    pub(super) server: Option<String>,
    pub(super) body: Vec<u8>,
    pub(super) truncated: bool,
}

impl Reply {
    pub(super) fn text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    pub(super) fn json(&self) -> Result<Value, String> {
        if self.truncated {
            return Err(format!("body is larger than {} MiB", MAX_BODY >> 20));
        }
        serde_json::from_slice(&self.body).map_err(|err| format!("body is not JSON ({err})"))
    }

    /// Whether a llama.cpp server signed it (`Server: llama.cpp`, on every answer it sends,
    /// errors and the 503s of its model loading too).
    pub(super) fn signed_by_llama_cpp(&self) -> bool {
        (self.server.as_deref())
            .is_some_and(|server| server.to_ascii_lowercase().contains("llama.cpp"))
    }

    /// The JSON body of a successful answer.
    pub(super) fn json_ok(&self) -> Option<Value> {
        if self.status.is_success() {
            self.json().ok()
        } else {
            None
        }
    }

    pub(super) fn openai_list(&self) -> Option<ModelList> {
        parse_openai_list(&self.json_ok()?).ok()
    }

    pub(super) fn ollama_tags(&self) -> Option<Vec<String>> {
        parse_ollama_tags(&self.json_ok()?).ok()
    }

    pub(super) fn openai_list_or_error(&self, url: &str) -> Result<ModelList, DiscoveryError> {
        self.check_status(url)?;
        self.json()
            .and_then(|v| parse_openai_list(&v))
            .map_err(|reason| bad_body(url, reason))
    }

    pub(super) fn ollama_tags_or_error(&self, url: &str) -> Result<Vec<String>, DiscoveryError> {
        self.check_status(url)?;
        self.json()
            .and_then(|v| parse_ollama_tags(&v))
            .map_err(|reason| bad_body(url, reason))
    }

    pub(super) fn check_status(&self, url: &str) -> Result<(), DiscoveryError> {
        if self.status.is_success() {
            return Ok(());
        }
        Err(DiscoveryError::Status {
            url: url.to_owned(),
            status: self.status.as_u16(),
            detail: self.detail(),
        })
    }

    /// The start of the body, if it is text worth showing a human: a JSON or
    /// plain-text explanation helps ("invalid API key"), an HTML page does not.
    pub(super) fn detail(&self) -> String {
        let text = self.text();
        let text = text.trim();
        if text.is_empty() || text.starts_with('<') {
            return String::new();
        }
        let mut detail: String = text
            .chars()
            .take(MAX_DETAIL_CHARS)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if text.chars().count() > MAX_DETAIL_CHARS {
            detail.push('…');
        }
        detail
    }
}

pub(super) fn bad_body(url: &str, reason: String) -> DiscoveryError {
    DiscoveryError::BadBody {
        url: url.to_owned(),
        reason,
    }
}

pub(super) async fn get(client: &reqwest::Client, url: &str) -> Result<Reply, DiscoveryError> {
    read_answer(url, client.get(url)).await
}

/// [`get`], for a `POST` of `body` as JSON.
pub(super) async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> Result<Reply, DiscoveryError> {
    let request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string());
    read_answer(url, request).await
}

/// Sends `request` and reads its answer, at most [`MAX_BODY`] bytes of it.
pub(super) async fn read_answer(
    url: &str,
    request: reqwest::RequestBuilder,
) -> Result<Reply, DiscoveryError> {
    let mut response = request
        .send()
        .await
        .map_err(|err| transport_error(url, &err))?;
    let status = response.status();
    let server = response
        .headers()
        .get(reqwest::header::SERVER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| transport_error(url, &err))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            truncated = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Reply {
        status,
        server,
        body,
        truncated,
    })
}

pub(super) fn transport_error(url: &str, err: &reqwest::Error) -> DiscoveryError {
    let url = url.to_owned();
    if err.is_builder() {
        DiscoveryError::InvalidUrl {
            url,
            reason: root_cause(err),
        }
    } else if err.is_timeout() {
        DiscoveryError::Timeout { url }
    } else if err.is_connect() {
        DiscoveryError::Connect {
            url,
            reason: root_cause(err),
        }
    } else {
        DiscoveryError::Request {
            url,
            reason: root_cause(err),
        }
    }
}

/// reqwest's own message is "error sending request for url (…)"; the useful
/// part ("Connection refused (os error 111)") is at the bottom of the chain.
pub(super) fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(source) = current.source() {
        current = source;
    }
    current.to_string()
}
