//! `tutti bench all`: the physical limits, Fig. 16 on tutti (`ram` and `log`, 1PC and 2PC)
//! and the same workload on every peer, in one run; writes `results/*.json` and
//! `RESULTS.md` (tables with the ratios to each peer and to the limits).

use super::cpu::{CpuMeter, CpuShare};
use super::driver::{closed_loop, Draw, Session};
use super::minitx::{run_minitx, Access, MinitxBench, MinitxKind};
use super::{limits, memory, peers, Point};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tutti_harness::local::{Layout, LocalCluster};

pub struct SuiteConfig {
    /// The `tutti` executable (memory nodes and managers are started from it).
    pub exe: PathBuf,
    /// Where `results/` and `RESULTS.md` go.
    pub out: PathBuf,
    /// Scratch data directories (removed afterwards).
    pub scratch: PathBuf,
    pub outstanding: Vec<usize>,
    /// Runs of each Fig. 16 system at `HEADLINE_OUTSTANDING` (the median is kept).
    pub headline_runs: usize,
    pub seconds_per_point: f64,
    pub items: u32,
    /// Skip the peers (Redis, PostgreSQL, etcd, SQLite).
    pub no_peers: bool,
}

/// The outstanding count the targets are read at. On a shared machine one run of a few
/// seconds can land in a slow spell, so Fig. 16 measures it `headline_runs` times per system.
pub const HEADLINE_OUTSTANDING: usize = 64;

impl SuiteConfig {
    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds_per_point)
    }

    /// Fig. 16's outstanding counts in the order each system runs them: the extra runs at
    /// `HEADLINE_OUTSTANDING` go before and after the sweep, apart in time.
    pub fn fig16_sweep(&self) -> Vec<usize> {
        let extra = if self.outstanding.contains(&HEADLINE_OUTSTANDING) {
            self.headline_runs.saturating_sub(1)
        } else {
            0
        };
        let before = extra.div_ceil(2);
        let again = |n| std::iter::repeat_n(HEADLINE_OUTSTANDING, n);
        again(before)
            .chain(self.outstanding.iter().copied())
            .chain(again(extra - before))
            .collect()
    }
}

/// Fig. 16 points measured more than once become their median run, with every run's
/// throughput in `runs`, where the middle run was measured; all other points stay as they are.
pub fn keep_median_runs(points: Vec<Point>) -> Vec<Point> {
    let key = |p: &Point| {
        (
            p.system.clone(),
            p.mode.clone(),
            p.nodes,
            p.spread,
            p.outstanding,
        )
    };
    let mut runs: HashMap<_, Vec<usize>> = HashMap::new();
    for (i, p) in points.iter().enumerate() {
        if p.experiment == "fig16" {
            runs.entry(key(p)).or_default().push(i);
        }
    }
    let mut medians: HashMap<usize, Point> = HashMap::new();
    for at in runs.into_values() {
        let mut same: Vec<&Point> = at.iter().map(|&i| &points[i]).collect();
        same.sort_by(|a, b| a.throughput_per_s.total_cmp(&b.throughput_per_s));
        let mut median = same[same.len() / 2].clone();
        if at.len() > 1 {
            median.runs = at.iter().map(|&i| points[i].throughput_per_s).collect();
        }
        medians.insert(at[at.len() / 2], median);
    }
    points
        .into_iter()
        .enumerate()
        .filter_map(|(i, p)| {
            if p.experiment == "fig16" {
                medians.remove(&i)
            } else {
                Some(p)
            }
        })
        .collect()
}

/// A local tutti cluster whose data is removed when dropped.
pub struct ScratchCluster {
    local: LocalCluster,
    dir: PathBuf,
    pub cluster: tutti_client::Cluster,
}

