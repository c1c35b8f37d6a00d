//! The application on the host, with a board that records what it is given: the model
//! slot's verdicts in words, the streamed text against the reference, and the refusals of
//! `fit`.

use std::fmt::Write as _;

use kvm_board_app::slot::{self, SlotError};
use kvm_board_app::{Board, Fail, Generate};
use kvm_core::state::ARENA_ALIGN;

/// The bundled model (q8_0 weights, f32 cache).
const MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../models/tiny-kjv-q8_0.kvm");
/// The reference implementation's first 16 greedy bytes after "And God said"
/// (models/tiny-kjv/reference/greedy.json); every dtype of tiny-kjv gives them.
const REFERENCE: &[u8] = b", I will not see";

/// A console into memory and a clock that advances 1000 ticks a reading; with `host`, a
/// host clock too (as QEMU's semihosting gives), 8 ns a tick.
#[derive(Default)]
struct Recorder {
    out: Vec<u8>,
    /// The console's length at each write, to see the text arrive token by token.
    writes: Vec<usize>,
    ticks: u64,
    host: bool,
}

impl Board for Recorder {
    fn name(&self) -> &'static str {
        "kvm-test"
    }
    fn write(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        self.writes.push(self.out.len());
    }
    fn ticks(&mut self) -> u64 {
        self.ticks += 1000;
        self.ticks
    }
    fn tick_hz(&self) -> u32 {
        125_000_000
    }
    fn host_ns(&mut self) -> Option<u64> {
        self.host.then_some(self.ticks * 8)
    }
}

fn leak(bytes: Vec<u8>) -> &'static [u8] {
    Box::leak(bytes.into_boxed_slice())
}

fn model_bytes() -> Vec<u8> {
    std::fs::read(MODEL).expect("the bundled model models/tiny-kjv-q8_0.kvm")
}

/// A slot of `len` bytes of erased flash with `file` at its start.
fn slot_with(file: &[u8], len: usize) -> &'static [u8] {
    let mut slot = vec![0xff; len];
    slot[..file.len()].copy_from_slice(file);
    leak(slot)
}

#[test]
fn an_erased_or_blank_slot_is_named_so() {
    let erased = leak(vec![0xff; 4096]);
    let e = slot::read(erased).unwrap_err();
    assert_eq!(e, SlotError::Empty { at: erased.as_ptr() as usize, fill: 0xff });
    assert_eq!(e.to_string(), format!("no model at {:#010x}: the slot is erased (0xFF)", erased.as_ptr() as usize));
    let blank = leak(vec![0; 4096]);
    assert!(slot::read(blank).unwrap_err().to_string().ends_with(": the slot is blank (0x00)"));
}

#[test]
fn a_model_in_a_larger_slot_is_read_to_its_declared_length() {
    let file = model_bytes();
    let slot = slot_with(&file, file.len() + 4096);
    let mut board = Recorder::default();
    let model = kvm_board_app::find_model(&mut board, slot).expect("the bundled model in the slot");
    assert_eq!(model.blob(), &file[..]);
    let text = String::from_utf8(board.out).unwrap();
    assert!(text.starts_with("kvm-test: model: 4 layers, d_model 128, "), "{text}");
}

#[test]
fn a_model_longer_than_its_slot_is_refused() {
    let file = model_bytes();
    let slot = leak(file[..file.len() - 1].to_vec());
    let e = slot::read(slot).unwrap_err();
    assert_eq!(
        e,
        SlotError::TooLong { at: slot.as_ptr() as usize, declared: file.len() as u64, slot_len: file.len() - 1 }
    );
    assert!(e.to_string().starts_with("bad model at 0x"), "{e}");
}

#[test]
fn a_flipped_weight_byte_is_refused_in_words() {
    let mut file = model_bytes();
    let mid = file.len() / 2;
    file[mid] ^= 1;
    let slot = slot_with(&file, file.len());
    let mut board = Recorder::default();
    let e = kvm_board_app::find_model(&mut board, slot).unwrap_err();
    assert!(matches!(e, SlotError::Bad { error: kvm_core::Error::Checksum { .. }, .. }), "{e:?}");
    let mut words = String::new();
    write!(words, "{}", Fail::from(e)).unwrap();
    assert!(words.starts_with(&format!("bad model at {:#010x}: checksum mismatch in Tensor", slot.as_ptr() as usize)));
}

/// An arena on [`ARENA_ALIGN`].
fn arena(len: usize) -> &'static mut [u8] {
    let buf = Box::leak(vec![0u8; len + ARENA_ALIGN].into_boxed_slice());
    let skip = buf.as_ptr().align_offset(ARENA_ALIGN);
    &mut buf[skip..skip + len]
}

#[test]
fn run_streams_the_reference_text_token_by_token() {
    let blob = leak(model_bytes());
    let mut board = Recorder::default();
    let model = kvm_board_app::validate(&mut board, blob).unwrap();
    let arena = kvm_board_app::fit(&model, arena(model.arena_len())).unwrap();
    let n_gen = REFERENCE.len();
    kvm_board_app::run(&mut board, model, arena, Generate { n_gen, echo_prompt: false }).unwrap();

    let out = &board.out;
    let start = out.windows(19).position(|w| w == b"--- kvm output ---\n").unwrap() + 19;
    let end = start + n_gen;
    assert_eq!(&out[start..end], REFERENCE);
    assert!(out[end..].starts_with(b"\n--- end ---\n"));
    // One write a token: the console saw the text grow a byte at a time.
    for i in 1..=n_gen {
        assert!(board.writes.contains(&(start + i)), "no write ended after token {i}");
    }
    let tail = String::from_utf8_lossy(&out[end..]);
    // Every step took two readings of the 1000-tick clock: 16 steps, 16,000 cycles at 125 MHz.
    assert!(tail.contains("kvm-test: decode 16 tokens: 0.128 ms (16000 cycles)\n"), "{tail}");
    assert!(tail.contains("kvm-test: speed: 1000 cycles a token at 125.000 MHz core clock, 125000.00 tok/s"), "{tail}");
}

#[test]
fn times_read_as_the_board_clock_or_as_qemu_host_time() {
    let blob = leak(model_bytes());
    for (host, line) in [
        (false, "kvm-test: from_bytes (all CRCs): 0.008 ms (1000 cycles)\n"),
        (true, "kvm-test: from_bytes (all CRCs): 0.008 ms host, 1000 ticks\n"),
    ] {
        let mut board = Recorder { host, ..Recorder::default() };
        kvm_board_app::validate(&mut board, blob).unwrap();
        let out = String::from_utf8_lossy(&board.out);
        assert!(out.contains(line), "{out}");
    }
}

#[test]
fn fit_takes_what_the_model_needs_and_refuses_less() {
    let blob = leak(model_bytes());
    let model = kvm_core::Model::from_bytes(blob).unwrap();
    let big = arena(model.arena_len() + 64);
    assert_eq!(kvm_board_app::fit(&model, big).unwrap().len(), model.arena_len());
    let small = arena(1024);
    let e = kvm_board_app::fit(&model, small).unwrap_err();
    assert_eq!(e, Fail::ArenaLen { built: 1024, model: model.arena_len() });
}
