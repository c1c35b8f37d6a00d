//! kvm on a microcontroller (Cortex-M or RISC-V): greedy text generation from a model in
//! flash, with constant memory.
//!
//! By default the model file is linked into flash with `include_bytes!` (64-byte aligned)
//! and decoded in place; the session lives in one `static` arena whose size comes from the
//! model at build time and is checked against it again at start. Nothing allocates: there
//! is no heap. The `heap` build instead finds its model in the board's model slot, takes
//! the attention cache from its command line and allocates the arena from a heap
//! (`source/heap.rs`). Text and reports go out over semihosting; the exit code is 0 on
//! success, 1 on an error, 101 on a panic and 102 on a hard fault.
//!
//! Everything but start-up is shared: `arch/arm.rs` (cortex-m-rt) and `arch/riscv.rs`
//! (riscv-rt) each give the tick counter, the stack region and the fault handler (`stack.rs`
//! measures the stack from that region);
//! `source/linked.rs` and `source/heap.rs` each give a model, an arena and the sampler's
//! scratch.
//!
//! Output, in order (see README.md for the exact contract):
//! ```text
//! kvm-mcu: ...                      (reports)
//! --- kvm output ---
//! <continuation bytes>              (prompt first with the `echo-prompt` feature)
//! --- end ---
//! kvm-mcu: ...                      (timings, stack use)
//! ```
#![no_std]
#![no_main]

#[cfg(feature = "heap")]
extern crate alloc;

use core::fmt;

use kvm_core::format::TokenizerKind;
use kvm_core::sampler::{Candidate, Sampler, SamplerConfig};
use kvm_core::{Model, Session};
use semihosting::println;
use semihosting::sys::arm_compat::{sys_elapsed, sys_tickfreq};

#[cfg_attr(target_arch = "arm", path = "arch/arm.rs")]
#[cfg_attr(target_arch = "riscv32", path = "arch/riscv.rs")]
mod arch;

#[cfg_attr(not(feature = "heap"), path = "source/linked.rs")]
#[cfg_attr(feature = "heap", path = "source/heap.rs")]
mod source;

mod stack;

mod model_info {
    include!(concat!(env!("OUT_DIR"), "/model_info.rs"));
}

/// The prompt, as bytes (the model is byte-level: token id = byte value).
const PROMPT: &[u8] = b"And God said";
/// Tokens to generate.
const N_GEN: usize = 64;

#[cfg_attr(target_arch = "arm", cortex_m_rt::entry)]
#[cfg_attr(target_arch = "riscv32", riscv_rt::entry)]
fn main() -> ! {
    arch::init();
    let code = match source::open().and_then(|(model, arena, candidates)| run(model, arena, candidates)) {
        Ok(()) => 0,
        Err(e) => {
            println!("kvm-mcu: error: {e}");
            1
        }
    };
    semihosting::process::exit(code)
}

/// Validates the model file twice to report what the tensor-data CRCs cost at boot; the
/// checked model is the one returned.
fn validate(blob: &'static [u8]) -> Result<Model<'static>, Fail> {
    let t0 = Stamp::now();
    let model = Model::from_bytes(blob)?;
    let t1 = Stamp::now();
    Model::from_bytes_trusted(blob)?;
    let t2 = Stamp::now();
    println!("kvm-mcu: from_bytes (all CRCs): {}", Span(t0, t1));
    println!("kvm-mcu: from_bytes_trusted: {}", Span(t1, t2));
    Ok(model)
}

/// Everything that stops the firmware.
#[derive(Debug)]
enum Fail {
    Core(kvm_core::Error),
    /// The arena was sized for another model.
    #[cfg(not(feature = "heap"))]
    ArenaLen {
        built: usize,
        model: usize,
    },
    /// The sampler scratch was sized for another vocabulary.
    #[cfg(not(feature = "heap"))]
    VocabLen {
        built: usize,
        model: usize,
    },
    /// Only byte-level models map token ids to text without a tokenizer here.
    NotByteLevel,
    /// The model slot holds no model file that fits in it.
    #[cfg(feature = "heap")]
    NoModel,
    /// The command line is not `[--cache f32|f16|q8]`.
    #[cfg(feature = "heap")]
    Usage,
    /// The heap cannot hold the arena and the sampler scratch.
    #[cfg(feature = "heap")]
    HeapFull {
        need: usize,
        heap: usize,
    },
}

impl From<kvm_core::Error> for Fail {
    fn from(e: kvm_core::Error) -> Self {
        Fail::Core(e)
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fail::Core(e) => write!(f, "{e}"),
            #[cfg(not(feature = "heap"))]
            Fail::ArenaLen { built, model } => {
                write!(f, "firmware arena is {built} bytes but the model needs {model}; rebuild for this model")
            }
            #[cfg(not(feature = "heap"))]
            Fail::VocabLen { built, model } => {
                write!(f, "firmware was built for a vocabulary of {built}, the model has {model}")
            }
            Fail::NotByteLevel => f.write_str("this firmware needs a byte-level model"),
            #[cfg(feature = "heap")]
            Fail::NoModel => f.write_str("no model file in the model slot"),
            #[cfg(feature = "heap")]
            Fail::Usage => f.write_str("usage: kvm-mcu [--cache f32|f16|q8]"),
            #[cfg(feature = "heap")]
            Fail::HeapFull { need, heap } => {
                write!(f, "the arena and sampler scratch need {need} bytes, the heap has {heap}")
            }
        }
    }
}

