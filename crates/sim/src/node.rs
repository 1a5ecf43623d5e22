//! A simulated memory node: the real `Participant` over a simulated disk. Records appended
//! are "written"; a sync (taking simulated time) makes them durable. A power loss drops what
//! was written but not synced and returns the image to its last flush; a process kill keeps
//! both (they were in the page cache), as on Linux.

use crate::msg::{self, addr_named, name_of, Directory, ManagerRoute, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::any::Any;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_memnode::mirror::{
    asks_before_giving_up, decode_records, encode_records, named_but_empty, seed_part, Mirror,
    Replicate, Standing,
};
use tutti_memnode::participant::{Actions, Checkpoint, Config, Participant, Stage};
use tutti_memnode::recovery::Stage2;
use tutti_memnode::redo_log::{LogRecord, Lsn};
use tutti_memnode::shipper::{Shipped, Shipper};
use tutti_memnode::space::Space;
use tutti_memnode::Mode;
use tutti_wire::{ErrorCode, Limits, NodeId, Placement, Request, Response};
use tutti_workload::Violation;

/// Checks a node's space right after it recovered, through `read(addr, len)`.
pub(crate) type RecoveryCheck = dyn Fn(NodeId, &tutti_workload::ReadNode<'_>) -> Vec<Violation>;

enum Pending {
    Heartbeat {
        sent_ms: u64,
    },
    Stage2 {
        index: usize,
    },
    /// `log-repl`: records (or a lease renewal) sent to the mirror, of the shipper's
    /// `generation` (a reply to an earlier one is not the current mirror's).
    Replicate {
        sent_ms: u64,
        generation: u64,
    },
    /// A primary whose mirror knows a newer configuration asks the manager for it.
    Placement,
    /// A primary asks the manager to name its caught-up joiner mirror (asked again if
    /// unanswered for a while: the manager may have lost it).
    AddMirror {
        sent_ms: u64,
    },
    /// A copy outside the placement asks the primary to join, then reads the seed.
    JoinMirror,
    ReadSeed {
        first_lsn: Lsn,
        next_lsn: Lsn,
        records_bytes: u64,
        config_epoch: u64,
    },
    MirrorHeartbeat,
    /// A primary whose mirror the placement dropped registers under it before it serves
    /// alone (`memnode::primary::confirm_alone`); asked again if unanswered for a while.
    ConfirmAlone {
        sent_ms: u64,
    },
    /// A joining primary's registration, its ask for the mirror's tail, and the records it
    /// sent the mirror because it lacked them (up to `upto`).
    Register,
    /// A joining primary reports its mirror unanswering (`Heartbeat`), as
    /// `memnode::primary::adopt_mirror_tail` does.
    MirrorReport,
    Tail {
        from: Lsn,
    },
    Lacking {
        upto: Lsn,
    },
}

#[derive(Debug)]
enum NodeTimer {
    SyncDone,
    Checkpoint,
    CheckpointStep,
    Heartbeat,
    Stage2Retry,
    /// `log-repl`: a primary renews its lease; a joining one asks again.
    Renew,
    Join,
    /// A promoted mirror looks whether the old primary's lease has run out.
    TakeOver,
    /// A minitransaction waiting for a lock has waited its `lock_wait_ms`.
    LockWait,
}

/// `log-repl` (docs/replication.md): what this process is for its node, driving the real
/// `Shipper` and `Mirror` as `memnode::primary` and `memnode::mirror_node` do.
struct Repl {
    state: ReplState,
    /// This incarnation as a primary, as its mirror knows it.
    session: u64,
    /// A mirror seeded under this configuration epoch and not named by the placement yet.
    joining: Option<u64>,
    /// A primary's seed for its joiner: the join, and the records encoded.
    seed: Option<(u64, Vec<u8>)>,
    /// A mirror named primary (under that configuration epoch), until its recovery starts
    /// (`Stage2::after_promotion`).
    promoted: Option<u64>,
    /// `log-repl`: the latest configuration epoch this copy served under as a primary,
    /// kept on its disk (`memnode::mirror_node::record_served`); gone with the copy.
    served: Option<u64>,
    /// The copy kept outside the placement is a mirror's (counted apart from replaced
    /// primaries when named primary).
    kept_dropped: bool,
}

enum ReplState {
    /// Serving (the participant runs), shipping to the placement's mirror.
    Primary(Shipper<Addr>),
    /// Down, or before its recovery: a primary learns its placement and makes both logs
    /// equal first.
    Joining {
        placement: Option<Placement>,
        /// Since when it has asked the placement's mirror for its tail, unanswered.
        asking_since_ms: Option<u64>,
    },
    Mirror(Mirror<Addr>),
    /// Named primary, waiting out the old primary's lease.
    Promoted(Mirror<Addr>),
    /// A mirror that is down.
    MirrorDown,
    /// Replaced, or dropped from the placement: answers nobody, and joins the node's
    /// primary as its new mirror once the placement has none (`memnode::mirror_node`),
    /// its disk emptied and filled from the primary's seed. `asked_ms`: when it last asked.
    /// `former`: a replaced primary (or a dropped mirror) that kept its copy, holding the
    /// node's data as of that configuration epoch while the managers may name it primary.
    Outside {
        asked_ms: Option<u64>,
        former: Option<u64>,
    },
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
    /// `log-repl` only.
    repl: Option<Repl>,
    /// `ram-repl`: a crash loses this process's copy (log and image, both in RAM).
    in_ram: bool,
    /// A promoted mirror's image as its page cache held it (not yet flushed): the node's
    /// recovery starts from it, a power loss drops it.
    page_cache: Option<Vec<u8>>,
    /// The mirror's lag in the latest heartbeat sent, and when it was sent: the managers
    /// may act on it after the mirror caught up, or this process died.
    reported_behind: (u64, u64),
    /// When the earliest `NodeTimer::LockWait` set fires, in ms.
    lock_wait_at: Option<u64>,
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

fn send_replies(ctx: &mut Ctx<'_>, replies: Vec<(Addr, u64, Response)>) {
    for (to, reply_id, resp) in replies {
        if reply_id != tutti_wire::ONE_WAY {
            ctx.send(to, Msg::Resp { id: reply_id, resp });
        }
    }
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
            repl: None,
            in_ram: false,
            lock_wait_at: None,
            page_cache: None,
            reported_behind: (0, 0),
        }
    }

    /// `ram-repl`: this copy lives in its process's memory only.
    pub(crate) fn in_ram(mut self, in_ram: bool) -> SimNode {
        self.in_ram = in_ram;
        if let Some(repl) = &mut self.repl {
            repl.state = match std::mem::replace(&mut repl.state, ReplState::MirrorDown) {
                ReplState::Primary(s) => ReplState::Primary(s.in_ram(in_ram)),
                ReplState::Mirror(m) => ReplState::Mirror(m.in_ram(in_ram)),
                other => other,
            };
            if in_ram {
                repl.served = None;
            }
        }
        self
    }

    /// A replicated primary's account of how long its mirror has failed it (0: not a
    /// primary, or it has not), now or in its latest heartbeat: the managers drop a mirror
    /// behind for the fail-over timeout.
    pub(crate) fn mirror_behind_ms(&self, now_ms: u64) -> u64 {
        let now = match self.repl.as_ref().map(|r| &r.state) {
            Some(ReplState::Primary(s)) => s.behind_ms(now_ms),
            _ => 0,
        };
        // The managers act on a report only while they hear from its sender, so an old one
        // (a process that stopped reporting: crashed, or a mirror now) no longer counts.
        let (sent_ms, reported) = self.reported_behind;
        let recent = now_ms < sent_ms + 10 * crate::manager::FAILOVER_TIMEOUT_MS;
        now.max(if recent { reported } else { 0 })
    }

    /// `ram-repl`: whether this process holds a copy of its node's data (serving it, or
    /// mirroring it, or promoted), as opposed to down or outside the placement, empty.
    pub(crate) fn holds_copy(&self) -> bool {
        matches!(
            self.repl.as_ref().map(|r| &r.state),
            Some(
                ReplState::Primary(_)
                    | ReplState::Mirror(_)
                    | ReplState::Promoted(_)
                    | ReplState::Outside {
                        former: Some(_),
                        ..
                    }
            )
        )
    }

    /// A replaced primary holding the copy it kept, named in no placement.
    pub(crate) fn is_former(&self) -> bool {
        self.former_epoch().is_some()
    }

    /// The configuration epoch of the copy it holds for the managers, as a former primary
    /// (or a mirror named primary that died before it registered).
    fn former_epoch(&self) -> Option<u64> {
        match self.repl.as_ref().map(|r| &r.state) {
            Some(ReplState::Outside { former, .. }) => *former,
            _ => None,
        }
    }

    /// Node `id`'s first primary at `me`, shipping to its mirror at `mirror` (`log-repl`).
    pub(crate) fn primary(
        id: NodeId,
        me: Addr,
        mirror: Addr,
        image: Vec<u8>,
        dir: Rc<Directory>,
        check: Rc<RecoveryCheck>,
    ) -> SimNode {
        let mut node = SimNode::new(id, image, dir, check);
        let placement = Placement {
            config_epoch: 1,
            primary: name_of(me),
            mirror: Some(name_of(mirror)),
        };
        node.repl = Some(Repl {
            state: ReplState::Primary(Shipper::new(id, 1, placement, 1)),
            session: 1,
            joining: None,
            seed: None,
            promoted: None,
            served: Some(1),
            kept_dropped: false,
        });
        node
    }

    /// Node `id`'s first mirror.
    pub(crate) fn mirror(
        id: NodeId,
        image: Vec<u8>,
        dir: Rc<Directory>,
        check: Rc<RecoveryCheck>,
    ) -> SimNode {
        let mut node = SimNode::new(id, image, dir, check);
        node.participant = None;
        let mut mirror = Mirror::new(id, space_from(&node.image), 1, vec![], 0);
        mirror.set_config_epoch(1);
        node.repl = Some(Repl {
            state: ReplState::Mirror(mirror),
            session: 0,
            joining: None,
            seed: None,
            promoted: None,
            served: None,
            kept_dropped: false,
        });
        node
    }

    /// A mirror's image, while it is up as one.
    pub(crate) fn mirror_space(&self) -> Option<&Space> {
        match &self.repl.as_ref()?.state {
            ReplState::Mirror(m) | ReplState::Promoted(m) => Some(m.space()),
            _ => None,
        }
    }

    /// Whether a primary holds its mirror in step: every record handed over acknowledged.
    pub(crate) fn mirrored(&self) -> Option<&str> {
        match &self.repl.as_ref()?.state {
            ReplState::Primary(s) if s.caught_up() => s.mirror(),
            _ => None,
        }
    }

    fn shipper(&mut self) -> Option<&mut Shipper<Addr>> {
        match &mut self.repl.as_mut()?.state {
            ReplState::Primary(s) => Some(s),
            _ => None,
        }
    }

    fn mirror_mut(&mut self) -> Option<&mut Mirror<Addr>> {
        match &mut self.repl.as_mut()?.state {
            ReplState::Mirror(m) | ReplState::Promoted(m) => Some(m),
            _ => None,
        }
    }

    /// The node's space, while it is up.
    pub(crate) fn space(&self) -> Option<&Space> {
        self.participant.as_ref().map(|p| p.space())
    }

    /// `len` bytes at `addr` as committed, if this node is serving and no minitransaction
    /// in flight holds them for writing (its outcome may be decided and not yet applied).
    pub(crate) fn committed_bytes(&self, addr: u64, len: u64) -> Option<Vec<u8>> {
        let p = self.participant.as_ref().filter(|_| self.serving())?;
        (!p.write_locked(addr, len)).then(|| p.space().read(addr, len).to_vec())
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
        if let Some(s) = self.shipper() {
            s.truncated(below);
        }
    }

    /// Carries out a participant's actions: append, reply, truncate after the next sync.
    fn apply(&mut self, ctx: &mut Ctx<'_>, acts: Actions<Addr>) {
        let mut needs_sync = false;
        let now = now_ms(ctx);
        if let (Some(s), Some((first, _))) = (self.shipper(), acts.append.first()) {
            // Shipped as the log writer writes them, in parallel with this copy's sync.
            let (first, count) = (*first, acts.append.len() as u64);
            s.push(now, first, count, encode_records(&acts.append));
        }
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
        let replies = match self.shipper() {
            Some(s) => s.replies(now, acts.replies),
            None => acts.replies,
        };
        self.check_sole_primary(ctx, &replies);
        send_replies(ctx, replies);
        self.ship(ctx, false);
        self.maybe_sync(ctx);
        self.arm_lock_wait(ctx);
    }

    /// Wakes the participant when a minitransaction waiting for a lock has waited its
    /// `lock_wait_ms`, as the real driver's `expire_lock_waits` does.
    fn arm_lock_wait(&mut self, ctx: &mut Ctx<'_>) {
        let Some(at_ms) = self.participant.as_ref().and_then(|p| p.waiting_until()) else {
            return;
        };
        if self.lock_wait_at.is_some_and(|set| set <= at_ms) {
            return;
        }
        ctx.set_timer(
            (at_ms * 1000).saturating_sub(ctx.now_us()),
            NodeTimer::LockWait,
        );
        self.lock_wait_at = Some(at_ms);
    }

    /// Sends the shipper's messages not sent yet (with `renew`, an empty one if none, to
    /// renew the lease).
    fn ship(&mut self, ctx: &mut Ctx<'_>, renew: bool) {
        let Some(repl) = &mut self.repl else { return };
        let ReplState::Primary(s) = &mut repl.state else {
            return;
        };
        let Some((to, generation)) = (s.shipping_to()).and_then(|(t, g)| Some((addr_named(t)?, g)))
        else {
            return;
        };
        for req in s.to_send(now_ms(ctx), renew) {
            let id = ctx.new_id();
            let sent_ms = now_ms(ctx);
            self.pending.insert(
                id,
                Pending::Replicate {
                    sent_ms,
                    generation,
                },
            );
            ctx.send(to, Msg::Req { id, req });
        }
    }

    /// Group commit: one sync covers everything written when it starts.
    fn maybe_sync(&mut self, ctx: &mut Ctx<'_>) {
        let mirror = self.mirror_space().is_some();
        if (self.participant.is_none() && !mirror) || self.sync_in_flight.is_some() {
            return;
        }
        // A mirror's writer syncs every round, lazy records too.
        let needs = |r: &LogRecord| mirror || r.needs_sync();
        if let Some((upto, _)) =
            (self.written.last()).filter(|_| self.written.iter().any(|(_, r)| needs(r)))
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
        let now = now_ms(ctx);
        if let Some(m) = self.mirror_mut() {
            let replies = m.on_synced(now, upto + 1);
            send_replies(ctx, replies);
            // What arrived during this sync goes in the next one.
            self.maybe_sync(ctx);
            return;
        }
        if self.participant.is_none() {
            return;
        }
        let durable = self.durable_upto(upto);
        let acts = self.up().on_synced(now, durable);
        self.apply(ctx, acts);
    }

    /// This copy synced every record up to `upto`: how far the participant may count them
    /// durable (a replicated primary's, once on the mirror too).
    fn durable_upto(&mut self, upto: Lsn) -> Lsn {
        match self.shipper() {
            Some(s) => s.on_local_synced(upto + 1) - 1,
            None => upto,
        }
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
        let durable = self.durable_upto(upto);
        let acts = self.up().on_synced(now, durable);
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
        let mirror_behind_ms = self.shipper().map_or(0, |s| s.behind_ms(now));
        self.reported_behind = (now, mirror_behind_ms);
        let req = Request::Heartbeat {
            node: self.id,
            uncertain: report.uncertain,
            applied: report.applied,
            applied_below: report.applied_below,
            mirror_behind_ms,
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
        if self.repl.is_some() {
            ctx.set_timer(50_000, NodeTimer::Renew);
        }
    }

    /// Stage 1 from the simulated disk, then stage 2 through the network.
    fn recover(&mut self, ctx: &mut Ctx<'_>) {
        self.next_lsn = self.log_next();
        let image = self.page_cache.take().unwrap_or_else(|| self.image.clone());
        let p = Participant::recover(
            config(self.id),
            space_from(&image),
            self.next_lsn,
            self.synced.clone(),
        );
        let undecided = p.undecided();
        self.participant = Some(p);
        let now = now_ms(ctx);
        if self.up().serve_undecided(now) {
            self.recovered(ctx);
            if undecided.is_empty() {
                return;
            }
        }
        let promoted = self
            .repl
            .as_mut()
            .is_some_and(|r| r.promoted.take().is_some());
        let (stage2, queries) = match promoted {
            true => Stage2::after_promotion(self.id, undecided),
            false => Stage2::start(self.id, undecided),
        };
        let outstanding = queries.into_iter().map(|(q, r)| (q, r, false)).collect();
        self.recovering = Some(Recovering {
            stage2,
            outstanding,
        });
        if self.stage2_progress(ctx) {
            return;
        }
        self.stage2_retry(ctx);
    }

    /// Every commit already reported that touched this node must be back in its space,
    /// or still to come there (its bytes locked by a tid in flight). A replaced primary
    /// that ends a recovery it began before its mirror took over is not the node any
    /// more: it serves nothing (its lease needs the mirror) and stops once it learns.
    fn recovered(&self, ctx: &mut Ctx<'_>) {
        if self.dir.node(self.id) != ctx.me() {
            return;
        }
        let p = self.participant.as_ref().expect("just recovered");
        let read = |addr, len| {
            let len = u64::from(len);
            (!p.write_locked(addr, len)).then(|| p.space().read(addr, len).to_vec())
        };
        for violation in (self.check)(self.id, &read) {
            let detail = format!("at {} µs {}", ctx.now_us(), violation.detail);
            ctx.report(Violation::new(violation.kind, detail));
        }
    }

    /// (Re)sends the unanswered stage-2 requests, as `call_until_ok` does.
    fn stage2_retry(&mut self, ctx: &mut Ctx<'_>) {
        let Some(rec) = &self.recovering else { return };
        let unanswered: Vec<usize> = (rec.outstanding.iter().enumerate())
            .filter(|(_, o)| !o.2)
            .map(|(i, _)| i)
            .collect();
        for i in unanswered {
            self.stage2_send(ctx, i);
        }
        ctx.set_timer(30_000, NodeTimer::Stage2Retry);
    }

    fn stage2_send(&mut self, ctx: &mut Ctx<'_>, i: usize) {
        let Some(rec) = &self.recovering else { return };
        let (q, req, _) = &rec.outstanding[i];
        let (to, req) = (self.dir.node(*q), req.clone());
        let msg_id = ctx.new_id();
        self.pending.insert(msg_id, Pending::Stage2 { index: i });
        ctx.send(to, Msg::Req { id: msg_id, req });
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
                // The peer's REQUEST-ABORTs go at once, whoever else has not answered.
                let asks = rec.stage2.on_log_tids(q, tids);
                let first = rec.outstanding.len();
                rec.outstanding
                    .extend(asks.into_iter().map(|(q, r)| (q, r, false)));
                for i in first..rec.outstanding.len() {
                    self.stage2_send(ctx, i);
                }
            }
            Response::Votes(votes) => {
                *answered = true;
                rec.stage2.on_votes(q, &votes);
            }
            _ => return,
        }
        self.stage2_progress(ctx);
    }

    /// Resolves the tids stage 2 decided since it last did and tells their other
    /// participants; once every outcome is known, serves (if not serving yet). Returns
    /// whether stage 2 is over.
    fn stage2_progress(&mut self, ctx: &mut Ctx<'_>) -> bool {
        let Some(rec) = self.recovering.as_mut() else {
            return true;
        };
        let (outcomes, decisions) = rec.stage2.decided();
        let done = rec.stage2.done();
        let now = now_ms(ctx);
        if !outcomes.is_empty() {
            let acts = self.up().resolve(now, &outcomes);
            self.apply(ctx, acts);
            for (q, decision) in decisions {
                msg::send_one_way(ctx, self.dir.node(q), decision);
            }
        }
        if done {
            self.recovering = None;
            if !self.serving() {
                self.up().finish_recovery(now);
            }
            self.recovered(ctx);
        }
        done
    }
}

