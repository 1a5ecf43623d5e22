//! The steps of building and playing views, sans-I/O, so that the async driver (`Tango`)
//! and the simulator run the same decisions: `Load` rebuilds views from their latest
//! checkpoints and their streams; `Player` plays synced streams, waits for missing decision
//! records, asks for a replay when they do not come, and pays the decisions owed; `Rebuild`
//! rebuilds views as of a position (to decide a commit from the views of what it read, or
//! for history), widening them until no commit they depend on is left undecided.

use crate::codec::Malformed;
use crate::error::TangoError;
use crate::object::Object;
use crate::record::{sorted_oids, Oid, Read, Record};
use crate::runtime::{Progress, Runtime};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tutti_log::Found;

/// Pause between syncs while a player waits for a decision record.
pub const DECISION_POLL: Duration = Duration::from_millis(5);

/// Empty or restored views, each with its object's id.
pub type Views = Vec<(Oid, Box<dyn Object>)>;

/// What one stream's sync found.
#[derive(Clone, Debug, Default)]
pub struct Synced {
    pub entries: BTreeMap<u64, Vec<u8>>,
    /// Every entry of the stream below this is found (the tail of the sync).
    pub floor: u64,
    /// The sync found the log trimmed here, above where the stream stood.
    pub trimmed: Option<u64>,
}

/// Offers `runtime` what the streams found and plays to where all of them reached.
pub fn offer(runtime: &mut Runtime, synced: Vec<Synced>) -> Result<Progress, TangoError> {
    let mut floor = u64::MAX;
    for s in synced {
        if let Some(trim) = s.trimmed.filter(|&t| t > runtime.played()) {
            return Err(TangoError::Trimmed {
                trim,
                played: runtime.played(),
            });
        }
        for (position, payload) in s.entries {
            runtime.offer(position, &payload);
        }
        floor = floor.min(s.floor);
    }
    Ok(runtime.play(floor))
}

#[derive(Debug)]
pub enum LoadStep {
    /// Read the log's trim point; `Load::on_trim_point`.
    TrimPoint,
    /// Sync each stream of `oids` from `from` (new streams) and hand back what each found,
    /// in the same order; `Load::on_synced`.
    Sync {
        oids: Vec<Oid>,
        from: u64,
    },
    /// Read these positions (checkpoint parts, in order); `Load::on_parts`.
    ReadParts(Vec<u64>),
    Done,
}

/// Rebuilds views: each restored from its latest checkpoint in its stream (at or below
/// `until` if given), then offered its stream's entries from the trim point on (below
/// `until` if given). Play the result with `offer` or a `Player`.
pub struct Load {
    views: Views,
    until: Option<u64>,
    /// Checkpoints are taken at or below this (`until` unless lower).
    start_by: Option<u64>,
    trim: u64,
    runtime: Runtime,
    /// Each object's checkpoint to restore: its record's position, as_of and parts.
    checkpoints: Vec<(Oid, u64, u64, Vec<u64>)>,
    entries: BTreeMap<u64, Vec<u8>>,
    /// Where each restored object's checkpoint was taken.
    pub restored: HashMap<Oid, u64>,
}

impl Load {
    pub fn new(views: Views, until: Option<u64>) -> (Load, LoadStep) {
        Load::starting_by(views, until, until)
    }

    /// A load whose views start from checkpoints taken at or below `start_by`.
    pub fn starting_by(
        views: Views,
        until: Option<u64>,
        start_by: Option<u64>,
    ) -> (Load, LoadStep) {
        let load = Load {
            views,
            until,
            start_by: match (start_by, until) {
                (Some(b), Some(u)) => Some(b.min(u)),
                (b, u) => b.or(u),
            },
            trim: 0,
            runtime: Runtime::new(),
            checkpoints: Vec::new(),
            entries: BTreeMap::new(),
            restored: HashMap::new(),
        };
        (load, LoadStep::TrimPoint)
    }

    pub fn on_trim_point(&mut self, trim: u64) -> LoadStep {
        self.trim = trim;
        LoadStep::Sync {
            oids: self.views.iter().map(|v| v.0).collect(),
            from: trim,
        }
    }

