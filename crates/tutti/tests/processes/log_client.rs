//! The log's client API and its sequencer as users run them: real memory nodes, manager
//! and `tutti sequencer`, the sequencer killed (-9) and restarted under load; holes filled;
//! every bad input refused with its own error.

use crate::common;

use rand::Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tutti_log::{EntryError, Found, Log, LogError, LogOptions, LogShape, StreamId};
use tutti_wire::{Answer, Ask, Connection, Dialer, Request, Response};

fn shape(nodes: Vec<u16>, slot_bytes: u32, slots: u64) -> LogShape {
    LogShape {
        nodes,
        slot_bytes,
        capacity_bytes: 4096 + slots * u64::from(slot_bytes),
        backpointers: 4,
    }
}

/// Appender `a`'s entry `i`: its streams and payload.
fn appended(a: u64, i: u64) -> (Vec<StreamId>, Vec<u8>) {
    let mut streams = vec![(a % 3) as StreamId + 1];
    if i.is_multiple_of(4) {
        streams.push(9);
    }
    let mut payload = a.to_le_bytes().to_vec();
    payload.extend_from_slice(&i.to_le_bytes());
    (streams, payload)
}

#[test]
fn acknowledged_appends_survive_sequencer_kills_and_each_stream_yields_them_once_in_order() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let mut c = common::start("log-client", 3, "ram", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = Log::create(
            &cluster,
            "events",
            &shape(vec![1, 2, 3], 512, 20_000),
            LogOptions::default(),
        )
        .await
        .expect("created");
        // Appenders run until every kill and restart is behind them.
        let stop = Arc::new(AtomicBool::new(false));
        let appenders: Vec<_> = (0..8u64)
            .map(|a| {
                let (log, stop) = (log.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    // Paced, and at most 3,000 each, so that the log never fills.
                    for i in 0..3000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let (streams, payload) = appended(a, i);
                        let p = log
                            .append(payload.clone(), &streams)
                            .await
                            .expect("appended");
                        acked.push((p, streams, payload));
                    }
                    acked
                })
            })
            .collect();
        for _ in 0..3 {
            let pause = rand::thread_rng().gen_range(100..400);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            c.local.kill_sequencer();
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.local.start_sequencer().expect("sequencer restarted");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        let mut acked = Vec::new();
        for a in appenders {
            acked.extend(a.await.expect("appender"));
        }
        let positions: BTreeSet<u64> = acked.iter().map(|(p, ..)| *p).collect();
        assert_eq!(
            positions.len(),
            acked.len(),
            "no position was handed out twice"
        );

        let stat = log.stat().await.expect("stat");
        assert!(
            stat.tail.epoch >= 4,
            "each restart took the log over: {stat:?}"
        );
        let last = *positions.last().expect("appends");
        assert!(stat.tail.tail > last);
        assert_eq!(log.check_slow().await.expect("slow check"), last + 1);

        let mut by_stream: BTreeMap<StreamId, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
        for (p, streams, payload) in &acked {
            match log.read(*p).await.expect("read") {
                Found::Data {
                    streams: headers,
                    payload: read,
                } => {
                    assert_eq!(&read, payload, "position {p}");
                    let ids: Vec<StreamId> = headers.iter().map(|h| h.stream).collect();
                    assert_eq!(&ids, streams);
                }
                other => panic!("acknowledged append at {p} reads {other:?}"),
            }
            for s in streams {
                by_stream.entry(*s).or_default().push((*p, payload.clone()));
            }
        }
        for (s, mut expected) in by_stream {
            expected.sort();
            let mut reader = log.stream(s, 0);
            let mut got = Vec::new();
            while let Some(e) = reader.readnext().await.expect("readnext") {
                got.push(e);
            }
            assert_eq!(got.len(), expected.len(), "stream {s}");
            assert!(
                got == expected,
                "stream {s} yields exactly its appends, in log order"
            );
        }
    });
}

