//! The `tutti` command line as a library: starting a local cluster of real processes
//! (`local`), parsing ad-hoc minitransaction items (`items`), the bank and register
//! workloads used by crash tests (`bank`, `registers`), failure injection against real
//! processes with a partitioning proxy (`chaos`, `proxy`) and the minitransaction benchmark
//! (`bench`). `main.rs` is the CLI.

pub mod bank;
pub mod bench;
pub mod chaos;
pub mod items;
pub mod local;
pub mod proxy;
pub mod registers;
