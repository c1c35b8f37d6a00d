//! How a model's weights are stored: the matrix dtype, per-role overrides, the default
//! attention cache and whether matrices are interleaved.

use kvm_core::cache::{CacheDtype, SlotReads};
use kvm_core::config::{flags, Config};
use kvm_core::format::Role;
use kvm_core::quant::DType;

/// The context a growable state has room for unless asked otherwise: the longest the
/// benchmarks measure.
pub const DEFAULT_CONTEXT: usize = 65_536;

/// How weights are stored, and the session defaults the header records.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Dtype of weight matrices.
    pub dtype: DType,
    /// Per-role overrides (`lm_head=q8_0`), by role.
    pub overrides: Vec<(Role, DType)>,
    /// How sessions store attention rows by default (the header's cache dtype).
    pub cache: CacheDtype,
    /// Where sessions keep the slots' read rows by default (the header's slot reads).
    pub reads: SlotReads,
    /// Store matrices in their dtype's row-interleaved form where it has one and the
    /// shape allows (q4_0 as q4_0x16: the SIMD kernels read it faster). Off for targets
    /// that run the scalar kernels, which read the plain form a little faster.
    pub repack: bool,
    /// A growable state's room: every slot it reaches within this many tokens of context
    /// (the header's state capacity); past it the state merges without growing.
    pub max_context: usize,
    /// The integer numerics (docs/integer.md): every matrix [`DType::I8`], every vector
    /// [`DType::I32`], and the config's [`flags::INT_NUMERICS`] set.
    pub int: bool,
}

impl Policy {
    /// Every matrix `dtype` (with the q4_0 exceptions of [`Policy::dtype_for`]), no
    /// overrides, the exact f32 cache, stored slot reads, repacked, room for
    /// [`DEFAULT_CONTEXT`] tokens.
    pub fn uniform(dtype: DType) -> Policy {
        Policy {
            dtype,
            overrides: vec![],
            cache: CacheDtype::F32,
            reads: SlotReads::Stored,
            repack: true,
            max_context: DEFAULT_CONTEXT,
            int: false,
        }
    }

    /// The integer numerics' policy: i8 matrices, i32 vectors.
    pub fn int() -> Policy {
        Policy { int: true, ..Policy::uniform(DType::I8) }
    }

    /// `cfg` as this policy stores it: with [`flags::INT_NUMERICS`] under [`Policy::int`].
    pub fn config(&self, mut cfg: Config) -> Config {
        if self.int {
            cfg.flags |= flags::INT_NUMERICS;
        }
        cfg
    }

    /// The dtype a `[rows, cols]` matrix of `role` gets: the override, else the policy
    /// dtype, except that under q4_0 the embedding stays q8_0 (a step reads one row of
    /// it, so that costs bytes on disk only; on tiny-kjv it takes a third off q4_0's loss
    /// in bits per byte); quantized formats fall back to f16 when `cols` is not a whole
    /// number of blocks, f32p to f32 (also where it would not make the rows smaller: 64
    /// columns or fewer). The result is row-interleaved when asked for (`q4_0x16`,
    /// `q8_0x16`, or [`Policy::repack`]) and `rows` is a whole number of groups, else
    /// plain; the embedding, read a row at a time, is interleaved only when its override
    /// names an interleaved dtype.
    pub fn dtype_for(&self, role: Role, rows: u32, cols: u32) -> DType {
        if self.int {
            return DType::I8;
        }
        let default = match (role, self.dtype.plain()) {
            (Role::TokEmbed, DType::Q4_0) => DType::Q8_0,
            (Role::TokEmbed, d) => d,
            _ => self.dtype,
        };
        let asked = self.overrides.iter().find(|(r, _)| *r == role).map(|&(_, d)| d).unwrap_or(default);
        let d = asked.plain();
        let bytes = |d: DType| d.row_bytes(cols as usize);
        if d == DType::F32P && !matches!((bytes(d), bytes(DType::F32)), (Some(p), Some(f)) if p < f) {
            return DType::F32;
        }
        if bytes(d).is_none() {
            return DType::F16;
        }
        let repack = self.repack && role != Role::TokEmbed;
        match d.interleaved() {
            Some(x) if (repack || asked == x) && x.matrix_bytes(rows as usize, cols as usize).is_some() => x,
            _ => d,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_packs_f32_where_the_columns_are_whole_blocks_and_rows_shrink() {
        let p = Policy::uniform(DType::F32P);
        assert_eq!(p.dtype_for(Role::Wq, 768, 768), DType::F32P);
        assert_eq!(p.dtype_for(Role::TokEmbed, 50304, 768), DType::F32P);
        assert_eq!(p.dtype_for(Role::Wq, 768, 100), DType::F32);
        // A row of 64: 264 bytes packed (two blocks and a head of 40) against 256.
        assert_eq!(p.dtype_for(Role::Wq, 64, 64), DType::F32);
        assert_eq!(p.dtype_for(Role::Wq, 64, 96), DType::F32P);
    }

    #[test]
    fn policy_keeps_q4_0_edges_at_q8_0_and_interleaves_whole_row_groups() {
        let q4 = Policy::uniform(DType::Q4_0);
        assert_eq!(q4.dtype_for(Role::Wq, 768, 768), DType::Q4_0x16);
        assert_eq!(q4.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        assert_eq!(q4.dtype_for(Role::LmHead, 50304, 768), DType::Q4_0x16);
        // Rows that are not whole groups of 16 stay row-major; columns that are not whole
        // blocks fall back to f16.
        assert_eq!(q4.dtype_for(Role::MergeGate, 6, 768), DType::Q4_0);
        assert_eq!(q4.dtype_for(Role::Wq, 768, 100), DType::F16);
        let plain = Policy { repack: false, ..Policy::uniform(DType::Q4_0) };
        assert_eq!(plain.dtype_for(Role::Wq, 768, 768), DType::Q4_0);
        // Asking for q4_0x16 by name interleaves even without `repack`, where it can.
        let named = Policy { repack: false, ..Policy::uniform(DType::Q4_0x16) };
        assert_eq!(named.dtype_for(Role::Wq, 768, 768), DType::Q4_0x16);
        assert_eq!(named.dtype_for(Role::MergeGate, 6, 768), DType::Q4_0);
        assert_eq!(named.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        let head = Policy { overrides: vec![(Role::LmHead, DType::Q4_0)], ..Policy::uniform(DType::Q8_0) };
        assert_eq!(head.dtype_for(Role::LmHead, 50304, 768), DType::Q4_0x16);
        assert_eq!(head.dtype_for(Role::Wq, 768, 768), DType::Q8_0x16);
    }

    #[test]
    fn policy_interleaves_q8_0_but_the_embedding() {
        let q8 = Policy::uniform(DType::Q8_0);
        assert_eq!(q8.dtype_for(Role::Wq, 768, 768), DType::Q8_0x16);
        assert_eq!(q8.dtype_for(Role::LmHead, 50304, 768), DType::Q8_0x16);
        assert_eq!(q8.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        assert_eq!(Policy::uniform(DType::Q8_0x16).dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0);
        let named = Policy { overrides: vec![(Role::TokEmbed, DType::Q8_0x16)], ..Policy::uniform(DType::Q8_0) };
        assert_eq!(named.dtype_for(Role::TokEmbed, 50304, 768), DType::Q8_0x16);
        let plain = Policy { repack: false, ..Policy::uniform(DType::Q8_0) };
        assert_eq!(plain.dtype_for(Role::Wq, 768, 768), DType::Q8_0);
        assert_eq!(plain.dtype_for(Role::MergeGate, 6, 768), DType::Q8_0);
    }
}
