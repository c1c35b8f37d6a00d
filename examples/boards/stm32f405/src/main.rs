//! kvm on an STM32F405 (Cortex-M4F with the DSP extension: kvm-core's `dsp` kernel tier):
//! the shared application (`examples/boards/app`) with this chip's clocks, console and
//! timer, on `stm32f4xx-hal` (embassy-stm32's `init()` waits for the oscillator-ready flag
//! that QEMU 7.2's unimplemented clock controller never sets, so it cannot run in CI).
//!
//! - **The chip's build or the emulator's, chosen at build time.** Default, for the chip:
//!   the PLL at 168 MHz from the internal 16 MHz oscillator (HSI; no crystal is assumed, so
//!   any F405 board runs it), and after its report the core sleeps, as on every board. With
//!   the `qemu` feature, for QEMU's `netduinoplus2`: the HSI itself at 16 MHz, no PLL (QEMU
//!   7.2 leaves the clock controller unimplemented: it reads as zeros and the PLL never
//!   reports lock), and after its report the firmware resets the chip (`SCB::sys_reset`),
//!   which ends a QEMU run with `-no-reboot` (no semihosting to exit with). Everything else
//!   is the same image.
//! - **Console:** USART1, TX on PA9, 115200 8N1 (QEMU's first `-serial`).
//! - **Timer:** SysTick on the core clock, counting cycles (`kvm_board_app::systick`).
//! - **Model:** linked into flash from `KVM_BOARD_MODEL` (build.rs), or with the `slot`
//!   feature read from the model slot at 0x0808_0000 (memory.x), written apart; refused
//!   in words when missing or bad. The arena is a static sized for
//!   the build's model, in the 128 KiB SRAM.
//! - No semihosting anywhere: panics and faults are reported on USART1 too.
//! - **`defmt` feature:** the console's bytes and any failure go over RTT as well.
#![no_std]
#![no_main]

use cortex_m_rt::{entry, exception, ExceptionFrame};
use kvm_board_app::{say, Board, Fail, Generate};
use kvm_core::Model;
use stm32f4xx_hal::pac::{self, USART1};
use stm32f4xx_hal::prelude::*;
use stm32f4xx_hal::rcc::Config;
use stm32f4xx_hal::serial::Tx;

#[cfg(feature = "defmt")]
use defmt_rtt as _;

mod model_info {
    include!(concat!(env!("OUT_DIR"), "/model_info.rs"));
}
use model_info::ARENA_LEN;

const NAME: &str = "kvm-stm32f405";

/// A value on a 64-byte boundary: tensor data is 64-aligned within the model file, and the
/// arena must start on [`kvm_core::state::ARENA_ALIGN`].
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

const _: () = assert!(core::mem::align_of::<Aligned<u8>>() == kvm_core::state::ARENA_ALIGN);

/// The model file in flash, decoded in place.
#[cfg(not(feature = "slot"))]
static MODEL: Aligned<[u8; model_info::MODEL_LEN]> = Aligned(*include_bytes!(env!("KVM_BOARD_MODEL_PATH")));

/// The session arena (`.bss`, in SRAM).
static mut ARENA: Aligned<[u8; ARENA_LEN]> = Aligned([0; ARENA_LEN]);

#[entry]
fn main() -> ! {
    let dp = pac::Peripherals::take().expect("first and only take");
    let cp = cortex_m::Peripherals::take().expect("first and only take");
    let mut rcc = dp.RCC.freeze(clock());
    let gpioa = dp.GPIOA.split(&mut rcc);
    // 115200 8N1: `Config::from(Bps)` keeps 8 data bits, no parity, 1 stop bit.
    let tx = match dp.USART1.tx(gpioa.pa9, 115_200.bps(), &mut rcc) {
        Ok(tx) => tx,
        // No console to say it on: 115200 baud is within reach of every clock above.
        Err(_) => stop(),
    };
    let hz = rcc.clocks.sysclk().raw();
    let mut board = Stm32 { tx, hz };
    kvm_board_app::systick::start(cp.SYST);

    say!(&mut board, "core clock {} MHz ({})", hz / 1_000_000, CLOCK_SOURCE);
    if let Err(e) = run(&mut board) {
        say!(&mut board, "error: {e}");
        #[cfg(feature = "defmt")]
        defmt::error!("{}: {}", NAME, e);
    }
    let (bottom, top) = stack_region();
    // SAFETY: `[bottom, top)` is the stack region `link.x` reserves: aligned RAM, painted
    // at reset by cortex-m-rt's `paint-stack`.
    let used = unsafe { kvm_board_app::stack::used(bottom, top) };
    say!(&mut board, "stack used {} of {} bytes", used, top - bottom);
    let _ = embedded_io::Write::flush(&mut board.tx);
    stop()
}

