//! fio's options, with fio's names and meanings, from a command line or a job file.
//!
//! Command line, as fio takes it: options before the first `--name` are global; each `--name=N` starts a
//! job that inherits them. Job files: a `[global]` section and one section per job, `key=value` or a bare
//! `key` for flags, `;` and `#` comments. When both are given, the command line's global options apply on top
//! of the file's `[global]`, and a job section overrides both.

use std::path::PathBuf;
use std::time::Duration;

use crate::byte_size::parse_byte_size;

/// fio's `rw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadWrite {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mixed reads and writes (`rwmixread` decides).
    RandRw,
    /// Sequential mixed reads and writes.
    Rw,
}

impl ReadWrite {
    /// fio's spelling.
    pub fn name(self) -> &'static str {
        match self {
            ReadWrite::Read => "read",
            ReadWrite::Write => "write",
            ReadWrite::RandRead => "randread",
            ReadWrite::RandWrite => "randwrite",
            ReadWrite::RandRw => "randrw",
            ReadWrite::Rw => "rw",
        }
    }

    /// Whether offsets are random.
    pub fn is_random(self) -> bool {
        matches!(self, ReadWrite::RandRead | ReadWrite::RandWrite | ReadWrite::RandRw)
    }

    /// The share of reads, given `rwmixread`.
    pub fn read_share(self, rwmixread: u32) -> f64 {
        match self {
            ReadWrite::Read | ReadWrite::RandRead => 1.0,
            ReadWrite::Write | ReadWrite::RandWrite => 0.0,
            ReadWrite::RandRw | ReadWrite::Rw => f64::from(rwmixread.min(100)) / 100.0,
        }
    }

    /// Whether the job writes.
    pub fn writes(self) -> bool {
        self.read_share(50) < 1.0
    }
}

/// fio's `ioengine`, as far as strata-bench has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoEngine {
    /// Strata's io_uring backend (glommio `DmaFile`), the one the storage node reads its tier through.
    Uring,
    /// Strata's own io_uring per job (`RingDevice`): submits what each pass of the executor queued in one
    /// system call, blocks the job's executor while waiting, as fio's engine does, and moves the job's
    /// buffers as registered (fixed) buffers, as fio does with `fixedbufs=1`. fio's `io_uring` maps here.
    Ring,
    /// Strata's NVMe-oF/TCP host (`NvmfDevice`); the filename is
    /// `trtype=tcp,traddr=ADDR,trsvcid=PORT,subnqn=NQN,ns=N`, with any connection settings
    /// (`strata_nvme::ConnectSettings`).
    Nvmf,
}

impl IoEngine {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            IoEngine::Uring => "uring",
            IoEngine::Ring => "ring",
            IoEngine::Nvmf => "nvmf",
        }
    }
}

/// fio's `random_distribution`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RandomDistribution {
    /// Uniform over the region.
    Random,
    /// Zipf with exponent θ.
    Zipf(f64),
}

/// fio's `verify`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// No verification.
    None,
    /// Every block carries a header with its offset, a generation and a CRC32C.
    Crc32c,
}

