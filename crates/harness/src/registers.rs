//! Per-key registers for linearizability checking: read, write and compare-and-swap on
//! 8-byte keys spread over the memory nodes, each recorded as a call and a return in a
//! history file that `tools/linearizability` (Porcupine) checks. Every operation also reads
//! a key on another node, so each is a two-node minitransaction (2PC, or a read-only
//! release) and its recovery paths are what the history exercises.

use rand::Rng;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use tutti_client::{Cluster, ExecError, Minitx};
use tutti_wire::NodeId;

const REGISTERS_BASE: u64 = 2 << 20;
/// Keys live at node `key % nodes + 1`; the companion key `key + 1` is on the next node.
pub const KEYS: u64 = 256;

/// One line of a history file: the call of an operation or its return. An operation with
/// a call and no return (its client was killed) has an unknown outcome.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Event {
    Call {
        id: String,
        t: u64,
        key: u64,
        #[serde(flatten)]
        op: Op,
        /// The operation this read of a second key belongs to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part_of: Option<String>,
    },
    Return {
        id: String,
        t: u64,
        out: Out,
        /// The value a read returned, or a failed compare found.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        value: Option<u64>,
    },
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(tag = "f", rename_all = "lowercase")]
pub enum Op {
    Read,
    Write { value: u64 },
    Cas { expect: u64, value: u64 },
}

/// How an operation ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Out {
    /// Took effect (a read: returned `value`).
    Ok,
    /// A compare-and-swap whose compare failed: the key held `value`, not `expect`.
    Mismatch,
    /// Definitely took no effect (every attempt aborted, or the request was refused).
    Aborted,
    /// May or may not have taken effect.
    Unknown,
}

/// The register a key names.
pub fn register(key: u64, nodes: NodeId) -> (NodeId, u64) {
    let n = u64::from(nodes);
    ((key % n) as NodeId + 1, REGISTERS_BASE + (key / n) * 8)
}

/// Nanoseconds of CLOCK_MONOTONIC: one clock for every process of the machine, so the
/// histories of several client processes share a real-time order.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Appends events to a history file, one line per `write`: a process killed with `-9` loses
/// no event it recorded, so a call recorded before its minitransaction was sent is never
/// missing from the history.
pub struct History {
    file: Mutex<File>,
}

impl History {
    pub fn create(path: &std::path::Path) -> std::io::Result<History> {
        Ok(History {
            file: Mutex::new(File::create(path)?),
        })
    }

    pub fn record(&self, event: &Event) {
        let mut line = serde_json::to_vec(event).expect("events serialise");
        line.push(b'\n');
        self.file
            .lock()
            .expect("history poisoned")
            .write_all(&line)
            .expect("history file writable");
    }
}

/// One task of a client process: issues register operations and records them.
pub struct RegisterClient<'a> {
    pub cluster: &'a Cluster,
    pub history: &'a History,
    pub nodes: NodeId,
    /// Unique among every task of every process of a run (e.g. `pid.task`).
    pub name: String,
    seq: u64,
    /// The last value this task saw in each key: the expected value of its next CAS.
    seen: HashMap<u64, u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterOp {
    Read,
    Write,
    Cas,
}

impl<'a> RegisterClient<'a> {
    pub fn new(cluster: &'a Cluster, history: &'a History, nodes: NodeId, name: String) -> Self {
        RegisterClient {
            cluster,
            history,
            nodes,
            name,
            seq: 0,
            seen: HashMap::new(),
        }
    }

    fn call(&mut self, t: u64, key: u64, op: Op, part_of: Option<String>) -> String {
        self.seq += 1;
        let id = format!("{}.{}", self.name, self.seq);
        self.history.record(&Event::Call {
            id: id.clone(),
            t,
            key,
            op,
            part_of,
        });
        id
    }

    fn ret(&mut self, id: String, t: u64, out: Out, value: Option<u64>) {
        self.history.record(&Event::Return { id, t, out, value });
    }