/// The build's clock: see the crate's documentation.
#[cfg(feature = "qemu")]
fn clock() -> Config {
    Config::hsi()
}
#[cfg(feature = "qemu")]
const CLOCK_SOURCE: &str = "HSI, no PLL: the emulator's build";

#[cfg(not(feature = "qemu"))]
fn clock() -> Config {
    Config::hsi().sysclk(168.MHz())
}
#[cfg(not(feature = "qemu"))]
const CLOCK_SOURCE: &str = "PLL from HSI";

/// The end of a run (the last bytes already sent): the emulator's build resets the chip, so
/// QEMU with `-no-reboot` exits; the chip's sleeps until its reset button.
#[cfg(feature = "qemu")]
fn stop() -> ! {
    cortex_m::peripheral::SCB::sys_reset()
}
#[cfg(not(feature = "qemu"))]
fn stop() -> ! {
    loop {
        cortex_m::asm::wfi();
    }
}

/// The model (linked in, or from the slot), checked against the statics, then the run.
fn run(board: &mut Stm32) -> Result<(), Fail> {
    let model = open_model(board)?;
    let arena = &raw mut ARENA;
    // SAFETY: `run` is called once, from the entry, and nothing else names these statics,
    // so these are the only references to them.
    let arena = unsafe { &mut (*arena).0 };
    let arena = kvm_board_app::fit(&model, arena)?;
    kvm_board_app::run(board, model, arena, Generate { n_gen: model_info::N_GEN, echo_prompt: false })
}

#[cfg(not(feature = "slot"))]
fn open_model(board: &mut Stm32) -> Result<Model<'static>, Fail> {
    let blob: &'static [u8] = &MODEL.0;
    say!(board, "model {} bytes at {:#010x} (linked in)", blob.len(), blob.as_ptr() as usize);
    Ok(kvm_board_app::validate(board, blob)?)
}

#[cfg(feature = "slot")]
fn open_model(board: &mut Stm32) -> Result<Model<'static>, Fail> {
    extern "C" {
        /// The model slot (memory.x); only the symbols' addresses are taken.
        static _kvm_model_slot: u8;
        static _kvm_model_slot_len: u8;
    }
    let (at, len) = (&raw const _kvm_model_slot as usize, &raw const _kvm_model_slot_len as usize);
    say!(board, "model slot at {at:#010x} ({len} bytes)");
    // SAFETY: memory.x puts the slot in the chip's flash, always readable and never
    // written while the firmware runs.
    let slot = unsafe { kvm_board_app::slot::at(at, len) };
    Ok(kvm_board_app::find_model(board, slot)?)
}

/// The board as the application sees it.
struct Stm32 {
    tx: Tx<USART1>,
    hz: u32,
}

impl Board for Stm32 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn write(&mut self, bytes: &[u8]) {
        // Best effort: a USART write has nowhere to report failing.
        let _ = embedded_io::Write::write_all(&mut self.tx, bytes);
        #[cfg(feature = "defmt")]
        defmt::info!("{=[u8]:a}", bytes);
    }

    fn ticks(&mut self) -> u64 {
        kvm_board_app::systick::ticks()
    }

    fn tick_hz(&self) -> u32 {
        self.hz
    }
}

#[exception]
fn SysTick() {
    kvm_board_app::systick::wrapped();
}

extern "C" {
    static _stack_start: u32;
    static _stack_end: u32;
}

/// The stack region `[bottom, top)`: `link.x` puts it between the end of the statics and
/// the top of RAM. Only the symbols' addresses are taken.
fn stack_region() -> (usize, usize) {
    (&raw const _stack_end as usize, &raw const _stack_start as usize)
}

/// Writes `bytes` on USART1 by its registers: for the fault and panic handlers, which
/// cannot reach the `Tx` that `main` owns (whatever it was doing is abandoned).
fn emergency_write(bytes: &[u8]) {
    // SAFETY: USART1's register block is always mapped; the firmware is stopping, so
    // nothing else drives the USART any more.
    let usart = unsafe { &*USART1::ptr() };
    for &b in bytes {
        while usart.sr().read().txe().bit_is_clear() {}
        usart.dr().write(|w| unsafe { w.dr().bits(u16::from(b)) });
    }
    while usart.sr().read().tc().bit_is_clear() {}
}

/// Formats one line into a stack buffer for [`emergency_write`] (cut where it is full).
fn emergency_line(args: core::fmt::Arguments<'_>) {
    use core::fmt::Write as _;
    let mut line = heapless::String::<160>::new();
    let _ = line.write_fmt(args);
    emergency_write(line.as_bytes());
}

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    emergency_line(format_args!("\n{NAME}: hard fault at pc {:#010x}\n", frame.pc()));
    stop()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    #[cfg(feature = "defmt")]
    defmt::error!("{}: panic", NAME);
    emergency_line(format_args!("\n{NAME}: panic: {info}\n"));
    stop()
}