/// One job, with every option resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct JobOptions {
    /// `name`.
    pub name: String,
    /// `filename`: the file or block device.
    pub filename: Option<PathBuf>,
    /// `rw`.
    pub rw: ReadWrite,
    /// `rwmixread`: percentage of reads in mixed jobs.
    pub rwmixread: u32,
    /// `bs`.
    pub bs: u64,
    /// `iodepth`.
    pub iodepth: u32,
    /// `numjobs`: clones of this job.
    pub numjobs: u32,
    /// `size`: the region's size (default: the file's size from `offset`).
    pub size: Option<u64>,
    /// `offset`: the region's start.
    pub offset: u64,
    /// `runtime`.
    pub runtime: Option<Duration>,
    /// `time_based`: run for `runtime` even when `size` is done.
    pub time_based: bool,
    /// `lat_percentiles`: report percentiles of total latency (`lat`, submission + completion) too. Worth
    /// asking for against `ring`, whose one system call submits and waits: it cannot split the two, so it
    /// counts the submission in `clat`, where fio counts it in `slat`.
    pub lat_percentiles: bool,
    /// `ramp_time`: run this long before measuring.
    pub ramp_time: Duration,
    /// `direct`.
    pub direct: bool,
    /// `ioengine`.
    pub ioengine: IoEngine,
    /// `random_distribution`.
    pub random_distribution: RandomDistribution,
    /// `verify`.
    pub verify: Verify,
    /// `randseed`.
    pub randseed: u64,
    /// Strata extension: how long the job's executor busy-polls for completions before it parks (blocks in
    /// the kernel). glommio's park is costly (a `membarrier`, timer re-arming, several `io_uring_enter`s),
    /// which dominates at low queue depth; spinning trades CPU for latency, as SPDK's polling does. 0: park
    /// at once, like fio.
    pub spin_before_park: Duration,
    /// Strata's own: TCP congestion control of the nvmf engine's sockets (`None`: the system's default).
    pub tcp_congestion: Option<String>,
    /// Strata's own: how long an nvmf command may wait for its completion before the host reconnects and
    /// sends it again (`None`: the host's default, 30 s).
    pub nvmf_command_timeout: Option<Duration>,
    /// `cpus_allowed`: the CPUs the job's executors may run on, ascending (`None`: not pinned, as in fio).
    pub cpus_allowed: Option<Vec<usize>>,
    /// `cpus_allowed_policy`.
    pub cpus_allowed_policy: CpusAllowedPolicy,
}

/// fio's `cpus_allowed_policy`: how a job's clones share its `cpus_allowed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpusAllowedPolicy {
    /// Every clone may run on any of the CPUs (fio's default).
    #[default]
    Shared,
    /// Clone `k` runs on the `k`-th CPU of the set (round robin).
    Split,
}

/// Parses a CPU list as fio and taskset write it: `0`, `0-3`, `0,2,4-5`. Returns the CPUs ascending.
fn parse_cpu_list(option: &str, text: &str) -> Result<Vec<usize>, OptionError> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let cpu = |text: &str| {
            text.trim().parse::<usize>().map_err(|_| bad(option, format!("'{text}' is not a CPU number (e.g. 0-3,5)")))
        };
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (cpu(first)?, cpu(last)?);
                if first > last || last - first >= 4096 {
                    return Err(bad(option, format!("'{part}' is not an ascending CPU range")));
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(cpu(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            name: "strata-bench".into(),
            filename: None,
            rw: ReadWrite::Read,
            rwmixread: 50,
            bs: 4096,
            iodepth: 1,
            numjobs: 1,
            size: None,
            offset: 0,
            runtime: None,
            time_based: false,
            lat_percentiles: false,
            ramp_time: Duration::ZERO,
            // fio's default is buffered I/O; strata-bench only does direct I/O, so it is the default here and
            // `direct=0` is refused rather than silently ignored.
            direct: true,
            ioengine: IoEngine::Uring,
            random_distribution: RandomDistribution::Random,
            verify: Verify::None,
            randseed: 0x5eed,
            spin_before_park: Duration::ZERO,
            tcp_congestion: None,
            nvmf_command_timeout: None,
            cpus_allowed: None,
            cpus_allowed_policy: CpusAllowedPolicy::Shared,
        }
    }
}

/// fio's `output-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// The human report.
    Normal,
    /// fio's JSON.
    Json,
}

/// Everything one invocation asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchPlan {
    /// The jobs (before `numjobs` cloning).
    pub jobs: Vec<JobOptions>,
    /// `output-format`.
    pub output_format: OutputFormat,
    /// `group_reporting`: one report for all jobs.
    pub group_reporting: bool,
}

