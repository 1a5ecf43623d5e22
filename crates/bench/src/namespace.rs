//! The namespace part of `tutti bench objects`: ZooKeeper's calls on tutti's namespace (one
//! view, over a log on the run's scratch cluster) against ZooKeeper 3.8 (`forceSync=yes`)
//! and etcd (which always fsyncs), in the same run: create, set, linearizable get (ZooKeeper:
//! `sync` then `getData`; etcd: a range in a Txn) and a multi of 3 operations (create, set,
//! check). Targets from the issue: ≥ 3 × ZooKeeper and ≥ 10 × etcd on create and set.

use crate::log::{label, sweep, Op};
use crate::objects::{four_node_log, host_one};
use crate::peers::{b64, b64_bytes, etcd, EtcdSession};
use crate::Point;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tutti_client::Cluster;
use tutti_log::Log;
use tutti_tango::{Kind, NamespaceRef, Op as NsOp, Tango, ANY_VERSION};

/// Each node's data, in bytes.
pub const DATA_BYTES: usize = 64;
/// The operations measured, in order.
pub const OPS: [&str; 4] = ["create", "set", "get", "multi"];
/// Bytes of each memory node the namespace's log takes, and its slots (a multi of 3 with
/// its headers fits).
const CAPACITY_BYTES: u64 = 80 << 20;
const SLOT_BYTES: u32 = 512;
/// Targets on create and set at 64 outstanding: tutti's throughput over the peer's.
pub const TARGETS: [(&str, f64); 2] = [("zookeeper", 3.0), ("etcd", 10.0)];

/// What one outstanding operation of a system does: the `op` of `OPS`, on its own node
/// `/s/SESSION` (set, get, multi) or on new ones named from a counter shared by every session
/// (create, multi).
trait System: Clone + Send + Sync + 'static {
    fn run(
        &self,
        op: &str,
        session: usize,
        seq: u64,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send;

    /// Runs before each point's sessions start.
    fn before_point(&self) -> impl std::future::Future<Output = Result<(), String>> + Send {
        async { Ok(()) }
    }
}

struct Session<S: System> {
    system: S,
    op: &'static str,
    session: usize,
    names: Arc<AtomicU64>,
}

impl<S: System> Op for Session<S> {
    async fn run(&mut self) -> Result<u64, String> {
        let seq = self.names.fetch_add(1, Ordering::Relaxed);
        self.system
            .run(self.op, self.session, seq)
            .await
            .map(|()| 1)
    }
}

fn data() -> Vec<u8> {
    vec![0x5a; DATA_BYTES]
}

/// Every operation at every count of outstanding on `system`, each session with its node
/// `/s/SESSION` (created beforehand by `setup`).
async fn every_op<S: System>(
    system: S,
    name: &str,
    mode: &str,
    outstanding: &[usize],
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let names = Arc::new(AtomicU64::new(0));
    let mut points = Vec::new();
    for op in OPS {
        let swept = sweep(
            outstanding,
            Duration::from_secs_f64(seconds),
            |n| label("namespace", name, mode, n, op),
            |session| {
                let (system, names) = (system.clone(), names.clone());
                async move {
                    if session == 0 {
                        system.before_point().await?;
                    }
                    Ok(Session {
                        system,
                        op,
                        session,
                        names,
                    })
                }
            },
            |_| {},
            progress,
        );
        points.extend(swept.await?);
    }
    Ok(points)
}

#[derive(Clone)]
struct Tutti {
    log: Log,
    tango: Tango,
    ns: NamespaceRef,
}

impl System for Tutti {
    async fn run(&self, op: &str, session: usize, seq: u64) -> Result<(), String> {
        let own = format!("/s/{session}");
        let e = |e: tutti_tango::TangoError| e.to_string();
        match op {
            "create" => (self
                .ns
                .create(&self.tango, &format!("/c/{seq}"), &data(), None, false)
                .await)
                .map(drop)
                .map_err(e),
            "set" => (self.ns.set(&self.tango, &own, &data(), ANY_VERSION).await)
                .map(drop)
                .map_err(e),
            "get" => self.ns.get(&self.tango, &own).await.map(drop).map_err(e),
            _ => {
                let ops = [
                    NsOp::Create {
                        path: format!("/m/{seq}"),
                        data: data(),
                        session: 0,
                        sequential: false,
                    },
                    NsOp::Set {
                        path: own.clone(),
                        data: data(),
                        version: ANY_VERSION,
                    },
                    NsOp::Check {
                        path: own,
                        version: ANY_VERSION,
                    },
                ];
                self.ns.multi(&self.tango, &ops).await.map(drop).map_err(e)
            }
        }
    }

