//! The directory (Tango §3.2): an object at a fixed id that maps names to object ids and
//! kinds, hands out new ids, and records each object's forget position, below which the
//! runtime may trim the log. Its updates are keyed by name.

use crate::codec::{Malformed, Reader, Writer};
use crate::object::{Applied, Object};
use crate::objects::Kind;
use crate::record::Oid;
use crate::{planted, Bug};
use std::collections::BTreeMap;

/// The directory's object id (and stream).
pub const DIRECTORY_OID: Oid = 0;
/// The directory's own name, for its forget position; no object may take it.
pub const DIRECTORY_NAME: &str = ".";
/// Names are at most this long, in bytes.
pub const NAME_BYTES_MAX: usize = 255;

const CREATE: u8 = 1;
const FORGET: u8 = 2;

/// What the directory knows of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    pub oid: Oid,
    pub kind: Kind,
    /// Transactions writing the object append a decision record after their commit record,
    /// for clients that host it without their read sets (Tango §4.1).
    pub decisions: bool,
    /// History below this position may be given up (Tango §3.1, `forget`).
    pub forget: u64,
}

/// What creating a name found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// Created now, or created earlier with the same kind.
    Ready(Meta),
    /// The name stands for an object of another kind.
    OtherKind(Kind),
}

#[derive(Default, Debug)]
pub struct Directory {
    names: BTreeMap<String, Meta>,
    next_oid: Oid,
    /// The directory's own forget position.
    forget: u64,
}

impl Directory {
    pub fn get(&self, name: &str) -> Option<&Meta> {
        self.names.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = (&String, &Meta)> {
        self.names.iter()
    }

    pub fn name_of(&self, oid: Oid) -> Option<&str> {
        (self.names.iter()).find_map(|(n, m)| (m.oid == oid).then_some(n.as_str()))
    }

    /// The position below which every object, the directory included, gave up its
    /// history: the log may be trimmed there.
    pub fn trim_point(&self) -> u64 {
        let forgets = self.names.values().map(|m| m.forget);
        if planted(Bug::TrimBelowForget) {
            return forgets.fold(self.forget, u64::max);
        }
        forgets.fold(self.forget, u64::min)
    }

    pub fn create(kind: Kind, decisions: bool) -> Vec<u8> {
        vec![CREATE, kind.code(), u8::from(decisions)]
    }

    pub fn forget(position: u64) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(FORGET).u64(position);
        w.finish()
    }

    pub fn created(reply: &[u8]) -> Result<Created, Malformed> {
        let mut r = Reader::new(reply);
        let created = match r.u8("directory's reply")? {
            0 => Created::Ready(meta_decode(&mut r)?),
            1 => Created::OtherKind(kind_decode(r.u8("kind")?)?),
            other => return Err(Malformed(format!("directory reply {other}"))),
        };
        r.end("directory's reply")?;
        Ok(created)
    }
}

fn kind_decode(code: u8) -> Result<Kind, Malformed> {
    Kind::from_code(code).ok_or_else(|| Malformed(format!("object kind {code}")))
}

fn meta_encode(w: &mut Writer, m: &Meta) {
    w.u32(m.oid)
        .u8(m.kind.code())
        .u8(u8::from(m.decisions))
        .u64(m.forget);
}

fn meta_decode(r: &mut Reader<'_>) -> Result<Meta, Malformed> {
    Ok(Meta {
        oid: r.u32("object id")?,
        kind: kind_decode(r.u8("kind")?)?,
        decisions: r.u8("decisions")? == 1,
        forget: r.u64("forget position")?,
    })
}

fn name_decode(key: Option<&[u8]>) -> Result<String, Malformed> {
    let key = key.ok_or_else(|| Malformed("a directory update without a name".into()))?;
    if key.is_empty() || key.len() > NAME_BYTES_MAX {
        return Err(Malformed(format!("a name of {} bytes", key.len())));
    }
    String::from_utf8(key.to_vec()).map_err(|_| Malformed("a name that is not UTF-8".into()))
}

