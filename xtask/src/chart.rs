//! `cargo xtask chart INPUT.json OUTPUT.png`: the benchmark chart of
//! docs/BENCHMARKS.md, drawn from what `bench/compare` wrote.

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::prelude::*;

/// Fonts tried, in order, for the labels.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// One bar: label, messages per second, colour.
struct Bar {
    label: String,
    rate: f64,
    colour: RGBColor,
}

pub fn chart(input: &Path, output: &Path) -> Result<()> {
    let text = std::fs::read_to_string(input).with_context(|| format!("cannot read {}; run bench/compare first", input.display()))?;
    let data: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", input.display()))?;
    let font = FONTS
        .iter()
        .find_map(|f| std::fs::read(f).ok())
        .context("no DejaVu or Liberation font found for the chart labels; install fonts-dejavu-core")?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| anyhow::anyhow!("the chart font could not be loaded"))?;

    let wasm = RGBColor(0x3b, 0x6e, 0xa8);
    let native = RGBColor(0x9c, 0xb8, 0xd9);
    let other = RGBColor(0xc0, 0x6c, 0x3c);
    let mut bars = Vec::new();
    for s in data["idem"]["summary"].as_array().into_iter().flatten() {
        let handler = s["handler"].as_str().unwrap_or("?");
        // The bare broker loops (scenario f's and g's baselines) are
        // ratios' denominators, an order of magnitude above everything
        // else: in the tables, not on the chart.
        if handler.ends_with("-loop") {
            continue;
        }
        bars.push(Bar {
            label: format!("{} {handler}", s["scenario"].as_str().unwrap_or("?")),
            rate: s["rate"].as_f64().unwrap_or(0.0),
            colour: if handler == "wasm" { wasm } else { native },
        });
    }
    for (key, label) in [("celery", "Celery + guard"), ("pgbench", "pgbench upsert")] {
        if let Some(rate) = data[key]["rate"].as_f64() {
            bars.push(Bar {
                label: label.to_string(),
                rate,
                colour: other,
            });
        }
    }
    if bars.is_empty() {
        bail!("{} holds no figures", input.display());
    }
    let top = bars.iter().map(|b| b.rate).fold(0.0, f64::max) * 1.15;

    let root = BitMapBackend::new(output, (1100, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Messages per second (median of runs), 2-core machine", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..bars.len() as f64, -top * 0.08..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc("messages / s")
        .y_label_formatter(&|v| if *v < 0.0 { String::new() } else { format!("{v:.0}") })
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, bar) in bars.iter().enumerate() {
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.12, 0.0), (x + 0.88, bar.rate)],
            bar.colour.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{:.0}", bar.rate),
            (x + 0.2, bar.rate + top * 0.02),
            ("sans-serif", 14),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            bar.label.clone(),
            (x + 0.1, -top * 0.03),
            ("sans-serif", 13),
        )))?;
    }
    root.present()?;
    Ok(())
}
