//! `tutti bench`: the benchmarks of `tutti-bench`, compiled in with the `bench` feature
//! (they link the peers' clients, which the binary that runs memory nodes does without).

use super::args::ModeArg;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;
use tutti_client::ClientOptions;

#[derive(Subcommand)]
pub(crate) enum BenchCommand {
    /// Sinfonia Fig. 16: 3 compare-and-swaps per minitransaction over 50,000 4-byte items,
    /// outstanding minitransactions swept. Without --cluster it starts (and removes) its own
    /// clusters: 1 node for 1PC, 4 nodes with spread 2 for 2PC, in each requested mode.
    Minitx(BenchMinitxArgs),
    /// Everything in one run: the physical limits (loopback round trip, fdatasync), Sinfonia
    /// Fig. 16-20 on tutti, and Fig. 16 on Redis, PostgreSQL, etcd and an embedded SQLite,
    /// each started here on loopback (installed with apt-get if missing). Writes
    /// results/*.json, RESULTS.md and a PNG per figure (matplotlib) under --out.
    All(BenchAllArgs),
    /// The shared log on a 4-node `log` cluster: appends (128 B and 4 KiB entries,
    /// outstanding swept) against Redis Streams XADD (appendfsync always), etcd puts and
    /// ZooKeeper 3.8 sequential znodes (forceSync=yes), each started here; reads; the
    /// sequencer alone; a new reader's sync of a 100,000-entry stream; a log node's resident
    /// set over minutes of appends and trims. Writes results/log.json and the log's section
    /// of RESULTS.md under --out.
    Log(BenchLogArgs),
    /// Tango's objects over the shared log on 4-node `log` clusters (Tango §6): a register
    /// with one view (writes and linearizable reads, outstanding swept); linearizable reads
    /// with 1, 2, 4 and 8 views in processes of their own; map transactions against key
    /// count (uniform and zipf); layered partitions with a growing share of cross-partition
    /// transactions; a view rebuilt every minute while a map takes 10 minutes of updates with
    /// checkpoints and trims; the namespace against ZooKeeper 3.8 and etcd, each started
    /// here. Writes results/objects.json and the objects' section of RESULTS.md under --out.
    Objects(BenchObjectsArgs),
    /// tutti-fs against the local disk, bindfs (a FUSE passthrough), GlusterFS (one brick)
    /// and JuiceFS (Redis metadata, appendfsync always), each set up here and torn down:
    /// Sinfonia's Connectathon phases (Fig. 22) and modified Andrew benchmark, creates,
    /// stats and unlinks of empty files in one directory, `ls -l` of a large directory, a
    /// sequential write and read; then tutti with two mounts against one. Needs root (FUSE,
    /// mount, dropping the page cache); installs missing peers with apt-get and builds
    /// JuiceFS with Go once. Writes results/fs.json and the fs section of RESULTS.md.
    Fs(BenchFsArgs),
    /// A consistent backup (docs/backup.md) of a 4-node `log` cluster holding data, taken
    /// while the bank runs: the bank's rate before, during and after it (goal: under 10 %
    /// lost), how long nodes were fenced, the backup's and the restore's times. JSON out.
    Backup(BenchBackupArgs),
    /// The client processes of `objects`, each with its own views.
    #[command(hide = true)]
    ObjectsClient(BenchObjectsClientArgs),
    /// The physical limits alone, as `all` measures them: the 64-byte loopback round trip
    /// (1 and 16 connections) and 4 KiB writes each followed by fdatasync (appending, on a
    /// preallocated file, and four preallocated streams at once), with p99.9 and max. Run it
    /// next to `minitx` to tell the disk's own stalls from tutti's.
    Limits(BenchLimitsArgs),
    /// Replicated memory nodes (docs/replication.md): Sinfonia Fig. 16 (3 compare-and-swaps
    /// per minitransaction over 50,000 items, outstanding swept) in `log`, `log-repl`, `ram`
    /// and `ram-repl` mode, on one node and on four with each minitransaction over two;
    /// Fig. 18 (scaling) in the four modes at 1, 2 and 4 nodes; each mode's CPU time per
    /// minitransaction by process (client, primary, mirror, manager) on one node at 64
    /// outstanding; then Fig. 16 on etcd (one member, started here), all in one run. Prints
    /// the points and a summary (the ratios, `cpu`) as JSON, then the ratios at 64
    /// outstanding against the targets (each replicated mode ≥ 0.7 × its unreplicated one,
    /// `log-repl` ≥ 10 × etcd). Writes results/repl.json and the replicated modes' section
    /// of RESULTS.md under --out.
    Repl(BenchReplArgs),
}

