//! What an object is to the runtime (Tango §3.1): a view that only `apply` changes, one
//! committed update at a time, and that can be checkpointed and restored.

use crate::codec::Malformed;
use std::any::Any;

/// What applying one update did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// For the mutator that wrote the update (a dequeued item, a znode's new version, an
    /// error code): opaque to the runtime.
    pub reply: Vec<u8>,
    /// The update removed its key from the view: the runtime drops the key's version.
    pub key_removed: bool,
}

impl Applied {
    pub fn reply(reply: Vec<u8>) -> Applied {
        Applied {
            reply,
            key_removed: false,
        }
    }
}

/// A view of one object. `apply` is the only way it changes; it is called with every
/// committed update of the object in log order, on every client that hosts it, and must be
/// deterministic. It gets bytes from the log, which anyone may have written: it never
/// panics on them, it returns `Malformed` and leaves the view as it was.
pub trait Object: Any + Send {
    fn apply(
        &mut self,
        key: Option<&[u8]>,
        update: &[u8],
        position: u64,
    ) -> Result<Applied, Malformed>;
    /// The view as bytes, for `restore` on another client.
    fn checkpoint(&self) -> Vec<u8>;
    /// Replaces the view by a checkpoint's.
    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed>;
}
