//! tutti-fs over real processes (`tutti chaos --workload fs`): each client is a mount (`tutti
//! fs mount`, dialing the memory nodes through the chaos proxy) and a process that works
//! through it with system calls (`tutti fs-workload`), killed and restarted together.
//!
//! A client's process runs two kinds of loops. Register loops read and replace the files
//! `registers/k1`..`k8`, each holding a u64 (a replacement is a write to a new file and a
//! rename over the key; a compare-and-swap from "absent" is a rename that refuses to
//! replace), recorded as a register history that Porcupine checks: no mount ever sees a
//! state that no serial order of the operations explains. Its action loop runs the
//! simulator's file-system actions (`tutti_workload::fs::Action`: creates, unlinks, mkdirs,
//! rmdirs, renames across directories with NOREPLACE and EXCHANGE, writes, truncates,
//! extended attributes) in its own directory `own-N` and the directory `shared` all clients
//! use, logging each call and its answer. The final check: fsck (what killed mounts leave
//! repaired, nothing else found), and each client's own directory against the simulator's
//! model fed with the answers every incarnation logged.

use crate::registers::{now_ns, Event, History, Op, Out};
use crate::supervisor::Supervisor;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::IntoRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tutti_client::Cluster;
use tutti_workload::fs::{dir_name, file_name, Action, DirModel, Where};

/// The volume a chaos run makes and its clients mount.
pub const VOLUME: &str = "fs";
/// Each memory node's part of the volume.
pub const BYTES_PER_NODE: &str = "24M";
/// Register files `registers/k1`..; a missing file is the register's initial 0.
pub const KEYS: u64 = 8;
const REGISTER_THREADS: usize = 2;
/// How long the start of a run waits for the mounts to appear.
const MOUNT_WAIT: Duration = Duration::from_secs(60);

/// One line of an action log: an action called, or how it returned (`errno` 0: it succeeded).
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "ev", rename_all = "lowercase")]
enum Logged {
    Call { n: u64, action: Action },
    Return { n: u64, errno: i32 },
}

/// Errors after which an action may or may not have taken effect: the mount gave up on the
/// memory nodes (EIO, its deadline), or the mount itself is gone.
fn is_unknown(errno: i32) -> bool {
    matches!(
        errno,
        libc::EIO | libc::ENOTCONN | libc::ECONNABORTED | libc::EINTR
    )
}

/// The clients of a run: mount `mount-N` and worker `worker-N` per client N.
pub struct FsClients {
    exe: PathBuf,
    manager: String,
    dir: PathBuf,
    pub count: u64,
    mounts: Supervisor,
    workers: Supervisor,
    incarnations: Vec<u64>,
    /// Clients whose mount is starting: their worker starts once it is up.
    pending: std::collections::BTreeSet<u64>,
    /// Extra flags of each client's mount (its routes through the chaos proxy, its
    /// credentials).
    pub flags: Vec<Vec<String>>,
}

impl FsClients {
    pub fn new(exe: &Path, manager: &str, dir: &Path, count: u64) -> FsClients {
        FsClients {
            exe: exe.to_path_buf(),
            manager: manager.into(),
            dir: dir.to_path_buf(),
            count,
            mounts: Supervisor::new(),
            workers: Supervisor::new(),
            incarnations: vec![0; count as usize],
            pending: Default::default(),
            flags: vec![vec![]; count as usize],
        }
    }

    /// The names the proxy knows the clients' mounts by.
    pub fn names(&self) -> Vec<String> {
        (0..self.count).map(|i| format!("client-{i}")).collect()
    }

    fn mountpoint(&self, client: u64) -> PathBuf {
        self.dir.join(format!("mnt-{client}"))
    }

