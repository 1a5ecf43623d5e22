//! Deterministic simulation of a tutti cluster. One thread runs N memory nodes (the real
//! `Participant` and `Stage2` state machines), a manager (the real `ManagerState` and
//! `Recovery`) and M coordinators (the client's real `Coordinator`) over a simulated
//! network that drops, duplicates, delays and reorders messages and partitions nodes, and a
//! simulated disk that loses what was not synced when a node loses power. Time is simulated
//! and every choice comes from one seeded RNG, so a seed replays the same run exactly.
//!
//! Nothing here re-implements the protocol: it only moves messages and bytes between the
//! state machines and checks invariants against a reference (see `check`).

mod check;
mod coordinator;
mod node;

pub use check::Violation;

use coordinator::SimCoordinator;
use node::SimNode;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use tutti_manager::{ManagerState, Persisted, Recovery};
use tutti_wire::{NodeId, Request, Response};

/// Who sends and receives simulated messages.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum Endpoint {
    Node(NodeId),
    Coordinator(usize),
    Manager,
}

#[derive(Debug)]
enum Msg {
    Req { id: u64, req: Request },
    Resp { id: u64, resp: Response },
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: Endpoint,
        to: Endpoint,
        msg: Msg,
    },
    SyncDone {
        node: NodeId,
        incarnation: u64,
    },
    Checkpoint {
        node: NodeId,
        incarnation: u64,
    },
    Heartbeat {
        node: NodeId,
        incarnation: u64,
    },
    Stage2Retry {
        node: NodeId,
        incarnation: u64,
    },
    Crash,
    Restart {
        node: NodeId,
    },
    Partition,
    Cut {
        node: NodeId,
    },
    Restore {
        node: NodeId,
    },
    Heal,
    SlowDown,
    SpeedUp {
        node: NodeId,
    },
    EpochTick,
    RecoveryTimeout {
        recovery: u64,
    },
    CoordinatorTimer {
        coordinator: usize,
        op: u64,
    },
    CoordinatorRestart {
        coordinator: usize,
    },
    CoordinatorRetry {
        coordinator: usize,
        op: u64,
    },
    CoordinatorResume {
        coordinator: usize,
    },
}

/// Shape and faults of one simulated run. Times are in simulated microseconds.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub nodes: u16,
    pub coordinators: usize,
    pub ops_per_coordinator: usize,
    pub accounts_per_node: u64,
    pub drop_probability: f64,
    pub duplicate_probability: f64,
    pub delay_us: (u64, u64),
    /// Mean time between memory node crashes while faults are on.
    pub crash_interval_us: u64,
    pub partition_interval_us: u64,
    /// Mean time between slow-node episodes (one node's messages take 1–20 ms longer).
    pub slow_interval_us: u64,
    /// Probability that a coordinator dies between the phases of a multi-node minitransaction.
    pub coordinator_crash_probability: f64,
    /// Probability that a coordinator stalls after its first EXEC&PREPARE for longer than the
    /// uncertain timeout, so recovery runs concurrently with it (Sinfonia Fig. 9).
    pub slow_coordinator_probability: f64,
    /// Probability that an attempt first executes its items with `ExecuteAhead` (Sinfonia
    /// Fig. 17 Systems A and B: per item or per node, here all sent at once) and only then
    /// runs the commit protocol.
    pub execute_ahead_probability: f64,
    pub epoch_interval_us: u64,
    /// Faults stop here; the run must then finish within `liveness_bound_us`.
    pub faults_until_us: u64,
    pub liveness_bound_us: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            coordinators: 3,
            ops_per_coordinator: 20,
            accounts_per_node: 4,
            drop_probability: 0.02,
            duplicate_probability: 0.01,
            delay_us: (20, 2_000),
            crash_interval_us: 150_000,
            partition_interval_us: 300_000,
            slow_interval_us: 300_000,
            coordinator_crash_probability: 0.03,
            slow_coordinator_probability: 0.03,
            execute_ahead_probability: 0.2,
            epoch_interval_us: 400_000,
            faults_until_us: 1_500_000,
            liveness_bound_us: 30_000_000,
        }
    }
}

/// What one seed did.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    /// FNV-1a over every event processed: equal for equal runs.
    pub trace_hash: u64,
    pub events: u64,
    pub end_us: u64,
    pub committed: u64,
    pub aborted_compare: u64,
    pub unknown: u64,
    pub node_crashes: u64,
    pub coordinator_crashes: u64,
    /// `Decisions` messages that carried the outcomes of several tids (recovery batches).
    pub batched_decisions: u64,
    /// Commits that told the participants every participant's Prepare lsn.
    pub commits_with_lsns: u64,
    pub violations: Vec<Violation>,
}

