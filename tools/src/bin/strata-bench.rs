//! `strata-bench`: Strata's fio-style benchmark CLI. Block mode takes fio's options and job files
//! (`strata-bench --name=x --filename=f --rw=randread ...` or `strata-bench job.fio`); subcommands: `alloc`
//! (allocator workloads), `kv` (drives a storage node) and `stalls` (how often this machine takes a core away).

use std::io::{IsTerminal, Write};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use strata_tools::alloc_bench::{self, AllocBenchConfig, AllocReport, Mode, Workload};
use strata_tools::block_bench;
use strata_tools::byte_size::parse_byte_size;

const BLOCK_MODE_HELP: &str = "\
Block mode (no subcommand): fio's options and job files, run on Strata's block layer (io_uring, NVMe-oF).
  strata-bench --name=NAME --filename=PATH --rw=read|write|randread|randwrite|randrw|rw [--rwmixread=N]
               [--bs=4k] [--iodepth=N] [--numjobs=N] [--size=4g] [--offset=N] [--runtime=15] [--time_based]
               [--ramp_time=N] [--direct=1] [--ioengine=uring|ring|io_uring|nvmf]
               [--random_distribution=random|zipf:1.2] [--lat_percentiles=1]
               [--verify=crc32c] [--randseed=N] [--group_reporting] [--output-format=normal|json]
               [--spin_before_park=50us]   (Strata's own: busy-poll before parking; trades CPU for latency;
                                            with --ioengine=nvmf the host also busy-polls its sockets)
               [--tcp_congestion=reno]     (Strata's own, nvmf: congestion control of the host's sockets)
               [--nvmf_command_timeout=30s] (Strata's own, nvmf: a command unanswered this long is sent
                                            again on a new connection)
  --ioengine=uring (the default) runs on glommio's DmaFile, as the storage node does; ring (alias io_uring,
  fio's name) on a ring of the job's own that it blocks in while waiting, as fio's engine does, with
  registered buffers.
  --ioengine=nvmf --filename='trtype=tcp,traddr=127.0.0.1,trsvcid=4420,subnqn=NQN,ns=1' runs on Strata's
  NVMe-oF host against any NVMe/TCP target (strata-pool target, Linux nvmet, SPDK); trtype=rdma (a build
  with --features rdma) against any NVMe/RDMA target, at an IPv4 address an RDMA device routes to. The
  address may add nvme connect's options for its controller: hdr_digest, data_digest (NVMe/TCP digests),
  queue_size=N, and in seconds keep_alive_tmo, ctrl_loss_tmo, reconnect_delay, and io_timeout (the
  command timeout, as nvmf_command_timeout).
  strata-bench JOBFILE.fio [--output-format=json]
Options before the first --name apply to every job. The exit status is 1 when a job failed or a block
failed verification.";

#[derive(Parser, Debug)]
#[command(
    name = "strata-bench",
    version,
    about = "Strata's fio-style benchmark CLI",
    after_help = BLOCK_MODE_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay KV-cache allocation workloads against strata-alloc and report utilisation per mode.
    ///
    /// Utilisation at first failure: allocated / capacity when the first request fails, filling from empty.
    /// Steady state: then random eviction and re-allocation until churn-factor × capacity bytes were
    /// allocated; the mean utilisation at each failure over the second half of the churn.
    Alloc(AllocArgs),
    /// Drive a Strata node: puts, gets, exists or a mix, single keys or batches, over several connections.
    ///
    /// Keys and values derive from the key index and --seed, so --verify checks what any earlier run wrote.
    Kv(Box<strata_tools::kv_bench::KvArgs>),
    /// Watch one CPU for stalls: a pinned thread reads the clock in a loop and counts the gaps longer than
    /// --threshold (kernel threads, interrupts, other tenants of the host). The floor under any p99.
    Stalls(strata_tools::stall_bench::StallArgs),
    /// One thread copying a value between two buffers: the reference for the shared-memory path. Prints
    /// JSON: size, copies_per_sec, bytes_per_sec.
    Memcpy(strata_tools::memcpy_bench::MemcpyArgs),
}

