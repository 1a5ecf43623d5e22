//! Byte-range reader/writer try-locks (Sinfonia §4.2): if any range is busy a
//! minitransaction takes none; the participant then has it vote ABORT-LOCK, or, touching
//! that node alone, wait until a release (`take_freed`) lets it try again.

use rustc_hash::FxHashMap;
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use tutti_wire::Tid;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LockKind {
    Read,
    Write,
}

/// A range `[start, end)` a minitransaction wants, and how.
#[derive(Clone, Copy, Debug)]
pub struct LockRange {
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
}

#[derive(Default)]
pub struct RangeLocks {
    /// Held ranges keyed by (start, holder); several readers may share bytes.
    held: BTreeMap<(u64, Tid), (u64, LockKind)>,
    by_tid: FxHashMap<Tid, Vec<u64>>,
    /// Longest range ever held: bounds how far left of a query an overlapping range may start.
    range_bytes_max: u64,
    /// Set while a backup takes its cut: every `try_lock` fails, so the held locks drain.
    fenced: bool,
    /// A lock was released (or the fence lifted) since `take_freed` last said so.
    freed: bool,
}

const TID_MIN: Tid = Tid {
    epoch: 0,
    coordinator: 0,
    seq: 0,
};

impl RangeLocks {
    /// Takes every range for `tid`, or none if any conflicts with another holder.
    pub fn try_lock(&mut self, tid: Tid, ranges: &[LockRange]) -> bool {
        if self.fenced || ranges.iter().any(|r| self.conflicts(tid, r)) {
            return false;
        }
        let starts = self.by_tid.entry(tid).or_default();
        for r in ranges {
            match self.held.entry((r.start, tid)) {
                Entry::Vacant(slot) => {
                    slot.insert((r.end, r.kind));
                    starts.push(r.start);
                }
                Entry::Occupied(mut slot) => {
                    let held = slot.get_mut();
                    held.0 = held.0.max(r.end);
                    if r.kind == LockKind::Write {
                        held.1 = LockKind::Write;
                    }
                }
            }
            self.range_bytes_max = self.range_bytes_max.max(r.end - r.start);
        }
        true
    }

    fn conflicts(&self, tid: Tid, want: &LockRange) -> bool {
        let from = want.start.saturating_sub(self.range_bytes_max);
        self.held.range((from, TID_MIN)..(want.end, TID_MIN)).any(
            |(&(start, holder), &(end, kind))| {
                holder != tid
                    && start < want.end
                    && end > want.start
                    && (kind == LockKind::Write || want.kind == LockKind::Write)
            },
        )
    }

    pub fn release(&mut self, tid: Tid) {
        if let Some(starts) = self.by_tid.remove(&tid) {
            for start in starts {
                self.held.remove(&(start, tid));
            }
            self.freed = true;
        }
    }

    /// Whether a lock was released, or the fence lifted, since the last call.
    pub fn take_freed(&mut self) -> bool {
        std::mem::take(&mut self.freed)
    }

    /// Gives up `tid`'s shared ranges and keeps its exclusive ones (a range both read and
    /// written from the same start is exclusive and stays).
    pub fn release_reads(&mut self, tid: Tid) {
        let Some(starts) = self.by_tid.get_mut(&tid) else {
            return;
        };
        starts.retain(|&start| match self.held.get(&(start, tid)) {
            Some((_, LockKind::Read)) => {
                self.held.remove(&(start, tid));
                self.freed = true;
                false
            }
            _ => true,
        });
        if starts.is_empty() {
            self.by_tid.remove(&tid);
        }
    }

    /// Whether any holder has an exclusive lock on bytes of `[start, end)`.
    pub fn write_held(&self, start: u64, end: u64) -> bool {
        let from = start.saturating_sub(self.range_bytes_max);
        (self.held.range((from, TID_MIN)..(end, TID_MIN)))
            .any(|(&(s, _), &(e, kind))| s < end && e > start && kind == LockKind::Write)
    }

    pub fn holders(&self) -> usize {
        self.by_tid.len()
    }

