//! Output files that appear whole or not at all: written to a temporary file beside the
//! target, synced, then renamed over it. Until [`AtomicFile::commit`] an existing file at
//! the target is untouched; a write that fails (or a panic) removes the temporary file.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

/// A file being written in place of `target`.
#[derive(Debug)]
pub struct AtomicFile {
    file: File,
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl AtomicFile {
    /// Starts writing `target` (a symbolic link is followed: the file it names is
    /// replaced, the link stays). The temporary file is created in the target's directory,
    /// so the rename never crosses file systems.
    ///
    /// # Errors
    /// `target` is a directory, or its directory cannot be written.
    pub fn create(target: &Path) -> Result<AtomicFile> {
        let target = resolve(target)?;
        if target.is_dir() {
            bail!("{} is a directory", target.display());
        }
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        static UNIQUE: AtomicU32 = AtomicU32::new(0);
        let tmp = dir.join(format!(".{name}.{}-{}.tmp", std::process::id(), UNIQUE.fetch_add(1, Ordering::Relaxed)));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        Ok(AtomicFile { file, tmp, target, committed: false })
    }

    /// The temporary file, open for reading and writing.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// The file that [`AtomicFile::commit`] replaces.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Syncs the temporary file to disk and renames it over the target (then syncs the
    /// directory, on Unix, so the rename survives a crash too).
    ///
    /// # Errors
    /// I/O errors; the target is then unchanged and the temporary file removed.
    pub fn commit(mut self) -> Result<()> {
        self.file.sync_all().with_context(|| format!("syncing {}", self.tmp.display()))?;
        fs::rename(&self.tmp, &self.target).with_context(|| format!("renaming onto {}", self.target.display()))?;
        self.committed = true;
        #[cfg(unix)]
        if let Some(dir) = self.target.parent().filter(|d| !d.as_os_str().is_empty()) {
            // The data is already safe; a directory that cannot be opened or synced (some
            // file systems refuse) only loses the rename's durability.
            let _ = File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// `target` with every symbolic link of its last component followed.
fn resolve(target: &Path) -> Result<PathBuf> {
    let mut path = target.to_path_buf();
    // A bound, so a cycle of links is an error instead of a hang.
    for _ in 0..40 {
        match fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                let link = fs::read_link(&path).with_context(|| format!("reading the link {}", path.display()))?;
                path = match path.parent() {
                    Some(dir) if link.is_relative() => dir.join(link),
                    _ => link,
                };
            }
            _ => return Ok(path),
        }
    }
    bail!("{}: too many levels of symbolic links", target.display())
}

/// Whether `a` and `b` name the same file (the same device and inode on Unix, the same
/// canonical path elsewhere); `false` when either does not exist.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::metadata(a), fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        matches!((fs::canonicalize(a), fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvm-atomic-{}-{name}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn entries(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    #[test]
    fn an_unfinished_file_leaves_the_old_one_and_no_trace() {
        let d = dir("drop");
        let target = d.join("out.kvm");
        fs::write(&target, b"old").unwrap();
        {
            let mut f = AtomicFile::create(&target).unwrap();
            f.file().write_all(b"half of the new").unwrap();
        }
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert_eq!(entries(&d), ["out.kvm"]);
        let mut f = AtomicFile::create(&target).unwrap();
        f.file().write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert_eq!(entries(&d), ["out.kvm"]);
        fs::remove_dir_all(d).ok();
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_written_through_and_same_file_sees_links() {
        let d = dir("link");
        let real = d.join("real.kvm");
        let link = d.join("link.kvm");
        fs::write(&real, b"old").unwrap();
        std::os::unix::fs::symlink("real.kvm", &link).unwrap();
        assert!(same_file(&real, &link));
        assert!(!same_file(&real, &d.join("missing")));
        let mut f = AtomicFile::create(&link).unwrap();
        assert_eq!(f.target(), real);
        f.file().write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&real).unwrap(), b"new");
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        fs::remove_dir_all(d).ok();
    }
}
