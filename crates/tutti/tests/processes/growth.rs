//! Online growth (Sinfonia §4.10): a memory node added while clients run is used by them
//! within seconds, without a restart, and the load on the other nodes never stalls.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_client::Minitx;

/// Windows in which the load must commit something.
const WINDOW: Duration = Duration::from_millis(250);

#[test]
fn a_node_added_under_load_is_used_within_seconds_and_nothing_stalls() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let mut c = common::start("growth", 2, "log", &[], &[]);
    let cluster = rt.block_on(common::ready(&c));
    let (stop, commits) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    // Eight clients of one handle, each adding to its own counter on both nodes (2PC).
    let load: Vec<_> = (0..8u64)
        .map(|i| {
            let (cluster, stop, commits) = (cluster.clone(), stop.clone(), commits.clone());
            rt.spawn(async move {
                let tx = Minitx::new().add(1, i * 8, 1).add(2, i * 8, 1);
                while !stop.load(Ordering::Relaxed) {
                    if cluster
                        .exec_and_commit(&tx)
                        .await
                        .is_ok_and(|o| o.committed)
                    {
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let sampler = {
        let (stop, commits) = (stop.clone(), commits.clone());
        rt.spawn(async move {
            let mut per_window = Vec::new();
            let mut last = commits.load(Ordering::Relaxed);
            loop {
                tokio::time::sleep(WINDOW).await;
                // A window cut short by the stop is not counted.
                if stop.load(Ordering::Relaxed) {
                    return per_window;
                }
                let now = commits.load(Ordering::Relaxed);
                per_window.push(now - last);
                last = now;
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));

    let added_at = Instant::now();
    let id = c.local.add_node().expect("add a node");
    // The clients' handle, made before the node existed, writes to it.
    let first_commit = rt.block_on(async {
        let tx = Minitx::new().write(id, 0, b"grown".to_vec());
        loop {
            match cluster.exec_and_commit(&tx).await {
                Ok(o) if o.committed => return added_at.elapsed(),
                _ => {
                    assert!(
                        added_at.elapsed() < Duration::from_secs(20),
                        "node {id} unused"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    for task in load {
        rt.block_on(task).unwrap();
    }
    let per_window = rt.block_on(sampler).unwrap();
    eprintln!(
        "node {id} took its first commit {first_commit:?} after it was added; commits per {WINDOW:?}: {per_window:?}"
    );
    assert!(first_commit < Duration::from_secs(5), "{first_commit:?}");
    assert!(
        per_window.iter().all(|&n| n > 0),
        "the load stalled in a window: {per_window:?}"
    );
    let read = rt.block_on(cluster.exec_and_commit(&Minitx::new().read(id, 0, 5)));
    assert_eq!(read.unwrap().reads, vec![b"grown".to_vec()]);
}
