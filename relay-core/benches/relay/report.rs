//! The results table: each figure with the direct path, the relay path, their ratio and the
//! target, written as Markdown (for the README and BENCHMARKS.md) and JSON (for tools).

use serde_json::{json, Value};

/// One measured figure.
pub struct Row {
    /// Scenario name (`unary1`, ...).
    pub scenario: &'static str,
    /// What is measured, with its unit.
    pub figure: &'static str,
    /// The direct path's value, when the figure has one.
    pub direct: Option<f64>,
    /// The relay path's value.
    pub relay: f64,
    /// How the ratio or value is judged, e.g. "≥ 35% of direct".
    pub target: String,
    /// Whether the target is met; `None` for figures reported for information.
    pub met: Option<bool>,
}

impl Row {
    /// relay / direct, when there is a direct value.
    pub fn ratio(&self) -> Option<f64> {
        self.direct.map(|d| self.relay / d)
    }
}

fn number(value: f64) -> String {
    if value.is_nan() {
        "–".to_string()
    } else if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

/// The Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from("| scenario | figure | direct | relay | relay/direct | target | met |\n| --- | --- | ---: | ---: | ---: | --- | :---: |\n");
    for row in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            row.scenario,
            row.figure,
            row.direct.map(number).unwrap_or_else(|| "–".to_string()),
            number(row.relay),
            row.ratio()
                .map(|r| format!("{r:.3}"))
                .unwrap_or_else(|| "–".to_string()),
            row.target,
            match row.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "–",
            },
        ));
    }
    out
}

/// The JSON document.
pub fn json(rows: &[Row], machine: &str) -> Value {
    json!({
        "machine": machine,
        "rows": rows.iter().map(|row| json!({
            "scenario": row.scenario,
            "figure": row.figure,
            "direct": row.direct,
            "relay": row.relay,
            "ratio": row.ratio(),
            "target": row.target,
            "met": row.met,
        })).collect::<Vec<_>>(),
    })
}
