//! A simulated client of the shared log: an appender (several appends to random streams at
//! once, their writes batched per node) or a reader (one stream, `readnext` in a loop),
//! running the log's real sans-I/O steps (`Append` and its `Batcher`, `ReadAt` with the
//! hole timeout, `Sync`) over the simulated network, against
//! the simulated sequencer and memory nodes. What it saw goes to the shared `LogHistory`,
//! which checks it once the run settles.

use crate::coordinators::{CoordinatorTimer, Coordinators, Finished, Handle};
use crate::msg::{self, Directory, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;
use tutti_client::Minitx;
use tutti_log::minitxs;
use tutti_log::{
    Append, AppendStep, Batch, Batcher, Found, Hole, LogError, LogLayout, ReadAt, ReadStep,
    StreamId, Sync, SyncStep,
};
use tutti_wire::{Answer, Ask, Request, Response};
use tutti_workload::log::{Acked, Reading};
use tutti_workload::Violation;

/// A lost ask to the sequencer is sent again after this long.
const ASK_TIMEOUT_US: u64 = 40_000;
/// A reader's pause between two syncs.
const SYNC_PAUSE_US: u64 = 5_000;
/// The streams appenders pick from.
pub(crate) const STREAMS: [StreamId; 3] = [1, 2, 3];

/// What every client saw, for the checks at the end.
#[derive(Default)]
pub(crate) struct LogHistory {
    /// Acknowledged appends, and those whose client crashed before it knew.
    pub(crate) log: tutti_workload::log::LogHistory,
    /// What each reader's `readnext` returned since its last restart.
    pub(crate) reading: BTreeMap<u64, Reading>,
    pub(crate) appenders_done: usize,
    pub(crate) appenders: usize,
    /// What a client found wrong as it ran.
    pub(crate) broken: Vec<Violation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// The append of this number.
    Append(u64),
    Sync,
    Read(u64),
    /// A reader's read of the control words, for where to start.
    Words,
    Trim,
    /// A sync's check that its tail's epoch is the log's.
    Fence,
}

#[derive(Debug)]
enum ClientTimer {
    AskTimeout(u64),
    HoleWait(u64),
    /// A reader's next sync, or the trimmer's next look.
    Next,
}

/// One append under way.
struct Appending {
    append: Append,
    streams: Vec<StreamId>,
    payload: Vec<u8>,
}

enum Task {
    Sync {
        sync: Sync,
        reads: BTreeMap<u64, ReadAt>,
        found: Vec<(u64, Found)>,
        last_round: bool,
    },
    /// A reader learning the trim point, where it starts.
    Start,
    /// A reader's first sync is done: the trim point again, since a trim that was on its
    /// way before this reader said where it was may have passed its start meanwhile (and
    /// then its sync could not see what lay below). Later trims stay below its floor.
    Confirm {
        entries: BTreeMap<u64, Vec<u8>>,
        last_round: bool,
    },
    Trim {
        prefix: u64,
    },
}

pub(crate) enum Role {
    /// `appends` in all, up to `in_flight_max` at once (each incarnation draws how many).
    Appender {
        appends: usize,
        in_flight_max: usize,
    },
    Reader {
        stream: StreamId,
    },
    /// Trims the log below every reader (as `tutti chaos` does) until the appenders are done.
    Trimmer,
}

pub(crate) struct SimLogClient {
    id: u64,
    role: Role,
    log: String,
    layout: LogLayout,
    hole_timeout: Duration,
    /// Every sequencer: each ask goes to one at random, as from a client whose idea of the
    /// current one may be stale.
    sequencers: Vec<Addr>,
    history: Rc<RefCell<LogHistory>>,
    coordinators: Coordinators,
    task: Option<Task>,
    started: usize,
    /// A reader's next position to sync from; it is done after a sync that began once every
    /// appender was.
    floor: u64,
    /// Where this incarnation of a reader started (the trim point then), once it knows.
    start: Option<u64>,
    /// How far the trimmer has trimmed.
    trimmed: u64,
    done: bool,
    asks: BTreeMap<u64, (Target, Ask, u64)>,
    minitxs: BTreeMap<Handle, (Target, Minitx, bool)>,
    /// An appender's appends under way, by number, and how many it keeps going.
    appending: BTreeMap<u64, Appending>,
    in_flight: usize,
    batcher: Batcher<u64>,
    batches: BTreeMap<Handle, Batch<u64>>,
}

impl SimLogClient {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: u64,
        role: Role,
        log: &str,
        layout: LogLayout,
        hole_timeout: Duration,
        dir: Rc<Directory>,
        sequencers: Vec<Addr>,
        history: Rc<RefCell<LogHistory>>,
    ) -> SimLogClient {
        SimLogClient {
            id,
            role,
            log: log.into(),
            layout,
            hole_timeout,
            sequencers,
            history,
            coordinators: Coordinators::new(dir, id + 1),
            task: None,
            started: 0,
            floor: 0,
            start: None,
            trimmed: 0,
            done: false,
            asks: BTreeMap::new(),
            minitxs: BTreeMap::new(),
            appending: BTreeMap::new(),
            in_flight: 1,
            batcher: Batcher::default(),
            batches: BTreeMap::new(),
        }
    }

    /// Starts appends until `in_flight` are under way or all were started; done once all
    /// have ended.
    fn start_appends(&mut self, ctx: &mut Ctx<'_>) {
        let Role::Appender { appends, .. } = self.role else {
            unreachable!("an appender appends")
        };
        while self.appending.len() < self.in_flight && self.started < appends {
            self.started += 1;
            let n = ctx.rng().gen_range(1..=2);
            let mut streams: Vec<StreamId> = Vec::new();
            while streams.len() < n {
                let s = STREAMS[ctx.rng().gen_range(0..STREAMS.len())];
                if !streams.contains(&s) {
                    streams.push(s);
                }
            }
            let id = self.started as u64;
            let mut payload = self.id.to_le_bytes().to_vec();
            payload.extend_from_slice(&id.to_le_bytes());
            let writer = ctx.rng().gen::<u64>() | 1;
            let (append, step) = Append::new(&self.layout, &streams, payload.clone(), writer)
                .expect("the simulated entries fit");
            let appending = Appending {
                append,
                streams,
                payload,
            };
            self.appending.insert(id, appending);
            self.append_step(ctx, id, step);
        }
        if self.started == appends && self.appending.is_empty() && !self.done {
            self.done = true;
            self.history.borrow_mut().appenders_done += 1;
        }
    }

    fn next_task(&mut self, ctx: &mut Ctx<'_>) {
        match self.role {
            Role::Appender { .. } => self.start_appends(ctx),
            Role::Reader { .. } if self.start.is_none() => {
                self.task = Some(Task::Start);
                self.run(ctx, Target::Words, minitxs::words(&self.layout), false);
            }
            Role::Trimmer => {
                let h = self.history.borrow();
                if h.appenders_done == h.appenders {
                    self.done = true;
                    return;
                }
                // Below every reader's floor, once each has said where it is.
                let below = (h.reading.len() == STREAMS.len())
                    .then(|| h.reading.values().map(|r| r.to).min())
                    .flatten();
                drop(h);
                match below {
                    Some(prefix) if prefix > self.trimmed => {
                        self.task = Some(Task::Trim { prefix });
                        self.run(
                            ctx,
                            Target::Trim,
                            minitxs::trim(&self.layout, prefix),
                            false,
                        );
                    }
                    _ => ctx.set_timer(SYNC_PAUSE_US, ClientTimer::Next),
                }
            }
            Role::Reader { stream } => {
                let h = self.history.borrow();
                let last_round = h.appenders_done == h.appenders;
                drop(h);
                let (sync, step) = Sync::new(stream, self.layout.backpointers, self.floor);
                self.task = Some(Task::Sync {
                    sync,
                    reads: BTreeMap::new(),
                    found: Vec::new(),
                    last_round,
                });
                self.sync_step(ctx, step);
            }
        }
    }

    fn ask(&mut self, ctx: &mut Ctx<'_>, target: Target, ask: Ask, min_epoch: u64) {
        let id = ctx.new_id();
        let req = Request::Sequence {
            log: self.log.clone(),
            min_epoch,
            asks: vec![ask.clone()],
        };
        let sequencer = self.sequencers[ctx.rng().gen_range(0..self.sequencers.len())];
        ctx.send(sequencer, Msg::Req { id, req });
        ctx.set_timer(ASK_TIMEOUT_US, ClientTimer::AskTimeout(id));
        self.asks.insert(id, (target, ask, min_epoch));
    }

    fn run(&mut self, ctx: &mut Ctx<'_>, target: Target, tx: Minitx, fill: bool) {
        let (handle, done) = self.coordinators.start(ctx, tx.clone());
        self.minitxs.insert(handle, (target, tx, fill));
        if let Some(done) = done {
            self.finished(ctx, done);
        }
    }

    fn append_step(&mut self, ctx: &mut Ctx<'_>, id: u64, step: AppendStep) {
        match step {
            AppendStep::Ask(ask) => {
                let min_epoch = self.appending[&id].append.min_epoch();
                self.ask(ctx, Target::Append(id), ask, min_epoch)
            }
            AppendStep::Write(write) => {
                if let Some(batch) = self.batcher.queue(&self.layout, write, id) {
                    self.run_batch(ctx, batch);
                }
            }
            AppendStep::Done(position) => {
                let Appending {
                    streams, payload, ..
                } = self.appending.remove(&id).expect("appending");
                self.history.borrow_mut().log.acked.push(Acked {
                    position,
                    streams,
                    payload,
                });
                self.start_appends(ctx);
            }
        }
    }

    fn run_batch(&mut self, ctx: &mut Ctx<'_>, mut batch: Batch<u64>) {
        ctx.count("batched_writes", u64::from(batch.writes() > 1));
        let tx = std::mem::take(&mut batch.tx);
        let (handle, done) = self.coordinators.start(ctx, tx);
        self.batches.insert(handle, batch);
        if let Some(done) = done {
            self.finished(ctx, done);
        }
    }

    /// The append's next step; a full log ends it, appended nowhere (so a reader that
    /// finds its payload breaks the checks).
    fn appended(&mut self, ctx: &mut Ctx<'_>, id: u64, step: Result<AppendStep, LogError>) {
        match step {
            Ok(step) => self.append_step(ctx, id, step),
            Err(LogError::Full { .. }) => {
                self.appending.remove(&id);
                self.start_appends(ctx);
            }
            Err(e) => panic!("log client {}: {e}", self.id),
        }
    }

    fn sync_step(&mut self, ctx: &mut Ctx<'_>, step: SyncStep) {
        let Some(Task::Sync { sync, reads, .. }) = &mut self.task else {
            return;
        };
        match step {
            SyncStep::Ask(ask) => {
                let min_epoch = sync.min_epoch();
                self.ask(ctx, Target::Sync, ask, min_epoch)
            }
            SyncStep::Fence(mut txs) => {
                // Any one node's epoch will do: the one that would answer first.
                let tx = txs.swap_remove(ctx.rng().gen_range(0..txs.len()));
                self.run(ctx, Target::Fence, tx, false)
            }
            SyncStep::Read(positions) => {
                let hole = Hole::FillAfter(self.hole_timeout);
                let mut steps = Vec::new();
                for p in positions {
                    let (read, step) = ReadAt::new(&self.layout, p, hole);
                    reads.insert(p, read);
                    steps.push((p, step));
                }
                for (p, step) in steps {
                    self.read_step(ctx, p, step);
                }
            }
            SyncStep::Done { tail, entries, .. } => {
                let Some(Task::Sync { last_round, .. }) = self.task.take() else {
                    unreachable!("syncing")
                };
                self.floor = self.floor.max(tail);
                if !self.history.borrow().reading.contains_key(&self.id) {
                    self.task = Some(Task::Confirm {
                        entries,
                        last_round,
                    });
                    return self.run(ctx, Target::Words, minitxs::words(&self.layout), false);
                }
                self.delivered(ctx, entries, last_round);
            }
        }
    }

    /// A sync's entries go to the reader's reading, which this incarnation starts at its
    /// start if it has none yet; then the next sync, unless this was the last.
    fn delivered(&mut self, ctx: &mut Ctx<'_>, entries: BTreeMap<u64, Vec<u8>>, last_round: bool) {
        let Role::Reader { stream } = self.role else {
            unreachable!("a reader syncs")
        };
        let from = self.start.unwrap_or_default();
        let mut h = self.history.borrow_mut();
        let reading = h.reading.entry(self.id).or_insert_with(|| Reading {
            reader: self.id.to_string(),
            stream,
            from,
            to: from,
            entries: vec![],
        });
        reading.entries.extend(entries);
        reading.to = self.floor;
        drop(h);
        if last_round {
            self.done = true;
        } else {
            ctx.set_timer(SYNC_PAUSE_US, ClientTimer::Next);
        }
    }

    fn read_step(&mut self, ctx: &mut Ctx<'_>, p: u64, step: ReadStep) {
        let Some(Task::Sync {
            sync, reads, found, ..
        }) = &mut self.task
        else {
            return;
        };
        match step {
            ReadStep::Read(tx) => self.run(ctx, Target::Read(p), tx, false),
            ReadStep::Fill(tx) => self.run(ctx, Target::Read(p), tx, true),
            ReadStep::Ask(ask) => {
                let min_epoch = reads[&p].min_epoch();
                self.ask(ctx, Target::Read(p), ask, min_epoch)
            }
            ReadStep::Wait(pause) => {
                ctx.set_timer(pause.as_micros() as u64, ClientTimer::HoleWait(p));
            }
            ReadStep::Done(f) => {
                reads.remove(&p);
                found.push((p, f));
                if reads.is_empty() {
                    found.sort_by_key(|(p, _)| *p);
                    let step = sync.on_found(std::mem::take(found));
                    self.sync_step(ctx, step);
                }
            }
        }
    }

    fn on_answer(&mut self, ctx: &mut Ctx<'_>, target: Target, answer: Answer) {
        let layout = self.layout.clone();
        match (target, &mut self.task) {
            (Target::Append(id), _) => {
                if let Some(a) = self.appending.get_mut(&id) {
                    let step = a.append.on_answer(&layout, answer);
                    self.appended(ctx, id, step);
                }
            }
            (Target::Sync, Some(Task::Sync { sync, .. })) => {
                let step = sync.on_answer(&layout, answer).expect("a tail");
                self.sync_step(ctx, step);
            }
            (Target::Read(p), Some(Task::Sync { reads, .. })) => {
                let Some(read) = reads.get_mut(&p) else {
                    return;
                };
                match read.on_answer(&layout, answer) {
                    Ok(step) => self.read_step(ctx, p, step),
                    // A sync reads only positions below a tail it was told, or named by an
                    // entry's backpointers: the tail never moves back below them.
                    Err(e) => {
                        let why = format!("client {} reading {p} for a sync: {e}", self.id);
                        let mut h = self.history.borrow_mut();
                        h.broken.push(Violation::new("read past the tail", why));
                        drop(h);
                        self.task = None;
                        self.done = true;
                    }
                }
            }
            _ => {}
        }
    }

    fn finished(&mut self, ctx: &mut Ctx<'_>, (handle, result): Finished) {
        if let Some(batch) = self.batches.remove(&handle) {
            // No outcome: each write of the batch is written again.
            let outcome = result.ok();
            let (results, next) = self.batcher.finish(&self.layout, batch, outcome.as_ref());
            if let Some(next) = next {
                self.run_batch(ctx, next);
            }
            let layout = self.layout.clone();
            for (id, written) in results {
                if let Some(a) = self.appending.get_mut(&id) {
                    let step = a.append.on_written(&layout, written);
                    self.appended(ctx, id, step);
                }
            }
            return;
        }
        let Some((target, tx, fill)) = self.minitxs.remove(&handle) else {
            return;
        };
        let Ok(outcome) = result else {
            // No outcome: every log minitransaction may run again.
            return self.run(ctx, target, tx, fill);
        };
        let layout = self.layout.clone();
        match (target, &mut self.task) {
            (Target::Words, Some(Task::Start)) => {
                let trim = minitxs::words_result(&outcome).iter().map(|w| w.trim).max();
                let start = trim.unwrap_or_default();
                (self.start, self.floor, self.task) = (Some(start), start, None);
                self.next_task(ctx);
            }
            (Target::Words, Some(Task::Confirm { .. })) => {
                let Some(Task::Confirm {
                    entries,
                    last_round,
                }) = self.task.take()
                else {
                    unreachable!("confirming")
                };
                let trim = minitxs::words_result(&outcome).iter().map(|w| w.trim).max();
                let start = self.start.unwrap_or_default().max(trim.unwrap_or_default());
                self.start = Some(start);
                self.delivered(ctx, entries, last_round);
            }
            (Target::Fence, Some(Task::Sync { sync, .. })) => {
                let step = sync.on_fenced(&outcome);
                self.sync_step(ctx, step);
            }
            (Target::Trim, Some(Task::Trim { prefix })) => {
                // Not committed: a node's trim point is there already (trims only grow).
                self.trimmed = *prefix;
                self.task = None;
                ctx.set_timer(SYNC_PAUSE_US, ClientTimer::Next);
            }
            (Target::Read(p), Some(Task::Sync { reads, .. })) => {
                let Some(read) = reads.get_mut(&p) else {
                    return;
                };
                let step = if fill {
                    read.on_fill(&layout, &outcome)
                } else {
                    read.on_read(&layout, &outcome)
                };
                let step = step.expect("no corrupt slot");
                self.read_step(ctx, p, step);
            }
            _ => {}
        }
    }
}

