//! The [`Session`]: a model and all of its decode state in the caller's arena (laid out
//! by [`crate::state::Layout`]), fed token by token or in batches; counters, snapshots,
//! and [`LayerView`] for inspection.

use crate::cache::Rows;
use crate::config::Config;
use crate::error::{Error, Origin, Result};
use crate::exec::{Exec, Serial};
use crate::forward::{forward, FloatActs, IntActs, Logits, Pass, Tap, TapFn};
use crate::math::{all_finite, Rope};
use crate::model::Model;
use crate::state::arena::COUNTERS;
use crate::state::arena_int::IntScratch;
use crate::state::plan::Plan;
use crate::state::{bswa_begin, coverage_at, Acts, Counters, Layout, Phase, ARENA_ALIGN};

/// Marks a live arena (`"KVMS"`).
const STAMP: u32 = 0x534D_564B;

/// A decoding session: the model's weights (borrowed) and all of its state, in the
/// caller's arena. Decoding allocates nothing.
#[derive(Debug)]
pub struct Session<'m, 'a> {
    model: Model<'m>,
    rope: Rope,
    /// The alternate layers' (spec §5; no pairs without them).
    alt_rope: Rope,
    layout: Layout,
    /// `[layout.arena_len() / 4]`, see the module docs.
    arena: &'a mut [f32],
}

/// Indices of the counters block.
mod counter {
    pub const STAMP: usize = 0;
    pub const POS: usize = 1;
    pub const SLOTS: usize = 2;
    pub const COVERAGE: usize = 3;
    pub const STATE_LEN: usize = 4;
    pub const ARENA_LEN: usize = 5;
    /// [`crate::Model::identity`]: a snapshot restores only into the model it came from.
    pub const MODEL: usize = 6;
    /// In a snapshot, the CRC-32 of its every other byte; zero in the arena.
    pub const CRC: usize = 7;
    /// Bits of state about the session, [`flag`]; zero in every snapshot written before
    /// the word had a use (words 8..15 were all zero), so those read as "no flags".
    pub const FLAGS: usize = 8;
}

/// Bits of [`counter::FLAGS`].
mod flag {
    /// The arena's logits ([`super::Session::logits`]) are those of the current position:
    /// set by a step run with `Logits::Last`, cleared by any other step and by a reset. In
    /// a snapshot: the logits follow the state.
    pub const LOGITS: u32 = 1 << 0;
}

/// The CRC of snapshot `snap`: every byte but those of [`counter::CRC`].
fn snapshot_crc(snap: &[u8]) -> u32 {
    let at = counter::CRC * 4;
    crate::crc::crc32_update(crate::crc::crc32(&snap[..at]), &snap[at + 4..])
}

impl<'m, 'a> Session<'m, 'a> {
    /// Creates a session of `model` at its default state capacity inside `arena`, which
    /// must be exactly [`Model::arena_len`] bytes and [`ARENA_ALIGN`]-aligned.
    ///
    /// # Errors
    /// [`Error::ArenaSize`], [`Error::ArenaMisaligned`].
    pub fn new(model: Model<'m>, arena: &'a mut [u8]) -> Result<Self> {
        let state_len = model.header().state_capacity as usize;
        Self::with_state_len(model, arena, state_len)
    }

    /// As [`Session::new`] with at most `state_len` state slots (growable models follow
    /// the reference exactly until the state reaches `state_len`, then keep merging
    /// without growing); `arena` must be [`Model::arena_len_for`]`(state_len)` bytes.
    ///
    /// # Errors
    /// [`Error::BadConfig`] for a capacity out of range, [`Error::ArenaSize`],
    /// [`Error::ArenaMisaligned`].
    pub fn with_state_len(model: Model<'m>, arena: &'a mut [u8], state_len: usize) -> Result<Self> {
        let layout = Layout::new(model.config(), state_len, model.cache(), model.slot_reads())?;
        if arena.len() != layout.arena_len() {
            return Err(Error::ArenaSize { expected: layout.arena_len(), got: arena.len() });
        }
        let arena: &mut [f32] = bytemuck::try_cast_slice_mut(arena).map_err(|_| Error::ArenaMisaligned)?;
        if !(arena.as_ptr() as usize).is_multiple_of(ARENA_ALIGN) {
            return Err(Error::ArenaMisaligned);
        }
        let cfg = model.config();
        let rope = Rope::new(cfg.rope_dim as usize / 2, cfg.rope_theta);
        let alt_rope = Rope::new(cfg.alt_rope_dim as usize / 2, cfg.alt_rope_theta);
        let mut session = Session { model, rope, alt_rope, layout, arena };
        session.reset();
        Ok(session)
    }

