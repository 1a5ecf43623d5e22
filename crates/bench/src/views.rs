//! N views in `tutti bench objects` (Tango §6.1, Fig. 8 right): linearizable reads of one
//! register from N client processes, each with its own view, while this process writes the
//! register at a fixed rate; the reads of each view and their sum, for N = 1, 2, 4, 8.
//! Also the paced writer that the history experiment uses.

use crate::log::{closed_loop, label};
use crate::objects::{four_node_log, host_one, Read, VALUE_BYTES};
use crate::suite::ScratchCluster;
use crate::Point;
use std::future::Future;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tutti_log::Log;
use tutti_tango::{Kind, RegisterRef};

pub const VIEW_COUNTS: [usize; 4] = [1, 2, 4, 8];
/// The writes the register takes meanwhile. Tango's figure has 10 K writes/s on 18 servers;
/// here, with every process on 2 cores, views fell behind that from 4 up (each read plays
/// what was written since the last, walking 16 backpointers a round of reads).
pub const WRITES_PER_S: u64 = 2_000;
/// Reads in flight in each view's process.
pub const READS_OUTSTANDING: usize = 16;
const LOG: &str = "views";
const REGISTER: &str = "viewed";
/// Writes of the paced writer in flight, at most (it falls behind rather than pile up).
const PACED_IN_FLIGHT_MAX: usize = 256;
/// How long a view's process may take to open its view.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Operations started at `per_s` a second (in bursts every millisecond) until dropped,
/// whatever each takes; `done` counts those that succeeded.
pub(crate) struct Paced {
    task: tokio::task::JoinHandle<()>,
    pub(crate) done: Arc<AtomicU64>,
}

impl Drop for Paced {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn paced<F, Fut>(per_s: u64, op: F) -> Paced
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let counted = done.clone();
    let task = tokio::spawn(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(PACED_IN_FLIGHT_MAX));
        let start = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut started = 0u64;
        loop {
            tick.tick().await;
            let due = (start.elapsed().as_secs_f64() * per_s as f64) as u64;
            while started < due {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    break;
                };
                started += 1;
                let (fut, counted) = (op(), counted.clone());
                tokio::spawn(async move {
                    if fut.await {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(slot);
                });
            }
            // Behind with every slot taken: what could not start is dropped, not owed.
            started = started.max(due.saturating_sub(PACED_IN_FLIGHT_MAX as u64));
        }
    });
    Paced { task, done }
}

/// A view's process (`tutti bench objects-client reads`): opens the register, prints `ready`,
/// waits for a line on stdin, reads with `outstanding` in flight for `seconds` and prints
/// its point as JSON.
pub async fn reader(log: Log, outstanding: usize, seconds: f64) -> Result<(), String> {
    let (tango, oid) = host_one(&log, REGISTER, Kind::Register).await?;
    let register = RegisterRef(oid);
    println!("ready");
    let go = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()));
    go.await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let p = closed_loop(
        label("objects-views", "tutti", "log", outstanding, "read"),
        outstanding,
        Duration::from_secs_f64(seconds),
        |_| {
            let tango = tango.clone();
            async move { Ok(Read { tango, register }) }
        },
    )
    .await?;
    println!("{}", serde_json::to_string(&p).map_err(|e| e.to_string())?);
    Ok(())
}

