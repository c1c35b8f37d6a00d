//! The session behind a `kvm_session *`: its place in the caller's arena, generation with
//! a lazily fed last token, and state snapshots that include the sampler.
//!
//! The caller's arena (64-byte aligned, at least [`ArenaPlan::total`] bytes) is carved as
//!
//! ```text
//! [0, cell)              SessionCell: the handle (what kvm_session * points at)
//! [cell, cell + core)    the core session arena, Model::arena_len_for(state_len) bytes
//! [.., + scratch)        sampler scratch, [vocab_len] Candidate
//! ```
//!
//! Each region starts on a 64-byte boundary. The cell holds pointers into the rest of the
//! arena, so an initialised arena must not move; it records its own address to catch that.
//!
//! # The pending token
//! The session keeps the last token of its context *unfed*: `prefill` feeds all but the
//! last id, and `decode_step` (or `logits`) feeds the pending token (computing logits only
//! then). Generating n tokens therefore costs n forward passes. A snapshot stores the
//! pending token, or, once it has been fed for its logits, the core's snapshot with them
//! (the core keeps whether its logits are the position's: `Session::has_logits`).
//!
//! # Threads and batches (std)
//! A session made with more than one thread or a batch of more than one token owns an
//! [`Engine`] on the heap: a thread pool and the activations of one batch. Every token
//! then goes through the core's `step_batch` with the pool as executor; the pool's split
//! products equal serial ones exactly, so the thread count never changes a bit; the batch
//! length can (a batch of tokens is computed together, which rounds differently from one
//! token at a time, by less than 1e-4 of a logit).

use core::mem::{align_of, size_of};
use core::ptr;

#[cfg(feature = "std")]
use kvm_core::forward::Logits as CoreLogits;
use kvm_core::sampler::{scratch_len, Candidate, Pcg32, Recent, Sampler, SamplerConfig};
use kvm_core::state::{Layout, Phase, ARENA_ALIGN};
use kvm_core::{Error, Model, Session};

use super::types::kvm_status::{self, *};

/// Most recent tokens kept for the repetition penalty (`repeat_window` may not exceed it).
pub(crate) const HISTORY_LEN: usize = super::types::KVM_MAX_REPEAT_WINDOW as usize;
// The header states the core's bound as a literal; this keeps the two one number.
const _: () = assert!(super::types::KVM_MAX_REPEAT_WINDOW == kvm_core::sampler::ranges::MAX_REPEAT_WINDOW);

/// `"KVMSESS1"`: an initialised cell.
const LIVE: u64 = u64::from_le_bytes(*b"KVMSESS1");
/// A cell whose call panicked: only `kvm_session_init` revives it.
const POISONED: u64 = u64::from_le_bytes(*b"KVMSPOIS");
/// A cell `kvm_session_release` ended.
const RELEASED: u64 = u64::from_le_bytes(*b"KVMSDONE");

#[inline]
const fn pad(n: usize) -> Option<usize> {
    match n.checked_add(ARENA_ALIGN - 1) {
        Some(m) => Some(m / ARENA_ALIGN * ARENA_ALIGN),
        None => None,
    }
}

/// Byte offsets of the arena's regions for one model and state capacity.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArenaPlan {
    /// State slots the core session holds.
    state_len: usize,
    core: usize,
    core_len: usize,
    scratch: usize,
    /// Candidates in the sampler scratch.
    scratch_len: usize,
    pub total: usize,
}

impl ArenaPlan {
    /// The plan of a session of `model` at its default state capacity.
    ///
    /// # Errors
    /// `KVM_ERR_BAD_CONFIG` if the sizes overflow `usize`.
    pub fn new(model: &Model<'_>) -> Result<ArenaPlan, kvm_status> {
        Self::with_state_len(model, model.header().state_capacity as usize)
    }

