//! Tango's objects as users run them: real memory nodes, manager and sequencer; several
//! clients with their own views of the same objects; transactions across objects hosted by
//! different clients; checkpoints, forget and trim; a writer that dies between its commit
//! record and its decision record; bad input refused with its own error.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;
use tutti_log::Log;
use tutti_tango::{
    CounterRef, Kind, Map, MapRef, QueueRef, Record, RegisterRef, Tango, TangoError, TangoOptions,
    Write,
};

type HashTable = std::collections::HashMap<Vec<u8>, Vec<u8>>;

async fn open(log: &Log, objects: &[(&str, Kind)]) -> Tango {
    let opts = TangoOptions {
        decision_timeout: Duration::from_millis(300),
    };
    Tango::open(log.clone(), objects, opts)
        .await
        .expect("opened")
}

#[test]
fn clients_with_their_own_views_see_each_others_updates() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-views", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "tango").await;
        let objects = [
            ("reg", Kind::Register),
            ("count", Kind::Counter),
            ("map", Kind::Map),
            ("queue", Kind::Queue),
        ];
        let a = open(&log, &objects).await;
        let b = open(&log, &objects).await;
        let reg = RegisterRef(a.hosted_as("reg", Kind::Register).unwrap());
        assert_eq!(b.hosted_as("reg", Kind::Register).unwrap(), reg.0);
        reg.set(&a, b"hello").await.unwrap();
        assert_eq!(reg.get(&b).await.unwrap(), b"hello");

        let count = CounterRef(a.hosted_as("count", Kind::Counter).unwrap());
        let adds = (0..40).map(|i| {
            let t = if i % 2 == 0 { a.clone() } else { b.clone() };
            async move { count.add(&t, 1).await.unwrap() }
        });
        let mut seen = futures::future::join_all(adds).await;
        seen.sort_unstable();
        assert_eq!(
            seen,
            (1..=40).collect::<Vec<i64>>(),
            "each add saw its own new value"
        );
        assert_eq!(count.get(&a).await.unwrap(), 40);

        let map: MapRef<HashTable> = MapRef::new(a.hosted_as("map", Kind::Map).unwrap());
        assert_eq!(map.put(&a, b"k", b"1").await.unwrap(), None);
        assert_eq!(map.put(&b, b"k", b"2").await.unwrap(), Some(b"1".to_vec()));
        assert_eq!(map.get(&a, b"k").await.unwrap(), Some(b"2".to_vec()));
        assert_eq!(map.delete(&a, b"k").await.unwrap(), Some(b"2".to_vec()));
        assert_eq!(map.get(&b, b"k").await.unwrap(), None);

        let queue = QueueRef(a.hosted_as("queue", Kind::Queue).unwrap());
        for i in 0..20u32 {
            queue.enqueue(&a, &i.to_le_bytes()).await.unwrap();
        }
        let takers = (0..24).map(|i| {
            let t = if i % 2 == 0 { a.clone() } else { b.clone() };
            async move { queue.dequeue(&t).await.unwrap() }
        });
        let taken = futures::future::join_all(takers).await;
        let mut items: Vec<u32> = taken
            .iter()
            .flatten()
            .map(|b| u32::from_le_bytes(b[..].try_into().unwrap()))
            .collect();
        items.sort_unstable();
        assert_eq!(
            items,
            (0..20).collect::<Vec<u32>>(),
            "every item dequeued exactly once"
        );
        assert_eq!(queue.len(&b).await.unwrap(), 0);
    });
}