/// `log-repl`: the mirror's side, a primary's joining, fail-over.
impl SimNode {
    /// Where the log on disk ends.
    fn log_next(&self) -> Lsn {
        self.synced.last().map_or(self.floor, |(lsn, _)| lsn + 1)
    }

    fn request(&mut self, ctx: &mut Ctx<'_>, to: Addr, pending: Pending, req: Request) {
        let id = ctx.new_id();
        self.pending.insert(id, pending);
        ctx.send(to, Msg::Req { id, req });
    }

    fn mirror_heartbeat(&mut self, ctx: &mut Ctx<'_>) {
        let now = now_ms(ctx);
        let (next_lsn, last_ack_ms) = self
            .mirror_mut()
            .map_or((0, 0), |m| (m.synced_next(), m.last_ack_ms()));
        let joined = self.repl.as_ref().and_then(|r| r.joining);
        let me = name_of(ctx.me());
        let outside = matches!(
            self.repl.as_ref().map(|r| &r.state),
            Some(ReplState::Outside { .. })
        );
        if outside {
            // As the real driver: a question, not a heartbeat. A copy that holds nothing
            // must not look alive as the mirror a placement may still name; a former
            // primary says what it holds.
            let to = self.manager.addr();
            let ask = match self.repl.as_ref().map(|r| &r.state) {
                Some(ReplState::Outside {
                    former: Some(config_epoch),
                    ..
                }) => Request::FormerPrimary {
                    node: self.id,
                    addr: me,
                    config_epoch: *config_epoch,
                },
                _ => Request::Placement { node: self.id },
            };
            self.request(ctx, to, Pending::Placement, ask);
            return;
        }
        // As the real driver: a join its primary gave up is abandoned, raising the epoch,
        // before the disk is emptied to join anew.
        let req = match joined {
            Some(config_epoch)
                if self.mirror_space().is_some()
                    && now >= last_ack_ms + tutti_memnode::shipper::JOINER_PATIENCE_MS =>
            {
                Request::AbandonJoin {
                    node: self.id,
                    config_epoch,
                    mirror: me,
                }
            }
            _ => Request::MirrorHeartbeat {
                node: self.id,
                addr: me,
                next_lsn,
            },
        };
        let to = self.manager.addr();
        self.request(ctx, to, Pending::MirrorHeartbeat, req);
    }

