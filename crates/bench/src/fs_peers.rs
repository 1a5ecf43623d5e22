//! The file systems `tutti bench fs` measures, each set up here and torn down when dropped:
//! tutti-fs on a scratch `log` cluster (one or two mounts), the local disk, the local disk
//! through a FUSE passthrough (bindfs), GlusterFS with one brick, and JuiceFS with its
//! metadata in Redis (`appendfsync always`). Servers are started here and stopped by PID;
//! missing programs come from Debian's packages, JuiceFS from the Go module proxy.

use crate::peers::{ensure_file, ensure_installed, redis_server, scratch, Daemon};
use crate::suite::ScratchCluster;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The JuiceFS release the bench builds, and the memory nodes' size for tutti's volume.
const JUICEFS_VERSION: &str = "v1.3.1";
const TUTTI_NODES: usize = 4;
const TUTTI_NODE_BYTES: u64 = 1 << 30;
const TUTTI_VOLUME_BYTES_PER_NODE: &str = "768M";
/// GlusterFS's management port (its CLI and mount helper find it there).
const GLUSTERD_PORT: u16 = 24007;

/// A file system under test: where it is mounted, and what to stop when it is dropped, in
/// the order of the fields (mounts before their servers).
pub struct Target {
    pub system: String,
    /// How it was configured, as the results record it.
    pub mode: String,
    pub path: PathBuf,
    /// A second mount of the same file system (tutti's two-mount case).
    pub second: Option<PathBuf>,
    mounts: Vec<FuseMount>,
    kernel_mount: Option<KernelMount>,
    gluster: Option<GlusterVolume>,
    servers: Vec<Daemon>,
    _cluster: Option<ScratchCluster>,
    _scratch: Option<RemoveDir>,
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A FUSE mount served by a daemon of ours, stopped when dropped. A daemon that had to be
/// killed (it did not leave within its grace period) cannot unmount: its mount point, left
/// mounted with nothing serving it, is unmounted here so that no run leaves one behind.
struct FuseMount(Option<Daemon>);

impl Drop for FuseMount {
    fn drop(&mut self) {
        let Some(daemon) = self.0.take() else { return };
        let at = daemon.dir.clone();
        drop(daemon);
        if is_mounted(&at) {
            let _ = Command::new("umount").arg("-l").arg(&at).status();
            let _ = std::fs::remove_dir_all(&at);
        }
    }
}

/// A mount made with mount(8) and no process of ours to stop: unmounted when dropped.
struct KernelMount(PathBuf);

impl Drop for KernelMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A GlusterFS volume: stopped and deleted when dropped (its brick process goes with it).
struct GlusterVolume(String);

impl Drop for GlusterVolume {
    fn drop(&mut self) {
        for args in [["volume", "stop"], ["volume", "delete"]] {
            let _ = Command::new("gluster")
                .arg("--mode=script")
                .args(args)
                .arg(&self.0)
                .stdout(Stdio::null())
                .status();
        }
    }
}

fn is_mounted(at: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let at = at.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&at))
}

