//! Helpers for cross-process tests: real `tutti` processes on loopback in scratch dirs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;
use tutti_client::Cluster;
use tutti_harness::local::{Layout, LocalCluster};

pub fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tutti"))
}

/// The runtime a test drives its cluster with; enter it (`rt.enter()`) before starting
/// processes, which the supervisor starts as `tokio::process` children.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A scratch directory under the system's temporary directory: removed when the test
/// passes, kept (and its path printed) when it fails, for the logs in it.
pub struct Scratch(Option<tempfile::TempDir>);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.as_ref().expect("present until dropped").path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!("scratch directory kept: {}", dir.keep().display());
            }
        }
    }
}

pub fn scratch(name: &str) -> Scratch {
    let dir = tempfile::Builder::new()
        .prefix(&format!("tutti-test-{name}-"))
        .tempdir()
        .expect("a scratch directory");
    Scratch(Some(dir))
}

/// A started cluster whose directory is removed when the test passes.
pub struct TestCluster {
    pub local: LocalCluster,
    _scratch: Scratch,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.local.stop_all();
    }
}

pub fn start(
    name: &str,
    nodes: usize,
    mode: &str,
    node_flags: &[&str],
    manager_flags: &[&str],
) -> TestCluster {
    start_with_managers(name, nodes, 1, mode, node_flags, manager_flags)
}

/// `start`, with a Raft group of `managers` managers.
pub fn start_with_managers(
    name: &str,
    nodes: usize,
    managers: usize,
    mode: &str,
    node_flags: &[&str],
    manager_flags: &[&str],
) -> TestCluster {
    let dir = scratch(name);
    let layout = Layout {
        host: tutti_harness::local::LOOPBACK,
        nodes,
        managers,
        mode: mode.into(),
        size_bytes: 64 << 20,
        node_flags: node_flags.iter().map(|s| s.to_string()).collect(),
        manager_flags: manager_flags.iter().map(|s| s.to_string()).collect(),
    };
    let mut local = LocalCluster::open(&exe(), &dir, layout, true).expect("cluster dir");
    local.start_all().expect("start cluster");
    TestCluster {
        local,
        _scratch: dir,
    }
}

/// 4 nodes in `mode` under a group of 3 managers, the bank set up for `clients` clients:
/// the cluster, a client of it, the managers' ids and addresses, and the bank's client
/// processes, started.
pub fn bank_under_managers(
    rt: &tokio::runtime::Runtime,
    name: &str,
    mode: &str,
    clients: u64,
) -> (
    TestCluster,
    Cluster,
    Vec<(u64, String)>,
    tutti_harness::chaos::Clients,
) {
    let c = start_with_managers(name, 4, 3, mode, tutti_harness::chaos::NODE_FLAGS, &[]);
    let cluster = rt.block_on(async {
        let cluster = ready(&c).await;
        tutti_harness::workload::setup(&cluster, &tutti_harness::chaos::bank(clients))
            .await
            .unwrap();
        cluster
    });
    let managers = (c.local.file.manager_entries().into_iter())
        .map(|m| (m.id, m.addr))
        .collect();
    let mut processes =
        tutti_harness::chaos::Clients::new(&exe(), &c.local.file.manager, &c.local.dir, clients);
    processes.start_all().unwrap();
    (c, cluster, managers, processes)
}

pub async fn ready(c: &TestCluster) -> Cluster {
    c.local
        .wait_ready(Duration::from_secs(60))
        .await
        .expect("cluster ready")
}

/// Every node ends with no uncertain tid and no lock within `within` (decisions are one-way
/// messages, so the last ones may still be in flight when the workload returns).
pub async fn assert_idle(cluster: &Cluster, within: Duration) {
    if let Err(busy) = tutti_harness::chaos::wait_idle(cluster, within).await {
        panic!("{busy}");
    }
}