    /// The plan of a session of `model` holding at most `state_len` state slots.
    ///
    /// # Errors
    /// `KVM_ERR_STATE_SLOTS` if `state_len` is outside [`state_len_range`];
    /// `KVM_ERR_BAD_CONFIG` if the sizes overflow `usize`.
    pub fn with_state_len(model: &Model<'_>, state_len: usize) -> Result<ArenaPlan, kvm_status> {
        if !state_len_range(model).contains(&state_len) {
            return Err(KVM_ERR_STATE_SLOTS);
        }
        let overflow = KVM_ERR_BAD_CONFIG;
        let core = pad(size_of::<SessionCell>()).ok_or(overflow)?;
        let core_len = model.arena_len_for(state_len)?;
        let scratch = core.checked_add(pad(core_len).ok_or(overflow)?).ok_or(overflow)?;
        let vocab_len = model.config().vocab_len as usize;
        let scratch_len = scratch_len(vocab_len);
        let scratch_bytes = scratch_len.checked_mul(size_of::<Candidate>()).ok_or(overflow)?;
        let total = scratch.checked_add(pad(scratch_bytes).ok_or(overflow)?).ok_or(overflow)?;
        if total > isize::MAX as usize {
            return Err(overflow);
        }
        Ok(ArenaPlan { state_len, core, core_len, scratch, scratch_len, total })
    }
}

/// The state capacities a session of `model` may have: from one chunk (what a fold
/// needs) to the most slots the config ever fills.
pub(crate) fn state_len_range(model: &Model<'_>) -> core::ops::RangeInclusive<usize> {
    let c = model.config();
    c.chunk_len as usize..=c.natural_state_len()
}

/// How a session runs its forward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exec {
    /// Threads, the caller's included (1 without `std`).
    pub threads: usize,
    /// Most prompt tokens fed as one batch (1 without `std`).
    pub batch: usize,
}

impl Exec {
    /// One token at a time on the caller's thread: what every build can run.
    pub const fn serial() -> Exec {
        Exec { threads: 1, batch: 1 }
    }
}

/// The heap half of a threaded or batching session (std).
#[cfg(feature = "std")]
#[derive(Debug)]
pub(crate) struct Engine {
    pool: crate::pool::Pool,
    /// Most tokens in one batch.
    batch_len: usize,
    /// Activations of one batch, `Layout::acts_len(batch_len)` f32s.
    acts: Vec<f32>,
}

#[cfg(feature = "std")]
impl Engine {
    /// The engine `exec` needs for a session of `model` with `state_len` slots: none for
    /// [`Exec::serial`].
    ///
    /// # Errors
    /// `KVM_ERR_THREADS` if the system refuses the threads, `KVM_ERR_OUT_OF_MEMORY` their
    /// batch buffer.
    fn new(model: &Model<'_>, state_len: usize, exec: Exec) -> Result<Option<std::boxed::Box<Engine>>, kvm_status> {
        if exec == Exec::serial() {
            return Ok(None);
        }
        let layout = Layout::new(model.config(), state_len, model.cache(), model.slot_reads())?;
        let acts_len = layout.acts_len(exec.batch).ok_or(KVM_ERR_BAD_CONFIG)?;
        let acts = crate::arena::zeroed(acts_len)?;
        let pool = crate::pool::Pool::new(exec.threads).map_err(|_| KVM_ERR_THREADS)?;
        Ok(Some(std::boxed::Box::new(Engine { pool, batch_len: exec.batch, acts })))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    token: u32,
    phase: Phase,
}

/// The handle at the front of the arena. `repr(C)` pins `magic` to offset 0, so a pointer
/// can be checked before anything else of the cell is read.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct SessionCell {
    magic: u64,
    /// The cell's own address when it was initialised.
    home: usize,
    session: Session<'static, 'static>,
    sampler: Sampler,
    /// The sampler's RNG is `Pcg32::new(seed)` advanced `draws` times.
    seed: u64,
    draws: u64,
    /// `[vocab_len]`, in the arena.
    scratch: &'static mut [Candidate],
    /// The last token of the context, not yet fed.
    pending: Option<Pending>,
    /// A step's logits came out NaN or infinite: only a reset or a restore goes on from
    /// here, every other call answers `KVM_ERR_NON_FINITE` again.
    non_finite: bool,
    #[cfg(feature = "std")]
    engine: Option<std::boxed::Box<Engine>>,
    /// The last [`HISTORY_LEN`] tokens of the context, whatever the window: a window
    /// raised later (or a snapshot's) sees them.
    history: Recent<HISTORY_LEN>,
}

