//! The memory map (memory.x, with a link-time stack check) and the model's sizes, as every
//! board firmware builds them (`kvm-board-build`; inputs `KVM_BOARD_MODEL`,
//! `KVM_BOARD_N_GEN`).

fn main() {
    kvm_board_build::Firmware {
        name: "kvm-pico2",
        default_model: "../../../target/tiny-kjv-q8_0-f16-cache.kvm",
        make_model: "cargo run --release -p kvm-export -- convert models/tiny-kjv --dtype q8_0 --cache f16 \
                     -o target/tiny-kjv-q8_0-f16-cache.kvm (from the repository's root)",
        // The application's high-water mark is ~10 KiB with the float numerics (an386).
        stack_reserve: 16 * 1024,
        linked: std::env::var_os("CARGO_FEATURE_SLOT").is_none(),
    }
    .build();
}
