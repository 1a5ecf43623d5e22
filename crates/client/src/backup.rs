//! A consistent backup's run over the memory nodes (Sinfonia §4.8) as a sans-I/O state
//! machine, one call at a time: phase 1 fences every node in node-id order and waits at each
//! until no tid holds a lock there (blocking, ordered lock requests: two backups cannot
//! deadlock, and minitransactions, refused while fenced, cannot starve it); phase 2 takes
//! the cut at every node, which lifts the fences; then the nodes' images as of the cut are
//! read, each in address order, a chunk of each node in turn. `tutti-backup` drives it over TCP, the simulator over its network.
//!
//! Why this is a cut: a committed tid applies its writes at a participant before it gives
//! up its locks there, and no tid gets a lock at a fenced node. When the last node is
//! fenced and drained, every tid has either applied everywhere or not yet locked
//! anywhere it writes (one that held locks at a later node voted there before the fence,
//! and cannot commit: its vote at the earlier, fenced node is refused). Each cut is taken
//! after that instant and before any new lock, so every node's cut holds the same tids.

use tutti_wire::{ErrorCode, NodeId, Request, Response, BACKUP_FENCE_LEASE_MS};

/// Times in microseconds on the driver's clock.
#[derive(Clone, Debug)]
pub struct BackupConfig {
    /// How long phase 1 may wait for the locks held at the nodes to drain before giving up
    /// (the fences then come down, and the driver may try again later).
    pub lock_timeout_us: u64,
    /// Pause between two `BackupLock` asks of a node whose locks have not drained.
    pub lock_poll_us: u64,
    /// Bytes per `BackupRead` (a multiple of the page, at most `BACKUP_READ_BYTES_MAX`).
    pub read_bytes: u64,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            lock_timeout_us: 5_000_000,
            lock_poll_us: 1_000,
            read_bytes: 1 << 20,
        }
    }
}

/// Why a backup run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackupError {
    /// Phase 1 did not finish: locks did not drain in time, or another backup runs. Nothing
    /// was kept; trying again later may succeed.
    #[error("no cut: {0}")]
    NoCut(String),
    /// Another backup holds a node (until it ends, or for its lease if it went away).
    #[error("no cut: {0}")]
    Busy(String),
    /// A node failed or answered wrongly after the cut.
    #[error("{0}")]
    Failed(String),
}

/// How many times `BackupEnd` is sent to a node that does not answer.
const END_TRIES: u32 = 3;

/// Bytes of an image as `(offset, bytes)` runs; every byte not in a run is zero.
pub type Runs = Vec<(u64, Vec<u8>)>;

/// What the driver does after a step, in this order: store `chunk`, then send `call` at
/// `at_us` (its reply or failure goes to `on_reply`), or stop with `done`.
#[derive(Debug, Default)]
pub struct BackupActions {
    /// Bytes of node `.0`'s image as of the cut.
    pub chunk: Option<(NodeId, Runs)>,
    /// `true` once per run, when every node took its cut: what else should be as of the
    /// cut (the manager's regions) is best read now.
    pub cut_taken: bool,
    pub call: Option<(NodeId, Request)>,
    /// Send `call` not before this time.
    pub at_us: u64,
    /// Each node's image, or why the backup failed.
    pub done: Option<Result<Vec<CutImage>, BackupError>>,
}

/// What a node's cut is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutImage {
    pub node: NodeId,
    pub size_bytes: u64,
    /// It holds only the pages written since the `since` backup's cut.
    pub incremental: bool,
}

enum Phase {
    /// Fencing `nodes[index]`, phase 1 started at `since_us`.
    Lock {
        index: usize,
        since_us: u64,
    },
    Cut {
        index: usize,
    },
    /// Reading `nodes[index]` from `read[index]`.
    Read {
        index: usize,
    },
    /// Telling `nodes[index..]` that the backup is over (`tries` times already the
    /// current one), then `outcome`.
    End {
        index: usize,
        tries: u32,
        outcome: Result<(), BackupError>,
    },
}

pub struct BackupRun {
    id: u64,
    cfg: BackupConfig,
    nodes: Vec<NodeId>,
    sizes: Vec<u64>,
    incremental: Vec<bool>,
    /// The backup an incremental one starts from.
    since: Option<u64>,
    /// How far each node's image has been read.
    read: Vec<u64>,
    phase: Phase,
}

impl BackupRun {
    /// A backup `id` (unique among the cluster's backups: a random number) of `nodes`;
    /// incremental from backup `since` at the nodes where that one is the last that
    /// completed, full elsewhere.
    pub fn new(
        id: u64,
        mut nodes: Vec<NodeId>,
        cfg: BackupConfig,
        since: Option<u64>,
    ) -> BackupRun {
        nodes.sort_unstable();
        nodes.dedup();
        assert!(!nodes.is_empty(), "a backup needs a node");
        assert!(
            cfg.lock_poll_us < BACKUP_FENCE_LEASE_MS * 1000 / 2,
            "a node would drop its fence between two asks"
        );
        BackupRun {
            id,
            cfg,
            sizes: vec![0; nodes.len()],
            incremental: vec![false; nodes.len()],
            since,
            read: vec![0; nodes.len()],
            nodes,
            phase: Phase::Lock {
                index: 0,
                since_us: 0,
            },
        }
    }

