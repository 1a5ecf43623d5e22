//! Randomized failure injection against real processes, after Ji's test engine: terminators
//! `kill -9` memory nodes, bank client processes and the manager at random intervals and
//! restart them; then everything is healed and the invariants are verified: nothing a client
//! saw commit is lost, money is conserved, no tid stays uncertain, no lock is held, and the
//! redo logs are collected again. The crash tests and `tutti chaos` both run on this.

use crate::fs_workload::{FsCheck, FsClients};
use crate::local::{LocalCluster, LocalError};
use crate::log_workload::{LogCheck, LogClients};
use crate::objects_workload::{ObjectClients, ObjectsCheck};
use crate::proxy::{Process, Proxy};
use crate::registers::{OpCounts, RegisterOp};
use crate::supervisor::Supervisor;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tutti_client::Cluster;
use tutti_log::{Log, LogError, LogOptions, LogShape};
use tutti_wire::NodeId;
use tutti_workload::Bank;

/// Memory node flags for fault runs: recovery within a second, small segments and frequent
/// checkpoints so that garbage collection shows within the run.
pub const NODE_FLAGS: &[&str] = &[
    "--timeout-uncertain-ms",
    "1000",
    "--log-segment-bytes",
    "256K",
    "--checkpoint-interval-ms",
    "200",
];
pub const SEGMENT_BYTES: u64 = 256 << 10;
/// Concurrent transfers per client process.
pub const TASKS: u64 = 4;

/// Bank client processes (`tutti workload`); each client id has one process at a time and
/// keeps, across its incarnations, the number of transfers it saw commit.
pub struct Clients {
    exe: PathBuf,
    manager: String,
    dir: PathBuf,
    count: u64,
    /// Client N runs as `client-N`; its output (the transfers it saw commit) goes to
    /// `outputs[N]`, a new file for each incarnation.
    processes: Supervisor,
    outputs: Vec<PathBuf>,
    pub seen: Vec<u64>,
    /// Transfers that ended in an error (their outcome is unknown), over all incarnations.
    pub errors: Vec<u64>,
    pub incarnations: Vec<u64>,
    pub mix: Mix,
    /// Extra flags of each client (its routes through the chaos proxy, its credentials).
    pub flags: Vec<Vec<String>>,
}

impl Clients {
    pub fn new(exe: &Path, manager: &str, dir: &Path, count: u64) -> Clients {
        Clients {
            exe: exe.to_path_buf(),
            manager: manager.into(),
            dir: dir.to_path_buf(),
            count,
            processes: Supervisor::new(),
            outputs: vec![PathBuf::new(); count as usize],
            seen: vec![0; count as usize],
            errors: vec![0; count as usize],
            incarnations: vec![0; count as usize],
            mix: Mix::TRANSFERS,
            flags: vec![vec![]; count as usize],
        }
    }

    /// Starts client `id` (even ids do compare-and-swap transfers, odd ones `add` transfers).
    pub fn start(&mut self, id: u64) -> std::io::Result<()> {
        let i = id as usize;
        self.incarnations[i] += 1;
        let out = self
            .dir
            .join(format!("client-{id}-{}.out", self.incarnations[i]));
        let kind = if id.is_multiple_of(2) { "cas" } else { "add" };
        let mut cmd = Command::new(&self.exe);
        cmd.args([
            "workload",
            "--cluster",
            &self.manager,
            "--client-id",
            &id.to_string(),
        ])
        .args([
            "--clients",
            &self.count.to_string(),
            "--tasks",
            &TASKS.to_string(),
            "--kind",
            kind,
        ])
        .args(["--seconds", "86400", "--deadline-ms", "30000"])
        .args(["--mix", &self.mix.to_string()])
        .args(&self.flags[i]);
        if self.mix.has_registers() {
            cmd.arg("--history").arg(
                self.dir
                    .join(format!("history-{id}-{}.jsonl", self.incarnations[i])),
            );
        }
        self.processes.start(&format!("client-{id}"), cmd, &out)?;
        self.outputs[i] = out;
        Ok(())
    }

    pub fn start_all(&mut self) -> std::io::Result<()> {
        (0..self.count).try_for_each(|id| self.start(id))
    }

    /// `kill -9` client `id`, keeping what it saw commit.
    pub fn kill(&mut self, id: u64) {
        if self.processes.kill(&format!("client-{id}")).is_some() {
            let (committed, errors) = outcomes(&self.outputs[id as usize]);
            self.seen[id as usize] += committed;
            self.errors[id as usize] += errors;
        }
    }

