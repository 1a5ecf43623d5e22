//! The namespace and ledgers as users run them, over real memory nodes, manager and
//! sequencer: ZooKeeper's versions, sequential names and errors; multi all or nothing;
//! ephemeral nodes that go when their session expires, including a client that is only
//! paused; one-shot watches in log order; a subtree moved between namespaces in one
//! transaction, never seen half done; a ledger whose fenced writer cannot add.

use crate::common;

use std::time::Duration;
use tutti_log::Log;
use tutti_tango::{
    ChangeKind, Code, Kind, LedgerRef, NamespaceRef, Op, OpResult, Session, Tango, TangoError,
    TangoOptions, WatchKind, Watches, ANY_VERSION,
};

async fn open(log: &Log, objects: &[(&str, Kind)]) -> Tango {
    Tango::open(log.clone(), objects, TangoOptions::default())
        .await
        .expect("opened")
}

fn code<T: std::fmt::Debug>(r: Result<T, TangoError>) -> Code {
    match r {
        Err(TangoError::Namespace { code, .. }) => code,
        other => panic!("expected a namespace failure, got {other:?}"),
    }
}

fn create(path: &str) -> Op {
    Op::Create {
        path: path.into(),
        data: vec![],
        session: 0,
        sequential: false,
    }
}

#[test]
fn versions_sequential_names_multi_and_errors_are_zookeepers() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("ns-semantics", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "tango").await;
        let a = open(&log, &[("zk", Kind::Namespace)]).await;
        let b = open(&log, &[("zk", Kind::Namespace)]).await;
        let ns = NamespaceRef(a.hosted_as("zk", Kind::Namespace).unwrap());

        assert_eq!(
            ns.create(&a, "/app", b"v0", None, false).await.unwrap(),
            "/app"
        );
        let (data, stat) = ns.get(&b, "/app").await.unwrap();
        assert_eq!((data.as_slice(), stat.version), (&b"v0"[..], 0));
        assert_eq!(ns.set(&b, "/app", b"v1", 0).await.unwrap(), 1);
        assert_eq!(
            code(ns.set(&a, "/app", b"stale", 0).await),
            Code::BadVersion
        );
        assert_eq!(ns.set(&a, "/app", b"v2", ANY_VERSION).await.unwrap(), 2);
        assert_eq!(
            code(ns.create(&b, "/app", b"", None, false).await),
            Code::NodeExists
        );
        assert_eq!(
            code(ns.create(&b, "/none/x", b"", None, false).await),
            Code::NoNode
        );
        assert_eq!(code(ns.get(&b, "/none").await), Code::NoNode);

        let mut names = vec![];
        for t in [&a, &b, &a] {
            names.push(ns.create(t, "/app/lock-", b"", None, true).await.unwrap());
        }
        assert_eq!(
            names,
            [
                "/app/lock-0000000000",
                "/app/lock-0000000001",
                "/app/lock-0000000002"
            ]
        );
        assert_eq!(
            code(ns.delete(&a, "/app", ANY_VERSION).await),
            Code::NotEmpty
        );
        assert_eq!(ns.children(&b, "/app").await.unwrap().len(), 3);

        // A multi whose last operation fails leaves no trace of the others.
        let ops = [
            create("/batch"),
            create("/batch/one"),
            Op::Delete {
                path: "/app/lock-0000000000".into(),
                version: 0,
            },
            Op::Check {
                path: "/app".into(),
                version: 1,
            },
        ];
        let failed = ns.multi(&b, &ops).await;
        assert_eq!(code(failed), Code::BadVersion);
        assert_eq!(ns.exists(&a, "/batch").await.unwrap(), None);
        assert!(ns
            .exists(&a, "/app/lock-0000000000")
            .await
            .unwrap()
            .is_some());
        let mut ops = ops.to_vec();
        ops[3] = Op::Check {
            path: "/app".into(),
            version: 2,
        };
        let results = ns.multi(&b, &ops).await.unwrap();
        assert_eq!(results[0], OpResult::Created("/batch".into()));
        assert_eq!(ns.children(&a, "/batch").await.unwrap(), ["one"]);
        assert_eq!(ns.children(&a, "/app").await.unwrap().len(), 2);

        let bad = ns.create(&a, "relative", b"", None, false).await;
        assert!(matches!(bad, Err(TangoError::BadPath { .. })), "{bad:?}");
        let long = format!("/{}", "x".repeat(2000));
        let bad = ns.get(&a, &long).await;
        assert!(matches!(bad, Err(TangoError::BadPath { .. })), "{bad:?}");
    });
}

