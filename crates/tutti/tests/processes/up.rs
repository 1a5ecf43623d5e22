//! `tutti up` end to end: starts a cluster, serves `tutti txn`, stops every child on
//! SIGTERM, and comes back on the same data directory with the data intact.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn up(data: &std::path::Path) -> (Up, String) {
    up_with(data, &[])
}

/// A running `tutti up`, stopped (SIGTERM, then SIGKILL) when dropped: a test that fails
/// leaves no cluster running behind it.
struct Up(Child);

impl std::ops::Deref for Up {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Up {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let until = Instant::now() + Duration::from_secs(15);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `up`, with more flags. What it says on stderr goes to `DIR/up.stderr`, for the
/// messages of a test that fails.
fn up_with(data: &std::path::Path, flags: &[&str]) -> (Up, String) {
    std::fs::create_dir_all(data).unwrap();
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data.join("up.stderr"))
        .unwrap();
    let mut child = Command::new(common::exe())
        .args(["up", "--nodes", "2", "--size", "16M", "--data"])
        .arg(data)
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("tutti up prints its manager").unwrap();
    let manager = first.rsplit(' ').next().unwrap().to_string();
    assert!(first.contains("up; manager at"), "{first}");
    std::thread::spawn(move || for _ in lines {});
    (Up(child), manager)
}

fn txn(cluster: &str, items: &[&str]) -> serde_json::Value {
    succeeded(&try_txn(cluster, items))
}

/// `tutti ARGS...`, which must succeed: the JSON it printed.
fn tutti_json(args: &[&str]) -> serde_json::Value {
    succeeded(&Command::new(common::exe()).args(args).output().unwrap())
}

/// The JSON a command printed; asserts that it succeeded.
fn succeeded(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `tutti txn --cluster CLUSTER ITEMS...` (items may carry flags), however it ends.
fn try_txn(cluster: &str, items: &[&str]) -> std::process::Output {
    try_txn_within("3000", cluster, items)
}

/// `try_txn` with a deadline of `deadline_ms`.
fn try_txn_within(deadline_ms: &str, cluster: &str, items: &[&str]) -> std::process::Output {
    Command::new(common::exe())
        .args(["txn", "--deadline-ms", deadline_ms, "--cluster", cluster])
        .args(items)
        .output()
        .unwrap()
}

/// `tutti txn` right after node 1 failed over, which must succeed: the JSON it printed. The
/// promoted copy waits out the old primary's lease and the emptied one joins it meanwhile,
/// which on a loaded machine may take longer than `try_txn`'s deadline. On failure it shows
/// the tails of node 1's and the manager's logs and what `tutti up` said, so that a run on
/// CI says what happened.
fn txn_after_fail_over(data: &std::path::Path, cluster: &str, items: &[&str]) -> serde_json::Value {
    let out = try_txn_within("15000", cluster, items);
    if !out.status.success() {
        let tail = |name: &str| {
            let log = std::fs::read_to_string(data.join(name)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            format!(
                "== {name}\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            )
        };
        let logs = [
            "logs/node-1.log",
            "logs/node-1-mirror.log",
            "logs/manager.log",
            "up.stderr",
        ]
        .map(tail);
        panic!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            logs.join("\n")
        );
    }
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The error a failed command printed; asserts that it failed.
fn failure(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "succeeded: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
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
    // Without --nodes, --managers or --mode, up brings back the cluster as it is.
    let mut child = Command::new(common::exe())
        .args(["up", "--data"])
        .arg(&*data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("2 memory nodes (log mode) up"), "{first}");
    sigterm_and_wait(&mut child);
}

/// `tutti node add` while `tutti up` serves: the node joins (up starts it), serves
/// minitransactions at once, is restarted by up like the others, and comes back with the
/// cluster, data intact, though up is started again with the --nodes it was made with.
#[test]
fn a_node_added_while_up_serves_joins_and_stays() {
    let data = common::scratch("up-node-add");
    let (mut child, manager) = up(&data);
    let dir = data.display().to_string();
    assert_eq!(tutti_json(&["node", "add", "--data", &dir])["node"], 3);
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

#[test]
fn a_cluster_with_a_token_serves_only_clients_that_prove_it() {
    let dir = common::scratch("up-token");
    let (token, other) = (dir.join("token"), dir.join("other"));
    let new_token = |path: &std::path::Path| {
        Command::new(common::exe())
            .args(["token", "new"])
            .arg(path)
            .output()
            .unwrap()
    };
    for path in [&token, &other] {
        assert!(new_token(path).status.success());
    }
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(&token).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 65, "64 hex digits and a newline");
    assert!(failure(&new_token(&token)).contains("exists"));
    let (token_s, other_s) = (token.to_str().unwrap(), other.to_str().unwrap());

    let data = dir.join("data");
    let (mut child, manager) = up_with(&data, &["--token-file", token_s]);
    let data_s = data.to_str().unwrap();
    // `--cluster DIR` finds the token that up recorded.
    assert_eq!(txn(data_s, &["write:1:0:6869"])["committed"], true);
    let started = Instant::now();
    let err = failure(&try_txn(&manager, &["read:1:0:2"]));
    assert!(err.contains("requires the cluster token"), "{err}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "a refusal is not retried: {waited:?}"
    );
    let read = txn(&manager, &["--token-file", token_s, "read:1:0:2"]);
    assert_eq!(read["reads"][0], "6869");
    let err = failure(&try_txn(&manager, &["--token-file", other_s, "read:1:0:2"]));
    assert!(err.contains("token differs"), "{err}");
    let err = failure(&try_txn(data_s, &["--token-file", other_s, "read:1:0:2"]));
    assert!(err.contains("token differs"), "{err}");

    // Serving beyond loopback without a token: refused at start, by each kind of process.
    let mdata = dir.join("manager");
    for args in [
        vec![
            "manager",
            "--listen",
            "0.0.0.0:0",
            "--data",
            mdata.to_str().unwrap(),
        ],
        vec![
            "memnode",
            "--id",
            "9",
            "--mode",
            "ram",
            "--listen",
            "0.0.0.0:0",
            "--manager",
            &manager,
        ],
        vec!["sequencer", "--listen", "0.0.0.0:0", "--cluster", &manager],
    ] {
        let out = Command::new(common::exe()).args(&args).output().unwrap();
        let err = failure(&out);
        assert!(err.contains("no cluster token"), "{args:?}: {err}");
    }
    sigterm_and_wait(&mut child);
}

#[test]
fn a_cluster_with_tls_serves_only_clients_with_certificates_of_its_authority() {
    fn flags(f: &[String]) -> Vec<&str> {
        f.iter().map(String::as_str).collect()
    }
    let dir = common::scratch("up-tls");
    let tls_new = |name: &str| {
        let made = tutti_json(&["tls", "new", dir.join(name).to_str().unwrap()]);
        ["--tls-cert", "--tls-key", "--tls-ca"]
            .into_iter()
            .zip(["cert", "key", "ca"])
            .flat_map(|(flag, field)| [flag.to_string(), made[field].as_str().unwrap().into()])
            .collect::<Vec<String>>()
    };
    let (ours, theirs) = (tls_new("ours"), tls_new("theirs"));

    let data = dir.join("data");
    let (mut child, manager) = up_with(&data, &flags(&ours));
    let data_s = data.to_str().unwrap();
    // `--cluster DIR` finds the certificates that up recorded.
    assert_eq!(txn(data_s, &["write:1:0:6869"])["committed"], true);
    let started = Instant::now();
    let err = failure(&try_txn(&manager, &["read:1:0:2"]));
    assert!(err.contains("requires TLS"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "not retried");
    let read = txn(&manager, &[flags(&ours), vec!["read:1:0:2"]].concat());
    assert_eq!(read["reads"][0], "6869");
    let err = failure(&try_txn(
        &manager,
        &[flags(&theirs), vec!["read:1:0:2"]].concat(),
    ));
    assert!(err.contains("TLS with the peer failed"), "{err}");
    sigterm_and_wait(&mut child);
}

#[test]
fn up_listens_on_its_host_and_beyond_loopback_only_with_credentials() {
    let dir = common::scratch("up-host");
    let refused = dir.join("refused");
    for (host, why) in [
        ("0.0.0.0", "other machines dial"),
        ("192.0.2.1", "--token-file"),
    ] {
        let out = Command::new(common::exe())
            .args(["up", "--host", host, "--data"])
            .arg(&refused)
            .output()
            .unwrap();
        let err = failure(&out);
        assert!(err.contains(why), "{host}: {err}");
        assert!(!refused.exists(), "{host}: nothing is made");
    }
    let data = dir.join("data");
    let (mut child, manager) = up_with(&data, &["--host", "127.0.0.2"]);
    assert!(manager.starts_with("127.0.0.2:"), "{manager}");
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    for node in file["nodes"].as_array().unwrap() {
        assert!(node["addr"].as_str().unwrap().starts_with("127.0.0.2:"));
    }
    assert_eq!(
        txn(data.to_str().unwrap(), &["write:2:0:6869"])["committed"],
        true
    );
    sigterm_and_wait(&mut child);
}

/// cluster.json's `processes`, once `tutti up` has recorded them: name → (role, pid).
fn processes(data: &std::path::Path) -> std::collections::HashMap<String, (String, Option<u64>)> {
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    let empty = vec![];
    (file["processes"].as_array().unwrap_or(&empty).iter())
        .map(|p| {
            let name = p["name"].as_str().unwrap().to_string();
            (
                name,
                (p["role"].as_str().unwrap().to_string(), p["pid"].as_u64()),
            )
        })
        .collect()
}

/// The address cluster.json gives the process `name`.
fn addr_of(data: &std::path::Path, name: &str) -> String {
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    (file["processes"].as_array().unwrap().iter())
        .find(|p| p["name"] == name)
        .and_then(|p| p["addr"].as_str())
        .unwrap()
        .to_string()
}

/// How many times the processes that ran as `name` logged a registration with the managers.
fn registrations(data: &std::path::Path, name: &str) -> usize {
    let log = std::fs::read_to_string(data.join(format!("logs/{name}.log")));
    log.unwrap_or_default()
        .matches("registered with the managers")
        .count()
}

/// Node 1's placement, asked of the managers directly (cluster.json follows it late).
struct NamedPrimary {
    rt: tokio::runtime::Runtime,
    managers: tutti_wire::Managers,
}

impl NamedPrimary {
    fn new(manager: &str) -> NamedPrimary {
        let managers = tutti_wire::Managers::parse(
            manager,
            tutti_wire::FRAME_BYTES_MAX_DEFAULT,
            tutti_wire::Dialer::default(),
        )
        .unwrap();
        NamedPrimary {
            rt: common::runtime(),
            managers,
        }
    }

    /// Waits, asking every 2 ms, until the placement names `addr` node 1's primary.
    fn until(&self, addr: &str, within: Duration) {
        let until = Instant::now() + within;
        while self.now().is_none_or(|p| p.primary != addr) {
            assert!(Instant::now() < until, "{addr} never named primary");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Node 1's placement as the managers' leader has it now, if it answers.
    fn now(&self) -> Option<tutti_wire::Placement> {
        let ask = tutti_wire::Request::Placement { node: 1 };
        match (self.rt).block_on(self.managers.call(&ask, Duration::from_secs(1))) {
            Ok(tutti_wire::Response::Placement(p)) => p,
            _ => None,
        }
    }
}

/// The copy that came back empty (`name`) joins node 1's primary as its mirror, node 1
/// takes a write, and `tutti up` stops leaving no child behind.
fn rejoins_and_stops(child: &mut Child, data: &std::path::Path, manager: &str, name: &str) {
    until_role(data, name, "mirror");
    assert_eq!(txn(manager, &["write:1:8:01"])["committed"], true);
    assert_eq!(stop_and_count_children(child, data), 0);
}

/// Waits until cluster.json gives `name` the role `role` and a pid; the pid.
fn until_role(data: &std::path::Path, name: &str, role: &str) -> u64 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((r, Some(pid))) = processes(data).get(name) {
            if r == role {
                return *pid;
            }
        }
        assert!(
            Instant::now() < until,
            "{name} never {role}: {:?}",
            processes(data)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `tutti up --mode log-repl`: cluster.json names each process's role and pid; a primary
/// frozen past the fail-over timeout (cut off, as by a partition) is replaced by its
/// mirror, stops when it wakes, and comes back as the node's new mirror.
#[test]
fn a_replaced_primary_comes_back_as_the_new_mirror() {
    let data = common::scratch("up-repl");
    let (mut child, manager) = up_with(&data, &["--mode", "log-repl"]);
    let out = txn(&manager, &["write:1:0:68656c6c6f"]);
    assert_eq!(out["committed"], true);
    let pid = until_role(&data, "node-1", "primary");
    until_role(&data, "node-1-mirror", "mirror");
    // SAFETY: kill(2) on a process of this test's cluster.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    until_role(&data, "node-1-mirror", "primary");
    // `tutti node list` gives the same placement: the mirror serves, alone.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    let mirror_addr = file["nodes"][0]["mirror"]["addr"].clone();
    let out = Command::new(common::exe())
        .args(["node", "list", "--cluster", &manager])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["node"], 1);
    assert_eq!(first["placement"]["primary"], mirror_addr);
    assert_eq!(first["placement"]["mirror"], serde_json::Value::Null);
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    let back = until_role(&data, "node-1", "mirror");
    assert_ne!(back, pid, "a new process");
    let out = txn_after_fail_over(&data, &manager, &["read:1:0:5", "write:1:8:01"]);
    assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
}

/// Process `name` (pid `pid`) of the cluster in `data` loses its disk: its data directory
/// is emptied while it is stopped, then it is killed (`tutti up` starts it again).
fn lose_disk(data: &std::path::Path, name: &str, pid: u64) {
    // SAFETY: kill(2) on a process of this test's cluster.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    tutti_harness::local::empty_dir(&data.join(name)).unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// `tutti up --mode log-repl` in `data`, `hello` written at node 1's address 0 and then
/// checkpointed out of both copies' logs (checkpoints run every 2 s): the cluster, its
/// manager, and the pids of node 1's primary and mirror.
fn log_repl_with_a_checkpointed_write(data: &std::path::Path) -> (Up, String, u64, u64) {
    let (child, manager) = up_with(data, &["--mode", "log-repl"]);
    let out = txn(&manager, &["write:1:0:68656c6c6f"]);
    assert_eq!(out["committed"], true);
    let primary = until_role(data, "node-1", "primary");
    let mirror = until_role(data, "node-1-mirror", "mirror");
    std::thread::sleep(Duration::from_secs(6));
    (child, manager, primary, mirror)
}

/// `tutti up --mode log-repl`: a primary whose disk is lost comes back empty while the
/// placement still names it: it must not serve. The mirror takes over with everything
/// written, and the emptied process joins it as the new mirror.
#[test]
fn a_log_repl_primary_that_lost_its_disk_gives_way_to_its_mirror() {
    let data = common::scratch("up-repl-primary-disk");
    let (mut child, manager, primary, mirror) = log_repl_with_a_checkpointed_write(&data);
    lose_disk(&data, "node-1", primary);
    assert_eq!(until_role(&data, "node-1-mirror", "primary"), mirror);
    let out = txn_after_fail_over(&data, &manager, &["read:1:0:5", "write:1:8:01"]);
    assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
    let back = until_role(&data, "node-1", "mirror");
    assert_ne!(back, primary, "a new process");
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
}

/// `tutti up`: a `log` node whose image file is lost (its `node.json` and log kept) does
/// not start: before, it served zeros where its writes had been checkpointed.
#[test]
fn a_log_node_that_lost_its_image_refuses_to_start() {
    let data = common::scratch("up-lost-image");
    let (mut child, manager) = up(&data);
    assert_eq!(txn(&manager, &["write:1:0:68656c6c6f"])["committed"], true);
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
    std::fs::remove_file(data.join("node-1").join("image")).unwrap();
    let mut again = Command::new(common::exe())
        .args(["up", "--nodes", "2", "--size", "16M", "--data"])
        .arg(&*data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while again.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = again.kill();
            panic!("tutti up serves a node that lost its image");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = again.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("lost part of node 1's data"), "{stderr}");
    assert!(
        !data.join("node-1").join("image").exists(),
        "an image made anew"
    );
    assert_eq!(children_alive(&data), 0);
}

/// `tutti up --mode log-repl`: a primary whose image file alone is lost (its `node.json`
/// and log kept) no longer holds the node either. The cluster stopped, the image deleted
/// and the cluster started again, the mirror serves the write (before, the primary served
/// zeros where the write had been checkpointed), and the damaged process joins it. An
/// unreplicated node refuses to start instead (`a_log_node_that_lost_its_image...`).
#[test]
fn a_log_repl_primary_that_lost_its_image_gives_way_to_its_mirror() {
    let data = common::scratch("up-repl-primary-image");
    let (mut child, _, _, _) = log_repl_with_a_checkpointed_write(&data);
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
    std::fs::remove_file(data.join("node-1").join("image")).unwrap();
    let (mut child, manager) = up_with(&data, &["--mode", "log-repl"]);
    until_role(&data, "node-1-mirror", "primary");
    let out = txn_after_fail_over(&data, &manager, &["read:1:0:5", "write:1:8:01"]);
    assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
    until_role(&data, "node-1", "mirror");
    assert!(data.join("node-1").join("image").exists(), "joined again");
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
}

/// `tutti up --mode log-repl`: a mirror whose disk is lost (its data directory emptied while
/// it is stopped, then killed) comes back empty. It must not count as a copy of the node
/// until it joined again, seeded by the primary: the primary cut off at once, it is not
/// promoted; once it is the mirror again, the primary cut off, it serves what was written
/// before its disk went, long since checkpointed away from the primary's log.
#[test]
fn a_log_repl_mirror_that_lost_its_disk_joins_again_before_it_counts() {
    let data = common::scratch("up-repl-disk");
    let (mut child, manager, primary, mirror) = log_repl_with_a_checkpointed_write(&data);
    // Node 1's placement (`tutti node list` prints a line per node).
    let placement = || {
        let out = Command::new(common::exe())
            .args(["node", "list", "--cluster", &manager])
            .output()
            .unwrap();
        let first = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .map(str::to_owned);
        let node: serde_json::Value =
            serde_json::from_str(&first.unwrap_or_default()).unwrap_or_default();
        node["placement"].clone()
    };
    let before = placement();
    lose_disk(&data, "node-1-mirror", mirror);
    let until = Instant::now() + Duration::from_secs(30);
    while !matches!(processes(&data).get("node-1-mirror"), Some((_, Some(pid))) if *pid != mirror) {
        assert!(Instant::now() < until, "{:?}", processes(&data));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The primary cut off (stopped, so that it does not come back as itself at once) as
    // soon as the emptied mirror is back, which the placement still names: the node must
    // wait for its primary rather than serve from the empty copy.
    // SAFETY: kill(2) on a process of this test's cluster.
    unsafe { libc::kill(primary as i32, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_secs(4));
    let role = processes(&data)["node-1-mirror"].0.clone();
    // SAFETY: as above.
    unsafe { libc::kill(primary as i32, libc::SIGCONT) };
    assert_ne!(role, "primary", "the emptied mirror was promoted");
    // Named again only in a later placement, once it joined.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = placement();
        let later = now["config_epoch"].as_u64() > before["config_epoch"].as_u64();
        if later && now["mirror"] == before["mirror"] {
            break;
        }
        assert!(Instant::now() < until, "{before} then {now}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let back = until_role(&data, "node-1-mirror", "mirror");
    assert_ne!(back, mirror, "a new process");
    // The primary's process as it is now: stopped that long, it may have been started again.
    let primary = until_role(&data, "node-1", "primary");
    // SAFETY: as above.
    unsafe { libc::kill(primary as i32, libc::SIGSTOP) };
    assert_eq!(until_role(&data, "node-1-mirror", "primary"), back);
    let out = txn_after_fail_over(&data, &manager, &["read:1:0:5"]);
    // SAFETY: as above.
    unsafe { libc::kill(primary as i32, libc::SIGCONT) };
    assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
}

/// `tutti up --mode ram-repl`: both copies of a node in RAM (under /dev/shm); a copy killed
/// with SIGKILL comes back empty and joins as the mirror, and holds everything once named:
/// the node survives the loss of each of its copies in turn. The RAM is freed at the stop,
/// and the cluster, gone with it, is not started again.
#[test]
fn a_ram_repl_node_survives_the_loss_of_each_copy_in_turn() {
    let data = common::scratch("up-ram-repl");
    let (mut child, manager) = up_with(&data, &["--mode", "ram-repl"]);
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("cluster.json")).unwrap()).unwrap();
    let ram = std::path::PathBuf::from(file["nodes"][0]["data"].as_str().unwrap());
    assert!(ram.starts_with("/dev/shm"), "{}", ram.display());
    let out = txn(&manager, &["write:1:0:68656c6c6f"]);
    assert_eq!(out["committed"], true);
    let mut serving = "node-1";
    for other in ["node-1-mirror", "node-1"] {
        let pid = until_role(&data, serving, "primary");
        until_role(&data, other, "mirror");
        // SAFETY: kill(2) on a process of this test's cluster.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        until_role(&data, other, "primary");
        let out = txn_after_fail_over(&data, &manager, &["read:1:0:5", "write:1:8:01"]);
        assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
        let back = until_role(&data, serving, "mirror");
        assert_ne!(back, pid, "a new process");
        serving = other;
    }
    assert_eq!(stop_and_count_children(&mut child, &data), 0);
    assert!(!ram.exists(), "{} left behind", ram.display());
    let again = Command::new(common::exe())
        .args(["up", "--data"])
        .arg(&*data)
        .output()
        .unwrap();
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("held a ram-repl cluster"), "{stderr}");
}

/// `ram-repl`: a mirror promoted and killed before it registers restarts empty, and the
/// primary it replaced (stopped, not dead: SIGSTOP here, a process cut off in life) learns
/// it was replaced on waking. It leaves its copy to the process `tutti up` starts in its
/// place, which tells the managers; they name it primary again, and what was written before
/// either event is read back. The kill must land between the promotion and the
/// registration (about 100 ms): an attempt whose mirror registered first is told by its log
/// and run again on a new cluster.
#[test]
fn a_replaced_ram_repl_primary_serves_again_when_its_successor_dies_before_registering() {
    a_replaced_primary_serves_again_when_its_successor_dies_empty("ram-repl", false, false);
}

/// `log-repl`: the same, the promoted mirror losing its disk as it dies (a killed one
/// would restart over its disk and serve). Before, the replaced primary joined the empty
/// successor, which waited for another copy to be named, and the node stopped serving.
#[test]
fn a_replaced_log_repl_primary_serves_again_when_its_successor_loses_its_disk() {
    a_replaced_primary_serves_again_when_its_successor_dies_empty("log-repl", false, false);
}

/// `log-repl`: the same, the stopped primary killed instead of woken: `tutti up` starts it
/// again as the primary, the managers refuse its registration, and it offers its copy as of
/// the configuration it last served under (`served.json`).
#[test]
fn a_log_repl_primary_replaced_while_down_serves_again_when_its_successor_loses_its_disk() {
    a_replaced_primary_serves_again_when_its_successor_dies_empty("log-repl", true, false);
}

/// `log-repl`: the same, the primary a process of the mirror role (its node failed over
/// once before). `tutti up` starts it again as a mirror-role process, which does not
/// register first: it offers its copy as of `served.json` instead of joining the empty
/// successor, as the simulator's model of it does. Before, the node stopped serving.
#[test]
fn a_log_repl_mirror_role_primary_replaced_while_down_serves_again_when_its_successor_loses_its_disk(
) {
    a_replaced_primary_serves_again_when_its_successor_dies_empty("log-repl", true, true);
}

/// `log-repl`: node 1's primary stopped until the managers name its mirror primary; the
/// mirror stopped as soon as it knows, before it registers, so that, hearing nothing from
/// it, the managers name the woken primary's copy again; that copy loses its disk before it
/// registers. The named mirror, killed and started again, finds the placement changed
/// without it and holds its copy for the managers (they know the change left it out), and
/// is named in turn, and what was
/// written before is read back. Before, it came back an ordinary mirror, joined the emptied
/// copy, and the node was lost. Each stop and loss must land before a registration (about
/// 100 ms): an attempt that missed is told by the logs and run again on a new cluster.
#[test]
fn a_named_log_repl_mirror_that_died_before_registering_serves_when_the_copy_named_again_is_lost() {
    for attempt in 1..=3 {
        let data = common::scratch("up-log-repl-named");
        let (mut child, manager) = up_with(&data, &["--mode", "log-repl"]);
        assert_eq!(txn(&manager, &["write:1:0:68656c6c6f"])["committed"], true);
        let primary = until_role(&data, "node-1", "primary");
        let mirror = until_role(&data, "node-1-mirror", "mirror");
        let (primary_addr, mirror_addr) =
            (addr_of(&data, "node-1"), addr_of(&data, "node-1-mirror"));
        let named = NamedPrimary::new(&manager);
        let primary_registrations = registrations(&data, "node-1");
        // SAFETY: kill(2) on processes of this test's cluster.
        unsafe { libc::kill(primary as i32, libc::SIGSTOP) };
        named.until(&mirror_addr, Duration::from_secs(30));
        let mirror_log = data.join("logs/node-1-mirror.log");
        let until = Instant::now() + Duration::from_secs(5);
        while !(std::fs::read_to_string(&mirror_log).unwrap_or_default())
            .contains("named primary: waiting out the old primary's lease")
        {
            assert!(
                Instant::now() < until,
                "the mirror never learned it was named"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: as above.
        unsafe { libc::kill(mirror as i32, libc::SIGSTOP) };
        unsafe { libc::kill(primary as i32, libc::SIGCONT) };
        if registrations(&data, "node-1-mirror") > 0 {
            eprintln!("attempt {attempt}: the named mirror registered before it was stopped");
            unsafe { libc::kill(mirror as i32, libc::SIGCONT) };
            sigterm_and_wait(&mut child);
            continue;
        }
        // The woken primary stops, replaced; the process started in its place is named
        // primary again once the named mirror has been silent long enough.
        named.until(&primary_addr, Duration::from_secs(30));
        let named_again = until_role(&data, "node-1", "primary");
        lose_disk(&data, "node-1", named_again);
        if registrations(&data, "node-1") > primary_registrations {
            eprintln!("attempt {attempt}: the copy named again registered before its disk went");
            unsafe { libc::kill(mirror as i32, libc::SIGCONT) };
            sigterm_and_wait(&mut child);
            continue;
        }
        // SAFETY: as above.
        unsafe { libc::kill(mirror as i32, libc::SIGKILL) };
        let until = Instant::now() + Duration::from_secs(30);
        while !matches!(processes(&data).get("node-1-mirror"),
            Some((role, Some(pid))) if role == "primary" && *pid != mirror)
        {
            assert!(Instant::now() < until, "{:?}", processes(&data));
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = txn_after_fail_over(&data, &manager, &["read:1:0:5"]);
        assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
        let log = std::fs::read_to_string(&mirror_log).unwrap();
        assert!(
            log.contains("the placement changed without this copy while it was down"),
            "{log}"
        );
        // The emptied copy joins it.
        rejoins_and_stops(&mut child, &data, &manager, "node-1");
        return;
    }
    panic!("in 3 attempts, a stop or a loss landed after a registration");
}

/// `ram-repl`: a mirror dropped on its primary's report (stopped past the fail-over
/// timeout), and the primary stopped before it heard of the drop, then killed (its process
/// restarts empty). The woken mirror holds every record the primary committed and keeps its
/// copy for the managers, who name it primary once the primary has been silent long enough:
/// what was written before is read back. Before, it gave its copy up to join the empty
/// primary, and the node was lost. The stop must land before the primary's next heartbeat
/// (every 200 ms) brings it the drop: an attempt whose primary registered alone first (the
/// mirror is then told to let its copy go) is run again on a new cluster.
#[test]
fn a_dropped_ram_repl_mirror_serves_when_its_primary_dies_before_hearing_of_the_drop() {
    a_dropped_mirror_serves_when_its_primary_is_lost_before_hearing_of_the_drop("ram-repl");
}

/// `log-repl`: the same, the primary losing its disk as it is killed (one killed with its
/// disk restarts over it, registers, and serves alone).
#[test]
fn a_dropped_log_repl_mirror_serves_when_its_primary_loses_its_disk_before_hearing_of_the_drop() {
    a_dropped_mirror_serves_when_its_primary_is_lost_before_hearing_of_the_drop("log-repl");
}

/// Node 1's mirror stopped until the managers drop it on its primary's report; the
/// primary stopped before it hears of the drop, the mirror woken, and the primary killed
/// (`ram-repl`) or killed with its disk (`log-repl`): the dropped mirror is named and serves.
fn a_dropped_mirror_serves_when_its_primary_is_lost_before_hearing_of_the_drop(mode: &str) {
    for attempt in 1..=3 {
        let data = common::scratch(&format!("up-{mode}-dropped"));
        let (mut child, manager) = up_with(&data, &["--mode", mode]);
        assert_eq!(txn(&manager, &["write:1:0:68656c6c6f"])["committed"], true);
        let primary = until_role(&data, "node-1", "primary");
        let mirror = until_role(&data, "node-1-mirror", "mirror");
        let mirror_addr = addr_of(&data, "node-1-mirror");
        let placement = NamedPrimary::new(&manager);
        let mirror_log = data.join("logs/node-1-mirror.log");
        let mirror_says =
            |what: &str| (std::fs::read_to_string(&mirror_log).unwrap_or_default()).contains(what);
        // A `ram-repl` mirror joins at its start: this test is of one that knows it was
        // named (a `log-repl` one is named from the cluster's creation).
        let until = Instant::now() + Duration::from_secs(10);
        while mode == "ram-repl" && !mirror_says("named the node's mirror") {
            assert!(
                Instant::now() < until,
                "the mirror never learned it was named"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: kill(2) on processes of this test's cluster.
        unsafe { libc::kill(mirror as i32, libc::SIGSTOP) };
        let until = Instant::now() + Duration::from_secs(10);
        while placement.now().is_none_or(|p| p.mirror.is_some()) {
            assert!(Instant::now() < until, "the mirror was never dropped");
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: as above.
        unsafe { libc::kill(primary as i32, libc::SIGSTOP) };
        unsafe { libc::kill(mirror as i32, libc::SIGCONT) };
        let until = Instant::now() + Duration::from_secs(5);
        while !mirror_says("the placement does not name this mirror") {
            assert!(
                Instant::now() < until,
                "the mirror never learned of the drop"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if mode == "log-repl" {
            lose_disk(&data, "node-1", primary);
        } else {
            // SAFETY: as above.
            unsafe { libc::kill(primary as i32, libc::SIGKILL) };
        }
        let until = Instant::now() + Duration::from_secs(30);
        let mut missed = false;
        while placement.now().is_none_or(|p| p.primary != mirror_addr) {
            missed = mirror_says("letting this one go");
            if missed {
                break;
            }
            assert!(Instant::now() < until, "the dropped mirror was never named");
            std::thread::sleep(Duration::from_millis(10));
        }
        if missed {
            eprintln!("attempt {attempt}: the primary registered alone before it was stopped");
            sigterm_and_wait(&mut child);
            continue;
        }
        let out = txn_after_fail_over(&data, &manager, &["read:1:0:5"]);
        assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
        assert!(mirror_says(
            "named primary: serving the copy kept for the managers"
        ));
        // The primary's process, started again empty, joins it.
        rejoins_and_stops(&mut child, &data, &manager, "node-1");
        return;
    }
    panic!("in 3 attempts, the primary registered alone before it was stopped");
}

/// Node 1's primary stopped until its mirror is promoted, the mirror then killed (losing
/// its disk in `log-repl`), the primary woken or killed (`primary_dies`). With `swapped`,
/// node 1's processes first trade places (its first primary killed, its mirror promoted,
/// the killed one back as the mirror), so that the primary is a process of the mirror role.
fn a_replaced_primary_serves_again_when_its_successor_dies_empty(
    mode: &str,
    primary_dies: bool,
    swapped: bool,
) {
    for attempt in 1..=3 {
        let data = common::scratch(&format!("up-{mode}-former"));
        let (mut child, manager) = up_with(&data, &["--mode", mode]);
        assert_eq!(txn(&manager, &["write:1:0:68656c6c6f"])["committed"], true);
        let (primary_name, mirror_name) = match swapped {
            false => ("node-1", "node-1-mirror"),
            true => ("node-1-mirror", "node-1"),
        };
        if swapped {
            let first = until_role(&data, "node-1", "primary");
            until_role(&data, "node-1-mirror", "mirror");
            // SAFETY: kill(2) on a process of this test's cluster.
            unsafe { libc::kill(first as i32, libc::SIGSTOP) };
            until_role(&data, "node-1-mirror", "primary");
            // SAFETY: as above.
            unsafe { libc::kill(first as i32, libc::SIGKILL) };
        }
        let primary = until_role(&data, primary_name, "primary");
        let mirror = until_role(&data, mirror_name, "mirror");
        let mirror_addr = addr_of(&data, mirror_name);
        let named = NamedPrimary::new(&manager);
        // SAFETY: kill(2) on processes of this test's cluster.
        unsafe { libc::kill(primary as i32, libc::SIGSTOP) };
        named.until(&mirror_addr, Duration::from_secs(10));
        if mode == "log-repl" {
            lose_disk(&data, mirror_name, mirror);
        } else {
            // SAFETY: as above.
            unsafe { libc::kill(mirror as i32, libc::SIGKILL) };
        }
        let wake = if primary_dies {
            libc::SIGKILL
        } else {
            libc::SIGCONT
        };
        // SAFETY: as above.
        unsafe { libc::kill(primary as i32, wake) };
        // A process of the primary role registers at its start.
        if registrations(&data, mirror_name) > usize::from(mirror_name == "node-1") {
            eprintln!("attempt {attempt}: the promoted mirror registered before it was killed");
            sigterm_and_wait(&mut child);
            continue;
        }
        // The old primary's process, started again in its place, is named primary again.
        let until = Instant::now() + Duration::from_secs(30);
        while !matches!(processes(&data).get(primary_name),
            Some((role, Some(pid))) if role == "primary" && *pid != primary)
        {
            assert!(Instant::now() < until, "{:?}", processes(&data));
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = txn(&manager, &["read:1:0:5"]);
        assert_eq!(out["reads"], serde_json::json!(["68656c6c6f"]));
        let log = std::fs::read_to_string(data.join(format!("logs/{primary_name}.log"))).unwrap();
        assert!(
            log.contains("named primary: serving the copy kept for the managers"),
            "{log}"
        );
        // The mirror, started again empty, joins it.
        rejoins_and_stops(&mut child, &data, &manager, mirror_name);
        return;
    }
    panic!("in 3 attempts, the promoted mirror registered before it was killed");
}
