//! The box's hardware, sampled off the request path: CPU and memory from the operating system
//! (`sysinfo`), and each GPU from its vendor's tool — `nvidia-smi` ([`nvidia`]), `rocm-smi`
//! ([`rocm`]), on macOS `system_profiler` ([`apple`]) — each run as a child process with a time
//! limit and a bounded read ([`tool`]). A tool that is not installed means no such GPU: no
//! error, no log line. The worker sends the latest sample in its `pong`s and its model
//! lifecycle checks free VRAM against it before a start.
//!
//! The parsers are pure functions of the tools' text; the sampler is the only part that runs
//! anything. Imports nothing of the crate but the wire types it fills.

pub mod apple;
pub mod nvidia;
pub mod rocm;
pub mod tool;

use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::protocol::{GpuReport, HardwareReport};
use tool::Run;

/// How often the box is sampled by default: often enough for live bars and a sparkline, rare
/// enough that running the vendor tools costs nothing noticeable (`nvidia-smi` takes ~30 ms).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// The longest a vendor tool may take before it is killed and its GPUs left out of the sample.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(3);

/// What the sampler is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplerSettings {
    /// Time between samples.
    pub interval: Duration,
    /// Where the vendor tools are looked for; `None` is the process's own `PATH`. (Tests point
    /// it at a directory of fake tools without changing the test process's environment.)
    pub search_path: Option<OsString>,
}

impl Default for SamplerSettings {
    fn default() -> Self {
        SamplerSettings {
            interval: DEFAULT_INTERVAL,
            search_path: None,
        }
    }
}

/// One sample and when it was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// What was seen.
    pub report: HardwareReport,
    /// When the sample was finished.
    pub taken: Instant,
}

/// The latest sample, `None` until the first one.
pub type Latest = watch::Receiver<Option<Arc<Sample>>>;

/// A running sampler; dropping it stops the sampling.
#[derive(Debug)]
pub struct Sampler {
    latest: Latest,
    task: JoinHandle<()>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sampler {
    /// Starts sampling now and every `settings.interval`. Must be called inside a tokio runtime.
    pub fn start(settings: SamplerSettings) -> Self {
        let (tx, latest) = watch::channel(None);
        let task = tokio::spawn(sample_forever(settings, tx));
        Sampler { latest, task }
    }

    /// The latest sample (and its changes).
    pub fn latest(&self) -> Latest {
        self.latest.clone()
    }
}

/// Free VRAM summed over the GPUs that state both their used and total VRAM, in MiB; `None`
/// when none does (no GPU, or a tool that does not tell): nothing is known, nothing is blocked.
pub fn free_vram_mb(report: &HardwareReport) -> Option<u64> {
    report
        .gpus
        .iter()
        .filter_map(|gpu| Some(gpu.vram_total_mb?.saturating_sub(gpu.vram_used_mb?)))
        .reduce(|a, b| a.saturating_add(b))
}

/// Free VRAM and when it was sampled, read from `latest` each time it is called: what the
/// model lifecycle checks a start against (`LifecycleManager::set_free_vram`).
pub fn free_vram_source(latest: Latest) -> Arc<dyn Fn() -> Option<(u64, Instant)> + Send + Sync> {
    Arc::new(move || {
        let sample = latest.borrow().clone()?;
        Some((free_vram_mb(&sample.report)?, sample.taken))
    })
}

const MIB: u64 = 1024 * 1024;

/// One vendor tool and whether its failure was already logged.
struct Vendor {
    program: &'static str,
    args: &'static [&'static str],
    parse: fn(&str) -> Vec<GpuReport>,
    /// Logged once per run of failures, so a broken driver is said once, not every 5 s.
    warned: bool,
}

async fn sample_forever(settings: SamplerSettings, tx: watch::Sender<Option<Arc<Sample>>>) {
    let mut system = sysinfo::System::new().ok();
    if let Some(system) = &mut system {
        // CPU use is a difference between two readings: the first one is the baseline.
        system.refresh_cpu_usage();
    }
    let mut vendors = vec![
        Vendor {
            program: "nvidia-smi",
            args: nvidia::ARGS,
            parse: nvidia::parse,
            warned: false,
        },
        Vendor {
            program: "rocm-smi",
            args: rocm::ARGS,
            parse: rocm::parse,
            warned: false,
        },
    ];
    // GPU names on a Mac do not change while it runs, and `system_profiler` takes a second:
    // asked once.
    let apple_gpus = if cfg!(target_os = "macos") {
        let run = tool::run_in("system_profiler", apple::ARGS, TOOL_TIMEOUT, None).await;
        match run {
            Run::Output(text) => apple::parse(&text),
            _ => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut report = HardwareReport::default();
        if let Some(system) = &mut system {
            system.refresh_cpu_usage();
            system.refresh_memory();
            report.cpu_percent = Some(system.global_cpu_usage().clamp(0.0, 100.0).round() as u32);
            report.memory_total_mb = Some(system.total_memory() / MIB);
            report.memory_used_mb = Some(system.used_memory() / MIB);
        }
        for vendor in &mut vendors {
            let path = settings.search_path.as_deref();
            match tool::run_in(vendor.program, vendor.args, TOOL_TIMEOUT, path).await {
                Run::Output(text) => {
                    vendor.warned = false;
                    report.gpus.extend((vendor.parse)(&text));
                }
                Run::Absent => {}
                Run::Failed(why) if !vendor.warned => {
                    vendor.warned = true;
                    tracing::warn!("GPU report unavailable: {why}");
                }
                Run::Failed(why) => tracing::debug!("GPU report unavailable: {why}"),
            }
        }
        for gpu in &apple_gpus {
            let mut gpu = gpu.clone();
            if gpu.vram_total_mb.is_none() {
                // Unified memory: the GPU's memory is the box's.
                gpu.vram_total_mb = report.memory_total_mb;
                gpu.vram_used_mb = report.memory_used_mb;
            }
            report.gpus.push(gpu);
        }
        let report = crate::protocol::Bounded::bounded(report);
        tx.send_replace(Some(Arc::new(Sample {
            report,
            taken: Instant::now(),
        })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(used: Option<u64>, total: Option<u64>) -> GpuReport {
        GpuReport {
            name: "g".into(),
            vram_used_mb: used,
            vram_total_mb: total,
            ..GpuReport::default()
        }
    }

    #[test]
    fn free_vram_adds_up_the_gpus_that_tell_and_is_unknown_without_any() {
        let mut report = HardwareReport::default();
        assert_eq!(free_vram_mb(&report), None);
        report.gpus = vec![gpu(None, Some(100)), gpu(Some(5), None)];
        assert_eq!(free_vram_mb(&report), None);
        report.gpus = vec![gpu(Some(1000), Some(24000)), gpu(Some(500), Some(8000))];
        assert_eq!(free_vram_mb(&report), Some(30500));
        // A tool reporting more used than installed counts as full, not as a huge number.
        report.gpus = vec![gpu(Some(10), Some(5))];
        assert_eq!(free_vram_mb(&report), Some(0));
    }
}
