//! `log-repl` in the simulator: each node a primary and a mirror that crash, are cut off
//! and fail over; every seed must pass every checker (the bank's, the manager group's, and
//! that a primary's and its mirror's images agree once quiet).

use tutti_sim::{run, SimConfig};

#[test]
fn replicated_seeds_pass_every_checker() {
    let seeds: u64 = std::env::var("TUTTI_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let cfg = SimConfig {
        replicated: true,
        ..SimConfig::default()
    };
    let mut failures = Vec::new();
    let (mut committed, mut fail_overs, mut crashes) = (0, 0, 0);
    for seed in 0..seeds {
        let report = run(seed, &cfg);
        committed += report.committed;
        fail_overs += report.fail_overs;
        crashes += report.node_crashes;
        if !report.violations.is_empty() {
            failures.push(format!("seed {seed}: {:?}", report.violations));
        }
    }
    eprintln!("{seeds} replicated seeds: {committed} committed, {crashes} crashes, {fail_overs} nodes served by their mirror at the end");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        fail_overs > seeds / 4,
        "fail-overs happen: {fail_overs} in {seeds} seeds"
    );
}
