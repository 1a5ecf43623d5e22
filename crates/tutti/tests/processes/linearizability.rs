//! The Porcupine checker's own tests (`tools/linearizability`, Go): hand-written histories
//! that are and are not linearizable, with unknown and aborted outcomes. The chaos test in
//! `crash.rs` runs the checker on a real history and on a corrupted copy of it.

#[test]
fn the_history_checker_passes_its_go_tests() {
    let dir = tutti_harness::chaos::default_checker();
    let out = std::process::Command::new("go")
        .args(["test", "./..."])
        .current_dir(&dir)
        .output()
        .expect("`go` is on the PATH");
    assert!(
        out.status.success(),
        "go test in {}:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
