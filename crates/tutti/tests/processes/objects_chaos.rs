//! Tango's objects' crash safety with real processes: four client processes, each with its
//! own views, read and write a register and a map's keys and move money between eight maps
//! hosted in layered partitions, while a maintainer checkpoints, forgets and trims, and the
//! sequencer, memory nodes, client processes and the manager are killed with SIGKILL at
//! random moments and pairs of processes are partitioned. Afterwards Porcupine finds the
//! register and map history linearizable, money is conserved, every account's balance is
//! what its receipts say, and every transfer a client saw commit is in the log and none it
//! saw abort is (the check's own failures: `objects_workload`'s unit tests).

use crate::common;

use std::time::Duration;
use tutti_harness::chaos::ChaosWorkload;

#[test]
fn random_kills_and_partitions_under_transactions_across_partitions_and_register_traffic() {
    let dir = common::scratch("objects-chaos");
    let cfg = common::log_chaos_config(ChaosWorkload::Objects, Duration::from_secs(25));
    let report = common::chaos(&dir, &cfg);
    assert!(
        report.sequencer_kills >= 4
            && report.node_kills >= 6
            && report.client_kills >= 6
            && report.manager_kills >= 2
            && report.partitions >= 3,
        "{report:?}"
    );
    let check = report.objects.as_ref().expect("the bank was checked");
    assert!(
        check.committed > 300 && report.reads.ok > 1000 && report.writes.ok > 1000,
        "the workload made progress: {report:?}"
    );
    assert!(report.trims >= 3, "the maintainer trimmed: {report:?}");
    assert!(
        report
            .linearizability
            .as_deref()
            .is_some_and(|l| l.starts_with("linearizable")),
        "{report:?}"
    );
}
