//! The sampler settings' ranges: one table, which the `kvm` command line parses its flags
//! with, the C API checks `kvm_sampler_set` against and kvm-wasm checks `setSampler`
//! against. Each lies within what [`SamplerConfig::validate`] accepts (which keeps the
//! last word); the table adds the bounds a caller may ask for: a temperature and a penalty
//! of at most 100, and a look-back of at most [`MAX_REPEAT_WINDOW`] tokens (what the C
//! API's session keeps).

use core::fmt;
use core::ops::Bound::{self, Excluded, Included, Unbounded};
use core::ops::RangeBounds;

use super::SamplerConfig;

/// A range as its two bounds (a [`RangeBounds`] that can be half-open at either end).
pub type Range<T> = (Bound<T>, Bound<T>);

/// The longest look-back of the repetition penalty, in tokens.
pub const MAX_REPEAT_WINDOW: u32 = 256;

/// Softmax temperature; 0 is greedy.
pub const TEMPERATURE: Range<f32> = (Included(0.0), Included(100.0));
/// Nucleus sampling; 1 is off.
pub const TOP_P: Range<f32> = (Excluded(0.0), Included(1.0));
/// Least probability relative to the most likely token's; 0 is off.
pub const MIN_P: Range<f32> = (Included(0.0), Included(1.0));
/// Repetition penalty; 1 is off.
pub const REPEAT_PENALTY: Range<f32> = (Excluded(0.0), Included(100.0));
/// Recent tokens the penalty looks at.
pub const REPEAT_WINDOW: Range<u32> = (Included(0), Included(MAX_REPEAT_WINDOW));

/// A field of a [`SamplerConfig`] outside its range; displays as `top_p must be in (0, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutOfRange {
    /// The field, as [`SamplerConfig`] names it.
    pub field: &'static str,
    /// Its range (a `u32` one widened, exactly).
    pub range: Range<f64>,
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} must be in {}", self.field, Shown::new(&self.range))
    }
}

/// A range written as `[lo, hi]`, `(lo, hi]`, `[lo, ...)`.
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a, T> {
    start: Bound<&'a T>,
    end: Bound<&'a T>,
}

impl<'a, T> Shown<'a, T> {
    /// `range`'s bounds, to display.
    pub fn new(range: &'a impl RangeBounds<T>) -> Self {
        Shown { start: range.start_bound(), end: range.end_bound() }
    }
}

impl<T: fmt::Display> fmt::Display for Shown<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.start {
            Included(lo) => write!(f, "[{lo}, ")?,
            Excluded(lo) => write!(f, "({lo}, ")?,
            Unbounded => write!(f, "(..., ")?,
        }
        match self.end {
            Included(hi) => write!(f, "{hi}]"),
            Excluded(hi) => write!(f, "{hi})"),
            Unbounded => write!(f, "...)"),
        }
    }
}

/// The first field of `cfg` outside its range, in declaration order (NaN is in none;
/// `top_k` has none).
pub fn check(cfg: &SamplerConfig) -> Result<(), OutOfRange> {
    fn within<T: PartialOrd + Into<f64>>(field: &'static str, range: Range<T>, v: T) -> Result<(), OutOfRange> {
        if range.contains(&v) {
            Ok(())
        } else {
            Err(OutOfRange { field, range: (range.0.map(Into::into), range.1.map(Into::into)) })
        }
    }
    within("temperature", TEMPERATURE, cfg.temperature)?;
    within("top_p", TOP_P, cfg.top_p)?;
    within("min_p", MIN_P, cfg.min_p)?;
    within("repeat_penalty", REPEAT_PENALTY, cfg.repeat_penalty)?;
    within("repeat_window", REPEAT_WINDOW, cfg.repeat_window)
}

/// Whether every field of `cfg` is in its range.
pub fn contain(cfg: &SamplerConfig) -> bool {
    check(cfg).is_ok()
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn the_defaults_and_greedy_are_in_range_and_within_validate() {
        for cfg in [SamplerConfig::DEFAULT, SamplerConfig::greedy()] {
            assert_eq!(check(&cfg), Ok(()));
            assert!(cfg.validate().is_ok());
        }
    }

    #[test]
    fn the_first_field_out_of_range_is_named_with_its_range() {
        let out = |cfg: SamplerConfig| check(&cfg).unwrap_err().to_string();
        let d = SamplerConfig::DEFAULT;
        assert_eq!(out(SamplerConfig { temperature: 100.5, ..d }), "temperature must be in [0, 100]");
        assert_eq!(out(SamplerConfig { top_p: 0.0, min_p: -1.0, ..d }), "top_p must be in (0, 1]");
        assert_eq!(out(SamplerConfig { min_p: f32::NAN, ..d }), "min_p must be in [0, 1]");
        assert_eq!(out(SamplerConfig { repeat_penalty: 0.0, ..d }), "repeat_penalty must be in (0, 100]");
        assert_eq!(out(SamplerConfig { repeat_window: 257, ..d }), "repeat_window must be in [0, 256]");
        assert!(contain(&SamplerConfig { repeat_window: 256, temperature: 100.0, ..d }));
    }

    #[test]
    fn every_range_lies_within_validate() {
        // Each bound the table includes, and the nearest value inside an excluded one.
        let d = SamplerConfig::DEFAULT;
        let inside = |b: Bound<f32>, up: bool| match b {
            Included(v) => v,
            Excluded(v) => f32::from_bits(if up { v.to_bits() + 1 } else { v.to_bits() - 1 }),
            Unbounded => unreachable!("every range is bounded"),
        };
        for (lo, hi) in [TEMPERATURE, TOP_P, MIN_P, REPEAT_PENALTY] {
            let ends = [inside(lo, true), inside(hi, false)];
            for v in ends {
                let cfgs = [
                    SamplerConfig { temperature: v, ..d },
                    SamplerConfig { top_p: v, ..d },
                    SamplerConfig { min_p: v, ..d },
                    SamplerConfig { repeat_penalty: v, ..d },
                ];
                for cfg in cfgs.iter().filter(|c| contain(c)) {
                    assert!(cfg.validate().is_ok(), "{cfg:?}");
                }
            }
        }
    }
}
