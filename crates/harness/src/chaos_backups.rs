//! Consistent backups taken during a `tutti chaos` bank run (`--backup-every-s`): each is a
//! `tutti backup create` process started while the faults go on, and each that completes is
//! restored afterwards, with `tutti backup restore`, into a cluster of its own whose bank
//! must be a cut: every transfer a client saw commit before the backup began is in it, each
//! counter lies between that and the client's possible commits at the end, and the money is
//! all there (`Bank::check_cut`). A backup that fails (it gave up its attempts) must leave
//! no backup behind. Each backup's standard error is kept beside it (`backup-N.err`).

use crate::chaos::{bank, Clients, Terminator};
use crate::local::{Layout, LocalCluster, LocalError, LOOPBACK};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tutti_workload::Workload;

/// Attempts each backup may make: a node is killed every second or two, and each kill
/// during an attempt ends it (`tutti backup create`'s default, 3, is for a calmer cluster).
const ATTEMPTS: &str = "10";

/// A backup process under way: where it writes, and each client's transfers seen committed
/// when it started.
struct Running {
    child: Child,
    dest: PathBuf,
    before: Vec<u64>,
}

/// What became of the run's backups.
#[derive(Debug, Default, Clone, Copy)]
pub struct BackupCounts {
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
    /// Completed ones restored and found to be cuts.
    pub checked: u64,
}

pub struct Backups {
    exe: PathBuf,
    dir: PathBuf,
    every: Terminator,
    /// `--cluster` and the credential flags for each `tutti backup` process.
    flags: Vec<String>,
    running: Option<Running>,
    completed: Vec<(PathBuf, Vec<u64>)>,
    pub counts: BackupCounts,
    pub violations: Vec<String>,
}

impl Backups {
    pub fn new(
        exe: &Path,
        dir: &Path,
        every: Terminator,
        cluster: &str,
        credentials: &[String],
    ) -> Backups {
        let mut flags = vec!["--cluster".to_string(), cluster.to_string()];
        flags.extend(credentials.iter().cloned());
        Backups {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            every,
            flags,
            running: None,
            completed: Vec::new(),
            counts: BackupCounts::default(),
            violations: Vec::new(),
        }
    }

    pub fn every(&self) -> &Terminator {
        &self.every
    }

    /// Starts a backup, unless one is still running (then it waits for it).
    pub fn start(&mut self, clients: &Clients) -> Result<(), LocalError> {
        if self.running.is_some() {
            return Ok(());
        }
        self.counts.started += 1;
        let dest = self.dir.join(format!("backup-{}", self.counts.started));
        let err = dest.with_extension("err");
        let stderr = std::fs::File::create(&err).map_err(|source| LocalError::Io {
            what: format!("create {}", err.display()),
            source,
        })?;
        let child = Command::new(&self.exe)
            .args(["backup", "create"])
            .arg(&dest)
            .args(["--max-rate", "0", "--attempts", ATTEMPTS])
            .args(&self.flags)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|source| LocalError::Io {
                what: "start tutti backup create".into(),
                source,
            })?;
        self.running = Some(Running {
            child,
            dest,
            before: clients.committed_so_far(),
        });
        Ok(())
    }

    /// Notes the running backup's end, if it ended.
    pub fn poll(&mut self) {
        let Some(r) = &mut self.running else { return };
        let Ok(Some(status)) = r.child.try_wait() else {
            return;
        };
        let r = self.running.take().expect("running");
        self.ended(r, status.success());
    }

    /// Waits for the running backup, if any.
    pub fn finish(&mut self) {
        if let Some(mut r) = self.running.take() {
            let ok = r.child.wait().is_ok_and(|s| s.success());
            self.ended(r, ok);
        }
    }

    fn ended(&mut self, r: Running, ok: bool) {
        let manifest = r.dest.join("manifest.json").exists();
        if ok && manifest {
            self.counts.completed += 1;
            self.completed.push((r.dest, r.before));
        } else {
            self.counts.failed += 1;
            if manifest {
                self.violations.push(format!(
                    "{}: the backup failed but left a manifest",
                    r.dest.display()
                ));
            }
        }
    }

    /// Restores every completed backup into a cluster of its own and checks it is a cut of
    /// the run whose clients (all stopped) are `clients`.
    pub fn check(&mut self, rt: &tokio::runtime::Runtime, clients: &Clients) {
        let possible = clients.possibly_committed();
        for (dest, before) in std::mem::take(&mut self.completed) {
            match self.check_one(rt, clients, &dest, &before, &possible) {
                Ok(()) => self.counts.checked += 1,
                Err(v) => self
                    .violations
                    .extend(v.into_iter().map(|v| format!("{}: {v}", dest.display()))),
            }
        }
    }

    fn check_one(
        &self,
        rt: &tokio::runtime::Runtime,
        clients: &Clients,
        dest: &Path,
        before: &[u64],
        possible: &[u64],
    ) -> Result<(), Vec<String>> {
        let data = dest.with_extension("restored");
        let out = Command::new(&self.exe)
            .args(["backup", "restore"])
            .arg(dest)
            .arg("--data")
            .arg(&data)
            .output()
            .map_err(|e| vec![format!("tutti backup restore: {e}")])?;
        if !out.status.success() {
            return Err(vec![format!(
                "tutti backup restore: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )]);
        }
        let layout = Layout {
            host: LOOPBACK,
            nodes: 4,
            managers: 1,
            mode: "log".into(),
            size_bytes: 64 << 20,
            node_flags: vec![],
            manager_flags: vec![],
        };
        let mut local = LocalCluster::open(&self.exe, &data, layout, true)
            .map_err(|e| vec![format!("the restored cluster: {e}")])?;
        local
            .start_all()
            .map_err(|e| vec![format!("start the restored cluster: {e}")])?;
        let checked = rt.block_on(async {
            let cluster = local
                .wait_ready(Duration::from_secs(60))
                .await
                .map_err(|e| vec![format!("the restored cluster: {e}")])?;
            let mut then = bank(clients.count());
            let mut end = bank(clients.count());
            for id in 0..clients.count() {
                let i = id as usize;
                then.tally(id, before[i], 0);
                end.tally(id, clients.seen[i], possible[i] - clients.seen[i]);
            }
            let snapshot = cluster
                .exec_and_commit(&end.snapshot())
                .await
                .map_err(|e| vec![format!("reading the restored bank: {e}")])?;
            let broken = end.check_cut(&then, &snapshot.reads);
            if broken.is_empty() {
                Ok(())
            } else {
                Err(broken.iter().map(ToString::to_string).collect())
            }
        });
        local.stop_all();
        if checked.is_ok() {
            let _ = std::fs::remove_dir_all(&data);
            let _ = std::fs::remove_dir_all(dest);
        }
        checked
    }
}