impl SessionCell {
    /// Builds a session of `model` with `plan`'s state capacity in `arena`, running as
    /// `exec` says, and returns the handle at its front. Nothing is written to the arena
    /// unless every check passed.
    ///
    /// # Safety
    /// `arena` is null or valid for writes of `len` bytes, is not accessed by anything else
    /// while the session is used, and does not move; `model`'s blob outlives the session;
    /// `plan` is `model`'s.
    pub unsafe fn init(
        model: Model<'static>,
        plan: ArenaPlan,
        exec: Exec,
        arena: *mut u8,
        len: usize,
    ) -> Result<*mut SessionCell, kvm_status> {
        const _: () = assert!(align_of::<SessionCell>() <= ARENA_ALIGN);
        const _: () = assert!(align_of::<Candidate>() <= ARENA_ALIGN && align_of::<f32>() <= ARENA_ALIGN);
        if arena.is_null() {
            return Err(KVM_ERR_NULL_POINTER);
        }
        if arena as usize % ARENA_ALIGN != 0 {
            return Err(KVM_ERR_ARENA_MISALIGNED);
        }
        if len < plan.total {
            return Err(KVM_ERR_ARENA_SIZE);
        }
        #[cfg(feature = "std")]
        let engine = Engine::new(&model, plan.state_len, exec)?;
        #[cfg(not(feature = "std"))]
        if exec != Exec::serial() {
            return Err(KVM_ERR_UNSUPPORTED);
        }
        let history = Recent::new(HISTORY_LEN as u32)?;
        // SAFETY: the caller lends `len >= plan.total` writable bytes at `arena`, which is
        // aligned for every region; zeroing first makes every byte initialised, and zero
        // is a valid `Candidate`. The three regions are disjoint.
        unsafe {
            ptr::write_bytes(arena, 0, plan.total);
            let core = core::slice::from_raw_parts_mut(arena.add(plan.core), plan.core_len);
            let scratch =
                core::slice::from_raw_parts_mut(arena.add(plan.scratch).cast::<Candidate>(), plan.scratch_len);
            let session = Session::with_state_len(model, core, plan.state_len)?;
            let cell = arena.cast::<SessionCell>();
            cell.write(SessionCell {
                magic: LIVE,
                home: cell as usize,
                session,
                sampler: Sampler::new(SamplerConfig::DEFAULT, 0),
                seed: 0,
                draws: 0,
                scratch,
                pending: None,
                non_finite: false,
                #[cfg(feature = "std")]
                engine,
                history,
            });
            Ok(cell)
        }
    }

    /// Checks that `p` points at a live cell at its home address.
    ///
    /// # Safety
    /// `p` is null or valid for reads of 8 bytes; if those hold the live magic, `p` is a
    /// handle [`SessionCell::init`] returned and the caller has the access it asks for.
    pub unsafe fn check(p: *const SessionCell) -> Result<(), kvm_status> {
        if p.is_null() {
            return Err(KVM_ERR_NULL_POINTER);
        }
        if p as usize % ARENA_ALIGN != 0 {
            return Err(KVM_ERR_BAD_HANDLE);
        }
        // SAFETY: readable per the contract; `magic` is at offset 0 (`repr(C)`).
        let magic = unsafe { p.cast::<u64>().read() };
        // SAFETY: the magic says the cell was initialised, so `home` is too.
        if magic != LIVE || unsafe { (*p).home } != p as usize {
            return Err(KVM_ERR_BAD_HANDLE);
        }
        Ok(())
    }

    /// Marks the cell unusable after a panic interrupted a call on it.
    ///
    /// # Safety
    /// `p` passed [`SessionCell::check`] and nothing else borrows the cell.
    pub unsafe fn poison(p: *mut SessionCell) {
        // SAFETY: per the contract.
        unsafe { p.cast::<u64>().write(POISONED) }
    }

