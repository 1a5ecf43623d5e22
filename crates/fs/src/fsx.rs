//! A randomized data-integrity exerciser in the manner of xfstests' fsx: random writes,
//! reads, truncates, fallocate modes, fsyncs and reopens of one file through any mounted
//! file system, every read compared with an in-memory model of what the file must hold.
//! `tutti fs fsx` runs it; the tests run it on a tutti-fs mount.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

#[derive(Clone, Debug)]
pub struct FsxConfig {
    pub ops: u64,
    pub seed: u64,
    /// The file never grows past this.
    pub file_bytes_max: u64,
    /// Largest single read or write.
    pub io_bytes_max: u64,
    /// Compare the whole file with the model every this many operations.
    pub check_every: u64,
    /// Use fallocate (the file system must support its modes).
    pub fallocate: bool,
}

impl Default for FsxConfig {
    fn default() -> Self {
        FsxConfig {
            ops: 10_000,
            seed: 1,
            file_bytes_max: 4 << 20,
            io_bytes_max: 256 << 10,
            check_every: 1000,
            fallocate: true,
        }
    }
}

/// How many of each operation ran.
#[derive(Clone, Debug, Default)]
pub struct FsxReport {
    pub writes: u64,
    pub reads: u64,
    pub truncates: u64,
    pub fallocates: u64,
    pub fsyncs: u64,
    pub reopens: u64,
    pub full_checks: u64,
}

fn open(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))
}

struct Fsx<'a> {
    path: &'a Path,
    file: File,
    model: Vec<u8>,
    rng: ChaCha8Rng,
    cfg: FsxConfig,
    report: FsxReport,
    op: u64,
}

impl Fsx<'_> {
    fn fail(&self, what: String) -> String {
        format!("fsx seed {} op {}: {what}", self.cfg.seed, self.op)
    }

    fn range(&mut self) -> (u64, u64) {
        let off = self.rng.gen_range(0..self.cfg.file_bytes_max);
        let len = self
            .rng
            .gen_range(1..=self.cfg.io_bytes_max)
            .min(self.cfg.file_bytes_max - off);
        (off, len.max(1))
    }

    fn write(&mut self) -> Result<(), String> {
        let (off, len) = self.range();
        let byte = self.rng.gen::<u8>() | 1;
        let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
        self.file
            .write_all_at(&data, off)
            .map_err(|e| self.fail(format!("write {len} at {off}: {e}")))?;
        let end = (off + len) as usize;
        if self.model.len() < end {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(&data);
        self.report.writes += 1;
        Ok(())
    }

    fn read(&mut self) -> Result<(), String> {
        let (off, len) = self.range();
        self.compare(off, len)?;
        self.report.reads += 1;
        Ok(())
    }

    fn compare(&mut self, off: u64, len: u64) -> Result<(), String> {
        let mut got = vec![0u8; len as usize];
        let mut n = 0;
        while n < got.len() {
            match self.file.read_at(&mut got[n..], off + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => return Err(self.fail(format!("read {len} at {off}: {e}"))),
            }
        }
        got.truncate(n);
        let model_end = (off as usize + len as usize).min(self.model.len());
        let want = if (off as usize) < self.model.len() {
            &self.model[off as usize..model_end]
        } else {
            &[][..]
        };
        if got != want {
            let first = got
                .iter()
                .zip(want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            return Err(self.fail(format!(
                "read {len} at {off}: got {} bytes, want {}; first difference at {} (got {:?}, want {:?})",
                got.len(),
                want.len(),
                off + first as u64,
                got.get(first),
                want.get(first)
            )));
        }
        Ok(())
    }

    fn truncate(&mut self) -> Result<(), String> {
        let size = self.rng.gen_range(0..=self.cfg.file_bytes_max);
        self.file
            .set_len(size)
            .map_err(|e| self.fail(format!("truncate to {size}: {e}")))?;
        self.model.resize(size as usize, 0);
        self.report.truncates += 1;
        Ok(())
    }

    fn fallocate(&mut self) -> Result<(), String> {
        let (off, len) = self.range();
        let modes = [
            0,
            libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_ZERO_RANGE,
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
        ];
        let mode = modes[self.rng.gen_range(0..modes.len())];
        // SAFETY: a valid open descriptor and plain integers.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off as i64, len as i64) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return Err(self.fail(format!("fallocate mode {mode:#x} {len} at {off}: {e}")));
        }
        let end = (off + len) as usize;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if !keep && self.model.len() < end {
            self.model.resize(end, 0);
        }
        if zero {
            let to = end.min(self.model.len());
            if (off as usize) < to {
                self.model[off as usize..to].fill(0);
            }
        }
        self.report.fallocates += 1;
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        let pick = self.rng.gen_range(0..100);
        match pick {
            0..=39 => self.write()?,
            40..=74 => self.read()?,
            75..=84 => self.truncate()?,
            85..=92 if self.cfg.fallocate => self.fallocate()?,
            85..=92 => self.write()?,
            93..=96 => {
                self.file
                    .sync_all()
                    .map_err(|e| self.fail(format!("fsync: {e}")))?;
                self.report.fsyncs += 1;
            }
            _ => {
                self.file = open(self.path)?;
                self.report.reopens += 1;
            }
        }
        let size = self
            .file
            .metadata()
            .map_err(|e| self.fail(format!("stat: {e}")))?
            .len();
        if size != self.model.len() as u64 {
            return Err(self.fail(format!("size {size}, want {}", self.model.len())));
        }
        Ok(())
    }
}

/// Runs `cfg.ops` operations on the file at `path` (created or truncated first);
/// `progress` hears the count every 1,000. Fails at the first disagreement with the model.
pub fn run(
    path: &Path,
    cfg: &FsxConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<FsxReport, String> {
    let file = open(path)?;
    file.set_len(0)
        .map_err(|e| format!("truncate {}: {e}", path.display()))?;
    let mut fsx = Fsx {
        path,
        file,
        model: vec![],
        rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        cfg: cfg.clone(),
        report: FsxReport::default(),
        op: 0,
    };
    for op in 0..cfg.ops {
        fsx.op = op;
        fsx.step()?;
        if cfg.check_every > 0 && (op + 1) % cfg.check_every == 0 {
            let len = fsx.model.len() as u64;
            fsx.compare(0, len.max(1))?;
            fsx.report.full_checks += 1;
        }
        if (op + 1) % 1000 == 0 {
            progress(op + 1);
        }
    }
    Ok(fsx.report)
}
