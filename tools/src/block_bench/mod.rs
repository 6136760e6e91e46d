//! `strata-bench` block mode: fio's options and job files, run on Strata's block layer.
//!
//! Each job (and each `numjobs` clone) runs on its own glommio executor pinned to a core, opening its own
//! `uring` device there, so each has its own io_uring queue, as fio's `io_uring` engine has one ring per
//! job. Files that a reading job needs but that do not exist yet, or are too short, are laid out first by
//! writing them (as fio does), so that reads hit real blocks rather than holes.

pub mod options;
pub mod report;
pub mod runner;
pub mod verify;
pub mod workload;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use glommio::{CpuSet, LocalExecutorBuilder, Placement};
use strata_nvme::environment::check_memlock_budget;
use strata_nvme::{BlockDevice, HostOptions, NvmfAddress, NvmfDevice, RingDevice, UringDevice, UringOptions};

use self::options::{BenchPlan, CpusAllowedPolicy, IoEngine, JobOptions, OutputFormat, Verify};
use self::runner::{JobProgress, JobResult, run_job};

/// What a run produced.
pub struct BenchOutcome {
    /// The report, as asked (`normal` or `json`).
    pub report: String,
    /// No job failed and no block failed verification.
    pub clean: bool,
}

/// Registered I/O memory for one executor: every worker's write buffer and read buffer, plus slack. A
/// `ring` job moves its own buffers (registered with its own ring, within what memlock allows, else from
/// the heap), so its executor asks glommio for the least it starts with, and the memlock preflight does not
/// refuse a job for memory it would never use.
fn io_memory_bytes(job: &JobOptions) -> usize {
    if job.ioengine == IoEngine::Ring {
        return GLOMMIO_LEAST_IO_MEMORY;
    }
    let per_worker = 2 * job.bs as usize;
    (per_worker * job.iodepth as usize + (4 << 20)).clamp(4 << 20, 1 << 30)
}

/// The memlock budget a glommio executor needs to start at all (`strata_nvme::environment`).
const GLOMMIO_LEAST_IO_MEMORY: usize = 512 << 10;

/// I/O queue entries for an nvmf job: its depth, plus one entry for the verify phase's reader, at least
/// the 2 entries NVMe requires.
fn nvmf_queue_entries(job: &JobOptions) -> u16 {
    (job.iodepth + 1).clamp(2, u32::from(u16::MAX)) as u16
}

fn region_end(job: &JobOptions) -> Option<u64> {
    job.size.map(|size| job.offset + size)
}

/// Writes `[from, to)` of `path` so that reads find real blocks: verify-formatted blocks of `bs` when the
/// job verifies, incompressible data otherwise.
fn lay_out(path: &Path, from: u64, to: u64, bs: u64, verify: Verify, show_progress: bool) -> anyhow::Result<()> {
    let path = path.to_path_buf();
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .name("strata-layout")
        .io_memory(16 << 20)
        .spawn(move || async move {
            let device = UringDevice::open(&path, &UringOptions { size_bytes: Some(to), read_only: false }).await?;
            let chunk_bytes = (1u64 << 20).max(bs) / bs * bs;
            let mut buffer = device.alloc_buffer(chunk_bytes as usize);
            let mut seed = 0x243F_6A88_85A3_08D3u64;
            let mut position = from - from % bs;
            let started = Instant::now();
            let mut last_report = started;
            while position < to {
                let this_chunk = chunk_bytes.min(to - position);
                if this_chunk != buffer.len() as u64 {
                    buffer = device.alloc_buffer(this_chunk as usize);
                }
                let bytes = buffer.as_mut_slice();
                match verify {
                    Verify::Crc32c => {
                        for (index, block) in bytes.chunks_mut(bs as usize).enumerate() {
                            verify::fill_block(block, position + index as u64 * bs, 0, 0);
                        }
                    }
                    Verify::None => {
                        for word in bytes.chunks_mut(8) {
                            seed ^= seed << 13;
                            seed ^= seed >> 7;
                            seed ^= seed << 17;
                            word.copy_from_slice(&seed.to_le_bytes()[..word.len()]);
                        }
                    }
                }
                let (returned, result) = device.write(buffer, position).await;
                result?;
                buffer = returned;
                position += this_chunk;
                if show_progress && last_report.elapsed() >= Duration::from_millis(500) {
                    last_report = Instant::now();
                    let done = (position - from) as f64 / (to - from) as f64;
                    eprint!(
                        "\rLaying out IO file {} ({} MiB): {:.0}%\x1b[K",
                        path.display(),
                        (to - from) >> 20,
                        done * 100.0
                    );
                }
            }
            device.flush().await?;
            if show_progress {
                eprint!("\r\x1b[K");
            }
            Ok::<_, strata_nvme::BlockError>(())
        })
        .map_err(|error| anyhow!("starting the layout executor: {error}"))?;
    handle.join().map_err(|error| anyhow!("layout executor: {error:?}"))?.context("laying out the file")?;
    Ok(())
}

