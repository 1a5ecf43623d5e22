//! The shared log's crash safety with real processes: appender processes on three streams,
//! one reader process per stream and a trimmer following the readers, while the sequencer,
//! memory nodes, client processes and the manager are killed with SIGKILL at random moments
//! and pairs of processes are partitioned. Afterwards no two appends share a position, every
//! acknowledged append is at its position, and every reader's stream (and a final read of
//! each) holds every acknowledged append of its range once, in log order; and the same
//! check fails on the run's history with one entry taken out of a reading.

use crate::common;

use std::time::Duration;
use tutti_harness::chaos::ChaosWorkload;
use tutti_harness::log_workload;

#[test]
fn random_kills_of_the_sequencer_nodes_clients_and_manager_under_appends_and_reads() {
    let dir = common::scratch("log-chaos");
    let cfg = common::log_chaos_config(ChaosWorkload::Log, Duration::from_secs(30));
    let report = common::chaos(&dir, &cfg);
    assert!(
        report.sequencer_kills >= 5
            && report.node_kills >= 8
            && report.client_kills >= 8
            && report.manager_kills >= 2
            && report.partitions >= 4,
        "{report:?}"
    );
    let check = report.log.as_ref().expect("the log was checked");
    assert!(
        check.acked > 1000 && check.entries_read > 1000 && report.trims >= 3,
        "the workload made progress: {report:?}"
    );

    let mut history = log_workload::history(&dir);
    assert!(history.check_readings().is_empty());
    let acked: std::collections::BTreeSet<u64> = history.acked.iter().map(|a| a.position).collect();
    let reading = (history.readings.iter_mut())
        .find(|r| {
            r.entries
                .iter()
                .any(|(p, _)| *p < r.to && acked.contains(p))
        })
        .expect("a reading with an acknowledged entry in its range");
    let i = (reading.entries.iter())
        .position(|(p, _)| *p < reading.to && acked.contains(p))
        .expect("found above");
    let (dropped, _) = reading.entries.remove(i);
    let violations = history.check_readings();
    assert!(
        violations.iter().any(|v| v
            .detail
            .contains(&format!("missed the append at {dropped}"))),
        "{violations:?}"
    );
}
