//! The participant's side of a consistent backup (Sinfonia §4.8; docs/backup.md): a fence
//! that refuses new locks until the held ones drain, then a copy-on-write cut of the space
//! that the backup reads in order while minitransactions go on.

use super::{error, planted, Actions, Bug, Participant};
use crate::space::CutReadError;
use tutti_wire::{
    ErrorCode, Request, Response, BACKUP_CUT_LEASE_MS, BACKUP_FENCE_LEASE_MS, BACKUP_READ_BYTES_MAX,
};

/// A backup this node takes part in.
pub(super) struct Backup {
    id: u64,
    cut: bool,
    /// When the backup last asked something of this node: a fence or a cut it stops asking
    /// about lapses (`BACKUP_FENCE_LEASE_MS`, `BACKUP_CUT_LEASE_MS`).
    touched_ms: u64,
}

impl<R> Participant<R> {
    /// Drops a backup that has not been heard from within its lease.
    pub(super) fn expire_backup(&mut self, now_ms: u64) {
        if let Some(b) = &self.backup {
            let lease = if b.cut {
                BACKUP_CUT_LEASE_MS
            } else {
                BACKUP_FENCE_LEASE_MS
            };
            if now_ms.saturating_sub(b.touched_ms) > lease {
                self.end_backup(false);
            }
        }
    }

    /// Ends the backup in progress; `completed`: the backup stored its cut, which is then
    /// the base of the next incremental backup (if it was read to the end here).
    fn end_backup(&mut self, completed: bool) {
        let ended = self.backup.take();
        self.locks.set_fenced(false);
        let whole = completed && self.space.cut_read_whole();
        let saved_max = self.space.end_cut(whole);
        self.backup_saved_bytes_max = self.backup_saved_bytes_max.max(saved_max);
        if whole {
            self.backup_base = ended.map(|b| b.id);
        }
    }

    /// `BackupLock`, `BackupCut`, `BackupRead` and `BackupEnd`.
    pub(super) fn backup_request(
        &mut self,
        acts: &mut Actions<R>,
        now_ms: u64,
        reply_to: R,
        id: u64,
        req: Request,
    ) {
        let resp = match req {
            Request::BackupLock { backup } => self.backup_lock(now_ms, backup),
            Request::BackupCut { backup, since } => self.backup_cut(now_ms, backup, since),
            Request::BackupRead {
                backup,
                offset,
                len,
            } => self.backup_read(now_ms, backup, offset, len),
            Request::BackupEnd { backup, completed } => {
                if self.backup.as_ref().is_some_and(|b| b.id == backup) {
                    self.end_backup(completed);
                }
                Response::BackupEnded
            }
            _ => unreachable!("only backup requests come here"),
        };
        acts.replies.push((reply_to, id, resp));
    }

    /// Whether the backup `backup` took its cut (touching it now), or the reply that says
    /// why it is not here.
    fn touch_backup(&mut self, now_ms: u64, backup: u64) -> Result<bool, Response> {
        match &mut self.backup {
            Some(b) if b.id == backup => {
                b.touched_ms = now_ms;
                Ok(b.cut)
            }
            Some(b) => Err(busy(b.id)),
            None => Err(error(
                ErrorCode::NotFound,
                format!("no backup {backup:#x} here: it ended, lapsed, or the node restarted"),
            )),
        }
    }

    fn backup_lock(&mut self, now_ms: u64, backup: u64) -> Response {
        if self.backup.is_none() {
            self.backup = Some(Backup {
                id: backup,
                cut: false,
                touched_ms: now_ms,
            });
            self.locks.set_fenced(true);
        }
        match self.touch_backup(now_ms, backup) {
            Ok(true) => error(
                ErrorCode::BadRequest,
                format!("backup {backup:#x} already took its cut"),
            ),
            Ok(false) => {
                let holders = self.locks.holders() as u64;
                Response::BackupLock {
                    locked: holders == 0 || planted(Bug::CutWithLocksHeld),
                    holders,
                }
            }
            Err(refusal) => refusal,
        }
    }

