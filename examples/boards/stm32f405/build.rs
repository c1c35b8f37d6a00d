//! The memory map (memory.x, with a link-time stack check) and the model's sizes, as every
//! board firmware builds them (`kvm-board-build`; inputs `KVM_BOARD_MODEL`,
//! `KVM_BOARD_N_GEN`).

fn main() {
    kvm_board_build::Firmware {
        name: "kvm-stm32f405",
        default_model: "../../../target/synth-tiny-q8_0.kvm",
        make_model: "cargo run --release -p kvm-export -- synth --preset tiny --dtype q8_0 \
                     -o target/synth-tiny-q8_0.kvm (from the repository's root)",
        // The application's high-water mark is about 9 KiB (kvm-stm32f405: stack used ...).
        stack_reserve: 16 * 1024,
        linked: std::env::var_os("CARGO_FEATURE_SLOT").is_none(),
    }
    .build();
}