    pub fn start(&mut self, now_us: u64) -> BackupActions {
        self.phase = Phase::Lock {
            index: 0,
            since_us: now_us,
        };
        self.ask(now_us)
    }

    /// The reply to the last call, or why none came (`Err`: the call may or may not have
    /// been delivered).
    pub fn on_reply(&mut self, now_us: u64, reply: Result<Response, String>) -> BackupActions {
        let node = self.call_node();
        let unexpected = |reply: Result<Response, String>| match reply {
            Ok(Response::Error { code, message }) => format!("node {node}: {code:?}: {message}"),
            Ok(other) => format!("node {node}: unexpected reply {other:?}"),
            Err(e) => format!("node {node}: {e}"),
        };
        match (&mut self.phase, reply) {
            (Phase::Lock { index, since_us }, reply) => match reply {
                Ok(Response::BackupLock { locked: true, .. }) => {
                    *index += 1;
                    if *index == self.nodes.len() {
                        self.phase = Phase::Cut { index: 0 };
                    }
                    self.ask(now_us)
                }
                Ok(Response::BackupLock { holders, .. }) => {
                    let waited_us = now_us.saturating_sub(*since_us);
                    if waited_us >= self.cfg.lock_timeout_us {
                        let why = format!(
                            "node {node}: {holders} minitransactions still hold locks after {} ms",
                            waited_us / 1000
                        );
                        return self.end(now_us, Err(BackupError::NoCut(why)));
                    }
                    let mut acts = self.ask(now_us);
                    acts.at_us = now_us + self.cfg.lock_poll_us;
                    acts
                }
                Ok(Response::Error {
                    code: ErrorCode::Conflict,
                    message,
                }) => {
                    let why = BackupError::Busy(format!("node {node}: {message}"));
                    self.end(now_us, Err(why))
                }
                other => {
                    let why = BackupError::NoCut(unexpected(other));
                    self.end(now_us, Err(why))
                }
            },
            (Phase::Cut { index }, reply) => match reply {
                Ok(Response::BackupCut {
                    size_bytes,
                    incremental,
                }) => {
                    self.sizes[*index] = size_bytes;
                    self.incremental[*index] = incremental;
                    *index += 1;
                    if *index < self.nodes.len() {
                        return self.ask(now_us);
                    }
                    self.phase = Phase::Read { index: 0 };
                    let mut acts = self.ask(now_us);
                    acts.cut_taken = true;
                    acts
                }
                other => {
                    let why = BackupError::Failed(unexpected(other));
                    self.end(now_us, Err(why))
                }
            },
            (Phase::Read { index }, reply) => match reply {
                Ok(Response::BackupChunk(runs)) => {
                    let i = *index;
                    self.read[i] = (self.read[i] + self.cfg.read_bytes).min(self.sizes[i]);
                    // Round robin over the nodes left, so that each hears from the backup
                    // well within its cut's lease however slowly the driver stores.
                    let n = self.nodes.len();
                    let next = (1..=n)
                        .map(|step| (i + step) % n)
                        .find(|&j| self.read[j] < self.sizes[j]);
                    let mut acts = match next {
                        Some(j) => {
                            *index = j;
                            self.ask(now_us)
                        }
                        None => self.end(now_us, Ok(())),
                    };
                    acts.chunk = Some((self.nodes[i], runs));
                    acts
                }
                other => {
                    let why = BackupError::Failed(unexpected(other));
                    self.end(now_us, Err(why))
                }
            },
            // A node that does not answer is asked again a few times: until it hears of the
            // end, it refuses other backups (for its lease, at most).
            (Phase::End { tries, .. }, Err(_)) if *tries < END_TRIES => {
                *tries += 1;
                self.ask(now_us)
            }
            (Phase::End { index, tries, .. }, _) => {
                (*index, *tries) = (*index + 1, 0);
                self.ask(now_us)
            }
        }
    }

    /// Each node's image, as its cut reported it (size 0 before).
    pub fn images(&self) -> Vec<CutImage> {
        (0..self.nodes.len())
            .map(|i| CutImage {
                node: self.nodes[i],
                size_bytes: self.sizes[i],
                incremental: self.incremental[i],
            })
            .collect()
    }

    fn call_node(&self) -> NodeId {
        let index = match self.phase {
            Phase::Lock { index, .. }
            | Phase::Cut { index }
            | Phase::Read { index, .. }
            | Phase::End { index, .. } => index,
        };
        self.nodes[index.min(self.nodes.len() - 1)]
    }

    fn end(&mut self, now_us: u64, outcome: Result<(), BackupError>) -> BackupActions {
        self.phase = Phase::End {
            index: 0,
            tries: 0,
            outcome,
        };
        self.ask(now_us)
    }

