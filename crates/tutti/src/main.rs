//! `tutti`: run memory nodes, the manager and the logs' sequencer, start a local cluster,
//! run ad-hoc minitransactions, use shared logs, read load statistics and benchmark.

mod cmd;

use clap::{Parser, Subcommand};
use cmd::args::init_tracing;

/// Memory nodes allocate and free a few buffers per request; glibc's malloc was 18% of a
/// memory node's CPU samples under load (perf, Fig. 16 log 1PC at 64 outstanding).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::process::ExitCode;
use tutti_wire::{CredentialFiles, Dialer};

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
    #[command(flatten)]
    credentials: cmd::args::CredentialArgs,
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
    Up(cmd::up::UpArgs),
    /// Run one minitransaction and print its outcome as JSON.
    ///
    /// Items: read:NODE:ADDR:LEN  cmp:NODE:ADDR:HEX  cmpop:NODE:ADDR:OP:U64 (OP: eq ne lt le gt ge,
    /// on the stored little-endian u64)  write:NODE:ADDR:HEX  add:NODE:ADDR:I64. ADDR is decimal
    /// or 0x-hex. Exit status 0 when committed or when a compare failed (see "committed").
    Txn(cmd::txn::TxnArgs),
    /// The shared log: create, append, read, tail, stream, trim, stat (JSON out).
    ///
    /// Positions are striped over memory nodes and written once; `tutti up` runs the
    /// sequencer that hands them out. See docs/log.md.
    Log(cmd::log::LogArgs),
    /// Tango's objects over a shared log: registers, counters, maps (JSON out).
    ///
    /// Every client builds its views by playing the log, so any number of them agree.
    /// Objects are created on their first write. See docs/objects.md.
    Obj(cmd::obj::ObjArgs),
    /// A ZooKeeper-like namespace over a shared log: znodes, versions, sequential and
    /// ephemeral nodes, watches (JSON out).
    ///
    /// ZooKeeper's failures print {"error": CODE, "path": P} and exit 1: no-node,
    /// node-exists, bad-version, not-empty, no-children-for-ephemerals, session-expired,
    /// bad-arguments. See docs/objects.md.
    Ns(cmd::ns::NsArgs),
    /// tutti-fs, a cluster file system on the memory nodes: mkfs, mount (FUSE), fsck, df.
    ///
    /// Any number of mounts, on any machines, share a volume; every operation is one
    /// minitransaction. See docs/fs.md.
    Fs(cmd::fs::FsArgs),
    /// Memory nodes of a local cluster: add one while `tutti up` serves.
    Node(cmd::node::NodeArgs),
    /// Consistent backups, taken while the cluster serves: create, verify, restore.
    ///
    /// A backup is the same cut of every memory node (Sinfonia §4.8) plus the manager's
    /// regions; restore makes a new local cluster of it. See docs/backup.md.
    Backup(cmd::backup::BackupArgs),
    /// Cluster tokens: `tutti token new FILE` makes one for --token-file.
    ///
    /// With a token, every process proves it on each connection (HMAC over fresh nonces; the
    /// token never crosses the wire) and refuses peers that do not. Processes serving beyond
    /// 127.0.0.1 refuse to start without one. See docs/operations.md, "Security".
    Token(cmd::token::TokenArgs),
    /// TLS certificates: `tutti tls new DIR` makes a cluster authority and a certificate.
    ///
    /// With --tls-cert, --tls-key and --tls-ca, every connection is TLS 1.3 and each end
    /// checks the other's certificate against the authority. See docs/operations.md,
    /// "Security".
    Tls(cmd::tls::TlsArgs),
    /// Print the load statistics of every memory node.
    Stats(cmd::stats::StatsArgs),
    /// Print where each manager stands in its Raft group: role, term, leader, log indexes.
    ///
    /// Every manager of `--cluster` is asked, whichever leads. Exit status 1 when none
    /// leads (an election under way, or a majority down).
    Managers(cmd::managers::ManagersArgs),
    /// Benchmarks; print JSON.
    Bench {
        #[command(subcommand)]
        which: cmd::bench::BenchCommand,
    },
    /// Deterministic simulation of a whole cluster under injected faults.
    ///
    /// Runs seeds on every core and checks every invariant. A failing seed prints the command
    /// that replays it; TUTTI_SIM_TRACE=1 prints every event of a run.
    Sim(cmd::sim::SimArgs),
    /// Randomized failure injection against real processes; verify and report.
    ///
    /// After Ji's test engine: a scratch 4-node log cluster and client processes running a mix
    /// of bank transfers and register operations, with memory nodes, clients and the manager
    /// killed (-9) and restarted at random intervals and random pairs of processes
    /// partitioned; then heal, verify every invariant, check the register history with
    /// Porcupine (needs `go`) and print the table of faults and operations done. Exit status
    /// 1 on any violation.
    Chaos(cmd::chaos::ChaosArgs),
    /// Run a memory node (normally started by `tutti up`).
    Memnode(cmd::memnode::MemnodeArgs),
    /// Run the management node (normally started by `tutti up`).
    Manager(cmd::manager::ManagerArgs),
    /// Run the logs' sequencer (normally started by `tutti up`).
    Sequencer(cmd::sequencer::SequencerArgs),
    /// Workloads used by the crash tests.
    #[command(hide = true)]
    Workload(cmd::workload::WorkloadArgs),
    /// The shared log's client processes under `tutti chaos`.
    #[command(hide = true)]
    LogWorkload(cmd::log_workload::LogWorkloadArgs),
    /// Tango's objects' client processes under `tutti chaos`.
    #[command(hide = true)]
    ObjectsWorkload(cmd::objects_workload::ObjectsWorkloadArgs),
    /// tutti-fs's client processes under `tutti chaos`, each working through a mount.
    #[command(hide = true)]
    FsWorkload(cmd::fs_workload::FsWorkloadArgs),
}

