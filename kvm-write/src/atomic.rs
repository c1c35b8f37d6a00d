//! Output files that appear whole or not at all: written to a temporary file beside the
//! target, synced, then renamed over it. Until [`AtomicFile::commit`] an existing file at
//! the target is untouched; a write that fails (or a panic) removes the temporary file,
//! and so does SIGINT, SIGTERM or SIGHUP (the module `on_signal`). A target that is one of the
//! run's inputs, or an existing file that is not a regular one (a device, a FIFO, a
//! socket: a rename would replace it), is refused before anything is written.

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
    #[cfg(unix)]
    _armed: on_signal::Armed,
}

impl AtomicFile {
    /// Starts writing `target` (a symbolic link is followed: the file it names is
    /// replaced, the link stays). The temporary file is created in the target's directory,
    /// so the rename never crosses file systems.
    ///
    /// # Errors
    /// `target` is a directory or another file that is not a regular one, it is (or
    /// links to, or is a hard link of) one of `inputs`, or its directory cannot be written.
    pub fn create(target: &Path, inputs: &[&Path]) -> Result<AtomicFile> {
        let target = resolve(target)?;
        check_target(&target, inputs)?;
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        static UNIQUE: AtomicU32 = AtomicU32::new(0);
        let tmp = dir.join(format!(".{name}.{}-{}.tmp", std::process::id(), UNIQUE.fetch_add(1, Ordering::Relaxed)));
        // Armed before the file exists, so no signal finds it unregistered.
        #[cfg(unix)]
        let armed = on_signal::arm(&tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        Ok(AtomicFile {
            file,
            tmp,
            target,
            committed: false,
            #[cfg(unix)]
            _armed: armed,
        })
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
        // Disarmed only after the rename: a signal in between unlinks a name that is gone.
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

/// Refuses a `target` that exists and is not a regular file, or that is one of `inputs`.
fn check_target(target: &Path, inputs: &[&Path]) -> Result<()> {
    if let Ok(meta) = fs::metadata(target) {
        if meta.is_dir() {
            bail!("{} is a directory", target.display());
        }
        if !meta.is_file() {
            bail!(
                "{} is {}, not a regular file: kvm writes its outputs only to regular files, which it \
                 replaces whole",
                target.display(),
                kind(&meta)
            );
        }
    }
    if let Some(input) = inputs.iter().find(|i| same_file(target, i)) {
        bail!("the output {} is the input {}: write the output somewhere else", target.display(), input.display());
    }
    Ok(())
}

/// What kind of file `meta` describes, for an error message.
fn kind(meta: &fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
    }
    let _ = meta;
    "a special file"
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

/// The temporary files of a process that SIGINT, SIGTERM or SIGHUP ends are removed: each
/// [`AtomicFile`] registers its path in a fixed table, and a handler (installed once, for
/// each of those signals whose action is still the default) unlinks every registered path,
/// restores the default action and raises the signal again, so the process ends as the
/// signal would have ended it. The handler touches only atomics, the table's bytes,
/// `unlink`, `signal` and `raise`, which are async-signal-safe.
#[cfg(unix)]
mod on_signal {
    use std::cell::UnsafeCell;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::Once;

    /// Temporary files alive at once that are cleaned up (a binary holds one; further
    /// ones are only removed on drop).
    const SLOTS: usize = 16;
    /// Bytes of a registered path with its NUL (Linux's `PATH_MAX`; longer paths are not
    /// registered).
    const PATH_LEN: usize = 4096;

    const FREE: u8 = 0;
    /// Being written by the thread that claimed it; the handler leaves it alone.
    const FILLING: u8 = 1;
    /// Holds a path to unlink on a signal.
    const ARMED: u8 = 2;
    /// The handler has it (the process is ending).
    const TAKEN: u8 = 3;

    struct Slot {
        state: AtomicU8,
        path: UnsafeCell<[u8; PATH_LEN]>,
    }

    // SAFETY: `path` is written only by the thread that moved `state` from FREE to
    // FILLING, and read only by whoever moves it from ARMED to TAKEN (the handler), after
    // the writer's release store of ARMED.
    unsafe impl Sync for Slot {}

    static TABLE: [Slot; SLOTS] =
        [const { Slot { state: AtomicU8::new(FREE), path: UnsafeCell::new([0; PATH_LEN]) } }; SLOTS];

    /// Which signals end the process in the middle of a write.
    const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    /// A path registered for removal on a signal, until dropped.
    #[derive(Debug)]
    pub struct Armed(Option<usize>);

    /// Registers `path` (none registered if the table is full or the path too long).
    pub fn arm(path: &Path) -> Armed {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(install);
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= PATH_LEN || bytes.contains(&0) {
            return Armed(None);
        }
        for (i, slot) in TABLE.iter().enumerate() {
            if slot.state.compare_exchange(FREE, FILLING, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                // SAFETY: this thread owns the slot while it is FILLING (see `Slot`).
                let buf = unsafe { &mut *slot.path.get() };
                buf[..bytes.len()].copy_from_slice(bytes);
                buf[bytes.len()] = 0;
                slot.state.store(ARMED, Ordering::Release);
                return Armed(Some(i));
            }
        }
        Armed(None)
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            if let Some(i) = self.0 {
                // Fails only when the handler took the slot, and the process is ending.
                let _ = TABLE[i].state.compare_exchange(ARMED, FREE, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }

    /// Installs [`handler`] for each of [`SIGNALS`] whose action is the default (an
    /// ignored signal stays ignored, and another handler, like `kvm chat`'s for SIGINT,
    /// stays in place).
    fn install() {
        for sig in SIGNALS {
            // SAFETY: a zeroed `sigaction` is a valid value to query into and to fill in;
            // the handler is async-signal-safe.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
                libc::sigemptyset(&mut new.sa_mask);
                libc::sigaction(sig, &new, std::ptr::null_mut());
            }
        }
    }

    extern "C" fn handler(sig: libc::c_int) {
        for slot in &TABLE {
            if slot.state.compare_exchange(ARMED, TAKEN, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                // SAFETY: the slot is ours now and holds a NUL-terminated path; `unlink`
                // is async-signal-safe.
                unsafe { libc::unlink(slot.path.get().cast()) };
            }
        }
        // SAFETY: `signal` and `raise` are async-signal-safe; the default action of these
        // signals ends the process.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::FileTypeExt;

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
            let mut f = AtomicFile::create(&target, &[]).unwrap();
            f.file().write_all(b"half of the new").unwrap();
        }
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert_eq!(entries(&d), ["out.kvm"]);
        let mut f = AtomicFile::create(&target, &[]).unwrap();
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
        let mut f = AtomicFile::create(&link, &[]).unwrap();
        assert_eq!(f.target(), real);
        f.file().write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(fs::read(&real).unwrap(), b"new");
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        fs::remove_dir_all(d).ok();
    }

    #[cfg(unix)]
    #[test]
    fn inputs_and_special_files_are_refused_and_left_as_they_are() {
        let d = dir("refuse");
        let input = d.join("in.kvm");
        fs::write(&input, b"input").unwrap();
        std::os::unix::fs::symlink("in.kvm", d.join("link")).unwrap();
        fs::hard_link(&input, d.join("hard")).unwrap();
        for out in ["in.kvm", "link", "hard"] {
            let err = AtomicFile::create(&d.join(out), &[Path::new("/nonexistent"), &input]).unwrap_err();
            assert!(format!("{err}").contains("is the input"), "{out}: {err}");
        }
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = AtomicFile::create(&fifo, &[]).unwrap_err();
        assert!(format!("{err}").contains("is a FIFO, not a regular file"), "{err}");
        let err = AtomicFile::create(&d, &[]).unwrap_err();
        assert!(format!("{err}").contains("is a directory"), "{err}");
        assert_eq!(fs::read(&input).unwrap(), b"input");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert_eq!(entries(&d), ["fifo", "hard", "in.kvm", "link"]);
        // Another path is written as ever.
        let mut f = AtomicFile::create(&d.join("out.kvm"), &[&input]).unwrap();
        f.file().write_all(b"out").unwrap();
        f.commit().unwrap();
        fs::remove_dir_all(d).ok();
    }
}
