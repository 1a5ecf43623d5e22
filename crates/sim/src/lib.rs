//! Deterministic simulation of a tutti cluster. One thread runs N memory nodes (the real
//! `Participant` and `Stage2` state machines), a manager (the real `ManagerState` and
//! `Recovery`) and M clients (the client's real `Coordinator`, running the bank workload
//! that `tutti chaos` also runs) as processes of a simulated world (`world`): a network
//! that drops, duplicates, delays and reorders messages and partitions nodes, and a
//! simulated disk that loses what was not synced when a node loses power. Time is simulated
//! and every choice comes from one seeded generator, so a seed replays the same run exactly.
//!
//! Nothing here re-implements the protocol: the processes only move messages and bytes
//! between the state machines, and the workload checks the result against its model.

mod backup;
mod client;
mod coordinators;
pub mod fs;
pub mod log;
mod log_client;
mod log_io;
mod manager;
mod msg;
mod node;
mod sequencer;
pub mod tango;
mod tango_client;
pub mod world;

pub use tutti_workload::Violation;

use backup::SimBackup;
use client::{ClientConfig, SimClient};
use manager::SimManager;
use msg::Directory;
use node::SimNode;
use std::cell::RefCell;
use std::rc::Rc;
use tutti_wire::{Item, NodeId, Placement};
use tutti_workload::{Bank, Workload};
use world::{Addr, Faults, World};

/// Bytes of each simulated node's space.
const SPACE_BYTES: u64 = 8192;

/// Shape and faults of one simulated run. Times are in simulated microseconds.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub nodes: u16,
    pub coordinators: usize,
    pub ops_per_coordinator: usize,
    pub accounts_per_node: u64,
    /// The network's and the memory nodes' faults (the world injects them).
    pub faults: Faults,
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
    /// Consistent backups taken while the bank runs (Sinfonia §4.8), each checked as a cut.
    pub backups: usize,
    /// Managers: a Raft group that crashes like the nodes if more than one.
    pub managers: u32,
    /// `log-repl`: each node a primary and a mirror, two processes that crash, are cut
    /// off and fail over (docs/replication.md).
    pub replicated: bool,
    /// With `replicated`, `ram-repl`: both copies in RAM, so every crash loses the
    /// process's copy; the fault schedule never crashes the only copy holding a node.
    pub in_ram: bool,
    /// With `replicated` and not `in_ram`: the share of the crashes of a node process that
    /// also take its disk, where the node keeps a copy the managers reach without it (0:
    /// none).
    pub disk_loss_probability: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            coordinators: 3,
            ops_per_coordinator: 20,
            accounts_per_node: 4,
            faults: Faults {
                drop_probability: 0.02,
                duplicate_probability: 0.01,
                delay_us: (20, 2_000),
                crash_interval_us: 150_000,
                partition_interval_us: 300_000,
                slow_interval_us: 300_000,
                faults_until_us: 1_500_000,
                liveness_bound_us: 30_000_000,
            },
            coordinator_crash_probability: 0.03,
            slow_coordinator_probability: 0.03,
            execute_ahead_probability: 0.2,
            epoch_interval_us: 400_000,
            backups: 2,
            managers: 3,
            replicated: false,
            in_ram: false,
            disk_loss_probability: DISK_LOSS_PROBABILITY,
        }
    }
}