/// Checks jobs before anything runs, and lays out the files reading jobs need.
fn prepare(jobs: &[JobOptions], show_progress: bool) -> anyhow::Result<()> {
    let mut needed: BTreeMap<PathBuf, (u64, bool, &JobOptions)> = BTreeMap::new();
    for job in jobs {
        let Some(filename) = &job.filename else {
            bail!("job {}: no filename (--filename=PATH)", job.name);
        };
        if job.ioengine == IoEngine::Nvmf {
            // A remote namespace is used as it is, as fio uses a block device: nothing to lay out.
            NvmfAddress::parse(&filename.to_string_lossy()).map_err(|error| anyhow!("job {}: {error}", job.name))?;
            continue;
        }
        if job.time_based && job.runtime.is_none() {
            bail!("job {}: time_based needs a runtime", job.name);
        }
        let end = match region_end(job) {
            Some(end) => end,
            None if filename.exists() => continue,
            None => bail!("job {}: {} does not exist; give a size to create it", job.name, filename.display()),
        };
        let reads = job.rw.read_share(job.rwmixread) > 0.0;
        let entry = needed.entry(filename.clone()).or_insert((0, false, job));
        entry.0 = entry.0.max(end);
        if reads {
            entry.1 = true;
            entry.2 = job;
        }
    }
    for (path, (end, read, job)) in needed {
        let metadata = std::fs::metadata(&path).ok();
        // Block devices are used as they are; a regular file shorter than the region is laid out.
        if metadata.as_ref().is_some_and(|metadata| !metadata.is_file()) {
            continue;
        }
        let current = metadata.map_or(0, |metadata| metadata.len());
        if current >= end {
            continue;
        }
        if read {
            lay_out(&path, current, end, job.bs, job.verify, show_progress)?;
        }
    }
    Ok(())
}

/// Where clone `clone` of `job` runs (`online`: ascending). Without `cpus_allowed` the job is not pinned,
/// as in fio: the scheduler places it, and a job waiting at queue depth 1 ends up on the CPU that takes its
/// device's interrupts (on this VM the disk's interrupts all go to CPU 1; a job pinned away from them
/// pays a cross-CPU wake-up per I/O, 45 µs of completion latency against 29 µs, whichever tool it is).
/// With `cpus_allowed`, the placement is fixed and the same every run.
fn placement(job: &JobOptions, clone: u32, online: &[usize]) -> anyhow::Result<Placement> {
    let Some(allowed) = &job.cpus_allowed else {
        return Ok(Placement::Unbound);
    };
    if let Some(cpu) = allowed.iter().find(|cpu| !online.contains(cpu)) {
        bail!("job {}: cpus_allowed names CPU {cpu}, which is not online (online: {online:?})", job.name);
    }
    if allowed.len() == 1 || job.cpus_allowed_policy == CpusAllowedPolicy::Split {
        return Ok(Placement::Fixed(allowed[clone as usize % allowed.len()]));
    }
    let set = CpuSet::online()
        .map_err(|error| anyhow!("reading the online CPUs: {error}"))?
        .filter(|location| allowed.contains(&location.cpu));
    Ok(Placement::Fenced(set))
}