fn run(model: Model<'static>, arena: &'static mut [u8], candidates: &mut [Candidate]) -> Result<(), Fail> {
    if model.header().tokenizer_kind != TokenizerKind::Bytes {
        return Err(Fail::NotByteLevel);
    }
    let arena_len = arena.len();
    let mut session = Session::new(model, arena)?;
    let state_bytes = session.layout().snapshot_len();
    println!(
        "kvm-mcu: arena = state {} bytes ({} slots) + scratch {} bytes",
        state_bytes,
        session.layout().state_len,
        arena_len - state_bytes
    );
    let mut sampler = Sampler::new(SamplerConfig::greedy(), 0);
    // Prompt then generated ids, oldest first: the sampler's repetition window.
    let mut history: heapless::Vec<u32, { PROMPT.len() + N_GEN }> = PROMPT.iter().map(|&b| u32::from(b)).collect();

    let t3 = Stamp::now();
    session.prefill(&history)?;
    let t4 = Stamp::now();
    while !history.is_full() {
        // From the ids with text only: a padding id is never picked.
        let id = sampler.sample(session.text_logits(), &history, candidates)?;
        // Cannot fail: the loop runs only while there is room.
        let _ = history.push(id);
        session.decode(id)?;
    }
    let t5 = Stamp::now();

    // Ids below 256 are bytes (a byte-level model's text ids).
    let text: heapless::Vec<u8, { PROMPT.len() + N_GEN }> =
        history.iter().filter_map(|&id| u8::try_from(id).ok()).collect();
    println!("--- kvm output ---");
    let shown = if cfg!(feature = "echo-prompt") { &text[..] } else { &text[PROMPT.len()..] };
    print_bytes(shown);
    println!();
    println!("--- end ---");

    println!("kvm-mcu: prefill {} tokens: {}", PROMPT.len(), Span(t3, t4));
    println!("kvm-mcu: decode {} tokens: {}; {}", N_GEN, Span(t4, t5), TokPerS(N_GEN, Span(t4, t5)));
    println!("kvm-mcu: stack used {} of {} bytes", stack::used(), stack::size());
    Ok(())
}

/// Writes raw bytes (the text need not be valid UTF-8 at a cut) to semihosting stdout.
fn print_bytes(bytes: &[u8]) {
    use semihosting::io::Write as _;
    if let Ok(mut out) = semihosting::io::stdout() {
        // Output is best effort: nowhere to report a failed semihosting write.
        let _ = out.write_all(bytes);
    }
}

/// A reading of two clocks: the host's, through semihosting (QEMU's wall clock; absent on
/// hardware without a debugger), and the processor clock (see `arch::ticks`).
#[derive(Debug, Clone, Copy)]
struct Stamp {
    host_ns: Option<u64>,
    ticks: u64,
}

impl Stamp {
    fn now() -> Stamp {
        let host_ns = (|| {
            let ticks = sys_elapsed().ok()?;
            let freq = sys_tickfreq().ok()? as u64;
            (freq != 0).then(|| ticks.saturating_mul(1_000_000_000 / freq.min(1_000_000_000)))
        })();
        Stamp { host_ns, ticks: arch::ticks() }
    }
}

/// The time between two stamps: `<host> ms host, <n> ticks`.
#[derive(Debug, Clone, Copy)]
struct Span(Stamp, Stamp);

impl Span {
    fn host_ns(&self) -> Option<u64> {
        Some(self.1.host_ns?.saturating_sub(self.0.host_ns?))
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host_ns() {
            Some(ns) => write!(f, "{}.{:03} ms host, ", ns / 1_000_000, ns / 1000 % 1000)?,
            None => f.write_str("(no host clock), ")?,
        }
        write!(f, "{} ticks", self.1.ticks.wrapping_sub(self.0.ticks))
    }
}

/// Tokens per second of host time (QEMU's speed on this host, not the device's).
struct TokPerS(usize, Span);

impl fmt::Display for TokPerS {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1.host_ns() {
            Some(ns) if ns > 0 => {
                let centi = self.0 as u64 * 100_000_000_000 / ns;
                write!(f, "{}.{:02} tok/s host", centi / 100, centi % 100)
            }
            _ => f.write_str("? tok/s"),
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("kvm-mcu: panic: {info}");
    semihosting::process::exit(101)
}
