//! The shared log's client operations for a simulated process of a layer above the log (the
//! tango clients): appends (batched per node), stream syncs, reads of positions, the trim
//! point and trims, any number at once, each running the log's real sans-I/O steps
//! (`Append` with the `Batcher`, `Sync`, `ReadAt` with the hole timeout) over the simulated
//! network. The owner starts operations with its own ids and takes what finished with
//! `take_done` after each event it hands over.

use crate::coordinators::{CoordinatorTimer, Coordinators, Finished, Handle};
use crate::msg::{Directory, Msg};
use crate::world::{Addr, Ctx, Timer};
use rand::Rng;
use std::any::Any;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;
use tutti_client::Minitx;
use tutti_log::{
    minitxs, Append, AppendStep, Batch, Batcher, Found, Hole, LogError, LogLayout, Own, OwnEntries,
    ReadAt, ReadStep, StreamId, Sync, SyncStep,
};
use tutti_wire::{Answer, Ask, Request, Response};

/// A lost ask to the sequencer is sent again after this long.
const ASK_TIMEOUT_US: u64 = 40_000;

/// An operation's id, chosen by the owner.
pub(crate) type OpId = u64;

/// What a finished operation came to.
#[derive(Debug)]
pub(crate) enum Done {
    Appended(Result<u64, LogError>),
    /// A stream's entries from the floor to `tail`; `trimmed` as `SyncStep::Done` says.
    Synced {
        tail: u64,
        entries: BTreeMap<u64, Vec<u8>>,
        trimmed: Option<u64>,
    },
    /// What the positions hold, in the order asked.
    Read(Vec<Found>),
    TrimPoint(u64),
    Trimmed,
}

#[derive(Debug)]
pub(crate) enum LogIoTimer {
    AskTimeout(u64),
    HoleWait(OpId, u64),
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Append(OpId),
    Sync(OpId),
    Read(OpId, u64),
    Words(OpId),
    Trim(OpId),
    Fence(OpId),
}

/// Reads of positions under way for one operation (a sync's or a plain read).
#[derive(Default)]
struct Reading {
    reads: BTreeMap<u64, ReadAt>,
    found: BTreeMap<u64, Found>,
    order: Vec<u64>,
}

enum Op {
    Append(Append),
    Sync(Sync, Reading),
    Read(Reading),
    Words,
    Trim(u64),
}

pub(crate) struct LogIo {
    log: String,
    layout: LogLayout,
    hole_timeout: Duration,
    sequencers: Vec<Addr>,
    coordinators: Coordinators,
    ops: BTreeMap<OpId, Op>,
    asks: BTreeMap<u64, (Target, Ask, u64)>,
    minitxs: BTreeMap<Handle, (Target, Minitx, bool)>,
    batcher: Batcher<OpId>,
    batches: BTreeMap<Handle, Batch<OpId>>,
    /// What this process's appends wrote, and the reads waiting on those under way.
    own: OwnEntries<(OpId, u64)>,
    done: Vec<(OpId, Done)>,
}

impl LogIo {
    pub(crate) fn new(
        log: &str,
        layout: LogLayout,
        hole_timeout: Duration,
        dir: Rc<Directory>,
        sequencers: Vec<Addr>,
        coordinator_id: u64,
    ) -> LogIo {
        LogIo {
            log: log.into(),
            layout,
            hole_timeout,
            sequencers,
            coordinators: Coordinators::new(dir, coordinator_id),
            ops: BTreeMap::new(),
            asks: BTreeMap::new(),
            minitxs: BTreeMap::new(),
            batcher: Batcher::default(),
            batches: BTreeMap::new(),
            own: OwnEntries::default(),
            done: Vec::new(),
        }
    }

    pub(crate) fn layout(&self) -> &LogLayout {
        &self.layout
    }

    /// The operations that finished since the last call.
    pub(crate) fn take_done(&mut self) -> Vec<(OpId, Done)> {
        std::mem::take(&mut self.done)
    }

    pub(crate) fn append(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: OpId,
        payload: Vec<u8>,
        streams: &[StreamId],
    ) {
        let writer = ctx.rng().gen::<u64>() | 1;
        match Append::new(&self.layout, streams, payload, writer) {
            Ok((append, step)) => {
                self.ops.insert(id, Op::Append(append));
                self.append_step(ctx, id, Ok(step));
            }
            Err(e) => self.done.push((id, Done::Appended(Err(e)))),
        }
    }