impl Drop for ScratchCluster {
    fn drop(&mut self) {
        self.local.stop_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl ScratchCluster {
    /// Its data directory, which `--cluster` takes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its processes that run (name, pid).
    pub fn processes(&self) -> Vec<(String, u32)> {
        (self.local.process_entries(&BTreeMap::new()).into_iter())
            .filter_map(|e| Some((e.name, e.pid?)))
            .collect()
    }

    pub async fn start(exe: &Path, dir: PathBuf, nodes: usize, mode: &str) -> Result<Self, String> {
        Self::start_sized(exe, dir, nodes, mode, 256 << 20).await
    }

    /// `start` with nodes of `size_bytes` each (sparse on disk).
    pub async fn start_sized(
        exe: &Path,
        dir: PathBuf,
        nodes: usize,
        mode: &str,
        size_bytes: u64,
    ) -> Result<Self, String> {
        let _ = std::fs::remove_dir_all(&dir);
        let layout = Layout {
            host: tutti_harness::local::LOOPBACK,
            nodes,
            managers: 1,
            mode: mode.into(),
            size_bytes,
            node_flags: vec![],
            manager_flags: vec![],
        };
        let mut local = LocalCluster::open(exe, &dir, layout, true).map_err(|e| e.to_string())?;
        local.start_all().map_err(|e| e.to_string())?;
        // Measured replicated, not while a mirror is still joining.
        let cluster = match local.wait_up(Duration::from_secs(60)).await {
            Ok(c) => c,
            Err(e) => {
                local.stop_all();
                return Err(e.to_string());
            }
        };
        Ok(ScratchCluster {
            local,
            dir,
            cluster,
        })
    }
}

/// Runs every experiment; `progress` sees each point as it is measured.
pub async fn run(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = physical_limits(&cfg.scratch, cfg.duration(), progress).await?;
    points.extend(fig16_on_tutti(cfg, &["ram", "log"], progress).await?);
    points.extend(memory_use(cfg, progress).await?);
    points.extend(breakdown(cfg, progress).await?);
    points.extend(scalability(cfg, progress).await?);
    points.extend(contention(cfg, progress).await?);
    if !cfg.no_peers {
        points.extend(run_peers(cfg, progress).await?);
    }
    Ok(keep_median_runs(points))
}

/// Fig. 16's minitransactions (3 increments over `cfg.items` items per node) on nodes
/// 1..=`nodes`, each over `spread` of them, at each of `outstanding`.
fn fig16_bench(
    cfg: &SuiteConfig,
    experiment: &str,
    mode: &str,
    nodes: u16,
    spread: usize,
    outstanding: Vec<usize>,
) -> MinitxBench {
    MinitxBench {
        nodes: (1..=nodes).collect(),
        spread,
        items_per_node: u64::from(cfg.items),
        ops_per_minitx: 3,
        kind: MinitxKind::Increment,
        access: Access::Combined,
        outstanding,
        duration: cfg.duration(),
        mode: mode.into(),
        experiment: experiment.into(),
    }
}

/// Fig. 16 on scratch tutti clusters in each of `modes`: 1 node (one phase), then 4 nodes
/// with each minitransaction over two.
async fn fig16_on_tutti(
    cfg: &SuiteConfig,
    modes: &[&str],
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    for &mode in modes {
        for (nodes, spread) in [(1u16, 1usize), (4, 2)] {
            let dir = cfg.scratch.join(format!("tutti-{mode}-{nodes}"));
            let c = ScratchCluster::start(&cfg.exe, dir, nodes as usize, mode).await?;
            let b = fig16_bench(cfg, "fig16", mode, nodes, spread, cfg.fig16_sweep());
            points.extend(run_minitx(&c.cluster, &b, &mut *progress).await?);
        }
    }
    Ok(points)
}

/// The loopback round trip (1 and 16 connections) and the fdatasync limits, measured in
/// `scratch` (on the disk the systems' data goes to) for `duration` each.
pub async fn physical_limits(
    scratch: &Path,
    duration: Duration,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let mut points = Vec::new();
    for connections in [1, 16] {
        let p = limits::loopback(connections, duration)
            .await
            .map_err(|e| format!("loopback limit: {e}"))?;
        progress(&p);
        points.push(p);
    }
    for p in limits::fdatasync(scratch, duration).map_err(|e| format!("fdatasync limit: {e}"))? {
        progress(&p);
        points.push(p);
    }
    Ok(points)
}

/// Points that do not depend on the outstanding counts: 5 limits, memory (6), Fig. 17 (16),
/// Fig. 18 (8), Fig. 19 (4), Fig. 20 (18).
pub const FIXED_POINTS: usize = 5
    + 2
    + MEMORY_LOG_ROUNDS
    + BREAKDOWN_WORKLOADS.len() * 4
    + 2 * SIZES.len()
    + SIZES.len()
    + 3 * CONTENTION_ITEMS.len();

/// Bytes written to one `ram` node, of the scratch cluster's 256 MiB.
const MEMORY_RAM_WRITTEN: u64 = 192 << 20;
/// Rounds of Fig. 16's 1PC load on one `log` node, its memory read after each.
const MEMORY_LOG_ROUNDS: usize = 4;

/// The memory targets: one `ram` node before and after `MEMORY_RAM_WRITTEN` bytes are
/// written to it, and one `log` node as its log takes `MEMORY_LOG_ROUNDS` rounds of load.
async fn memory_use(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    {
        let c =
            ScratchCluster::start(&cfg.exe, cfg.scratch.join("tutti-memory-ram"), 1, "ram").await?;
        for p in memory::ram(&c.cluster, 1, MEMORY_RAM_WRITTEN).await? {
            progress(&p);
            points.push(p);
        }
    }
    let c = ScratchCluster::start(&cfg.exe, cfg.scratch.join("tutti-memory-log"), 1, "log").await?;
    let b = cfg.scaling_point("memory", "log", 1);
    points.extend(memory::log(&c.cluster, &b, MEMORY_LOG_ROUNDS, progress).await?);
    Ok(points)
}

/// Fig. 17's workloads: (name, minitransaction items, read-write).
const BREAKDOWN_WORKLOADS: [(&str, usize, bool); 4] = [
    ("rw6", 6, true),
    ("rw50", 50, true),
    ("ro6", 6, false),
    ("ro50", 50, false),
];

/// Fig. 17: the same items executed by Systems A–D on 4 `log` nodes. Read-write
/// minitransactions are compare-and-swaps of the same value (always succeed); read-only
/// ones compares only. A–C spread items over every node; D puts them on one node (1PC).
async fn breakdown(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    let c = ScratchCluster::start(&cfg.exe, cfg.scratch.join("tutti-breakdown"), 4, "log").await?;
    for (workload, items, read_write) in BREAKDOWN_WORKLOADS {
        let (ops, kind) = if read_write {
            (items / 2, MinitxKind::SameValue)
        } else {
            (items, MinitxKind::CompareOnly)
        };
        for (variant, access, spread) in [
            ("A", Access::PerItem, ops.min(4)),
            ("B", Access::Batched, ops.min(4)),
            ("C", Access::Combined, ops.min(4)),
            ("D", Access::Combined, 1),
        ] {
            let b = MinitxBench {
                spread,
                ops_per_minitx: ops,
                kind,
                access,
                ..cfg.scaling_point("fig17", "log", 4)
            };
            points.extend(
                measure(&c, &b, progress, |p| {
                    p.operation = Some(workload.into());
                    p.variant = Some(variant.into());
                })
                .await?,
            );
        }
    }
    Ok(points)
}

/// Outstanding minitransactions for Fig. 17–20 (the paper: 32 threads per application node).
const SCALING_OUTSTANDING: usize = 64;

impl SuiteConfig {
    /// One point of Fig. 17–20 on memory nodes `1..=nodes`: 3 compare-and-swaps (increments)
    /// inside the commit protocol at `SCALING_OUTSTANDING`, spread 1; callers change the rest.
    fn scaling_point(&self, experiment: &str, mode: &str, nodes: u16) -> MinitxBench {
        MinitxBench {
            nodes: (1..=nodes).collect(),
            spread: 1,
            items_per_node: u64::from(self.items),
            ops_per_minitx: 3,
            kind: MinitxKind::Increment,
            access: Access::Combined,
            outstanding: vec![SCALING_OUTSTANDING],
            duration: self.duration(),
            mode: mode.into(),
            experiment: experiment.into(),
        }
    }
}

/// Runs `b` on `c`, then labels each point with `label` and reports it.
async fn measure(
    c: &ScratchCluster,
    b: &MinitxBench,
    progress: &mut dyn FnMut(&Point),
    label: impl Fn(&mut Point),
) -> Result<Vec<Point>, String> {
    let mut measured = run_minitx(&c.cluster, b, |_| {}).await?;
    for p in &mut measured {
        label(p);
        progress(p);
    }
    Ok(measured)
}
/// System sizes (memory nodes) of Fig. 18 and 19 on this machine.
const SIZES: [u16; 4] = [1, 2, 4, 8];

/// Fig. 18's sizes in `tutti bench repl`: a replicated node is two processes, and 8 of them
/// (16 processes) on this machine's 2 cores would measure the scheduler.
const REPLICATION_SIZES: [u16; 3] = [1, 2, 4];

/// Fig. 18 (3 CAS, spread 2, `ram` and `log`) and Fig. 19 (16 CAS, spread = every node,
/// `log`) at 1, 2, 4 and 8 memory nodes.
async fn scalability(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    scaling(cfg, &["ram", "log"], &SIZES, true, progress).await
}

/// Fig. 18 in each of `modes` at each of `sizes` memory nodes, and with `fig19` Fig. 19 in
/// `log` mode.
async fn scaling(
    cfg: &SuiteConfig,
    modes: &[&str],
    sizes: &[u16],
    fig19: bool,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    for &mode in modes {
        for &nodes in sizes {
            let dir = cfg.scratch.join(format!("tutti-scaling-{mode}-{nodes}"));
            let c = ScratchCluster::start(&cfg.exe, dir, nodes as usize, mode).await?;
            let mut runs = vec![("fig18", 3, usize::from(nodes).min(2))];
            if fig19 && mode == "log" {
                runs.push(("fig19", 16, usize::from(nodes)));
            }
            for (experiment, cas, spread) in runs {
                let b = MinitxBench {
                    spread,
                    ops_per_minitx: cas,
                    ..cfg.scaling_point(experiment, mode, nodes)
                };
                points.extend(measure(&c, &b, progress, |_| {}).await?);
            }
        }
    }
    Ok(points)
}

/// Item-set sizes of Fig. 20 (over 4 nodes): pairwise overlap from about 0.001 to 0.9.
const CONTENTION_ITEMS: [u64; 6] = [65_536, 8_192, 1_024, 256, 64, 32];

/// The probability that two minitransactions of `k` items drawn from `n` share one, as the
/// paper computes it: 1 - C(n-k, k) / C(n, k).
pub fn overlap(n: u64, k: u64) -> f64 {
    1.0 - (0..k)
        .map(|i| (n - k - i) as f64 / (n - i) as f64)
        .product::<f64>()
}

/// Fig. 20: 8 operations per minitransaction, spread 2, 4 `log` nodes, the item set
/// shrinking; compare-and-swaps of the same value (`cas`), optimistic increments (`inc`)
/// and `add` items (`add`).
async fn contention(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    let c = ScratchCluster::start(&cfg.exe, cfg.scratch.join("tutti-contention"), 4, "log").await?;
    for items in CONTENTION_ITEMS {
        for (operation, kind) in [
            ("cas", MinitxKind::SameValue),
            ("inc", MinitxKind::Increment),
            ("add", MinitxKind::Add),
        ] {
            let b = MinitxBench {
                spread: 2,
                items_per_node: items / 4,
                ops_per_minitx: 8,
                kind,
                ..cfg.scaling_point("fig20", "log", 4)
            };
            points.extend(
                measure(&c, &b, progress, |p| {
                    p.items = Some(items);
                    p.overlap = Some((overlap(items, 8) * 1000.0).round() / 1000.0);
                    p.operation = Some(operation.into());
                })
                .await?,
            );
        }
    }
    Ok(points)
}

/// Fig. 16 at `HEADLINE_OUTSTANDING` on one node in each of `modes`, on a cluster of its
/// own, with the CPU time each process took: measured between the ends of two runs, so
/// that loading the items and opening the connections fall outside.
async fn cpu_shares(
    cfg: &SuiteConfig,
    modes: &[&str],
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<CpuShare>, String> {
    let mut shares = Vec::new();
    for &mode in modes {
        let dir = cfg.scratch.join(format!("tutti-cpu-{mode}"));
        let c = ScratchCluster::start(&cfg.exe, dir, 1, mode).await?;
        let meter = CpuMeter::new(c.processes());
        let b = fig16_bench(cfg, "cpu", mode, 1, 1, vec![HEADLINE_OUTSTANDING; 2]);
        let mut samples = Vec::new();
        let measured = |p: &Point| {
            samples.push(meter.sample());
            progress(p);
        };
        let points = run_minitx(&c.cluster, &b, measured).await?;
        let (Some(p), [before, after]) = (points.last(), &samples[..]) else {
            return Err(format!("cpu {mode}: {} runs measured, not 2", points.len()));
        };
        let minitxs = p.committed + p.compare_failed;
        let us_per_minitx = (meter.share(before, after, minitxs))
            .ok_or_else(|| format!("cpu {mode}: a process went away during the run"))?;
        shares.push(CpuShare {
            mode: mode.into(),
            nodes: 1,
            outstanding: HEADLINE_OUTSTANDING,
            throughput_per_s: p.throughput_per_s,
            us_per_minitx,
            busy_cores: meter.busy_cores(before, after),
        });
    }
    Ok(shares)
}

/// What `replication` compares, at `HEADLINE_OUTSTANDING`.
#[derive(serde::Serialize, Debug)]
pub struct ReplicationSummary {
    /// `log-repl` over `log` (1 node, one phase; 4 nodes, two phases): target ≥ 0.7.
    pub log_repl_vs_log_1pc: f64,
    pub log_repl_vs_log_2pc: f64,
    /// `ram-repl` over `ram`, the same two layouts: target ≥ 0.7.
    pub ram_repl_vs_ram_1pc: f64,
    pub ram_repl_vs_ram_2pc: f64,
    /// `log-repl` (1 node) over etcd with one member: target ≥ 10.
    pub log_repl_vs_etcd: f64,
    pub targets_met: bool,
    /// Where the CPU goes in each mode on one node, at `HEADLINE_OUTSTANDING`, on `cores`
    /// cores shared by every process.
    pub cpu: Vec<CpuShare>,
    pub cores: usize,
}

/// Fig. 16 (3 compare-and-swaps per minitransaction) in `log`, `log-repl`, `ram` and
/// `ram-repl` mode, on one node and on four with each minitransaction over two, Fig. 18 in
/// the four modes at 1, 2 and 4 nodes, then Fig. 16 on etcd (one member), in one run; with
/// the Fig. 16 ratios at `HEADLINE_OUTSTANDING` against issue 18's targets, and each mode's
/// CPU time per minitransaction by process on 1 node (`cpu_shares`).
pub async fn replication(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<(Vec<Point>, ReplicationSummary), String> {
    let modes = ["log", "log-repl", "ram", "ram-repl"];
    let mut points = fig16_on_tutti(cfg, &modes, progress).await?;
    points.extend(scaling(cfg, &modes, &REPLICATION_SIZES, false, progress).await?);
    let cpu = cpu_shares(cfg, &modes, progress).await?;
    {
        let (_daemon, session) = peers::etcd(&cfg.scratch, cfg.items).await?;
        let open = || {
            let s = session.clone();
            async move { Ok(s) }
        };
        points.extend(peer_fig16(cfg, "etcd", "fsync", open, progress).await?);
    }
    let points = keep_median_runs(points);
    let at = |system: &str, mode: &str, nodes: usize| {
        find(&points, system, mode, nodes, HEADLINE_OUTSTANDING).map_or(0.0, |p| p.throughput_per_s)
    };
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            (a / b * 100.0).round() / 100.0
        } else {
            0.0
        }
    };
    let repl_1pc = at("tutti", "log-repl", 1);
    let summary = ReplicationSummary {
        log_repl_vs_log_1pc: ratio(repl_1pc, at("tutti", "log", 1)),
        log_repl_vs_log_2pc: ratio(at("tutti", "log-repl", 4), at("tutti", "log", 4)),
        ram_repl_vs_ram_1pc: ratio(at("tutti", "ram-repl", 1), at("tutti", "ram", 1)),
        ram_repl_vs_ram_2pc: ratio(at("tutti", "ram-repl", 4), at("tutti", "ram", 4)),
        log_repl_vs_etcd: ratio(repl_1pc, at("etcd", "fsync", 1)),
        targets_met: false,
        cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let targets_met = summary.log_repl_vs_log_1pc >= 0.7
        && summary.log_repl_vs_log_2pc >= 0.7
        && summary.ram_repl_vs_ram_1pc >= 0.7
        && summary.ram_repl_vs_ram_2pc >= 0.7
        && summary.log_repl_vs_etcd >= 10.0;
    Ok((
        points,
        ReplicationSummary {
            targets_met,
            ..summary
        },
    ))
}

/// Fig. 16 on the peers, one system and mode at a time.
async fn run_peers(
    cfg: &SuiteConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let (root, items) = (&cfg.scratch, cfg.items);
    let mut points = Vec::new();
    for mode in ["none", "always"] {
        let (_daemon, sessions) = peers::redis(root, mode, items).await?;
        let opened = std::cell::Cell::new(0);
        let open = || {
            let s = sessions[opened.get() % sessions.len()].clone();
            opened.set(opened.get() + 1);
            async move { Ok(s) }
        };
        points.extend(peer_fig16(cfg, "redis", mode, open, progress).await?);
    }
    for mode in ["off", "on"] {
        let (_daemon, port) = peers::postgres(root, mode, items).await?;
        let open = || peers::postgres_session(port);
        points.extend(peer_fig16(cfg, "postgres", mode, open, progress).await?);
    }
    {
        let (_daemon, session) = peers::etcd(root, items).await?;
        let open = || {
            let s = session.clone();
            async move { Ok(s) }
        };
        points.extend(peer_fig16(cfg, "etcd", "fsync", open, progress).await?);
    }
    {
        let (dir, session) = peers::sqlite(root, items)?;
        let open = || {
            let s = session.clone();
            async move { Ok(s) }
        };
        let result = peer_fig16(cfg, "embedded", "sync", open, progress).await;
        let _ = std::fs::remove_dir_all(dir);
        points.extend(result?);
    }
    Ok(points)
}

/// One peer's Fig. 16 sweep, by the closed loop tutti is measured by: 3 compare-and-swaps
/// of `cfg.items` items.
async fn peer_fig16<S: Session, F: Future<Output = Result<S, String>>>(
    cfg: &SuiteConfig,
    system: &str,
    mode: &str,
    open: impl FnMut() -> F,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let draw = Draw {
        groups: 1,
        items_per_group: u64::from(cfg.items),
        spread: 1,
        swaps: 3,
        increment: true,
    };
    let label = Point::new("fig16", system, mode, 1, 1, 0);
    let (outstanding, duration) = (cfg.fig16_sweep(), cfg.duration());
    closed_loop(&label, draw, &outstanding, duration, open, progress).await
}

/// Draws `out/fig*.png` with `bench/plot.py` (matplotlib, installed with pip if missing).
pub fn plot(out: &Path) -> Result<(), String> {
    let script = tutti_harness::source_tree().join("bench/plot.py");
    let has_matplotlib = std::process::Command::new("python3")
        .args(["-c", "import matplotlib"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_matplotlib {
        let installed = std::process::Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--user", "matplotlib"])
            .status()
            .map_err(|e| format!("python3 -m pip: {e}"))?;
        if !installed.success() {
            return Err("installing matplotlib with pip failed".into());
        }
    }
    let status = std::process::Command::new("python3")
        .arg(&script)
        .arg(out)
        .status()
        .map_err(|e| format!("python3 {}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", script.display()))
    }
}

/// Writes one JSON file per experiment under `out/results/` and `out/RESULTS.md` (keeping
/// the sections other suites wrote there: `tutti bench log`, `objects`, `fs`, `repl`).
pub fn write(cfg: &SuiteConfig, points: &[Point], command: &str) -> Result<(), String> {
    let results = cfg.out.join("results");
    std::fs::create_dir_all(&results).map_err(|e| format!("{}: {e}", results.display()))?;
    let mut by_experiment: BTreeMap<&str, Vec<&Point>> = BTreeMap::new();
    for p in points {
        by_experiment.entry(&p.experiment).or_default().push(p);
    }
    for (experiment, ps) in &by_experiment {
        let path = results.join(format!("{experiment}.json"));
        let json = serde_json::to_string_pretty(ps).expect("points serialise");
        std::fs::write(&path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let mut md = results_md(cfg, points, command);
    let path = cfg.out.join("RESULTS.md");
    // The other suites' sections come from their own runs: kept as they are.
    let before = std::fs::read_to_string(&path).unwrap_or_default();
    for (begin, end) in crate::SUITE_SECTIONS {
        if let Some(section) = crate::log::section_between(&before, begin, end) {
            md = crate::log::splice_between(&md, begin, end, section);
        }
    }
    std::fs::write(&path, md).map_err(|e| format!("{}: {e}", path.display()))
}

/// A line of Fig. 16: (system, mode, nodes).
type Series = (&'static str, &'static str, usize);

pub(crate) fn find<'a>(
    points: &'a [Point],
    system: &str,
    mode: &str,
    nodes: usize,
    outstanding: usize,
) -> Option<&'a Point> {
    points.iter().find(|p| {
        p.experiment == "fig16"
            && p.system == system
            && p.mode == mode
            && p.nodes == nodes
            && p.outstanding == outstanding
    })
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or("?".into(), |kb| format!("{} GiB", kb >> 20));
    format!("{cores} cores ({cpu}), {mem} RAM, Linux; clients, servers and peers all on this one machine over loopback")
}

/// A Markdown table's header row and its separator.
fn table_header<S: std::fmt::Display>(md: &mut String, columns: impl IntoIterator<Item = S>) {
    let columns: Vec<String> = columns.into_iter().map(|c| c.to_string()).collect();
    let _ = writeln!(
        md,
        "| {} |\n|{}",
        columns.join(" | "),
        " --- |".repeat(columns.len())
    );
}

fn memory_md(md: &mut String, points: &[Point]) {
    let memory: Vec<&Point> = points.iter().filter(|p| p.experiment == "memory").collect();
    if memory.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Memory\n\nOne memory node's resident set (`rss_bytes` in `tutti stats`), read at a heartbeat after each step. Targets: a `ram` node within the bytes written to it plus {} MiB; a `log` node flat while its log takes more records, here within {} MiB of its reading after the first round of Fig. 16's 1PC load at {SCALING_OUTSTANDING} outstanding.\n",
        memory::RAM_HEADROOM_BYTES >> 20,
        memory::LOG_SLACK_BYTES >> 20
    );
    table_header(md, ["node", "after", "resident MiB", "limit MiB", "within"]);
    let mib = |b: Option<u64>| b.map_or("–".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
    for p in memory {
        let after = match (p.written_bytes, p.log_records) {
            (Some(w), _) => format!("{} MiB written", w >> 20),
            (_, Some(r)) => format!("{r} records appended"),
            _ => "–".into(),
        };
        let within = match (p.rss_bytes, p.limit_bytes) {
            (Some(r), Some(l)) if r <= l => "yes",
            (Some(_), Some(_)) => "**no**",
            _ => "–",
        };
        let _ = writeln!(
            md,
            "| {} | {after} | {} | {} | {within} |",
            p.mode,
            mib(p.rss_bytes),
            mib(p.limit_bytes)
        );
    }
}

fn breakdown_md(md: &mut String, points: &[Point]) {
    if !points.iter().any(|p| p.experiment == "fig17") {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Fig. 17: where the speed comes from\n\n![Fig. 17](fig17.png)\n\nThe same items on 4 `log` nodes, {SCALING_OUTSTANDING} outstanding, in minitransactions/s. A: each item executed and locked at its node with a request of its own (`ExecuteAhead`), one after the other, then 2PC; B: the same with one request per node carrying all its items, all nodes at once, then 2PC; in both the locks last until the decision. C: items executed inside 2PC's first phase (tutti's multi-node path); D: the same on one node, in one phase (tutti's one-node path). rw = compare-and-swaps (6 or 50 items = 3 or 25 swaps), ro = compares only.\n"
    );
    table_header(md, ["workload", "A", "B", "C", "D", "B/A", "C/B", "D/C"]);
    for (workload, _, _) in BREAKDOWN_WORKLOADS {
        let t = |v: &str| {
            points
                .iter()
                .find(|p| {
                    p.experiment == "fig17"
                        && p.operation.as_deref() == Some(workload)
                        && p.variant.as_deref() == Some(v)
                })
                .map(|p| p.throughput_per_s)
        };
        let [a, b, c, d] = ["A", "B", "C", "D"].map(t);
        let num = |x: Option<f64>| x.map_or("–".into(), |x| format!("{x:.0}"));
        let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
            (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
            _ => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {workload} | {} | {} | {} | {} | {} | {} | {} |",
            num(a),
            num(b),
            num(c),
            num(d),
            ratio(b, a),
            ratio(c, b),
            ratio(d, c)
        );
    }
}

fn scaling_md(md: &mut String, points: &[Point]) {
    let lines: [(&str, &str, &str); 3] = [
        ("fig18", "ram", "Fig. 18 ram: 3 CAS, spread 2"),
        ("fig18", "log", "Fig. 18 log: 3 CAS, spread 2"),
        ("fig19", "log", "Fig. 19 log: 16 CAS, spread = all nodes"),
    ];
    if !points.iter().any(|p| p.experiment == "fig18") {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Fig. 18 and 19: scalability\n\n![Fig. 18](fig18.png) ![Fig. 19](fig19.png)\n\nThroughput (minitransactions/s) at {SCALING_OUTSTANDING} outstanding as memory nodes are added, and the paper's scalability efficiency from each size to the next (target/base throughput ÷ target/base size). All memory nodes share this machine's 2 cores with the client, so adding nodes adds no CPU: efficiency here measures the protocol's overhead per node, not the scaling a cluster of machines would see.\n"
    );
    table_header(
        md,
        std::iter::once("line".to_string()).chain(SIZES.iter().map(|n| format!("{n} node(s)"))),
    );
    for (experiment, mode, name) in lines {
        let tput: Vec<Option<f64>> = SIZES
            .iter()
            .map(|&n| {
                points
                    .iter()
                    .find(|p| {
                        p.experiment == experiment && p.mode == mode && p.nodes == usize::from(n)
                    })
                    .map(|p| p.throughput_per_s)
            })
            .collect();
        let cells: Vec<String> = tput
            .iter()
            .enumerate()
            .map(|(i, t)| match (t, i.checked_sub(1).and_then(|j| tput[j])) {
                (Some(t), Some(base)) if base > 0.0 => {
                    let eff = (t / base) / (f64::from(SIZES[i]) / f64::from(SIZES[i - 1]));
                    format!("{t:.0} (eff. {eff:.2})")
                }
                (Some(t), _) => format!("{t:.0}"),
                (None, _) => "–".into(),
            })
            .collect();
        let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
    }
}

fn contention_md(md: &mut String, points: &[Point]) {
    if !points.iter().any(|p| p.experiment == "fig20") {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Fig. 20: contention\n\n![Fig. 20](fig20.png)\n\n8 operations per minitransaction, spread 2, 4 `log` nodes, {SCALING_OUTSTANDING} outstanding; throughput in committed minitransactions/s (compare failures of `inc` are retried after a refresh and not counted).\n"
    );
    table_header(
        md,
        [
            "items",
            "overlap",
            "cas (same value)",
            "inc (optimistic)",
            "add",
        ],
    );
    for items in CONTENTION_ITEMS {
        let cell = |op: &str| {
            points
                .iter()
                .find(|p| {
                    p.experiment == "fig20"
                        && p.items == Some(items)
                        && p.operation.as_deref() == Some(op)
                })
                .map_or("–".into(), |p| format!("{:.0}", p.throughput_per_s))
        };
        let _ = writeln!(
            md,
            "| {items} | {:.3} | {} | {} | {} |",
            overlap(items, 8),
            cell("cas"),
            cell("inc"),
            cell("add")
        );
    }
}

fn results_md(cfg: &SuiteConfig, points: &[Point], command: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# tutti benchmark results\n");
    let _ = writeln!(
        md,
        "Generated by `{command}`; every number below was measured in that one run.\n"
    );
    let _ = writeln!(md, "- Machine: {}", machine());
    let _ = writeln!(
        md,
        "- {} s per point, items drawn uniformly from {} per node; raw records in `results/*.json`.\n",
        cfg.seconds_per_point, cfg.items
    );
    limits_md(&mut md, points);
    fig16_md(&mut md, cfg, points);
    tail_md(&mut md, points);
    ratios_md(&mut md, cfg, points);
    memory_md(&mut md, points);
    breakdown_md(&mut md, points);
    scaling_md(&mut md, points);
    contention_md(&mut md, points);
    against_limits_md(&mut md, points);
    let _ = writeln!(
        md,
        "\n## Reproduce\n\n```sh\ncargo build --release -p tutti --features bench\n{command}\n```"
    );
    let _ = writeln!(
        md,
        "\nThe bench installs `redis-server` and `etcd-server` with apt-get if missing, starts every server on 127.0.0.1 with a scratch data directory, and stops it by its PID. The machine has 2 cores shared by the client, the servers and the peers: absolute numbers are bounded by that; compare ratios within one run."
    );
    md
}

/// The limit point of `mode` at `outstanding`.
fn limit<'a>(points: &'a [Point], mode: &str, outstanding: usize) -> Option<&'a Point> {
    points
        .iter()
        .find(|p| p.experiment == "limits" && p.mode == mode && p.outstanding == outstanding)
}

fn limits_md(md: &mut String, points: &[Point]) {
    let _ = writeln!(md, "## Physical limits\n");
    table_header(
        md,
        [
            "limit",
            "outstanding",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
        ],
    );
    for p in points.iter().filter(|p| p.experiment == "limits") {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {} | {} | {} |",
            p.mode, p.outstanding, p.throughput_per_s, p.p50_us, p.p99_us, p.p999_us, p.max_us
        );
    }
}

/// The tail of tutti's Fig. 16 at the headline count, against its targets and against the
/// tail of the limits measured in the same run (the disk's own stalls show there).
fn tail_md(md: &mut String, points: &[Point]) {
    let _ = writeln!(
        md,
        "\n## Tail at {HEADLINE_OUTSTANDING} outstanding\n\nTargets for `log`: p99.9 under 5 ms and max under 15 ms. A point's max counts every operation from its first, with no warm-up, on the clusters started for the sweep. The last column is the slowest synced write (one write and its fdatasync) of any memory node's redo log during the point, from the nodes' statistics: every operation that waited for it took at least that long (\"≤\" marks the bound of a histogram bucket, when that write was not the slowest since its node started). The limits' rows show how long this machine's disk and loopback stall by themselves in the same run.\n"
    );
    table_header(
        md,
        [
            "series",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
            "slowest log sync µs",
        ],
    );
    for (mode, nodes) in [("ram", 1), ("ram", 4), ("log", 1), ("log", 4)] {
        if let Some(p) = find(points, "tutti", mode, nodes, HEADLINE_OUTSTANDING) {
            let layout = if nodes == 1 { "1PC" } else { "2PC" };
            let _ = writeln!(
                md,
                "| tutti {mode} {layout} | {} | {} | {} | {} | {} |",
                p.p50_us,
                p.p99_us,
                p.p999_us,
                p.max_us,
                match (p.log_sync_max_us, p.log_sync_max_is_bound) {
                    (None, _) => "–".to_string(),
                    (Some(us), false) => us.to_string(),
                    (Some(us), true) => format!("≤ {us}"),
                }
            );
        }
    }
    for p in points.iter().filter(|p| p.experiment == "limits") {
        let _ = writeln!(
            md,
            "| limit {} ×{} | {} | {} | {} | {} | – |",
            p.mode, p.outstanding, p.p50_us, p.p99_us, p.p999_us, p.max_us
        );
    }
}

/// Fig. 16's table: every system's throughput (p50 / p99) at each outstanding count.
fn fig16_md(md: &mut String, cfg: &SuiteConfig, points: &[Point]) {
    let _ = writeln!(
        md,
        "\n## Fig. 16: 3 compare-and-swaps per operation\n\n![Fig. 16](fig16.png)\n"
    );
    if cfg.fig16_sweep().len() > cfg.outstanding.len() {
        let _ = writeln!(
            md,
            "At {HEADLINE_OUTSTANDING} outstanding, where the targets are read, each system ran {} times (before, within and after its sweep) and the median run is shown; `runs` in `results/fig16.json` has them all.\n",
            cfg.headline_runs
        );
    }
    let _ = writeln!(
        md,
        "Throughput in operations per second (p50 / p99 latency in µs). tutti 1PC is one memory node; 2PC is 4 nodes with each minitransaction spread over 2. Every system is driven from one client process: tutti's client opens two pipelined connections in all (two to the single node, one to each of the 4), Redis sessions share two pipelined connections, PostgreSQL and etcd get one connection per outstanding operation.\n"
    );
    let columns: Vec<(&str, &str, usize)> = vec![
        ("tutti", "ram", 1),
        ("tutti", "ram", 4),
        ("tutti", "log", 1),
        ("tutti", "log", 4),
        ("redis", "none", 1),
        ("redis", "always", 1),
        ("postgres", "off", 1),
        ("postgres", "on", 1),
        ("etcd", "fsync", 1),
        ("embedded", "sync", 1),
    ];
    let present: Vec<_> = columns
        .into_iter()
        .filter(|(s, m, n)| {
            points
                .iter()
                .any(|p| p.experiment == "fig16" && &p.system == s && &p.mode == m && p.nodes == *n)
        })
        .collect();
    let header: Vec<String> = present
        .iter()
        .map(|(s, m, n)| match (*s, *n) {
            ("tutti", 1) => format!("tutti {m} 1PC"),
            ("tutti", _) => format!("tutti {m} 2PC"),
            _ => format!("{s} {m}"),
        })
        .collect();
    table_header(md, std::iter::once("outstanding".to_string()).chain(header));
    for &o in &cfg.outstanding {
        let cells: Vec<String> = present
            .iter()
            .map(|(s, m, n)| {
                find(points, s, m, *n, o).map_or("–".into(), |p| {
                    format!("{:.0} ({}/{})", p.throughput_per_s, p.p50_us, p.p99_us)
                })
            })
            .collect();
        let _ = writeln!(md, "| {o} | {} |", cells.join(" | "));
    }
}

/// Throughput ratios between tutti and each peer, and 2PC over 1PC, with their targets.
fn ratios_md(md: &mut String, cfg: &SuiteConfig, points: &[Point]) {
    let _ = writeln!(md, "\n## Ratios\n");
    let _ = writeln!(
        md,
        "Throughput ratios at each outstanding count (target in brackets).\n"
    );
    let ratios: [(&str, Series, Series); 7] = [
        (
            "tutti ram / Redis no persistence [≥ 1.5]",
            ("tutti", "ram", 1),
            ("redis", "none", 1),
        ),
        (
            "tutti log / etcd [≥ 10]",
            ("tutti", "log", 1),
            ("etcd", "fsync", 1),
        ),
        (
            "tutti log / Redis appendfsync always [≥ 2]",
            ("tutti", "log", 1),
            ("redis", "always", 1),
        ),
        (
            "tutti log / PostgreSQL synchronous_commit=on [≥ 2]",
            ("tutti", "log", 1),
            ("postgres", "on", 1),
        ),
        (
            "tutti log / embedded SQLite",
            ("tutti", "log", 1),
            ("embedded", "sync", 1),
        ),
        (
            "tutti ram 2PC / 1PC [≥ 0.5]",
            ("tutti", "ram", 4),
            ("tutti", "ram", 1),
        ),
        (
            "tutti log 2PC / 1PC [≥ 0.5]",
            ("tutti", "log", 4),
            ("tutti", "log", 1),
        ),
    ];
    table_header(
        md,
        std::iter::once("ratio".to_string()).chain(cfg.outstanding.iter().map(|o| o.to_string())),
    );
    for (name, a, b) in ratios {
        let cells: Vec<String> = cfg
            .outstanding
            .iter()
            .map(|&o| {
                match (
                    find(points, a.0, a.1, a.2, o),
                    find(points, b.0, b.1, b.2, o),
                ) {
                    (Some(x), Some(y)) if y.throughput_per_s > 0.0 => {
                        format!("{:.2}", x.throughput_per_s / y.throughput_per_s)
                    }
                    _ => "–".into(),
                }
            })
            .collect();
        let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
    }
}

/// Latency and throughput against the loopback and fdatasync limits measured in the run.
fn against_limits_md(md: &mut String, points: &[Point]) {
    let _ = writeln!(md, "\n## Against the physical limits\n");
    let sync = limit(points, "fdatasync-4KiB-preallocated", 1);
    if let (Some(rtt), Some(sync)) = (limit(points, "loopback-rtt-64B", 1), sync) {
        let _ = writeln!(
            md,
            "At 1 outstanding operation, latency over the limit: tutti ram 1PC p50 = {} × the loopback round trip ({} µs); tutti log 1PC p50 = {} × (loopback + one fdatasync of a preallocated file, {} µs).",
            find(points, "tutti", "ram", 1, 1).map_or("–".into(), |p| format!("{:.1}", p.p50_us / rtt.p50_us)),
            rtt.p50_us,
            find(points, "tutti", "log", 1, 1).map_or("–".into(), |p| format!("{:.1}", p.p50_us / (rtt.p50_us + sync.p50_us))),
            sync.p50_us,
        );
    }
    if let (Some(one), Some(four)) = (sync, limit(points, "fdatasync-4KiB-preallocated", 4)) {
        let _ = writeln!(
            md,
            "\nThe four logs of the 2PC layout share one disk. Four fdatasync streams at once take {} µs per sync (p50), one stream alone {} µs; {:.0} syncs/s in all against {:.0}/s. A log-mode 2PC minitransaction waits for a sync on two of the four streams, a 1PC one for a sync on the single stream: the disk alone bounds log 2PC / 1PC at about the ratio of these latencies ({:.2}), before any CPU is spent.",
            four.p50_us,
            one.p50_us,
            four.throughput_per_s,
            one.throughput_per_s,
            one.p50_us / four.p50_us.max(1.0),
        );
    }
    if let Some(rtt16) = limit(points, "loopback-rtt-64B", 16) {
        let best = points
            .iter()
            .filter(|p| {
                p.experiment == "fig16" && p.system == "tutti" && p.mode == "ram" && p.nodes == 1
            })
            .map(|p| p.throughput_per_s)
            .fold(0.0, f64::max);
        let _ = writeln!(
            md,
            "\nPeak tutti ram 1PC throughput is {:.2} × the 16-connection loopback ping-pong rate ({:.0}/s); a minitransaction is one request and one reply, but tutti pipelines many on each of its two connections while the limit waits for each reply.",
            best / rtt16.throughput_per_s.max(1.0),
            rtt16.throughput_per_s
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(outstanding: Vec<usize>, headline_runs: usize) -> SuiteConfig {
        SuiteConfig {
            exe: PathBuf::new(),
            out: PathBuf::new(),
            scratch: PathBuf::new(),
            outstanding,
            headline_runs,
            seconds_per_point: 1.0,
            items: 1,
            no_peers: true,
        }
    }

    #[test]
    fn the_headline_count_runs_before_and_after_the_sweep() {
        assert_eq!(
            config(vec![1, 64, 256], 3).fig16_sweep(),
            vec![64, 1, 64, 256, 64]
        );
        assert_eq!(config(vec![1, 64], 1).fig16_sweep(), vec![1, 64]);
        assert_eq!(config(vec![1, 16], 3).fig16_sweep(), vec![1, 16]);
    }

    #[test]
    fn repeated_points_become_their_median_run_where_the_middle_one_ran() {
        let point = |experiment: &str, outstanding, throughput| {
            let mut p = Point::new(experiment, "tutti", "log", 1, 1, outstanding);
            p.throughput_per_s = throughput;
            p
        };
        let points = vec![
            point("limits", 1, 5.0),
            point("fig16", 64, 30.0),
            point("fig16", 1, 7.0),
            point("fig16", 64, 10.0),
            point("fig16", 64, 20.0),
            point("fig17", 64, 9.0),
        ];
        let kept = keep_median_runs(points);
        let summary: Vec<_> = kept
            .iter()
            .map(|p| (p.experiment.as_str(), p.outstanding, p.throughput_per_s))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("limits", 1, 5.0),
                ("fig16", 1, 7.0),
                ("fig16", 64, 20.0),
                ("fig17", 64, 9.0)
            ]
        );
        assert!(kept[1].runs.is_empty(), "measured once");
        assert_eq!(kept[2].runs, vec![30.0, 10.0, 20.0]);
    }
}
