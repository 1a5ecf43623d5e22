//! Helpers for cross-process tests: real `tutti` processes on loopback in scratch dirs.
#![allow(dead_code)]

use std::path::PathBuf;
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

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tutti-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A started cluster whose directory is removed when the test passes.
pub struct TestCluster {
    pub local: LocalCluster,
    pub dir: PathBuf,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.local.stop_all();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("cluster logs kept in {}", self.dir.join("logs").display());
        }
    }
}

pub fn start(
    name: &str,
    nodes: usize,
    mode: &str,
    node_flags: &[&str],
    manager_flags: &[&str],
) -> TestCluster {
    let dir = scratch(name);
    let layout = Layout {
        nodes,
        mode: mode.into(),
        size_bytes: 64 << 20,
        node_flags: node_flags.iter().map(|s| s.to_string()).collect(),
        manager_flags: manager_flags.iter().map(|s| s.to_string()).collect(),
    };
    let mut local = LocalCluster::open(&exe(), &dir, layout, true).expect("cluster dir");
    local.start_all().expect("start cluster");
    TestCluster { local, dir }
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
