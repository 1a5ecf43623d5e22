//! The file-system workloads of `tutti bench fs`, run through the kernel's system calls on a
//! directory of the file system under test: Sinfonia's modified Connectathon phases
//! (Fig. 22), its modified Andrew benchmark (§7.2.1), creates, stats and unlinks of empty
//! files in one directory, `ls -l` of a large directory, and sequential transfer. Each phase
//! answers how long it took and how many operations it made; the same code runs on every
//! system.

use crate::Latencies;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one phase did: its name, how long it took, how many operations (or MiB for the
/// sequential ones) it made, and the latency of each operation where one is timed.
pub struct Phase {
    pub name: String,
    pub elapsed: Duration,
    pub ops: u64,
    pub latencies: Option<Latencies>,
}

fn io<'a>(what: &'a str, path: &'a Path) -> impl Fn(std::io::Error) -> String + 'a {
    move |e| format!("{what} {}: {e}", path.display())
}

fn create_empty(path: &Path) -> Result<(), String> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map(drop)
        .map_err(io("create", path))
}

/// Times `body`, which reports how many operations it made.
fn timed(name: &str, body: impl FnOnce() -> Result<u64, String>) -> Result<Phase, String> {
    let start = Instant::now();
    let ops = body()?;
    Ok(Phase {
        name: name.into(),
        elapsed: start.elapsed(),
        ops,
        latencies: None,
    })
}

/// Times each of `items` through `op`, one after another.
fn timed_each<T>(
    name: &str,
    items: &[T],
    mut op: impl FnMut(&T) -> Result<(), String>,
) -> Result<Phase, String> {
    let mut lat = Latencies::new();
    let start = Instant::now();
    for item in items {
        let t = Instant::now();
        op(item)?;
        lat.record(t.elapsed());
    }
    Ok(Phase {
        name: name.into(),
        elapsed: start.elapsed(),
        ops: items.len() as u64,
        latencies: Some(lat),
    })
}

/// Empties the kernel's page, dentry and inode caches (root only), so that a read phase
/// reads from the file system, not from memory. Failing to is not an error: the phase then
/// says less, and the report says so where it matters.
pub fn drop_caches() -> bool {
    settle_disk();
    fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Writes back what earlier phases (or an earlier system's data, removed) left dirty in the
/// page cache, so that a phase timing each call's fsync does not queue behind it.
fn settle_disk() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

// ------------------------------------------------------------------ Connectathon (Fig. 22)

/// Connectathon's tree: `levels` deep, `files` files and `dirs` subdirectories in each
/// directory above the last level (5, 5, 3: 605 files in 363 directories).
fn tree_create(
    dir: &Path,
    levels: u32,
    files: u32,
    dirs: u32,
    made: &mut u64,
) -> Result<(), String> {
    if levels == 0 {
        return Ok(());
    }
    for f in 0..files {
        create_empty(&dir.join(format!("file.{f}")))?;
        *made += 1;
    }
    for d in 0..dirs {
        let sub = dir.join(format!("dir.{d}"));
        fs::create_dir(&sub).map_err(io("mkdir", &sub))?;
        *made += 1;
        tree_create(&sub, levels - 1, files, dirs, made)?;
    }
    Ok(())
}

fn tree_remove(
    dir: &Path,
    levels: u32,
    files: u32,
    dirs: u32,
    gone: &mut u64,
) -> Result<(), String> {
    if levels == 0 {
        return Ok(());
    }
    for f in 0..files {
        let p = dir.join(format!("file.{f}"));
        fs::remove_file(&p).map_err(io("unlink", &p))?;
        *gone += 1;
    }
    for d in 0..dirs {
        let sub = dir.join(format!("dir.{d}"));
        tree_remove(&sub, levels - 1, files, dirs, gone)?;
        fs::remove_dir(&sub).map_err(io("rmdir", &sub))?;
        *gone += 1;
    }
    Ok(())
}

fn files_in(dir: &Path, prefix: &str, n: usize) -> Result<Vec<PathBuf>, String> {
    fs::create_dir_all(dir).map_err(io("mkdir", dir))?;
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("{prefix}{i}"))).collect();
    for p in &paths {
        create_empty(p)?;
    }
    Ok(paths)
}