struct View {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl View {
    async fn start(exe: &Path, dir: &Path, seconds: f64) -> Result<View, String> {
        let mut child = tokio::process::Command::new(exe)
            .args(["bench", "objects-client", "reads"])
            .arg("--cluster")
            .arg(dir)
            .args(["--log", LOG, "--outstanding"])
            .arg(READS_OUTSTANDING.to_string())
            .arg("--seconds")
            .arg(seconds.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("start a view's process: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let mut view = View {
            child,
            lines: BufReader::new(stdout).lines(),
        };
        let ready = tokio::time::timeout(READY_TIMEOUT, view.line()).await;
        match ready {
            Ok(Ok(line)) if line == "ready" => Ok(view),
            Ok(Ok(line)) => Err(format!("a view's process said {line:?}, not ready")),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("a view's process did not open its view within 60 s".into()),
        }
    }

    async fn line(&mut self) -> Result<String, String> {
        match self.lines.next_line().await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err("a view's process ended early (its errors are above)".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn go(&mut self) -> Result<(), String> {
        let stdin = self.child.stdin.as_mut().expect("piped");
        stdin.write_all(b"go\n").await.map_err(|e| e.to_string())
    }

    async fn point(mut self) -> Result<Point, String> {
        let line = self.line().await?;
        let _ = self.child.wait().await;
        serde_json::from_str(&line).map_err(|e| format!("a view's point {line:?}: {e}"))
    }
}

/// For each N, N view processes read at once while this process writes at
/// `WRITES_PER_S`: one point per N (`views`), its throughput the sum of the views'.
pub async fn run(
    exe: &Path,
    c: &ScratchCluster,
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let log = four_node_log(&c.cluster, LOG, 512, 128 << 20, Some(16)).await?;
    let (tango, oid) = host_one(&log, REGISTER, Kind::Register).await?;
    let register = RegisterRef(oid);
    let writer = paced(WRITES_PER_S, move || {
        let tango = tango.clone();
        async move { register.set(&tango, &[0x5a; VALUE_BYTES]).await.is_ok() }
    });
    let mut points = Vec::new();
    for n in VIEW_COUNTS {
        let mut views = Vec::with_capacity(n);
        for _ in 0..n {
            views.push(View::start(exe, c.dir(), seconds).await?);
        }
        let written = writer.done.load(Ordering::Relaxed);
        let start = std::time::Instant::now();
        for view in &mut views {
            view.go().await?;
        }
        let mut each = Vec::with_capacity(n);
        for view in views {
            each.push(view.point().await?);
        }
        let writes = writer.done.load(Ordering::Relaxed) - written;
        let mut p = label(
            "objects-views",
            "tutti",
            "log",
            n * READS_OUTSTANDING,
            "read",
        );
        p.views = Some(n as u64);
        p.throughput_per_s = each.iter().map(|v| v.throughput_per_s).sum();
        p.p50_us = each.iter().map(|v| v.p50_us).sum::<f64>() / n as f64;
        p.p99_us = each.iter().map(|v| v.p99_us).fold(0.0, f64::max);
        p.p999_us = each.iter().map(|v| v.p999_us).fold(0.0, f64::max);
        p.max_us = each.iter().map(|v| v.max_us).fold(0.0, f64::max);
        p.committed = each.iter().map(|v| v.committed).sum();
        p.errors = each.iter().map(|v| v.errors).sum();
        p.runs = each.iter().map(|v| v.throughput_per_s).collect();
        p.background_writes_per_s = Some(writes as f64 / start.elapsed().as_secs_f64());
        progress(&p);
        points.push(p);
    }
    drop(writer);
    Ok(points)
}

/// The RESULTS.md part: reads against views.
pub fn section(points: &[Point], seconds: f64) -> String {
    use std::fmt::Write as _;
    let mut md = format!(
        "\n### Linearizable reads with N views\n\nOne register, written at {WRITES_PER_S} writes/s by the bench's own client; N client processes, each with its own view, read it (linearizable: each read plays the register's stream to the tail) with {READS_OUTSTANDING} reads in flight each, all at once for {seconds} s (Tango §6.1, Fig. 8 right, where each view issues 10 K reads/s and the writes are 10 K/s). The log keeps 16 backpointers per stream (a read that finds new entries walks back to the last it played, 16 a round of reads). Reads per second of all views together and of each; p50 is the views' mean, p99 the worst view's, in µs; writes per second achieved meanwhile. The views share this machine's 2 cores with the 4 memory nodes, the sequencer and the writer.\n\n| views | reads/s | each view's reads/s | p50 / p99 µs | writes/s |\n| --- | --- | --- | --- | --- |\n"
    );
    for p in points.iter().filter(|p| p.experiment == "objects-views") {
        let each: Vec<String> = p.runs.iter().map(|r| format!("{r:.0}")).collect();
        let _ = writeln!(
            md,
            "| {} | {:.0} | {} | {:.0} / {:.0} | {:.0} |",
            p.views.unwrap_or(0),
            p.throughput_per_s,
            each.join(", "),
            p.p50_us,
            p.p99_us,
            p.background_writes_per_s.unwrap_or(0.0)
        );
    }
    md
}