/// Runs a plan: every job concurrently, each on its own pinned executor. `show_status` prints fio's one-line
/// live status on standard error.
pub fn run(plan: &BenchPlan, show_status: bool) -> anyhow::Result<BenchOutcome> {
    let mut clones: Vec<(JobOptions, u32)> = Vec::new();
    for job in &plan.jobs {
        for clone in 0..job.numjobs {
            clones.push((job.clone(), clone));
        }
    }
    prepare(&plan.jobs, show_status)?;
    let largest_io_memory = clones.iter().map(|(job, _)| io_memory_bytes(job) as u64).max().unwrap_or(0);
    check_memlock_budget(largest_io_memory, clones.len() as u64)?;

    // The online CPUs, to check `cpus_allowed` against.
    let mut online: Vec<usize> =
        CpuSet::online().map(|set| set.iter().map(|location| location.cpu).collect()).unwrap_or_default();
    online.sort_unstable();
    online.dedup();
    let placements =
        clones.iter().map(|(job, clone)| placement(job, *clone, &online)).collect::<anyhow::Result<Vec<_>>>()?;
    let finished = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    let mut progresses = Vec::new();
    for (index, ((job, clone), placement)) in clones.iter().zip(placements).enumerate() {
        let progress = Arc::new(JobProgress::default());
        progresses.push(progress.clone());
        let job = job.clone();
        let clone = *clone;
        let job_index = index as u32;
        let finished = finished.clone();
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("strata-bench-{}-{clone}", job.name))
            .io_memory(io_memory_bytes(&job))
            .spin_before_park(job.spin_before_park)
            .spawn(move || async move {
                let result = async {
                    let filename = job.filename.clone().ok_or_else(|| "no filename".to_string())?;
                    let options = UringOptions { size_bytes: region_end(&job), read_only: !job.rw.writes() };
                    match job.ioengine {
                        IoEngine::Uring => {
                            let device =
                                UringDevice::open(&filename, &options).await.map_err(|error| error.to_string())?;
                            run_job(Rc::new(device), &job, job_index, progress).await
                        }
                        IoEngine::Ring => {
                            let device = Rc::new(
                                RingDevice::open(&filename, &options, job.iodepth)
                                    .map_err(|error| error.to_string())?,
                            );
                            let result = run_job(Rc::clone(&device), &job, job_index, progress).await;
                            // Said, not failed: the run is valid, but not the one asked for (fio's
                            // `fixedbufs=1`), and slower per I/O.
                            if let Some(why) = device.fixed_buffers_refused() {
                                eprintln!(
                                    "strata-bench: job {}: ring: {why}; buffers from then on came from the heap and \
                                     moved as plain reads and writes (pages pinned at every I/O): raise the memlock \
                                     limit (`ulimit -l`) or run with CAP_IPC_LOCK",
                                    job.name
                                );
                            }
                            result
                        }
                        IoEngine::Nvmf => {
                            let address =
                                NvmfAddress::parse(&filename.to_string_lossy()).map_err(|error| error.to_string())?;
                            // Each job clone is its own controller with one I/O queue on its executor.
                            let host = HostOptions {
                                queue_entries: nvmf_queue_entries(&job),
                                // spin_before_park asks for polling: the host then busy-polls its socket.
                                busy_poll: !job.spin_before_park.is_zero(),
                                tcp_congestion: job.tcp_congestion.clone(),
                                command_timeout: job
                                    .nvmf_command_timeout
                                    .unwrap_or(HostOptions::default().command_timeout),
                                ..HostOptions::default()
                            };
                            let device =
                                NvmfDevice::connect(&address, &host, 1).await.map_err(|error| error.to_string())?;
                            run_job(Rc::new(device), &job, job_index, progress).await
                        }
                    }
                    .map_err(|error| error.to_string())
                }
                .await;
                finished.fetch_add(1, Ordering::Relaxed);
                result
            })
            .map_err(|error| anyhow!("starting the executor of job {}: {error}", clones[index].0.name))?;
        handles.push(handle);
    }

    if show_status {
        show_live_status(&plan.jobs, &progresses, &finished, clones.len());
    }
    let mut results: Vec<JobResult> = Vec::new();
    for (handle, (job, _)) in handles.into_iter().zip(&clones) {
        let result = handle.join().map_err(|error| anyhow!("job {}: executor failed: {error:?}", job.name))?;
        results.push(result.map_err(|error| anyhow!("job {}: {error}", job.name))?);
    }
    let clean = results.iter().all(|result| result.error.is_none() && result.mismatch_count == 0);
    Ok(BenchOutcome { report: render(plan, &clones, &results), clean })
}

fn render(plan: &BenchPlan, clones: &[(JobOptions, u32)], results: &[JobResult]) -> String {
    // With group_reporting, each job (all its clones) is one entry; fio merges across jobs too, which is
    // what a single-job comparison needs.
    let entries: Vec<(JobResult, &JobOptions, u32)> = if plan.group_reporting {
        match report::group(results) {
            Some(merged) => vec![(merged, &clones[0].0, clones.len() as u32)],
            None => Vec::new(),
        }
    } else {
        results.iter().zip(clones).map(|(result, (job, _))| (result.clone(), job, 1)).collect()
    };
    match plan.output_format {
        OutputFormat::Json => {
            let jobs = entries.iter().map(|(result, job, _)| report::job_json(result, job)).collect();
            let mut text = serde_json::to_string_pretty(&report::document_json(jobs)).unwrap_or_default();
            text.push('\n');
            text
        }
        OutputFormat::Normal => {
            let mut text: String =
                entries.iter().map(|(result, job, count)| report::job_text(result, job, *count)).collect();
            text.push_str(&report::run_status_text(results));
            text
        }
    }
}

