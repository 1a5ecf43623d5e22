//! A simulated manager: one `Replica` of the manager group (the real Raft replica over the
//! real `ManagerState`) and the real `Recovery` coordinator, over the simulated network. Its
//! disk is what the replica last asked to persist, written before anything it sends (as the
//! real driver does), so it survives crashes and power losses alike.

use crate::msg::{self, Directory, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use rand::Rng;
use std::any::Any;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_manager::{Actions, Persisted, Recovery, RecoveryBatch, Replica, ReplicaConfig};
use tutti_wire::{NodeId, Request, Response};

/// A replicated node's primary silent this long is replaced, and a mirror its primary
/// reports behind this long dropped: shorter than the real 500 ms, so that a fair share of the simulated crashes (down 5–200 ms) and
/// partitions end in a fail-over.
pub(crate) const FAILOVER_TIMEOUT_MS: u64 = 100;

/// The Raft clock's tick in the simulation: shorter than the real 50 ms, so that elections
/// fit many times into a run's faults.
const TICK_US: u64 = 10_000;

#[derive(Debug)]
enum ManagerTimer {
    Tick,
    /// Advances the epoch (what the real epoch clock does, faster).
    Epoch,
    /// The real manager gives up on a recovery after its call timeout; the nodes report
    /// the tids again.
    RecoveryTimeout(u64),
}

pub(crate) struct SimManager {
    /// Raft id: its place in `dir.managers`, from 1.
    id: u64,
    dir: Rc<Directory>,
    epoch_interval_us: u64,
    /// The state the group starts from (the same at every manager).
    initial: Persisted,
    replica: Option<Replica<Addr>>,
    /// It led when it last acted (for counting elections).
    led: bool,
    disk: Option<Vec<u8>>,
    recoveries: BTreeMap<u64, Recovery>,
    /// Request id → (recovery, node asked).
    asked: BTreeMap<u64, (u64, NodeId)>,
}

impl SimManager {
    /// Manager `id` (from 1) of the group in `dir.managers`, starting from `initial` (a
    /// fresh state, or one with the nodes registered and regions allocated, as `tutti up`
    /// and the layers above make it before anything else happens).
    pub(crate) fn new(
        id: u64,
        dir: Rc<Directory>,
        epoch_interval_us: u64,
        initial: Persisted,
    ) -> SimManager {
        SimManager {
            id,
            dir,
            epoch_interval_us,
            initial,
            replica: None,
            led: false,
            disk: None,
            recoveries: BTreeMap::new(),
            asked: BTreeMap::new(),
        }
    }

    fn replica(&mut self) -> &mut Replica<Addr> {
        self.replica
            .as_mut()
            .expect("a running manager has its replica")
    }

    /// Carries out what the replica asked: persist, then send.
    fn act(&mut self, ctx: &mut Ctx<'_>, acts: Actions<Addr>) {
        if let Some(bytes) = acts.persist {
            self.disk = Some(bytes);
        }
        for (to, bytes) in acts.messages {
            let peer = self.dir.managers[to as usize - 1];
            msg::send_one_way(ctx, peer, Request::Raft(bytes));
        }
        for (to, id, resp) in acts.replies {
            if id != 0 {
                ctx.send(to, Msg::Resp { id, resp });
            }
        }
        for batch in acts.recoveries {
            self.start_recovery(ctx, batch);
        }
        let leads = self.is_leader();
        if leads && !self.led {
            ctx.count("manager_elections", 1);
        }
        self.led = leads;
    }

    fn start_recovery(&mut self, ctx: &mut Ctx<'_>, batch: RecoveryBatch) {
        let (recovery, requests) = Recovery::start(batch);
        let rid = ctx.new_id();
        self.recoveries.insert(rid, recovery);
        for (q, req) in requests {
            let id = ctx.new_id();
            self.asked.insert(id, (rid, q));
            ctx.send(self.dir.node(q), Msg::Req { id, req });
        }
        ctx.set_timer(500_000, ManagerTimer::RecoveryTimeout(rid));
    }

    /// The state as of this manager's log's last entry, for the run's checks.
    pub(crate) fn latest(&self) -> Option<&Persisted> {
        self.replica.as_ref().map(Replica::latest)
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.replica.as_ref().is_some_and(Replica::is_leader)
    }
}

/// The name each simulated manager goes by in `NotLeader` hints: `sim-manager-ID`.
pub(crate) fn manager_name(id: u64) -> String {
    format!("sim-manager-{id}")
}

impl Process for SimManager {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>) {
        let now_ms = ctx.now_us() / 1000;
        match msg::open(msg) {
            Msg::Req { id, req } => {
                let acts = self.replica().on_request(now_ms, from, id, req);
                self.act(ctx, acts);
            }
            Msg::Resp {
                id,
                resp: Response::Votes(votes),
            } => {
                let Some((rid, q)) = self.asked.remove(&id) else {
                    return;
                };
                let Some(recovery) = self.recoveries.get_mut(&rid) else {
                    return;
                };
                if let Some(decisions) = recovery.on_votes(q, &votes) {
                    let recovery = self.recoveries.remove(&rid).expect("present");
                    for (q, decision) in decisions {
                        msg::send_one_way(ctx, self.dir.node(q), decision);
                    }
                    self.replica().recovery_done(recovery.batch());
                }
            }
            Msg::Resp { .. } => {}
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        let now_ms = ctx.now_us() / 1000;
        match *timer.downcast::<ManagerTimer>().expect("a manager timer") {
            ManagerTimer::Tick => {
                let acts = self.replica().tick(now_ms);
                self.act(ctx, acts);
                ctx.set_timer(TICK_US, ManagerTimer::Tick);
            }
            ManagerTimer::Epoch => {
                if ctx.faults_on() {
                    let acts = self.replica().advance_epoch(now_ms);
                    self.act(ctx, acts);
                    ctx.set_timer(self.epoch_interval_us, ManagerTimer::Epoch);
                }
            }
            ManagerTimer::RecoveryTimeout(rid) => {
                if let Some(r) = self.recoveries.remove(&rid) {
                    self.replica().recovery_done(r.batch());
                }
            }
        }
    }

    fn on_crash(&mut self, _ctx: &mut Ctx<'_>, _power_loss: bool) {
        // Its disk is only ever written whole and before anything depends on it.
        self.replica = None;
        self.led = false;
        self.recoveries.clear();
        self.asked.clear();
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        // Ticks without a leader before it stands: drawn here, from the seed, at each start
        // (raft's own draw is not seeded).
        let election_ticks = 10 + ctx.rng().gen_range(0..10);
        let cfg = ReplicaConfig {
            id: self.id,
            peers: (1..=self.dir.managers.len() as u64)
                .map(manager_name)
                .collect(),
            failure_timeout_ms: 3_000,
            failover_timeout_ms: FAILOVER_TIMEOUT_MS,
            election_ticks,
            heartbeat_ticks: 2,
            fixed_election: true,
        };
        let replica = Replica::open(cfg, self.disk.as_deref(), &self.initial)
            .expect("a simulated manager's disk reads back");
        self.replica = Some(replica);
        let jitter = ctx.rng().gen_range(0..TICK_US);
        ctx.set_timer(jitter + 1, ManagerTimer::Tick);
        ctx.set_timer(self.epoch_interval_us, ManagerTimer::Epoch);
    }

    fn settled(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        let role = if self.is_leader() {
            "leader"
        } else {
            "follower"
        };
        format!(
            "manager {} ({role}), {} recoveries running",
            self.id,
            self.recoveries.len()
        )
    }
}