    pub(crate) fn sync(&mut self, ctx: &mut Ctx<'_>, id: OpId, stream: StreamId, floor: u64) {
        let (sync, step) = Sync::new(stream, self.layout.backpointers, floor);
        self.ops.insert(id, Op::Sync(sync, Reading::default()));
        self.sync_step(ctx, id, step);
    }

    pub(crate) fn read(&mut self, ctx: &mut Ctx<'_>, id: OpId, positions: Vec<u64>) {
        self.ops.insert(id, Op::Read(Reading::default()));
        self.start_reads(ctx, id, positions);
    }

    pub(crate) fn trim_point(&mut self, ctx: &mut Ctx<'_>, id: OpId) {
        self.ops.insert(id, Op::Words);
        self.run(ctx, Target::Words(id), minitxs::words(&self.layout), false);
    }

    pub(crate) fn trim(&mut self, ctx: &mut Ctx<'_>, id: OpId, prefix: u64) {
        self.ops.insert(id, Op::Trim(prefix));
        self.run(
            ctx,
            Target::Trim(id),
            minitxs::trim(&self.layout, prefix),
            false,
        );
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
        ctx.set_timer(ASK_TIMEOUT_US, LogIoTimer::AskTimeout(id));
        self.asks.insert(id, (target, ask, min_epoch));
    }

    fn run(&mut self, ctx: &mut Ctx<'_>, target: Target, tx: Minitx, fill: bool) {
        let (handle, done) = self.coordinators.start(ctx, tx.clone());
        self.minitxs.insert(handle, (target, tx, fill));
        if let Some(done) = done {
            self.finished(ctx, done);
        }
    }

    fn append_step(&mut self, ctx: &mut Ctx<'_>, id: OpId, step: Result<AppendStep, LogError>) {
        let woken = match self.ops.get(&id) {
            Some(Op::Append(append)) => self.own.on_step(append, &step),
            _ => Vec::new(),
        };
        self.append_step_taken(ctx, id, step);
        for (reader, p) in woken {
            self.read_own(ctx, reader, p);
        }
    }

    fn append_step_taken(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: OpId,
        step: Result<AppendStep, LogError>,
    ) {
        match step {
            Ok(AppendStep::Ask(ask)) => {
                let Some(Op::Append(append)) = self.ops.get(&id) else {
                    return;
                };
                let min_epoch = append.min_epoch();
                self.ask(ctx, Target::Append(id), ask, min_epoch)
            }
            Ok(AppendStep::Write(write)) => {
                if let Some(batch) = self.batcher.queue(&self.layout, write, id) {
                    self.run_batch(ctx, batch);
                }
            }
            Ok(AppendStep::Done(position)) => {
                self.ops.remove(&id);
                self.done.push((id, Done::Appended(Ok(position))));
            }
            Err(e) => {
                self.ops.remove(&id);
                self.done.push((id, Done::Appended(Err(e))));
            }
        }
    }

    fn run_batch(&mut self, ctx: &mut Ctx<'_>, mut batch: Batch<OpId>) {
        let tx = std::mem::take(&mut batch.tx);
        let (handle, done) = self.coordinators.start(ctx, tx);
        self.batches.insert(handle, batch);
        if let Some(done) = done {
            self.finished(ctx, done);
        }
    }

    fn sync_step(&mut self, ctx: &mut Ctx<'_>, id: OpId, step: SyncStep) {
        match step {
            SyncStep::Ask(ask) => {
                let Some(Op::Sync(sync, _)) = self.ops.get(&id) else {
                    return;
                };
                let min_epoch = sync.min_epoch();
                self.ask(ctx, Target::Sync(id), ask, min_epoch)
            }
            SyncStep::Fence(mut txs) => {
                // Any one node's epoch will do: the one that would answer first.
                let tx = txs.swap_remove(ctx.rng().gen_range(0..txs.len()));
                self.run(ctx, Target::Fence(id), tx, false)
            }
            SyncStep::Read(positions) => self.start_reads(ctx, id, positions),
            SyncStep::Done {
                tail,
                entries,
                trimmed,
            } => {
                self.ops.remove(&id);
                let done = Done::Synced {
                    tail,
                    entries,
                    trimmed,
                };
                self.done.push((id, done));
            }
        }
    }

    fn reading(&mut self, id: OpId) -> Option<&mut Reading> {
        match self.ops.get_mut(&id)? {
            Op::Sync(_, r) | Op::Read(r) => Some(r),
            _ => None,
        }
    }