#[test]
fn ephemerals_go_when_their_session_expires_even_if_its_client_was_only_paused() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("ns-sessions", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "tango").await;
        let owner = open(&log, &[("zk", Kind::Namespace)]).await;
        let other = open(&log, &[("zk", Kind::Namespace)]).await;
        let ns = NamespaceRef(owner.hosted_as("zk", Kind::Namespace).unwrap());
        let timeout = Duration::from_millis(600);
        let session = Session::open(&owner, ns, timeout).await.unwrap();
        let beating = session.keep_alive(&owner, ns);
        ns.create(&owner, "/members", b"", None, false)
            .await
            .unwrap();
        let me = ns
            .create(&owner, "/members/m-", b"", Some(&session), true)
            .await
            .unwrap();
        assert_eq!(
            code(
                ns.create(&owner, &format!("{me}/x"), b"", None, false)
                    .await
            ),
            Code::NoChildrenForEphemerals
        );

        // While it beats, nobody can expire it.
        for _ in 0..6 {
            tokio::time::sleep(timeout / 3).await;
            assert_eq!(ns.expire_overdue(&other).await.unwrap(), Vec::<u64>::new());
        }
        assert_eq!(
            ns.get(&other, &me).await.unwrap().1.ephemeral_owner,
            session.id
        );

        // The owner stops beating (paused, not dead): the other client expires it.
        beating.abort();
        tokio::time::sleep(timeout + Duration::from_millis(200)).await;
        assert_eq!(ns.expire_overdue(&other).await.unwrap(), vec![session.id]);
        assert_eq!(
            ns.exists(&owner, &me).await.unwrap(),
            None,
            "every view agrees"
        );
        assert!(ns.children(&other, "/members").await.unwrap().is_empty());
        // When it wakes up, its session is gone for good.
        assert!(!session.beat(&owner, ns).await.unwrap());
        let late = ns
            .create(&owner, "/members/m-", b"", Some(&session), true)
            .await;
        assert_eq!(code(late), Code::SessionExpired);

        // A closed session takes its ephemerals at once.
        let second = Session::open(&owner, ns, timeout).await.unwrap();
        ns.create(&owner, "/e", b"", Some(&second), false)
            .await
            .unwrap();
        second.close(&owner, ns).await.unwrap();
        assert_eq!(ns.exists(&other, "/e").await.unwrap(), None);
    });
}

#[test]
fn watches_fire_once_and_in_log_order() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("ns-watches", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "tango").await;
        let writer = open(&log, &[("zk", Kind::Namespace)]).await;
        let watcher = open(&log, &[("zk", Kind::Namespace)]).await;
        let ns = NamespaceRef(writer.hosted_as("zk", Kind::Namespace).unwrap());
        let mut watches = Watches::new(ns);
        assert_eq!(
            watches
                .watch(&watcher, "/w", WatchKind::Data)
                .await
                .unwrap(),
            None
        );
        watches
            .watch(&watcher, "/", WatchKind::Children)
            .await
            .unwrap();
        ns.create(&writer, "/w", b"", None, false).await.unwrap();
        ns.set(&writer, "/w", b"1", 0).await.unwrap();
        ns.set(&writer, "/w", b"2", 1).await.unwrap();
        let events = watches.poll(&watcher).await.unwrap();
        let seen: Vec<_> = events.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        assert_eq!(
            seen,
            [
                ("/w", ChangeKind::Created),
                ("/", ChangeKind::ChildrenChanged)
            ]
        );
        assert!(events[0].position <= events[1].position);
        assert!(watches.is_empty(), "one-shot: both fired and are gone");
        assert!(watches.poll(&watcher).await.unwrap().is_empty());

        watches
            .watch(&watcher, "/w", WatchKind::Data)
            .await
            .unwrap();
        watches
            .watch(&watcher, "/w", WatchKind::Children)
            .await
            .unwrap();
        ns.create(&writer, "/w/c", b"", None, false).await.unwrap();
        ns.set(&writer, "/w", b"3", 2).await.unwrap();
        let events = watches.poll(&watcher).await.unwrap();
        let seen: Vec<_> = events.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        assert_eq!(
            seen,
            [
                ("/w", ChangeKind::ChildrenChanged),
                ("/w", ChangeKind::DataChanged)
            ]
        );
        assert!(events[0].position < events[1].position);
    });
}