/// fio's status line: `Jobs: 1 (f=1): [r(1)][40.0%][r=294MiB/s][r=75.2k IOPS][eta 00m:09s]`, once a
/// second, until every job has finished.
fn show_live_status(jobs: &[JobOptions], progresses: &[Arc<JobProgress>], finished: &AtomicUsize, total: usize) {
    let started = Instant::now();
    let planned = jobs.iter().filter_map(|job| job.runtime.map(|runtime| runtime + job.ramp_time)).max();
    let mut previous = (0u64, 0u64, 0u64, 0u64);
    let mut previous_at = started;
    // Bounded by the jobs themselves: each ends by size or runtime; this loop ends when all have.
    while finished.load(Ordering::Relaxed) < total {
        std::thread::sleep(Duration::from_millis(250));
        if previous_at.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let sum = |pick: fn(&JobProgress) -> u64| progresses.iter().map(|progress| pick(progress)).sum::<u64>();
        let now = (
            sum(|p| p.read_ios.load(Ordering::Relaxed)),
            sum(|p| p.read_bytes.load(Ordering::Relaxed)),
            sum(|p| p.write_ios.load(Ordering::Relaxed)),
            sum(|p| p.write_bytes.load(Ordering::Relaxed)),
        );
        let seconds = previous_at.elapsed().as_secs_f64();
        previous_at = Instant::now();
        let rate = |now: u64, before: u64| (now - before) as f64 / seconds;
        let elapsed = started.elapsed();
        let (percent, eta) = match planned {
            Some(planned) => {
                let left = planned.saturating_sub(elapsed);
                (100.0 * elapsed.as_secs_f64() / planned.as_secs_f64().max(1e-9), left)
            }
            None => (0.0, Duration::ZERO),
        };
        let running = total - finished.load(Ordering::Relaxed);
        eprint!(
            "\rJobs: {running} (f={running}): [{:.1}%][r={:.0}MiB/s,w={:.0}MiB/s][r={:.1}k,w={:.1}k IOPS][eta {:02}m:{:02}s]\x1b[K",
            percent.min(100.0),
            rate(now.1, previous.1) / 1_048_576.0,
            rate(now.3, previous.3) / 1_048_576.0,
            rate(now.0, previous.0) / 1000.0,
            rate(now.2, previous.2) / 1000.0,
            eta.as_secs() / 60,
            eta.as_secs() % 60
        );
        previous = now;
    }
    eprint!("\r\x1b[K");
}

/// Whether standard error is a terminal (the status line is only for people).
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cpus_allowed: Option<Vec<usize>>, policy: CpusAllowedPolicy) -> JobOptions {
        JobOptions { cpus_allowed, cpus_allowed_policy: policy, ..JobOptions::default() }
    }

    fn fixed(placement: Placement) -> Option<usize> {
        match placement {
            Placement::Fixed(cpu) => Some(cpu),
            _ => None,
        }
    }

    #[test]
    fn jobs_are_unpinned_unless_cpus_allowed_says_otherwise() {
        let online = [0, 1, 2, 3];
        let open = job(None, CpusAllowedPolicy::Shared);
        for clone in 0..3 {
            assert!(matches!(placement(&open, clone, &online).unwrap(), Placement::Unbound));
        }

        let split = job(Some(vec![1, 3]), CpusAllowedPolicy::Split);
        let cpus: Vec<_> = (0..3).map(|clone| fixed(placement(&split, clone, &online).unwrap())).collect();
        assert_eq!(cpus, [Some(1), Some(3), Some(1)]);

        let one = job(Some(vec![2]), CpusAllowedPolicy::Shared);
        assert_eq!(fixed(placement(&one, 1, &online).unwrap()), Some(2));

        let shared = job(Some(vec![1, 2]), CpusAllowedPolicy::Shared);
        assert!(matches!(placement(&shared, 0, &online).unwrap(), Placement::Fenced(_)));

        let offline = job(Some(vec![9]), CpusAllowedPolicy::Shared);
        let error = placement(&offline, 0, &online).unwrap_err().to_string();
        assert!(error.contains("CPU 9") && error.contains("not online"), "{error}");
    }
}
