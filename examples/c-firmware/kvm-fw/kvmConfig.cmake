# kvm's C API for C firmware (Pico SDK, ESP-IDF, Zephyr, STM32Cube): the imported static
# library target `kvm` (alias `kvm::kvm`) with kvm.h on its include path.
#
#   add_subdirectory(path/to/kvm/examples/c-firmware/kvm-fw kvm)     # or
#   find_package(kvm REQUIRED CONFIG PATHS path/to/kvm/examples/c-firmware/kvm-fw)
#   target_link_libraries(app PRIVATE kvm)
#
# The library is this directory's crate (kvm-runtime without std plus a panic handler
# that calls the firmware's `void kvm_fw_panic(void)`, which must not return), built by
# cargo at build time for KVM_RUST_TARGET, or an archive already built (KVM_PREBUILT_LIB).
#
# Cache variables:
#   KVM_RUST_TARGET    the Rust target; default from CMAKE_SYSTEM_PROCESSOR (below)
#   KVM_RUSTFLAGS      extra rustc flags (default: -C target-cpu=cortex-m33 for
#                      thumbv8m.main, whose DSP kernels need it; see kvm-core/build.rs)
#   KVM_PREBUILT_LIB   path of a libkvm_fw.a built before: imported as is, no cargo
#   KVM_CARGO          the cargo executable (default: found on PATH)
#   KVM_CARGO_TARGET_DIR  cargo's target directory (default: kvm-cargo in the build tree)
if(TARGET kvm)
  return()
endif()

set(_kvm_fw_dir "${CMAKE_CURRENT_LIST_DIR}")
get_filename_component(_kvm_root "${_kvm_fw_dir}/../../.." ABSOLUTE)

# CMAKE_SYSTEM_PROCESSOR as toolchain files spell it, to the Rust target of that core.
# ARMv6-M: Cortex-M0/M0+ (RP2040); ARMv7E-M: Cortex-M4F/M7 (STM32F4/F7); ARMv8-M
# Mainline: Cortex-M33 (RP2350); RV32IMC: ESP32-C3.
function(_kvm_target_for processor out)
  string(TOLOWER "${processor}" p)
  if(p MATCHES "^(cortex-m0|cortex-m0plus|cortex-m0\\+|armv6-?m|armv6s-m)$")
    set(t thumbv6m-none-eabi)
  elseif(p MATCHES "^(cortex-m4|cortex-m4f|cortex-m7|armv7e-?m)$")
    set(t thumbv7em-none-eabihf)
  elseif(p MATCHES "^(cortex-m33|cortex-m33f|armv8-?m\\.main|armv8m-main)$")
    set(t thumbv8m.main-none-eabihf)
  elseif(p MATCHES "^(riscv32|riscv|rv32imc|esp32c3)$")
    set(t riscv32imc-unknown-none-elf)
  else()
    set(t "")
  endif()
  set(${out} "${t}" PARENT_SCOPE)
endfunction()

set(KVM_PREBUILT_LIB "" CACHE FILEPATH "A libkvm_fw.a built before (skips cargo)")
if(KVM_PREBUILT_LIB)
  set(_kvm_lib "${KVM_PREBUILT_LIB}")
else()
  _kvm_target_for("${CMAKE_SYSTEM_PROCESSOR}" _kvm_default_target)
  set(KVM_RUST_TARGET "${_kvm_default_target}" CACHE STRING
      "Rust target of the kvm static library (thumbv6m-none-eabi, thumbv7em-none-eabihf, thumbv8m.main-none-eabihf, riscv32imc-unknown-none-elf)")
  if(NOT KVM_RUST_TARGET)
    message(FATAL_ERROR "kvm: no Rust target for CMAKE_SYSTEM_PROCESSOR '${CMAKE_SYSTEM_PROCESSOR}': set KVM_RUST_TARGET")
  endif()
  if(KVM_RUST_TARGET MATCHES "^thumbv8m\\.main")
    set(_kvm_default_flags "-C target-cpu=cortex-m33")
  else()
    set(_kvm_default_flags "")
  endif()
  set(KVM_RUSTFLAGS "${_kvm_default_flags}" CACHE STRING "Extra rustc flags for the kvm static library")
  find_program(KVM_CARGO cargo HINTS "$ENV{HOME}/.cargo/bin" REQUIRED)

  set(KVM_CARGO_TARGET_DIR "${CMAKE_BINARY_DIR}/kvm-cargo" CACHE PATH "Cargo's target directory for the kvm library")
  # Cargo decides what is stale, so it runs on every build (a no-op when nothing changed).
  set(_kvm_target_dir "${KVM_CARGO_TARGET_DIR}")
  set(_kvm_lib "${_kvm_target_dir}/${KVM_RUST_TARGET}/release/libkvm_fw.a")
  add_custom_target(kvm_cargo
    COMMAND ${CMAKE_COMMAND} -E env --unset=CARGO_ENCODED_RUSTFLAGS "RUSTFLAGS=${KVM_RUSTFLAGS}"
            "${KVM_CARGO}" build --release --locked --quiet
            --manifest-path "${_kvm_fw_dir}/Cargo.toml"
            --target "${KVM_RUST_TARGET}" --target-dir "${_kvm_target_dir}"
    BYPRODUCTS "${_kvm_lib}"
    COMMENT "kvm: cargo build of the static library for ${KVM_RUST_TARGET}"
    VERBATIM)
endif()

add_library(kvm STATIC IMPORTED GLOBAL)
set_target_properties(kvm PROPERTIES
  IMPORTED_LOCATION "${_kvm_lib}"
  INTERFACE_INCLUDE_DIRECTORIES "${_kvm_root}/kvm-runtime/include")
if(TARGET kvm_cargo)
  add_dependencies(kvm kvm_cargo)
endif()
add_library(kvm::kvm ALIAS kvm)
