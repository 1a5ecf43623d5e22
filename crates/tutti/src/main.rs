//! `tutti`: run memory nodes and the manager, start a local cluster, run ad-hoc
//! minitransactions, read load statistics and benchmark.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Memory nodes allocate and free a few buffers per request; glibc's malloc was 18% of a
/// memory node's CPU samples under load (perf, Fig. 16 log 1PC at 64 outstanding).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tutti::bench::minitx::{client_connections, run_minitx, Access, MinitxBench, MinitxKind};
use tutti::bench::suite::ScratchCluster;
use tutti::bench::Point;
use tutti::items::{parse_items, to_hex};
use tutti::local::{manager_addr, Layout, LocalCluster};
use tutti_client::{ClientOptions, Cluster};
use tutti_memnode::{Limits, Mode, NodeConfig};
use tutti_workload::{BankOp, TransferKind};

#[derive(Parser)]
#[command(
    name = "tutti",
    version,
    about = "Fault-tolerant shared data structures over memory nodes (Sinfonia minitransactions)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Dial FROM through VIA instead (repeatable): `tutti chaos` points each process at its
    /// own fault-injecting proxy for every peer.
    #[arg(long, global = true, hide = true, value_name = "FROM=VIA", value_parser = parse_route)]
    route: Vec<(String, String)>,
}

fn parse_route(s: &str) -> Result<(String, String), String> {
    let (from, via) = s
        .split_once('=')
        .ok_or("expected FROM=VIA, e.g. 127.0.0.1:7701=127.0.0.1:9001")?;
    Ok((from.to_string(), via.to_string()))
}

#[derive(Subcommand)]
enum Command {
    /// Start a local cluster and keep it running until Ctrl-C or SIGTERM.
    ///
    /// A manager and N memory nodes run as child processes. Restarting on the same --data
    /// keeps all data.
    Up(UpArgs),
    /// Run one minitransaction and print its outcome as JSON.
    ///
    /// Items: read:NODE:ADDR:LEN  cmp:NODE:ADDR:HEX  cmpop:NODE:ADDR:OP:U64 (OP: eq ne lt le gt ge,
    /// on the stored little-endian u64)  write:NODE:ADDR:HEX  add:NODE:ADDR:I64. ADDR is decimal
    /// or 0x-hex. Exit status 0 when committed or when a compare failed (see "committed").
    Txn(TxnArgs),
    /// Print the load statistics of every memory node.
    Stats(StatsArgs),
    /// Benchmarks; print JSON.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Deterministic simulation of a whole cluster under injected faults.
    ///
    /// Runs seeds on every core and checks every invariant. A failing seed prints the command
    /// that replays it; TUTTI_SIM_TRACE=1 prints every event of a run.
    Sim(SimArgs),
    /// Randomized failure injection against real processes; verify and report.
    ///
    /// After Ji's test engine: a scratch 4-node log cluster and client processes running a mix
    /// of bank transfers and register operations, with memory nodes, clients and the manager
    /// killed (-9) and restarted at random intervals and random pairs of processes
    /// partitioned; then heal, verify every invariant, check the register history with
    /// Porcupine (needs `go`) and print the table of faults and operations done. Exit status
    /// 1 on any violation.
    Chaos(ChaosArgs),
    /// Run a memory node (normally started by `tutti up`).
    Memnode(MemnodeArgs),
    /// Run the management node (normally started by `tutti up`).
    Manager(ManagerArgs),
    /// Workloads used by the crash tests.
    #[command(hide = true)]
    Workload(WorkloadArgs),
}

#[derive(Args)]
struct UpArgs {
    /// Memory nodes to start (numbered 1..N). Fixed when the data directory is created.
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    #[arg(long, value_enum, default_value_t = ModeArg::Log)]
    mode: ModeArg,
    /// Data directory: cluster.json, the manager's state, one directory per node, logs/.
    #[arg(long, default_value = "./tutti-data")]
    data: PathBuf,
    /// Bytes of address space per memory node (suffixes K, M, G accepted).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum ModeArg {
    /// No redo log: survives application crashes, not memory node crashes.
    Ram,
    /// Redo log synced at prepare; survives crashes of every node.
    Log,
}

