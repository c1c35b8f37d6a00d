//! Inputs that are files by nature (a checkpoint's `model.safetensors`, its `config.json`,
//! a `tokenizer.json`): opened without waiting, then refused unless a regular file, so a
//! FIFO without a writer is an error naming it instead of a hang, and a device is never
//! read as a checkpoint. (Prompts and texts may come from pipes: they are read as given.)

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// `path`, open for reading, if it is a regular file.
///
/// # Errors
/// I/O errors, with the path; a directory, a FIFO, a socket or a device.
pub fn open(path: &Path) -> Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening a FIFO for reading waits for a writer unless non-blocking; a regular
    // file's reads ignore the flag.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
    if meta.is_dir() {
        bail!("{} is a directory, not a file", path.display());
    }
    if !meta.is_file() {
        bail!("{} is not a regular file (a FIFO, socket or device): kvm reads it only from a file", path.display());
    }
    Ok(file)
}

/// The text of the regular file `path` ([`open`]).
///
/// # Errors
/// As [`open`]; text that is not UTF-8.
pub fn read_to_string(path: &Path) -> Result<String> {
    let mut text = String::new();
    open(path)?.read_to_string(&mut text).with_context(|| format!("reading {}", path.display()))?;
    Ok(text)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_without_a_writer_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("kvm-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let e = format!("{:#}", open(&fifo).unwrap_err());
        assert!(e.contains("not a regular file") && e.contains("fifo"), "{e}");
        assert!(format!("{:#}", read_to_string(&dir).unwrap_err()).contains("is a directory"));
        let file = dir.join("f.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "{}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
