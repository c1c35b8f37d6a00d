//! Byte-level BPE of one piece, in a scratch of one `u32` per byte of the piece.
//!
//! The result is the one of Hugging Face `tokenizers`: start from the piece's byte tokens
//! and repeatedly merge the adjacent pair with the lowest rank, the leftmost on a tie
//! (their merge queue pops `(rank, position)` minima; the section's validation makes its
//! stale-entry check exact, see `Tables::new`).
//!
//! Each scratch slot holds one symbol together with the merge it forms with its right
//! neighbour, so the lowest-ranked pair is found without a second array:
//! `PAIR | m` for merge entry `m` (the symbol is `merges[m].left`), or the bare token id
//! when the symbol does not merge with its neighbour (or is the last one).

use super::section::{Tables, MAX_COUNT};

/// Tags a slot holding a merge index; ids and merge indices are below [`MAX_COUNT`].
const PAIR: u32 = MAX_COUNT;

impl Tables<'_> {
    /// The slot of symbol `left` followed by `right`. Validated ids are below `PAIR`; the
    /// mask keeps an unvalidated one from passing for a merge index.
    fn slot(&self, left: u32, right: Option<u32>) -> u32 {
        match right.and_then(|r| self.find_merge(left, r)) {
            Some(m) => PAIR | m as u32,
            None => left & !PAIR,
        }
    }

    /// The token a slot holds.
    fn slot_id(&self, slot: u32) -> u32 {
        if slot & PAIR != 0 {
            self.merge_left((slot & !PAIR) as usize)
        } else {
            slot
        }
    }

    /// The rank of the merge a slot forms with its right neighbour, if any.
    fn slot_rank(&self, slot: u32) -> Option<u32> {
        (slot & PAIR != 0).then(|| self.merge_rank((slot & !PAIR) as usize))
    }
}

fn min_rank(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// BPE-encodes `piece` using `scratch[..piece.len()]` and leaves the ids at the front of
/// `scratch`; returns their count. `scratch` must hold `piece.len()` slots (0 otherwise).
pub(crate) fn encode_piece(t: &Tables<'_>, piece: &[u8], scratch: &mut [u32]) -> usize {
    let Some(s) = scratch.get_mut(..piece.len()) else {
        return 0;
    };
    let mut min = None;
    for (i, slot) in s.iter_mut().enumerate() {
        let left = piece.get(i).map_or(0, |&b| t.byte_id(b));
        let right = piece.get(i + 1).map(|&b| t.byte_id(b));
        *slot = t.slot(left, right);
        min = min_rank(min, t.slot_rank(*slot));
    }
    let mut len = s.len();
    // Each pass merges at least once, so there are fewer passes than bytes.
    while let Some(rank) = min {
        let (new_len, new_min) = merge_pass(t, s.get_mut(..len).unwrap_or_default(), rank);
        if new_len == len {
            break;
        }
        (len, min) = (new_len, new_min);
    }
    for slot in s.iter_mut().take(len) {
        *slot = t.slot_id(*slot);
    }
    len
}

/// One left-to-right sweep merging pairs of rank `k`, the lowest present, in exactly the
/// order a `(rank, position)` queue would: it stops merging once a merge creates a pair
/// of rank `<= k` behind the sweep or `< k` ahead of it, which the queue would take
/// first. Compacts `s` in place; returns the new length and lowest rank.
fn merge_pass(t: &Tables<'_>, s: &mut [u32], k: u32) -> (usize, Option<u32>) {
    let Some(&first) = s.first() else {
        return (0, None);
    };
    let mut min = None;
    let mut stop = false;
    // s[..w] holds the symbols swept past (s[w - 1] may still change); `cur` is the
    // symbol under the sweep, s[r] its right neighbour; w < r always.
    let (mut w, mut r, mut cur) = (0usize, 1usize, first);
    loop {
        if !stop && r < s.len() && t.slot_rank(cur) == Some(k) {
            let merged = t.merged((cur & !PAIR) as usize);
            r += 1;
            cur = t.slot(merged, s.get(r).map(|&x| t.slot_id(x)));
            if let Some(prev) = w.checked_sub(1).and_then(|i| s.get_mut(i)) {
                *prev = t.slot(t.slot_id(*prev), Some(merged));
                stop |= t.slot_rank(*prev).is_some_and(|p| p <= k);
            }
            stop |= t.slot_rank(cur).is_some_and(|p| p < k);
            continue;
        }
        if let Some(&prev) = w.checked_sub(1).and_then(|i| s.get(i)) {
            min = min_rank(min, t.slot_rank(prev));
        }
        let Some(dst) = s.get_mut(w) else { break };
        *dst = cur;
        w += 1;
        match s.get(r) {
            Some(&next) => cur = next,
            None => break,
        }
        r += 1;
    }
    if let Some(&last) = w.checked_sub(1).and_then(|i| s.get(i)) {
        min = min_rank(min, t.slot_rank(last));
    }
    (w, min)
}