    /// Starts `client`'s mount; `tend` starts its worker once the mount is there, so that
    /// the fault loop never waits for a mount (a partition it must heal may hold it up).
    pub fn start(&mut self, client: u64) -> std::io::Result<()> {
        let at = self.mountpoint(client);
        detach(&at);
        std::fs::create_dir_all(&at)?;
        let mut mount = Command::new(&self.exe);
        mount
            .args(["fs", "mount", "--cluster", &self.manager])
            .arg(&at)
            .args(&self.flags[client as usize]);
        let log = self.dir.join(format!("mount-{client}.log"));
        self.mounts.start(&format!("mount-{client}"), mount, &log)?;
        self.pending.insert(client);
        Ok(())
    }

    /// Starts the worker of each client whose mount has come up, and mounts again for each
    /// whose mount process gave up.
    pub fn tend(&mut self) -> std::io::Result<()> {
        for (name, _) in self.mounts.reap() {
            if let Some(client) = name.strip_prefix("mount-").and_then(|c| c.parse().ok()) {
                self.start(client)?;
            }
        }
        let up: Vec<u64> = (self.pending.iter().copied())
            .filter(|c| is_mounted(&self.mountpoint(*c)))
            .collect();
        for client in up {
            self.pending.remove(&client);
            self.start_worker(client)?;
        }
        Ok(())
    }

    fn start_worker(&mut self, client: u64) -> std::io::Result<()> {
        let i = client as usize;
        self.incarnations[i] += 1;
        let name = format!("fs-{client}-{}", self.incarnations[i]);
        let mut worker = Command::new(&self.exe);
        worker
            .args(["fs-workload", "--client", &client.to_string()])
            .args(["--incarnation", &self.incarnations[i].to_string()])
            .arg("--history")
            .arg(self.dir.join(format!("history-{name}.jsonl")))
            .arg("--actions")
            .arg(self.dir.join(format!("actions-{name}.jsonl")))
            .arg(self.mountpoint(client));
        let out = self.dir.join(format!("worker-{client}.log"));
        self.workers
            .start(&format!("worker-{client}"), worker, &out)?;
        Ok(())
    }

    /// Starts every client and waits until each is working.
    pub fn start_all(&mut self) -> std::io::Result<()> {
        (0..self.count).try_for_each(|c| self.start(c))?;
        let until = Instant::now() + MOUNT_WAIT;
        while !self.pending.is_empty() {
            if Instant::now() > until {
                return Err(std::io::Error::other(format!(
                    "mounts {:?} not up within {MOUNT_WAIT:?}; see mount-N.log in {}",
                    self.pending,
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
            self.tend()?;
        }
        Ok(())
    }

    /// `kill -9` the client's worker and its mount, and detaches the dead mount. The worker
    /// is reaped last: a thread of it waiting on a request the mount holds dies only when
    /// the request ends, which the mount's death ends at once (the mount could otherwise
    /// take its whole deadline, waiting on a partition that only this loop heals).
    pub fn kill(&mut self, client: u64) {
        let worker = format!("worker-{client}");
        self.workers.start_kill(&worker);
        self.mounts.kill(&format!("mount-{client}"));
        self.workers.kill(&worker);
        self.pending.remove(&client);
        detach(&self.mountpoint(client));
    }

    pub fn kill_all(&mut self) {
        (0..self.count).for_each(|c| self.kill(c));
    }

    /// Actions that returned, over every incarnation so far.
    pub fn actions_done(&self) -> usize {
        action_logs(&self.dir)
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                text.matches("\"ev\":\"return\"").count()
            })
            .sum()
    }
}

impl Drop for FsClients {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn is_mounted(at: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let at = at.to_string_lossy();
    info.lines().any(|l| l.split(' ').nth(4) == Some(&at))
}

/// Detaches whatever is mounted at `at` (a killed mount leaves its mount point dead).
fn detach(at: &Path) {
    if is_mounted(at) {
        let _ = Command::new("umount").arg("-l").arg(at).status();
    }
}

fn action_logs(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path.file_name()?.to_str()?;
            (name.starts_with("actions-fs-") && name.ends_with(".jsonl")).then_some(path)
        })
        .collect();
    logs.sort_by_key(|p| log_order(p));
    logs
}

/// (client, incarnation) of an action log `actions-fs-CLIENT-INCARNATION.jsonl`.
fn log_order(p: &Path) -> (u64, u64) {
    let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let mut parts = name.trim_start_matches("actions-fs-").split('-');
    let mut next = || parts.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    (next(), next())
}

// ---------------------------------------------------------------- the client process

fn errno_of(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a path")
}

/// close(2), whose error std's `File` drops: a write-back mount reports a failed flush there.
fn close_checked(file: std::fs::File) -> Result<(), i32> {
    // SAFETY: the descriptor was just taken out of the File, so it is closed once.
    match unsafe { libc::close(file.into_raw_fd()) } {
        0 => Ok(()),
        _ => Err(errno_of(std::io::Error::last_os_error())),
    }
}

fn rename2(from: &Path, to: &Path, flags: u32) -> Result<(), i32> {
    let (f, t) = (cpath(from), cpath(to));
    // SAFETY: two valid NUL-terminated paths.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    match rc {
        0 => Ok(()),
        _ => Err(errno_of(std::io::Error::last_os_error())),
    }
}

