//! `tutti bench backup`: a consistent backup (docs/backup.md) of a `log` cluster holding data,
//! taken while the bank runs, against the same bank before and after it in the same run:
//! the throughput lost while it runs (goal: under 10 %), how long the nodes were fenced, the
//! backup's and the restore's times.

use rand::{RngCore, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_client::{Cluster, Minitx};
use tutti_harness::local::{Layout, LocalCluster, LOOPBACK};
use tutti_workload::Bank;

pub struct BackupBenchConfig {
    pub exe: PathBuf,
    pub scratch: PathBuf,
    pub nodes: u16,
    pub size_bytes: u64,
    /// Random bytes written on each node before the backup (beyond the bank's).
    pub data_bytes_per_node: u64,
    pub clients: u64,
    /// How long the bank's rate is measured before and after the backup.
    pub window: Duration,
    /// One backup at each of these `--max-rate`s, in bytes per second (0: unlimited).
    pub max_rates: Vec<u64>,
}

/// What one run measured.
#[derive(Serialize, Debug)]
pub struct BackupResult {
    pub nodes: u16,
    pub data_bytes_per_node: u64,
    pub clients: u64,
    pub max_bytes_per_s: Option<u64>,
    /// Bank operations per second before, during and after the backup.
    pub ops_per_s_before: f64,
    pub ops_per_s_during: f64,
    pub ops_per_s_after: f64,
    /// 1 − during / mean(before, after).
    pub throughput_lost: f64,
    pub goal_throughput_lost: f64,
    pub backup_ms: u64,
    pub fenced_ms: u64,
    pub copy_ms: u64,
    pub backup_mib_per_s: f64,
    pub stored_bytes: u64,
    pub restore_ms: u64,
}

/// The most throughput the backup may cost (the goal).
const GOAL_THROUGHPUT_LOST: f64 = 0.10;

pub async fn run(cfg: &BackupBenchConfig) -> Result<Vec<BackupResult>, String> {
    let layout = Layout {
        host: LOOPBACK,
        nodes: usize::from(cfg.nodes),
        managers: 1,
        mode: "log".into(),
        size_bytes: cfg.size_bytes,
        node_flags: vec![],
        manager_flags: vec![],
    };
    let dir = cfg.scratch.join("cluster");
    let mut local = LocalCluster::open(&cfg.exe, &dir, layout, true).map_err(|e| e.to_string())?;
    local.start_all().map_err(|e| e.to_string())?;
    let result = measure(cfg, &local).await;
    local.stop_all();
    result
}

async fn measure(
    cfg: &BackupBenchConfig,
    local: &LocalCluster,
) -> Result<Vec<BackupResult>, String> {
    let cluster = (local.wait_ready(Duration::from_secs(60)).await).map_err(|e| e.to_string())?;
    let bank = Bank::new(64 * u64::from(cfg.nodes), cfg.nodes, cfg.clients);
    let base = bank.bytes_per_node().div_ceil(1 << 20) << 20;
    if base + cfg.data_bytes_per_node > cfg.size_bytes {
        return Err("the data does not fit the nodes: raise --size or lower --data".into());
    }
    tutti_harness::workload::setup(&cluster, &bank)
        .await
        .map_err(|e| e.to_string())?;
    eprintln!(
        "bench: writing {} MiB on each of {} nodes",
        cfg.data_bytes_per_node >> 20,
        cfg.nodes
    );
    fill(&cluster, cfg, base).await?;

    let (stop, ops) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let load: Vec<_> = (0..cfg.clients)
        .map(|client| {
            let (cluster, stop, ops, mut bank) =
                (cluster.clone(), stop.clone(), ops.clone(), bank.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(client);
                while !stop.load(Ordering::Relaxed) {
                    let _ = tutti_harness::workload::run_op(&cluster, &mut bank, client, &mut rng)
                        .await;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut results = Vec::new();
    let mut failed = None;
    for (i, &max_rate) in cfg.max_rates.iter().enumerate() {
        let dest = cfg.scratch.join(format!("backup-{i}"));
        let max_bytes_per_s = (max_rate > 0).then_some(max_rate);
        match backup_under_load(cfg, &cluster, &ops, &dest, max_bytes_per_s).await {
            Ok(result) => {
                eprintln!(
                    "bench: {}",
                    serde_json::to_string(&result).unwrap_or_default()
                );
                results.push(result);
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&dest);
        let _ = std::fs::remove_dir_all(cfg.scratch.join("restored"));
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.map_err(|e| e.to_string())?;
    }
    failed.map_or(Ok(results), Err)
}

/// The bank's rate over `cfg.window`, during a backup into `dest`, and over `cfg.window`
/// again; then the backup restored.
async fn backup_under_load(
    cfg: &BackupBenchConfig,
    cluster: &Cluster,
    ops: &AtomicU64,
    dest: &std::path::Path,
    max_bytes_per_s: Option<u64>,
) -> Result<BackupResult, String> {
    let rate = |from: u64, since: Instant| {
        (ops.load(Ordering::Relaxed) - from) as f64 / since.elapsed().as_secs_f64()
    };
    let (from, since) = (ops.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(cfg.window).await;
    let before = rate(from, since);

    let opts = tutti_backup::CreateOptions {
        max_bytes_per_s,
        ..tutti_backup::CreateOptions::default()
    };
    let (from, since) = (ops.load(Ordering::Relaxed), Instant::now());
    let made = tutti_backup::create(cluster, dest, &opts).await;
    let (during, backup_ms) = (rate(from, since), since.elapsed().as_millis() as u64);
    let manifest = made.map_err(|e| e.to_string())?;

    let (from, since) = (ops.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(cfg.window).await;
    let after = rate(from, since);

    let started = Instant::now();
    tutti_backup::restore(dest, &cfg.scratch.join("restored")).map_err(|e| e.to_string())?;
    let restore_ms = started.elapsed().as_millis() as u64;
    let stored_bytes: u64 = manifest.nodes.iter().map(|n| n.data_bytes).sum();
    Ok(BackupResult {
        nodes: cfg.nodes,
        data_bytes_per_node: cfg.data_bytes_per_node,
        clients: cfg.clients,
        max_bytes_per_s,
        ops_per_s_before: before,
        ops_per_s_during: during,
        ops_per_s_after: after,
        throughput_lost: 1.0 - during / ((before + after) / 2.0),
        goal_throughput_lost: GOAL_THROUGHPUT_LOST,
        backup_ms,
        fenced_ms: manifest.fenced_ms,
        copy_ms: manifest.copy_ms,
        backup_mib_per_s: (stored_bytes as f64 / f64::from(1 << 20)) / (backup_ms as f64 / 1000.0),
        stored_bytes,
        restore_ms,
    })
}

/// Writes `data_bytes_per_node` of random bytes on every node from `base`, 8 MiB per
/// minitransaction.
async fn fill(cluster: &Cluster, cfg: &BackupBenchConfig, base: u64) -> Result<(), String> {
    const ITEM: u64 = 1 << 20;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for node in 1..=cfg.nodes {
        let mut addr = base;
        while addr < base + cfg.data_bytes_per_node {
            let mut tx = Minitx::new().class("bench-fill");
            for _ in 0..8 {
                if addr >= base + cfg.data_bytes_per_node {
                    break;
                }
                let len = ITEM.min(base + cfg.data_bytes_per_node - addr);
                let mut bytes = vec![0u8; len as usize];
                rng.fill_bytes(&mut bytes);
                tx = tx.write(node, addr, bytes);
                addr += len;
            }
            let outcome = cluster
                .exec_and_commit(&tx)
                .await
                .map_err(|e| e.to_string())?;
            if !outcome.committed {
                return Err("a fill did not commit".into());
            }
        }
    }
    Ok(())
}
