//! The `faults` wrapper tears writes (only a prefix of each write's blocks persists, and the write still
//! reports success); the bench's `verify=crc32c` must catch every torn block, in its verify phase and in a
//! later read job, and report where.

use std::rc::Rc;
use std::sync::Arc;

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::{FaultConfig, FaultDevice, MemoryDevice};
use strata_tools::block_bench::options::{JobOptions, ReadWrite, Verify};
use strata_tools::block_bench::runner::{JobProgress, run_job};
use strata_tools::block_bench::verify::MismatchKind;

const BS: u64 = 16 << 10;
const SIZE: u64 = 4 << 20;

fn job(rw: ReadWrite) -> JobOptions {
    JobOptions {
        name: format!("{rw:?}"),
        rw,
        bs: BS,
        iodepth: 4,
        size: Some(SIZE),
        verify: Verify::Crc32c,
        ..JobOptions::default()
    }
}

fn on_executor<F: Future<Output = ()> + 'static>(make: impl FnOnce() -> F + Send + 'static) {
    LocalExecutorBuilder::new(Placement::Unbound).spawn(make).unwrap().join().unwrap();
}

#[test]
fn every_torn_block_is_reported_by_verify() {
    on_executor(|| async {
        let config = FaultConfig { seed: 9, torn_write_probability: 0.1, ..FaultConfig::default() };
        let device = Rc::new(FaultDevice::new(MemoryDevice::new(SIZE, 4096), config));
        // A sequential write job writes each of the 256 blocks exactly once, then verifies them.
        let written =
            run_job(device.clone(), &job(ReadWrite::Write), 0, Arc::new(JobProgress::default())).await.unwrap();
        let torn = device.fault_stats().torn_writes;
        assert!(torn >= 10, "the seed tears about 1 write in 10 of 256: {torn}");
        assert_eq!(written.error, None);
        assert_eq!(written.write.ios, SIZE / BS);
        assert_eq!(written.verified_blocks, SIZE / BS);
        assert_eq!(written.mismatch_count, torn, "one mismatch per torn block, no more, no fewer");
        for mismatch in &written.mismatches {
            assert_eq!(mismatch.offset % BS, 0);
            // A torn 16 KiB block keeps 0..3 of its 4 KiB sectors: no header at all, or a bad checksum.
            assert!(matches!(mismatch.kind, MismatchKind::BadMagic | MismatchKind::Checksum), "{mismatch:?}");
        }

        // A later read job (which knows no generations) finds the same blocks.
        let read = run_job(device.clone(), &job(ReadWrite::Read), 1, Arc::new(JobProgress::default())).await.unwrap();
        assert_eq!(read.read.ios, SIZE / BS);
        assert_eq!(read.mismatch_count, torn);
        let written_offsets: Vec<u64> = written.mismatches.iter().map(|mismatch| mismatch.offset).collect();
        let read_offsets: Vec<u64> = read.mismatches.iter().map(|mismatch| mismatch.offset).collect();
        let mut sorted_written = written_offsets.clone();
        sorted_written.sort_unstable();
        let mut sorted_read = read_offsets.clone();
        sorted_read.sort_unstable();
        assert_eq!(sorted_written, sorted_read, "the same blocks, at the same offsets");
    });
}

#[test]
fn a_clean_device_verifies_without_mismatches() {
    on_executor(|| async {
        let device = Rc::new(FaultDevice::new(MemoryDevice::new(SIZE, 4096), FaultConfig::default()));
        let mut random_writes = job(ReadWrite::RandRw);
        random_writes.iodepth = 8;
        random_writes.size = Some(SIZE);
        let result = run_job(device.clone(), &random_writes, 0, Arc::new(JobProgress::default())).await.unwrap();
        assert_eq!(result.error, None);
        assert!(result.read.ios > 0 && result.write.ios > 0, "{result:?}");
        assert_eq!(result.mismatch_count, 0, "{:?}", result.mismatches);
        assert!(result.verified_blocks > 0, "{result:?}");
        // A sequential write job on the clean device writes every block once and verifies each of them.
        let sequential =
            run_job(device.clone(), &job(ReadWrite::Write), 1, Arc::new(JobProgress::default())).await.unwrap();
        assert_eq!(sequential.verified_blocks, SIZE / BS);
        assert_eq!(sequential.mismatch_count, 0);
    });
}

#[test]
fn an_io_error_ends_the_job_with_its_message() {
    on_executor(|| async {
        // Errors on two blocks: the job stops at the first and reports it, as fio does without
        // continue_on_error; never a silent pass.
        let config = FaultConfig { error_ranges: vec![BS * 10..BS * 11, BS * 20..BS * 21], ..FaultConfig::default() };
        let device = Rc::new(FaultDevice::new(MemoryDevice::new(SIZE, 4096), config));
        let result = run_job(device, &job(ReadWrite::Write), 0, Arc::new(JobProgress::default())).await.unwrap();
        let error = result.error.expect("an injected error ends the job with an error");
        assert!(error.contains("injected"), "{error}");
    });
}
