//! State files: a session's snapshot as it is ([`Session::snapshot_with_logits`] when the
//! session has the logits of its position, as after a prompt; [`Session::snapshot`]
//! before any), so a file has one of two sizes, carries the snapshot's CRC over every
//! byte, and restores only into a session of the same model, cache dtype and state
//! capacity. Files of kvm before the logits were saved are the state alone and load as
//! they did. Written whole or not at all; read only when its size is one of the session's.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use kvm_core::Session;
use kvm_runtime::arena::zeroed;
use kvm_write::atomic::AtomicFile;

/// Writes `session`'s state to `path` (a temporary file renamed over it once complete),
/// which must be none of the run's `inputs`.
pub fn save(session: &Session<'_, '_>, path: &Path, inputs: &[&Path]) -> Result<()> {
    write(session, create(path, inputs)?)
}

/// The state file `path` to be, refused if it is one of `inputs` or a special file: made
/// before a run's work, so such a path fails at once.
pub fn create(path: &Path, inputs: &[&Path]) -> Result<AtomicFile> {
    AtomicFile::create(path, inputs).with_context(|| format!("creating {}", path.display()))
}

/// Writes `session`'s state into `file` ([`create`]) and puts it in place.
pub fn write(session: &Session<'_, '_>, mut file: AtomicFile) -> Result<()> {
    let mut snap = zeroed::<u8>(session.snapshot_as_is_len())?;
    session.snapshot_as_is(&mut snap)?;
    let path = file.target().display().to_string();
    file.file().write_all(&snap).with_context(|| format!("writing {path}"))?;
    file.commit()
}

/// Restores the state in `path` into `session`; on any error the session is unchanged.
/// Anything but a regular file of one of the session's snapshot sizes is refused unread.
pub fn load(session: &mut Session<'_, '_>, path: &Path) -> Result<()> {
    let (state, with_logits) = (session.snapshot_len(), session.snapshot_len_with_logits());
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file, so not a state file", path.display());
    }
    let foreign = |len: u64| {
        anyhow::anyhow!(
            "{} is not a state of this session ({len} bytes, {state} or {with_logits} expected): saved from \
             another model, or with another --cache or --state-slots",
            path.display()
        )
    };
    if meta.len() != state as u64 && meta.len() != with_logits as u64 {
        return Err(foreign(meta.len()));
    }
    let n = meta.len() as usize;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // One byte more than a state, so a file that grew since is seen and not read on.
    let mut snap = zeroed::<u8>(n + 1)?;
    snap.clear();
    file.take(n as u64 + 1).read_to_end(&mut snap).with_context(|| format!("reading {}", path.display()))?;
    if snap.len() != n {
        return Err(foreign(snap.len() as u64));
    }
    if session.restore(&snap).is_err() {
        bail!(
            "{} is not a state of this session, or is damaged: its checksum or counters are not those of a \
             snapshot of this model with this --cache and --state-slots",
            path.display()
        );
    }
    Ok(())
}
