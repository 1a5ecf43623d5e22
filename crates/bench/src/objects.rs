//! `tutti bench objects`: Tango's objects over the shared log (Tango §6.1): a register with
//! one view, linearizable reads (each plays the log to the tail; concurrent reads share
//! plays) and writes (each one append), against outstanding operations, on a 4-node `log`
//! cluster. Targets from the issue: 135,000 reads/s and 40,000 writes/s with one view.

use crate::log::{label, sweep, write_results, Op};
use crate::suite::ScratchCluster;
use crate::Point;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tutti_log::{Log, LogOptions, LogShape};
use tutti_tango::{Kind, RegisterRef, Tango, TangoOptions};

/// Bytes of each memory node (256 MiB) the register's log takes; the map transactions'
/// and the namespace's logs take 48 and 80 MiB.
const CAPACITY_BYTES: u64 = 96 << 20;
/// The register's value, in bytes.
pub(crate) const VALUE_BYTES: usize = 64;
/// Slots that hold a write with its headers (158 B), as a user sizes a log for its entries:
/// 1.5 M positions over the 4 nodes, more than the writes of a run take (about 1.2 M), so
/// nothing is trimmed.
const SLOT_BYTES: u32 = 256;
/// Writes to the reads' register before they begin.
const READ_REGISTER_WRITES: usize = 1000;
/// Targets at 64 outstanding (Tango §6.1, one view).
const READS_TARGET_PER_S: f64 = 135_000.0;
const WRITES_TARGET_PER_S: f64 = 40_000.0;

pub const SECTION_BEGIN: &str = "<!-- tutti bench objects -->";
pub const SECTION_END: &str = "<!-- /tutti bench objects -->";

#[derive(Clone, Debug)]
pub struct ObjectsBenchConfig {
    pub exe: PathBuf,
    pub scratch: PathBuf,
    pub outstanding: Vec<usize>,
    pub seconds: f64,
    /// Measure tutti's namespace only, not ZooKeeper's and etcd's.
    pub no_peers: bool,
    /// The experiments to run (`PARTS`); all when empty.
    pub only: Vec<String>,
    /// How long the history experiment updates its map.
    pub history_minutes: u64,
}

/// The experiments, in the order they run.
pub const PARTS: [&str; 6] = [
    "register",
    "transactions",
    "namespace",
    "views",
    "partitions",
    "history",
];