impl SimConfig {
    /// A client running `ops` operations with this configuration's client faults.
    pub(crate) fn client_config(&self, ops: usize) -> ClientConfig {
        ClientConfig {
            ops,
            crash_probability: self.coordinator_crash_probability,
            stall_probability: self.slow_coordinator_probability,
            execute_ahead_probability: self.execute_ahead_probability,
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
    /// The log: minitransactions that wrote several appends' positions at once.
    pub batched_writes: u64,
    /// Node images that backups took incrementally (the pages written since the last one).
    pub incremental_images: u64,
    /// Times a manager came to lead its group (the first election included).
    pub manager_elections: u64,
    /// `log-repl`: nodes whose mirror served them at the end.
    pub fail_overs: u64,
    /// `log-repl`: mirrors that joined a primary running without one (re-replication).
    pub mirror_joins: u64,
    /// `ram-repl`, and `log-repl` with its lost disks: nodes both of whose copies were
    /// lost by the end.
    pub nodes_lost: u64,
    /// `log-repl`: crashes that also took the process's disk.
    pub disks_lost: u64,
    /// `ram-repl`: replaced primaries named primary again, holding the copy they kept (the
    /// copy that replaced them died before it registered).
    pub formers_named_again: u64,
    /// Mirrors the placement left out (dropped, or named and replaced before they heard)
    /// named primary, holding the copy they kept (the copy serving in their place fell
    /// silent before it registered).
    pub dropped_mirrors_named: u64,
    /// `fs`: steps the clients answered on trust, without a minitransaction (each checked
    /// against the memory nodes at that instant).
    pub answered_on_trust: u64,
    /// `fs`: clients a writer revoked, and callbacks revoked clients took back.
    pub members_revoked: u64,
    pub callbacks_retaken: u64,
    pub violations: Vec<Violation>,
}

/// Runs one seed to completion and checks it.
pub fn run(seed: u64, cfg: &SimConfig) -> Report {
    let accounts = cfg.accounts_per_node * u64::from(cfg.nodes);
    let bank = Bank::new(accounts, cfg.nodes, cfg.coordinators as u64)
        .initial_balance(300)
        .audits(0.15)
        .receipts(cfg.ops_per_coordinator as u64);
    assert!(
        bank.bytes_per_node() <= SPACE_BYTES,
        "the bank fits the spaces"
    );
    let mut world = World::new(seed, cfg.faults.clone());
    let images = initial_images(&bank, cfg.nodes, SPACE_BYTES);
    let bank = Rc::new(RefCell::new(bank));
    let client_cfg = cfg.client_config(cfg.ops_per_coordinator);
    let servers = Servers {
        managers: cfg.managers,
        epoch_interval_us: cfg.epoch_interval_us,
        replicated: cfg.replicated,
        in_ram: cfg.in_ram,
        disk_loss_probability: cfg.disk_loss_probability,
    };
    let dir = spawn_cluster(
        &mut world,
        images,
        &servers,
        &bank,
        cfg.coordinators,
        &client_cfg,
    );
    let cuts = Rc::new(RefCell::new(Vec::new()));
    let backup = SimBackup::new(
        dir.clone(),
        bank.clone(),
        SPACE_BYTES,
        cfg.backups,
        cfg.faults.faults_until_us,
        cuts.clone(),
    );
    world.spawn(Box::new(backup), false);
    let mut violations = run_to_the_end(&mut world, &cfg.faults);
    let bank = bank.borrow();
    if world.settled() {
        violations.extend(bank.check(&snapshot(&world, &dir, &bank)));
        violations.extend(check_managers(&world, &dir));
        violations.extend(check_mirrors(&world, &dir));
    }
    for (i, cut) in cuts.borrow().iter().enumerate() {
        let reads = read_items(&bank.snapshot(), |node, addr, len| {
            let image = &cut.images[usize::from(node) - 1];
            image[addr as usize..(addr + len) as usize].to_vec()
        });
        let broken = bank.check_cut(&cut.before, &reads).into_iter();
        violations
            .extend(broken.map(|v| Violation::new(v.kind, format!("backup {i}: {}", v.detail))));
    }
    let (committed, aborted_compare, unknown) = bank.outcomes();
    Report {
        seed,
        trace_hash: world.trace_hash(),
        events: world.events(),
        end_us: world.now_us(),
        committed,
        aborted_compare,
        unknown,
        node_crashes: world.counter("crashes"),
        coordinator_crashes: world.counter("coordinator_crashes"),
        batched_decisions: world.counter("batched_decisions"),
        batched_writes: 0,
        incremental_images: world.counter("incremental_images"),
        manager_elections: world.counter("manager_elections"),
        commits_with_lsns: world.counter("commits_with_lsns"),
        fail_overs: fail_overs(&dir),
        mirror_joins: world.counter("mirror_joins"),
        formers_named_again: world.counter("formers_named_again"),
        dropped_mirrors_named: world.counter("dropped_mirrors_named"),
        answered_on_trust: 0,
        members_revoked: 0,
        callbacks_retaken: 0,
        nodes_lost: match cfg.replicated {
            true => nodes_lost(&world, &dir),
            false => 0,
        },
        disks_lost: world.counter("disks_lost"),
        violations,
    }
}

/// Nodes neither of whose processes holds a copy at the end (both lost).
fn nodes_lost(world: &World, dir: &Directory) -> u64 {
    let holds = |a: Addr| world.is_up(a) && world.process::<SimNode>(a).holds_copy();
    (1..=dir.nodes_len() as NodeId)
        .filter(|&id| !holds(first_primary(id)) && !holds(first_mirror(dir, id)))
        .count() as u64
}

/// Where node `id`'s first primary runs: the nodes come first.
fn first_primary(id: NodeId) -> Addr {
    Addr(u32::from(id) - 1)
}

/// Where a replicated node `id`'s first mirror runs: after the nodes and the managers.
fn first_mirror(dir: &Directory, id: NodeId) -> Addr {
    Addr((dir.nodes_len() + dir.managers.len()) as u32 + u32::from(id) - 1)
}

/// Nodes served by another process than their first primary at the end.
fn fail_overs(dir: &Directory) -> u64 {
    (1..=dir.nodes_len() as NodeId)
        .filter(|&id| dir.node(id) != first_primary(id))
        .count() as u64
}

/// Once quiet, a replicated primary whose mirror holds every record it shipped has the
/// same image as the mirror.
pub(crate) fn check_mirrors(world: &World, dir: &Directory) -> Vec<Violation> {
    let mut violations = Vec::new();
    for id in 1..=dir.nodes_len() as NodeId {
        let primary = world.process::<SimNode>(dir.node(id));
        let Some(mirror) = primary.mirrored().and_then(crate::msg::addr_named) else {
            continue;
        };
        let (Some(p), Some(m)) = (
            primary.space(),
            world.process::<SimNode>(mirror).mirror_space(),
        ) else {
            continue;
        };
        let bytes = p.size_bytes();
        let (p, m) = (p.read(0, bytes), m.read(0, bytes));
        if let Some(at) = (0..p.len()).find(|&i| p[i] != m[i]) {
            let detail = format!(
                "node {id}: the mirror's image differs from the primary's at byte {at} ({} vs {})",
                m[at], p[at]
            );
            violations.push(Violation::new("mirror diverged", detail));
        }
    }
    violations
}

/// The server side of a simulated cluster, besides its memory nodes.
pub(crate) struct Servers {
    /// Managers: a Raft group, crashing like the nodes if more than one.
    pub(crate) managers: u32,
    pub(crate) epoch_interval_us: u64,
    /// `log-repl`: each node a primary and a mirror.
    pub(crate) replicated: bool,
    /// `ram-repl` (with `replicated`).
    pub(crate) in_ram: bool,
    /// `log-repl` (`replicated`, not `in_ram`): the share of crashes that take a node
    /// process's disk.
    pub(crate) disk_loss_probability: f64,
}

/// Spawns memory nodes holding `images` (node i + 1 the i-th), the `servers`, and
/// `clients` clients running `workload`; returns the cluster's directory.
pub(crate) fn spawn_cluster<W: Workload + 'static>(
    world: &mut World,
    images: Vec<Vec<u8>>,
    servers: &Servers,
    workload: &Rc<RefCell<W>>,
    clients: usize,
    client_cfg: &ClientConfig,
) -> Rc<Directory> {
    let Servers {
        managers,
        epoch_interval_us,
        replicated,
        in_ram,
        disk_loss_probability,
    } = *servers;
    let nodes = images.len() as u32;
    let dir = Rc::new(Directory::new(
        (0..nodes).map(Addr).collect(),
        (nodes..nodes + managers).map(Addr).collect(),
    ));
    // Mirrors come after the managers; the group starts with every node's placement, as
    // the primaries' first registrations make it.
    let mirror_of = |id: NodeId| first_mirror(&dir, id);
    let mut initial = tutti_manager::ManagerState::new(tutti_manager::Persisted::fresh(), 0);
    if replicated {
        for id in 1..=nodes as NodeId {
            let _ = initial.register(
                0,
                id,
                crate::msg::name_of(dir.node(id)),
                images[0].len() as u64,
                true,
                false,
                Some(crate::msg::name_of(mirror_of(id))),
            );
        }
    }
    let initial = initial.persisted().clone();
    let mirror_images = images.clone();
    let check = {
        let workload = workload.clone();
        Rc::new(move |node: NodeId, read: &tutti_workload::ReadNode<'_>| {
            workload.borrow().check_node(node, read)
        })
    };
    for (id, image) in (1..).zip(images) {
        let node = match replicated {
            true => SimNode::primary(
                id,
                dir.node(id),
                mirror_of(id),
                image,
                dir.clone(),
                check.clone(),
            )
            .in_ram(in_ram),
            false => SimNode::new(id, image, dir.clone(), check.clone()),
        };
        assert_eq!(world.spawn(Box::new(node), true), dir.node(id));
    }
    for (id, &addr) in (1..).zip(&dir.managers) {
        let manager = SimManager::new(id, dir.clone(), epoch_interval_us, initial.clone());
        assert_eq!(world.spawn(Box::new(manager), managers > 1), addr);
    }
    if replicated {
        for (id, image) in (1..).zip(mirror_images) {
            let mirror = SimNode::mirror(id, image, dir.clone(), check.clone()).in_ram(in_ram);
            assert_eq!(world.spawn(Box::new(mirror), true), mirror_of(id));
        }
    }
    if replicated && in_ram {
        world.guard_faults(copies_guard(dir.clone()));
    }
    if replicated && !in_ram && disk_loss_probability > 0.0 {
        world.lose_disks(disk_loss_probability, disks_guard(dir.clone()));
    }
    for c in 0..clients {
        let client = SimClient::new(c as u64, client_cfg.clone(), workload.clone(), dir.clone());
        world.spawn(Box::new(client), false);
    }
    dir
}

