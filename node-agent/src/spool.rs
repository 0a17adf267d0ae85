//! The directories a root daemon keeps its files in (the spool, the
//! socket's directory): created private, and refused when anyone but root
//! could swap what is in them.

use std::path::{Path, PathBuf};

use crate::agent::AgentError;

/// Creates `dir` (mode 0755) if needed and checks it is safe to keep a
/// root daemon's files in.
pub fn create_private_dir(dir: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|source| AgentError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    check_private_dir(dir)?;
    Ok(())
}

/// Whether a batch script can be written into the spool `dir` now: a
/// probe file of 64 KiB written and removed (what the node's health
/// checks after a script could not be written).
pub fn probe(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(".probe");
    let _ = std::fs::remove_file(&path);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| f.write_all(&[0u8; 64 << 10]).and_then(|()| f.sync_data()));
    let _ = std::fs::remove_file(&path);
    written
}

/// Why a directory is not safe for a root daemon's files.
#[derive(Debug, thiserror::Error)]
pub enum UnsafeDir {
    #[error("{path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is owned by uid {owner}; it must belong to root or to uid {me}")]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("{path} is writable by others (mode {mode:o}); it must be writable by its owner only")]
    Writable { path: PathBuf, mode: u32 },
}

/// Checks that no one but root (or the agent's own uid) can change `dir`
/// or any directory above it, so a path under it cannot be swapped by a
/// user. A sticky directory above it (`/tmp`) owned by root or by the
/// agent's uid is accepted: there no one may rename or remove what they
/// do not own.
pub fn check_private_dir(dir: &Path) -> Result<(), UnsafeDir> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let dir = std::path::absolute(dir).map_err(|source| UnsafeDir::Stat {
        path: dir.to_path_buf(),
        source,
    })?;
    for (depth, d) in dir.ancestors().enumerate() {
        let m = std::fs::metadata(d).map_err(|source| UnsafeDir::Stat {
            path: d.to_path_buf(),
            source,
        })?;
        let (owner, mode) = (m.uid(), m.mode() & 0o7777);
        if owner != 0 && owner != me {
            return Err(UnsafeDir::Owner {
                path: d.to_path_buf(),
                owner,
                me,
            });
        }
        let shared = mode & 0o022 != 0;
        let sticky_root_parent = depth > 0 && mode & 0o1000 != 0;
        if shared && !sticky_root_parent {
            return Err(UnsafeDir::Writable {
                path: d.to_path_buf(),
                mode,
            });
        }
    }
    Ok(())
}
