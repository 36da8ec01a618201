//! Each worker's box as its pongs tell it: the latest hardware report, its model map's states,
//! and a short history of CPU, memory and VRAM use for the dashboard's sparklines. What a
//! worker sends is already cut to the report limits when the pong is read (`protocol.rs`).

use std::collections::VecDeque;

use serde::Serialize;

use crate::protocol::{HardwareReport, ModelStateReport};

/// Points kept per worker: at the default heartbeat (15 s) an hour; a faster heartbeat shortens
/// it. Bounded per worker, and workers are bounded by the connection limit.
pub const HISTORY_POINTS: usize = 240;

/// Pongs closer together than this (the flow-control pings of a busy worker are answered too)
/// replace the last point instead of adding one, so a burst cannot push the history out.
pub const MIN_POINT_SPACING_MS: u64 = 2_000;

/// What a worker reported of its box.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerBox {
    /// The last hardware report.
    pub hardware: Option<HardwareReport>,
    /// The last model-map states.
    pub model_states: Option<Vec<ModelStateReport>>,
    /// When the last report came.
    pub reported_unix_ms: u64,
    history: VecDeque<Point>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    unix_ms: u64,
    cpu: Option<u32>,
    memory: Option<u32>,
    vram: Option<u32>,
}

/// The history as columns, oldest first; a value a report did not have is `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[cfg_attr(test, derive(ts_rs::TS))]
pub struct BoxHistory {
    /// Each point's time.
    pub unix_ms: Vec<u64>,
    /// CPU use, percent.
    pub cpu_percent: Vec<Option<u32>>,
    /// Memory in use, percent of installed.
    pub memory_percent: Vec<Option<u32>>,
    /// VRAM in use over all GPUs that tell, percent of their total.
    pub vram_percent: Vec<Option<u32>>,
}

fn percent(used: u64, total: u64) -> Option<u32> {
    (total > 0).then(|| (used.min(total) as u128 * 100 / total as u128) as u32)
}

/// VRAM in use over the GPUs that state both figures, percent.
pub fn vram_percent(report: &HardwareReport) -> Option<u32> {
    let (used, total) = report
        .gpus
        .iter()
        .filter_map(|gpu| Some((gpu.vram_used_mb?, gpu.vram_total_mb?)))
        .fold((0u64, 0u64), |(u, t), (used, total)| {
            (u.saturating_add(used), t.saturating_add(total))
        });
    percent(used, total)
}

impl WorkerBox {
    /// A pong's report at `now_ms`; an absent part leaves the last one as it was.
    pub fn record(
        &mut self,
        hardware: Option<HardwareReport>,
        model_states: Option<Vec<ModelStateReport>>,
        now_ms: u64,
    ) {
        if model_states.is_some() {
            self.model_states = model_states;
        }
        self.reported_unix_ms = now_ms;
        let Some(hardware) = hardware else {
            return;
        };
        let point = Point {
            unix_ms: now_ms,
            cpu: hardware.cpu_percent,
            memory: hardware
                .memory_used_mb
                .zip(hardware.memory_total_mb)
                .and_then(|(used, total)| percent(used, total)),
            vram: vram_percent(&hardware),
        };
        self.hardware = Some(hardware);
        match self.history.back_mut() {
            // The newer values, at the point's own time: moving the time along would let a
            // steady fast heartbeat replace one point for ever.
            Some(last) if now_ms.saturating_sub(last.unix_ms) < MIN_POINT_SPACING_MS => {
                *last = Point {
                    unix_ms: last.unix_ms,
                    ..point
                };
            }
            _ => {
                self.history.push_back(point);
                if self.history.len() > HISTORY_POINTS {
                    self.history.pop_front();
                }
            }
        }
    }

    /// The history as the dashboard reads it.
    pub fn history(&self) -> BoxHistory {
        let column = |f: fn(&Point) -> Option<u32>| self.history.iter().map(f).collect();
        BoxHistory {
            unix_ms: self.history.iter().map(|p| p.unix_ms).collect(),
            cpu_percent: column(|p| p.cpu),
            memory_percent: column(|p| p.memory),
            vram_percent: column(|p| p.vram),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::GpuReport;

    fn report(cpu: u32) -> HardwareReport {
        HardwareReport {
            cpu_percent: Some(cpu),
            memory_used_mb: Some(4096),
            memory_total_mb: Some(16384),
            gpus: vec![
                GpuReport {
                    name: "a".into(),
                    vram_used_mb: Some(6000),
                    vram_total_mb: Some(8000),
                    ..GpuReport::default()
                },
                GpuReport {
                    name: "b".into(),
                    vram_used_mb: Some(2000),
                    vram_total_mb: Some(8000),
                    ..GpuReport::default()
                },
            ],
        }
    }

    #[test]
    fn reports_become_history_points_with_percentages() {
        let mut worker = WorkerBox::default();
        worker.record(Some(report(10)), None, 1_000);
        worker.record(Some(report(20)), None, 5_000);
        let history = worker.history();
        assert_eq!(history.unix_ms, vec![1_000, 5_000]);
        assert_eq!(history.cpu_percent, vec![Some(10), Some(20)]);
        assert_eq!(history.memory_percent, vec![Some(25), Some(25)]);
        assert_eq!(history.vram_percent, vec![Some(50), Some(50)]);
    }

    #[test]
    fn a_burst_of_pongs_replaces_the_last_point_and_the_history_is_bounded() {
        let mut worker = WorkerBox::default();
        worker.record(Some(report(1)), None, 10_000);
        worker.record(Some(report(2)), None, 10_500);
        assert_eq!(worker.history().cpu_percent, vec![Some(2)]);
        // A steady heartbeat faster than the spacing still adds a point per spacing.
        worker.record(Some(report(3)), None, 11_500);
        worker.record(Some(report(4)), None, 12_500);
        assert_eq!(worker.history().unix_ms, vec![10_000, 12_500]);
        for i in 0..(HISTORY_POINTS as u64 * 2) {
            worker.record(Some(report(3)), None, 20_000 + i * MIN_POINT_SPACING_MS);
        }
        assert_eq!(worker.history().unix_ms.len(), HISTORY_POINTS);
    }

    #[test]
    fn an_absent_part_keeps_the_last_one() {
        let mut worker = WorkerBox::default();
        let states = vec![ModelStateReport {
            model: "m".into(),
            state: "loaded".into(),
            load_ms: Some(1_500),
        }];
        worker.record(Some(report(5)), Some(states.clone()), 1_000);
        worker.record(None, None, 9_000);
        assert_eq!(worker.model_states, Some(states));
        assert_eq!(worker.hardware, Some(report(5)));
        assert_eq!(worker.reported_unix_ms, 9_000);
        assert_eq!(worker.history().unix_ms, vec![1_000]);
    }

    #[test]
    fn odd_figures_give_no_percentage_rather_than_a_wrong_one() {
        assert_eq!(percent(5, 0), None);
        assert_eq!(percent(u64::MAX, u64::MAX), Some(100));
        assert_eq!(percent(10, 5), Some(100));
        assert_eq!(vram_percent(&HardwareReport::default()), None);
    }
}