/// `log-repl`: the share of a node process's crashes that also take its disk, by default.
const DISK_LOSS_PROBABILITY: f64 = 0.2;

/// `log-repl` survives a lost disk as `ram-repl` survives a crash (`copies_guard`): only a
/// node process may lose its disk (the managers' and the sequencer's are beyond the mode),
/// and only while the node keeps a copy the managers can reach without it.
fn disks_guard(dir: Rc<Directory>) -> crate::world::FaultGuard {
    let copies = copies_guard(dir.clone());
    Rc::new(move |world: &World, victim: Addr| {
        node_of(&dir, victim).is_some() && copies(world, victim)
    })
}

/// The node `process` is one of the two processes of (its first primary's or its first
/// mirror's; the directory says which serves now).
fn node_of(dir: &Directory, process: Addr) -> Option<NodeId> {
    (1..=dir.nodes_len() as NodeId)
        .find(|&id| first_primary(id) == process || first_mirror(dir, id) == process)
}

/// `ram-repl` survives the loss of one copy while the managers see the other: a node
/// process may crash, or be cut off, only if the node keeps a copy the managers can reach
/// without it. Either it is named in none of the placements the managers that are up hold
/// (committed or not: a majority of them is up, so the committed one is among them) and
/// holds no copy the other lacks (a replaced primary that kept its copy), or the other
/// process is named in each of them too and holds its copy (up, serving or mirroring, not
/// cut off, not found behind by its primary). A copy lost while the other is
/// cut off from the managers is beyond the mode (docs/replication.md, "`ram-repl`").
fn copies_guard(dir: Rc<Directory>) -> crate::world::FaultGuard {
    Rc::new(move |world: &World, victim: Addr| {
        let Some(id) = node_of(&dir, victim) else {
            return true;
        };
        let other = if first_primary(id) == victim {
            first_mirror(&dir, id)
        } else {
            first_primary(id)
        };
        let (victim_name, other_name) = (crate::msg::name_of(victim), crate::msg::name_of(other));
        let named =
            |p: &Placement, name: &str| p.primary == name || p.mirror.as_deref() == Some(name);
        let other_holds = world.is_up(other)
            && !world.is_cut(other)
            && world.process::<SimNode>(other).holds_copy();
        let states: Vec<_> = (dir.managers.iter())
            .filter_map(|&m| world.process::<SimManager>(m).latest())
            .collect();
        // A mirror its primary has found behind for long may be dropped any moment, on a
        // report sent before the crash: the primary is then the only copy.
        let now_ms = world.now_us() / 1000;
        let behind_ms = (world.process::<SimNode>(victim).mirror_behind_ms(now_ms))
            .max(world.process::<SimNode>(other).mirror_behind_ms(now_ms));
        // A replaced primary holding the copy it kept is named nowhere, and may be the
        // node's only copy (the one that replaced it died before serving).
        let former_alone = world.process::<SimNode>(victim).is_former() && !other_holds;
        !former_alone
            && states.len() > dir.managers.len() / 2
            && behind_ms < crate::manager::FAILOVER_TIMEOUT_MS / 2
            && (states.iter())
                .filter_map(|state| state.placement(id))
                .all(|p| !named(&p, &victim_name) || (named(&p, &other_name) && other_holds))
    })
}