#[derive(Args)]
pub(crate) struct BenchBackupArgs {
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    /// Bytes of address space per node (suffixes K, M, G).
    #[arg(long, default_value = "1G", value_parser = super::args::parse_size)]
    size: u64,
    /// Random bytes written on each node before the backup.
    #[arg(long, default_value = "256M", value_parser = super::args::parse_size)]
    data: u64,
    /// Bank clients running during the measurement.
    #[arg(long, default_value_t = 16)]
    clients: u64,
    /// Seconds the bank's rate is measured before and after the backup.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// The backup's --max-rate for each backup taken in turn (suffixes K, M, G; 0:
    /// unlimited): `tutti backup create`'s default and no limit.
    #[arg(long, value_delimiter = ',', default_value = "32M,0", value_parser = super::args::parse_rate)]
    max_rate: Vec<u64>,
}

#[derive(Args)]
pub(crate) struct BenchReplArgs {
    /// A short pass: outstanding 1,16,64 for 1 s each.
    #[arg(long)]
    quick: bool,
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    outstanding: Vec<usize>,
    /// Seconds per point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Runs at 64 outstanding per system and layout (the median is kept: the machine is
    /// shared and noisy).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where results/ and RESULTS.md are written (default: bench/ of the source tree).
    #[arg(long, default_value_os_t = tutti_harness::source_tree().join("bench"))]
    out: PathBuf,
}

#[derive(Args)]
pub(crate) struct BenchLimitsArgs {
    /// Seconds per limit (an fdatasync stream stops early after 64 MiB).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// A directory on the disk to measure (default: a scratch directory under $TMPDIR).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct BenchLogArgs {
    /// A short pass: outstanding 1,16,64 for 1 s each, a 10,000-entry sync, one minute of
    /// memory.
    #[arg(long)]
    quick: bool,
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    outstanding: Vec<usize>,
    /// Seconds per point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Entry sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "128,4096")]
    sizes: Vec<usize>,
    /// Entries of the stream the sync reads.
    #[arg(long, default_value_t = 100_000)]
    sync_entries: u64,
    /// Minutes over which a log node's resident set is read (0: not measured).
    #[arg(long, default_value_t = 10)]
    memory_minutes: u64,
    /// Where results/ and RESULTS.md are written (default: bench/ of the source tree).
    #[arg(long, default_value_os_t = tutti_harness::source_tree().join("bench"))]
    out: PathBuf,
    /// Measure tutti only.
    #[arg(long)]
    no_peers: bool,
    /// Measure nothing: write the log's section of RESULTS.md again from the points in
    /// results/log.json (after a change to how they are shown). The command line recorded is
    /// the one given here, so give the measuring run's options.
    #[arg(long)]
    from_results: bool,
}

#[derive(Args)]
pub(crate) struct BenchObjectsArgs {
    /// A short pass: outstanding 1,16,64 for 1 s each.
    #[arg(long)]
    quick: bool,
    /// The namespace on tutti only: do not start ZooKeeper and etcd.
    #[arg(long)]
    no_peers: bool,
    /// Run only these experiments (comma-separated: register, transactions, namespace,
    /// views, partitions, history); all by default. What is written under --out then holds
    /// only them.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Minutes of updates in the history experiment (--quick: 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    history_minutes: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    outstanding: Vec<usize>,
    /// Seconds per point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Where results/ and RESULTS.md are written (default: bench/ of the source tree).
    #[arg(long, default_value_os_t = tutti_harness::source_tree().join("bench"))]
    out: PathBuf,
}

