//! The look-back of the repetition penalty: the most recent token ids, kept in a fixed
//! inline buffer, so it costs no allocation and a long generation holds constant memory.
//! `kvm generate` / `kvm chat`, the C API's session and kvm-wasm's all keep theirs in a
//! [`Recent`], which hands [`Sampler::sample`](super::Sampler::sample) its
//! [`tokens`](Recent::tokens).

use crate::error::{Error, Result};

use super::ranges::MAX_REPEAT_WINDOW;

/// The last `window` token ids seen, oldest first, in a buffer of `N` ids (`window <= N`).
///
/// It slides: ids are appended until the buffer is full, then the ones still in the
/// window move to its front. With `N == window` that is a move of `window - 1` ids per
/// id pushed; the slack of a larger `N` makes it rarer. Either way [`Recent::tokens`]
/// is one slice, the shape [`Sampler::sample`](super::Sampler::sample) reads.
///
/// `const fn new`, so it can live in a `static`. `N` is at most `u16::MAX` (the counts
/// are `u16`, which keeps a `Recent<256>` at 1028 bytes on every target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent<const N: usize = { MAX_REPEAT_WINDOW as usize }> {
    /// `[N]`: `buf[..len]` holds the latest ids, oldest first; its last `window` count.
    buf: [u32; N],
    len: u16,
    window: u16,
}

impl<const N: usize> Recent<N> {
    /// An empty look-back that keeps the last `window` ids.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `window > N`.
    pub const fn new(window: u32) -> Result<Recent<N>> {
        const { assert!(N <= u16::MAX as usize, "Recent counts its ids in u16") };
        if window as usize > N {
            return Err(Error::InvalidArgument);
        }
        Ok(Recent { buf: [0; N], len: 0, window: window as u16 })
    }

    /// How many of the latest ids it keeps.
    pub const fn window(&self) -> usize {
        self.window as usize
    }

    /// Appends `ids` (oldest first) as the most recent; of a longer slice only the last
    /// `window` can still count, so only they are copied.
    pub fn push(&mut self, ids: &[u32]) {
        let window = self.window();
        let ids = &ids[ids.len().saturating_sub(window)..];
        let mut len = self.len as usize;
        if len + ids.len() > N {
            // Full: keep the ids that stay in the window, at the front. `ids.len() <=
            // window`, so `keep + ids.len() <= window <= N`.
            let keep = len.min(window - ids.len());
            self.buf.copy_within(len - keep..len, 0);
            len = keep;
        }
        self.buf[len..len + ids.len()].copy_from_slice(ids);
        self.len = (len + ids.len()) as u16;
    }

    /// Forgets every id.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The last `window` ids pushed (fewer until that many were), oldest first.
    pub fn tokens(&self) -> &[u32] {
        let len = self.len as usize;
        &self.buf[len - len.min(self.window())..len]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// The last `window` of everything pushed: what every caller kept before, by hand.
    fn tail(all: &[u32], window: usize) -> &[u32] {
        &all[all.len().saturating_sub(window)..]
    }

    #[test]
    fn window_zero_keeps_nothing() {
        let mut r = Recent::<4>::new(0).unwrap();
        r.push(&[1, 2, 3]);
        r.push(&[]);
        r.push(&[9]);
        assert_eq!(r.tokens(), &[] as &[u32]);
        let mut none = Recent::<0>::new(0).unwrap();
        none.push(&[5, 6]);
        assert_eq!(none.tokens(), &[] as &[u32]);
    }

    #[test]
    fn window_one_keeps_the_last_id() {
        fn check<const N: usize>() {
            let mut r = Recent::<N>::new(1).unwrap();
            assert_eq!(r.tokens(), &[] as &[u32]);
            r.push(&[4]);
            assert_eq!(r.tokens(), &[4]);
            r.push(&[5]);
            assert_eq!(r.tokens(), &[5]);
            r.push(&[6, 7, 8]);
            assert_eq!(r.tokens(), &[8]);
            r.push(&[]);
            assert_eq!(r.tokens(), &[8]);
        }
        check::<1>();
        check::<8>();
    }

    /// Pushes 0 to 4 ids at a time, 60 times, checking the look-back after each.
    fn follow<const N: usize>(window: usize) {
        let mut r = Recent::<N>::new(window as u32).unwrap();
        let mut all = Vec::new();
        for step in 0..60u32 {
            let ids: Vec<u32> = (0..step % 5).map(|i| 100 * step + i).collect();
            all.extend_from_slice(&ids);
            r.push(&ids);
            assert_eq!(r.tokens(), tail(&all, window), "N {N}, window {window}, step {step}");
        }
    }

    #[test]
    fn wraps_around_keeping_the_last_window_in_order() {
        // No slack, some, and plenty.
        follow::<5>(5);
        follow::<7>(5);
        follow::<10>(5);
        follow::<16>(3);
        follow::<4>(4);
        follow::<256>(64);
    }

    #[test]
    fn a_push_longer_than_the_window_keeps_its_tail() {
        let mut r = Recent::<4>::new(3).unwrap();
        r.push(&[1, 2]);
        r.push(&[10, 11, 12, 13, 14, 15, 16]);
        assert_eq!(r.tokens(), &[14, 15, 16]);
        r.push(&[17]);
        assert_eq!(r.tokens(), &[15, 16, 17]);
        let long: Vec<u32> = (0..1000).collect();
        r.push(&long);
        assert_eq!(r.tokens(), &[997, 998, 999]);
    }

    #[test]
    fn clear_forgets_and_starts_over() {
        let mut r = Recent::<3>::new(3).unwrap();
        r.push(&[1, 2, 3, 4]);
        r.clear();
        assert_eq!(r.tokens(), &[] as &[u32]);
        r.push(&[7]);
        assert_eq!(r.tokens(), &[7]);
    }

    #[test]
    fn a_window_past_the_buffer_is_refused() {
        assert_eq!(Recent::<4>::new(5), Err(Error::InvalidArgument));
        assert_eq!(Recent::<0>::new(1), Err(Error::InvalidArgument));
        assert_eq!(Recent::<4>::new(u32::MAX), Err(Error::InvalidArgument));
        assert_eq!(Recent::<256>::new(MAX_REPEAT_WINDOW + 1), Err(Error::InvalidArgument));
        assert_eq!(<Recent>::new(MAX_REPEAT_WINDOW).map(|r| r.window()), Ok(256));
        // It fits where the C API's session kept its history: a usize and 256 ids.
        assert!(core::mem::size_of::<Recent>() <= core::mem::size_of::<(usize, [u32; 256])>());
    }
}
