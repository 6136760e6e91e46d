//! The `faults` wrapper: errors at chosen offsets and by chance, torn writes that keep only a prefix of
//! blocks, added latency; one seed reproduces every decision.

use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::{BlockDevice, BlockErrorKind, FaultConfig, FaultDevice, MemoryDevice};

const BLOCK: u64 = 4096;

fn run<F: Future<Output = ()> + 'static>(make: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound).spawn(make).unwrap().join().unwrap();
}

fn faulty(config: FaultConfig) -> FaultDevice<MemoryDevice> {
    FaultDevice::new(MemoryDevice::new(1 << 20, BLOCK), config)
}

async fn write_filled(device: &impl BlockDevice, offset: u64, blocks: u64, byte: u8) -> bool {
    let mut buf = device.alloc_buffer((blocks * BLOCK) as usize);
    buf.as_mut_slice().fill(byte);
    device.write(buf, offset).await.1.is_ok()
}

#[test]
fn errors_hit_exactly_the_chosen_ranges() {
    run(|| async {
        let device = faulty(FaultConfig {
            error_ranges: vec![8 * BLOCK..10 * BLOCK, 14 * BLOCK..14 * BLOCK + 1],
            ..FaultConfig::default()
        });
        for block in 0..16 {
            let (_, result) = device.read(device.alloc_buffer(BLOCK as usize), block * BLOCK).await;
            let inside = (8..10).contains(&block) || block == 14;
            assert_eq!(result.is_err(), inside, "block {block}");
            if let Err(error) = result {
                assert!(matches!(error.kind, BlockErrorKind::Injected));
                assert_eq!(error.offset, block * BLOCK);
            }
        }
        // A write overlapping the range fails too, and writes nothing.
        assert!(!write_filled(&device, 7 * BLOCK, 2, 0xAB).await);
        let (buf, result) = device.inner().read(device.alloc_buffer(BLOCK as usize), 7 * BLOCK).await;
        result.unwrap();
        assert!(buf.as_slice().iter().all(|&byte| byte == 0));
        assert_eq!(device.fault_stats().injected_errors, 4);
    });
}

async fn outcomes(seed: u64) -> Vec<bool> {
    let device = faulty(FaultConfig { seed, error_probability: 0.3, ..FaultConfig::default() });
    let mut outcomes = Vec::new();
    for block in 0..200 {
        outcomes.push(device.read(device.alloc_buffer(BLOCK as usize), (block % 256) * BLOCK).await.1.is_ok());
    }
    outcomes
}

#[test]
fn one_seed_reproduces_a_run() {
    run(|| async {
        let first = outcomes(11).await;
        assert_eq!(first, outcomes(11).await, "same seed, same faults");
        assert_ne!(first, outcomes(12).await, "another seed, other faults");
        let failures = first.iter().filter(|ok| !**ok).count();
        assert!((30..90).contains(&failures), "{failures} failures of 200 at p = 0.3");
    });
}

#[test]
fn a_torn_write_keeps_only_a_prefix_of_blocks_and_reports_success() {
    run(|| async {
        let device = faulty(FaultConfig { seed: 5, torn_write_probability: 1.0, ..FaultConfig::default() });
        let mut torn_somewhere = false;
        for attempt in 0..8u64 {
            let offset = attempt * 16 * BLOCK;
            // The old content, written beneath the wrapper, then a torn overwrite of 16 blocks.
            assert!(write_filled(device.inner(), offset, 16, 0x11).await);
            assert!(write_filled(&device, offset, 16, 0x22).await, "a torn write reports success");
            let (buf, result) = device.inner().read(device.inner().alloc_buffer(16 * BLOCK as usize), offset).await;
            result.unwrap();
            let blocks: Vec<u8> = buf
                .as_slice()
                .chunks(BLOCK as usize)
                .map(|block| {
                    assert!(block.iter().all(|&byte| byte == block[0]), "a block is never torn inside");
                    block[0]
                })
                .collect();
            let kept = blocks.iter().take_while(|&&byte| byte == 0x22).count();
            assert!(blocks[kept..].iter().all(|&byte| byte == 0x11), "only a prefix is new: {blocks:?}");
            assert!(kept < 16, "a torn write never persists every block");
            torn_somewhere |= kept > 0;
        }
        assert!(torn_somewhere, "some torn writes keep a non-empty prefix");
        assert_eq!(device.fault_stats().torn_writes, 8);
    });
}

#[test]
fn added_latency_delays_every_operation() {
    run(|| async {
        let device = faulty(FaultConfig { added_latency: Duration::from_millis(5), ..FaultConfig::default() });
        let started = Instant::now();
        for _ in 0..3 {
            device.flush().await.unwrap();
        }
        assert!(started.elapsed() >= Duration::from_millis(15), "{:?}", started.elapsed());
    });
}
