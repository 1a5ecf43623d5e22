//! A coordinator that dies between the phases, and bad input of every kind, against real
//! memory node processes.

use crate::common;

use rand::{Rng, RngCore};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tutti_client::{ClientOptions, Cluster, ExecError, Minitx};
use tutti_wire::{
    Connection, ErrorCode, ExecPrepare, Item, Request, Response, Tid, Vote, FRAME_BYTES_MAX_DEFAULT,
};

async fn raw(c: &common::TestCluster, node: u16) -> Connection {
    let addr = &c
        .local
        .file
        .nodes
        .iter()
        .find(|n| n.id == node)
        .unwrap()
        .addr;
    Connection::connect(addr, FRAME_BYTES_MAX_DEFAULT, &Default::default())
        .await
        .unwrap()
}

fn prepare(t: Tid, participants: Vec<u16>, items: Vec<Item>) -> Request {
    let read_only = !items.iter().any(Item::writes);
    Request::ExecPrepare(ExecPrepare {
        tid: t,
        participants,
        class: "raw".into(),
        read_only,
        items,
        executed: 0,
        lock_wait_ms: 0,
    })
}

async fn vote(conn: &Connection, req: &Request) -> Vote {
    match conn.call(req).await.unwrap() {
        Response::Vote(v) => v.vote,
        other => panic!("expected a vote, got {other:?}"),
    }
}

/// The pid of process `name` (`node-2`, say) of `c`.
fn pid_of(c: &common::TestCluster, name: &str) -> i32 {
    (c.local.process_entries(&Default::default()).into_iter())
        .find(|p| p.name == name)
        .and_then(|p| p.pid)
        .unwrap_or_else(|| panic!("{name}'s pid")) as i32
}

/// Kills node 1, stops node 2 (SIGSTOP) and starts node 1 again, whose stage 2 then waits
/// for node 2 until the pid returned gets SIGCONT.
fn restart_1_with_2_frozen(c: &mut common::TestCluster) -> i32 {
    let pid_2 = pid_of(c, "node-2");
    c.local.kill_node(1);
    unsafe { libc::kill(pid_2, libc::SIGSTOP) };
    c.local.start_node(1).unwrap();
    pid_2
}

/// A client of `c` that gives up after `deadline`.
async fn client(c: &common::TestCluster, deadline: Duration) -> Cluster {
    let opts = ClientOptions {
        deadline,
        dialer: c.local.dialer(),
        ..Default::default()
    };
    Cluster::connect(&c.local.file.manager, opts).await.unwrap()
}

fn w(v: u8) -> Item {
    Item::Write {
        addr: 0,
        bytes: vec![v; 8],
    }
}

