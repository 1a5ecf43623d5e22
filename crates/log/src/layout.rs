//! Where a log lives on its memory nodes: on each node a region (a header of control words,
//! then the slots), and the deterministic map from a position to its node and slot (CORFU's
//! round robin: position p is on node p mod N, in slot (p div N) mod slots-per-node).

use tutti_wire::NodeId;

/// Bytes of a region's header: the control words, padded so that slots start on a page.
pub const REGION_HEADER_BYTES: u64 = 4096;
/// The first word of every region: "TUTTILOG" in ASCII.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TUTTILOG");
/// Smallest slot: an entry header with a few streams and some payload.
pub const SLOT_BYTES_MIN: u32 = 256;
/// Largest slot: one minitransaction item.
pub const SLOT_BYTES_MAX: u32 = 1 << 20;
pub const SLOT_BYTES_DEFAULT: u32 = 4096;
/// Backpointers each stream header carries (Tango §5: K = 4 by default).
pub const BACKPOINTERS_DEFAULT: u8 = 4;
pub const BACKPOINTERS_MAX: u8 = 16;

/// Offsets of the little-endian u64 control words in a region's header. The same words are
/// on every node of the log and change only by minitransactions over all of them at once.
pub mod word {
    /// `MAGIC` once the log is created.
    pub const MAGIC: u64 = 0;
    /// The log's epoch: appends and fills are accepted only in it. A seal raises it.
    pub const EPOCH: u64 = 8;
    /// Positions below it are trimmed; their slots may take new positions.
    pub const TRIM: u64 = 16;
    /// The sequencer of the current epoch had handed out every position below this when it
    /// last reserved: the tail is at least this.
    pub const RESERVED_FROM: u64 = 24;
    /// No sequencer ever handed out a position at or above this.
    pub const RESERVED_TO: u64 = 32;
    /// The layout, for anyone reading the region without the manager: slot bytes (u32),
    /// backpointers (u8), three zero bytes, then slots per node (u64).
    pub const LAYOUT: u64 = 40;
    /// Where the words end.
    pub const END: u64 = 56;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("a log needs at least one memory node")]
    NoNodes,
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    #[error(
        "slot size {0} bytes is outside {SLOT_BYTES_MIN}..={SLOT_BYTES_MAX} or not a multiple of 8"
    )]
    SlotBytes(u32),
    #[error("{0} backpointers per stream; a log keeps 1 to {BACKPOINTERS_MAX}")]
    Backpointers(u8),
    #[error("the region's parameters are not a log's layout ({0} bytes)")]
    Params(usize),
    #[error("capacity {capacity} bytes per node holds no slot of {slot_bytes} bytes after the {REGION_HEADER_BYTES}-byte header")]
    Capacity { capacity: u64, slot_bytes: u32 },
}

/// A log's shape, fixed at creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLayout {
    /// The memory nodes striped over, in position order, each with its region's address.
    pub nodes: Vec<(NodeId, u64)>,
    pub slot_bytes: u32,
    pub slots_per_node: u64,
    /// Backpointers per stream header (Tango's K).
    pub backpointers: u8,
}

/// Where one position's slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub node: NodeId,
    /// Address of the slot's first byte.
    pub addr: u64,
    /// Address of its node's region header.
    pub header: u64,
}

impl LogLayout {
    /// The number of slots per node that `capacity_bytes` (the region, header included)
    /// holds, checking every other parameter.
    pub fn slots_for(
        nodes: &[NodeId],
        slot_bytes: u32,
        capacity_bytes: u64,
        backpointers: u8,
    ) -> Result<u64, LayoutError> {
        if nodes.is_empty() {
            return Err(LayoutError::NoNodes);
        }
        for (i, n) in nodes.iter().enumerate() {
            if nodes[..i].contains(n) {
                return Err(LayoutError::DuplicateNode(*n));
            }
        }
        if !(SLOT_BYTES_MIN..=SLOT_BYTES_MAX).contains(&slot_bytes) || !slot_bytes.is_multiple_of(8)
        {
            return Err(LayoutError::SlotBytes(slot_bytes));
        }
        if backpointers == 0 || backpointers > BACKPOINTERS_MAX {
            return Err(LayoutError::Backpointers(backpointers));
        }
        let slots = capacity_bytes.saturating_sub(REGION_HEADER_BYTES) / u64::from(slot_bytes);
        if slots == 0 {
            return Err(LayoutError::Capacity {
                capacity: capacity_bytes,
                slot_bytes,
            });
        }
        Ok(slots)
    }

    /// Bytes of each node's region.
    pub fn region_bytes(&self) -> u64 {
        REGION_HEADER_BYTES + self.slots_per_node * u64::from(self.slot_bytes)
    }

