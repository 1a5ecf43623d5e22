//! The shared log's workload over real processes (`tutti chaos --workload log`): the loops a
//! client process runs (`tutti log-workload`: an appender tagging each entry uniquely, or a
//! reader following one stream), the supervisor of those processes, which reads back what
//! each incarnation printed, and the final check against the log (`tutti_workload::log`).

use crate::supervisor::Supervisor;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;
use tutti_log::{Found, Hole, Log, LogError, StreamId};
use tutti_workload::log::{Acked, Held, LogHistory, Reading, Unsure};

/// The streams appenders pick one or two of; each has one reader.
pub const STREAMS: [StreamId; 3] = [1, 2, 3];
/// Concurrent appends per appender process.
pub const APPEND_TASKS: usize = 4;
/// The log's name in a chaos run.
pub const LOG: &str = "chaos";
/// Reads of the final check in flight at once.
const CHECK_READS: usize = 64;

/// An appender process: `APPEND_TASKS` tasks, each appending entries tagged
/// `client.incarnation.task.seq` to one or two streams, until killed. Prints `begin TAG
/// STREAMS` before an append, then `acked POSITION TAG` or `error TAG WHY`.
pub async fn append_forever(log: Log, client: u64, incarnation: u64) {
    let tasks = (0..APPEND_TASKS).map(|task| {
        let log = log.clone();
        tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::from_entropy();
            for seq in 0u64.. {
                let mut streams: Vec<StreamId> = Vec::new();
                while streams.len() < rng.gen_range(1..=2) {
                    let s = STREAMS[rng.gen_range(0..STREAMS.len())];
                    if !streams.contains(&s) {
                        streams.push(s);
                    }
                }
                let tag = format!("{client}.{incarnation}.{task}.{seq}");
                let list: Vec<String> = streams.iter().map(ToString::to_string).collect();
                println!("begin {tag} {}", list.join(","));
                match log.append(tag.clone().into_bytes(), &streams).await {
                    Ok(position) => println!("acked {position} {tag}"),
                    Err(e) => {
                        println!("error {tag} {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        })
    });
    futures::future::join_all(tasks).await;
}

/// A reader process: from the log's trim point, every entry of `stream` in log order, until
/// killed. Prints `start FROM`, then `entry POSITION HEX` per entry and `synced FLOOR` each
/// time every entry below FLOOR has been printed.
pub async fn read_forever(log: Log, stream: StreamId) {
    let from = loop {
        match log.stat().await {
            Ok(stat) => break stat.words.iter().map(|w| w.trim).max().unwrap_or(0),
            Err(e) => {
                println!("error {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    println!("start {from}");
    let mut reader = log.stream(stream, from);
    loop {
        match reader.readnext().await {
            Ok(Some((position, payload))) => {
                println!("entry {position} {}", hex(&payload));
                if reader.ready() == 0 {
                    println!("synced {}", reader.floor());
                }
            }
            Ok(None) => {
                println!("synced {}", reader.floor());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                println!("error {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// What an appender's output says: its acknowledged appends, and those begun and never
/// acknowledged (killed, or an error: their outcome is unknown).
fn parse_appender(text: &str) -> (Vec<Acked>, Vec<Unsure>) {
    let mut begun: BTreeMap<&str, Vec<StreamId>> = BTreeMap::new();
    let mut acked = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match words[..] {
            ["begin", tag, streams] => {
                let streams = streams.split(',').filter_map(|s| s.parse().ok()).collect();
                begun.insert(tag, streams);
            }
            ["acked", position, tag] => {
                if let (Ok(position), Some(streams)) = (position.parse(), begun.remove(tag)) {
                    acked.push(Acked {
                        position,
                        streams,
                        payload: tag.as_bytes().to_vec(),
                    });
                }
            }
            _ => {}
        }
    }
    let unknown = (begun.into_iter())
        .map(|(tag, streams)| (streams, tag.as_bytes().to_vec()))
        .collect();
    (acked, unknown)
}

/// What a reader's output says: where it started, the entries it printed, and how far it
/// had synced (the start, if it never said).
fn parse_reader(reader: String, stream: StreamId, text: &str) -> Option<Reading> {
    let mut reading: Option<Reading> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        match (&words[..], reading.as_mut()) {
            (["start", from], None) => {
                let from = from.parse().ok()?;
                reading = Some(Reading {
                    reader: reader.clone(),
                    stream,
                    from,
                    to: from,
                    entries: vec![],
                });
            }
            (["entry", position, payload], Some(r)) => {
                if let (Ok(p), Some(payload)) = (position.parse(), unhex(payload)) {
                    r.entries.push((p, payload));
                }
            }
            (["synced", floor], Some(r)) => {
                if let Ok(floor) = floor.parse() {
                    r.to = floor;
                }
            }
            _ => {}
        }
    }
    reading
}

/// The log's client processes: `appender-N` and `reader-S`, each restarted as a new
/// incarnation with its own output file.
pub struct LogClients {
    exe: PathBuf,
    manager: String,
    dir: PathBuf,
    pub appenders: u64,
    processes: Supervisor,
    /// Every incarnation's output, by process name, in order.
    outputs: BTreeMap<String, Vec<PathBuf>>,
    /// Extra flags of each process (its routes through the chaos proxy).
    pub flags: BTreeMap<String, Vec<String>>,
}

impl LogClients {
    pub fn new(exe: &Path, manager: &str, dir: &Path, appenders: u64) -> LogClients {
        LogClients {
            exe: exe.to_path_buf(),
            manager: manager.into(),
            dir: dir.to_path_buf(),
            appenders,
            processes: Supervisor::new(),
            outputs: BTreeMap::new(),
            flags: BTreeMap::new(),
        }
    }

    /// Every client process's name.
    pub fn names(&self) -> Vec<String> {
        (0..self.appenders)
            .map(|i| format!("appender-{i}"))
            .chain(STREAMS.iter().map(|s| format!("reader-{s}")))
            .collect()
    }

    pub fn start(&mut self, name: &str) -> std::io::Result<()> {
        let outputs = self.outputs.entry(name.to_string()).or_default();
        let incarnation = outputs.len() + 1;
        let out = self.dir.join(format!("{name}-{incarnation}.out"));
        let mut cmd = Command::new(&self.exe);
        cmd.args(["log-workload", "--cluster", &self.manager, "--log", LOG])
            .args(["--deadline-ms", "30000"]);
        match (name.strip_prefix("appender-"), name.strip_prefix("reader-")) {
            (Some(id), _) => cmd.args(["--appender", id, "--incarnation"]),
            (_, Some(stream)) => cmd.args(["--reader", stream, "--incarnation"]),
            _ => return Err(std::io::Error::other(format!("no log client {name}"))),
        };
        cmd.arg(incarnation.to_string())
            .args(self.flags.get(name).into_iter().flatten());
        self.processes.start(name, cmd, &out)?;
        outputs.push(out);
        Ok(())
    }

    pub fn start_all(&mut self) -> std::io::Result<()> {
        self.names().iter().try_for_each(|n| self.start(n))
    }

    /// `kill -9` the client process `name`.
    pub fn kill(&mut self, name: &str) {
        self.processes.kill(name);
    }

    pub fn kill_all(&mut self) {
        for name in self.names() {
            self.kill(&name);
        }
    }

    /// How far every reader has synced, at least (its current incarnation's last `synced`
    /// or its start); `None` while one has not said where it starts. The log may be
    /// trimmed up to there without a reader missing an entry.
    pub fn readers_synced(&self) -> Option<u64> {
        STREAMS
            .iter()
            .map(|s| {
                let out = self.outputs.get(&format!("reader-{s}"))?.last()?;
                let text = std::fs::read_to_string(out).ok()?;
                parse_reader(String::new(), *s, &text).map(|r| r.to)
            })
            .min()
            .flatten()
    }

    /// Appends acknowledged so far, over every incarnation.
    pub fn acked(&self) -> usize {
        self.outputs
            .iter()
            .filter(|(name, _)| name.starts_with("appender-"))
            .flat_map(|(_, outs)| outs)
            .map(|out| {
                let text = std::fs::read_to_string(out).unwrap_or_default();
                text.lines().filter(|l| l.starts_with("acked ")).count()
            })
            .sum()
    }

    /// What every incarnation of every client printed.
    pub fn history(&self) -> LogHistory {
        history(&self.dir)
    }
}

/// What every incarnation of every log client whose output is in `dir` printed
/// (`appender-N-I.out`, `reader-S-I.out`).
pub fn history(dir: &Path) -> LogHistory {
    let mut h = LogHistory::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for path in files {
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str()?.strip_suffix(".out"))
        else {
            continue;
        };
        let Some((name, incarnation)) = stem.rsplit_once('-') else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if name.starts_with("appender-") {
            let (acked, unknown) = parse_appender(&text);
            h.acked.extend(acked);
            h.unknown.extend(unknown);
        } else if let Some(Ok(stream)) = name.strip_prefix("reader-").map(str::parse) {
            let reader = format!("{name} (incarnation {incarnation})");
            h.readings.extend(parse_reader(reader, stream, &text));
        }
    }
    h
}

impl Drop for LogClients {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// What the final check saw.
#[derive(Debug, Default)]
pub struct LogCheck {
    pub acked: u64,
    pub unknown: u64,
    pub readings: u64,
    pub entries_read: u64,
    pub trim: u64,
    pub tail: u64,
}

/// Once the clients are stopped: each stream read once more from the trim point, every
/// acknowledged append above it read at its position, and the history checked.
pub async fn check(log: &Log, mut history: LogHistory) -> Result<LogCheck, Vec<String>> {
    let fail = |e: LogError| vec![format!("final check of the log: {e}")];
    let stat = log.stat().await.map_err(fail)?;
    let trim = stat.words.iter().map(|w| w.trim).max().unwrap_or(0);
    for &stream in &STREAMS {
        let mut reader = log.stream(stream, trim);
        let mut entries = Vec::new();
        while let Some(entry) = reader.readnext().await.map_err(fail)? {
            entries.push(entry);
        }
        history.readings.push(Reading {
            reader: "final".into(),
            stream,
            from: trim,
            to: reader.floor(),
            entries,
        });
    }
    let positions: Vec<u64> = (history.acked.iter())
        .map(|a| a.position)
        .filter(|&p| p >= trim)
        .collect();
    let until = Instant::now() + Duration::from_secs(120);
    let reads = futures::stream::iter(positions)
        .map(|p| async move { (p, log.read_with(p, Hole::Report, until).await) })
        .buffer_unordered(CHECK_READS);
    let found: Vec<(u64, Result<Found, LogError>)> = reads.collect().await;
    let mut held: BTreeMap<u64, Held> = BTreeMap::new();
    for (p, f) in found {
        held.insert(
            p,
            match f.map_err(fail)? {
                Found::Data { streams, payload } => Held::Data {
                    streams: streams.into_iter().map(|s| s.stream).collect(),
                    payload,
                },
                Found::Junk => Held::Junk,
                Found::Empty => Held::Empty,
                Found::Trimmed { .. } => Held::Trimmed,
            },
        );
    }
    let mut violations: Vec<String> = history
        .check_appends(|p| held.get(&p).cloned().unwrap_or(Held::Trimmed))
        .iter()
        .chain(&history.check_readings())
        .map(ToString::to_string)
        .collect();
    violations.truncate(100);
    if !violations.is_empty() {
        return Err(violations);
    }
    Ok(LogCheck {
        acked: history.acked.len() as u64,
        unknown: history.unknown.len() as u64,
        readings: history.readings.len() as u64,
        entries_read: history
            .readings
            .iter()
            .map(|r| r.entries.len() as u64)
            .sum(),
        trim,
        tail: stat.tail.tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_cut_anywhere_parse_into_what_was_seen() {
        let appender = "begin 0.1.0.0 1,2\nacked 7 0.1.0.0\nbegin 0.1.1.0 3\nbegin 0.1.0.1 2\nerror 0.1.0.1 deadline\nacked 9 0.1.1.0\nbegin 0.1.0.2 1\nack";
        let (acked, unknown) = parse_appender(appender);
        assert_eq!(acked.iter().map(|a| a.position).collect::<Vec<_>>(), [7, 9]);
        assert_eq!(acked[0].streams, [1, 2]);
        assert_eq!(
            unknown,
            [
                (vec![2], b"0.1.0.1".to_vec()),
                (vec![1], b"0.1.0.2".to_vec())
            ]
        );
        let reader = "start 5\nentry 6 6162\nsynced 7\nentry 9 63\nsyn";
        let r = parse_reader("r".into(), 2, reader).expect("started");
        assert_eq!((r.from, r.to), (5, 7));
        assert_eq!(r.entries, [(6, b"ab".to_vec()), (9, b"c".to_vec())]);
        assert_eq!(parse_reader("r".into(), 2, "error no sequencer\n"), None);
    }
}