/// A bank over 8 counters in 8 streams: client `p` hosts accounts 2p and 2p+1 only and
/// moves money out of them (a local read) into any account (a remote write). Every
/// client's committed transfers, replayed on the initial balances, give the final ones.
#[test]
fn transfers_across_layered_partitions_conserve_money_and_commit_exactly_once() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-bank", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "bank").await;
        let names: Vec<String> = (0..8).map(|i| format!("account-{i}")).collect();
        let all: Vec<(&str, Kind)> = names.iter().map(|n| (n.as_str(), Kind::Counter)).collect();
        let setup = open(&log, &[]).await;
        for name in &names {
            // Other clients write each account without hosting what the transfer read.
            setup.create(name, Kind::Counter, true).await.unwrap();
        }
        let auditor = open(&log, &all).await;
        let accounts: Vec<CounterRef> = (names.iter())
            .map(|n| CounterRef(auditor.hosted_as(n, Kind::Counter).unwrap()))
            .collect();
        for account in &accounts {
            account.add(&auditor, 100).await.unwrap();
        }
        let clients = (0..4).map(|p| {
            let (log, all, accounts) = (log.clone(), all.clone(), accounts.clone());
            async move {
                let t = open(&log, &all[2 * p..2 * p + 2]).await;
                let mut committed = Vec::new();
                let mut aborted = 0;
                for i in 0..60usize {
                    t.sync().await.unwrap();
                    let mut tx = t.begin();
                    let from = accounts[2 * p + i % 2];
                    let to = accounts[(2 * p + 3 * i + 1) % 8];
                    let balance = from.get_in(&t, &mut tx).unwrap();
                    let amount = (i as i64 % 7 + 1).min(balance);
                    from.add_in(&mut tx, -amount);
                    to.add_in(&mut tx, amount);
                    let outcome = t.end(tx).await.unwrap();
                    if outcome.committed {
                        committed.push((from.0, to.0, amount));
                    } else {
                        aborted += 1;
                    }
                }
                (committed, aborted)
            }
        });
        let results = futures::future::join_all(clients).await;
        let mut expected: BTreeMap<u32, i64> = accounts.iter().map(|a| (a.0, 100)).collect();
        for (committed, _) in &results {
            for &(from, to, amount) in committed {
                *expected.get_mut(&from).unwrap() -= amount;
                *expected.get_mut(&to).unwrap() += amount;
            }
        }
        let mut total = 0;
        for account in &accounts {
            let balance = account.get(&auditor).await.unwrap();
            assert_eq!(balance, expected[&account.0], "account {}", account.0);
            assert!(balance >= 0);
            total += balance;
        }
        assert_eq!(total, 800);
        let commits: usize = results.iter().map(|r| r.0.len()).sum();
        assert!(commits > 0, "some transfers committed");
    });
}

/// A writer dies after its commit record, before its decision record: a client that hosts
/// the written object but not the read set decides it by rebuilding the read set's views
/// after the timeout; a client that hosts the read set appends the missing decision.
#[test]
fn a_missing_decision_record_blocks_no_one() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-decisions", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "decisions").await;
        let setup = open(&log, &[]).await;
        let read = setup.create("read", Kind::Register, false).await.unwrap();
        let written = setup.create("written", Kind::Register, true).await.unwrap();
        RegisterRef(read.oid).set(&setup, b"r").await.unwrap();
        let both = open(
            &log,
            &[("read", Kind::Register), ("written", Kind::Register)],
        )
        .await;
        let mut tx = both.begin();
        RegisterRef(read.oid).get_in(&both, &mut tx).unwrap();
        RegisterRef(written.oid).set_in(&mut tx, b"from the dead writer");
        // The writer appends its commit record and dies before its decision record.
        let commit = tx.commit_record(true).encode();
        let position = log.append(commit, &[read.oid, written.oid]).await.unwrap();

        let partial = open(&log, &[("written", Kind::Register)]).await;
        let value = RegisterRef(written.oid).get(&partial).await.unwrap();
        assert_eq!(
            value, b"from the dead writer",
            "decided by replaying the read set"
        );
        // The client hosting both plays the commit, owes its decision, and pays it once
        // the timeout has passed.
        RegisterRef(written.oid).get(&both).await.unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        both.sync().await.unwrap();
        let mut stream = log.stream(written.oid, position);
        stream.sync().await.unwrap();
        let decisions: Vec<Record> = (stream.take_ready().into_values())
            .map(|p| Record::decode(&p).unwrap())
            .filter(|r| matches!(r, Record::Decision { .. }))
            .collect();
        assert!(!decisions.is_empty(), "a decision record was appended");
        for d in decisions {
            assert_eq!(
                d,
                Record::Decision {
                    commit: position,
                    committed: true
                }
            );
        }
    });
}