    /// A mirror learns the placement: promoted, still the mirror (or still joining), or
    /// dropped. A copy outside asks the primary to join when the node has no mirror.
    fn mirror_placement(&mut self, ctx: &mut Ctx<'_>, placement: Option<Placement>) {
        let now = now_ms(ctx);
        let (Some(p), Some(repl)) = (placement, self.repl.as_mut()) else {
            return;
        };
        let me = name_of(ctx.me());
        if let ReplState::Outside { asked_ms, .. } = &mut repl.state {
            if named_but_empty(&p, &me, false) {
                // A `ram-repl` copy restarted empty: it waits to be dropped, then joins.
                return;
            }
            if p.primary == me || p.mirror.as_deref() == Some(&me) {
                // Only with `Bug::EmptyCopyServes` planted: it serves as named, empty.
                let space = space_from(&vec![0; self.space_bytes as usize]);
                let mirror = Mirror::new(self.id, space, self.floor, vec![], now);
                repl.state = ReplState::Mirror(mirror.in_ram(self.in_ram));
                return self.mirror_placement(ctx, Some(p));
            }
            let primary = addr_named(&p.primary).filter(|_| p.primary != me);
            let due = asked_ms.is_none_or(|t| now >= t + 500);
            if let (Some(primary), None, true) = (primary, &p.mirror, due) {
                *asked_ms = Some(now);
                self.pending
                    .retain(|_, p| !matches!(p, Pending::JoinMirror | Pending::ReadSeed { .. }));
                let ask = Request::JoinMirror {
                    node: self.id,
                    addr: me,
                };
                self.request(ctx, primary, Pending::JoinMirror, ask);
            }
            return;
        }
        let ReplState::Mirror(m) = &mut repl.state else {
            return;
        };
        match Standing::of(&p, &me, m.config_epoch(), repl.joining) {
            Standing::Stale | Standing::Joining => {}
            Standing::Primary => {
                m.promote(p.config_epoch);
                let ReplState::Mirror(m) =
                    std::mem::replace(&mut repl.state, ReplState::MirrorDown)
                else {
                    unreachable!("matched above")
                };
                repl.state = ReplState::Promoted(m);
                ctx.set_timer(10_000, NodeTimer::TakeOver);
            }
            Standing::Mirror => {
                m.set_config_epoch(p.config_epoch);
                repl.joining = None;
            }
            // The copy the change left out (a named mirror dropped, or named primary and
            // replaced before it heard) is kept while the managers may name it; they say
            // whether it is that one (`memnode::mirror_node::run`).
            Standing::Outside if !asks_before_giving_up() => self.retire(),
            Standing::Outside => {
                repl.kept_dropped = true;
                self.retire_keeping_copy(p.config_epoch - 1);
            }
        }
    }

