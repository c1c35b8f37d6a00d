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
//! The application itself (validate, prefill, generate, stream, time) is the one every
//! board runs, `examples/boards/app` (`kvm-board-app`); this firmware is one board of it:
//! semihosting as the console and the host clock, and `arch/arm.rs` (cortex-m-rt) or
//! `arch/riscv.rs` (riscv-rt) for the tick counter, the stack region and the fault handler;
//! `source/linked.rs` and `source/heap.rs` each give a model, an arena and the sampler's
//! scratch.
//!
//! Output, in order (see README.md for the exact contract):
//! ```text
//! kvm-mcu: ...                      (reports)
//! --- kvm output ---
//! <continuation bytes>              (prompt first with the `echo-prompt` feature), streamed
//! --- end ---
//! kvm-mcu: ...                      (timings, speed, stack use)
//! ```
#![no_std]
#![no_main]

#[cfg(feature = "heap")]
extern crate alloc;

use core::fmt;

use kvm_board_app::{Board, Generate};
use semihosting::println;
use semihosting::sys::arm_compat::{sys_elapsed, sys_tickfreq};

#[cfg_attr(target_arch = "arm", path = "arch/arm.rs")]
#[cfg_attr(target_arch = "riscv32", path = "arch/riscv.rs")]
mod arch;

#[cfg_attr(not(feature = "heap"), path = "source/linked.rs")]
#[cfg_attr(feature = "heap", path = "source/heap.rs")]
mod source;

mod model_info {
    include!(concat!(env!("OUT_DIR"), "/model_info.rs"));
}

/// Tokens to generate.
const N_GEN: usize = kvm_board_app::MAX_GEN;

#[cfg_attr(target_arch = "arm", cortex_m_rt::entry)]
#[cfg_attr(target_arch = "riscv32", riscv_rt::entry)]
fn main() -> ! {
    arch::init();
    let board = &mut Semihosting;
    let how = Generate { n_gen: N_GEN, echo_prompt: cfg!(feature = "echo-prompt") };
    let run = source::open(board).and_then(|(model, arena)| Ok(kvm_board_app::run(board, model, arena, how)?));
    let code = match run {
        Ok(()) => {
            let (bottom, top) = arch::stack_region();
            // SAFETY: the stack region is word-aligned RAM the linker script reserves.
            let used = unsafe { kvm_board_app::stack::used(bottom, top) };
            println!("kvm-mcu: stack used {} of {} bytes", used, top - bottom);
            0
        }
        Err(e) => {
            println!("kvm-mcu: error: {e}");
            1
        }
    };
    semihosting::process::exit(code)
}

/// The QEMU boards as the application sees them: semihosting's stdout as the console and
/// its elapsed time as the host clock, the processor's tick counter as the board's clock.
struct Semihosting;

impl Board for Semihosting {
    fn name(&self) -> &'static str {
        "kvm-mcu"
    }

    fn write(&mut self, bytes: &[u8]) {
        use semihosting::io::Write as _;
        if let Ok(mut out) = semihosting::io::stdout() {
            // Output is best effort: nowhere to report a failed semihosting write.
            let _ = out.write_all(bytes);
        }
    }

    fn ticks(&mut self) -> u64 {
        arch::ticks()
    }

    fn tick_hz(&self) -> u32 {
        model_info::TICK_HZ
    }

    fn clock_name(&self) -> &'static str {
        "core clock (QEMU's virtual time)"
    }

    fn host_ns(&mut self) -> Option<u64> {
        let ticks = sys_elapsed().ok()?;
        let freq = sys_tickfreq().ok()? as u64;
        (freq != 0).then(|| ticks.saturating_mul(1_000_000_000 / freq.min(1_000_000_000)))
    }
}

/// Everything that stops the firmware.
#[derive(Debug)]
enum Fail {
    /// The application's reasons (the model, the slot, the session).
    App(kvm_board_app::Fail),
    /// The command line is not `[--cache f32|f16|q8]`.
    #[cfg(feature = "heap")]
    Usage,
    /// The heap cannot hold the arena.
    #[cfg(feature = "heap")]
    HeapFull { need: usize, heap: usize },
}

impl From<kvm_board_app::Fail> for Fail {
    fn from(e: kvm_board_app::Fail) -> Self {
        Fail::App(e)
    }
}

impl From<kvm_core::Error> for Fail {
    fn from(e: kvm_core::Error) -> Self {
        Fail::App(e.into())
    }
}

impl fmt::Display for Fail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fail::App(e) => write!(f, "{e}"),
            #[cfg(feature = "heap")]
            Fail::Usage => f.write_str("usage: kvm-mcu [--cache f32|f16|q8]"),
            #[cfg(feature = "heap")]
            Fail::HeapFull { need, heap } => {
                write!(f, "the arena needs {need} bytes, the heap has {heap}")
            }
        }
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("kvm-mcu: panic: {info}");
    semihosting::process::exit(101)
}
