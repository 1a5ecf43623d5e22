//! Physical limits measured in the same run as the systems: the round trip of a 64-byte
//! request and response over loopback TCP (1 connection, and 16 connections at once), and
//! the latency of a 4 KiB write followed by fdatasync on the data disk (one stream, and
//! four at once, as the four logs of the 2PC layout share the disk).

use super::{Latencies, Point};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MESSAGE_BYTES: usize = 64;
/// Bytes each fdatasync probe file may grow to (and is preallocated with).
const PROBE_BYTES: u64 = 64 << 20;

fn limit(mode: &str, outstanding: usize, ops: u64, elapsed: Duration, lat: &Latencies) -> Point {
    Point::new("limits", "limit", mode, 1, 1, outstanding).measured(ops, elapsed, lat)
}

/// Ping-pong of 64-byte messages on `connections` loopback connections for `duration`. The
/// echo server runs on its own thread and event loop, as a server process would.
pub async fn loopback(connections: usize, duration: Duration) -> std::io::Result<Point> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("echo runtime");
        rt.block_on(async move {
            let listener = TcpListener::from_std(listener).expect("echo listener");
            let accept = async {
                while let Ok((mut s, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        s.set_nodelay(true).ok();
                        let mut buf = [0u8; MESSAGE_BYTES];
                        while s.read_exact(&mut buf).await.is_ok() {
                            if s.write_all(&buf).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            };
            tokio::select! {
                _ = accept => {}
                _ = stopped => {}
            }
        });
    });
    let start = Instant::now();
    let until = start + duration;
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let mut s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        tasks.push(tokio::spawn(async move {
            let mut lat = Latencies::new();
            let mut buf = [7u8; MESSAGE_BYTES];
            while Instant::now() < until {
                let t0 = Instant::now();
                s.write_all(&buf).await?;
                s.read_exact(&mut buf).await?;
                lat.record(t0.elapsed());
            }
            Ok::<_, std::io::Error>(lat)
        }));
    }
    let mut lat = Latencies::new();
    for t in tasks {
        lat.add(&t.await.expect("echo client")?);
    }
    let _ = stop.send(());
    let _ = server.join();
    Ok(limit(
        "loopback-rtt-64B",
        connections,
        lat.count(),
        start.elapsed(),
        &lat,
    ))
}

/// 4 KiB appends to a new file in `dir`, each followed by fdatasync, for `duration`; the
/// same on a preallocated file (what a redo log that zero-extends ahead pays); and on four
/// preallocated files at once, one thread each (`outstanding` 4).
pub fn fdatasync(dir: &Path, duration: Duration) -> std::io::Result<Vec<Point>> {
    let mut points = Vec::new();
    for (mode, preallocated, streams) in [
        ("fdatasync-4KiB-append", false, 1),
        ("fdatasync-4KiB-preallocated", true, 1),
        ("fdatasync-4KiB-preallocated", true, 4),
    ] {
        let paths: Vec<_> = (0..streams)
            .map(|i| dir.join(format!("fdatasync-probe-{i}")))
            .collect();
        let files = (paths.iter())
            .map(|path| probe_file(path, preallocated))
            .collect::<std::io::Result<Vec<_>>>()?;
        let start = Instant::now();
        let lat = std::thread::scope(|scope| {
            let streams: Vec<_> = (files.into_iter())
                .map(|file| scope.spawn(move || sync_stream(file, start + duration)))
                .collect();
            let mut lat = Latencies::new();
            for stream in streams {
                lat.add(&stream.join().expect("fdatasync stream")?);
            }
            Ok::<_, std::io::Error>(lat)
        })?;
        points.push(limit(mode, streams, lat.count(), start.elapsed(), &lat));
        for path in paths {
            std::fs::remove_file(path)?;
        }
    }
    Ok(points)
}

/// A new file at `path`; `preallocated`: 64 MiB of zeros written and synced.
fn probe_file(path: &Path, preallocated: bool) -> std::io::Result<std::fs::File> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)?;
    if preallocated {
        file.write_all(&vec![0u8; PROBE_BYTES as usize])?;
        file.sync_all()?;
    }
    Ok(file)
}

/// Writes and syncs 4 KiB blocks one after another from the start of `file` until `until`.
fn sync_stream(file: std::fs::File, until: Instant) -> std::io::Result<Latencies> {
    let block = vec![0xA5u8; 4096];
    let mut lat = Latencies::new();
    let mut offset = 0u64;
    while Instant::now() < until && offset < PROBE_BYTES {
        let t0 = Instant::now();
        file.write_all_at(&block, offset)?;
        file.sync_data()?;
        lat.record(t0.elapsed());
        offset += block.len() as u64;
    }
    Ok(lat)
}