impl Process for SimLogClient {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, _from: Addr, msg: Box<dyn Message>) {
        let Msg::Resp { id, resp } = msg::open(msg) else {
            return;
        };
        let resp = match self.coordinators.on_response(ctx, id, resp) {
            Ok(Some(done)) => return self.finished(ctx, done),
            Ok(None) => return,
            Err(resp) => resp,
        };
        let Some((target, ask, min_epoch)) = self.asks.remove(&id) else {
            return;
        };
        match resp {
            Response::Sequenced(mut answers) if answers.len() == 1 => {
                let answer = answers.pop().expect("one");
                self.on_answer(ctx, target, answer);
            }
            // Refused (the sequencer is taking the log over or restarting): ask again.
            _ => self.ask(ctx, target, ask, min_epoch),
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        let timer = match timer.downcast::<CoordinatorTimer>() {
            Ok(t) => {
                if let Some(done) = self.coordinators.on_timer(ctx, *t) {
                    self.finished(ctx, done);
                }
                return;
            }
            Err(other) => other,
        };
        match *timer.downcast::<ClientTimer>().expect("a log client timer") {
            ClientTimer::AskTimeout(id) => {
                if let Some((target, ask, min_epoch)) = self.asks.remove(&id) {
                    self.ask(ctx, target, ask, min_epoch);
                }
            }
            ClientTimer::HoleWait(p) => {
                let layout = self.layout.clone();
                if let Some(Task::Sync { reads, .. }) = &mut self.task {
                    if let Some(read) = reads.get_mut(&p) {
                        let step = read.on_waited(&layout);
                        self.read_step(ctx, p, step);
                    }
                }
            }
            ClientTimer::Next => self.next_task(ctx),
        }
    }