    /// `ram-repl`: the process died and its copy with it (the real one empties its tmpfs
    /// directory at start); `log-repl`: its disk was lost (the real one finds its data
    /// directory marked `empty`). It comes back outside the placement, holding nothing,
    /// whatever it was, and joins once the manager has named another copy.
    fn lose_copy(&mut self, _ctx: &mut Ctx<'_>) {
        self.retire();
        if let Some(repl) = &mut self.repl {
            repl.served = None;
            repl.kept_dropped = false;
        }
        self.synced.clear();
        self.written.clear();
        self.image = vec![0; self.space_bytes as usize];
        self.page_cache = None;
        self.pending.clear();
        self.pending_truncate = None;
    }

    /// A former primary's answer from the managers (`memnode::mirror_node` does the same):
    /// named primary again, it serves the copy it kept, as a process of the mirror role
    /// named primary does; no longer needed, it lets the copy go and joins like any copy
    /// outside the placement.
    fn former_answer(&mut self, ctx: &mut Ctx<'_>, placement: Option<Placement>, keep: bool) {
        let now = now_ms(ctx);
        let me = name_of(ctx.me());
        let Some(p) = placement else { return };
        if !self.is_former() {
            return;
        }
        if p.primary == me {
            // Not a copy still named under the epoch it holds (a named mirror restarted).
            if self.former_epoch().is_some_and(|e| p.config_epoch > e) {
                let kept_dropped = self.repl.as_ref().is_some_and(|r| r.kept_dropped);
                let counter = if kept_dropped {
                    "dropped_mirrors_named"
                } else {
                    "formers_named_again"
                };
                ctx.count(counter, 1);
            }
            let mirror = self.mirror_from_disk(now);
            let repl = self.repl.as_mut().expect("replicated");
            repl.kept_dropped = false;
            repl.state = ReplState::Mirror(mirror);
            self.mirror_placement(ctx, Some(p));
        } else if !keep {
            match (self.repl.as_mut()).map(|r| &mut r.state) {
                // Asked as of an older placement: the latest change may have left it out
                // again. It asks again as of that one.
                Some(ReplState::Outside {
                    former: Some(e), ..
                }) if p.config_epoch > *e + 1 => *e = p.config_epoch - 1,
                _ => self.lose_copy(ctx),
            }
        }
    }

    /// A mirror over what this process holds: its image and its synced records, the next
    /// record after them.
    fn mirror_from_disk(&mut self, now_ms: u64) -> Mirror<Addr> {
        let next = self.log_next();
        self.next_lsn = next;
        let space = space_from(&self.image);
        Mirror::new(self.id, space, next, self.synced.clone(), now_ms).in_ram(self.in_ram)
    }

    /// A replaced primary stops, and the process started in its place keeps the copy it
    /// left (its log, and its image as the participant had it: the page cache outlives the
    /// process, as at a crash without power loss), holding the node's data as of
    /// `config_epoch` (`memnode::node::Node::replaced`).
    fn retire_keeping_copy(&mut self, config_epoch: u64) {
        if let Some(p) = &self.participant {
            self.image = p.space().read(0, self.space_bytes).to_vec();
        } else if let Some(space) = self.mirror_space() {
            self.image = space.read(0, self.space_bytes).to_vec();
        } else if let Some(cache) = self.page_cache.take() {
            self.image = cache;
        }
        self.synced.append(&mut self.written);
        self.page_cache = None;
        self.pending_truncate = None;
        self.pending.clear();
        self.retire();
        if let Some(repl) = &mut self.repl {
            repl.state = ReplState::Outside {
                asked_ms: None,
                former: Some(config_epoch),
            };
        }
    }

