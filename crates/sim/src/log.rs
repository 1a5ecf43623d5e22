//! A simulated run of the shared log: memory nodes and the manager as they are, the
//! sequencer (crashing and restarting) and log clients (appenders on random streams, one
//! reader per stream), then the checks: every acknowledged append is at its position, no two
//! appends share one, and each reader's stream held exactly the stream's appends, in log
//! order, once each.

use crate::log_client::{LogHistory, Role, SimLogClient, STREAMS};
use crate::manager::SimManager;
use crate::msg::Directory;
use crate::node::SimNode;
use crate::sequencer::SimSequencer;
use crate::world::{Addr, Faults, World};
use crate::Report;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;
use tutti_log::layout::word;
use tutti_log::minitxs::Words;
use tutti_log::{Content, Entry, LogLayout};
use tutti_manager::{ManagerState, Persisted};
use tutti_wire::{Request, Response};
use tutti_workload::log::Held;
use tutti_workload::Violation;

const LOG: &str = "sim-log";
const SPACE_BYTES: u64 = 64 << 10;
const SLOT_BYTES: u32 = 256;
const SLOTS_PER_NODE: u64 = 96;

#[derive(Clone, Debug)]
pub struct LogSimConfig {
    pub nodes: u16,
    pub appenders: usize,
    pub appends_per_appender: usize,
    /// Appends an appender keeps under way at once, at most (each incarnation draws how
    /// many from 1 up): their writes to one node go out batched.
    pub appends_in_flight_max: usize,
    pub backpointers: u8,
    /// Positions per reservation: small, so that reservations are frequent.
    pub lease: u64,
    /// Sequencer processes: each restart of one replaces the one named before, and clients
    /// ask any of them.
    pub sequencers: u64,
    /// Managers: a Raft group that crashes like the nodes if more than one.
    pub managers: u32,
    /// A client that trims the log below every reader, so that appends go round the slots.
    pub trimmer: bool,
    pub hole_timeout_us: u64,
    pub faults: Faults,
}

impl Default for LogSimConfig {
    fn default() -> Self {
        LogSimConfig {
            nodes: 3,
            appenders: 3,
            appends_per_appender: 12,
            appends_in_flight_max: 8,
            backpointers: 2,
            lease: 8,
            sequencers: 2,
            managers: 3,
            trimmer: true,
            hole_timeout_us: 20_000,
            faults: crate::SimConfig::default().faults,
        }
    }
}

/// The memory nodes (a log's region allocated over them all), `managers` managers (a group
/// crashing like the nodes if more than one) and `sequencers` sequencer processes (each restart of one replaces the one named before) of a run of a
/// layer over the log: where they are, the log's layout, the sequencers' addresses.
pub(crate) fn spawn_log_cluster(
    world: &mut World,
    shape: &LogShape<'_>,
    lease: u64,
    sequencers: u64,
    managers: u32,
) -> (Rc<Directory>, LogLayout, Vec<Addr>) {
    let dir = Rc::new(Directory::new(
        (0..u32::from(shape.nodes)).map(Addr).collect(),
        (0..managers)
            .map(|i| Addr(u32::from(shape.nodes) + i))
            .collect(),
    ));
    let (state, layout, images) = allocate(shape);
    let no_check = Rc::new(|_: u16, _: &tutti_workload::ReadNode<'_>| Vec::new());
    for (id, image) in (1..=shape.nodes).zip(images) {
        let node = SimNode::new(id, image, dir.clone(), no_check.clone());
        assert_eq!(world.spawn(Box::new(node), true), dir.node(id));
    }
    for (id, &addr) in (1..).zip(&dir.managers) {
        let manager = SimManager::new(id, dir.clone(), 400_000, state.persisted().clone());
        assert_eq!(world.spawn(Box::new(manager), managers > 1), addr);
    }
    let sequencers = (0..sequencers.max(1))
        .map(|i| {
            let sequencer = SimSequencer::new(i, shape.name, lease, dir.clone());
            world.spawn(Box::new(sequencer), true)
        })
        .collect();
    (dir, layout, sequencers)
}

/// A simulated log's shape.
pub(crate) struct LogShape<'a> {
    pub(crate) name: &'a str,
    pub(crate) nodes: u16,
    pub(crate) space_bytes: u64,
    pub(crate) slot_bytes: u32,
    pub(crate) slots_per_node: u64,
    pub(crate) backpointers: u8,
}

/// The manager with `shape.nodes` nodes registered and the log's region allocated over
/// them all, and the log's layout; the region's headers go into the nodes' images.
pub(crate) fn allocate(shape: &LogShape<'_>) -> (ManagerState, LogLayout, Vec<Vec<u8>>) {
    let mut state = ManagerState::new(Persisted::fresh(), 1);
    for id in 1..=shape.nodes {
        let _ = state.register(
            0,
            id,
            format!("sim-node-{id}"),
            shape.space_bytes,
            true,
            false,
            None,
        );
    }
    let mut layout = LogLayout {
        nodes: vec![],
        slot_bytes: shape.slot_bytes,
        slots_per_node: shape.slots_per_node,
        backpointers: shape.backpointers,
    };
    let create = Request::CreateRegion {
        name: shape.name.into(),
        kind: tutti_log::REGION_KIND.into(),
        nodes: (1..=shape.nodes).collect(),
        bytes_per_node: layout.region_bytes(),
        params: layout.layout_word(),
    };
    let Some((Response::Region(region), _)) = state.region_request(create) else {
        panic!("the simulated log's region is allocated");
    };
    layout.nodes = region.nodes;
    let mut images = vec![vec![0u8; shape.space_bytes as usize]; usize::from(shape.nodes)];
    for (node, item) in tutti_log::minitxs::create(&layout).items() {
        if let tutti_wire::Item::Write { addr, bytes } = item {
            let at = *addr as usize;
            images[usize::from(*node) - 1][at..at + bytes.len()].copy_from_slice(bytes);
        }
    }
    (state, layout, images)
}