/// Sinfonia's Connectathon phases (Fig. 22, ten times Connectathon's basic tests), in `dir`.
pub fn connectathon(dir: &Path) -> Result<Vec<Phase>, String> {
    let mut out = vec![];
    let tree = dir.join("tree");
    fs::create_dir(&tree).map_err(io("mkdir", &tree))?;
    out.push(timed("cthon-1-create-tree", || {
        let mut made = 0;
        tree_create(&tree, 5, 5, 3, &mut made).map(|()| made)
    })?);
    out.push(timed("cthon-2-remove-tree", || {
        let mut gone = 0;
        tree_remove(&tree, 5, 5, 3, &mut gone).map(|()| gone)
    })?);
    out.push(timed("cthon-3-stat-cwd", || {
        for _ in 0..250 {
            fs::metadata(dir).map_err(io("stat", dir))?;
        }
        Ok(250)
    })?);
    let p4 = files_in(&dir.join("p4"), "f", 100)?;
    out.push(timed("cthon-4-chmod-stat", || {
        for round in 0..50u32 {
            for p in &p4 {
                let mode = if round.is_multiple_of(2) {
                    0o600
                } else {
                    0o644
                };
                fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(io("chmod", p))?;
                fs::metadata(p).map_err(io("stat", p))?;
            }
        }
        Ok(100 * 50 * 2)
    })?);
    let p4a = files_in(&dir.join("p4a"), "f", 10)?;
    out.push(timed("cthon-4a-stat", || {
        for _ in 0..50 {
            for p in &p4a {
                fs::metadata(p).map_err(io("stat", p))?;
            }
        }
        Ok(10 * 50)
    })?);
    let big = dir.join("bigfile");
    out.push(timed("cthon-5a-write-1MB", || {
        let buf = vec![0x5au8; 8192];
        for _ in 0..10 {
            let mut f = File::create(&big).map_err(io("create", &big))?;
            for _ in 0..128 {
                f.write_all(&buf).map_err(io("write", &big))?;
            }
            // The NFS server of Fig. 23 wrote synchronously: every system here makes the
            // file durable before the next round.
            f.sync_all().map_err(io("fsync", &big))?;
        }
        Ok(10 * 128)
    })?);
    out.push(timed("cthon-5b-read-1MB", || {
        let mut buf = vec![0u8; 8192];
        for _ in 0..10 {
            let mut f = File::open(&big).map_err(io("open", &big))?;
            while f.read(&mut buf).map_err(io("read", &big))? > 0 {}
        }
        Ok(10 * 128)
    })?);
    let p6 = dir.join("p6");
    let p6_files = files_in(&p6, "f", 200)?;
    out.push(timed("cthon-6-readdir", || {
        for p in &p6_files {
            let n = fs::read_dir(&p6).map_err(io("readdir", &p6))?.count();
            std::hint::black_box(n);
            fs::remove_file(p).map_err(io("unlink", p))?;
        }
        Ok(200 * 2)
    })?);
    let p7 = files_in(&dir.join("p7a"), "f", 100)?;
    out.push(timed("cthon-7a-rename-stat", || {
        for round in 0..10 {
            for p in &p7 {
                let (from, to) = renamed(p, round);
                fs::rename(&from, &to).map_err(io("rename", &from))?;
                fs::metadata(&to).map_err(io("stat", &to))?;
            }
        }
        Ok(100 * 10 * 2)
    })?);
    let p7b = files_in(&dir.join("p7b"), "f", 100)?;
    out.push(timed("cthon-7b-link-stat", || {
        for _ in 0..10 {
            for p in &p7b {
                let l = p.with_extension("link");
                fs::hard_link(p, &l).map_err(io("link", &l))?;
                fs::metadata(&l).map_err(io("stat", &l))?;
                fs::remove_file(&l).map_err(io("unlink", &l))?;
            }
        }
        Ok(100 * 10 * 3)
    })?);
    let p8 = dir.join("p8");
    fs::create_dir(&p8).map_err(io("mkdir", &p8))?;
    out.push(timed("cthon-8-symlink-readlink", || {
        for _ in 0..20 {
            for i in 0..100 {
                let l = p8.join(format!("s{i}"));
                symlink(format!("/this/is/symlink/target/{i}"), &l).map_err(io("symlink", &l))?;
            }
            for i in 0..100 {
                let l = p8.join(format!("s{i}"));
                fs::read_link(&l).map_err(io("readlink", &l))?;
                fs::remove_file(&l).map_err(io("unlink", &l))?;
            }
        }
        Ok(20 * 100 * 3)
    })?);
    out.push(timed("cthon-9-statfs", || {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("no NUL");
        for _ in 0..1500 {
            let mut st: libc::statfs = unsafe { std::mem::zeroed() };
            // SAFETY: a valid path and a statfs buffer of the right type.
            if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
                return Err(format!(
                    "statfs {}: {}",
                    dir.display(),
                    std::io::Error::last_os_error()
                ));
            }
        }
        Ok(1500)
    })?);
    Ok(out)
}

