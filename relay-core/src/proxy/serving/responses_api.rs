//! `POST /v1/responses` with the [`ResponsesStore`], `GET` / `DELETE /v1/responses/{id}`, and
//! `GET /v1/responses/{id}/input_items`.
//!
//! A request with `previous_response_id` is expanded here, before dispatch: the stored
//! conversation and the new input become one standalone Responses request (the id removed), so
//! whichever worker gets it — translating for a chat-only backend or passing through to a
//! native one — sees the whole conversation. The answer is watched on its way to the client
//! (the whole body, or the `response.completed` event of a stream) and stored under its id
//! unless the request said `store: false`. A streamed answer is also patched on its way out
//! ([`patch_stream`]): a continuation's response objects echo `previous_response_id` (the
//! worker never saw it), and events a native backend sent without `sequence_number` get one.
//! Only `/v1/responses` requests pay for any of this.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::adapter::canonical::Message;
use crate::adapter::openai_responses::{
    expand_with_history, input_items, output_messages, parse_request, StoredConversation,
};
use crate::dialect::{ApiError, Dialect};
use crate::protocol::ResponseCompleteMessage;
use crate::proxy::access::client_keys::ClientIdentity;
use crate::proxy::serving::completed_event::CompletedWatch;
use crate::proxy::serving::response::AnswerObserver;
use crate::proxy::serving::responses_shared::SharedResponses;
use crate::proxy::serving::responses_store::{ResponsesStore, StoredResponse};
use crate::proxy::serving::stream_patch::StreamPatcher;
use crate::proxy::AppState;

/// A `POST /v1/responses` body ready for dispatch.
pub struct Prepared {
    /// What the worker receives: the client's body, or the expanded one for a continuation.
    pub body: String,
    /// Stores the answer; `None` for `store: false` or a body the store cannot keep.
    pub recorder: Option<Recorder>,
    /// The `previous_response_id` a continuation continued, for [`patch_stream`] to echo.
    pub continues: Option<String>,
}

/// Resolves `previous_response_id` against `store` and sets up recording of the answer. An
/// unknown (or expired) id is a 404, as OpenAI answers it. An expanded request may not exceed
/// `max_body_bytes` either, so no worker gets more than a client could send it directly.
pub async fn prepare(
    store: &Arc<ResponsesStore>,
    shared: Option<&SharedResponses>,
    owner: Arc<str>,
    body: String,
    max_body_bytes: usize,
) -> Result<Prepared, ApiError> {
    let mut request: Value = serde_json::from_str(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("invalid JSON in request body: {e}"),
        )
    })?;
    let wants_storing = request.get("store") != Some(&Value::Bool(false));
    let previous = match request.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "previous_response_id: expected a string",
            ))
        }
    };
    let Some(previous) = previous else {
        // A standalone request goes out as the client sent it. One the adapter cannot read is
        // still dispatched (a native backend may take it); it just cannot be continued.
        let recorder = wants_storing
            .then(|| parse_request(&request).ok())
            .flatten()
            .map(|parsed| Recorder::new(store, shared, owner, parsed.messages, None));
        return Ok(Prepared {
            body,
            recorder,
            continues: None,
        });
    };
    let stored = lookup(store, shared, &previous, &owner)
        .await
        .ok_or_else(|| previous_not_found(&previous))?;
    let expanded = expand_with_history(&stored.conversation, &request)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()))?;
    if let Some(fields) = request.as_object_mut() {
        fields.remove("previous_response_id");
        fields.insert(
            "input".to_string(),
            Value::Array(input_items(&expanded.messages)),
        );
    }
    let body = request.to_string();
    if body.len() > max_body_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "the conversation continued from {previous} with this input is {} bytes, over \
                 the relay's limit of {max_body_bytes} bytes (MAX_BODY_BYTES); start a new one",
                body.len()
            ),
        ));
    }
    let recorder = wants_storing.then(|| {
        Recorder::new(
            store,
            shared,
            owner,
            expanded.messages,
            Some(previous.clone()),
        )
    });
    Ok(Prepared {
        body,
        recorder,
        continues: Some(previous),
    })
}

/// The response stored as `id`, if it is `owner`'s: from memory, else from the database other
/// proxies share (kept in memory from then on). Another client's is as good as none: it is not
/// found, so nobody learns that it exists.
async fn lookup(
    store: &Arc<ResponsesStore>,
    shared: Option<&SharedResponses>,
    id: &str,
    owner: &str,
) -> Option<Arc<StoredResponse>> {
    let stored = match store.get(id, Instant::now()) {
        Some(stored) => stored,
        None => {
            let stored = shared?.get(id).await?;
            store.insert(id, stored.clone(), Instant::now());
            Arc::new(stored)
        }
    };
    (*stored.owner == *owner).then_some(stored)
}