#[test]
fn coordinator_crash_between_phases_is_recovered_by_the_manager() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let c = common::start(
        "coord-crash",
        2,
        "log",
        &["--timeout-uncertain-ms", "1000"],
        &[],
    );
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let epoch = 1;
        let coordinator = rand::thread_rng().gen();
        // Orphan 1: both participants voted COMMIT-OK, then the coordinator vanished.
        // The minitransaction is committed (every vote is in a log) and must become visible.
        let (n1, n2) = (raw(&c, 1).await, raw(&c, 2).await);
        let t1 = Tid {
            epoch,
            coordinator,
            seq: 1,
        };
        assert_eq!(
            vote(&n1, &prepare(t1, vec![1, 2], vec![w(0xaa)])).await,
            Vote::CommitOk
        );
        assert_eq!(
            vote(&n2, &prepare(t1, vec![1, 2], vec![w(0xaa)])).await,
            Vote::CommitOk
        );
        drop((n1, n2));
        // Meanwhile its locks are held: a short-deadline minitransaction on them does not
        // commit (the compares below see the orphan's values). It times out, or, when its
        // last attempt's vote (ABORT-LOCK after waiting for the lock) comes back after the
        // deadline on a loaded machine, its outcome is unknown: that vote was lost, and
        // the node's "no vote" to REQUEST-ABORT is not conclusive (docs/protocol.md).
        let short = Cluster::connect(
            &c.local.file.manager,
            ClientOptions {
                deadline: Duration::from_millis(300),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let err = short
            .exec_and_commit(&Minitx::new().write(1, 0, vec![1; 8]))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ExecError::Timeout { .. } | ExecError::OutcomeUnknown { .. }
            ),
            "{err}"
        );
        // The recovery coordinator commits it within the timeout (plus a heartbeat or two).
        let start = Instant::now();
        let cas = Minitx::new()
            .compare(1, 0, vec![0xaa; 8])
            .compare(2, 0, vec![0xaa; 8])
            .write(1, 0, vec![1; 8])
            .write(2, 0, vec![1; 8]);
        let out = cluster.exec_and_commit(&cas).await.unwrap();
        assert!(
            out.committed,
            "the orphan committed, so its values are visible: {out:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "recovered in {:?}",
            start.elapsed()
        );

        // The Decision of that minitransaction is one-way: wait until it released its locks,
        // which a request on another connection could otherwise find still held.
        common::assert_idle(&cluster, Duration::from_secs(5)).await;

        // Orphan 2: only node 1 was asked before the crash. Recovery forces node 2 to abort,
        // so the minitransaction aborts and a late EXEC&PREPARE from the slow coordinator
        // is refused with ABORT-FORCED.
        let n1 = raw(&c, 1).await;
        let t2 = Tid {
            epoch,
            coordinator,
            seq: 2,
        };
        assert_eq!(
            vote(&n1, &prepare(t2, vec![1, 2], vec![w(0xbb)])).await,
            Vote::CommitOk
        );
        drop(n1);
        let read = Minitx::new().read(1, 0, 8).write(2, 8, vec![0; 8]);
        let out = cluster.exec_and_commit(&read).await.unwrap();
        assert_eq!(out.reads[0], vec![1; 8], "the half-prepared orphan aborted");
        let n2 = raw(&c, 2).await;
        assert_eq!(
            vote(&n2, &prepare(t2, vec![1, 2], vec![w(0xbb)])).await,
            Vote::AbortForced
        );
        common::assert_idle(&cluster, Duration::from_secs(5)).await;
    });
}

/// A node restarting with a tid undecided in its log, whose other participant is frozen,
/// serves everything but that tid's bytes at once; its stage 2 waits for the peer meanwhile
/// and commits the tid once the peer answers. It served nothing until then: Sinfonia's
/// recovery blocks while a participant is down (a promoted copy so waited 4 s under chaos).
#[test]
fn a_restart_serves_while_stage_2_waits_for_a_frozen_peer() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    // The manager's recovery coordinator must not decide the orphan before node 1 restarts.
    let flags = ["--timeout-uncertain-ms", "600000"];
    let mut c = common::start("serve-undecided", 2, "log", &flags, &[]);
    let orphan = Tid {
        epoch: 1,
        coordinator: rand::thread_rng().gen(),
        seq: 1,
    };
    rt.block_on(async {
        common::ready(&c).await;
        let (n1, n2) = (raw(&c, 1).await, raw(&c, 2).await);
        for n in [&n1, &n2] {
            let ep = prepare(orphan, vec![1, 2], vec![w(0xaa)]);
            assert_eq!(vote(n, &ep).await, Vote::CommitOk);
        }
    });
    let pid_2 = restart_1_with_2_frozen(&mut c);
    let served = rt.block_on(async {
        let patient = client(&c, Duration::from_secs(20)).await;
        let started = Instant::now();
        let elsewhere = Minitx::new().write(1, 4096, vec![1; 8]);
        let out = patient.exec_and_commit(&elsewhere).await;
        let took = started.elapsed();
        let short = client(&c, Duration::from_millis(300)).await;
        let on_the_orphan = Minitx::new().write(1, 0, vec![1; 8]);
        (out, took, short.exec_and_commit(&on_the_orphan).await)
    });
    unsafe { libc::kill(pid_2, libc::SIGCONT) };
    let (out, took, on_the_orphan) = served;
    eprintln!(
        "node 1 served after {took:?} of its restart; on the orphan's bytes: {on_the_orphan:?}"
    );
    assert!(
        out.as_ref().is_ok_and(|o| o.committed),
        "{out:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(5), "served after {took:?}");
    assert!(
        held_back(&on_the_orphan),
        "the orphan's bytes are locked until stage 2 decides it: {on_the_orphan:?}"
    );
    let cas = Minitx::new()
        .compare(1, 0, vec![0xaa; 8])
        .compare(2, 0, vec![0xaa; 8])
        .write(1, 0, vec![2; 8])
        .write(2, 0, vec![2; 8]);
    rt.block_on(commits_once_thawed(
        &c,
        &cas,
        "stage 2 committed the orphan",
    ));
}

