//! The minitransaction builder and its outcome.

use crate::ExecError;
use tutti_wire::{CmpOp, Item, Limits, NodeId, CLASS_BYTES_MAX};

/// Items of one minitransaction, each addressed by (memory node, address). Reads and
/// compares see the state before the minitransaction; writes and adds apply in item order
/// iff every compare holds.
#[derive(Clone, Debug, Default)]
pub struct Minitx {
    pub(crate) items: Vec<(NodeId, Item)>,
    class: Option<String>,
}

impl Minitx {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn read(mut self, node: NodeId, addr: u64, len: u32) -> Self {
        self.items.push((node, Item::Read { addr, len }));
        self
    }

    /// Equality compare of `bytes` with the stored bytes.
    pub fn compare(self, node: NodeId, addr: u64, bytes: Vec<u8>) -> Self {
        self.compare_op(node, addr, CmpOp::Eq, bytes)
    }

    /// Ordered compare of the stored little-endian u64 with `value`: `stored op value`.
    pub fn compare_u64(self, node: NodeId, addr: u64, op: CmpOp, value: u64) -> Self {
        self.compare_op(node, addr, op, value.to_le_bytes().to_vec())
    }

    fn compare_op(mut self, node: NodeId, addr: u64, op: CmpOp, bytes: Vec<u8>) -> Self {
        self.items.push((node, Item::Compare { addr, op, bytes }));
        self
    }

    pub fn write(mut self, node: NodeId, addr: u64, bytes: Vec<u8>) -> Self {
        self.items.push((node, Item::Write { addr, bytes }));
        self
    }

    /// Atomic wrapping add to the little-endian i64 at `addr`.
    pub fn add(mut self, node: NodeId, addr: u64, delta: i64) -> Self {
        self.items.push((node, Item::Add { addr, delta }));
        self
    }

    /// Names the class this minitransaction is counted under in load statistics.
    pub fn class(mut self, name: &str) -> Self {
        self.class = Some(name.to_string());
        self
    }

    pub(crate) fn class_name(&self) -> &str {
        self.class.as_deref().unwrap_or("default")
    }

    pub fn items(&self) -> &[(NodeId, Item)] {
        &self.items
    }

    pub(crate) fn check(&self, limits: &Limits) -> Result<(), ExecError> {
        if let Some(i) = self.items.iter().position(|(node, _)| *node == 0) {
            return Err(ExecError::Invalid(format!("item {i}: node ids start at 1")));
        }
        if self.class_name().len() > CLASS_BYTES_MAX {
            return Err(ExecError::Invalid(format!(
                "class name longer than {CLASS_BYTES_MAX} bytes"
            )));
        }
        limits
            .check(self.items.iter().map(|(_, item)| item))
            .map_err(ExecError::Invalid)
    }
}

/// What a minitransaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub committed: bool,
    /// Data of the read items, in item order (also when a compare failed).
    pub reads: Vec<Vec<u8>>,
    /// Positions, among all items of the minitransaction, of the compares that failed.
    pub failed_compares: Vec<usize>,
}