/// Transparent huge pages off for this process and the nodes and managers it starts (the
/// setting is inherited): mimalloc advises them for its heap, and once it has returned
/// memory to the system, the next touch faults in a whole 2 MiB page and zeroes it inside
/// the fault. In a memory node that was 5 ms of CPU inside one request, every few hundred
/// ms (probe, log 2PC at 64 outstanding), and most of the p99.9. Redis and most databases
/// ask for THP off for the same reason. A kernel without the call (before 3.15) only costs
/// latency, so its failure is ignored.
fn disable_transparent_huge_pages() {
    // SAFETY: integer arguments only; it sets a flag on this process's memory.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let cli = Cli::parse();
    let mut dialer = Dialer::with_routes(cli.route.into_iter().collect());
    let credentials = match cli.credentials.files() {
        Ok(files) => files,
        Err(e) => {
            eprintln!("tutti: {e}");
            return ExitCode::FAILURE;
        }
    };
    match credentials.load() {
        Ok(c) => dialer = dialer.with_credentials(c),
        Err(e) => {
            eprintln!("tutti: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Command::Chaos(a) = cli.command {
        // Chaos drives its own runtime between the processes it kills.
        init_tracing("error");
        return match cmd::chaos::run(a, credentials) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tutti: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // A memory node is one event loop plus its log writer thread, the sequencer and the
    // benchmark client one event loop each: on a machine shared by several processes, extra
    // worker threads only add wake-ups and migrations (the sequencer alone, one ask per
    // frame at 64 outstanding, alternating: 133-136 K positions/s on one thread, 97-111 K on
    // two).
    let runtime = match cli.command {
        Command::Memnode(_) | Command::Sequencer(_) | Command::Bench { .. } => {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    match runtime {
        Ok(rt) => rt.block_on(run(cli.command, dialer, credentials)),
        Err(e) => {
            eprintln!("tutti: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, dialer: Dialer, credentials: CredentialFiles) -> ExitCode {
    let result = match command {
        Command::Memnode(a) => {
            init_tracing("info");
            cmd::memnode::run(a, dialer).await
        }
        Command::Manager(a) => {
            init_tracing("info");
            cmd::manager::run(a, dialer).await
        }
        Command::Sequencer(a) => {
            init_tracing("info");
            cmd::sequencer::run(a, dialer).await
        }
        Command::Log(a) => {
            init_tracing("error");
            cmd::log::run(a, &dialer).await
        }
        Command::Obj(a) => {
            init_tracing("error");
            cmd::obj::run(a, &dialer).await
        }
        Command::Ns(a) => {
            init_tracing("error");
            cmd::ns::run(a, &dialer).await
        }
        Command::Up(a) => {
            init_tracing("warn");
            cmd::up::run(a, &credentials).await
        }
        Command::Txn(a) => {
            init_tracing("error");
            cmd::txn::run(a, &dialer).await
        }
        Command::Fs(a) => {
            init_tracing("warn");
            cmd::fs::run(a, &dialer).await
        }
        Command::Node(a) => {
            init_tracing("error");
            cmd::node::run(a, &dialer).await
        }
        Command::Backup(a) => {
            init_tracing("warn");
            cmd::backup::run(a, &dialer).await
        }
        Command::Token(a) => cmd::token::run(a),
        Command::Tls(a) => cmd::tls::run(a),
        Command::Stats(a) => {
            init_tracing("error");
            cmd::stats::run(a, &dialer).await
        }
        Command::Managers(a) => {
            init_tracing("error");
            cmd::managers::run(a, &dialer).await
        }
        Command::Bench { which } => {
            init_tracing("error");
            cmd::bench::run(which).await
        }
        Command::Chaos(_) => unreachable!("handled before the runtime starts"),
        Command::Sim(a) => {
            init_tracing("error");
            cmd::sim::run(a)
        }
        Command::Workload(a) => {
            init_tracing("error");
            cmd::workload::run(a, &dialer).await
        }
        Command::LogWorkload(a) => {
            init_tracing("error");
            cmd::log_workload::run(a, &dialer).await
        }
        Command::ObjectsWorkload(a) => {
            init_tracing("error");
            cmd::objects_workload::run(a, &dialer).await
        }
        Command::FsWorkload(a) => {
            init_tracing("error");
            tokio::task::block_in_place(|| cmd::fs_workload::run(a))
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
