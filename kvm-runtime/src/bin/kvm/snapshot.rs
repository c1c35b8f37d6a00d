//! State files: a session's snapshot ([`Session::snapshot`]) as it is, so a file is
//! constant-size and restores only into a session of the same model, cache dtype and
//! state capacity. Written whole or not at all.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use kvm_core::Session;
use kvm_write::atomic::AtomicFile;

/// Writes `session`'s state to `path` (a temporary file renamed over it once complete).
pub fn save(session: &Session<'_, '_>, path: &Path) -> Result<()> {
    let mut snap = vec![0u8; session.snapshot_len()];
    session.snapshot(&mut snap)?;
    let mut file = AtomicFile::create(path).with_context(|| format!("creating {}", path.display()))?;
    file.file().write_all(&snap).with_context(|| format!("writing {}", path.display()))?;
    file.commit()
}

/// Restores the state in `path` into `session`; on any error the session is unchanged.
pub fn load(session: &mut Session<'_, '_>, path: &Path) -> Result<()> {
    let snap = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if session.restore(&snap).is_err() {
        bail!(
            "{} is not a state of this session ({} bytes, {} expected): saved from another model, \
             or with another --cache or --state-slots",
            path.display(),
            snap.len(),
            session.snapshot_len()
        );
    }
    Ok(())
}
