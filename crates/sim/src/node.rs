//! A simulated memory node: the real `Participant` over a simulated disk. Records appended
//! are "written"; a sync (taking simulated time) makes them durable. A power loss drops what
//! was written but not synced and returns the image to its last flush; a process kill keeps
//! both (they were in the page cache), as on Linux.

use crate::check;
use crate::coordinator::{initial_image, SPACE_BYTES};
use crate::{Endpoint, Event, Msg, SimConfig, World};
use rand::Rng;
use std::collections::BTreeMap;
use tutti_memnode::participant::{Actions, Config, Participant, Stage};
use tutti_memnode::recovery::Stage2;
use tutti_memnode::redo_log::{LogRecord, Lsn};
use tutti_memnode::space::Space;
use tutti_memnode::Mode;
use tutti_wire::{Limits, NodeId, Request, Response};

enum Pending {
    Heartbeat { sent_ms: u64 },
    Stage2 { index: usize },
}

struct Recovering {
    stage2: Stage2,
    /// Requests of the current step: (peer, request, answered).
    outstanding: Vec<(NodeId, Request, bool)>,
}

pub(crate) struct SimNode {
    pub(crate) incarnation: u64,
    pub(crate) participant: Option<Participant<Endpoint>>,
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
}

fn config(id: NodeId) -> Config {
    Config {
        id,
        mode: Mode::Log,
        timeout_uncertain_ms: 100,
        limits: Limits::default(),
    }
}

fn space_from(image: &[u8]) -> Space {
    let mut space = Space::anonymous(SPACE_BYTES).expect("map a small anonymous space");
    space.write(0, image);
    space
}

impl SimNode {
    pub(crate) fn new(id: NodeId, cfg: &SimConfig) -> SimNode {
        let image = initial_image(cfg, id);
        let participant = Participant::new(config(id), space_from(&image), 1);
        SimNode {
            incarnation: 1,
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
        }
    }

    /// Up, serving, nothing uncertain and no lock held.
    pub(crate) fn quiet(&self) -> bool {
        self.participant.as_ref().is_some_and(|p| {
            let s = p.stats(0);
            p.stage() == Stage::Serving && s.uncertain == 0 && s.locks_held == 0
        })
    }

    fn serving(&self) -> bool {
        self.participant
            .as_ref()
            .is_some_and(|p| p.stage() == Stage::Serving)
    }

    fn truncate(&mut self, below: Lsn) {
        self.synced.retain(|(lsn, _)| *lsn >= below);
        self.floor = self.floor.max(below);
    }
}

fn index(id: NodeId) -> usize {
    usize::from(id) - 1
}

fn now_ms(world: &World) -> u64 {
    world.now_us / 1000
}

/// Carries out a participant's actions: append, reply, truncate after the next sync.
fn apply(world: &mut World, id: NodeId, acts: Actions<Endpoint>) {
    let node = &mut world.nodes[index(id)];
    let mut needs_sync = false;
    for (lsn, record) in acts.append {
        needs_sync |= record.needs_sync();
        node.next_lsn = lsn + 1;
        node.written.push((lsn, record));
    }
    if let Some(below) = acts.truncate_below {
        // The real writer truncates only after syncing the batches queued before it.
        if needs_sync || node.written.iter().any(|(_, r)| r.needs_sync()) {
            node.pending_truncate = Some((below, node.next_lsn - 1));
        } else {
            node.truncate(below);
        }
    }
    for (to, reply_id, resp) in acts.replies {
        if reply_id != tutti_wire::ONE_WAY {
            world.send(Endpoint::Node(id), to, Msg::Resp { id: reply_id, resp });
        }
    }
    maybe_sync(world, id);
}

/// Group commit: one sync covers everything written when it starts.
fn maybe_sync(world: &mut World, id: NodeId) {
    let node = &mut world.nodes[index(id)];
    if node.participant.is_none() || node.sync_in_flight.is_some() {
        return;
    }
    if let Some((upto, _)) = node
        .written
        .last()
        .filter(|_| node.written.iter().any(|(_, r)| r.needs_sync()))
    {
        node.sync_in_flight = Some(*upto);
        let incarnation = node.incarnation;
        let took = world.rng.gen_range(100..1_500);
        world.at(
            took,
            Event::SyncDone {
                node: id,
                incarnation,
            },
        );
    }
}