    pub fn on_synced(&mut self, synced: &[Synced]) -> Result<LoadStep, TangoError> {
        let (trim, until) = (self.trim, self.until);
        let mut found = Vec::with_capacity(synced.len());
        for (s, (oid, _)) in synced.iter().zip(&self.views) {
            if let Some(t) = s.trimmed {
                return Err(TangoError::Trimmed {
                    trim: t,
                    played: trim,
                });
            }
            let checkpoints: Vec<(u64, u64, Vec<u64>)> = (s.entries.iter())
                .filter_map(|(&position, payload)| match Record::decode(payload) {
                    Ok(Record::Checkpoint {
                        oid: o,
                        as_of,
                        parts,
                    }) if o == *oid && as_of >= trim => Some((position, as_of, parts)),
                    _ => None,
                })
                .collect();
            found.push(checkpoints);
            let below = s
                .entries
                .iter()
                .filter(|(p, _)| until.is_none_or(|u| **p < u));
            self.entries.extend(below.map(|(p, e)| (*p, e.clone())));
        }
        // Every view starts from a checkpoint at or below one point, when it can: the
        // earliest of the latest ones. A commit between two views' starts that reads the
        // later-starting one could not be decided from the views.
        let start_by = self
            .start_by
            .or_else(|| (found.iter()).filter_map(|c| c.last().map(|c| c.1)).min());
        for (checkpoints, (oid, _)) in found.into_iter().zip(&self.views) {
            let latest = (checkpoints.iter())
                .rev()
                .find(|c| start_by.is_none_or(|b| c.1 <= b));
            match latest {
                Some((position, as_of, parts)) => {
                    (self.checkpoints).push((*oid, *position, *as_of, parts.clone()))
                }
                // As of a position: from the start of the log, unless the log is trimmed,
                // and then the object's history as of `start_by` is gone (its checkpoints
                // since the trim point are all later).
                None if self.until.is_some() => {
                    if !checkpoints.is_empty() && trim > 0 {
                        return Err(TangoError::Trimmed {
                            trim,
                            played: start_by.unwrap_or_default(),
                        });
                    }
                }
                // The latest view of it, then.
                None => {
                    if let Some((position, as_of, parts)) = checkpoints.last() {
                        (self.checkpoints).push((*oid, *position, *as_of, parts.clone()))
                    }
                }
            }
        }
        let parts: Vec<u64> = self.checkpoints.iter().flat_map(|c| c.3.clone()).collect();
        if parts.is_empty() {
            self.finish(Vec::new())?;
            return Ok(LoadStep::Done);
        }
        Ok(LoadStep::ReadParts(parts))
    }

    /// What the positions of the last `ReadParts` hold, in order.
    pub fn on_parts(&mut self, found: Vec<Found>) -> Result<LoadStep, TangoError> {
        self.finish(found)?;
        Ok(LoadStep::Done)
    }

    fn finish(&mut self, found: Vec<Found>) -> Result<(), TangoError> {
        let mut found = found.into_iter();
        let mut checkpoints: HashMap<Oid, (u64, u64, Vec<u8>)> = HashMap::new();
        for (oid, position, as_of, parts) in std::mem::take(&mut self.checkpoints) {
            let mut bytes = Vec::new();
            for p in parts {
                let malformed = |why: String| TangoError::Malformed { position: p, why };
                let part = found
                    .next()
                    .ok_or_else(|| malformed("checkpoint part not read".into()))?;
                if let Found::Trimmed { trim } = part {
                    // A trim passed the load since it read the trim point.
                    return Err(TangoError::Trimmed {
                        trim,
                        played: self.trim,
                    });
                }
                let Found::Data { payload, .. } = part else {
                    return Err(malformed(format!(
                        "checkpoint part of {oid} is {}",
                        part.state()
                    )));
                };
                match Record::decode(&payload) {
                    Ok(Record::CheckpointPart { oid: o, bytes: b }) if o == oid => bytes.extend(b),
                    Ok(other) => {
                        return Err(malformed(format!(
                            "not a part of {oid}'s checkpoint: {other:?}"
                        )))
                    }
                    Err(Malformed(why)) => return Err(malformed(why)),
                }
            }
            checkpoints.insert(oid, (position, as_of, bytes));
        }
        for (oid, view) in std::mem::take(&mut self.views) {
            match checkpoints.remove(&oid) {
                Some((position, as_of, bytes)) => {
                    (self.runtime.host_restored(oid, view, as_of, &bytes))
                        .map_err(|e| TangoError::Malformed { position, why: e.0 })?;
                    self.restored.insert(oid, as_of);
                }
                None => self.runtime.host(oid, view, 0),
            }
        }
        for (position, payload) in std::mem::take(&mut self.entries) {
            self.runtime.offer(position, &payload);
        }
        Ok(())
    }

