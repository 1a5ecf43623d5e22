//! A simulated run of tutti-fs: memory nodes and the manager as in the bank's runs; clients
//! running the file system's workload (the real `ops`, each step one minitransaction through
//! the client's `Coordinator`), under the same faults. Then the checks: every invariant fsck
//! checks on the settled images, and each client's own directory against its model.

use crate::client::{ClientConfig, SimClient};
use crate::manager::SimManager;
use crate::msg::Directory;
use crate::node::SimNode;
use crate::world::{Addr, Faults, World};
use crate::Report;
use std::cell::RefCell;
use std::rc::Rc;
use tutti_wire::{Item, NodeId};
use tutti_workload::fs::{FsWorkload, BYTES_PER_NODE};
use tutti_workload::Workload;

#[derive(Clone, Debug)]
pub struct FsSimConfig {
    pub nodes: u16,
    pub clients: usize,
    pub ops_per_client: usize,
    pub faults: Faults,
}

impl Default for FsSimConfig {
    fn default() -> Self {
        FsSimConfig {
            nodes: 3,
            clients: 3,
            ops_per_client: 30,
            faults: crate::SimConfig::default().faults,
        }
    }
}

pub fn run(seed: u64, cfg: &FsSimConfig) -> Report {
    let base = crate::SimConfig::default();
    let mut world = World::new(seed, cfg.faults.clone());
    let dir = Rc::new(Directory {
        nodes: (0..u32::from(cfg.nodes)).map(Addr).collect(),
        manager: Addr(u32::from(cfg.nodes)),
    });
    let fs = FsWorkload::new(cfg.nodes, cfg.clients as u64);
    let images = initial_images(&fs, cfg.nodes);
    let fs = Rc::new(RefCell::new(fs));
    let check = Rc::new(|_: NodeId, _: &dyn Fn(u64, u32) -> Vec<u8>| vec![]);
    for (id, image) in (1..=cfg.nodes).zip(images) {
        let node = SimNode::new(id, image, dir.clone(), check.clone());
        assert_eq!(world.spawn(Box::new(node), true), dir.node(id));
    }
    let manager = SimManager::new(dir.clone(), base.epoch_interval_us);
    assert_eq!(world.spawn(Box::new(manager), false), dir.manager);
    let client_cfg = ClientConfig {
        ops: cfg.ops_per_client,
        crash_probability: base.coordinator_crash_probability,
        stall_probability: base.slow_coordinator_probability,
        execute_ahead_probability: base.execute_ahead_probability,
    };
    for c in 0..cfg.clients {
        let client = SimClient::new(c as u64, client_cfg.clone(), fs.clone(), dir.clone());
        world.spawn(Box::new(client), false);
    }
    let mut violations = crate::run_to_the_end(&mut world, &cfg.faults);
    let fs = fs.borrow();
    if world.settled() {
        let snapshot: Vec<Vec<u8>> = (1..=cfg.nodes)
            .map(|n| {
                let space = world.process::<SimNode>(dir.node(n)).space();
                space
                    .expect("settled nodes are up")
                    .read(0, BYTES_PER_NODE)
                    .to_vec()
            })
            .collect();
        violations.extend(fs.check(&snapshot));
    }
    Report {
        seed,
        trace_hash: world.trace_hash(),
        events: world.events(),
        end_us: world.now_us(),
        committed: fs.counts.done,
        aborted_compare: fs.counts.errors,
        unknown: fs.counts.unknown,
        node_crashes: world.counter("crashes"),
        coordinator_crashes: world.counter("coordinator_crashes"),
        batched_decisions: world.counter("batched_decisions"),
        batched_writes: 0,
        commits_with_lsns: world.counter("commits_with_lsns"),
        violations,
    }
}

/// Each node's image: the whole volume part, formatted.
fn initial_images(fs: &FsWorkload, nodes: NodeId) -> Vec<Vec<u8>> {
    let mut images = vec![vec![0; BYTES_PER_NODE as usize]; usize::from(nodes)];
    for (node, item) in fs.setup().items() {
        if let Item::Write { addr, bytes } = item {
            let at = *addr as usize;
            images[usize::from(*node) - 1][at..at + bytes.len()].copy_from_slice(bytes);
        }
    }
    images
}
