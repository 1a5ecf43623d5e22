//! `tutti up`: a local cluster (a manager, N memory nodes and the logs' sequencer as child
//! processes), restarted when a child dies, until Ctrl-C or SIGTERM.

use super::args::{parse_size, shutdown_signal, ModeArg};
use super::out::noteln;
use clap::Args;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};
use tutti_client::Cluster;
use tutti_harness::local::{Layout, LocalCluster};
use tutti_wire::{CredentialFiles, NodeId, Placement, Request, Response};

#[derive(Args)]
pub(crate) struct UpArgs {
    /// Memory nodes to start (numbered 1..N) [default: 4, or the existing cluster's]. Fixed
    /// when the data directory is created.
    #[arg(long)]
    nodes: Option<usize>,
    /// Managers to start: 1, or a Raft group of 3 or 5 that keeps the directory, the epochs
    /// and the regions through the loss of any minority of them [default: 1, or the
    /// existing cluster's]. Fixed when the data directory is created.
    #[arg(long)]
    managers: Option<usize>,
    /// [default: log, or the existing cluster's]
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Data directory: cluster.json, the manager's state, one directory per node, logs/.
    #[arg(long, default_value = "./tutti-data")]
    data: PathBuf,
    /// Bytes of address space per memory node (suffixes K, M, G accepted).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// The address every process listens on, each on its own port: 127.0.0.1, or this
    /// machine's address that other machines dial (then with --token-file or --tls-*).
    /// Fixed when the data directory is created.
    #[arg(long, default_value_t = tutti_harness::local::LOOPBACK)]
    host: std::net::IpAddr,
    /// Also mount tutti-fs here (the volume `fs`, made on first use), unmounted on Ctrl-C.
    /// More mounts of it: `tutti fs mount --cluster DATA MOUNTPOINT`.
    #[arg(long, value_name = "MOUNTPOINT")]
    fs: Option<PathBuf>,
}

pub(crate) async fn run(a: UpArgs, credentials: &CredentialFiles) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the tutti executable: {e}"))?;
    if a.host.is_unspecified() {
        return Err(format!(
            "--host {}: give the address other machines dial this one at; processes register it with the manager, and clients dial what they find there",
            a.host
        ));
    }
    let credentials_given = *credentials != CredentialFiles::default();
    if !a.host.is_loopback() && !credentials_given && !recorded_credentials(&a.data) {
        return Err(format!(
            "--host {} is reachable from other machines: give the cluster --token-file FILE (`tutti token new FILE`) or --tls-cert, --tls-key and --tls-ca (`tutti tls new DIR --host {}`)",
            a.host, a.host
        ));
    }
    // What is not asked for is what the existing cluster has, if there is one.
    let existing = tutti_harness::local::read_file(&a.data).ok();
    let nodes = (a.nodes)
        .or_else(|| existing.as_ref().map(|f| f.nodes.len()))
        .unwrap_or(4);
    let managers = (a.managers)
        .or_else(|| existing.as_ref().map(|f| f.manager_entries().len()))
        .unwrap_or(1);
    let mode = match (a.mode, &existing) {
        (Some(m), _) => m.name().to_string(),
        (None, Some(f)) => f.mode.clone(),
        (None, None) => ModeArg::Log.name().to_string(),
    };
    let layout = Layout {
        host: a.host,
        nodes,
        managers,
        mode,
        size_bytes: a.size,
        node_flags: vec![],
        manager_flags: vec![],
    };
    if nodes == 0 || nodes > 1000 {
        return Err("--nodes must be between 1 and 1000".into());
    }
    let mut cluster = LocalCluster::open(&exe, &a.data, layout, true).map_err(|e| e.to_string())?;
    if credentials_given {
        (cluster.set_credentials(credentials)).map_err(|e| e.to_string())?;
    }
    cluster.start_all().map_err(|e| e.to_string())?;
    let client = (cluster.wait_up(Duration::from_secs(60)).await).map_err(|e| e.to_string())?;
    let managers = match cluster.file.managers.len() {
        0 => format!("manager at {}", cluster.file.manager),
        n => format!("{n} managers at {}", cluster.file.manager),
    };
    noteln!(
        "tutti: {} memory nodes ({} mode) up; {managers}",
        cluster.file.nodes.len(),
        cluster.file.mode,
    );
    noteln!("tutti: logs sequenced at {}", cluster.file.sequencer);
    noteln!(
        "tutti: addresses in {}; logs in {}",
        cluster.dir.join("cluster.json").display(),
        cluster.dir.join("logs").display()
    );
    // Two minitransactions: one's reads see the state before its own writes.
    noteln!(
        "tutti: try  tutti txn --cluster {0} write:1:0:68656c6c6f  then  tutti txn --cluster {0} read:1:0:5",
        cluster.file.manager
    );
    let session = match &a.fs {
        Some(at) => match super::fs::up_session(&cluster, a.size, at).await {
            Ok(s) => {
                noteln!("tutti: file system mounted at {}", at.display());
                Some(s)
            }
            Err(e) => {
                cluster.stop_all();
                return Err(format!("--fs: {e}"));
            }
        },
        None => None,
    };
    noteln!("tutti: Ctrl-C stops the cluster");
    let mut failure = supervise(&mut cluster, &client).await.err();
    eprintln!("tutti: stopping");
    if let (Some(s), Some(at)) = (session, &a.fs) {
        if let Err(e) = super::fs::stop_session(s, at).await {
            failure.get_or_insert(e);
        }
    }
    cluster.stop_all();
    failure.map_or(Ok(()), Err)
}

