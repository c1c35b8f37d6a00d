//! Writes a model file (format v1) one tensor at a time: peak memory is about one
//! tensor in f32 plus its encoding.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};

use anyhow::{bail, Context, Result};
use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::config::{flags, Config};
use kvm_core::format::{
    self, crc32, crc32_update, Header, Role, TensorEntry, TokenizerKind, ENTRY_LEN, HEADER_LEN, TENSOR_ALIGN,
};
use kvm_core::kernels;
use kvm_core::quant::{self, DType};
use kvm_core::state::Layout;
use kvm_core::tensor::Matrix;

use crate::atomic::AtomicFile;

/// What one tensor became.
#[derive(Debug, Clone)]
pub struct TensorReport {
    pub name: String,
    pub dtype: DType,
    pub rows: u32,
    pub cols: u32,
    pub bytes: u64,
    /// Root-mean-square and worst absolute error of the stored weights vs the source.
    pub rmse: f64,
    pub max_abs: f64,
    /// Root-mean-square of the source values, the scale `rmse` is relative to.
    pub rms: f64,
}

impl TensorReport {
    /// `rmse / rms`: comparable across tensors of different scales (0 for an all-zero
    /// source).
    pub fn rel_rmse(&self) -> f64 {
        if self.rms > 0.0 {
            self.rmse / self.rms
        } else {
            0.0
        }
    }
}

/// What the whole file became.
#[derive(Debug, Clone)]
pub struct WriteReport {
    pub tensors: Vec<TensorReport>,
    pub file_len: u64,
    pub arena_len: u64,
    /// Largest number of bytes held for one tensor at once (source f32 + encoding).
    pub peak_tensor_bytes: u64,
}

/// The tensor name as the checkpoint spells it.
pub fn hf_name(role: Role, layer: u16) -> String {
    role.hf_name().replace("{}", &layer.to_string())
}

/// Encodes `src` (`[rows, cols]` f32) as `dtype`, one piece of rows per core.
pub fn encode(dtype: DType, cols: usize, src: &[f32]) -> Result<Vec<u8>> {
    let rows = src.len() / cols.max(1);
    let len = dtype
        .matrix_bytes(rows, cols)
        .with_context(|| format!("[{rows}, {cols}] does not fit {} blocks", dtype.name()))?;
    let mut out = vec![0u8; len];
    let per = piece_rows(rows, cols, dtype.group_rows());
    let piece_bytes = dtype.matrix_bytes(per, cols).unwrap_or(len).max(1);
    std::thread::scope(|s| {
        let pieces: Vec<_> = src
            .chunks(per * cols)
            .zip(out.chunks_mut(piece_bytes))
            .map(|(src, dst)| s.spawn(move || kvm_core::quant::quantize_matrix(dtype, cols, src, dst)))
            .collect();
        pieces.into_iter().try_for_each(|p| join(p).map_err(|e| anyhow::anyhow!("{e}")))
    })?;
    Ok(out)
}

/// `dtype`, unless it is f32p and a row of `src` (`[rows, cols]`) has more weights than
/// its spill slots hold; then f32, which holds the same values.
fn packable(dtype: DType, cols: usize, src: &[f32]) -> DType {
    if dtype != DType::F32P || cols == 0 {
        return dtype;
    }
    let fits = |rows: &[f32]| rows.chunks_exact(cols).all(|row| quant::f32p_spills(row) <= quant::f32p_slots(cols));
    let per = piece_rows(src.len() / cols, cols, 1);
    let all_fit = std::thread::scope(|s| {
        let pieces: Vec<_> = src.chunks(per * cols).map(|piece| s.spawn(move || fits(piece))).collect();
        pieces.into_iter().all(join)
    });
    if all_fit {
        dtype
    } else {
        DType::F32
    }
}

/// Rows per piece when a `[rows, cols]` tensor is split across the cores, whole `group`s
/// of rows each: one piece for tensors under a million weights, where threads cost more
/// than they save.
fn piece_rows(rows: usize, cols: usize, group: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pieces = if rows * cols < 1 << 20 { 1 } else { cores };
    rows.div_ceil(pieces).div_ceil(group).max(1) * group
}

