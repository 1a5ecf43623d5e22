//! Random request sequences against one `Participant` in log mode, checked against a model
//! of sixteen 8-byte slots. The input picks one-phase compare-and-writes, two-phase
//! prepares and their decisions, read-only reads, log syncs (made durable, then delivered
//! as a separate step, as the node's writer thread does), checkpoints and crashes. A crash
//! keeps only the durable records (less what a checkpoint truncated) and an image that holds
//! at least the last checkpoint; recovery must then rebuild exactly the committed slots.
//! Every reply is checked: a read sees the model's value unless the slot may be locked, a
//! compare holds iff the model says so, and a lock conflict is reported only where one can be.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use tutti_memnode::redo_log::{LogRecord, Lsn};
use tutti_memnode::{participant::Actions, space::Space, Config, Mode, Participant};
use tutti_wire::{
    CmpOp, Decision, ExecPrepare, Item, Limits, NodeId, Request, Response, Tid, Vote,
};

const SLOTS: u64 = 16;
const SPACE_BYTES: u64 = 4096;
const ME: NodeId = 1;

/// A request whose reply has not arrived.
enum Waiting {
    /// A one-phase compare-and-write: `(slot, expected)` compared, `(slot, value)` written.
    OnePhase {
        tid: Tid,
        compare: (u64, u64),
        write: (u64, u64),
    },
    /// A two-phase prepare writing `value` to `slot`.
    Prepare { tid: Tid, slot: u64, value: u64 },
    /// A read-only read of `slot`.
    Read { slot: u64 },
}

impl Waiting {
    fn slots(&self) -> Vec<u64> {
        match self {
            Waiting::OnePhase { compare, write, .. } => vec![compare.0, write.0],
            Waiting::Prepare { slot, .. } => vec![*slot],
            Waiting::Read { slot } => vec![*slot],
        }
    }
}

struct Harness {
    p: Participant<u32>,
    /// The committed value of each slot.
    model: [u64; SLOTS as usize],
    waiting: HashMap<u64, Waiting>,
    /// Prepared with a commit vote, not yet decided: `(tid, slot, value)`.
    voted: Vec<(Tid, u64, u64)>,
    /// Outcomes the coordinator (this harness) decided.
    decided: HashMap<Tid, bool>,
    /// Every record appended and not truncated.
    log: Vec<(Lsn, LogRecord)>,
    durable: Lsn,
    delivered: Lsn,
    /// The durable image: the space as of the last checkpoint.
    image: Vec<u8>,
    next_id: u64,
    next_seq: u64,
}

fn config() -> Config {
    Config {
        id: ME,
        mode: Mode::Log,
        timeout_uncertain_ms: 1_000_000,
        limits: Limits::default(),
        checkpoint_step_tids: 3,
    }
}