    /// Replaced or dropped: answers nobody, and joins again as a new mirror.
    fn retire(&mut self) {
        self.participant = None;
        self.recovering = None;
        self.checkpoint = None;
        self.sync_in_flight = None;
        if let Some(repl) = &mut self.repl {
            repl.state = ReplState::Outside {
                asked_ms: None,
                former: None,
            };
            repl.joining = None;
            repl.seed = None;
        }
    }

    /// A serving primary's side of a join (`memnode::primary::serve_join`): the request
    /// handed back if it is not `JoinMirror` or `ReadSeed`.
    fn serve_join(
        &mut self,
        ctx: &mut Ctx<'_>,
        from: Addr,
        id: u64,
        req: Request,
    ) -> Option<Request> {
        let now = now_ms(ctx);
        let resp = match req {
            Request::JoinMirror { node, addr } if node == self.id => {
                let Some(s) = self.shipper() else {
                    return Some(Request::JoinMirror { node, addr });
                };
                match s.join(now, &addr) {
                    Err(message) => Response::Error {
                        code: ErrorCode::NotReady,
                        message,
                    },
                    Ok(terms) => {
                        // As the real driver: every record below the join's first shipped
                        // one synced, then read from disk.
                        let upto = terms.next_lsn - 1;
                        self.make_durable(upto);
                        let durable = self.durable_upto(upto);
                        let acts = self.up().on_synced(now, durable);
                        self.apply(ctx, acts);
                        let records: Vec<_> = (self.synced.iter())
                            .filter(|(lsn, _)| *lsn < terms.next_lsn)
                            .cloned()
                            .collect();
                        let first_lsn = records.first().map_or(terms.next_lsn, |r| r.0);
                        let records = encode_records(&records);
                        let records_bytes = records.len() as u64;
                        let repl = self.repl.as_mut().expect("replicated");
                        repl.seed = Some((terms.join, records));
                        Response::JoinOffer {
                            join: terms.join,
                            config_epoch: terms.config_epoch,
                            session: terms.session,
                            first_lsn,
                            next_lsn: terms.next_lsn,
                            records_bytes,
                            image_bytes: self.space_bytes,
                        }
                    }
                }
            }
            Request::ReadSeed {
                node,
                join,
                offset,
                len,
            } if node == self.id => {
                let heard = self.shipper().is_some_and(|s| s.joiner_heard(now, join));
                let seed = (self.repl.as_ref())
                    .and_then(|r| r.seed.as_ref())
                    .filter(|(j, _)| heard && *j == join);
                match seed {
                    None => Response::Error {
                        code: ErrorCode::NotFound,
                        message: format!("join {join} was given up"),
                    },
                    // One read takes the whole seed here.
                    Some((_, records)) => {
                        let space = self.participant.as_ref().expect("serving").space();
                        seed_part(records, self.space_bytes, offset, len, |from, len| {
                            space.read_written(from, len)
                        })
                    }
                }
            }
            other => return Some(other),
        };
        ctx.send(from, Msg::Resp { id, resp });
        None
    }

    /// A copy outside the placement: the primary's answers to its join.
    fn seed_answer(&mut self, ctx: &mut Ctx<'_>, from: Addr, pending: Pending, resp: Response) {
        let now = now_ms(ctx);
        let Some(Repl {
            state: ReplState::Outside { .. },
            ..
        }) = &self.repl
        else {
            return;
        };
        match (pending, resp) {
            (
                Pending::JoinMirror,
                Response::JoinOffer {
                    join,
                    config_epoch,
                    first_lsn,
                    next_lsn,
                    records_bytes,
                    image_bytes,
                    ..
                },
            ) => {
                let read = Request::ReadSeed {
                    node: self.id,
                    join,
                    offset: 0,
                    len: records_bytes + image_bytes,
                };
                let pending = Pending::ReadSeed {
                    first_lsn,
                    next_lsn,
                    records_bytes,
                    config_epoch,
                };
                self.request(ctx, from, pending, read);
            }
            (
                Pending::ReadSeed {
                    first_lsn,
                    next_lsn,
                    records_bytes,
                    config_epoch,
                },
                Response::SeedPart { records, pages, .. },
            ) => {
                assert_eq!(records.len() as u64, records_bytes, "a whole seed");
                let mut image = vec![0; self.space_bytes as usize];
                for (at, run) in pages {
                    image[at as usize..at as usize + run.len()].copy_from_slice(&run);
                }
                let (decoded, _) = decode_records(&records);
                assert_eq!(decoded.len() as u64, next_lsn - first_lsn, "a whole seed");
                // The disk emptied and filled: the image flushed, the records synced.
                let mirror_space = space_from(&image);
                self.image = image;
                self.synced = decoded.clone();
                self.written.clear();
                self.floor = first_lsn;
                self.next_lsn = next_lsn;
                self.page_cache = None;
                let mut mirror =
                    Mirror::new(self.id, mirror_space, next_lsn, decoded, now).in_ram(self.in_ram);
                mirror.set_config_epoch(config_epoch);
                let repl = self.repl.as_mut().expect("replicated");
                repl.state = ReplState::Mirror(mirror);
                repl.joining = Some(config_epoch);
                repl.served = None;
            }
            // Asked again after the next heartbeat's placement.
            _ => {}
        }
    }

    /// A primary whose joiner caught up asks the manager to name it mirror.
    fn name_joiner(&mut self, ctx: &mut Ctx<'_>) {
        let now = now_ms(ctx);
        let node = self.id;
        let Some(s) = self.shipper() else { return };
        s.give_up_silent_joiner(now);
        let Some((config_epoch, mirror)) = s.joiner_to_name() else {
            return;
        };
        let ask = Request::AddMirror {
            node,
            config_epoch,
            primary: s.placement().primary.clone(),
            mirror: mirror.to_string(),
        };
        self.pending
            .retain(|_, p| !matches!(p, Pending::AddMirror { sent_ms } if now >= *sent_ms + 200));
        if !(self.pending.values()).any(|p| matches!(p, Pending::AddMirror { .. })) {
            let to = self.manager.addr();
            self.request(ctx, to, Pending::AddMirror { sent_ms: now }, ask);
        }
    }

    /// A placement the manager committed reaches a serving primary; `registered`: its
    /// registration's reply, which confirms it serves that placement alone if it has no
    /// mirror (`memnode::primary::confirm_alone`).
    fn primary_placement(&mut self, ctx: &mut Ctx<'_>, placement: Placement, registered: bool) {
        let now = now_ms(ctx);
        let Some(s) = self.shipper() else { return };
        let config_epoch = s.placement().config_epoch;
        if s.set_placement(placement.clone()).is_err() {
            self.retire_keeping_copy(config_epoch);
            return;
        }
        if registered {
            s.confirm_alone(&placement);
        }
        let now_serving = s.placement().config_epoch;
        let confirming = s.confirming_alone();
        // Without a mirror now (and registered so), what waited for it is durable.
        let durable_next = s.durable_next();
        let released = s.release(now);
        if now_serving > config_epoch && !self.in_ram {
            self.repl.as_mut().expect("replicated").served = Some(now_serving);
        }
        send_replies(ctx, released);
        let acts = self.up().on_synced(now, durable_next - 1);
        self.apply(ctx, acts);
        if confirming {
            self.pending.retain(
                |_, p| !matches!(p, Pending::ConfirmAlone { sent_ms } if now >= *sent_ms + 200),
            );
            if !(self.pending.values()).any(|p| matches!(p, Pending::ConfirmAlone { .. })) {
                let req = self.register_request(ctx, false);
                let to = self.manager.addr();
                self.request(ctx, to, Pending::ConfirmAlone { sent_ms: now }, req);
            }
        }
    }

