//! `log-repl` with real processes: three managers, four logical memory nodes, each a
//! primary and a mirror in processes of their own, under the bank workload. A primary is
//! killed with SIGKILL (once together with the manager group's leader) and its mirror
//! serves the node within about a second; a mirror is killed and its primary goes on
//! alone; a replaced primary started again is refused, and started as a mirror, joins
//! (re-replication) and serves the node when its new primary is killed in turn; a killed
//! mirror started again joins as well. At the end nothing a client saw commit is lost and
//! money is conserved.

use crate::common;

use std::time::{Duration, Instant};
use tutti_harness::chaos;
use tutti_wire::{Placement, Request, Response};

const CLIENTS: u64 = 6;

/// Where node `id` is served, by the manager's directory.
async fn serving(cluster: &tutti_client::Cluster, id: u16) -> String {
    let Ok(Response::Directory(d)) = cluster.ask_manager(&Request::Directory).await else {
        panic!("directory");
    };
    d.nodes.into_iter().find(|n| n.id == id).expect("node").addr
}

/// Node `id`'s placement, as the manager group committed it.
async fn placement(cluster: &tutti_client::Cluster, id: u16) -> Placement {
    let ask = Request::Placement { node: id };
    match cluster.ask_manager(&ask).await {
        Ok(Response::Placement(Some(p))) => p,
        other => panic!("placement of node {id}: {other:?}"),
    }
}

/// Waits until the placement names `addr` node `id`'s mirror; how long that took.
async fn until_mirror(cluster: &tutti_client::Cluster, id: u16, addr: &str) -> Duration {
    let started = Instant::now();
    loop {
        let p = placement(cluster, id).await;
        if p.mirror.as_deref() == Some(addr) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{addr} never joined node {id}: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes to node `id` until a write commits; how long that took.
async fn until_served(cluster: &tutti_client::Cluster, id: u16, round: u64) -> Duration {
    let started = Instant::now();
    loop {
        let tx = tutti_client::Minitx::new().write(id, 60 << 20, round.to_le_bytes().to_vec());
        let outcome = cluster.exec_and_commit(&tx).await;
        if outcome.as_ref().is_ok_and(|o| o.committed) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "node {id} not served again: {outcome:?}"
        );
    }
}

#[test]
fn a_node_serves_through_the_loss_of_its_primary_or_its_mirror() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let (mut c, cluster, managers, mut clients) =
        common::bank_under_managers(&rt, "replication", "log-repl", CLIENTS);
    let mut failovers = Vec::new();
    // Node 1 loses its primary; node 2 its primary and the managers' leader at once.
    for (round, id) in [(0u64, 1u16), (1, 2)] {
        std::thread::sleep(Duration::from_millis(1500));
        let primary = rt.block_on(serving(&cluster, id));
        let name = c
            .local
            .process_at(id, &primary)
            .expect("a process of the node");
        assert_eq!(name, format!("node-{id}"), "served by its first primary");
        let before = clients.progress();
        c.local.kill(&name);
        if round == 1 {
            let old = rt.block_on(common::leader(&managers)).expect("a leader");
            c.local.kill_manager_id(old);
            std::thread::sleep(Duration::from_millis(300));
            c.local.start_manager_id(old).unwrap();
        }
        failovers.push(rt.block_on(until_served(&cluster, id, round)));
        let now = rt.block_on(serving(&cluster, id));
        assert_eq!(
            c.local.process_at(id, &now).as_deref(),
            Some(format!("node-{id}-mirror").as_str()),
            "the mirror serves node {id}"
        );
        assert!(
            clients.progress() > before,
            "round {round}: the bank goes on"
        );
        // The replaced primary, started again, is refused and stops.
        c.local.start_primary(id).unwrap();
        let (exited, status) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), c.local.exited())
                .await
                .expect("the replaced primary stops")
        });
        assert_eq!(exited, format!("node-{id}"));
        assert_eq!(
            status.code(),
            Some(tutti_memnode::EXIT_REPLACED),
            "{status}"
        );
    }
    // Node 1's replaced primary comes back as a mirror: it is filled from the node's new
    // primary while the bank runs, joins, and takes over when that primary is killed.
    let mut joins = Vec::new();
    c.local.restart_as_mirror("node-1").unwrap();
    let old_primary = c.local.file.nodes[0].addr.clone();
    joins.push(rt.block_on(until_mirror(&cluster, 1, &old_primary)));
    std::thread::sleep(Duration::from_millis(500));
    let before = clients.progress();
    c.local.kill("node-1-mirror");
    failovers.push(rt.block_on(until_served(&cluster, 1, 7)));
    assert_eq!(
        rt.block_on(serving(&cluster, 1)),
        old_primary,
        "the joined copy serves"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(clients.progress() > before, "the bank goes on");
    // Node 3 loses its mirror: the primary goes on alone once the manager drops it.
    let before = clients.progress();
    c.local.kill("node-3-mirror");
    let alone = rt.block_on(until_served(&cluster, 3, 9));
    assert_eq!(
        rt.block_on(serving(&cluster, 3)),
        c.local.file.nodes[2].addr,
        "node 3's primary still serves"
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert!(clients.progress() > before, "the bank goes on");
    // Started again, the dropped mirror joins anew.
    c.local.start_mirror(3).unwrap();
    let mirror3 = c.local.file.nodes[2].mirror.clone().expect("a mirror").addr;
    joins.push(rt.block_on(until_mirror(&cluster, 3, &mirror3)));
    eprintln!(
        "fail-over (kill to a committed write on the node): {failovers:?}; a lost mirror: \
         {alone:?}; a new mirror joining (start to named): {joins:?}"
    );
    for elapsed in &failovers {
        assert!(*elapsed < Duration::from_secs(5), "{failovers:?}");
    }
    clients.kill_all();
    rt.block_on(chaos::verify(&c.local, &clients))
        .unwrap_or_else(|v| panic!("violations: {v:#?}"));
    assert!(clients.seen.iter().sum::<u64>() > 100, "{:?}", clients.seen);
    // Every node's log is collected once quiet. Node 2's (promoted while the managers'
    // leader was killed) is collected through the GC backstop here, which must ask each
    // peer where it is served now: an old primary's address answers again, as a mirror.
    rt.block_on(chaos::wait_log_collected(&cluster, Duration::from_secs(45)))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Writers retry on node 1 while its mirror takes over: the directory names the mirror at
/// once, the mirror refuses them (`NotReady`) until it has waited out the old primary's
/// lease, then stops serving its connections and listens again as the node. None of the
/// writers was in flight when the primary died, so each write must end committed or
/// aborted, never `OutcomeUnknown`. Before `GoingAway`, a retry in flight when the promoted
/// mirror closed its connections lost its vote, and fail-over tests failed now and then.
#[test]
fn writers_retrying_through_a_promotion_learn_every_outcome() {
    const WRITERS: u64 = 16;
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let mut c = common::start("promotion-writers", 1, "log-repl", &[], &[]);
    let eager = rt.block_on(async {
        common::ready(&c).await;
        let opts = tutti_client::ClientOptions {
            backoff_initial: Duration::from_millis(1),
            backoff_max: Duration::from_millis(2),
            dialer: c.local.dialer(),
            ..Default::default()
        };
        let eager = tutti_client::Cluster::connect(&c.local.file.manager, opts)
            .await
            .unwrap();
        // A new mirror holds no copy yet: it joins its primary before it may take over.
        let mirror = c.local.file.nodes[0].mirror.clone().expect("a mirror").addr;
        until_mirror(&eager, 1, &mirror).await;
        until_served(&eager, 1, 0).await;
        eager
    });
    c.local.kill("node-1");
    // The client hears its connection to the dead primary close before anyone writes.
    std::thread::sleep(Duration::from_millis(200));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let eager = eager.clone();
            rt.spawn(async move {
                let started = Instant::now();
                let (mut commits, mut unknown) = (0, Vec::new());
                while commits < 3 && started.elapsed() < Duration::from_secs(30) {
                    let tx = tutti_client::Minitx::new().write(1, w * 8, vec![commits; 8]);
                    match eager.exec_and_commit(&tx).await {
                        Ok(out) if out.committed => commits += 1,
                        Err(e @ tutti_client::ExecError::OutcomeUnknown { .. }) => {
                            unknown.push(e.to_string())
                        }
                        _ => {}
                    }
                }
                (commits, unknown)
            })
        })
        .collect();
    for writer in writers {
        let (commits, unknown) = rt.block_on(writer).unwrap();
        assert!(unknown.is_empty(), "{unknown:#?}");
        assert_eq!(commits, 3, "the node is served again");
    }
    let now = rt.block_on(serving(&eager, 1));
    assert_eq!(
        c.local.process_at(1, &now).as_deref(),
        Some("node-1-mirror")
    );
}

