//! Size limits of a minitransaction, checked by the client before sending and by each
//! memory node on receipt, with the same rules and messages on both sides.

use crate::message::{CmpOp, Item};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub item_bytes_max: u64,
    pub minitx_bytes_max: u64,
    pub items_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            item_bytes_max: 1 << 20,
            minitx_bytes_max: 16 << 20,
            items_max: 4096,
        }
    }
}

impl Limits {
    /// Checks the shape of `items` (count, each item's length and operand, total bytes;
    /// addresses are the memory node's to check). The message names the first bad item.
    pub fn check<'a>(&self, items: impl ExactSizeIterator<Item = &'a Item>) -> Result<(), String> {
        if items.len() == 0 || items.len() > self.items_max {
            return Err(format!(
                "{} items; a minitransaction has 1 to {}",
                items.len(),
                self.items_max
            ));
        }
        let mut total = 0u64;
        for (i, item) in items.enumerate() {
            let len = item.len();
            if len == 0 || len > self.item_bytes_max {
                return Err(format!(
                    "item {i}: {len} bytes, outside 1..={}",
                    self.item_bytes_max
                ));
            }
            if let Item::Compare { op, bytes, .. } = item {
                if *op != CmpOp::Eq && bytes.len() != 8 {
                    return Err(format!("item {i}: ordered compares take an 8-byte operand"));
                }
            }
            total += len;
        }
        if total > self.minitx_bytes_max {
            return Err(format!(
                "items total {total} bytes, over the limit of {}",
                self.minitx_bytes_max
            ));
        }
        Ok(())
    }
}