    /// Forgets every token: the session is as new.
    pub fn reset(&mut self) {
        let state = self.layout.state_floats();
        self.arena[..state].fill(0.0);
        let c: &mut [u32] = bytemuck::cast_slice_mut(&mut self.arena[..COUNTERS]);
        c[counter::STAMP] = STAMP;
        c[counter::STATE_LEN] = self.layout.state_len as u32;
        c[counter::ARENA_LEN] = self.layout.arena_len() as u32;
        c[counter::MODEL] = self.model.identity();
        c[counter::FLAGS] = 0;
    }

    /// The model this session decodes.
    #[inline]
    pub fn model(&self) -> &Model<'m> {
        &self.model
    }

    /// The arena layout.
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn counters(&self) -> Counters {
        counters_in(&self.arena[..COUNTERS])
    }

    /// Tokens seen so far.
    #[inline]
    pub fn pos(&self) -> usize {
        self.counters().pos
    }

    /// Live state slots (the same in every layer and head).
    #[inline]
    pub fn state_slots(&self) -> usize {
        self.counters().slots
    }

    /// Feeds one token. `phase` matters only for models that gate their initial state
    /// (see [`Phase`]); with `want_logits` the token's logits are left in
    /// [`Session::logits`].
    ///
    /// # Errors
    /// [`Error::TokenOutOfRange`]; [`Error::InvalidArgument`] once the position counter
    /// would overflow (after 2^32 - 1 tokens); [`Error::NonFiniteLogits`] when logits were
    /// asked for and hold a NaN or an infinity (the step was taken).
    pub fn step(&mut self, token: u32, phase: Phase, want_logits: bool) -> Result<()> {
        let logits = if want_logits { Logits::Last } else { Logits::None };
        self.run(&[token], phase, None, logits, &Serial, None)
    }

    /// [`Session::step`], calling `tap` at every [`Tap`] point (for an integer file, with
    /// the f32 of each fixed-point value, exact to 24 bits).
    ///
    /// # Errors
    /// As [`Session::step`].
    pub fn step_tapped(
        &mut self,
        token: u32,
        phase: Phase,
        want_logits: bool,
        tap: &mut dyn FnMut(Tap, &[f32]),
    ) -> Result<()> {
        let logits = if want_logits { Logits::Last } else { Logits::None };
        self.run(&[token], phase, None, logits, &Serial, Some(tap))
    }

    /// Feeds `tokens` as one batch: every matrix product runs over all of them at once,
    /// so each weight is read once per batch instead of once per token, while the state
    /// is updated token by token exactly as [`Session::step`] would. `batch` is scratch
    /// of at least [`Layout::acts_len`]`(tokens.len())` f32s; `exec` runs the products
    /// (the std runtime passes a thread pool). An integer file's session
    /// ([`Layout::is_int`]) runs the forward pass token by token (its activations are one
    /// token's), with the bits of single steps: its `acts_len` is 0, `batch` goes unused,
    /// and `exec` splits each token's products by rows (docs/integer.md).
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] for a short `batch` or `Logits::All` buffer;
    /// [`Error::InvalidArgument`] for no tokens; as [`Session::step`]. Nothing is
    /// consumed on error, but for [`Error::NonFiniteLogits`]: the batch was fed.
    pub fn step_batch(
        &mut self,
        tokens: &[u32],
        phase: Phase,
        batch: &mut [f32],
        exec: &dyn Exec,
        logits: Logits<'_>,
    ) -> Result<()> {
        self.run(tokens, phase, Some(batch), logits, exec, None)
    }

    fn run(
        &mut self,
        tokens: &[u32],
        phase: Phase,
        batch: Option<&mut [f32]>,
        mut logits: Logits<'_>,
        exec: &dyn Exec,
        tap: Option<&mut TapFn<'_>>,
    ) -> Result<()> {
        let vocab_len = self.model.config().vocab_len;
        if tokens.is_empty() {
            return Err(Error::InvalidArgument);
        }
        if let Some(&token) = tokens.iter().find(|&&t| t >= vocab_len) {
            return Err(Error::TokenOutOfRange { token, vocab_len });
        }
        if let Logits::All(out) = &logits {
            let needed = tokens.len() * vocab_len as usize;
            if out.len() < needed {
                return Err(Error::BufferTooSmall { needed });
            }
        }
        let at = self.counters();
        if at.pos.checked_add(tokens.len()).is_none_or(|end| end > u32::MAX as usize) {
            return Err(Error::InvalidArgument);
        }
        let pass = Pass::new(&self.model, (&self.rope, &self.alt_rope), &self.layout, at, phase, exec);
        let last = matches!(logits, Logits::Last);
        if self.layout.is_int() {
            run_int(&pass, self.arena, tokens, logits, tap)?;
            self.set_has_logits(last);
            return Ok(());
        }
        // An error here consumed nothing: the flag stays as it was.
        let origin = run_float(&pass, self.arena, tokens, batch, logits.reborrow(), tap)?;
        let vocab = vocab_len as usize;
        let checked = match logits {
            Logits::None => Ok(()),
            Logits::Last => check_finite(self.logits(), vocab, at.pos + tokens.len() - 1, origin),
            Logits::All(out) => check_finite(&out[..tokens.len() * vocab], vocab, at.pos, origin),
        };
        // Non-finite logits are not the position's to sample from, nor to save.
        self.set_has_logits(last && checked.is_ok());
        checked
    }

    fn flags(&self) -> u32 {
        bytemuck::cast_slice::<f32, u32>(&self.arena[..COUNTERS])[counter::FLAGS]
    }

    fn set_has_logits(&mut self, yes: bool) {
        let c: &mut [u32] = bytemuck::cast_slice_mut(&mut self.arena[..COUNTERS]);
        c[counter::FLAGS] = (c[counter::FLAGS] & !flag::LOGITS) | if yes { flag::LOGITS } else { 0 };
    }

    /// Whether [`Session::logits`] are those of the current position: the last step ran
    /// with `want_logits` (or `Logits::Last`) and they were finite, or they were restored
    /// ([`Session::restore`] of a snapshot with logits, [`Session::restore_with_logits`]). A new or
    /// reset session has none.
    #[inline]
    pub fn has_logits(&self) -> bool {
        self.flags() & flag::LOGITS != 0
    }

    /// The logits of the last step run with `want_logits`, `[vocab_len]`.
    pub fn logits(&self) -> &[f32] {
        let start = self.layout.state_floats();
        &self.arena[start..start + self.model.config().vocab_len as usize]
    }

    /// [`Session::logits`] of the ids that have text, `[text_len]`
    /// ([`Tokenizer::text_len`](crate::tokenizer::Tokenizer::text_len)): what a sampler
    /// picks from, so that it never picks a padding id.
    pub fn text_logits(&self) -> &[f32] {
        let logits = self.logits();
        logits.get(..self.model.tokenizer().text_len() as usize).unwrap_or(logits)
    }

    /// Feeds one generated token and returns its logits.
    ///
    /// # Errors
    /// As [`Session::step`].
    pub fn decode(&mut self, token: u32) -> Result<&[f32]> {
        self.step(token, Phase::Decode, true)?;
        Ok(self.logits())
    }

    /// [`Session::decode`] with the matrix products run by `exec` (a thread pool).
    ///
    /// # Errors
    /// As [`Session::step`].
    pub fn decode_with(&mut self, token: u32, exec: &dyn Exec) -> Result<&[f32]> {
        self.run(&[token], Phase::Decode, None, Logits::Last, exec, None)?;
        Ok(self.logits())
    }

    /// Feeds a prompt and returns the logits after its last token.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty prompt; as [`Session::step`] (tokens
    /// before the bad one have been consumed).
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        let (last, head) = tokens.split_last().ok_or(Error::InvalidArgument)?;
        for &t in head {
            self.step(t, Phase::Prefill, false)?;
        }
        self.step(*last, Phase::Prefill, true)?;
        Ok(self.logits())
    }

    /// Bytes [`Session::snapshot`] writes.
    #[inline]
    pub fn snapshot_len(&self) -> usize {
        self.layout.snapshot_len()
    }

    /// Bytes [`Session::snapshot_with_logits`] writes: the state's, then `[vocab_len]` f32.
    #[inline]
    pub fn snapshot_len_with_logits(&self) -> usize {
        self.snapshot_len() + 4 * self.model.config().vocab_len as usize
    }

    /// Copies the session's whole state (constant size) into `out`, with a CRC-32 of
    /// every byte, so that [`Session::restore`] takes back only the bytes saved. The
    /// snapshot holds no logits: after restoring it, a token must be fed before sampling.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `out` is shorter than [`Session::snapshot_len`].
    pub fn snapshot(&self, out: &mut [u8]) -> Result<usize> {
        self.write_snapshot(out, false)
    }

    /// As [`Session::snapshot`], followed by [`Session::logits`] (the arena's words right
    /// after the state, so the snapshot is one copy), under the same CRC: restored, the
    /// session samples its next token from them with no token fed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the session has no logits of its position
    /// ([`Session::has_logits`]); [`Error::BufferTooSmall`] if `out` is shorter than
    /// [`Session::snapshot_len_with_logits`].
    pub fn snapshot_with_logits(&self, out: &mut [u8]) -> Result<usize> {
        if !self.has_logits() {
            return Err(Error::InvalidArgument);
        }
        self.write_snapshot(out, true)
    }

    /// Bytes [`Session::snapshot_as_is`] writes now: [`Session::snapshot_len_with_logits`]
    /// when the session has logits of its position, else [`Session::snapshot_len`].
    #[inline]
    pub fn snapshot_as_is_len(&self) -> usize {
        if self.has_logits() {
            self.snapshot_len_with_logits()
        } else {
            self.snapshot_len()
        }
    }

    /// The session's snapshot as it is: with the logits when it has them
    /// ([`Session::snapshot_with_logits`]), the state alone otherwise
    /// ([`Session::snapshot`]); [`Session::snapshot_as_is_len`] bytes.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `out` is shorter than [`Session::snapshot_as_is_len`].
    pub fn snapshot_as_is(&self, out: &mut [u8]) -> Result<usize> {
        self.write_snapshot(out, self.has_logits())
    }

    /// The snapshot layout (FORMAT.md, "Session snapshots"): the arena's first
    /// `snapshot_len` bytes (+ the logits' with `logits`), the flags word saying which,
    /// the CRC of every other byte in its word.
    fn write_snapshot(&self, out: &mut [u8], logits: bool) -> Result<usize> {
        let n = if logits { self.snapshot_len_with_logits() } else { self.snapshot_len() };
        let out = out.get_mut(..n).ok_or(Error::BufferTooSmall { needed: n })?;
        out.copy_from_slice(bytemuck::cast_slice(&self.arena[..n / 4]));
        let flags = (self.flags() & !flag::LOGITS) | if logits { flag::LOGITS } else { 0 };
        out[counter::FLAGS * 4..counter::FLAGS * 4 + 4].copy_from_slice(&flags.to_le_bytes());
        let crc = snapshot_crc(out);
        out[counter::CRC * 4..counter::CRC * 4 + 4].copy_from_slice(&crc.to_le_bytes());
        Ok(n)
    }

    /// Restores a [`Session::snapshot`] or a [`Session::snapshot_with_logits`] of a
    /// session of the same model and layout (told apart by length); decoding then
    /// continues bit-exactly as it would have from the snapshot, and with logits
    /// [`Session::has_logits`] holds. On an error the session is unchanged.
    ///
    /// # Errors
    /// [`Error::BadSnapshot`] if `snap` has neither length, any byte other than the one
    /// saved (its CRC), the wrong layout stamp, flags other than its length says, counters
    /// no session of this layout reaches or non-finite logits, or comes from another model
    /// (another header: config, tensor table or tokenizer).
    pub fn restore(&mut self, snap: &[u8]) -> Result<()> {
        let n = self.snapshot_len();
        let logits = snap.len() == self.snapshot_len_with_logits();
        if !(snap.len() == n || logits) || n < COUNTERS * 4 {
            return Err(Error::BadSnapshot);
        }
        let word = |i: usize| u32::from_le_bytes([snap[i * 4], snap[i * 4 + 1], snap[i * 4 + 2], snap[i * 4 + 3]]);
        let (pos, slots, coverage) =
            (word(counter::POS) as usize, word(counter::SLOTS) as usize, word(counter::COVERAGE) as usize);
        // The counters every session of this layout has at `pos` (the CRC only shows that
        // the bytes are those saved, not that a session saved them); anything else could
        // index past the state.
        let cfg = self.model.config();
        let chunk = cfg.chunk_len as usize;
        let slots_ok = match pos <= chunk {
            // The first chunk enters the state token by token.
            true => slots == pos,
            // Folds add slots, up to the state's room, from tokens the state covers.
            false => chunk <= slots && slots <= coverage.min(self.layout.state_len),
        };
        let flags = if logits { flag::LOGITS } else { 0 };
        let logits_ok =
            !logits || snap[n..].chunks_exact(4).all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite());
        if word(counter::CRC) != snapshot_crc(snap)
            || word(counter::FLAGS) != flags
            || !logits_ok
            || word(counter::STAMP) != STAMP
            || word(counter::STATE_LEN) as usize != self.layout.state_len
            || word(counter::ARENA_LEN) as usize != self.layout.arena_len() as u32 as usize
            || word(counter::MODEL) != self.model.identity()
            || coverage != coverage_at(cfg, pos)
            || !slots_ok
        {
            return Err(Error::BadSnapshot);
        }
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut self.arena[..snap.len() / 4]);
        dst.copy_from_slice(snap);
        let c: &mut [u32] = bytemuck::cast_slice_mut(&mut self.arena[..COUNTERS]);
        c[counter::CRC] = 0;
        Ok(())
    }

    /// Restores a state-only [`Session::snapshot`] `state` and makes `logits` the
    /// position's, as if its last step had produced them: for snapshot formats that kept
    /// the logits apart from the state (the C API's v3, kvm-wasm's first). `logits` are
    /// `[vocab_len]` little-endian f32, as a snapshot stores them. On an error the session
    /// is unchanged.
    ///
    /// # Errors
    /// [`Error::BadSnapshot`] if `logits` have the wrong length or one is not finite, or
    /// as [`Session::restore`] (for `state`, which must be state-only).
    pub fn restore_with_logits(&mut self, state: &[u8], logits: &[u8]) -> Result<()> {
        let vocab = self.model.config().vocab_len as usize;
        let value = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if logits.len() != 4 * vocab || !logits.chunks_exact(4).all(|b| value(b).is_finite()) {
            return Err(Error::BadSnapshot);
        }
        if state.len() != self.snapshot_len() {
            return Err(Error::BadSnapshot);
        }
        self.restore(state)?;
        let start = self.layout.state_floats();
        for (x, b) in self.arena[start..start + vocab].iter_mut().zip(logits.chunks_exact(4)) {
            *x = value(b);
        }
        self.set_has_logits(true);
        Ok(())
    }

    /// A read-only view of layer `l`'s state, for inspection and tests (`None` past the
    /// last layer, and in the integer numerics, whose state is not f32).
    pub fn layer_view(&self, l: usize) -> Option<LayerView<'_>> {
        let cfg = self.model.config();
        if l >= cfg.n_layers as usize || self.layout.is_int() {
            return None;
        }
        let at = self.counters();
        let parts = self.layout.layer_parts(self.arena, l);
        let (sk, sv, r, wk, wv) = (parts.sk, parts.sv, parts.r, parts.wk, parts.wv);
        let (alt, wa) = (cfg.is_alt(l), cfg.alt_window as usize);
        Some(LayerView {
            cfg: *cfg,
            state_len: self.layout.state_len,
            ring_len: if alt { wa } else { cfg.window_len() },
            slots: if alt { 0 } else { at.slots },
            pos: at.pos,
            coverage: if alt { 0 } else { at.coverage },
            window_begin: if alt { at.pos.saturating_sub(wa) } else { bswa_begin(cfg, at.pos) },
            sk,
            sv,
            r,
            wk,
            wv,
        })
    }
}

