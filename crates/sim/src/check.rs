//! What must hold at the end of every simulated run, read straight from the nodes' spaces:
//! - liveness: once faults stop, every operation returns and every node is up, serving,
//!   with nothing uncertain and no lock held, within the bound;
//! - atomicity: each transfer's receipts are on all its nodes or on none;
//! - durability: every transfer a coordinator saw commit has its receipts;
//! - serializability: the balances equal the reference model (initial balances plus the
//!   transfers whose receipts are present), none is negative, money is conserved, and every
//!   committed audit (a read of all accounts in one minitransaction) saw the full total.

use crate::coordinator::{account, accounts, receipt, OpOutcome, INITIAL_BALANCE};
use crate::World;
use std::fmt;
use tutti_wire::NodeId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

fn violation(kind: &'static str, detail: String) -> Violation {
    Violation { kind, detail }
}

/// Checked whenever a memory node finishes recovery: every transfer already reported committed
/// that touches the node is applied in its space (the node's vote was synced before the
/// coordinator heard it, so a restart must bring the transfer back).
pub(crate) fn after_recovery(world: &mut World, node: NodeId) {
    let cfg = &world.cfg;
    let p = world.nodes[usize::from(node) - 1]
        .participant
        .as_ref()
        .expect("just recovered");
    let mut found = Vec::new();
    for (c, co) in world.coordinators.iter().enumerate() {
        for (k, from, to, _, outcome) in co.transfers() {
            let touches = account(cfg, from).0 == node || account(cfg, to).0 == node;
            if outcome == OpOutcome::Committed
                && touches
                && p.space().read(receipt(cfg, c, k), 1)[0] != 1
            {
                let detail = format!("at {} µs node {node} recovered without coordinator {c}'s committed transfer {k}", world.now_us);
                found.push(violation("durability", detail));
            }
        }
    }
    world.violations.extend(found);
}

pub(crate) fn final_state(world: &World) -> Vec<Violation> {
    let mut out = world.violations.clone();
    let cfg = &world.cfg;
    if !world.finished() {
        let pending: Vec<usize> = (0..world.coordinators.len())
            .filter(|&c| !world.coordinators[c].done())
            .collect();
        let busy: Vec<usize> = (0..world.nodes.len())
            .filter(|&n| !world.nodes[n].quiet())
            .map(|n| n + 1)
            .collect();
        let detail = format!(
            "not settled {} µs after faults stopped: coordinators {pending:?} unfinished, nodes {busy:?} down, recovering or holding locks",
            world.now_us.saturating_sub(cfg.faults_until_us)
        );
        out.push(violation("liveness", detail));
        return out;
    }
    let read = |node: u16, addr: u64, len: u64| -> Vec<u8> {
        let p = world.nodes[usize::from(node) - 1]
            .participant
            .as_ref()
            .expect("settled nodes are up");
        p.space().read(addr, len).to_vec()
    };
    let mut model: Vec<i128> = vec![i128::from(INITIAL_BALANCE); accounts(cfg) as usize];
    for (c, co) in world.coordinators.iter().enumerate() {
        out.extend(
            co.errors
                .iter()
                .map(|e| violation("protocol", format!("coordinator {c}: {e}"))),
        );
        for (k, from, to, amount, outcome) in co.transfers() {
            let nodes = [account(cfg, from).0, account(cfg, to).0];
            let present: Vec<bool> = nodes
                .iter()
                .map(|&n| read(n, receipt(cfg, c, k), 1)[0] == 1)
                .collect();
            let applied = present.iter().all(|&p| p);
            if present.iter().any(|&p| p) && !applied {
                out.push(violation(
                    "atomicity",
                    format!(
                        "coordinator {c} transfer {k}: receipts {present:?} on nodes {nodes:?}"
                    ),
                ));
            }
            match outcome {
                OpOutcome::Committed if !applied => {
                    out.push(violation("durability", format!("coordinator {c} transfer {k} was reported committed but is not applied")));
                }
                OpOutcome::AbortedCompare if applied => {
                    out.push(violation(
                        "atomicity",
                        format!("coordinator {c} transfer {k} was reported aborted but is applied"),
                    ));
                }
                _ => {}
            }
            if applied {
                model[from as usize] -= i128::from(amount);
                model[to as usize] += i128::from(amount);
            }
        }
        for (i, total) in co.audits.iter().enumerate() {
            if *total != INITIAL_BALANCE * accounts(cfg) {
                out.push(violation(
                    "isolation",
                    format!("coordinator {c} audit {i} saw a total of {total}"),
                ));
            }
        }
    }
    let mut total = 0u128;
    for i in 0..accounts(cfg) {
        let (node, addr) = account(cfg, i);
        let balance = u64::from_le_bytes(read(node, addr, 8).try_into().expect("8 bytes"));
        total += u128::from(balance);
        if balance > INITIAL_BALANCE * accounts(cfg) {
            out.push(violation(
                "serializability",
                format!("account {i} went negative ({balance} as u64)"),
            ));
        }
        if i128::from(balance) != model[i as usize] {
            out.push(violation(
                "serializability",
                format!(
                    "account {i} holds {balance}, the reference model {}",
                    model[i as usize]
                ),
            ));
        }
    }
    if total != u128::from(INITIAL_BALANCE * accounts(cfg)) {
        out.push(violation(
            "atomicity",
            format!("money is not conserved: total {total}"),
        ));
    }
    out
}