    /// Runs one operation on a random key; returns how it ended.
    pub async fn run(&mut self, which: RegisterOp, rng: &mut impl Rng) -> Out {
        let key = rng.gen_range(0..KEYS);
        let other = (key + 1) % KEYS;
        let ((n, a), (on, oa)) = (register(key, self.nodes), register(other, self.nodes));
        let value = rng.gen_range(1..u64::MAX);
        let (op, tx) = match which {
            RegisterOp::Read => (Op::Read, Minitx::new().class("register-read").read(n, a, 8)),
            RegisterOp::Write => (
                Op::Write { value },
                Minitx::new()
                    .class("register-write")
                    .write(n, a, value.to_le_bytes().to_vec()),
            ),
            RegisterOp::Cas => {
                let expect = self.seen.get(&key).copied().unwrap_or(0);
                (
                    Op::Cas { expect, value },
                    Minitx::new()
                        .class("register-cas")
                        .compare(n, a, expect.to_le_bytes().to_vec())
                        .read(n, a, 8)
                        .write(n, a, value.to_le_bytes().to_vec()),
                )
            }
        };
        let tx = tx.read(on, oa, 8);
        let t = now_ns();
        let id = self.call(t, key, op, None);
        let other_id = self.call(t, other, Op::Read, Some(id.clone()));
        let result = self.cluster.exec_and_commit(&tx).await;
        let t = now_ns();
        let (out, other_out, reads) = match result {
            Ok(o) if o.committed => (Out::Ok, Out::Ok, o.reads),
            // The reads of a failed compare are still consistent: keep them to learn the
            // key's value, but record only the mismatch.
            Ok(o) => (Out::Mismatch, Out::Aborted, o.reads),
            Err(ExecError::ReadsLost { .. }) => (Out::Ok, Out::Unknown, vec![]),
            Err(ExecError::OutcomeUnknown { .. }) => (Out::Unknown, Out::Unknown, vec![]),
            Err(_) => (Out::Aborted, Out::Aborted, vec![]),
        };
        let read_value = |i: usize| {
            (reads.get(i)).map(|r| u64::from_le_bytes(r[..8].try_into().expect("an 8-byte read")))
        };
        let (own, companion) = match op {
            Op::Read | Op::Cas { .. } => (read_value(0), read_value(1)),
            Op::Write { .. } => (None, read_value(0)),
        };
        let out = match (op, out, own) {
            (Op::Read, Out::Ok, None) => Out::Unknown,
            _ => out,
        };
        match (op, out) {
            (Op::Read, Out::Ok) | (Op::Cas { .. }, Out::Mismatch) => {
                if let Some(v) = own {
                    self.seen.insert(key, v);
                }
            }
            (Op::Write { value } | Op::Cas { value, .. }, Out::Ok) => {
                self.seen.insert(key, value);
            }
            _ => {}
        }
        if let (Some(v), Out::Ok) = (companion, other_out) {
            self.seen.insert(other, v);
        }
        let own_value = match (op, out) {
            (Op::Read, _) | (Op::Cas { .. }, Out::Mismatch) => own,
            _ => None,
        };
        self.ret(id, t, out, own_value);
        self.ret(
            other_id,
            t,
            other_out,
            companion.filter(|_| other_out == Out::Ok),
        );
        out
    }
}

/// Porcupine's verdict on a run's histories, and the operations they hold.
#[derive(Debug, Default)]
pub struct Verdict {
    pub linearizable: bool,
    pub summary: String,
    pub reads: OpCounts,
    pub writes: OpCounts,
    pub cases: OpCounts,
}

/// The history files a run left in `dir`.
pub fn history_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("history-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Counts the operations of `files` (not the reads of second keys) and runs the Porcupine checker in `checker` on them.
/// A torn last line (a client killed while writing it) is an operation that never
/// returned, as the checker also reads it.
pub fn check_histories(dir: &Path, checker: &Path) -> Result<Verdict, String> {
    let files = history_files(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut verdict = Verdict::default();
    let mut calls: HashMap<String, Op> = HashMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        for event in text
            .lines()
            .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        {
            match event {
                Event::Call {
                    id, op, part_of, ..
                } => {
                    if part_of.is_some() {
                        continue;
                    }
                    let counts = verdict.counts(op);
                    counts.calls += 1;
                    counts.unknown += 1;
                    calls.insert(id, op);
                }
                Event::Return { id, out, .. } => {
                    let Some(op) = calls.get(&id).copied() else {
                        continue;
                    };
                    let counts = verdict.counts(op);
                    counts.unknown -= 1;
                    match out {
                        Out::Ok => counts.ok += 1,
                        Out::Mismatch => counts.mismatch += 1,
                        Out::Aborted => counts.aborted += 1,
                        Out::Unknown => counts.unknown += 1,
                    }
                }
            }
        }
    }
    let output = std::process::Command::new("go")
        .args(["run", "."])
        .args(&files)
        .current_dir(checker)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running `go run` in {}: {e}", checker.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    verdict.summary = stdout.lines().last().unwrap_or("").trim().to_string();
    match output.status.code() {
        Some(0) => verdict.linearizable = true,
        Some(1) => verdict.linearizable = false,
        _ => {
            return Err(format!(
                "the checker in {} failed ({}): {}",
                checker.display(),
                output.status,
                verdict.summary
            ))
        }
    }
    Ok(verdict)
}

impl Verdict {
    fn counts(&mut self, op: Op) -> &mut OpCounts {
        match op {
            Op::Read => &mut self.reads,
            Op::Write { .. } => &mut self.writes,
            Op::Cas { .. } => &mut self.cases,
        }
    }
}

/// Register operations of a run, by kind and outcome (from the history files).
#[derive(Debug, Default, Clone, Copy)]
pub struct OpCounts {
    pub calls: u64,
    pub ok: u64,
    pub mismatch: u64,
    pub aborted: u64,
    /// Returned unknown, or never returned (the client was killed).
    pub unknown: u64,
}
