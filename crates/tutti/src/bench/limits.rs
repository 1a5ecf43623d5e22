//! Physical limits measured in the same run as the systems: the round trip of a 64-byte
//! request and response over loopback TCP (1 connection, and 16 connections at once), and
//! the latency of a 4 KiB append followed by fdatasync on the data disk.

use super::{Latencies, Point};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MESSAGE_BYTES: usize = 64;

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

/// 4 KiB appends to a new file in `dir`, each followed by fdatasync, for `duration`; and the
/// same on a preallocated file (what a redo log that zero-extends ahead pays).
pub fn fdatasync(dir: &Path, duration: Duration) -> std::io::Result<Vec<Point>> {
    let mut points = Vec::new();
    for preallocated in [false, true] {
        let path = dir.join("fdatasync-probe");
        let _ = std::fs::remove_file(&path);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        let block = vec![0xA5u8; 4096];
        if preallocated {
            file.write_all(&vec![0u8; 64 << 20])?;
            file.sync_all()?;
        }
        let start = Instant::now();
        let mut lat = Latencies::new();
        let mut offset = 0u64;
        while start.elapsed() < duration && offset < 64 << 20 {
            let t0 = Instant::now();
            file.write_all_at(&block, offset)?;
            file.sync_data()?;
            lat.record(t0.elapsed());
            offset += block.len() as u64;
        }
        let mode = if preallocated {
            "fdatasync-4KiB-preallocated"
        } else {
            "fdatasync-4KiB-append"
        };
        points.push(limit(mode, 1, lat.count(), start.elapsed(), &lat));
        drop(file);
        std::fs::remove_file(&path)?;
    }
    Ok(points)
}
