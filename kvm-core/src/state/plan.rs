//! What one token does to the means state (spec §3): the [`Counters`] every layer and
//! head share, the [`Plan`] of a step derived from them (initial append, fold, target
//! size, which window and state slots attention reads) and [`bswa_begin`].

use crate::config::{flags, Config, StateBudget, MAX_STATE_CHUNKS};

/// Where the sequence is: the counters shared by every layer and head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Tokens seen.
    pub pos: usize,
    /// Live state slots.
    pub slots: usize,
    /// The state covers tokens `[0, coverage)`.
    pub coverage: usize,
}

impl Counters {
    #[inline]
    pub(crate) fn new(pos: usize, slots: usize, coverage: usize) -> Counters {
        Counters { pos, slots, coverage }
    }

    /// The counters after `n` more tokens in a session of at most `state_len` slots: the
    /// counters alone decide each token's [`Plan`].
    pub(crate) fn after(self, cfg: &Config, state_len: usize, n: usize) -> Counters {
        (0..n).fold(self, |at, _| Plan::new(cfg, state_len, at, Phase::Decode).next())
    }
}

/// How a token enters the session: prompt tokens gate the initial state when the model
/// says so (`kvm_apply_merge_gate_to_initial_state`); the reference's decode path never
/// does, and kvm reproduces both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Phase {
    Prefill,
    Decode,
}

/// What the means state does during one step (the same for every layer and head).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// Absolute position of the new token.
    pub t: usize,
    /// `Some(slot)`: the token is copied straight into the initial state.
    pub initial: Option<usize>,
    /// Whether the initial copy is gated.
    pub gate_initial: bool,
    /// `Some(b)`: chunk `[b, b + chunk_len)` leaves the window and is folded first.
    pub fold_begin: Option<usize>,
    /// Slots before and after this step's update.
    pub slots_before: usize,
    pub slots_after: usize,
    /// The token attends to window tokens `[window_begin, t]`.
    pub window_begin: usize,
    /// Whether the state is read (`n > window_len`).
    pub read_state: bool,
    pub coverage_after: usize,
}

/// The first window token a step with `n` tokens seen attends to (spec §3):
/// `bswa_begin(n) = max(0, ceil(n / C) * C - W)`.
#[inline]
pub fn bswa_begin(cfg: &Config, n: usize) -> usize {
    let c = cfg.chunk_len as usize;
    (n.div_ceil(c) * c).saturating_sub(cfg.window_len())
}

/// The state's coverage once `pos` tokens are in, in every session (what [`Plan`] leaves
/// after each step): the first chunk, then everything before the window.
#[inline]
pub(crate) fn coverage_at(cfg: &Config, pos: usize) -> usize {
    pos.min(cfg.chunk_len as usize).max(bswa_begin(cfg, pos))
}

impl Plan {
    /// The step of the token at `at.pos` in a session of at most `state_len` slots.
    pub(crate) fn new(cfg: &Config, state_len: usize, at: Counters, phase: Phase) -> Plan {
        let c = cfg.chunk_len as usize;
        let t = at.pos;
        let n = t + 1;
        let window_begin = bswa_begin(cfg, n);
        let coverage_after = coverage_at(cfg, n);
        let mut plan = Plan {
            t,
            initial: None,
            gate_initial: phase == Phase::Prefill && cfg.has(flags::GATE_INITIAL_STATE),
            fold_begin: None,
            slots_before: at.slots,
            slots_after: at.slots,
            window_begin,
            read_state: n > cfg.window_len(),
            coverage_after,
        };
        if t < c {
            plan.initial = Some(at.slots);
            plan.slots_after = at.slots + 1;
        } else if coverage_after > at.coverage {
            let b = at.coverage;
            plan.fold_begin = Some(b);
            let target = target_slots(cfg, state_len, b + cfg.window_len(), b + c, at.slots);
            plan.slots_after = at.slots + (target - at.slots).min(c);
        }
        plan
    }
}

/// The state's slot counts along a session of at most `state_len` slots, without running
/// the model: the `n`-th item (from 1) is the slot count once `n` tokens are in, which is
/// what the `n`-th token's attention reads (a fold comes before the token's read). The
/// counters of spec §3 alone decide it, so it holds for every model of `cfg`.
pub fn state_slots(cfg: &Config, state_len: usize) -> impl Iterator<Item = usize> + '_ {
    let mut at = Counters::new(0, 0, 0);
    core::iter::from_fn(move || {
        at = Plan::new(cfg, state_len, at, Phase::Decode).next();
        Some(at.slots)
    })
}

/// The first context length (tokens in) at which a session of `cfg` holding at most
/// `state_len` slots has fewer slots than with the most room the format allows (1024
/// chunks): where its room stops the state's growth, after which it merges every folded
/// token. `None` for a fixed state, or if that does not happen within `within` tokens.
pub fn growth_stops(cfg: &Config, state_len: usize, within: usize) -> Option<usize> {
    if matches!(cfg.budget, StateBudget::Fixed) {
        return None;
    }
    let most = Config { max_state_chunks: MAX_STATE_CHUNKS, ..*cfg };
    let stops = state_slots(&most, most.max_state_len())
        .zip(state_slots(cfg, state_len))
        .take(within)
        .position(|(free, room)| free != room);
    stops.map(|p| p + 1)
}

impl Plan {
    /// The counters after this step.
    pub(crate) fn next(&self) -> Counters {
        Counters { pos: self.t + 1, slots: self.slots_after, coverage: self.coverage_after }
    }
}