    pub fn kill_all(&mut self) {
        (0..self.count).for_each(|id| self.kill(id));
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Each client's transfers seen committed so far, over all its incarnations.
    pub fn committed_so_far(&self) -> Vec<u64> {
        (0..self.count)
            .map(|id| {
                let i = id as usize;
                let running = self.processes.is_running(&format!("client-{id}"));
                self.seen[i]
                    + if running {
                        outcomes(&self.outputs[i]).0
                    } else {
                        0
                    }
            })
            .collect()
    }

    /// Each client's transfers that may have committed: seen committed, ended in an
    /// error, or in flight in a killed incarnation's tasks.
    pub fn possibly_committed(&self) -> Vec<u64> {
        (0..self.count as usize)
            .map(|i| self.seen[i] + self.errors[i] + self.incarnations[i] * TASKS)
            .collect()
    }

    /// Transfers the running clients saw commit so far.
    pub fn progress(&self) -> u64 {
        (0..self.count)
            .filter(|id| self.processes.is_running(&format!("client-{id}")))
            .map(|id| outcomes(&self.outputs[id as usize]).0)
            .sum()
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// What a client process printed: its last "committed N" line (it prints one after each
/// commit), and how many "error" lines (transfers whose outcome it does not know).
fn outcomes(out: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let committed = (text.lines().rev())
        .find_map(|l| l.strip_prefix("committed "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let errors = text.lines().filter(|l| l.starts_with("error ")).count();
    (committed, errors as u64)
}

/// The bank the client processes run (`tutti workload`'s defaults).
pub fn bank(clients: u64) -> Bank {
    Bank::new(1000, 4, clients)
}

/// Waits until every node holds no uncertain tid and no lock.
pub async fn wait_idle(cluster: &Cluster, within: Duration) -> Result<(), String> {
    let until = Instant::now() + within;
    loop {
        let busy: Vec<_> = cluster
            .stats()
            .await
            .into_iter()
            .map(|(n, s)| {
                (
                    n,
                    s.map(|s| (s.uncertain, s.locks_held))
                        .map_err(|e| e.to_string()),
                )
            })
            .filter(|(_, s)| s != &Ok((0, 0)))
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!(
                "nodes still busy after {within:?} (node, (uncertain, locks)): {busy:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The cluster once faults are over: every node serving, none with an uncertain tid or a
/// lock held.
async fn healed(local: &LocalCluster) -> Result<Cluster, Vec<String>> {
    let cluster = local
        .wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| vec![e.to_string()])?;
    wait_idle(&cluster, Duration::from_secs(20))
        .await
        .map_err(|e| vec![e])?;
    Ok(cluster)
}

/// Everything that must hold once the cluster is healed and the clients are stopped.
pub async fn verify(local: &LocalCluster, clients: &Clients) -> Result<Cluster, Vec<String>> {
    let cluster = healed(local).await?;
    let mut bank = bank(clients.count);
    for id in 0..clients.count {
        let i = id as usize;
        // Every task of every incarnation may have been killed with a transfer in flight.
        let unknown = clients.errors[i] + clients.incarnations[i] * TASKS;
        bank.tally(id, clients.seen[i], unknown);
    }
    let violations: Vec<String> = crate::workload::check(&cluster, &bank)
        .await
        .map_err(|e| vec![format!("bank snapshot: {e}")])?
        .iter()
        .map(ToString::to_string)
        .collect();
    if violations.is_empty() {
        Ok(cluster)
    } else {
        Err(violations)
    }
}

/// Waits until the redo logs hold no live record and no segment but each node's current one.
pub async fn wait_log_collected(cluster: &Cluster, within: Duration) -> Result<u64, String> {
    let until = Instant::now() + within;
    loop {
        let stats: Vec<_> = cluster
            .stats()
            .await
            .into_iter()
            .filter_map(|(_, s)| s.ok())
            .collect();
        let live: u64 = stats.iter().map(|s| s.log_records_live).sum();
        let bytes: u64 = stats.iter().map(|s| s.log_bytes).sum();
        if live == 0 && bytes <= SEGMENT_BYTES * stats.len() as u64 {
            return Ok(bytes);
        }
        if Instant::now() >= until {
            return Err(format!(
                "log not collected after {within:?}: {live} live records, {bytes} bytes"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn log_bytes(cluster: &Cluster) -> u64 {
    cluster
        .stats()
        .await
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .map(|s| s.log_bytes)
        .sum()
}

/// Relative frequencies of client operations, e.g. `transfer=4,read=2,write=1,cas=1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    pub transfer: u32,
    pub read: u32,
    pub write: u32,
    pub cas: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixOp {
    Transfer,
    Register(RegisterOp),
}

impl Mix {
    /// Bank transfers only.
    pub const TRANSFERS: Mix = Mix {
        transfer: 1,
        read: 0,
        write: 0,
        cas: 0,
    };

    fn weights(&self) -> [(MixOp, u32); 4] {
        [
            (MixOp::Transfer, self.transfer),
            (MixOp::Register(RegisterOp::Read), self.read),
            (MixOp::Register(RegisterOp::Write), self.write),
            (MixOp::Register(RegisterOp::Cas), self.cas),
        ]
    }

    pub fn pick(&self, rng: &mut impl Rng) -> MixOp {
        let total: u32 = self.weights().iter().map(|(_, w)| w).sum();
        let mut x = rng.gen_range(0..total);
        for (op, w) in self.weights() {
            if x < w {
                return op;
            }
            x -= w;
        }
        unreachable!("x < total")
    }

    pub fn has_registers(&self) -> bool {
        self.read + self.write + self.cas > 0
    }
}

impl std::str::FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Mix, String> {
        let mut mix = Mix {
            transfer: 0,
            read: 0,
            write: 0,
            cas: 0,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected OPERATION=WEIGHT"))?;
            let weight: u32 = weight
                .trim()
                .parse()
                .map_err(|e| format!("{part:?}: weight: {e}"))?;
            let slot = match name.trim() {
                "transfer" => &mut mix.transfer,
                "read" => &mut mix.read,
                "write" => &mut mix.write,
                "cas" => &mut mix.cas,
                other => {
                    return Err(format!(
                        "unknown operation {other:?} (use transfer, read, write, cas)"
                    ))
                }
            };
            *slot = weight;
        }
        if mix.weights().iter().all(|(_, w)| *w == 0) {
            return Err("every weight is 0".into());
        }
        if mix
            .weights()
            .iter()
            .map(|(_, w)| u64::from(*w))
            .sum::<u64>()
            > u64::from(u32::MAX)
        {
            return Err("weights too large".into());
        }
        Ok(mix)
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "transfer={},read={},write={},cas={}",
            self.transfer, self.read, self.write, self.cas
        )
    }
}

/// One terminator: kills its kind of process at intervals drawn from `every`.
#[derive(Clone, Copy, Debug)]
pub struct Terminator {
    pub every: (Duration, Duration),
}

/// What the clients of a chaos run do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChaosWorkload {
    /// Bank transfers and registers over minitransactions (`tutti workload` processes).
    Bank,
    /// The shared log: appenders, one reader per stream, a trimmer (`log_workload`).
    Log,
    /// Tango's objects: registers and maps checked by Porcupine, a bank over eight maps
    /// in layered partitions, a maintainer that checkpoints and trims (`objects_workload`).
    Objects,
    /// tutti-fs: clients are mounts with a process working through each.
    Fs,
}

#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub duration: Duration,
    pub workload: ChaosWorkload,
    /// Client processes: bank clients, or the log's appenders.
    pub clients: u64,
    pub mix: Mix,
    pub nodes: Terminator,
    pub clients_killer: Terminator,
    /// Kills of a manager: the lone one, or a random one of the group (leader or follower).
    pub manager: Terminator,
    /// Managers: 1, or a Raft group of 3 or 5 (`tutti up --managers`).
    pub managers: usize,
    /// `log`, or `log-repl`: each node a primary and a mirror, and a node kill strikes the
    /// process serving the node (or, one time in three, the other one).
    pub mode: String,
    /// `log-repl`: the managers' `--failover-timeout-ms`, if not their default.
    pub failover_timeout_ms: Option<u64>,
    /// `log-repl`: one node kill in five, while both of the node's copies are named, also
    /// empties the killed process's data directory (its disk lost): it starts again with
    /// no copy and joins as the mirror.
    pub lose_disks: bool,
    /// Kills of the logs' sequencer (log workload only).
    pub sequencer: Terminator,
    /// Consistent backups taken while the bank runs, each restored at the end and checked
    /// as a cut (bank workload only; `None`: none).
    pub backups: Option<Terminator>,
    /// Time between partitions of a random pair of processes, and how long each lasts.
    /// `None`: processes talk directly, without the proxy.
    pub partitions: Option<(Terminator, Terminator)>,
    /// The Go program that checks register histories with Porcupine.
    pub linearizability_checker: PathBuf,
    pub seed: u64,
    /// What every process of the run proves (a token, TLS), as `tutti up --token-file`
    /// would give it: each reconnection after a kill or a partition authenticates again.
    pub credentials: tutti_wire::CredentialFiles,
}

/// Where `tools/linearizability` is in the source tree this binary was built from.
pub fn default_checker() -> PathBuf {
    crate::source_tree().join("tools/linearizability")
}

/// What a run did, for the report (Ji's Table 2: each fault, its configured interval, and how
/// often it actually happened).
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub node_kills: u64,
    /// `log-repl`: kills of the process serving a node, and of the other one.
    pub primary_kills: u64,
    pub mirror_kills: u64,
    /// `log-repl`: of the node kills, those that also lost the process's disk.
    pub disk_losses: u64,
    /// `log-repl`: processes that stopped on learning they were replaced, and came back
    /// as their node's new mirror.
    pub rejoins: u64,
    /// `log-repl`: from each kill of a node's serving process to the first write committed
    /// on the node again, sorted: all of them, and split by whether the node had a mirror
    /// at the kill (a fail-over) or ran alone (it waits for the killed process's restart).
    pub unavailability: Vec<Duration>,
    pub failovers: Vec<Duration>,
    pub restarts: Vec<Duration>,
    /// The longest of `unavailability`: the node, when in the run its serving process was
    /// killed (to find it in the processes' logs), how long, and how its probe went.
    pub slowest: Option<(NodeId, Duration, Duration, ProbeTrace)>,
    pub client_kills: u64,
    pub manager_kills: u64,
    pub sequencer_kills: u64,
    pub partitions: u64,
    pub transfers_seen_committed: u64,
    /// Trims of the log, and the last trim point.
    pub trims: u64,
    pub trimmed_to: u64,
    /// The log workload's final check.
    pub log: Option<LogCheck>,
    /// The objects workload's final check.
    pub objects: Option<ObjectsCheck>,
    /// The file system workload's final check.
    pub fs: Option<FsCheck>,
    pub reads: OpCounts,
    pub writes: OpCounts,
    pub cases: OpCounts,
    /// Porcupine's verdict on the register history, e.g. "linearizable (41,012 operations)".
    pub linearizability: Option<String>,
    pub log_peak_bytes: u64,
    pub log_after_bytes: u64,
    pub backups: crate::chaos_backups::BackupCounts,
    pub violations: Vec<String>,
}

impl ChaosReport {
    pub fn table(&self, cfg: &ChaosConfig) -> String {
        let interval = |t: &Terminator| {
            format!(
                "every {:.1}–{:.1} s",
                t.every.0.as_secs_f64(),
                t.every.1.as_secs_f64()
            )
        };
        let weight = |w: u32| {
            let total = cfg.mix.transfer + cfg.mix.read + cfg.mix.write + cfg.mix.cas;
            format!(
                "{:.0}% of ops, {} clients × {TASKS}",
                100.0 * f64::from(w) / f64::from(total.max(1)),
                cfg.clients
            )
        };
        let ops = |c: &OpCounts| {
            format!(
                "{} ({} ok, {} mismatch, {} aborted, {} unknown)",
                c.calls, c.ok, c.mismatch, c.aborted, c.unknown
            )
        };
        let node_kills = if crate::local::replicated(&cfg.mode) {
            format!(
                "{} ({} of the serving copy, {} of the other, {} with its disk; {} replaced \
                 copies rejoined)",
                self.node_kills,
                self.primary_kills,
                self.mirror_kills,
                self.disk_losses,
                self.rejoins
            )
        } else {
            self.node_kills.to_string()
        };
        let mut rows = vec![
            (
                "kill -9 a memory node, restart it".to_string(),
                interval(&cfg.nodes),
                node_kills,
            ),
            (
                "kill -9 a client process, restart it".into(),
                interval(&cfg.clients_killer),
                self.client_kills.to_string(),
            ),
            (
                match cfg.managers {
                    1 => "kill -9 the manager, restart it".into(),
                    n => format!("kill -9 one of {n} managers, restart it"),
                },
                interval(&cfg.manager),
                self.manager_kills.to_string(),
            ),
        ];
        if matches!(cfg.workload, ChaosWorkload::Log | ChaosWorkload::Objects) {
            rows.push((
                "kill -9 the sequencer, restart it".into(),
                interval(&cfg.sequencer),
                self.sequencer_kills.to_string(),
            ));
        }
        if let (Some(every), ChaosWorkload::Bank) = (&cfg.backups, cfg.workload) {
            let b = &self.backups;
            rows.push((
                "consistent backup, restored as a cut".into(),
                interval(every),
                format!(
                    "{} ({} completed and {} of them checked, {} failed)",
                    b.started, b.completed, b.checked, b.failed
                ),
            ));
        }
        for (what, u) in [
            (
                "node unavailable after a kill of its serving copy",
                &self.unavailability,
            ),
            ("  with a mirror: fail-over", &self.failovers),
            ("  running alone: restart", &self.restarts),
        ] {
            if u.is_empty() {
                continue;
            }
            let at = |q: f64| u[((u.len() as f64 * q).ceil() as usize).clamp(1, u.len()) - 1];
            rows.push((
                what.into(),
                "until a write commits on it".into(),
                format!(
                    "p50 {:.2} s, p99 {:.2} s, max {:.2} s ({} kills)",
                    at(0.5).as_secs_f64(),
                    at(0.99).as_secs_f64(),
                    u[u.len() - 1].as_secs_f64(),
                    u.len()
                ),
            ));
        }
        if let Some((node, killed, took, trace)) = &self.slowest {
            let last = (trace.last_error.as_deref())
                .map_or(String::new(), |e| format!("; the last that failed: {e}"));
            rows.push((
                "  the slowest".into(),
                format!(
                    "node {node}, killed {:.1} s into the run",
                    killed.as_secs_f64()
                ),
                format!(
                    "{:.2} s: {} writes tried, the longest {:.2} s{last}",
                    took.as_secs_f64(),
                    trace.attempts,
                    trace.longest.as_secs_f64()
                ),
            ));
        }
        if let Some((every, lasting)) = &cfg.partitions {
            rows.push((
                "partition two processes (blackhole)".into(),
                format!(
                    "{}, {:.1}–{:.1} s long",
                    interval(every),
                    lasting.every.0.as_secs_f64(),
                    lasting.every.1.as_secs_f64()
                ),
                self.partitions.to_string(),
            ));
        }
        if cfg.workload == ChaosWorkload::Log {
            let check = self.log.as_ref();
            let count = |f: fn(&LogCheck) -> u64| check.map_or("-".into(), |c| f(c).to_string());
            rows.extend([
                (
                    "log append, acknowledged".to_string(),
                    format!(
                        "{} appenders × {}, streams {:?}",
                        cfg.clients,
                        crate::log_workload::APPEND_TASKS,
                        crate::log_workload::STREAMS
                    ),
                    count(|c| c.acked),
                ),
                (
                    "log append, outcome unknown".into(),
                    "killed or failed".into(),
                    count(|c| c.unknown),
                ),
                (
                    "stream entries read".into(),
                    "one reader per stream, and a final read".into(),
                    count(|c| c.entries_read),
                ),
                (
                    "trim below every reader".into(),
                    "every 2 s".into(),
                    format!("{} (to {})", self.trims, self.trimmed_to),
                ),
            ]);
        }
        if cfg.workload == ChaosWorkload::Objects {
            let check = self.objects.as_ref();
            let count =
                |f: fn(&ObjectsCheck) -> usize| check.map_or("-".into(), |c| f(c).to_string());
            let ops = |c: &OpCounts| {
                format!(
                    "{} ({} ok, {} failed, {} unknown)",
                    c.calls, c.ok, c.aborted, c.unknown
                )
            };
            let clients = format!("{} clients × 2, own views", cfg.clients);
            rows.extend([
                (
                    "register/map read (linearizable)".to_string(),
                    clients.clone(),
                    ops(&self.reads),
                ),
                (
                    "register/map write".into(),
                    clients.clone(),
                    ops(&self.writes),
                ),
                (
                    "bank transfer (tx over 8 maps), committed".into(),
                    format!("{} clients × 2, 3 maps each", cfg.clients),
                    count(|c| c.committed),
                ),
                (
                    "bank transfer, aborted (conflict)".into(),
                    "-".into(),
                    count(|c| c.aborted),
                ),
                (
                    "bank transfer, outcome unknown".into(),
                    "killed or failed".into(),
                    format!(
                        "{} ({} committed in the log)",
                        count(|c| c.unknown),
                        count(|c| c.unknown_committed)
                    ),
                ),
                (
                    "checkpoint + forget every object, trim".into(),
                    "every 3 s".into(),
                    format!("{} (to {})", self.trims, self.trimmed_to),
                ),
            ]);
        }
        if cfg.workload == ChaosWorkload::Fs {
            let check = self.fs.as_ref();
            let count = |f: fn(&FsCheck) -> u64| check.map_or("-".into(), |c| f(c).to_string());
            let ops = |c: &OpCounts| {
                format!(
                    "{} ({} ok, {} failed, {} unknown)",
                    c.calls, c.ok, c.aborted, c.unknown
                )
            };
            let clients = format!("{} mounts × 2 threads", cfg.clients);
            rows.extend([
                (
                    "register file read".to_string(),
                    clients.clone(),
                    ops(&self.reads),
                ),
                (
                    "register file replace (rename)".into(),
                    clients.clone(),
                    ops(&self.writes),
                ),
                (
                    "register file create-if-absent".into(),
                    clients,
                    ops(&self.cases),
                ),
                (
                    "fs action (create, rename, write, …)".into(),
                    format!("{} mounts × 1", cfg.clients),
                    format!(
                        "{} ({} unknown)",
                        count(|c| c.actions),
                        count(|c| c.unknown)
                    ),
                ),
                (
                    "fsck --repair after the run".into(),
                    "orphans and leaks of killed mounts".into(),
                    check.map_or("-".into(), |c| c.repaired.to_string()),
                ),
            ]);
        }
        let bank = cfg.workload == ChaosWorkload::Bank;
        if bank {
            rows.push((
                "bank transfer, seen committed".into(),
                weight(cfg.mix.transfer),
                self.transfers_seen_committed.to_string(),
            ));
        }
        for (name, w, c) in [
            (
                "register read (+ read of another key)",
                cfg.mix.read,
                &self.reads,
            ),
            (
                "register write (+ read of another key)",
                cfg.mix.write,
                &self.writes,
            ),
            (
                "register cas (+ read of another key)",
                cfg.mix.cas,
                &self.cases,
            ),
        ] {
            if bank && w > 0 {
                rows.push((name.into(), weight(w), ops(c)));
            }
        }
        let mut out = format!(
            "{:<40} {:<34} {}\n",
            "operation or fault", "configured", "done"
        );
        for (what, configured, done) in rows {
            out += &format!("{what:<40} {configured:<34} {done}\n");
        }
        out += &format!(
            "redo logs: {} bytes at peak, {} after GC\n",
            self.log_peak_bytes, self.log_after_bytes
        );
        if let Some(l) = &self.linearizability {
            out += &format!("register history (Porcupine): {l}\n");
        }
        out
    }
}

fn draw(rng: &mut impl Rng, t: &Terminator) -> Duration {
    let (lo, hi) = (t.every.0.as_millis() as u64, t.every.1.as_millis() as u64);
    Duration::from_millis(rng.gen_range(lo..=hi.max(lo)))
}

/// The client processes of a run, with what each workload needs besides.
enum Workload {
    Bank(Clients),
    Log {
        clients: LogClients,
        /// The harness's own handle on the log, for trims.
        log: Log,
        next_trim: Duration,
    },
    Objects {
        clients: ObjectClients,
        log: Log,
        /// The maintainer's client (opened on first use: it may fail under faults).
        maintainer: Option<tutti_tango::Tango>,
        next_trim: Duration,
    },
    Fs(FsClients),
}

impl Workload {
    /// Kills a random client process and starts it again.
    fn kill_one(&mut self, rng: &mut impl Rng) -> Result<(), LocalError> {
        let restarted = match self {
            Workload::Bank(clients) => {
                let id = rng.gen_range(0..clients.count);
                clients.kill(id);
                clients.start(id)
            }
            Workload::Log { clients, .. } => {
                let names = clients.names();
                let name = &names[rng.gen_range(0..names.len())];
                clients.kill(name);
                clients.start(name)
            }
            Workload::Objects { clients, .. } => {
                let id = rng.gen_range(0..clients.count);
                clients.kill(id);
                clients.start(id)
            }
            Workload::Fs(clients) => {
                let id = rng.gen_range(0..clients.count);
                clients.kill(id);
                clients.start(id)
            }
        };
        restarted.map_err(|e| LocalError::Config(format!("restart a client: {e}")))
    }

    fn kill_all(&mut self) {
        match self {
            Workload::Bank(clients) => clients.kill_all(),
            Workload::Log { clients, .. } => clients.kill_all(),
            Workload::Objects { clients, .. } => clients.kill_all(),
            Workload::Fs(clients) => clients.kill_all(),
        }
    }

    /// Trims the log below every reader, every 2 s (log workload); checkpoints every object,
    /// forgets below and trims, every 3 s (objects workload).
    fn trim(&mut self, rt: &tokio::runtime::Runtime, now: Duration, report: &mut ChaosReport) {
        if let Workload::Objects {
            log,
            maintainer,
            next_trim,
            ..
        } = self
        {
            if now < *next_trim {
                return;
            }
            *next_trim = now + Duration::from_secs(3);
            let maintained = rt.block_on(tokio::time::timeout(Duration::from_secs(5), async {
                let t = match maintainer.take() {
                    Some(t) => t,
                    None => crate::objects_workload::maintainer(log.clone()).await?,
                };
                let trimmed = t.compact().await.map(|(_, trim)| trim);
                // A maintainer trimmed past (partitioned away) opens anew next time.
                if !matches!(trimmed, Err(tutti_tango::TangoError::Trimmed { .. })) {
                    *maintainer = Some(t);
                }
                trimmed
            }));
            if let Ok(Ok(to)) = maintained {
                report.trims += 1;
                report.trimmed_to = to;
            }
            return;
        }
        let Workload::Log {
            clients,
            log,
            next_trim,
        } = self
        else {
            return;
        };
        if now < *next_trim {
            return;
        }
        *next_trim = now + Duration::from_secs(2);
        let Some(to) = clients.readers_synced() else {
            return;
        };
        if to <= report.trimmed_to {
            return;
        }
        let trimmed = rt.block_on(tokio::time::timeout(Duration::from_secs(3), log.trim(to)));
        if let Ok(Ok(())) = trimmed {
            report.trims += 1;
            report.trimmed_to = to;
        }
    }

    fn progress(&self) -> String {
        match self {
            Workload::Bank(clients) => format!(
                "{} transfers",
                clients.progress() + clients.seen.iter().sum::<u64>()
            ),
            Workload::Log { clients, .. } => format!("{} appends", clients.acked()),
            Workload::Objects { clients, .. } => {
                format!("{} transfers committed", clients.committed())
            }
            Workload::Fs(clients) => format!("{} fs actions", clients.actions_done()),
        }
    }
}

/// Runs the terminators and the partitioner against a fresh 4-node `log` cluster in `dir`,
/// heals, and verifies.
pub fn run(
    exe: &Path,
    dir: &Path,
    cfg: &ChaosConfig,
    progress: impl Fn(&str),
) -> Result<ChaosReport, LocalError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LocalError::Config(format!("tokio runtime: {e}")))?;
    // The supervisor starts processes as tokio children, from this thread.
    let _in_rt = rt.enter();
    let layout = crate::local::Layout {
        host: crate::local::LOOPBACK,
        nodes: 4,
        managers: cfg.managers,
        mode: cfg.mode.clone(),
        size_bytes: 64 << 20,
        node_flags: NODE_FLAGS.iter().map(|s| s.to_string()).collect(),
        manager_flags: (cfg.failover_timeout_ms.iter())
            .flat_map(|ms| ["--failover-timeout-ms".to_string(), ms.to_string()])
            .collect(),
    };
    let mut local = LocalCluster::open(exe, dir, layout, true)?;
    let manager = local.file.manager.clone();
    let mut bank_clients = Clients::new(exe, &manager, dir, cfg.clients);
    bank_clients.mix = cfg.mix;
    let mut log_clients = LogClients::new(exe, &manager, dir, cfg.clients);
    let mut object_clients = ObjectClients::new(exe, &manager, dir, cfg.clients);
    let mut fs_clients = FsClients::new(exe, &manager, dir, cfg.clients);
    let proxy = match (cfg.partitions, cfg.workload) {
        (None, _) => None,
        (Some(_), ChaosWorkload::Bank) => {
            let names = (0..cfg.clients).map(|i| format!("client-{i}")).collect();
            let proxy = rt.block_on(start_proxy(&mut local, names, false))?;
            bank_clients.flags = (0..cfg.clients)
                .map(|i| proxy.route_flags(&format!("client-{i}")))
                .collect();
            Some(proxy)
        }
        (Some(_), ChaosWorkload::Log) => {
            let names = log_clients.names();
            let proxy = rt.block_on(start_proxy(&mut local, names.clone(), true))?;
            log_clients.flags = routes(&proxy, names);
            Some(proxy)
        }
        (Some(_), ChaosWorkload::Objects) => {
            let names = object_clients.names();
            let proxy = rt.block_on(start_proxy(&mut local, names.clone(), true))?;
            object_clients.flags = routes(&proxy, names);
            Some(proxy)
        }
        (Some(_), ChaosWorkload::Fs) => {
            let names = fs_clients.names();
            let proxy = rt.block_on(start_proxy(&mut local, names.clone(), false))?;
            fs_clients.flags = names.iter().map(|n| proxy.route_flags(n)).collect();
            Some(proxy)
        }
    };
    if cfg.credentials != tutti_wire::CredentialFiles::default() {
        local.set_credentials(&cfg.credentials)?;
        let flags = local.file.credentials.flags();
        for f in bank_clients.flags.iter_mut().chain(&mut fs_clients.flags) {
            f.extend(flags.iter().cloned());
        }
        for n in log_clients.names() {
            log_clients
                .flags
                .entry(n)
                .or_default()
                .extend(flags.iter().cloned());
        }
        for n in object_clients.names() {
            (object_clients.flags.entry(n).or_default()).extend(flags.iter().cloned());
        }
    }
    local.start_all()?;
    let cluster = rt.block_on(local.wait_ready(Duration::from_secs(60)))?;
    let mut workload = match cfg.workload {
        ChaosWorkload::Bank => {
            rt.block_on(crate::workload::setup(&cluster, &bank(cfg.clients)))
                .map_err(|e| LocalError::Config(format!("bank init: {e}")))?;
            bank_clients
                .start_all()
                .map_err(|e| LocalError::Config(format!("start clients: {e}")))?;
            Workload::Bank(bank_clients)
        }
        ChaosWorkload::Log => {
            let log = rt
                .block_on(create_log(&cluster))
                .map_err(|e| LocalError::Config(format!("create the log: {e}")))?;
            log_clients
                .start_all()
                .map_err(|e| LocalError::Config(format!("start clients: {e}")))?;
            Workload::Log {
                clients: log_clients,
                log,
                next_trim: Duration::ZERO,
            }
        }
        ChaosWorkload::Objects => {
            let log = rt
                .block_on(create_objects_log(&cluster))
                .map_err(|e| LocalError::Config(format!("create the objects: {e}")))?;
            object_clients
                .start_all()
                .map_err(|e| LocalError::Config(format!("start clients: {e}")))?;
            Workload::Objects {
                clients: object_clients,
                log,
                maintainer: None,
                next_trim: Duration::from_secs(3),
            }
        }
        ChaosWorkload::Fs => {
            mkfs(exe, &manager, &local.file.credentials.flags())?;
            fs_clients
                .start_all()
                .map_err(|e| LocalError::Config(format!("start clients: {e}")))?;
            Workload::Fs(fs_clients)
        }
    };
    let mut report = ChaosReport::default();
    let mut faults = Faults::new(cfg);
    faults.log = std::fs::File::create(local.dir.join(FAULT_LOG)).ok();
    if crate::local::replicated(&cfg.mode) {
        faults.probe_addrs = rt
            .block_on(create_probe_region(&cluster))
            .map_err(LocalError::Config)?;
    }
    let mut backups = match (&cfg.backups, cfg.workload) {
        (Some(every), ChaosWorkload::Bank) => Some(crate::chaos_backups::Backups::new(
            exe,
            dir,
            *every,
            &manager,
            &local.file.credentials.flags(),
        )),
        _ => None,
    };
    // Drawn apart from the faults, so that the fault schedule of a seed stays what it was.
    let mut backup_rng = rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0xBAC_C0DE);
    let mut next_backup = backups
        .as_ref()
        .map_or(Duration::MAX, |b| draw(&mut backup_rng, b.every()));
    let start = Instant::now();
    let mut next_progress = Duration::ZERO;
    while start.elapsed() < cfg.duration {
        std::thread::sleep(Duration::from_millis(50));
        let now = start.elapsed();
        let at = Strike {
            now,
            rt: &rt,
            cluster: &cluster,
        };
        faults.inject(at, &mut local, &mut workload, proxy.as_ref(), &mut report)?;
        if let (Some(b), Workload::Bank(clients)) = (&mut backups, &workload) {
            b.poll();
            if now >= next_backup {
                b.start(clients)?;
                next_backup = now + draw(&mut backup_rng, b.every());
            }
        }
        workload.trim(&rt, now, &mut report);
        if let Workload::Fs(clients) = &mut workload {
            clients
                .tend()
                .map_err(|e| LocalError::Config(format!("restart a client: {e}")))?;
        }
        if now < next_progress {
            continue;
        }
        next_progress = now + Duration::from_secs(1);
        if let Ok(Ok(cluster)) = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(2),
                local.wait_ready(Duration::from_secs(1)),
            )
            .await
        }) {
            // A node cut off or recovering answers its stats late; the next second asks again.
            let bytes = rt.block_on(tokio::time::timeout(
                Duration::from_secs(2),
                log_bytes(&cluster),
            ));
            report.log_peak_bytes = report.log_peak_bytes.max(bytes.unwrap_or(0));
        }
        progress(&format!(
            "{:>4.0} s: {} node, {} client, {} manager, {} sequencer kills, {} partitions, {}",
            now.as_secs_f64(),
            report.node_kills,
            report.client_kills,
            report.manager_kills,
            report.sequencer_kills,
            report.partitions,
            workload.progress(),
        ));
    }
    if let Some(proxy) = &proxy {
        proxy.heal_all();
    }
    let probed = rt.block_on(faults.probed());
    let split = |mirrored: bool| -> Vec<Duration> {
        (probed.iter())
            .filter(|(kill, _, _)| kill.mirrored == mirrored)
            .map(|(_, took, _)| *took)
            .collect()
    };
    report.failovers = split(true);
    report.restarts = split(false);
    report.slowest =
        (probed.last()).map(|(kill, took, trace)| (kill.node, kill.killed, *took, trace.clone()));
    report.unavailability = probed.into_iter().map(|(_, took, _)| took).collect();
    if let Some(b) = &mut backups {
        b.finish();
    }
    workload.kill_all();
    rt.block_on(async {
        let verified = match &workload {
            Workload::Bank(clients) => {
                report.transfers_seen_committed = clients.seen.iter().sum();
                verify(&local, clients).await
            }
            Workload::Log { clients, .. } => verify_log(&local, clients, &mut report).await,
            Workload::Objects { .. } => verify_objects(&local, dir, &mut report).await,
            Workload::Fs(clients) => verify_fs(&local, dir, clients.count, &mut report).await,
        };
        let cluster = match verified {
            Ok(cluster) => cluster,
            Err(v) => return report.violations.extend(v),
        };
        if crate::local::replicated(&cfg.mode) {
            // Every copy killed, or whose disk was lost, came back: joined, or kept.
            let mirrored = local.wait_mirrored(&cluster, Duration::from_secs(60));
            if let Err(e) = mirrored.await {
                report.violations.push(e.to_string());
            }
        }
        match wait_log_collected(&cluster, Duration::from_secs(45)).await {
            Ok(bytes) => report.log_after_bytes = bytes,
            Err(e) => report.violations.push(e),
        }
    });
    local.stop_all();
    drop(proxy);
    if let (Some(b), Workload::Bank(clients)) = (&mut backups, &workload) {
        progress("restoring the backups and checking each is a cut…");
        b.check(&rt, clients);
        report.backups = b.counts;
        report.violations.append(&mut b.violations);
    }
    if matches!(cfg.workload, ChaosWorkload::Objects | ChaosWorkload::Fs)
        || (cfg.workload == ChaosWorkload::Bank && cfg.mix.has_registers())
    {
        progress("checking the register history with Porcupine…");
        check_registers(dir, cfg, &mut report);
    }
    Ok(report)
}

/// Makes the file system's volume on the run's cluster (`tutti fs mkfs`).
fn mkfs(exe: &Path, manager: &str, credentials: &[String]) -> Result<(), LocalError> {
    let out = Command::new(exe)
        .args(["fs", "mkfs", "--cluster", manager, "--name"])
        .arg(crate::fs_workload::VOLUME)
        .args(["--bytes-per-node", crate::fs_workload::BYTES_PER_NODE])
        .args(credentials)
        .output()
        .map_err(|e| LocalError::Config(format!("tutti fs mkfs: {e}")))?;
    if !out.status.success() {
        return Err(LocalError::Config(format!(
            "tutti fs mkfs: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// Once healed and the mounts stopped: the cluster idle, then the file system's check.
async fn verify_fs(
    local: &LocalCluster,
    dir: &Path,
    clients: u64,
    report: &mut ChaosReport,
) -> Result<Cluster, Vec<String>> {
    let cluster = healed(local).await?;
    report.fs = Some(crate::fs_workload::check(&cluster, dir, clients).await?);
    cluster.flush().await.map_err(|e| vec![e.to_string()])?;
    Ok(cluster)
}

/// The chaos run's log: striped over the 4 nodes in 512-byte slots, 16 MiB of each (32,768
/// slots), so that a minute of appends wraps around it behind the trims.
async fn create_log(cluster: &Cluster) -> Result<Log, LogError> {
    let shape = LogShape {
        slot_bytes: 512,
        ..LogShape::new(vec![1, 2, 3, 4], 16 << 20)
    };
    Log::create(
        cluster,
        crate::log_workload::LOG,
        &shape,
        LogOptions::default(),
    )
    .await
}

/// The objects' log: 1 KiB slots (a checkpoint part fits), 32 MiB of each node; the objects
/// created and the accounts opened.
async fn create_objects_log(cluster: &Cluster) -> Result<Log, String> {
    let shape = LogShape {
        slot_bytes: 1024,
        ..LogShape::new(vec![1, 2, 3, 4], 32 << 20)
    };
    let log = Log::create(
        cluster,
        crate::objects_workload::LOG,
        &shape,
        LogOptions::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    crate::objects_workload::setup(log.clone())
        .await
        .map_err(|e| e.to_string())?;
    Ok(log)
}

/// Once healed and the objects' clients stopped: the cluster idle, then the bank's check.
async fn verify_objects(
    local: &LocalCluster,
    dir: &Path,
    report: &mut ChaosReport,
) -> Result<Cluster, Vec<String>> {
    let (cluster, log) = healed_log(local, crate::objects_workload::LOG).await?;
    report.objects = Some(crate::objects_workload::check(log, dir).await?);
    cluster.flush().await.map_err(|e| vec![e.to_string()])?;
    Ok(cluster)
}

/// The healed cluster (idle), and the log `name` on it for a final check.
async fn healed_log(local: &LocalCluster, name: &str) -> Result<(Cluster, Log), Vec<String>> {
    let cluster = healed(local).await?;
    let opts = LogOptions {
        deadline: Duration::from_secs(60),
        ..LogOptions::default()
    };
    let log = Log::open(&cluster, name, opts)
        .await
        .map_err(|e| vec![format!("open the log: {e}")])?;
    Ok((cluster, log))
}

/// Once healed and the log's clients stopped: the cluster idle, then the log's final check.
async fn verify_log(
    local: &LocalCluster,
    clients: &LogClients,
    report: &mut ChaosReport,
) -> Result<Cluster, Vec<String>> {
    let (cluster, log) = healed_log(local, crate::log_workload::LOG).await?;
    report.log = Some(crate::log_workload::check(&log, clients.history()).await?);
    // The final check's fills and reads leave decisions queued.
    cluster.flush().await.map_err(|e| vec![e.to_string()])?;
    Ok(cluster)
}

/// Each client's flags that route it through `proxy`, by name.
fn routes(
    proxy: &Proxy,
    clients: Vec<Process>,
) -> std::collections::BTreeMap<Process, Vec<String>> {
    (clients.into_iter())
        .map(|n| {
            let flags = proxy.route_flags(&n);
            (n, flags)
        })
        .collect()
}

/// Starts the partitioning proxy between every pair of processes (manager, nodes, the
/// sequencer if `sequencer`, the clients) and routes each server through it; the clients'
/// routes are `proxy.route_flags(client)`.
async fn start_proxy(
    local: &mut LocalCluster,
    clients: Vec<Process>,
    sequencer: bool,
) -> Result<Proxy, LocalError> {
    let managers = local.file.manager_entries();
    let servers: Vec<(Process, String)> = (managers.into_iter())
        .map(|m| (local.file.manager_process(m.id), m.addr))
        .chain(local.file.nodes.iter().flat_map(|n| {
            let mirror =
                (n.mirror.as_ref()).map(|m| (format!("node-{}-mirror", n.id), m.addr.clone()));
            std::iter::once((format!("node-{}", n.id), n.addr.clone())).chain(mirror)
        }))
        .chain(sequencer.then(|| ("sequencer".into(), local.file.sequencer.clone())))
        .collect();
    let sources: Vec<Process> = servers
        .iter()
        .map(|(name, _)| name.clone())
        .chain(clients)
        .collect();
    let proxy = Proxy::start(&sources, &servers)
        .await
        .map_err(|e| LocalError::Config(format!("start the partition proxy: {e}")))?;
    for (name, _) in &servers {
        local
            .process_flags
            .insert(name.clone(), proxy.route_flags(name));
    }
    Ok(proxy)
}

/// The fault schedule of a run, drawn from its seed: when each terminator strikes next,
/// and which process pairs are cut until when.
struct Faults<'a> {
    cfg: &'a ChaosConfig,
    rng: rand::rngs::StdRng,
    next_node: Duration,
    next_client: Duration,
    next_manager: Duration,
    next_sequencer: Duration,
    next_partition: Duration,
    cut: Vec<((Process, Process), Duration)>,
    /// `log-repl`: a probe per kill of a node's serving process, timing its unavailability,
    /// with whether the node had a mirror then; and where on each node probes write.
    probes: Vec<(ServingKill, tokio::task::JoinHandle<ProbeTrace>)>,
    probe_addrs: Vec<(NodeId, u64)>,
    /// Each node process started again empty (every restart in `ram-repl`, one whose disk
    /// was lost in `log-repl`), with its node's configuration epoch then: it holds the
    /// node's data only once a placement of a later epoch names it (it joined).
    emptied_at_epoch: std::collections::HashMap<String, u64>,
    /// `FAULT_LOG` in the cluster's directory: each fault, with when in the run it struck.
    log: Option<std::fs::File>,
}

/// The faults of a run, one line each, in the cluster's directory (kept with `--data`, or
/// when a run fails): to line a slow fail-over up with what else struck then.
pub const FAULT_LOG: &str = "faults.log";

/// Waits a pause drawn below `max_ms` before a killed process is started again, having
/// noted the kill of `what` and the pause in `log`.
fn pause_before_restart(
    log: &mut Option<std::fs::File>,
    rng: &mut rand::rngs::StdRng,
    now: Duration,
    max_ms: u64,
    what: std::fmt::Arguments<'_>,
) {
    let pause = rng.gen_range(0..max_ms);
    note(
        log,
        now,
        format_args!("kill -9 {what}; restarted {pause} ms later"),
    );
    std::thread::sleep(Duration::from_millis(pause));
}

/// Notes a fault that struck at `now` in `log` (`FAULT_LOG`).
fn note(log: &mut Option<std::fs::File>, now: Duration, what: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    if let Some(log) = log {
        let _ = writeln!(log, "{:9.3} s  {what}", now.as_secs_f64());
    }
}

/// A kill of a node's serving process, which a probe times.
struct ServingKill {
    node: NodeId,
    /// When in the run.
    killed: Duration,
    /// Whether the node had a mirror at the kill (a fail-over) or ran alone.
    mirrored: bool,
}

/// When a fault strikes, and how to ask the cluster where a node is served.
struct Strike<'r> {
    now: Duration,
    rt: &'r tokio::runtime::Runtime,
    cluster: &'r Cluster,
}

/// The region a probe writes in, on every node (created when the run starts).
const PROBE_REGION: &str = "chaos-probe";

async fn create_probe_region(cluster: &Cluster) -> Result<Vec<(NodeId, u64)>, String> {
    let create = tutti_wire::Request::CreateRegion {
        name: PROBE_REGION.into(),
        kind: "probe".into(),
        nodes: (1..=4).collect(),
        bytes_per_node: 4096,
        params: vec![],
    };
    match cluster.ask_manager(&create).await {
        Ok(tutti_wire::Response::Region(r)) => Ok(r.nodes),
        other => Err(format!("create the probes' region: {other:?}")),
    }
}

/// How a probe went: the time from the kill to its committed write (none after 60 s), its
/// attempts, the longest one, and what the last failed one said.
#[derive(Debug, Default, Clone)]
pub struct ProbeTrace {
    pub took: Option<Duration>,
    pub attempts: u64,
    pub longest: Duration,
    pub last_error: Option<String>,
}

/// Writes to `node` at `addr` until a write commits, or for 60 s after `killed`.
async fn probe(cluster: Cluster, node: NodeId, addr: u64, killed: Instant) -> ProbeTrace {
    let mut trace = ProbeTrace::default();
    while killed.elapsed() < Duration::from_secs(60) {
        let tx = tutti_client::Minitx::new().write(node, addr, vec![1; 8]);
        let started = Instant::now();
        let outcome = cluster.exec_and_commit(&tx).await;
        trace.attempts += 1;
        trace.longest = trace.longest.max(started.elapsed());
        match outcome {
            Ok(o) if o.committed => {
                trace.took = Some(killed.elapsed());
                return trace;
            }
            Ok(_) => trace.last_error = Some("not committed".into()),
            Err(e) => trace.last_error = Some(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    trace
}

/// `node`'s placement, as the managers have it committed.
async fn placement(cluster: &Cluster, node: NodeId) -> Option<tutti_wire::Placement> {
    match cluster
        .ask_manager(&tutti_wire::Request::Placement { node })
        .await
    {
        Ok(tutti_wire::Response::Placement(p)) => p,
        _ => None,
    }
}

impl<'a> Faults<'a> {
    fn new(cfg: &'a ChaosConfig) -> Faults<'a> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
        Faults {
            next_node: draw(&mut rng, &cfg.nodes),
            next_client: draw(&mut rng, &cfg.clients_killer),
            next_manager: draw(&mut rng, &cfg.manager),
            next_sequencer: match cfg.workload {
                ChaosWorkload::Log | ChaosWorkload::Objects => draw(&mut rng, &cfg.sequencer),
                ChaosWorkload::Bank | ChaosWorkload::Fs => Duration::MAX,
            },
            next_partition: cfg
                .partitions
                .map_or(Duration::MAX, |(every, _)| draw(&mut rng, &every)),
            cut: Vec::new(),
            probes: Vec::new(),
            probe_addrs: Vec::new(),
            emptied_at_epoch: std::collections::HashMap::new(),
            log: None,
            cfg,
            rng,
        }
    }

    /// Each kill a probe timed, with that time, sorted by it (a probe that never saw a
    /// commit counts as 60 s), and how the probe went.
    async fn probed(&mut self) -> Vec<(ServingKill, Duration, ProbeTrace)> {
        let mut timings = Vec::new();
        for (kill, p) in self.probes.drain(..) {
            let trace = p.await.unwrap_or_default();
            let took = trace.took.unwrap_or(Duration::from_secs(60));
            timings.push((kill, took, trace));
        }
        timings.sort_by_key(|(_, took, _)| *took);
        timings
    }

    /// Kills a `log-repl` node's serving process (two times in three) or its other one,
    /// restarting it 0–2 s later: long enough, often, for its mirror to take over. A
    /// `ram-repl` node's serving process is killed only while the node has a mirror, and
    /// a `log-repl` process's disk is lost (`lose_disks`) only then: the other copy holds
    /// every commit.
    fn kill_replicated(
        &mut self,
        at: &Strike<'_>,
        local: &mut LocalCluster,
        report: &mut ChaosReport,
    ) -> Result<(), LocalError> {
        let rng = &mut self.rng;
        let node = rng.gen_range(1..=4);
        let Some(p) = at.rt.block_on(placement(at.cluster, node)) else {
            return Ok(());
        };
        let Some(serving) = local.process_at(node, &p.primary) else {
            return Ok(());
        };
        // A mirror started again empty since the placement's epoch has not joined yet:
        // named still, maybe, but holding nothing.
        let in_ram = self.cfg.mode == crate::local::RAM_REPLICATED_MODE;
        let mirror = (p.mirror.as_ref()).and_then(|m| local.process_at(node, m));
        let mirrored = mirror
            .is_some_and(|m| (self.emptied_at_epoch.get(&m)).is_none_or(|&e| p.config_epoch > e));
        let other = match serving.strip_suffix("-mirror") {
            Some(primary) => primary.to_string(),
            None => format!("{serving}-mirror"),
        };
        // A ram-repl node running alone holds its data in one process only: killing that
        // one is a second fault, which the mode does not survive, so the other is killed.
        let alone_in_ram = !mirrored && in_ram;
        let (name, role) = if rng.gen_range(0..3) < 2 && !alone_in_ram {
            report.primary_kills += 1;
            let killed = Instant::now();
            local.kill(&serving);
            let addr = (self.probe_addrs.iter())
                .find(|(n, _)| *n == node)
                .map(|(_, a)| *a);
            if let Some(addr) = addr {
                let _in = at.rt.enter();
                let probe = probe(at.cluster.clone(), node, addr, killed);
                let kill = ServingKill {
                    node,
                    killed: at.now,
                    mirrored,
                };
                self.probes.push((kill, tokio::spawn(probe)));
            }
            (serving, "serving")
        } else {
            report.mirror_kills += 1;
            local.kill(&other);
            (other, "the other copy of")
        };
        let lose_disk = self.cfg.lose_disks && !in_ram && mirrored && rng.gen_ratio(1, 5);
        if lose_disk {
            local.lose_disk(&name)?;
            report.disk_losses += 1;
        }
        let disk = if lose_disk { ", with its disk" } else { "" };
        let what = format_args!(
            "{name} ({role} node {node}, epoch {}{disk})",
            p.config_epoch
        );
        pause_before_restart(&mut self.log, rng, at.now, 2000, what);
        // A process of the mirror role serves as what the placement makes it, and joins
        // as the new mirror if it is neither primary nor mirror any more.
        if in_ram || lose_disk {
            self.emptied_at_epoch.insert(name.clone(), p.config_epoch);
        }
        local.restart_as_mirror(&name)
    }

    /// `log-repl`: node processes that stopped by themselves (a primary that learnt it was
    /// replaced) come back as their node's new mirror.
    fn restart_replaced(
        &mut self,
        at: &Strike<'_>,
        local: &mut LocalCluster,
        report: &mut ChaosReport,
    ) -> Result<(), LocalError> {
        for (name, status) in local.reap() {
            if !name.starts_with("node-") {
                continue;
            }
            if status.code() == Some(tutti_wire::EXIT_REPLACED) {
                report.rejoins += 1;
            } else {
                report
                    .violations
                    .push(format!("{name} exited by itself: {status}"));
            }
            if self.cfg.mode == crate::local::RAM_REPLICATED_MODE {
                let node = crate::local::node_of_process(&name);
                let epoch = node.and_then(|n| at.rt.block_on(placement(at.cluster, n)));
                let epoch = epoch.map_or(u64::MAX, |p| p.config_epoch);
                self.emptied_at_epoch.insert(name.clone(), epoch);
            }
            local.restart_as_mirror(&name)?;
        }
        Ok(())
    }

    /// Strikes with every terminator whose time has come at `now` (since the start), and
    /// heals or cuts partitions; counts each fault in `report`.
    fn inject(
        &mut self,
        at: Strike<'_>,
        local: &mut LocalCluster,
        workload: &mut Workload,
        proxy: Option<&Proxy>,
        report: &mut ChaosReport,
    ) -> Result<(), LocalError> {
        let now = at.now;
        if crate::local::replicated(&self.cfg.mode) {
            self.restart_replaced(&at, local, report)?;
        }
        if now >= self.next_node && crate::local::replicated(&self.cfg.mode) {
            self.kill_replicated(&at, local, report)?;
            report.node_kills += 1;
            self.next_node = now + draw(&mut self.rng, &self.cfg.nodes);
        }
        let (cfg, rng) = (self.cfg, &mut self.rng);
        if now >= self.next_node {
            let node = rng.gen_range(1..=4);
            local.kill_node(node);
            pause_before_restart(&mut self.log, rng, now, 800, format_args!("node {node}"));
            local.start_node(node)?;
            report.node_kills += 1;
            self.next_node = now + draw(rng, &cfg.nodes);
        }
        if now >= self.next_client {
            note(&mut self.log, now, format_args!("kill -9 a client process"));
            workload.kill_one(rng)?;
            report.client_kills += 1;
            self.next_client = now + draw(rng, &cfg.clients_killer);
        }
        if now >= self.next_manager {
            let id = rng.gen_range(1..=local.file.manager_entries().len() as u64);
            local.kill_manager_id(id);
            pause_before_restart(&mut self.log, rng, now, 2000, format_args!("manager {id}"));
            local.start_manager_id(id)?;
            report.manager_kills += 1;
            self.next_manager = now + draw(rng, &cfg.manager);
        }
        if now >= self.next_sequencer {
            local.kill_sequencer();
            let what = format_args!("the sequencer");
            pause_before_restart(&mut self.log, rng, now, 500, what);
            local.start_sequencer()?;
            report.sequencer_kills += 1;
            self.next_sequencer = now + draw(rng, &cfg.sequencer);
        }
        if let (Some(proxy), Some((every, lasting))) = (proxy, &cfg.partitions) {
            self.cut.retain(|((a, b), until)| {
                let keep = now < *until;
                if !keep {
                    proxy.set_cut(a, b, false);
                    note(&mut self.log, now, format_args!("heal {a} / {b}"));
                }
                keep
            });
            if now >= self.next_partition {
                let pairs: Vec<_> = proxy
                    .pairs()
                    .into_iter()
                    .filter(|p| !self.cut.iter().any(|(q, _)| q == p))
                    .collect();
                if !pairs.is_empty() {
                    let (a, b) = pairs[rng.gen_range(0..pairs.len())].clone();
                    proxy.set_cut(&a, &b, true);
                    let until = now + draw(rng, lasting);
                    let what = format_args!("cut {a} / {b} until {:.3} s", until.as_secs_f64());
                    note(&mut self.log, now, what);
                    self.cut.push(((a, b), until));
                    report.partitions += 1;
                }
                self.next_partition = now + draw(rng, every);
            }
        }
        Ok(())
    }
}

/// Checks the register histories the clients wrote in `dir` with Porcupine; a history that
/// is not linearizable, or that could not be checked, is a violation.
fn check_registers(dir: &Path, cfg: &ChaosConfig, report: &mut ChaosReport) {
    match crate::registers::check_histories(dir, &cfg.linearizability_checker) {
        Ok(verdict) => {
            report.reads = verdict.reads;
            report.writes = verdict.writes;
            report.cases = verdict.cases;
            report.linearizability = Some(verdict.summary.clone());
            if !verdict.linearizable {
                report
                    .violations
                    .push(format!("register history: {}", verdict.summary));
            }
        }
        Err(e) => report
            .violations
            .push(format!("register history not checked: {e}")),
    }
}