fn slot_bytes(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

impl Harness {
    fn new() -> Harness {
        let space = Space::anonymous(SPACE_BYTES).expect("anonymous space");
        Harness {
            p: Participant::new(config(), space, 1),
            model: [0; SLOTS as usize],
            waiting: HashMap::new(),
            voted: Vec::new(),
            decided: HashMap::new(),
            log: Vec::new(),
            durable: 0,
            delivered: 0,
            image: vec![0; SPACE_BYTES as usize],
            next_id: 1,
            next_seq: 1,
        }
    }

    fn tid(&mut self) -> Tid {
        self.next_seq += 1;
        Tid {
            epoch: 1,
            coordinator: 7,
            seq: self.next_seq,
        }
    }

    /// Whether some request in flight or some undecided prepare may hold a lock on `slot`.
    fn maybe_locked(&self, slot: u64) -> bool {
        self.waiting.values().any(|w| w.slots().contains(&slot))
            || self.voted.iter().any(|(_, s, _)| *s == slot)
    }

    fn send(&mut self, ep: ExecPrepare, waiting: Waiting) {
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.insert(id, waiting);
        let acts = self.p.on_request(0, 0, id, Request::ExecPrepare(ep));
        self.take(acts);
    }

    fn take(&mut self, acts: Actions<u32>) {
        self.log.extend(acts.append);
        if let Some(below) = acts.truncate_below {
            assert!(below <= self.durable + 1, "truncation past the durable log");
            self.log.retain(|(lsn, _)| *lsn >= below);
        }
        for (_, id, resp) in acts.replies {
            self.reply(id, resp);
        }
    }

    fn reply(&mut self, id: u64, resp: Response) {
        let waiting = self.waiting.remove(&id).expect("a reply to a request sent");
        let Response::Vote(v) = resp else {
            panic!("expected a vote, got {resp:?}");
        };
        if v.vote == Vote::AbortLock {
            let held = waiting.slots().iter().any(|s| self.maybe_locked(*s));
            assert!(held, "a lock conflict with no lock held");
            return;
        }
        match waiting {
            Waiting::Read { slot } => {
                assert_eq!(v.vote, Vote::CommitOk);
                assert_eq!(v.reads, vec![slot_bytes(self.model[slot as usize])]);
            }
            Waiting::OnePhase {
                compare,
                write,
                tid,
            } => {
                let holds = self.model[compare.0 as usize] == compare.1;
                let expected = if holds {
                    Vote::CommitOk
                } else {
                    Vote::AbortCompare
                };
                assert_eq!(v.vote, expected, "{tid}");
                if holds {
                    self.model[write.0 as usize] = write.1;
                }
            }
            Waiting::Prepare { tid, slot, value } => {
                assert_eq!(v.vote, Vote::CommitOk, "{tid}");
                self.voted.push((tid, slot, value));
            }
        }
    }

    fn one_phase(&mut self, compare: (u64, u64), write: (u64, u64)) {
        let tid = self.tid();
        let items = vec![
            Item::Compare {
                addr: compare.0 * 8,
                op: CmpOp::Eq,
                bytes: slot_bytes(compare.1),
            },
            Item::Write {
                addr: write.0 * 8,
                bytes: slot_bytes(write.1),
            },
        ];
        let ep = exec_prepare(tid, vec![ME], items);
        self.send(
            ep,
            Waiting::OnePhase {
                tid,
                compare,
                write,
            },
        );
    }

    fn prepare(&mut self, slot: u64, value: u64) {
        let tid = self.tid();
        let items = vec![Item::Write {
            addr: slot * 8,
            bytes: slot_bytes(value),
        }];
        self.send(
            exec_prepare(tid, vec![ME, 2], items),
            Waiting::Prepare { tid, slot, value },
        );
    }

    fn read(&mut self, slot: u64) {
        let tid = self.tid();
        let mut ep = exec_prepare(
            tid,
            vec![ME],
            vec![Item::Read {
                addr: slot * 8,
                len: 8,
            }],
        );
        ep.read_only = true;
        self.send(ep, Waiting::Read { slot });
    }

    fn decide(&mut self, pick: usize, commit: bool) {
        if self.voted.is_empty() {
            return;
        }
        let (tid, slot, value) = self.voted.remove(pick % self.voted.len());
        self.decided.insert(tid, commit);
        if commit {
            self.model[slot as usize] = value;
        }
        let decision = Decision {
            tid,
            commit,
            lsns: Vec::new(),
        };
        let acts = self
            .p
            .on_request(0, 0, 0, Request::Decisions(vec![decision]));
        self.take(acts);
    }

    fn sync(&mut self) {
        self.durable = self.log.last().map_or(self.durable, |(lsn, _)| *lsn);
    }

    fn deliver(&mut self) {
        if self.delivered < self.durable {
            self.delivered = self.durable;
            let acts = self.p.on_synced(0, self.durable);
            self.take(acts);
        }
    }

    fn checkpoint(&mut self) {
        self.sync();
        self.deliver();
        let mut cp = self.p.checkpoint_begin();
        self.image = self.p.space().read(0, SPACE_BYTES).to_vec();
        let acts = loop {
            if let Some(acts) = self.p.checkpoint_step(&mut cp) {
                break acts;
            }
        };
        self.log.extend(acts.append);
        self.sync();
        self.deliver();
        self.take(Actions {
            truncate_below: acts.truncate_below,
            replies: acts.replies,
            append: Vec::new(),
        });
    }

    /// Kills the node: unsynced records and every reply not yet sent are lost. The image
    /// holds the last checkpoint, or (`flushed`) everything applied so far.
    fn crash(&mut self, flushed: bool) {
        let lost_from = self.durable + 1;
        self.log.retain(|(lsn, _)| *lsn < lost_from);
        // A one-phase minitransaction whose Prepare became durable commits; its reply is lost.
        for waiting in std::mem::take(&mut self.waiting).into_values() {
            if let Waiting::OnePhase {
                tid,
                compare,
                write,
            } = waiting
            {
                let durable = self.log.iter().any(
                    |(_, r)| matches!(r, LogRecord::Prepare { tid: t, .. } if *t == tid),
                );
                if durable {
                    assert_eq!(self.model[compare.0 as usize], compare.1, "{tid}");
                    self.model[write.0 as usize] = write.1;
                }
            }
        }
        // The coordinator aborts what it had not decided yet.
        for (tid, _, _) in std::mem::take(&mut self.voted) {
            self.decided.insert(tid, false);
        }
        let mut space = Space::anonymous(SPACE_BYTES).expect("anonymous space");
        let image = if flushed {
            self.p.space().read(0, SPACE_BYTES).to_vec()
        } else {
            self.image.clone()
        };
        space.write(0, &image);
        let next_lsn = lost_from;
        self.p = Participant::recover(config(), space, next_lsn, self.log.clone());
        let outcomes: Vec<(Tid, bool)> = (self.p.undecided().into_iter())
            .map(|(tid, _)| (tid, self.decided.get(&tid).copied().unwrap_or(false)))
            .collect();
        let acts = self.p.resolve(&outcomes);
        self.log.extend(acts.append);
        self.p.finish_recovery();
        self.delivered = self.durable;
        for slot in 0..SLOTS {
            assert_eq!(
                self.p.space().read(slot * 8, 8),
                &slot_bytes(self.model[slot as usize])[..],
                "slot {slot} after recovery"
            );
        }
    }
}

fn exec_prepare(tid: Tid, participants: Vec<NodeId>, items: Vec<Item>) -> ExecPrepare {
    ExecPrepare {
        tid,
        participants,
        class: "fuzz".into(),
        read_only: false,
        items,
        executed: 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut h = Harness::new();
    for op in data.chunks_exact(4) {
        let (a, b, c) = (u64::from(op[1]), u64::from(op[2]), u64::from(op[3]));
        match op[0] % 10 {
            0 | 1 => {
                let (slot, write) = (a % SLOTS, b % SLOTS);
                // Half the time the compare names the current value.
                let expected = if c & 1 == 0 {
                    h.model[slot as usize]
                } else {
                    c
                };
                h.one_phase((slot, expected), (write, c + 1));
            }
            2 => h.prepare(a % SLOTS, b + 1),
            3 => h.decide(a as usize, b & 1 == 0),
            4 => h.sync(),
            5 => h.deliver(),
            6 => h.read(a % SLOTS),
            7 => h.checkpoint(),
            8 => h.crash(a & 1 == 0),
            _ => {
                h.sync();
                h.deliver();
            }
        }
    }
    h.checkpoint();
    h.crash(false);
});