    /// Phase 2: the cut, incremental if `since` is the last backup that completed here.
    fn backup_cut(&mut self, now_ms: u64, backup: u64, since: Option<u64>) -> Response {
        let drained = self.locks.holders() == 0 || planted(Bug::CutWithLocksHeld);
        match self.touch_backup(now_ms, backup) {
            Ok(true) => error(
                ErrorCode::BadRequest,
                format!("backup {backup:#x} already took its cut"),
            ),
            Ok(false) if !drained => error(
                ErrorCode::BadRequest,
                format!("backup {backup:#x}: locks are still held here; ask BackupLock first"),
            ),
            Ok(false) => {
                self.backup.as_mut().expect("touched").cut = true;
                self.locks.set_fenced(false);
                let incremental = since.is_some() && since == self.backup_base;
                self.space.begin_cut(incremental);
                Response::BackupCut {
                    size_bytes: self.space.size_bytes(),
                    incremental,
                }
            }
            Err(refusal) => refusal,
        }
    }

    fn backup_read(&mut self, now_ms: u64, backup: u64, offset: u64, len: u64) -> Response {
        if len > BACKUP_READ_BYTES_MAX {
            let message = format!("a backup read is at most {BACKUP_READ_BYTES_MAX} bytes");
            return error(ErrorCode::BadRequest, message);
        }
        match self.touch_backup(now_ms, backup) {
            Ok(false) => error(
                ErrorCode::BadRequest,
                format!("backup {backup:#x} has not taken its cut"),
            ),
            Ok(true) => match self.space.read_cut(offset, len) {
                Ok(runs) => Response::BackupChunk(runs),
                Err(CutReadError::OutOfOrder { expected }) => error(
                    ErrorCode::BadRequest,
                    format!("backup reads go in order: the next one starts at {expected}"),
                ),
                Err(CutReadError::BadRange | CutReadError::NoCut) => error(
                    ErrorCode::OutOfRange,
                    format!(
                        "[{offset}, +{len}) is not whole pages of the {} bytes of the space",
                        self.space.size_bytes()
                    ),
                ),
            },
            Err(refusal) => refusal,
        }
    }
}

fn busy(other: u64) -> Response {
    error(
        ErrorCode::Conflict,
        format!("backup {other:#x} is in progress on this node; one backup at a time"),
    )
}

#[cfg(test)]
mod tests {
    use crate::participant::tests::{node, tid, P};
    use crate::participant::Mode;
    use tutti_wire::{
        Decision, ErrorCode, ExecPrepare, Item, Request, Response, Vote, BACKUP_FENCE_LEASE_MS,
        LOCK_WAIT_MS_MAX,
    };

    fn ask(p: &mut P, now_ms: u64, req: Request) -> Response {
        let mut acts = p.on_request(now_ms, 0, 1, req);
        assert_eq!(acts.replies.len(), 1);
        acts.replies.pop().unwrap().2
    }

    /// Writes `v` at `addr`: alone (one phase) or with node 2 (then it waits for its decision).
    fn write(p: &mut P, seq: u64, with_peer: bool, addr: u64, v: u8) -> Vote {
        match ask(p, 0, exec(seq, with_peer, addr, v)) {
            Response::Vote(v) => v.vote,
            other => panic!("no vote: {other:?}"),
        }
    }

    fn exec(seq: u64, with_peer: bool, addr: u64, v: u8) -> Request {
        Request::ExecPrepare(ExecPrepare {
            tid: tid(seq),
            participants: if with_peer { vec![1, 2] } else { vec![1] },
            class: "t".into(),
            read_only: false,
            items: vec![Item::Write {
                addr,
                bytes: vec![v; 8],
            }],
            executed: 0,
            lock_wait_ms: LOCK_WAIT_MS_MAX,
        })
    }

    fn lock(p: &mut P, now_ms: u64) -> (bool, u64) {
        match ask(p, now_ms, Request::BackupLock { backup: 9 }) {
            Response::BackupLock { locked, holders } => (locked, holders),
            other => panic!("{other:?}"),
        }
    }