    /// A point at 256 outstanding appends about 275 K entries: the log is trimmed below
    /// the tail before each point (after a checkpoint of the directory), so that the whole
    /// sweep fits. The one view has played everything below and reads none of it again.
    async fn before_point(&self) -> Result<(), String> {
        let e = |e: tutti_tango::TangoError| e.to_string();
        let as_of = (self.tango.checkpoint(tutti_tango::DIRECTORY_OID).await).map_err(e)?;
        (self.tango.forget(".", as_of).await).map_err(e)?;
        self.log.trim(as_of).await.map_err(|e| e.to_string())
    }
}

/// tutti's namespace on `cluster`: a log of its own, one client (one view) for every session.
pub async fn tutti(
    cluster: &Cluster,
    outstanding: &[usize],
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let log = four_node_log(cluster, "namespace", SLOT_BYTES, CAPACITY_BYTES, None).await?;
    let (tango, oid) = host_one(&log, "ns", Kind::Namespace).await?;
    let ns = NamespaceRef(oid);
    let max = outstanding.iter().copied().max().unwrap_or(1);
    let paths = ["/c".to_string(), "/m".into(), "/s".into()]
        .into_iter()
        .chain((0..max).map(|s| format!("/s/{s}")));
    for path in paths {
        (ns.create(&tango, &path, &data(), None, false).await).map_err(|e| e.to_string())?;
    }
    every_op(
        Tutti { log, tango, ns },
        "tutti",
        "log",
        outstanding,
        seconds,
        progress,
    )
    .await
}

#[derive(Clone)]
struct ZooKeeper {
    /// One session per outstanding operation, as ZooKeeper's clients have.
    clients: Arc<Vec<zookeeper_client::Client>>,
}

impl System for ZooKeeper {
    async fn run(&self, op: &str, session: usize, seq: u64) -> Result<(), String> {
        let client = &self.clients[session];
        let own = format!("/s/{session}");
        let persistent = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::anyone_all());
        let e = |e: zookeeper_client::Error| e.to_string();
        match op {
            "create" => client
                .create(&format!("/c/{seq}"), &data(), &persistent)
                .await
                .map(drop)
                .map_err(e),
            "set" => client
                .set_data(&own, &data(), None)
                .await
                .map(drop)
                .map_err(e),
            "get" => {
                client.sync(&own).await.map_err(e)?;
                client.get_data(&own).await.map(drop).map_err(e)
            }
            _ => {
                let mut multi = client.new_multi_writer();
                multi
                    .add_create(&format!("/m/{seq}"), &data(), &persistent)
                    .map_err(e)?;
                multi.add_set_data(&own, &data(), None).map_err(e)?;
                multi.add_check_version(&own, -1).map_err(e)?;
                multi.commit().await.map(drop).map_err(|e| e.to_string())
            }
        }
    }
}

/// ZooKeeper 3.8 standalone with `forceSync=yes` (started, then stopped when dropped).
pub async fn zookeeper(
    root: &std::path::Path,
    outstanding: &[usize],
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let (_server, addr) = crate::log::zookeeper(root).await?;
    let max = outstanding.iter().copied().max().unwrap_or(1);
    let mut clients = Vec::with_capacity(max);
    for _ in 0..max {
        let client = zookeeper_client::Client::connect(&addr)
            .await
            .map_err(|e| e.to_string())?;
        clients.push(client);
    }
    let persistent =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let paths = ["/c".to_string(), "/m".into(), "/s".into()]
        .into_iter()
        .chain((0..max).map(|s| format!("/s/{s}")));
    for path in paths {
        (clients[0].create(&path, &data(), &persistent).await)
            .map_err(|e| format!("{path}: {e}"))?;
    }
    let system = ZooKeeper {
        clients: Arc::new(clients),
    };
    every_op(
        system,
        "zookeeper",
        "forceSync",
        outstanding,
        seconds,
        progress,
    )
    .await
}

#[derive(Clone)]
struct Etcd {
    session: EtcdSession,
}

