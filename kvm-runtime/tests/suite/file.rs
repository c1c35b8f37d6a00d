//! Model files in memory: read into huge pages or mapped, the same bytes either way.

use kvm_core::quant::DType;
use kvm_export::synth::{synth, Preset};
use kvm_runtime::file::{ModelFile, Pages};
use kvm_write::policy::Policy;

#[test]
fn huge_pages_and_mapping_hold_the_same_bytes() {
    let path = std::env::temp_dir().join(format!("kvm-file-test-{}.kvm", std::process::id()));
    synth(&path, &Preset::Tiny.config(), &Policy::uniform(DType::Q4_0), 3, &mut |_| {}).unwrap();
    let on_disk = std::fs::read(&path).unwrap();

    let mapped = ModelFile::open(&path, Pages::Mapped).unwrap();
    assert_eq!(mapped.pages(), Pages::Mapped);
    assert_eq!(mapped.bytes(), &on_disk[..]);

    let huge = ModelFile::open(&path, Pages::Huge).unwrap();
    assert_eq!(huge.bytes(), &on_disk[..]);
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let thp_on = cfg!(target_os = "linux") && (thp.contains("[always]") || thp.contains("[madvise]"));
    assert_eq!(huge.pages(), if thp_on { Pages::Huge } else { Pages::Mapped }, "THP: {thp}");
    if huge.pages() == Pages::Huge {
        // The copy starts on a huge page boundary, so every whole 2 MiB of it can be one.
        assert_eq!(huge.bytes().as_ptr() as usize % (2 << 20), 0);
    }
    // Both validate as the same model.
    let (a, b) = (mapped.model().unwrap(), huge.model().unwrap());
    assert_eq!(a.config(), b.config());
    assert!(a.tensors().eq(b.tensors()));

    drop((mapped, huge));
    std::fs::remove_file(&path).ok();
    // A missing file is an error naming it, either way.
    for pages in [Pages::Mapped, Pages::Huge] {
        let e = ModelFile::open(&path, pages).unwrap_err();
        assert!(format!("{e:#}").contains(&path.display().to_string()), "{e:#}");
    }
}