/// Waits until `at` is a mount point (the daemon that serves it still running).
async fn mounted(daemon: &mut Daemon, at: &Path) -> Result<(), String> {
    daemon
        .wait(|| async {
            if is_mounted(at) {
                Ok(())
            } else {
                Err(format!("{} is not mounted yet", at.display()))
            }
        })
        .await
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Target {
    fn new(system: &str, mode: &str, path: PathBuf) -> Target {
        Target {
            system: system.into(),
            mode: mode.into(),
            path,
            second: None,
            mounts: vec![],
            kernel_mount: None,
            gluster: None,
            servers: vec![],
            _cluster: None,
            _scratch: None,
        }
    }

    /// A directory on the local disk.
    pub fn local(root: &Path) -> Result<Target, String> {
        let dir = scratch(root, "local")?;
        let mut t = Target::new("local", "ext4", dir.clone());
        t._scratch = Some(RemoveDir(dir));
        Ok(t)
    }

    /// tutti-fs on a scratch 4-node `log` cluster, mounted by `tutti fs mount` with its
    /// defaults (coherent caching); `two` mounts it twice.
    pub async fn tutti(exe: &Path, root: &Path, two: bool) -> Result<Target, String> {
        let dir = root.join("tutti-cluster");
        let cluster =
            ScratchCluster::start_sized(exe, dir, TUTTI_NODES, "log", TUTTI_NODE_BYTES).await?;
        let data = cluster.dir().to_path_buf();
        run(
            Command::new(exe)
                .args([
                    "fs",
                    "mkfs",
                    "--bytes-per-node",
                    TUTTI_VOLUME_BYTES_PER_NODE,
                ])
                .arg("--cluster")
                .arg(&data),
            "tutti fs mkfs",
        )?;
        let mut t = Target::new("tutti", "log", PathBuf::new());
        t._cluster = Some(cluster);
        let count = if two { 2 } else { 1 };
        for k in 0..count {
            let at = scratch(root, &format!("tutti-mount-{k}"))?;
            let mut cmd = Command::new(exe);
            cmd.args(["fs", "mount", "--cluster"]).arg(&data).arg(&at);
            let mut daemon = Daemon::spawn("tutti-fs-mount", at.clone(), 0, cmd)?;
            mounted(&mut daemon, &at).await?;
            t.mounts.push(FuseMount(Some(daemon)));
            match k {
                0 => t.path = at,
                _ => t.second = Some(at),
            }
        }
        Ok(t)
    }

    /// The local disk through bindfs (FUSE, multithreaded), with the kernel's attribute
    /// and entry caches off as tutti's default has them.
    pub async fn bindfs(root: &Path) -> Result<Target, String> {
        let exe = ensure_installed("bindfs", "bindfs")?;
        let src = scratch(root, "bindfs-src")?;
        let at = scratch(root, "bindfs-mount")?;
        let mut cmd = Command::new(exe);
        cmd.args(["-f", "--multithreaded", "-o"])
            .arg("entry_timeout=0,attr_timeout=0,negative_timeout=0")
            .arg(&src)
            .arg(&at);
        let mut daemon = Daemon::spawn("bindfs", at.clone(), 0, cmd)?;
        mounted(&mut daemon, &at).await?;
        let mut t = Target::new("bindfs", "fuse-passthrough", at);
        t.mounts.push(FuseMount(Some(daemon)));
        t._scratch = Some(RemoveDir(src));
        Ok(t)
    }

    /// GlusterFS 10 (Debian): glusterd with its state in scratch, one brick on the local
    /// disk, mounted with its FUSE client, the kernel's attribute and entry caches off.
    pub async fn glusterfs(root: &Path) -> Result<Target, String> {
        let glusterd = ensure_installed("glusterd", "glusterfs-server")?;
        ensure_file(Path::new("/sbin/mount.glusterfs"), "glusterfs-client")?;
        if std::net::TcpListener::bind(("127.0.0.1", GLUSTERD_PORT)).is_err() {
            return Err(format!(
                "port {GLUSTERD_PORT} is taken: is a glusterd running?"
            ));
        }
        let state = scratch(root, "glusterd")?;
        let brick = scratch(root, "gluster-brick")?;
        let at = scratch(root, "gluster-mount")?;
        let vol = state.join("glusterd.vol");
        std::fs::write(
            &vol,
            format!(
                "volume management\n    type mgmt/glusterd\n    option working-directory {}\n    \
                 option transport-type socket\n    option transport.socket.listen-port {GLUSTERD_PORT}\n    \
                 option ping-timeout 0\n    option event-threads 1\n    option max-port 60999\nend-volume\n",
                state.join("lib").display()
            ),
        )
        .map_err(|e| format!("{}: {e}", vol.display()))?;
        let mut cmd = Command::new(glusterd);
        cmd.arg("-N")
            .arg("-f")
            .arg(&vol)
            .arg("-l")
            .arg(state.join("glusterd.log"));
        let mut daemon = Daemon::spawn("glusterd", state.clone(), GLUSTERD_PORT, cmd)?;
        daemon
            .wait(|| async {
                run(
                    Command::new("gluster").args(["--mode=script", "volume", "list"]),
                    "gluster volume list",
                )
                .map(drop)
            })
            .await?;
        // glusterd refuses a brick named by a loopback address, not by this host's name.
        let host = run(&mut Command::new("hostname"), "hostname")?
            .trim()
            .to_string();
        let name = "tuttibench";
        let mut t = Target::new("glusterfs", "1-brick", at.clone());
        t.servers.push(daemon);
        run(
            Command::new("gluster")
                .args(["--mode=script", "volume", "create", name])
                .arg(format!("{host}:{}", brick.display()))
                .arg("force"),
            "gluster volume create",
        )?;
        t.gluster = Some(GlusterVolume(name.into()));
        run(
            Command::new("gluster").args(["--mode=script", "volume", "start", name]),
            "gluster volume start",
        )?;
        run(
            Command::new("mount")
                .args(["-t", "glusterfs", "-o"])
                .arg("attribute-timeout=0,entry-timeout=0,negative-timeout=0")
                .arg(format!("{host}:/{name}"))
                .arg(&at),
            "mount -t glusterfs",
        )?;
        t.kernel_mount = Some(KernelMount(at));
        t._scratch = Some(RemoveDir(brick));
        Ok(t)
    }

    /// JuiceFS with its metadata in Redis (`appendfsync always`) and its data in a directory
    /// of the local disk, mounted with the kernel's attribute and entry caches off (as
    /// tutti's default).
    pub async fn juicefs(root: &Path) -> Result<Target, String> {
        let exe = juicefs_binary(root)?;
        let (redis, _, _) = redis_server(root, "always").await?;
        let meta = format!("redis://127.0.0.1:{}/1", redis.port);
        let bucket = scratch(root, "juicefs-bucket")?;
        let at = scratch(root, "juicefs-mount")?;
        run(
            Command::new(&exe)
                .args(["format", "--no-update", "--storage", "file", "--bucket"])
                .arg(format!("{}/", bucket.display()))
                .arg(&meta)
                .arg("tuttibench"),
            "juicefs format",
        )?;
        let mut cmd = Command::new(&exe);
        cmd.args([
            "mount",
            "--no-usage-report",
            "--attr-cache",
            "0",
            "--entry-cache",
            "0",
            "--dir-entry-cache",
            "0",
        ])
        .arg(&meta)
        .arg(&at);
        let mut daemon = Daemon::spawn("juicefs", at.clone(), 0, cmd)?;
        mounted(&mut daemon, &at).await?;
        let mut t = Target::new("juicefs", "redis-appendfsync-always", at);
        t.mounts.push(FuseMount(Some(daemon)));
        t.servers.push(redis);
        t._scratch = Some(RemoveDir(bucket));
        Ok(t)
    }
}

/// `juicefs` on the PATH, or the one built earlier under ~/.cache/tutti, or one built now
/// from the Go module proxy (a few minutes; the module has replace directives, so it is
/// built in a copy of its source rather than with `go install`).
fn juicefs_binary(root: &Path) -> Result<PathBuf, String> {
    if let Some(p) = on_path("juicefs") {
        return Ok(p);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    let cached = home
        .join(".cache/tutti")
        .join(format!("juicefs-{JUICEFS_VERSION}"));
    if cached.is_file() {
        return Ok(cached);
    }
    let go = ensure_installed("go", "golang-go")?;
    eprintln!(
        "bench: building JuiceFS {JUICEFS_VERSION} from the Go module proxy (a few minutes, once)"
    );
    let started = Instant::now();
    let module = format!("github.com/juicedata/juicefs@{JUICEFS_VERSION}");
    let json = run(
        Command::new(&go).args(["mod", "download", "-json", &module]),
        "go mod download",
    )?;
    let info: serde_json::Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
    let src = info["Dir"]
        .as_str()
        .ok_or("go mod download printed no Dir")?;
    let copy = scratch(root, "juicefs-src")?;
    run(
        Command::new("cp")
            .arg("-r")
            .arg(format!("{src}/."))
            .arg(&copy),
        "copying JuiceFS's source",
    )?;
    run(
        Command::new("chmod").args(["-R", "u+w"]).arg(&copy),
        "chmod",
    )?;
    std::fs::create_dir_all(cached.parent().expect("a parent")).map_err(|e| e.to_string())?;
    run(
        Command::new(&go)
            .args(["build", "-ldflags=-s -w", "-o"])
            .arg(&cached)
            .arg(".")
            .current_dir(&copy),
        "go build (JuiceFS)",
    )?;
    let _ = std::fs::remove_dir_all(&copy);
    eprintln!(
        "bench: JuiceFS built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(cached)
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}
