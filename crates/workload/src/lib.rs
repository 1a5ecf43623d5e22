//! Workloads that check tutti end to end, written once and run by every driver: the
//! deterministic simulator (over simulated nodes), `tutti chaos` and the crash tests (over
//! real processes). A workload generates operations as minitransactions, feeds a reference
//! model with how each one ended, and checks a final snapshot against that model. Nothing
//! here does I/O: a driver executes the minitransactions and hands back their outcomes.

pub mod bank;
pub mod fs;
pub mod log;

pub use bank::{Bank, BankOp, TransferKind};

use rand::RngCore;
use std::fmt;
use tutti_client::{ExecError, Minitx, Outcome};
use tutti_wire::NodeId;

/// An invariant that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which property: `atomicity`, `durability`, `serializability`, `isolation`,
    /// `liveness` or `protocol`; for the log, `write-once`, `lost append`, `stream` or
    /// `stream order`.
    pub kind: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(kind: &'static str, detail: impl Into<String>) -> Violation {
        Violation {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

/// A recovered node's bytes `read(addr, len)`, as [`Workload::check_node`] sees them.
pub type ReadNode<'a> = dyn Fn(u64, u32) -> Option<Vec<u8>> + 'a;

/// A workload, as every driver runs it:
/// 1. execute [`Workload::setup`] once (the simulator writes it into the initial images);
/// 2. for each operation of a client, execute the minitransaction of [`Workload::next`],
///    then hand its outcome to [`Workload::record`], which may return the operation's next
///    minitransaction (a compare-and-swap after its read);
/// 3. once faults have stopped and the cluster is idle, execute [`Workload::snapshot`] (or
///    read its items straight from the spaces) and pass the reads to [`Workload::check`].
pub trait Workload {
    /// What a client remembers about an operation between its minitransactions.
    type Op: fmt::Debug;

    /// Sets up the initial state; takes effect once (a second run changes nothing).
    fn setup(&self) -> Minitx;

    /// The first minitransaction of `client`'s next operation.
    fn next(&mut self, client: u64, rng: &mut dyn RngCore) -> (Self::Op, Minitx);

    /// Feeds the model with how a minitransaction of `op` ended; returns the operation's
    /// next minitransaction, or `None` when the operation is over.
    fn record(
        &mut self,
        client: u64,
        op: &mut Self::Op,
        ended: Result<&Outcome, &ExecError>,
        rng: &mut dyn RngCore,
    ) -> Option<Minitx>;

    /// Read items only: what [`Workload::check`] needs to see.
    fn snapshot(&self) -> Minitx;

    /// Checks the reads of [`Workload::snapshot`] (in item order) against the model.
    fn check(&self, snapshot: &[Vec<u8>]) -> Vec<Violation>;

    /// Checks one memory node's state right after it recovered, through `read(addr, len)`:
    /// whatever the model already knows committed on that node must be there. `read` gives
    /// `None` for bytes a minitransaction in flight there holds for writing (a tid its
    /// restart has not decided yet, or one whose decision is on its way): their value is
    /// still to come.
    fn check_node(&self, node: NodeId, read: &ReadNode<'_>) -> Vec<Violation>;
}
