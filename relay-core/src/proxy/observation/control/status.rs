//! `GET /api/status` and its live feed `GET /api/events`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tokio::time::{interval, Instant, MissedTickBehavior};

use crate::dialect::{ApiError, Dialect};
use crate::protocol::{HardwareReport, ModelStateReport};
use crate::proxy::dispatch::hub::Weighed;
use crate::proxy::dispatch::scheduler::AffinityCounts;
use crate::proxy::dispatch::telemetry::{BoxHistory, Series, TotalsSnapshot};
use crate::proxy::observation::control::NodeInfo;
use crate::proxy::AppState;
use crate::store::StorageView;

/// How often the feed checks for changes: the dashboard sees a change within this.
const FEED_CHECK: Duration = Duration::from_millis(100);
/// The feed sends at least this often, so the charts move every second.
const FEED_HEARTBEAT: Duration = Duration::from_secs(1);

/// The node as the dashboard shows it.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct NodeStatus {
    /// The crate version.
    pub version: &'static str,
    #[serde(flatten)]
    info: NodeInfo,
    /// Whether the control API needs the admin token.
    pub admin_token_required: bool,
    /// Whether inference requests need a client API key.
    pub require_api_keys: bool,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Where Claude Code's requests go now.
    pub claude_code: crate::proxy::serving::claude_code::ClaudeCodeUses,
}

/// One connected worker.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct WorkerView {
    id: String,
    provider: String,
    name: String,
    host: Option<String>,
    models: Vec<String>,
    load: u32,
    max_concurrent: u32,
    #[cfg_attr(test, ts(type = "'idle' | 'busy' | 'draining'"))]
    state: &'static str,
    connected_unix_ms: Option<u64>,
    heartbeat_ms: Option<f64>,
    /// The worker's box at its last report (`null` for a worker that sends none).
    hardware: Option<HardwareReport>,
    /// CPU, memory and VRAM use over the last reports, for sparklines.
    hardware_history: BoxHistory,
    /// The states of its model map's models (`null` without a model map or report).
    model_states: Option<Vec<ModelStateReport>>,
    /// The tokens one request may hold, per model, where the worker reported them.
    context_windows: std::collections::BTreeMap<String, u32>,
    /// Its measured speeds per model (tokens per second), once it has answered with timings.
    speeds: std::collections::BTreeMap<String, SpeedView>,
}

/// A worker's measured speed on one model, in tokens per second.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct SpeedView {
    /// Prompt tokens evaluated per second.
    prompt_tps: Option<f64>,
    /// Tokens generated per second.
    generation_tps: Option<f64>,
    /// Whether it evaluates side requests (titles, summaries) before the turns waiting there:
    /// its worker gives them the lowest slot of a llama-server, which evaluates slots in order,
    /// so cost routing counts about one batch of prompt ahead of them, not all that waits.
    sides_first: bool,
}

/// One served model.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct ModelView {
    name: String,
    provider: String,
    workers: Vec<String>,
}

/// One sleeping box.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct SleeperView {
    name: String,
    provider: String,
    models: Vec<String>,
    mac_address: Option<String>,
    since_unix_ms: u64,
    #[cfg_attr(test, ts(type = "'asleep' | 'waking'"))]
    state: &'static str,
    waking_since_unix_ms: Option<u64>,
    wake_packets: u32,
    /// Why it is being woken (none while asleep): a request for a model no awake box serves,
    /// a long prompt whose first token comes sooner there, a request that would wait longer for
    /// an awake slot than the wake, or a queue that has waited as long as the wake.
    #[cfg_attr(
        test,
        ts(type = "'nothing_awake' | 'first_token_sooner' | 'slot_wait' | 'queue_waited' | null")
    )]
    wake_cause: Option<&'static str>,
}

/// One provider's queue.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct QueueView {
    provider: String,
    depth: usize,
}

