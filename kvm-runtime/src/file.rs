//! Model files on disk: memory-mapped, validated once, borrowed by sessions.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use kvm_core::Model;

/// A model file mapped read-only into memory (page-aligned, so tensors stay 64-byte
/// aligned in memory too).
#[derive(Debug)]
pub struct ModelFile {
    map: memmap2::Mmap,
}

impl ModelFile {
    /// Maps `path`.
    ///
    /// # Errors
    /// I/O errors, with the path.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: mapped read-only; kvm never writes the file, and a model file changed
        // under a running process is outside what kvm promises.
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        Ok(ModelFile { map })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Validates the file completely and returns the model view.
    ///
    /// # Errors
    /// Any [`kvm_core::Error`], with the cause spelled out.
    pub fn model(&self) -> Result<Model<'_>> {
        Model::from_bytes(&self.map).map_err(|e| anyhow::anyhow!("invalid model file: {e}"))
    }
}