    /// While `fenced`, no lock is granted, to anyone.
    pub fn set_fenced(&mut self, fenced: bool) {
        self.freed |= self.fenced && !fenced;
        self.fenced = fenced;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid(seq: u64) -> Tid {
        Tid {
            epoch: 0,
            coordinator: 1,
            seq,
        }
    }
    fn r(start: u64, end: u64, kind: LockKind) -> LockRange {
        LockRange { start, end, kind }
    }

    #[test]
    fn readers_share_writers_exclude() {
        let mut locks = RangeLocks::default();
        assert!(locks.try_lock(tid(1), &[r(0, 8, LockKind::Read)]));
        assert!(locks.try_lock(tid(2), &[r(4, 12, LockKind::Read)]));
        assert!(!locks.try_lock(tid(3), &[r(7, 9, LockKind::Write)]));
        assert!(locks.try_lock(tid(3), &[r(12, 20, LockKind::Write)]));
        assert!(!locks.try_lock(
            tid(4),
            &[r(100, 108, LockKind::Read), r(19, 20, LockKind::Read)]
        ));
        // All-or-nothing: tid 4 took nothing, so 100..108 is free.
        assert!(locks.try_lock(tid(5), &[r(100, 108, LockKind::Write)]));
        locks.release(tid(1));
        locks.release(tid(2));
        assert!(locks.try_lock(tid(6), &[r(0, 12, LockKind::Write)]));
        assert_eq!(locks.holders(), 3);
    }

    #[test]
    fn write_held_names_exclusive_ranges_only() {
        let mut locks = RangeLocks::default();
        assert!(locks.try_lock(tid(1), &[r(0, 8, LockKind::Read)]));
        assert!(locks.try_lock(tid(2), &[r(100, 164, LockKind::Write)]));
        assert!(!locks.write_held(0, 8), "shared");
        assert!(locks.write_held(160, 170) && locks.write_held(90, 101));
        assert!(!locks.write_held(164, 200) && !locks.write_held(50, 100));
        locks.release(tid(2));
        assert!(!locks.write_held(100, 164));
    }

    #[test]
    fn own_locks_never_conflict() {
        let mut locks = RangeLocks::default();
        assert!(locks.try_lock(tid(1), &[r(0, 8, LockKind::Read), r(0, 8, LockKind::Write)]));
        assert!(!locks.try_lock(tid(2), &[r(0, 1, LockKind::Read)]));
        locks.release(tid(1));
        assert!(locks.try_lock(tid(2), &[r(0, 1, LockKind::Read)]));
    }

    #[test]
    fn releasing_reads_keeps_the_writes() {
        let mut locks = RangeLocks::default();
        let ranges = [
            r(0, 8, LockKind::Read),
            r(16, 24, LockKind::Write),
            r(32, 40, LockKind::Read),
            r(32, 36, LockKind::Write),
        ];
        assert!(locks.try_lock(tid(1), &ranges));
        locks.release_reads(tid(1));
        assert!(locks.try_lock(tid(2), &[r(0, 8, LockKind::Write)]));
        assert!(!locks.try_lock(tid(3), &[r(16, 24, LockKind::Read)]));
        assert!(!locks.try_lock(tid(3), &[r(38, 40, LockKind::Read)]));
        locks.release_reads(tid(2));
        assert_eq!(locks.holders(), 2);
        locks.release(tid(1));
        locks.release(tid(2));
        assert_eq!(locks.holders(), 0);
        locks.release_reads(tid(1));
        assert!(locks.try_lock(tid(3), &[r(0, 40, LockKind::Write)]));
    }

    #[test]
    fn long_range_left_of_query_is_found() {
        let mut locks = RangeLocks::default();
        assert!(locks.try_lock(tid(1), &[r(0, 1 << 20, LockKind::Write)]));
        assert!(!locks.try_lock(tid(2), &[r((1 << 20) - 1, 1 << 20, LockKind::Read)]));
        assert!(locks.try_lock(tid(2), &[r(1 << 20, (1 << 20) + 8, LockKind::Read)]));
    }
}
