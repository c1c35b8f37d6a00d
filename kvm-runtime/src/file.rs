//! Model files on disk: mapped or read into huge pages, validated once, borrowed by
//! sessions; an all-f32 model optionally packed losslessly into f32p on the way in.

use std::fs::File;
use std::io::{Cursor, Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context, Result};
use kvm_core::error::Section;
use kvm_core::format::{crc32, Header, Role, TensorEntry, HEADER_LEN};
use kvm_core::quant::DType;
use kvm_core::Model;
use memmap2::UncheckedAdvice;

/// Where a model file's bytes live while sessions read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Mapped read-only from the page cache: nothing is copied, the kernel loads pages
    /// on first touch and shares them between processes.
    Mapped,
    /// Read once into anonymous memory advised for transparent huge pages. Decode
    /// streams every weight each step; in 2 MiB pages that stream misses the TLB once
    /// per 2 MiB instead of once per 4 KiB (docs/perf.md). Linux with transparent huge pages on
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
    /// Whether these bytes are [`ModelFile::pack_f32`]'s rather than the file's.
    packed: bool,
}

/// The huge page size the anonymous copies align to (x86_64 and aarch64 with 4 KiB base
/// pages).
const HUGE_PAGE: usize = 2 << 20;

impl ModelFile {
    /// Brings `path` into memory as `pages` asks ([`ModelFile::pages`] says what it got).
    /// The header is checked first, and its file length against the file's size, so a
    /// file that is not a model, or is cut short or padded, is refused before it is read.
    ///
    /// # Errors
    /// I/O errors, with the path; a directory, a pipe, a device or anything else that is
    /// not a regular file; a bad header; a size other than the header's.
    pub fn open(path: &Path, pages: Pages) -> Result<Self> {
        // Before opening too: opening a FIFO waits for a writer.
        regular(&std::fs::metadata(path).with_context(|| format!("opening {}", path.display()))?, path)?;
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        check_size(&file, path)?;
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
        Ok(ModelFile { map, start: 0, len, pages: Pages::Mapped, packed: false })
    }

    /// The file read into a fresh anonymous mapping, from its first 2 MiB boundary on,
    /// advised for huge pages before the first touch so the read faults them in.
    #[cfg(target_os = "linux")]
    fn read_huge(mut file: &File) -> Result<Self> {
        let len = usize::try_from(file.metadata()?.len())?;
        let (mut anon, start) = anon_huge(len)?;
        file.read_exact(&mut anon[start..start + len])?;
        Ok(ModelFile { map: anon.make_read_only()?, start, len, pages: Pages::Huge, packed: false })
    }

    /// This model with its f32 matrices packed into f32p ([`DType::F32P`], FORMAT.md):
    /// the same values, every bit, in 28 bits a weight instead of 32, so decode, which
    /// streams every weight each step, reads 11% fewer bytes (`paper-120m`). `None` when
    /// the model is not all f32 (quantized weights stay as they are) or no matrix packs
    /// smaller. Matrices are packed as `kvm-export --dtype f32p` packs them, so the bytes
    /// are that file's.
    ///
    /// The copy lives in anonymous memory, in huge pages where the kernel has them. Each
    /// tensor's checksum is checked as it is read; from a [`Pages::Mapped`] file the pages
    /// read are then let go, so memory peaks near the packed model plus one tensor. Products
    /// agree with the f32 model's to rounding: a packed row adds its rare spilled weights
    /// (tiny or subnormal) after the others.
    ///
    /// # Errors
    /// An invalid model, or no memory for the copy.
    pub fn pack_f32(&self) -> Result<Option<ModelFile>> {
        let invalid = |e| anyhow::anyhow!("invalid model file: {e}");
        // Everything but the data checksums, which the reads below check.
        let model = Model::from_bytes_trusted(self.bytes()).map_err(invalid)?;
        kvm_core::tokenizer::Tokenizer::from_section(
            model.header().tokenizer_kind,
            model.tokenizer_section(),
            model.config().vocab_len,
        )
        .map_err(invalid)?;
        // The exporter's choice: f32p where the width allows and it makes the rows smaller.
        let policy = kvm_write::policy::Policy::uniform(DType::F32P);
        let dtype_for = |role: Role, rows: u32, cols: u32| policy.dtype_for(role, rows, cols);
        let packs = |e: &TensorEntry| e.role.is_matrix() && dtype_for(e.role, e.rows, e.cols) == DType::F32P;
        if !model.tensors().all(|e| e.dtype == DType::F32) || !model.tensors().any(|e| packs(&e)) {
            return Ok(None);
        }
        let mut source = |role: Role, layer: u16, _: u32, _: u32| {
            let (index, e) = model
                .tensors()
                .enumerate()
                .find(|(_, e)| e.role == role && e.layer == layer)
                .context("tensor missing")?;
            let (offset, len) = (e.offset as usize, e.len as usize);
            let data = &self.bytes()[offset..offset + len];
            if crc32(data) != e.crc {
                let section = Section::Tensor { index: index as u32 };
                bail!("invalid model file: {}", kvm_core::Error::Checksum { section });
            }
            let values = data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            if self.pages == Pages::Mapped {
                // SAFETY: a read-only mapping of the file: the pages dropped are read
                // again, unchanged, if touched again.
                unsafe { self.map.unchecked_advise_range(UncheckedAdvice::DontNeed, self.start + offset, len) }?;
            }
            Ok(values)
        };
        let header = model.header();
        // Every tensor packs no larger than it was: the file's length bounds the copy's.
        let (mut anon, start) = anon_huge(self.len)?;
        let report = kvm_write::writer::write_model_to(
            &mut Cursor::new(&mut anon[start..start + self.len]),
            model.config(),
            (header.tokenizer_kind, model.tokenizer_section()),
            (header.cache, header.reads),
            &dtype_for,
            &mut source,
            &mut |_| {},
        )?;
        let (len, pages) =
            (usize::try_from(report.file_len)?, if huge_pages_on() { Pages::Huge } else { Pages::Mapped });
        Ok(Some(ModelFile { map: anon.make_read_only()?, start, len, pages, packed: true }))
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }

    /// Where the bytes live: [`Pages::Huge`] only if they were read into huge pages.
    pub fn pages(&self) -> Pages {
        self.pages
    }

    /// Whether the bytes are the file's f32 weights packed as it loaded
    /// ([`ModelFile::pack_f32`]).
    pub fn packed(&self) -> bool {
        self.packed
    }

    /// Validates the file completely and returns the model view (packed bytes, written
    /// here from a file checked as it was read, skip their data checksums).
    ///
    /// # Errors
    /// Any [`kvm_core::Error`], with the cause spelled out.
    pub fn model(&self) -> Result<Model<'_>> {
        let load = if self.packed { Model::from_bytes_trusted } else { Model::from_bytes };
        load(self.bytes()).map_err(|e| anyhow::anyhow!("invalid model file: {e}"))
    }
}

/// Refuses a directory and anything else that is not a regular file: a model file is read
/// by its size, which a pipe or a device does not have.
fn regular(meta: &std::fs::Metadata, path: &Path) -> Result<()> {
    if meta.is_dir() {
        bail!("{} is a directory, not a model file", path.display());
    }
    if !meta.is_file() {
        bail!("{} is not a regular file (a pipe, FIFO, socket or device), so not a model file", path.display());
    }
    Ok(())
}

/// Refuses what [`regular`] refuses, a file whose header is invalid, and a file whose size
/// is not the one its header states; leaves `file` at its start.
fn check_size(mut file: &File, path: &Path) -> Result<()> {
    let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
    regular(&meta, path)?;
    let mut head = Vec::with_capacity(HEADER_LEN);
    file.take(HEADER_LEN as u64).read_to_end(&mut head).with_context(|| format!("reading {}", path.display()))?;
    file.seek(SeekFrom::Start(0)).with_context(|| format!("reading {}", path.display()))?;
    let stated = Header::stated_file_len(&head).map_err(|e| anyhow::anyhow!("invalid model file: {e}"))?;
    let size = meta.len();
    if size < stated {
        bail!("invalid model file: {} is {size} bytes but its header says {stated}: it is cut short", path.display());
    }
    if size > stated {
        bail!(
            "invalid model file: {} is {size} bytes, longer than the {stated} its header states (bytes were \
             appended)",
            path.display()
        );
    }
    Ok(())
}

/// A fresh anonymous mapping with `len` bytes from its first 2 MiB boundary on (the
/// offset returned), advised for huge pages on Linux.
fn anon_huge(len: usize) -> Result<(memmap2::MmapMut, usize)> {
    let span = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let anon = memmap2::MmapOptions::new().len(span + HUGE_PAGE).map_anon()?;
    let start = anon.as_ptr().align_offset(HUGE_PAGE);
    #[cfg(target_os = "linux")]
    anon.advise_range(memmap2::Advice::HugePage, start, span)?;
    Ok((anon, start))
}

/// Whether the kernel hands out transparent huge pages to memory that asks for them
/// (Linux only).
fn huge_pages_on() -> bool {
    cfg!(target_os = "linux")
        && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]") || s.contains("[madvise]"))
}
