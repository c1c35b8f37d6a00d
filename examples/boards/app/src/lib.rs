//! The board-independent kvm application, shared by every firmware (`examples/mcu` on QEMU,
//! `examples/boards/*` on the boards people own): validate a model, open a session on a
//! caller-owned arena, prefill the prompt, generate greedily and stream each token's bytes
//! to the board's console as it is generated, then report the speed from the board's own
//! clock.
//!
//! A board supplies only what differs between chips ([`Board`]): a console that takes
//! bytes, a tick counter and its rate, and a name. Where the model lives (linked into the
//! image, or a slot in flash written apart: [`slot`]) and where the arena lives (a static,
//! a heap) is the firmware's choice; this crate takes them as values.
//!
//! Output, in order (the host's comparison reads the bytes between the markers):
//! ```text
//! <name>: model: 2 layers, d_model 256, ...  (the model's one-line description)
//! <name>: from_bytes (all CRCs): 90.083 ms (11260367 cycles)   (reports)
//! --- kvm output ---
//! <continuation bytes>                        (prompt first when asked), one token at a time
//! --- end ---
//! <name>: prefill 12 tokens: 812.087 ms (101510905 cycles)
//! <name>: decode 64 tokens: 9241.795 ms (1155224425 cycles)
//! <name>: speed: 18050381 cycles a token at 125.000 MHz core clock, 6.92 tok/s
//! ```
//! Times are the board's own tick counter at its rate ([`Board::tick_hz`]). Under QEMU,
//! whose ticks are virtual time and which has the host's clock through semihosting, the
//! times read `4.881 ms host, 86073 ticks` instead (`examples/mcu`).
//! The text is the bytes after the line `--- kvm output ---` up to (not including) the
//! newline before the line `--- end ---`; the application adds that newline itself, so a
//! text without a trailing newline is still exact.
#![no_std]

use core::fmt::{self, Write as _};

use kvm_core::config::flags;
use kvm_core::format::TokenizerKind;
use kvm_core::{kernels, Model, Session};

pub mod mmu;
pub mod slot;
pub mod stack;
#[cfg(feature = "cortex-m")]
pub mod systick;

/// The prompt, as bytes (the model is byte-level: token id = byte value).
pub const PROMPT: &[u8] = b"And God said";
/// The most tokens a run generates (the size of its history buffer).
pub const MAX_GEN: usize = 64;

/// What a firmware gives the application: its console, its clock and its name.
pub trait Board {
    /// Starts every report line (`kvm-mcu`, `kvm-pico`).
    fn name(&self) -> &'static str;
    /// Writes raw bytes to the console (text need not be valid UTF-8 at a token's cut).
    /// Best effort: a console has nowhere to report its own failure.
    fn write(&mut self, bytes: &[u8]);
    /// The tick counter: a free-running count of [`Board::tick_hz`] ticks a second.
    fn ticks(&mut self) -> u64;
    /// The tick counter's rate, in Hz: the core clock where it counts cycles.
    fn tick_hz(&self) -> u32;
    /// What the tick counter counts, as it is named in the speed line.
    fn clock_name(&self) -> &'static str {
        "core clock"
    }
    /// Nanoseconds of a host clock, where the board has one (QEMU through semihosting); a
    /// chip on its own has none.
    fn host_ns(&mut self) -> Option<u64> {
        None
    }
}

/// Writes one report line, `<name>: <text>\n`, to a board's console.
#[macro_export]
macro_rules! say {
    ($board:expr, $($arg:tt)*) => {
        $crate::say_fmt(&mut *$board, format_args!($($arg)*))
    };
}

/// [`say!`]'s function: one report line.
pub fn say_fmt<B: Board + ?Sized>(board: &mut B, args: fmt::Arguments<'_>) {
    let name = board.name();
    let mut out = Console(board);
    // Formatting into the console cannot fail: `Console::write_str` never does.
    let _ = writeln!(out, "{name}: {args}");
}

/// A board's console as a `fmt::Write`.
pub struct Console<'b, B: Board + ?Sized>(pub &'b mut B);

impl<B: Board + ?Sized> fmt::Write for Console<'_, B> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// Everything that stops the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Fail {
    /// The core refused the model or a step.
    Core(kvm_core::Error),
    /// The model slot holds no usable model ([`slot::find_model`]).
    Slot(slot::SlotError),
    /// The model slot cannot be mapped into the address space ([`mmu`]).
    Map(mmu::MapError),
    /// Only byte-level models map token ids to text without a tokenizer here.
    NotByteLevel,
    /// The firmware's arena was sized for another model.
    ArenaLen { built: usize, model: usize },
}

impl From<kvm_core::Error> for Fail {
    fn from(e: kvm_core::Error) -> Self {
        Fail::Core(e)
    }
}

impl From<mmu::MapError> for Fail {
    fn from(e: mmu::MapError) -> Self {
        Fail::Map(e)
    }
}

