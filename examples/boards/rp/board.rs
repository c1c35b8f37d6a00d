//! The board of both Raspberry Pi firmwares (Pico: RP2040, `rp2040-hal`; Pico 2: RP2350,
//! `rp235x-hal`): the two HALs share their API, so one file serves both, included by each
//! firmware's `main.rs` with `#[path]`, which names its HAL `hal` and gives `NAME`, `XOSC_HZ`,
//! its `model_info` consts and `usb_peripherals!` (the chips name the USB blocks apart).
//!
//! Clocks from the crystal through the PLL (125 MHz on the RP2040, 150 MHz on the RP2350),
//! UART0 on GP0 (TX) / GP1 (RX) at 115200 8N1 as the console (and USB CDC with the `usb`
//! feature, `usb.rs`), SysTick as the cycle
//! counter; the model linked into flash, or (feature `slot`) read from the model slot; the
//! arena in a static sized at build time.

use core::fmt::Write as _;

use cortex_m_rt::exception;
use hal::clocks::{init_clocks_and_plls, Clock};
use hal::fugit::RateExtU32;
use hal::gpio::{bank0, FunctionUart, Pin, Pins, PullDown};
use hal::pac;
use hal::uart::{DataBits, Enabled, StopBits, UartConfig, UartPeripheral};
use hal::{Sio, Watchdog};
use kvm_board_app::Board;
use kvm_core::Model;

use crate::model_info::ARENA_LEN;
use crate::{hal, NAME, XOSC_HZ};

#[cfg(feature = "usb")]
#[path = "usb.rs"]
mod usb;

const BAUD: u32 = 115_200;

/// A value on a 64-byte boundary: tensor data is 64-aligned within the model file, and the
/// arena must start on [`kvm_core::state::ARENA_ALIGN`].
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

const _: () = assert!(core::mem::align_of::<Aligned<u8>>() == kvm_core::state::ARENA_ALIGN);

/// The model file, in flash, decoded in place (XIP, never copied to RAM).
#[cfg(not(feature = "slot"))]
static MODEL: Aligned<[u8; crate::model_info::MODEL_LEN]> = Aligned(*include_bytes!(env!("KVM_BOARD_MODEL_PATH")));

/// The session arena (`.bss`).
static mut ARENA: Aligned<[u8; ARENA_LEN]> = Aligned([0; ARENA_LEN]);

type Uart = UartPeripheral<
    Enabled,
    pac::UART0,
    (Pin<bank0::Gpio0, FunctionUart, PullDown>, Pin<bank0::Gpio1, FunctionUart, PullDown>),
>;

/// The board as the application sees it.
pub struct Rp {
    uart: Uart,
    sys_hz: u32,
}

impl Board for Rp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn write(&mut self, bytes: &[u8]) {
        self.uart.write_full_blocking(bytes);
        #[cfg(feature = "usb")]
        usb::write(bytes);
        #[cfg(feature = "defmt")]
        defmt::info!("{=[u8]:a}", bytes);
    }

    fn ticks(&mut self) -> u64 {
        kvm_board_app::systick::ticks()
    }

    fn tick_hz(&self) -> u32 {
        self.sys_hz
    }

    fn clock_name(&self) -> &'static str {
        "core clock (clk_sys)"
    }
}

/// Clocks, UART0 on GP0/GP1, the cycle counter; `None` if the clocks do not start (then
/// there is no console to say so on).
pub fn start() -> Option<Rp> {
    let mut pac = pac::Peripherals::take()?;
    let core = cortex_m::Peripherals::take()?;
    let mut watchdog = Watchdog::new(pac.WATCHDOG);
    let clocks =
        init_clocks_and_plls(XOSC_HZ, pac.XOSC, pac.CLOCKS, pac.PLL_SYS, pac.PLL_USB, &mut pac.RESETS, &mut watchdog)
            .ok()?;
    let sio = Sio::new(pac.SIO);
    let pins = Pins::new(pac.IO_BANK0, pac.PADS_BANK0, sio.gpio_bank0, &mut pac.RESETS);
    let uart_pins = (pins.gpio0.into_function::<FunctionUart>(), pins.gpio1.into_function::<FunctionUart>());
    let uart = UartPeripheral::new(pac.UART0, uart_pins, &mut pac.RESETS)
        .enable(UartConfig::new(BAUD.Hz(), DataBits::Eight, None, StopBits::One), clocks.peripheral_clock.freq())
        .ok()?;
    #[cfg(feature = "usb")]
    {
        let (regs, dpram) = crate::usb_peripherals!(pac);
        usb::start(hal::usb::UsbBus::new(regs, dpram, clocks.usb_clock, true, &mut pac.RESETS));
    }
    kvm_board_app::systick::start(core.SYST);
    Some(Rp { uart, sys_hz: clocks.system_clock.freq().to_Hz() })
}

