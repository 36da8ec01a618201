//! `rocm-smi --showmeminfo vram --showuse --showtemp --showproductname --json`: an object of
//! cards (`card0`, `card1`, …), each an object of text values keyed by labels such as
//! `VRAM Total Memory (B)`. Labels changed case across ROCm releases (`Card series`, later
//! `Card Series`), so they are matched without case.

use serde_json::{Map, Value};

use crate::protocol::GpuReport;

/// The arguments `rocm-smi` is run with; [`parse`] reads its answer.
pub const ARGS: &[&str] = &[
    "--showmeminfo",
    "vram",
    "--showuse",
    "--showtemp",
    "--showproductname",
    "--json",
];

const MIB: u64 = 1024 * 1024;

/// The GPUs of a `rocm-smi` JSON answer, in card order; anything else (the `system` entry, a
/// card without a name or memory) is skipped. Not JSON at all: no GPUs.
pub fn parse(text: &str) -> Vec<GpuReport> {
    let Ok(Value::Object(cards)) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let mut named: Vec<(u32, GpuReport)> = cards
        .iter()
        .filter_map(|(key, card)| {
            let index: u32 = key.strip_prefix("card")?.parse().ok()?;
            Some((index, read_card(card.as_object()?)?))
        })
        .collect();
    named.sort_by_key(|(index, _)| *index);
    named.into_iter().map(|(_, gpu)| gpu).collect()
}

fn read_card(card: &Map<String, Value>) -> Option<GpuReport> {
    let text = |label: &str| {
        card.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(label))
            .and_then(|(_, value)| match value {
                Value::String(s) => Some(s.trim().to_string()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
    };
    let number = |label: &str| {
        text(label)
            .and_then(|t| t.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let name = ["Card Series", "Card Model", "Card SKU"]
        .iter()
        .find_map(|label| text(label).filter(|t| !t.is_empty()))
        .unwrap_or_else(|| "AMD GPU".to_string());
    let total = number("VRAM Total Memory (B)").map(|b| b as u64 / MIB);
    let used = number("VRAM Total Used Memory (B)").map(|b| b as u64 / MIB);
    let utilization = number("GPU use (%)").map(|p| p.min(100.0) as u32);
    let temperature = [
        "Temperature (Sensor edge) (C)",
        "Temperature (Sensor junction) (C)",
    ]
    .iter()
    .find_map(|label| number(label))
    .map(|t| t.min(1000.0) as i32);
    // A card entry with none of these is not a GPU we can say anything about.
    if total.is_none() && used.is_none() && utilization.is_none() && temperature.is_none() {
        return None;
    }
    Some(GpuReport {
        name,
        vram_used_mb: used,
        vram_total_mb: total,
        utilization_percent: utilization,
        temperature_c: temperature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cards_are_read_in_card_order() {
        let gpus = parse(include_str!(
            "../../tests/fixtures/hardware/rocm-smi-2gpu.json"
        ));
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]");
        assert_eq!(gpus[0].vram_total_mb, Some(16368));
        assert_eq!(gpus[0].vram_used_mb, Some(9));
        assert_eq!(gpus[0].utilization_percent, Some(12));
        assert_eq!(gpus[0].temperature_c, Some(45));
        assert_eq!(gpus[1].name, "AMD Instinct MI300X");
        assert_eq!(gpus[1].vram_total_mb, Some(196592));
        // No edge sensor on this card: the junction temperature is taken.
        assert_eq!(gpus[1].temperature_c, Some(38));
    }

    #[test]
    fn not_json_or_the_wrong_shape_gives_no_gpus() {
        for text in [
            "",
            "ERROR: No AMD GPUs specified",
            "[1,2,3]",
            r#"{"card0": "x", "cardX": {"GPU use (%)": "5"}, "system": {"Driver version": "6.1"}}"#,
            r#"{"card0": {"Card Series": "no numbers"}}"#,
            r#"{"card0": {"GPU use (%)": "-4", "VRAM Total Memory (B)": "NaN"}}"#,
        ] {
            assert_eq!(parse(text), Vec::new(), "{text:?}");
        }
    }

    #[test]
    fn numbers_may_come_as_numbers() {
        let gpus = parse(r#"{"card3": {"VRAM Total Memory (B)": 1073741824, "GPU use (%)": 250}}"#);
        assert_eq!(gpus[0].name, "AMD GPU");
        assert_eq!(gpus[0].vram_total_mb, Some(1024));
        assert_eq!(gpus[0].utilization_percent, Some(100));
    }
}