/// The chaos schedule's seed: `TUTTI_CRASH_SEED` to replay one, else random (printed).
pub fn chaos_seed() -> u64 {
    let seed = std::env::var("TUTTI_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("TUTTI_CRASH_SEED={seed}");
    seed
}

/// A terminator striking every `lo`–`hi` seconds.
pub fn secs(lo: f64, hi: f64) -> tutti_harness::chaos::Terminator {
    tutti_harness::chaos::Terminator {
        every: (Duration::from_secs_f64(lo), Duration::from_secs_f64(hi)),
    }
}

/// Runs `cfg` in `dir` and prints its table; every invariant must hold.
pub fn chaos(
    dir: &Path,
    cfg: &tutti_harness::chaos::ChaosConfig,
) -> tutti_harness::chaos::ChaosReport {
    let report =
        tutti_harness::chaos::run(&exe(), dir, cfg, |p| eprintln!("{p}")).expect("a chaos run");
    eprint!("{}", report.table(cfg));
    assert!(
        report.violations.is_empty(),
        "violations (logs in {}): {:#?}",
        dir.display(),
        report.violations
    );
    report
}

/// A log for objects' tests: 1 KiB slots over nodes 1–3, 30,000 of them each.
pub async fn tango_log(cluster: &Cluster, name: &str) -> tutti_log::Log {
    let shape = tutti_log::LogShape {
        nodes: vec![1, 2, 3],
        slot_bytes: 1024,
        capacity_bytes: 4096 + 30_000 * 1024,
        backpointers: 4,
    };
    tutti_log::Log::create(cluster, name, &shape, tutti_log::LogOptions::default())
        .await
        .expect("log created")
}

/// The log's and the objects' chaos schedule: 4 clients, memory nodes and clients killed
/// every 1–3 s, the manager every 6–10 s (twice within 20 s, so the tests' 25 s runs see two
/// kills even when the fault loop is held up), the sequencer every 1.5–4 s, a pair of
/// processes cut every 3–6 s for 0.5–3 s; the seed from `chaos_seed`.
pub fn log_chaos_config(
    workload: tutti_harness::chaos::ChaosWorkload,
    duration: Duration,
) -> tutti_harness::chaos::ChaosConfig {
    tutti_harness::chaos::ChaosConfig {
        duration,
        workload,
        clients: 4,
        mix: tutti_harness::chaos::Mix::TRANSFERS,
        nodes: secs(1.0, 3.0),
        clients_killer: secs(1.0, 3.0),
        manager: secs(6.0, 10.0),
        mode: "log".into(),
        failover_timeout_ms: None,
        lose_disks: false,
        managers: 1,
        backups: None,
        sequencer: secs(1.5, 4.0),
        partitions: Some((secs(3.0, 6.0), secs(0.5, 3.0))),
        linearizability_checker: tutti_harness::chaos::default_checker(),
        seed: chaos_seed(),
        credentials: Default::default(),
    }
}

/// A new cluster token in `dir`, as credentials for every process.
pub fn token(dir: &Path) -> tutti_wire::CredentialFiles {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("cluster.token");
    std::fs::write(&path, tutti_wire::ClusterToken::generate()).expect("write a token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    tutti_wire::CredentialFiles {
        token_file: Some(path),
        tls: None,
    }
}

/// The id of the manager that says it leads, if any.
pub async fn leader(addrs: &[(u64, String)]) -> Option<u64> {
    for (id, addr) in addrs {
        let Ok(Ok(conn)) = tokio::time::timeout(
            Duration::from_millis(300),
            tutti_wire::Connection::connect(addr, 1 << 20, &tutti_wire::Dialer::default()),
        )
        .await
        else {
            continue;
        };
        let answer = conn
            .call_within(
                &tutti_wire::Request::ManagerStatus,
                Duration::from_millis(500),
            )
            .await;
        if matches!(answer, Ok(tutti_wire::Response::ManagerStatus(s)) if s.role == "leader") {
            return Some(*id);
        }
    }
    None
}
