//! `tutti bench log`: the shared log against what a user would pick instead for a durable,
//! ordered log, each started here with the same durability (every append synced before it
//! is acknowledged): Redis Streams (`XADD`, `appendfsync always`), etcd (a put; its revision
//! is the position) and ZooKeeper 3.8 (a sequential znode, `forceSync=yes`). Besides the
//! appends: tutti's reads, the sequencer alone (positions per second, one per frame and
//! batched), a stream's sync, and a log node's resident set under appends and trims.

use super::peers::{ensure_file, ensure_installed, etcd, redis, Daemon};
use super::suite::ScratchCluster;
use super::{Latencies, Point};
use rand::Rng;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_client::Cluster;
use tutti_log::layout::{BACKPOINTERS_DEFAULT, SLOT_BYTES_MIN};
use tutti_log::{Log, LogOptions, LogShape, StreamId};
use tutti_wire::{Answer, Ask, Connection, Request, Response};

/// The logs the benchmarks append to: 64 MiB of each of the 4 nodes, in slots sized for the
/// entries (`slot_for`), trimmed behind the appends.
const CAPACITY_BYTES: u64 = 64 << 20;
/// Streams appends go to, in turn.
const STREAMS: u32 = 8;
/// Asks per frame of the batched sequencer runs: the client's own batch limit.
const ASKS_PER_FRAME: usize = 1024;

#[derive(Clone, Debug)]
pub struct LogBenchConfig {
    pub exe: PathBuf,
    pub scratch: PathBuf,
    pub outstanding: Vec<usize>,
    pub seconds: f64,
    /// Entry sizes, in bytes.
    pub sizes: Vec<usize>,
    /// Entries of the stream a sync reads (as many again go to other streams between them).
    pub sync_entries: u64,
    /// Minutes of appends and trims over which a log node's resident set is read.
    pub memory_minutes: u64,
    pub no_peers: bool,
}

impl LogBenchConfig {
    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }
}

/// One operation of a closed loop, on a session of its own.
pub trait Op: Send + 'static {
    /// Runs the operation once; the count of what it did (entries, positions).
    fn run(&mut self) -> impl Future<Output = Result<u64, String>> + Send;
}