    /// The runtime, after `Done`: views hosted and entries offered, nothing played.
    pub fn runtime(self) -> Runtime {
        self.runtime
    }
}

/// What a player's driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlayStep {
    /// Sync every hosted stream and hand back what they found (`Player::on_synced`).
    Sync,
    /// Pause this long, then `Sync` (a decision record is awaited).
    Pause(Duration),
    /// Decide the commit at `commit` by rebuilding the views of the objects in `reads` as of
    /// it (`Rebuild`) and validating `reads` there, then `Player::on_replayed`.
    Replay { commit: u64, reads: Vec<Read> },
    /// Append this decision record to `streams`, then `Player::on_decision_appended`.
    AppendDecision {
        commit: u64,
        committed: bool,
        streams: Vec<Oid>,
    },
    /// Every hosted stream is played to where the syncs reached.
    Done,
}

/// Plays a runtime's synced streams; keeps, across plays, when each awaited decision and
/// each owed one was first seen. `now` is any monotonic clock.
pub struct Player {
    decision_timeout: Duration,
    since: HashMap<u64, Duration>,
    /// The blocked commit being replayed, and the streams it writes.
    replaying: Option<(u64, Vec<Oid>)>,
    /// Blocked commits decided by replay, to append for the others.
    replayed: BTreeMap<u64, (bool, Vec<Oid>)>,
    /// A decision of this client's own is being appended while play is blocked: sync
    /// again once it is.
    blocked: bool,
}

impl Player {
    pub fn new(decision_timeout: Duration) -> Player {
        Player {
            decision_timeout,
            since: HashMap::new(),
            replaying: None,
            replayed: BTreeMap::new(),
            blocked: false,
        }
    }

    pub fn on_synced(
        &mut self,
        runtime: &mut Runtime,
        synced: Vec<Synced>,
        now: Duration,
    ) -> Result<PlayStep, TangoError> {
        let progress = offer(runtime, synced)?;
        Ok(self.next(runtime, progress, now))
    }

    fn next(&mut self, runtime: &mut Runtime, progress: Progress, now: Duration) -> PlayStep {
        if let Progress::Blocked {
            commit,
            reads,
            streams,
        } = progress
        {
            // A blocked client appends its own transactions' decisions at once (their
            // writers do so after playing to the tail, which it cannot reach now): the
            // writer of the commit it waits on may itself be blocked on one of them.
            let own = (runtime.owed().iter()).find(|(_, o)| o.own);
            if let Some((&commit, o)) = own {
                self.blocked = true;
                return PlayStep::AppendDecision {
                    commit,
                    committed: o.committed,
                    streams: o.streams.clone(),
                };
            }
            let since = *self.since.entry(commit).or_insert(now);
            if now.saturating_sub(since) < self.decision_timeout {
                return PlayStep::Pause(DECISION_POLL);
            }
            self.replaying = Some((commit, streams));
            return PlayStep::Replay { commit, reads };
        }
        if let Some((&commit, (committed, streams))) = self.replayed.first_key_value() {
            return PlayStep::AppendDecision {
                commit,
                committed: *committed,
                streams: streams.clone(),
            };
        }
        let owed = runtime.owed();
        self.since.retain(|p, _| owed.contains_key(p));
        for (&commit, o) in owed {
            let since = *self.since.entry(commit).or_insert(now);
            if now.saturating_sub(since) >= self.decision_timeout {
                return PlayStep::AppendDecision {
                    commit,
                    committed: o.committed,
                    streams: o.streams.clone(),
                };
            }
        }
        PlayStep::Done
    }

