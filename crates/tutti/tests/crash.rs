//! Crash safety with real processes in `log` mode: client processes run bank transfers
//! while memory nodes, clients and the manager are killed with SIGKILL at random moments
//! and restarted. Afterwards nothing a client saw commit is lost, money is conserved, no
//! tid stays uncertain, no lock is held, and garbage collection shrinks the redo log.

mod common;

use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tutti::bank::Bank;
use tutti_client::Cluster;

const CLIENTS: u64 = 6;
const TASKS: u64 = 4;
const NODE_FLAGS: &[&str] = &[
    "--timeout-uncertain-ms",
    "1000",
    "--log-segment-bytes",
    "256K",
    "--checkpoint-interval-ms",
    "200",
];

fn bank() -> Bank {
    Bank {
        accounts: 1000,
        nodes: 4,
        initial_balance: 1000,
        clients: CLIENTS,
    }
}

/// Bank client processes; each client id has one process at a time and keeps, across its
/// incarnations, the number of transfers it saw commit.
struct Clients {
    manager: String,
    dir: PathBuf,
    running: Vec<Option<(Child, PathBuf)>>,
    seen: Vec<u64>,
    incarnations: Vec<u64>,
}

impl Clients {
    fn new(manager: &str, dir: &Path) -> Clients {
        Clients {
            manager: manager.into(),
            dir: dir.to_path_buf(),
            running: (0..CLIENTS).map(|_| None).collect(),
            seen: vec![0; CLIENTS as usize],
            incarnations: vec![0; CLIENTS as usize],
        }
    }

    fn start(&mut self, id: u64) {
        let i = id as usize;
        self.incarnations[i] += 1;
        let out = self
            .dir
            .join(format!("client-{id}-{}.out", self.incarnations[i]));
        let kind = if id.is_multiple_of(2) { "cas" } else { "add" };
        let child = Command::new(common::exe())
            .args([
                "workload",
                "--cluster",
                &self.manager,
                "--client-id",
                &id.to_string(),
                "--clients",
                &CLIENTS.to_string(),
            ])
            .args([
                "--tasks",
                &TASKS.to_string(),
                "--kind",
                kind,
                "--seconds",
                "600",
                "--deadline-ms",
                "30000",
            ])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.running[i] = Some((child, out));
    }

    fn kill(&mut self, id: u64) {
        if let Some((mut child, out)) = self.running[id as usize].take() {
            let _ = child.kill();
            let _ = child.wait();
            self.seen[id as usize] += last_committed(&out);
        }
    }

    fn kill_all(&mut self) {
        for id in 0..CLIENTS {
            self.kill(id);
        }
    }

