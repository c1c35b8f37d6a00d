//! The model's hyper-parameters: every field of the checkpoint config that changes the
//! math (spec §1), with validation and the sizes derived from them.

use crate::error::{ConfigField, Error, Result, Unsupported};

/// How the means state grows as context grows (spec §3, "Target size").
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum StateBudget {
    /// `state_min_len` slots.
    Fixed,
    /// `factor * ctx^exponent` slots.
    PowerLaw { factor: f64, exponent: f64 },
    /// `n * ctx / (n + ctx)` slots.
    Saturation { n: f64 },
}

/// Boolean switches of the architecture, as bits of [`Config::flags`].
pub mod flags {
    pub const TOKENSHIFT_ATT: u32 = 1 << 0;
    pub const TOKENSHIFT_FFN: u32 = 1 << 1;
    pub const VALUE_RESIDUAL: u32 = 1 << 2;
    pub const MERGE_GATE_KEYS: u32 = 1 << 3;
    pub const MERGE_GATE_VALUES: u32 = 1 << 4;
    pub const HEAD_TEMPS: u32 = 1 << 5;
    pub const VLENS: u32 = 1 << 6;
    pub const GATE_INITIAL_STATE: u32 = 1 << 7;
    pub const GATE_APPENDS: u32 = 1 << 8;
    /// `alt_share_v0`: KVM layers take the alternate layers' `v_first` (spec §5); no
    /// effect without alternate layers.
    pub const ALT_SHARE_V0: u32 = 1 << 9;
    /// The integer numerics (docs/integer.md): matrices [`crate::quant::DType::I8`],
    /// vectors [`crate::quant::DType::I32`], and sessions compute with integers only.
    pub const INT_NUMERICS: u32 = 1 << 10;
    /// Every bit of the model's own architecture (all but [`INT_NUMERICS`]).
    pub const MODEL: u32 = (1 << 10) - 1;
    /// Every defined bit.
    pub const ALL: u32 = MODEL | INT_NUMERICS;
}

/// A validated-on-demand KVM configuration. Sizes use the house vocabulary.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Config {
    pub vocab_len: u32,
    pub n_layers: u32,
    pub n_heads: u32,
    pub d_model: u32,
    /// Per-head query/key width.
    pub d_qk: u32,
    /// Per-head value width.
    pub d_v: u32,
    /// MLP hidden width.
    pub d_ff: u32,
    /// Value-residual LoRA rank (0 without value residual).
    pub d_vgate: u32,
    /// Dims `[0, rope_dim)` of each q/k head are rotated.
    pub rope_dim: u32,
    pub rope_theta: f64,
    pub chunk_len: u32,
    /// `n_bswa_chunks`: the window is `window_chunks * chunk_len` tokens.
    pub window_chunks: u32,
    /// `n_max_d_chunks`: the state never exceeds `max_state_chunks * chunk_len` slots.
    pub max_state_chunks: u32,
    pub budget: StateBudget,
    /// May be negative (the reference's default -1 means "no minimum").
    pub state_min_len: i32,
    pub state_round_down: u32,
    pub sink_len: u32,
    /// 0 = no softcap.
    pub logit_softcap: f32,
    pub residual_scale: f32,
    /// See [`flags`].
    pub flags: u32,
    /// `alt_layer_every`: layer `i` is an alternate (sliding-window) layer iff this is at
    /// least 2 and `i % alt_layer_every == 0` (spec §5); 0 = none.
    pub alt_layer_every: u32,
    /// `swa_window_size` resolved (`<= 0` in the checkpoint means `chunk_len`): the tokens
    /// an alternate layer attends over, the current one included (`Wa`); 0 without
    /// alternate layers.
    pub alt_window: u32,
    /// `alt_rope_partial_dim`: dims `[0, alt_rope_dim)` of an alternate layer's q/k heads
    /// are rotated; 0 without alternate layers.
    pub alt_rope_dim: u32,
    /// `alt_rope_theta`; 0 without alternate layers.
    pub alt_rope_theta: f64,
}

/// The most chunks of state a model file may hold (`max_state_chunks`).
pub const MAX_STATE_CHUNKS: u32 = 1 << 10;

impl Config {
    #[inline]
    pub const fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// Tokens in the block sliding window (`W`).
    #[inline]
    pub const fn window_len(&self) -> usize {
        self.window_chunks as usize * self.chunk_len as usize
    }

    /// The reference's hard cap on state slots (`chunk_len * n_max_d_chunks`), never below
    /// the first chunk, which always enters the state whole.
    #[inline]
    pub const fn max_state_len(&self) -> usize {
        let cap = self.chunk_len as usize * self.max_state_chunks as usize;
        if cap > self.chunk_len as usize {
            cap
        } else {
            self.chunk_len as usize
        }
    }

    /// The most slots this model can ever hold, which sizes the default arena: fixed
    /// models stop at `max(chunk_len, min(state_min_len, cap))`, growable ones at the cap.
    pub fn natural_state_len(&self) -> usize {
        let c = self.chunk_len as usize;
        match self.budget {
            StateBudget::Fixed => {
                let min = if self.state_min_len > 0 { self.state_min_len as usize } else { 0 };
                c.max(min.min(self.max_state_len()))
            }
            _ => self.max_state_len(),
        }
    }

    /// Whether the model has alternate (sliding-window) layers.
    #[inline]
    pub const fn is_hybrid(&self) -> bool {
        self.alt_layer_every >= 2
    }

    /// Whether layer `l` is an alternate (sliding-window) layer (spec §5).
    #[inline]
    pub const fn is_alt(&self, l: usize) -> bool {
        self.is_hybrid() && l.is_multiple_of(self.alt_layer_every as usize)
    }