/// Whether a minitransaction on bytes a stage 2 holds locked ran into them.
fn held_back(out: &Result<tutti_client::Outcome, ExecError>) -> bool {
    matches!(
        out,
        Err(ExecError::Timeout { .. } | ExecError::OutcomeUnknown { .. })
    )
}

/// Once the frozen peer is back, `cas` (which compares what stage 2 should have committed)
/// commits, and the cluster ends with nothing locked or uncertain.
async fn commits_once_thawed(c: &common::TestCluster, cas: &Minitx, what: &str) {
    let cluster = client(c, Duration::from_secs(20)).await;
    let out = cluster.exec_and_commit(cas).await.unwrap();
    assert!(out.committed, "{what}: {out:?}");
    common::assert_idle(&cluster, Duration::from_secs(5)).await;
}

/// Stage 2 decides each undecided tid as soon as its own participants answer: with one peer
/// frozen, a restarting node commits (and unlocks) at once the tid it shares with the other
/// peer, and keeps locked only the frozen peer's. Before, it asked its peers one after the
/// other, the frozen one first here, and applied nothing until all had answered.
#[test]
fn a_frozen_peer_holds_back_only_the_tids_it_takes_part_in() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let flags = ["--timeout-uncertain-ms", "600000"];
    let mut c = common::start("stage2-per-tid", 3, "log", &flags, &[]);
    let orphan = |seq| Tid {
        epoch: 1,
        coordinator: rand::thread_rng().gen(),
        seq,
    };
    let (with_2, with_3) = (orphan(1), orphan(2));
    let at = |addr, v| Item::Write {
        addr,
        bytes: vec![v; 8],
    };
    rt.block_on(async {
        common::ready(&c).await;
        let n = [raw(&c, 1).await, raw(&c, 2).await, raw(&c, 3).await];
        for (node, tid, addr, v) in [
            (0, with_2, 0, 0xaa),
            (1, with_2, 0, 0xaa),
            (0, with_3, 4096, 0xbb),
            (2, with_3, 0, 0xbb),
        ] {
            let peers = if tid == with_2 {
                vec![1, 2]
            } else {
                vec![1, 3]
            };
            let ep = prepare(tid, peers, vec![at(addr, v)]);
            assert_eq!(vote(&n[node], &ep).await, Vote::CommitOk);
        }
    });
    let pid_2 = restart_1_with_2_frozen(&mut c);
    let (shared_with_3, shared_with_2) = rt.block_on(async {
        let patient = client(&c, Duration::from_secs(10)).await;
        let with_3_committed = Minitx::new()
            .compare(1, 4096, vec![0xbb; 8])
            .compare(3, 0, vec![0xbb; 8])
            .write(1, 4096, vec![3; 8]);
        let shared_with_3 = patient.exec_and_commit(&with_3_committed).await;
        let short = client(&c, Duration::from_millis(300)).await;
        let on_with_2 = Minitx::new().write(1, 0, vec![1; 8]);
        (shared_with_3, short.exec_and_commit(&on_with_2).await)
    });
    unsafe { libc::kill(pid_2, libc::SIGCONT) };
    assert!(
        shared_with_3.as_ref().is_ok_and(|o| o.committed),
        "the tid node 1 shares with node 3 is decided while node 2 is frozen: {shared_with_3:?}"
    );
    assert!(
        held_back(&shared_with_2),
        "the tid node 1 shares with the frozen node 2 stays locked: {shared_with_2:?}"
    );
    let cas = Minitx::new()
        .compare(1, 0, vec![0xaa; 8])
        .compare(2, 0, vec![0xaa; 8])
        .write(1, 0, vec![2; 8]);
    rt.block_on(commits_once_thawed(
        &c,
        &cas,
        "stage 2 committed the other tid too",
    ));
}