#[derive(clap::Args, Debug)]
struct AllocArgs {
    /// Workloads to replay (comma-separated); all by default.
    #[arg(long, value_enum, value_delimiter = ',')]
    workload: Vec<Workload>,
    /// Modes to measure (comma-separated): bins = OffsetAllocator behaviour, classes = Strata's front.
    #[arg(long, value_enum, value_delimiter = ',')]
    mode: Vec<Mode>,
    /// Arena size, e.g. 8GiB.
    #[arg(long, default_value = "8GiB", value_parser = parse_byte_size)]
    arena: u64,
    /// Arena alignment; every size rounds up to it.
    #[arg(long, default_value = "4KiB", value_parser = parse_byte_size)]
    alignment: u64,
    /// Churn volume in arena capacities.
    #[arg(long, default_value_t = 10)]
    churn_factor: u64,
    /// Seed of the request stream and of eviction; one seed reproduces a run.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// normal: a table; json: one JSON object per line.
    #[arg(long = "output-format", value_enum, default_value_t = OutputFormat::Normal)]
    output_format: OutputFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OutputFormat {
    Normal,
    Json,
}

const SUBCOMMANDS_AND_CLAP_FLAGS: [&str; 9] =
    ["alloc", "kv", "stalls", "memcpy", "help", "-h", "--help", "-V", "--version"];

fn main() -> anyhow::Result<()> {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let wants_clap = arguments.first().is_none_or(|first| SUBCOMMANDS_AND_CLAP_FLAGS.contains(&first.as_str()));
    if !wants_clap {
        return run_block_mode(&arguments);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Alloc(args) => run_alloc(args),
        Command::Kv(args) => run_kv(*args),
        Command::Stalls(args) => run_stalls(&args),
        Command::Memcpy(args) => {
            println!("{}", serde_json::to_string(&strata_tools::memcpy_bench::run(&args))?);
            Ok(())
        }
    }
}

fn run_block_mode(arguments: &[String]) -> anyhow::Result<()> {
    let plan = block_bench::options::parse_command_line(arguments)?;
    let outcome = block_bench::run(&plan, block_bench::stderr_is_terminal())?;
    print!("{}", outcome.report);
    std::io::stdout().flush()?;
    if !outcome.clean {
        // fio's convention: a failed job or a verify mismatch makes the run fail.
        std::process::exit(1);
    }
    Ok(())
}

fn run_kv(args: strata_tools::kv_bench::KvArgs) -> anyhow::Result<()> {
    let report = strata_tools::kv_bench::run(&args, std::io::stderr().is_terminal())?;
    match args.output_format.as_str() {
        "json" => println!("{}", serde_json::to_string(&report)?),
        "normal" => print!("{}", strata_tools::kv_bench::format_report(&report)),
        other => anyhow::bail!("--output-format {other:?}: expected normal or json"),
    }
    if report.errors > 0 || report.mismatches > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn run_stalls(args: &strata_tools::stall_bench::StallArgs) -> anyhow::Result<()> {
    let report = strata_tools::stall_bench::run(args)?;
    match args.output_format.as_str() {
        "json" => println!("{}", serde_json::to_string(&report)?),
        "normal" => print!("{}", strata_tools::stall_bench::format_report(&report)),
        other => anyhow::bail!("--output-format {other:?}: expected normal or json"),
    }
    Ok(())
}

fn run_alloc(args: AllocArgs) -> anyhow::Result<()> {
    let workloads = if args.workload.is_empty() { Workload::ALL.to_vec() } else { args.workload };
    let modes = if args.mode.is_empty() { Mode::ALL.to_vec() } else { args.mode };
    let config = AllocBenchConfig {
        arena_bytes: args.arena,
        alignment_bytes: args.alignment,
        churn_factor: args.churn_factor,
        seed: args.seed,
    };
    let interactive = std::io::stderr().is_terminal();
    let mut stdout = std::io::stdout().lock();
    if args.output_format == OutputFormat::Normal {
        writeln!(
            stdout,
            "arena {} B, alignment {} B, churn {}x capacity, seed {}",
            config.arena_bytes, config.alignment_bytes, config.churn_factor, config.seed
        )?;
        writeln!(
            stdout,
            "{:<18} {:<8} {:>14} {:>13} {:>13} {:>10} {:>8}",
            "workload", "mode", "first-failure", "steady-state", "steady-min", "ops/s", "classes"
        )?;
    }
    for &workload in &workloads {
        for &mode in &modes {
            if interactive {
                eprint!("\rreplaying {} ({})...\x1b[K", workload.name(), mode.name());
            }
            let report = alloc_bench::run(workload, mode, &config)
                .with_context(|| format!("replaying {} in {} mode", workload.name(), mode.name()))?;
            if interactive {
                eprint!("\r\x1b[K");
            }
            print_report(&mut stdout, &report, args.output_format)?;
        }
    }
    Ok(())
}

fn print_report(out: &mut impl Write, report: &AllocReport, format: OutputFormat) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => writeln!(out, "{}", serde_json::to_string(report)?)?,
        OutputFormat::Normal => writeln!(
            out,
            "{:<18} {:<8} {:>14.4} {:>13.4} {:>13.4} {:>9.2}M {:>8}",
            report.workload,
            report.mode,
            report.utilization_at_first_failure,
            report.steady_state_utilization,
            report.steady_state_min_utilization,
            report.ops_per_sec / 1e6,
            report.size_classes
        )?,
    }
    Ok(())
}