    /// The replay decided the blocked commit: sync and play on.
    pub fn on_replayed(&mut self, runtime: &mut Runtime, commit: u64, committed: bool) -> PlayStep {
        runtime.resolve(commit, committed);
        if let Some((c, streams)) = self.replaying.take() {
            debug_assert_eq!(c, commit);
            self.replayed.insert(commit, (committed, streams));
        }
        self.since.remove(&commit);
        PlayStep::Sync
    }

    pub fn on_decision_appended(
        &mut self,
        runtime: &mut Runtime,
        commit: u64,
        now: Duration,
    ) -> PlayStep {
        self.replayed.remove(&commit);
        self.since.remove(&commit);
        runtime.settle_owed(commit);
        if std::mem::take(&mut self.blocked) {
            return PlayStep::Sync;
        }
        self.next(runtime, Progress::Played(runtime.played()), now)
    }
}

pub enum RebuildStep {
    /// Rebuild views of `oids` as of `until`, from checkpoints taken at or below
    /// `start_by`, with a `Load` (`Load::starting_by`), then `Rebuild::on_loaded`.
    Load {
        oids: Vec<Oid>,
        until: u64,
        start_by: u64,
    },
    /// The views, played as of `until`.
    Done(Box<Runtime>),
}

/// Rebuilds the views of `oids` as of `until` (every entry below it played): for a commit's
/// decision when no decision record comes (Tango §4.1: the views of what it read, as of
/// it), or for history. A commit the views wait on is decided by hosting the objects it
/// read as well, and loading again.
pub struct Rebuild {
    oids: Vec<Oid>,
    until: u64,
    start_by: u64,
}

impl Rebuild {
    pub fn new(oids: impl IntoIterator<Item = Oid>, until: u64) -> (Rebuild, RebuildStep) {
        let oids = sorted_oids(oids.into_iter());
        let step = RebuildStep::Load {
            oids: oids.clone(),
            until,
            start_by: until,
        };
        let rebuild = Rebuild {
            oids,
            until,
            start_by: until,
        };
        (rebuild, step)
    }

