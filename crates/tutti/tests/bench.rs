//! `tutti bench minitx --quick` runs on scratch clusters and writes valid records (no
//! wall-clock number is checked: benchmarks never gate CI).

mod common;

use tutti::bench::Point;

#[test]
fn bench_minitx_quick_writes_valid_json() {
    let dir = common::scratch("bench");
    std::fs::create_dir_all(&dir).unwrap();
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
    }
    std::fs::remove_dir_all(&dir).unwrap();
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