/// One request in flight.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct RequestView {
    id: String,
    model: String,
    provider: Option<String>,
    worker: Option<String>,
    #[cfg_attr(test, ts(type = "'queued' | 'running'"))]
    state: &'static str,
    streaming: bool,
    age_ms: u64,
    ttft_ms: Option<u64>,
    tokens: u64,
    tokens_per_sec: Option<f64>,
    /// Why it went to its worker: `cache_hit`, `home_busy`, `new_conversation`,
    /// `least_loaded`, `faster_box`, `waking` or `side_request` (none while queued).
    #[cfg_attr(
        test,
        ts(
            type = "'cache_hit' | 'home_busy' | 'new_conversation' | 'least_loaded' | 'faster_box' | 'waking' | 'side_request' | null"
        )
    )]
    reason: Option<&'static str>,
    /// What cost routing weighed for it, moving it (`faster_box`, `waking`) or not.
    weighed: Option<WeighedView>,
}

/// What cost routing weighed for a request: the usual choice against the best other worker, in
/// seconds (estimates, to the hundredth).
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct WeighedView {
    /// It stayed with the usual choice: the other was not clearly sooner.
    kept: bool,
    /// Until the first token where it went (a woken box's wake included), with what its prompt
    /// delays the prompts evaluated beside it there.
    first_token_s: f64,
    /// The worker weighed against (its name): the usual choice where it moved, the best other
    /// where it stayed; `null`: it moved to a waking box while no worker was free.
    other: Option<String>,
    /// The same estimate there (with no worker free, the wait for a slot included).
    other_s: f64,
    /// How much longer its answer takes where it went than there (below zero: sooner), where a
    /// quiet fleet weighed answers; 0 where it did not.
    answer_s: f64,
    /// Charged for the conversation evicted on the worker that is not the usual choice; 0
    /// where it evicts none.
    eviction_s: f64,
}

impl From<Weighed> for WeighedView {
    fn from(w: Weighed) -> WeighedView {
        // `+ 0.0`: a kept request's answer gap is a negated one, and -0.0 would read "-0.0".
        let hundredths = |secs: f64| (secs * 100.0).round() / 100.0 + 0.0;
        WeighedView {
            kept: w.kept,
            first_token_s: hundredths(w.first_token_secs),
            other: w.other,
            other_s: hundredths(w.other_secs),
            answer_s: hundredths(w.answer_secs),
            eviction_s: hundredths(w.eviction_secs),
        }
    }
}

/// Everything the dashboard shows.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct Status {
    node: NodeStatus,
    workers: Vec<WorkerView>,
    models: Vec<ModelView>,
    sleepers: Vec<SleeperView>,
    queues: Vec<QueueView>,
    in_flight: Vec<RequestView>,
    totals: TotalsSnapshot,
    series: Series,
    affinity: AffinityView,
    placements: PlacementsView,
    /// Whether the database takes writes (a full disk or read-only data directory says so).
    storage: StorageView,
}

/// Requests placed on a worker since start, by why it was that one (as `/metrics` counts them
/// in `modelrelay_placements_total`), and whether cost routing weighs boxes' speeds.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct PlacementsView {
    cost_routing: bool,
    by_reason: Vec<PlacementCount>,
}

/// One reason's placements.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct PlacementCount {
    #[cfg_attr(
        test,
        ts(
            type = "'cache_hit' | 'home_busy' | 'new_conversation' | 'least_loaded' | 'faster_box' | 'waking' | 'side_request'"
        )
    )]
    reason: &'static str,
    count: u64,
}

/// Conversation affinity: whether it is on, and how placements went since start.
#[derive(Debug, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct AffinityView {
    enabled: bool,
    #[serde(flatten)]
    counts: AffinityCounts,
}

