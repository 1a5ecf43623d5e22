//! `tutti chaos`: failure injection against real processes, then verification and a report.

use super::args::{parse_duration_s, parse_range, ModeArg};
use super::out::noteln;
use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use tutti_wire::CredentialFiles;

#[derive(Args)]
pub(crate) struct ChaosArgs {
    /// How long to inject faults: seconds, or with a unit (90s, 10m, 1h).
    #[arg(long, visible_alias = "duration", default_value = "60", value_parser = parse_duration_s)]
    duration_s: f64,
    /// What the clients do: `bank` (transfers and registers over minitransactions), `log`
    /// (the shared log: appenders on streams 1-3, one reader per stream, a trimmer following
    /// the readers; the sequencer is killed too) or `objects` (Tango's objects, each client
    /// with its own views: a register and a map's keys checked by Porcupine, transfers in
    /// transactions across eight maps hosted in layered partitions, checkpoints and trims;
    /// the sequencer is killed too) or `fs` (tutti-fs: each client a `tutti fs mount` and a
    /// process working through it: register files replaced by rename and checked by
    /// Porcupine, the simulator's file-system actions in its own and a shared directory;
    /// a client kill kills both; fsck and each client's directory model at the end).
    #[arg(long, value_enum, default_value = "bank")]
    workload: WorkloadArg,
    /// Client processes: bank clients (default 6), the log's appenders (6), objects clients
    /// (4), or file-system mounts (3).
    #[arg(long)]
    clients: Option<u64>,
    /// Seconds between memory node kills, as MIN-MAX.
    #[arg(long, default_value = "1-4", value_parser = parse_range)]
    node_kill_every_s: (f64, f64),
    /// Seconds between client kills, as MIN-MAX.
    #[arg(long, default_value = "1-4", value_parser = parse_range)]
    client_kill_every_s: (f64, f64),
    /// Seconds between manager kills, as MIN-MAX (with --managers 3, a random one of the
    /// group, leader or follower).
    #[arg(long, default_value = "10-30", value_parser = parse_range)]
    manager_kill_every_s: (f64, f64),
    /// Managers: 1, or a Raft group of 3 or 5 whose members are killed and partitioned
    /// from each other and from the nodes like every other process.
    #[arg(long, default_value_t = 1)]
    managers: usize,
    /// `log`, or `log-repl`: each memory node a primary and a mirror in two processes
    /// (docs/replication.md); a node kill then strikes the process serving the node, or
    /// one time in three its other one, and each kill of a serving process is timed until
    /// the node commits again (the report's unavailability). Or `ram-repl`: the same with
    /// both copies in RAM, where a node running alone loses only its other process.
    #[arg(long, value_enum, default_value = "log")]
    mode: ModeArg,
    /// `log-repl`, `ram-repl`: how long the managers wait for a silent primary before its mirror takes
    /// over (`tutti manager --failover-timeout-ms`; the managers' default, 500, without it).
    #[arg(long)]
    failover_timeout_ms: Option<u64>,
    /// `log-repl`: never lose a disk. Without it, one node kill in five, while both of the
    /// node's copies are named, also empties the killed process's data directory: it
    /// comes back with no copy and joins as the mirror, and the node loses nothing.
    #[arg(long)]
    no_disk_loss: bool,
    /// Seconds between sequencer kills (log workload), as MIN-MAX.
    #[arg(long, default_value = "2-6", value_parser = parse_range)]
    sequencer_kill_every_s: (f64, f64),
    /// Seconds between consistent backups taken while the bank runs, as MIN-MAX (bank
    /// workload; none without it). Each is a `tutti backup create` process; each that
    /// completes is restored at the end into a cluster of its own, checked as a cut.
    #[arg(long, value_parser = parse_range)]
    backup_every_s: Option<(f64, f64)>,
    /// Seconds between partitions of a random pair of processes, as MIN-MAX. Every process
    /// then dials its peers through a fault-injecting proxy in this process.
    #[arg(long, default_value = "5-20", value_parser = parse_range)]
    partition_every_s: (f64, f64),
    /// How long each partition lasts, in seconds, as MIN-MAX.
    #[arg(long, default_value = "1-8", value_parser = parse_range)]
    partition_for_s: (f64, f64),
    /// Run without the proxy and without partitions.
    #[arg(long)]
    no_partitions: bool,
    /// Relative frequencies of client operations: bank transfers, and reads, writes and
    /// compare-and-swaps of registers whose history Porcupine checks.
    #[arg(long, default_value = "transfer=2,read=1,write=1,cas=1")]
    mix: tutti_harness::chaos::Mix,
    /// The directory of the Go program that checks register histories with Porcupine.
    #[arg(long, default_value_os_t = tutti_harness::chaos::default_checker())]
    linearizability_checker: PathBuf,
    /// Seed of the fault schedule (random if not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the cluster's data and logs here (default: a scratch directory, removed if the
    /// run passes).
    #[arg(long)]
    data: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum WorkloadArg {
    Bank,
    Log,
    Objects,
    Fs,
}

pub(crate) fn run(a: ChaosArgs, credentials: CredentialFiles) -> Result<(), String> {
    use tutti_harness::chaos::{ChaosConfig, ChaosWorkload, Terminator};
    let every = |(lo, hi): (f64, f64)| Terminator {
        every: (Duration::from_secs_f64(lo), Duration::from_secs_f64(hi)),
    };
    if matches!(a.mode, ModeArg::Ram) {
        return Err(
            "--mode ram loses what a killed node held: chaos runs log, log-repl or ram-repl".into(),
        );
    }
    let cfg = ChaosConfig {
        duration: Duration::from_secs_f64(a.duration_s),
        workload: match a.workload {
            WorkloadArg::Bank => ChaosWorkload::Bank,
            WorkloadArg::Log => ChaosWorkload::Log,
            WorkloadArg::Objects => ChaosWorkload::Objects,
            WorkloadArg::Fs => ChaosWorkload::Fs,
        },
        clients: a
            .clients
            .unwrap_or(match a.workload {
                WorkloadArg::Objects => 4,
                WorkloadArg::Fs => 3,
                WorkloadArg::Bank | WorkloadArg::Log => 6,
            })
            .max(1),
        nodes: every(a.node_kill_every_s),
        clients_killer: every(a.client_kill_every_s),
        manager: every(a.manager_kill_every_s),
        managers: a.managers,
        mode: a.mode.name().into(),
        failover_timeout_ms: a.failover_timeout_ms,
        lose_disks: !a.no_disk_loss,
        backups: a.backup_every_s.map(every),
        sequencer: every(a.sequencer_kill_every_s),
        partitions: (!a.no_partitions)
            .then(|| (every(a.partition_every_s), every(a.partition_for_s))),
        mix: a.mix,
        linearizability_checker: a.linearizability_checker,
        seed: a.seed.unwrap_or_else(rand::random),
        credentials,
    };
    // Without --data: a scratch directory, removed when every invariant holds and kept
    // (for its logs) otherwise.
    let (dir, scratch) = match a.data {
        Some(data) => (data, None),
        None => {
            let scratch = tempfile::Builder::new()
                .prefix("tutti-chaos-")
                .tempdir()
                .map_err(|e| format!("creating a scratch directory: {e}"))?;
            (scratch.path().to_path_buf(), Some(scratch))
        }
    };
    let keep = |scratch: Option<tempfile::TempDir>| scratch.map(tempfile::TempDir::keep);
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    eprintln!(
        "chaos: seed {} (replay the fault schedule with --seed), data in {}",
        cfg.seed,
        dir.display()
    );
    let report =
        match tutti_harness::chaos::run(&exe, &dir, &cfg, |line| eprint!("\rchaos: {line}   ")) {
            Ok(report) => report,
            Err(e) => {
                keep(scratch);
                return Err(format!("{e}; data and logs kept in {}", dir.display()));
            }
        };
    eprintln!();
    print!("{}", report.table(&cfg));
    if report.violations.is_empty() {
        match cfg.workload {
            ChaosWorkload::Bank => {
                let registers = if cfg.mix.has_registers() {
                    ", register history linearizable"
                } else {
                    ""
                };
                let mirrored = if tutti_harness::local::replicated(&cfg.mode) {
                    ", every node mirrored again"
                } else {
                    ""
                };
                noteln!("invariants: all hold (no committed transfer lost, money conserved, nothing uncertain or locked, logs collected{registers}{mirrored})");
            }
            ChaosWorkload::Objects => noteln!("invariants: all hold (register and map history linearizable, money conserved over 8 maps, every account's balance its receipts', each transfer seen committed in the log and none seen aborted, nothing uncertain or locked, logs collected)"),
            ChaosWorkload::Fs => noteln!("invariants: all hold (register files linearizable across mounts, every client's directory as its answers say, fsck clean once what killed mounts left is repaired, nothing uncertain or locked, logs collected)"),
            ChaosWorkload::Log => noteln!("invariants: all hold (no two appends at one position, every acknowledged append at its position, every reader's stream in log order with each acknowledged append once, nothing uncertain or locked, logs collected)"),
        }
        Ok(())
    } else {
        keep(scratch);
        for v in &report.violations {
            noteln!("VIOLATION: {v}");
        }
        Err(format!(
            "{} invariant violations; data and logs kept in {}",
            report.violations.len(),
            dir.display()
        ))
    }
}
