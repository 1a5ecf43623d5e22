//! `tutti up` end to end: starts a cluster, serves `tutti txn`, stops every child on
//! SIGTERM, and comes back on the same data directory with the data intact.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn up(data: &std::path::Path) -> (Child, String) {
    let mut child = Command::new(common::exe())
        .args(["up", "--nodes", "2", "--size", "16M", "--data"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("tutti up prints its manager").unwrap();
    let manager = first.rsplit(' ').next().unwrap().to_string();
    assert!(first.contains("up; manager at"), "{first}");
    std::thread::spawn(move || for _ in lines {});
    (child, manager)
}

fn txn(cluster: &str, items: &[&str]) -> serde_json::Value {
    let out = Command::new(common::exe())
        .args(["txn", "--cluster", cluster])
        .args(items)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// GET the OpenMetrics text of a node, at the metrics address `tutti up` recorded, as a
/// Prometheus scraper does.
fn scrape(data: &std::path::Path, node: usize) -> String {
    use std::io::{Read, Write};
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    let addr = file["nodes"][node - 1]["metrics"]
        .as_str()
        .unwrap()
        .to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: tutti\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(
        out.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{out}"
    );
    assert!(out.ends_with("# EOF\n"), "{out}");
    out
}

fn sigterm_and_wait(child: &mut Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let until = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "tutti up did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn children_alive(data: &std::path::Path) -> usize {
    let needle = data.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| {
            String::from_utf8_lossy(c).contains(&needle)
                && !String::from_utf8_lossy(c).contains("\0up\0")
        })
        .count()
}

/// `tutti stats --json` of the cluster in `dir`.
fn stats_json(dir: &str) -> serde_json::Value {
    let out = Command::new(common::exe())
        .args(["stats", "--json", "--cluster", dir])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Stops `tutti up` with SIGTERM; the children of its cluster still alive a moment later.
fn stop_and_count_children(child: &mut Child, data: &std::path::Path) -> usize {
    sigterm_and_wait(child);
    std::thread::sleep(Duration::from_millis(300));
    children_alive(data)
}

/// Each `tutti txn` is a process that exits right after its minitransaction: its one-way
/// decisions must be on the wire by then, or the next one finds the locks still held.
#[test]
fn back_to_back_txn_processes_never_meet_a_predecessors_locks() {
    let data = common::scratch("up-back-to-back");
    let (mut child, manager) = up(&data);
    for _ in 0..6 {
        let out = txn(&manager, &["add:1:0:1", "add:2:0:1"]);
        assert_eq!(out["committed"], true);
    }
    let out = txn(&manager, &["read:1:0:8", "read:2:0:8"]);
    assert_eq!(
        out["reads"],
        serde_json::json!(["0600000000000000", "0600000000000000"])
    );
    for node in [1, 2] {
        let metrics = scrape(&data, node);
        let no_lock_aborts =
            format!("tutti_load_aborted_lock{{node=\"{node}\",class=\"txn\",window=\"60s\"}} 0");
        assert!(metrics.contains(&no_lock_aborts), "{metrics}");
    }
    sigterm_and_wait(&mut child);
}

#[test]
fn up_serves_stops_cleanly_and_restarts_with_data_intact() {
    let data = common::scratch("up");
    let (mut child, manager) = up(&data);
    let out = txn(
        &manager,
        &["write:1:0:68656c6c6f", "write:2:0x10:0100000000000000"],
    );
    assert_eq!(out["committed"], true);
    let dir = data.display().to_string();
    let out = txn(
        &dir,
        &["cmpop:2:0x10:lt:10", "add:2:0x10:5", "read:2:0x10:8"],
    );
    assert_eq!(
        out,
        serde_json::json!({"committed": true, "reads": ["0100000000000000"], "failed_compares": []})
    );
    let stats = stats_json(&dir);
    assert_eq!(stats.as_array().unwrap().len(), 2);
    let metrics = scrape(&data, 2);
    assert!(metrics.contains("tutti_serving{node=\"2\"} 1"), "{metrics}");
    assert!(
        metrics.contains("tutti_load_committed{node=\"2\",class=\"txn\",window=\"60s\"} 2"),
        "{metrics}"
    );
    assert_eq!(
        stop_and_count_children(&mut child, &data),
        0,
        "every child stopped with tutti up"
    );

    let (mut child, _) = up(&data);
    let out = txn(&dir, &["read:1:0:5", "read:2:0x10:8"]);
    assert_eq!(
        out["reads"],
        serde_json::json!(["68656c6c6f", "0600000000000000"])
    );
    sigterm_and_wait(&mut child);
}

#[test]
fn up_refuses_to_reshape_an_existing_cluster() {
    let data = common::scratch("up-reshape");
    let (mut child, _) = up(&data);
    sigterm_and_wait(&mut child);
    let out = Command::new(common::exe())
        .args(["up", "--nodes", "3", "--data"])
        .arg(&*data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2-node"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `tutti node add` while `tutti up` serves: the node joins (up starts it), serves
/// minitransactions at once, is restarted by up like the others, and comes back with the
/// cluster, data intact, though up is started again with the --nodes it was made with.
#[test]
fn a_node_added_while_up_serves_joins_and_stays() {
    let data = common::scratch("up-node-add");
    let (mut child, manager) = up(&data);
    let dir = data.display().to_string();
    let add = || {
        let out = Command::new(common::exe())
            .args(["node", "add", "--data", &dir])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(add()["node"], 3);
    let out = txn(&manager, &["write:3:0:0700000000000000", "add:1:0:1"]);
    assert_eq!(out["committed"], true);
    let stats = stats_json(&dir);
    assert_eq!(stats.as_array().unwrap().len(), 3);
    assert_eq!(
        stop_and_count_children(&mut child, &data),
        0,
        "the added node stopped with up"
    );

    let (mut child, _) = up(&data);
    let out = txn(&dir, &["read:3:0:8", "read:1:0:8"]);
    assert_eq!(
        out["reads"],
        serde_json::json!(["0700000000000000", "0100000000000000"])
    );
    sigterm_and_wait(&mut child);
}