/// The manager group once settled: a majority holds one state (the group's), and no node
/// heard of an epoch the group does not have, since a manager acknowledges an epoch only
/// once a majority holds it.
pub(crate) fn check_managers(world: &World, dir: &Directory) -> Vec<Violation> {
    let states: Vec<Option<&tutti_manager::Persisted>> = (dir.managers.iter())
        .map(|&a| world.process::<SimManager>(a).latest())
        .collect();
    let majority = states.len() / 2 + 1;
    let agreed = (states.iter().flatten())
        .find(|s| states.iter().flatten().filter(|t| t == s).count() >= majority);
    let Some(group) = agreed else {
        let detail = format!("no majority of the managers holds one state: {states:?}");
        return vec![Violation::new("managers", detail)];
    };
    let mut violations = Vec::new();
    for id in 1..=dir.nodes_len() as NodeId {
        let addr = dir.node(id);
        let epoch = world.process::<SimNode>(addr).epoch().unwrap_or(0);
        if epoch > group.epoch() {
            let detail = format!(
                "node {id} was told of epoch {epoch}, the manager group holds {}",
                group.epoch()
            );
            violations.push(Violation::new("lost acknowledgement", detail));
        }
    }
    violations
}

/// Starts every process, runs the world until it settles or the liveness bound passes, and
/// returns the violations found on the way, with a liveness one if it did not settle.
pub(crate) fn run_to_the_end(world: &mut World, faults: &Faults) -> Vec<Violation> {
    for i in 0..world.next_addr().0 {
        world.start(Addr(i));
    }
    world.run();
    let mut violations = world.violations().to_vec();
    if !world.settled() {
        let detail = format!(
            "not settled {} µs after faults stopped: {}",
            world.now_us().saturating_sub(faults.faults_until_us),
            world.unsettled().join("; ")
        );
        violations.push(Violation::new("liveness", detail));
    }
    violations
}

