//! The shared log's minitransactions against real memory nodes and a real manager: the
//! nodes, not the log's clients, enforce write-once positions, epochs and trims.

mod common;

use tutti_client::Cluster;
use tutti_log::minitxs::{self, Refusal};
use tutti_log::{Content, Entry, LogLayout, Reservation};
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
        Err(minitxs::write_refusal(e.position, epoch, &outcome))
    }
}

async fn read(c: &Cluster, l: &LogLayout, position: u64) -> (u64, Option<Entry>) {
    let outcome = c
        .exec_and_commit(&minitxs::read(l, position, minitxs::READ_PREFIX_BYTES))
        .await
        .expect("an outcome");
    let (trim, bytes) = minitxs::read_result(&outcome);
    let entry = Entry::decode(position, bytes, l.backpointers, l.slot_bytes).expect("decodes");
    (trim, entry)
}

async fn committed(c: &Cluster, tx: &tutti_client::Minitx) -> bool {
    c.exec_and_commit(tx).await.expect("an outcome").committed
}

#[test]
fn memory_nodes_enforce_write_once_positions_epochs_and_trims() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("log-minitxs", 2, "ram", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let slots = LogLayout::slots_for(&[1, 2], 256, 4096 + 2 * 256, 4).expect("a layout");
        let mut layout = LogLayout {
            nodes: vec![],
            slot_bytes: 256,
            slots_per_node: slots,
            backpointers: 4,
        };
        let create = Request::CreateRegion {
            name: "events".into(),
            kind: "log".into(),
            nodes: vec![1, 2],
            bytes_per_node: layout.region_bytes(),
            params: layout.layout_word(),
        };
        let Response::Region(region) = cluster.ask_manager(&create).await.expect("created") else {
            panic!("not a region");
        };
        layout.nodes = region.nodes;
        let l = &layout;
        assert_eq!(l.period(), 4);
        assert!(committed(&cluster, &minitxs::create(l)).await);
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
