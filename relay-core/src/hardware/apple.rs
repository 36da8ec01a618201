//! `system_profiler SPDisplaysDataType -json` on macOS: the GPUs' names, and for discrete GPUs
//! their VRAM (`spdisplays_vram`: `"8 GB"`, `"1536 MB"`). Apple silicon shares the box's memory
//! with its GPU (unified memory): no VRAM figure there, the sampler uses the memory numbers.

use serde_json::Value;

use crate::protocol::GpuReport;

/// The arguments `system_profiler` is run with; [`parse`] reads its answer.
pub const ARGS: &[&str] = &["SPDisplaysDataType", "-json"];

/// The GPUs of a `system_profiler` answer, with their VRAM when it is stated.
pub fn parse(text: &str) -> Vec<GpuReport> {
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let Some(displays) = value.get("SPDisplaysDataType").and_then(Value::as_array) else {
        return Vec::new();
    };
    displays
        .iter()
        .filter_map(|gpu| {
            let name = ["sppci_model", "_name"]
                .iter()
                .find_map(|key| gpu.get(*key).and_then(Value::as_str))
                .map(str::trim)
                .filter(|name| !name.is_empty())?;
            let vram = ["spdisplays_vram", "spdisplays_vram_shared"]
                .iter()
                .find_map(|key| gpu.get(*key).and_then(Value::as_str).and_then(megabytes));
            Some(GpuReport {
                name: name.to_string(),
                vram_total_mb: vram,
                ..GpuReport::default()
            })
        })
        .collect()
}

/// `"8 GB"` → 8192, `"1536 MB"` → 1536.
fn megabytes(text: &str) -> Option<u64> {
    let (number, unit) = text.trim().split_once(' ')?;
    let number: u64 = number.parse().ok()?;
    match unit.trim() {
        "GB" => number.checked_mul(1024),
        "MB" => Some(number),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apple_silicon_has_a_name_and_no_vram_of_its_own() {
        let gpus = parse(include_str!(
            "../../tests/fixtures/hardware/system_profiler-m2.json"
        ));
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].name, "Apple M2 Pro");
        assert_eq!(gpus[0].vram_total_mb, None);
    }

    #[test]
    fn a_discrete_gpu_states_its_vram() {
        let gpus = parse(include_str!(
            "../../tests/fixtures/hardware/system_profiler-intel.json"
        ));
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "Intel UHD Graphics 630");
        assert_eq!(gpus[0].vram_total_mb, Some(1536));
        assert_eq!(gpus[1].name, "AMD Radeon Pro 5500M");
        assert_eq!(gpus[1].vram_total_mb, Some(8192));
    }

    #[test]
    fn the_wrong_shape_gives_no_gpus() {
        for text in [
            "",
            "{}",
            r#"{"SPDisplaysDataType": {}}"#,
            r#"{"SPDisplaysDataType": [1, {"_name": ""}, {"spdisplays_vram": "8 GB"}]}"#,
        ] {
            assert_eq!(parse(text), Vec::new(), "{text:?}");
        }
        assert_eq!(megabytes("99999999999999999 GB"), None);
        assert_eq!(megabytes("8 TB"), None);
    }
}