/// Runs `outstanding` sessions from `open`, each repeating its operation for `duration`:
/// throughput counts what the operations did, latencies are per operation, errors are
/// counted and followed by a 1 ms pause.
pub async fn closed_loop<O: Op, F: Future<Output = Result<O, String>>>(
    label: Point,
    outstanding: usize,
    duration: Duration,
    mut open: impl FnMut(usize) -> F,
) -> Result<Point, String> {
    let mut sessions = Vec::with_capacity(outstanding);
    for i in 0..outstanding {
        sessions.push(open(i).await?);
    }
    let start = Instant::now();
    let until = start + duration;
    let tasks: Vec<_> = sessions
        .into_iter()
        .map(|mut op| {
            tokio::spawn(async move {
                let (mut done, mut errors, mut lat) = (0u64, 0u64, Latencies::new());
                while Instant::now() < until {
                    let t = Instant::now();
                    match op.run().await {
                        Ok(n) => {
                            lat.record(t.elapsed());
                            done += n;
                        }
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
                (done, errors, lat)
            })
        })
        .collect();
    let (mut done, mut errors, mut lat) = (0, 0, Latencies::new());
    for t in tasks {
        let (d, e, l) = t.await.map_err(|e| e.to_string())?;
        done += d;
        errors += e;
        lat.add(&l);
    }
    let mut p = label.measured(done, start.elapsed(), &lat);
    p.errors = errors;
    Ok(p)
}

/// `closed_loop` for `duration` at each count of `outstanding`, sessions from `open`, each
/// point labelled by `label(outstanding)`, completed by `finish` and handed to `progress`
/// as it is measured.
pub(crate) async fn sweep<O: Op, F: Future<Output = Result<O, String>>>(
    outstanding: &[usize],
    duration: Duration,
    label: impl Fn(usize) -> Point,
    mut open: impl FnMut(usize) -> F,
    mut finish: impl FnMut(&mut Point),
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    for &n in outstanding {
        let mut p = closed_loop(label(n), n, duration, &mut open).await?;
        finish(&mut p);
        progress(&p);
        points.push(p);
    }
    Ok(points)
}

pub(crate) fn label(
    experiment: &str,
    system: &str,
    mode: &str,
    outstanding: usize,
    op: &str,
) -> Point {
    let mut p = Point::new(experiment, system, mode, 4, 4, outstanding);
    p.operation = Some(op.into());
    p
}

fn size_name(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) {
        format!("{}KiB", bytes / 1024)
    } else {
        format!("{bytes}B")
    }
}

// ---------------------------------------------------------------- tutti

struct TuttiAppend {
    log: Log,
    payload: Vec<u8>,
    stream: StreamId,
}

impl Op for TuttiAppend {
    async fn run(&mut self) -> Result<u64, String> {
        let streams = [self.stream];
        self.log
            .append(self.payload.clone(), &streams)
            .await
            .map(|_| 1)
            .map_err(|e| e.to_string())
    }
}

struct TuttiRead {
    log: Log,
    below: u64,
    from: u64,
}

impl Op for TuttiRead {
    async fn run(&mut self) -> Result<u64, String> {
        let p = rand::thread_rng().gen_range(self.from..self.below);
        self.log.read(p).await.map(|_| 1).map_err(|e| e.to_string())
    }
}

/// Asks the sequencer for `asks` positions in one frame, over a connection of its own.
struct SequencerAsk {
    conn: Arc<Connection>,
    log: String,
    asks: usize,
}

impl Op for SequencerAsk {
    async fn run(&mut self) -> Result<u64, String> {
        let req = Request::Sequence {
            log: self.log.clone(),
            min_epoch: 0,
            asks: vec![Ask::Next { streams: vec![1] }; self.asks],
        };
        match self.conn.call(&req).await.map_err(|e| e.to_string())? {
            Response::Sequenced(answers) => Ok(answers
                .iter()
                .filter(|a| matches!(a, Answer::Granted { .. }))
                .count() as u64),
            other => Err(format!("the sequencer answered {other:?}")),
        }
    }
}

/// Trims `log` every 100 ms until dropped, keeping the last `keep` positions, so that
/// appends (and positions taken from the sequencer alone) never find it full; counts the
/// trims that committed and keeps the slowest.
struct Trimmer {
    task: tokio::task::JoinHandle<()>,
    trims: Arc<std::sync::Mutex<(u64, Duration)>>,
}

impl Trimmer {
    fn start(log: &Log, keep: u64) -> Trimmer {
        let log = log.clone();
        let trims: Arc<std::sync::Mutex<(u64, Duration)>> = Arc::default();
        let seen = trims.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(t) = log.check().await {
                    let start = Instant::now();
                    if log.trim(t.tail.saturating_sub(keep)).await.is_ok() {
                        let mut seen = seen.lock().expect("trims poisoned");
                        seen.0 += 1;
                        seen.1 = seen.1.max(start.elapsed());
                    }
                }
            }
        });
        Trimmer { task, trims }
    }

    /// Records in `p` the trims since the last call, and starts counting again.
    fn finish(&self, p: &mut Point) {
        let (count, slowest) = std::mem::take(&mut *self.trims.lock().expect("trims poisoned"));
        p.trims = Some(count);
        p.trim_max_us = Some(slowest.as_micros() as u64);
    }
}

impl Drop for Trimmer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn create_log(cluster: &Cluster, name: &str, slot_bytes: u32) -> Result<Log, String> {
    let shape = LogShape {
        slot_bytes,
        ..LogShape::new(vec![1, 2, 3, 4], CAPACITY_BYTES)
    };
    Log::create(cluster, name, &shape, LogOptions::default())
        .await
        .map_err(|e| format!("create log {name}: {e}"))
}

async fn sequencer_connection(cluster: &Cluster) -> Result<Arc<Connection>, String> {
    let addr = match cluster.ask_manager(&Request::Sequencer).await {
        Ok(Response::Sequencer(Some(addr))) => addr,
        other => return Err(format!("no sequencer: {other:?}")),
    };
    let opts = cluster.options();
    let conn = Connection::connect(&addr, opts.frame_bytes_max, &opts.dialer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(conn))
}

/// The slot size for entries of `size` bytes in one stream: the smallest power of two that
/// holds one with its headers (256 B for 128 B entries, 8 KiB for 4 KiB ones), as a user
/// sizes a log for its entries (docs/log.md, "Choosing the slot size").
fn slot_for(size: usize) -> u32 {
    let with_header = size + tutti_log::entry::header_bytes(1, BACKPOINTERS_DEFAULT);
    (with_header.next_power_of_two() as u32).max(SLOT_BYTES_MIN)
}