/// Why options did not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// An option strata-bench does not know.
    #[error(
        "unknown option '{0}' (strata-bench takes fio's names: name filename rw rwmixread bs iodepth numjobs size offset runtime time_based lat_percentiles ramp_time direct ioengine random_distribution verify randseed cpus_allowed cpus_allowed_policy group_reporting output-format; Strata's own: spin_before_park tcp_congestion nvmf_command_timeout)"
    )]
    Unknown(String),
    /// A value that does not fit the option.
    #[error("option {option}: {message}")]
    BadValue {
        /// The option.
        option: String,
        /// What is wrong, with the accepted values.
        message: String,
    },
    /// A known fio value that strata-bench does not support (yet), with the reason.
    #[error("option {option}={value}: {message}")]
    Unsupported {
        /// The option.
        option: String,
        /// The value.
        value: String,
        /// Why, and what to use instead.
        message: String,
    },
    /// A job file that could not be read or has a line that is not an option.
    #[error("job file {path}: {message}")]
    JobFile {
        /// The file.
        path: String,
        /// What is wrong, with the line number.
        message: String,
    },
    /// No job to run.
    #[error("no job defined: give --name=NAME --filename=PATH ..., or a job file")]
    NoJobs,
}

/// An option that applies to the whole run rather than one job.
enum Scope {
    Job,
    Run,
}

fn bad(option: &str, message: impl Into<String>) -> OptionError {
    OptionError::BadValue { option: option.to_string(), message: message.into() }
}

fn parse_bool(option: &str, value: Option<&str>) -> Result<bool, OptionError> {
    match value.map(str::trim) {
        None | Some("1") | Some("true") => Ok(true),
        Some("0") | Some("false") => Ok(false),
        Some(other) => Err(bad(option, format!("'{other}' is not 0 or 1"))),
    }
}

/// fio's time values: a number with an optional unit (`us`, `ms`, `s`, `m`, `h`, `d`); seconds by default.
pub fn parse_duration(option: &str, text: &str) -> Result<Duration, OptionError> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let value: u64 = digits.parse().map_err(|_| bad(option, format!("'{text}' is not a time (e.g. 15, 500ms, 2m)")))?;
    let micros = match unit.trim().to_ascii_lowercase().as_str() {
        "us" | "usec" => value,
        "ms" | "msec" => value.saturating_mul(1_000),
        "" | "s" | "sec" => value.saturating_mul(1_000_000),
        "m" | "min" => value.saturating_mul(60_000_000),
        "h" => value.saturating_mul(3_600_000_000),
        "d" => value.saturating_mul(86_400_000_000),
        other => return Err(bad(option, format!("unknown time unit '{other}'"))),
    };
    Ok(Duration::from_micros(micros))
}

fn parse_size(option: &str, value: &str) -> Result<u64, OptionError> {
    parse_byte_size(value).map_err(|error| bad(option, error.to_string()))
}

fn required<'a>(option: &str, value: Option<&'a str>) -> Result<&'a str, OptionError> {
    value.ok_or_else(|| bad(option, "needs a value (--option=value)"))
}