    fn read(p: &mut P, offset: u64, len: u64) -> Vec<(u64, Vec<u8>)> {
        let req = Request::BackupRead {
            backup: 9,
            offset,
            len,
        };
        match ask(p, 0, req) {
            Response::BackupChunk(runs) => runs,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_cut_waits_for_held_locks_refuses_new_ones_and_keeps_its_image() {
        let mut p = node(1, Mode::Ram);
        assert_eq!(write(&mut p, 1, false, 0, 1), Vote::CommitOk);
        assert_eq!(write(&mut p, 2, true, 8, 2), Vote::CommitOk, "uncertain");
        assert_eq!(lock(&mut p, 0), (false, 1), "tid 2 holds its lock");
        assert_eq!(write(&mut p, 3, true, 16, 3), Vote::AbortLock, "fenced");
        let cut_too_early = ask(
            &mut p,
            0,
            Request::BackupCut {
                backup: 9,
                since: None,
            },
        );
        assert!(matches!(
            cut_too_early,
            Response::Error {
                code: ErrorCode::BadRequest,
                ..
            }
        ));
        let decision = Decision {
            tid: tid(2),
            commit: true,
            lsns: vec![],
        };
        assert!(p
            .on_request(0, 0, 0, Request::Decisions(vec![decision]))
            .replies
            .is_empty());
        assert_eq!(lock(&mut p, 1), (true, 0));
        let other = ask(&mut p, 1, Request::BackupLock { backup: 10 });
        assert!(matches!(
            other,
            Response::Error {
                code: ErrorCode::Conflict,
                ..
            }
        ));
        let cut = ask(
            &mut p,
            1,
            Request::BackupCut {
                backup: 9,
                since: None,
            },
        );
        assert!(matches!(
            cut,
            Response::BackupCut {
                size_bytes: 1_048_576,
                incremental: false
            }
        ));

        assert_eq!(write(&mut p, 4, false, 0, 4), Vote::CommitOk, "unfenced");
        let saved = |p: &P| {
            (
                p.stats(1).backup_saved_bytes,
                p.stats(1).backup_saved_bytes_max,
            )
        };
        assert_eq!(saved(&p), (4096, 4096), "page 0 saved for the cut");
        let mut page = vec![0u8; 16];
        page[..8].fill(1);
        page[8..].fill(2);
        page.resize(4096, 0);
        assert_eq!(read(&mut p, 0, 8192), vec![(0, page)], "as of the cut");
        assert_eq!(read(&mut p, 8192, 1_048_576 - 8192), vec![]);
        assert_eq!(saved(&p), (0, 4096), "read, so no longer kept");
        assert!(matches!(
            ask(
                &mut p,
                1,
                Request::BackupEnd {
                    backup: 9,
                    completed: true
                }
            ),
            Response::BackupEnded
        ));
        assert_eq!(write(&mut p, 5, false, 0, 5), Vote::CommitOk);

        // Backup 9 completed: a cut since it is incremental, since another is not.
        let cut = |p: &mut P, backup, since| {
            assert!(matches!(
                ask(p, 2, Request::BackupLock { backup }),
                Response::BackupLock { locked: true, .. }
            ));
            match ask(p, 2, Request::BackupCut { backup, since }) {
                Response::BackupCut { incremental, .. } => incremental,
                other => panic!("{other:?}"),
            }
        };
        assert!(cut(&mut p, 10, Some(9)));
        let ended = Request::BackupEnd {
            backup: 10,
            completed: false,
        };
        assert!(matches!(ask(&mut p, 2, ended), Response::BackupEnded));
        assert!(!cut(&mut p, 11, Some(10)), "10 did not complete");
        let unread = Request::BackupEnd {
            backup: 11,
            completed: true,
        };
        assert!(matches!(ask(&mut p, 2, unread), Response::BackupEnded));
        assert!(!cut(&mut p, 12, Some(11)), "11 was not read to the end");
    }

    #[test]
    fn a_fence_nobody_asks_about_lapses() {
        let mut p = node(1, Mode::Ram);
        assert_eq!(lock(&mut p, 0), (true, 0));
        assert_eq!(write(&mut p, 1, true, 0, 1), Vote::AbortLock);
        // A single-node write waits at the fence, for at most its lock_wait_ms.
        assert!(p
            .on_request(0, 0, 1, exec(2, false, 0, 1))
            .replies
            .is_empty());
        let refused = p.tick(u64::from(LOCK_WAIT_MS_MAX)).replies;
        assert!(matches!(&refused[..], [(_, _, Response::Vote(v))] if v.vote == Vote::AbortLock));
        let later = BACKUP_FENCE_LEASE_MS + 1;
        let gone = ask(
            &mut p,
            later,
            Request::BackupCut {
                backup: 9,
                since: None,
            },
        );
        assert!(matches!(
            gone,
            Response::Error {
                code: ErrorCode::NotFound,
                ..
            }
        ));
        assert_eq!(write(&mut p, 3, false, 0, 1), Vote::CommitOk);
    }
}
