// Runs a Raspberry Pi Pico firmware image under rp2040js (the Wokwi RP2040 emulator) and
// prints what it writes on UART0, unchanged, on stdout.
//
// usage: node run.mjs [--slot MODEL] [--usb-cdc FILE] [--max-instructions N] [--timeout SECS] IMAGE.uf2|IMAGE.elf
//
//   --slot MODEL          write MODEL's bytes into flash at 0x1010_0000, the model slot, as
//                         `picotool load MODEL -o 0x10100000` does on a Pico
//   --usb-cdc FILE        be the USB host of a firmware built with `usb`: enumerate it as a
//                         CDC serial port (rp2040js's own `USBCDC` host) and write what it
//                         sends there to FILE; the run then also waits for the last line
//                         over USB
//   --max-instructions N  stop after N instructions (default 4e9)
//   --timeout SECS        stop after SECS seconds of wall time (default 1200)
//
// Stops when the firmware prints its last line (`kvm-<board>: stack used ...` after a run,
// `kvm-<board>: error: ...` or `kvm-<board>: panic: ...`), then prints on stderr the
// instructions and cycles it took and the emulator's speed. Exit code: 0 after
// `stack used`, 1 after an error or a panic, 124 when a limit is reached first or the core
// runs an instruction rp2040js does not implement (a crash), 2 on bad usage or an image it
// cannot read.
//
// The firmware is the image a user flashes; the harness supplies only what the chip has
// before the image runs and rp2040js lacks: the boot ROM. On a Pico the ROM checks the
// CRC of the image's first 256 bytes (boot2), copies them to the top of SRAM and runs them;
// boot2 sets up the flash's fast read mode, points VTOR at the vector table after it and
// jumps to the reset handler. The ROM is Raspberry Pi's and not in any registry we use, so
// the harness does the ROM's part itself, the CRC check included, and then runs the
// image's own boot2 in the emulator: everything from boot2 on is the firmware's code.
//
// It also corrects one step of rp2040js 1.4.1's core: on taking an exception it loads PC
// from the vector table with the entry's Thumb bit (bit 0) still set, where the
// architecture clears it (ARMv6-M ARM, B1.5.6 ExceptionTaken: BranchTo(vector AND NOT 1)).
// Code that reads PC then computes addresses one byte off: the USB interrupt handler's
// jump table (`add r4, pc`) sent it into the weeds. Handlers without such code (SysTick's)
// ran correctly before; the correction changes nothing for them.

import { readFileSync, writeFileSync } from 'node:fs';
import { RP2040, USBCDC } from 'rp2040js';

const FLASH = 0x1000_0000;
const SLOT = 0x1010_0000;
/** Where the boot ROM copies boot2 and starts it (the last 256 bytes of SRAM5). */
const BOOT2_SRAM = 0x2004_1f00;

const args = process.argv.slice(2);
let slot = null;
let usbCdc = null;
let maxInstructions = 4e9;
let timeoutS = 1200;
let image = null;
while (args.length > 0) {
  const a = args.shift();
  if (a === '--slot') slot = args.shift();
  else if (a === '--usb-cdc') usbCdc = args.shift();
  else if (a === '--max-instructions') maxInstructions = Number(args.shift());
  else if (a === '--timeout') timeoutS = Number(args.shift());
  else if (a.startsWith('-')) usage(`unknown option ${a}`);
  else image = a;
}
if (!image) usage('no image');

function usage(why) {
  process.stderr.write(
    `run.mjs: ${why}\nusage: node run.mjs [--slot MODEL] [--usb-cdc FILE] [--max-instructions N] [--timeout SECS] IMAGE.uf2|IMAGE.elf\n`,
  );
  process.exit(2);
}

/** The flash bytes an image holds, as [address, bytes] pairs. */
function flashSegments(path) {
  const data = readFileSync(path);
  return path.endsWith('.uf2') ? uf2Segments(data) : elfSegments(data);
}

/** The payloads of a UF2 file's 512-byte blocks (magic numbers from the UF2 spec). */
function uf2Segments(data) {
  const out = [];
  for (let at = 0; at + 512 <= data.length; at += 512) {
    const w = (i) => data.readUInt32LE(at + i);
    if (w(0) !== 0x0a324655 || w(4) !== 0x9e5d5157 || w(508) !== 0x0ab16f30) {
      throw new Error(`block at byte ${at} is not a UF2 block`);
    }
    // Flag 0x1: not for the main flash.
    if (w(8) & 1) continue;
    out.push([w(12), data.subarray(at + 32, at + 32 + w(16))]);
  }
  return out;
}

/** The file contents of an ELF32 little-endian image's PT_LOAD segments, at their load
 * (physical) addresses. */
function elfSegments(data) {
  if (data.readUInt32BE(0) !== 0x7f454c46 || data[4] !== 1 || data[5] !== 1) {
    throw new Error('not a little-endian ELF32 file');
  }
  const phoff = data.readUInt32LE(28);
  const phentsize = data.readUInt16LE(42);
  const phnum = data.readUInt16LE(44);
  const out = [];
  for (let i = 0; i < phnum; i++) {
    const p = phoff + i * phentsize;
    const [type, offset, paddr, filesz] = [0, 4, 12, 16].map((o) => data.readUInt32LE(p + o));
    if (type === 1 && filesz > 0) out.push([paddr, data.subarray(offset, offset + filesz)]);
  }
  return out;
}

/** CRC-32/MPEG-2 (polynomial 0x04c11db7, not reflected, initial 0xffffffff, no final xor):
 * the boot ROM's check of boot2. */