impl ModeArg {
    fn mode(self) -> Mode {
        match self {
            ModeArg::Ram => Mode::Ram,
            ModeArg::Log => Mode::Log,
        }
    }
    fn name(self) -> &'static str {
        match self {
            ModeArg::Ram => "ram",
            ModeArg::Log => "log",
        }
    }
}

#[derive(Args)]
struct ClusterArg {
    /// Manager address, or a data directory / cluster.json written by `tutti up`.
    #[arg(long, default_value = "./tutti-data")]
    cluster: String,
    /// Give up after this long (retries included).
    #[arg(long, default_value_t = 10_000)]
    deadline_ms: u64,
}

impl ClusterArg {
    async fn connect(&self) -> Result<Cluster, String> {
        let addr = manager_addr(&self.cluster).map_err(|e| e.to_string())?;
        let opts = ClientOptions {
            deadline: Duration::from_millis(self.deadline_ms),
            ..ClientOptions::default()
        };
        Cluster::connect(&addr, opts)
            .await
            .map_err(|e| e.to_string())
    }
}

#[derive(Args)]
struct TxnArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    /// Class to count this minitransaction under in `tutti stats`.
    #[arg(long, default_value = "txn")]
    class: String,
    #[arg(required = true)]
    items: Vec<String>,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Sinfonia Fig. 16: 3 compare-and-swaps per minitransaction over 50,000 4-byte items,
    /// outstanding minitransactions swept. Without --cluster it starts (and removes) its own
    /// clusters: 1 node for 1PC, 4 nodes with spread 2 for 2PC, in each requested mode.
    Minitx(BenchMinitxArgs),
    /// Everything in one run: the physical limits (loopback round trip, fdatasync), Sinfonia
    /// Fig. 16-20 on tutti, and Fig. 16 on Redis, PostgreSQL, etcd and an embedded SQLite,
    /// each started here on loopback (installed with apt-get if missing). Writes
    /// results/*.json, RESULTS.md and a PNG per figure (matplotlib) under --out.
    All(BenchAllArgs),
}

#[derive(Args)]
struct BenchAllArgs {
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
    #[arg(long, default_value_os_t = tutti::source_tree().join("bench"))]
    out: PathBuf,
    /// Measure tutti and the limits only.
    #[arg(long)]
    no_peers: bool,
}

#[derive(Args)]
struct BenchMinitxArgs {
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
enum Layout2 {
    /// One memory node: every minitransaction commits in one phase.
    #[value(name = "1pc")]
    OnePc,
    /// Four memory nodes, each minitransaction spread over two: two-phase commit.
    #[value(name = "2pc")]
    TwoPc,
}

#[derive(Args)]
struct ChaosArgs {
    /// How long to inject faults: seconds, or with a unit (90s, 10m, 1h).
    #[arg(long, visible_alias = "duration", default_value = "60", value_parser = parse_duration_s)]
    duration_s: f64,
    /// Bank client processes.
    #[arg(long, default_value_t = 6)]
    clients: u64,
    /// Seconds between memory node kills, as MIN-MAX.
    #[arg(long, default_value = "1-4", value_parser = parse_range)]
    node_kill_every_s: (f64, f64),
    /// Seconds between client kills, as MIN-MAX.
    #[arg(long, default_value = "1-4", value_parser = parse_range)]
    client_kill_every_s: (f64, f64),
    /// Seconds between manager kills, as MIN-MAX.
    #[arg(long, default_value = "10-30", value_parser = parse_range)]
    manager_kill_every_s: (f64, f64),
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
    mix: tutti::chaos::Mix,
    /// The directory of the Go program that checks register histories with Porcupine.
    #[arg(long, default_value_os_t = tutti::chaos::default_checker())]
    linearizability_checker: PathBuf,
    /// Seed of the fault schedule (random if not given).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the cluster's data and logs here (default: a scratch directory, removed if the
    /// run passes).
    #[arg(long)]
    data: Option<PathBuf>,
}

/// Seconds from "600", "600s", "10m" or "1h".
fn parse_duration_s(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|e| format!("duration {s:?}: {e}"))?;
    let unit_s = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown duration unit {other:?} (use s, m or h)")),
    };
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(n * unit_s)
}

