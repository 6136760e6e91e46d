//! glommio's quirk (LAB.md): if the first `DmaFile` a process opens is new and empty, every later O_DIRECT
//! read fails. `UringDevice::open` on a brand-new file, as the first open of this process (this test binary
//! holds nothing else), must still read what it writes.

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::{BlockDevice, UringDevice, UringOptions};

#[test]
fn a_new_empty_file_opened_first_still_reads() {
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(|| async {
            let path =
                std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("quirk-new-{}.img", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let device =
                UringDevice::open(&path, &UringOptions { size_bytes: Some(1 << 20), read_only: false }).await.unwrap();
            let mut buf = device.alloc_buffer(4096);
            buf.as_mut_slice().fill(0x5A);
            device.write(buf, 8192).await.1.unwrap();
            let (buf, result) = device.read(device.alloc_buffer(4096), 8192).await;
            result.unwrap();
            assert!(buf.as_slice().iter().all(|&byte| byte == 0x5A));
            // The first block was a hole and is zeroes, as before the fix-up write.
            let (buf, result) = device.read(device.alloc_buffer(4096), 0).await;
            result.unwrap();
            assert!(buf.as_slice().iter().all(|&byte| byte == 0));
            std::fs::remove_file(path).unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
}