/// Each node's image (`space_bytes`) before anything ran: the workload's set-up written in.
pub(crate) fn initial_images<W: Workload>(
    workload: &W,
    nodes: NodeId,
    space_bytes: u64,
) -> Vec<Vec<u8>> {
    let mut images = vec![vec![0; space_bytes as usize]; usize::from(nodes)];
    for (node, item) in workload.setup().items() {
        if let Item::Write { addr, bytes } = item {
            let at = *addr as usize;
            images[usize::from(*node) - 1][at..at + bytes.len()].copy_from_slice(bytes);
        }
    }
    images
}

/// The reads of the workload's snapshot, straight from the settled nodes' spaces.
fn snapshot(world: &World, dir: &Directory, bank: &Bank) -> Vec<Vec<u8>> {
    read_items(&bank.snapshot(), |node, addr, len| {
        let space = world.process::<SimNode>(dir.node(node)).space();
        space
            .expect("settled nodes are up")
            .read(addr, len)
            .to_vec()
    })
}

/// The reads of `tx` (read items only), each from `read(node, addr, len)`.
fn read_items(
    tx: &tutti_client::Minitx,
    read: impl Fn(NodeId, u64, u64) -> Vec<u8>,
) -> Vec<Vec<u8>> {
    (tx.items().iter())
        .map(|(node, item)| {
            let Item::Read { addr, len } = item else {
                unreachable!("a snapshot only reads")
            };
            read(*node, *addr, u64::from(*len))
        })
        .collect()
}

/// The command that replays a seed of `workload` (`bank`, `log`, `tango`).
pub fn reproduce_command(seed: u64, workload: &str) -> String {
    format!("cargo run --release -p tutti -- sim --seeds 1 --from {seed} --workload {workload}")
}