    /// The loaded views (the `Load`'s runtime, not played yet).
    pub fn on_loaded(&mut self, mut runtime: Runtime) -> Result<RebuildStep, TangoError> {
        match runtime.play(self.until) {
            Progress::Played(_) => Ok(RebuildStep::Done(Box::new(runtime))),
            Progress::Blocked { commit, reads, .. } => {
                let hosted = self.oids.len();
                self.oids =
                    sorted_oids(self.oids.iter().copied().chain(reads.iter().map(|r| r.oid)));
                if self.oids.len() == hosted {
                    // What it read is hosted, but from a checkpoint taken after it: start
                    // every view at or below it.
                    if commit >= self.start_by {
                        return Err(TangoError::Undecided {
                            commit,
                            why: "the views of what it read start after it".into(),
                        });
                    }
                    self.start_by = commit;
                }
                Ok(RebuildStep::Load {
                    oids: self.oids.clone(),
                    until: self.until,
                    start_by: self.start_by,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Kind;
    use crate::runtime::Tx;

    const TIMEOUT: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A commit at 0 that read object 1 and wrote object 2, its decision promised.
    fn commit() -> Synced {
        let mut tx = Tx::new(5);
        tx.reads.push(Read {
            oid: 1,
            key: None,
            version: 0,
        });
        tx.write(2, None, b"v".to_vec());
        Synced {
            entries: [(0, tx.commit_record(true).encode())].into(),
            floor: 1,
            trimmed: None,
        }
    }

    fn hosting(oids: &[Oid]) -> Runtime {
        let mut rt = Runtime::new();
        for &oid in oids {
            rt.host(oid, Kind::Register.view(), 0);
        }
        rt
    }

    #[test]
    fn a_missing_decision_is_waited_for_then_replayed_then_appended_for_the_others() {
        let mut rt = hosting(&[2]);
        let mut player = Player::new(TIMEOUT);
        let step = player.on_synced(&mut rt, vec![commit()], ms(0)).unwrap();
        assert_eq!(step, PlayStep::Pause(DECISION_POLL));
        let step = player.on_synced(&mut rt, vec![], ms(50)).unwrap();
        assert_eq!(step, PlayStep::Pause(DECISION_POLL));
        let step = player.on_synced(&mut rt, vec![], ms(100)).unwrap();
        assert!(
            matches!(step, PlayStep::Replay { commit: 0, .. }),
            "{step:?}"
        );
        assert_eq!(player.on_replayed(&mut rt, 0, true), PlayStep::Sync);
        let step = player.on_synced(&mut rt, vec![], ms(101)).unwrap();
        let append = PlayStep::AppendDecision {
            commit: 0,
            committed: true,
            streams: vec![2],
        };
        assert_eq!(step, append);
        assert_eq!(
            player.on_decision_appended(&mut rt, 0, ms(102)),
            PlayStep::Done
        );
        assert_eq!(
            rt.view(2, |r: &crate::Register| r.value.clone()).unwrap(),
            b"v"
        );
    }

    /// Client A's own commit at 0 (read 1, wrote 2) is decided; B's commit at 1 wrote 1 and
    /// read 3, which A does not host: blocked there, A appends its own decision at once (B
    /// may be blocked at 0, waiting for it), then syncs again.
    #[test]
    fn a_blocked_client_appends_its_own_decisions_at_once() {
        let mut rt = hosting(&[1, 2]);
        rt.await_reply(5);
        let mut theirs = Tx::new(6);
        theirs.reads.push(Read {
            oid: 3,
            key: None,
            version: 0,
        });
        theirs.write(1, None, b"w".to_vec());
        let mut synced = commit();
        synced
            .entries
            .insert(1, theirs.commit_record(true).encode());
        synced.floor = 2;
        let mut player = Player::new(TIMEOUT);
        let step = player.on_synced(&mut rt, vec![synced], ms(0)).unwrap();
        let own = PlayStep::AppendDecision {
            commit: 0,
            committed: true,
            streams: vec![2],
        };
        assert_eq!(step, own);
        assert_eq!(
            player.on_decision_appended(&mut rt, 0, ms(1)),
            PlayStep::Sync
        );
        let step = player.on_synced(&mut rt, vec![], ms(2)).unwrap();
        assert_eq!(step, PlayStep::Pause(DECISION_POLL), "still blocked at 1");
    }

    #[test]
    fn a_decision_owed_is_appended_only_after_the_timeout() {
        let mut rt = hosting(&[1, 2]);
        let mut player = Player::new(TIMEOUT);
        assert_eq!(
            player.on_synced(&mut rt, vec![commit()], ms(0)).unwrap(),
            PlayStep::Done
        );
        assert_eq!(
            player.on_synced(&mut rt, vec![], ms(99)).unwrap(),
            PlayStep::Done
        );
        let step = player.on_synced(&mut rt, vec![], ms(100)).unwrap();
        assert!(matches!(
            step,
            PlayStep::AppendDecision {
                commit: 0,
                committed: true,
                ..
            }
        ));
        assert_eq!(
            player.on_decision_appended(&mut rt, 0, ms(101)),
            PlayStep::Done
        );
        assert!(rt.owed().is_empty());
    }

    #[test]
    fn a_rebuild_widens_to_what_an_undecided_commit_read() {
        // The views of object 2 wait on the commit at 0, which read object 1.
        let (mut rebuild, step) = Rebuild::new([2], 5);
        assert!(
            matches!(step, RebuildStep::Load { ref oids, until: 5, start_by: 5 } if oids == &[2])
        );
        let step = rebuild.on_loaded(hosting(&[2])).unwrap();
        assert!(
            matches!(step, RebuildStep::Done(_)),
            "nothing offered: nothing waits"
        );
        let mut waiting = hosting(&[2]);
        waiting.offer(0, &commit().entries[&0]);
        let step = rebuild.on_loaded(waiting).unwrap();
        assert!(matches!(step, RebuildStep::Load { ref oids, .. } if oids == &[1, 2]));
    }
}