#[test]
fn checkpoints_rebuild_views_history_is_kept_and_forget_lets_the_log_be_trimmed() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-history", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "history").await;
        let t = open(&log, &[("m", Kind::Map)]).await;
        let map: MapRef<HashTable> = MapRef::new(t.hosted_as("m", Kind::Map).unwrap());
        let mut positions = Vec::new();
        for i in 0..200u32 {
            let key = format!("k{}", i % 50);
            let position = map
                .put_blind(&t, key.as_bytes(), &i.to_le_bytes())
                .await
                .unwrap();
            positions.push((position, i));
        }
        let as_of = t.checkpoint(map.0).await.unwrap();
        for i in 200..260u32 {
            map.put_blind(&t, b"k0", &i.to_le_bytes()).await.unwrap();
        }
        // The view as of a position before the checkpoint, rebuilt from the log.
        let (p100, _) = positions[100];
        let before = t.view_at("m", p100, |m: &Map| m.get(b"k0")).await.unwrap();
        assert_eq!(before, Some(50u32.to_le_bytes().to_vec()));
        let k0_then = t
            .view_at("m", p100 + 1, |m: &Map| m.get(b"k0"))
            .await
            .unwrap();
        assert_eq!(k0_then, Some(100u32.to_le_bytes().to_vec()));

        let forgot = t.forget("m", u64::MAX).await.unwrap();
        assert_eq!(forgot, as_of);
        t.checkpoint(tutti_tango::DIRECTORY_OID).await.unwrap();
        t.forget(".", u64::MAX).await.unwrap();
        let trimmed = t.trim().await.unwrap();
        assert!(trimmed >= as_of.min(200), "trimmed at {trimmed}");
        assert!(log.trim_point().await.unwrap() >= trimmed);

        let fresh = open(&log, &[("m", Kind::Map)]).await;
        let listed = map.list(&fresh).await.unwrap();
        assert_eq!(listed, map.list(&t).await.unwrap());
        assert_eq!(
            map.get(&fresh, b"k0").await.unwrap(),
            Some(259u32.to_le_bytes().to_vec())
        );
        assert_eq!(listed.len(), 50);
    });
}

#[test]
fn bad_input_gets_its_own_error() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-bad-input", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "bad").await;
        let t = open(&log, &[("c", Kind::Counter)]).await;
        fn err<T>(r: Result<T, TangoError>) -> TangoError {
            r.err().expect("an error")
        }
        assert!(matches!(
            err(t.create("", Kind::Map, false).await),
            TangoError::BadName(_)
        ));
        assert!(matches!(
            err(t.create(".", Kind::Map, false).await),
            TangoError::BadName(_)
        ));
        let long = "n".repeat(256);
        assert!(matches!(
            err(t.create(&long, Kind::Map, false).await),
            TangoError::BadName(_)
        ));
        assert!(matches!(
            err(t.create("c", Kind::Map, false).await),
            TangoError::KindMismatch {
                is: Kind::Counter,
                wanted: Kind::Map,
                ..
            }
        ));
        assert!(matches!(
            err(t.hosted_as("nope", Kind::Map)),
            TangoError::NoSuchObject(_)
        ));
        let counter = CounterRef(t.hosted_as("c", Kind::Counter).unwrap());

        let mut tx = t.begin();
        counter.get_in(&t, &mut tx).unwrap();
        tx.write(counter.0, None, vec![0; 2000]);
        assert!(matches!(
            err(t.end(tx).await),
            TangoError::TxTooLarge { .. }
        ));

        // Garbage in the counter's stream: reported with its position, never a panic.
        let garbage = Record::Update {
            nonce: 0,
            write: Write {
                oid: counter.0,
                key: None,
                data: b"not an i64".to_vec(),
            },
        };
        let position = log.append(garbage.encode(), &[counter.0]).await.unwrap();
        log.append(b"\x09 not a record".to_vec(), &[counter.0])
            .await
            .unwrap();
        assert_eq!(counter.add(&t, 2).await.unwrap(), 2);
        let err = t
            .update_reply(counter.0, None, b"short".to_vec())
            .await
            .expect_err("a malformed update");
        assert!(matches!(err, TangoError::Malformed { .. }), "{err}");
        assert!(err.to_string().contains("malformed"));
        assert!(position > 0);
    });
}

