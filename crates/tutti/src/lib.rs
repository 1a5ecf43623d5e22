//! The `tutti` command line as a library: starting a local cluster of real processes
//! (`local`), parsing ad-hoc minitransaction items (`items`), the bank workload used by
//! crash tests (`bank`), failure injection against real processes (`chaos`) and the
//! minitransaction benchmark (`bench`). `main.rs` is the CLI.

pub mod bank;
pub mod bench;
pub mod chaos;
pub mod items;
pub mod local;