    /// Ends the session behind `p`, live or poisoned: stops its threads and frees what it
    /// holds on the heap (nothing without `std`), and marks the cell dead.
    ///
    /// # Safety
    /// As [`SessionCell::check`], for writes; `p` is not used by anything else.
    pub unsafe fn release(p: *mut SessionCell) -> Result<(), kvm_status> {
        if p.is_null() {
            return Err(KVM_ERR_NULL_POINTER);
        }
        if p as usize % ARENA_ALIGN != 0 {
            return Err(KVM_ERR_BAD_HANDLE);
        }
        // SAFETY: readable per the contract; `magic` is at offset 0 (`repr(C)`).
        let magic = unsafe { p.cast::<u64>().read() };
        // SAFETY: either magic says the cell was initialised, so `home` is too.
        if !(magic == LIVE || magic == POISONED) || unsafe { (*p).home } != p as usize {
            return Err(KVM_ERR_BAD_HANDLE);
        }
        // SAFETY: an initialised cell at home, lent exclusively; a poisoned one was left
        // by a panic between its fields' updates, never inside the engine's `Option`.
        #[cfg(feature = "std")]
        drop(unsafe { (*p).engine.take() });
        // SAFETY: as above.
        unsafe { p.cast::<u64>().write(RELEASED) };
        Ok(())
    }