/// Phase 7a's files move between `NAME` and `NAME.r` each round.
fn renamed(p: &Path, round: u32) -> (PathBuf, PathBuf) {
    let r = p.with_extension("r");
    if round.is_multiple_of(2) {
        (p.to_path_buf(), r)
    } else {
        (r, p.to_path_buf())
    }
}

// ---------------------------------------------------------------- Andrew (Sinfonia §7.2.1)

/// The source tree's directories (relative, parents first) and files (relative).
fn source_tree(src: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    let (mut dirs, mut files) = (vec![], vec![]);
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let here = src.join(&rel);
        let mut entries: Vec<_> = fs::read_dir(&here)
            .map_err(io("readdir", &here))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let t = e.file_type().map_err(io("stat", &e.path()))?;
            let r = rel.join(e.file_name());
            if t.is_dir() {
                dirs.push(r.clone());
                todo.push(r);
            } else if t.is_file() {
                files.push(r);
            }
        }
    }
    dirs.sort_by_key(|d| d.components().count());
    Ok((dirs, files))
}

/// A small C program that includes headers of the copied tree: what phase 5 compiles.
fn small_program(dir: &Path, units: usize) -> Result<(), String> {
    let mut objects = String::new();
    for u in 0..units {
        let src = format!(
            "#include <linux/types.h>\n#include <linux/stat.h>\n\
             int unit{u}(int x) {{ __u32 v = (__u32)x * {m}u; for (int i = 0; i < {u} + 3; i++) v ^= v >> 3; return (int)v + S_IFREG; }}\n",
            m = 2 * u + 1
        );
        let path = dir.join(format!("unit{u}.c"));
        fs::write(&path, src).map_err(io("write", &path))?;
        objects += &format!(" unit{u}.o");
    }
    let calls: String = (0..units).map(|u| format!("s += unit{u}(s);\n")).collect();
    let decls: String = (0..units).map(|u| format!("int unit{u}(int);\n")).collect();
    let main = format!("{decls}int main(void) {{ int s = 1;\n{calls}return s == 0; }}\n");
    fs::write(dir.join("main.c"), main).map_err(io("write", dir))?;
    let makefile = format!(
        "CFLAGS = -O1 -I../include\nprog: main.o{objects}\n\t$(CC) -o $@ $^\n%.o: %.c\n\t$(CC) $(CFLAGS) -c $<\n"
    );
    fs::write(dir.join("Makefile"), makefile).map_err(io("write", dir))
}