impl System for Etcd {
    async fn run(&self, op: &str, session: usize, seq: u64) -> Result<(), String> {
        let own = b64(&format!("/s/{session}"));
        let value = b64_bytes(&data());
        let put = |key: &str| serde_json::json!({"requestPut": {"key": key, "value": value}});
        // A create fails if the key exists (its create revision is 0 only while absent).
        let absent = |key: &str| serde_json::json!({"key": key, "target": "CREATE", "result": "EQUAL", "createRevision": "0"});
        let body = match op {
            "create" => {
                let key = b64(&format!("/c/{seq}"));
                serde_json::json!({"compare": [absent(&key)], "success": [put(&key)]})
            }
            "set" => serde_json::json!({"success": [put(&own)]}),
            "get" => serde_json::json!({"success": [{"requestRange": {"key": own}}]}),
            _ => {
                let key = b64(&format!("/m/{seq}"));
                let exists = serde_json::json!({"key": own, "target": "VERSION", "result": "GREATER", "version": "0"});
                serde_json::json!({"compare": [absent(&key), exists], "success": [put(&key), put(&own)]})
            }
        };
        let out = self.session.txn(body).await?;
        match out.get("succeeded").and_then(|v| v.as_bool()) {
            Some(false) => Err(format!("etcd's compare failed for {op}")),
            _ => Ok(()),
        }
    }
}

/// A single-member etcd (started, then stopped when dropped).
pub async fn etcd_points(
    root: &std::path::Path,
    outstanding: &[usize],
    seconds: f64,
    progress: &mut dyn FnMut(&Point),
) -> Result<Vec<Point>, String> {
    let (_server, session) = etcd(root, 0).await?;
    let max = outstanding.iter().copied().max().unwrap_or(1);
    let value = b64_bytes(&data());
    // etcd takes at most 128 operations in one Txn (its --max-txn-ops).
    for chunk in (0..max).collect::<Vec<_>>().chunks(128) {
        let puts: Vec<_> = (chunk.iter())
            .map(|s| serde_json::json!({"requestPut": {"key": b64(&format!("/s/{s}")), "value": value}}))
            .collect();
        session.txn(serde_json::json!({ "success": puts })).await?;
    }
    every_op(
        Etcd { session },
        "etcd",
        "fsync",
        outstanding,
        seconds,
        progress,
    )
    .await
}

/// The namespace's part of the objects section of RESULTS.md: a table per operation, then
/// each target at 64 outstanding with whether it was met.
pub fn section(points: &[Point], outstanding: &[usize]) -> String {
    use std::fmt::Write as _;
    let find = |system: &str, n: usize, op: &str| {
        points.iter().find(|p| {
            p.experiment == "namespace"
                && p.system == system
                && p.outstanding == n
                && p.operation.as_deref() == Some(op)
        })
    };
    let cell = |p: Option<&Point>| {
        p.map_or("-".to_string(), |p| {
            let failed = match p.errors {
                0 => String::new(),
                n => format!(", {n} failed"),
            };
            format!(
                "{:.0} ({:.0}/{:.0}{failed})",
                p.throughput_per_s, p.p50_us, p.p99_us
            )
        })
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n### The namespace against ZooKeeper and etcd\n\nZooKeeper's calls with {DATA_BYTES} B of data: tutti's namespace (one object, one view, over a log of its own on the same 4 nodes, 512 B slots), ZooKeeper 3.8 standalone (`forceSync=yes`, one session per outstanding call) and a single-member etcd (fsync always, its JSON gateway, one HTTP connection per outstanding call). create: a new persistent node (etcd: a Txn putting a key whose create revision is 0); set: a node's data, any version; get: linearizable (tutti: played to the tail; ZooKeeper: `sync` then `getData`; etcd: a range in a Txn); multi: a create, a set and a version check in one call (etcd: two compares, two puts). Calls per second (p50 / p99 latency in µs).\n"
    );
    for op in OPS {
        let _ = writeln!(
            md,
            "**{op}**\n\n| outstanding | tutti | zookeeper | etcd |\n| --- | --- | --- | --- |"
        );
        for &n in outstanding {
            let _ = writeln!(
                md,
                "| {n} | {} | {} | {} |",
                cell(find("tutti", n, op)),
                cell(find("zookeeper", n, op)),
                cell(find("etcd", n, op))
            );
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "Targets at 64 outstanding:\n");
    for op in ["create", "set"] {
        for (peer, factor) in TARGETS {
            let verdict = match (find("tutti", 64, op), find(peer, 64, op)) {
                (Some(t), Some(p)) if p.throughput_per_s > 0.0 => {
                    let ratio = t.throughput_per_s / p.throughput_per_s;
                    let met = if ratio >= factor { "met" } else { "not met" };
                    format!("{ratio:.1} ×: {met}")
                }
                _ => "not measured".into(),
            };
            let _ = writeln!(md, "- {op} ≥ {factor:.0} × {peer}: {verdict}");
        }
    }
    md
}
