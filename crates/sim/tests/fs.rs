//! Seeds of the file system's simulation pass every check (fsck's invariants, each client's
//! model of its directory); one seed twice gives the same trace.

use tutti_sim::fs::{run, FsSimConfig};
use tutti_sim::reproduce_command;

#[test]
fn fs_seeds_pass_every_check() {
    let cfg = FsSimConfig::default();
    let mut failures = Vec::new();
    let (mut done, mut unknown, mut crashes) = (0, 0, 0);
    let seeds = 500;
    for seed in 0..seeds {
        let report = run(seed, &cfg);
        done += report.committed;
        unknown += report.unknown;
        crashes += report.node_crashes + report.coordinator_crashes;
        if !report.violations.is_empty() {
            let repro = reproduce_command(seed, "fs");
            failures.push(format!(
                "seed {seed}: {:?}\n  reproduce: {repro}",
                report.violations
            ));
        }
    }
    eprintln!(
        "{seeds} seeds: {done} operations done, {unknown} unknown outcomes, {crashes} crashes"
    );
    assert!(
        failures.is_empty(),
        "{} failing seeds:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(done > seeds * 20, "the workload made progress");
    assert!(crashes > seeds, "faults were injected");
}

#[test]
fn an_fs_seed_replays_identically() {
    let cfg = FsSimConfig::default();
    for seed in [3, 99] {
        let (a, b) = (run(seed, &cfg), run(seed, &cfg));
        assert_eq!(
            (a.trace_hash, a.events),
            (b.trace_hash, b.events),
            "seed {seed}"
        );
    }
}
