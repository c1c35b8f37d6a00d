//! Model files on disk: mapped or read into huge pages, validated once, borrowed by
//! sessions.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use kvm_core::Model;

/// Where a model file's bytes live while sessions read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Mapped read-only from the page cache: nothing is copied, the kernel loads pages
    /// on first touch and shares them between processes.
    Mapped,
    /// Read once into anonymous memory advised for transparent huge pages. Decode
    /// streams every weight each step; in 2 MiB pages that stream misses the TLB once
    /// per 2 MiB instead of once per 4 KiB (`paper-120m` on two threads: q4_0 1.07-1.15x
    /// decode, f32 1.04-1.10x, docs/perf.md). Linux with transparent huge pages on
    /// (`always` or `madvise`); anywhere else, or without the memory for the copy, it
    /// falls back to [`Pages::Mapped`].
    Huge,
}

/// A model file in memory, page-aligned (so tensors stay 64-byte aligned in memory too).
#[derive(Debug)]
pub struct ModelFile {
    map: memmap2::Mmap,
    /// The file's bytes within `map`.
    start: usize,
    len: usize,
    pages: Pages,
}

/// The huge page size the anonymous copy aligns to (x86_64 and aarch64 with 4 KiB base
/// pages).
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

impl ModelFile {
    /// Brings `path` into memory as `pages` asks ([`ModelFile::pages`] says what it got).
    ///
    /// # Errors
    /// I/O errors, with the path.
    pub fn open(path: &Path, pages: Pages) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // Where the copy cannot be made (no memory for it), the mapping still serves.
        #[cfg(target_os = "linux")]
        if pages == Pages::Huge && huge_pages_on() {
            if let Ok(f) = Self::read_huge(&file) {
                return Ok(f);
            }
        }
        // SAFETY: mapped read-only; kvm never writes the file, and a model file changed
        // under a running process is outside what kvm promises.
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        let len = map.len();
        Ok(ModelFile { map, start: 0, len, pages: Pages::Mapped })
    }

    /// The file read into a fresh anonymous mapping, from its first 2 MiB boundary on,
    /// advised for huge pages before the first touch so the read faults them in.
    #[cfg(target_os = "linux")]
    fn read_huge(mut file: &File) -> Result<Self> {
        use std::io::Read;
        let len = usize::try_from(file.metadata()?.len())?;
        let span = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        let mut anon = memmap2::MmapOptions::new().len(span + HUGE_PAGE).map_anon()?;
        let start = anon.as_ptr().align_offset(HUGE_PAGE);
        anon.advise_range(memmap2::Advice::HugePage, start, span)?;
        file.read_exact(&mut anon[start..start + len])?;
        Ok(ModelFile { map: anon.make_read_only()?, start, len, pages: Pages::Huge })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// Where the bytes live: [`Pages::Huge`] only if they were read into huge pages.
    pub fn pages(&self) -> Pages {
        self.pages
    }

    /// Validates the file completely and returns the model view.
    ///
    /// # Errors
    /// Any [`kvm_core::Error`], with the cause spelled out.
    pub fn model(&self) -> Result<Model<'_>> {
        Model::from_bytes(self.bytes()).map_err(|e| anyhow::anyhow!("invalid model file: {e}"))
    }
}

/// Whether the kernel hands out transparent huge pages to memory that asks for them.
#[cfg(target_os = "linux")]
fn huge_pages_on() -> bool {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}
