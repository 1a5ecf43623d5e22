//! The registry of regions: named ranges of the memory nodes' address spaces that the layers
//! above the core (shared logs first) are given, each with an epoch that its one active
//! holder takes. Regions are allocated from the top of each node's space downwards, so that
//! raw addresses from 0 up (`tutti txn`, the chaos bank) stay the user's; they are never
//! freed or moved.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tutti_wire::{ErrorCode, NodeId, RegionInfo, Response};

/// Regions start on a page.
const ALIGN: u64 = 4096;
/// Longest region name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct Regions {
    by_name: BTreeMap<String, Region>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Region {
    kind: String,
    nodes: Vec<(NodeId, u64)>,
    bytes_per_node: u64,
    params: Vec<u8>,
    epoch: u64,
    holder: Option<String>,
}

fn error(code: ErrorCode, message: String) -> Response {
    Response::Error { code, message }
}

impl Regions {
    /// The registry that lists `infos` (what `Request::Regions` answered).
    pub(crate) fn from_infos(infos: &[RegionInfo]) -> Regions {
        let by_name = (infos.iter())
            .map(|i| {
                let region = Region {
                    kind: i.kind.clone(),
                    nodes: i.nodes.clone(),
                    bytes_per_node: i.bytes_per_node,
                    params: i.params.clone(),
                    epoch: i.epoch,
                    holder: i.holder.clone(),
                };
                (i.name.clone(), region)
            })
            .collect();
        Regions { by_name }
    }

    fn info(name: &str, r: &Region) -> RegionInfo {
        RegionInfo {
            name: name.to_string(),
            kind: r.kind.clone(),
            nodes: r.nodes.clone(),
            bytes_per_node: r.bytes_per_node,
            params: r.params.clone(),
            epoch: r.epoch,
            holder: r.holder.clone(),
        }
    }

    /// The lowest address allocated on `node` (its space's size if none is).
    fn floor(&self, node: NodeId, size_bytes: u64) -> u64 {
        self.by_name
            .values()
            .flat_map(|r| &r.nodes)
            .filter(|(n, _)| *n == node)
            .map(|(_, base)| *base)
            .fold(size_bytes, u64::min)
    }

    /// Allocates a region; `sizes` gives each known node's space. Returns the reply and
    /// whether the registry changed (then persist before replying).
    pub(crate) fn create(
        &mut self,
        name: String,
        kind: String,
        nodes: Vec<NodeId>,
        bytes_per_node: u64,
        params: Vec<u8>,
        sizes: impl Fn(NodeId) -> Option<u64>,
    ) -> (Response, bool) {
        let refuse = |code, message: String| (error(code, message), false);
        if name.is_empty() || name.len() > NAME_BYTES_MAX || name.chars().any(char::is_control) {
            let m = format!("a region name is 1 to {NAME_BYTES_MAX} bytes, no control characters");
            return refuse(ErrorCode::BadRequest, m);
        }
        if let Some(r) = self.by_name.get(&name) {
            let same = r.kind == kind
                && r.nodes.iter().map(|(n, _)| *n).eq(nodes.iter().copied())
                && r.bytes_per_node == bytes_per_node
                && r.params == params;
            if same {
                return (Response::Region(Box::new(Self::info(&name, r))), false);
            }
            let on: Vec<NodeId> = r.nodes.iter().map(|(n, _)| *n).collect();
            let (kind, bytes) = (&r.kind, r.bytes_per_node);
            let m = format!(
                "{name} exists already, as a {kind} over nodes {on:?} of {bytes} bytes each"
            );
            return refuse(ErrorCode::Conflict, m);
        }
        if nodes.is_empty() || bytes_per_node == 0 {
            let m = "a region takes at least one byte on at least one node".to_string();
            return refuse(ErrorCode::BadRequest, m);
        }
        let placed = match self.place(&name, &nodes, bytes_per_node, sizes) {
            Ok(placed) => placed,
            Err(refused) => return (refused, false),
        };
        let region = Region {
            kind,
            nodes: placed,
            bytes_per_node,
            params,
            epoch: 1,
            holder: None,
        };
        let reply = Response::Region(Box::new(Self::info(&name, &region)));
        self.by_name.insert(name, region);
        (reply, true)
    }

