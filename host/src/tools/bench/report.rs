//! The report: medians per scenario and handler, and the table printed.

use std::collections::BTreeMap;

use super::{BenchReport, RunFigures, Scenario, Summary};
use crate::worker::percentile;

pub(super) fn summarize(runs: &[RunFigures]) -> Vec<Summary> {
    let mut groups: BTreeMap<(Scenario, &'static str), Vec<&RunFigures>> = BTreeMap::new();
    for r in runs {
        groups.entry((r.scenario, r.handler)).or_default().push(r);
    }
    let median = |v: Vec<f64>| percentile(v, 0.5);
    let mut out: Vec<Summary> = groups
        .iter()
        .map(|((scenario, handler), rs)| Summary {
            scenario: *scenario,
            handler,
            runs: rs.len(),
            rate: median(rs.iter().map(|r| r.rate).collect()),
            p50_ms: median(rs.iter().map(|r| r.p50_ms).collect()),
            p99_ms: median(rs.iter().map(|r| r.p99_ms).collect()),
            cpu_s_per_1k: median(rs.iter().map(|r| r.cpu_s_per_1k).collect()),
            peak_rss_mib: rs.iter().map(|r| r.peak_rss_mib).fold(0.0, f64::max),
            wasm_over_native: None,
        })
        .collect();
    let natives: BTreeMap<Scenario, f64> = out.iter().filter(|s| s.handler == "native").map(|s| (s.scenario, s.rate)).collect();
    for s in out.iter_mut().filter(|s| matches!(s.handler, "wasm" | "python" | "js")) {
        s.wasm_over_native = natives.get(&s.scenario).map(|n| s.rate / n);
    }
    out
}

pub(super) fn print_table(report: &BenchReport) {
    if report.processes > 1 {
        println!(
            "components run by `idem run` with {} pinned worker processes of {} handler slots; latency not measured",
            report.processes,
            report.concurrency / report.processes
        );
    }
    let mut table = comfy_table::Table::new();
    table.set_header(vec![
        "scenario",
        "handler",
        "runs",
        "msg/s (median)",
        "p50 ms",
        "p99 ms",
        "CPU s / 1k msgs",
        "peak RSS MiB",
        "component / native",
    ]);
    for s in &report.summary {
        table.add_row(vec![
            format!("{:?}", s.scenario).to_lowercase(),
            s.handler.to_string(),
            s.runs.to_string(),
            format!("{:.0}", s.rate),
            format!("{:.2}", s.p50_ms),
            format!("{:.2}", s.p99_ms),
            format!("{:.3}", s.cpu_s_per_1k),
            format!("{:.0}", s.peak_rss_mib),
            s.wasm_over_native.map(|r| format!("{r:.3}")).unwrap_or_default(),
        ]);
    }
    println!("{table}");
}