pub fn run(seed: u64, cfg: &LogSimConfig) -> Report {
    let mut world = World::new(seed, cfg.faults.clone());
    let shape = LogShape {
        name: LOG,
        nodes: cfg.nodes,
        space_bytes: SPACE_BYTES,
        slot_bytes: SLOT_BYTES,
        slots_per_node: SLOTS_PER_NODE,
        backpointers: cfg.backpointers,
    };
    let (dir, layout, sequencers) =
        spawn_log_cluster(&mut world, &shape, cfg.lease, cfg.sequencers, cfg.managers);
    let history = Rc::new(RefCell::new(LogHistory {
        appenders: cfg.appenders,
        ..LogHistory::default()
    }));
    let roles = (0..cfg.appenders)
        .map(|_| Role::Appender {
            appends: cfg.appends_per_appender,
            in_flight_max: cfg.appends_in_flight_max,
        })
        .chain(STREAMS.iter().map(|&stream| Role::Reader { stream }))
        .chain(cfg.trimmer.then_some(Role::Trimmer));
    for (i, role) in roles.enumerate() {
        let client = SimLogClient::new(
            i as u64,
            role,
            LOG,
            layout.clone(),
            Duration::from_micros(cfg.hole_timeout_us),
            dir.clone(),
            sequencers.clone(),
            history.clone(),
        );
        world.spawn(Box::new(client), true);
    }
    let mut violations = crate::run_to_the_end(&mut world, &cfg.faults);
    let mut h = history.borrow_mut();
    violations.extend(h.broken.iter().cloned());
    violations.extend(check_words(&world, &dir, &layout));
    if world.settled() {
        violations.extend(crate::check_managers(&world, &dir));
        let trim = (layout.nodes.iter())
            .filter_map(|&(node, base)| {
                let space = world.process::<SimNode>(dir.node(node)).space()?;
                Some(Words::parse(space.read(base, word::LAYOUT)).trim)
            })
            .max()
            .unwrap_or_default();
        let held = |p: u64| -> Held {
            if p < trim {
                return Held::Trimmed;
            }
            let s = layout.slot(p);
            let Some(space) = world.process::<SimNode>(dir.node(s.node)).space() else {
                return Held::Empty;
            };
            let bytes = space.read(s.addr, u64::from(layout.slot_bytes));
            match Entry::decode(p, bytes, layout.backpointers, layout.slot_bytes) {
                Ok(Some(Entry {
                    content: Content::Data { streams, payload },
                    ..
                })) => Held::Data {
                    streams: streams.into_iter().map(|s| s.stream).collect(),
                    payload,
                },
                Ok(Some(_)) => Held::Junk,
                Ok(None) | Err(_) => Held::Empty,
            }
        };
        h.log.readings = h.reading.values().cloned().collect();
        violations.extend(h.log.check_appends(held));
        violations.extend(h.log.check_readings());
    }
    Report {
        seed,
        trace_hash: world.trace_hash(),
        events: world.events(),
        end_us: world.now_us(),
        committed: h.log.acked.len() as u64,
        aborted_compare: 0,
        unknown: h.log.unknown.len() as u64,
        node_crashes: world.counter("crashes"),
        coordinator_crashes: 0,
        batched_decisions: world.counter("batched_decisions"),
        batched_writes: world.counter("batched_writes"),
        incremental_images: 0,
        manager_elections: world.counter("manager_elections"),
        commits_with_lsns: world.counter("commits_with_lsns"),
        fail_overs: 0,
        mirror_joins: 0,
        formers_named_again: 0,
        dropped_mirrors_named: 0,
        answered_on_trust: 0,
        members_revoked: 0,
        callbacks_retaken: 0,
        nodes_lost: 0,
        disks_lost: 0,
        violations,
    }
}

/// The log's control words change on all its nodes at once (a seal, a reservation, a
/// trim is one minitransaction over them all), so at the end every node that is up holds
/// the same: a node left at an older epoch would still take writes the seal fenced.
fn check_words(world: &World, dir: &Directory, layout: &LogLayout) -> Vec<Violation> {
    let words: Vec<(u16, Words)> = (layout.nodes.iter())
        .filter_map(|&(node, base)| {
            let space = world.process::<SimNode>(dir.node(node)).space()?;
            Some((node, Words::parse(space.read(base, word::LAYOUT))))
        })
        .collect();
    let Some((first, agreed)) = words.first() else {
        return vec![];
    };
    (words.iter())
        .filter(|(_, w)| w != agreed)
        .map(|(node, w)| {
            let why = format!("node {node} holds {w:?}, node {first} {agreed:?}");
            Violation::new("control words", why)
        })
        .collect()
}