/// Builds the status now.
pub fn snapshot(state: &AppState) -> Status {
    let hub = &state.hub;
    let telemetry = hub.telemetry();
    let snapshots = hub.workers();
    let workers: Vec<WorkerView> = snapshots
        .iter()
        .map(|w| {
            let record = telemetry.worker(&w.id);
            let load = w.in_flight + w.external_load;
            WorkerView {
                id: w.id.clone(),
                provider: w.provider.clone(),
                name: w.name.clone(),
                host: record.as_ref().map(|r| r.host.clone()),
                models: w.models.clone(),
                load,
                max_concurrent: w.max_concurrent,
                state: if w.draining {
                    "draining"
                } else if load > 0 {
                    "busy"
                } else {
                    "idle"
                },
                connected_unix_ms: record.as_ref().map(|r| r.connected_unix_ms),
                heartbeat_ms: record
                    .as_ref()
                    .and_then(|r| r.heartbeat)
                    .map(|d| (d.as_secs_f64() * 1e5).round() / 100.0),
                hardware_history: record
                    .as_ref()
                    .map(|r| r.reported.history())
                    .unwrap_or_default(),
                hardware: record.as_ref().and_then(|r| r.reported.hardware.clone()),
                model_states: record.and_then(|r| r.reported.model_states),
                context_windows: w.context_windows.clone(),
                speeds: w
                    .speeds
                    .iter()
                    .map(|(model, speed)| {
                        let round = |tps: Option<f64>| tps.map(|t| (t * 10.0).round() / 10.0);
                        let view = SpeedView {
                            prompt_tps: round(speed.prompt_tps),
                            generation_tps: round(speed.generation_tps),
                            sides_first: w.sides_first.contains(model),
                        };
                        (model.clone(), view)
                    })
                    .collect(),
            }
        })
        .collect();
    let models: Vec<ModelView> = hub
        .models()
        .into_iter()
        .map(|(name, provider)| ModelView {
            workers: snapshots
                .iter()
                .filter(|w| w.provider == provider && w.models.contains(&name))
                .map(|w| w.id.clone())
                .collect(),
            name,
            provider,
        })
        .collect();
    let provider_of: HashMap<&str, &str> = models
        .iter()
        .map(|m| (m.name.as_str(), m.provider.as_str()))
        .collect();
    let requests = telemetry.requests();
    let ids: Vec<_> = requests.iter().map(|(id, _)| *id).collect();
    let assignments = hub.assignments(&ids);
    let reasons = hub.reasons(&ids);
    let in_flight = requests
        .iter()
        .zip(assignments)
        .zip(reasons)
        .filter_map(|(((id, record), assignment), placed)| {
            // Untracked by the scheduler: an upstream's, or answered with the client still
            // reading the last bytes.
            let worker = match (assignment, &record.upstream) {
                (Some(worker), _) => worker,
                (None, Some(upstream)) => Some(format!("upstream:{upstream}")),
                (None, None) => return None,
            };
            let age = record.arrived.elapsed();
            let ttft = record.ttft();
            let tokens = record.tokens();
            let generating = ttft.map(|t| age.saturating_sub(t).as_secs_f64());
            Some(RequestView {
                id: crate::proxy::dispatch::scheduler::request_wire_id(*id),
                provider: provider_of
                    .get(record.model.as_str())
                    .map(|p| p.to_string()),
                model: record.model.clone(),
                state: if worker.is_some() {
                    "running"
                } else {
                    "queued"
                },
                worker,
                streaming: record.streaming,
                age_ms: age.as_millis() as u64,
                ttft_ms: ttft.map(|t| t.as_millis() as u64),
                tokens,
                tokens_per_sec: generating
                    .filter(|secs| *secs > 0.05 && tokens > 0)
                    .map(|secs| (tokens as f64 / secs * 10.0).round() / 10.0),
                reason: placed.as_ref().map(|(reason, _)| *reason),
                weighed: placed
                    .and_then(|(_, weighed)| weighed)
                    .map(WeighedView::from),
            })
        })
        .collect();
    Status {
        node: NodeStatus {
            version: env!("CARGO_PKG_VERSION"),
            info: state.node.borrow().clone(),
            admin_token_required: state.admin.required(),
            require_api_keys: state.config.require_api_keys,
            uptime_secs: hub.uptime().as_secs(),
            claude_code: state.names.claude_code(),
        },
        workers,
        models,
        sleepers: hub
            .sleepers()
            .into_iter()
            .map(|s| SleeperView {
                state: if s.waking.is_some() {
                    "waking"
                } else {
                    "asleep"
                },
                waking_since_unix_ms: s.waking.map(|w| w.since_unix_ms),
                wake_packets: s.waking.map_or(0, |w| w.packets),
                wake_cause: s.waking.map(|w| w.cause.as_str()),
                mac_address: s.mac.map(|m| m.to_string()),
                name: s.name,
                provider: s.provider,
                models: s.models,
                since_unix_ms: s.since_unix_ms,
            })
            .collect(),
        queues: hub
            .queue_depths()
            .into_iter()
            .map(|(provider, depth)| QueueView { provider, depth })
            .collect(),
        in_flight,
        totals: telemetry.totals(),
        series: telemetry.series(),
        affinity: AffinityView {
            enabled: state.config.affinity,
            counts: hub.affinity_counts(),
        },
        placements: PlacementsView {
            cost_routing: state.config.cost_routing,
            by_reason: hub
                .reason_counts()
                .into_iter()
                .map(|(reason, count)| PlacementCount { reason, count })
                .collect(),
        },
        storage: state.usage.health().view(),
    }
}