fn parse_range(s: &str) -> Result<(f64, f64), String> {
    let (lo, hi) = s.split_once('-').ok_or("expected MIN-MAX, e.g. 1-4")?;
    let (lo, hi): (f64, f64) = (
        lo.trim().parse().map_err(|e| format!("{e}"))?,
        hi.trim().parse().map_err(|e| format!("{e}"))?,
    );
    if lo < 0.0 || hi < lo {
        return Err("expected 0 <= MIN <= MAX".into());
    }
    Ok((lo, hi))
}

#[derive(Args)]
struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
}

#[derive(Args)]
struct MemnodeArgs {
    /// This node's id (1, 2, …), unique in the cluster.
    #[arg(long)]
    id: u16,
    #[arg(long, default_value = "127.0.0.1:7701")]
    listen: String,
    #[arg(long, default_value = "127.0.0.1:7700")]
    manager: String,
    /// Data directory (required in log mode): redo log segments, image, node.json.
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = ModeArg::Log)]
    mode: ModeArg,
    /// Bytes of address space (suffixes K, M, G accepted). Fixed at creation.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Serve Prometheus text metrics on this address.
    #[arg(long)]
    metrics: Option<String>,
    /// A tid uncertain this long is reported to the manager's recovery coordinator.
    #[arg(long, default_value_t = 2_000)]
    timeout_uncertain_ms: u64,
    /// How often the image is flushed and the log head collected.
    #[arg(long, default_value_t = 2_000)]
    checkpoint_interval_ms: u64,
    /// Redo log segment size; garbage collection deletes whole segments.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    log_segment_bytes: u64,
    #[arg(long, default_value_t = 1 << 20)]
    item_bytes_max: u64,
    #[arg(long, default_value_t = 16 << 20)]
    minitx_bytes_max: u64,
    #[arg(long, default_value_t = 4096)]
    items_max: usize,
}

#[derive(Args)]
struct ManagerArgs {
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: String,
    /// Where the directory and epoch are kept.
    #[arg(long)]
    data: PathBuf,
    /// Seconds between epochs (forced-abort entries live two epochs).
    #[arg(long, default_value_t = 3600)]
    epoch_period_s: u64,
    /// A node silent this long is reported as not alive.
    #[arg(long, default_value_t = 3_000)]
    failure_timeout_ms: u64,
}

