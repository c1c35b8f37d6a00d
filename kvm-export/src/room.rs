//! How much state a file has room for. A growable state (power law, saturation) grows
//! with the context up to the reference's cap `n_max_d_chunks` chunks, which the paper
//! sets to 10,000 as "no bound", not as a size anyone allocates. A file gets the room for
//! every slot its state reaches within a context the user chooses (`--max-context`):
//! within it kvm computes what the reference computes; past it the state stops growing
//! and merges every folded token (a fixed state of the room's size).

use anyhow::{bail, Result};
use kvm_core::config::{Config, StateBudget, MAX_STATE_CHUNKS};
use kvm_core::state::state_slots;

pub use kvm_write::policy::DEFAULT_CONTEXT;

/// The longest `--max-context`: 2^26 tokens, 64 times a million-token context, its slot
/// counts found by walking it token by token in about a second.
pub const MAX_CONTEXT: usize = 1 << 26;

/// `cfg` with `max_state_chunks` the room its state needs: for a growable budget, the
/// whole chunks that hold every slot the state reaches within `context` tokens and the
/// step after them, never more than `reference_chunks` (the checkpoint's
/// `n_max_d_chunks`; `u32::MAX` for no cap); for a fixed one, `reference_chunks` cut to
/// the chunks its fixed size fills, which changes nothing it computes.
///
/// # Errors
/// `context` outside `[1, MAX_CONTEXT]`; a state that outgrows the format's 1024 chunks
/// within `context` while the reference would still grow; an invalid config.
pub fn fit(cfg: Config, reference_chunks: u32, context: usize) -> Result<Config> {
    if !(1..=MAX_CONTEXT).contains(&context) {
        bail!("--max-context {context}: must be in [1, {MAX_CONTEXT}] tokens");
    }
    let c = cfg.chunk_len.max(1) as usize;
    let most = Config { max_state_chunks: reference_chunks.min(MAX_STATE_CHUNKS), ..cfg };
    if matches!(cfg.budget, StateBudget::Fixed) {
        let fixed = most.natural_state_len().div_ceil(c) as u32;
        let cfg = Config { max_state_chunks: most.max_state_chunks.min(fixed), ..cfg };
        cfg.validate()?;
        return Ok(cfg);
    }
    most.validate()?;
    let slots = state_slots(&most, most.max_state_len()).nth(context).unwrap_or(0);
    if slots >= most.max_state_len() && reference_chunks > MAX_STATE_CHUNKS {
        bail!(
            "the state grows past {} slots within {context} tokens of context (give a shorter --max-context)",
            most.max_state_len()
        );
    }
    let room = Config { max_state_chunks: (slots.div_ceil(c).max(1) as u32).min(most.max_state_chunks), ..most };
    room.validate()?;
    Ok(room)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Preset, SQRT16};
    use kvm_core::state::growth_stops;

    #[test]
    fn the_paper_sqrt16_state_has_room_for_its_context() {
        let paper = Config { budget: SQRT16, max_state_chunks: 10_000, ..Preset::Paper120m.config() };
        let cfg = fit(paper, 10_000, DEFAULT_CONTEXT).unwrap();
        // 16 * sqrt(65536) = 4096 slots: 16 chunks of 256.
        assert_eq!((cfg.max_state_chunks, cfg.natural_state_len()), (16, 4096));
        let stops = growth_stops(&cfg, cfg.natural_state_len(), MAX_CONTEXT).unwrap();
        assert!(stops > DEFAULT_CONTEXT, "{stops}");
        // With a smaller session (`--state-slots`), sooner.
        assert!(growth_stops(&cfg, 1024, MAX_CONTEXT).unwrap() < DEFAULT_CONTEXT);
        // A shorter context, a smaller file; the slots agree up to it.
        let short = fit(paper, 10_000, 4096).unwrap();
        assert!(short.max_state_chunks < cfg.max_state_chunks);
        let (a, b) = (state_slots(&short, short.natural_state_len()), state_slots(&cfg, cfg.natural_state_len()));
        assert!(a.zip(b).take(4097).all(|(x, y)| x == y));
    }

    #[test]
    fn a_reference_cap_within_the_context_is_kept() {
        let small = Config {
            budget: StateBudget::PowerLaw { factor: 2.0, exponent: 0.5 },
            max_state_chunks: 4,
            chunk_len: 8,
            window_chunks: 2,
            state_min_len: 8,
            ..Preset::Tiny.config()
        };
        assert_eq!(fit(small, 4, DEFAULT_CONTEXT).unwrap().max_state_chunks, 4);
        // 2 * sqrt(ctx) reaches the cap's 32 slots within a few hundred tokens.
        let stops = growth_stops(&small, 32, MAX_CONTEXT).unwrap();
        assert!((200..400).contains(&stops), "{stops}");
    }

    #[test]
    fn contexts_out_of_range_are_refused() {
        let paper = Config { budget: SQRT16, ..Preset::Paper120m.config() };
        for context in [0, MAX_CONTEXT + 1, usize::MAX] {
            assert!(fit(paper, 10_000, context).unwrap_err().to_string().contains("--max-context"));
        }
        let fixed = Preset::Paper120m.config();
        assert_eq!(fit(fixed, 10_000, 1000).unwrap().max_state_chunks, 1);
    }
}