    /// Positions that share a slot are this far apart: the log's capacity in entries.
    pub fn period(&self) -> u64 {
        self.nodes.len() as u64 * self.slots_per_node
    }

    pub fn slot(&self, position: u64) -> Slot {
        let n = self.nodes.len() as u64;
        let (node, base) = self.nodes[(position % n) as usize];
        let index = (position / n) % self.slots_per_node;
        Slot {
            node,
            addr: base + REGION_HEADER_BYTES + index * u64::from(self.slot_bytes),
            header: base,
        }
    }

    /// The layout of a log whose region (from the manager) is on `nodes` with the `LAYOUT`
    /// word's bytes as its parameters.
    pub fn from_region(nodes: Vec<(NodeId, u64)>, params: &[u8]) -> Result<LogLayout, LayoutError> {
        let bytes: [u8; 16] = params
            .try_into()
            .map_err(|_| LayoutError::Params(params.len()))?;
        let layout = LogLayout {
            nodes,
            slot_bytes: u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")),
            slots_per_node: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
            backpointers: bytes[4],
        };
        let ids: Vec<NodeId> = layout.nodes.iter().map(|(n, _)| *n).collect();
        let capacity = layout.region_bytes();
        LogLayout::slots_for(&ids, layout.slot_bytes, capacity, layout.backpointers)?;
        Ok(layout)
    }

    /// The `LAYOUT` word's 16 bytes.
    pub fn layout_word(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(16);
        w.extend_from_slice(&self.slot_bytes.to_le_bytes());
        w.extend_from_slice(&[self.backpointers, 0, 0, 0]);
        w.extend_from_slice(&self.slots_per_node.to_le_bytes());
        w
    }
}

/// Two nodes at address 0 with 4 backpointers: even positions on node 1, odd on node 2
/// (the other modules' tests).
#[cfg(test)]
pub(crate) fn two_nodes(slot_bytes: u32, slots_per_node: u64) -> LogLayout {
    LogLayout {
        nodes: vec![(1, 0), (2, 0)],
        slot_bytes,
        slots_per_node,
        backpointers: 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> LogLayout {
        LogLayout {
            nodes: vec![(3, 1 << 30), (1, 1 << 20), (2, 0)],
            slot_bytes: 4096,
            slots_per_node: 5,
            backpointers: 4,
        }
    }

    #[test]
    fn positions_go_round_robin_and_wrap_after_a_period() {
        let l = layout();
        assert_eq!(l.period(), 15);
        let s = |p| {
            let s = l.slot(p);
            (s.node, s.addr)
        };
        assert_eq!(s(0), (3, (1 << 30) + 4096));
        assert_eq!(s(1), (1, (1 << 20) + 4096));
        assert_eq!(s(2), (2, 4096));
        assert_eq!(s(3), (3, (1 << 30) + 8192));
        assert_eq!(s(14), (2, 4096 + 4 * 4096));
        assert_eq!(s(15), s(0));
        assert_eq!(l.slot(14).header, 0);
        let mut seen = std::collections::HashSet::new();
        for p in 0..15 {
            assert!(
                seen.insert(s(p)),
                "position {p} shares a slot within a period"
            );
            let slot = l.slot(p);
            assert!(slot.addr + 4096 <= slot.header + l.region_bytes());
        }
    }

    #[test]
    fn bad_shapes_are_refused_with_the_reason() {
        assert_eq!(
            LogLayout::slots_for(&[], 4096, 1 << 20, 4),
            Err(LayoutError::NoNodes)
        );
        assert_eq!(
            LogLayout::slots_for(&[1, 2, 1], 4096, 1 << 20, 4),
            Err(LayoutError::DuplicateNode(1))
        );
        assert_eq!(
            LogLayout::slots_for(&[1], 100, 1 << 20, 4),
            Err(LayoutError::SlotBytes(100))
        );
        assert_eq!(
            LogLayout::slots_for(&[1], (1 << 20) + 8, 1 << 30, 4),
            Err(LayoutError::SlotBytes((1 << 20) + 8))
        );
        assert_eq!(
            LogLayout::slots_for(&[1], 4096, 1 << 20, 0),
            Err(LayoutError::Backpointers(0))
        );
        assert!(matches!(
            LogLayout::slots_for(&[1], 4096, 8000, 4),
            Err(LayoutError::Capacity { .. })
        ));
        assert_eq!(LogLayout::slots_for(&[1, 2], 4096, 4096 * 11, 4), Ok(10));
        assert_eq!(
            LogLayout::from_region(layout().nodes, &layout().layout_word()),
            Ok(layout())
        );
        assert_eq!(
            LogLayout::from_region(layout().nodes, &[1, 2]),
            Err(LayoutError::Params(2))
        );
    }
}