    fn start_reads(&mut self, ctx: &mut Ctx<'_>, id: OpId, positions: Vec<u64>) {
        let hole = Hole::FillAfter(self.hole_timeout);
        let mut steps = Vec::new();
        let layout = self.layout.clone();
        let Some(Op::Sync(_, r) | Op::Read(r)) = self.ops.get_mut(&id) else {
            return;
        };
        for p in positions {
            r.order.push(p);
            match self.own.look(p, || (id, p)) {
                Own::Found(found) => {
                    r.found.insert(p, found);
                }
                Own::Wait => {
                    r.reads.insert(p, ReadAt::new(&layout, p, hole).0);
                }
                Own::Read => {
                    let (read, step) = ReadAt::new(&layout, p, hole);
                    r.reads.insert(p, read);
                    steps.push((p, step));
                }
            }
        }
        for (p, step) in steps {
            self.read_step(ctx, id, p, Ok(step));
        }
        self.reads_done(ctx, id);
    }

    /// The append that held `p` ended: what it wrote there, or a read of the slot.
    fn read_own(&mut self, ctx: &mut Ctx<'_>, id: OpId, p: u64) {
        let hole = Hole::FillAfter(self.hole_timeout);
        let layout = self.layout.clone();
        let Some(Op::Sync(_, r) | Op::Read(r)) = self.ops.get_mut(&id) else {
            return;
        };
        let Some(read) = r.reads.get_mut(&p) else {
            return;
        };
        let step = match self.own.look(p, || (id, p)) {
            Own::Found(found) => ReadStep::Done(found),
            Own::Wait => return,
            Own::Read => {
                let (fresh, step) = ReadAt::new(&layout, p, hole);
                *read = fresh;
                step
            }
        };
        self.read_step(ctx, id, p, Ok(step));
    }

    fn read_step(&mut self, ctx: &mut Ctx<'_>, id: OpId, p: u64, step: Result<ReadStep, LogError>) {
        let step = match step {
            Ok(step) => step,
            // Reads are of positions below a tail the reader was told: none is past it.
            Err(e) => panic!("log client reading {p}: {e}"),
        };
        match step {
            ReadStep::Read(tx) => self.run(ctx, Target::Read(id, p), tx, false),
            ReadStep::Fill(tx) => self.run(ctx, Target::Read(id, p), tx, true),
            ReadStep::Ask(ask) => {
                let Some(min_epoch) = self
                    .reading(id)
                    .and_then(|r| Some(r.reads.get(&p)?.min_epoch()))
                else {
                    return;
                };
                self.ask(ctx, Target::Read(id, p), ask, min_epoch)
            }
            ReadStep::Wait(pause) => {
                ctx.set_timer(pause.as_micros() as u64, LogIoTimer::HoleWait(id, p));
            }
            ReadStep::Done(found) => {
                if let Found::Trimmed { trim } = found {
                    self.own.trimmed(trim);
                }
                let Some(r) = self.reading(id) else {
                    return;
                };
                r.reads.remove(&p);
                r.found.insert(p, found);
                self.reads_done(ctx, id);
            }
        }
    }

    /// Once every read of `id` is done: the sync's next step, or the read's result.
    fn reads_done(&mut self, ctx: &mut Ctx<'_>, id: OpId) {
        match self.ops.get_mut(&id) {
            Some(Op::Sync(sync, r)) if r.reads.is_empty() && !r.order.is_empty() => {
                r.order.clear();
                let step = sync.on_found(std::mem::take(&mut r.found).into_iter().collect());
                self.sync_step(ctx, id, step);
            }
            Some(Op::Read(r)) if r.reads.is_empty() => {
                let mut found = std::mem::take(&mut r.found);
                let values = r
                    .order
                    .iter()
                    .map(|p| found.remove(p).expect("read"))
                    .collect();
                self.ops.remove(&id);
                self.done.push((id, Done::Read(values)));
            }
            _ => {}
        }
    }

    fn on_answer(&mut self, ctx: &mut Ctx<'_>, target: Target, answer: Answer) {
        let layout = self.layout.clone();
        match target {
            Target::Append(id) => {
                if let Some(Op::Append(append)) = self.ops.get_mut(&id) {
                    let step = append.on_answer(&layout, answer);
                    self.append_step(ctx, id, step);
                }
            }
            Target::Sync(id) => {
                if let Some(Op::Sync(sync, _)) = self.ops.get_mut(&id) {
                    let step = sync.on_answer(&layout, answer).expect("a tail");
                    self.sync_step(ctx, id, step);
                }
            }
            Target::Read(id, p) => {
                let Some(read) = self.reading(id).and_then(|r| r.reads.get_mut(&p)) else {
                    return;
                };
                let step = read.on_answer(&layout, answer);
                self.read_step(ctx, id, p, step);
            }
            Target::Words(_) | Target::Trim(_) | Target::Fence(_) => {}
        }
    }