/// Stores counters `c` in the arena's counters block `words`.
fn store_counters(words: &mut [f32], c: Counters) {
    let w: &mut [u32] = bytemuck::cast_slice_mut(words);
    w[counter::POS] = c.pos as u32;
    w[counter::SLOTS] = c.slots as u32;
    w[counter::COVERAGE] = c.coverage as u32;
}

/// [`Session::run`] in the float numerics: one forward pass over `tokens` (in the
/// caller's `batch` buffer, or one token in the arena's), storing the counters after it;
/// returns where a NaN or an infinity first appeared.
// Never inlined, as `run_int`: each numerics' frames then take no stack in the other's.
#[inline(never)]
fn run_float(
    pass: &Pass<'_, '_>,
    arena: &mut [f32],
    tokens: &[u32],
    batch: Option<&mut [f32]>,
    logits: Logits<'_>,
    tap: Option<&mut TapFn<'_>>,
) -> Result<Option<Origin>> {
    let lay = pass.lay;
    let arena = lay.split(arena);
    let mut s = arena.scratch;
    let mut acts = match batch {
        None => Acts::carve(arena.acts, lay, tokens.len().min(1)),
        Some(buf) => {
            let needed = lay.acts_len(tokens.len()).unwrap_or(usize::MAX);
            if buf.len() < needed {
                return Err(Error::BufferTooSmall { needed });
            }
            Acts::carve(buf, lay, tokens.len())
        }
    };
    if acts.n != tokens.len() {
        return Err(Error::BufferTooSmall { needed: lay.acts_len(tokens.len()).unwrap_or(usize::MAX) });
    }
    let mut x = FloatActs::new(&mut acts, &mut s);
    let (next, origin) = forward(pass, (arena.layers, arena.reads), &mut x, tokens, logits, &mut { tap });
    store_counters(arena.counters, next);
    Ok(origin)
}