/// A `log-repl` copy whose redo log was damaged at rest (one bit flipped in a record
/// already synced) does not cut its log there, which would drop what follows: it refuses
/// the log, gives its copy up (marked empty) and exits; started again, it joins its
/// primary, and promoted later it serves what was written before.
#[test]
fn a_copy_whose_log_was_damaged_gives_it_up_and_joins_again() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let mut c = common::start("damaged-log", 1, "log-repl", &[], &[]);
    let mirror = c.local.file.nodes[0].mirror.clone().expect("a mirror");
    let (cluster, named) = rt.block_on(async {
        let cluster = common::ready(&c).await;
        until_mirror(&cluster, 1, &mirror.addr).await;
        let tx = tutti_client::Minitx::new().write(1, 0, b"hello".to_vec());
        assert!(cluster.exec_and_commit(&tx).await.unwrap().committed);
        let named = placement(&cluster, 1).await.config_epoch;
        (cluster, named)
    });
    c.local.kill("node-1-mirror");
    let mut segments: Vec<_> = std::fs::read_dir(mirror.data.join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    let segment = segments.pop().expect("a segment");
    let mut bytes = std::fs::read(&segment).unwrap();
    // Inside the first record's payload (the 32-byte segment header, then its frame).
    bytes[32 + 8 + 12] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();
    c.local.restart_as_mirror("node-1-mirror").unwrap();
    let (name, status) = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), c.local.exited())
            .await
            .expect("the damaged copy exits")
    });
    assert_eq!(name, "node-1-mirror");
    assert!(!status.success(), "{status}");
    let said = c.local.log_tail("node-1-mirror");
    assert!(said.contains("is damaged at byte 32"), "{said}");
    assert!(
        mirror.data.join("empty").exists(),
        "marked as holding no copy"
    );
    c.local.restart_as_mirror("node-1-mirror").unwrap();
    rt.block_on(async {
        let started = Instant::now();
        loop {
            let p = placement(&cluster, 1).await;
            if p.mirror.as_deref() == Some(&mirror.addr) && p.config_epoch > named {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{p:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    c.local.kill("node-1");
    let read = tutti_client::Minitx::new().read(1, 0, 5);
    let out = rt.block_on(cluster.exec_and_commit(&read)).unwrap();
    assert_eq!(
        out.reads,
        vec![b"hello".to_vec()],
        "served by the copy that joined"
    );
}
