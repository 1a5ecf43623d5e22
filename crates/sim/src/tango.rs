//! A simulated run of Tango's objects over the shared log: memory nodes, the manager and the
//! sequencers as in the log's runs; transfer clients that host different accounts of a bank
//! (layered partitions) and move money in transactions; a maintainer that checkpoints,
//! forgets and trims. Then the checks: every client's views of an account agree; every
//! transfer a client saw commit is in the balances and every one it saw abort is not (with
//! those whose outcome no one learned either way); no balance ever went lower than a serial
//! order allows.

use crate::log::{spawn_log_cluster, LogShape};
use crate::tango_client::{
    Role, SimTangoClient, TangoHistory, Transfer, ACCOUNTS, AMOUNT_MAX, BALANCE_MIN,
};
use crate::world::{Faults, World};
use crate::Report;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;
use tutti_tango::Oid;
use tutti_workload::Violation;

const LOG: &str = "sim-tango";
const SPACE_BYTES: u64 = 256 << 10;
const SLOT_BYTES: u32 = 512;
const SLOTS_PER_NODE: u64 = 300;
/// Unknown outcomes up to which the balances are checked exactly (every subset is tried).
const UNKNOWN_CHECKED_MAX: usize = 14;

#[derive(Clone, Debug)]
pub struct TangoSimConfig {
    pub nodes: u16,
    pub transfers_per_client: usize,
    pub sequencers: u64,
    /// Managers: a Raft group that crashes like the nodes if more than one.
    pub managers: u32,
    pub lease: u64,
    pub hole_timeout_us: u64,
    pub decision_timeout_us: u64,
    pub faults: Faults,
}

impl Default for TangoSimConfig {
    fn default() -> Self {
        TangoSimConfig {
            nodes: 3,
            transfers_per_client: 8,
            sequencers: 2,
            managers: 3,
            lease: 8,
            hole_timeout_us: 20_000,
            decision_timeout_us: 40_000,
            faults: crate::SimConfig::default().faults,
        }
    }
}