    #[inline]
    pub fn model(&self) -> &Model<'static> {
        self.session.model()
    }

    fn vocab_len(&self) -> u32 {
        self.model().config().vocab_len
    }

    /// Tokens in the context, the pending one included.
    pub fn pos(&self) -> usize {
        self.session.pos() + usize::from(self.pending.is_some())
    }

    /// Forgets every token and rewinds the RNG to its seed; the settings stay.
    pub fn reset(&mut self) {
        self.session.reset();
        self.pending = None;
        self.non_finite = false;
        self.history.clear();
        self.reseed(self.seed);
    }

    pub fn set_sampler(&mut self, cfg: SamplerConfig) -> Result<(), kvm_status> {
        // The ranges lie within the sampler's own; its validation has the last word.
        cfg.validate()?;
        if !kvm_core::sampler::ranges::contain(&cfg) {
            return Err(KVM_ERR_INVALID_ARGUMENT);
        }
        self.sampler.cfg = cfg;
        Ok(())
    }

    pub fn sampler_config(&self) -> SamplerConfig {
        self.sampler.cfg
    }

    pub fn reseed(&mut self, seed: u64) {
        self.seed = seed;
        self.draws = 0;
        self.sampler.rng = Pcg32::new(seed);
    }

    /// Feeds `tokens` (at least one) to the core, leaving the last one's logits in it
    /// when `want_logits`; logits that are not finite mark the session so.
    fn feed(&mut self, tokens: &[u32], phase: Phase, want_logits: bool) -> Result<(), Error> {
        let fed = self.feed_core(tokens, phase, want_logits);
        if let Err(Error::NonFiniteLogits { .. }) = fed {
            self.non_finite = true;
        }
        fed
    }

    /// [`SessionCell::feed`]'s work: one token at a time, or in batches through the engine.
    fn feed_core(&mut self, tokens: &[u32], phase: Phase, want_logits: bool) -> Result<(), Error> {
        #[cfg(feature = "std")]
        if let Some(e) = self.engine.as_deref_mut() {
            let n_batches = tokens.len().div_ceil(e.batch_len);
            for (i, batch) in tokens.chunks(e.batch_len).enumerate() {
                let logits = if want_logits && i + 1 == n_batches { CoreLogits::Last } else { CoreLogits::None };
                self.session.step_batch(batch, phase, &mut e.acts, &e.pool, logits)?;
            }
            return Ok(());
        }
        let last = tokens.len().saturating_sub(1);
        for (i, &t) in tokens.iter().enumerate() {
            self.session.step(t, phase, want_logits && i == last)?;
        }
        Ok(())
    }

    /// Feeds the pending token, computing logits when `want_logits`.
    fn flush(&mut self, want_logits: bool) -> Result<(), kvm_status> {
        if let Some(p) = self.pending {
            let fed = self.feed(&[p.token], p.phase, want_logits);
            // A step whose logits came out non-finite was still taken.
            if matches!(fed, Ok(()) | Err(Error::NonFiniteLogits { .. })) {
                self.pending = None;
            }
            fed?;
        }
        Ok(())
    }

    /// `KVM_ERR_NON_FINITE` while the session is marked by logits that were not finite.
    pub fn check_finite(&self) -> Result<(), kvm_status> {
        if self.non_finite {
            Err(KVM_ERR_NON_FINITE)
        } else {
            Ok(())
        }
    }

    /// Checks that every id of `ids` (at least one) is a token of the model.
    pub fn check_ids(&self, ids: &[u32]) -> Result<(), kvm_status> {
        if ids.is_empty() {
            return Err(KVM_ERR_INVALID_ARGUMENT);
        }
        let vocab_len = self.vocab_len();
        if ids.iter().any(|&t| t >= vocab_len) {
            return Err(KVM_ERR_TOKEN_OUT_OF_RANGE);
        }
        Ok(())
    }

    /// Appends prompt tokens to the context. All ids are checked before any is fed, so
    /// a bad id leaves the session untouched.
    pub fn prefill(&mut self, ids: &[u32]) -> Result<(), kvm_status> {
        self.check_finite()?;
        self.check_ids(ids)?;
        let (&last, head) = ids.split_last().ok_or(KVM_ERR_INVALID_ARGUMENT)?;
        self.flush(false)?;
        if !head.is_empty() {
            self.feed(head, Phase::Prefill, false)?;
        }
        self.pending = Some(Pending { token: last, phase: Phase::Prefill });
        self.history.push(ids);
        Ok(())
    }

    /// The logits of the next token after the whole context, `[vocab_len]`: feeds the
    /// pending token first if there is one (the forward pass the next
    /// [`SessionCell::decode_step`] would run, which then samples from these logits).
    pub fn logits(&mut self) -> Result<&[f32], kvm_status> {
        self.check_finite()?;
        self.flush(true)?;
        match self.has_logits() {
            true => Ok(self.session.logits()),
            false => Err(KVM_ERR_NO_CONTEXT),
        }
    }

    /// Whether the core's logits are those of the whole context: nothing pending, and the
    /// core's last step (or restored snapshot) left them.
    fn has_logits(&self) -> bool {
        self.pending.is_none() && self.session.has_logits()
    }

    /// Feeds the pending token, samples the next one and leaves it pending.
    pub fn decode_step(&mut self) -> Result<u32, kvm_status> {
        self.logits()?;
        // Padding ids have no text: never sampled.
        let logits = self.session.text_logits();
        let token = self.sampler.sample(logits, self.history.tokens(), self.scratch)?;
        self.draws = self.draws.wrapping_add(1);
        self.pending = Some(Pending { token, phase: Phase::Decode });
        self.history.push(&[token]);
        Ok(token)
    }

    /// Bytes of a snapshot: the header, the history, the core's snapshot with logits.
    pub fn state_size(&self) -> usize {
        snap::CORE + self.session.snapshot_len_with_logits()
    }

    /// Writes a snapshot into `out` (exactly [`SessionCell::state_size`] bytes).
    pub fn save(&self, out: &mut [u8]) -> Result<(), kvm_status> {
        // A snapshot would pass a state that overflowed for a sound one.
        self.check_finite()?;
        if out.len() != self.state_size() {
            return Err(KVM_ERR_BUFFER_TOO_SMALL);
        }
        out[..snap::CORE].fill(0);
        let (head, core) = out.split_at_mut(snap::CORE);
        let logits = self.has_logits();
        if logits {
            self.session.snapshot_with_logits(core)?;
        } else {
            // The state alone, and a zero tail where the logits would be.
            let n = self.session.snapshot(core)?;
            core[n..].fill(0);
        }
        let mut flags = if logits { snap::LOGITS } else { 0 };
        let mut pending = 0;
        if let Some(p) = self.pending {
            flags |= snap::PENDING;
            if p.phase == Phase::Prefill {
                flags |= snap::PREFILL;
            }
            pending = p.token;
        }
        put(head, snap::MAGIC, &snap::MAGIC_BYTES);
        put(head, snap::VERSION, &snap::CURRENT.to_le_bytes());
        put(head, snap::LEN, &(self.state_size() as u64).to_le_bytes());
        put(head, snap::MODEL_ID, &self.model().identity().to_le_bytes());
        put(head, snap::FLAGS, &flags.to_le_bytes());
        put(head, snap::PENDING_TOKEN, &pending.to_le_bytes());
        let history = self.history.tokens();
        put(head, snap::HISTORY_LEN, &(history.len() as u32).to_le_bytes());
        put(head, snap::SEED, &self.seed.to_le_bytes());
        put(head, snap::DRAWS, &self.draws.to_le_bytes());
        for (i, &t) in history.iter().enumerate() {
            put(head, snap::HISTORY + 4 * i, &t.to_le_bytes());
        }
        let crc = snap::crc(out, out.len());
        put(out, snap::CRC, &crc.to_le_bytes());
        Ok(())
    }

    /// Restores a [`SessionCell::save`] of a session of the same model, or one of the
    /// version before (v3: the core's state alone, the logits after it, under this CRC).
    /// Everything is checked before anything changes.
    pub fn restore(&mut self, snap_bytes: &[u8]) -> Result<(), kvm_status> {
        let bad = KVM_ERR_BAD_SNAPSHOT;
        if snap_bytes.len() != self.state_size() {
            return Err(bad);
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([snap_bytes[at], snap_bytes[at + 1], snap_bytes[at + 2], snap_bytes[at + 3]])
        };
        let u64_at = |at: usize| u64::from(u32_at(at)) | u64::from(u32_at(at + 4)) << 32;
        let flags = u32_at(snap::FLAGS);
        let history_len = u32_at(snap::HISTORY_LEN) as usize;
        let vocab_len = self.vocab_len();
        let state_len = self.session.snapshot_len();
        // Where the header's CRC takes up again after the header: v4 nowhere (the core
        // has its own); v3 at the logits, which follow the core's state.
        let v3 = match u32_at(snap::VERSION) {
            snap::CURRENT => false,
            snap::V3 => true,
            _ => return Err(bad),
        };
        let crc_from = if v3 { snap::CORE + state_len } else { snap_bytes.len() };
        let ok = snap_bytes[snap::MAGIC..snap::MAGIC + 4] == snap::MAGIC_BYTES
            && u64_at(snap::LEN) == snap_bytes.len() as u64
            && u32_at(snap::CRC) == snap::crc(snap_bytes, crc_from)
            && u32_at(snap::MODEL_ID) == self.model().identity()
            && flags & !(snap::PENDING | snap::PREFILL | snap::LOGITS) == 0
            && !(flags & snap::PENDING != 0 && flags & snap::LOGITS != 0)
            && u32_at(snap::PENDING_TOKEN) < vocab_len
            && history_len <= HISTORY_LEN
            && (0..history_len).all(|i| u32_at(snap::HISTORY + 4 * i) < vocab_len);
        if !ok {
            return Err(bad);
        }
        self.restore_core(&snap_bytes[snap::CORE..], flags & snap::LOGITS != 0, v3)?;
        self.pending = (flags & snap::PENDING != 0).then(|| Pending {
            token: u32_at(snap::PENDING_TOKEN),
            phase: if flags & snap::PREFILL != 0 { Phase::Prefill } else { Phase::Decode },
        });
        // The core refuses logits that are not finite: a restored session is sound.
        self.non_finite = false;
        self.history.clear();
        for i in 0..history_len {
            self.history.push(&[u32_at(snap::HISTORY + 4 * i)]);
        }
        self.seed = u64_at(snap::SEED);
        self.draws = u64_at(snap::DRAWS);
        self.sampler.rng = rng_at(self.seed, self.draws);
        Ok(())
    }

    /// Restores the core's part of a snapshot, `[snapshot_len_with_logits]` bytes, its
    /// header already checked: the core's snapshot with logits (`logits`), or the state
    /// alone and a zero tail; v3 (`v3`): the state alone, then the logits (zero without
    /// `logits`), put back after the state once they are checked. On an error the
    /// session is unchanged.
    fn restore_core(&mut self, core: &[u8], logits: bool, v3: bool) -> Result<(), kvm_status> {
        let (state, tail) = core.split_at(self.session.snapshot_len());
        let restored = match (v3, logits) {
            (false, true) => self.session.restore(core),
            (true, true) => self.session.restore_with_logits(state, tail),
            // Unused: zero in v4 (so no byte goes unchecked); v3's, under its header's CRC.
            (false, false) if tail.iter().any(|&b| b != 0) => return Err(KVM_ERR_BAD_SNAPSHOT),
            (_, false) => self.session.restore(state),
        };
        restored.map_err(Into::into)
    }
}

