//! The VRAM check before a lazy start (issue 17): with the box's GPUs known (a fake
//! `nvidia-smi` on the sampler's PATH), a model whose file plus margin exceeds the free VRAM is
//! refused with what it needs and what is free, and llama-server is never run; once the GPUs
//! report room, the same model starts.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use relay_core::hardware::{free_vram_source, Sampler, SamplerSettings};
use relay_core::lifecycle::LifecycleError;

use crate::support::*;

/// Writes an `nvidia-smi` into `dir` that reports one 24 GiB GPU with `used_mb` in use.
fn fake_nvidia_smi(dir: &Path, used_mb: u64) {
    let script = dir.join("nvidia-smi");
    let partial = dir.join("nvidia-smi.tmp");
    std::fs::write(
        &partial,
        format!("#!/bin/sh\necho 'NVIDIA GeForce RTX 4090, {used_mb}, 24564, 0, 40'\n"),
    )
    .unwrap();
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Renamed into place, so the sampler never runs a half-written script.
    std::fs::rename(partial, script).unwrap();
}

/// A model map of one fake-server model `name` whose model file (sparse: no disk used) has
/// `gib` GiB, on ports from `port_base`; its text and the log its starts go to.
fn map_with_file(dir: &TempDir, name: &str, gib: u64, port_base: u16) -> (String, PathBuf) {
    let model_file = dir.join(&format!("{name}.gguf"));
    std::fs::File::create(&model_file)
        .unwrap()
        .set_len(gib * 1024 * 1024 * 1024)
        .unwrap();
    let log = dir.join("starts.log");
    let text = format!(
        "[worker.lifecycle]\nmodel_port_base = {port_base}\n{}",
        fake_entry(name, &log, "", "")
    )
    .replace(
        &format!("/models/{name}.gguf"),
        &model_file.display().to_string(),
    );
    (text, log)
}

/// A sampler every 100 ms looking for GPU tools in `tools` only.
fn sampler_over(tools: &Path) -> Sampler {
    std::fs::create_dir_all(tools).unwrap();
    Sampler::start(SamplerSettings {
        interval: Duration::from_millis(100),
        search_path: Some(tools.as_os_str().to_owned()),
    })
}

#[tokio::test]
async fn a_start_that_would_not_fit_in_free_vram_is_refused_with_the_numbers_until_there_is_room() {
    bounded(async {
        let dir = TempDir::new("vram");
        let tools = dir.join("tools");
        let sampler = sampler_over(&tools);
        fake_nvidia_smi(&tools, 23_000);
        // A 2 GiB model file: it needs 2048 + 10% + 256 = 2508 MiB.
        let (text, log) = map_with_file(&dir, "big", 2, 24600);
        let mut latest = sampler.latest();
        latest
            .wait_for(|sample| sample.as_ref().is_some_and(|s| !s.report.gpus.is_empty()))
            .await
            .unwrap();
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        harness
            .manager
            .set_free_vram(free_vram_source(sampler.latest()));

        let refused = harness.manager.acquire("big", None).await.unwrap_err();
        assert!(
            matches!(
                refused,
                LifecycleError::NotEnoughVram {
                    needed_mb: 2508,
                    free_mb: 1564,
                    ..
                }
            ),
            "{refused:?}"
        );
        let message = refused.to_string();
        assert!(message.contains("needs about 2508 MiB"), "{message}");
        assert!(message.contains("2048 MiB model file"), "{message}");
        assert!(message.contains("1564 MiB free"), "{message}");
        assert!(message.contains("unload other models"), "{message}");
        assert_eq!(refused.status_code(), 503);
        assert!(
            starts(&log).is_empty(),
            "llama-server is not run for a model that does not fit"
        );

        // Another program frees the GPU: the next sample has room and the model starts.
        fake_nvidia_smi(&harness.dir.join("tools"), 1_000);
        latest
            .wait_for(|s| {
                s.as_ref()
                    .is_some_and(|s| s.report.gpus[0].vram_used_mb == Some(1_000))
            })
            .await
            .unwrap();
        let lease = harness
            .manager
            .acquire("big", None)
            .await
            .expect("starts once there is room");
        assert_eq!(starts(&log).len(), 1);
        drop(lease);
        harness.finish().await;
    })
    .await;
}

#[tokio::test]
async fn without_gpu_information_a_start_is_never_refused_for_vram() {
    bounded(async {
        let dir = TempDir::new("vram-none");
        let (text, log) = map_with_file(&dir, "m", 64, 24650);
        // No tool in the sampler's PATH: a box without GPUs (or drivers) as far as it knows.
        let sampler = sampler_over(&dir.join("tools"));
        sampler.latest().wait_for(Option::is_some).await.unwrap();
        let harness = Harness::new(dir, quick(config(&text)), std::slice::from_ref(&log));
        harness
            .manager
            .set_free_vram(free_vram_source(sampler.latest()));
        let lease = harness.manager.acquire("m", None).await.expect("starts");
        drop(lease);
        harness.finish().await;
    })
    .await;
}