/// Whose a request is, for the store: its key's id, else its address (`addr:IP`).
fn owner_of(identity: Option<&ClientIdentity>) -> Arc<str> {
    identity
        .and_then(|identity| identity.client.clone())
        .unwrap_or_else(|| Arc::from(""))
}

fn previous_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "previous_response_not_found",
        format!("Previous response with id '{id}' not found."),
    )
}

fn response_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "response_not_found",
        format!("Response with id '{id}' not found."),
    )
}

/// Stores a request's answer once it is complete.
pub struct Recorder {
    store: Arc<ResponsesStore>,
    /// Whose the answer will be.
    owner: Arc<str>,
    /// The copy other proxies read, when they share a database.
    shared: Option<SharedResponses>,
    /// The conversation the request carried (the stored history plus its own input).
    history: Vec<Message>,
    /// The id the request continued, echoed in the stored response.
    previous: Option<String>,
    watch: CompletedWatch,
    done: bool,
}

impl Recorder {
    fn new(
        store: &Arc<ResponsesStore>,
        shared: Option<&SharedResponses>,
        owner: Arc<str>,
        history: Vec<Message>,
        previous: Option<String>,
    ) -> Self {
        Recorder {
            watch: CompletedWatch::new(store.limits().max_bytes),
            store: store.clone(),
            owner,
            shared: shared.cloned(),
            history,
            previous,
            done: false,
        }
    }

    /// Sets `previous_response_id` in an answer made from the expanded request (which had none).
    /// Only an object can carry it: an answer that is JSON but not an object (a backend's
    /// mistake) passes as it is, and is not stored.
    fn echo_previous(&self, response: &mut Value) -> bool {
        let (Some(previous), Some(fields)) = (&self.previous, response.as_object_mut()) else {
            return false;
        };
        match fields.get("previous_response_id") {
            None | Some(Value::Null) => {
                fields.insert("previous_response_id".to_string(), json!(previous));
                true
            }
            Some(_) => false,
        }
    }

    fn record(&mut self, mut response: Value) {
        self.done = true;
        self.echo_previous(&mut response);
        let Some(id) = response
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
        else {
            return;
        };
        let output = match output_messages(&response) {
            Ok(output) => output,
            Err(error) => {
                tracing::info!(%id, "response not stored: its output cannot be read: {error}");
                return;
            }
        };
        let mut messages = std::mem::take(&mut self.history);
        let input_len = messages.len();
        messages.extend(output);
        let stored = StoredResponse {
            response,
            conversation: StoredConversation { messages },
            input_len,
            owner: self.owner.clone(),
        };
        if let Some(shared) = &self.shared {
            // The database keeps the first row of an id too.
            shared.put(&id, &stored);
        }
        self.store.insert_new(&id, stored, Instant::now());
    }
}

impl AnswerObserver for Recorder {
    fn complete(&mut self, complete: &mut ResponseCompleteMessage) {
        if self.done || !(200..300).contains(&complete.status_code) {
            return;
        }
        let Some(mut response) = complete
            .body
            .as_deref()
            .and_then(|body| serde_json::from_str::<Value>(body).ok())
        else {
            return;
        };
        if self.echo_previous(&mut response) {
            complete.body = Some(response.to_string());
        }
        self.record(response);
    }

    fn chunk(&mut self, bytes: &[u8]) {
        if self.done {
            return;
        }
        if let Some(response) = self.watch.push(bytes) {
            self.record(response);
        }
    }
}

/// `GET /v1/responses/{id}`: the stored response object, to the client that made it.
pub async fn get_response(
    State(state): State<AppState>,
    identity: Option<Extension<ClientIdentity>>,
    Path(id): Path<String>,
) -> Response {
    let owner = owner_of(identity.as_ref().map(|e| &e.0));
    match lookup(
        &state.responses,
        state.shared_responses.as_ref(),
        &id,
        &owner,
    )
    .await
    {
        Some(stored) => Json(stored.response.clone()).into_response(),
        None => response_not_found(&id).into_response(Dialect::OpenAiResponses),
    }
}

/// `DELETE /v1/responses/{id}`: forgets a stored response, for the client that made it.
pub async fn delete_response(
    State(state): State<AppState>,
    identity: Option<Extension<ClientIdentity>>,
    Path(id): Path<String>,
) -> Response {
    let owner = owner_of(identity.as_ref().map(|e| &e.0));
    let mine = state
        .responses
        .get(&id, Instant::now())
        .is_some_and(|stored| *stored.owner == *owner);
    let here = mine && state.responses.remove(&id);
    let shared = match &state.shared_responses {
        Some(shared) => shared.delete(&id, &owner).await,
        None => false,
    };
    if here || shared {
        Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        response_not_found(&id).into_response(Dialect::OpenAiResponses)
    }
}

