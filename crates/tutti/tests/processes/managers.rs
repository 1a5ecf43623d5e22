//! A group of three managers (Raft) with real processes: the leader is killed with SIGKILL
//! again and again under the bank workload, and a memory node with it. Each time another
//! manager leads within seconds, with every region and node the group had committed; the
//! memory nodes' heartbeats, the recovery coordinator and the clients follow it; and at the
//! end nothing a client saw commit is lost and money is conserved.

use crate::common;

use rand::{Rng, SeedableRng};
use std::time::{Duration, Instant};
use tutti_harness::chaos;
use tutti_wire::{Request, Response};

const CLIENTS: u64 = 6;

fn create(name: &str) -> Request {
    Request::CreateRegion {
        name: name.into(),
        kind: "test".into(),
        nodes: vec![1, 2, 3],
        bytes_per_node: 4096,
        params: vec![],
    }
}

#[test]
fn the_manager_group_survives_kills_of_its_leader_under_load() {
    let seed = common::chaos_seed();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let (mut c, cluster, addrs, mut clients) =
        common::bank_under_managers(&rt, "managers", "log", CLIENTS);
    let mut failovers = Vec::new();
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(rng.gen_range(500..1500)));
        let old = rt.block_on(common::leader(&addrs)).expect("a leader");
        let before = clients.progress();
        c.local.kill_manager_id(old);
        // Every other round a memory node dies with it: its restart registers with the new
        // leader, and its uncertain tids go to the new leader's recovery coordinator.
        let node = (round % 2 == 1).then(|| rng.gen_range(1..=4));
        if let Some(node) = node {
            c.local.kill_node(node);
        }
        let killed = Instant::now();
        rt.block_on(async {
            let name = format!("after-kill-{round}");
            let resp = cluster.ask_manager(&create(&name)).await;
            assert!(matches!(resp, Ok(Response::Region(_))), "{resp:?}");
        });
        failovers.push(killed.elapsed());
        let new = rt.block_on(common::leader(&addrs)).expect("a new leader");
        assert_ne!(new, old, "round {round}: the killed manager cannot lead");
        if let Some(node) = node {
            c.local.start_node(node).unwrap();
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..1000)));
        c.local.start_manager_id(old).unwrap();
        assert!(
            clients.progress() > before || node.is_some(),
            "round {round}: the clients commit on their cached directory meanwhile"
        );
    }
    eprintln!("fail-over (kill to a committed region): {failovers:?}");
    for elapsed in &failovers {
        assert!(*elapsed < Duration::from_secs(5), "{failovers:?}");
    }
    std::thread::sleep(Duration::from_millis(1000));
    clients.kill_all();
    let cluster = rt
        .block_on(chaos::verify(&c.local, &clients))
        .unwrap_or_else(|v| panic!("violations: {v:#?}"));
    rt.block_on(async {
        let Ok(Response::Regions(regions)) = cluster.ask_manager(&Request::Regions).await else {
            panic!("regions");
        };
        for round in 0..4 {
            let name = format!("after-kill-{round}");
            assert!(regions.iter().any(|r| r.name == name), "{name} was lost");
        }
        assert_eq!(cluster.nodes().len(), 4, "the directory survived");
    });
    assert!(clients.seen.iter().sum::<u64>() > 100, "{:?}", clients.seen);
    // `tutti managers` finds one leader among the three, all in one term.
    let out = std::process::Command::new(common::exe())
        .args(["managers", "--json", "--cluster"])
        .arg(&c.local.dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let roles: Vec<&str> = rows.iter().map(|r| r["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "leader").count(),
        1,
        "{rows:?}"
    );
    assert!(
        rows.windows(2).all(|w| w[0]["term"] == w[1]["term"]),
        "{rows:?}"
    );
}
