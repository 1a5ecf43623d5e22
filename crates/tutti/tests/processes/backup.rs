//! Consistent backups (Sinfonia §4.8) of real processes: `tutti backup create` taken while
//! the bank runs, and an incremental one after it, restore, with `tutti backup restore`, to
//! a cluster where the money is all there and every client's counter is a prefix of that
//! client's transfers; a log made
//! before the backup reads back from the restored cluster; backups killed with `kill -9` at
//! random points leave the cluster serving and no backup that verifies but is not one; one
//! that loses a node's cut starts over once the node is back, or gives up if it stays down; a file system backed up while written restores to one that fsck finds
//! whole; a damaged backup is refused.

use crate::common;

use rand::{Rng, RngCore, SeedableRng};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_harness::local::{Layout, LocalCluster, LOOPBACK};
use tutti_workload::{Bank, Workload};

const NODES: u16 = 3;
const CLIENTS: u64 = 8;
const ACCOUNTS: u64 = 64;

fn bank() -> Bank {
    Bank::new(ACCOUNTS, NODES, CLIENTS)
}

/// Runs `tutti ARGS`; the JSON it printed, or panics with its standard error.
fn tutti_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(common::exe()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tutti {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `tutti backup restore BACKUP --data DATA`, then the restored cluster started and ready.
fn restore_and_start(
    rt: &tokio::runtime::Runtime,
    backup: &std::path::Path,
    data: &std::path::Path,
) -> (LocalCluster, tutti_client::Cluster) {
    let restored = tutti_json(&[
        "backup",
        "restore",
        backup.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ]);
    eprintln!("restored: {restored}");
    let layout = Layout {
        host: LOOPBACK,
        nodes: NODES as usize,
        managers: 1,
        mode: "log".into(),
        size_bytes: 64 << 20,
        node_flags: vec![],
        manager_flags: vec![],
    };
    let mut local = LocalCluster::open(&common::exe(), data, layout, true).unwrap();
    local.start_all().unwrap();
    let cluster = rt
        .block_on(local.wait_ready(Duration::from_secs(60)))
        .unwrap();
    (local, cluster)
}

/// Each client's transfers: seen committed, and seen committed or unknown.
type Counts = Vec<(Arc<AtomicU64>, Arc<AtomicU64>)>;

fn read_counts(counts: &Counts) -> Vec<(u64, u64)> {
    (counts.iter())
        .map(|(c, u)| {
            let committed = c.load(Ordering::SeqCst);
            (committed, committed + u.load(Ordering::SeqCst))
        })
        .collect()
}

#[test]
fn a_backup_under_load_restores_to_a_consistent_cut() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("backup", NODES as usize, "log", &[], &[]);
    let cluster = rt.block_on(common::ready(&c));
    let dir = c.local.dir.display().to_string();
    tutti_json(&[
        "log",
        "create",
        "journal",
        "--capacity-bytes",
        "32M",
        "--cluster",
        &dir,
    ]);
    tutti_json(&[
        "log",
        "append",
        "journal",
        "6a6f75726e616c",
        "--cluster",
        &dir,
    ]);
    rt.block_on(tutti_harness::workload::setup(&cluster, &bank()))
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let counts: Counts = (0..CLIENTS)
        .map(|_| (Arc::default(), Arc::default()))
        .collect();
    let load = bank_load(&rt, &cluster, &stop, &commits, &counts);
    let rate = |during: Duration| {
        let before = commits.load(Ordering::Relaxed);
        std::thread::sleep(during);
        (commits.load(Ordering::Relaxed) - before) as f64 / during.as_secs_f64()
    };
    let rate_before = rate(Duration::from_secs(2));

    let backup_dir = common::scratch("backup-dest");
    let dest = backup_dir.join("b");
    let (started, ops_at_start) = (Instant::now(), commits.load(Ordering::Relaxed));
    let made = tutti_json(&[
        "backup",
        "create",
        dest.to_str().unwrap(),
        "--cluster",
        &dir,
    ]);
    let took = started.elapsed();
    let rate_during = (commits.load(Ordering::Relaxed) - ops_at_start) as f64 / took.as_secs_f64();
    let rate_after = rate(Duration::from_secs(2));
    // Then an incremental one from it, which is what gets restored.
    let dest_full = dest;
    let dest = backup_dir.join("b2");
    let before = read_counts(&counts);
    let made2 = tutti_json(&[
        "backup",
        "create",
        dest.to_str().unwrap(),
        "--since",
        dest_full.to_str().unwrap(),
        "--cluster",
        &dir,
    ]);
    let after = read_counts(&counts);
    stop.store(true, Ordering::Relaxed);
    for task in load {
        rt.block_on(task).unwrap();
    }
    eprintln!(
        "backup {made}: {took:?}; operations/s before {rate_before:.0}, during {rate_during:.0}, after {rate_after:.0}"
    );
    eprintln!("incremental backup {made2}");
    assert_eq!(made["nodes"].as_array().unwrap().len(), NODES as usize);
    assert_eq!(made["regions"], 1, "the log's region");
    let nodes2 = made2["nodes"].as_array().unwrap();
    assert!(nodes2.iter().all(|n| n["incremental"] == true), "{made2}");
    assert!(
        made2["data_bytes"].as_u64() < made["data_bytes"].as_u64(),
        "the log's entries are not copied again"
    );
    assert!(after.iter().map(|a| a.0).sum::<u64>() > before.iter().map(|b| b.0).sum::<u64>());

    let verified = tutti_json(&["backup", "verify", dest.to_str().unwrap()]);
    assert_eq!(verified["ok"], true);
    assert_eq!(verified["chain"].as_array().unwrap().len(), 2, "{verified}");
    let restore_dir = common::scratch("backup-restored");
    let data = restore_dir.join("cluster");
    drop(c);
    let (mut local, restored_cluster) = restore_and_start(&rt, &dest, &data);
    // The incremental cut laid over the full one: its counters lie between what clients had
    // seen when the backup began and what they had seen, or might have, when it ended; the
    // money is all there.
    let mut model = bank();
    for (client, (b, a)) in before.iter().zip(&after).enumerate() {
        model.tally(client as u64, b.0, a.1 - b.0);
    }
    let snapshot = rt
        .block_on(restored_cluster.exec_and_commit(&model.snapshot()))
        .unwrap();
    let violations = model.check(&snapshot.reads);
    assert!(violations.is_empty(), "{violations:?}");
    let data_dir = data.display().to_string();
    let entry = tutti_json(&["log", "read", "journal", "0", "--cluster", &data_dir]);
    assert!(entry.to_string().contains("6a6f75726e616c"), "{entry}");
    let moved = tutti_json(&[
        "log",
        "append",
        "journal",
        "6d6f7265",
        "--cluster",
        &data_dir,
    ]);
    // A new sequencer takes the log over: it starts past the old one's reservation.
    assert!(moved["position"].as_u64().unwrap() >= 1, "{moved}");
    local.stop_all();
}

/// The bank under `CLIENTS` clients of `cluster` until `stop`; each client's counts go to
/// `counts`, every operation to `ops`.
fn bank_load(
    rt: &tokio::runtime::Runtime,
    cluster: &tutti_client::Cluster,
    stop: &Arc<AtomicBool>,
    ops: &Arc<AtomicU64>,
    counts: &Counts,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|client| {
            let (cluster, stop, ops) = (cluster.clone(), stop.clone(), ops.clone());
            let (committed, unknown) = counts[client as usize].clone();
            rt.spawn(async move {
                let mut bank = bank();
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(client);
                while !stop.load(Ordering::Relaxed) {
                    let _ = tutti_harness::workload::run_op(&cluster, &mut bank, client, &mut rng)
                        .await;
                    let (c, _, u) = bank.outcomes();
                    unknown.store(u, Ordering::SeqCst);
                    committed.store(c, Ordering::SeqCst);
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect()
}

/// Waits until the load runs `n` more operations, for at most 5 s (a fence left by a killed
/// backup lapses within 2 s).
fn progresses(ops: &AtomicU64, n: u64) -> bool {
    let from = ops.load(Ordering::Relaxed);
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        if ops.load(Ordering::Relaxed) >= from + n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn backups_killed_at_random_points_or_losing_a_node_leave_the_cluster_serving() {
    let rt = common::runtime();
    let _guard = rt.enter();
    let mut c = common::start("backup-kill", NODES as usize, "log", &[], &[]);
    let cluster = rt.block_on(common::ready(&c));
    let dir = c.local.dir.display().to_string();
    rt.block_on(tutti_harness::workload::setup(&cluster, &bank()))
        .unwrap();
    // 24 MiB of data per node past the bank's bytes, so that the copy takes a while.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(common::chaos_seed());
    for node in 1..=NODES {
        for part in 0..3u64 {
            let mut tx = tutti_client::Minitx::new();
            for i in 0..8u64 {
                let mut bytes = vec![0u8; 1 << 20];
                rng.fill_bytes(&mut bytes);
                tx = tx.write(node, (1 + part * 8 + i) << 20, bytes);
            }
            assert!(rt.block_on(cluster.exec_and_commit(&tx)).unwrap().committed);
        }
    }
    let (stop, ops) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let counts: Counts = (0..CLIENTS)
        .map(|_| (Arc::default(), Arc::default()))
        .collect();
    let load = bank_load(&rt, &cluster, &stop, &ops, &counts);
    let scratch = common::scratch("backup-kill-dest");
    let backup = |dest: &std::path::Path, flags: &[&str]| {
        Command::new(common::exe())
            .args([
                "backup",
                "create",
                dest.to_str().unwrap(),
                "--cluster",
                &dir,
            ])
            .args(flags)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let copy_begun = |dest: &std::path::Path| {
        let until = Instant::now() + Duration::from_secs(30);
        while !dest.join("node-1.image").exists() {
            assert!(Instant::now() < until, "the copy never began");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let (mut finished, mut cut_short) = (0, 0);
    for round in 0..8 {
        let dest = scratch.join(format!("killed-{round}"));
        let mut child = backup(&dest, &[]);
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..400)));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            progresses(&ops, 50),
            "round {round}: the bank stalled after the kill"
        );
        if dest.join("manifest.json").exists() {
            let verified = tutti_json(&["backup", "verify", dest.to_str().unwrap()]);
            assert_eq!(verified["ok"], true);
            finished += 1;
        } else {
            let out = Command::new(common::exe())
                .args(["backup", "verify", dest.to_str().unwrap()])
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(1),
                "round {round}: an unfinished backup"
            );
            cut_short += 1;
        }
    }
    eprintln!("backups killed: {cut_short} before their manifest, {finished} after");

    // A node killed while the images are copied loses its cut: that attempt ends and its
    // files go; the next one waits for the node to come back and makes the backup.
    let dest = scratch.join("node-lost");
    let child = backup(&dest, &[]);
    copy_begun(&dest);
    c.local.kill_node(3);
    std::thread::sleep(Duration::from_millis(1500));
    c.local.restart("node-3").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("node 3"), "the lost cut is told: {stderr}");
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(made["data_bytes"].as_u64().unwrap() >> 20, 3 * 24, "{made}");
    assert_eq!(
        tutti_json(&["backup", "verify", dest.to_str().unwrap()])["ok"],
        true
    );
    assert!(
        progresses(&ops, 50),
        "the bank stalled after node 3 came back"
    );

    // A node that stays down: the backup waits for it as long as it is told, then gives up
    // and removes its files.
    let dest = scratch.join("node-down");
    let child = backup(&dest, &["--node-wait-s", "2"]);
    copy_begun(&dest);
    c.local.kill_node(3);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a backup without node 3 succeeded");
    assert!(
        stderr.contains("memory node 3") && stderr.contains("a backup needs every node"),
        "{stderr}"
    );
    assert!(!dest.exists(), "a failed backup left {}", dest.display());
    c.local.restart("node-3").unwrap();
    assert!(
        progresses(&ops, 50),
        "the bank stalled after node 3 came back"
    );

    // Then a backup succeeds (after the cut of a killed one lapses, if it must).
    let dest = scratch.join("last");
    let made = tutti_json(&[
        "backup",
        "create",
        dest.to_str().unwrap(),
        "--cluster",
        &dir,
    ]);
    assert_eq!(made["data_bytes"].as_u64().unwrap() >> 20, 3 * 24, "{made}");
    stop.store(true, Ordering::Relaxed);
    for task in load {
        rt.block_on(task).unwrap();
    }
    let mut model = bank();
    for (client, (committed, possible)) in read_counts(&counts).into_iter().enumerate() {
        model.tally(client as u64, committed, possible - committed);
    }
    rt.block_on(common::assert_idle(&cluster, Duration::from_secs(10)));
    let violations = rt
        .block_on(tutti_harness::workload::check(&cluster, &model))
        .unwrap();
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn a_damaged_or_unfinished_backup_is_refused() {
    let dir = common::scratch("backup-damaged");
    let run = |args: &[&str]| Command::new(common::exe()).args(args).output().unwrap();
    let out = run(&["backup", "verify", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("did not finish"));
    let data = dir.join("restored");
    let out = run(&["backup", "restore", dir.to_str().unwrap(), "--data"])
        .status
        .success();
    assert!(!out, "--data is required");
    let out = run(&[
        "backup",
        "restore",
        dir.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!data.exists(), "nothing made from a backup that is not one");
}

/// The content of writer `w`'s file `i`.
fn file_content(w: u64, i: u64) -> Vec<u8> {
    format!("writer {w} file {i}\n")
        .repeat(100 + (i % 50) as usize)
        .into_bytes()
}

#[test]
fn a_file_system_backed_up_while_written_restores_clean() {
    use tutti_fs::ops::{Caller, NewFile};
    use tutti_fs::{FileSystem, Handle};
    let rt = common::runtime();
    let _guard = rt.enter();
    let c = common::start("backup-fs", NODES as usize, "log", &[], &[]);
    let cluster = rt.block_on(common::ready(&c));
    let dir = c.local.dir.display().to_string();
    tutti_json(&["fs", "mkfs", "--bytes-per-node", "16M", "--cluster", &dir]);
    let deadline = Duration::from_secs(10);
    let fs = Arc::new(
        rt.block_on(FileSystem::open(&cluster, "fs", deadline))
            .unwrap(),
    );
    let root = Handle::any(fs.root());
    let stop = Arc::new(AtomicBool::new(false));
    // Writers create a file, write it in a second minitransaction, and unlink every third
    // of their files: a cut can fall between any two of these.
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let (fs, stop) = (fs.clone(), stop.clone());
            rt.spawn(async move {
                let root_user = Caller { uid: 0, gid: 0 };
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("w{w}-{i}");
                    let new = NewFile::of(tutti_fs::inode::S_IFREG | 0o644);
                    let (ino, _) = fs
                        .make(root, name.as_bytes(), &new, root_user)
                        .await
                        .unwrap();
                    let extents = [(0, file_content(w, i))];
                    fs.write(Handle::any(ino), &extents, false, true)
                        .await
                        .unwrap();
                    if i % 3 == 2 {
                        let gone = format!("w{w}-{}", i - 1);
                        fs.unlink(root, gone.as_bytes(), &|_, _| false)
                            .await
                            .unwrap();
                    }
                    i += 1;
                }
                i
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let scratch = common::scratch("backup-fs-dest");
    let dest = scratch.join("b");
    tutti_json(&[
        "backup",
        "create",
        dest.to_str().unwrap(),
        "--cluster",
        &dir,
    ]);
    stop.store(true, Ordering::Relaxed);
    let made: Vec<u64> = writers
        .into_iter()
        .map(|w| rt.block_on(w).unwrap())
        .collect();
    eprintln!("files made by each writer: {made:?}");

    let data = scratch.join("restored");
    drop(c);
    let (mut local, restored) = restore_and_start(&rt, &dest, &data);
    let data_dir = data.display().to_string();
    // The cut is the volume as after a crash of every mount: an unlink's reclaim of the
    // file's inode (a minitransaction of its own) may not be in it, which --repair frees.
    let fsck = tutti_json(&["fs", "fsck", "--repair", "--cluster", &data_dir]);
    assert_eq!(fsck["clean"], true, "{fsck}");
    let problems = fsck["problems"].as_array().unwrap();
    assert!(
        problems.iter().all(|p| p.get("orphan_inode").is_some()),
        "{fsck}"
    );
    eprintln!("fsck of the restored volume: {fsck}");
    // Every file in the cut is whole: empty (made, not yet written) or all its bytes.
    let fs = rt
        .block_on(FileSystem::open(&restored, "fs", deadline))
        .unwrap();
    let (_, entries, _) = rt.block_on(fs.list(Handle::any(fs.root()))).unwrap();
    let mut whole = 0;
    for e in entries.iter().filter(|e| e.name.starts_with(b"w")) {
        let name = String::from_utf8_lossy(&e.name).to_string();
        let (w, i) = name[1..].split_once('-').unwrap();
        let expected = file_content(w.parse().unwrap(), i.parse().unwrap());
        let got = rt
            .block_on(fs.read(Handle::any(e.ino), 0, expected.len() as u32 + 1))
            .unwrap();
        assert!(
            got.is_empty() || got == expected,
            "{name}: {} bytes",
            got.len()
        );
        whole += usize::from(!got.is_empty());
    }
    assert!(whole > 0, "the cut holds written files");
    local.stop_all();
}
