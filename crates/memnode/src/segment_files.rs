//! The redo log's file work that its writer thread must not wait for: a spare segment zeroed
//! and synced ahead of need, so that appends never extend a file inline, and the deletion of
//! segments that garbage collection freed (an unlink and a directory sync). One thread per log.

use crate::redo_log::{sync_dir, LogError};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The spare's name in the log directory; it never parses as a segment name (`<lsn>.log`).
pub const SPARE_NAME: &str = "spare.segment";
/// Zeros written back per step. The steps go to the device without flushing its cache or
/// committing the journal (`sync_file_range`), so the writer's own syncs queue behind at most
/// one step's worth of writes; one `fdatasync` at the end makes the whole spare durable.
const ZERO_STEP_BYTES: u64 = 256 << 10;
/// The pace of the zeroing. At the disk's full speed (four logs zeroing 32 MiB spares in
/// 170 ms) every log's syncs waited 3-12 ms behind the zeros, the worst stretches of log
/// 2PC's tail (probe). One log at Fig. 16's 1PC load fills 23 MiB/s, so spares at this pace
/// are still ready well before they are needed.
const ZERO_BYTES_PER_S: f64 = (64 << 20) as f64;

enum Job {
    PrepareSpare { bytes: u64 },
    Delete(Vec<PathBuf>),
}

#[derive(Default)]
struct Shared {
    spare_ready: bool,
    failed: Option<LogError>,
}

/// The writer's handle on the thread.
pub struct SegmentFiles {
    spare: PathBuf,
    jobs: Option<mpsc::Sender<Job>>,
    shared: Arc<Mutex<Shared>>,
    closing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    spare_requested: bool,
}

impl SegmentFiles {
    /// Starts the thread for the log in `dir`; a spare left there by an earlier run (maybe
    /// half zeroed) is removed first.
    pub fn start(dir: &Path) -> Result<Self, LogError> {
        let spare = dir.join(SPARE_NAME);
        match std::fs::remove_file(&spare) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(LogError::Io {
                    path: spare,
                    source: e,
                })
            }
            _ => {}
        }
        let (jobs, rx) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let closing = Arc::new(AtomicBool::new(false));
        let thread = {
            let (spare, shared, closing) = (spare.clone(), shared.clone(), closing.clone());
            let log_dir = dir.to_path_buf();
            std::thread::Builder::new()
                .name("log-segments".into())
                .spawn(move || work(&log_dir, &spare, rx, &shared, &closing))
                .map_err(|source| LogError::Io {
                    path: dir.to_path_buf(),
                    source,
                })?
        };
        Ok(SegmentFiles {
            spare,
            jobs: Some(jobs),
            shared,
            closing,
            thread: Some(thread),
            spare_requested: false,
        })
    }

    /// Asks for a spare of `bytes` zeros, unless one is ready or on its way.
    pub fn request_spare(&mut self, bytes: u64) {
        if !self.spare_requested {
            self.spare_requested = true;
            self.send(Job::PrepareSpare { bytes });
        }
    }

    /// The spare's path if it is ready (zeroed and synced): the caller now owns the file and
    /// must move it away before asking for another. The thread's first failure, if any.
    pub fn take_spare(&mut self) -> Result<Option<PathBuf>, LogError> {
        let mut shared = self.shared.lock().expect("segment files poisoned");
        failure(&mut shared)?;
        if !std::mem::take(&mut shared.spare_ready) {
            return Ok(None);
        }
        self.spare_requested = false;
        Ok(Some(self.spare.clone()))
    }

    /// Deletes `segments`, then syncs the directory, in the background. Nothing depends on
    /// when: a segment still there after a crash is read again at restart, as before GC.
    pub fn delete(&mut self, segments: Vec<PathBuf>) -> Result<(), LogError> {
        failure(&mut self.shared.lock().expect("segment files poisoned"))?;
        self.send(Job::Delete(segments));
        Ok(())
    }

    fn send(&self, job: Job) {
        // The thread only stops when `jobs` is dropped, so the send cannot fail.
        let _ = self.jobs.as_ref().expect("jobs until drop").send(job);
    }
}

