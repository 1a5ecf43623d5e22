//! Randomized failure injection against real processes, after Ji's test engine: terminators
//! `kill -9` memory nodes, bank client processes and the manager at random intervals and
//! restart them; then everything is healed and the invariants are verified: nothing a client
//! saw commit is lost, money is conserved, no tid stays uncertain, no lock is held, and the
//! redo logs are collected again. The crash tests and `tutti chaos` both run on this.

use crate::bank::Bank;
use crate::local::{LocalCluster, LocalError};
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tutti_client::Cluster;

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
    running: Vec<Option<(Child, PathBuf)>>,
    pub seen: Vec<u64>,
    pub incarnations: Vec<u64>,
}

impl Clients {
    pub fn new(exe: &Path, manager: &str, dir: &Path, count: u64) -> Clients {
        Clients {
            exe: exe.to_path_buf(),
            manager: manager.into(),
            dir: dir.to_path_buf(),
            count,
            running: (0..count).map(|_| None).collect(),
            seen: vec![0; count as usize],
            incarnations: vec![0; count as usize],
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
        crate::local::die_with_parent(&mut cmd);
        let child = cmd
            .args([
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
            .stdout(std::fs::File::create(&out)?)
            .stderr(Stdio::null())
            .spawn()?;
        self.running[i] = Some((child, out));
        Ok(())
    }

    pub fn start_all(&mut self) -> std::io::Result<()> {
        (0..self.count).try_for_each(|id| self.start(id))
    }

    /// `kill -9` client `id`, keeping what it saw commit.
    pub fn kill(&mut self, id: u64) {
        if let Some((mut child, out)) = self.running[id as usize].take() {
            let _ = child.kill();
            let _ = child.wait();
            self.seen[id as usize] += last_committed(&out);
        }
    }

    pub fn kill_all(&mut self) {
        (0..self.count).for_each(|id| self.kill(id));
    }

    /// Transfers the running clients saw commit so far.
    pub fn progress(&self) -> u64 {
        self.running
            .iter()
            .flatten()
            .map(|(_, out)| last_committed(out))
            .sum()
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The last "committed N" line a client printed (it prints only after a commit).
fn last_committed(out: &Path) -> u64 {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix("committed "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

pub fn bank(clients: u64) -> Bank {
    Bank {
        accounts: 1000,
        nodes: 4,
        initial_balance: 1000,
        clients,
    }
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

/// Everything that must hold once the cluster is healed and the clients are stopped.
pub async fn verify(local: &LocalCluster, clients: &Clients) -> Result<Cluster, Vec<String>> {
    let cluster = local
        .wait_ready(Duration::from_secs(60))
        .await
        .map_err(|e| vec![e.to_string()])?;
    wait_idle(&cluster, Duration::from_secs(20))
        .await
        .map_err(|e| vec![e])?;
    let audit = bank(clients.count)
        .audit(&cluster)
        .await
        .map_err(|e| vec![format!("audit: {e}")])?;
    let mut violations = Vec::new();
    if audit.total != 1000 * 1000 {
        violations.push(format!("money is not conserved: total {}", audit.total));
    }
    for id in 0..clients.count as usize {
        let (counter, seen) = (audit.counters[id], clients.seen[id]);
        if counter < seen {
            violations.push(format!(
                "client {id}: {seen} transfers seen committed but only {counter} recorded"
            ));
        }
        let in_flight = clients.incarnations[id] * TASKS;
        if counter > seen + in_flight {
            violations.push(format!(
                "client {id}: counter {counter} exceeds {seen} seen + {in_flight} in flight"
            ));
        }
    }
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

/// One terminator: kills its kind of process at intervals drawn from `every`.
#[derive(Clone, Copy, Debug)]
pub struct Terminator {
    pub every: (Duration, Duration),
}

#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub duration: Duration,
    pub clients: u64,
    pub nodes: Terminator,
    pub clients_killer: Terminator,
    pub manager: Terminator,
    pub seed: u64,
}

/// What a run did, for the report (Ji's Table 2: each fault, its configured interval, and how
/// often it actually happened).
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub node_kills: u64,
    pub client_kills: u64,
    pub manager_kills: u64,
    pub transfers_seen_committed: u64,
    pub log_peak_bytes: u64,
    pub log_after_bytes: u64,
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
        let rows = [
            (
                "kill -9 a memory node, restart it",
                interval(&cfg.nodes),
                self.node_kills,
            ),
            (
                "kill -9 a client process, restart it",
                interval(&cfg.clients_killer),
                self.client_kills,
            ),
            (
                "kill -9 the manager, restart it",
                interval(&cfg.manager),
                self.manager_kills,
            ),
            (
                "bank transfer (CAS or add), seen committed",
                format!("{} clients × {TASKS} tasks, continuous", cfg.clients),
                self.transfers_seen_committed,
            ),
        ];
        let mut out = format!(
            "{:<44} {:<28} {:>8}\n",
            "operation or fault", "configured", "done"
        );
        for (what, configured, done) in rows {
            out += &format!("{what:<44} {configured:<28} {done:>8}\n");
        }
        out += &format!(
            "redo logs: {} bytes at peak, {} after GC\n",
            self.log_peak_bytes, self.log_after_bytes
        );
        out
    }
}

fn draw(rng: &mut impl Rng, t: &Terminator) -> Duration {
    let (lo, hi) = (t.every.0.as_millis() as u64, t.every.1.as_millis() as u64);
    Duration::from_millis(rng.gen_range(lo..=hi.max(lo)))
}

/// Runs the terminators against a fresh 4-node `log` cluster in `dir`, heals, and verifies.
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
    let layout = crate::local::Layout {
        nodes: 4,
        mode: "log".into(),
        size_bytes: 64 << 20,
        node_flags: NODE_FLAGS.iter().map(|s| s.to_string()).collect(),
        manager_flags: vec![],
    };
    let mut local = LocalCluster::open(exe, dir, layout, true)?;
    local.start_all()?;
    rt.block_on(async {
        let cluster = local.wait_ready(Duration::from_secs(60)).await?;
        bank(cfg.clients)
            .init(&cluster)
            .await
            .map_err(|e| LocalError::Config(format!("bank init: {e}")))
    })?;
    let mut clients = Clients::new(exe, &local.file.manager, dir, cfg.clients);
    clients
        .start_all()
        .map_err(|e| LocalError::Config(format!("start clients: {e}")))?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    let mut report = ChaosReport::default();
    let start = Instant::now();
    let (mut next_node, mut next_client, mut next_manager) = (
        draw(&mut rng, &cfg.nodes),
        draw(&mut rng, &cfg.clients_killer),
        draw(&mut rng, &cfg.manager),
    );
    while start.elapsed() < cfg.duration {
        std::thread::sleep(Duration::from_millis(50));
        let now = start.elapsed();
        if now >= next_node {
            let node = rng.gen_range(1..=4);
            local.kill_node(node);
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..800)));
            local.start_node(node)?;
            report.node_kills += 1;
            next_node = now + draw(&mut rng, &cfg.nodes);
        }
        if now >= next_client {
            let id = rng.gen_range(0..cfg.clients);
            clients.kill(id);
            clients
                .start(id)
                .map_err(|e| LocalError::Config(format!("restart client: {e}")))?;
            report.client_kills += 1;
            next_client = now + draw(&mut rng, &cfg.clients_killer);
        }
        if now >= next_manager {
            local.kill_manager();
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..2000)));
            local.start_manager()?;
            report.manager_kills += 1;
            next_manager = now + draw(&mut rng, &cfg.manager);
        }
        if let Ok(Ok(cluster)) = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(2),
                local.wait_ready(Duration::from_secs(1)),
            )
            .await
        }) {
            report.log_peak_bytes = report.log_peak_bytes.max(rt.block_on(log_bytes(&cluster)));
        }
        progress(&format!(
            "{:>4.0} s: {} node kills, {} client kills, {} manager kills, {} transfers",
            now.as_secs_f64(),
            report.node_kills,
            report.client_kills,
            report.manager_kills,
            clients.progress() + clients.seen.iter().sum::<u64>()
        ));
    }
    clients.kill_all();
    report.transfers_seen_committed = clients.seen.iter().sum();
    rt.block_on(async {
        match verify(&local, &clients).await {
            Ok(cluster) => match wait_log_collected(&cluster, Duration::from_secs(45)).await {
                Ok(bytes) => report.log_after_bytes = bytes,
                Err(e) => report.violations.push(e),
            },
            Err(v) => report.violations.extend(v),
        }
    });
    local.stop_all();
    Ok(report)
}