/// Most tokens of one [`Segment`]: its plans live on the stack (a few hundred bytes on a
/// 32-bit MCU), and eight queries per head already reuse each head's keys from cache.
pub(crate) const SEGMENT_LEN: usize = 8;

/// The plans of consecutive tokens within one chunk, each computed once: the state
/// updates of the segment's tokens read them in order, then every head's attention. Folds
/// happen only at a chunk's first token, so once a segment's tokens are in, the state
/// each of them reads is final.
pub(crate) struct Segment {
    plans: [Plan; SEGMENT_LEN],
    len: usize,
}

impl Segment {
    /// The plans of the tokens from `at.pos` on: `n` of them (`n >= 1`) or fewer, up to
    /// the chunk's end or [`SEGMENT_LEN`].
    pub(crate) fn new(cfg: &Config, state_len: usize, at: Counters, phase: Phase, n: usize) -> Segment {
        let c = cfg.chunk_len as usize;
        let len = n.min(c - at.pos % c).clamp(1, SEGMENT_LEN);
        let mut plans = [Plan::new(cfg, state_len, at, phase); SEGMENT_LEN];
        for i in 1..len {
            plans[i] = Plan::new(cfg, state_len, plans[i - 1].next(), phase);
        }
        Segment { plans, len }
    }

    /// `[len]`, in token order.
    #[inline]
    pub(crate) fn plans(&self) -> &[Plan] {
        &self.plans[..self.len]
    }

    /// The counters after the segment's last token.
    #[inline]
    pub(crate) fn next(&self) -> Counters {
        self.plans[self.len - 1].next()
    }
}

/// The state size a fold grows to (spec §3 "Target size"), capped by the arena.
fn target_slots(cfg: &Config, state_len: usize, ctx: usize, avail: usize, cur: usize) -> usize {
    let round_down = |x: f64| -> i64 {
        let x = if x > 0.0 { libm::floor(x) as i64 } else { 0 };
        x / cfg.state_round_down as i64 * cfg.state_round_down as i64
    };
    let min_len = cfg.state_min_len as i64;
    let want = match cfg.budget {
        StateBudget::Fixed => min_len,
        StateBudget::PowerLaw { factor, exponent } => round_down(factor * libm::pow(ctx as f64, exponent)).max(min_len),
        StateBudget::Saturation { n } => round_down(n * ctx as f64 / (n + ctx as f64)).max(min_len),
    };
    let cap = avail.min(cfg.chunk_len as usize * cfg.max_state_chunks as usize).min(state_len);
    let want = if want < 0 { 0 } else { (want as u64).min(cap as u64) as usize };
    want.max(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of 4, a window of 8, room for 16 slots, 2 * ctx^0.5 of them, at least 4.
    fn small() -> Config {
        Config {
            vocab_len: 16,
            n_layers: 1,
            n_heads: 1,
            d_model: 8,
            d_qk: 8,
            d_v: 8,
            d_ff: 8,
            d_vgate: 0,
            rope_dim: 2,
            rope_theta: 10000.0,
            chunk_len: 4,
            window_chunks: 2,
            max_state_chunks: 4,
            budget: StateBudget::PowerLaw { factor: 2.0, exponent: 0.5 },
            state_min_len: 4,
            state_round_down: 1,
            sink_len: 1,
            logit_softcap: 0.0,
            residual_scale: 1.0,
            flags: flags::VLENS,
            alt_layer_every: 0,
            alt_window: 0,
            alt_rope_dim: 0,
            alt_rope_theta: 0.0,
        }
    }

    #[test]
    fn state_slots_follow_the_budget_chunk_by_chunk() {
        let cfg = small();
        cfg.validate().unwrap();
        // The first chunk enters whole; the first fold comes with token 13 (its chunk
        // [4, 8) leaves the window, ctx = 12: floor(2 * 12^0.5) = 6), then every 4 tokens:
        // ctx 16 -> 8, 20 -> 8, 24 -> 9, 28 -> 10.
        let grown = [1, 2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10];
        assert!(state_slots(&cfg, 16).take(30).eq(grown));
        // A smaller arena stops the growth at its size.
        assert!(state_slots(&cfg, 9).take(30).eq(grown.map(|s| s.min(9))));
        // A fixed state of 4 never grows past the first chunk.
        let fixed = Config { budget: StateBudget::Fixed, max_state_chunks: 1, ..cfg };
        assert!(state_slots(&fixed, 4).take(30).eq(grown.map(|s| s.min(4))));
    }

    /// The counters `Session::restore` accepts are those of every step: the coverage
    /// `coverage_at` says, the first chunk's slots one a token, then no fewer than a chunk
    /// and no more than the coverage or the room.
    #[test]
    fn every_step_has_the_coverage_and_slots_restore_accepts() {
        let base = small();
        let fixed = Config { budget: StateBudget::Fixed, max_state_chunks: 1, ..base };
        let wide = Config { chunk_len: 3, window_chunks: 1, budget: StateBudget::Saturation { n: 8.0 }, ..base };
        for (cfg, state_len) in [(base, 16), (base, 9), (fixed, 4), (wide, 12)] {
            let c = cfg.chunk_len as usize;
            let mut at = Counters::new(0, 0, 0);
            for _ in 0..500 {
                assert_eq!(at.coverage, coverage_at(&cfg, at.pos), "{cfg:?} at {}", at.pos);
                if at.pos <= c {
                    assert_eq!(at.slots, at.pos);
                } else {
                    assert!(c <= at.slots && at.slots <= at.coverage.min(state_len), "{at:?}");
                }
                at = Plan::new(&cfg, state_len, at, Phase::Decode).next();
            }
        }
    }
}