#[derive(Args)]
pub(crate) struct BenchFsArgs {
    /// A short pass: 1,000 files, `ls -l` of 5,000 entries, 64 MiB sequential, Andrew's
    /// directories copied 5 times.
    #[arg(long)]
    quick: bool,
    /// The systems to measure (comma-separated: tutti, local, bindfs, glusterfs, juicefs).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tutti,local,bindfs,glusterfs,juicefs"
    )]
    systems: Vec<String>,
    /// Run only these parts (comma-separated: connectathon, andrew, metadata, sequential,
    /// ls, two-mounts); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Empty files created, stated and unlinked in one directory.
    #[arg(long, default_value_t = 10_000)]
    files: usize,
    /// Entries of the directory `ls -l` lists.
    #[arg(long, default_value_t = 100_000)]
    ls_entries: usize,
    /// MiB written and read sequentially.
    #[arg(long, default_value_t = 1024)]
    sequential_mib: u64,
    /// How many times Andrew's first phase copies the source tree's directories.
    #[arg(long, default_value_t = 50)]
    andrew_copies: usize,
    /// Where results/ and RESULTS.md are written (default: bench/ of the source tree).
    #[arg(long, default_value_os_t = tutti_harness::source_tree().join("bench"))]
    out: PathBuf,
}

#[derive(Args)]
pub(crate) struct BenchObjectsClientArgs {
    #[command(flatten)]
    cluster: super::args::ClusterArg,
    #[command(subcommand)]
    role: ObjectsClientRole,
}

#[derive(Subcommand)]
enum ObjectsClientRole {
    /// Open the register's view, print `ready`, wait for a line on stdin, read for
    /// --seconds with --outstanding reads in flight, print the point as JSON.
    Reads {
        #[arg(long)]
        log: String,
        #[arg(long)]
        outstanding: usize,
        #[arg(long)]
        seconds: f64,
    },
    /// Rebuild the history map's view; print how long it took and the memory it took.
    Replay {
        #[arg(long)]
        log: String,
    },
}

#[derive(Args)]
pub(crate) struct BenchAllArgs {
    /// A 2-minute pass: outstanding 1,16,64 for 1 s each.
    #[arg(long)]
    quick: bool,
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    outstanding: Vec<usize>,
    /// Seconds per point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 50_000)]
    items: u32,
    /// Where results/ and RESULTS.md are written (default: bench/ of the source tree).
    #[arg(long, default_value_os_t = tutti_harness::source_tree().join("bench"))]
    out: PathBuf,
    /// Measure tutti and the limits only.
    #[arg(long)]
    no_peers: bool,
}

#[derive(Args)]
pub(crate) struct BenchMinitxArgs {
    /// Run against this running cluster instead of starting one (then --mode only labels).
    #[arg(long)]
    cluster: Option<String>,
    #[arg(long, value_enum, default_values_t = vec![ModeArg::Ram, ModeArg::Log])]
    mode: Vec<ModeArg>,
    #[arg(long, value_enum, default_values_t = vec![Layout2::OnePc, Layout2::TwoPc])]
    layout: Vec<Layout2>,
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    outstanding: Vec<usize>,
    /// Seconds per point.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 50_000)]
    items: u64,
    /// A short pass: outstanding 1,16,64 for 1 s each.
    #[arg(long)]
    quick: bool,
    /// Pipelined connections the client opens in all, spread over the nodes the layout uses
    /// (at least one per node), also against a larger --cluster. Over one, client and node
    /// take turns; compare with the default.
    #[arg(long, default_value_t = ClientOptions::default().connections as u16, value_parser = clap::value_parser!(u16).range(1..=64))]
    connections: u16,
    /// Also write the JSON array to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub(crate) enum Layout2 {
    /// One memory node: every minitransaction commits in one phase.
    #[value(name = "1pc")]
    OnePc,
    /// Four memory nodes, each minitransaction spread over two: two-phase commit.
    #[value(name = "2pc")]
    TwoPc,
}