impl From<slot::SlotError> for Fail {
    fn from(e: slot::SlotError) -> Self {
        Fail::Slot(e)
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fail::Core(e) => write!(f, "{e}"),
            Fail::Slot(e) => write!(f, "{e}"),
            Fail::Map(e) => write!(f, "{e}"),
            Fail::NotByteLevel => f.write_str("this firmware needs a byte-level model"),
            Fail::ArenaLen { built, model } => {
                write!(f, "firmware arena is {built} bytes but the model needs {model}; rebuild for this model")
            }
        }
    }
}

impl core::error::Error for Fail {}

/// Validates `blob` completely, reporting what the tensor-data CRCs cost at boot (a second,
/// trusted validation is timed beside it); prints the model's description.
///
/// # Errors
/// The core's verdict on the blob.
pub fn validate<B: Board + ?Sized>(board: &mut B, blob: &'static [u8]) -> Result<Model<'static>, kvm_core::Error> {
    let t0 = Stamp::now(board);
    let model = Model::from_bytes(blob)?;
    let t1 = Stamp::now(board);
    Model::from_bytes_trusted(blob)?;
    let t2 = Stamp::now(board);
    say!(board, "model: {}", Describe(&model));
    say!(board, "kernel tier {}", kvm_core::kernels::tier());
    let hz = board.tick_hz();
    say!(board, "from_bytes (all CRCs): {}", Span::between(t0, t1).at(hz));
    say!(board, "from_bytes_trusted: {}", Span::between(t1, t2).at(hz));
    Ok(model)
}

/// The model in the model slot `slot` (see [`slot`]): its declared length bounded by the
/// slot, validated as [`validate`] does.
///
/// # Errors
/// [`slot::SlotError`], in words through its `Display`: an empty slot, a file longer than
/// the slot, or the core's reason for refusing the bytes there.
pub fn find_model<B: Board + ?Sized>(board: &mut B, slot: &'static [u8]) -> Result<Model<'static>, slot::SlotError> {
    let blob = slot::read(slot)?;
    validate(board, blob).map_err(|e| slot::SlotError::bad(slot, e))
}

/// The part of a firmware's arena that a model uses: its first `model.arena_len()` bytes.
/// The arena's size comes from a model at build time; a model swapped in later (the model
/// slot) may need less, or more.
///
/// # Errors
/// [`Fail::ArenaLen`] when the model needs more than the firmware has.
pub fn fit<'r>(model: &Model<'_>, arena: &'r mut [u8]) -> Result<&'r mut [u8], Fail> {
    let built = arena.len();
    arena.get_mut(..model.arena_len()).ok_or(Fail::ArenaLen { built, model: model.arena_len() })
}

/// How a run generates: how many tokens (at most [`MAX_GEN`]) and whether the prompt is
/// printed before the continuation, as `kvm generate` does on its stdout.
#[derive(Debug, Clone, Copy)]
pub struct Generate {
    pub n_gen: usize,
    pub echo_prompt: bool,
}

/// Greedy generation from [`PROMPT`]: prefill, then `n_gen` tokens, each written to the
/// console as soon as it is picked; then the timings. `arena` must be `model.arena_len()`
/// bytes on [`kvm_core::state::ARENA_ALIGN`]. Greedy needs no sampler scratch: the pick is
/// the sampler's own greedy one (`kernels::argmax` of the ids with text, ties to the lowest
/// id), so a firmware spends no RAM on candidates (2 KiB for a byte-level vocabulary, which
/// the 256 KiB configurations have no room for).
///
/// # Errors
/// [`Fail::NotByteLevel`] for a model with a tokenizer; the core's errors from the session.
pub fn run<B: Board + ?Sized>(board: &mut B, model: Model<'_>, arena: &mut [u8], how: Generate) -> Result<(), Fail> {
    if model.header().tokenizer_kind != TokenizerKind::Bytes {
        return Err(Fail::NotByteLevel);
    }
    let arena_len = arena.len();
    let mut session = Session::new(model, arena)?;
    let state_bytes = session.layout().snapshot_len();
    say!(
        board,
        "arena = state {} bytes ({} slots) + scratch {} bytes",
        state_bytes,
        session.layout().state_len,
        arena_len - state_bytes
    );
    // Prompt then generated ids, oldest first.
    let mut history: heapless::Vec<u32, { PROMPT.len() + MAX_GEN }> = PROMPT.iter().map(|&b| u32::from(b)).collect();
    let n_gen = how.n_gen.min(MAX_GEN);

    board.write(b"--- kvm output ---\n");
    if how.echo_prompt {
        board.write(PROMPT);
    }
    let t0 = Stamp::now(board);
    session.prefill(&history)?;
    let prefill = Span::between(t0, Stamp::now(board));
    // Decode time is the sum of the steps' own times: the console's writes between them
    // are not the model's cost.
    let mut decode = Span { host_ns: t0.host_ns.map(|_| 0), ticks: 0 };
    while history.len() < PROMPT.len() + n_gen {
        let t = Stamp::now(board);
        // From the ids with text only: a padding id is never picked.
        let id = kernels::argmax(session.text_logits()).ok_or(kvm_core::Error::InvalidArgument)? as u32;
        // Cannot fail: the loop runs only while there is room.
        let _ = history.push(id);
        session.decode(id)?;
        decode = decode.plus(Span::between(t, Stamp::now(board)));
        // Ids below 256 are bytes (a byte-level model's text ids).
        if let Ok(byte) = u8::try_from(id) {
            board.write(&[byte]);
        }
    }
    board.write(b"\n--- end ---\n");

    let hz = board.tick_hz();
    say!(board, "prefill {} tokens: {}", PROMPT.len(), prefill.at(hz));
    say!(board, "decode {} tokens: {}{}", n_gen, decode.at(hz), HostRate(n_gen, decode));
    let speed = Speed { tokens: n_gen, span: decode, hz, clock: board.clock_name() };
    say!(board, "speed: {speed}");
    Ok(())
}

/// The model's one-line description: shapes, numerics, storage, file size.
pub struct Describe<'m, 'a>(pub &'m Model<'a>);

impl fmt::Display for Describe<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, c) = (self.0, self.0.config());
        let numerics = if c.has(flags::INT_NUMERICS) { "int" } else { "float" };
        // The weights' storage is that of the largest tensor (norms and biases may differ).
        let weights = m.tensors().max_by_key(|t| t.len).map_or("none", |t| t.dtype.name());
        write!(
            f,
            "{} layers, d_model {}, {} heads (d_qk {}, d_v {}), d_ff {}, vocab {}; {} numerics, {} weights, \
             {} cache, slot reads {}; {} bytes, arena {} bytes",
            c.n_layers,
            c.d_model,
            c.n_heads,
            c.d_qk,
            c.d_v,
            c.d_ff,
            c.vocab_len,
            numerics,
            weights,
            m.cache().name(),
            m.slot_reads().name(),
            m.blob().len(),
            m.arena_len()
        )
    }
}

