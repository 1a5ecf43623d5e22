//! The manager's files in its data directory, each replaced atomically (written to a
//! temporary file, synced, renamed, the directory synced): `raft.bin`, what the replica
//! keeps of its Raft group (`RaftStore`), and `manager.json`, the state a group starts
//! from at its first start (a restored cluster's, or a manager's from before Raft).

use crate::state::Persisted;
use crate::ManagerError;
use std::path::{Path, PathBuf};

fn path(dir: &Path) -> PathBuf {
    dir.join("manager.json")
}

/// The state last saved in `dir` (created if missing), or a fresh one.
pub(crate) fn load(dir: &Path) -> Result<Persisted, ManagerError> {
    let path = path(dir);
    match read_if_present(dir, &path)? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| ManagerError::State {
            path,
            reason: e.to_string(),
        }),
        None => Ok(Persisted::fresh()),
    }
}

/// Makes `state` what `load` returns from now on, even across a crash.
pub(crate) fn save(dir: &Path, state: &Persisted) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
    replace(dir, &path(dir), &bytes)
}

pub(crate) fn raft_path(dir: &Path) -> PathBuf {
    dir.join("raft.bin")
}

/// What the replica stored last, if it ever did.
pub(crate) fn load_raft(dir: &Path) -> Result<Option<Vec<u8>>, ManagerError> {
    read_if_present(dir, &raft_path(dir))
}

/// The bytes of `path` in `dir` (created if missing), or `None` if there is no such file.
fn read_if_present(dir: &Path, path: &Path) -> Result<Option<Vec<u8>>, ManagerError> {
    std::fs::create_dir_all(dir).map_err(|source| ManagerError::Io {
        what: format!("create {}", dir.display()),
        source,
    })?;
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ManagerError::Io {
            what: format!("read {}", path.display()),
            source,
        }),
    }
}

/// Makes `bytes` what `load_raft` returns from now on, even across a crash.
pub(crate) fn save_raft(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace(dir, &raft_path(dir), bytes)
}

fn replace(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManagerState;

    #[test]
    fn directory_and_epoch_survive_restart() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ManagerState::new(load(dir.path()).unwrap(), 1);
        let (_, written) = s.register(0, 4, "127.0.0.1:9".into(), 4096, true, false, None);
        save(dir.path(), &written.unwrap()).unwrap();
        save(dir.path(), &s.advance_epoch()).unwrap();
        let s = ManagerState::new(load(dir.path()).unwrap(), 2);
        assert_eq!(s.epoch(), 2);
        assert_eq!(s.persisted().addr(4).as_deref(), Some("127.0.0.1:9"));
    }
}