#[test]
fn a_subtree_moves_between_namespaces_whole_or_not_at_all() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("ns-move", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "tango").await;
        let both = [("east", Kind::Namespace), ("west", Kind::Namespace)];
        let mover = open(&log, &both).await;
        let east = NamespaceRef(mover.hosted_as("east", Kind::Namespace).unwrap());
        let west = NamespaceRef(mover.hosted_as("west", Kind::Namespace).unwrap());
        let only_west = open(&log, &[("west", Kind::Namespace)]).await;
        for path in ["/job", "/job/a", "/job/a/x", "/job/b"] {
            east.create(&mover, path, path.as_bytes(), None, false)
                .await
                .unwrap();
        }

        // A change to the source between the reads and the commit aborts the move: nothing
        // of it is visible anywhere.
        mover.sync().await.unwrap();
        let mut tx = mover.begin();
        east.get_in(&mover, &mut tx, "/job").unwrap();
        west.multi_in(&mut tx, &[create("/half")]).unwrap();
        east.multi_in(
            &mut tx,
            &[Op::Delete {
                path: "/job/b".into(),
                version: 0,
            }],
        )
        .unwrap();
        // The same client writing after the reads still conflicts with them.
        east.set(&mover, "/job", b"changed", ANY_VERSION)
            .await
            .unwrap();
        assert!(!mover.end(tx).await.unwrap().committed);
        assert_eq!(west.exists(&only_west, "/half").await.unwrap(), None);
        assert!(east.exists(&mover, "/job/b").await.unwrap().is_some());

        assert!(
            NamespaceRef::move_subtree(&mover, (east, "/job"), (west, "/moved"))
                .await
                .unwrap()
        );
        assert_eq!(east.exists(&mover, "/job").await.unwrap(), None);
        let (data, _) = west.get(&only_west, "/moved/a/x").await.unwrap();
        assert_eq!(data, b"/job/a/x");
        assert_eq!(
            west.children(&only_west, "/moved").await.unwrap(),
            ["a", "b"]
        );
        let again = NamespaceRef::move_subtree(&mover, (east, "/job"), (west, "/moved")).await;
        assert_eq!(code(again), Code::NoNode);
    });
}

#[test]
fn a_recovered_ledger_fences_its_writer_and_readers_stop_at_its_length() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("ledger-fence", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "tango").await;
        let w = open(&log, &[("wal", Kind::Ledger)]).await;
        let r = open(&log, &[("wal", Kind::Ledger)]).await;
        let ledger = LedgerRef(w.hosted_as("wal", Kind::Ledger).unwrap());
        let writer = ledger.open_writer(&w).await.unwrap();
        let second = ledger.open_writer(&r).await;
        assert!(
            matches!(second, Err(TangoError::LedgerFenced { .. })),
            "{second:?}"
        );
        for i in 0..5u8 {
            assert_eq!(writer.add(&w, &[i]).await.unwrap(), u64::from(i));
        }
        assert_eq!(ledger.length(&r).await.unwrap(), (5, false));
        assert_eq!(ledger.recover(&r).await.unwrap(), 5);
        let late = writer.add(&w, b"late").await;
        assert!(
            matches!(late, Err(TangoError::LedgerFenced { .. })),
            "{late:?}"
        );
        assert!(matches!(
            writer.close(&w).await,
            Err(TangoError::LedgerFenced { .. })
        ));
        let entries = ledger.read(&r, 0, 100).await.unwrap();
        assert_eq!(entries, (0..5u8).map(|i| vec![i]).collect::<Vec<_>>());
        assert_eq!(ledger.length(&w).await.unwrap(), (5, true));
    });
}