/// Sinfonia's modified Andrew benchmark over source tree `src` (its directories copied
/// `copies` times), in `dir`: 1 mkdir of every copy, 2 copy of the files into the first
/// copy, 3 a recursive listing (stat of every entry) of the copies, 4 every copied file read
/// twice, 5 a make of a small program in the copy.
pub fn andrew(dir: &Path, src: &Path, copies: usize) -> Result<Vec<Phase>, String> {
    let (dirs, files) = source_tree(src)?;
    let copy = |k: usize| dir.join(format!("copy{k}"));
    let mut out = vec![];
    out.push(timed("andrew-1-mkdir", || {
        for k in 0..copies {
            fs::create_dir(copy(k)).map_err(io("mkdir", &copy(k)))?;
            for d in &dirs {
                let p = copy(k).join(d);
                fs::create_dir(&p).map_err(io("mkdir", &p))?;
            }
        }
        Ok((copies * (dirs.len() + 1)) as u64)
    })?);
    let mut bytes = 0u64;
    out.push(timed("andrew-2-copy", || {
        for f in &files {
            let (from, to) = (src.join(f), copy(0).join(f));
            bytes += fs::copy(&from, &to).map_err(io("copy", &to))?;
        }
        Ok(files.len() as u64)
    })?);
    out.push(timed("andrew-3-stat-all", || {
        let mut n = 0u64;
        for k in 0..copies {
            let mut todo = vec![copy(k)];
            while let Some(d) = todo.pop() {
                for e in fs::read_dir(&d).map_err(io("readdir", &d))? {
                    let e = e.map_err(io("readdir", &d))?;
                    let m = fs::symlink_metadata(e.path()).map_err(io("stat", &e.path()))?;
                    n += 1;
                    if m.is_dir() {
                        todo.push(e.path());
                    }
                }
            }
        }
        Ok(n)
    })?);
    drop_caches();
    out.push(timed("andrew-4-read-twice", || {
        let mut buf = vec![0u8; 64 << 10];
        for _ in 0..2 {
            for f in &files {
                let p = copy(0).join(f);
                let mut file = File::open(&p).map_err(io("open", &p))?;
                while file.read(&mut buf).map_err(io("read", &p))? > 0 {}
            }
        }
        Ok(2 * files.len() as u64)
    })?);
    let build = copy(0).join("build");
    fs::create_dir(&build).map_err(io("mkdir", &build))?;
    let include = copy(0).join("include");
    fs::create_dir(&include).map_err(io("mkdir", &include))?;
    // The program includes <linux/...> from the copied tree: link it in as include/linux.
    symlink("..", include.join("linux")).map_err(io("symlink", &include))?;
    small_program(&build, 20)?;
    out.push(timed("andrew-5-make", || {
        let status = Command::new("make")
            .args(["-s", "-j2", "CC=gcc"])
            .current_dir(&build)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("make (is it installed?): {e}"))?;
        if !status.success() {
            return Err(format!("make in {} failed: {status}", build.display()));
        }
        Ok(22)
    })?);
    Ok(out)
}

// ---------------------------------------------------------------- metadata and listing

/// Creates, stats and unlinks `n` empty files in one new directory `dir`, one at a time.
pub fn metadata(dir: &Path, n: usize) -> Result<Vec<Phase>, String> {
    fs::create_dir(dir).map_err(io("mkdir", dir))?;
    settle_disk();
    let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("file-{i:06}"))).collect();
    Ok(vec![
        timed_each("create", &paths, |p| create_empty(p))?,
        timed_each("stat", &paths, |p| {
            fs::symlink_metadata(p).map(drop).map_err(io("stat", p))
        })?,
        timed_each("unlink", &paths, |p| {
            fs::remove_file(p).map_err(io("unlink", p))
        })?,
    ])
}