#[cfg(feature = "bench")]
pub(crate) async fn run(which: BenchCommand) -> Result<(), String> {
    match which {
        BenchCommand::Minitx(a) => measure::minitx(a).await,
        BenchCommand::All(a) => measure::all(a).await,
        BenchCommand::Log(a) => measure::log(a).await,
        BenchCommand::Objects(a) => measure::objects(a).await,
        BenchCommand::Fs(a) => measure::fs(a).await,
        BenchCommand::ObjectsClient(a) => measure::objects_client(a).await,
        BenchCommand::Limits(a) => measure::limits(a).await,
        BenchCommand::Repl(a) => measure::repl(a).await,
        BenchCommand::Backup(a) => measure::backup(a).await,
    }
}

#[cfg(not(feature = "bench"))]
pub(crate) async fn run(_which: BenchCommand) -> Result<(), String> {
    Err(
        "this tutti was built without its benchmarks (they link the Redis, PostgreSQL, etcd \
         and SQLite clients): run `cargo build --release -p tutti --features bench` and try again"
            .into(),
    )
}

#[cfg(feature = "bench")]
mod measure {
    use super::{
        BenchAllArgs, BenchBackupArgs, BenchFsArgs, BenchLimitsArgs, BenchLogArgs, BenchMinitxArgs,
        BenchObjectsArgs, BenchObjectsClientArgs, BenchReplArgs, Layout2, ObjectsClientRole,
    };
    use crate::cmd::args::with_cluster_credentials;
    use crate::cmd::out::noteln;
    use std::path::Path;
    use std::time::Duration;
    use tutti_bench::minitx::{client_connections, run_minitx, Access, MinitxBench, MinitxKind};
    use tutti_bench::suite::ScratchCluster;
    use tutti_bench::Point;
    use tutti_client::{ClientOptions, Cluster};
    use tutti_harness::local::access;

    /// A scratch directory for the bench's clusters and peers, removed when dropped: in
    /// `within`, or under $TMPDIR.
    fn scratch_dir(prefix: &str, within: Option<&Path>) -> Result<tempfile::TempDir, String> {
        let mut builder = tempfile::Builder::new();
        builder.prefix(prefix);
        match within {
            Some(dir) => builder.tempdir_in(dir),
            None => builder.tempdir(),
        }
        .map_err(|e| format!("creating a scratch directory: {e}"))
    }

    /// How this run was invoked, as the results record it, without the argument `leave_out`.
    fn command_line(leave_out: Option<&str>) -> String {
        std::env::args()
            .skip(1)
            .filter(|a| Some(a.as_str()) != leave_out)
            .fold("tutti".to_string(), |acc, a| acc + " " + &a)
    }