impl ObjectsBenchConfig {
    fn runs(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

struct Write {
    tango: Tango,
    register: RegisterRef,
}

impl Op for Write {
    async fn run(&mut self) -> Result<u64, String> {
        let value = [0x5a; VALUE_BYTES];
        let set = self.register.set(&self.tango, &value).await;
        set.map(|_| 1).map_err(|e| e.to_string())
    }
}

pub(crate) struct Read {
    pub(crate) tango: Tango,
    pub(crate) register: RegisterRef,
}

impl Op for Read {
    async fn run(&mut self) -> Result<u64, String> {
        let get = self.register.get(&self.tango).await;
        get.map(|_| 1).map_err(|e| e.to_string())
    }
}

/// A new log `name` over the 4 nodes of a bench cluster, `capacity_bytes` of each, with
/// `backpointers` per stream (none: the log's default).
pub(crate) async fn four_node_log(
    cluster: &tutti_client::Cluster,
    name: &str,
    slot_bytes: u32,
    capacity_bytes: u64,
    backpointers: Option<u8>,
) -> Result<Log, String> {
    let mut shape = LogShape::new(vec![1, 2, 3, 4], capacity_bytes);
    shape.slot_bytes = slot_bytes;
    shape.backpointers = backpointers.unwrap_or(shape.backpointers);
    Log::create(cluster, name, &shape, LogOptions::default())
        .await
        .map_err(|e| format!("create log {name}: {e}"))
}

/// A client of `log` hosting its object `object` only (created if new), and the object's id.
pub(crate) async fn host_one(log: &Log, object: &str, kind: Kind) -> Result<(Tango, u32), String> {
    let tango = (Tango::open(log.clone(), &[(object, kind)], TangoOptions::default()).await)
        .map_err(|e| e.to_string())?;
    let oid = tango.hosted_as(object, kind).map_err(|e| e.to_string())?;
    Ok((tango, oid))
}

/// Every experiment of `cfg.only` (all by default): the register, the map transactions
/// and tutti's namespace on one cluster; the N views and the layered partitions on a second;
/// the history on a third; then the namespace on ZooKeeper and etcd.
pub async fn run(
    cfg: &ObjectsBenchConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    if let Some(unknown) = cfg.only.iter().find(|p| !PARTS.contains(&p.as_str())) {
        return Err(format!(
            "no experiment {unknown:?}: --only takes {}",
            PARTS.join(", ")
        ));
    }
    let (outstanding, seconds) = (&cfg.outstanding, cfg.seconds);
    let mut points = Vec::new();
    if cfg.runs("register") || cfg.runs("transactions") || cfg.runs("namespace") {
        let dir = cfg.scratch.join("tutti-objects");
        let c = ScratchCluster::start(&cfg.exe, dir, 4, "log").await?;
        if cfg.runs("register") {
            points.extend(register(cfg, &c.cluster, progress).await?);
        }
        if cfg.runs("transactions") {
            points.extend(crate::transactions::run(&c.cluster, seconds, progress).await?);
        }
        if cfg.runs("namespace") {
            points
                .extend(crate::namespace::tutti(&c.cluster, outstanding, seconds, progress).await?);
        }
    }
    if cfg.runs("views") || cfg.runs("partitions") {
        let dir = cfg.scratch.join("tutti-views");
        let c = ScratchCluster::start(&cfg.exe, dir, 4, "log").await?;
        if cfg.runs("views") {
            points.extend(crate::views::run(&cfg.exe, &c, seconds, progress).await?);
        }
        if cfg.runs("partitions") {
            points.extend(crate::partitions::run(&c.cluster, seconds, progress).await?);
        }
    }
    if cfg.runs("history") {
        let (exe, scratch, minutes) = (&cfg.exe, &cfg.scratch, cfg.history_minutes);
        points.extend(crate::history::run(exe, scratch, minutes, progress).await?);
    }
    if cfg.runs("namespace") && !cfg.no_peers {
        let root = &cfg.scratch;
        points.extend(crate::namespace::zookeeper(root, outstanding, seconds, progress).await?);
        points.extend(crate::namespace::etcd_points(root, outstanding, seconds, progress).await?);
    }
    Ok(points)
}

/// Writes, then reads (of what the writes left), at each count of outstanding operations,
/// all on one view.
async fn register(
    cfg: &ObjectsBenchConfig,
    cluster: &tutti_client::Cluster,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let log = four_node_log(cluster, "objects", SLOT_BYTES, CAPACITY_BYTES, None).await?;
    // Two clients, each hosting one register (layered partitions): the writes' register
    // receives over a million updates, which the reads' view does not play.
    let open = |name: &'static str| {
        let log = log.clone();
        async move {
            let (tango, oid) = host_one(&log, name, Kind::Register).await?;
            Ok::<_, String>((tango, RegisterRef(oid)))
        }
    };
    let duration = Duration::from_secs_f64(cfg.seconds);
    let mut points = Vec::new();
    let (tango, register) = open("written").await?;
    let writes = sweep(
        &cfg.outstanding,
        duration,
        |n| label("objects-register", "tutti", "log", n, "write"),
        |_| {
            let tango = tango.clone();
            async move { Ok(Write { tango, register }) }
        },
        |_| {},
        progress,
    );
    points.extend(writes.await?);
    let (tango, register) = open("read").await?;
    for _ in 0..READ_REGISTER_WRITES {
        register
            .set(&tango, &[0x5a; VALUE_BYTES])
            .await
            .map_err(|e| e.to_string())?;
    }
    let reads = sweep(
        &cfg.outstanding,
        duration,
        |n| label("objects-register", "tutti", "log", n, "read"),
        |_| {
            let tango = tango.clone();
            async move { Ok(Read { tango, register }) }
        },
        |_| {},
        progress,
    );
    points.extend(reads.await?);
    Ok(points)
}

/// The RESULTS.md section: the register's writes and reads against outstanding, and the
/// targets at 64.
pub fn section(cfg: &ObjectsBenchConfig, points: &[Point], command: &str) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "{SECTION_BEGIN}\n## Objects over the log (`tutti bench objects`)\n"
    );
    let _ = writeln!(
        md,
        "Generated by `{command}`; {} s per point, raw records in `results/objects.json`. A register with one view (Tango §6.1) on a log striped over 4 memory nodes in `log` mode (256 B slots, large enough that nothing is trimmed): a write is one append of {VALUE_BYTES} B; a read is linearizable (it plays the register's stream to the tail: a fenced fast check, then the new entries), and concurrent reads share plays. Writes and reads go to two registers, each hosted by its own client (layered partitions), so that the reads' view does not play the million writes: a view's play follows the stream's backpointers, 4 entries per round of reads, and one that had fallen 700,000 entries behind (5 s of writes at 256 outstanding) did not catch up within the log's 10 s deadline. Operations per second (p50 / p99 latency in µs).\n",
        cfg.seconds
    );
    let _ = writeln!(
        md,
        "| outstanding | writes/s | reads/s |\n| --- | --- | --- |"
    );
    let find = |n: usize, op: &str| {
        points.iter().find(|p| {
            p.experiment == "objects-register"
                && p.outstanding == n
                && p.operation.as_deref() == Some(op)
        })
    };
    let cell = |p: Option<&Point>| {
        p.map_or("-".to_string(), |p| {
            format!(
                "{:.0} ({:.0}/{:.0})",
                p.throughput_per_s, p.p50_us, p.p99_us
            )
        })
    };
    for &n in &cfg.outstanding {
        let _ = writeln!(
            md,
            "| {n} | {} | {} |",
            cell(find(n, "write")),
            cell(find(n, "read"))
        );
    }
    let _ = writeln!(md, "\nTargets at 64 outstanding:\n");
    for (op, target) in [("write", WRITES_TARGET_PER_S), ("read", READS_TARGET_PER_S)] {
        let verdict = match find(64, op) {
            Some(p) if p.throughput_per_s >= target => format!("{:.0}/s: met", p.throughput_per_s),
            Some(p) => format!("{:.0}/s: not met", p.throughput_per_s),
            None => "not measured".into(),
        };
        let _ = writeln!(md, "- {op}s ≥ {target:.0}/s: {verdict}");
    }
    md += &crate::transactions::section(points, cfg.seconds);
    md += &crate::views::section(points, cfg.seconds);
    md += &crate::partitions::section(points, cfg.seconds);
    md += &crate::history::section(points);
    md += &crate::namespace::section(points, &cfg.outstanding);
    let _ = write!(md, "\n{SECTION_END}");
    md
}

/// Writes `results/objects.json` and the objects section of `RESULTS.md` under `out`.
pub fn write(
    out: &Path,
    cfg: &ObjectsBenchConfig,
    points: &[Point],
    command: &str,
) -> Result<(), String> {
    let md = section(cfg, points, command);
    write_results(out, "objects.json", points, SECTION_BEGIN, SECTION_END, &md)
}
