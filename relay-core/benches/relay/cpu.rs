//! CPU time per unit of work (request, chunk), read from `/proc/PID/stat` around a measurement.
//! Unlike throughput, it does not depend on how fast the load generator is, so it is the figure
//! to compare across machines and runs for what the relay itself costs.

use crate::procs::ChildProcess;
use crate::report::Row;

/// CPU seconds of some processes at the start of a measurement.
pub struct Meter<'a> {
    processes: Vec<&'a ChildProcess>,
    start: Vec<f64>,
}

impl<'a> Meter<'a> {
    /// Starts measuring `processes`.
    pub fn start(processes: &[&'a ChildProcess]) -> Meter<'a> {
        Meter {
            processes: processes.to_vec(),
            start: processes.iter().map(|p| p.cpu_seconds()).collect(),
        }
    }

    /// Microseconds of CPU each process spent per unit since the start, in the order given.
    pub fn per_unit_us(&self, units: u64) -> Vec<f64> {
        self.processes
            .iter()
            .zip(&self.start)
            .map(|(process, start)| (process.cpu_seconds() - start) * 1e6 / units.max(1) as f64)
            .collect()
    }
}

/// The rows for the relay's CPU per `unit`: proxy, worker, and their sum against `target_us`,
/// with the mock backend's CPU per unit on the direct path as the sum's reference.
pub fn rows(
    scenario: &'static str,
    unit: &'static str,
    backend_direct_us: f64,
    proxy_us: f64,
    worker_us: f64,
    target_us: f64,
) -> Vec<Row> {
    let (proxy_figure, worker_figure, sum_figure) = match unit {
        "request" => (
            "proxy CPU per request (µs)",
            "worker CPU per request (µs)",
            "relay CPU per request, proxy + worker (µs; direct: the mock backend)",
        ),
        _ => (
            "proxy CPU per chunk (µs)",
            "worker CPU per chunk (µs)",
            "relay CPU per chunk, proxy + worker (µs; direct: the mock backend)",
        ),
    };
    let sum = proxy_us + worker_us;
    vec![
        Row {
            scenario,
            figure: proxy_figure,
            direct: None,
            relay: proxy_us,
            target: "–".to_string(),
            met: None,
        },
        Row {
            scenario,
            figure: worker_figure,
            direct: None,
            relay: worker_us,
            target: "–".to_string(),
            met: None,
        },
        Row {
            scenario,
            figure: sum_figure,
            direct: Some(backend_direct_us),
            relay: sum,
            target: format!("≤ {target_us} µs"),
            met: Some(sum <= target_us),
        },
    ]
}