    pub(super) async fn all(a: BenchAllArgs) -> Result<(), String> {
        use tutti_bench::suite::{self, SuiteConfig};
        let (outstanding, headline_runs, seconds) = if a.quick {
            (vec![1, 16, 64], 1, 1.0)
        } else {
            (a.outstanding, 3, a.seconds)
        };
        let scratch = scratch_dir("tutti-bench-all-", None)?;
        let cfg = SuiteConfig {
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            out: a.out,
            scratch: scratch.path().to_path_buf(),
            outstanding,
            headline_runs,
            seconds_per_point: seconds,
            items: a.items,
            no_peers: a.no_peers,
        };
        let configs = if a.no_peers { 4 } else { 10 };
        let bar = indicatif::ProgressBar::new(
            (suite::FIXED_POINTS + configs * cfg.fig16_sweep().len()) as u64,
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} points {elapsed} {msg}")
                .expect("a valid template"),
        );
        let mut progress = |p: &Point| {
            bar.inc(1);
            let point = format!(
                "{} {} {} nodes={} outstanding={}: {:.0}/s",
                p.experiment, p.system, p.mode, p.nodes, p.outstanding, p.throughput_per_s
            );
            // Without a terminal (a log file, CI) the bar is hidden: a line per point instead.
            if bar.is_hidden() {
                eprintln!(
                    "bench: {}/{} {point}",
                    bar.position(),
                    bar.length().unwrap_or(0)
                );
            }
            bar.set_message(point);
        };
        let result = suite::run(&cfg, &mut progress).await;
        bar.finish();
        drop(scratch);
        let points = result?;
        suite::write(&cfg, &points, &command_line(None))?;
        suite::plot(&cfg.out)?;
        noteln!(
            "{}",
            serde_json::to_string(&points).expect("points serialise")
        );
        eprintln!(
            "bench: {} points; wrote {} and {}",
            points.len(),
            cfg.out.join("results").display(),
            cfg.out.join("RESULTS.md").display()
        );
        Ok(())
    }

    /// One line per point on stderr, as it is measured.
    fn print_point(p: &Point) {
        eprintln!(
            "bench: {} {} {} {} outstanding={:>3}: {:>9.0}/s p50 {} µs p99 {} µs{}",
            p.experiment,
            p.system,
            p.mode,
            p.operation.as_deref().unwrap_or(""),
            p.outstanding,
            p.throughput_per_s,
            p.p50_us,
            p.p99_us,
            p.rss_bytes
                .map_or(String::new(), |r| format!(" rss {} MiB", r >> 20))
        )
    }

    /// The points as JSON on stdout, and where `results/NAME.json` and NAME's section of
    /// RESULTS.md were written.
    fn report_written(points: &[Point], out: &Path, name: &str) {
        noteln!(
            "{}",
            serde_json::to_string(points).expect("points serialise")
        );
        eprintln!(
            "bench: {} points; wrote {} and the {name} section of {}",
            points.len(),
            out.join(format!("results/{name}.json")).display(),
            out.join("RESULTS.md").display()
        );
    }

    /// The outstanding counts and seconds per point: `--quick`'s, or those given.
    fn sweep_of(quick: bool, outstanding: Vec<usize>, seconds: f64) -> (Vec<usize>, f64) {
        if quick {
            (vec![1, 16, 64], 1.0)
        } else {
            (outstanding, seconds)
        }
    }

    pub(super) async fn objects(a: BenchObjectsArgs) -> Result<(), String> {
        use tutti_bench::objects::ObjectsBenchConfig;
        let scratch = scratch_dir("tutti-bench-objects-", None)?;
        let (outstanding, seconds) = sweep_of(a.quick, a.outstanding, a.seconds);
        let cfg = ObjectsBenchConfig {
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            scratch: scratch.path().to_path_buf(),
            outstanding,
            seconds,
            no_peers: a.no_peers,
            only: a.only,
            history_minutes: if a.quick { 1 } else { a.history_minutes },
        };
        let mut print = print_point;
        let result = tutti_bench::objects::run(&cfg, &mut print).await;
        drop(scratch);
        let points = result?;
        tutti_bench::objects::write(&a.out, &cfg, &points, &command_line(None))?;
        report_written(&points, &a.out, "objects");
        Ok(())
    }

    pub(super) async fn fs(a: BenchFsArgs) -> Result<(), String> {
        use tutti_bench::fs::FsBenchConfig;
        let scratch = scratch_dir("tutti-bench-fs-", None)?;
        let quick = |full, short| if a.quick { short } else { full };
        let cfg = FsBenchConfig {
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            scratch: scratch.path().to_path_buf(),
            systems: a.systems,
            only: a.only,
            files: quick(a.files, 1_000),
            ls_entries: quick(a.ls_entries, 5_000),
            sequential_bytes: if a.quick { 64 } else { a.sequential_mib } << 20,
            andrew_copies: quick(a.andrew_copies, 5),
        };
        let mut print = |p: &Point| {
            eprintln!(
                "bench: fs {:<9} {:<18} {:<24} {:>8.2} s {:>10.0}/s{}",
                p.system,
                p.variant.as_deref().unwrap_or(""),
                p.operation.as_deref().unwrap_or(""),
                p.elapsed_s.unwrap_or(0.0),
                p.throughput_per_s,
                if p.p50_us > 0.0 {
                    format!(" p50 {} µs p99 {} µs", p.p50_us, p.p99_us)
                } else {
                    String::new()
                }
            )
        };
        let result = tutti_bench::fs::run(&cfg, &mut print).await;
        drop(scratch);
        let points = result?;
        tutti_bench::fs::write(&a.out, &cfg, &points, &command_line(None))?;
        report_written(&points, &a.out, "fs");
        Ok(())
    }

    pub(super) async fn objects_client(a: BenchObjectsClientArgs) -> Result<(), String> {
        let dialer = tutti_wire::Dialer::with_routes(Default::default());
        match a.role {
            ObjectsClientRole::Reads {
                log,
                outstanding,
                seconds,
            } => {
                let log = a.cluster.open_log(&dialer, &log).await?;
                tutti_bench::views::reader(log, outstanding, seconds).await
            }
            ObjectsClientRole::Replay { log } => {
                let log = a.cluster.open_log(&dialer, &log).await?;
                tutti_bench::history::rebuild(log).await
            }
        }
    }

    pub(super) async fn log(a: BenchLogArgs) -> Result<(), String> {
        use tutti_bench::log::LogBenchConfig;
        let scratch = scratch_dir("tutti-bench-log-", None)?;
        let (outstanding, seconds) = sweep_of(a.quick, a.outstanding, a.seconds);
        let cfg = LogBenchConfig {
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            scratch: scratch.path().to_path_buf(),
            outstanding,
            seconds,
            sizes: a.sizes,
            sync_entries: if a.quick { 10_000 } else { a.sync_entries },
            memory_minutes: if a.quick { 1 } else { a.memory_minutes },
            no_peers: a.no_peers,
        };
        let mut print = print_point;
        let command = command_line(Some("--from-results"));
        if a.from_results {
            let points = tutti_bench::log::read_results(&a.out)?;
            return tutti_bench::log::write(&a.out, &cfg, &points, &command);
        }
        let result = tutti_bench::log::run(&cfg, &mut print).await;
        drop(scratch);
        let points = result?;
        tutti_bench::log::write(&a.out, &cfg, &points, &command)?;
        report_written(&points, &a.out, "log");
        Ok(())
    }

    pub(super) async fn backup(a: BenchBackupArgs) -> Result<(), String> {
        let scratch = scratch_dir("tutti-bench-backup-", None)?;
        let cfg = tutti_bench::backup::BackupBenchConfig {
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            scratch: scratch.path().to_path_buf(),
            nodes: a.nodes,
            size_bytes: a.size,
            data_bytes_per_node: a.data,
            clients: a.clients,
            window: Duration::from_secs_f64(a.seconds),
            max_rates: a.max_rate,
        };
        let results = tutti_bench::backup::run(&cfg).await?;
        noteln!(
            "{}",
            serde_json::to_string(&results).map_err(|e| e.to_string())?
        );
        Ok(())
    }

    /// A Fig. 16 point as it is measured, on stderr.
    fn print_fig16_point(p: &Point) {
        eprintln!(
            "bench: {} {} {} nodes={} spread={} outstanding={:>3}: {:>9.0}/s p50 {} µs p99 {} µs",
            p.experiment,
            p.system,
            p.mode,
            p.nodes,
            p.spread,
            p.outstanding,
            p.throughput_per_s,
            p.p50_us,
            p.p99_us
        )
    }

    pub(super) async fn repl(a: BenchReplArgs) -> Result<(), String> {
        let scratch = scratch_dir("tutti-bench-repl-", None)?;
        let (outstanding, seconds, runs) = if a.quick {
            (vec![1, 16, 64], 1.0, 1)
        } else {
            (a.outstanding, a.seconds, a.runs)
        };
        let cfg = tutti_bench::suite::SuiteConfig {
            exe: std::env::current_exe().map_err(|e| e.to_string())?,
            out: scratch.path().to_path_buf(),
            scratch: scratch.path().to_path_buf(),
            outstanding,
            headline_runs: runs.max(1),
            seconds_per_point: seconds,
            items: 50_000,
            no_peers: false,
        };
        let mut print = print_fig16_point;
        let result = tutti_bench::suite::replication(&cfg, &mut print).await;
        drop(scratch);
        let (points, summary) = result?;
        tutti_bench::replication::write(&a.out, &points, &summary, &command_line(None))?;
        let out = serde_json::json!({ "points": points, "summary": summary });
        noteln!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serialisable")
        );
        eprintln!(
            "bench: wrote {} and the repl section of {}",
            a.out.join("results/repl.json").display(),
            a.out.join("RESULTS.md").display()
        );
        eprintln!(
            "bench: log-repl / log at 64 outstanding: {} (1 node), {} (4 nodes, spread 2); \
             ram-repl / ram: {}, {}; log-repl / etcd: {}; targets (0.7, 0.7, 0.7, 0.7, 10) {}",
            summary.log_repl_vs_log_1pc,
            summary.log_repl_vs_log_2pc,
            summary.ram_repl_vs_ram_1pc,
            summary.ram_repl_vs_ram_2pc,
            summary.log_repl_vs_etcd,
            if summary.targets_met {
                "met"
            } else {
                "NOT met"
            }
        );
        let cpu: Vec<String> = (summary.cpu.iter())
            .map(|c| format!("{} {:.2} µs", c.mode, c.total_us()))
            .collect();
        eprintln!(
            "bench: CPU per minitransaction, every process, 1 node at 64 outstanding ({} \
             cores): {}",
            summary.cores,
            cpu.join(", ")
        );
        Ok(())
    }

    pub(super) async fn limits(a: BenchLimitsArgs) -> Result<(), String> {
        let scratch = scratch_dir("tutti-bench-limits-", a.dir.as_deref())?;
        let mut print = |p: &Point| {
            eprintln!(
                "bench: {} outstanding={}: {:.0}/s p50 {} µs p99.9 {} µs max {} µs",
                p.mode, p.outstanding, p.throughput_per_s, p.p50_us, p.p999_us, p.max_us
            )
        };
        let duration = Duration::from_secs_f64(a.seconds);
        let points =
            tutti_bench::suite::physical_limits(scratch.path(), duration, &mut print).await?;
        noteln!(
            "{}",
            serde_json::to_string_pretty(&points).expect("serialisable")
        );
        Ok(())
    }

    pub(super) async fn minitx(a: BenchMinitxArgs) -> Result<(), String> {
        let (outstanding, seconds) = if a.quick {
            (vec![1, 16, 64], 1.0)
        } else {
            (a.outstanding.clone(), a.seconds)
        };
        let mut points: Vec<Point> = Vec::new();
        let scratch = scratch_dir("tutti-bench-", None)?;
        let print = print_fig16_point;
        for &mode in &a.mode {
            for &layout in &a.layout {
                let (nodes, spread) = match layout {
                    Layout2::OnePc => (1u16, 1usize),
                    Layout2::TwoPc => (4, 2),
                };
                let b = MinitxBench {
                    nodes: (1..=nodes).collect(),
                    spread,
                    items_per_node: a.items,
                    ops_per_minitx: 3,
                    kind: MinitxKind::Increment,
                    access: Access::Combined,
                    outstanding: outstanding.clone(),
                    duration: Duration::from_secs_f64(seconds),
                    mode: mode.name().into(),
                    experiment: "fig16".into(),
                };
                let _local;
                let mut dialer = tutti_wire::Dialer::default();
                let manager = match &a.cluster {
                    Some(c) => {
                        let (manager, files) = access(c).map_err(|e| e.to_string())?;
                        dialer = with_cluster_credentials(&dialer, &files)?;
                        manager
                    }
                    None => {
                        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                        let dir = scratch.path().join(format!("{}-{nodes}", mode.name()));
                        let local =
                            ScratchCluster::start(&exe, dir, nodes as usize, mode.name()).await?;
                        let manager = local.cluster.manager().to_string();
                        _local = local;
                        manager
                    }
                };
                let connect = |connections: usize| {
                    let opts = ClientOptions {
                        connections,
                        dialer: dialer.clone(),
                        ..ClientOptions::default()
                    };
                    Cluster::connect(&manager, opts)
                };
                let requested = usize::from(a.connections);
                let mut cluster = (connect(requested).await).map_err(|e| e.to_string())?;
                let total =
                    client_connections(requested, usize::from(nodes), cluster.nodes().len());
                if total != requested {
                    cluster = (connect(total).await).map_err(|e| e.to_string())?;
                }
                points.extend(run_minitx(&cluster, &b, print).await?);
            }
        }
        let json = serde_json::to_string_pretty(&points).expect("serialisable");
        noteln!("{json}");
        if let Some(path) = a.out {
            std::fs::write(&path, &json).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        Ok(())
    }
}