    /// Where `bytes_per_node` of region `name` go on each of `nodes`: below what is
    /// allocated there already.
    fn place(
        &self,
        name: &str,
        nodes: &[NodeId],
        bytes_per_node: u64,
        sizes: impl Fn(NodeId) -> Option<u64>,
    ) -> Result<Vec<(NodeId, u64)>, Response> {
        let mut placed = Vec::with_capacity(nodes.len());
        for (i, &node) in nodes.iter().enumerate() {
            if nodes[..i].contains(&node) {
                let m = format!("node {node} is listed twice");
                return Err(error(ErrorCode::BadRequest, m));
            }
            let Some(size) = sizes(node) else {
                let m = format!("node {node} is not in the directory");
                return Err(error(ErrorCode::UnknownNode, m));
            };
            let floor = self.floor(node, size);
            let Some(base) = floor.checked_sub(bytes_per_node).map(|b| b / ALIGN * ALIGN) else {
                let m = format!("node {node} has {floor} bytes below its regions; {name} needs {bytes_per_node}");
                return Err(error(ErrorCode::NoSpace, m));
            };
            placed.push((node, base));
        }
        Ok(placed)
    }

    /// Gives region `name` its size on each of `nodes` it does not span yet, after the nodes
    /// it has. Returns the region as it is after and whether it changed.
    pub(crate) fn extend(
        &mut self,
        name: &str,
        nodes: Vec<NodeId>,
        sizes: impl Fn(NodeId) -> Option<u64>,
    ) -> (Response, bool) {
        let Some(r) = self.by_name.get(name) else {
            let m = format!("no region is called {name}");
            return (error(ErrorCode::NotFound, m), false);
        };
        let new: Vec<NodeId> = (nodes.into_iter())
            .filter(|n| !r.nodes.iter().any(|(m, _)| m == n))
            .collect();
        let placed = match self.place(name, &new, r.bytes_per_node, sizes) {
            Ok(placed) => placed,
            Err(refused) => return (refused, false),
        };
        let r = self.by_name.get_mut(name).expect("looked up above");
        r.nodes.extend(placed);
        (
            Response::Region(Box::new(Self::info(name, r))),
            !new.is_empty(),
        )
    }

    pub(crate) fn get(&self, name: &str) -> Response {
        match self.by_name.get(name) {
            Some(r) => Response::Region(Box::new(Self::info(name, r))),
            None => error(ErrorCode::NotFound, format!("no region is called {name}")),
        }
    }

    pub(crate) fn all(&self) -> Response {
        Response::Regions(self.by_name.iter().map(|(n, r)| Self::info(n, r)).collect())
    }