impl JobOptions {
    /// Applies one option to this job. Returns `Scope::Run` for options of the whole run, which the caller
    /// applies to the plan instead.
    fn apply(&mut self, option: &str, value: Option<&str>) -> Result<Scope, OptionError> {
        match option {
            "name" => self.name = required(option, value)?.to_string(),
            "filename" => self.filename = Some(PathBuf::from(required(option, value)?)),
            "rw" | "readwrite" => {
                self.rw = match required(option, value)? {
                    "read" => ReadWrite::Read,
                    "write" => ReadWrite::Write,
                    "randread" => ReadWrite::RandRead,
                    "randwrite" => ReadWrite::RandWrite,
                    "randrw" => ReadWrite::RandRw,
                    "rw" | "readwrite" => ReadWrite::Rw,
                    other => {
                        return Err(bad(
                            option,
                            format!("'{other}' is not read, write, randread, randwrite, randrw or rw"),
                        ));
                    }
                }
            }
            "rwmixread" => {
                let percent: u32 = required(option, value)?.parse().map_err(|_| bad(option, "not a percentage"))?;
                if percent > 100 {
                    return Err(bad(option, "a percentage is at most 100"));
                }
                self.rwmixread = percent;
            }
            "rwmixwrite" => {
                let percent: u32 = required(option, value)?.parse().map_err(|_| bad(option, "not a percentage"))?;
                if percent > 100 {
                    return Err(bad(option, "a percentage is at most 100"));
                }
                self.rwmixread = 100 - percent;
            }
            "bs" | "blocksize" => {
                let bs = parse_size(option, required(option, value)?)?;
                if bs == 0 || !bs.is_multiple_of(512) {
                    return Err(bad(option, "direct I/O needs a block size that is a positive multiple of 512"));
                }
                self.bs = bs;
            }
            "iodepth" => {
                let depth: u32 = required(option, value)?.parse().map_err(|_| bad(option, "not a number"))?;
                if !(1..=4096).contains(&depth) {
                    return Err(bad(option, "must be in 1..=4096"));
                }
                self.iodepth = depth;
            }
            "numjobs" => {
                let jobs: u32 = required(option, value)?.parse().map_err(|_| bad(option, "not a number"))?;
                if !(1..=256).contains(&jobs) {
                    return Err(bad(option, "must be in 1..=256"));
                }
                self.numjobs = jobs;
            }
            "size" => self.size = Some(parse_size(option, required(option, value)?)?),
            "offset" => self.offset = parse_size(option, required(option, value)?)?,
            "runtime" => self.runtime = Some(parse_duration(option, required(option, value)?)?),
            "time_based" => self.time_based = parse_bool(option, value)?,
            "lat_percentiles" => self.lat_percentiles = parse_bool(option, value)?,
            "ramp_time" => self.ramp_time = parse_duration(option, required(option, value)?)?,
            "direct" => {
                self.direct = parse_bool(option, value)?;
                if !self.direct {
                    return Err(OptionError::Unsupported {
                        option: option.into(),
                        value: "0".into(),
                        message: "strata-bench measures direct I/O only (the uring engine opens files with O_DIRECT); use --direct=1".into(),
                    });
                }
            }
            "ioengine" => {
                self.ioengine = match required(option, value)? {
                    "uring" => IoEngine::Uring,
                    // fio's engine is a thread with its own ring, blocking in it while it waits: `ring` is
                    // that, so a fio command line runs here the way it runs in fio.
                    "ring" | "io_uring" => IoEngine::Ring,
                    "nvmf" => IoEngine::Nvmf,
                    engine @ "spdk" => {
                        return Err(OptionError::Unsupported {
                            option: option.into(),
                            value: engine.into(),
                            message: "this strata-bench was built without SPDK (feature `spdk`, with SPDK_DIR pointing at an install); use --ioengine=uring".into(),
                        });
                    }
                    other => {
                        return Err(bad(
                            option,
                            format!("unknown engine '{other}': strata-bench has ring (alias io_uring), uring and nvmf"),
                        ));
                    }
                }
            }
            "random_distribution" => {
                let text = required(option, value)?;
                self.random_distribution = if text == "random" {
                    RandomDistribution::Random
                } else if let Some(theta) = text.strip_prefix("zipf:").or_else(|| text.strip_prefix("zipf")) {
                    let theta = if theta.is_empty() { "1.2" } else { theta };
                    let theta: f64 = theta.parse().map_err(|_| bad(option, format!("'{theta}' is not a number")))?;
                    if !(theta > 0.0 && theta.is_finite()) {
                        return Err(bad(option, "zipf's θ must be positive"));
                    }
                    RandomDistribution::Zipf(theta)
                } else {
                    return Err(bad(option, format!("'{text}' is not random or zipf:θ")));
                }
            }
            "verify" => {
                self.verify = match required(option, value)? {
                    "crc32c" | "crc32c-intel" => Verify::Crc32c,
                    "0" | "none" => Verify::None,
                    other => {
                        return Err(bad(
                            option,
                            format!("'{other}' is not supported: strata-bench verifies with crc32c"),
                        ));
                    }
                }
            }
            "randseed" => self.randseed = required(option, value)?.parse().map_err(|_| bad(option, "not a number"))?,
            "spin_before_park" => self.spin_before_park = parse_duration(option, required(option, value)?)?,
            "tcp_congestion" => self.tcp_congestion = Some(required(option, value)?.to_string()),
            "nvmf_command_timeout" => {
                self.nvmf_command_timeout = Some(parse_duration(option, required(option, value)?)?);
            }
            "cpus_allowed" => self.cpus_allowed = Some(parse_cpu_list(option, required(option, value)?)?),
            "cpus_allowed_policy" => {
                self.cpus_allowed_policy = match required(option, value)? {
                    "shared" => CpusAllowedPolicy::Shared,
                    "split" => CpusAllowedPolicy::Split,
                    other => return Err(bad(option, format!("'{other}' is not shared or split"))),
                }
            }
            "group_reporting" | "output-format" => return Ok(Scope::Run),
            other => return Err(OptionError::Unknown(other.to_string())),
        }
        Ok(Scope::Job)
    }
}