/// Runs `action` of `client` on the mount at `root` with system calls.
fn perform(root: &Path, client: u64, action: &Action) -> Result<(), i32> {
    let dir = |w: Where| match w {
        Where::Own => root.join(format!("own-{client}")),
        Where::Shared => root.join("shared"),
    };
    let file = |w: Where, i: u32| dir(w).join(std::ffi::OsStr::from_bytes(&file_name(i)));
    let sub = |w: Where, i: u32| dir(w).join(std::ffi::OsStr::from_bytes(&dir_name(i)));
    match *action {
        Action::Create(w, i) => {
            let f = (OpenOptions::new().write(true).create_new(true).mode(0o644))
                .open(file(w, i))
                .map_err(errno_of)?;
            close_checked(f)
        }
        Action::Unlink(w, i) => std::fs::remove_file(file(w, i)).map_err(errno_of),
        Action::Mkdir(w, i) => std::fs::create_dir(sub(w, i)).map_err(errno_of),
        Action::Rmdir(w, i) => std::fs::remove_dir(sub(w, i)).map_err(errno_of),
        Action::Stat(w, i) => (std::fs::symlink_metadata(file(w, i)).map(|_| ())).map_err(errno_of),
        Action::Rename {
            from,
            to,
            dirs,
            flags,
        } => {
            let name = |(w, i): (Where, u32)| if dirs { sub(w, i) } else { file(w, i) };
            rename2(&name(from), &name(to), flags)
        }
        Action::Write(w, i, offset, len) => {
            let f = OpenOptions::new()
                .write(true)
                .open(file(w, i))
                .map_err(errno_of)?;
            let data: Vec<u8> = (0..len)
                .map(|k| (k as u8).wrapping_add(client as u8))
                .collect();
            f.write_all_at(&data, offset).map_err(errno_of)?;
            close_checked(f)
        }
        Action::Truncate(w, i, size) => {
            let f = OpenOptions::new()
                .write(true)
                .open(file(w, i))
                .map_err(errno_of)?;
            f.set_len(size).map_err(errno_of)?;
            close_checked(f)
        }
        Action::Xattr(w, i, set) => {
            let (p, name) = (
                cpath(&file(w, i)),
                CString::new(format!("user.c{client}")).unwrap(),
            );
            let value = vec![client as u8; 1 + (i as usize * 97) % 700];
            // SAFETY: valid NUL-terminated path and name; the value's pointer and length.
            let rc = unsafe {
                if set {
                    libc::setxattr(
                        p.as_ptr(),
                        name.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                } else {
                    libc::removexattr(p.as_ptr(), name.as_ptr())
                }
            };
            match rc {
                0 => Ok(()),
                _ => Err(errno_of(std::io::Error::last_os_error())),
            }
        }
    }
}

/// Appends lines to a log file, each in one write (a killed process loses none it wrote).
struct Lines(std::sync::Mutex<std::fs::File>);

impl Lines {
    fn create(path: &Path) -> std::io::Result<Lines> {
        Ok(Lines(std::sync::Mutex::new(std::fs::File::create(path)?)))
    }

    fn write(&self, line: &impl Serialize) {
        use std::io::Write;
        let mut bytes = serde_json::to_vec(line).expect("serialisable");
        bytes.push(b'\n');
        (self.0.lock().expect("log poisoned"))
            .write_all(&bytes)
            .expect("the action log is writable");
    }
}

/// Makes `dir` (it may exist), retrying while the mount cannot reach the memory nodes.
fn make_dir(dir: &Path) {
    loop {
        match std::fs::create_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return,
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// A client process: its register loops and its action loop on the mount at `root`, until
/// it is killed.
pub fn run_client(root: &Path, client: u64, incarnation: u64, history: &Path, actions: &Path) {
    for d in [
        "registers".to_string(),
        "shared".into(),
        format!("own-{client}"),
    ] {
        make_dir(&root.join(d));
    }
    let history = History::create(history).expect("the history file");
    let actions = Lines::create(actions).expect("the action log");
    let seed = client << 32 ^ incarnation;
    std::thread::scope(|s| {
        for t in 0..REGISTER_THREADS {
            let history = &history;
            s.spawn(move || {
                let name = format!("fs-{client}-{incarnation}-{t}");
                registers(
                    root,
                    &name,
                    client << 48 | incarnation << 40 | (t as u64) << 36,
                    seed + t as u64,
                    history,
                )
            });
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xac71);
        for n in 0.. {
            let action = Action::random(&mut rng);
            actions.write(&Logged::Call { n, action });
            let errno = perform(root, client, &action).err().unwrap_or(0);
            actions.write(&Logged::Return { n, errno });
        }
    });
}

/// A register loop: reads, replacements, removals (a write of 0) and creates-if-absent (a
/// compare-and-swap from 0) of the register files. `base` makes written values unique.
fn registers(root: &Path, name: &str, base: u64, seed: u64, history: &History) {
    let dir = root.join("registers");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for seq in 1u64.. {
        let key = rng.gen_range(1..=KEYS);
        let path = dir.join(format!("k{key}"));
        let id = format!("{name}.{seq}");
        let call = |op| {
            history.record(&Event::Call {
                id: id.clone(),
                t: now_ns(),
                key,
                op,
                part_of: None,
            })
        };
        let ret = |out, value| {
            history.record(&Event::Return {
                id: id.clone(),
                t: now_ns(),
                out,
                value,
            })
        };
        let ended = |r: Result<(), i32>| match r {
            Ok(()) => Out::Ok,
            Err(e) if is_unknown(e) => Out::Unknown,
            Err(_) => Out::Aborted,
        };
        match rng.gen_range(0..10) {
            0..=4 => {
                call(Op::Read);
                match std::fs::read(&path) {
                    Ok(bytes) => {
                        // Anything but 8 bytes is a value no one wrote: Porcupine refuses it.
                        let v = bytes.try_into().map(u64::from_le_bytes).unwrap_or(u64::MAX);
                        ret(Out::Ok, Some(v));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => ret(Out::Ok, Some(0)),
                    Err(_) => ret(Out::Aborted, None),
                }
            }
            9 => {
                call(Op::Write { value: 0 });
                match std::fs::remove_file(&path).map_err(errno_of) {
                    Ok(()) | Err(libc::ENOENT) => ret(Out::Ok, None),
                    Err(e) => ret(ended(Err(e)), None),
                }
            }
            k => {
                let value = base | seq;
                let tmp = dir.join(format!(".{name}.{seq}"));
                let staged = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .map_err(errno_of)
                    .and_then(|f| {
                        f.write_all_at(&value.to_le_bytes(), 0).map_err(errno_of)?;
                        close_checked(f)
                    });
                if staged.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                    continue;
                }
                let (op, flags) = if k <= 7 {
                    (Op::Write { value }, 0)
                } else {
                    (Op::Cas { expect: 0, value }, libc::RENAME_NOREPLACE)
                };
                call(op);
                let r = rename2(&tmp, &path, flags);
                // A refused create-if-absent saw the key taken: dropped, not a mismatch,
                // since which value it saw is unknown.
                ret(ended(r), None);
                if r.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
        }
    }
}

// ---------------------------------------------------------------- the final check

/// What the final check found.
#[derive(Debug, Default, Clone)]
pub struct FsCheck {
    pub actions: u64,
    pub unknown: u64,
    /// What fsck repaired: orphans and leaked blocks killed mounts left.
    pub repaired: usize,
    pub files: u64,
    pub directories: u64,
}

/// Every client's actions, from its logs in order of incarnation, fed into its model.
fn models(dir: &Path, clients: u64) -> (Vec<DirModel>, FsCheck, Vec<String>) {
    let mut models = vec![DirModel::default(); clients as usize];
    let (mut check, mut violations) = (FsCheck::default(), vec![]);
    for log in action_logs(dir) {
        let (client, incarnation) = log_order(&log);
        let Some(model) = models.get_mut(client as usize) else {
            continue;
        };
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let mut open: Option<(u64, Action)> = None;
        for line in text.lines() {
            match serde_json::from_str::<Logged>(line) {
                Ok(Logged::Call { n, action }) => open = Some((n, action)),
                Ok(Logged::Return { n, errno }) => {
                    let Some((_, action)) = open.take().filter(|(m, _)| *m == n) else {
                        violations.push(format!("{}: a return without its call", log.display()));
                        continue;
                    };
                    check.actions += 1;
                    if is_unknown(errno) {
                        check.unknown += 1;
                        model.unknown(&action);
                    } else if let Some(what) = model.learn(&action, (errno != 0).then_some(errno)) {
                        violations.push(format!(
                            "client {client} (incarnation {incarnation}), action {n} {action:?}: {what}"
                        ));
                    }
                }
                // A line torn by the kill.
                Err(_) => {}
            }
        }
        if let Some((_, action)) = open {
            check.unknown += 1;
            model.unknown(&action);
        }
    }
    (models, check, violations)
}

/// Once every client is stopped and the cluster healed: fsck repairs what killed mounts left
/// and must then find the volume clean; each client's own directory must hold what its
/// model says.
pub async fn check(cluster: &Cluster, dir: &Path, clients: u64) -> Result<FsCheck, Vec<String>> {
    let fs = tutti_fs::FileSystem::open(cluster, VOLUME, Duration::from_secs(60))
        .await
        .map_err(|e| vec![format!("open the volume: {e}")])?;
    let fsck = |what: &'static str| {
        let fs = &fs;
        async move {
            fs.fsck()
                .await
                .map_err(|e| vec![format!("fsck {what}: {e}")])
        }
    };
    let first = fsck("before repair").await?;
    let repaired = fs
        .repair(&first.problems)
        .await
        .map_err(|e| vec![format!("fsck --repair: errno {e}")])?;
    let report = fsck("after repair").await?;
    let mut violations: Vec<String> = (report.problems.iter())
        .map(|p| format!("fsck after repair: {p:?}"))
        .collect();
    let (models, mut check, model_violations) = models(dir, clients);
    violations.extend(model_violations);
    check.repaired = repaired;
    check.files = report.files;
    check.directories = report.directories;
    for (client, model) in models.iter().enumerate() {
        let own = format!("own-{client}").into_bytes();
        let root = tutti_fs::Handle::any(fs.root());
        let listed = match fs.lookup(root, &own).await {
            Ok(found) => {
                (fs.list(tutti_fs::Handle::any(found.ino)).await).map(|(_, entries, _)| entries)
            }
            Err(libc::ENOENT) => Ok(vec![]),
            Err(e) => Err(e),
        };
        match listed {
            Ok(entries) => {
                let names = entries.into_iter().map(|e| e.name).collect();
                for what in model.check(&names) {
                    violations.push(format!("client {client}'s directory: {what}"));
                }
            }
            Err(e) => violations.push(format!("client {client}'s directory: errno {e}")),
        }
    }
    if violations.is_empty() {
        Ok(check)
    } else {
        Err(violations)
    }
}