    /// The call of the current phase, or the end of the run.
    fn ask(&mut self, now_us: u64) -> BackupActions {
        let backup = self.id;
        let (index, request) = match &mut self.phase {
            Phase::Lock { index, .. } => (*index, Request::BackupLock { backup }),
            Phase::Cut { index } => {
                let since = self.since;
                (*index, Request::BackupCut { backup, since })
            }
            Phase::Read { index } => {
                let offset = self.read[*index];
                let len = self.cfg.read_bytes.min(self.sizes[*index] - offset);
                let req = Request::BackupRead {
                    backup,
                    offset,
                    len,
                };
                (*index, req)
            }
            Phase::End { index, outcome, .. } if *index == self.nodes.len() => {
                let done = outcome.clone().map(|()| self.images());
                return BackupActions {
                    done: Some(done),
                    ..BackupActions::default()
                };
            }
            Phase::End { index, outcome, .. } => {
                let completed = outcome.is_ok();
                (*index, Request::BackupEnd { backup, completed })
            }
        };
        BackupActions {
            call: Some((self.nodes[index], request)),
            at_us: now_us,
            ..BackupActions::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(acts: &BackupActions) -> (NodeId, &Request) {
        let (node, req) = acts.call.as_ref().expect("a call");
        (*node, req)
    }

    fn locked(locked: bool) -> Result<Response, String> {
        Ok(Response::BackupLock {
            locked,
            holders: u64::from(!locked),
        })
    }

    #[test]
    fn fences_in_node_order_then_cuts_then_reads_every_image_in_order() {
        let cfg = BackupConfig {
            read_bytes: 8192,
            ..BackupConfig::default()
        };
        let mut run = BackupRun::new(5, vec![3, 1], cfg, Some(4));
        let acts = run.start(0);
        assert!(matches!(
            call(&acts),
            (1, Request::BackupLock { backup: 5 })
        ));
        let acts = run.on_reply(10, locked(false));
        assert_eq!(
            (call(&acts).0, acts.at_us),
            (1, 1_010),
            "asks again after a pause"
        );
        let acts = run.on_reply(1_010, locked(true));
        assert!(matches!(call(&acts), (3, Request::BackupLock { .. })));
        let acts = run.on_reply(1_020, locked(true));
        assert!(matches!(
            call(&acts),
            (1, Request::BackupCut { since: Some(4), .. })
        ));
        let cut = |size_bytes, incremental| {
            Ok(Response::BackupCut {
                size_bytes,
                incremental,
            })
        };
        let acts = run.on_reply(1_030, cut(10_000, true));
        assert!(matches!(call(&acts), (3, Request::BackupCut { .. })));
        let acts = run.on_reply(1_040, cut(4096, false));
        assert!(acts.cut_taken);
        let mut reads = Vec::new();
        let mut acts = acts;
        loop {
            match call(&acts) {
                (node, Request::BackupRead { offset, len, .. }) => {
                    reads.push((node, *offset, *len));
                    acts = run.on_reply(2_000, Ok(Response::BackupChunk(vec![(*offset, vec![1])])));
                    assert_eq!(acts.chunk.as_ref().unwrap().0, node);
                }
                (_, Request::BackupEnd { .. }) => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            reads,
            vec![(1, 0, 8192), (3, 0, 4096), (1, 8192, 1808)],
            "whole chunks round robin, the last one short"
        );
        let acts = run.on_reply(3_000, Ok(Response::BackupEnded));
        assert!(matches!(
            call(&acts),
            (
                3,
                Request::BackupEnd {
                    completed: true,
                    ..
                }
            )
        ));
        for _ in 0..END_TRIES {
            let acts = run.on_reply(3_000, Err("connection reset".into()));
            assert!(
                matches!(call(&acts), (3, Request::BackupEnd { .. })),
                "asked again"
            );
        }
        let acts = run.on_reply(3_000, Err("connection reset".into()));
        let image = |node, size_bytes, incremental| CutImage {
            node,
            size_bytes,
            incremental,
        };
        let images = vec![image(1, 10_000, true), image(3, 4096, false)];
        assert_eq!(acts.done, Some(Ok(images)));
    }

    #[test]
    fn locks_that_do_not_drain_end_the_run_without_a_cut() {
        let cfg = BackupConfig {
            lock_timeout_us: 100_000,
            ..BackupConfig::default()
        };
        let mut run = BackupRun::new(5, vec![1, 2], cfg, None);
        run.start(0);
        let acts = run.on_reply(0, locked(true));
        assert!(matches!(call(&acts), (2, Request::BackupLock { .. })));
        let acts = run.on_reply(100_000, locked(false));
        assert!(
            matches!(call(&acts), (1, Request::BackupEnd { .. })),
            "fences come down"
        );
        let acts = run.on_reply(100_000, Ok(Response::BackupEnded));
        assert!(matches!(call(&acts), (2, Request::BackupEnd { .. })));
        let acts = run.on_reply(100_000, Ok(Response::BackupEnded));
        match acts.done {
            Some(Err(BackupError::NoCut(why))) => assert!(why.contains("node 2"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
