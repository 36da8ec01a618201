//! What the hub tells a client when dispatch cannot serve its request: the refusal, the failure
//! or the queue timeout, in words that say what to do (served models, sleeping boxes, aliases).

use super::*;

/// The client-facing error for a request the relay could not serve.
pub fn fail_error(reason: FailReason) -> ApiError {
    match reason {
        FailReason::QueueFull => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "queue_full",
            // The seed's stable client message first; then what an operator needs.
            "Service temporarily at capacity, please retry (queue full: the requests waiting \
             for a worker are at max_queue_len)",
        ),
        FailReason::RequestTimeout => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "request_timeout",
            "request timeout: the worker did not finish within the request timeout",
        ),
        FailReason::RequeueExhausted => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "requeue_exhausted",
            "requeue attempts exhausted: the workers serving this request failed or disconnected 3 times",
        ),
        FailReason::WorkerLostMidStream => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "worker_disconnected",
            "the worker serving this request disconnected mid-response; retry the request",
        ),
        FailReason::ShuttingDown => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the relay is shutting down; retry shortly",
        )
        .retry_after(Duration::from_secs(5)),
    }
}

/// The 504 for a request that waited its whole queue timeout: for which model, and whether
/// its workers were all busy or none is connected (the runbook's "requests queue but never
/// complete"); for a name nobody serves, what is served (`served`) and how to map the name.
pub(super) fn queue_timeout_error(
    expired: &Expired,
    sleepers: &[String],
    served: &[String],
) -> ApiError {
    let model = &expired.model;
    let why = if !sleepers.is_empty() {
        let names = sleepers
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        let noun = if sleepers.len() == 1 { "box" } else { "boxes" };
        format!(
            "model {model} is served only by the sleeping {noun} {names}, which did not wake \
             within the queue timeout (a Wake-on-LAN packet was sent; check that Wake-on-LAN is \
             enabled in its firmware and on its network card)"
        )
    } else if expired.served {
        format!("every worker serving model {model} stayed busy for the queue timeout")
    } else if served.is_empty() {
        format!(
            "no connected worker serves model {model}; it waited the queue timeout for one to \
             register or announce it (no worker is connected: check the workers' logs)"
        )
    } else {
        const SHOWN: usize = 10;
        let mut names = served
            .iter()
            .take(SHOWN)
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        if served.len() > SHOWN {
            names.push_str(&format!(" and {} more", served.len() - SHOWN));
        }
        format!(
            "no connected worker serves model {model}; it waited the queue timeout for one to \
             announce it. Served now: {names}. To send {model:?} to one of them, add an alias \
             ([proxy.aliases] {model:?} = {:?} in the config file, or on the dashboard's \
             Settings page) or set default_model",
            served[0]
        )
    };
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "queue_timeout",
        format!("queue timeout: no worker available within deadline: {why}"),
    )
}

pub(super) fn log_woke(woke: &[Sleeper], name: &str) {
    for sleeper in woke {
        match sleeper.waking {
            Some(attempt) => {
                tracing::info!(name, packets = attempt.packets, "woken box reconnected")
            }
            None => tracing::info!(name, "sleeping box reconnected"),
        }
    }
}

/// A request the hub did not take: why (for routing it elsewhere, e.g. to an upstream), and the
/// answer to give the client otherwise.
#[derive(Debug)]
pub struct Refused {
    /// Why, as the scheduler said.
    pub reason: SubmitError,
    /// The client's answer in its dialect-independent form.
    pub error: ApiError,
}

pub(super) fn submit_error(error: SubmitError, model: &str) -> ApiError {
    match error {
        // Any name a worker could advertise waits in a queue for one (walkthrough §7): only
        // these are refused.
        SubmitError::UnknownModel => {
            let hint = match unusable_name(model) {
                Some(why) => format!("no worker can advertise a model name {why}"),
                None => "this proxy has no provider".to_string(),
            };
            // A hostile name is echoed only in part.
            let shown: String = model.chars().take(80).collect();
            let ellipsis = if shown.len() < model.len() { "…" } else { "" };
            ApiError::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("no provider for model {shown:?}{ellipsis}: {hint}"),
            )
        }
        SubmitError::ProviderDisabled => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "provider_disabled",
            "Provider is currently disabled",
        ),
        SubmitError::QueueFull { retry_after } => {
            tracing::warn!(model, "queue full");
            fail_error(FailReason::QueueFull).retry_after(retry_after)
        }
        SubmitError::ShuttingDown => fail_error(FailReason::ShuttingDown),
        // Anthropic's wording, which Claude Code reads as its cue to compact the conversation;
        // OpenAI clients get `context_length_exceeded`.
        SubmitError::PromptTooLong { tokens, limit } => ApiError::new(
            StatusCode::BAD_REQUEST,
            "context_length_exceeded",
            format!(
                "prompt is too long: {tokens} tokens > {limit} maximum (estimated from the \
                 request's size; {limit} is the largest context window of the workers serving \
                 {model})"
            ),
        ),
    }
}