/// [`Session::run`] in the integer numerics: the forward pass token by token (its
/// activations are one token's), the logits of those asked for (the last, or each into
/// the caller's rows), the taps at their points; then the counters. Fixed-point logits
/// are always finite.
// Never inlined: the integer step's frames then take no stack in a float session's.
#[inline(never)]
fn run_int(
    pass: &Pass<'_, '_>,
    arena: &mut [f32],
    tokens: &[u32],
    logits: Logits<'_>,
    mut tap: Option<&mut TapFn<'_>>,
) -> Result<()> {
    let (lay, cfg) = (pass.lay, pass.model.config());
    let vocab = cfg.vocab_len as usize;
    let (counters, layers, scratch) = lay.regions(arena);
    let (mut s, reads) = IntScratch::carve(scratch, cfg, lay.state_len);
    let mut out = logits;
    let mut at = pass.at;
    for (i, &token) in tokens.iter().enumerate() {
        let asked = match &mut out {
            Logits::None => Logits::None,
            Logits::Last if i + 1 == tokens.len() => Logits::Last,
            Logits::Last => Logits::None,
            Logits::All(rows) => Logits::All(&mut rows[i * vocab..(i + 1) * vocab]),
        };
        let pass = pass.at(at);
        let mut x = IntActs::new(&mut s, Plan::new(cfg, lay.state_len, at, pass.phase));
        (at, _) = forward(&pass, (&mut *layers, &mut *reads), &mut x, &[token], asked, &mut tap);
    }
    store_counters(counters, at);
    Ok(())
}

