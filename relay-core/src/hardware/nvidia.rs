//! `nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu,temperature.gpu
//! --format=csv,noheader,nounits`: one line per GPU, e.g.
//! `NVIDIA GeForce RTX 4090, 1234, 24564, 3, 45` (MiB, MiB, %, °C).

use crate::protocol::GpuReport;

/// The arguments `nvidia-smi` is run with; [`parse`] reads its answer.
pub const ARGS: &[&str] = &[
    "--query-gpu=name,memory.used,memory.total,utilization.gpu,temperature.gpu",
    "--format=csv,noheader,nounits",
];

/// The GPUs of an `nvidia-smi` answer. A line that does not have the five fields is skipped;
/// a field the GPU does not support (`[N/A]`, `[Not Supported]`) is left out.
pub fn parse(text: &str) -> Vec<GpuReport> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<GpuReport> {
    // The name comes first and may itself hold a comma: the four numbers are the last fields.
    let mut fields = line.trim().rsplitn(5, ',').map(str::trim);
    let temperature = fields.next()?;
    let utilization = fields.next()?;
    let total = fields.next()?;
    let used = fields.next()?;
    let name = fields.next()?;
    if name.is_empty() {
        return None;
    }
    Some(GpuReport {
        name: name.to_string(),
        vram_used_mb: number(used),
        vram_total_mb: number(total),
        utilization_percent: number(utilization).map(|p| p.min(100) as u32),
        temperature_c: number(temperature).map(|t| t.min(1000) as i32),
    })
}

/// A whole number of the answer; `nvidia-smi` writes integers, but a decimal is rounded down.
fn number(field: &str) -> Option<u64> {
    let value: f64 = field.parse().ok()?;
    (value.is_finite() && value >= 0.0).then_some(value as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_gpus_are_read_with_every_field() {
        let gpus = parse(include_str!(
            "../../tests/fixtures/hardware/nvidia-smi-2gpu.csv"
        ));
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA GeForce RTX 4090");
        assert_eq!(gpus[0].vram_used_mb, Some(18211));
        assert_eq!(gpus[0].vram_total_mb, Some(24564));
        assert_eq!(gpus[0].utilization_percent, Some(97));
        assert_eq!(gpus[0].temperature_c, Some(71));
        assert_eq!(gpus[1].name, "NVIDIA RTX A6000");
        assert_eq!(gpus[1].vram_used_mb, Some(3));
    }

    #[test]
    fn unsupported_fields_are_left_out_not_guessed() {
        let gpus = parse(include_str!(
            "../../tests/fixtures/hardware/nvidia-smi-na.csv"
        ));
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].name, "Tesla K80");
        assert_eq!(gpus[0].vram_total_mb, Some(11441));
        assert_eq!(gpus[0].utilization_percent, None);
        assert_eq!(gpus[0].temperature_c, None);
    }

    #[test]
    fn a_name_with_a_comma_keeps_it() {
        let gpus = parse("Acme GPU, rev 2, 10, 100, 5, 40\n");
        assert_eq!(gpus[0].name, "Acme GPU, rev 2");
        assert_eq!(gpus[0].vram_total_mb, Some(100));
    }

    #[test]
    fn garbage_and_errors_give_no_gpus() {
        for text in [
            "",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "No devices were found",
            ", 1, 2, 3, 4",
            "\u{0}\u{1}\u{2}",
        ] {
            assert_eq!(parse(text), Vec::new(), "{text:?}");
        }
    }

    #[test]
    fn absurd_numbers_are_dropped_or_clamped() {
        let gpus = parse("X, -5, NaN, 1e30, 99999\nY, 1.5, inf, 250, -3\n");
        assert_eq!(gpus[0].vram_used_mb, None);
        assert_eq!(gpus[0].vram_total_mb, None);
        assert_eq!(gpus[0].utilization_percent, Some(100));
        assert_eq!(gpus[0].temperature_c, Some(1000));
        assert_eq!(gpus[1].vram_used_mb, Some(1));
        assert_eq!(gpus[1].vram_total_mb, None);
        assert_eq!(gpus[1].temperature_c, None);
    }
}
