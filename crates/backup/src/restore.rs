//! `restore`: a new local cluster (what `tutti up --data DIR` starts) made of a backup: each
//! node's image written into its data directory with an empty redo log, the manager's state
//! with the backup's regions, every process on new free ports on loopback.

use crate::format::{chain, read_image, verify, NodeImage};
use crate::Error;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tutti_harness::local::{create_file, LOOPBACK};
use tutti_wire::NodeId;

/// What `restore` made.
#[derive(Debug)]
pub struct Restored {
    pub data: PathBuf,
    pub nodes: Vec<NodeId>,
    pub data_bytes: u64,
    pub took: Duration,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// Checks the backup in `backup`, then makes a `log`-mode local cluster of it in `data` (a
/// new or empty directory). On failure, removes what it made.
pub fn restore(backup: &Path, data: &Path) -> Result<Restored, Error> {
    let start = Instant::now();
    let manifest = verify(backup)?;
    let size_bytes = manifest.nodes[0].size_bytes;
    if let Some(n) = manifest.nodes.iter().find(|n| n.size_bytes != size_bytes) {
        return Err(Error::Refused(format!(
            "node {} has {} bytes and node {} {size_bytes}: a local cluster's nodes are all one size",
            n.id, n.size_bytes, manifest.nodes[0].id
        )));
    }
    let claimed = crate::Destination::claim(
        data,
        "a restore makes a new cluster in a new or empty directory",
    )?;
    let result = write_cluster(backup, data, &manifest, size_bytes);
    if result.is_err() {
        claimed.undo();
    }
    let data = result?;
    Ok(Restored {
        data,
        nodes: manifest.nodes.iter().map(|n| n.id).collect(),
        data_bytes: manifest.nodes.iter().map(|n| n.data_bytes).sum(),
        took: start.elapsed(),
    })
}

fn write_cluster(
    backup: &Path,
    data: &Path,
    manifest: &crate::Manifest,
    size_bytes: u64,
) -> Result<PathBuf, Error> {
    let data = data
        .canonicalize()
        .map_err(io("resolve the data directory"))?;
    std::fs::create_dir_all(data.join("logs")).map_err(io("create logs/"))?;
    let ids: Vec<NodeId> = manifest.nodes.iter().map(|n| n.id).collect();
    let file = create_file(&data, LOOPBACK, "log", size_bytes, &ids)
        .map_err(|e| Error::Refused(e.to_string()))?;
    let chain = chain(backup, manifest)?;
    for (image, entry) in manifest.nodes.iter().zip(&file.nodes) {
        let tmp = data.join(format!(".node-{}.image", image.id));
        let out = File::create_new(&tmp).map_err(io(format!("create {}", tmp.display())))?;
        out.set_len(size_bytes).map_err(io("size the image"))?;
        // The last whole image of the node, then each incremental one after it in order.
        let mut layers: Vec<(&Path, &NodeImage)> = Vec::new();
        for (dir, m) in &chain {
            let Some(layer) = m.nodes.iter().find(|n| n.id == image.id) else {
                break;
            };
            layers.push((dir, layer));
            if !layer.incremental {
                break;
            }
        }
        for (dir, layer) in layers.into_iter().rev() {
            read_image(dir, layer, |offset, bytes| {
                out.write_all_at(bytes, offset)
                    .map_err(io(format!("write {}", tmp.display())))
            })?;
        }
        out.sync_all().map_err(io("sync the image"))?;
        tutti_memnode::node::create_data_dir(&entry.data, image.id, size_bytes, &tmp)
            .map_err(|e| Error::Refused(e.to_string()))?;
    }
    let nodes: Vec<(NodeId, String, u64)> = (file.nodes.iter())
        .map(|n| (n.id, n.addr.clone(), size_bytes))
        .collect();
    let state = tutti_manager::Persisted::restored(&nodes, &manifest.regions);
    tutti_manager::write_state(&file.manager_data, &state)
        .map_err(io("write the manager's state"))?;
    Ok(data)
}