/// Every tutti experiment on a 4-node `log` cluster.
async fn tutti(
    cfg: &LogBenchConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let c = ScratchCluster::start(&cfg.exe, cfg.scratch.join("tutti-log"), 4, "log").await?;
    let mut points = Vec::new();
    let mut logs = Vec::new();
    for &size in &cfg.sizes {
        let log = create_log(
            &c.cluster,
            &format!("bench-{}", size_name(size)),
            slot_for(size),
        )
        .await?;
        let trimmer = Trimmer::start(&log, log.layout().period() / 2);
        let op = size_name(size);
        let appends = sweep(
            &cfg.outstanding,
            cfg.duration(),
            |n| label("log-append", "tutti", "log", n, &op),
            |i| {
                let log = log.clone();
                async move {
                    Ok(TuttiAppend {
                        log,
                        payload: vec![0xa5; size],
                        stream: i as u32 % STREAMS,
                    })
                }
            },
            |p| trimmer.finish(p),
            progress,
        );
        points.extend(appends.await?);
        drop(trimmer);
        logs.push((size, log));
    }
    // Reads of what the appends of the smallest entries left (the last half lap, above the
    // trim point).
    if let Some((size, log)) = logs.iter().min_by_key(|(size, _)| *size) {
        let stat = log.stat().await.map_err(|e| e.to_string())?;
        let from = stat.words.iter().map(|w| w.trim).max().unwrap_or(0);
        let below = stat.tail.tail;
        if below > from {
            let op = size_name(*size);
            let reads = sweep(
                &cfg.outstanding,
                cfg.duration(),
                |n| label("log-read", "tutti", "log", n, &op),
                |_| {
                    let log = log.clone();
                    async move { Ok(TuttiRead { log, below, from }) }
                },
                |_| {},
                progress,
            );
            points.extend(reads.await?);
        }
    }
    points.extend(sequencer(cfg, &c.cluster, progress).await?);
    points.push(sync(cfg, &c.cluster).await?);
    progress(points.last().expect("pushed"));
    if cfg.memory_minutes > 0 {
        let largest = logs.iter().max_by_key(|(size, _)| *size);
        if let Some((size, log)) = largest {
            points.extend(memory(cfg, &c.cluster, (*size, log), progress).await?);
        }
    }
    Ok(points)
}

/// The sequencer alone: positions taken with one ask per frame (`outstanding` frames in
/// flight, each session on its own connection) and 1,024 per frame.
async fn sequencer(
    cfg: &LogBenchConfig,
    cluster: &Cluster,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    // Small slots: a million positions a lap, so that the trims keep well ahead.
    let log = create_log(cluster, "positions", 256).await?;
    let _trimmer = Trimmer::start(&log, 0);
    let mut points = Vec::new();
    for (asks, name) in [(1, "1 per frame"), (ASKS_PER_FRAME, "1024 per frame")] {
        let positions = sweep(
            &cfg.outstanding,
            cfg.duration(),
            |n| label("log-sequencer", "tutti", "-", n, name),
            |_| async move {
                Ok(SequencerAsk {
                    conn: sequencer_connection(cluster).await?,
                    log: "positions".into(),
                    asks,
                })
            },
            |_| {},
            progress,
        );
        points.extend(positions.await?);
    }
    Ok(points)
}