/// `GET /api/status`.
pub async fn get_status(State(state): State<AppState>) -> Json<Status> {
    Json(snapshot(&state))
}

fn status_event(state: &AppState) -> Event {
    Event::default()
        .event("status")
        .json_data(snapshot(state))
        .unwrap_or_else(|_| Event::default().comment("status could not be encoded"))
}

/// `GET /api/events`: the status now, then on every change (at most every 100 ms) and at least
/// once a second.
pub async fn events(State(state): State<AppState>) -> Response {
    // Held by the stream: each open feed costs a status snapshot a second.
    let Ok(slot) = state.event_slots.clone().try_acquire_owned() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_subscribers",
            format!(
                "{} live feeds are open already (close a dashboard tab, or poll /api/status)",
                state.config.max_event_subscribers
            ),
        )
        .retry_after(Duration::from_secs(5))
        .into_response(Dialect::OpenAi);
    };
    let first = status_event(&state);
    let mut check = interval(FEED_CHECK);
    check.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let node_changes = state.node.subscribe();
    let seen = (state.hub.telemetry().version(), Instant::now());
    let mut closing = state.closing.subscribe();
    let later = futures_util::stream::unfold(
        (state, check, node_changes, seen),
        |(state, mut check, mut node_changes, (mut version, mut sent))| async move {
            loop {
                check.tick().await;
                let now_version = state.hub.telemetry().version();
                let node_changed = node_changes.has_changed().unwrap_or(false);
                if now_version != version || node_changed || sent.elapsed() >= FEED_HEARTBEAT {
                    node_changes.mark_unchanged();
                    version = now_version;
                    sent = Instant::now();
                    let event = status_event(&state);
                    let next = Ok::<_, Infallible>(event);
                    return Some((next, (state, check, node_changes, (version, sent))));
                }
            }
        },
    );
    let closed = async move {
        let _ = closing.wait_for(|closing| *closing).await;
    };
    let later = futures_util::StreamExt::map(later, move |event| {
        let _held = &slot;
        event
    });
    // Ends with the proxy: an open dashboard must not hold up a graceful stop.
    let stream = futures_util::StreamExt::take_until(
        futures_util::StreamExt::chain(futures_util::stream::once(async { Ok(first) }), later),
        closed,
    );
    Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(15))
                .text("keep-alive"),
        )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighed_seconds_are_rounded_to_the_hundredth_and_never_negative_zero() {
        let kept = Weighed {
            kept: true,
            first_token_secs: 0.504_9,
            other: Some("fast-box".to_string()),
            other_secs: 4.123_4,
            // A kept request's answer gap is the other's, negated: no gap is -0.0.
            answer_secs: -0.0,
            eviction_secs: 0.0,
        };
        let json = serde_json::to_string(&WeighedView::from(kept)).unwrap();
        assert_eq!(
            json,
            r#"{"kept":true,"first_token_s":0.5,"other":"fast-box","other_s":4.12,"answer_s":0.0,"eviction_s":0.0}"#
        );
    }
}
