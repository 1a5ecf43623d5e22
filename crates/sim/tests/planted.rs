//! The checkers can fail: each planted protocol bug is caught within 1,000 seeds.
#![cfg(feature = "planted-bugs")]

use tutti_client::coordinator;
use tutti_memnode::participant::{plant, Bug};
use tutti_sim::{run, SimConfig};

fn first_failing_seed(bug: Bug) -> Option<(u64, String)> {
    plant(Some(bug));
    let found = first_failing();
    plant(None);
    found
}

fn first_failing() -> Option<(u64, String)> {
    let cfg = SimConfig::default();
    (0..1000).find_map(|seed| {
        let report = run(seed, &cfg);
        report.violations.first().map(|v| (seed, v.to_string()))
    })
}

/// The coordinator the simulator runs is the one `Cluster` runs: a bug planted in it is
/// caught here.
#[test]
fn a_lost_vote_counted_as_commit_is_caught() {
    coordinator::plant(Some(coordinator::Bug::LostVoteCountsAsCommit));
    let found = first_failing();
    coordinator::plant(None);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}

#[test]
fn skipping_the_forced_abort_check_is_caught() {
    let found = first_failing_seed(Bug::SkipForcedAbortCheck);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}

#[test]
fn commit_ok_before_the_log_sync_is_caught() {
    let found = first_failing_seed(Bug::CommitOkBeforeSync);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}

#[test]
fn preparing_without_the_items_executed_ahead_is_caught() {
    let found = first_failing_seed(Bug::IgnoreExecutedCount);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}

#[test]
fn gc_before_every_participant_applied_is_caught() {
    let found = first_failing_seed(Bug::GcBeforeAllApplied);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}

#[test]
fn counting_a_peer_as_applied_at_its_own_lsn_is_caught() {
    let found = first_failing_seed(Bug::AppliedBelowInclusive);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}

#[test]
fn publishing_applied_below_before_the_checkpoint_scan_ends_is_caught() {
    let found = first_failing_seed(Bug::AppliedBelowBeforeScan);
    assert!(found.is_some(), "not caught in 1,000 seeds");
    eprintln!("caught: {found:?}");
}