/// A stream of `sync_entries` 128-byte entries, each followed by one in another stream,
/// read by a new reader's sync from the start: entries per second.
async fn sync(cfg: &LogBenchConfig, cluster: &Cluster) -> Result<Point, String> {
    // Room for every entry of both kinds (and a lease to spare) in 512-byte slots over the
    // 4 nodes, plus a MiB per node for the region's header: the log never wraps.
    let per_node = (cfg.sync_entries * 2 + 8192) * 512 / 4 + (1 << 20);
    let shape = LogShape {
        slot_bytes: 512,
        ..LogShape::new(vec![1, 2, 3, 4], per_node)
    };
    let log = Log::create(cluster, "sync", &shape, LogOptions::default())
        .await
        .map_err(|e| format!("create log sync: {e}"))?;
    let total = cfg.sync_entries * 2;
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writers: Vec<_> = (0..64)
        .map(|_| {
            let (log, next) = (log.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        return Ok::<(), String>(());
                    }
                    let stream = if i % 2 == 0 {
                        1
                    } else {
                        2 + (i / 2 % 7) as u32
                    };
                    log.append(vec![7; 128], &[stream])
                        .await
                        .map_err(|e| e.to_string())?;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.map_err(|e| e.to_string())??;
    }
    let opts = LogOptions {
        deadline: Duration::from_secs(600),
        ..LogOptions::default()
    };
    let reader = Log::open(cluster, "sync", opts)
        .await
        .map_err(|e| e.to_string())?;
    let mut stream = reader.stream(1, 0);
    let start = Instant::now();
    stream.sync().await.map_err(|e| e.to_string())?;
    let elapsed = start.elapsed();
    let found = stream.ready() as u64;
    if found != cfg.sync_entries {
        return Err(format!(
            "the sync found {found} of the stream's {} entries",
            cfg.sync_entries
        ));
    }
    let mut lat = Latencies::new();
    lat.record(elapsed);
    Ok(label("log-sync", "tutti", "log", 1, "128B").measured(found, elapsed, &lat))
}

/// Node 1's resident set once a minute while 64 appenders of `size`-byte entries go round
/// `log` (the appends' log of the largest entries) and a trimmer keeps up: flat once every
/// slot has been touched.
async fn memory(
    cfg: &LogBenchConfig,
    cluster: &Cluster,
    (size, log): (usize, &Log),
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let _trimmer = Trimmer::start(log, log.layout().period() / 2);
    let mut points: Vec<Point> = Vec::new();
    for _ in 0..cfg.memory_minutes {
        let load = closed_loop(
            label("log-memory", "tutti", "log", 64, &size_name(size)),
            64,
            Duration::from_secs(60),
            |i| {
                let log = log.clone();
                async move {
                    Ok(TuttiAppend {
                        log,
                        payload: vec![0x5a; size],
                        stream: i as u32 % STREAMS,
                    })
                }
            },
        )
        .await?;
        let rss = super::memory::settled_stats(cluster, 1).await?.rss_bytes;
        let mut p = load;
        p.rss_bytes = Some(rss);
        p.limit_bytes = Some(
            points.first().and_then(|p| p.rss_bytes).unwrap_or(rss)
                + super::memory::LOG_SLACK_BYTES,
        );
        progress(&p);
        points.push(p);
    }
    Ok(points)
}

// ---------------------------------------------------------------- peers

struct RedisAppend {
    con: redis::aio::MultiplexedConnection,
    payload: Vec<u8>,
}

impl Op for RedisAppend {
    async fn run(&mut self) -> Result<u64, String> {
        redis::cmd("XADD")
            .arg("log")
            .arg("*")
            .arg("d")
            .arg(&self.payload)
            .query_async::<String>(&mut self.con)
            .await
            .map(|_| 1)
            .map_err(|e| e.to_string())
    }
}

struct EtcdAppend {
    session: super::peers::EtcdSession,
    payload: String,
    key: u64,
}

impl Op for EtcdAppend {
    async fn run(&mut self) -> Result<u64, String> {
        self.key += 1;
        let key = super::peers::b64(&format!("e{}", self.key));
        let put = serde_json::json!({"requestPut": {"key": key, "value": self.payload}});
        self.session
            .txn(serde_json::json!({ "success": [put] }))
            .await
            .map(|_| 1)
    }
}

struct ZkAppend {
    client: zookeeper_client::Client,
    payload: Vec<u8>,
}

impl Op for ZkAppend {
    async fn run(&mut self) -> Result<u64, String> {
        let options = zookeeper_client::CreateMode::PersistentSequential
            .with_acls(zookeeper_client::Acls::anyone_all());
        self.client
            .create("/log/e-", &self.payload, &options)
            .await
            .map(|_| 1)
            .map_err(|e| e.to_string())
    }
}

/// ZooKeeper 3.8 standalone (the Debian package's jar) with `forceSync=yes`: every
/// transaction is fsynced before it is acknowledged.
pub(crate) async fn zookeeper(root: &Path) -> Result<(Daemon, String), String> {
    let jar = ensure_file(Path::new("/usr/share/java/zookeeper.jar"), "zookeeper")?;
    let java = ensure_installed("java", "default-jre-headless")?;
    let dir = super::peers::scratch(root, "zookeeper")?;
    let port = super::peers::free_port()?;
    let cfg = dir.join("zoo.cfg");
    let text = format!(
        "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\nforceSync=yes\nadmin.enableServer=false\nmaxClientCnxns=0\n",
        dir.join("data").display()
    );
    std::fs::write(&cfg, text).map_err(|e| format!("{}: {e}", cfg.display()))?;
    let mut cmd = Command::new(java);
    cmd.arg("-cp")
        .arg(format!("/etc/zookeeper/conf:{}", jar.display()))
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(&cfg);
    let mut daemon = Daemon::spawn("zookeeper", dir, port, cmd)?;
    let addr = format!("127.0.0.1:{port}");
    let client = daemon
        .wait(|| {
            let addr = addr.clone();
            async move {
                zookeeper_client::Client::connect(&addr)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await?;
    let options =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    client
        .create("/log", &[], &options)
        .await
        .map_err(|e| format!("create /log: {e}"))?;
    Ok((daemon, addr))
}

/// Appends on each peer, as on tutti: `outstanding` sessions, entries of each size.
async fn peers(
    cfg: &LogBenchConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = Vec::new();
    let (redis_server, sessions) = redis(&cfg.scratch, "always", 0).await?;
    for &size in &cfg.sizes {
        let op = size_name(size);
        let appends = sweep(
            &cfg.outstanding,
            cfg.duration(),
            |n| label("log-append", "redis", "always", n, &op),
            |i| {
                let con = sessions[i % sessions.len()].con.clone();
                async move {
                    Ok(RedisAppend {
                        con,
                        payload: vec![0xa5; size],
                    })
                }
            },
            |_| {},
            progress,
        );
        points.extend(appends.await?);
    }
    drop(redis_server);
    let (etcd_server, session) = etcd(&cfg.scratch, 0).await?;
    for &size in &cfg.sizes {
        let op = size_name(size);
        let payload = super::peers::b64_bytes(&vec![0xa5; size]);
        let appends = sweep(
            &cfg.outstanding,
            cfg.duration(),
            |n| label("log-append", "etcd", "fsync", n, &op),
            |i| {
                let (session, payload) = (session.clone(), payload.clone());
                async move {
                    Ok(EtcdAppend {
                        session,
                        payload,
                        key: (i as u64) << 40,
                    })
                }
            },
            |_| {},
            progress,
        );
        points.extend(appends.await?);
    }
    drop(etcd_server);
    // Stopped (dropped) at the end, as the two before it were before the next started.
    let (_zookeeper_server, addr) = zookeeper(&cfg.scratch).await?;
    for &size in &cfg.sizes {
        let op = size_name(size);
        let appends = sweep(
            &cfg.outstanding,
            cfg.duration(),
            |n| label("log-append", "zookeeper", "forceSync", n, &op),
            |_| {
                let addr = addr.clone();
                async move {
                    Ok(ZkAppend {
                        client: zookeeper_client::Client::connect(&addr)
                            .await
                            .map_err(|e| e.to_string())?,
                        payload: vec![0xa5; size],
                    })
                }
            },
            |_| {},
            progress,
        );
        points.extend(appends.await?);
    }
    Ok(points)
}

/// Every log experiment: tutti's, then the peers' (unless `no_peers`).
pub async fn run(
    cfg: &LogBenchConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let mut points = tutti(cfg, progress).await?;
    if !cfg.no_peers {
        points.extend(peers(cfg, progress).await?);
    }
    Ok(points)
}

// ---------------------------------------------------------------- results

/// Where the log's section of RESULTS.md begins and ends: `tutti bench log` replaces what is
/// between, `tutti bench all` keeps it.
pub const SECTION_BEGIN: &str = "<!-- tutti bench log -->";
pub const SECTION_END: &str = "<!-- /tutti bench log -->";

/// `md` with what lies from `begin` to `end` (markers included) replaced by `section`, or
/// `section` appended if it has no such part.
pub fn splice_between(md: &str, begin: &str, end: &str, section: &str) -> String {
    match (md.find(begin), md.find(end)) {
        (Some(b), Some(e)) if b < e => format!("{}{section}{}", &md[..b], &md[e + end.len()..]),
        _ => format!("{}\n{section}\n", md.trim_end()),
    }
}

/// The part of `md` from `begin` to `end`, markers included, if it has one.
pub fn section_between<'a>(md: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let (b, e) = (md.find(begin)?, md.find(end)?);
    (b < e).then(|| &md[b..e + end.len()])
}

fn find<'a>(
    points: &'a [Point],
    experiment: &str,
    system: &str,
    n: usize,
    op: &str,
) -> Option<&'a Point> {
    points.iter().find(|p| {
        p.experiment == experiment
            && p.system == system
            && p.outstanding == n
            && p.operation.as_deref() == Some(op)
    })
}

/// Throughput (p50/p99), and the operations that failed, if any: each failure was followed
/// by a 1 ms pause, so they lower the throughput.
fn cell(p: Option<&Point>) -> String {
    p.map_or("-".into(), |p| {
        let failed = if p.errors > 0 {
            format!(", {} failed", p.errors)
        } else {
            String::new()
        };
        format!(
            "{:.0} ({}/{}{failed})",
            p.throughput_per_s, p.p50_us, p.p99_us
        )
    })
}

/// The RESULTS.md section: appends against the peers, reads, the sequencer, the sync, the
/// resident set, and each target at 64 outstanding with whether it was met.
pub fn section(cfg: &LogBenchConfig, points: &[Point], command: &str) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(md, "{SECTION_BEGIN}\n## Shared log (`tutti bench log`)\n");
    let _ = writeln!(
        md,
        "Generated by `{command}`; every number below was measured in that one run, {} s per point; raw records in `results/log.json`. tutti: a log striped over 4 memory nodes in `log` mode (slots of the smallest power of two that holds an entry with its headers: {} B for 128 B entries; trimmed behind the appends), each append to one of {STREAMS} streams; Redis: `XADD` with `appendfsync always`; etcd: one put per append (fsync always), one HTTP connection per outstanding append; ZooKeeper 3.8: a persistent sequential znode per append, `forceSync=yes`, one session per outstanding append. Throughput in entries per second (p50 / p99 latency in µs, and how many operations failed, each followed by a 1 ms pause; a failed tutti append is `log full`, when the trims fall behind).\n",
        cfg.seconds,
        slot_for(128)
    );
    for &size in &cfg.sizes {
        let op = size_name(size);
        let _ = writeln!(md, "### Appends of {op} entries\n");
        let _ = writeln!(md, "| outstanding | tutti | redis always | etcd | zookeeper |\n| --- | --- | --- | --- | --- |");
        for &n in &cfg.outstanding {
            let _ = writeln!(
                md,
                "| {n} | {} | {} | {} | {} |",
                cell(find(points, "log-append", "tutti", n, &op)),
                cell(find(points, "log-append", "redis", n, &op)),
                cell(find(points, "log-append", "etcd", n, &op)),
                cell(find(points, "log-append", "zookeeper", n, &op)),
            );
        }
        let trims: Vec<String> = (cfg.outstanding.iter())
            .filter_map(|&n| find(points, "log-append", "tutti", n, &op))
            .filter_map(|p| {
                let (count, max_us) = (p.trims?, p.trim_max_us?);
                Some(format!(
                    "{} ({count}, {:.1} ms)",
                    p.outstanding,
                    max_us as f64 / 1e3
                ))
            })
            .collect();
        if !trims.is_empty() {
            let _ = writeln!(
                md,
                "\ntutti's log was trimmed every 100 ms to half a lap behind the tail; per outstanding count, the trims that committed and the slowest: {}.",
                trims.join(", ")
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "### Reads, the sequencer alone\n");
    let read_op = cfg
        .sizes
        .iter()
        .min()
        .map_or("128B".into(), |s| size_name(*s));
    let _ = writeln!(md, "| outstanding | reads of {read_op} entries | positions, 1 per frame | positions, 1,024 per frame |\n| --- | --- | --- | --- |");
    for &n in &cfg.outstanding {
        let _ = writeln!(
            md,
            "| {n} | {} | {} | {} |",
            cell(find(points, "log-read", "tutti", n, &read_op)),
            cell(find(points, "log-sequencer", "tutti", n, "1 per frame")),
            cell(find(points, "log-sequencer", "tutti", n, "1024 per frame")),
        );
    }
    md.push('\n');
    if let Some(s) = points.iter().find(|p| p.experiment == "log-sync") {
        let _ = writeln!(
            md,
            "A new reader's sync of a stream of {} entries, each followed by an entry of another stream: {:.2} s, {:.0} entries per second.\n",
            s.committed,
            s.p50_us / 1e6,
            s.throughput_per_s
        );
    }
    let memory: Vec<&Point> = points
        .iter()
        .filter(|p| p.experiment == "log-memory")
        .collect();
    if !memory.is_empty() {
        let readings: Vec<String> = memory
            .iter()
            .map(|p| format!("{:.0}", p.rss_bytes.unwrap_or(0) as f64 / (1 << 20) as f64))
            .collect();
        let limit = memory.last().and_then(|p| p.limit_bytes).unwrap_or(0);
        let flat = memory.iter().all(|p| p.rss_bytes <= p.limit_bytes);
        let _ = writeln!(
            md,
            "Memory: node 1's resident set after each minute of 64 appenders of {} entries with trims keeping up, in MiB: {} (limit {:.0} MiB: the first reading plus {} MiB): {}.\n",
            memory[0].operation.as_deref().unwrap_or("?"),
            readings.join(", "),
            limit as f64 / (1 << 20) as f64,
            super::memory::LOG_SLACK_BYTES >> 20,
            if flat { "flat" } else { "GROWS" }
        );
    }
    let _ = writeln!(
        md,
        "### Targets at 64 outstanding\n\n| target | measured | met |\n| --- | --- | --- |"
    );
    let at64 = |e: &str, s: &str, op: &str| find(points, e, s, 64, op).map(|p| p.throughput_per_s);
    let tutti128 = at64("log-append", "tutti", "128B");
    for (peer, factor) in [("redis", 1.5), ("etcd", 20.0), ("zookeeper", 3.0)] {
        let ratio = tutti128
            .zip(at64("log-append", peer, "128B"))
            .map(|(t, p)| t / p.max(1.0));
        let _ = writeln!(
            md,
            "| 128 B appends ≥ {factor} × {peer} | {} | {} |",
            ratio.map_or("-".into(), |r| format!("{r:.2} ×")),
            ratio.map_or("-", |r| if r >= factor { "yes" } else { "no" })
        );
    }
    let best = |e: &str, op: &str| {
        points
            .iter()
            .filter(|p| p.experiment == e && p.operation.as_deref() == Some(op))
            .map(|p| p.throughput_per_s)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))))
    };
    for (what, value, target) in [
        (
            "sequencer ≥ 500,000 positions/s (best of the batched runs)",
            best("log-sequencer", "1024 per frame"),
            500_000.0,
        ),
        (
            "reads ≥ 200,000 entries/s",
            at64("log-read", "tutti", &read_op),
            200_000.0,
        ),
    ] {
        let _ = writeln!(
            md,
            "| {what} | {} | {} |",
            value.map_or("-".into(), |v| format!("{v:.0}")),
            value.map_or("-", |v| if v >= target { "yes" } else { "no" })
        );
    }
    let _ = write!(md, "\n{SECTION_END}");
    md
}

