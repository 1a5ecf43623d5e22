//! The shared log's minitransactions against real memory nodes and a real manager: the
//! nodes, not the log's clients, enforce write-once positions, epochs and trims.

use crate::common;

use tutti_client::Cluster;
use tutti_log::minitxs::{self, Refusal};
use tutti_log::{
    Answer, Ask, Content, Entry, LogLayout, Reservation, Sequencer, SlowCheck, Step, StreamHeader,
    Takeover, TakeoverError,
};
use tutti_wire::{Request, Response};

fn entry(position: u64, writer: u64, epoch: u64) -> Entry {
    Entry {
        position,
        epoch,
        writer,
        content: Content::Data {
            streams: vec![],
            payload: writer.to_le_bytes().to_vec(),
        },
    }
}

/// Writes `e` in `epoch`: `Ok` if it committed, else why not.
async fn write(c: &Cluster, l: &LogLayout, epoch: u64, e: &Entry) -> Result<(), Refusal> {
    let outcome = c
        .exec_and_commit(&minitxs::write(l, epoch, e))
        .await
        .expect("an outcome");
    if outcome.committed {
        Ok(())
    } else {
        Err(minitxs::write_refusal(l, e.position, epoch, &outcome))
    }
}

async fn read(c: &Cluster, l: &LogLayout, position: u64) -> (u64, Option<Entry>) {
    let outcome = c
        .exec_and_commit(&minitxs::read(l, position, minitxs::READ_PREFIX_BYTES))
        .await
        .expect("an outcome");
    let (_, trim, bytes) = minitxs::read_result(&outcome);
    let entry = Entry::decode(position, bytes, l.backpointers, l.slot_bytes).expect("decodes");
    (trim, entry)
}

async fn committed(c: &Cluster, tx: &tutti_client::Minitx) -> bool {
    c.exec_and_commit(tx).await.expect("an outcome").committed
}

/// Allocates a log's regions on `nodes` from the manager, `slots` slots of `slot_bytes` per
/// node, and writes its headers.
async fn create_log(
    c: &Cluster,
    name: &str,
    nodes: &[u16],
    slot_bytes: u32,
    slots: u64,
    backpointers: u8,
) -> LogLayout {
    let capacity = 4096 + slots * u64::from(slot_bytes);
    let slots_per_node =
        LogLayout::slots_for(nodes, slot_bytes, capacity, backpointers).expect("a layout");
    let mut layout = LogLayout {
        nodes: vec![],
        slot_bytes,
        slots_per_node,
        backpointers,
    };
    let create = Request::CreateRegion {
        name: name.into(),
        kind: "log".into(),
        nodes: nodes.to_vec(),
        bytes_per_node: layout.region_bytes(),
        params: layout.layout_word(),
    };
    let Response::Region(region) = c.ask_manager(&create).await.expect("created") else {
        panic!("not a region");
    };
    layout.nodes = region.nodes;
    assert!(committed(c, &minitxs::create(&layout)).await);
    layout
}

#[test]
fn memory_nodes_enforce_write_once_positions_epochs_and_trims() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("log-minitxs", 2, "ram", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let layout = create_log(&cluster, "events", &[1, 2], 256, 2, 4).await;
        let l = &layout;
        assert_eq!(l.period(), 4);
        assert!(
            !committed(&cluster, &minitxs::create(l)).await,
            "a region in use is not created again"
        );

        write(&cluster, l, 1, &entry(0, 7, 1)).await.expect("free");
        assert_eq!(
            write(&cluster, l, 1, &entry(0, 8, 1)).await,
            Err(Refusal::Taken { writer: 7 }),
            "a second writer of position 0 is refused"
        );
        assert_eq!(read(&cluster, l, 0).await, (0, Some(entry(0, 7, 1))));
        assert_eq!(read(&cluster, l, 1).await, (0, None), "never written");

        assert_eq!(
            write(&cluster, l, 1, &entry(4, 9, 1)).await,
            Err(Refusal::Full { trim: 0 }),
            "position 4 shares position 0's slot, which is not trimmed"
        );
        assert!(committed(&cluster, &minitxs::trim(l, 1)).await);
        assert!(
            !committed(&cluster, &minitxs::trim(l, 1)).await,
            "trims only grow"
        );
        write(&cluster, l, 1, &entry(4, 9, 1))
            .await
            .expect("slot reused");
        assert_eq!(read(&cluster, l, 0).await, (1, None), "trimmed and reused");
        assert_eq!(
            write(&cluster, l, 1, &entry(0, 10, 1)).await,
            Err(Refusal::Trimmed { trim: 1 })
        );

        assert!(committed(&cluster, &minitxs::seal(l, 2)).await);
        assert!(
            !committed(&cluster, &minitxs::seal(l, 2)).await,
            "a seal only raises the epoch"
        );
        assert_eq!(
            write(&cluster, l, 1, &entry(1, 11, 1)).await,
            Err(Refusal::Sealed { epoch: 2 }),
            "a writer of the old epoch is refused"
        );
        let reservation = |epoch| Reservation {
            epoch,
            from: 5,
            to: 100,
        };
        assert!(!committed(&cluster, &minitxs::reserve(l, &reservation(1))).await);
        assert!(committed(&cluster, &minitxs::reserve(l, &reservation(2))).await);
        write(&cluster, l, 2, &entry(1, 11, 2))
            .await
            .expect("the new epoch writes");
        let words = cluster
            .exec_and_commit(&minitxs::words(l))
            .await
            .expect("an outcome");
        for w in minitxs::words_result(&words) {
            assert_eq!(
                (w.magic, w.epoch, w.trim, w.reserved_from, w.reserved_to),
                (tutti_log::layout::MAGIC, 2, 1, 5, 100)
            );
        }
    });
}