#[derive(Default)]
struct PlanBuilder {
    output_format: Option<OutputFormat>,
    group_reporting: bool,
}

impl PlanBuilder {
    fn apply_run_option(&mut self, option: &str, value: Option<&str>) -> Result<(), OptionError> {
        match option {
            "group_reporting" => self.group_reporting = parse_bool(option, value)?,
            "output-format" => {
                self.output_format = Some(match required(option, value)? {
                    "normal" => OutputFormat::Normal,
                    "json" => OutputFormat::Json,
                    other => return Err(bad(option, format!("'{other}' is not normal or json"))),
                })
            }
            _ => {}
        }
        Ok(())
    }

    fn apply(&mut self, job: &mut JobOptions, option: &str, value: Option<&str>) -> Result<(), OptionError> {
        match job.apply(option, value)? {
            Scope::Job => Ok(()),
            Scope::Run => self.apply_run_option(option, value),
        }
    }
}

/// Splits `--key=value` / `--flag` arguments; anything else is a job file.
fn split_argument(argument: &str) -> Option<(&str, Option<&str>)> {
    let option = argument.strip_prefix("--")?;
    Some(match option.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (option, None),
    })
}

/// Parses a command line (without the program name) and the job files it names.
pub fn parse_command_line(arguments: &[String]) -> Result<BenchPlan, OptionError> {
    let mut builder = PlanBuilder::default();
    let mut global = JobOptions::default();
    let mut command_line_jobs: Vec<JobOptions> = Vec::new();
    let mut job_files = Vec::new();
    // Options before the first --name, kept to re-apply over a job file's [global].
    let mut global_options: Vec<(String, Option<String>)> = Vec::new();
    for argument in arguments {
        let Some((option, value)) = split_argument(argument) else {
            job_files.push(argument.clone());
            continue;
        };
        if option == "name" {
            let mut job = global.clone();
            builder.apply(&mut job, option, value)?;
            command_line_jobs.push(job);
        } else if let Some(job) = command_line_jobs.last_mut() {
            builder.apply(job, option, value)?;
        } else {
            builder.apply(&mut global, option, value)?;
            global_options.push((option.to_string(), value.map(str::to_string)));
        }
    }
    let mut jobs = Vec::new();
    for path in &job_files {
        let text = std::fs::read_to_string(path)
            .map_err(|error| OptionError::JobFile { path: path.clone(), message: error.to_string() })?;
        jobs.extend(parse_job_file(&text, path, &mut builder, &global_options)?);
    }
    jobs.extend(command_line_jobs);
    if jobs.is_empty() {
        if global_options.is_empty() {
            return Err(OptionError::NoJobs);
        }
        // Options but no --name: one job, as a user pasting part of a fio line means.
        jobs.push(global);
    }
    Ok(BenchPlan {
        jobs,
        output_format: builder.output_format.unwrap_or(OutputFormat::Normal),
        group_reporting: builder.group_reporting,
    })
}