/// Runs one seed to completion and checks it.
pub fn run(seed: u64, cfg: &SimConfig) -> Report {
    let mut world = World::new(seed, cfg.clone());
    world.run();
    let violations = check::final_state(&world);
    world.report(violations)
}

/// The command that replays a seed.
pub fn reproduce_command(seed: u64) -> String {
    format!("cargo run --release -p tutti -- sim --seeds 1 --from {seed}")
}

struct Manager {
    state: ManagerState,
    recoveries: BTreeMap<u64, Recovery>,
    /// Request id → (recovery, node asked).
    asked: BTreeMap<u64, (u64, NodeId)>,
}

pub(crate) struct World {
    cfg: SimConfig,
    /// Every choice of a run. ChaCha8 is specified (unlike `StdRng`, which rand may change
    /// between versions), so a recorded seed keeps replaying; `tests/seeds.rs` pins traces.
    rng: ChaCha8Rng,
    now_us: u64,
    queue: BTreeMap<(u64, u64), Event>,
    seq: u64,
    next_id: u64,
    trace: u64,
    events: u64,
    nodes: Vec<SimNode>,
    coordinators: Vec<SimCoordinator>,
    manager: Manager,
    /// Nodes cut off from everyone (a partition, or a swizzle in progress).
    cut: std::collections::BTreeSet<NodeId>,
    /// Nodes whose every message takes 1–20 ms longer.
    slow: std::collections::BTreeSet<NodeId>,
    /// `TUTTI_SIM_TRACE=1` prints every event (for debugging one seed).
    print_trace: bool,
    node_crashes: u64,
    coordinator_crashes: u64,
    batched_decisions: u64,
    commits_with_lsns: u64,
    seed: u64,
    /// Found by checks that run during the run (see `check::after_recovery`).
    violations: Vec<Violation>,
}

const FNV_PRIME: u64 = 0x100_0000_01b3;

impl World {
    fn new(seed: u64, cfg: SimConfig) -> World {
        let nodes = (1..=cfg.nodes).map(|id| SimNode::new(id, &cfg)).collect();
        let coordinators = (0..cfg.coordinators)
            .map(|i| SimCoordinator::new(i, &cfg))
            .collect();
        let mut world = World {
            rng: ChaCha8Rng::seed_from_u64(seed),
            now_us: 0,
            queue: BTreeMap::new(),
            seq: 0,
            next_id: 1,
            trace: 0xcbf2_9ce4_8422_2325,
            events: 0,
            nodes,
            coordinators,
            manager: Manager {
                state: ManagerState::new(Persisted::fresh(), 1),
                recoveries: BTreeMap::new(),
                asked: BTreeMap::new(),
            },
            cut: Default::default(),
            slow: Default::default(),
            print_trace: std::env::var_os("TUTTI_SIM_TRACE").is_some(),
            node_crashes: 0,
            coordinator_crashes: 0,
            batched_decisions: 0,
            commits_with_lsns: 0,
            seed,
            cfg,
            violations: Vec::new(),
        };
        for id in 1..=world.cfg.nodes {
            world.schedule_node_timers(id);
        }
        for i in 0..world.cfg.coordinators {
            coordinator::start_next(&mut world, i);
        }
        let (crash, partition, epoch) = (
            world.cfg.crash_interval_us,
            world.cfg.partition_interval_us,
            world.cfg.epoch_interval_us,
        );
        let first_crash = world.rng.gen_range(0..crash * 2);
        world.at(first_crash, Event::Crash);
        let first_partition = world.rng.gen_range(0..partition * 2);
        world.at(first_partition, Event::Partition);
        let first_slow = world.rng.gen_range(0..world.cfg.slow_interval_us * 2);
        world.at(first_slow, Event::SlowDown);
        world.at(epoch, Event::EpochTick);
        world
    }

    fn faults_on(&self) -> bool {
        self.now_us < self.cfg.faults_until_us
    }

    fn at(&mut self, delay_us: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((self.now_us + delay_us, self.seq), event);
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn mix(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.trace ^= u64::from(byte);
            self.trace = self.trace.wrapping_mul(FNV_PRIME);
        }
    }

