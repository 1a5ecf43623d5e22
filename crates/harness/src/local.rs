//! A local cluster of real processes: one manager and N memory nodes started from this
//! executable, described by `DATA/cluster.json`, restartable on the same data directory.
//! `tutti up`, `tutti bench` and the cross-process tests all start clusters through it.

use crate::supervisor::Supervisor;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};
use tutti_client::{ClientOptions, Cluster};
use tutti_wire::{CredentialFiles, Credentials, Dialer, NodeId};

/// A logical memory node: its first primary (process `node-ID`) and, in `log-repl` mode,
/// its mirror (process `node-ID-mirror`). Which of the two serves is the manager's
/// placement (`tutti nodes` shows it): after a fail-over, the mirror.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NodeEntry {
    pub id: NodeId,
    pub addr: String,
    pub metrics: String,
    pub data: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorEntry>,
}

/// A `log-repl` node's mirror process.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MirrorEntry {
    pub addr: String,
    pub data: PathBuf,
}

/// The modes whose nodes have mirrors: `log-repl`, and `ram-repl`, whose copies live in
/// RAM (data directories under `/dev/shm`) and die with their processes.
pub const REPLICATED_MODES: [&str; 2] = ["log-repl", "ram-repl"];

/// Whether nodes of `mode` have a primary and a mirror.
pub fn replicated(mode: &str) -> bool {
    REPLICATED_MODES.contains(&mode)
}

/// The mode whose copies live in RAM.
pub const RAM_REPLICATED_MODE: &str = "ram-repl";

/// The logical node of the process called `name` (`node-ID` or `node-ID-mirror`).
pub fn node_of_process(name: &str) -> Option<NodeId> {
    let id = name.strip_prefix("node-")?;
    id.strip_suffix("-mirror").unwrap_or(id).parse().ok()
}

/// Where a `ram-repl` cluster in `dir` keeps its nodes' data directories: on the RAM file
/// system, named after `dir` (so that one cluster always finds its own).
pub fn ram_dir(dir: &Path) -> PathBuf {
    // FNV-1a: stable across builds, unlike std's hasher.
    let hash = (dir.as_os_str().as_encoded_bytes().iter())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let name = dir
        .file_name()
        .map_or("cluster".into(), |n| n.to_string_lossy());
    PathBuf::from("/dev/shm").join(format!("tutti-{name}-{hash:016x}"))
}

/// One manager of a group of several (`tutti up --managers 3`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ManagerEntry {
    /// Its Raft id: its place in the group, from 1.
    pub id: u64,
    pub addr: String,
    pub data: PathBuf,
}

/// `DATA/cluster.json`: every address of a local cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ClusterFile {
    /// What clients take as `--cluster`: the manager's address, or the addresses of every
    /// manager of the group separated by commas.
    pub manager: String,
    /// A lone manager's data directory (the first one's, in a group).
    pub manager_data: PathBuf,
    /// The managers of a group, each with its id, address and data directory; empty for a
    /// lone manager (files from before groups have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managers: Vec<ManagerEntry>,
    pub mode: String,
    pub size_bytes: u64,
    pub nodes: Vec<NodeEntry>,
    /// The logs' sequencer (`tutti sequencer`); files from before it have none, and get one
    /// when opened.
    #[serde(default)]
    pub sequencer: String,
    /// What every process proves (`tutti up --token-file`, `--tls-*`), if anything; clients
    /// given `--cluster DIR` read it from here.
    #[serde(flatten)]
    pub credentials: CredentialFiles,
    /// Every process as `tutti up` last saw it: its role (from the manager's placements,
    /// in `log-repl` mode), logical node, address and pid. Rewritten as they change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessEntry>,
}

/// One process of a local cluster (`cluster.json` `processes`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProcessEntry {
    /// `manager-N` (or `manager`), `sequencer`, `node-N`, `node-N-mirror`.
    pub name: String,
    /// `manager`, `sequencer`; for a memory node's process `primary` (it serves the
    /// node), `mirror`, `joining` (neither yet: a replaced copy filling itself to become
    /// the node's mirror) or `unknown` (the managers did not answer).
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeId>,
    pub addr: String,
    /// None while it is down.
    pub pid: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("cluster not ready after {0:?}: {1}")]
    NotReady(Duration, String),
    /// A child exited while the cluster started: which, how, and the end of its log.
    #[error("{0}")]
    Exited(String),
}