/// `tutti ns` as scripts use it: JSON out, ZooKeeper's codes on failure with exit 1; an
/// ephemeral node held by a process that is then stopped (SIGSTOP, paused, not dead) goes
/// when its session expires, and the process learns it when it wakes; `watch` prints each
/// change in log order.
#[test]
fn the_command_line_speaks_zookeeper() {
    use std::process::{Command, Stdio};
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("ns-cli", 2, "log", &[], &[]);
    rt.block_on(common::ready(&c));
    let manager = c.local.file.manager.clone();
    let tutti = |args: &[&str]| {
        let mut cmd = Command::new(common::exe());
        cmd.args(["ns", "--cluster", &manager]).args(args);
        cmd
    };
    let ns = |args: &[&str]| {
        let out = tutti(args).output().expect("tutti runs");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.code(), stdout)
    };
    assert_eq!(ns(&["ls", "/"]), (Some(0), r#"{"children":[]}"#.into()));
    assert_eq!(
        ns(&["get", "/a"]),
        (Some(1), r#"{"error":"no-node","path":"/a"}"#.into())
    );
    let mut watch = tutti(&["watch", "/a"]);
    assert_eq!(
        ns(&["create", "/a", "--data", "01"]),
        (Some(0), r#"{"path":"/a"}"#.into())
    );
    let mut watch = watch
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    let mut stderr = std::io::BufReader::new(watch.stderr.take().unwrap());
    std::io::BufRead::read_line(&mut stderr, &mut ready).unwrap();
    assert!(ready.contains("watching /a"), "{ready}");

    assert_eq!(
        ns(&["set", "/a", "02", "--version", "0"]),
        (Some(0), r#"{"version":1}"#.into())
    );
    assert_eq!(
        ns(&["set", "/a", "03", "--version", "0"]),
        (Some(1), r#"{"error":"bad-version","path":"/a"}"#.into())
    );
    let (code, out) = ns(&["create", "/a/q-", "--sequential"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), r#"{"path":"/a/q-0000000000"}"#)
    );
    assert_eq!(
        ns(&["delete", "/a"]),
        (Some(1), r#"{"error":"not-empty","path":"/a"}"#.into())
    );
    assert_eq!(
        ns(&["ls", "/a"]),
        (Some(0), r#"{"children":["q-0000000000"]}"#.into())
    );
    let (_, got) = ns(&["get", "/a"]);
    assert!(
        got.contains(r#""data":"02""#) && got.contains(r#""version":1"#),
        "{got}"
    );
    assert_eq!(
        ns(&["create", "/a/q-0000000000/x", "--bad"]).0,
        Some(2),
        "clap refuses an unknown flag"
    );
    assert_eq!(
        ns(&["create", "a"]),
        (Some(1), r#"{"error":"bad-arguments","path":"a"}"#.into())
    );

    // An ephemeral node held by a process that is then paused past its session's timeout.
    let mut holder = tutti(&["create", "/a/q-0000000000/../x", "--ephemeral"]);
    assert_eq!(holder.output().unwrap().status.code(), Some(1), "bad path");
    holder = tutti(&[
        "create",
        "/member",
        "--ephemeral",
        "--hold",
        "--session-timeout-ms",
        "800",
    ]);
    let mut holder = holder.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(line.contains(r#""path":"/member""#), "{line}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        ns(&["get", "/member"]).0,
        Some(0),
        "kept alive while it runs"
    );
    let pid = holder.id().to_string();
    Command::new("kill").args(["-STOP", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        ns(&["get", "/member"]),
        (Some(1), r#"{"error":"no-node","path":"/member"}"#.into()),
        "expired through the log by the next caller"
    );
    Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    let status = holder.wait().unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(status.code(), Some(1));
    assert!(line.contains("session-expired"), "{line}");

    Command::new("kill")
        .args(["-INT", &watch.id().to_string()])
        .status()
        .unwrap();
    let watched = watch.wait_with_output().unwrap();
    let events: Vec<String> = String::from_utf8_lossy(&watched.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            format!(
                "{} {}",
                v["event"].as_str().unwrap(),
                v["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(events, ["data-changed /a", "children-changed /a"]);
}
