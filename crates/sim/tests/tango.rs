//! Tango's objects under simulation: transfer clients on layered partitions of a bank and a
//! maintainer that checkpoints, forgets and trims, with the clients, the sequencers and the
//! memory nodes crashing, messages lost and partitions; every seed passes the checks and
//! replays identically.

use tutti_sim::reproduce_command;
use tutti_sim::tango::{run, TangoSimConfig};

#[test]
fn tango_seeds_pass_every_check() {
    let cfg = TangoSimConfig::default();
    let (mut committed, mut aborted) = (0, 0);
    for seed in 0..200 {
        let report = run(seed, &cfg);
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}\n  reproduce: {}",
            report.violations,
            reproduce_command(seed, "tango")
        );
        committed += report.committed;
        aborted += report.aborted_compare;
    }
    assert!(committed > 200 * 10, "{committed} transfers committed");
    eprintln!("{committed} committed, {aborted} aborted");
    assert!(
        aborted > 20,
        "{aborted} transfers aborted: the seeds have conflicts"
    );
}

#[test]
fn a_tango_seed_replays_identically() {
    let cfg = TangoSimConfig::default();
    let (a, b) = (run(7, &cfg), run(7, &cfg));
    assert_eq!((a.trace_hash, a.events), (b.trace_hash, b.events));
}