    /// Alternate layers among layers `[0, l)`.
    #[inline]
    pub const fn alt_before(&self, l: usize) -> usize {
        if self.is_hybrid() {
            l.div_ceil(self.alt_layer_every as usize)
        } else {
            0
        }
    }

    /// The first KVM layer, whose `c_v` gives KVM layers' `v_first` (spec §5).
    #[inline]
    pub const fn first_kvm_layer(&self) -> usize {
        if self.is_hybrid() {
            1
        } else {
            0
        }
    }

    #[inline]
    pub const fn q_dim(&self) -> usize {
        self.n_heads as usize * self.d_qk as usize
    }

    #[inline]
    pub const fn v_dim(&self) -> usize {
        self.n_heads as usize * self.d_v as usize
    }

    /// Checks every field the math depends on.
    ///
    /// # Errors
    /// [`Error::BadConfig`] names the first field out of range; [`Error::Unsupported`]
    /// a combination the reference itself cannot run.
    pub fn validate(&self) -> Result<()> {
        use ConfigField as F;
        const BIG: u32 = 1 << 20;
        let check = |ok: bool, f: ConfigField| if ok { Ok(()) } else { Err(Error::BadConfig(f)) };
        check(self.vocab_len >= 1 && self.vocab_len <= 1 << 24, F::VocabLen)?;
        check(self.n_layers >= 1 && self.n_layers <= 1024, F::Layers)?;
        check(self.n_heads >= 1 && self.n_heads <= 1024, F::Heads)?;
        check(self.d_model >= 1 && self.d_model <= BIG, F::DModel)?;
        check(self.d_qk >= 2 && self.d_qk <= 1 << 14, F::DQk)?;
        check(self.d_v >= 1 && self.d_v <= 1 << 14, F::DV)?;
        check(self.d_ff >= 1 && self.d_ff <= BIG, F::DFf)?;
        check(self.q_dim() <= BIG as usize && self.v_dim() <= BIG as usize, F::Heads)?;
        let vres = self.has(flags::VALUE_RESIDUAL);
        check(if vres { self.d_vgate >= 1 && self.d_vgate <= BIG } else { self.d_vgate == 0 }, F::DVGate)?;
        check(self.rope_dim >= 2 && self.rope_dim.is_multiple_of(2) && self.rope_dim <= self.d_qk, F::RopePartialDim)?;
        check(self.rope_theta.is_finite() && self.rope_theta > 0.0, F::RopeTheta)?;
        check(self.chunk_len >= 1 && self.chunk_len <= 1 << 16, F::ChunkLen)?;
        check(self.window_chunks >= 1 && self.window_chunks <= 1 << 10, F::WindowChunks)?;
        check(self.max_state_chunks <= MAX_STATE_CHUNKS, F::MaxStateChunks)?;
        check(self.window_len() <= 1 << 20 && self.max_state_len() <= 1 << 20, F::ChunkLen)?;
        check(self.state_round_down >= 1, F::StateRoundDown)?;
        check(self.state_min_len >= -1, F::StateMinLen)?;
        match self.budget {
            StateBudget::Fixed => {}
            StateBudget::PowerLaw { factor, exponent } => {
                check(factor.is_finite() && factor >= 0.0 && exponent.is_finite() && exponent >= 0.0, F::StateGrowth)?
            }
            StateBudget::Saturation { n } => check(n.is_finite() && n > 0.0, F::StateSaturation)?,
        }
        check(self.sink_len <= 1 << 20, F::SinkLen)?;
        check(self.logit_softcap.is_finite(), F::LogitSoftcap)?;
        // The reference reads `residual_scale or 1.0`: a stored 0 would mean 1 to it.
        check(self.residual_scale.is_finite() && self.residual_scale != 0.0, F::ResidualScale)?;
        check(self.flags & !flags::ALL == 0, F::Flags)?;
        if self.has(flags::INT_NUMERICS) {
            // Attention rows are i16 pairs in whole words.
            check(self.d_qk.is_multiple_of(2), F::DQk)?;
            check(self.d_v.is_multiple_of(2), F::DV)?;
        }
        if self.is_hybrid() {
            // Layer 1 is the first KVM layer (its `c_v` gives theirs `v_first`).
            check(self.alt_layer_every <= 1 << 10 && self.n_layers >= 2, F::AltLayerEvery)?;
            check(self.alt_window >= 1 && self.alt_window <= 1 << 20, F::AltWindow)?;
            let r = self.alt_rope_dim;
            check(r >= 2 && r.is_multiple_of(2) && r <= self.d_qk, F::AltRopePartialDim)?;
            check(self.alt_rope_theta.is_finite() && self.alt_rope_theta > 0.0, F::AltRopeTheta)?;
        } else {
            // Absent (zero) unless the model is a hybrid, so a file has one encoding.
            let none = self.alt_layer_every == 0 && self.alt_window == 0 && self.alt_rope_dim == 0;
            check(none && self.alt_rope_theta == 0.0, F::AltLayerEvery)?;
        }
        // A merge needs a non-sink slot to land in, at least once the state is full.
        check((self.sink_len as usize) < self.natural_state_len(), F::SinkLen)?;
        if !self.has(flags::VLENS) {
            // The reference adds a per-merged-token row to every slot's count, which only
            // broadcasts when each fold merges exactly as many tokens as there are slots.
            let fixed_full =
                matches!(self.budget, StateBudget::Fixed) && self.natural_state_len() == self.chunk_len as usize;
            if !fixed_full {
                return Err(Error::Unsupported(Unsupported::NoVlensShape));
            }
        }
        Ok(())
    }
}