    fn on_crash(&mut self, ctx: &mut Ctx<'_>, _power_loss: bool) {
        self.coordinators.crash(ctx);
        self.asks.clear();
        self.minitxs.clear();
        self.batcher.clear();
        self.batches.clear();
        self.task = None;
        let mut h = self.history.borrow_mut();
        for (_, a) in std::mem::take(&mut self.appending) {
            h.log.unknown.push((a.streams, a.payload));
        }
        drop(h);
        if let Role::Reader { .. } = self.role {
            // A new reader: from the trim point, which it reads first.
            (self.floor, self.start) = (0, None);
            self.history.borrow_mut().reading.remove(&self.id);
        }
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        if let Role::Appender { in_flight_max, .. } = self.role {
            self.in_flight = ctx.rng().gen_range(1..=in_flight_max.max(1));
        }
        if !self.done {
            self.next_task(ctx);
        }
    }

    fn settled(&self) -> bool {
        self.done
    }

    fn describe(&self) -> String {
        let what = match self.role {
            Role::Appender { appends, .. } => format!(
                "appender, {} of {appends} started, {} under way",
                self.started,
                self.appending.len()
            ),
            Role::Reader { stream } => format!("reader of stream {stream} at {}", self.floor),
            Role::Trimmer => format!("trimmer at {}", self.trimmed),
        };
        format!(
            "log client {}: {what}, {} asks out",
            self.id,
            self.asks.len()
        )
    }
}