    fn progress(&self) -> u64 {
        self.running
            .iter()
            .flatten()
            .map(|(_, out)| last_committed(out))
            .sum()
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

/// Everything that must hold once the cluster is healed.
async fn verify(c: &common::TestCluster, clients: &Clients) -> Cluster {
    let cluster = common::ready(c).await;
    common::assert_idle(&cluster, Duration::from_secs(20)).await;
    let audit = bank().audit(&cluster).await.unwrap();
    assert_eq!(audit.total, 1000 * 1000, "money is conserved");
    for id in 0..CLIENTS as usize {
        let (counter, seen) = (audit.counters[id], clients.seen[id]);
        assert!(
            counter >= seen,
            "client {id}: {seen} transfers seen committed but only {counter} recorded"
        );
        let in_flight = clients.incarnations[id] * TASKS;
        assert!(
            counter <= seen + in_flight,
            "client {id}: counter {counter} exceeds {seen} seen + {in_flight} in flight"
        );
    }
    eprintln!(
        "verified: counters {:?} >= seen {:?}",
        audit.counters, clients.seen
    );
    cluster
}

/// The redo logs shrink back once everything is applied everywhere: no live record, and no
/// segment left but each node's current one.
async fn assert_log_collected(cluster: &Cluster, peak: u64) {
    const SEGMENT_BYTES: u64 = 256 << 10;
    let until = Instant::now() + Duration::from_secs(45);
    loop {
        let stats: Vec<_> = cluster
            .stats()
            .await
            .into_iter()
            .map(|(_, s)| s.unwrap())
            .collect();
        let live: u64 = stats.iter().map(|s| s.log_records_live).sum();
        let bytes: u64 = stats.iter().map(|s| s.log_bytes).sum();
        if live == 0 && bytes <= SEGMENT_BYTES * stats.len() as u64 {
            eprintln!("log collected: {bytes} bytes on disk (peak {peak})");
            return;
        }
        assert!(
            Instant::now() < until,
            "log not collected: {live} live records, {bytes} bytes (peak {peak})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn log_bytes(cluster: &Cluster) -> u64 {
    cluster
        .stats()
        .await
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .map(|s| s.log_bytes)
        .sum()
}

/// A 4-node `log` cluster with the bank initialised, and no client started yet.
fn bank_cluster(rt: &tokio::runtime::Runtime, name: &str) -> (common::TestCluster, Clients) {
    let c = common::start(name, 4, "log", NODE_FLAGS, &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        bank().init(&cluster).await.unwrap();
    });
    let clients = Clients::new(&c.local.file.manager, &c.dir);
    (c, clients)
}

#[test]
fn random_kills_of_memory_nodes_and_clients_under_load() {
    let rt = common::runtime();
    let (mut c, mut clients) = bank_cluster(&rt, "crash-random");
    let seed: u64 = std::env::var("TUTTI_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("TUTTI_CRASH_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for id in 0..CLIENTS {
        clients.start(id);
    }
    let mut peak = 0;
    let (mut node_kills, mut client_kills) = (0, 0);
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.gen_range(200..1200)));
        if rng.gen_bool(0.5) {
            let node = rng.gen_range(1..=4);
            c.local.kill_node(node);
            node_kills += 1;
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..800)));
            c.local.start_node(node).unwrap();
        } else {
            let id = rng.gen_range(0..CLIENTS);
            clients.kill(id);
            client_kills += 1;
            clients.start(id);
        }
        if let Ok(cluster) = rt.block_on(c.local.wait_ready(Duration::from_secs(1))) {
            peak = peak.max(rt.block_on(log_bytes(&cluster)));
        }
    }
    let progress_before_stop = clients.progress();
    clients.kill_all();
    eprintln!("{node_kills} node kills, {client_kills} client kills; {progress_before_stop} transfers in live clients");
    rt.block_on(async {
        let cluster = verify(&c, &clients).await;
        assert!(
            clients.seen.iter().sum::<u64>() > 100,
            "the workload made progress: {:?}",
            clients.seen
        );
        peak = peak.max(log_bytes(&cluster).await);
        assert!(
            peak > 4 * (256 << 10),
            "the test wrote more log than GC keeps (peak {peak})"
        );
        assert_log_collected(&cluster, peak).await;
    });
    drop(c);
}

#[test]
fn every_memory_node_killed_at_once_and_restarted() {
    let rt = common::runtime();
    let (mut c, mut clients) = bank_cluster(&rt, "crash-all");
    for round in 0..3 {
        for id in 0..CLIENTS {
            clients.start(id);
        }
        std::thread::sleep(Duration::from_millis(2500));
        for node in 1..=4 {
            c.local.kill_node(node);
        }
        clients.kill_all();
        for node in 1..=4 {
            c.local.start_node(node).unwrap();
        }
        rt.block_on(verify(&c, &clients));
        eprintln!("round {round}: whole-cluster restart verified");
    }
    assert!(
        clients.seen.iter().sum::<u64>() > 100,
        "the workload made progress: {:?}",
        clients.seen
    );
}

#[test]
fn manager_killed_and_restarted_while_clients_work() {
    let rt = common::runtime();
    let (mut c, mut clients) = bank_cluster(&rt, "crash-manager");
    for id in 0..CLIENTS {
        clients.start(id);
    }
    std::thread::sleep(Duration::from_millis(1500));
    c.local.kill_manager();
    let before = clients.progress();
    std::thread::sleep(Duration::from_millis(2000));
    let during = clients.progress();
    assert!(during > before, "clients keep committing on their cached directory while the manager is down ({before} -> {during})");
    c.local.start_manager().unwrap();
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        assert_eq!(
            cluster.nodes().len(),
            4,
            "the directory survived the manager's crash"
        );
    });
    std::thread::sleep(Duration::from_millis(1500));
    clients.kill_all();
    rt.block_on(async {
        let cluster = verify(&c, &clients).await;
        let peak = log_bytes(&cluster).await;
        assert_log_collected(&cluster, peak).await;
    });
}
