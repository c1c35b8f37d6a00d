//! Numeric flags with a stated range: clap parses each value and refuses one outside its
//! range before any work starts, with an error that echoes the value as typed and names
//! the range (`invalid value '1e39' for '--temperature <TEMPERATURE>': must be in
//! [0, 100]`).

use std::fmt::Display;
use std::ops::RangeBounds;
use std::str::FromStr;

use kvm_core::sampler::ranges::Shown;
use kvm_runtime::capi::KVM_MAX_THREADS;
use kvm_runtime::pool::default_threads;

/// The most worker threads a command runs, as the C API allows.
pub const MAX_THREADS: usize = KVM_MAX_THREADS as usize;

/// A value parser for a number of type `T` in `range` (NaN is in no range).
pub fn ranged<T, R>(range: R) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: FromStr + PartialOrd + Display + Send + Sync + 'static,
    T::Err: Display,
    R: RangeBounds<T> + Clone + Send + Sync + 'static,
{
    move |s: &str| {
        let v: T = s.parse().map_err(|e| format!("{e}"))?;
        if range.contains(&v) {
            Ok(v)
        } else {
            Err(format!("must be in {}", describe(&range)))
        }
    }
}

/// `--threads`: 1 to [`MAX_THREADS`].
pub fn threads() -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    ranged(1..=MAX_THREADS)
}

/// The threads asked for, or every core (at most [`MAX_THREADS`]).
pub fn threads_or_all(asked: Option<usize>) -> usize {
    asked.unwrap_or_else(|| default_threads().min(MAX_THREADS))
}

/// `range` as `[lo, hi]`, `(lo, hi]`, `[lo, ...)` (as the sampler's ranges are written).
fn describe<T: Display>(range: &impl RangeBounds<T>) -> String {
    Shown::new(range).to_string()
}

#[cfg(test)]
mod tests {
    use std::ops::Bound::{Excluded, Included};

    use super::ranged;

    #[test]
    fn values_outside_the_range_are_refused_naming_it() {
        let p = ranged(0.0f32..=100.0);
        assert_eq!(p("0"), Ok(0.0));
        assert_eq!(p("100"), Ok(100.0));
        for bad in ["1e39", "inf", "-inf", "NaN", "-0.5", "100.5"] {
            assert_eq!(p(bad), Err("must be in [0, 100]".into()), "{bad}");
        }
        assert!(p("x").is_err());
        let open = ranged((Excluded(0.0f64), Included(1.0)));
        assert_eq!(open("0"), Err("must be in (0, 1]".into()));
        assert_eq!(open("1"), Ok(1.0));
        assert_eq!(ranged(1..=256usize)("0"), Err("must be in [1, 256]".into()));
    }
}