/// A node that takes connections but never answers (its process stopped, as one cut off
/// or swapping): a write on it ends in `Timeout`, since its request never left the client,
/// at its deadline, and nothing is written. It ended `OutcomeUnknown`: a call still
/// connecting at the deadline counted as a delivered request whose vote was lost; and the
/// abort decision for the frozen node held the outcome up while it tried to connect.
#[test]
fn a_write_that_never_left_for_a_frozen_node_times_out() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let c = common::start("frozen-node", 2, "log", &[], &[]);
    let cluster = rt.block_on(common::ready(&c));
    let pid = pid_of(&c, "node-1");
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let (err, took) = rt.block_on(async {
        let fresh = client(&c, Duration::from_millis(500)).await;
        let write = Minitx::new()
            .write(1, 0, vec![7; 8])
            .write(2, 0, vec![7; 8]);
        let started = Instant::now();
        let err = fresh.exec_and_commit(&write).await.unwrap_err();
        (err, started.elapsed())
    });
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(matches!(err, ExecError::Timeout { .. }), "{err}");
    // Not held up by the abort decision to node 1, which cannot connect for 1 s.
    assert!(took < Duration::from_millis(1300), "{took:?}");
    let read = Minitx::new().read(1, 0, 8).read(2, 0, 8);
    let out = rt.block_on(cluster.exec_and_commit(&read)).unwrap();
    assert_eq!(
        out.reads,
        vec![vec![0; 8], vec![0; 8]],
        "nothing was written"
    );
}

#[test]
fn bad_input_gets_an_error_and_the_node_keeps_serving() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let c = common::start("bad-input", 2, "log", &[], &["--epoch-period-s", "1"]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        // A well-behaved client works throughout.
        let healthy = {
            let cluster = cluster.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                let until = Instant::now() + Duration::from_secs(6);
                while Instant::now() < until {
                    let tx = Minitx::new().add(1, 4096, 1).add(2, 4096, 1);
                    assert!(cluster.exec_and_commit(&tx).await.unwrap().committed);
                    n += 1;
                }
                n
            })
        };
        let addr = c.local.file.nodes[0].addr.clone();
        tokio::task::spawn_blocking(move || garbage(&addr))
            .await
            .unwrap();

        // Out-of-range addresses, unknown nodes, limits: clear errors.
        let size = 64u64 << 20;
        let err = cluster
            .exec_and_commit(&Minitx::new().write(1, size - 4, vec![0; 8]))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ExecError::Rejected { node: 1, message } if message.contains("outside")),
            "{err}"
        );
        let err = cluster
            .exec_and_commit(&Minitx::new().read(9, 0, 8))
            .await
            .unwrap_err();
        assert!(matches!(err, ExecError::UnknownNode(9)), "{err}");
        let err = cluster
            .exec_and_commit(&Minitx::new().write(1, 0, vec![0; (1 << 20) + 1]))
            .await
            .unwrap_err();
        assert!(matches!(err, ExecError::Invalid(_)), "{err}");
        let many = (0..4097).fold(Minitx::new(), |tx, i| tx.read(1, i * 8, 8));
        assert!(matches!(
            cluster.exec_and_commit(&many).await.unwrap_err(),
            ExecError::Invalid(_)
        ));
        let n1 = raw(&c, 1).await;
        let t = Tid {
            epoch: 1,
            coordinator: 5,
            seq: 1,
        };
        match n1.call(&prepare(t, vec![2, 3], vec![w(1)])).await {
            Err(tutti_wire::RpcError::Remote {
                code: ErrorCode::UnknownNode,
                ..
            }) => {}
            other => panic!("wrong node: {other:?}"),
        }
        // Stale epochs: once the epoch is 3 or more, a tid of epoch 1 votes abort.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = cluster.stats().await;
            if stats
                .iter()
                .all(|(_, s)| s.as_ref().is_ok_and(|s| s.epoch >= 3))
            {
                break;
            }
            assert!(Instant::now() < until, "epochs did not advance");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(
            vote(&n1, &prepare(Tid { seq: 2, ..t }, vec![1], vec![w(1)])).await,
            Vote::AbortEpoch
        );
        assert!(
            cluster
                .exec_and_commit(&Minitx::new().write(1, 0, vec![2; 8]))
                .await
                .unwrap()
                .committed,
            "clients learn the epoch and go on"
        );
        assert!(healthy.await.unwrap() > 10);
    });
}