/// The whole firmware after start-up: the model, the application's run, the stack report.
pub fn run(rp: &mut Rp) {
    let how = kvm_board_app::Generate { n_gen: crate::model_info::N_GEN, echo_prompt: false };
    let run = open(rp).and_then(|(model, arena)| kvm_board_app::run(rp, model, arena, how));
    match run {
        Ok(()) => {
            let (bottom, top) = stack_region();
            // SAFETY: the stack region is word-aligned RAM that memory.x and link.x reserve.
            let used = unsafe { kvm_board_app::stack::used(bottom, top) };
            kvm_board_app::say!(rp, "stack used {} of {} bytes", used, top - bottom);
        }
        Err(e) => kvm_board_app::say!(rp, "error: {e}"),
    }
}

/// The model (linked, or from the slot), validated and described, with the parts of the
/// arena it uses. Call once.
fn open(rp: &mut Rp) -> Result<(Model<'static>, &'static mut [u8]), kvm_board_app::Fail> {
    let arena = &raw mut ARENA;
    // SAFETY: called once, from the entry, and nothing else names these statics, so these
    // are the only references to them.
    let arena = unsafe { &mut (*arena).0 };
    #[cfg(not(feature = "slot"))]
    let (model, place) = (kvm_board_app::validate(rp, &MODEL.0)?, "flash");
    #[cfg(feature = "slot")]
    let (model, place) = (kvm_board_app::find_model(rp, model_slot())?, "model slot");
    kvm_board_app::say!(
        rp,
        "model {} bytes at {:#010x} ({place}), arena {} bytes at {:#010x}",
        model.blob().len(),
        model.blob().as_ptr() as usize,
        arena.len(),
        arena.as_ptr() as usize
    );
    let arena = kvm_board_app::fit(&model, arena)?;
    Ok((model, arena))
}

extern "C" {
    /// The model slot (memory.x); only the symbols' addresses are taken.
    #[cfg(feature = "slot")]
    static _kvm_model_slot: u8;
    #[cfg(feature = "slot")]
    static _kvm_model_slot_len: u8;
    /// The stack region (cortex-m-rt's link.x): the end of the statics and the top of RAM.
    static _stack_start: u32;
    static _stack_end: u32;
}

/// The model slot's bytes.
#[cfg(feature = "slot")]
fn model_slot() -> &'static [u8] {
    let (start, len) = (&raw const _kvm_model_slot as usize, &raw const _kvm_model_slot_len as usize);
    // SAFETY: memory.x places the slot in flash, readable through XIP, which nothing
    // writes while the firmware runs.
    unsafe { kvm_board_app::slot::at(start, len) }
}

/// The stack region `[bottom, top)`.
fn stack_region() -> (usize, usize) {
    (&raw const _stack_end as usize, &raw const _stack_start as usize)
}

/// Sleeps for good: the report is out.
pub fn halt() -> ! {
    loop {
        cortex_m::asm::wfi();
    }
}

#[exception]
fn SysTick() {
    kvm_board_app::systick::wrapped();
}

/// UART0 as a bare `fmt::Write` for the panic handler, which cannot reach the board: waits
/// while the transmit FIFO is full, then writes the data register.
struct PanicUart;

impl core::fmt::Write for PanicUart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        // SAFETY: UART0's registers, only written here once the application has stopped;
        // the UART was enabled at start (if not, the bytes are lost, harmlessly).
        let uart = unsafe { &*pac::UART0::ptr() };
        for &b in s.as_bytes() {
            while uart.uartfr().read().txff().bit_is_set() {}
            // SAFETY: any byte is a valid data register value.
            uart.uartdr().write(|w| unsafe { w.data().bits(b) });
        }
        Ok(())
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    let _ = writeln!(PanicUart, "{NAME}: panic: {info}");
    halt()
}
