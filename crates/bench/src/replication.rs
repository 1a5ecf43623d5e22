//! The replicated modes' section of RESULTS.md (`tutti bench repl`): Fig. 16 at every
//! outstanding count and Fig. 18's scaling in `log`, `log-repl`, `ram` and `ram-repl`, etcd
//! beside them, and issue 18's ratios at 64 outstanding against their targets.

use crate::log::write_results;
use crate::suite::{find, ReplicationSummary, HEADLINE_OUTSTANDING};
use crate::Point;
use std::fmt::Write;
use std::path::Path;

pub const SECTION_BEGIN: &str = "<!-- tutti bench repl -->";
pub const SECTION_END: &str = "<!-- /tutti bench repl -->";

const MODES: [&str; 4] = ["log", "log-repl", "ram", "ram-repl"];

/// Fig. 18's point of `mode` at `nodes` (Fig. 16's are `suite::find`'s).
fn fig18<'a>(points: &'a [Point], mode: &str, nodes: usize) -> Option<&'a Point> {
    (points.iter()).find(|p| {
        p.experiment == "fig18" && p.system == "tutti" && p.mode == mode && p.nodes == nodes
    })
}

/// The distinct values of `of` over `experiment`'s points, in order.
fn distinct(points: &[Point], experiment: &str, of: impl Fn(&Point) -> usize) -> Vec<usize> {
    let values: std::collections::BTreeSet<usize> = (points.iter())
        .filter(|p| p.experiment == experiment)
        .map(of)
        .collect();
    values.into_iter().collect()
}

fn cell(p: Option<&Point>) -> String {
    p.map_or("–".into(), |p| format!("{:.0}", p.throughput_per_s))
}

fn ratio_row(md: &mut String, what: &str, value: f64, target: f64) {
    let met = if value >= target { "met" } else { "not met" };
    let _ = writeln!(md, "| {what} | {value:.2} | ≥ {target} | {met} |");
}

/// The section, markers included.
pub fn section(points: &[Point], summary: &ReplicationSummary, command: &str) -> String {
    let mut md = format!("{SECTION_BEGIN}\n## Replicated memory nodes (`tutti bench repl`)\n\n");
    let _ = writeln!(
        md,
        "`{command}`: each mode on a cluster of its own started here (`log-repl` and \
         `ram-repl`: every memory node a primary process and a mirror process), 3 \
         compare-and-swaps per minitransaction over 50,000 items per node, minitransactions \
         per second; at {HEADLINE_OUTSTANDING} outstanding the median of several runs. etcd: \
         one member on the local disk (fsync), the same transactions. Sinfonia reports \
         LOG-REPL at 0.83 × LOG.\n"
    );
    let outstanding = distinct(points, "fig16", |p| p.outstanding);
    for (nodes, title) in [
        (1, "one node (one phase)"),
        (4, "four nodes, each minitransaction over two (two phases)"),
    ] {
        let _ = writeln!(md, "### Fig. 16, {title}\n");
        let _ = writeln!(md, "| outstanding | {} | etcd |", MODES.join(" | "));
        let _ = writeln!(md, "| ---: |{}", " ---: |".repeat(MODES.len() + 1));
        for &o in &outstanding {
            let cells: Vec<String> = (MODES.iter())
                .map(|m| cell(find(points, "tutti", m, nodes, o)))
                .collect();
            let etcd = (nodes == 1)
                .then(|| find(points, "etcd", "fsync", 1, o))
                .flatten();
            let _ = writeln!(md, "| {o} | {} | {} |", cells.join(" | "), cell(etcd));
        }
        md.push('\n');
    }
    let sizes = distinct(points, "fig18", |p| p.nodes);
    let at = (points.iter())
        .find(|p| p.experiment == "fig18")
        .map_or(HEADLINE_OUTSTANDING, |p| p.outstanding);
    let _ = writeln!(
        md,
        "### Fig. 18, scaling at {at} outstanding (each minitransaction over two nodes where \
         there are two)\n"
    );
    let _ = writeln!(md, "| nodes | {} |", MODES.join(" | "));
    let _ = writeln!(md, "| ---: |{}", " ---: |".repeat(MODES.len()));
    for n in sizes {
        let cells: Vec<String> = (MODES.iter()).map(|m| cell(fig18(points, m, n))).collect();
        let _ = writeln!(md, "| {n} | {} |", cells.join(" | "));
    }
    let _ = writeln!(
        md,
        "\n### Targets at {HEADLINE_OUTSTANDING} outstanding\n\n| ratio | value | target | |\n| --- | ---: | ---: | --- |"
    );
    ratio_row(
        &mut md,
        "log-repl / log, 1 node",
        summary.log_repl_vs_log_1pc,
        0.7,
    );
    ratio_row(
        &mut md,
        "log-repl / log, 4 nodes",
        summary.log_repl_vs_log_2pc,
        0.7,
    );
    ratio_row(
        &mut md,
        "ram-repl / ram, 1 node",
        summary.ram_repl_vs_ram_1pc,
        0.7,
    );
    ratio_row(
        &mut md,
        "ram-repl / ram, 4 nodes",
        summary.ram_repl_vs_ram_2pc,
        0.7,
    );
    ratio_row(&mut md, "log-repl / etcd", summary.log_repl_vs_etcd, 10.0);
    cpu_table(&mut md, summary);
    let _ = write!(md, "\n{SECTION_END}");
    md
}