fn make_durable(node: &mut SimNode, upto: Lsn) {
    let split = node.written.partition_point(|(lsn, _)| *lsn <= upto);
    node.synced.extend(node.written.drain(..split));
    if let Some((below, after)) = node.pending_truncate {
        if after <= upto {
            node.truncate(below);
            node.pending_truncate = None;
        }
    }
}

pub(crate) fn sync_done(world: &mut World, id: NodeId, incarnation: u64) {
    let now = now_ms(world);
    let node = &mut world.nodes[index(id)];
    if node.incarnation != incarnation {
        return;
    }
    let Some(upto) = node.sync_in_flight.take() else {
        return;
    };
    make_durable(node, upto);
    let acts = node.participant.as_mut().expect("up").on_synced(now, upto);
    apply(world, id, acts);
}

/// A node timer firing: re-arms itself (every `period_us` plus up to 40 % jitter) while the
/// node keeps this incarnation; says whether the node is serving and so should act now.
fn periodic(
    world: &mut World,
    id: NodeId,
    incarnation: u64,
    period_us: u64,
    event: fn(NodeId, u64) -> Event,
) -> bool {
    if world.nodes[index(id)].incarnation != incarnation {
        return false;
    }
    let next = period_us + world.rng.gen_range(0..period_us * 2 / 5);
    world.at(next, event(id, incarnation));
    world.nodes[index(id)].serving()
}

/// Flush the image, sync the log, then let the participant collect its log head.
pub(crate) fn checkpoint(world: &mut World, id: NodeId, incarnation: u64) {
    if !periodic(world, id, incarnation, 50_000, |node, incarnation| {
        Event::Checkpoint { node, incarnation }
    }) {
        return;
    }
    let now = now_ms(world);
    let node = &mut world.nodes[index(id)];
    let p = node.participant.as_mut().expect("up");
    let cp = p.checkpoint_begin();
    node.image = p.space().read(0, SPACE_BYTES).to_vec();
    let upto = node.next_lsn - 1;
    make_durable(node, upto);
    let acts = node.participant.as_mut().expect("up").on_synced(now, upto);
    apply(world, id, acts);
    let acts = world.nodes[index(id)]
        .participant
        .as_mut()
        .expect("up")
        .checkpoint_done(cp);
    apply(world, id, acts);
}

pub(crate) fn heartbeat(world: &mut World, id: NodeId, incarnation: u64) {
    if !periodic(world, id, incarnation, 20_000, |node, incarnation| {
        Event::Heartbeat { node, incarnation }
    }) {
        return;
    }
    let now = now_ms(world);
    let node = &mut world.nodes[index(id)];
    let p = node.participant.as_mut().expect("up");
    // An unanswered heartbeat is a failed call: the real driver then resends its reports.
    let unanswered: Vec<u64> = node
        .pending
        .iter()
        .filter(|(_, p)| matches!(p, Pending::Heartbeat { .. }))
        .map(|(id, _)| *id)
        .collect();
    for pending in unanswered {
        if let Some(Pending::Heartbeat { sent_ms }) = node.pending.remove(&pending) {
            // An epoch of 0 never advances anything, so there is nothing to carry out.
            let acts = p.on_heartbeat_ack(sent_ms + 1, 0, u64::MAX, &[], &[]);
            assert!(acts.append.is_empty() && acts.replies.is_empty());
        }
    }
    let report = p.heartbeat(now);
    let req = Request::Heartbeat {
        node: id,
        uncertain: report.uncertain,
        applied: report.applied,
        applied_below: report.applied_below,
    };
    let msg_id = world.new_id();
    world.nodes[index(id)]
        .pending
        .insert(msg_id, Pending::Heartbeat { sent_ms: now });
    world.send(
        Endpoint::Node(id),
        Endpoint::Manager,
        Msg::Req { id: msg_id, req },
    );
}

pub(crate) fn deliver(world: &mut World, id: NodeId, from: Endpoint, msg: Msg) {
    let now = now_ms(world);
    let node = &mut world.nodes[index(id)];
    let Some(p) = node.participant.as_mut() else {
        return;
    };
    match msg {
        Msg::Req { id: req_id, req } => {
            let acts = p.on_request(now, from, req_id, req);
            apply(world, id, acts);
        }
        Msg::Resp { id: resp_id, resp } => match node.pending.remove(&resp_id) {
            Some(Pending::Heartbeat { sent_ms }) => {
                if let Response::HeartbeatAck {
                    epoch,
                    incarnation,
                    gc,
                    applied_below,
                } = resp
                {
                    let acts = p.on_heartbeat_ack(sent_ms, epoch, incarnation, &gc, &applied_below);
                    apply(world, id, acts);
                }
            }
            Some(Pending::Stage2 { index: i }) => stage2_answer(world, id, i, resp),
            None => {}
        },
    }
}

