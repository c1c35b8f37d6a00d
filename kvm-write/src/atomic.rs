//! Output files that appear whole or not at all: written to a temporary file beside the
//! target, synced, then renamed over it. Until [`AtomicFile::commit`] an existing file at
//! the target is untouched; a write that fails (or a panic) removes the temporary file,
//! and so does SIGINT, SIGTERM or SIGHUP (the module `on_signal`). A target that is one of the
//! run's inputs (standard input among them, when it is a file), or an existing file that
//! is not a regular one (a device, a FIFO, a socket: a rename would replace it), is
//! refused before anything is written. What no handler can clean (SIGKILL, a power cut)
//! the next write of the same target does: a temporary file is named after its process
//! (`.NAME.PID-N.tmp`) and locked (`flock`) while written, and one whose process is gone
//! and whose lock is free is removed (the module `stale`).

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
    /// links to, or is a hard link of) one of `inputs` or the file standard input reads
    /// (every run's possible input: `--prompt -`, a chat script), or its directory cannot
    /// be written.
    pub fn create(target: &Path, inputs: &[&Path]) -> Result<AtomicFile> {
        let target = resolve(target)?;
        check_target(&target, inputs)?;
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        #[cfg(unix)]
        stale::remove(&dir, &name);
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
        #[cfg(unix)]
        stale::hold(&file);
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
    if is_stdin(target) {
        bail!(
            "the output {} is the file standard input reads, an input of this run: write the output somewhere else",
            target.display()
        );
    }
    Ok(())
}

/// Whether standard input is redirected from the file `target` (same device and inode).
fn is_stdin(target: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let Ok(stdin) = std::io::stdin().as_fd().try_clone_to_owned() else { return false };
        match (File::from(stdin).metadata(), fs::metadata(target)) {
            (Ok(x), Ok(y)) => x.is_file() && x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = target;
        false
    }
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

/// Temporary files of writers that died without cleaning up (SIGKILL, a crash, a power
/// cut). A writer holds an exclusive `flock` on its temporary file until it is dropped; a
/// file of the target's name pattern is stale when the process its name gives is gone
/// (`kill(pid, 0)` says so) and its lock can be taken: a writer in another PID namespace
/// sharing the directory, whose PID means nothing here, still holds its lock. A file
/// system without `flock` keeps every file (no lock is ever taken).
#[cfg(unix)]
mod stale {
    use std::fs::{self, File, OpenOptions};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;

    /// Locks `file`, the temporary file of a live writer, for as long as it is open.
    pub fn hold(file: &File) {
        // SAFETY: a valid descriptor. A failure (no `flock` here) leaves the file
        // unlocked, which only keeps others from ever removing it.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    }

    /// Removes the stale temporary files of `name` in `dir`.
    pub fn remove(dir: &Path, name: &str) {
        let Ok(entries) = fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(pid) = file_name.to_str().and_then(|f| writer_pid(f, name)) else { continue };
            if alive(pid) {
                continue;
            }
            let path = entry.path();
            // Opened without following a link or waiting on a FIFO; only ever unlinked.
            let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK;
            let Ok(file) = OpenOptions::new().read(true).custom_flags(flags).open(&path) else { continue };
            // SAFETY: a valid descriptor.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                let _ = fs::remove_file(&path);
            }
        }
    }

    /// The PID in `file`, a temporary file name of target `name` (`.NAME.PID-N.tmp`).
    pub fn writer_pid(file: &str, name: &str) -> Option<libc::pid_t> {
        let rest = file.strip_prefix('.')?.strip_prefix(name)?.strip_prefix('.')?.strip_suffix(".tmp")?;
        let (pid, n) = rest.split_once('-')?;
        n.bytes().all(|b| b.is_ascii_digit()).then_some(())?;
        pid.parse().ok().filter(|&p| p > 0)
    }

    /// Whether process `pid` exists (one of another user's too: EPERM).
    fn alive(pid: libc::pid_t) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        let found = unsafe { libc::kill(pid, 0) } == 0;
        found || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
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

    #[cfg(unix)]
    #[test]
    fn stale_temporary_files_of_dead_writers_are_removed_and_no_others() {
        let d = dir("stale");
        // A PID that was a process and is no more: a child, waited for.
        let dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        assert!(dead.wait_with_output().unwrap().status.success());
        let me = std::process::id();
        let stale = format!(".out.kvm.{dead_pid}-0.tmp");
        // A live writer's (this process's), a dead one's still locked (a writer in
        // another PID namespace), another target's, and names of no writer.
        let mine = format!(".out.kvm.{me}-99.tmp");
        let locked = format!(".out.kvm.{dead_pid}-1.tmp");
        let kept =
            [mine.as_str(), &locked, &format!(".other.kvm.{dead_pid}-0.tmp"), ".out.kvm.x-0.tmp", "out.kvm.1-0.tmp"];
        for name in kept.iter().chain([&stale.as_str()]) {
            fs::write(d.join(name), b"partial").unwrap();
        }
        let lock = File::open(d.join(&locked)).unwrap();
        stale::hold(&lock);
        let mut f = AtomicFile::create(&d.join("out.kvm"), &[]).unwrap();
        f.file().write_all(b"new").unwrap();
        f.commit().unwrap();
        let mut want: Vec<String> = kept.iter().map(|s| s.to_string()).chain(["out.kvm".into()]).collect();
        want.sort();
        assert_eq!(entries(&d), want);
        assert_eq!(stale::writer_pid(&stale, "out.kvm"), Some(dead_pid as libc::pid_t));
        assert_eq!(stale::writer_pid(".out.kvm.12-3.tmp.x", "out.kvm"), None);
        drop(lock);
        fs::remove_dir_all(d).ok();
    }
}