/// The counters in the arena's counters block `words`.
fn counters_in(words: &[f32]) -> Counters {
    let c: &[u32] = bytemuck::cast_slice(words);
    Counters::new(c[counter::POS] as usize, c[counter::SLOTS] as usize, c[counter::COVERAGE] as usize)
}

/// [`Error::NonFiniteLogits`] for the first of `rows` (`[n, vocab]`, the logits of the
/// tokens at positions `pos..pos + n`) that holds a NaN or an infinity; `origin` is where
/// the forward pass first saw one (none: in the head).
fn check_finite(rows: &[f32], vocab: usize, pos: usize, origin: Option<Origin>) -> Result<()> {
    // One branch-free pass (it vectorises); the row is looked for only once it fails.
    if all_finite(rows) {
        return Ok(());
    }
    let row = rows.chunks(vocab.max(1)).position(|r| r.iter().any(|x| !x.is_finite())).unwrap_or(0);
    Err(Error::NonFiniteLogits { pos: (pos + row) as u32, origin: origin.unwrap_or(Origin::Head) })
}

/// Read-only view of one layer's state (see [`Session::layer_view`]).
#[derive(Debug)]
pub struct LayerView<'s> {
    cfg: Config,
    state_len: usize,
    /// Entries of a head's window ring: `window_len`, or an alternate layer's `Wa`.
    ring_len: usize,
    /// Live slots (none in an alternate layer, spec §5).
    pub slots: usize,
    /// Tokens seen.
    pub pos: usize,
    /// The state covers `[0, coverage)`.
    pub coverage: usize,
    /// The window holds `[window_begin, pos)` (an alternate layer's: its ring's last `Wa`
    /// tokens).
    pub window_begin: usize,
    sk: &'s [f32],
    sv: &'s [f32],
    r: &'s [f32],
    wk: Rows<'s>,
    wv: Rows<'s>,
}

