//! The cross-process tests: real `tutti` processes on loopback, killed with `kill -9`,
//! partitioned and restarted. One test binary with a module per subject, so that CI links
//! one binary instead of nineteen; `cargo test -p tutti --test processes crash::` runs one
//! module.

mod backup;
mod bank;
mod bench;
mod common;
mod crash;
mod faults;
mod fs;
mod fs_chaos;
mod growth;
mod linearizability;
mod log;
mod log_chaos;
mod log_client;
mod managers;
mod namespace;
mod objects;
mod objects_chaos;
mod replication;
mod semantics;
mod up;