    fn finished(&mut self, ctx: &mut Ctx<'_>, (handle, result): Finished) {
        if let Some(batch) = self.batches.remove(&handle) {
            let outcome = result.ok();
            let (results, next) = self.batcher.finish(&self.layout, batch, outcome.as_ref());
            if let Some(next) = next {
                self.run_batch(ctx, next);
            }
            let layout = self.layout.clone();
            for (id, written) in results {
                if let Some(Op::Append(append)) = self.ops.get_mut(&id) {
                    let step = append.on_written(&layout, written);
                    self.append_step(ctx, id, step);
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
        match target {
            Target::Words(id) => {
                self.ops.remove(&id);
                let trim = minitxs::words_result(&outcome).iter().map(|w| w.trim).max();
                let trim = trim.unwrap_or_default();
                self.own.trimmed(trim);
                self.done.push((id, Done::TrimPoint(trim)));
            }
            Target::Trim(id) => {
                if let Some(Op::Trim(prefix)) = self.ops.remove(&id) {
                    self.own.trimmed(prefix);
                }
                self.done.push((id, Done::Trimmed));
            }
            Target::Fence(id) => {
                if let Some(Op::Sync(sync, _)) = self.ops.get_mut(&id) {
                    let step = sync.on_fenced(&outcome);
                    self.sync_step(ctx, id, step);
                }
            }
            Target::Read(id, p) => {
                let Some(read) = self.reading(id).and_then(|r| r.reads.get_mut(&p)) else {
                    return;
                };
                let step = if fill {
                    read.on_fill(&layout, &outcome)
                } else {
                    read.on_read(&layout, &outcome)
                };
                self.read_step(ctx, id, p, step);
            }
            Target::Append(_) | Target::Sync(_) => {}
        }
    }

    /// A response for this process: handled here if it is the log's (true).
    pub(crate) fn on_response(&mut self, ctx: &mut Ctx<'_>, id: u64, resp: Response) -> bool {
        let resp = match self.coordinators.on_response(ctx, id, resp) {
            Ok(Some(done)) => {
                self.finished(ctx, done);
                return true;
            }
            Ok(None) => return true,
            Err(resp) => resp,
        };
        let Some((target, ask, min_epoch)) = self.asks.remove(&id) else {
            return false;
        };
        match resp {
            Response::Sequenced(mut answers) if answers.len() == 1 => {
                let answer = answers.pop().expect("one");
                self.on_answer(ctx, target, answer);
            }
            // Refused (the sequencer is taking the log over or restarting): ask again.
            _ => self.ask(ctx, target, ask, min_epoch),
        }
        true
    }

    /// A timer for this process: handled here if it is the log's (`Err` gives it back).
    pub(crate) fn on_timer(
        &mut self,
        ctx: &mut Ctx<'_>,
        timer: Box<dyn Timer>,
    ) -> Result<(), Box<dyn Any>> {
        let timer: Box<dyn Any> = timer;
        let timer = match timer.downcast::<CoordinatorTimer>() {
            Ok(t) => {
                if let Some(done) = self.coordinators.on_timer(ctx, *t) {
                    self.finished(ctx, done);
                }
                return Ok(());
            }
            Err(other) => other,
        };
        match *timer.downcast::<LogIoTimer>()? {
            LogIoTimer::AskTimeout(id) => {
                if let Some((target, ask, min_epoch)) = self.asks.remove(&id) {
                    self.ask(ctx, target, ask, min_epoch);
                }
            }
            LogIoTimer::HoleWait(id, p) => {
                let layout = self.layout.clone();
                if let Some(read) = self.reading(id).and_then(|r| r.reads.get_mut(&p)) {
                    let step = read.on_waited(&layout);
                    self.read_step(ctx, id, p, Ok(step));
                }
            }
        }
        Ok(())
    }

    /// The process died: every operation is gone.
    pub(crate) fn crash(&mut self, ctx: &mut Ctx<'_>) {
        self.coordinators.crash(ctx);
        self.ops.clear();
        self.asks.clear();
        self.minitxs.clear();
        self.batcher.clear();
        self.batches.clear();
        self.own = OwnEntries::default();
        self.done.clear();
    }

    /// Operations under way.
    pub(crate) fn busy(&self) -> usize {
        self.ops.len()
    }
}