/// Removes everything in `dir`, keeping `dir`.
pub fn empty_dir(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Where local clusters listen unless told otherwise.
pub const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// `host` with a port free on it, as an address.
fn new_addr(host: IpAddr) -> Result<String, LocalError> {
    Ok(SocketAddr::new(host, free_port_on(host)?).to_string())
}

impl ClusterFile {
    /// The address the cluster's processes listen on (the manager's host).
    pub fn host(&self) -> IpAddr {
        let first = self.manager.split(',').next().unwrap_or_default();
        first.parse::<SocketAddr>().map_or(LOOPBACK, |a| a.ip())
    }

    /// Every manager: the group's, or the lone one as a group of one.
    pub fn manager_entries(&self) -> Vec<ManagerEntry> {
        if !self.managers.is_empty() {
            return self.managers.clone();
        }
        vec![ManagerEntry {
            id: 1,
            addr: self.manager.clone(),
            data: self.manager_data.clone(),
        }]
    }

    /// The supervised process name of manager `id`: `manager` when it is alone.
    pub fn manager_process(&self, id: u64) -> String {
        if self.managers.is_empty() {
            "manager".into()
        } else {
            format!("manager-{id}")
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LocalError {
    let what = what.into();
    move |source| LocalError::Io { what, source }
}

/// What to create when the data directory holds no cluster yet.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The address every process listens on (each on its own port): loopback, or one that
    /// other machines dial.
    pub host: IpAddr,
    pub nodes: usize,
    /// Managers in the Raft group holding the manager's state: 1, 3 or 5.
    pub managers: usize,
    pub mode: String,
    pub size_bytes: u64,
    /// Extra flags for every memory node (e.g. a shorter uncertain timeout in tests).
    pub node_flags: Vec<String>,
    pub manager_flags: Vec<String>,
}

pub struct LocalCluster {
    pub dir: PathBuf,
    pub file: ClusterFile,
    /// What `file.credentials` names.
    credentials: Credentials,
    exe: PathBuf,
    layout: Layout,
    /// The manager runs as `manager`, memory node N as `node-N`.
    processes: Supervisor,
    /// Extra flags for one process, by name (`manager`, `node-1`, …).
    pub process_flags: BTreeMap<String, Vec<String>>,
}

impl Drop for LocalCluster {
    /// Its processes stop with it (the supervisor's own drop); a `ram-repl` cluster's RAM
    /// directories are removed once they have.
    fn drop(&mut self) {
        if self.file.mode == RAM_REPLICATED_MODE {
            self.stop_all();
        }
    }
}

/// A port free now and below the kernel's ephemeral range. A port from that range (what
/// binding port 0 gives) can be taken by any outgoing connection before the process meant
/// for it binds it; a CI run lost a manager that way ("Address already in use"). Never the
/// same port twice in one process: clusters started at once (tests run in parallel) would
/// otherwise both find a port free before either child binds it.
pub fn free_port() -> Result<u16, LocalError> {
    free_port_on(LOOPBACK)
}

/// `free_port`, free on `host`.
pub fn free_port_on(host: IpAddr) -> Result<u16, LocalError> {
    use rand::Rng;
    static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let range = 10_000..ephemeral_low.max(20_000);
    let mut rng = rand::thread_rng();
    let mut handed_out = HANDED_OUT.lock().expect("ports poisoned");
    for _ in 0..1000 {
        let port = rng.gen_range(range.clone());
        if !handed_out.contains(&port) && std::net::TcpListener::bind((host, port)).is_ok() {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(LocalError::Config(format!(
        "no free port in {range:?} after 1000 tries"
    )))
}

impl LocalCluster {
    /// Opens the cluster described by `dir/cluster.json`, or creates one with `layout`.
    /// An existing cluster keeps its shape; asking for another one is an error.
    pub fn open(
        exe: &Path,
        dir: &Path,
        layout: Layout,
        strict: bool,
    ) -> Result<LocalCluster, LocalError> {
        std::fs::create_dir_all(dir.join("logs"))
            .map_err(io(format!("create {}", dir.display())))?;
        let dir = dir
            .canonicalize()
            .map_err(io("resolve the data directory"))?;
        let path = dir.join("cluster.json");
        let file = match std::fs::read(&path) {
            Ok(bytes) => {
                let mut file: ClusterFile = serde_json::from_slice(&bytes)
                    .map_err(|e| LocalError::Config(format!("{}: {e}", path.display())))?;
                if file.sequencer.is_empty() {
                    file.sequencer = new_addr(file.host())?;
                    write_file(&dir, &file)?;
                }
                if strict && file.host() != layout.host {
                    return Err(LocalError::Config(format!(
                        "{} holds a cluster on {}; use another --data to make one on {}",
                        dir.display(),
                        file.host(),
                        layout.host
                    )));
                }
                let managers = file.manager_entries().len();
                if strict && managers != layout.managers {
                    return Err(LocalError::Config(format!(
                        "{} holds a cluster with {managers} manager(s); use another --data to make one with {}",
                        dir.display(),
                        layout.managers
                    )));
                }
                // More nodes than asked for is the same cluster grown by `tutti node add`.
                if strict && (file.nodes.len() < layout.nodes || file.mode != layout.mode) {
                    return Err(LocalError::Config(format!(
                        "{} holds a {}-node {} cluster; use another --data to make a {}-node {} one",
                        dir.display(),
                        file.nodes.len(),
                        file.mode,
                        layout.nodes,
                        layout.mode
                    )));
                }
                if file.mode == RAM_REPLICATED_MODE {
                    return Err(LocalError::Config(format!(
                        "{} held a ram-repl cluster, whose copies lived in RAM and were lost \
                         when its processes stopped; remove it, or use another --data, to make \
                         a new one",
                        dir.display()
                    )));
                }
                file
            }
            Err(_) => {
                let ids: Vec<NodeId> = (1..=layout.nodes as NodeId).collect();
                let file = create_file(&dir, layout.host, &layout.mode, layout.size_bytes, &ids)?;
                with_managers(&dir, file, layout.managers)?
            }
        };
        let credentials = file.credentials.load().map_err(LocalError::Config)?;
        Ok(LocalCluster {
            dir,
            file,
            credentials,
            exe: exe.to_path_buf(),
            layout,
            processes: Supervisor::new(),
            process_flags: BTreeMap::new(),
        })
    }

    /// Makes every process of the cluster prove `files` from its next start (they replace
    /// what it proved), and records them in cluster.json for clients.
    pub fn set_credentials(&mut self, files: &CredentialFiles) -> Result<(), LocalError> {
        let files = files.absolute().map_err(LocalError::Config)?;
        self.credentials = files.load().map_err(LocalError::Config)?;
        self.file.credentials = files;
        write_file(&self.dir, &self.file)
    }

    /// How a client of this cluster dials it: with its credentials.
    pub fn dialer(&self) -> Dialer {
        Dialer::default().with_credentials(self.credentials.clone())
    }

    /// Starts `name` (needs a tokio runtime context, as every supervised child does).
    fn spawn(&mut self, name: &str, mut args: Vec<String>) -> Result<(), LocalError> {
        args.extend(self.process_flags.get(name).into_iter().flatten().cloned());
        args.extend(self.file.credentials.flags());
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let mut cmd = Command::new(&self.exe);
        cmd.args(&args);
        self.processes
            .start(name, cmd, &log)
            .map_err(io(format!("start {name}")))?;
        Ok(())
    }

    /// Starts every manager.
    pub fn start_manager(&mut self) -> Result<(), LocalError> {
        for m in self.file.manager_entries() {
            self.start_manager_id(m.id)?;
        }
        Ok(())
    }

    /// Starts manager `id` of the group (1 for a lone manager).
    pub fn start_manager_id(&mut self, id: u64) -> Result<(), LocalError> {
        let entries = self.file.manager_entries();
        let m = (entries.iter())
            .find(|m| m.id == id)
            .ok_or_else(|| LocalError::Config(format!("no manager {id}")))?;
        let mut args = vec![
            "manager".into(),
            "--listen".into(),
            m.addr.clone(),
            "--data".into(),
            m.data.display().to_string(),
        ];
        if entries.len() > 1 {
            args.extend(["--id".into(), id.to_string()]);
            args.extend(["--peers".into(), self.file.manager.clone()]);
        }
        args.extend(self.layout.manager_flags.iter().cloned());
        let name = self.file.manager_process(id);
        self.spawn(&name, args)
    }

    fn node_entry(&self, id: NodeId) -> Result<&NodeEntry, LocalError> {
        (self.file.nodes.iter())
            .find(|n| n.id == id)
            .ok_or_else(|| LocalError::Config(format!("no node {id}")))
    }

    /// Starts node `id`: its primary process, and its mirror's if it has one.
    pub fn start_node(&mut self, id: NodeId) -> Result<(), LocalError> {
        if self.node_entry(id)?.mirror.is_some() {
            self.start_mirror(id)?;
        }
        self.start_primary(id)
    }

    /// Starts `log-repl` node `id`'s mirror process, `node-ID-mirror`.
    pub fn start_mirror(&mut self, id: NodeId) -> Result<(), LocalError> {
        let n = self.node_entry(id)?;
        let m = (n.mirror.clone())
            .ok_or_else(|| LocalError::Config(format!("node {id} has no mirror")))?;
        self.spawn_mirror(&format!("node-{id}-mirror"), id, &m.addr, &m.data)
    }

    /// Starts `name` again as a process of the mirror role, on its own address and data
    /// directory: `node-ID` once replaced by its mirror. Such a process serves as what the
    /// manager's placement names it, primary or mirror, and otherwise joins the node's
    /// primary as its new mirror.
    pub fn restart_as_mirror(&mut self, name: &str) -> Result<(), LocalError> {
        let (id, addr, data) = self.copy_process(name)?;
        self.spawn_mirror(name, id, &addr, &data)
    }

    /// Empties the data directory of `name`, a replicated node's process that is not
    /// running: its disk is lost, and started again it holds no copy (docs/replication.md,
    /// "A lost disk").
    pub fn lose_disk(&self, name: &str) -> Result<(), LocalError> {
        let (_, _, data) = self.copy_process(name)?;
        empty_dir(&data).map_err(|source| LocalError::Io {
            what: format!("empty {}", data.display()),
            source,
        })
    }

    /// The node, address and data directory of `name`, one of a replicated node's two
    /// processes (`node-ID` or `node-ID-mirror`).
    fn copy_process(&self, name: &str) -> Result<(NodeId, String, PathBuf), LocalError> {
        let id = node_of_process(name)
            .ok_or_else(|| LocalError::Config(format!("{name} is not a memory node")))?;
        let n = self.node_entry(id)?;
        match &n.mirror {
            Some(m) if name.ends_with("-mirror") => Ok((id, m.addr.clone(), m.data.clone())),
            Some(_) => Ok((id, n.addr.clone(), n.data.clone())),
            None => Err(LocalError::Config(format!("node {id} has no mirror"))),
        }
    }

    fn spawn_mirror(
        &mut self,
        name: &str,
        id: NodeId,
        addr: &str,
        data: &std::path::Path,
    ) -> Result<(), LocalError> {
        let mut args = vec![
            "memnode".into(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            addr.to_string(),
            "--manager".into(),
            self.file.manager.clone(),
            "--data".into(),
            data.display().to_string(),
            "--mode".into(),
            self.file.mode.clone(),
            "--role".into(),
            "mirror".into(),
            "--size".into(),
            self.file.size_bytes.to_string(),
        ];
        args.extend(self.layout.node_flags.iter().cloned());
        self.spawn(name, args)
    }

    /// Starts node `id`'s primary process, `node-ID`.
    pub fn start_primary(&mut self, id: NodeId) -> Result<(), LocalError> {
        let n = self.node_entry(id)?;
        let mirror = n.mirror.as_ref().map(|m| m.addr.clone());
        let mut args = vec![
            "memnode".into(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            n.addr.clone(),
            "--manager".into(),
            self.file.manager.clone(),
            "--data".into(),
            n.data.display().to_string(),
            "--mode".into(),
            self.file.mode.clone(),
            "--size".into(),
            self.file.size_bytes.to_string(),
            "--metrics".into(),
            n.metrics.clone(),
        ];
        if let Some(mirror) = mirror {
            args.extend(["--mirror".into(), mirror]);
        }
        args.extend(self.layout.node_flags.iter().cloned());
        self.spawn(&format!("node-{id}"), args)
    }

    pub fn start_sequencer(&mut self) -> Result<(), LocalError> {
        let args = vec![
            "sequencer".into(),
            "--listen".into(),
            self.file.sequencer.clone(),
            "--cluster".into(),
            self.file.manager.clone(),
        ];
        self.spawn("sequencer", args)
    }

    /// Starts `name` again after it exited: `manager`, `sequencer`, `node-N` or
    /// `node-N-mirror`.
    pub fn restart(&mut self, name: &str) -> Result<(), LocalError> {
        let mirror = name
            .strip_prefix("node-")
            .and_then(|n| n.strip_suffix("-mirror"));
        if let Some(Ok(id)) = mirror.map(str::parse) {
            return self.start_mirror(id);
        }
        match name.strip_prefix("node-").map(str::parse) {
            // A ram-repl copy comes back empty: it can only join.
            Some(Ok(_)) if self.file.mode == RAM_REPLICATED_MODE => self.restart_as_mirror(name),
            Some(Ok(id)) => self.start_primary(id),
            Some(Err(_)) => Err(LocalError::Config(format!("no process {name}"))),
            None if name == "manager" => self.start_manager_id(1),
            None => match name.strip_prefix("manager-").map(str::parse) {
                Some(Ok(id)) => self.start_manager_id(id),
                _ if name == "sequencer" => self.start_sequencer(),
                _ => Err(LocalError::Config(format!("no process {name}"))),
            },
        }
    }

    pub fn start_all(&mut self) -> Result<(), LocalError> {
        self.start_manager()?;
        for id in self.node_ids() {
            self.start_node(id)?;
        }
        self.start_sequencer()
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        self.file.nodes.iter().map(|n| n.id).collect()
    }

    /// Adds memory node max+1 to the cluster (in cluster.json, then started): it registers
    /// with the manager, and clients find it in the directory. Returns its id.
    pub fn add_node(&mut self) -> Result<NodeId, LocalError> {
        let node = record_node(&self.dir)?;
        self.adopt_new_nodes()?;
        Ok(node.id)
    }

    /// Starts the nodes that cluster.json lists and this cluster does not run yet (added
    /// by `tutti node add` from another process); returns them.
    pub fn adopt_new_nodes(&mut self) -> Result<Vec<NodeEntry>, LocalError> {
        let file = read_file(&self.dir)?;
        let new: Vec<NodeEntry> = (file.nodes.into_iter())
            .filter(|n| !self.file.nodes.iter().any(|m| m.id == n.id))
            .collect();
        for n in &new {
            self.file.nodes.push(n.clone());
            self.start_node(n.id)?;
        }
        Ok(new)
    }

    /// `kill -9` a memory node (its first primary's process).
    pub fn kill_node(&mut self, id: NodeId) {
        self.processes.kill(&format!("node-{id}"));
    }

    /// `kill -9` the process called `name` (`node-3-mirror`, say).
    pub fn kill(&mut self, name: &str) {
        self.processes.kill(name);
    }

    /// The process of node `id` that listens on `addr` (the manager's directory names the
    /// one serving): `node-ID` or `node-ID-mirror`.
    pub fn process_at(&self, id: NodeId, addr: &str) -> Option<String> {
        let n = self.node_entry(id).ok()?;
        if n.addr == addr {
            return Some(format!("node-{id}"));
        }
        (n.mirror.as_ref()?.addr == addr).then(|| format!("node-{id}-mirror"))
    }

    /// `kill -9` every manager.
    pub fn kill_manager(&mut self) {
        for m in self.file.manager_entries() {
            self.kill_manager_id(m.id);
        }
    }

    /// `kill -9` manager `id` of the group.
    pub fn kill_manager_id(&mut self, id: u64) {
        let name = self.file.manager_process(id);
        self.processes.kill(&name);
    }

    /// `kill -9` the sequencer.
    pub fn kill_sequencer(&mut self) {
        self.processes.kill("sequencer");
    }

    /// Every process with its role (`placements`: each `log-repl` node's, where the
    /// managers answered) and pid.
    pub fn process_entries(
        &self,
        placements: &BTreeMap<NodeId, tutti_wire::Placement>,
    ) -> Vec<ProcessEntry> {
        let entry = |name: String, role: &str, node, addr: &str| ProcessEntry {
            pid: self.processes.pid(&name),
            name,
            role: role.to_string(),
            node,
            addr: addr.to_string(),
        };
        let mut entries: Vec<ProcessEntry> = (self.file.manager_entries().iter())
            .map(|m| entry(self.file.manager_process(m.id), "manager", None, &m.addr))
            .collect();
        entries.push(entry(
            "sequencer".into(),
            "sequencer",
            None,
            &self.file.sequencer,
        ));
        for n in &self.file.nodes {
            let role = |addr: &str| match placements.get(&n.id) {
                _ if n.mirror.is_none() => "primary",
                Some(p) if p.primary == addr => "primary",
                Some(p) if p.mirror.as_deref() == Some(addr) => "mirror",
                Some(_) => "joining",
                None => "unknown",
            };
            entries.push(entry(
                format!("node-{}", n.id),
                role(&n.addr),
                Some(n.id),
                &n.addr,
            ));
            if let Some(m) = &n.mirror {
                let name = format!("node-{}-mirror", n.id);
                entries.push(entry(name, role(&m.addr), Some(n.id), &m.addr));
            }
        }
        entries
    }

    /// Records `entries` in cluster.json if they changed (under its lock, keeping the
    /// nodes `tutti node add` recorded meanwhile).
    pub fn record_processes(&mut self, entries: Vec<ProcessEntry>) -> Result<(), LocalError> {
        if entries == self.file.processes {
            return Ok(());
        }
        let _lock = lock_file(&self.dir)?;
        let mut file = read_file(&self.dir)?;
        file.processes = entries.clone();
        write_file(&self.dir, &file)?;
        self.file.processes = entries;
        Ok(())
    }

    /// The children that exited by themselves since the last call: (name, exit status).
    pub fn reap(&mut self) -> Vec<(String, ExitStatus)> {
        self.processes.reap()
    }

    /// Waits until a child exits by itself: (name, exit status).
    pub async fn exited(&mut self) -> (String, ExitStatus) {
        self.processes.exited().await
    }

    /// SIGTERM every child, wait up to 10 s, then SIGKILL what is left.
    pub fn stop_all(&mut self) {
        self.processes
            .stop_all(libc::SIGTERM, Duration::from_secs(10));
        self.free_ram();
    }

    /// `ram-repl`: removes the RAM directories, whose copies died with the processes
    /// (a process killed with SIGKILL leaves its copy behind).
    fn free_ram(&self) {
        if self.file.mode == RAM_REPLICATED_MODE {
            let _ = std::fs::remove_dir_all(ram_dir(&self.dir));
        }
    }

    /// Waits until the manager answers and every memory node serves (recovery done).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Cluster, LocalError> {
        let until = Instant::now() + timeout;
        let mut last = String::from("nothing tried");
        while Instant::now() < until {
            let opts = ClientOptions {
                deadline: Duration::from_millis(500),
                dialer: self.dialer(),
                ..ClientOptions::default()
            };
            match Cluster::connect(&self.file.manager, opts).await {
                Ok(cluster) => {
                    let stats = cluster.stats().await;
                    let all = stats.len() == self.file.nodes.len()
                        && stats
                            .iter()
                            .all(|(_, s)| s.as_ref().is_ok_and(|s| s.serving));
                    if all {
                        let opts = ClientOptions {
                            dialer: self.dialer(),
                            ..ClientOptions::default()
                        };
                        return Cluster::connect(&self.file.manager, opts)
                            .await
                            .map_err(|e| LocalError::NotReady(timeout, e.to_string()));
                    }
                    last = format!(
                        "{} of {} nodes serving",
                        stats
                            .iter()
                            .filter(|(_, s)| s.as_ref().is_ok_and(|s| s.serving))
                            .count(),
                        self.file.nodes.len()
                    );
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(LocalError::NotReady(timeout, last))
    }

    /// `wait_ready`, and in a replicated mode also until every node has a mirror named in
    /// its placement (a `ram-repl` node's first mirror joins only after the start), for
    /// `timeout` at most. For a start: a child that exits meanwhile fails it at once, with
    /// the end of its log (a node refusing its data directory says why there); at the
    /// timeout the error ends with every process's log tail.
    pub async fn wait_up(&mut self, timeout: Duration) -> Result<Cluster, LocalError> {
        let until = Instant::now() + timeout;
        loop {
            let tried = self.up_within(Duration::from_secs(1)).await;
            if let Some((name, status)) = self.reap().into_iter().next() {
                let tail = self.log_tail(&name);
                let why = format!("{name} exited ({status}) while the cluster started:\n{tail}");
                return Err(LocalError::Exited(why));
            }
            match tried {
                Ok(cluster) => return Ok(cluster),
                Err(e) if Instant::now() >= until => {
                    let managers = self.file.manager_entries();
                    let tails: Vec<String> = (managers.iter())
                        .map(|m| self.file.manager_process(m.id))
                        .chain(self.node_ids().iter().map(|id| format!("node-{id}")))
                        .map(|n| format!("--- {n}:\n{}", self.log_tail(&n)))
                        .collect();
                    let last = match e {
                        LocalError::NotReady(_, last) => last,
                        other => other.to_string(),
                    };
                    return Err(LocalError::NotReady(
                        timeout,
                        format!("{last}\n{}", tails.join("\n")),
                    ));
                }
                Err(_) => {}
            }
        }
    }

    /// One try of `wait_up`, for `timeout`.
    async fn up_within(&self, timeout: Duration) -> Result<Cluster, LocalError> {
        let cluster = self.wait_ready(timeout).await?;
        if replicated(&self.file.mode) {
            self.wait_mirrored(&cluster, timeout).await?;
        }
        Ok(cluster)
    }

    /// Waits until the managers name a mirror for every node (replicated modes).
    pub async fn wait_mirrored(
        &self,
        cluster: &Cluster,
        timeout: Duration,
    ) -> Result<(), LocalError> {
        let until = Instant::now() + timeout;
        for id in self.node_ids() {
            let ask = tutti_wire::Request::Placement { node: id };
            loop {
                match cluster.ask_manager(&ask).await {
                    Ok(tutti_wire::Response::Placement(Some(p))) if p.mirror.is_some() => break,
                    other if Instant::now() >= until => {
                        return Err(LocalError::NotReady(
                            timeout,
                            format!("node {id} has no mirror: {other:?}"),
                        ))
                    }
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        }
        Ok(())
    }

    /// The last lines of a child's log, for error messages.
    pub fn log_tail(&self, name: &str) -> String {
        let path = self.dir.join("logs").join(format!("{name}.log"));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }
}

/// Records a new memory node, id max+1 with free ports, in `dir/cluster.json` (under a lock,
/// so that two adds never take one id); the cluster's `tutti up` starts it.
pub fn record_node(dir: &Path) -> Result<NodeEntry, LocalError> {
    let _lock = lock_file(dir)?;
    let mut file = read_file(dir)?;
    let id = file.nodes.iter().map(|n| n.id).max().unwrap_or(0) + 1;
    let node = node_entry(dir, file.host(), &file.mode, id)?;
    file.nodes.push(node.clone());
    write_file(dir, &file)?;
    Ok(node)
}

/// Holds `dir/cluster.json`'s lock (for writers that read it first) until dropped.
fn lock_file(dir: &Path) -> Result<File, LocalError> {
    use std::os::fd::AsRawFd;
    let lock = File::create(dir.join("cluster.json.lock")).map_err(io("lock cluster.json"))?;
    // SAFETY: flock(2) on a descriptor we own; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io("lock cluster.json")(std::io::Error::last_os_error()));
    }
    Ok(lock)
}

/// Node `id` of a cluster in `dir` on `host`: free ports, data directory `dir/node-ID`
/// (and in `log-repl` mode a mirror with `dir/node-ID-mirror`; in `ram-repl` mode both
/// under `ram_dir(dir)`).
fn node_entry(dir: &Path, host: IpAddr, mode: &str, id: NodeId) -> Result<NodeEntry, LocalError> {
    let data = match mode {
        RAM_REPLICATED_MODE => ram_dir(dir),
        _ => dir.to_path_buf(),
    };
    let mirror = match replicated(mode) {
        true => Some(MirrorEntry {
            addr: new_addr(host)?,
            data: data.join(format!("node-{id}-mirror")),
        }),
        false => None,
    };
    Ok(NodeEntry {
        id,
        addr: new_addr(host)?,
        metrics: new_addr(host)?,
        data: data.join(format!("node-{id}")),
        mirror,
    })
}

/// Writes `dir/cluster.json` for a new cluster on `host` with memory nodes `ids`, each
/// with its data directory `dir/node-ID` and free ports; returns it.
pub fn create_file(
    dir: &Path,
    host: IpAddr,
    mode: &str,
    size_bytes: u64,
    ids: &[NodeId],
) -> Result<ClusterFile, LocalError> {
    let mut nodes = Vec::new();
    for &id in ids {
        nodes.push(node_entry(dir, host, mode, id)?);
    }
    let file = ClusterFile {
        manager: new_addr(host)?,
        manager_data: dir.join("manager"),
        managers: Vec::new(),
        mode: mode.to_string(),
        size_bytes,
        nodes,
        sequencer: new_addr(host)?,
        credentials: CredentialFiles::default(),
        processes: Vec::new(),
    };
    write_file(dir, &file)?;
    Ok(file)
}

/// `file` with a group of `managers` managers (`manager-ID` data directories, free ports)
/// instead of its lone one, if more than one; written to `dir/cluster.json`.
fn with_managers(
    dir: &Path,
    mut file: ClusterFile,
    managers: usize,
) -> Result<ClusterFile, LocalError> {
    if ![1, 3, 5].contains(&managers) {
        return Err(LocalError::Config(format!(
            "{managers} managers: a group has 1, 3 or 5 (a majority must survive)"
        )));
    }
    if managers > 1 {
        for id in 1..=managers as u64 {
            file.managers.push(ManagerEntry {
                id,
                addr: new_addr(file.host())?,
                data: dir.join(format!("manager-{id}")),
            });
        }
        let addrs: Vec<&str> = file.managers.iter().map(|m| m.addr.as_str()).collect();
        file.manager = addrs.join(",");
        file.manager_data = file.managers[0].data.clone();
        write_file(dir, &file)?;
    }
    Ok(file)
}

pub fn read_file(dir: &Path) -> Result<ClusterFile, LocalError> {
    let path = dir.join("cluster.json");
    let bytes = std::fs::read(&path).map_err(io(format!("read {}", path.display())))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| LocalError::Config(format!("{}: {e}", path.display())))
}

/// Writes `dir/cluster.json` through a temporary file, so that a reader never sees half.
fn write_file(dir: &Path, file: &ClusterFile) -> Result<(), LocalError> {
    let tmp = dir.join("cluster.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(file).expect("serialisable"))
        .map_err(io("write cluster.json"))?;
    std::fs::rename(&tmp, dir.join("cluster.json")).map_err(io("write cluster.json"))
}

/// How a client reaches `cluster` (`ADDR`, or a cluster.json path or its directory): the
/// manager's address, and the credentials cluster.json records.
pub fn access(cluster: &str) -> Result<(String, CredentialFiles), LocalError> {
    let path = Path::new(cluster);
    let host_port = cluster
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if host_port && !path.exists() {
        return Ok((cluster.to_string(), CredentialFiles::default()));
    }
    let json = if path.is_dir() || !cluster.ends_with(".json") {
        path.join("cluster.json")
    } else {
        path.to_path_buf()
    };
    if !json.is_file() {
        return Err(LocalError::Config(format!(
            "--cluster {cluster}: no {} (is `tutti up` running there?) and not an address like 127.0.0.1:7700",
            json.display()
        )));
    }
    let file: ClusterFile =
        serde_json::from_reader(File::open(&json).map_err(io(format!("open {}", json.display())))?)
            .map_err(|e| LocalError::Config(format!("{}: {e}", json.display())))?;
    Ok((file.manager, file.credentials))
}