#[derive(Args)]
struct WorkloadArgs {
    #[command(flatten)]
    cluster: ClusterArg,
    #[arg(long, default_value_t = 1000)]
    accounts: u64,
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    #[arg(long, default_value_t = 16)]
    clients: u64,
    #[arg(long)]
    client_id: u64,
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// How transfers move money: `cas` (read both balances, then compare and write both)
    /// or `add` (an ordered compare and two adds).
    #[arg(long, default_value = "cas")]
    kind: TransferKind,
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Relative frequencies of the operations.
    #[arg(long, default_value = "transfer=1")]
    mix: tutti::chaos::Mix,
    /// Record register operations here (required if the mix has any).
    #[arg(long)]
    history: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => {
            let mult = match s[i..]
                .trim()
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1u64 << 40,
                other => return Err(format!("unknown size suffix {other:?} (use K, M, G or T)")),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: u64 = num.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    n.checked_mul(mult)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("size {s:?} is zero or too large"))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn init_tracing(default: &str) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("TUTTI_LOG").unwrap_or_else(|_| default.into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = tutti_wire::conn::set_routes(cli.route.into_iter().collect()) {
        eprintln!("tutti: {e}");
        return ExitCode::FAILURE;
    }
    if let Command::Chaos(a) = cli.command {
        // Chaos drives its own runtime between the processes it kills.
        init_tracing("error");
        return match chaos(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tutti: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // A memory node is one event loop plus its log writer thread, and the benchmark client
    // one event loop: on a machine shared by several processes, extra worker threads only
    // add wake-ups and migrations.
    let runtime = match cli.command {
        Command::Memnode(_) | Command::Bench { .. } => {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(rt) => rt.block_on(run(cli.command)),
        Err(e) => {
            eprintln!("tutti: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Memnode(a) => {
            init_tracing("info");
            memnode(a).await
        }
        Command::Manager(a) => {
            init_tracing("info");
            let mut cfg = tutti_manager::ManagerConfig::new(a.listen, a.data);
            cfg.epoch_period_ms = a.epoch_period_s.max(1) * 1000;
            cfg.failure_timeout_ms = a.failure_timeout_ms;
            tutti_manager::run(cfg, shutdown_signal())
                .await
                .map_err(|e| e.to_string())
        }
        Command::Up(a) => {
            init_tracing("warn");
            up(a).await
        }
        Command::Txn(a) => {
            init_tracing("error");
            txn(a).await
        }
        Command::Stats(a) => {
            init_tracing("error");
            stats(a).await
        }
        Command::Bench {
            which: BenchCommand::Minitx(a),
        } => {
            init_tracing("error");
            bench_minitx(a).await
        }
        Command::Bench {
            which: BenchCommand::All(a),
        } => {
            init_tracing("error");
            bench_all(a).await
        }
        Command::Chaos(_) => unreachable!("handled before the runtime starts"),
        Command::Sim(a) => {
            init_tracing("error");
            sim(a)
        }
        Command::Workload(a) => {
            init_tracing("error");
            workload(a).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tutti: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn memnode(a: MemnodeArgs) -> Result<(), String> {
    let mut cfg = NodeConfig::new(a.id, a.listen, a.manager, a.mode.mode(), a.data);
    cfg.size_bytes = a.size;
    cfg.metrics = a.metrics;
    cfg.timeout_uncertain_ms = a.timeout_uncertain_ms;
    cfg.checkpoint_interval_ms = a.checkpoint_interval_ms;
    cfg.log_segment_bytes = a.log_segment_bytes;
    cfg.limits = Limits {
        item_bytes_max: a.item_bytes_max,
        minitx_bytes_max: a.minitx_bytes_max,
        items_max: a.items_max,
    };
    cfg.frame_bytes_max = (a.minitx_bytes_max as usize)
        .saturating_add(1 << 20)
        .max(tutti_wire::FRAME_BYTES_MAX_DEFAULT);
    tutti_memnode::run(cfg, shutdown_signal())
        .await
        .map_err(|e| e.to_string())
}

async fn up(a: UpArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the tutti executable: {e}"))?;
    let layout = Layout {
        nodes: a.nodes,
        mode: a.mode.name().into(),
        size_bytes: a.size,
        node_flags: vec![],
        manager_flags: vec![],
    };
    if a.nodes == 0 || a.nodes > 1000 {
        return Err("--nodes must be between 1 and 1000".into());
    }
    let mut cluster = LocalCluster::open(&exe, &a.data, layout, true).map_err(|e| e.to_string())?;
    cluster.start_all().map_err(|e| e.to_string())?;
    if let Err(e) = cluster.wait_ready(Duration::from_secs(60)).await {
        let tails: Vec<String> = std::iter::once("manager".to_string())
            .chain(cluster.node_ids().iter().map(|id| format!("node-{id}")))
            .map(|n| format!("--- {n}:\n{}", cluster.log_tail(&n)))
            .collect();
        return Err(format!("{e}\n{}", tails.join("\n")));
    }
    println!(
        "tutti: {} memory nodes ({} mode) up; manager at {}",
        cluster.file.nodes.len(),
        cluster.file.mode,
        cluster.file.manager
    );
    println!(
        "tutti: addresses in {}; logs in {}",
        cluster.dir.join("cluster.json").display(),
        cluster.dir.join("logs").display()
    );
    println!(
        "tutti: try  tutti txn --cluster {} write:1:0:68656c6c6f read:1:0:5",
        cluster.file.manager
    );
    println!("tutti: Ctrl-C stops the cluster");
    let mut signal = Box::pin(shutdown_signal());
    // Per child: when it was last started, how many times in a row it died within
    // QUICK_DEATH of a start, and when it is due to start again.
    const QUICK_DEATH: Duration = Duration::from_secs(10);
    const QUICK_DEATHS_MAX: u32 = 5;
    let mut children: std::collections::HashMap<
        String,
        (std::time::Instant, u32, Option<std::time::Instant>),
    > = Default::default();
    let mut failure = None;
    'supervise: loop {
        tokio::select! {
            _ = &mut signal => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let now = std::time::Instant::now();
        for (name, status) in cluster.reap() {
            let log = cluster.dir.join("logs").join(format!("{name}.log"));
            let (started, quick, due) = children.entry(name.clone()).or_insert((now, 0, None));
            *quick = if started.elapsed() < QUICK_DEATH {
                *quick + 1
            } else {
                1
            };
            if *quick > QUICK_DEATHS_MAX {
                failure = Some(format!(
                    "{name} exited {quick} times right after starting ({status}); see {}",
                    log.display()
                ));
                break 'supervise;
            }
            let delay = Duration::from_millis(200 << *quick).min(Duration::from_secs(10));
            eprintln!(
                "tutti: {name} exited ({status}); restarting it in {delay:?}; see {}",
                log.display()
            );
            *due = Some(now + delay);
        }
        for (name, (started, _, due)) in children
            .iter_mut()
            .filter(|(_, c)| c.2.is_some_and(|d| d <= now))
        {
            *due = None;
            *started = now;
            let result = match name.strip_prefix("node-").and_then(|id| id.parse().ok()) {
                Some(id) => cluster.start_node(id),
                None => cluster.start_manager(),
            };
            if let Err(e) = result {
                eprintln!("tutti: restarting {name}: {e}");
            }
        }
    }
    eprintln!("tutti: stopping");
    cluster.stop_all();
    failure.map_or(Ok(()), Err)
}

async fn txn(a: TxnArgs) -> Result<(), String> {
    let tx = parse_items(&a.items)
        .map_err(|e| e.to_string())?
        .class(&a.class);
    let cluster = a.cluster.connect().await?;
    let out = cluster
        .exec_and_commit(&tx)
        .await
        .map_err(|e| e.to_string())?;
    // The decision must reach the participants before this process exits, or the locks
    // stay held until the recovery coordinator steps in.
    cluster.flush().await.map_err(|e| e.to_string())?;
    let json = serde_json::json!({
        "committed": out.committed,
        "reads": out.reads.iter().map(|r| to_hex(r)).collect::<Vec<_>>(),
        "failed_compares": out.failed_compares,
    });
    println!("{json}");
    Ok(())
}

async fn stats(a: StatsArgs) -> Result<(), String> {
    let cluster = a.cluster.connect().await?;
    let reports = cluster.stats().await;
    if a.json {
        let nodes: Vec<serde_json::Value> = reports
            .iter()
            .map(|(id, r)| match r {
                Ok(s) => serde_json::json!({
                    "node": id, "serving": s.serving, "epoch": s.epoch, "uncertain": s.uncertain,
                    "locks_held": s.locks_held, "log_bytes": s.log_bytes, "log_records_live": s.log_records_live,
                    "log_syncs": s.log_syncs, "log_records_appended": s.log_records_appended,
                    "rss_bytes": s.rss_bytes,
                    "classes": s.classes.iter().map(|c| serde_json::json!({
                        "class": c.class,
                        "windows": s.windows_s.iter().zip(&c.windows).map(|(w, l)| serde_json::json!({
                            "window_s": w, "bytes_read": l.bytes_read, "bytes_written": l.bytes_written,
                            "committed": l.committed, "aborted_lock": l.aborted_lock,
                            "aborted_compare": l.aborted_compare, "forced_abort": l.forced_abort,
                        })).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                }),
                Err(e) => serde_json::json!({ "node": id, "error": e.to_string() }),
            })
            .collect();
        println!("{}", serde_json::Value::Array(nodes));
        return Ok(());
    }
    println!(
        "{:>4} {:<16} {:>6} {:>10} {:>10} {:>8} {:>8} {:>8} {:>12} {:>12}",
        "node",
        "class",
        "window",
        "committed",
        "abort-lock",
        "abort-cmp",
        "forced",
        "per-s",
        "bytes-read",
        "bytes-written"
    );
    for (id, r) in &reports {
        match r {
            Ok(s) => {
                for c in &s.classes {
                    for (w, l) in s.windows_s.iter().zip(&c.windows) {
                        let rate = l.committed as f64 / *w as f64;
                        println!(
                            "{id:>4} {:<16} {:>5}s {:>10} {:>10} {:>8} {:>8} {:>8.1} {:>12} {:>12}",
                            c.class,
                            w,
                            l.committed,
                            l.aborted_lock,
                            l.aborted_compare,
                            l.forced_abort,
                            rate,
                            l.bytes_read,
                            l.bytes_written
                        );
                    }
                }
                println!("{id:>4} serving={} epoch={} uncertain={} locks_held={} log_bytes={} log_records_live={} log_syncs={} log_records_appended={} rss_bytes={}", s.serving, s.epoch, s.uncertain, s.locks_held, s.log_bytes, s.log_records_live, s.log_syncs, s.log_records_appended, s.rss_bytes);
            }
            Err(e) => println!("{id:>4} unreachable: {e}"),
        }
    }
    Ok(())
}

async fn bench_all(a: BenchAllArgs) -> Result<(), String> {
    use tutti::bench::suite::{self, SuiteConfig};
    let (outstanding, headline_runs, seconds) = if a.quick {
        (vec![1, 16, 64], 1, 1.0)
    } else {
        (a.outstanding, 3, a.seconds)
    };
    let cfg = SuiteConfig {
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        out: a.out,
        scratch: std::env::temp_dir().join(format!("tutti-bench-all-{}", std::process::id())),
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
    let _ = std::fs::remove_dir_all(&cfg.scratch);
    let points = result?;
    let command = std::env::args()
        .skip(1)
        .fold("tutti".to_string(), |acc, a| acc + " " + &a);
    suite::write(&cfg, &points, &command)?;
    suite::plot(&cfg.out)?;
    println!(
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

async fn bench_minitx(a: BenchMinitxArgs) -> Result<(), String> {
    let (outstanding, seconds) = if a.quick {
        (vec![1, 16, 64], 1.0)
    } else {
        (a.outstanding.clone(), a.seconds)
    };
    let mut points: Vec<Point> = Vec::new();
    let print = |p: &Point| {
        eprintln!(
            "bench: {} {} nodes={} spread={} outstanding={:>3}: {:>9.0}/s p50 {} µs p99 {} µs",
            p.system,
            p.mode,
            p.nodes,
            p.spread,
            p.outstanding,
            p.throughput_per_s,
            p.p50_us,
            p.p99_us
        )
    };
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
            let manager = match &a.cluster {
                Some(c) => manager_addr(c).map_err(|e| e.to_string())?,
                None => {
                    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                    let dir = std::env::temp_dir().join(format!(
                        "tutti-bench-{}-{}-{}",
                        std::process::id(),
                        mode.name(),
                        nodes
                    ));
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
                    ..ClientOptions::default()
                };
                Cluster::connect(&manager, opts)
            };
            let requested = usize::from(a.connections);
            let mut cluster = (connect(requested).await).map_err(|e| e.to_string())?;
            let total = client_connections(requested, usize::from(nodes), cluster.nodes().len());
            if total != requested {
                cluster = (connect(total).await).map_err(|e| e.to_string())?;
            }
            points.extend(
                run_minitx(&cluster, &b, print)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
    }
    let json = serde_json::to_string_pretty(&points).expect("serialisable");
    println!("{json}");
    if let Some(path) = a.out {
        std::fs::write(&path, &json).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn chaos(a: ChaosArgs) -> Result<(), String> {
    use tutti::chaos::{ChaosConfig, Terminator};
    let every = |(lo, hi): (f64, f64)| Terminator {
        every: (Duration::from_secs_f64(lo), Duration::from_secs_f64(hi)),
    };
    let cfg = ChaosConfig {
        duration: Duration::from_secs_f64(a.duration_s),
        clients: a.clients.max(1),
        nodes: every(a.node_kill_every_s),
        clients_killer: every(a.client_kill_every_s),
        manager: every(a.manager_kill_every_s),
        partitions: (!a.no_partitions)
            .then(|| (every(a.partition_every_s), every(a.partition_for_s))),
        mix: a.mix,
        linearizability_checker: a.linearizability_checker,
        seed: a.seed.unwrap_or_else(rand::random),
    };
    let scratch = a.data.is_none();
    let dir = a.data.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("tutti-chaos-{}", std::process::id()))
    });
    if scratch {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    eprintln!(
        "chaos: seed {} (replay the fault schedule with --seed), data in {}",
        cfg.seed,
        dir.display()
    );
    let report = tutti::chaos::run(&exe, &dir, &cfg, |line| eprint!("\rchaos: {line}   "))
        .map_err(|e| e.to_string())?;
    eprintln!();
    print!("{}", report.table(&cfg));
    if report.violations.is_empty() {
        let registers = if cfg.mix.has_registers() {
            ", register history linearizable"
        } else {
            ""
        };
        println!("invariants: all hold (no committed transfer lost, money conserved, nothing uncertain or locked, logs collected{registers})");
        if scratch {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    } else {
        for v in &report.violations {
            println!("VIOLATION: {v}");
        }
        Err(format!(
            "{} invariant violations; data and logs kept in {}",
            report.violations.len(),
            dir.display()
        ))
    }
}

fn sim(a: SimArgs) -> Result<(), String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let cfg = tutti_sim::SimConfig::default();
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
    let totals = [
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    ];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.seeds {
                    return;
                }
                let seed = a.from + i;
                let report = tutti_sim::run(seed, &cfg);
                for (total, n) in totals.iter().zip([
                    report.committed,
                    report.unknown,
                    report.node_crashes,
                    report.coordinator_crashes,
                ]) {
                    total.fetch_add(n, Ordering::Relaxed);
                }
                if !report.violations.is_empty() {
                    let text = report
                        .violations
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ");
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
        let (first, second) = (tutti_sim::run(a.from, &cfg), tutti_sim::run(a.from, &cfg));
        let same = (first.trace_hash, first.events) == (second.trace_hash, second.events);
        println!(
            "seed {}: {} events, trace {:016x}, replayed identically: {same}",
            a.from, first.events, first.trace_hash
        );
    }
    let [committed, unknown, node_crashes, coordinator_crashes] = totals.map(|t| t.into_inner());
    let mut failures = failures.into_inner().expect("failures poisoned");
    failures.sort();
    println!(
        "{} seeds from {} in {:.1} s: {} failing; {committed} minitransactions committed, {unknown} with unknown outcome, {node_crashes} memory node crashes, {coordinator_crashes} coordinator crashes",
        a.seeds,
        a.from,
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    for (seed, text) in &failures {
        println!(
            "seed {seed}: {text}\n  reproduce: {}",
            tutti_sim::reproduce_command(*seed)
        );
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} seeds broke an invariant", failures.len()))
    }
}

async fn workload(a: WorkloadArgs) -> Result<(), String> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use tutti::chaos::MixOp;
    use tutti::registers::{History, RegisterClient};
    let cluster = a.cluster.connect().await?;
    let bank = tutti_workload::Bank::new(a.accounts, a.nodes, a.clients).kind(a.kind);
    let history = match (&a.history, a.mix.has_registers()) {
        (Some(path), _) => Some(Arc::new(
            History::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
        )),
        (None, true) => return Err("a mix with register operations needs --history".into()),
        (None, false) => None,
    };
    let committed = Arc::new(AtomicU64::new(0));
    let until = std::time::Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut tasks = Vec::new();
    for task in 0..a.tasks {
        let (cluster, committed, history) = (cluster.clone(), committed.clone(), history.clone());
        let (client, mix, nodes) = (a.client_id, a.mix, a.nodes);
        let mut bank = bank.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::from_entropy();
            let name = format!("{client}.{}.{task}", std::process::id());
            let mut registers = history
                .as_deref()
                .map(|h| RegisterClient::new(&cluster, h, nodes, name));
            while std::time::Instant::now() < until {
                let op = mix.pick(&mut rng);
                let line = match (op, registers.as_mut()) {
                    (MixOp::Register(op), Some(r)) => {
                        r.run(op, &mut rng).await;
                        continue;
                    }
                    (MixOp::Register(_), None) => unreachable!("checked above"),
                    (MixOp::Transfer, _) => {
                        let ran = tutti::workload::run_op(&cluster, &mut bank, client, &mut rng);
                        match ran.await {
                            (BankOp::Move { .. }, Ok(out)) if out.committed => {
                                let n = committed.fetch_add(1, Ordering::SeqCst) + 1;
                                format!("committed {n}")
                            }
                            (BankOp::Move { .. }, Err(e)) => format!("error {e}"),
                            _ => continue,
                        }
                    }
                };
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

use rand::SeedableRng;
