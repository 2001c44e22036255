//! Without a GPU device node the daemon never loads a GPU driver: `auto`
//! used to enumerate Vulkan's drivers at start-up to find no hardware
//! adapter, which mapped Mesa's drivers and LLVM (42 MiB resident) into
//! the daemon for good.

mod common;

use std::fs;

use common::{can_mount, daemon_pid, fixtures, mount, source_and_mountpoint, text, unmount};

#[test]
fn without_a_gpu_device_the_daemon_maps_no_gpu_driver() {
    if !can_mount() || qemfs_gpu::gpu_device_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (src, mnt) = source_and_mountpoint(dir.path());
    let fixture = fixtures().join("qem/u16-allmodels-8x9.qem");
    fs::copy(&fixture, src.join("scan.qem")).unwrap();
    let out = mount(&src, &mnt, &[]);
    assert!(out.status.success(), "mount: {}", text(&out));
    let pid = daemon_pid(&mnt);
    // The backend is named, and a reduction runs (on the CPU).
    let info = fs::read_to_string(mnt.join("scan.qem/info.json")).unwrap();
    assert!(info.contains(r#""reductions_backend": "cpu""#), "{info}");
    assert!(!fs::read(mnt.join("scan.qem/virtual/bf.npy"))
        .unwrap()
        .is_empty());
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for library in ["libvulkan", "libLLVM", "libcuda"] {
        assert!(!maps.contains(library), "the daemon mapped {library}");
    }
    assert!(unmount(&mnt).status.success());
}