    /// This process's registration as the node's primary (`memnode::node::register_request`).
    fn register_request(&self, ctx: &Ctx<'_>, rebooted: bool) -> Request {
        Request::Register {
            node: self.id,
            addr: name_of(ctx.me()),
            size_bytes: self.space_bytes,
            durable: true,
            rebooted,
            mirror: None,
        }
    }

    /// The answer to a primary's registration without its mirror.
    fn alone_answer(&mut self, ctx: &mut Ctx<'_>, resp: Response) {
        match resp {
            Response::Registered {
                placement: Some(placement),
                ..
            } => self.primary_placement(ctx, placement, true),
            Response::Error {
                code: ErrorCode::StaleConfig,
                ..
            } => {
                let config_epoch = (self.shipper()).map(|s| s.placement().config_epoch);
                if let Some(config_epoch) = config_epoch {
                    self.retire_keeping_copy(config_epoch);
                }
            }
            other => {
                self.manager.not_leader(&other);
            }
        }
    }

    /// A promoted mirror, once the old primary's lease ran out: its writer syncs what it
    /// had and stops; it joins as the node's primary over its own log and image.
    fn take_over(&mut self, ctx: &mut Ctx<'_>) {
        let now = now_ms(ctx);
        let Some(repl) = &mut self.repl else { return };
        let ReplState::Promoted(m) = &repl.state else {
            return;
        };
        if !m.may_take_over(now) {
            ctx.set_timer(10_000, NodeTimer::TakeOver);
            return;
        }
        let named_in = m.config_epoch();
        self.page_cache = Some(m.space().read(0, self.space_bytes).to_vec());
        repl.state = ReplState::Joining {
            placement: None,
            asking_since_ms: None,
        };
        repl.session = ctx.now_us();
        repl.promoted = Some(named_in);
        let upto = self.next_lsn - 1;
        self.make_durable(upto);
        self.sync_in_flight = None;
        self.join(ctx);
    }

    /// A primary before its recovery registers to learn its placement (asked again on a
    /// timer until it has made both logs equal).
    fn join(&mut self, ctx: &mut Ctx<'_>) {
        self.pending.retain(|_, p| {
            !matches!(
                p,
                Pending::Register
                    | Pending::MirrorReport
                    | Pending::Tail { .. }
                    | Pending::Lacking { .. }
            )
        });
        let req = self.register_request(ctx, true);
        let to = self.manager.addr();
        // The mirror left the last ask unanswered: the manager drops it only once told.
        if let Some(Repl {
            state:
                ReplState::Joining {
                    placement: Some(p),
                    asking_since_ms: Some(since),
                },
            ..
        }) = &self.repl
        {
            if p.mirror.is_some() {
                let now = now_ms(ctx);
                let behind = now.saturating_sub(*since);
                self.reported_behind = (now, behind);
                let report = tutti_memnode::shipper::mirror_unanswering(self.id, behind);
                self.request(ctx, to, Pending::MirrorReport, report);
            }
        }
        self.request(ctx, to, Pending::Register, req);
        ctx.set_timer(30_000, NodeTimer::Join);
    }

    /// The answers of a joining primary's steps (`memnode::primary::adopt_mirror_tail`).
    fn join_answer(&mut self, ctx: &mut Ctx<'_>, pending: Pending, resp: Response) {
        let Some(Repl {
            state:
                ReplState::Joining {
                    placement,
                    asking_since_ms,
                },
            promoted,
            served,
            ..
        }) = &mut self.repl
        else {
            return;
        };
        if let Response::Error {
            code: ErrorCode::StaleConfig,
            ..
        } = resp
        {
            // A copy promoted and replaced before it registered keeps its copy, as a
            // replaced primary does; so does a `log-repl` primary replaced while it was
            // down, as of the configuration it last served (`memnode::node`).
            match promoted.or(*served) {
                Some(config_epoch) => self.retire_keeping_copy(config_epoch),
                None => self.retire(),
            }
            return;
        }
        match (pending, resp) {
            (
                Pending::Register,
                Response::Registered {
                    placement: Some(p), ..
                },
            ) => {
                *placement = Some(p.clone());
                match p.mirror.as_deref().and_then(addr_named) {
                    None => self.joined(ctx, p, false),
                    Some(mirror) => {
                        asking_since_ms.get_or_insert(now_ms(ctx));
                        let from = self.log_next();
                        let ask = Request::ReplicaTail {
                            node: self.id,
                            session: self.repl.as_ref().map_or(0, |r| r.session),
                            config_epoch: p.config_epoch,
                            from,
                        };
                        self.request(ctx, mirror, Pending::Tail { from }, ask);
                    }
                }
            }
            (Pending::Register, resp) => {
                // Asked again on the join timer.
                self.manager.not_leader(&resp);
            }
            (
                Pending::Tail { from },
                Response::ReplicaTail {
                    first_lsn, records, ..
                },
            ) => {
                let p = placement.clone().expect("asked under a placement");
                if first_lsn == from {
                    self.synced.extend(decode_records(&records).0);
                    self.joined(ctx, p, false);
                    return;
                }
                let lacking: Vec<_> = (self.synced.iter())
                    .filter(|(lsn, _)| *lsn >= first_lsn)
                    .cloned()
                    .collect();
                if lacking.first().is_none_or(|(lsn, _)| *lsn != first_lsn) {
                    self.joined(ctx, p, true);
                    return;
                }
                let mirror = p.mirror.as_deref().and_then(addr_named).expect("a mirror");
                let send = Request::Replicate {
                    node: self.id,
                    session: self.repl.as_ref().map_or(0, |r| r.session),
                    config_epoch: p.config_epoch,
                    first_lsn,
                    count: lacking.len() as u64,
                    records: encode_records(&lacking),
                    truncate_below: 0,
                    primary_synced: from,
                };
                self.request(ctx, mirror, Pending::Lacking { upto: from }, send);
            }
            (Pending::Lacking { upto }, Response::Replicated { next_lsn }) if next_lsn >= upto => {
                let p = placement.clone().expect("sent under a placement");
                self.joined(ctx, p, false);
            }
            _ => {}
        }
    }

    /// Both logs are equal (or the mirror is behind for good): recover as the primary.
    fn joined(&mut self, ctx: &mut Ctx<'_>, placement: Placement, behind: bool) {
        let session = self.repl.as_ref().map_or(0, |r| r.session);
        let served = (!self.in_ram).then_some(placement.config_epoch);
        let mut shipper =
            Shipper::new(self.id, session, placement, self.log_next()).in_ram(self.in_ram);
        if behind {
            shipper.mark_behind(now_ms(ctx));
        }
        let repl = self.repl.as_mut().expect("replicated");
        repl.state = ReplState::Primary(shipper);
        repl.served = served;
        // Clients find the node here once the managers took this process's registration:
        // one that took over and was then refused (named, then replaced before it
        // registered) never serves, and must not hide the copy that does.
        self.dir.serve_at(self.id, ctx.me());
        self.pending.retain(|_, p| {
            !matches!(
                p,
                Pending::Register
                    | Pending::MirrorReport
                    | Pending::Tail { .. }
                    | Pending::Lacking { .. }
            )
        });
        self.recover(ctx);
    }

