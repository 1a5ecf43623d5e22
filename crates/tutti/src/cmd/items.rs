//! Ad-hoc minitransaction items from the shell: `read:NODE:ADDR:LEN`, `cmp:NODE:ADDR:HEX`,
//! `cmpop:NODE:ADDR:OP:U64`, `write:NODE:ADDR:HEX`, `add:NODE:ADDR:I64`; addresses are
//! decimal or 0x-hex.

use tutti_client::Minitx;
use tutti_wire::{CmpOp, NodeId};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("item {index} ({text:?}): {reason}")]
pub struct ItemError {
    pub index: usize,
    pub text: String,
    pub reason: String,
}

pub fn parse_items(texts: &[String]) -> Result<Minitx, ItemError> {
    let mut tx = Minitx::new();
    for (index, text) in texts.iter().enumerate() {
        tx = parse_item(tx, text).map_err(|reason| ItemError {
            index,
            text: text.clone(),
            reason,
        })?;
    }
    Ok(tx)
}

fn parse_item(tx: Minitx, text: &str) -> Result<Minitx, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let want = |n: usize, form: &str| {
        if parts.len() == n {
            Ok(())
        } else {
            Err(format!("expected {form}"))
        }
    };
    match parts[0] {
        "read" => {
            want(4, "read:NODE:ADDR:LEN")?;
            let len = parts[3].parse::<u32>().map_err(|e| format!("LEN: {e}"))?;
            Ok(tx.read(node(parts[1])?, addr(parts[2])?, len))
        }
        "cmp" => {
            want(4, "cmp:NODE:ADDR:HEX")?;
            Ok(tx.compare(node(parts[1])?, addr(parts[2])?, hex(parts[3])?))
        }
        "cmpop" => {
            want(5, "cmpop:NODE:ADDR:OP:U64 with OP one of eq ne lt le gt ge")?;
            let op = CmpOp::parse(parts[3]).ok_or("OP must be one of eq ne lt le gt ge")?;
            let value = parts[4].parse::<u64>().map_err(|e| format!("U64: {e}"))?;
            Ok(tx.compare_u64(node(parts[1])?, addr(parts[2])?, op, value))
        }
        "write" => {
            want(4, "write:NODE:ADDR:HEX")?;
            Ok(tx.write(node(parts[1])?, addr(parts[2])?, hex(parts[3])?))
        }
        "add" => {
            want(4, "add:NODE:ADDR:I64")?;
            let delta = parts[3].parse::<i64>().map_err(|e| format!("I64: {e}"))?;
            Ok(tx.add(node(parts[1])?, addr(parts[2])?, delta))
        }
        other => Err(format!(
            "unknown item kind {other:?}; use read, cmp, cmpop, write or add"
        )),
    }
}

fn node(s: &str) -> Result<NodeId, String> {
    match s.parse::<NodeId>() {
        Ok(0) => Err("NODE: node ids start at 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("NODE: {e}")),
    }
}

fn addr(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse::<u64>(),
    };
    parsed.map_err(|e| format!("ADDR: {e}"))
}

pub fn hex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) || s.is_empty() {
        return Err("HEX: an even, non-zero number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16)
                .map_err(|_| format!("HEX: bad digits {:?}", &s[i..i + 2]))
        })
        .collect()
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
