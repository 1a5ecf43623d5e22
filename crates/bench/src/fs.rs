//! `tutti bench fs`: tutti-fs against the file systems a user would pick instead, all in one
//! run on this machine: the local disk, the local disk through a FUSE passthrough (bindfs),
//! GlusterFS (one brick) and JuiceFS (Redis metadata, `appendfsync always`). Workloads:
//! Sinfonia's Connectathon phases (Fig. 22) and modified Andrew benchmark, creates, stats and
//! unlinks of empty files in one directory, `ls -l` of a large directory, 1 GiB written and
//! read; and tutti with two mounts against one. Targets from the issue are checked in the
//! report, never in CI.

use crate::fs_peers::Target;
use crate::fs_phases::{self, Phase};
use crate::log::write_results;
use crate::Point;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub const SECTION_BEGIN: &str = "<!-- tutti bench fs -->";
pub const SECTION_END: &str = "<!-- /tutti bench fs -->";

/// The systems, in the order they run and appear.
pub const SYSTEMS: [&str; 5] = ["tutti", "local", "bindfs", "glusterfs", "juicefs"];
/// The parts of the run, in order (`ls` last: it leaves its directory for the teardown).
pub const PARTS: [&str; 6] = [
    "connectathon",
    "andrew",
    "metadata",
    "sequential",
    "ls",
    "two-mounts",
];
/// The source tree Andrew copies (Debian's kernel headers, there wherever gcc is: about
/// 30 directories, 760 files, 6.5 MB, the shape of the Tcl tree Sinfonia used).
pub const ANDREW_SOURCE: &str = "/usr/include/linux";

/// Targets: tutti's creates, stats and unlinks against JuiceFS's and the passthrough's;
/// sequential transfer against the passthrough's; two mounts against one.
const METADATA_OVER_JUICEFS: f64 = 3.0;
const METADATA_OVER_BINDFS: f64 = 0.5;
const SEQUENTIAL_OVER_BINDFS: f64 = 0.5;
const TWO_MOUNTS_OVER_ONE: f64 = 0.8;

#[derive(Clone, Debug)]
pub struct FsBenchConfig {
    pub exe: PathBuf,
    pub scratch: PathBuf,
    pub systems: Vec<String>,
    pub only: Vec<String>,
    /// Empty files of the metadata part.
    pub files: usize,
    /// Entries of the directory `ls -l` lists.
    pub ls_entries: usize,
    pub sequential_bytes: u64,
    /// How many times Andrew's phase 1 copies the source's directories.
    pub andrew_copies: usize,
}

impl FsBenchConfig {
    fn runs(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == part)
    }
}

fn point(t: &Target, phase: &Phase, workers: usize, variant: Option<&str>) -> Point {
    let mut p = Point::new("fs", &t.system, &t.mode, 1, 1, workers);
    p.operation = Some(phase.name.clone());
    p.variant = variant.map(str::to_string);
    p.elapsed_s = Some((phase.elapsed.as_secs_f64() * 1e4).round() / 1e4);
    match &phase.latencies {
        Some(lat) => p.measured(phase.ops, phase.elapsed, lat),
        None => {
            p.committed = phase.ops;
            let per_s = phase.ops as f64 / phase.elapsed.as_secs_f64().max(1e-9);
            p.throughput_per_s = (per_s * 10.0).round() / 10.0;
            p
        }
    }
}

/// Runs `body` (the system calls of a part) on a blocking thread.
async fn blocking<T: Send + 'static>(
    body: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(body)
        .await
        .map_err(|e| format!("a workload thread failed: {e}"))?
}

async fn target(cfg: &FsBenchConfig, system: &str, two: bool) -> Result<Target, String> {
    let root = &cfg.scratch;
    match system {
        "tutti" => Target::tutti(&cfg.exe, root, two).await,
        "local" => Target::local(root),
        "bindfs" => Target::bindfs(root).await,
        "glusterfs" => Target::glusterfs(root).await,
        "juicefs" => Target::juicefs(root).await,
        other => Err(format!(
            "no system {other:?}: the systems are {}",
            SYSTEMS.join(", ")
        )),
    }
}

/// Every part of `cfg.only` on every system of `cfg.systems`, each system set up afresh.
pub async fn run(
    cfg: &FsBenchConfig,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    if let Some(p) = cfg.only.iter().find(|p| !PARTS.contains(&p.as_str())) {
        return Err(format!("no part {p:?}: the parts are {}", PARTS.join(", ")));
    }
    if let Some(s) = cfg.systems.iter().find(|s| !SYSTEMS.contains(&s.as_str())) {
        return Err(format!(
            "no system {s:?}: the systems are {}",
            SYSTEMS.join(", ")
        ));
    }
    let mut points = vec![];
    for system in SYSTEMS
        .iter()
        .filter(|s| cfg.systems.iter().any(|c| c == *s))
    {
        let singles = PARTS[..5].iter().any(|p| cfg.runs(p));
        if singles {
            let t = target(cfg, system, false).await?;
            for p in one_system(cfg, &t).await? {
                progress(&p);
                points.push(p);
            }
        }
        if *system == "tutti" && cfg.runs("two-mounts") {
            for p in two_mounts(cfg).await? {
                progress(&p);
                points.push(p);
            }
        }
    }
    Ok(points)
}