    /// The mirror's answer to a `Replicate` sent at `sent_ms` to the shipper's `generation`.
    fn replicated(&mut self, ctx: &mut Ctx<'_>, sent_ms: u64, generation: u64, resp: Response) {
        let now = now_ms(ctx);
        let reply = match resp {
            Response::Error { code, message } => Err((code, message)),
            other => Ok(other),
        };
        let Some(s) = self.shipper() else { return };
        if s.shipping_to().is_none_or(|(_, g)| g != generation) {
            return;
        }
        match s.on_reply(sent_ms, reply) {
            Shipped::Acknowledged { durable_next } => {
                let released = s.release(now);
                self.check_sole_primary(ctx, &released);
                send_replies(ctx, released);
                if self.participant.is_some() {
                    let acts = self.up().on_synced(now, durable_next - 1);
                    self.apply(ctx, acts);
                }
            }
            Shipped::Resend(requests) => {
                let Some(to) = s.target().and_then(addr_named) else {
                    return;
                };
                for req in requests {
                    let pending = Pending::Replicate {
                        sent_ms: now,
                        generation,
                    };
                    self.request(ctx, to, pending, req);
                }
            }
            Shipped::Stale(_) => {
                // As the real driver: the manager says whether this primary was replaced.
                let ask = Request::Placement { node: self.id };
                let to = self.manager.addr();
                self.request(ctx, to, Pending::Placement, ask);
            }
            Shipped::MirrorBehind { .. } | Shipped::Nothing => {}
        }
    }

    /// A replicated node's participant answers only from the process serving the node: a
    /// mirror takes over once the old primary's lease has run out, so the old primary has
    /// stopped answering by then (two processes answering for one node could each commit
    /// or read what the other does not see).
    fn check_sole_primary(&self, ctx: &mut Ctx<'_>, replies: &[(Addr, u64, Response)]) {
        let answering = replies.iter().any(|(_, id, _)| *id != tutti_wire::ONE_WAY);
        if self.repl.is_some() && answering && self.dir.node(self.id) != ctx.me() {
            let detail = format!(
                "at {} µs process {} answered for node {}, which process {} serves",
                ctx.now_us(),
                ctx.me().0,
                self.id,
                self.dir.node(self.id).0
            );
            ctx.report(Violation::new("two primaries", detail));
        }
    }

    /// A `Replicate` unanswered for long: the real driver's call times out and it connects
    /// again, sending everything unacknowledged anew (a lost message is a broken
    /// connection: TCP loses none on one that stays up).
    fn reconnect_if_silent(&mut self, ctx: &mut Ctx<'_>) {
        const SILENT_MS: u64 = 200;
        let now = now_ms(ctx);
        let before = self.pending.len();
        self.pending.retain(|_, p| {
            !matches!(p, Pending::Replicate { sent_ms, .. } if now.saturating_sub(*sent_ms) >= SILENT_MS)
        });
        if self.pending.len() != before {
            if let Some(s) = self.shipper() {
                s.reconnected();
            }
        }
    }

    /// A request to a mirror (a promoted one refuses records).
    fn mirror_request(&mut self, ctx: &mut Ctx<'_>, from: Addr, id: u64, req: Request) {
        let now = now_ms(ctx);
        let me = self.id;
        let Some(m) = self.mirror_mut() else { return };
        if let Some((_, msg)) = Replicate::of(&req).filter(|(node, _)| *node == me) {
            let acts = m.on_replicate(now, from, id, msg);
            if let Some((first, count, bytes)) = acts.append {
                self.written.extend(decode_records(&bytes).0);
                self.next_lsn = first + count;
            }
            send_replies(ctx, acts.replies);
            self.maybe_sync(ctx);
            return;
        }
        match req {
            Request::ReplicaTail {
                node,
                session,
                config_epoch,
                from: tail_from,
            } if node == me => {
                let replies = m.on_tail(from, id, session, config_epoch, tail_from);
                send_replies(ctx, replies);
            }
            _ if id != tutti_wire::ONE_WAY => {
                let resp = Response::Error {
                    code: ErrorCode::NotReady,
                    message: "a mirror serves its primary only".into(),
                };
                ctx.send(from, Msg::Resp { id, resp });
            }
            _ => {}
        }
    }

    /// A mirror's checkpoint: the image flushed, the log truncated below what both it and
    /// the primary's truncation allow.
    fn mirror_checkpoint(&mut self) {
        let bytes = self.space_bytes;
        let Some(m) = self.mirror_mut() else { return };
        let below = m.truncation_point();
        let image = m.space().read(0, bytes).to_vec();
        self.image = image;
        if below > 0 {
            self.truncate(below);
        }
    }
}