/// Runs a takeover or a slow check to its end.
async fn drive<T>(
    c: &Cluster,
    first: tutti_client::Minitx,
    mut on_outcome: impl FnMut(&tutti_client::Outcome) -> Result<Step<T>, TakeoverError>,
) -> Result<T, TakeoverError> {
    let mut tx = first;
    loop {
        let outcome = c.exec_and_commit(&tx).await.expect("an outcome");
        match on_outcome(&outcome)? {
            Step::Run(next) => tx = next,
            Step::Done(done) => return Ok(done),
        }
    }
}

#[test]
fn a_takeover_starts_above_every_position_handed_out_with_each_streams_last_positions() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("log-takeover", 3, "ram", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let layout = create_log(&cluster, "streams", &[1, 2, 3], 512, 2000, 2).await;
        let l = &layout;

        // The first sequencer, in epoch 1: 3,000 positions over streams 1 and 2, with holes.
        let (mut first, r) = Sequencer::<u64>::start(1, (0, 0, l.period()), 2, 1000, []);
        assert!(committed(&cluster, &minitxs::reserve(l, &r)).await);
        first.on_reserved(r.to, 0);
        let mut reserved = r.to;
        let mut written = 0u64;
        for i in 0..3000u64 {
            let streams = match i % 3 {
                0 => vec![1],
                1 => vec![1, 2],
                _ => vec![],
            };
            let acts = first.on_asks([(
                i,
                Ask::Next {
                    streams: streams.clone(),
                },
            )]);
            if let Some(r) = acts.reserve {
                assert!(committed(&cluster, &minitxs::reserve(l, &r)).await);
                first.on_reserved(r.to, 0);
                reserved = r.to;
            }
            let Some((
                _,
                Answer::Granted {
                    position,
                    backpointers,
                    ..
                },
            )) = acts.answers.first().cloned()
            else {
                panic!("granted at once: {acts:?}");
            };
            if i % 7 == 6 {
                continue; // a hole: its appender died
            }
            let e = Entry {
                position,
                epoch: 1,
                writer: i,
                content: Content::Data {
                    streams: streams
                        .iter()
                        .zip(backpointers)
                        .map(|(&stream, backpointers)| StreamHeader {
                            stream,
                            backpointers,
                        })
                        .collect(),
                    payload: vec![1; 10],
                },
            };
            write(&cluster, l, 1, &e).await.expect("free");
            written = position;
        }
        assert!(committed(&cluster, &minitxs::trim(l, 100)).await);

        let (mut check, tx) = SlowCheck::start(l);
        let tail = drive(&cluster, tx, |o| check.on_outcome(o))
            .await
            .expect("a tail");
        assert_eq!(
            tail,
            written + 1,
            "the slow check finds the highest written position"
        );

        let (mut takeover, tx) = Takeover::start(l, 2);
        let taken = drive(&cluster, tx, |o| takeover.on_outcome(o))
            .await
            .expect("taken over");
        assert!(reserved > written + 1, "the first sequencer reserved ahead");
        assert_eq!(taken.trim, 100, "the successor knows the trim point");
        assert_eq!(
            taken.tail, reserved,
            "the new epoch starts above every position the old one may have handed out"
        );
        let oldest = taken.history.last().expect("some history").0;
        assert!(
            oldest >= 100,
            "nothing below the trim point is scanned: {oldest}"
        );
        let (mut second, r) = Sequencer::<u64>::start(
            2,
            (taken.tail, taken.trim, l.period()),
            2,
            1000,
            taken.history,
        );
        assert!(committed(&cluster, &minitxs::reserve(l, &r)).await);
        second.on_reserved(r.to, taken.trim);
        let acts = second.on_asks([(
            0,
            Ask::Next {
                streams: vec![1, 2],
            },
        )]);
        // Position i holds entry i; stream 1 has the entries with i % 3 of 0 or 1, stream 2
        // those with 1; every seventh is a hole.
        let last_two = |in_stream: fn(u64) -> bool| {
            (0..3000u64)
                .rev()
                .filter(|&i| i % 7 != 6 && in_stream(i))
                .take(2)
                .collect::<Vec<u64>>()
        };
        assert_eq!(
            acts.answers[0].1,
            Answer::Granted {
                position: reserved,
                epoch: 2,
                backpointers: vec![last_two(|i| i % 3 < 2), last_two(|i| i % 3 == 1)]
            }
        );

        let (mut late, tx) = Takeover::start(l, 2);
        assert_eq!(
            drive(&cluster, tx, |o| late.on_outcome(o)).await,
            Err(TakeoverError::Superseded(2)),
            "a takeover racing a later one stops at its seal"
        );
        assert_eq!(
            write(&cluster, l, 1, &entry(written + 1, 5, 1)).await,
            Err(Refusal::Sealed { epoch: 2 }),
            "the first sequencer's positions are refused"
        );
    });
}
