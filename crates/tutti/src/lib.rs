//! The `tutti` command line as a library: starting a local cluster of real processes
//! (`local`), parsing ad-hoc minitransaction items (`items`), the register workload and the
//! driver of `tutti-workload`'s workloads over a real cluster (`registers`, `workload`),
//! failure injection against real processes with a partitioning proxy (`chaos`, `proxy`)
//! and the minitransaction benchmark (`bench`). `main.rs` is the CLI.

pub mod bench;
pub mod chaos;
pub mod items;
pub mod local;
pub mod proxy;
pub mod registers;
pub mod workload;

/// The root of the source tree this binary was built from, where `tools/` and `bench/` are.
pub fn source_tree() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/tutti sits two levels below the workspace root")
}