impl Drop for SegmentFiles {
    /// Waits for the deletions asked for; a spare being zeroed is left half done (the next
    /// start removes it).
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Relaxed);
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread's failure, reported once.
fn failure(shared: &mut Shared) -> Result<(), LogError> {
    shared.failed.take().map_or(Ok(()), Err)
}

fn work(
    dir: &Path,
    spare: &Path,
    jobs: mpsc::Receiver<Job>,
    shared: &Mutex<Shared>,
    closing: &AtomicBool,
) {
    for job in jobs {
        let result = match job {
            Job::PrepareSpare { bytes } => prepare_spare(spare, bytes, closing).map(|done| {
                shared.lock().expect("segment files poisoned").spare_ready = done;
            }),
            Job::Delete(segments) => delete(dir, &segments),
        };
        if let Err(e) = result {
            shared.lock().expect("segment files poisoned").failed = Some(e);
            return;
        }
    }
}

/// Writes `bytes` zeros into a new file at `path` and syncs them, a step at a time at
/// `ZERO_BYTES_PER_S`; `false` if the log closed first.
fn prepare_spare(path: &Path, bytes: u64, closing: &AtomicBool) -> Result<bool, LogError> {
    use std::os::fd::AsRawFd;
    let io = |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(io)?;
    file.set_len(bytes).map_err(io)?;
    let begun = Instant::now();
    let mut at = 0;
    while at < bytes {
        if closing.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let due = begun + Duration::from_secs_f64(at as f64 / ZERO_BYTES_PER_S);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let to = (at + ZERO_STEP_BYTES).min(bytes);
        zero_fill(&file, at, to).map_err(io)?;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain system call on an open descriptor; it touches no memory of ours.
        let rc =
            unsafe { libc::sync_file_range(file.as_raw_fd(), at as i64, (to - at) as i64, flags) };
        if rc != 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        at = to;
    }
    file.sync_data().map_err(io)?;
    Ok(true)
}

fn delete(dir: &Path, segments: &[PathBuf]) -> Result<(), LogError> {
    for path in segments {
        std::fs::remove_file(path).map_err(|source| LogError::Io {
            path: path.clone(),
            source,
        })?;
    }
    sync_dir(dir)
}

/// Writes zeros over `[from, to)` of `file`.
pub fn zero_fill(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let chunk = vec![0u8; (to - from).min(1 << 20) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(chunk.len() as u64) as usize;
        file.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spare_is_zeroed_whole_and_handed_over_once() {
        let scratch = tempfile::tempdir().unwrap();
        let mut files = SegmentFiles::start(scratch.path()).unwrap();
        files.request_spare(10 << 20);
        let deadline = Instant::now() + Duration::from_secs(20);
        let spare = loop {
            if let Some(spare) = files.take_spare().unwrap() {
                break spare;
            }
            assert!(Instant::now() < deadline, "no spare");
            std::thread::sleep(Duration::from_millis(1));
        };
        let bytes = std::fs::read(&spare).unwrap();
        assert_eq!(bytes.len(), 10 << 20);
        assert!(bytes.iter().all(|&b| b == 0));
        assert_eq!(files.take_spare().unwrap(), None, "taken once");
    }

    #[test]
    fn a_failed_deletion_reaches_the_writer() {
        let scratch = tempfile::tempdir().unwrap();
        let mut files = SegmentFiles::start(scratch.path()).unwrap();
        files
            .delete(vec![scratch.path().join("00000000000000000001.log")])
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match files.take_spare() {
                Err(LogError::Io { path, .. }) => {
                    assert!(path.ends_with("00000000000000000001.log"));
                    break;
                }
                other => assert!(matches!(other, Ok(None)), "{other:?}"),
            }
            assert!(Instant::now() < deadline, "the failure was not reported");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