function crc32Mpeg2(bytes) {
  let crc = 0xffffffff;
  for (const b of bytes) {
    crc ^= b << 24;
    for (let k = 0; k < 8; k++) crc = crc & 0x80000000 ? (crc << 1) ^ 0x04c11db7 : crc << 1;
  }
  return crc >>> 0;
}

// `new RP2040()` resets flash to 0xFF: load the image after it. Its default clock is a
// simulation clock, which the loop below advances by each instruction's cycles.
const mcu = new RP2040();
const { clock } = mcu;
// The emulator's own messages (a register it does not model, such as UART0's DMA control,
// which the HAL sets and nothing here uses) go to stderr: stdout is the UART's alone.
// An instruction it does not implement means the firmware has crashed (or rp2040js lacks
// it): either way the run is over.
let crashed = null;
const toStderr = (level) => (component, message) => {
  process.stderr.write(`run.mjs: rp2040js ${level}: [${component}] ${message}\n`);
  if (/Instruction at .* is not implemented/.test(message)) crashed ??= message;
};
mcu.logger = { debug() {}, info() {}, warn: toStderr('warning'), error: toStderr('error') };
// The Thumb bit the architecture clears on exception entry (see the top of this file).
const takeException = mcu.core.exceptionEntry.bind(mcu.core);
mcu.core.exceptionEntry = (n) => {
  takeException(n);
  mcu.core.PC &= ~1;
};
function writeFlash(addr, bytes) {
  const off = addr - FLASH;
  if (off < 0 || off + bytes.length > mcu.flash.length) {
    throw new Error(`${bytes.length} bytes at 0x${addr.toString(16)} are outside the flash`);
  }
  mcu.flash.set(bytes, off);
}
try {
  for (const [addr, bytes] of flashSegments(image)) writeFlash(addr, bytes);
  if (slot) writeFlash(SLOT, readFileSync(slot));
} catch (e) {
  process.stderr.write(`run.mjs: ${image}: ${e.message}\n`);
  process.exit(2);
}

// The boot ROM's part: check boot2's CRC, copy it to SRAM, run it as the ROM does (with
// LR = 0, which tells boot2 to enter the image's vector table when it is done).
const boot2 = mcu.flash.subarray(0, 256);
const stated = boot2[252] | (boot2[253] << 8) | (boot2[254] << 16) | (boot2[255] << 24);
if (crc32Mpeg2(boot2.subarray(0, 252)) !== stated >>> 0) {
  process.stderr.write('run.mjs: boot2 (the first 256 bytes of flash) fails its CRC: a Pico would not boot this image\n');
  process.exit(1);
}
mcu.sram.set(boot2, BOOT2_SRAM - 0x2000_0000);
// Below boot2: its stack must not overwrite its own constants.
mcu.core.SP = BOOT2_SRAM;
mcu.core.LR = 0;
mcu.core.PC = BOOT2_SRAM;

/** A console's bytes (as Latin-1: one char per byte) and its verdict once its last line
 * (`stack used`: 0; `error` or `panic`: 1) has arrived. */
class Console {
  text = '';
  verdict = null;
  take(bytes) {
    for (const b of bytes) {
      this.text += String.fromCharCode(b);
      if (b !== 10) continue;
      const line = this.text.slice(this.text.lastIndexOf('\n', this.text.length - 2) + 1);
      const m = /^kvm-\S+: (stack used|error|panic)/.exec(line);
      if (m) this.verdict = m[1] === 'stack used' ? 0 : 1;
    }
  }
}
const uart = new Console();
mcu.uart[0].onByte = (b) => {
  process.stdout.write(Uint8Array.of(b));
  uart.take([b]);
};
// The USB host: rp2040js's CDC host enumerates the device and reads its bulk IN endpoint.
const cdc = usbCdc && new Console();
if (cdc) new USBCDC(mcu.usbCtrl).onSerialData = (bytes) => cdc.take(bytes);
/** The run's verdict: UART0's, once every console watched has its last line. */
const verdictNow = () => (cdc && cdc.verdict === null ? null : uart.verdict);

const started = Date.now();
let instructions = 0;
let reason = null;
for (;;) {
  // Steps in batches, checking the limits between them.
  for (let i = 0; i < 100_000 && verdictNow() === null && !crashed; i++) {
    if (mcu.core.waiting) {
      // Asleep (WFI) until the next timer event.
      const next = clock.nanosToNextAlarm;
      if (!(next > 0 && Number.isFinite(next))) {
        reason = 'the core sleeps with nothing to wake it';
        break;
      }
      clock.tick(next);
    } else {
      const cycles = mcu.core.executeInstruction();
      instructions++;
      clock.tick((cycles * 1e9) / mcu.clkSys);
    }
  }
  if (crashed) reason = `a crash (${crashed})`;
  if (verdictNow() !== null || reason) break;
  if (instructions >= maxInstructions) reason = `${maxInstructions} instructions`;
  else if (Date.now() - started > timeoutS * 1000) reason = `${timeoutS} s of wall time`;
  if (reason) break;
}

const secs = (Date.now() - started) / 1000;
process.stderr.write(
  `run.mjs: ${instructions} instructions, ${mcu.core.cycles} cycles at ${mcu.clkSys / 1e6} MHz in ${secs.toFixed(1)} s ` +
    `(${(instructions / secs / 1e6).toFixed(1)} M instructions/s)\n`,
);
if (cdc) writeFileSync(usbCdc, cdc.text, 'latin1');
const verdict = verdictNow();
if (verdict === null) {
  process.stderr.write(`run.mjs: stopped after ${reason ?? 'an unknown reason'}, before the firmware's last line\n`);
  process.exit(124);
}
process.exit(verdict);