/// Bytes of a snapshot of a session of `model` at its default state capacity.
///
/// # Errors
/// `KVM_ERR_BAD_CONFIG` if the layout overflows (not for a loaded model).
pub(crate) fn state_size(model: &Model<'_>) -> Result<usize, kvm_status> {
    let layout =
        Layout::new(model.config(), model.header().state_capacity as usize, model.cache(), model.slot_reads())?;
    // The core's snapshot with logits (`Session::snapshot_len_with_logits`).
    Ok(snap::CORE + layout.snapshot_len() + 4 * model.config().vocab_len as usize)
}

fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
    out[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The snapshot format (all little-endian).
mod snap {
    use kvm_core::format::crc32_update;

    pub(super) const MAGIC_BYTES: [u8; 4] = *b"KVMC";
    /// 2 added the logits; 3 leaves the core's state, which carries its own CRC, out of
    /// this one's; 4 keeps the logits in the core's snapshot, under its CRC.
    pub(super) const CURRENT: u32 = 4;
    /// Still read: the core's state alone, then `[vocab_len] f32` logits (zero without
    /// `LOGITS`) under this header's CRC.
    pub(super) const V3: u32 = 3;
    pub(super) const PENDING: u32 = 1 << 0;
    pub(super) const PREFILL: u32 = 1 << 1;
    /// The logits of the whole context are in the snapshot (never with `PENDING`): the
    /// core's snapshot is [`kvm_core::Session::snapshot_with_logits`].
    pub(super) const LOGITS: u32 = 1 << 2;

    pub(super) const MAGIC: usize = 0;
    pub(super) const VERSION: usize = 4;
    /// u64: bytes of the whole snapshot.
    pub(super) const LEN: usize = 8;
    pub(super) const MODEL_ID: usize = 16;
    pub(super) const FLAGS: usize = 20;
    pub(super) const PENDING_TOKEN: usize = 24;
    pub(super) const HISTORY_LEN: usize = 28;
    /// u64.
    pub(super) const SEED: usize = 32;
    /// u64.
    pub(super) const DRAWS: usize = 40;
    /// CRC-32 of the header's every other byte ([`crc`]).
    pub(super) const CRC: usize = 48;
    /// `[HISTORY_LEN] u32`, unused entries zero.
    pub(super) const HISTORY: usize = 64;
    /// The core's [`kvm_core::Session::snapshot_with_logits`], or with no `LOGITS` its
    /// [`kvm_core::Session::snapshot`] and zeros to the same length, so that every
    /// snapshot of a session has one size. The core checks its part against its own CRC.
    pub(super) const CORE: usize = HISTORY + 4 * super::HISTORY_LEN;

    /// The CRC of `snap`'s header (v4: up to `CORE`) and, in v3, of the logits after the
    /// core's state at `from`: every byte but the CRC's own, and the core's snapshot.
    pub(super) fn crc(snap: &[u8], from: usize) -> u32 {
        let crc = crc32_update(0, &snap[..CRC]);
        let crc = crc32_update(crc, &snap[CRC + 4..CORE]);
        crc32_update(crc, &snap[from..])
    }
}

/// `Pcg32::new(seed)` advanced by `draws` outputs, in O(log draws) steps.
///
/// PCG's state is an LCG, `s' = MUL * s + inc`, so `draws` steps at once are
/// `s_n = MUL^n * s_0 + inc * (MUL^n - 1) / (MUL - 1)` (Brown, "Random number generation
/// with arbitrary strides", 1994). A generator can only be built through
/// `Pcg32::new(seed)`, whose first state is `(inc + seed) * MUL + inc`, so the seed that
/// lands on `s_n` is found by inverting that map (`MUL` is odd, hence invertible mod 2^64).
fn rng_at(seed: u64, draws: u64) -> Pcg32 {
    const MUL: u64 = 6_364_136_223_846_793_005;
    let inc = (Pcg32::DEFAULT_STREAM << 1) | 1;
    let first = inc.wrapping_add(seed).wrapping_mul(MUL).wrapping_add(inc);
    let (mut acc_mul, mut acc_plus) = (1u64, 0u64);
    let (mut cur_mul, mut cur_plus) = (MUL, inc);
    let mut n = draws;
    while n > 0 {
        if n & 1 == 1 {
            acc_mul = acc_mul.wrapping_mul(cur_mul);
            acc_plus = acc_plus.wrapping_mul(cur_mul).wrapping_add(cur_plus);
        }
        cur_plus = cur_mul.wrapping_add(1).wrapping_mul(cur_plus);
        cur_mul = cur_mul.wrapping_mul(cur_mul);
        n >>= 1;
    }
    let state = acc_mul.wrapping_mul(first).wrapping_add(acc_plus);
    // Newton's iteration for the inverse of an odd number mod 2^64: each step doubles
    // the correct low bits, starting from 3 (MUL * MUL == 1 mod 8).
    let mut inv = MUL;
    for _ in 0..5 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(MUL.wrapping_mul(inv)));
    }
    let seed_for_state = state.wrapping_sub(inc).wrapping_mul(inv).wrapping_sub(inc);
    Pcg32::new(seed_for_state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_at_matches_stepping() {
        for seed in [0, 1, 42, u64::MAX, 0x1234_5678_9abc_def0] {
            let mut rng = Pcg32::new(seed);
            for draws in 0..300u64 {
                assert_eq!(rng_at(seed, draws), rng, "seed {seed}, draws {draws}");
                rng.next_u32();
            }
        }
        // A long jump agrees with stepping too.
        let mut rng = Pcg32::new(7);
        for _ in 0..100_000 {
            rng.next_u32();
        }
        assert_eq!(rng_at(7, 100_000), rng);
    }

    /// The one allocation of a threaded session that a model sizes, its batch buffer, is
    /// `KVM_ERR_OUT_OF_MEMORY` when the system refuses it, before any thread starts.
    #[cfg(feature = "std")]
    #[test]
    fn a_batch_buffer_the_system_refuses_is_out_of_memory() {
        let blob = kvm_test_support::model_with(256, 0.1);
        let model = Model::from_bytes(&blob).unwrap();
        let state_len = model.header().state_capacity as usize;
        // A batch no memory holds (the C API caps it at KVM_MAX_BATCH_TOKENS; the
        // allocation path is the same).
        let exec = Exec { threads: 2, batch: 1 << 36 };
        assert_eq!(Engine::new(&model, state_len, exec).err(), Some(KVM_ERR_OUT_OF_MEMORY));
        assert!(Engine::new(&model, state_len, Exec { threads: 2, batch: 16 }).unwrap().is_some());
    }

    #[test]
    fn snapshot_crc_skips_its_own_field_and_the_core_snapshot() {
        // v3: the header and history, then from `from` on the logits after a 32-byte state.
        let mut a = [7u8; snap::CORE + 64];
        let from = snap::CORE + 32;
        let before = snap::crc(&a, from);
        a[snap::CRC..snap::CRC + 4].fill(0xFF);
        assert_eq!(snap::crc(&a, from), before);
        a[snap::CORE + 31] ^= 1;
        assert_eq!(snap::crc(&a, from), before, "the core's state counted");
        a[snap::CORE + 32] ^= 1;
        assert_ne!(snap::crc(&a, from), before, "v3's logits not counted");
        a[snap::CORE + 32] ^= 1;
        a[snap::CORE - 1] ^= 1;
        assert_ne!(snap::crc(&a, from), before, "the history not counted");
        // v4: the header and history alone; the core's snapshot has its own CRC.
        let end = a.len();
        let v4 = snap::crc(&a, end);
        a[snap::CORE + 40] ^= 1;
        assert_eq!(snap::crc(&a, end), v4);
    }
}