pub fn run(seed: u64, cfg: &TangoSimConfig) -> Report {
    let mut world = World::new(seed, cfg.faults.clone());
    let shape = LogShape {
        name: LOG,
        nodes: cfg.nodes,
        space_bytes: SPACE_BYTES,
        slot_bytes: SLOT_BYTES,
        slots_per_node: SLOTS_PER_NODE,
        backpointers: 2,
    };
    let (dir, layout, sequencers) =
        spawn_log_cluster(&mut world, &shape, cfg.lease, cfg.sequencers, cfg.managers);
    // Which accounts ask for decision records: drawn per seed, so that both ways of
    // deciding without the read set (decision records, and rebuilding it) run.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x7a6e_6f00);
    let decisions: BTreeSet<Oid> = ACCOUNTS.into_iter().filter(|_| rng.gen_bool(0.5)).collect();
    let partitions: [Vec<Oid>; 3] = [vec![1, 2, 3, 4], vec![5, 6, 7, 8], ACCOUNTS.to_vec()];
    let history = Rc::new(RefCell::new(TangoHistory {
        transfer_clients: partitions.len(),
        ..TangoHistory::default()
    }));
    let roles = (partitions.into_iter())
        .map(|hosted| Role::Transfers {
            hosted,
            transfers: cfg.transfers_per_client,
        })
        .chain([Role::Maintainer]);
    for (i, role) in roles.enumerate() {
        let client = SimTangoClient::new(
            i as u64,
            role,
            LOG,
            layout.clone(),
            Duration::from_micros(cfg.hole_timeout_us),
            Duration::from_micros(cfg.decision_timeout_us),
            dir.clone(),
            sequencers.clone(),
            Rc::new(decisions.clone()),
            history.clone(),
        );
        world.spawn(Box::new(client), true);
    }
    let mut violations = crate::run_to_the_end(&mut world, &cfg.faults);
    let h = history.borrow();
    violations.extend(h.broken.iter().cloned());
    if world.settled() {
        violations.extend(check(&h));
        violations.extend(crate::check_managers(&world, &dir));
    }
    let committed = (h.transfers.values())
        .filter(|t| t.committed == Some(true))
        .count();
    let unknown = (h.transfers.values())
        .filter(|t| t.committed.is_none())
        .count();
    Report {
        seed,
        trace_hash: world.trace_hash(),
        events: world.events(),
        end_us: world.now_us(),
        committed: committed as u64,
        aborted_compare: (h.transfers.len() - committed - unknown) as u64,
        unknown: unknown as u64,
        node_crashes: world.counter("crashes"),
        coordinator_crashes: 0,
        batched_decisions: 0,
        batched_writes: 0,
        incremental_images: 0,
        manager_elections: world.counter("manager_elections"),
        commits_with_lsns: 0,
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

fn check(h: &TangoHistory) -> Vec<Violation> {
    let mut violations = Vec::new();
    // Every view of an account agrees.
    let mut agreed: BTreeMap<Oid, (u64, (i64, i64))> = BTreeMap::new();
    for (&client, views) in &h.views {
        for (&oid, &view) in views {
            let (first, seen) = *agreed.entry(oid).or_insert((client, view));
            if seen != view {
                let why = format!(
                    "account {oid}: client {first} holds (balance, lowest) {seen:?}, client {client} {view:?}"
                );
                violations.push(Violation::new("views agree", why));
            }
        }
    }
    let balances: BTreeMap<Oid, i64> = agreed.iter().map(|(&o, &(_, (b, _)))| (o, b)).collect();
    for (&oid, &(_, (_, lowest))) in &agreed {
        if lowest < BALANCE_MIN - AMOUNT_MAX {
            let why = format!("account {oid} went down to {lowest}: transfers read stale balances");
            violations.push(Violation::new("serializable transfers", why));
        }
    }
    if balances.values().sum::<i64>() != 0 {
        violations.push(Violation::new("money conserved", format!("{balances:?}")));
    }
    violations.extend(check_outcomes(h, &balances));
    violations.extend(check_reads(h));
    violations
}

/// Serializability in log order (Tango's commit order): replaying the committed transfers
/// by their commit records' positions, each read the balance its account held just before
/// it. A transfer's outcome is what it learned, or else what the clients decided at its
/// commit record; a run where some transfer may have committed at a position no one knows
/// is not checked.
fn check_reads(h: &TangoHistory) -> Vec<Violation> {
    let mut committed = BTreeMap::new();
    for t in h.transfers.values() {
        let decided = t
            .position
            .and_then(|p| h.decisions.get(&p))
            .map(|&(c, _)| c);
        match (t.committed.or(decided), t.position) {
            (Some(true), Some(position)) => {
                committed.insert(position, t);
            }
            (Some(false), _) => {}
            _ => return vec![],
        }
    }
    let mut balances: BTreeMap<Oid, i64> = ACCOUNTS.iter().map(|&a| (a, 0)).collect();
    for (position, t) in committed {
        let held = balances[&t.from];
        if t.read != held {
            let why = format!(
                "the transfer committed at {position} read {} in account {}, which held {held} there",
                t.read, t.from
            );
            return vec![Violation::new("serializable transfers", why)];
        }
        *balances.get_mut(&t.from).expect("an account") -= t.amount;
        *balances.get_mut(&t.to).expect("an account") += t.amount;
    }
    vec![]
}

/// The balances are the committed transfers' sum, with some subset of those whose
/// outcome is unknown: a transfer seen to abort is not in them, one seen to commit is.
fn check_outcomes(h: &TangoHistory, balances: &BTreeMap<Oid, i64>) -> Vec<Violation> {
    let mut expected: BTreeMap<Oid, i64> = ACCOUNTS.iter().map(|&a| (a, 0)).collect();
    let mut unknown: Vec<&Transfer> = Vec::new();
    for t in h.transfers.values() {
        match t.committed {
            Some(true) => {
                *expected.get_mut(&t.from).expect("an account") -= t.amount;
                *expected.get_mut(&t.to).expect("an account") += t.amount;
            }
            Some(false) => {}
            None => unknown.push(t),
        }
    }
    if unknown.len() > UNKNOWN_CHECKED_MAX || balances.len() != ACCOUNTS.len() {
        return vec![];
    }
    let explained = (0u32..1 << unknown.len()).any(|subset| {
        let mut sum = expected.clone();
        for (i, t) in unknown.iter().enumerate() {
            if subset & (1 << i) != 0 {
                *sum.get_mut(&t.from).expect("an account") -= t.amount;
                *sum.get_mut(&t.to).expect("an account") += t.amount;
            }
        }
        &sum == balances
    });
    if explained {
        return vec![];
    }
    let why = format!(
        "balances {balances:?}; committed transfers give {expected:?}, and no subset of the {} unknown ones makes up the difference",
        unknown.len()
    );
    vec![Violation::new("outcomes", why)]
}