/// The single-mount parts on `t`, each in a directory of its own.
async fn one_system(cfg: &FsBenchConfig, t: &Target) -> Result<Vec<Point>, String> {
    let mut phases = vec![];
    let dir = |name: &str| t.path.join(name);
    if cfg.runs("connectathon") {
        let d = dir("cthon");
        std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        phases.extend(blocking(move || fs_phases::connectathon(&d)).await?);
    }
    if cfg.runs("andrew") {
        let (d, copies) = (dir("andrew"), cfg.andrew_copies);
        std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        phases.extend(
            blocking(move || fs_phases::andrew(&d, Path::new(ANDREW_SOURCE), copies)).await?,
        );
    }
    if cfg.runs("metadata") {
        let (d, n) = (dir("metadata"), cfg.files);
        phases.extend(blocking(move || fs_phases::metadata(&d, n)).await?);
    }
    if cfg.runs("sequential") {
        let (d, bytes) = (t.path.clone(), cfg.sequential_bytes);
        phases.extend(blocking(move || fs_phases::sequential(&d, bytes)).await?);
    }
    if cfg.runs("ls") {
        let (d, n) = (dir("ls"), cfg.ls_entries);
        phases.extend(blocking(move || fs_phases::listing(&d, n)).await?);
    }
    Ok(phases.iter().map(|p| point(t, p, 1, None)).collect())
}

/// tutti's creates, stats and unlinks by two workers in one directory: through one mount,
/// then each through a mount of its own (two processes, one volume).
async fn two_mounts(cfg: &FsBenchConfig) -> Result<Vec<Point>, String> {
    let t = target(cfg, "tutti", true).await?;
    let second = t.second.clone().expect("two mounts");
    let n = cfg.files;
    let mut out = vec![];
    let one = t.path.join("one");
    let dirs = vec![one.clone(), one];
    for p in blocking(move || fs_phases::metadata_parallel(&dirs, n)).await? {
        out.push(point(&t, &p, 2, Some("one-mount")));
    }
    let dirs = vec![t.path.join("two"), second.join("two")];
    for p in blocking(move || fs_phases::metadata_parallel(&dirs, n)).await? {
        out.push(point(&t, &p, 2, Some("two-mounts")));
    }
    Ok(out)
}

// ---------------------------------------------------------------- the report

/// (system, operation, variant) → point.
type Index<'a> = BTreeMap<(&'a str, &'a str, Option<&'a str>), &'a Point>;

fn index(points: &[Point]) -> Index<'_> {
    points
        .iter()
        .filter(|p| p.experiment == "fs")
        .map(|p| {
            let op = p.operation.as_deref().unwrap_or("");
            ((p.system.as_str(), op, p.variant.as_deref()), p)
        })
        .collect()
}

fn systems_in(points: &[Point]) -> Vec<&'static str> {
    SYSTEMS
        .iter()
        .copied()
        .filter(|s| points.iter().any(|p| p.system == *s))
        .collect()
}

/// A table of one value per (phase, system).
fn table(
    md: &mut String,
    ix: &Index<'_>,
    systems: &[&str],
    phases: &[&str],
    value: impl Fn(&Point) -> String,
) {
    let _ = writeln!(md, "| phase | {} |", systems.join(" | "));
    let _ = writeln!(md, "| --- |{}", " ---: |".repeat(systems.len()));
    for phase in phases {
        let cells: Vec<String> = systems
            .iter()
            .map(|s| ix.get(&(*s, *phase, None)).map_or("–".into(), |p| value(p)))
            .collect();
        if cells.iter().any(|c| c != "–") {
            let _ = writeln!(md, "| {phase} | {} |", cells.join(" | "));
        }
    }
    md.push('\n');
}

fn ratio_line(md: &mut String, ix: &Index<'_>, op: &str, peer: &str, target: f64) {
    let (Some(t), Some(p)) = (ix.get(&("tutti", op, None)), ix.get(&(peer, op, None))) else {
        return;
    };
    let r = t.throughput_per_s / p.throughput_per_s;
    let _ = writeln!(
        md,
        "- {op}: tutti / {peer} = {r:.2} (target ≥ {target}): **{}**",
        if r >= target { "met" } else { "not met" }
    );
}

