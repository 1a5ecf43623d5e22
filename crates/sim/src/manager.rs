//! The simulated manager: the real `ManagerState` (directory, epochs, failure detection)
//! and `Recovery` (the recovery coordinator for tids left uncertain) over the simulated
//! network. It does not crash, so its snapshots need no disk.

use crate::msg::{self, Directory, Msg};
use crate::world::{Addr, Ctx, Message, Process, Timer};
use std::any::Any;
use std::collections::BTreeMap;
use std::rc::Rc;
use tutti_manager::{ManagerState, Persisted, Recovery, RecoveryBatch};
use tutti_wire::{NodeId, Request, Response};

#[derive(Debug)]
enum ManagerTimer {
    /// Advances the epoch (what a restarted manager or `tutti` operator would do).
    Epoch,
    /// The real manager gives up on a recovery after its call timeout; the nodes report
    /// the tids again.
    RecoveryTimeout(u64),
}

pub(crate) struct SimManager {
    state: ManagerState,
    dir: Rc<Directory>,
    epoch_interval_us: u64,
    recoveries: BTreeMap<u64, Recovery>,
    /// Request id → (recovery, node asked).
    asked: BTreeMap<u64, (u64, NodeId)>,
}

impl SimManager {
    pub(crate) fn new(dir: Rc<Directory>, epoch_interval_us: u64) -> SimManager {
        SimManager::with_state(
            dir,
            epoch_interval_us,
            ManagerState::new(Persisted::fresh(), 1),
        )
    }

    /// A manager that knows the nodes already (`tutti up` registers them before anything
    /// else happens): regions are allocated from their spaces.
    pub(crate) fn with_state(
        dir: Rc<Directory>,
        epoch_interval_us: u64,
        state: ManagerState,
    ) -> SimManager {
        SimManager {
            state,
            dir,
            epoch_interval_us,
            recoveries: BTreeMap::new(),
            asked: BTreeMap::new(),
        }
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
}

impl Process for SimManager {
    fn on_message(&mut self, ctx: &mut Ctx<'_>, from: Addr, msg: Box<dyn Message>) {
        match msg::open(msg) {
            Msg::Req {
                id,
                req:
                    Request::Heartbeat {
                        node,
                        uncertain,
                        applied,
                        applied_below,
                    },
            } => {
                let now_ms = ctx.now_us() / 1000;
                let (resp, batch) =
                    self.state
                        .heartbeat(now_ms, node, uncertain, applied, applied_below);
                ctx.send(from, Msg::Resp { id, resp });
                if let Some(batch) = batch {
                    self.start_recovery(ctx, batch);
                }
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
                    self.state.recovery_done(recovery.batch());
                }
            }
            // Regions and the sequencer's address, for the layers above the core.
            Msg::Req { id, req } => {
                if let Some((resp, _written)) = self.state.region_request(req) {
                    ctx.send(from, Msg::Resp { id, resp });
                }
            }
            _ => {}
        }
    }

    fn on_timer(&mut self, ctx: &mut Ctx<'_>, timer: Box<dyn Timer>) {
        let timer: Box<dyn Any> = timer;
        match *timer.downcast::<ManagerTimer>().expect("a manager timer") {
            ManagerTimer::Epoch => {
                if ctx.faults_on() {
                    // Not persisted: the simulated manager never crashes.
                    let _written = self.state.advance_epoch();
                    ctx.set_timer(self.epoch_interval_us, ManagerTimer::Epoch);
                }
            }
            ManagerTimer::RecoveryTimeout(rid) => {
                if let Some(r) = self.recoveries.remove(&rid) {
                    self.state.recovery_done(r.batch());
                }
            }
        }
    }

    fn on_crash(&mut self, _ctx: &mut Ctx<'_>, _power_loss: bool) {
        unreachable!("the simulated manager is not faulty");
    }

    fn on_restart(&mut self, ctx: &mut Ctx<'_>) {
        ctx.set_timer(self.epoch_interval_us, ManagerTimer::Epoch);
    }

    fn settled(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!("manager, {} recoveries running", self.recoveries.len())
    }
}