/// Each `log-repl` node's placement, as far as the managers answer at once.
async fn placements(cluster: &LocalCluster, client: &Cluster) -> BTreeMap<NodeId, Placement> {
    let mut placements = BTreeMap::new();
    let replicated = cluster.file.nodes.iter().filter(|n| n.mirror.is_some());
    for node in replicated.map(|n| n.id) {
        let req = Request::Placement { node };
        let ask = client.ask_manager(&req);
        if let Ok(Ok(Response::Placement(Some(p)))) =
            tokio::time::timeout(PLACEMENT_WAIT, ask).await
        {
            placements.insert(node, p);
        }
    }
    placements
}

/// How long `tutti up` waits for a placement before it records the role as unknown.
const PLACEMENT_WAIT: Duration = Duration::from_millis(200);

/// Whether the cluster in `data` (if any) recorded credentials at an earlier start.
fn recorded_credentials(data: &std::path::Path) -> bool {
    tutti_harness::local::read_file(data).is_ok_and(|f| f.credentials != CredentialFiles::default())
}

/// How often `tutti up` reads cluster.json for nodes `tutti node add` recorded.
const NEW_NODES_EVERY: Duration = Duration::from_millis(500);

/// A child that exits within this long of its start died quickly; more than
/// `QUICK_DEATHS_MAX` quick deaths in a row stop the cluster.
const QUICK_DEATH: Duration = Duration::from_secs(10);
const QUICK_DEATHS_MAX: u32 = 5;

/// One child's restarts: when it last started, its quick deaths in a row, and when it is due
/// to start again (it is down until then).
struct Restarts {
    started: Instant,
    quick_deaths: u32,
    due: Option<Instant>,
}

/// Restarts every child that dies, after a delay that doubles with each quick death in a row
/// (200 ms up to 10 s), until a shutdown signal (`Ok`) or a child that keeps dying (`Err`).
async fn supervise(cluster: &mut LocalCluster, client: &Cluster) -> Result<(), String> {
    enum Event {
        Shutdown,
        Exited(String, ExitStatus),
        Due,
        /// Time to look for nodes `tutti node add` recorded.
        Look,
    }
    let mut signal = Box::pin(shutdown_signal());
    let mut children: HashMap<String, Restarts> = HashMap::new();
    // Primaries a mirror replaced: they start again as mirrors.
    let mut as_mirror: HashSet<String> = HashSet::new();
    let mut look = tokio::time::interval(NEW_NODES_EVERY);
    loop {
        let due = children.values().filter_map(|r| r.due).min();
        let event = tokio::select! {
            _ = &mut signal => Event::Shutdown,
            (name, status) = cluster.exited() => Event::Exited(name, status),
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now).into()), if due.is_some() => Event::Due,
            _ = look.tick() => Event::Look,
        };
        let now = Instant::now();
        match event {
            Event::Shutdown => return Ok(()),
            Event::Look => {
                match cluster.adopt_new_nodes() {
                    Ok(added) => {
                        for n in added {
                            noteln!("tutti: memory node {} added, at {}", n.id, n.addr);
                        }
                    }
                    Err(e) => eprintln!("tutti: looking for added nodes: {e}"),
                }
                let placements = placements(cluster, client).await;
                let entries = cluster.process_entries(&placements);
                if let Err(e) = cluster.record_processes(entries) {
                    eprintln!("tutti: recording the processes in cluster.json: {e}");
                }
            }
            Event::Exited(name, status) if status.code() == Some(tutti_memnode::EXIT_REPLACED) => {
                // Its node is served by its mirror: it comes back as the node's new mirror
                // (docs/replication.md, "Re-replication"), and as a mirror-role process
                // from now on, whatever the placement makes of it.
                eprintln!(
                    "tutti: {name} was replaced by its node's mirror; it joins as the new \
                     mirror; see {}",
                    cluster
                        .dir
                        .join("logs")
                        .join(format!("{name}.log"))
                        .display()
                );
                as_mirror.insert(name.clone());
                let r = children.entry(name).or_insert(Restarts {
                    started: now,
                    quick_deaths: 0,
                    due: None,
                });
                r.due = Some(now);
            }
            Event::Exited(name, status) => {
                let log = cluster.dir.join("logs").join(format!("{name}.log"));
                let r = children.entry(name.clone()).or_insert(Restarts {
                    started: now,
                    quick_deaths: 0,
                    due: None,
                });
                r.quick_deaths = if r.started.elapsed() < QUICK_DEATH {
                    r.quick_deaths + 1
                } else {
                    1
                };
                if r.quick_deaths > QUICK_DEATHS_MAX {
                    return Err(format!(
                        "{name} exited {} times right after starting ({status}); see {}",
                        r.quick_deaths,
                        log.display()
                    ));
                }
                let delay =
                    Duration::from_millis(200 << r.quick_deaths).min(Duration::from_secs(10));
                eprintln!(
                    "tutti: {name} exited ({status}); restarting it in {delay:?}; see {}",
                    log.display()
                );
                r.due = Some(now + delay);
            }
            Event::Due => {
                for (name, r) in children
                    .iter_mut()
                    .filter(|(_, r)| r.due.is_some_and(|d| d <= now))
                {
                    r.due = None;
                    r.started = now;
                    let restarted = match as_mirror.contains(name) {
                        true => cluster.restart_as_mirror(name),
                        false => cluster.restart(name),
                    };
                    if let Err(e) = restarted {
                        eprintln!("tutti: restarting {name}: {e}; trying again in 1 s");
                        r.due = Some(now + Duration::from_secs(1));
                    }
                }
            }
        }
    }
}