/// A scoped thread's result, its panic carried on.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Writes `out`'s target: `cfg`, the tokenizer section, and every tensor of the config in
/// canonical order, each fetched from `source` (f32, `[rows, cols]` row-major) and
/// stored as `dtype_for(role, rows, cols)`; sessions store attention rows as `cache` and
/// keep the slots' read rows as `reads` unless they override them (`sessions`).
///
/// The file appears whole or not at all ([`AtomicFile`]): it is written beside the target,
/// loaded back with the runtime's own validation ([`kvm_core::Model::from_bytes`]: every
/// checksum, the tokenizer against the vocabulary), and only then renamed over it. On
/// any error an existing file at the target is left as it was.
///
/// # Errors
/// The source's errors, a non-finite weight, a config or tokenizer the runtime would
/// refuse, I/O errors.
pub fn write_model(
    mut out: AtomicFile,
    cfg: &Config,
    tokenizer: (TokenizerKind, &[u8]),
    sessions: (CacheDtype, SlotReads),
    dtype_for: &dyn Fn(Role, u32, u32) -> DType,
    source: &mut dyn FnMut(Role, u16, u32, u32) -> Result<Vec<f32>>,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<WriteReport> {
    let mut w = BufWriter::with_capacity(1 << 20, out.file());
    let report = write_model_to(&mut w, cfg, tokenizer, sessions, dtype_for, source, on_tensor)?;
    w.flush()?;
    drop(w);
    check_written(out.file())?;
    out.commit()?;
    Ok(report)
}

/// Loads the file just written as the runtime would, so that no file kvm refuses is kept.
fn check_written(file: &File) -> Result<()> {
    // SAFETY: our own temporary file, which nothing writes while it is mapped.
    let map = unsafe { memmap2::Mmap::map(file) }.context("mapping the file written")?;
    kvm_core::Model::from_bytes(&map).map_err(|e| anyhow::anyhow!("the runtime would refuse this file: {e}"))?;
    Ok(())
}

/// [`write_model`] into `w` (a file, or a buffer in memory), from its start.
pub fn write_model_to<W: Write + Seek>(
    w: &mut W,
    cfg: &Config,
    tokenizer: (TokenizerKind, &[u8]),
    sessions: (CacheDtype, SlotReads),
    dtype_for: &dyn Fn(Role, u32, u32) -> DType,
    source: &mut dyn FnMut(Role, u16, u32, u32) -> Result<Vec<f32>>,
    on_tensor: &mut dyn FnMut(&TensorReport),
) -> Result<WriteReport> {
    cfg.validate().map_err(|e| anyhow::anyhow!("config: {e}"))?;
    let state_capacity = cfg.natural_state_len();
    let (cache, reads) = sessions;
    let layout = Layout::new(cfg, state_capacity, cache, reads).map_err(|e| anyhow::anyhow!("arena: {e}"))?;
    let tensors: Vec<(Role, u16)> = format::canonical_tensors(cfg).collect();
    let align = |x: u64| x.div_ceil(TENSOR_ALIGN as u64) * TENSOR_ALIGN as u64;
    let table_offset = HEADER_LEN as u64;
    let table_len = (tensors.len() * ENTRY_LEN) as u64;
    let tokenizer_offset = table_offset + table_len;
    let mut offset = align(tokenizer_offset + tokenizer.1.len() as u64);

    // Header and table are written last, once every offset and checksum is known.
    w.write_all(&vec![0u8; tokenizer_offset as usize])?;
    w.write_all(tokenizer.1)?;
    w.write_all(&vec![0u8; (offset - tokenizer_offset - tokenizer.1.len() as u64) as usize])?;

    let mut entries = Vec::with_capacity(tensors.len());
    let mut reports = Vec::with_capacity(tensors.len());
    let mut peak = 0u64;
    for &(role, layer) in &tensors {
        let name = hf_name(role, layer);
        let (rows, cols) = role.shape(cfg, layer as usize).expect("canonical tensors have shapes");
        let src = source(role, layer, rows, cols).with_context(|| format!("tensor {name}"))?;
        if src.len() != rows as usize * cols as usize {
            bail!("tensor {name}: {} values for shape [{rows}, {cols}]", src.len());
        }
        if let Some(bad) = src.iter().position(|v| !v.is_finite()) {
            bail!("tensor {name}: value {} at index {bad} is not finite", src[bad]);
        }
        let dtype = match role.is_matrix() {
            true => packable(dtype_for(role, rows, cols), cols as usize, &src),
            false if cfg.has(flags::INT_NUMERICS) => DType::I32,
            false => DType::F32,
        };
        let data = encode(dtype, cols as usize, &src).with_context(|| format!("tensor {name}"))?;
        let (rmse, max_abs) = error_stats(dtype, rows as usize, cols as usize, &data, &src)?;
        let rms = (src.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / src.len().max(1) as f64).sqrt();
        let pad = align(offset + data.len() as u64) - (offset + data.len() as u64);
        w.write_all(&data)?;
        w.write_all(&vec![0u8; pad as usize])?;
        entries.push(TensorEntry { role, layer, dtype, rows, cols, offset, len: data.len() as u64, crc: crc32(&data) });
        peak = peak.max((src.len() * 4 + data.len()) as u64);
        let report = TensorReport { name, dtype, rows, cols, bytes: data.len() as u64, rmse, max_abs, rms };
        on_tensor(&report);
        reports.push(report);
        offset += data.len() as u64 + pad;
    }
    let file_len = offset;

    let mut table = Vec::with_capacity(table_len as usize);
    for e in &entries {
        table.extend_from_slice(&e.encode());
    }
    let header = Header {
        minor: format::VERSION_MINOR,
        file_len,
        arena_len: layout.arena_len() as u64,
        state_capacity: state_capacity as u32,
        cache,
        reads,
        n_tensors: entries.len() as u32,
        table_offset,
        table_len,
        table_crc: crc32(&table),
        tokenizer_kind: tokenizer.0,
        tokenizer_offset,
        tokenizer_len: tokenizer.1.len() as u64,
        tokenizer_crc: crc32_update(0, tokenizer.1),
        config: *cfg,
    };
    let mut head = [0u8; HEADER_LEN];
    header.encode(&mut head);
    w.seek(SeekFrom::Start(0))?;
    w.write_all(&head)?;
    w.write_all(&table)?;
    Ok(WriteReport { tensors: reports, file_len, arena_len: layout.arena_len() as u64, peak_tensor_bytes: peak })
}

/// RMSE and max |error| of the encoded tensor against its source: zero for the
/// [`DType::exact`] dtypes, without decoding (the quant tests check their round trips).
fn error_stats(dtype: DType, rows: usize, cols: usize, data: &[u8], src: &[f32]) -> Result<(f64, f64)> {
    if dtype.exact() {
        return Ok((0.0, 0.0));
    }
    let m = Matrix::new(dtype, rows, cols, data).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut row = vec![0f32; cols];
    let (mut sq, mut max) = (0f64, 0f64);
    for r in 0..rows {
        kernels::dequant_row(&m, r, &mut row);
        for (a, b) in row.iter().zip(&src[r * cols..(r + 1) * cols]) {
            let e = (*a as f64 - *b as f64).abs();
            sq += e * e;
            max = max.max(e);
        }
    }
    Ok(((sq / (rows * cols).max(1) as f64).sqrt(), max))
}

/// The quantization error of every lossy tensor, one line each, worst (highest relative
/// RMSE) first, then one line counting the tensors stored exactly.
pub fn error_table(tensors: &[TensorReport]) -> String {
    use std::fmt::Write as _;
    let mut lossy: Vec<&TensorReport> = tensors.iter().filter(|t| t.max_abs > 0.0).collect();
    lossy.sort_by(|a, b| b.rel_rmse().total_cmp(&a.rel_rmse()).then_with(|| b.max_abs.total_cmp(&a.max_abs)));
    let mut out = String::new();
    if !lossy.is_empty() {
        let _ = writeln!(
            out,
            "{:<44} {:>5} {:>15} {:>10} {:>10} {:>10}",
            "tensor (worst first)", "dtype", "shape", "rmse", "rel rmse", "max abs"
        );
    }
    for t in &lossy {
        let shape = format!("[{}, {}]", t.rows, t.cols);
        let _ = writeln!(
            out,
            "{:<44} {:>5} {:>15} {:>10.3e} {:>10.3e} {:>10.3e}",
            t.name,
            t.dtype.name(),
            shape,
            t.rmse,
            t.rel_rmse(),
            t.max_abs
        );
    }
    let _ = writeln!(out, "{} of {} tensors stored exactly", tensors.len() - lossy.len(), tensors.len());
    out
}

/// Peak resident memory of this process so far (`VmHWM`), if the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim();
    kb.parse::<u64>().ok().map(|kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, rmse: f64, rms: f64, max_abs: f64) -> TensorReport {
        TensorReport { name: name.into(), dtype: DType::Q8_0, rows: 2, cols: 32, bytes: 68, rmse, max_abs, rms }
    }

    #[test]
    fn table_is_worst_first_and_counts_exact_tensors() {
        let t = error_table(&[
            report("small", 1e-3, 1.0, 2e-3),
            report("exact", 0.0, 1.0, 0.0),
            report("worst", 1e-3, 0.01, 3e-3),
            report("middle", 1e-2, 1.0, 4e-2),
        ]);
        let order: Vec<&str> = t.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
        assert_eq!(order, ["worst", "middle", "small", "1"], "{t}");
        assert!(t.ends_with("1 of 4 tensors stored exactly\n"), "{t}");
    }

    #[test]
    fn f32p_falls_back_to_f32_when_a_row_spills_past_its_slots() {
        let mut src: Vec<f32> = (0..128).map(|i| (i as f32 - 60.5) / 64.0).collect();
        assert_eq!(packable(DType::F32P, 64, &src), DType::F32P);
        // Row 1 gets a fifth weight 2^-20 below its largest: one more than 4 slots hold.
        for i in 0..5 {
            src[64 + 7 * i] = 1e-7;
        }
        assert_eq!(packable(DType::F32P, 64, &src), DType::F32);
        assert_eq!(packable(DType::Q8_0, 64, &src), DType::Q8_0);
    }

    #[test]
    fn peak_rss_is_reported_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(peak_rss_bytes().unwrap() > 1 << 20);
        }
    }
}
