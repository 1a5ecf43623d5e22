//! The shared log under simulation: appenders and stream readers with the sequencer, the
//! clients and the memory nodes crashing, messages lost and partitions; every seed passes
//! the log's checks and replays identically.

use tutti_sim::log::{run, LogSimConfig};
use tutti_sim::reproduce_command;

#[test]
fn log_seeds_pass_every_check() {
    let cfg = LogSimConfig::default();
    let (mut appends, mut batched) = (0, 0);
    for seed in 0..300 {
        let report = run(seed, &cfg);
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}\n  reproduce: {}",
            report.violations,
            reproduce_command(seed, "log")
        );
        appends += report.committed;
        batched += report.batched_writes;
    }
    assert!(appends > 300 * 20, "{appends} appends acknowledged");
    assert!(batched > 150, "{batched} batches wrote several positions");
}

#[test]
fn a_log_seed_replays_identically() {
    let cfg = LogSimConfig::default();
    let (a, b) = (run(7, &cfg), run(7, &cfg));
    assert_eq!((a.trace_hash, a.events), (b.trace_hash, b.events));
}
