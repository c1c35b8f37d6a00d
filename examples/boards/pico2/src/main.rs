//! kvm on the Raspberry Pi Pico 2 (RP2350, Cortex-M33 with FPU and DSP at 150 MHz):
//! tiny-kjv with q8_0 weights in the float numerics on the `dsp` kernel tier, its
//! attention rows in f16 (the f16 cache: a 364,224-byte arena, where the f32 cache's
//! 560,832 would not fit the 520 KiB of SRAM), generates greedily from "And God said" and
//! streams the text on UART0 (GP0 TX, GP1 RX, 115200 8N1).
//!
//! HAL: `rp235x-hal`, the RP2040 HAL's sibling with the same API, so the Pico and the Pico 2
//! share one board file (`../../rp/board.rs`: clocks, UART0, SysTick, where the model and
//! arena live); its `block::ImageDef` is the IMAGE_DEF block the boot ROM needs.
//!
//! The application is `kvm-board-app`, shared with every board. By default the model is
//! linked into flash (`KVM_BOARD_MODEL` at build time); with the `slot` feature the image
//! holds no model and reads the one written at 0x1020_0000 (the model slot), saying in words
//! when there is none or a bad one. No semihosting: this image runs on a chip with no
//! debugger attached; after its report it sleeps.
#![no_std]
#![no_main]

use rp235x_hal as hal;

#[cfg(feature = "defmt")]
use defmt_rtt as _;

/// The USB controller's registers and its RAM, taken from the peripherals.
#[cfg(feature = "usb")]
macro_rules! usb_peripherals {
    ($pac:ident) => {
        ($pac.USB, $pac.USB_DPRAM)
    };
}
#[cfg(feature = "usb")]
use usb_peripherals;

#[path = "../../rp/board.rs"]
mod board;

mod model_info {
    include!(concat!(env!("OUT_DIR"), "/model_info.rs"));
}

/// Starts every report line.
const NAME: &str = "kvm-pico2";
/// The Pico 2's crystal.
const XOSC_HZ: u32 = 12_000_000;

/// Tells the boot ROM this is an Arm executable for the secure state (memory.x places it
/// in the first 4 KiB of flash, where the ROM looks).
#[link_section = ".start_block"]
#[used]
static IMAGE_DEF: hal::block::ImageDef = hal::block::ImageDef::secure_exe();

#[hal::entry]
fn main() -> ! {
    if let Some(mut rp) = board::start() {
        board::run(&mut rp);
    }
    board::halt()
}