fn parse_job_file(
    text: &str,
    path: &str,
    builder: &mut PlanBuilder,
    command_line_global: &[(String, Option<String>)],
) -> Result<Vec<JobOptions>, OptionError> {
    let mut global = JobOptions::default();
    let mut jobs: Vec<JobOptions> = Vec::new();
    let mut in_global = false;
    let mut saw_section = false;
    let file_error = |line: usize, message: String| OptionError::JobFile {
        path: path.to_string(),
        message: format!("line {line}: {message}"),
    };
    for (index, raw) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            saw_section = true;
            let section = section.trim();
            if section == "global" {
                in_global = true;
            } else {
                in_global = false;
                let mut job = global.clone();
                for (option, value) in command_line_global {
                    builder.apply(&mut job, option, value.as_deref())?;
                }
                job.name = section.to_string();
                jobs.push(job);
            }
            continue;
        }
        if !saw_section {
            return Err(file_error(line_number, "an option outside any [section]".into()));
        }
        let (key, value) = match line.split_once('=') {
            Some((key, value)) => (key.trim(), Some(value.trim())),
            None => (line, None),
        };
        let target = if in_global { &mut global } else { jobs.last_mut().unwrap_or(&mut global) };
        builder.apply(target, key, value).map_err(|error| file_error(line_number, error.to_string()))?;
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_fio_command_line_parses_with_fio_meanings() {
        let plan = parse_command_line(&args(
            "--name=rr --filename=/tmp/x --rw=randread --bs=4k --iodepth=32 --direct=1 --size=4g --runtime=15 \
             --time_based --ioengine=io_uring --random_distribution=zipf:1.1 --verify=crc32c --output-format=json \
             --group_reporting --ramp_time=2 --numjobs=2 --offset=1m --spin_before_park=50us --lat_percentiles=1 \
             --nvmf_command_timeout=2s",
        ))
        .unwrap();
        assert_eq!(plan.output_format, OutputFormat::Json);
        assert!(plan.group_reporting);
        let job = &plan.jobs[0];
        assert_eq!(job.name, "rr");
        assert_eq!(job.rw, ReadWrite::RandRead);
        assert_eq!((job.bs, job.iodepth, job.numjobs), (4096, 32, 2));
        assert_eq!((job.size, job.offset), (Some(4 << 30), 1 << 20));
        assert_eq!(job.runtime, Some(Duration::from_secs(15)));
        assert_eq!(job.ramp_time, Duration::from_secs(2));
        assert!(job.time_based && job.direct && job.lat_percentiles);
        assert_eq!(job.random_distribution, RandomDistribution::Zipf(1.1));
        assert_eq!(job.verify, Verify::Crc32c);
        assert_eq!(job.spin_before_park, Duration::from_micros(50));
        assert_eq!(job.nvmf_command_timeout, Some(Duration::from_secs(2)));
    }

    #[test]
    fn options_before_the_first_name_are_global() {
        let plan =
            parse_command_line(&args("--bs=1m --iodepth=8 --name=a --rw=read --name=b --rw=write --bs=64k")).unwrap();
        assert_eq!(plan.jobs.len(), 2);
        assert_eq!((plan.jobs[0].name.as_str(), plan.jobs[0].rw, plan.jobs[0].bs), ("a", ReadWrite::Read, 1 << 20));
        assert_eq!((plan.jobs[1].name.as_str(), plan.jobs[1].rw, plan.jobs[1].bs), ("b", ReadWrite::Write, 64 << 10));
        assert_eq!(plan.jobs[1].iodepth, 8);
    }

    #[test]
    fn a_job_file_with_global_sections_and_comments() {
        let text = "; a fio job file\n[global]\nioengine=io_uring\ndirect=1\nbs=4k\n# comment\nsize=1g\n\n[seq-read]\nrw=read\nbs=1m\niodepth=8\n\n[rand-write]\nrw=randwrite\ntime_based\nruntime=5s\n";
        let mut builder = PlanBuilder::default();
        let jobs = parse_job_file(text, "test.fio", &mut builder, &[("iodepth".into(), Some("4".into()))]).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            (jobs[0].name.as_str(), jobs[0].rw, jobs[0].bs, jobs[0].iodepth),
            ("seq-read", ReadWrite::Read, 1 << 20, 8)
        );
        assert_eq!(jobs[0].size, Some(1 << 30));
        assert_eq!((jobs[1].rw, jobs[1].bs, jobs[1].iodepth), (ReadWrite::RandWrite, 4096, 4));
        assert!(jobs[1].time_based);
        assert_eq!(jobs[1].runtime, Some(Duration::from_secs(5)));
    }

    #[test]
    fn bad_options_are_clear_errors() {
        let cases = [
            ("--name=x --rw=sideways", "rw"),
            ("--name=x --bs=1000", "bs"),
            ("--name=x --iodepth=0", "iodepth"),
            ("--name=x --runtime=5 parsecs", "job file"),
            ("--name=x --frobnicate=1", "unknown option"),
            ("--name=x --direct=0", "direct"),
            ("--name=x --ioengine=libaio", "ioengine"),
            ("--name=x --ioengine=spdk", "SPDK"),
            ("--name=x --random_distribution=pareto:0.5", "random_distribution"),
            ("--name=x --rwmixread=150", "rwmixread"),
            ("--name=x --cpus_allowed=1-x", "cpus_allowed"),
            ("--name=x --cpus_allowed=3-1", "cpus_allowed"),
            ("--name=x --cpus_allowed_policy=scatter", "cpus_allowed_policy"),
        ];
        for (line, expected) in cases {
            let error = parse_command_line(&args(line)).unwrap_err().to_string();
            assert!(error.contains(expected), "{line}: {error}");
        }
        assert_eq!(parse_command_line(&[]), Err(OptionError::NoJobs));
        let mut builder = PlanBuilder::default();
        let error = parse_job_file("rw=read\n", "x.fio", &mut builder, &[]).unwrap_err().to_string();
        assert!(error.contains("line 1"), "{error}");
    }

    #[test]
    fn cpu_lists_read_as_fio_and_taskset_write_them() {
        for (text, expected) in [("0", vec![0]), ("0-3", vec![0, 1, 2, 3]), ("5,0-1,1", vec![0, 1, 5])] {
            assert_eq!(parse_cpu_list("cpus_allowed", text).unwrap(), expected, "{text}");
        }
        let plan = parse_command_line(&args("--name=x --cpus_allowed=1 --cpus_allowed_policy=split")).unwrap();
        assert_eq!(plan.jobs[0].cpus_allowed, Some(vec![1]));
        assert_eq!(plan.jobs[0].cpus_allowed_policy, CpusAllowedPolicy::Split);
        assert_eq!(parse_command_line(&args("--name=x")).unwrap().jobs[0].cpus_allowed, None);
    }

    #[test]
    fn durations_take_fio_units() {
        for (text, expected) in
            [("15", 15_000_000), ("500ms", 500_000), ("2m", 120_000_000), ("10us", 10), ("1h", 3_600_000_000)]
        {
            assert_eq!(parse_duration("runtime", text).unwrap(), Duration::from_micros(expected), "{text}");
        }
        assert!(parse_duration("runtime", "soon").is_err());
    }
}