    /// Sends `msg`, subject to the network's faults. EXEC&PREPARE and EXECUTE-AHEAD are
    /// never duplicated: TCP does not duplicate, and coordinators never resend one (they
    /// retry with a new tid). A participant counts the items executed ahead, so a duplicate
    /// would be counted twice.
    fn send(&mut self, from: Endpoint, to: Endpoint, msg: Msg) {
        let touches = |set: &std::collections::BTreeSet<NodeId>| {
            set.iter()
                .any(|&n| from == Endpoint::Node(n) || to == Endpoint::Node(n))
        };
        let (cut, slow) = (touches(&self.cut), touches(&self.slow));
        if cut || (self.faults_on() && self.rng.gen_bool(self.cfg.drop_probability)) {
            return;
        }
        let (lo, hi) = self.cfg.delay_us;
        let (lo, hi) = if slow {
            (lo + 1_000, hi + 20_000)
        } else {
            (lo, hi)
        };
        let duplicable = !matches!(
            msg,
            Msg::Req {
                req: Request::ExecPrepare(_) | Request::ExecuteAhead(_),
                ..
            }
        );
        if duplicable && self.faults_on() && self.rng.gen_bool(self.cfg.duplicate_probability) {
            let copy = match &msg {
                Msg::Req { id, req } => Msg::Req {
                    id: *id,
                    req: req.clone(),
                },
                Msg::Resp { id, resp } => Msg::Resp {
                    id: *id,
                    resp: resp.clone(),
                },
            };
            let delay = self.rng.gen_range(lo..=hi);
            self.at(
                delay,
                Event::Deliver {
                    from,
                    to,
                    msg: copy,
                },
            );
        }
        let delay = self.rng.gen_range(lo..=hi);
        self.at(delay, Event::Deliver { from, to, msg });
    }

    /// A request that expects no reply (message id 0), such as a DECISION.
    fn send_one_way(&mut self, from: Endpoint, to: Endpoint, req: Request) {
        if let Request::Decisions(d) = &req {
            self.batched_decisions += u64::from(d.len() > 1);
            self.commits_with_lsns += d.iter().filter(|d| !d.lsns.is_empty()).count() as u64;
        }
        self.send(from, to, Msg::Req { id: 0, req });
    }

    fn schedule_node_timers(&mut self, id: NodeId) {
        let incarnation = self.nodes[usize::from(id) - 1].incarnation;
        let jitter = self.rng.gen_range(0..20_000);
        self.at(
            20_000 + jitter,
            Event::Heartbeat {
                node: id,
                incarnation,
            },
        );
        let jitter = self.rng.gen_range(0..50_000);
        self.at(
            50_000 + jitter,
            Event::Checkpoint {
                node: id,
                incarnation,
            },
        );
    }

    fn finished(&self) -> bool {
        !self.faults_on()
            && self.coordinators.iter().all(|c| c.done())
            && self.nodes.iter().all(|n| n.quiet())
            && self.cut.is_empty()
    }

    fn run(&mut self) {
        let deadline = self.cfg.faults_until_us + self.cfg.liveness_bound_us;
        while let Some(((at, _), event)) = self.queue.pop_first() {
            self.now_us = at;
            if self.finished() || at > deadline {
                break;
            }
            self.events += 1;
            self.mix(at);
            if self.print_trace {
                eprintln!("{at:>10} {event:?}");
            }
            self.handle(event);
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { from, to, msg } => {
                self.mix(match &msg {
                    Msg::Req { id, .. } | Msg::Resp { id, .. } => *id,
                });
                match to {
                    Endpoint::Node(n) => node::deliver(self, n, from, msg),
                    Endpoint::Coordinator(c) => coordinator::deliver(self, c, from, msg),
                    Endpoint::Manager => self.manager_deliver(from, msg),
                }
            }
            Event::SyncDone { node, incarnation } => node::sync_done(self, node, incarnation),
            Event::Checkpoint { node, incarnation } => node::checkpoint(self, node, incarnation),
            Event::Heartbeat { node, incarnation } => node::heartbeat(self, node, incarnation),
            Event::Stage2Retry { node, incarnation } => node::stage2_retry(self, node, incarnation),
            Event::Crash => {
                if self.faults_on() {
                    let victim = self.rng.gen_range(1..=self.cfg.nodes);
                    let power_loss = self.rng.gen_bool(0.5);
                    self.mix(u64::from(victim));
                    node::crash(self, victim, power_loss);
                    self.node_crashes += 1;
                    let down = self.rng.gen_range(5_000..200_000);
                    self.at(down, Event::Restart { node: victim });
                    let next = self.rng.gen_range(0..self.cfg.crash_interval_us * 2);
                    self.at(next, Event::Crash);
                }
            }
            Event::Restart { node } => node::restart(self, node),
            Event::Partition => {
                if self.faults_on() {
                    self.partition();
                }
            }
            Event::Cut { node } => {
                self.cut.insert(node);
            }
            Event::Restore { node } => {
                self.cut.remove(&node);
            }
            Event::SlowDown => {
                if self.faults_on() {
                    let node = self.rng.gen_range(1..=self.cfg.nodes);
                    self.slow.insert(node);
                    let length = self.rng.gen_range(50_000..300_000);
                    self.at(length, Event::SpeedUp { node });
                    let next = self.rng.gen_range(0..self.cfg.slow_interval_us * 2);
                    self.at(next, Event::SlowDown);
                }
            }
            Event::SpeedUp { node } => {
                self.slow.remove(&node);
            }
            Event::Heal => {
                self.cut.clear();
                if self.faults_on() {
                    let next = self.rng.gen_range(0..self.cfg.partition_interval_us * 2);
                    self.at(next, Event::Partition);
                }
            }
            Event::EpochTick => {
                if self.faults_on() {
                    // The simulated manager never crashes: its snapshots need no disk.
                    let _written = self.manager.state.advance_epoch();
                    let next = self.cfg.epoch_interval_us;
                    self.at(next, Event::EpochTick);
                }
            }
            Event::RecoveryTimeout { recovery } => {
                // The real manager gives up after its call timeout; tids are reported again.
                if let Some(r) = self.manager.recoveries.remove(&recovery) {
                    self.manager.state.recovery_done(r.batch());
                }
            }
            Event::CoordinatorTimer { coordinator, op } => {
                coordinator::timer(self, coordinator, op)
            }
            Event::CoordinatorRestart { coordinator } => coordinator::restart(self, coordinator),
            Event::CoordinatorRetry { coordinator, op } => {
                coordinator::retry(self, coordinator, op)
            }
            Event::CoordinatorResume { coordinator } => coordinator::resume(self, coordinator),
        }
    }