/// A transaction whose writes fill several log entries (1 KiB slots here) commits through
/// speculative entries: every write shows at once on a client hosting one of the two maps
/// only; one aborted by a stale read shows none of them.
#[test]
fn a_transaction_larger_than_an_entry_commits_or_aborts_whole() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-speculative", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = common::tango_log(&cluster, "speculative").await;
        let both = [("left", Kind::Map), ("right", Kind::Map)];
        let writer = open(&log, &both).await;
        let right_only = open(&log, &[("right", Kind::Map)]).await;
        let left: MapRef<HashTable> = MapRef::new(writer.hosted_as("left", Kind::Map).unwrap());
        let right: MapRef<HashTable> = MapRef::new(writer.hosted_as("right", Kind::Map).unwrap());
        let value = vec![7u8; 100];
        let keys: Vec<Vec<u8>> = (0..40)
            .map(|i| format!("key-{i:02}").into_bytes())
            .collect();

        let mut tx = writer.begin();
        left.get_in(&writer, &mut tx, b"guard").unwrap();
        for key in &keys {
            left.put_in(&mut tx, key, &value);
            right.put_in(&mut tx, key, &value);
        }
        let first = log.check().await.unwrap().tail;
        let outcome = writer.end(tx).await.unwrap();
        assert!(outcome.committed);
        assert_eq!(outcome.replies.len(), 80, "a reply for every write");
        let position = outcome.position.unwrap();
        assert!(
            position - first >= 8,
            "8 KB of writes went into speculative entries before the commit at {position}"
        );
        let seen = right.list(&right_only).await.unwrap();
        assert_eq!(seen.len(), 40);
        assert!(seen.iter().all(|(_, v)| *v == value));
        assert_eq!(left.list(&writer).await.unwrap().len(), 40);

        let mut stale = writer.begin();
        left.get_in(&writer, &mut stale, b"guard").unwrap();
        for key in &keys {
            right.put_in(&mut stale, key, b"never");
        }
        left.put(&writer, b"guard", b"moved").await.unwrap();
        let outcome = writer.end(stale).await.unwrap();
        assert!(!outcome.committed);
        let seen = right.list(&right_only).await.unwrap();
        assert!(
            seen.iter().all(|(_, v)| *v == value),
            "nothing of the aborted one"
        );
    });
}

/// `tutti obj` as scripts use it: one JSON object per call, exit 0; a clear message and
/// exit 1 on a missing object or a name of another kind, with nothing written.
#[test]
fn the_command_line_prints_json_and_refuses_what_it_cannot_do() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("objects-cli", 2, "log", &[], &[]);
    rt.block_on(common::ready(&c));
    let manager = c.local.file.manager.clone();
    let obj = |args: &[&str]| {
        let out = std::process::Command::new(common::exe())
            .args(["obj", "--cluster", &manager])
            .args(args)
            .output()
            .expect("tutti runs");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        (out.status.code(), stdout, stderr)
    };
    let (code, _, err) = obj(&["register", "get", "r"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no log called \"tango\""), "{err}");
    assert_eq!(
        obj(&["register", "set", "r", "6869"]).1,
        r#"{"position":1}"#
    );
    assert_eq!(obj(&["register", "get", "r"]).1, r#"{"data":"6869"}"#);
    assert_eq!(obj(&["counter", "add", "c", "-3"]).1, r#"{"value":-3}"#);
    assert_eq!(obj(&["counter", "add", "c", "5"]).1, r#"{"value":2}"#);
    assert_eq!(
        obj(&["map", "put", "m", "k", "01"]).1,
        r#"{"key":"k","previous":null}"#
    );
    assert_eq!(
        obj(&["map", "list", "m"]).1,
        r#"{"entries":[{"data":"01","key":"k"}]}"#
    );
    let (code, _, err) = obj(&["counter", "get", "m"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("\"m\" is a map, not a counter"), "{err}");
    let (code, _, err) = obj(&["map", "get", "nothing", "k"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("no object called \"nothing\""), "{err}");
    let (code, _, err) = obj(&["register", "set", "r", "zz"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("HEX"), "{err}");
    let (_, listed, _) = obj(&["ls"]);
    assert!(
        listed.contains(r#""name":"c""#) && listed.contains(r#""kind":"map""#),
        "{listed}"
    );
    assert!(
        !listed.contains("nothing"),
        "a failed read wrote nothing: {listed}"
    );
    // Every object and the directory checkpointed at one position, the log trimmed there,
    // and the views rebuilt from the checkpoints alone.
    let (code, maintained, _) = obj(&["maintain"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&maintained).unwrap();
    assert_eq!(
        (v["objects"].as_u64(), v["trim"].as_u64()),
        (Some(3), v["as_of"].as_u64())
    );
    assert!(v["trim"].as_u64() > Some(0), "{maintained}");
    assert_eq!(obj(&["counter", "get", "c"]).1, r#"{"value":2}"#);
    assert_eq!(
        obj(&["map", "get", "m", "k"]).1,
        r#"{"data":"01","key":"k"}"#
    );
}
