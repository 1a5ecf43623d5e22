//! History in `tutti bench objects` (Tango §3.1, checkpoints and forget): a map updated at
//! a fixed rate for 10 minutes while a maintainer compacts it every 5 s (checkpoint, forget,
//! trim); every minute a new client process rebuilds the map's view from the log, and its
//! replay time and peak memory stay flat while the history keeps growing.

use crate::log::label;
use crate::objects::{four_node_log, host_one};
use crate::suite::ScratchCluster;
use crate::views::paced;
use crate::Point;
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_log::Log;
use tutti_tango::{Kind, MapRef};

pub const UPDATES_PER_S: u64 = 10_000;
/// The map's keys: its view (and checkpoint) holds at most this many values.
pub const KEYS: u64 = 2_000;
const VALUE_BYTES: usize = 64;
pub const COMPACT_EVERY: Duration = Duration::from_secs(5);
/// The first rebuild, once the map holds every key; then one a minute.
const FIRST_REBUILD: Duration = Duration::from_secs(10);
const LOG: &str = "history";
const MAP: &str = "history";

type Table = std::collections::HashMap<Vec<u8>, Vec<u8>>;

/// What a rebuilding process reports.
#[derive(Serialize, Deserialize)]
pub struct Rebuilt {
    pub replay_us: u64,
    pub rss_before_bytes: u64,
    pub peak_rss_bytes: u64,
    pub keys: u64,
}

/// A field of /proc/self/status in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    let line = (status.lines())
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| format!("no {field} in /proc/self/status"))?;
    let kib: u64 =
        (line.trim().trim_end_matches("kB").trim().parse()).map_err(|e| format!("{field}: {e}"))?;
    Ok(kib * 1024)
}

/// The rebuilding process (`tutti bench objects-client replay`): opens the map's view,
/// timing it, and prints what it took as JSON.
pub async fn rebuild(log: Log) -> Result<(), String> {
    let rss_before_bytes = status_bytes("VmRSS")?;
    let start = Instant::now();
    let (tango, oid) = host_one(&log, MAP, Kind::Map).await?;
    let replay_us = start.elapsed().as_micros() as u64;
    let map = MapRef::<Table>::new(oid);
    let keys = map.list(&tango).await.map_err(|e| e.to_string())?.len() as u64;
    let rebuilt = Rebuilt {
        replay_us,
        rss_before_bytes,
        peak_rss_bytes: status_bytes("VmHWM")?,
        keys,
    };
    println!(
        "{}",
        serde_json::to_string(&rebuilt).map_err(|e| e.to_string())?
    );
    Ok(())
}

