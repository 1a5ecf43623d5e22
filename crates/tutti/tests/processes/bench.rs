//! `tutti bench minitx --quick` runs on scratch clusters and writes valid records (no
//! wall-clock number is checked: benchmarks never gate CI), and a `ram` node keeps to the
//! core's memory target.

#![cfg(feature = "bench")]

use crate::common;

use tutti_bench::Point;

#[test]
fn bench_minitx_quick_writes_valid_json() {
    let dir = common::scratch("bench");
    let out = dir.join("fig16.json");
    let status = std::process::Command::new(common::exe())
        .args(["bench", "minitx", "--quick", "--out"])
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let points: Vec<Point> = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(
        points.len(),
        2 * 2 * 3,
        "ram and log, 1PC and 2PC, 3 outstanding counts"
    );
    for p in &points {
        assert_eq!(
            (p.experiment.as_str(), p.system.as_str()),
            ("fig16", "tutti")
        );
        assert!(p.committed > 0 && p.throughput_per_s > 0.0, "{p:?}");
        assert!(p.p50_us > 0.0 && p.p99_us >= p.p50_us, "{p:?}");
        assert!(p.max_us >= p.p999_us && p.p999_us >= p.p99_us, "{p:?}");
    }
}

#[test]
fn bench_minitx_takes_a_connection_count_and_refuses_zero() {
    let run = |connections: &str| {
        std::process::Command::new(common::exe())
            .args(["bench", "minitx", "--mode", "ram", "--layout", "1pc"])
            .args(["--outstanding", "16", "--seconds", "0.5"])
            .args(["--connections", connections])
            .output()
            .unwrap()
    };
    let one = run("1");
    assert!(one.status.success());
    let points: Vec<Point> = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(points.len(), 1);
    assert!(points[0].committed > 0, "{:?}", points[0]);
    let zero = run("0");
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--connections"));
}

/// The core's memory target for `ram` nodes, read as `tutti bench all` reads it: from the
/// resident set the node reports in its statistics.
#[test]
fn a_ram_node_holds_no_more_than_the_bytes_written_plus_64_mib() {
    let rt = common::runtime();
    let _in_rt = rt.enter();
    let c = common::start("memory-ram", 1, "ram", &[], &[]);
    rt.block_on(async {
        let cluster = common::ready(&c).await;
        let written = 48 << 20;
        let points = tutti_bench::memory::ram(&cluster, 1, written)
            .await
            .expect("memory points");
        let rss: Vec<u64> = points.iter().map(|p| p.rss_bytes.unwrap()).collect();
        for p in &points {
            assert!(p.rss_bytes <= p.limit_bytes, "{p:?}");
        }
        // The reading is real: the node holds most of what was written.
        assert!(rss[1] >= rss[0] + written * 3 / 4, "{rss:?}");
    });
}

#[test]
fn bench_fs_quick_measures_tutti_and_the_local_disk() {
    let dir = common::scratch("bench-fs");
    let status = std::process::Command::new(common::exe())
        .args([
            "bench",
            "fs",
            "--quick",
            "--systems",
            "tutti,local",
            "--only",
            "metadata,two-mounts",
            "--out",
        ])
        .arg(&*dir)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let points: Vec<Point> =
        serde_json::from_slice(&std::fs::read(dir.join("results/fs.json")).unwrap()).unwrap();
    let ops = |system: &str, variant: Option<&str>| -> Vec<String> {
        (points.iter())
            .filter(|p| p.system == system && p.variant.as_deref() == variant)
            .map(|p| p.operation.clone().unwrap())
            .collect()
    };
    assert_eq!(ops("local", None), ["create", "stat", "unlink"]);
    assert_eq!(ops("tutti", None), ["create", "stat", "unlink"]);
    assert_eq!(
        ops("tutti", Some("two-mounts")),
        ["create", "stat", "unlink"]
    );
    for p in &points {
        assert!(p.committed == 1000 && p.throughput_per_s > 0.0, "{p:?}");
    }
    let md = std::fs::read_to_string(dir.join("RESULTS.md")).unwrap();
    assert!(md.contains("## File system (`tutti bench fs`)"), "{md}");
    assert!(!md.contains("tutti / juicefs"), "no JuiceFS was run: {md}");
}