    /// Either one node cut off for a while, or a swizzle (FoundationDB): a random subset of
    /// nodes cut off one by one, then restored one by one in another random order.
    fn partition(&mut self) {
        use rand::seq::SliceRandom;
        if self.rng.gen_bool(0.5) {
            let node = self.rng.gen_range(1..=self.cfg.nodes);
            self.cut.insert(node);
            let length = self.rng.gen_range(20_000..200_000);
            self.at(length, Event::Heal);
            return;
        }
        let mut nodes: Vec<NodeId> = (1..=self.cfg.nodes).collect();
        nodes.shuffle(&mut self.rng);
        nodes.truncate(self.rng.gen_range(1..=nodes.len()));
        let mut at = 0;
        for &node in &nodes {
            at += self.rng.gen_range(5_000..30_000);
            self.at(at, Event::Cut { node });
        }
        nodes.shuffle(&mut self.rng);
        for &node in &nodes {
            at += self.rng.gen_range(5_000..30_000);
            self.at(at, Event::Restore { node });
        }
        self.at(at + 1, Event::Heal);
    }

    fn manager_deliver(&mut self, from: Endpoint, msg: Msg) {
        match msg {
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
                let now_ms = self.now_us / 1000;
                let (resp, batch) =
                    self.manager
                        .state
                        .heartbeat(now_ms, node, uncertain, applied, applied_below);
                self.send(Endpoint::Manager, from, Msg::Resp { id, resp });
                if let Some(batch) = batch {
                    let (recovery, requests) = Recovery::start(batch);
                    let rid = self.new_id();
                    self.manager.recoveries.insert(rid, recovery);
                    for (q, req) in requests {
                        let id = self.new_id();
                        self.manager.asked.insert(id, (rid, q));
                        self.send(Endpoint::Manager, Endpoint::Node(q), Msg::Req { id, req });
                    }
                    self.at(500_000, Event::RecoveryTimeout { recovery: rid });
                }
            }
            Msg::Resp {
                id,
                resp: Response::Votes(votes),
            } => {
                let Some((rid, q)) = self.manager.asked.remove(&id) else {
                    return;
                };
                let Some(recovery) = self.manager.recoveries.get_mut(&rid) else {
                    return;
                };
                if let Some(decisions) = recovery.on_votes(q, &votes) {
                    let recovery = self.manager.recoveries.remove(&rid).expect("present");
                    for (q, decision) in decisions {
                        self.send_one_way(Endpoint::Manager, Endpoint::Node(q), decision);
                    }
                    self.manager.state.recovery_done(recovery.batch());
                }
            }
            _ => {}
        }
    }

    fn report(self, violations: Vec<Violation>) -> Report {
        let (mut committed, mut aborted_compare, mut unknown) = (0, 0, 0);
        for c in &self.coordinators {
            for outcome in c.outcomes() {
                match outcome {
                    coordinator::OpOutcome::Committed => committed += 1,
                    coordinator::OpOutcome::AbortedCompare => aborted_compare += 1,
                    coordinator::OpOutcome::Unknown => unknown += 1,
                }
            }
        }
        Report {
            seed: self.seed,
            trace_hash: self.trace,
            events: self.events,
            end_us: self.now_us,
            committed,
            aborted_compare,
            unknown,
            node_crashes: self.node_crashes,
            coordinator_crashes: self.coordinator_crashes,
            batched_decisions: self.batched_decisions,
            commits_with_lsns: self.commits_with_lsns,
            violations,
        }
    }
}
