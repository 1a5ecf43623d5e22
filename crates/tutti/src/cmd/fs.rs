//! `tutti fs`: make, grow, mount and check tutti-fs volumes (docs/fs.md). mkfs, grow and
//! fsck print one JSON object; mount stays in the foreground until unmounted or interrupted,
//! or with --background returns once the mount is ready.

use super::args::{parse_size, shutdown_signal, ClusterArg};
use super::out::outln;
use clap::{Args, Subcommand};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_fs::fsck::Problem;
use tutti_fs::layout::{BLOCK_BYTES_DEFAULT, BYTES_PER_INODE_DEFAULT};
use tutti_fs::{FileSystem, Mount, MountOptions, Shape};
use tutti_wire::Dialer;

/// How long `mount --background` waits for the mount to appear.
const BACKGROUND_READY_S: u64 = 30;

#[derive(Args)]
pub(crate) struct FsArgs {
    #[command(subcommand)]
    command: FsCommand,
    #[command(flatten)]
    cluster: ClusterArg,
    /// The volume (one cluster may hold several).
    #[arg(long, global = true, default_value = "fs")]
    name: String,
}

#[derive(Subcommand)]
enum FsCommand {
    /// Create a volume on every memory node of a running cluster: {"volume": NAME, ...}.
    ///
    /// Refuses a volume that already holds a file system unless --force (which loses every
    /// file; unmount it everywhere first).
    Mkfs {
        /// Space the volume takes on each memory node (K, M, G suffixes).
        #[arg(long, default_value = "512M", value_parser = parse_size)]
        bytes_per_node: u64,
        /// Data block size, a power of two from 4K to 1M.
        #[arg(long, default_value_t = BLOCK_BYTES_DEFAULT as u64, value_parser = parse_size)]
        block_size: u64,
        /// One inode per this many bytes of space.
        #[arg(long, default_value_t = BYTES_PER_INODE_DEFAULT as u64, value_parser = parse_size)]
        bytes_per_inode: u64,
        #[arg(long)]
        force: bool,
    },
    /// Extend a volume onto memory nodes added to the cluster: {"volume": NAME, "added":
    /// [...], ...}. Running mounts learn the new nodes within 5 s, without a remount.
    ///
    /// The new nodes get the volume's share of space (--bytes-per-node at mkfs) each.
    /// Safe to rerun: nodes the volume spans already are left alone.
    Grow {
        /// A memory node to add (repeat the flag); by default every live node of the
        /// cluster that the volume does not span.
        #[arg(long = "node")]
        nodes: Vec<tutti_wire::NodeId>,
    },
    /// Mount a volume with FUSE, in the foreground until unmounted (fusermount -u, umount)
    /// or interrupted (Ctrl-C, SIGTERM), which unmounts it.
    Mount {
        mountpoint: PathBuf,
        /// Let the kernel trust attributes and names this long, whatever other mounts do.
        /// 0 (the default) keeps every mount coherent: other mounts' changes show at once
        /// (docs/fs.md, "Coherent caching"); more may show one up to this late.
        #[arg(long, default_value_t = 0)]
        cache_ms: u64,
        /// Threads serving the kernel's requests.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Return once the mount is ready, leaving it served by a process of its own (its
        /// log goes to --log). Unmount with `umount MOUNTPOINT`.
        #[arg(long)]
        background: bool,
        /// Where a --background mount logs (default: MOUNTPOINT's parent/tutti-fs-NAME.log).
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Check every invariant of a quiet volume: {"clean": BOOL, "problems": [...], ...}.
    /// Exit status 1 if problems remain.
    ///
    /// --repair frees what a crashed mount can leave: orphan inodes (unlinked while open)
    /// and blocks nothing references. Run it with no mount writing.
    Fsck {
        #[arg(long)]
        repair: bool,
    },
    /// Space and inodes used: {"blocks": N, "blocks_free": N, ...}.
    Df,
    /// The processes using the volume now (mounts, fsck --repair), one JSON object each:
    /// {"slot", "token", "callback", "pid", "joined_unix_s", "lease_ms", "renewals"}.
    Members,
    /// Exercise one file on any mounted file system as xfstests' fsx does: random writes,
    /// reads, truncates, fallocates, fsyncs and reopens, every read checked against a model.
    /// Prints {"ops": N, ...}; exit status 1 at the first wrong byte or size.
    Fsx {
        /// The file to create (or overwrite) and exercise.
        file: PathBuf,
        #[arg(long, default_value_t = 10_000)]
        ops: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Largest size the file reaches.
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        size_max: u64,
        /// Leave fallocate out (for file systems without it).
        #[arg(long)]
        no_fallocate: bool,
    },
}

pub(crate) async fn run(a: FsArgs, dialer: &Dialer) -> Result<(), String> {
    if let FsCommand::Mount {
        background: true,
        mountpoint,
        log,
        ..
    } = &a.command
    {
        return background(mountpoint, log.as_deref());
    }
    if let FsCommand::Fsx {
        file,
        ops,
        seed,
        size_max,
        no_fallocate,
    } = &a.command
    {
        return fsx(file, *ops, *seed, *size_max, !*no_fallocate);
    }
    let cluster = a.cluster.connect(dialer).await?;
    let deadline = a.cluster.deadline().max(Duration::from_secs(60));
    match a.command {
        FsCommand::Mkfs {
            bytes_per_node,
            block_size,
            bytes_per_inode,
            force,
        } => {
            let shape = Shape {
                nodes: cluster.nodes().iter().map(|n| n.id).collect(),
                bytes_per_node,
                block_bytes: u32::try_from(block_size).map_err(|_| "block size too large")?,
                bytes_per_inode: u32::try_from(bytes_per_inode)
                    .map_err(|_| "bytes per inode too large")?,
            };
            let vol = FileSystem::mkfs(&cluster, &a.name, &shape, force, deadline)
                .await
                .map_err(|e| e.to_string())?;
            outln!("{}", shape_json(&a.name, &vol));
            Ok(())
        }
        FsCommand::Grow { nodes } => {
            let before = FileSystem::open(&cluster, &a.name, deadline)
                .await
                .map_err(|e| e.to_string())?
                .volume();
            let nodes = match nodes.is_empty() {
                true => (cluster.nodes().iter())
                    .filter(|n| n.alive && !before.holds(n.id))
                    .map(|n| n.id)
                    .collect(),
                false => nodes,
            };
            let vol = FileSystem::grow(&cluster, &a.name, &nodes, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let mut out = shape_json(&a.name, &vol);
            out["added"] = (vol.nodes.iter())
                .map(|(n, _)| *n)
                .filter(|n| !before.holds(*n))
                .collect::<Vec<_>>()
                .into();
            outln!("{out}");
            Ok(())
        }
        FsCommand::Mount {
            mountpoint,
            cache_ms,
            threads,
            ..
        } => {
            let fs = FileSystem::open(&cluster, &a.name, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let opts = MountOptions {
                cache_ms,
                threads: threads.max(1),
                ..MountOptions::default()
            };
            let fs = Arc::new(fs);
            fs.spawn_placement();
            mount(fs, &mountpoint, &opts).await
        }
        FsCommand::Fsck { repair } => {
            let fs = FileSystem::open(&cluster, &a.name, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let checked = fsck(&fs, repair).await;
            // A repair's writes made this process a member (docs/fs.md, "Coherent caching").
            fs.leave().await;
            checked
        }
        FsCommand::Fsx { .. } => unreachable!("runs without a cluster"),
        FsCommand::Members => {
            let fs = FileSystem::open(&cluster, &a.name, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let members = fs.members().await.map_err(|e| e.to_string())?;
            for (slot, m) in members.slots.iter().enumerate() {
                let Some(m) = m else { continue };
                let out = json!({
                    "slot": slot,
                    "token": format!("{:016x}", m.token),
                    "callback": m.callback.map(|a| a.to_string()),
                    "pid": m.pid,
                    "joined_unix_s": m.joined_unix_s,
                    "lease_ms": m.lease_ms,
                    "renewals": m.renewals,
                });
                outln!("{out}");
            }
            Ok(())
        }
        FsCommand::Df => {
            let fs = FileSystem::open(&cluster, &a.name, deadline)
                .await
                .map_err(|e| e.to_string())?;
            let u = fs.count_usage().await.map_err(|e| format!("errno {e}"))?;
            let out = json!({
                "volume": a.name,
                "block_bytes": u.block_bytes,
                "blocks": u.blocks,
                "blocks_free": u.blocks_free,
                "inodes": u.inodes,
                "inodes_free": u.inodes_free,
            });
            outln!("{out}");
            Ok(())
        }
    }
}

/// A volume's nodes and size, as mkfs and grow print them.
fn shape_json(name: &str, vol: &tutti_fs::layout::Volume) -> serde_json::Value {
    let g = &vol.geometry;
    let n = vol.nodes.len() as u64;
    json!({
        "volume": name,
        "nodes": vol.nodes.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "block_bytes": g.block_bytes,
        "blocks": g.blocks_per_node * n,
        "inodes": g.inodes_per_node * n,
        "bytes": g.blocks_per_node * n * g.block_bytes as u64,
    })
}

/// A mounted volume: the FUSE session and the member it is of the volume.
pub(crate) struct FsSession {
    fuse: fuser::BackgroundSession,
    fs: Arc<FileSystem>,
}

/// Where this mount takes other members' invalidations: on the interface that reaches the
/// cluster (loopback for a local one), a port the system picks.
async fn callback_listener(fs: &FileSystem) -> Result<tokio::net::TcpListener, String> {
    let manager = fs.cluster().manager();
    let first = manager.split(',').next().unwrap_or_default().to_string();
    let ip = tokio::task::spawn_blocking(move || {
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
        probe.connect(&first).ok()?;
        Some(probe.local_addr().ok()?.ip())
    })
    .await
    .map_err(|e| e.to_string())?
    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    tokio::net::TcpListener::bind((ip, 0))
        .await
        .map_err(|e| format!("cannot listen for other mounts' invalidations on {ip}: {e}"))
}

/// Mounts `fs` at `at` with FUSE, served by threads of this process until the session is
/// unmounted; the mount joins the volume's members first.
pub(crate) async fn start_session(
    fs: Arc<FileSystem>,
    at: &Path,
    opts: &MountOptions,
) -> Result<FsSession, String> {
    let name = fs.name().to_string();
    let listener = callback_listener(&fs).await?;
    let callback = listener.local_addr().map_err(|e| e.to_string())?;
    fs.join(Some(callback)).await.map_err(|e| e.to_string())?;
    fs.serve_invalidations(listener);
    fs.spawn_renewals();
    let mount = Mount::new(fs.clone(), tokio::runtime::Handle::current(), opts);
    let given = mount.given();
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("tutti:{name}")),
        fuser::MountOption::Subtype("tutti".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads);
    let at = at.to_path_buf();
    let told = fs.clone();
    let fuse = tokio::task::spawn_blocking(move || {
        let session = fuser::Session::new(mount, &at, &config)
            .map_err(|e| format!("cannot mount {}: {e}", at.display()))?;
        // Before the first request is served: nothing the kernel is given goes unforgotten.
        told.on_forget(Mount::forgetter(given, session.notifier()));
        (session.spawn()).map_err(|e| format!("cannot serve {}: {e}", at.display()))
    })
    .await
    .map_err(|e| e.to_string())?;
    let fuse = match fuse {
        Ok(fuse) => fuse,
        Err(e) => {
            fs.leave().await;
            return Err(e);
        }
    };
    Ok(FsSession { fuse, fs })
}

/// Unmounts a session (its open files' buffered writes are flushed by their close first)
/// and leaves the volume's members.
pub(crate) async fn stop_session(session: FsSession, at: &Path) -> Result<(), String> {
    let FsSession { fuse, fs } = session;
    let unmounted = tokio::task::spawn_blocking(move || fuse.umount_and_join()).await;
    fs.leave().await;
    (unmounted.map_err(|e| e.to_string())?).map_err(|e| format!("unmount {}: {e}", at.display()))
}

/// `tutti up --fs`: the volume `fs` on the local cluster (made if it is not there, half of
/// each node's space at most 512 MiB), mounted at `at`.
pub(crate) async fn up_session(
    local: &tutti_harness::local::LocalCluster,
    node_bytes: u64,
    at: &Path,
) -> Result<FsSession, String> {
    let opts = tutti_client::ClientOptions {
        deadline: Duration::from_secs(60),
        dialer: local.dialer(),
        ..Default::default()
    };
    let cluster = tutti_client::Cluster::connect(&local.file.manager, opts)
        .await
        .map_err(|e| e.to_string())?;
    let shape = Shape {
        nodes: cluster.nodes().iter().map(|n| n.id).collect(),
        bytes_per_node: (node_bytes / 2).min(512 << 20),
        block_bytes: BLOCK_BYTES_DEFAULT,
        bytes_per_inode: BYTES_PER_INODE_DEFAULT,
    };
    let deadline = Duration::from_secs(60);
    match FileSystem::mkfs(&cluster, "fs", &shape, false, deadline).await {
        Ok(_) | Err(tutti_fs::FsError::Exists { .. }) => {}
        Err(e) => return Err(e.to_string()),
    }
    let fs = Arc::new(
        FileSystem::open(&cluster, "fs", deadline)
            .await
            .map_err(|e| e.to_string())?,
    );
    fs.spawn_placement();
    std::fs::create_dir_all(at).map_err(|e| format!("{}: {e}", at.display()))?;
    start_session(fs, at, &MountOptions::default()).await
}

async fn mount(fs: Arc<FileSystem>, at: &Path, opts: &MountOptions) -> Result<(), String> {
    let name = fs.name().to_string();
    let session = start_session(fs, at, opts).await?;
    eprintln!("tutti fs: volume {name} mounted at {}", at.display());
    let guard = &session.fuse.guard;
    let unmounted = async {
        while !guard.is_finished() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        _ = shutdown_signal() => stop_session(session, at).await?,
        _ = unmounted => {
            let FsSession { fuse, fs } = session;
            let joined = tokio::task::spawn_blocking(move || fuse.join()).await;
            fs.leave().await;
            (joined.map_err(|e| e.to_string())?).map_err(|e| format!("the mount ended: {e}"))?;
        }
    }
    eprintln!("tutti fs: {} unmounted", at.display());
    Ok(())
}

/// Is something mounted at `at` (per /proc/self/mountinfo)?
fn mounted(at: &Path) -> bool {
    let Ok(at) = at.canonicalize() else {
        return false;
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(at.to_string_lossy().as_ref()))
}

/// Starts this mount again as a process of its own and waits until it is mounted.
fn background(at: &Path, log: Option<&Path>) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let parent = at
        .canonicalize()
        .map_err(|e| format!("{}: {e}", at.display()))?;
    let log = log.map(Path::to_path_buf).unwrap_or_else(|| {
        parent
            .parent()
            .unwrap_or(Path::new("/tmp"))
            .join(format!("tutti-fs-{}.log", std::process::id()))
    });
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--background")
        .collect();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the mount process: {e}"))?;
    let until = Instant::now() + Duration::from_secs(BACKGROUND_READY_S);
    while Instant::now() < until {
        if mounted(at) {
            let out = json!({"mounted": parent, "pid": child.id(), "log": log});
            outln!("{out}");
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!(
                "the mount process exited ({status}): {}",
                tail.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    Err(format!(
        "not mounted within {BACKGROUND_READY_S} s; see {}",
        log.display()
    ))
}

async fn fsck(fs: &FileSystem, repair: bool) -> Result<(), String> {
    let started = Instant::now();
    let report = fs.fsck().await.map_err(|e| e.to_string())?;
    let mut repaired = 0;
    let mut after = None;
    if repair && !report.problems.is_empty() {
        repaired = fs
            .repair(&report.problems)
            .await
            .map_err(|e| format!("repair: errno {e}"))?;
        after = Some(fs.fsck().await.map_err(|e| e.to_string())?);
    }
    let last = after.as_ref().unwrap_or(&report);
    let describe = |p: &Problem| match p {
        Problem::LeakedBlock(b) => json!({"leaked_block": format!("{:#x}", b.0)}),
        Problem::Orphan(i) => json!({"orphan_inode": format!("{:#x}", i.0)}),
        Problem::Broken(what) => json!({"broken": what}),
    };
    let out = json!({
        "volume": fs.name(),
        "clean": last.problems.is_empty(),
        "inodes_used": last.inodes_used,
        "blocks_used": last.blocks_used,
        "files": last.files,
        "directories": last.directories,
        "problems": report.problems.iter().map(describe).collect::<Vec<_>>(),
        "repaired": repaired,
        "remaining": last.problems.iter().map(describe).collect::<Vec<_>>(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    outln!("{out}");
    if last.problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{} problems remain", last.problems.len()))
    }
}

fn fsx(file: &Path, ops: u64, seed: u64, size_max: u64, fallocate: bool) -> Result<(), String> {
    let cfg = tutti_fs::fsx::FsxConfig {
        ops,
        seed,
        file_bytes_max: size_max,
        fallocate,
        ..Default::default()
    };
    let started = Instant::now();
    let report = tokio::task::block_in_place(|| {
        tutti_fs::fsx::run(file, &cfg, &mut |n| eprintln!("fsx: {n} operations"))
    })?;
    let out = json!({
        "ops": ops,
        "seed": seed,
        "writes": report.writes,
        "reads": report.reads,
        "truncates": report.truncates,
        "fallocates": report.fallocates,
        "fsyncs": report.fsyncs,
        "reopens": report.reopens,
        "full_checks": report.full_checks,
        "seconds": started.elapsed().as_secs_f64(),
    });
    outln!("{out}");
    Ok(())
}