async fn rebuild_in_a_new_process(exe: &Path, dir: &Path) -> Result<Rebuilt, String> {
    let out = tokio::process::Command::new(exe)
        .args(["bench", "objects-client", "replay", "--cluster"])
        .arg(dir)
        .args(["--log", LOG])
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("start the rebuilding process: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last() {
        Some(line) if out.status.success() => {
            serde_json::from_str(line).map_err(|e| format!("its report {line:?}: {e}"))
        }
        _ => Err(format!(
            "the rebuilding process failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// `minutes` of updates at `UPDATES_PER_S` with a compaction every `COMPACT_EVERY`; a
/// point for each rebuild (after 10 s, then every minute).
pub async fn run(
    exe: &Path,
    scratch: &Path,
    minutes: u64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let dir = scratch.join("tutti-history");
    let c = ScratchCluster::start(exe, dir.clone(), 4, "log").await?;
    // 2 KiB slots hold the map's checkpoint (about 190 KB) in at most 245 parts; 160 MiB of
    // each node holds 320 K positions, six rounds of compaction at the update rate. 16
    // backpointers: a new view walks the stream from the trim point 16 entries a round.
    let log = four_node_log(&c.cluster, LOG, 2048, 160 << 20, Some(16)).await?;
    let (tango, oid) = host_one(&log, MAP, Kind::Map).await?;
    let map = MapRef::<Table>::new(oid);
    let writer_tango = tango.clone();
    let writer = paced(UPDATES_PER_S, move || {
        let tango = writer_tango.clone();
        let key = format!("k{}", rand::thread_rng().gen_range(0..KEYS));
        async move {
            let put = map.put_blind(&tango, key.as_bytes(), &[0x5a; VALUE_BYTES]);
            put.await.is_ok()
        }
    });
    let trimmed = Arc::new(AtomicU64::new(0));
    let compactor = {
        let trimmed = trimmed.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(COMPACT_EVERY).await;
                match tango.compact().await {
                    Ok((_, trim)) => trimmed.store(trim, Ordering::Relaxed),
                    Err(e) => tracing::warn!(%e, "a compaction failed"),
                }
            }
        })
    };
    let start = Instant::now();
    let mut points = Vec::new();
    let due =
        std::iter::once(FIRST_REBUILD).chain((1..=minutes).map(|m| Duration::from_secs(60 * m)));
    for at in due {
        tokio::time::sleep(at.saturating_sub(start.elapsed())).await;
        let rebuilt = rebuild_in_a_new_process(exe, &dir).await;
        let elapsed = start.elapsed().as_secs_f64();
        let rebuilt = match rebuilt {
            Ok(r) => r,
            Err(e) => {
                compactor.abort();
                return Err(e);
            }
        };
        let tail = log.check().await.map_err(|e| e.to_string())?.tail;
        let mut p = label("objects-history", "tutti", "log", 1, "rebuild");
        p.elapsed_s = Some((elapsed * 10.0).round() / 10.0);
        p.history_positions = Some(tail);
        p.trimmed_below = Some(trimmed.load(Ordering::Relaxed));
        p.replay_us = Some(rebuilt.replay_us);
        p.rss_bytes = Some(rebuilt.peak_rss_bytes);
        p.rss_before_bytes = Some(rebuilt.rss_before_bytes);
        p.items = Some(rebuilt.keys);
        p.background_writes_per_s = Some(writer.done.load(Ordering::Relaxed) as f64 / elapsed);
        progress(&p);
        points.push(p);
    }
    compactor.abort();
    drop(writer);
    drop(c);
    Ok(points)
}

/// The RESULTS.md part: the rebuilds over time.
pub fn section(points: &[Point]) -> String {
    use std::fmt::Write as _;
    let mib = |b: Option<u64>| b.unwrap_or(0) as f64 / (1 << 20) as f64;
    let mut md = format!(
        "\n### History: checkpoint, forget and trim over time\n\nA map of {KEYS} keys takes {UPDATES_PER_S} updates/s ({VALUE_BYTES} B values) from one client, which also compacts every {} s (`Tango::compact`: every hosted object and the directory checkpointed at one position, their history below it forgotten, the log trimmed there). At each time below, a new client process rebuilds the map's view (opening it: latest checkpoint, then the stream's entries after it) and reports how long that took and its peak resident set (its resident set before opening in brackets). Positions: the log's tail, i.e. the history written so far; trimmed below: the log's trim point after the last compaction.\n\n| after s | positions | trimmed below | keys | rebuild ms | peak RSS MiB | updates/s |\n| --- | --- | --- | --- | --- | --- | --- |\n",
        COMPACT_EVERY.as_secs()
    );
    for p in points.iter().filter(|p| p.experiment == "objects-history") {
        let _ = writeln!(
            md,
            "| {:.0} | {} | {} | {} | {:.0} | {:.1} ({:.1}) | {:.0} |",
            p.elapsed_s.unwrap_or(0.0),
            p.history_positions.unwrap_or(0),
            p.trimmed_below.unwrap_or(0),
            p.items.unwrap_or(0),
            p.replay_us.unwrap_or(0) as f64 / 1000.0,
            mib(p.rss_bytes),
            mib(p.rss_before_bytes),
            p.background_writes_per_s.unwrap_or(0.0)
        );
    }
    md
}
