//! `tutti sim`: seeds of the deterministic simulation on every core.

use super::out::outln;
use clap::Args;

#[derive(Args)]
pub(crate) struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// What to simulate: `bank` (minitransactions: transfers and audits under recovery),
    /// `bank-repl` (the same over `log-repl` nodes: each a primary and a mirror that crash,
    /// are cut off and fail over), `bank-ram-repl` (over `ram-repl` nodes: every crash
    /// loses that copy; a seed that loses a node reports it),
    /// `log` (the shared log: appenders and stream readers, the sequencer crashing) or
    /// `tango` (objects over the log: transactions across layered partitions, decision
    /// records, checkpoints, forget and trim) or `fs` (tutti-fs: creates, unlinks, renames,
    /// mkdir/rmdir, writes and truncates from several clients; fsck's checks at the end).
    #[arg(long, value_enum, default_value_t = SimWorkload::Bank)]
    workload: SimWorkload,
}

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq, Debug)]
pub(crate) enum SimWorkload {
    Bank,
    BankRepl,
    BankRamRepl,
    Log,
    Tango,
    Fs,
}

impl SimWorkload {
    fn run(self, seed: u64) -> tutti_sim::Report {
        match self {
            SimWorkload::Bank => tutti_sim::run(seed, &tutti_sim::SimConfig::default()),
            SimWorkload::BankRepl => {
                let cfg = tutti_sim::SimConfig {
                    replicated: true,
                    ..tutti_sim::SimConfig::default()
                };
                tutti_sim::run(seed, &cfg)
            }
            SimWorkload::BankRamRepl => {
                let cfg = tutti_sim::SimConfig {
                    replicated: true,
                    in_ram: true,
                    ..tutti_sim::SimConfig::default()
                };
                tutti_sim::run(seed, &cfg)
            }
            SimWorkload::Log => tutti_sim::log::run(seed, &tutti_sim::log::LogSimConfig::default()),
            SimWorkload::Tango => {
                tutti_sim::tango::run(seed, &tutti_sim::tango::TangoSimConfig::default())
            }
            SimWorkload::Fs => tutti_sim::fs::run(seed, &tutti_sim::fs::FsSimConfig::default()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            SimWorkload::Bank => "bank",
            SimWorkload::BankRepl => "bank-repl",
            SimWorkload::BankRamRepl => "bank-ram-repl",
            SimWorkload::Log => "log",
            SimWorkload::Tango => "tango",
            SimWorkload::Fs => "fs",
        }
    }
}

pub(crate) fn run(a: SimArgs) -> Result<(), String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let started = std::time::Instant::now();
    let bar = indicatif::ProgressBar::new(a.seeds);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} seeds {per_sec} eta {eta} {msg}",
        )
        .expect("a valid template"),
    );
    let next = AtomicU64::new(0);
    let failures: Mutex<Vec<(u64, String)>> = Mutex::default();
    let totals: [AtomicU64; 13] = Default::default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.seeds {
                    return;
                }
                let seed = a.from + i;
                let report = a.workload.run(seed);
                for (total, n) in totals.iter().zip([
                    report.committed,
                    report.unknown,
                    report.node_crashes,
                    report.coordinator_crashes,
                    report.fail_overs,
                    report.mirror_joins,
                    u64::from(report.nodes_lost > 0),
                    report.formers_named_again,
                    report.answered_on_trust,
                    report.disks_lost,
                    report.members_revoked,
                    report.callbacks_retaken,
                    report.dropped_mirrors_named,
                ]) {
                    total.fetch_add(n, Ordering::Relaxed);
                }
                if !report.violations.is_empty() {
                    let mut text = report
                        .violations
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ");
                    if report.nodes_lost > 0 {
                        let lost = report.nodes_lost;
                        text = format!("{lost} node(s) lost both copies; {text}");
                    }
                    let mut failures = failures.lock().expect("failures poisoned");
                    failures.push((seed, text));
                    bar.set_message(format!("{} failing", failures.len()));
                }
                bar.inc(1);
            });
        }
    });
    bar.finish();
    if a.seeds == 1 {
        let (first, second) = (a.workload.run(a.from), a.workload.run(a.from));
        let same = (first.trace_hash, first.events) == (second.trace_hash, second.events);
        outln!(
            "seed {}: {} events, trace {:016x}, replayed identically: {same}",
            a.from,
            first.events,
            first.trace_hash
        );
    }
    let [committed, unknown, node_crashes, coordinator_crashes, fail_overs, mirror_joins, lost, formers, trusted, disks_lost, revoked, retaken, dropped] =
        totals.map(|t| t.into_inner());
    let mut failures = failures.into_inner().expect("failures poisoned");
    failures.sort();
    outln!(
        "{} seeds from {} in {:.1} s: {} failing; {committed} {} committed, {unknown} with unknown outcome, {node_crashes} crashes of faulty processes, {coordinator_crashes} coordinator crashes",
        a.seeds,
        a.from,
        started.elapsed().as_secs_f64(),
        failures.len(),
        match a.workload {
            SimWorkload::Bank | SimWorkload::BankRepl | SimWorkload::BankRamRepl => {
                "minitransactions"
            }
            SimWorkload::Log => "appends",
            SimWorkload::Tango => "transfers",
            SimWorkload::Fs => "file-system operations",
        }
    );
    if matches!(a.workload, SimWorkload::BankRepl | SimWorkload::BankRamRepl) {
        outln!(
            "{fail_overs} nodes served by another copy than their first primary at the end; \
             {mirror_joins} mirrors joined a primary running without one"
        );
    }
    if a.workload == SimWorkload::BankRepl {
        outln!(
            "{disks_lost} crashes also took the process's disk (it joins again, empty); \
             {lost} seeds lost a node (both copies); {formers} replaced primaries named \
             again and {dropped} mirrors named primary after the placement left them out \
             (dropped, or named and replaced before they heard), the copy serving in their \
             place having fallen silent before it registered"
        );
    }
    if a.workload == SimWorkload::BankRamRepl {
        outln!(
            "{lost} seeds lost a node (both copies; docs/replication.md, \"ram-repl\"); \
             {formers} replaced primaries named again and {dropped} mirrors named primary \
             after the placement left them out (the copy serving in their place died before \
             it registered)"
        );
    }
    if a.workload == SimWorkload::Fs {
        outln!(
            "{trusted} steps answered on trust without a minitransaction (coherent caching), \
             each compared with the memory nodes at that instant; {revoked} clients revoked \
             by a writer, {retaken} callbacks taken back"
        );
    }
    for (seed, text) in &failures {
        outln!(
            "seed {seed}: {text}\n  reproduce: {}",
            tutti_sim::reproduce_command(*seed, a.workload.name())
        );
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} seeds broke an invariant", failures.len()))
    }
}