/// `GET /v1/responses/{id}/input_items`: the items the response was generated from, as an
/// OpenAI list page (`limit` 1–100, default 20; `order` `desc` by default, or `asc`; `after` an
/// item id). Like OpenAI's, the list holds the whole context: the conversation a continuation
/// continued, then its own input.
pub async fn list_input_items(
    State(state): State<AppState>,
    identity: Option<Extension<ClientIdentity>>,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let owner = owner_of(identity.as_ref().map(|e| &e.0));
    let Some(stored) = lookup(
        &state.responses,
        state.shared_responses.as_ref(),
        &id,
        &owner,
    )
    .await
    else {
        return response_not_found(&id).into_response(Dialect::OpenAiResponses);
    };
    match ListQuery::parse(&query).and_then(|query| input_items_page(&stored, &id, &query)) {
        Ok(page) => Json(page).into_response(),
        Err(error) => error.into_response(Dialect::OpenAiResponses),
    }
}

/// The paging parameters of a list request.
#[derive(Debug, PartialEq, Eq)]
struct ListQuery {
    limit: usize,
    descending: bool,
    after: Option<String>,
}

impl ListQuery {
    /// Reads `limit`, `order` and `after`; `include` and unknown parameters change nothing
    /// (stored items have no optional fields to include).
    fn parse(pairs: &[(String, String)]) -> Result<Self, ApiError> {
        let mut query = ListQuery {
            limit: 20,
            descending: true,
            after: None,
        };
        for (key, value) in pairs {
            match key.as_str() {
                "limit" => {
                    query.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=100).contains(n))
                        .ok_or_else(|| {
                            invalid_parameter(format!(
                                "limit: expected an integer from 1 to 100, got {value:?}"
                            ))
                        })?;
                }
                "order" => {
                    query.descending = match value.as_str() {
                        "desc" => true,
                        "asc" => false,
                        other => {
                            return Err(invalid_parameter(format!(
                                "order: expected asc or desc, got {other:?}"
                            )))
                        }
                    };
                }
                "after" => query.after = Some(value.clone()),
                _ => {}
            }
        }
        Ok(query)
    }
}

fn invalid_parameter(message: String) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// One page of `stored`'s input items. Items get ids derived from the response id and their
/// position, so pages stay consistent across requests (the canonical conversation keeps no
/// item ids of its own).
fn input_items_page(
    stored: &StoredResponse,
    response_id: &str,
    query: &ListQuery,
) -> Result<Value, ApiError> {
    let messages = &stored.conversation.messages;
    let input = &messages[..stored.input_len.min(messages.len())];
    let base = response_id.strip_prefix("resp_").unwrap_or(response_id);
    let mut items: Vec<Value> = input_items(input)
        .into_iter()
        .enumerate()
        .map(|(position, mut item)| {
            let prefix = match item["type"].as_str() {
                Some("function_call") => "fc",
                Some("function_call_output") => "fco",
                Some("reasoning") => "rs",
                _ => "msg",
            };
            item["id"] = json!(format!("{prefix}_{base}_in{position}"));
            item["status"] = json!("completed");
            item
        })
        .collect();
    if query.descending {
        items.reverse();
    }
    let start = match &query.after {
        None => 0,
        Some(after) => {
            let found = items.iter().position(|item| item["id"] == after.as_str());
            found.map(|at| at + 1).ok_or_else(|| {
                invalid_parameter(format!(
                    "after: response {response_id} has no input item {after}"
                ))
            })?
        }
    };
    let rest = &items[start..];
    let page = &rest[..query.limit.min(rest.len())];
    Ok(json!({
        "object": "list",
        "data": page,
        "first_id": page.first().map(|item| item["id"].clone()),
        "last_id": page.last().map(|item| item["id"].clone()),
        "has_more": rest.len() > page.len(),
    }))
}

/// A streamed `/v1/responses` answer with its events patched by [`StreamPatcher`] as they pass
/// (`continues`: the `previous_response_id` to echo). Anything but an SSE stream is returned
/// as it is.
pub fn patch_stream(response: Response, continues: Option<String>) -> Response {
    let is_stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_stream {
        return response;
    }
    let (parts, body) = response.into_parts();
    let state = Some((body.into_data_stream(), StreamPatcher::new(continues)));
    let patched = futures_util::stream::unfold(state, |state| async move {
        let (mut body, mut patcher) = state?;
        loop {
            match body.next().await {
                Some(Ok(bytes)) => {
                    let out = patcher.push(&bytes);
                    // A piece that ended inside a line yields nothing yet.
                    if !out.is_empty() {
                        return Some((Ok(out), Some((body, patcher))));
                    }
                }
                Some(Err(error)) => return Some((Err(error), None)),
                None => {
                    let rest = patcher.finish();
                    return (!rest.is_empty()).then_some((Ok(rest), None));
                }
            }
        }
    });
    Response::from_parts(parts, Body::from_stream(patched))
}
