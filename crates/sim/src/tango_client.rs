//! A simulated tango client: the real `Runtime`, `Load`, `Player` and `Rebuild` of
//! crates/tango, driven over the simulated log (`log_io`). A transfer client hosts some of
//! the bank's accounts and moves money out of them into any account in transactions (a
//! local read, local and remote writes); the maintainer hosts every account and the
//! directory, checkpoints each in turn, forgets below the checkpoint and trims the log below
//! every forget position. What each saw goes to the shared `TangoHistory`.

use crate::log_io::{Done, LogIo, OpId};
use crate::msg::{self, Directory as Nodes, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;
use tutti_log::{LogLayout, StreamId};
use tutti_tango::codec::{Malformed, Reader, Writer};
use tutti_tango::directory::DIRECTORY_NAME;
use tutti_tango::play::Views;
use tutti_tango::{
    Applied, Directory, Kind, Load, LoadStep, Object, Oid, PlayStep, Player, Rebuild, RebuildStep,
    Record, Reply, Runtime, Speculated, Synced, TangoError, Tx, Write, DIRECTORY_OID,
};

/// The bank's accounts: objects 1 to 8, each in its own stream.
pub(crate) const ACCOUNTS: [Oid; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
/// A transfer moves money only out of an account holding at least this much, and at most
/// `AMOUNT_MAX`: serially, no balance ever goes below `BALANCE_MIN - AMOUNT_MAX`.
pub(crate) const BALANCE_MIN: i64 = -20;
pub(crate) const AMOUNT_MAX: i64 = 5;
/// Loads of an account's history that a trim may pass before its absence counts.
const HISTORY_TRIES_MAX: u32 = 5;
/// Pause between two transfers, or two rounds of the maintainer, or two looks at whether
/// everyone is done.
const PAUSE_US: u64 = 4_000;
/// The share of transfers whose first write goes in a speculative entry ahead of the
/// commit record (a client that crashes in between leaves an orphan).
const SPECULATIVE_SHARE: f64 = 0.3;

/// An account: its balance, and the lowest it ever was (part of the view, so every view
/// that played the same entries holds the same).
#[derive(Default, Debug)]
pub(crate) struct Account {
    pub(crate) balance: i64,
    pub(crate) lowest: i64,
}

impl Object for Account {
    fn apply(&mut self, _: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        let mut r = Reader::new(update);
        let delta = r.i64("account's change")?;
        r.end("account's change")?;
        self.balance += delta;
        self.lowest = self.lowest.min(self.balance);
        Ok(Applied::default())
    }

    fn checkpoint(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.i64(self.balance).i64(self.lowest);
        w.finish()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let mut r = Reader::new(bytes);
        (self.balance, self.lowest) = (r.i64("balance")?, r.i64("lowest")?);
        r.end("account's checkpoint")
    }
}

fn change(delta: i64) -> Vec<u8> {
    delta.to_le_bytes().to_vec()
}

/// Empty views of `oids`: accounts, and the directory at its id.
fn views(oids: &[Oid]) -> Views {
    (oids.iter())
        .map(|&oid| match oid {
            DIRECTORY_OID => (oid, Box::new(Directory::default()) as Box<dyn Object>),
            _ => (oid, Box::new(Account::default()) as Box<dyn Object>),
        })
        .collect()
}

/// A transfer some client made (by transaction id: the client's id, then its number): its
/// outcome, once the client learned it.
#[derive(Clone, Debug)]
pub(crate) struct Transfer {
    pub(crate) from: Oid,
    pub(crate) to: Oid,
    pub(crate) amount: i64,
    /// The balance of `from` it read.
    pub(crate) read: i64,
    /// Where its commit record is, once its append was acknowledged.
    pub(crate) position: Option<u64>,
    /// None: the client crashed before it learned the outcome.
    pub(crate) committed: Option<bool>,
}

/// What every client saw, for the checks at the end.
#[derive(Default)]
pub(crate) struct TangoHistory {
    pub(crate) transfers: BTreeMap<u64, Transfer>,
    /// Transfer clients done with their transfers.
    pub(crate) finished: BTreeSet<u64>,
    pub(crate) transfer_clients: usize,
    /// Each client's views at its last play, begun once every transfer client had
    /// finished: account → (balance, lowest).
    pub(crate) views: BTreeMap<u64, BTreeMap<Oid, (i64, i64)>>,
    pub(crate) broken: Vec<tutti_workload::Violation>,
    /// Every commit record some client played: its outcome, and the first client to play it.
    pub(crate) decisions: BTreeMap<u64, (bool, u64)>,
    /// Each account's forget position, as the maintainer appends it (a lower bound of the
    /// directory's, which may hold a later one whose append had no outcome).
    pub(crate) forgets: BTreeMap<Oid, u64>,
}

/// What objects ask for decision records, per run.
pub(crate) type Decisions = Rc<BTreeSet<Oid>>;

pub(crate) enum Role {
    Transfers { hosted: Vec<Oid>, transfers: usize },
    Maintainer,
}

/// What a finished play goes on with.
#[derive(Clone, Debug)]
enum Then {
    /// Make the next transfer.
    Transfer,
    /// Learn the outcome of the transfer whose commit record is at `position`.
    Outcome {
        tx: u64,
        position: u64,
        decision: Option<Vec<Oid>>,
        /// `reloads` when the commit record was appended.
        reloads: u64,
    },
    /// The last play: record the views.
    Last,
    /// The maintainer's round: checkpoint the next object.
    Checkpoint,
    /// The maintainer's round: trim below every forget position.
    Trim,
}

/// What a log operation under way is for.
#[derive(Clone, Debug)]
enum Purpose {
    LoadTrimPoint,
    LoadSync(usize),
    LoadParts,
    PlaySync(usize),
    /// The speculative entry holding a transfer's first write; its commit record follows.
    Speculative {
        tx: Tx,
        decision: Option<Vec<Oid>>,
        streams: Vec<StreamId>,
    },
    Commit {
        tx: u64,
        decision: Option<Vec<Oid>>,
    },
    OwnDecision {
        position: u64,
    },
    Decision {
        commit: u64,
    },
    /// A checkpoint part: the object's place in `hosted`, the part's number.
    Part((usize, usize)),
    CheckpointRecord,
    Forget,
    Trim,
}

/// A `Load` under way: for the hosted views, or for a rebuild that decides a commit.
struct Loading {
    load: Load,
    oids: Vec<Oid>,
    synced: Vec<Option<Synced>>,
    why: Why,
}

/// What a load is for.
enum Why {
    /// The hosted views.
    Host,
    /// Deciding the commit at this position, which read these.
    Decide(Rebuild, u64, Vec<tutti_tango::Read>),
    /// A view of an account as of a position, to compare with the balance seen there live.
    History(Rebuild, Oid, u64, i64),
}

impl Why {
    fn until(&self) -> Option<u64> {
        match self {
            Why::Host => None,
            Why::Decide(_, commit, _) => Some(*commit),
            Why::History(_, _, position, _) => Some(*position),
        }
    }
}

pub(crate) struct SimTangoClient {
    id: u64,
    role: Role,
    io: LogIo,
    decisions: Decisions,
    history: Rc<RefCell<TangoHistory>>,
    runtime: Option<Runtime>,
    player: Player,
    decision_timeout: Duration,
    hosted: Vec<Oid>,
    /// Each hosted stream's floor, in `hosted` order.
    floors: Vec<u64>,
    loading: Option<Loading>,
    playing: Option<(Vec<Option<Synced>>, Then)>,
    then: Option<Then>,
    pending: BTreeMap<OpId, Purpose>,
    next_op: OpId,
    /// Transfers begun; the one whose outcome is awaited.
    started: usize,
    /// The maintainer: its rounds so far, the positions of the checkpoints' parts (by
    /// object and number), how many, and the position the checkpoints were taken at.
    turn: usize,
    parts: BTreeMap<(usize, usize), u64>,
    /// The objects of this round (places in `hosted`).
    round: Vec<usize>,
    parts_wanted: usize,
    as_of: u64,
    trimmed: u64,
    /// Times the views were rebuilt from the log (a trim passed them).
    reloads: u64,
    /// Balances seen live: account, position played, balance.
    samples: Vec<(Oid, u64, i64)>,
    history_tries: u32,
    done: bool,
}

impl SimTangoClient {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        role: Role,
        log: &str,
        layout: LogLayout,
        hole_timeout: Duration,
        decision_timeout: Duration,
        nodes: Rc<Nodes>,
        sequencers: Vec<Addr>,
        decisions: Decisions,
        history: Rc<RefCell<TangoHistory>>,
    ) -> SimTangoClient {
        let hosted = match &role {
            Role::Transfers { hosted, .. } => hosted.clone(),
            Role::Maintainer => [DIRECTORY_OID].into_iter().chain(ACCOUNTS).collect(),
        };
        SimTangoClient {
            id,
            role,
            io: LogIo::new(log, layout, hole_timeout, nodes, sequencers, 1000 + id),
            decisions,
            history,
            runtime: None,
            player: Player::new(decision_timeout),
            decision_timeout,
            hosted,
            floors: Vec::new(),
            loading: None,
            playing: None,
            then: None,
            pending: BTreeMap::new(),
            next_op: 0,
            started: 0,
            turn: 0,
            parts: BTreeMap::new(),
            round: Vec::new(),
            parts_wanted: 0,
            as_of: 0,
            trimmed: 0,
            reloads: 0,
            samples: Vec::new(),
            history_tries: 0,
            done: false,
        }
    }

    fn op(&mut self, purpose: Purpose) -> OpId {
        self.next_op += 1;
        self.pending.insert(self.next_op, purpose);
        self.next_op
    }

    fn now(ctx: &Ctx<'_>) -> Duration {
        Duration::from_micros(ctx.now_us())
    }

    fn broken(&mut self, what: &'static str, why: String) {
        let why = format!("tango client {}: {why}", self.id);
        self.history
            .borrow_mut()
            .broken
            .push(tutti_workload::Violation::new(what, why));
        self.done = true;
    }

    /// Rebuilds the hosted views from the log, then goes on with `then`.
    fn host(&mut self, ctx: &mut Ctx<'_>, then: Then) {
        self.reloads += 1;
        self.runtime = None;
        self.player = Player::new(self.decision_timeout);
        self.then = Some(then);
        self.start_load(ctx, self.hosted.clone(), None, Why::Host);
    }

    fn start_load(&mut self, ctx: &mut Ctx<'_>, oids: Vec<Oid>, start_by: Option<u64>, why: Why) {
        let (load, step) = Load::starting_by(views(&oids), why.until(), start_by);
        self.loading = Some(Loading {
            load,
            oids,
            synced: Vec::new(),
            why,
        });
        self.load_step(ctx, Ok(step));
    }

    fn load_step(&mut self, ctx: &mut Ctx<'_>, step: Result<LoadStep, TangoError>) {
        let step = match step {
            Ok(step) => step,
            Err(TangoError::Trimmed { .. }) => return self.restart_load(ctx),
            Err(e) => return self.broken("tango load", e.to_string()),
        };
        match step {
            LoadStep::TrimPoint => {
                let id = self.op(Purpose::LoadTrimPoint);
                self.io.trim_point(ctx, id);
            }
            LoadStep::Sync { oids, from } => {
                let loading = self.loading.as_mut().expect("loading");
                loading.synced = vec![None; oids.len()];
                for (i, oid) in oids.into_iter().enumerate() {
                    let id = self.op(Purpose::LoadSync(i));
                    self.io.sync(ctx, id, oid as StreamId, from);
                }
            }
            LoadStep::ReadParts(positions) => {
                let id = self.op(Purpose::LoadParts);
                self.io.read(ctx, id, positions);
            }
            LoadStep::Done => self.loaded(ctx),
        }
    }

    /// A trim passed the load: a load of the hosted views starts again from the new trim
    /// point; a rebuild's history is gone, so the hosted views are rebuilt from their
    /// latest checkpoints (past the commit it was to decide, once the maintainer takes
    /// them), as a user reopens on `Trimmed`. An account's history at or above its forget
    /// position must still be there.
    fn restart_load(&mut self, ctx: &mut Ctx<'_>) {
        let Some(Loading { oids, why, .. }) = self.loading.take() else {
            return;
        };
        match why {
            Why::Host => self.start_load(ctx, oids, None, Why::Host),
            Why::Decide(..) => {
                let (_, then) = self.playing.take().expect("a rebuild is part of a play");
                self.then = Some(then);
                ctx.set_timer(PAUSE_US, Tick::Reload);
            }
            Why::History(_, oid, position, balance) => {
                // A trim may pass a load under way: try again a few times. The maintainer
                // may also have forgotten past the position meanwhile.
                let forget = self
                    .history
                    .borrow()
                    .forgets
                    .get(&oid)
                    .copied()
                    .unwrap_or_default();
                if position < forget {
                    self.done = true;
                } else if self.history_tries < HISTORY_TRIES_MAX {
                    self.history_tries += 1;
                    self.rebuild(ctx, vec![oid], position, |r| {
                        Why::History(r, oid, position, balance)
                    });
                } else {
                    self.broken(
                        "history kept",
                        format!("account {oid} as of {position} is trimmed away; it forgot only below {forget}"),
                    );
                }
            }
        }
    }

    fn loaded(&mut self, ctx: &mut Ctx<'_>) {
        let Loading {
            load, synced, why, ..
        } = self.loading.take().expect("loading");
        let runtime = load.runtime();
        match why {
            Why::Host => {
                self.floors = synced
                    .iter()
                    .map(|s| s.as_ref().map_or(0, |s| s.floor))
                    .collect();
                let mut runtime = runtime;
                if let Some(Then::Outcome { tx, .. }) = &self.then {
                    runtime.await_reply(*tx);
                }
                self.runtime = Some(runtime);
                let then = self.then.take().expect("what the load was for");
                self.play(ctx, then);
            }
            Why::Decide(mut rebuild, commit, reads) => match rebuild.on_loaded(runtime) {
                Ok(RebuildStep::Load { oids, start_by, .. }) => self.start_load(
                    ctx,
                    oids,
                    Some(start_by),
                    Why::Decide(rebuild, commit, reads),
                ),
                Ok(RebuildStep::Done(views)) => {
                    let committed = views.validate(&reads);
                    let runtime = self.runtime.as_mut().expect("hosting");
                    let step = self.player.on_replayed(runtime, commit, committed);
                    self.play_step(ctx, Ok(step));
                }
                Err(e) => self.broken("tango rebuild", e.to_string()),
            },
            Why::History(mut rebuild, oid, position, balance) => match rebuild.on_loaded(runtime) {
                Ok(RebuildStep::Load { oids, start_by, .. }) => {
                    let why = Why::History(rebuild, oid, position, balance);
                    self.start_load(ctx, oids, Some(start_by), why)
                }
                Ok(RebuildStep::Done(views)) => {
                    let then = views
                        .view(oid, |a: &Account| a.balance)
                        .expect("an account");
                    if then != balance {
                        let why = format!(
                            "account {oid} as of {position} rebuilt holds {then}, {balance} live"
                        );
                        self.broken("history kept", why);
                    }
                    self.done = true;
                }
                Err(e) => self.broken("tango history", e.to_string()),
            },
        }
    }

    /// Syncs every hosted stream and plays; then `then`.
    fn play(&mut self, ctx: &mut Ctx<'_>, then: Then) {
        self.playing = Some((vec![None; self.hosted.len()], then));
        for i in 0..self.hosted.len() {
            let id = self.op(Purpose::PlaySync(i));
            self.io
                .sync(ctx, id, self.hosted[i] as StreamId, self.floors[i]);
        }
    }

    /// Every client that plays a commit record decides it alike (Tango §3.2).
    fn note_decisions(&mut self) {
        let Some(runtime) = self.runtime.as_mut() else {
            return;
        };
        let decided = runtime.take_decisions();
        let mut h = self.history.borrow_mut();
        for (position, committed) in decided {
            let (first, by) = *h.decisions.entry(position).or_insert((committed, self.id));
            if first != committed {
                let why = format!(
                    "the commit record at {position}: client {by} decided committed={first}, client {} committed={committed}",
                    self.id
                );
                h.broken
                    .push(tutti_workload::Violation::new("decisions agree", why));
            }
        }
    }

    fn play_step(&mut self, ctx: &mut Ctx<'_>, step: Result<PlayStep, TangoError>) {
        self.note_decisions();
        let step = match step {
            Ok(step) => step,
            Err(TangoError::Trimmed { .. }) => {
                // Fell behind a trim: rebuild the views from the checkpoints, as users do.
                let (_, then) = self.playing.take().expect("playing");
                return self.host(ctx, then);
            }
            Err(e) => return self.broken("tango play", e.to_string()),
        };
        match step {
            PlayStep::Sync => {
                let (_, then) = self.playing.take().expect("playing");
                self.play(ctx, then);
            }
            PlayStep::Pause(pause) => ctx.set_timer(pause.as_micros() as u64, Tick::Replay),
            PlayStep::Replay { commit, reads } => {
                let oids: Vec<Oid> = reads.iter().map(|r| r.oid).collect();
                self.rebuild(ctx, oids, commit, |r| Why::Decide(r, commit, reads));
            }
            PlayStep::AppendDecision {
                commit,
                committed,
                streams,
            } => {
                let id = self.op(Purpose::Decision { commit });
                let record = Record::Decision { commit, committed };
                let streams: Vec<StreamId> = streams.iter().map(|&s| s as StreamId).collect();
                self.io.append(ctx, id, record.encode(), &streams);
            }
            PlayStep::Done => {
                let (_, then) = self.playing.take().expect("playing");
                self.then_do(ctx, then);
            }
        }
    }

    fn then_do(&mut self, ctx: &mut Ctx<'_>, then: Then) {
        match then {
            Then::Transfer => self.transfer(ctx),
            Then::Outcome {
                tx,
                position,
                decision,
                reloads,
            } => self.outcome(ctx, tx, position, decision, reloads),
            Then::Last => {
                let runtime = self.runtime.as_ref().expect("hosting");
                let views = (self.hosted.iter())
                    .filter(|&&oid| oid != DIRECTORY_OID)
                    .map(|&oid| {
                        let v = runtime.view(oid, |a: &Account| (a.balance, a.lowest));
                        (oid, v.expect("an account"))
                    })
                    .collect();
                self.history.borrow_mut().views.insert(self.id, views);
                self.check_history(ctx);
            }
            Then::Checkpoint => self.checkpoint(ctx),
            Then::Trim => self.trim(ctx),
        }
    }

    /// Rebuilds an account as of a position where this client saw its balance live, if one
    /// is at or above the account's forget position (History: the log keeps what was not
    /// forgotten); done after.
    fn check_history(&mut self, ctx: &mut Ctx<'_>) {
        let forgets = self.history.borrow().forgets.clone();
        let kept: Vec<(Oid, u64, i64)> = (self.samples.iter())
            .filter(|(oid, position, _)| forgets.get(oid).copied().unwrap_or_default() <= *position)
            .copied()
            .collect();
        if kept.is_empty() {
            self.done = true;
            return;
        }
        let (oid, position, balance) = kept[ctx.rng().gen_range(0..kept.len())];
        self.rebuild(ctx, vec![oid], position, |r| {
            Why::History(r, oid, position, balance)
        });
    }

    /// Views of `oids` as of `until`, for `why`.
    fn rebuild(
        &mut self,
        ctx: &mut Ctx<'_>,
        oids: Vec<Oid>,
        until: u64,
        why: impl FnOnce(Rebuild) -> Why,
    ) {
        let (rebuild, step) = Rebuild::new(oids, until);
        let RebuildStep::Load { oids, start_by, .. } = step else {
            unreachable!("a rebuild starts with a load")
        };
        self.start_load(ctx, oids, Some(start_by), why(rebuild));
    }

    /// The next transfer, or the last play once every transfer client finished.
    fn transfer(&mut self, ctx: &mut Ctx<'_>) {
        let Role::Transfers { transfers, .. } = self.role else {
            unreachable!("a transfer client")
        };
        if self.started == transfers {
            return self.wait_for_all(ctx);
        }
        self.started += 1;
        let tx_id = (self.id << 32) | self.started as u64;
        let from = self.hosted[ctx.rng().gen_range(0..self.hosted.len())];
        let others: Vec<Oid> = ACCOUNTS.iter().copied().filter(|&a| a != from).collect();
        let to = others[ctx.rng().gen_range(0..others.len())];
        let amount = ctx.rng().gen_range(1..=AMOUNT_MAX);
        let runtime = self.runtime.as_mut().expect("hosting");
        let seen = runtime
            .view(from, |a: &Account| a.balance)
            .expect("a hosted account");
        self.samples.push((from, runtime.played(), seen));
        let mut tx = Tx::new(tx_id);
        let balance = runtime.view_in(&mut tx, from, None, |a: &Account| a.balance);
        let balance = balance.expect("a hosted account");
        if balance < BALANCE_MIN {
            // Too poor: a read-only transaction, nothing to append.
            ctx.set_timer(PAUSE_US, Tick::Next);
            return;
        }
        tx.write(from, None, change(-amount));
        tx.write(to, None, change(amount));
        let decision = [from, to]
            .iter()
            .any(|o| self.decisions.contains(o))
            .then(|| vec![from.min(to), from.max(to)]);
        runtime.await_reply(tx_id);
        self.history.borrow_mut().transfers.insert(
            tx_id,
            Transfer {
                from,
                to,
                amount,
                read: balance,
                position: None,
                committed: None,
            },
        );
        let mut streams = vec![from as StreamId, to as StreamId];
        streams.sort_unstable();
        if ctx.rng().gen_bool(SPECULATIVE_SHARE) {
            let entry = tx.speculative(0..1).encode();
            let id = self.op(Purpose::Speculative {
                tx,
                decision,
                streams,
            });
            self.io.append(ctx, id, entry, &[from as StreamId]);
            return;
        }
        self.commit(ctx, &tx, &[], decision, &streams);
    }

    /// Appends `tx`'s commit record, after its speculative entries `speculated`.
    fn commit(
        &mut self,
        ctx: &mut Ctx<'_>,
        tx: &Tx,
        speculated: &[Speculated],
        decision: Option<Vec<Oid>>,
        streams: &[StreamId],
    ) {
        let record = tx.commit_record_after(decision.is_some(), speculated);
        let id = self.op(Purpose::Commit {
            tx: tx.id,
            decision,
        });
        self.io.append(ctx, id, record.encode(), streams);
    }

    fn outcome(
        &mut self,
        ctx: &mut Ctx<'_>,
        tx: u64,
        position: u64,
        decision: Option<Vec<Oid>>,
        reloads: u64,
    ) {
        let runtime = self.runtime.as_mut().expect("hosting");
        let Some(Reply::Tx { committed, .. }) = runtime.take_reply(tx) else {
            if reloads != self.reloads {
                // Rebuilt from a checkpoint past the commit: its outcome stays unknown.
                ctx.set_timer(PAUSE_US, Tick::Next);
                return;
            }
            return self.broken(
                "tango commit",
                format!("played past its commit record at {position} without its outcome"),
            );
        };
        if let Some(t) = self.history.borrow_mut().transfers.get_mut(&tx) {
            t.committed = Some(committed);
        }
        match decision {
            Some(streams) => {
                let id = self.op(Purpose::OwnDecision { position });
                let record = Record::Decision {
                    commit: position,
                    committed,
                };
                let streams: Vec<StreamId> = streams.iter().map(|&s| s as StreamId).collect();
                self.io.append(ctx, id, record.encode(), &streams);
            }
            None => ctx.set_timer(PAUSE_US, Tick::Next),
        }
    }

    /// Once every transfer client finished, the last play; until then, look again later.
    fn wait_for_all(&mut self, ctx: &mut Ctx<'_>) {
        let mut h = self.history.borrow_mut();
        h.finished.insert(self.id);
        let all = h.finished.len() == h.transfer_clients;
        drop(h);
        if all {
            self.play(ctx, Then::Last);
        } else {
            ctx.set_timer(PAUSE_US, Tick::Next);
        }
    }

    /// The maintainer checkpoints every object at one position (a consistent cut, so that
    /// a client hosting several starts them all at one point), until every transfer client
    /// has played its last (one that waits for a decision no one will append catches up
    /// from a checkpoint past it).
    fn checkpoint(&mut self, ctx: &mut Ctx<'_>) {
        let h = self.history.borrow();
        let all = h.views.len() == h.transfer_clients;
        drop(h);
        if all {
            self.done = true;
            return;
        }
        let runtime = self.runtime.as_ref().expect("hosting");
        self.as_of = runtime.played();
        let layout = self.io.layout();
        let part_max =
            layout.slot_bytes as usize - tutti_log::entry::header_bytes(0, layout.backpointers) - 9;
        // Every object at one position: a view hosting several starts them all there, so
        // that every commit after it can be decided from them.
        self.round = (0..self.hosted.len()).collect();
        let mut parts = Vec::new();
        for &o in &self.round {
            let oid = self.hosted[o];
            let bytes = runtime.checkpoint(oid).expect("hosted");
            for (i, chunk) in bytes.chunks(part_max).enumerate() {
                parts.push((
                    (o, i),
                    Record::CheckpointPart {
                        oid,
                        bytes: chunk.to_vec(),
                    },
                ));
            }
        }
        self.parts.clear();
        self.parts_wanted = parts.len();
        for (at, part) in parts {
            let id = self.op(Purpose::Part(at));
            self.io.append(ctx, id, part.encode(), &[]);
        }
    }

    fn checkpoint_parts_written(&mut self, ctx: &mut Ctx<'_>) {
        for o in self.round.clone() {
            let oid = self.hosted[o];
            let parts = (self.parts.range((o, 0)..(o + 1, 0)))
                .map(|(_, &p)| p)
                .collect();
            let record = Record::Checkpoint {
                oid,
                as_of: self.as_of,
                parts,
            };
            let id = self.op(Purpose::CheckpointRecord);
            self.io.append(ctx, id, record.encode(), &[oid as StreamId]);
        }
    }

    /// Each object forgets its history below the round's position or, half the time, keeps
    /// it (forget positions differ; each is a round's, where every object has a checkpoint).
    fn forget(&mut self, ctx: &mut Ctx<'_>) {
        let mut forgotten = 0;
        for o in self.round.clone() {
            if ctx.rng().gen_bool(0.5) {
                continue;
            }
            forgotten += 1;
            let oid = self.hosted[o];
            self.history.borrow_mut().forgets.insert(oid, self.as_of);
            let name = match oid {
                DIRECTORY_OID => DIRECTORY_NAME.to_string(),
                _ => format!("account-{oid}"),
            };
            self.update_directory(ctx, name, Directory::forget(self.as_of));
        }
        if forgotten == 0 {
            self.play(ctx, Then::Trim);
        }
    }

    fn trim(&mut self, ctx: &mut Ctx<'_>) {
        let runtime = self.runtime.as_ref().expect("hosting");
        let point = runtime
            .view(DIRECTORY_OID, |d: &Directory| d.trim_point())
            .expect("the directory");
        self.turn += 1;
        if point > self.trimmed {
            let id = self.op(Purpose::Trim);
            self.io.trim(ctx, id, point);
            self.trimmed = point;
        } else {
            ctx.set_timer(PAUSE_US, Tick::Next);
        }
    }

    /// The maintainer names the accounts in the directory first (they keep ids 1 to 4:
    /// the directory hands them out in order), with the kind of a counter.
    fn name_accounts(&mut self, ctx: &mut Ctx<'_>) {
        for oid in ACCOUNTS {
            let create = Directory::create(Kind::Counter, self.decisions.contains(&oid));
            self.update_directory(ctx, format!("account-{oid}"), create);
        }
    }

    /// Appends an update of the directory's entry `name` (`Purpose::Forget` covers them
    /// all: the maintainer goes on once none is left under way).
    fn update_directory(&mut self, ctx: &mut Ctx<'_>, name: String, data: Vec<u8>) {
        let write = Write {
            oid: DIRECTORY_OID,
            key: Some(name.into_bytes()),
            data,
        };
        let record = Record::Update { nonce: 0, write };
        let id = self.op(Purpose::Forget);
        self.io
            .append(ctx, id, record.encode(), &[DIRECTORY_OID as StreamId]);
    }

    fn on_done(&mut self, ctx: &mut Ctx<'_>, id: OpId, done: Done) {
        let Some(purpose) = self.pending.remove(&id) else {
            return;
        };
        match (purpose, done) {
            (Purpose::LoadTrimPoint, Done::TrimPoint(trim)) => {
                let loading = self.loading.as_mut().expect("loading");
                let step = loading.load.on_trim_point(trim);
                self.load_step(ctx, Ok(step));
            }
            (
                Purpose::LoadSync(i),
                Done::Synced {
                    tail,
                    entries,
                    trimmed,
                },
            ) => {
                let loading = self.loading.as_mut().expect("loading");
                loading.synced[i] = Some(Synced {
                    entries,
                    floor: tail,
                    trimmed,
                });
                if loading.synced.iter().all(Option::is_some) {
                    let synced: Vec<Synced> = loading.synced.iter().flatten().cloned().collect();
                    let step = loading.load.on_synced(&synced);
                    self.load_step(ctx, step);
                }
            }
            (Purpose::LoadParts, Done::Read(found)) => {
                let loading = self.loading.as_mut().expect("loading");
                let step = loading.load.on_parts(found);
                self.load_step(ctx, step);
            }
            (
                Purpose::PlaySync(i),
                Done::Synced {
                    tail,
                    entries,
                    trimmed,
                },
            ) => {
                let Some((synced, _)) = self.playing.as_mut() else {
                    return;
                };
                self.floors[i] = self.floors[i].max(tail);
                synced[i] = Some(Synced {
                    entries,
                    floor: tail,
                    trimmed,
                });
                if synced.iter().all(Option::is_some) {
                    let synced = synced
                        .iter_mut()
                        .map(|s| s.take().expect("synced"))
                        .collect();
                    let runtime = self.runtime.as_mut().expect("hosting");
                    let step = self.player.on_synced(runtime, synced, Self::now(ctx));
                    self.play_step(ctx, step);
                }
            }
            (
                Purpose::Speculative {
                    tx,
                    decision,
                    streams,
                },
                Done::Appended(Ok(position)),
            ) => {
                let speculated = Speculated {
                    position,
                    oids: vec![tx.writes[0].oid],
                    writes: 1,
                };
                self.commit(ctx, &tx, &[speculated], decision, &streams);
            }
            (Purpose::Commit { tx, decision }, Done::Appended(Ok(position))) => {
                if let Some(t) = self.history.borrow_mut().transfers.get_mut(&tx) {
                    t.position = Some(position);
                }
                let reloads = self.reloads;
                let then = Then::Outcome {
                    tx,
                    position,
                    decision,
                    reloads,
                };
                self.play(ctx, then);
            }
            (Purpose::OwnDecision { position }, Done::Appended(Ok(_))) => {
                self.runtime
                    .as_mut()
                    .expect("hosting")
                    .settle_owed(position);
                ctx.set_timer(PAUSE_US, Tick::Next);
            }
            (Purpose::Decision { commit }, Done::Appended(Ok(_))) => {
                let runtime = self.runtime.as_mut().expect("hosting");
                let step = self
                    .player
                    .on_decision_appended(runtime, commit, Self::now(ctx));
                self.play_step(ctx, Ok(step));
            }
            (Purpose::Part(i), Done::Appended(Ok(position))) => {
                self.parts.insert(i, position);
                if self.parts.len() == self.parts_wanted {
                    self.checkpoint_parts_written(ctx);
                }
            }
            (Purpose::CheckpointRecord, Done::Appended(Ok(_))) => {
                if self
                    .pending
                    .values()
                    .all(|p| !matches!(p, Purpose::CheckpointRecord))
                {
                    self.forget(ctx);
                }
            }
            (Purpose::Forget, Done::Appended(Ok(_))) => {
                if self.pending.values().all(|p| !matches!(p, Purpose::Forget)) {
                    match self.runtime {
                        None => self.host(ctx, Then::Trim),
                        Some(_) => self.play(ctx, Then::Trim),
                    }
                }
            }
            (Purpose::Trim, Done::Trimmed) => ctx.set_timer(PAUSE_US, Tick::Next),
            (purpose, Done::Appended(Err(e))) => {
                self.broken("tango append", format!("{purpose:?}: {e}"));
            }
            (purpose, done) => unreachable!("{purpose:?} finished with {done:?}"),
        }
    }

    fn handle_done(&mut self, ctx: &mut Ctx<'_>) {
        loop {
            let done = self.io.take_done();
            if done.is_empty() {
                return;
            }
            for (id, d) in done {
                if !self.done {
                    self.on_done(ctx, id, d);
                }
            }
        }
    }
}

#[derive(Debug)]
enum Tick {
    /// The next transfer, or the maintainer's next round.
    Next,
    /// Sync again while a decision record is awaited.
    Replay,
    /// Rebuild the hosted views from the log.
    Reload,
}

impl Process for SimTangoClient {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, _from: Addr, m: Box<dyn Message>) {
        let Msg::Resp { id, resp } = msg::open(m) else {
            return;
        };
        self.io.on_response(ctx, id, resp);
        self.handle_done(ctx);
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let Err(timer) = self.io.on_timer(ctx, timer) else {
            return self.handle_done(ctx);
        };
        if self.done {
            return;
        }
        match *timer.downcast::<Tick>().expect("a tango client timer") {
            Tick::Next => match self.role {
                Role::Transfers { .. } => self.play(ctx, Then::Transfer),
                Role::Maintainer => self.play(ctx, Then::Checkpoint),
            },
            Tick::Replay => {
                let (_, then) = self.playing.take().expect("playing");
                self.play(ctx, then);
            }
            Tick::Reload => {
                let then = self.then.take().expect("what the reload is for");
                self.host(ctx, then);
            }
        }
        self.handle_done(ctx);
    }

    fn on_crash(&mut self, ctx: &mut Ctx<'_>, _power_loss: bool) {
        self.io.crash(ctx);
        self.pending.clear();
        (self.runtime, self.loading, self.playing, self.then) = (None, None, None, None);
        self.parts.clear();
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        if self.done {
            return;
        }
        match self.role {
            Role::Transfers { .. } => self.host(ctx, Then::Transfer),
            Role::Maintainer => self.name_accounts(ctx),
        }
        self.handle_done(ctx);
    }

    fn settled(&self) -> bool {
        self.done
    }

    fn describe(&self) -> String {
        let what = match &self.role {
            Role::Transfers { transfers, .. } => {
                format!("transfers, {} of {transfers} begun", self.started)
            }
            Role::Maintainer => format!(
                "maintainer, round {}, trimmed at {}",
                self.turn, self.trimmed
            ),
        };
        let played = self.runtime.as_ref().map(Runtime::played);
        format!(
            "tango client {}: {what}, played to {played:?}, {} log operations under way, loading {}, playing {}",
            self.id,
            self.io.busy(),
            self.loading.is_some(),
            self.playing.is_some()
        )
    }
}