pub(crate) fn crash(world: &mut World, id: NodeId, power_loss: bool) {
    let node = &mut world.nodes[index(id)];
    let Some(p) = node.participant.take() else {
        return;
    };
    if power_loss {
        node.written.clear();
    } else {
        node.synced.append(&mut node.written);
        node.image = p.space().read(0, SPACE_BYTES).to_vec();
    }
    node.incarnation += 1;
    node.sync_in_flight = None;
    node.pending_truncate = None;
    node.recovering = None;
    node.pending.clear();
}

/// Stage 1 from the simulated disk, then stage 2 through the network.
pub(crate) fn restart(world: &mut World, id: NodeId) {
    let node = &mut world.nodes[index(id)];
    if node.participant.is_some() {
        return;
    }
    node.incarnation += 1;
    node.next_lsn = node.synced.last().map_or(node.floor, |(lsn, _)| lsn + 1);
    let p = Participant::recover(
        config(id),
        space_from(&node.image),
        node.next_lsn,
        node.synced.clone(),
    );
    let undecided = p.undecided();
    node.participant = Some(p);
    world.schedule_node_timers(id);
    if undecided.is_empty() {
        world.nodes[index(id)]
            .participant
            .as_mut()
            .expect("up")
            .finish_recovery();
        check::after_recovery(world, id);
        return;
    }
    let (stage2, queries) = Stage2::start(id, undecided);
    let outstanding = queries.into_iter().map(|(q, r)| (q, r, false)).collect();
    world.nodes[index(id)].recovering = Some(Recovering {
        stage2,
        outstanding,
    });
    stage2_retry(world, id, world.nodes[index(id)].incarnation);
}

/// (Re)sends the unanswered requests of the current stage-2 step, as `call_until_ok` does.
pub(crate) fn stage2_retry(world: &mut World, id: NodeId, incarnation: u64) {
    let node = &world.nodes[index(id)];
    if node.incarnation != incarnation {
        return;
    }
    let Some(rec) = &node.recovering else { return };
    let unanswered: Vec<(usize, NodeId, Request)> = rec
        .outstanding
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.2)
        .map(|(i, (q, r, _))| (i, *q, r.clone()))
        .collect();
    for (i, q, req) in unanswered {
        let msg_id = world.new_id();
        world.nodes[index(id)]
            .pending
            .insert(msg_id, Pending::Stage2 { index: i });
        world.send(
            Endpoint::Node(id),
            Endpoint::Node(q),
            Msg::Req { id: msg_id, req },
        );
    }
    world.at(
        30_000,
        Event::Stage2Retry {
            node: id,
            incarnation,
        },
    );
}

fn stage2_answer(world: &mut World, id: NodeId, i: usize, resp: Response) {
    let node = &mut world.nodes[index(id)];
    let Some(rec) = node.recovering.as_mut() else {
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
                node.pending
                    .retain(|_, p| !matches!(p, Pending::Stage2 { .. }));
                rec.outstanding = requests.into_iter().map(|(q, r)| (q, r, false)).collect();
                let incarnation = node.incarnation;
                stage2_retry(world, id, incarnation);
            }
        }
        Response::Votes(votes) => {
            *answered = true;
            rec.stage2.on_votes(q, &votes);
        }
        _ => return,
    }
    let node = &mut world.nodes[index(id)];
    if node.recovering.as_ref().is_some_and(|r| r.stage2.done()) {
        let rec = node.recovering.take().expect("recovering");
        let (outcomes, decisions) = rec.stage2.outcomes();
        let acts = node.participant.as_mut().expect("up").resolve(&outcomes);
        node.participant.as_mut().expect("up").finish_recovery();
        apply(world, id, acts);
        check::after_recovery(world, id);
        for (q, decision) in decisions {
            world.send_one_way(Endpoint::Node(id), Endpoint::Node(q), decision);
        }
    }
}
