//! A simulated memory node: the real `Participant` over a simulated disk. Records appended
//! are "written"; a sync (taking simulated time) makes them durable. A power loss drops what
//! was written but not synced and returns the image to its last flush; a process kill keeps
//! both (they were in the page cache), as on Linux.

use crate::msg::{self, Directory, ManagerRoute, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::any::Any;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_memnode::participant::{Actions, Checkpoint, Config, Participant, Stage};
use tutti_memnode::recovery::Stage2;
use tutti_memnode::redo_log::{LogRecord, Lsn};
use tutti_memnode::space::Space;
use tutti_memnode::Mode;
use tutti_wire::{Limits, NodeId, Request, Response};
use tutti_workload::Violation;

/// Checks a node's space right after it recovered, through `read(addr, len)`.
pub(crate) type RecoveryCheck = dyn Fn(NodeId, &dyn Fn(u64, u32) -> Vec<u8>) -> Vec<Violation>;

enum Pending {
    Heartbeat { sent_ms: u64 },
    Stage2 { index: usize },
}

#[derive(Debug)]
enum NodeTimer {
    SyncDone,
    Checkpoint,
    CheckpointStep,
    Heartbeat,
    Stage2Retry,
}

struct Recovering {
    stage2: Stage2,
    /// Requests of the current step: (peer, request, answered).
    outstanding: Vec<(NodeId, Request, bool)>,
}

pub(crate) struct SimNode {
    id: NodeId,
    space_bytes: u64,
    dir: Rc<Directory>,
    /// The manager its heartbeats go to.
    manager: ManagerRoute,
    check: Rc<RecoveryCheck>,
    participant: Option<Participant<Addr>>,
    synced: Vec<(Lsn, LogRecord)>,
    written: Vec<(Lsn, LogRecord)>,
    next_lsn: Lsn,
    /// Every record below this was collected: a log emptied by GC continues from here.
    floor: Lsn,
    sync_in_flight: Option<Lsn>,
    pending_truncate: Option<(Lsn, Lsn)>,
    /// The image as last flushed.
    image: Vec<u8>,
    recovering: Option<Recovering>,
    pending: BTreeMap<u64, Pending>,
    /// A checkpoint between two of its steps.
    checkpoint: Option<Checkpoint>,
}

/// Tids per checkpoint step: few, so that a checkpoint here spans several events and
/// requests and heartbeats come between its steps, as they do on a real node.
const CHECKPOINT_STEP_TIDS: usize = 2;
/// Between two steps of a checkpoint: up to this long, so that a checkpoint often spans a
/// heartbeat (every 20–28 ms).
const CHECKPOINT_STEP_GAP_US_MAX: u64 = 4_000;

fn config(id: NodeId) -> Config {
    Config {
        id,
        mode: Mode::Log,
        timeout_uncertain_ms: 100,
        limits: Limits::default(),
        checkpoint_step_tids: CHECKPOINT_STEP_TIDS,
    }
}

fn space_from(image: &[u8]) -> Space {
    let mut space = Space::anonymous(image.len() as u64).expect("map a small anonymous space");
    space.write(0, image);
    space
}

fn now_ms(ctx: &Ctx<'_>) -> u64 {
    ctx.now_us() / 1000
}

impl SimNode {
    pub(crate) fn new(
        id: NodeId,
        image: Vec<u8>,
        dir: Rc<Directory>,
        check: Rc<RecoveryCheck>,
    ) -> SimNode {
        let participant = Participant::new(config(id), space_from(&image), 1);
        SimNode {
            id,
            space_bytes: image.len() as u64,
            manager: ManagerRoute::new(&dir),
            dir,
            check,
            participant: Some(participant),
            synced: Vec::new(),
            written: Vec::new(),
            next_lsn: 1,
            floor: 1,
            sync_in_flight: None,
            pending_truncate: None,
            image,
            recovering: None,
            pending: BTreeMap::new(),
            checkpoint: None,
        }
    }

    /// The node's space, while it is up.
    pub(crate) fn space(&self) -> Option<&Space> {
        self.participant.as_ref().map(|p| p.space())
    }

    /// The newest epoch it has heard of, if it is up.
    pub(crate) fn epoch(&self) -> Option<u64> {
        self.participant.as_ref().map(|p| p.epoch())
    }

    fn serving(&self) -> bool {
        self.participant
            .as_ref()
            .is_some_and(|p| p.stage() == Stage::Serving)
    }

    fn up(&mut self) -> &mut Participant<Addr> {
        self.participant.as_mut().expect("up")
    }

    fn truncate(&mut self, below: Lsn) {
        self.synced.retain(|(lsn, _)| *lsn >= below);
        self.floor = self.floor.max(below);
    }

    /// Carries out a participant's actions: append, reply, truncate after the next sync.
    fn apply(&mut self, ctx: &mut Ctx<'_>, acts: Actions<Addr>) {
        let mut needs_sync = false;
        for (lsn, record) in acts.append {
            needs_sync |= record.needs_sync();
            self.next_lsn = lsn + 1;
            self.written.push((lsn, record));
        }
        if let Some(below) = acts.truncate_below {
            // The real writer truncates only after syncing the batches queued before it.
            if needs_sync || self.written.iter().any(|(_, r)| r.needs_sync()) {
                self.pending_truncate = Some((below, self.next_lsn - 1));
            } else {
                self.truncate(below);
            }
        }
        for (to, reply_id, resp) in acts.replies {
            if reply_id != tutti_wire::ONE_WAY {
                ctx.send(to, Msg::Resp { id: reply_id, resp });
            }
        }
        self.maybe_sync(ctx);
    }

    /// Group commit: one sync covers everything written when it starts.
    fn maybe_sync(&mut self, ctx: &mut Ctx<'_>) {
        if self.participant.is_none() || self.sync_in_flight.is_some() {
            return;
        }
        if let Some((upto, _)) =
            (self.written.last()).filter(|_| self.written.iter().any(|(_, r)| r.needs_sync()))
        {
            self.sync_in_flight = Some(*upto);
            let took = ctx.rng().gen_range(100..1_500);
            ctx.set_timer(took, NodeTimer::SyncDone);
        }
    }

    fn make_durable(&mut self, upto: Lsn) {
        let split = self.written.partition_point(|(lsn, _)| *lsn <= upto);
        self.synced.extend(self.written.drain(..split));
        if let Some((below, after)) = self.pending_truncate {
            if after <= upto {
                self.truncate(below);
                self.pending_truncate = None;
            }
        }
    }

    fn sync_done(&mut self, ctx: &mut Ctx<'_>) {
        let Some(upto) = self.sync_in_flight.take() else {
            return;
        };
        self.make_durable(upto);
        let acts = self.up().on_synced(now_ms(ctx), upto);
        self.apply(ctx, acts);
    }

    /// Flush the image, sync the log, then let the participant collect its log head, a
    /// step at a time.
    fn checkpoint(&mut self, ctx: &mut Ctx<'_>) {
        if self.checkpoint.is_some() {
            return;
        }
        let now = now_ms(ctx);
        let cp = self.up().checkpoint_begin();
        let bytes = self.space_bytes;
        self.image = self.up().space().read(0, bytes).to_vec();
        let upto = self.next_lsn - 1;
        self.make_durable(upto);
        let acts = self.up().on_synced(now, upto);
        self.apply(ctx, acts);
        self.checkpoint = Some(cp);
        self.checkpoint_step(ctx);
    }

    fn checkpoint_step(&mut self, ctx: &mut Ctx<'_>) {
        let Some(mut cp) = self.checkpoint.take() else {
            return;
        };
        match self.up().checkpoint_step(&mut cp) {
            Some(acts) => self.apply(ctx, acts),
            None => {
                self.checkpoint = Some(cp);
                let gap = ctx.rng().gen_range(0..CHECKPOINT_STEP_GAP_US_MAX);
                ctx.set_timer(gap, NodeTimer::CheckpointStep);
            }
        }
    }

    fn heartbeat(&mut self, ctx: &mut Ctx<'_>) {
        let now = now_ms(ctx);
        // An unanswered heartbeat is a failed call: the real driver then resends its reports.
        let unanswered: Vec<u64> = (self.pending.iter())
            .filter(|(_, p)| matches!(p, Pending::Heartbeat { .. }))
            .map(|(id, _)| *id)
            .collect();
        for pending in unanswered {
            if let Some(Pending::Heartbeat { sent_ms }) = self.pending.remove(&pending) {
                self.manager.silent();
                // An epoch of 0 never advances anything, so there is nothing to carry out.
                let acts = self
                    .up()
                    .on_heartbeat_ack(sent_ms + 1, 0, u64::MAX, &[], &[]);
                assert!(acts.append.is_empty() && acts.replies.is_empty());
            }
        }
        let report = self.up().heartbeat(now);
        let req = Request::Heartbeat {
            node: self.id,
            uncertain: report.uncertain,
            applied: report.applied,
            applied_below: report.applied_below,
            mirror_behind_ms: 0,
        };
        let msg_id = ctx.new_id();
        self.pending
            .insert(msg_id, Pending::Heartbeat { sent_ms: now });
        ctx.send(self.manager.addr(), Msg::Req { id: msg_id, req });
    }

    /// A periodic timer firing: re-arms itself (every `period_us` plus up to 40 % jitter);
    /// says whether the node is serving and so should act now.
    fn periodic(&self, ctx: &mut Ctx<'_>, period_us: u64, timer: NodeTimer) -> bool {
        let next = period_us + ctx.rng().gen_range(0..period_us * 2 / 5);
        ctx.set_timer(next, timer);
        self.serving()
    }

    fn schedule_timers(&self, ctx: &mut Ctx<'_>) {
        let jitter = ctx.rng().gen_range(0..20_000);
        ctx.set_timer(20_000 + jitter, NodeTimer::Heartbeat);
        let jitter = ctx.rng().gen_range(0..50_000);
        ctx.set_timer(50_000 + jitter, NodeTimer::Checkpoint);
    }

    /// Stage 1 from the simulated disk, then stage 2 through the network.
    fn recover(&mut self, ctx: &mut Ctx<'_>) {
        self.next_lsn = self.synced.last().map_or(self.floor, |(lsn, _)| lsn + 1);
        let p = Participant::recover(
            config(self.id),
            space_from(&self.image),
            self.next_lsn,
            self.synced.clone(),
        );
        let undecided = p.undecided();
        self.participant = Some(p);
        if undecided.is_empty() {
            self.up().finish_recovery();
            self.recovered(ctx);
            return;
        }
        let (stage2, queries) = Stage2::start(self.id, undecided);
        let outstanding = queries.into_iter().map(|(q, r)| (q, r, false)).collect();
        self.recovering = Some(Recovering {
            stage2,
            outstanding,
        });
        self.stage2_retry(ctx);
    }

    /// Every commit already reported that touched this node must be back in its space.
    fn recovered(&self, ctx: &mut Ctx<'_>) {
        let space = self.participant.as_ref().expect("just recovered").space();
        let read = |addr, len| space.read(addr, u64::from(len)).to_vec();
        for violation in (self.check)(self.id, &read) {
            let detail = format!("at {} µs {}", ctx.now_us(), violation.detail);
            ctx.report(Violation::new(violation.kind, detail));
        }
    }

    /// (Re)sends the unanswered requests of the current stage-2 step, as `call_until_ok`
    /// does.
    fn stage2_retry(&mut self, ctx: &mut Ctx<'_>) {
        let Some(rec) = &self.recovering else { return };
        let unanswered: Vec<(usize, NodeId, Request)> = (rec.outstanding.iter().enumerate())
            .filter(|(_, o)| !o.2)
            .map(|(i, (q, r, _))| (i, *q, r.clone()))
            .collect();
        for (i, q, req) in unanswered {
            let msg_id = ctx.new_id();
            self.pending.insert(msg_id, Pending::Stage2 { index: i });
            ctx.send(self.dir.node(q), Msg::Req { id: msg_id, req });
        }
        ctx.set_timer(30_000, NodeTimer::Stage2Retry);
    }

    fn stage2_answer(&mut self, ctx: &mut Ctx<'_>, i: usize, resp: Response) {
        let Some(rec) = self.recovering.as_mut() else {
            return;
        };
        let Some((q, _, answered)) = rec.outstanding.get_mut(i) else {
            return;
        };
        if *answered {
            return;
        }
        let q = *q;
        match resp {
            Response::LogTids(tids) => {
                *answered = true;
                if let Some(requests) = rec.stage2.on_log_tids(q, tids) {
                    // The next step: forget the LogTids queries, ask the REQUEST-ABORTs.
                    rec.outstanding = requests.into_iter().map(|(q, r)| (q, r, false)).collect();
                    self.pending
                        .retain(|_, p| !matches!(p, Pending::Stage2 { .. }));
                    self.stage2_retry(ctx);
                }
            }
            Response::Votes(votes) => {
                *answered = true;
                rec.stage2.on_votes(q, &votes);
            }
            _ => return,
        }
        if self.recovering.as_ref().is_some_and(|r| r.stage2.done()) {
            let rec = self.recovering.take().expect("recovering");
            let (outcomes, decisions) = rec.stage2.outcomes();
            let acts = self.up().resolve(&outcomes);
            self.up().finish_recovery();
            self.apply(ctx, acts);
            self.recovered(ctx);
            for (q, decision) in decisions {
                msg::send_one_way(ctx, self.dir.node(q), decision);
            }
        }
    }
}

impl Process for SimNode {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>) {
        let now = now_ms(ctx);
        let Some(p) = self.participant.as_mut() else {
            return;
        };
        match msg::open(msg) {
            Msg::Req { id, req } => {
                let acts = p.on_request(now, from, id, req);
                self.apply(ctx, acts);
            }
            Msg::Resp { id, resp } => match self.pending.remove(&id) {
                Some(Pending::Heartbeat { sent_ms }) => {
                    if self.manager.not_leader(&resp) {
                        // As the real driver after a failed call: the reports go again.
                        let acts = p.on_heartbeat_ack(sent_ms + 1, 0, u64::MAX, &[], &[]);
                        self.apply(ctx, acts);
                    } else if let Response::HeartbeatAck {
                        epoch,
                        incarnation,
                        gc,
                        applied_below,
                        ..
                    } = resp
                    {
                        let acts =
                            p.on_heartbeat_ack(sent_ms, epoch, incarnation, &gc, &applied_below);
                        self.apply(ctx, acts);
                    }
                }
                Some(Pending::Stage2 { index }) => self.stage2_answer(ctx, index, resp),
                None => {}
            },
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        match *timer.downcast::<NodeTimer>().expect("a node timer") {
            NodeTimer::SyncDone => self.sync_done(ctx),
            NodeTimer::Checkpoint => {
                if self.periodic(ctx, 50_000, NodeTimer::Checkpoint) {
                    self.checkpoint(ctx);
                }
            }
            NodeTimer::CheckpointStep => self.checkpoint_step(ctx),
            NodeTimer::Heartbeat => {
                if self.periodic(ctx, 20_000, NodeTimer::Heartbeat) {
                    self.heartbeat(ctx);
                }
            }
            NodeTimer::Stage2Retry => self.stage2_retry(ctx),
        }
    }

    fn on_crash(&mut self, _ctx: &mut Ctx<'_>, power_loss: bool) {
        let Some(p) = self.participant.take() else {
            return;
        };
        if power_loss {
            self.written.clear();
        } else {
            self.synced.append(&mut self.written);
            self.image = p.space().read(0, self.space_bytes).to_vec();
        }
        self.sync_in_flight = None;
        self.pending_truncate = None;
        self.recovering = None;
        self.pending.clear();
        self.checkpoint = None;
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        self.schedule_timers(ctx);
        if self.participant.is_none() {
            self.recover(ctx);
        }
    }

    /// Up, serving, nothing uncertain and no lock held.
    fn settled(&self) -> bool {
        self.participant.as_ref().is_some_and(|p| p.idle())
    }

    fn describe(&self) -> String {
        match &self.participant {
            None => format!("node {} down", self.id),
            Some(p) => {
                let s = p.stats(0);
                format!(
                    "node {} {:?}, {} uncertain, {} locks held",
                    self.id,
                    p.stage(),
                    s.uncertain,
                    s.locks_held
                )
            }
        }
    }
}
