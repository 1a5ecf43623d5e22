//! The little-endian, length-prefixed encoding every tango record and object update uses
//! (docs/objects.md, "Records"): fixed-width integers, and byte strings as a u32 length
//! followed by the bytes. Decoding never panics: a short or inconsistent buffer is `Malformed`.

/// Why bytes from the log could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed: {0}")]
pub struct Malformed(pub String);

/// Appends fields to a buffer.
#[derive(Default)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    pub fn u8(&mut self, v: u8) -> &mut Writer {
        self.bytes.push(v);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(&mut self, v: i64) -> &mut Writer {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A u32 length, then the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Writer {
        self.u32(v.len() as u32);
        self.bytes.extend_from_slice(v);
        self
    }

    /// 0 for none, else 1 and the bytes.
    pub fn opt_bytes(&mut self, v: Option<&[u8]>) -> &mut Writer {
        match v {
            None => self.u8(0),
            Some(v) => self.u8(1).bytes(v),
        }
    }

    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.bytes)
    }
}

/// Takes fields off the front of a buffer.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { rest: bytes }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Malformed> {
        if self.rest.len() < n {
            return Err(Malformed(format!(
                "{what}: {n} bytes wanted, {} left",
                self.rest.len()
            )));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, Malformed> {
        Ok(self.take(1, what)?[0])
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    pub fn i64(&mut self, what: &str) -> Result<i64, Malformed> {
        Ok(i64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    pub fn bytes(&mut self, what: &str) -> Result<&'a [u8], Malformed> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    pub fn opt_bytes(&mut self, what: &str) -> Result<Option<&'a [u8]>, Malformed> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => self.bytes(what).map(Some),
            other => Err(Malformed(format!("{what}: presence byte {other}"))),
        }
    }

    /// A count of items that each take at least `min_item_bytes`: refuses counts the
    /// buffer cannot hold, so that a corrupt count never allocates.
    pub fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize, Malformed> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_item_bytes.max(1)) > self.rest.len() {
            return Err(Malformed(format!(
                "{what}: {n} items in {} bytes",
                self.rest.len()
            )));
        }
        Ok(n)
    }

    /// The bytes not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    /// Fails unless every byte was read.
    pub fn end(&self, what: &str) -> Result<(), Malformed> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(Malformed(format!(
                "{what}: {} bytes left over",
                self.rest.len()
            )))
        }
    }
}
