//! A simulated run of tutti-fs: memory nodes and the manager as in the bank's runs; clients
//! running the file system's workload (the real `ops`, each step one minitransaction through
//! the client's `Coordinator`), under the same faults. Then the checks: every invariant fsck
//! checks on the settled images, and each client's own directory against its model.

use crate::node::SimNode;
use crate::world::{Faults, World};
use crate::Report;
use std::cell::RefCell;
use std::rc::Rc;
use tutti_workload::fs::{FsWorkload, BYTES_PER_NODE};
use tutti_workload::Workload;

#[derive(Clone, Debug)]
pub struct FsSimConfig {
    pub nodes: u16,
    /// Nodes the volume does not span at first: clients grow it onto them during the run
    /// (`tutti fs grow`'s minitransaction), then once more as a rerun that must change nothing.
    pub spare: u16,
    pub clients: usize,
    pub ops_per_client: usize,
    pub faults: Faults,
}

impl Default for FsSimConfig {
    fn default() -> Self {
        FsSimConfig {
            nodes: 3,
            spare: 1,
            clients: 3,
            ops_per_client: 30,
            faults: crate::SimConfig::default().faults,
        }
    }
}

pub fn run(seed: u64, cfg: &FsSimConfig) -> Report {
    let base = crate::SimConfig::default();
    let mut world = World::new(seed, cfg.faults.clone());
    let fs = FsWorkload::new(cfg.nodes, cfg.spare, cfg.clients as u64);
    let images = crate::initial_images(&fs, cfg.nodes, BYTES_PER_NODE);
    let fs = Rc::new(RefCell::new(fs));
    let client_cfg = base.client_config(cfg.ops_per_client);
    let servers = crate::Servers {
        managers: 3,
        epoch_interval_us: base.epoch_interval_us,
        replicated: false,
        in_ram: false,
        disk_loss_probability: 0.0,
    };
    let dir = crate::spawn_cluster(&mut world, images, &servers, &fs, cfg.clients, &client_cfg);
    let nodes: Vec<_> = (1..=cfg.nodes).map(|n| dir.node(n)).collect();
    let checked = fs.clone();
    world.after_each_event(move |world| {
        // What a client answered on trust must be what the node holds at that instant
        // (bytes a minitransaction in flight holds for writing are skipped: their outcome
        // may be decided and not yet applied).
        let reads = checked.borrow_mut().take_trusted_reads();
        for read in reads {
            let node = world.process::<SimNode>(nodes[usize::from(read.node) - 1]);
            if let Some(now) = node.committed_bytes(read.addr, read.bytes.len() as u64) {
                if now != read.bytes {
                    checked.borrow_mut().stale(&read, &now);
                }
            }
        }
    });
    let mut violations = crate::run_to_the_end(&mut world, &cfg.faults);
    let fs = fs.borrow();
    if world.settled() {
        violations.extend(crate::check_managers(&world, &dir));
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
        incremental_images: 0,
        manager_elections: world.counter("manager_elections"),
        commits_with_lsns: world.counter("commits_with_lsns"),
        fail_overs: 0,
        mirror_joins: 0,
        formers_named_again: 0,
        dropped_mirrors_named: 0,
        answered_on_trust: fs.counts.trusted,
        members_revoked: fs.counts.revoked,
        callbacks_retaken: fs.counts.retaken,
        nodes_lost: 0,
        disks_lost: 0,
        violations,
    }
}