/// The points `write` wrote to `out/results/log.json`.
pub fn read_results(out: &Path) -> Result<Vec<Point>, String> {
    let path = out.join("results").join("log.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `results/log.json` and the log section of `RESULTS.md` under `out`.
pub fn write(
    out: &Path,
    cfg: &LogBenchConfig,
    points: &[Point],
    command: &str,
) -> Result<(), String> {
    let md = section(cfg, points, command);
    write_results(out, "log.json", points, SECTION_BEGIN, SECTION_END, &md)
}

/// Writes `points` to `results/NAME` under `out` and puts `section` (marked by `begin` and
/// `end`) in `RESULTS.md` there.
pub fn write_results(
    out: &Path,
    name: &str,
    points: &[Point],
    begin: &str,
    end: &str,
    section: &str,
) -> Result<(), String> {
    let results = out.join("results");
    std::fs::create_dir_all(&results).map_err(|e| format!("{}: {e}", results.display()))?;
    let path = results.join(name);
    let json = serde_json::to_string_pretty(points).expect("points serialise");
    std::fs::write(&path, json + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    let path = out.join("RESULTS.md");
    let md = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, splice_between(&md, begin, end, section))
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_in_place_or_appended() {
        let section = format!("{SECTION_BEGIN}\nnew\n{SECTION_END}");
        let md = format!("# r\n\n{SECTION_BEGIN}\nold\n{SECTION_END}\n## after\n");
        let splice = |md: &str| splice_between(md, SECTION_BEGIN, SECTION_END, &section);
        assert_eq!(splice(&md), format!("# r\n\n{section}\n## after\n"));
        assert_eq!(splice("# r\n"), format!("# r\n{section}\n"));
        assert_eq!(
            section_between(&md, SECTION_BEGIN, SECTION_END),
            Some(&md[5..md.len() - 10])
        );
    }
}
