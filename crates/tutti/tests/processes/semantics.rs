//! Random sequences of minitransactions over a real cluster give exactly the results of a
//! single-threaded reference model, for every item kind, in `ram` and `log` modes.

use crate::common;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::collections::HashMap;
use tutti_client::{Cluster, ExecuteAhead, Minitx};
use tutti_wire::{CmpOp, Item, NodeId};

const NODES: NodeId = 3;
const REGION_BYTES: u64 = 64;

fn item() -> impl Strategy<Value = (NodeId, Item)> {
    let node = 1..=NODES;
    let addr = 0..REGION_BYTES - 8;
    let small = prop::collection::vec(0u8..4, 1..=8);
    let op = prop_oneof![
        Just(CmpOp::Eq),
        Just(CmpOp::Ne),
        Just(CmpOp::Lt),
        Just(CmpOp::Le),
        Just(CmpOp::Gt),
        Just(CmpOp::Ge)
    ];
    (
        node,
        prop_oneof![
            (addr.clone(), 1u32..=8).prop_map(|(addr, len)| Item::Read { addr, len }),
            (addr.clone(), small.clone()).prop_map(|(addr, bytes)| Item::Compare {
                addr,
                op: CmpOp::Eq,
                bytes
            }),
            (addr.clone(), op, 0u64..4).prop_map(|(addr, op, v)| Item::Compare {
                addr,
                op,
                bytes: v.to_le_bytes().to_vec()
            }),
            (addr.clone(), small).prop_map(|(addr, bytes)| Item::Write { addr, bytes }),
            (addr, -3i64..=3).prop_map(|(addr, delta)| Item::Add { addr, delta }),
        ],
    )
}

fn minitxs() -> impl Strategy<Value = Vec<Vec<(NodeId, Item)>>> {
    prop::collection::vec(prop::collection::vec(item(), 1..6), 1..16)
}

/// The reference: one byte map per node, items applied exactly as documented.
#[derive(Default)]
struct Model {
    bytes: HashMap<(NodeId, u64), u8>,
}

impl Model {
    fn get(&self, node: NodeId, addr: u64, len: u64) -> Vec<u8> {
        (addr..addr + len)
            .map(|a| *self.bytes.get(&(node, a)).unwrap_or(&0))
            .collect()
    }

    fn exec(&mut self, items: &[(NodeId, Item)]) -> (bool, Vec<Vec<u8>>, Vec<usize>) {
        let mut reads = Vec::new();
        let mut failed = Vec::new();
        for (i, (node, item)) in items.iter().enumerate() {
            match item {
                Item::Read { addr, len } => reads.push(self.get(*node, *addr, u64::from(*len))),
                Item::Compare { addr, op, bytes } => {
                    let len = if *op == CmpOp::Eq {
                        bytes.len() as u64
                    } else {
                        8
                    };
                    if !op.holds(&self.get(*node, *addr, len), bytes) {
                        failed.push(i);
                    }
                }
                _ => {}
            }
        }
        if !failed.is_empty() {
            return (false, reads, failed);
        }
        for (node, item) in items {
            match item {
                Item::Write { addr, bytes } => {
                    for (k, b) in bytes.iter().enumerate() {
                        self.bytes.insert((*node, addr + k as u64), *b);
                    }
                }
                Item::Add { addr, delta } => {
                    let v = i64::from_le_bytes(self.get(*node, *addr, 8).try_into().unwrap())
                        .wrapping_add(*delta);
                    for (k, b) in v.to_le_bytes().iter().enumerate() {
                        self.bytes.insert((*node, addr + k as u64), *b);
                    }
                }
                _ => {}
            }
        }
        (true, reads, failed)
    }
}

fn rebase(item: &Item, base: u64) -> Item {
    match item.clone() {
        Item::Read { addr, len } => Item::Read {
            addr: addr + base,
            len,
        },
        Item::Compare { addr, op, bytes } => Item::Compare {
            addr: addr + base,
            op,
            bytes,
        },
        Item::Write { addr, bytes } => Item::Write {
            addr: addr + base,
            bytes,
        },
        Item::Add { addr, delta } => Item::Add {
            addr: addr + base,
            delta,
        },
    }
}

fn to_minitx(items: &[(NodeId, Item)], base: u64) -> Minitx {
    items.iter().fold(
        Minitx::new().class("proptest"),
        |tx, (node, item)| match rebase(item, base) {
            Item::Read { addr, len } => tx.read(*node, addr, len),
            Item::Compare {
                addr,
                op: CmpOp::Eq,
                bytes,
            } => tx.compare(*node, addr, bytes),
            Item::Compare { addr, op, bytes } => tx.compare_u64(
                *node,
                addr,
                op,
                u64::from_le_bytes(bytes.try_into().unwrap()),
            ),
            Item::Write { addr, bytes } => tx.write(*node, addr, bytes),
            Item::Add { addr, delta } => tx.add(*node, addr, delta),
        },
    )
}

async fn check(
    cluster: &Cluster,
    txs: &[Vec<(NodeId, Item)>],
    base: u64,
) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    for (k, items) in txs.iter().enumerate() {
        // Every third one the traditional way (items executed ahead), for Fig. 17.
        let ahead = [
            None,
            Some(ExecuteAhead::PerNode),
            Some(ExecuteAhead::PerItem),
        ][k % 3];
        let tx = to_minitx(items, base);
        let out = match ahead {
            None => cluster.exec_and_commit(&tx).await,
            Some(ahead) => cluster.exec_and_commit_ahead(&tx, ahead).await,
        }
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (committed, reads, mut failed) = model.exec(items);
        prop_assert_eq!(out.committed, committed, "minitx {} {:?}", k, items);
        if committed || ahead.is_none() {
            prop_assert_eq!(&out.reads, &reads, "minitx {} {:?}", k, items);
        }
        if ahead == Some(ExecuteAhead::PerItem) {
            failed.truncate(1);
        }
        prop_assert_eq!(&out.failed_compares, &failed, "minitx {} {:?}", k, items);
    }
    let all: Vec<(NodeId, Item)> = (1..=NODES)
        .map(|n| {
            (
                n,
                Item::Read {
                    addr: 0,
                    len: REGION_BYTES as u32,
                },
            )
        })
        .collect();
    let out = cluster
        .exec_and_commit(&to_minitx(&all, base))
        .await
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for (n, read) in (1..=NODES).zip(&out.reads) {
        prop_assert_eq!(
            read,
            &model.get(n, 0, REGION_BYTES),
            "final state of node {}",
            n
        );
    }
    Ok(())
}

fn run(mode: &str) {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let c = common::start(&format!("semantics-{mode}"), NODES as usize, mode, &[], &[]);
    let cluster = rt.block_on(common::ready(&c));
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&minitxs(), |txs| {
            // Each case (and each shrinking step) starts on fresh, zeroed bytes.
            let base = (case.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1) * 4096;
            rt.block_on(check(&cluster, &txs, base))
        })
        .unwrap();
}

#[test]
fn ram_mode_matches_the_model() {
    run("ram");
}

#[test]
fn log_mode_matches_the_model() {
    run("log");
}