/// Takes a position from the sequencer and never writes it: an appender that crashed.
async fn take_position(sequencer: &str, log: &str) -> u64 {
    let conn = Connection::connect(sequencer, 1 << 20, &Dialer::default())
        .await
        .expect("sequencer");
    let ask = Request::Sequence {
        log: log.into(),
        min_epoch: 0,
        asks: vec![Ask::Next { streams: vec![5] }],
    };
    match conn.call(&ask).await.expect("answered") {
        Response::Sequenced(answers) => match answers[0] {
            Answer::Granted { position, .. } => position,
            ref other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn holes_are_filled_after_the_timeout_and_bad_input_gets_its_own_error() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("log-holes", 2, "ram", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let opts = LogOptions {
            deadline: Duration::from_secs(5),
            hole_timeout: Duration::from_millis(50),
        };
        let log = Log::create(&cluster, "holes", &shape(vec![1, 2], 256, 4), opts.clone())
            .await
            .expect("created");
        let again = Log::create(&cluster, "holes", &shape(vec![1, 2], 256, 4), opts.clone()).await;
        assert!(again.is_ok(), "creating the same log again opens it");
        assert_eq!(
            Log::create(&cluster, "holes", &shape(vec![1], 256, 4), opts.clone())
                .await
                .err(),
            Some(LogError::Exists("holes".into()))
        );
        assert_eq!(
            Log::open(&cluster, "nope", opts.clone()).await.err(),
            Some(LogError::NoSuchLog("nope".into()))
        );

        let first = log.append(vec![1], &[5]).await.expect("appended");
        let hole = take_position(&c.local.file.sequencer, "holes").await;
        let after = log.append(vec![2], &[5]).await.expect("appended");
        assert_eq!((first, hole, after), (0, 1, 2));
        let mut reader = log.stream(5, 0);
        assert_eq!(reader.readnext().await.expect("read"), Some((0, vec![1])));
        assert_eq!(
            reader.readnext().await.expect("read past the hole"),
            Some((2, vec![2])),
            "the hole's backpointer led to junk; the entry before it was found"
        );
        assert_eq!(reader.readnext().await.expect("read"), None);
        assert_eq!(log.read(hole).await.expect("read"), Found::Junk, "filled");

        assert!(matches!(
            log.append(vec![0; 300], &[]).await,
            Err(LogError::Entry(EntryError::TooLarge { .. }))
        ));
        let many: Vec<StreamId> = (0..17).collect();
        assert_eq!(
            log.append(vec![], &many).await,
            Err(LogError::Entry(EntryError::TooManyStreams(17)))
        );
        assert_eq!(
            log.read(3).await,
            Err(LogError::PastTail {
                position: 3,
                tail: 3
            })
        );
        assert_eq!(
            log.trim(4).await,
            Err(LogError::TrimPastTail { prefix: 4, tail: 3 })
        );
        for i in 3..8 {
            log.append(vec![i as u8], &[]).await.expect("room for 8");
        }
        assert_eq!(
            log.append(vec![9], &[]).await,
            Err(LogError::Full {
                position: 8,
                trim: 0
            })
        );
        log.trim(2).await.expect("trimmed");
        assert_eq!(log.read(1).await, Ok(Found::Trimmed { trim: 2 }));
        assert_eq!(
            log.append(vec![9], &[]).await,
            Ok(8),
            "the full log handed out nothing, and the trim made room"
        );
    });
}

/// Concurrent appends to one node leave in batches: the node logs one record for many, and
/// every acknowledged append is at its position.
#[test]
fn concurrent_appends_to_a_node_are_written_in_batches() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("log-batches", 1, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let log = Log::create(
            &cluster,
            "batches",
            &shape(vec![1], 256, 4096),
            LogOptions::default(),
        )
        .await
        .expect("created");
        let records = || async {
            let stats = cluster.stats().await;
            let (_, node) = stats.first().expect("one node");
            node.as_ref().expect("stats").log_records_appended
        };
        let before = records().await;
        let appenders: Vec<_> = (0..64u64)
            .map(|a| {
                let log = log.clone();
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    for i in 0..10u64 {
                        let (streams, payload) = appended(a, i);
                        let p = log.append(payload.clone(), &streams).await;
                        acked.push((p.expect("appended"), payload));
                    }
                    acked
                })
            })
            .collect();
        let mut acked = Vec::new();
        for a in appenders {
            acked.extend(a.await.expect("appender"));
        }
        let logged = records().await - before;
        assert!(
            logged * 2 < acked.len() as u64,
            "{logged} redo-log records for {} appends",
            acked.len()
        );
        for (p, payload) in acked {
            match log.read(p).await.expect("read") {
                Found::Data { payload: read, .. } => assert_eq!(read, payload, "at {p}"),
                other => panic!("position {p} holds {other:?}"),
            }
        }
        eprintln!("{logged} redo-log records for 640 appends");
    });
}

/// A log smaller than the default lease stays usable across replacements of its sequencer:
/// each leaves at most a lease of holes, and the lease is a 16th of the log's period.
#[test]
fn a_small_log_survives_replacements_of_its_sequencer() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let mut c = common::start("log-small", 3, "log", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        // 3 × 1,000 positions, below the default lease of 4,096.
        let log = Log::create(
            &cluster,
            "small",
            &shape(vec![1, 2, 3], 512, 1000),
            LogOptions::default(),
        )
        .await
        .expect("created");
        let mut positions = Vec::new();
        for round in 0..6u8 {
            positions.push(log.append(vec![round], &[1]).await.expect("appended"));
            c.local.kill_sequencer();
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.local.start_sequencer().expect("sequencer restarted");
        }
        positions.push(log.append(vec![6], &[1]).await.expect("appended"));
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
        assert!(*positions.last().unwrap() < 3000, "{positions:?}");
    });
}