impl Object for Directory {
    fn apply(&mut self, key: Option<&[u8]>, update: &[u8], _: u64) -> Result<Applied, Malformed> {
        let name = name_decode(key)?;
        let mut r = Reader::new(update);
        let mut w = Writer::new();
        match r.u8("directory operation")? {
            CREATE if name == DIRECTORY_NAME => {
                return Err(Malformed(format!("a create of {DIRECTORY_NAME:?}")));
            }
            CREATE => {
                let kind = kind_decode(r.u8("kind")?)?;
                let decisions = r.u8("decisions")? == 1;
                r.end("directory's create")?;
                match self.names.get(&name) {
                    Some(m) if m.kind != kind => {
                        w.u8(1).u8(m.kind.code());
                    }
                    Some(m) => meta_encode(w.u8(0), m),
                    None => {
                        self.next_oid += 1;
                        let meta = Meta {
                            oid: DIRECTORY_OID + self.next_oid,
                            kind,
                            decisions,
                            forget: 0,
                        };
                        meta_encode(w.u8(0), &meta);
                        self.names.insert(name, meta);
                    }
                }
            }
            FORGET => {
                let position = r.u64("forget position")?;
                r.end("directory's forget")?;
                if name == DIRECTORY_NAME {
                    self.forget = self.forget.max(position);
                    return Ok(Applied::default());
                }
                let meta = (self.names.get_mut(&name))
                    .ok_or_else(|| Malformed(format!("forget of unknown name {name:?}")))?;
                meta.forget = meta.forget.max(position);
            }
            other => return Err(Malformed(format!("directory operation {other}"))),
        }
        Ok(Applied::reply(w.finish()))
    }

    fn checkpoint(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u32(self.next_oid).u64(self.forget);
        w.u32(self.names.len() as u32);
        for (name, meta) in &self.names {
            w.bytes(name.as_bytes());
            meta_encode(&mut w, meta);
        }
        w.finish()
    }

    fn restore(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let mut r = Reader::new(bytes);
        let next_oid = r.u32("directory's next id")?;
        let forget = r.u64("directory's forget")?;
        let mut names = BTreeMap::new();
        for _ in 0..r.count("directory's names", 18)? {
            let name = name_decode(Some(r.bytes("name")?))?;
            names.insert(name, meta_decode(&mut r)?);
        }
        r.end("directory's checkpoint")?;
        (self.next_oid, self.forget, self.names) = (next_oid, forget, names);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(d: &mut Directory, name: &str, kind: Kind) -> Result<Created, Malformed> {
        let reply = d.apply(Some(name.as_bytes()), &Directory::create(kind, false), 0)?;
        Directory::created(&reply.reply)
    }

    #[test]
    fn names_get_new_ids_once_and_keep_their_kind() {
        let mut d = Directory::default();
        let Created::Ready(a) = create(&mut d, "a", Kind::Map).unwrap() else {
            panic!("created")
        };
        let Created::Ready(b) = create(&mut d, "b", Kind::Queue).unwrap() else {
            panic!("created")
        };
        assert_ne!(a.oid, DIRECTORY_OID);
        assert_ne!(a.oid, b.oid);
        assert_eq!(create(&mut d, "a", Kind::Map).unwrap(), Created::Ready(a));
        assert_eq!(
            create(&mut d, "a", Kind::Counter).unwrap(),
            Created::OtherKind(Kind::Map)
        );
        assert!(create(&mut d, DIRECTORY_NAME, Kind::Map).is_err());
        assert!(create(&mut d, "", Kind::Map).is_err());
    }

    #[test]
    fn the_trim_point_is_the_lowest_forget_position_the_directorys_included() {
        let mut d = Directory::default();
        create(&mut d, "a", Kind::Map).unwrap();
        create(&mut d, "b", Kind::Map).unwrap();
        let forget = |d: &mut Directory, name: &str, p: u64| {
            d.apply(Some(name.as_bytes()), &Directory::forget(p), 0)
                .unwrap();
        };
        forget(&mut d, "a", 50);
        forget(&mut d, "b", 70);
        assert_eq!(d.trim_point(), 0);
        forget(&mut d, DIRECTORY_NAME, 90);
        assert_eq!(d.trim_point(), 50);
        forget(&mut d, "a", 10);
        assert_eq!(d.trim_point(), 50, "forget positions only grow");
        let mut restored = Directory::default();
        restored.restore(&d.checkpoint()).unwrap();
        assert_eq!(restored.trim_point(), 50);
        assert_eq!(restored.get("b"), d.get("b"));
    }
}