pub fn section(cfg: &FsBenchConfig, points: &[Point], command: &str) -> String {
    let ix = index(points);
    let systems = systems_in(points);
    let mut md = format!("{SECTION_BEGIN}\n## File system (`tutti bench fs`)\n\n");
    let _ = writeln!(
        md,
        "`{command}`: every system on this machine in one run, each mounted afresh. tutti-fs: a \
         4-node `log` cluster, one `tutti fs mount` with its defaults (coherent caching: reads \
         answered from what the mount validated while no other mount announced a write; every \
         operation durable when it returns). local: ext4. bindfs: the local disk through FUSE \
         (multithreaded). GlusterFS 10: one brick on the local disk. JuiceFS 1.3: metadata in \
         Redis with `appendfsync always`, data in a local directory. The FUSE peers run with \
         the kernel's attribute and entry caches off; tutti's kernel keeps no entries and \
         keeps attributes only while its lease vouches for them. Only tutti and JuiceFS make \
         each metadata change \
         durable before it returns. Read phases start with the kernel's caches dropped. One \
         process makes the calls, one at a time, except in the two-mount case.\n"
    );
    md += "### Connectathon (Sinfonia Fig. 22), seconds\n\n";
    let cthon: Vec<&str> = (points.iter())
        .filter_map(|p| p.operation.as_deref())
        .filter(|o| o.starts_with("cthon-"))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let seconds = |p: &Point| format!("{:.2}", p.elapsed_s.unwrap_or(0.0));
    table(&mut md, &ix, &systems, &cthon, seconds);
    let _ = writeln!(
        md,
        "### Modified Andrew (Sinfonia §7.2.1: `{ANDREW_SOURCE}`'s directories copied {} times, \
         its files copied once, every entry stated, every file read twice, a small program \
         made), seconds\n",
        cfg.andrew_copies
    );
    let andrew = [
        "andrew-1-mkdir",
        "andrew-2-copy",
        "andrew-3-stat-all",
        "andrew-4-read-twice",
        "andrew-5-make",
    ];
    table(&mut md, &ix, &systems, &andrew, seconds);
    let _ = writeln!(
        md,
        "### {} empty files in one directory, operations per second (p50 µs)\n",
        cfg.files
    );
    let per_s = |p: &Point| format!("{:.0} ({:.0})", p.throughput_per_s, p.p50_us);
    table(&mut md, &ix, &systems, &["create", "stat", "unlink"], per_s);
    for op in ["create", "stat", "unlink"] {
        ratio_line(&mut md, &ix, op, "juicefs", METADATA_OVER_JUICEFS);
        ratio_line(&mut md, &ix, op, "bindfs", METADATA_OVER_BINDFS);
    }
    let _ = writeln!(
        md,
        "\n### `ls -l` of a directory of {} entries, seconds (and the creates that filled it, per second)\n",
        cfg.ls_entries
    );
    table(&mut md, &ix, &systems, &["ls-l"], seconds);
    let rate = |p: &Point| format!("{:.0}/s", p.throughput_per_s);
    table(&mut md, &ix, &systems, &["ls-fill"], rate);
    let _ = writeln!(
        md,
        "### Sequential, {} MiB in 1 MiB calls (the write's fsync included), MiB/s\n",
        cfg.sequential_bytes >> 20
    );
    table(&mut md, &ix, &systems, &["seq-write", "seq-read"], |p| {
        format!("{:.0}", p.throughput_per_s)
    });
    for op in ["seq-write", "seq-read"] {
        ratio_line(&mut md, &ix, op, "bindfs", SEQUENTIAL_OVER_BINDFS);
    }
    two_mount_section(&mut md, &ix, cfg.files);
    let _ = write!(md, "\n{SECTION_END}");
    md
}

fn two_mount_section(md: &mut String, ix: &Index<'_>, files: usize) {
    if !ix.keys().any(|(_, _, v)| v.is_some()) {
        return;
    }
    let _ = writeln!(
        md,
        "\n### tutti, two workers on {files} files in one directory: one mount, or a mount each (two processes), per second\n\n\
         | operation | one mount | two mounts | two / one |\n| --- | ---: | ---: | ---: |"
    );
    for op in ["create", "stat", "unlink"] {
        let (Some(one), Some(two)) = (
            ix.get(&("tutti", op, Some("one-mount"))),
            ix.get(&("tutti", op, Some("two-mounts"))),
        ) else {
            continue;
        };
        let r = two.throughput_per_s / one.throughput_per_s;
        let _ = writeln!(
            md,
            "| {op} | {:.0} | {:.0} | {r:.2}{} |",
            one.throughput_per_s,
            two.throughput_per_s,
            if r >= TWO_MOUNTS_OVER_ONE {
                ""
            } else {
                " (target ≥ 0.8 not met)"
            }
        );
    }
}

/// Writes `results/fs.json` and the file-system section of `RESULTS.md` under `out`.
pub fn write(
    out: &Path,
    cfg: &FsBenchConfig,
    points: &[Point],
    command: &str,
) -> Result<(), String> {
    let md = section(cfg, points, command);
    write_results(out, "fs.json", points, SECTION_BEGIN, SECTION_END, &md)
}
