//! kvm on an ESP32-C3 (RV32IMC: no FPU, no atomics): the shared application
//! (`examples/boards/app`) with this chip's clock, console and timer, on `esp-hal`
//! (Espressif's own HAL, the one its second-stage bootloader and `espflash` are made for).
//!
//! - **Model:** tiny-kjv in the integer numerics (docs/integer.md) in its 256 KiB
//!   configuration (i8 attention rows, slot reads recomputed: a 246,656-byte arena; the
//!   full one's 320,384 bytes do not fit the 313 KiB of data RAM esp-hal's memory map
//!   gives an application), linked into flash from `KVM_BOARD_MODEL` (build.rs) and read
//!   in place through the flash cache; or, with the `slot` feature, read from the model
//!   slot (the `model` partition, written apart with `espflash write-bin`; `slot.rs` maps
//!   it), refused in words when there is none or a bad one.
//! - **Clock:** the CPU at 160 MHz (`CpuClock::max()`).
//! - **Console:** through `esp-println`, the USB-Serial-JTAG port (the chip's own USB
//!   pins) by default, or UART0 at 115200 8N1 with the `uart` feature (Cargo.toml says
//!   which boards wire which to their connector).
//! - **Timer:** the core's machine performance counter counting cycles (CSRs `mpcer`,
//!   `mpcmr`, `mpccr`: the counter ESP-IDF's `esp_cpu_get_cycle_count` reads), 32 bits,
//!   its wraps counted on every reading.
//! - **End:** after its report the core sleeps (`wfi`); press RESET to run again. No
//!   semihosting anywhere.
//! - **`defmt` feature:** the console's bytes and any failure go over RTT as well.
#![no_std]
#![no_main]

use esp_hal::clock::CpuClock;
use kvm_board_app::{say, Board, Fail, Generate};
use kvm_core::Model;

esp_bootloader_esp_idf::esp_app_desc!();

mod model_info {
    include!(concat!(env!("OUT_DIR"), "/model_info.rs"));
}
use model_info::ARENA_LEN;

#[cfg(feature = "slot")]
mod slot;
#[cfg(feature = "slot")]
mod slot_info {
    include!(concat!(env!("OUT_DIR"), "/slot_info.rs"));
}

const NAME: &str = "kvm-esp32c3";
/// The core clock `CpuClock::max()` sets on the ESP32-C3.
const CPU_HZ: u32 = 160_000_000;

/// A value on a 64-byte boundary: tensor data is 64-aligned within the model file, and the
/// arena must start on [`kvm_core::state::ARENA_ALIGN`].
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

const _: () = assert!(core::mem::align_of::<Aligned<u8>>() == kvm_core::state::ARENA_ALIGN);

/// The model file in flash (`.rodata`, mapped through the cache), decoded in place.
#[cfg(not(feature = "slot"))]
static MODEL: Aligned<[u8; model_info::MODEL_LEN]> = Aligned(*include_bytes!(env!("KVM_BOARD_MODEL_PATH")));
/// The session arena (`.bss`, in data RAM).
static mut ARENA: Aligned<[u8; ARENA_LEN]> = Aligned([0; ARENA_LEN]);

#[esp_hal::main]
fn main() -> ! {
    let _peripherals = esp_hal::init(esp_hal::Config::default().with_cpu_clock(CpuClock::max()));
    #[cfg(feature = "defmt")]
    rtt_target::rtt_init_defmt!();
    let mut board = EspC3 { cycles: CycleCounter::start() };
    say!(&mut board, "core clock {} MHz", CPU_HZ / 1_000_000);
    if let Err(e) = run(&mut board) {
        say!(&mut board, "error: {e}");
        #[cfg(feature = "defmt")]
        defmt::error!("{}: {}", NAME, e);
    }
    sleep()
}

/// The end of a run: the core waits for interrupts (none is enabled) until RESET.
fn sleep() -> ! {
    loop {
        // SAFETY: `wfi` only pauses the core; it touches no memory.
        unsafe { core::arch::asm!("wfi", options(nomem, nostack)) };
    }
}

/// The model (linked in, or from the slot), checked against the statics, then the run.
fn run(board: &mut EspC3) -> Result<(), Fail> {
    let model = open(board)?;
    let arena = &raw mut ARENA;
    // SAFETY: `run` is called once, from the entry, and nothing else names these statics,
    // so these are the only references to them.
    let arena = unsafe { &mut (*arena).0 };
    let arena = kvm_board_app::fit(&model, arena)?;
    say!(board, "arena {} bytes at {:#010x}", arena.len(), arena.as_ptr() as usize);
    kvm_board_app::run(board, model, arena, Generate { n_gen: model_info::N_GEN, echo_prompt: false })
}

/// The model linked into the image, validated.
#[cfg(not(feature = "slot"))]
fn open(board: &mut EspC3) -> Result<Model<'static>, Fail> {
    let blob: &'static [u8] = &MODEL.0;
    say!(board, "model {} bytes at {:#010x} (flash)", blob.len(), blob.as_ptr() as usize);
    Ok(kvm_board_app::validate(board, blob)?)
}

/// The model in the slot, mapped and validated.
#[cfg(feature = "slot")]
fn open(board: &mut EspC3) -> Result<Model<'static>, Fail> {
    let slot = slot::map()?;
    say!(
        board,
        "model slot: flash {:#x}, {} bytes, mapped at {:#010x}",
        slot_info::SLOT_FLASH,
        slot.len(),
        slot.as_ptr() as usize
    );
    Ok(kvm_board_app::find_model(board, slot)?)
}

/// The board as the application sees it.
struct EspC3 {
    cycles: CycleCounter,
}

impl Board for EspC3 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn write(&mut self, bytes: &[u8]) {
        esp_println::Printer::write_bytes(bytes);
        #[cfg(feature = "defmt")]
        defmt::info!("{=[u8]:a}", bytes);
    }

    fn ticks(&mut self) -> u64 {
        self.cycles.read()
    }

    fn tick_hz(&self) -> u32 {
        CPU_HZ
    }
}

/// The core's cycle counter (`mpccr`, 32 bits) widened to 64 by counting its wraps between
/// readings: correct while readings are less than 2^32 cycles (26.8 s at 160 MHz) apart,
/// which the application's per-token readings are.
struct CycleCounter {
    last: u32,
    high: u64,
}

impl CycleCounter {
    /// Counts cycles from now: `mpcer` = cycles (bit 0), `mpcmr` = count enable (bit 0).
    fn start() -> CycleCounter {
        // SAFETY: writes the machine performance counter's own CSRs (ESP32-C3 TRM,
        // "Performance Counter"); nothing else in the firmware uses them.
        unsafe {
            core::arch::asm!("csrw 0x7e0, {0}", "csrw 0x7e1, {0}", "csrw 0x7e2, zero", in(reg) 1u32, options(nomem, nostack));
        }
        CycleCounter { last: 0, high: 0 }
    }

    fn read(&mut self) -> u64 {
        let now: u32;
        // SAFETY: reads `mpccr`; no memory is touched.
        unsafe { core::arch::asm!("csrr {0}, 0x7e2", out(reg) now, options(nomem, nostack)) };
        if now < self.last {
            self.high += 1 << 32;
        }
        self.last = now;
        self.high + u64::from(now)
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    use core::fmt::Write as _;
    #[cfg(feature = "defmt")]
    defmt::error!("{}: panic", NAME);
    let _ = writeln!(esp_println::Printer, "\n{NAME}: panic: {info}");
    sleep()
}
