//! Crash safety with real processes in `log` mode: client processes run bank transfers
//! and register operations while memory nodes, clients and the manager are killed with
//! SIGKILL at random moments and restarted, pairs of processes are partitioned, and
//! consistent backups are taken (each restored at the end and checked as a cut).
//! Afterwards nothing a client saw commit is lost, money is conserved, no tid stays
//! uncertain, no lock is held, garbage collection shrinks the redo log, and Porcupine finds
//! the register history linearizable (and a corrupted copy of it not).

use crate::common;

use std::time::Duration;
use tutti_client::Cluster;
use tutti_harness::chaos::{self, ChaosConfig, ChaosWorkload, Clients};

const CLIENTS: u64 = 6;

/// A 4-node `log` cluster with the bank initialised, and the client processes (not started).
fn bank_cluster(rt: &tokio::runtime::Runtime, name: &str) -> (common::TestCluster, Clients) {
    let c = common::start(name, 4, "log", chaos::NODE_FLAGS, &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        tutti_harness::workload::setup(&cluster, &chaos::bank(CLIENTS))
            .await
            .unwrap();
    });
    let clients = Clients::new(&common::exe(), &c.local.file.manager, &c.local.dir, CLIENTS);
    (c, clients)
}

fn verify(rt: &tokio::runtime::Runtime, c: &common::TestCluster, clients: &Clients) -> Cluster {
    let cluster = rt
        .block_on(chaos::verify(&c.local, clients))
        .unwrap_or_else(|v| panic!("violations: {v:#?}"));
    eprintln!(
        "verified: transfers seen committed per client {:?}",
        clients.seen
    );
    cluster
}

#[test]
fn random_kills_of_memory_nodes_clients_and_the_manager_under_load() {
    let dir = common::scratch("chaos");
    let seed = common::chaos_seed();
    let cfg = ChaosConfig {
        duration: Duration::from_secs(40),
        workload: ChaosWorkload::Bank,
        clients: CLIENTS,
        mix: "transfer=2,read=1,write=1,cas=1".parse().unwrap(),
        nodes: common::secs(0.5, 3.0),
        clients_killer: common::secs(0.5, 3.0),
        manager: common::secs(8.0, 16.0),
        mode: "log".into(),
        failover_timeout_ms: None,
        lose_disks: false,
        managers: 1,
        // Backups taken under the faults, each restored at the end and checked as a cut.
        backups: Some(common::secs(8.0, 16.0)),
        sequencer: common::secs(2.0, 6.0),
        partitions: Some((common::secs(2.0, 6.0), common::secs(0.5, 4.0))),
        linearizability_checker: chaos::default_checker(),
        seed,
        // Every process proves a token: reconnections after kills and partitions too.
        credentials: common::token(&dir),
    };
    let report = common::chaos(&dir, &cfg);
    assert!(
        report.node_kills >= 10
            && report.client_kills >= 10
            && report.manager_kills >= 2
            && report.partitions >= 5,
        "{report:?}"
    );
    assert!(
        report.writes.ok > 100 && report.cases.ok > 10 && report.reads.ok > 100,
        "register operations committed: {report:?}"
    );
    assert!(
        report.transfers_seen_committed > 100,
        "the workload made progress: {report:?}"
    );
    assert!(
        report.backups.checked >= 2,
        "backups were taken under the faults and restored as cuts: {report:?}"
    );
    assert!(
        report.log_peak_bytes > 4 * chaos::SEGMENT_BYTES,
        "the run wrote more log than GC keeps: {report:?}"
    );
    corrupted_history_is_not_linearizable(&dir);
}

/// The checker can fail: one read in the run's real history is made to return a value no
/// one wrote.
fn corrupted_history_is_not_linearizable(dir: &std::path::Path) {
    use tutti_harness::registers::{check_histories, history_files, Event, Out};
    let files = history_files(dir).unwrap();
    let corrupted = files.iter().any(|file| {
        let text = std::fs::read_to_string(file).unwrap();
        let mut done = false;
        let lines: Vec<String> = text
            .lines()
            .map(|line| match serde_json::from_str::<Event>(line) {
                Ok(Event::Return {
                    id,
                    t,
                    out: Out::Ok,
                    value: Some(_),
                }) if !done => {
                    done = true;
                    serde_json::to_string(&Event::Return {
                        id,
                        t,
                        out: Out::Ok,
                        value: Some(0xDEAD_BEEF),
                    })
                    .unwrap()
                }
                _ => line.to_string(),
            })
            .collect();
        if done {
            std::fs::write(file, lines.join("\n") + "\n").unwrap();
        }
        done
    });
    assert!(corrupted, "the history holds a read");
    let verdict = check_histories(dir, &chaos::default_checker()).unwrap();
    assert!(!verdict.linearizable, "{}", verdict.summary);
    eprintln!("corrupted history: {}", verdict.summary);
}

#[test]
fn every_memory_node_killed_at_once_and_restarted() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let (mut c, mut clients) = bank_cluster(&rt, "crash-all");
    for round in 0..3 {
        clients.start_all().unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        for node in 1..=4 {
            c.local.kill_node(node);
        }
        clients.kill_all();
        for node in 1..=4 {
            c.local.start_node(node).unwrap();
        }
        verify(&rt, &c, &clients);
        eprintln!("round {round}: whole-cluster restart verified");
    }
    assert!(
        clients.seen.iter().sum::<u64>() > 100,
        "the workload made progress: {:?}",
        clients.seen
    );
}

#[test]
fn manager_killed_and_restarted_while_clients_work() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let (mut c, mut clients) = bank_cluster(&rt, "crash-manager");
    clients.start_all().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    c.local.kill_manager();
    let before = clients.progress();
    std::thread::sleep(Duration::from_millis(2000));
    let during = clients.progress();
    assert!(during > before, "clients keep committing on their cached directory while the manager is down ({before} -> {during})");
    c.local.start_manager().unwrap();
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        assert_eq!(
            cluster.nodes().len(),
            4,
            "the directory survived the manager's crash"
        );
    });
    std::thread::sleep(Duration::from_millis(1500));
    clients.kill_all();
    let cluster = verify(&rt, &c, &clients);
    rt.block_on(chaos::wait_log_collected(&cluster, Duration::from_secs(45)))
        .unwrap();
}
