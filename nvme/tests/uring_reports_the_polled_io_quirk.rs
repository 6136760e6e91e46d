//! When something else opened an empty `DmaFile` first (so glommio marked the device pollable for this
//! process), `UringDevice::open` must fail with an error that explains the quirk, not an obscure errno later.

use glommio::io::OpenOptions;
use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::{BlockErrorKind, UringDevice, UringOptions};

#[test]
fn the_quirk_is_reported_with_its_fix() {
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(|| async {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
            let empty = dir.join(format!("quirk-empty-{}.img", std::process::id()));
            let ours = dir.join(format!("quirk-ours-{}.img", std::process::id()));
            let _ = std::fs::remove_file(&empty);
            let _ = std::fs::remove_file(&ours);
            // Opened read-write (glommio's `DmaFile::create` opens write-only, so its probe fails with EBADF
            // and does not trigger the quirk).
            std::fs::write(&empty, b"").unwrap();
            let poisoner = OpenOptions::new().read(true).write(true).dma_open(&empty).await.unwrap();
            let result = UringDevice::open(&ours, &UringOptions { size_bytes: Some(1 << 20), read_only: false }).await;
            let error = result.err().expect("the quirk makes reads fail");
            match &error.kind {
                BlockErrorKind::Environment(message) => assert!(message.contains("glommio quirk"), "{message}"),
                other => panic!("expected the quirk's explanation, got {other:?}"),
            }
            poisoner.close().await.unwrap();
            std::fs::remove_file(empty).unwrap();
            std::fs::remove_file(ours).unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
}