/// Random bytes, truncated frames and oversized frames on a node's port: most sessions open
/// with a valid hello so that the frame decoder sees them, a third are refused at the hello.
fn garbage(addr: &str) {
    let mut rng = rand::thread_rng();
    let mut sessions: Vec<Vec<u8>> = (0..40)
        .map(|i| {
            let mut bytes = vec![0u8; rng.gen_range(4..4096)];
            rng.fill_bytes(&mut bytes);
            if i % 2 == 0 {
                // A plausible length prefix over random content.
                let len = (bytes.len() as u32).saturating_sub(4);
                bytes[..4].copy_from_slice(&len.to_be_bytes());
            }
            bytes
        })
        .collect();
    sessions.push([&100u32.to_be_bytes()[..], &[1, 2, 3]].concat()); // truncated
    sessions.push(0x7fff_ffffu32.to_be_bytes().to_vec()); // oversized
    sessions.push([&20u32.to_be_bytes()[..], &[0xff; 20]].concat());
    let hello = tutti_wire::handshake::hello(0, &[0; 16]);
    let sessions: Vec<Vec<u8>> = (sessions.into_iter().enumerate())
        .map(|(i, s)| {
            if i % 3 == 0 {
                s
            } else {
                [&hello[..], &s].concat()
            }
        })
        .collect();
    // A client that pipelines thousands of requests and never reads a reply.
    let flood: Vec<u8> = hello
        .into_iter()
        .chain((1..=20_000u64).flat_map(|id| {
            let frame = tutti_wire::encode_envelope(id, &Request::Stats);
            [(frame.len() as u32).to_be_bytes().to_vec(), frame.to_vec()].concat()
        }))
        .collect();
    let mut flooder = TcpStream::connect(addr).unwrap();
    flooder
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let _ = flooder.write_all(&flood);
    for bytes in sessions {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    drop(flooder);
}

#[test]
fn malformed_cli_items_are_refused_with_a_reason() {
    for item in [
        "read:1:0",
        "read:1:0xq:1",
        "cmp:1:0:abc",
        "cmp:1:0:zz",
        "cmp:0:0:00",
        "cmpop:1:0:about:3",
        "write:0:0:00",
        "add:1:0:one",
        "peek:1:0:1",
        "",
    ] {
        let out = std::process::Command::new(common::exe())
            .args([
                "txn",
                "--cluster",
                "127.0.0.1:1",
                "--deadline-ms",
                "100",
                item,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{item} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("item 0"), "{item}: {stderr}");
    }
    // Every kind well formed: parsed, then refused for the cluster only.
    let out = std::process::Command::new(common::exe())
        .args([
            "txn",
            "--cluster",
            "127.0.0.1:1",
            "--deadline-ms",
            "300",
            "read:1:0x10:8",
            "cmp:2:0:00ff",
            "cmpop:1:8:ge:5",
            "write:3:16:ab",
            "add:1:24:-3",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the manager"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
