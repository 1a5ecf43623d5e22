//! The one supervisor of the processes tutti starts (memory nodes and managers of local
//! clusters, chaos clients, the peers' servers): each child runs under a name with its output
//! appended to a log file, dies with this process, and is killed, stopped or reaped by name.
//! Children are `tokio::process` children, so starting one needs a runtime context.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// How often a kill or a stop checks whether its child has exited.
const REAP_POLL: Duration = Duration::from_millis(1);

#[derive(Default)]
pub struct Supervisor {
    children: BTreeMap<String, Child>,
}

impl Supervisor {
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// Starts `cmd` as `name`, its stdout and stderr appended to `log`, stdin closed. The
    /// child gets SIGTERM if this process dies (a killed `tutti up` or `tutti chaos` leaves
    /// nothing running) and SIGKILL if the supervisor is dropped with it still running. A
    /// child already running under that name is an error.
    pub fn start(
        &mut self,
        name: &str,
        cmd: std::process::Command,
        log: &Path,
    ) -> std::io::Result<u32> {
        if self.is_running(name) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{name} is already running"),
            ));
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::from(cmd);
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe, as a pre_exec hook must be.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let pid = child.id().expect("a child that was just spawned has a pid");
        self.children.insert(name.to_string(), child);
        Ok(pid)
    }

    /// The pid of the child `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.get(name)?.id()
    }

    pub fn is_running(&self, name: &str) -> bool {
        self.children.contains_key(name)
    }

    /// `kill -9` the child `name` and reap it; its exit status, or `None` if it was not
    /// running.
    pub fn kill(&mut self, name: &str) -> Option<ExitStatus> {
        let mut child = self.children.remove(name)?;
        let _ = child.start_kill();
        reap_blocking(&mut child, None)
    }

    /// Sends SIGKILL to the child `name` without waiting for it: a process blocked on a
    /// request another child serves dies only once that one answers or dies (FUSE).
    pub fn start_kill(&mut self, name: &str) {
        if let Some(child) = self.children.get_mut(name) {
            let _ = child.start_kill();
        }
    }

    /// Sends `signal` to the child `name`, waits up to `grace` for it to exit, then kills it.
    pub fn stop(&mut self, name: &str, signal: i32, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.children.remove(name)?;
        signal_child(&child, signal);
        reap_blocking(&mut child, Some(Instant::now() + grace))
    }

    /// Sends `signal` to every child at once, waits up to `grace` in all for them to exit,
    /// then kills what is left.
    pub fn stop_all(&mut self, signal: i32, grace: Duration) {
        let mut children: Vec<Child> = std::mem::take(&mut self.children).into_values().collect();
        for child in &children {
            signal_child(child, signal);
        }
        let until = Instant::now() + grace;
        for child in &mut children {
            reap_blocking(child, Some(until));
        }
    }

    /// Children that exited by themselves since the last call: (name, exit status).
    pub fn reap(&mut self) -> Vec<(String, ExitStatus)> {
        let exited: Vec<(String, ExitStatus)> = self
            .children
            .iter_mut()
            .filter_map(|(name, child)| Some((name.clone(), child.try_wait().ok()??)))
            .collect();
        for (name, _) in &exited {
            self.children.remove(name);
        }
        exited
    }

    /// Waits until some child exits by itself and reaps it: (name, exit status). Pending
    /// forever when no child runs.
    pub async fn exited(&mut self) -> (String, ExitStatus) {
        if self.children.is_empty() {
            return std::future::pending().await;
        }
        let waits = self
            .children
            .iter_mut()
            .map(|(name, child)| Box::pin(async move { (name.clone(), child.wait().await) }));
        let ((name, status), _, _) = futures::future::select_all(waits).await;
        self.children.remove(&name);
        let status = status.unwrap_or_else(|e| panic!("waiting for {name}: {e}"));
        (name, status)
    }
}

impl Drop for Supervisor {
    /// Children still running get SIGTERM and 10 s to exit, then SIGKILL.
    fn drop(&mut self) {
        self.stop_all(libc::SIGTERM, Duration::from_secs(10));
    }
}

fn signal_child(child: &Child, signal: i32) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) on our own child, which has not been reaped (it has an id).
        unsafe { libc::kill(pid as libc::pid_t, signal) };
    }
}

/// Waits for `child` to exit, killing it at `until` if it has not; reaps it.
fn reap_blocking(child: &mut Child, until: Option<Instant>) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if until.is_some_and(|u| Instant::now() >= u) {
            let _ = child.start_kill();
            return reap_blocking(child, None);
        }
        std::thread::sleep(REAP_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> std::process::Command {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[tokio::test]
    async fn children_are_killed_stopped_and_reaped_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("out.log");
        let mut s = Supervisor::new();
        s.start("sleeper", sh("echo started; exec sleep 60"), &log)
            .unwrap();
        assert!(s.start("sleeper", sh("true"), &log).is_err());
        s.start("quick", sh("exit 3"), &log).unwrap();
        let (name, status) = s.exited().await;
        assert_eq!((name.as_str(), status.code()), ("quick", Some(3)));
        assert!(s.reap().is_empty());
        // Killed before its shell had echoed, the sleeper would leave the log empty.
        while !std::fs::read_to_string(&log).unwrap().contains("started") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let killed = s.kill("sleeper").unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(killed.signal(), Some(libc::SIGKILL));
        assert!(!s.is_running("sleeper") && s.kill("sleeper").is_none());
        // A child that ignores the signal is killed once the grace period is over.
        s.start(
            "stubborn",
            sh("trap '' TERM; echo trapped; exec sleep 60"),
            &log,
        )
        .unwrap();
        while !std::fs::read_to_string(&log).unwrap().contains("trapped") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let t0 = Instant::now();
        let status = s
            .stop("stubborn", libc::SIGTERM, Duration::from_millis(200))
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert!(std::fs::read_to_string(&log)
            .unwrap()
            .starts_with("started\n"));
    }
}
