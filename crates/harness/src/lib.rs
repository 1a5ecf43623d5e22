//! Everything that runs tutti as real processes, shared by `tutti up`, `tutti chaos`, the
//! cross-process tests and the bench: the supervisor of every child process
//! (`supervisor`), local clusters (`local`), the fault-injecting proxy (`proxy`), the driver of `tutti-workload`'s workloads over a real
//! cluster (`workload`), the register workload with its histories and Porcupine check
//! (`registers`), the shared log's client processes and final check (`log_workload`), Tango's objects'
//! (`objects_workload`), tutti-fs's mounts and workers (`fs_workload`), and the chaos engine
//! (`chaos`, with the backups it takes: `chaos_backups`). Internal: not published.

pub mod chaos;
pub mod chaos_backups;
pub mod fs_workload;
pub mod local;
pub mod log_workload;
pub mod objects_workload;
pub mod proxy;
pub mod registers;
pub mod supervisor;
pub mod workload;

/// The root of the source tree this was built from, where `tools/` and `bench/` are.
pub fn source_tree() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/harness sits two levels below the workspace root")
}