impl LayerView<'_> {
    /// Key sum of head `h`, slot `s` (`[d_qk]`).
    pub fn state_key(&self, h: usize, s: usize) -> &[f32] {
        let dk = self.cfg.d_qk as usize;
        &self.sk[(h * self.state_len + s) * dk..][..dk]
    }
    /// Value sum of head `h`, slot `s` (`[d_v]`).
    pub fn state_value(&self, h: usize, s: usize) -> &[f32] {
        let dv = self.cfg.d_v as usize;
        &self.sv[(h * self.state_len + s) * dv..][..dv]
    }
    /// Read radius (or fold count) of head `h`, slot `s`.
    pub fn state_radius(&self, h: usize, s: usize) -> f32 {
        self.r[h * self.state_len + s]
    }
    /// Key of window token `j` (absolute position, in `[window_begin, pos)`) of head `h`
    /// into `out` (`[d_qk]`), as stored (f16 caches widen).
    pub fn window_key(&self, h: usize, j: usize, out: &mut [f32]) {
        self.wk.get(h * self.ring_len + j % self.ring_len, out);
    }
    /// Value of window token `j` of head `h` into `out` (`[d_v]`).
    pub fn window_value(&self, h: usize, j: usize, out: &mut [f32]) {
        self.wv.get(h * self.ring_len + j % self.ring_len, out);
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;

    /// 64 bytes, aligned as an arena or a model blob must be.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    /// A zeroed, 64-byte-aligned buffer of `n` bytes.
    fn aligned(n: usize) -> Vec<Line> {
        vec![Line([0; 64]); n.div_ceil(64)]
    }

    fn bytes(buf: &mut [Line], n: usize) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Line, u8>(buf)[..n]
    }

    // SAFETY: 64 bytes with no padding (`repr(C)`, size = alignment), every bit pattern a
    // valid value, zero included.
    unsafe impl bytemuck::Zeroable for Line {}
    // SAFETY: as above; `Copy`, `'static`, no interior mutability.
    unsafe impl bytemuck::Pod for Line {}

    const FILE: &[u8] = include_bytes!("../../models/tiny-kjv-q8_0.kvm");

    /// Two sessions of the repository's tiny model (`a` fed `prompt`, `b` new), given to `f`.
    fn with_two(prompt: &[u32], f: impl FnOnce(&mut Session<'_, '_>, &mut Session<'_, '_>)) {
        let mut blob = aligned(FILE.len());
        bytes(&mut blob, FILE.len()).copy_from_slice(FILE);
        let blob = &bytemuck::cast_slice::<Line, u8>(&blob)[..FILE.len()];
        let model = Model::from_bytes(blob).unwrap();
        let n = model.arena_len();
        let (mut x, mut y) = (aligned(n), aligned(n));
        let mut a = Session::new(model, bytes(&mut x, n)).unwrap();
        let mut b = Session::new(model, bytes(&mut y, n)).unwrap();
        if !prompt.is_empty() {
            a.prefill(prompt).unwrap();
        }
        f(&mut a, &mut b);
    }

    fn snap_of(s: &Session<'_, '_>, logits: bool) -> Vec<u8> {
        let mut out = vec![0; if logits { s.snapshot_len_with_logits() } else { s.snapshot_len() }];
        let n = if logits { s.snapshot_with_logits(&mut out) } else { s.snapshot(&mut out) }.unwrap();
        assert_eq!(n, out.len());
        out
    }

    const PROMPT: [u32; 5] = [65, 110, 100, 32, 71];

    #[test]
    fn session_flag_follows_the_steps() {
        with_two(&[], |a, _| {
            assert!(!a.has_logits());
            assert_eq!(a.snapshot_with_logits(&mut vec![0; a.snapshot_len_with_logits()]), Err(Error::InvalidArgument));
            a.step(65, Phase::Prefill, false).unwrap();
            assert!(!a.has_logits());
            a.step(66, Phase::Prefill, true).unwrap();
            assert!(a.has_logits());
            // A step that fails before the pass consumes nothing, the flag included.
            assert!(a.step(u32::MAX, Phase::Decode, false).is_err());
            assert!(a.has_logits());
            a.step(67, Phase::Decode, false).unwrap();
            assert!(!a.has_logits());
            a.decode(68).unwrap();
            a.reset();
            assert!(!a.has_logits());
        });
    }

    #[test]
    fn session_snapshot_with_logits_round_trips() {
        with_two(&PROMPT, |a, b| {
            let snap = snap_of(a, true);
            assert_eq!(snap.len(), a.snapshot_len() + 4 * a.model().config().vocab_len as usize);
            b.restore(&snap).unwrap();
            assert!(b.has_logits());
            assert_eq!(b.logits(), a.logits());
            assert_eq!(b.pos(), a.pos());
            assert_eq!(snap_of(b, true), snap);
            assert_eq!(b.decode(7).unwrap(), a.decode(7).unwrap());
        });
    }

    /// `snapshot_as_is` is the snapshot with logits while the session has them, the state
    /// alone otherwise, and says its length beforehand.
    #[test]
    fn session_snapshot_as_is_follows_the_logits() {
        with_two(&PROMPT, |a, b| {
            let as_is = |s: &Session<'_, '_>| {
                let mut out = vec![0; s.snapshot_as_is_len()];
                assert_eq!(s.snapshot_as_is(&mut out).unwrap(), out.len());
                out
            };
            assert!(a.has_logits() && !b.has_logits());
            assert_eq!(as_is(a), snap_of(a, true));
            assert_eq!(as_is(b), snap_of(b, false));
            let mut short = vec![0; a.snapshot_as_is_len() - 1];
            assert!(matches!(a.snapshot_as_is(&mut short), Err(Error::BufferTooSmall { .. })));
        });
    }

    #[test]
    fn session_snapshot_without_logits_round_trips() {
        with_two(&PROMPT, |a, b| {
            let snap = snap_of(a, false);
            b.decode(3).unwrap();
            b.restore(&snap).unwrap();
            assert!(!b.has_logits());
            assert_eq!(snap_of(b, false), snap);
            assert_eq!(b.decode(7).unwrap(), a.decode(7).unwrap());
        });
    }

    /// A snapshot written before the flags word (word 8 zero, the state alone) is what
    /// `snapshot` writes today: it restores as it always did, with no logits; the logits
    /// an old format kept apart are put back with it, checked first.
    #[test]
    fn session_old_snapshot_restores() {
        with_two(&PROMPT, |a, b| {
            let snap = snap_of(a, false);
            assert_eq!(&snap[counter::FLAGS * 4..COUNTERS * 4], &[0; (COUNTERS - counter::FLAGS) * 4][..]);
            b.restore(&snap).unwrap();
            assert!(!b.has_logits());
            b.decode(9).unwrap();
            let before = snap_of(b, true);
            let logits: Vec<u8> = a.logits().iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut nan = logits.clone();
            nan[12..16].copy_from_slice(&f32::NAN.to_le_bytes());
            let with = snap_of(a, true);
            for (state, l) in [(&snap[..], &logits[4..]), (&snap[..], &nan[..]), (&with[..], &logits[..])] {
                assert_eq!(b.restore_with_logits(state, l), Err(Error::BadSnapshot));
                assert_eq!(snap_of(b, true), before);
            }
            b.restore_with_logits(&snap, &logits).unwrap();
            assert!(b.has_logits());
            assert_eq!(snap_of(b, true), with);
        });
    }

    /// Re-signs `snap` as a session would: its CRC made right.
    fn resign(snap: &mut [u8]) {
        let crc = snapshot_crc(snap);
        snap[counter::CRC * 4..counter::CRC * 4 + 4].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn session_bad_snapshots_change_nothing() {
        with_two(&PROMPT, |a, b| {
            let good = snap_of(a, true);
            let n = a.snapshot_len();
            b.decode(9).unwrap();
            let before = snap_of(b, true);
            let mut cases: Vec<Vec<u8>> =
                vec![good[..good.len() - 1].to_vec(), good[..n + 4].to_vec(), [&good[..], &[0; 4]].concat()];
            // A logit's byte changed: the CRC covers the logits.
            let mut flipped = good.clone();
            flipped[n + 5] ^= 1;
            cases.push(flipped);
            // A non-finite logit, its CRC made right.
            let mut nan = good.clone();
            nan[n + 8..n + 12].copy_from_slice(&f32::INFINITY.to_le_bytes());
            resign(&mut nan);
            cases.push(nan);
            // Logits appended, the flag not set (or set on a state alone), signed.
            let mut unflagged = good.clone();
            unflagged[counter::FLAGS * 4] = 0;
            resign(&mut unflagged);
            cases.push(unflagged);
            let mut flagged = good[..n].to_vec();
            resign(&mut flagged);
            assert_eq!(b.restore(&flagged), Err(Error::BadSnapshot));
            let mut unknown = good.clone();
            unknown[counter::FLAGS * 4] |= 2;
            resign(&mut unknown);
            cases.push(unknown);
            // The CRC itself wrong.
            let mut crc = good.clone();
            crc[counter::CRC * 4] ^= 1;
            cases.push(crc);
            for (i, bad) in cases.iter().enumerate() {
                assert_eq!(b.restore(bad), Err(Error::BadSnapshot), "case {i}");
                assert_eq!(snap_of(b, true), before, "case {i}");
            }
            b.restore(&good).unwrap();
            assert_eq!(snap_of(b, true), good);
        });
    }
}