    /// Raises the epoch of `name` if it is still `expect`, recording `holder`. Returns the
    /// region as it is after and whether it changed (then persist before replying).
    pub(crate) fn take(&mut self, name: &str, expect: u64, holder: String) -> (Response, bool) {
        let Some(r) = self.by_name.get_mut(name) else {
            return (
                error(ErrorCode::NotFound, format!("no region is called {name}")),
                false,
            );
        };
        let taken = r.epoch == expect;
        if taken {
            r.epoch += 1;
            r.holder = Some(holder);
        }
        (Response::Region(Box::new(Self::info(name, r))), taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(resp: Response) -> RegionInfo {
        match resp {
            Response::Region(r) => *r,
            other => panic!("not a region: {other:?}"),
        }
    }

    fn code(resp: Response) -> ErrorCode {
        match resp {
            Response::Error { code, .. } => code,
            other => panic!("not an error: {other:?}"),
        }
    }

    const MIB: u64 = 1 << 20;

    fn size(node: NodeId) -> Option<u64> {
        (node <= 3).then_some(16 * MIB)
    }

    #[test]
    fn a_registry_rebuilt_from_its_listing_is_the_same() {
        let mut r = Regions::default();
        r.create("a".into(), "log".into(), vec![1, 2], 4 * MIB, vec![7], size);
        r.create("b".into(), "fs".into(), vec![3], MIB, vec![], size);
        r.take("a", 1, "127.0.0.1:9".into());
        let Response::Regions(infos) = r.all() else {
            panic!("not a listing");
        };
        assert_eq!(Regions::from_infos(&infos), r);
    }

    #[test]
    fn regions_stack_down_from_the_top_of_each_node() {
        let mut r = Regions::default();
        let (a, changed) = r.create("a".into(), "log".into(), vec![1, 2], 4 * MIB, vec![7], size);
        assert!(changed);
        assert_eq!(region(a).nodes, vec![(1, 12 * MIB), (2, 12 * MIB)]);
        let (b, _) = r.create("b".into(), "log".into(), vec![2, 3], 5000, vec![], size);
        assert_eq!(
            region(b).nodes,
            vec![(2, 12 * MIB - 8192), (3, 16 * MIB - 8192)]
        );
        let (again, changed) =
            r.create("a".into(), "log".into(), vec![1, 2], 4 * MIB, vec![7], size);
        assert!(!changed, "a retried create replies the same region");
        assert_eq!(region(again).nodes, vec![(1, 12 * MIB), (2, 12 * MIB)]);
        let (clash, _) = r.create("a".into(), "log".into(), vec![1], 4 * MIB, vec![7], size);
        assert_eq!(code(clash), ErrorCode::Conflict);
        let (full, changed) = r.create("c".into(), "log".into(), vec![1], 13 * MIB, vec![], size);
        assert_eq!(code(full), ErrorCode::NoSpace);
        assert!(!changed);
        let (unknown, _) = r.create("c".into(), "log".into(), vec![9], MIB, vec![], size);
        assert_eq!(code(unknown), ErrorCode::UnknownNode);
        let (twice, _) = r.create("c".into(), "log".into(), vec![1, 1], MIB, vec![], size);
        assert_eq!(code(twice), ErrorCode::BadRequest);
        let (unnamed, _) = r.create(String::new(), "log".into(), vec![1], MIB, vec![], size);
        assert_eq!(code(unnamed), ErrorCode::BadRequest);
        assert_eq!(code(r.get("c")), ErrorCode::NotFound);
    }

    #[test]
    fn an_extended_region_spans_new_nodes_after_its_own() {
        let mut r = Regions::default();
        let _ = r.create("a".into(), "fs".into(), vec![1], 4 * MIB, vec![], size);
        let _ = r.create("b".into(), "log".into(), vec![3], MIB, vec![], size);
        let (grown, changed) = r.extend("a", vec![1, 3], size);
        assert!(changed);
        assert_eq!(region(grown).nodes, vec![(1, 12 * MIB), (3, 11 * MIB)]);
        let (again, changed) = r.extend("a", vec![3], size);
        assert!(!changed, "a retried extension changes nothing");
        assert_eq!(region(again).nodes.len(), 2);
        assert_eq!(code(r.extend("a", vec![9], size).0), ErrorCode::UnknownNode);
        assert_eq!(code(r.extend("z", vec![2], size).0), ErrorCode::NotFound);
        let _ = r.create("c".into(), "fs".into(), vec![1], 10 * MIB, vec![], size);
        let _ = r.create("d".into(), "log".into(), vec![2], 10 * MIB, vec![], size);
        assert_eq!(code(r.extend("c", vec![2], size).0), ErrorCode::NoSpace);
        assert_eq!(
            region(r.get("c")).nodes.len(),
            1,
            "a refused extension adds nothing"
        );
    }

    #[test]
    fn an_epoch_is_taken_once_by_whoever_expected_it() {
        let mut r = Regions::default();
        let _ = r.create("a".into(), "log".into(), vec![1], MIB, vec![], size);
        let (first, changed) = r.take("a", 1, "x:1".into());
        assert!(changed);
        let first = region(first);
        assert_eq!((first.epoch, first.holder.as_deref()), (2, Some("x:1")));
        let (late, changed) = r.take("a", 1, "y:2".into());
        assert!(!changed, "the epoch moved on");
        let late = region(late);
        assert_eq!((late.epoch, late.holder.as_deref()), (2, Some("x:1")));
        assert_eq!(code(r.take("b", 1, "y:2".into()).0), ErrorCode::NotFound);
    }
}