/// A reading of the board's clocks: its tick counter and, where there is one, the host's.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    host_ns: Option<u64>,
    ticks: u64,
}

impl Stamp {
    fn now<B: Board + ?Sized>(board: &mut B) -> Stamp {
        Stamp { host_ns: board.host_ns(), ticks: board.ticks() }
    }
}

/// Time spent: ticks, and host nanoseconds where both ends had a host clock.
#[derive(Debug, Clone, Copy)]
struct Span {
    host_ns: Option<u64>,
    ticks: u64,
}

impl Span {
    fn between(a: Stamp, b: Stamp) -> Span {
        let host_ns = match (a.host_ns, b.host_ns) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Span { host_ns, ticks: b.ticks.wrapping_sub(a.ticks) }
    }

    /// The sum of two spans; the host time only if both have one.
    fn plus(self, o: Span) -> Span {
        let host_ns = match (self.host_ns, o.host_ns) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        Span { host_ns, ticks: self.ticks + o.ticks }
    }

    /// The span as printed, its ticks counted at `hz`.
    fn at(self, hz: u32) -> Timed {
        Timed { span: self, hz }
    }
}

/// A span as printed: on a board, the time its own clock measured and the cycles,
/// `<t> ms (<n> cycles)`; under QEMU (a host clock), `<host> ms host, <n> ticks`, the
/// host's time and the virtual clock's ticks (`examples/mcu/run-qemu.sh` reads them).
struct Timed {
    span: Span,
    hz: u32,
}

impl fmt::Display for Timed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ticks = self.span.ticks;
        match self.span.host_ns {
            Some(ns) => write!(f, "{}.{:03} ms host, {ticks} ticks", ns / 1_000_000, ns / 1000 % 1000),
            None => {
                // Microseconds in u64 (u128 arithmetic would cost small chips code and
                // stack): whole seconds, then the remainder, below 2^32, times 10^6.
                let hz = u64::from(self.hz.max(1));
                let us = (ticks / hz).saturating_mul(1_000_000).saturating_add(ticks % hz * 1_000_000 / hz);
                write!(f, "{}.{:03} ms ({ticks} cycles)", us / 1000, us % 1000)
            }
        }
    }
}

/// `; <r> tok/s host` where there is a host clock (QEMU's speed on its host, not the
/// device's), else nothing.
struct HostRate(usize, Span);

impl fmt::Display for HostRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1.host_ns {
            Some(ns) if ns > 0 => {
                let centi = self.0 as u64 * 100_000_000_000 / ns;
                write!(f, "; {}.{:02} tok/s host", centi / 100, centi % 100)
            }
            _ => Ok(()),
        }
    }
}

/// The device's speed from its own clock: ticks a token, and tokens a second at the tick
/// rate: `<n> cycles a token at <f> MHz core clock, <r> tok/s`.
struct Speed {
    tokens: usize,
    span: Span,
    hz: u32,
    clock: &'static str,
}

impl fmt::Display for Speed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, ticks) = (self.tokens as u64, self.span.ticks);
        if n == 0 || ticks == 0 {
            return f.write_str("no tokens timed");
        }
        let centi = n * u64::from(self.hz) * 100 / ticks;
        let khz = self.hz / 1000;
        write!(
            f,
            "{} cycles a token at {}.{:03} MHz {}, {}.{:02} tok/s",
            ticks / n,
            khz / 1000,
            khz % 1000,
            self.clock,
            centi / 100,
            centi % 100
        )
    }
}