impl Process for SimNode {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>) {
        let now = now_ms(ctx);
        let msg = msg::open(msg);
        if self.participant.is_none() {
            match msg {
                Msg::Req { id, req } => self.mirror_request(ctx, from, id, req),
                Msg::Resp { id, resp } => match self.pending.remove(&id) {
                    Some(Pending::MirrorHeartbeat | Pending::Placement)
                        if !self.manager.not_leader(&resp) =>
                    {
                        match resp {
                            Response::Placement(p) => self.mirror_placement(ctx, p),
                            Response::FormerCopy { placement, keep } => {
                                self.former_answer(ctx, placement, keep)
                            }
                            _ => {}
                        }
                    }
                    Some(Pending::MirrorHeartbeat | Pending::Placement) => {}
                    Some(pending @ (Pending::JoinMirror | Pending::ReadSeed { .. })) => {
                        self.seed_answer(ctx, from, pending, resp)
                    }
                    Some(pending) => self.join_answer(ctx, pending, resp),
                    None => {}
                },
            }
            return;
        }
        match msg {
            Msg::Req { id, req } => {
                let Some(req) = self.serve_join(ctx, from, id, req) else {
                    return;
                };
                let acts = self.up().on_request(now, from, id, req);
                self.apply(ctx, acts);
            }
            Msg::Resp { id, resp } => match self.pending.remove(&id) {
                Some(Pending::Heartbeat { sent_ms }) => {
                    let p = self.participant.as_mut().expect("up");
                    if self.manager.not_leader(&resp) {
                        // As the real driver after a failed call: the reports go again.
                        let acts = p.on_heartbeat_ack(sent_ms + 1, 0, u64::MAX, &[], &[]);
                        self.apply(ctx, acts);
                    } else if let Response::HeartbeatAck {
                        epoch,
                        incarnation,
                        gc,
                        applied_below,
                        placement,
                    } = resp
                    {
                        let acts =
                            p.on_heartbeat_ack(sent_ms, epoch, incarnation, &gc, &applied_below);
                        self.apply(ctx, acts);
                        if let Some(placement) = placement {
                            self.primary_placement(ctx, placement, false);
                        }
                        self.name_joiner(ctx);
                    }
                }
                Some(Pending::Placement) => match resp {
                    Response::Placement(Some(placement)) => {
                        self.primary_placement(ctx, placement, false)
                    }
                    other => {
                        self.manager.not_leader(&other);
                    }
                },
                Some(Pending::AddMirror { .. }) => {
                    if let Response::Placement(Some(placement)) = resp {
                        let named = self.shipper().is_some_and(|s| {
                            s.joiner_to_name().map(|(_, m)| m) == placement.mirror.as_deref()
                        });
                        if named {
                            ctx.count("mirror_joins", 1);
                        }
                        self.primary_placement(ctx, placement, false);
                        if let Some(repl) = &mut self.repl {
                            repl.seed = None;
                        }
                    } else {
                        self.manager.not_leader(&resp);
                    }
                }
                Some(Pending::Stage2 { index }) => self.stage2_answer(ctx, index, resp),
                Some(Pending::ConfirmAlone { .. }) => self.alone_answer(ctx, resp),
                Some(Pending::MirrorReport) => {
                    self.manager.not_leader(&resp);
                }
                Some(Pending::Replicate {
                    sent_ms,
                    generation,
                }) => self.replicated(ctx, sent_ms, generation, resp),
                Some(_) | None => {}
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
                } else {
                    self.mirror_checkpoint();
                }
            }
            NodeTimer::CheckpointStep => self.checkpoint_step(ctx),
            NodeTimer::Heartbeat => {
                if self.periodic(ctx, 20_000, NodeTimer::Heartbeat) {
                    self.heartbeat(ctx);
                } else if matches!(
                    self.repl.as_ref().map(|r| &r.state),
                    Some(ReplState::Mirror(_) | ReplState::Promoted(_) | ReplState::Outside { .. })
                ) {
                    // A promoted one too, until it takes over: the managers hear it alive.
                    self.mirror_heartbeat(ctx);
                }
            }
            NodeTimer::Stage2Retry => self.stage2_retry(ctx),
            NodeTimer::Renew => {
                if self.shipper().is_some() && self.participant.is_some() {
                    self.reconnect_if_silent(ctx);
                    self.ship(ctx, true);
                }
                ctx.set_timer(50_000, NodeTimer::Renew);
            }
            NodeTimer::Join => {
                if matches!(
                    self.repl.as_ref().map(|r| &r.state),
                    Some(ReplState::Joining { .. })
                ) {
                    self.join(ctx);
                }
            }
            NodeTimer::TakeOver => self.take_over(ctx),
            NodeTimer::LockWait => {
                self.lock_wait_at = None;
                if self.participant.is_some() {
                    let acts = self.up().tick(now_ms(ctx));
                    self.apply(ctx, acts);
                }
            }
        }
    }

    fn on_crash(&mut self, ctx: &mut Ctx<'_>, power_loss: bool) {
        // Its timers never fire now.
        self.lock_wait_at = None;
        if self.in_ram {
            return self.lose_copy(ctx);
        }
        // What the process held in the page cache: the participant's space, a mirror's.
        let cache = match (&self.participant, self.mirror_space()) {
            (Some(p), _) => Some(p.space().read(0, self.space_bytes).to_vec()),
            (None, Some(space)) => Some(space.read(0, self.space_bytes).to_vec()),
            (None, None) => self.page_cache.take(),
        };
        self.participant = None;
        if power_loss {
            self.written.clear();
            self.page_cache = None;
        } else {
            self.synced.append(&mut self.written);
            if let Some(image) = cache {
                self.image = image;
            }
        }
        if let Some(repl) = &mut self.repl {
            repl.state = match std::mem::replace(&mut repl.state, ReplState::MirrorDown) {
                ReplState::Primary(_) | ReplState::Joining { .. } => ReplState::Joining {
                    placement: None,
                    asking_since_ms: None,
                },
                // A mirror (named primary or not, joined or still joining) keeps what its
                // disk holds: once up again, it serves as the placement names it, or as the
                // mirror of the join the placement still waits for, and if neither, asks
                // the managers whether the change left it out before it empties its disk to
                // join anew (`mirror::asks_before_giving_up`), as the real one does.
                ReplState::Mirror(_) | ReplState::Promoted(_) | ReplState::MirrorDown => {
                    ReplState::MirrorDown
                }
                // A `log-repl` former's marker stays with its copy on disk.
                ReplState::Outside { former, .. } => ReplState::Outside {
                    asked_ms: None,
                    former,
                },
            };
            // `joining` stays: the real mirror's join.json.
            repl.seed = None;
        }
        self.sync_in_flight = None;
        self.pending_truncate = None;
        self.recovering = None;
        self.pending.clear();
        self.checkpoint = None;
    }

    fn on_disk_lost(&mut self, ctx: &mut Ctx<'_>) {
        assert!(
            self.repl.is_some(),
            "only a replicated node's disk is taken"
        );
        self.lose_copy(ctx);
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        if let Some(repl) = &mut self.repl {
            match &repl.state {
                ReplState::Outside { .. } => {
                    self.schedule_timers(ctx);
                    return;
                }
                ReplState::MirrorDown => {
                    let mirror = self.mirror_from_disk(now_ms(ctx));
                    let repl = self.repl.as_mut().expect("replicated");
                    repl.state = ReplState::Mirror(mirror);
                    self.schedule_timers(ctx);
                    return;
                }
                ReplState::Mirror(_) | ReplState::Promoted(_) => {
                    self.schedule_timers(ctx);
                    return;
                }
                ReplState::Joining { .. } => {
                    // A new primary process: later than any before it.
                    repl.session = ctx.now_us();
                    self.schedule_timers(ctx);
                    self.join(ctx);
                    return;
                }
                ReplState::Primary(_) => {}
            }
        }
        self.schedule_timers(ctx);
        if self.participant.is_none() {
            self.recover(ctx);
        }
    }

    /// Up, serving, nothing uncertain and no lock held; a replicated primary has a mirror
    /// again, which holds every record; a mirror has nothing unsynced and is named.
    fn settled(&self) -> bool {
        let idle = self.participant.as_ref().is_some_and(|p| p.idle());
        match self.repl.as_ref().map(|r| &r.state) {
            None => idle,
            Some(ReplState::Primary(s)) => idle && s.caught_up() && s.mirror().is_some(),
            Some(ReplState::Mirror(_)) => self.written.is_empty() && r_named(self),
            Some(_) => false,
        }
    }

    fn describe(&self) -> String {
        let role = match self.repl.as_ref().map(|r| &r.state) {
            None => "",
            Some(ReplState::Primary(s)) if !s.caught_up() => " (primary, mirror behind)",
            Some(ReplState::Primary(_)) => " (primary)",
            Some(ReplState::Joining { .. }) => " (joining as primary)",
            Some(ReplState::Mirror(_)) if !r_named(self) => " (mirror, joining)",
            Some(ReplState::Mirror(_)) => " (mirror)",
            Some(ReplState::Promoted(_)) => " (promoted, waiting out the lease)",
            Some(ReplState::MirrorDown) => " (mirror, down)",
            Some(ReplState::Outside {
                former: Some(_), ..
            }) => " (former primary, holding its copy)",
            Some(ReplState::Outside { .. }) => " (outside the placement, joining)",
        };
        match &self.participant {
            None => format!("node {}{role} down", self.id),
            Some(p) => {
                let s = p.stats(0);
                format!(
                    "node {}{role} {:?}, {} uncertain, {} locks held",
                    self.id,
                    p.stage(),
                    s.uncertain,
                    s.locks_held
                )
            }
        }
    }
}

/// Whether a mirror is named by the placement (not still joining).
fn r_named(node: &SimNode) -> bool {
    node.repl.as_ref().is_some_and(|r| r.joining.is_none())
}