/// Where the CPU goes in each mode, and what 0.7 × `ram` leaves for `ram-repl` on the
/// cores every process shares here.
fn cpu_table(md: &mut String, summary: &ReplicationSummary) {
    if summary.cpu.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n### Where the CPU goes: one node, {HEADLINE_OUTSTANDING} outstanding\n\nµs of \
         CPU (user and system, every thread, from `/proc/PID/stat` between the ends of two \
         runs) per minitransaction, by process: the client (this bench), the memory node's \
         first process (its primary in the replicated modes), the mirror, the manager and the \
         sequencer. Every process shares this machine's {} cores.\n\n| mode | per second | \
         client | primary | mirror | manager | all | cores busy |\n| --- | ---: | ---: | ---: \
         | ---: | ---: | ---: | ---: |",
        summary.cores
    );
    for c in &summary.cpu {
        let us = |kind: &str| {
            c.us_per_minitx
                .get(kind)
                .map_or("–".into(), |v| format!("{v:.2}"))
        };
        let _ = writeln!(
            md,
            "| {} | {:.0} | {} | {} | {} | {} | {:.2} | {:.2} |",
            c.mode,
            c.throughput_per_s,
            us("client"),
            us("primary"),
            us("mirror"),
            us("manager"),
            c.total_us(),
            c.busy_cores
        );
    }
    let share = |mode: &str| summary.cpu.iter().find(|c| c.mode == mode);
    if let (Some(ram), Some(repl)) = (share("ram"), share("ram-repl")) {
        let target = 0.7 * ram.throughput_per_s;
        let budget = |cores: f64| cores * 1e6 / target;
        let _ = writeln!(
            md,
            "\nAt 0.7 × `ram`'s {:.0}/s, {} cores allow at most {:.2} µs of CPU per \
             minitransaction for every process together, and {:.2} µs with them as busy as \
             `ram` keeps them; `ram-repl` takes {:.2} µs, `ram` {:.2} µs.",
            ram.throughput_per_s,
            summary.cores,
            budget(summary.cores as f64),
            budget(ram.busy_cores),
            repl.total_us(),
            ram.total_us()
        );
    }
}

/// Writes `results/repl.json` and the replicated modes' section of `RESULTS.md` under `out`.
pub fn write(
    out: &Path,
    points: &[Point],
    summary: &ReplicationSummary,
    command: &str,
) -> Result<(), String> {
    let md = section(points, summary, command);
    write_results(out, "repl.json", points, SECTION_BEGIN, SECTION_END, &md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::CpuShare;

    /// `us`: the primary's, the client's, then the mirror's µs per minitransaction.
    fn share(mode: &str, per_s: f64, busy_cores: f64, us: &[f64]) -> CpuShare {
        let kinds = ["primary", "client", "mirror"];
        CpuShare {
            mode: mode.into(),
            nodes: 1,
            outstanding: 64,
            throughput_per_s: per_s,
            us_per_minitx: kinds
                .iter()
                .zip(us)
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            busy_cores,
        }
    }

    #[test]
    fn the_section_has_a_row_per_outstanding_count_and_the_targets() {
        let mut points = vec![];
        for (mode, per_s) in [("log", 100.0), ("log-repl", 69.0)] {
            let mut p = Point::new("fig16", "tutti", mode, 1, 1, 64);
            p.throughput_per_s = per_s;
            points.push(p);
        }
        let summary = ReplicationSummary {
            log_repl_vs_log_1pc: 0.69,
            log_repl_vs_log_2pc: 0.0,
            ram_repl_vs_ram_1pc: 0.0,
            ram_repl_vs_ram_2pc: 0.0,
            log_repl_vs_etcd: 12.0,
            targets_met: false,
            cpu: vec![
                share("ram", 400_000.0, 1.5, &[1.6, 2.4]),
                share("ram-repl", 150_000.0, 1.3, &[4.5, 2.8, 1.35]),
            ],
            cores: 2,
        };
        let md = section(&points, &summary, "tutti bench repl");
        assert!(md.starts_with(SECTION_BEGIN) && md.ends_with(SECTION_END));
        assert!(md.contains("| 64 | 100 | 69 | – | – | – |"), "{md}");
        assert!(md.contains("| log-repl / log, 1 node | 0.69 | ≥ 0.7 | not met |"));
        assert!(md.contains("| log-repl / etcd | 12.00 | ≥ 10 | met |"));
        assert!(
            md.contains("| ram | 400000 | 2.40 | 1.60 | – | – | 4.00 | 1.50 |"),
            "{md}"
        );
        assert!(md.contains("| ram-repl | 150000 | 2.80 | 4.50 | 1.35 | – | 8.65 | 1.30 |"));
        // 2 cores over 280,000/s; 1.5 cores over the same.
        assert!(
            md.contains(
                "at most 7.14 µs of CPU per minitransaction for every process \
             together, and 5.36 µs with them as busy as `ram` keeps them; `ram-repl` takes 8.65 \
             µs, `ram` 4.00 µs."
            ),
            "{md}"
        );
    }
}
