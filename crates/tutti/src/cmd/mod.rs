//! One module per `tutti` command: its arguments and what it does. Protocols, workloads
//! and benchmarks live in their crates; these only parse, call and print.

pub(crate) mod args;
pub(crate) mod backup;
pub(crate) mod bench;
pub(crate) mod chaos;
pub(crate) mod fs;
pub(crate) mod fs_workload;
mod items;
pub(crate) mod log;
pub(crate) mod log_workload;
pub(crate) mod manager;
pub(crate) mod managers;
pub(crate) mod memnode;
pub(crate) mod node;
pub(crate) mod ns;
pub(crate) mod obj;
pub(crate) mod objects_workload;
pub(crate) mod out;
pub(crate) mod sequencer;
pub(crate) mod sim;
pub(crate) mod stats;
pub(crate) mod tls;
pub(crate) mod token;
pub(crate) mod txn;
pub(crate) mod up;
pub(crate) mod workload;