/// `workers` threads, each creating, stating and unlinking its share of `n` files in `dir`
/// (made if missing) through its own path (`dirs[w]`: a directory, seen through one mount
/// or another); each step starts when every worker has finished the one before.
pub fn metadata_parallel(dirs: &[PathBuf], n: usize) -> Result<Vec<Phase>, String> {
    let workers = dirs.len();
    fs::create_dir_all(&dirs[0]).map_err(io("mkdir", &dirs[0]))?;
    let share = |w: usize| -> Vec<PathBuf> {
        (w..n)
            .step_by(workers)
            .map(|i| dirs[w].join(format!("file-{i:06}")))
            .collect()
    };
    let mut out = vec![];
    settle_disk();
    for step in ["create", "stat", "unlink"] {
        let start = Instant::now();
        let lat = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    let paths = share(w);
                    s.spawn(move || {
                        timed_each(step, &paths, |p| match step {
                            "create" => create_empty(p),
                            "stat" => fs::symlink_metadata(p).map(drop).map_err(io("stat", p)),
                            _ => fs::remove_file(p).map_err(io("unlink", p)),
                        })
                    })
                })
                .collect();
            let mut all = Latencies::new();
            for h in handles {
                let phase = h.join().map_err(|_| "a worker panicked".to_string())??;
                all.add(phase.latencies.as_ref().expect("timed each"));
            }
            Ok::<_, String>(all)
        })?;
        out.push(Phase {
            name: step.into(),
            elapsed: start.elapsed(),
            ops: n as u64,
            latencies: Some(lat),
        });
    }
    Ok(out)
}

/// Makes `n` empty files in new directory `dir` (reported as a phase of its own), then
/// times `ls -l` of it with a cold cache.
pub fn listing(dir: &Path, n: usize) -> Result<Vec<Phase>, String> {
    fs::create_dir(dir).map_err(io("mkdir", dir))?;
    let fill = timed("ls-fill", || {
        for i in 0..n {
            create_empty(&dir.join(format!("entry-{i:07}")))?;
        }
        Ok(n as u64)
    })?;
    drop_caches();
    let ls = timed("ls-l", || {
        let out = Command::new("ls")
            .args(["-l", "--color=never"])
            .arg(dir)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("ls: {e}"))?;
        if !out.status.success() {
            return Err(format!("ls -l {} failed: {}", dir.display(), out.status));
        }
        let lines = out.stdout.iter().filter(|b| **b == b'\n').count() as u64;
        if lines < n as u64 {
            return Err(format!("ls -l listed {lines} entries of {n}"));
        }
        Ok(n as u64)
    })?;
    Ok(vec![fill, ls])
}

// ---------------------------------------------------------------- sequential transfer

/// Bytes of each write and read.
const TRANSFER_BYTES: usize = 1 << 20;

/// Writes `bytes` to a new file in 1 MiB writes and fsyncs it; then, with a cold cache,
/// reads it back. `ops` is MiB.
pub fn sequential(dir: &Path, bytes: u64) -> Result<Vec<Phase>, String> {
    let path = dir.join("sequential");
    let mib = bytes / TRANSFER_BYTES as u64;
    let write = timed("seq-write", || {
        let buf: Vec<u8> = (0..TRANSFER_BYTES).map(|i| (i * 7 + 1) as u8).collect();
        let mut f = File::create(&path).map_err(io("create", &path))?;
        for _ in 0..mib {
            f.write_all(&buf).map_err(io("write", &path))?;
        }
        f.sync_all().map_err(io("fsync", &path))?;
        Ok(mib)
    })?;
    drop_caches();
    let read = timed("seq-read", || {
        let mut buf = vec![0u8; TRANSFER_BYTES];
        let mut f = File::open(&path).map_err(io("open", &path))?;
        let mut total = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(io("read", &path))?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        if total != mib * TRANSFER_BYTES as u64 {
            return Err(format!(
                "read {total} bytes back of {}",
                mib * TRANSFER_BYTES as u64
            ));
        }
        Ok(mib)
    })?;
    fs::remove_file(&path).map_err(io("unlink", &path))?;
    Ok(vec![write, read])
}
