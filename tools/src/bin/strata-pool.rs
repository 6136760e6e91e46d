//! `strata-pool`: Strata's NVMe-oF pool tool. `target` serves subsystems over NVMe/TCP; `discover` prints
//! a discovery log like `nvme discover`.

use std::process::ExitCode;

use strata_nvme::host::{HostOptions, resolve};
use strata_tools::pool;

const USAGE: &str = "\
usage: strata-pool target --listen ADDR:PORT --subsystem NQN --namespace SPEC ... (see strata-pool target --help)
       strata-pool discover ADDR[:PORT] [--hostnqn NQN] [--output-format=normal|json]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("target") => target(&args[1..]),
        Some("discover") => discover(&args[1..]),
        _ => Err(anyhow::anyhow!("{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("strata-pool: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn target(args: &[String]) -> anyhow::Result<()> {
    let config = pool::parse_target_args(args)?;
    let summary: Vec<String> = config
        .subsystems
        .iter()
        .map(|subsystem| format!("{} ({} namespaces)", subsystem.nqn, subsystem.namespaces.len()))
        .collect();
    let cpus = config.cpus.clone();
    let handle = strata_nvme::target::start(config)?;
    eprintln!(
        "strata-pool: NVMe/TCP target on {} (cpus {cpus:?}), discovery {} and {}",
        handle.local_addr(),
        strata_nvme::spec::DISCOVERY_NQN,
        summary.join(", ")
    );
    handle.wait();
    Ok(())
}

fn discover(args: &[String]) -> anyhow::Result<()> {
    let mut target = None;
    let mut options = HostOptions::default();
    let mut json = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--hostnqn" => {
                options.hostnqn = iter.next().cloned().ok_or_else(|| anyhow::anyhow!("--hostnqn needs a value"))?
            }
            "--output-format=json" => json = true,
            "--output-format=normal" => json = false,
            other if target.is_none() && !other.starts_with('-') => target = Some(other.to_string()),
            other => anyhow::bail!("unknown option {other}\n{USAGE}"),
        }
    }
    let target = target.ok_or_else(|| anyhow::anyhow!("{USAGE}"))?;
    let (host, port) = match target.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && port.parse::<u16>().is_ok() => (host.to_string(), port.parse()?),
        _ => (target.clone(), 8009u16),
    };
    let addr = resolve(&host, port).map_err(|error| anyhow::anyhow!(error))?;
    let log = pool::discover(addr, options)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&pool::discovery_json(&log))?);
    } else {
        print!("{}", pool::format_discovery(&log));
    }
    Ok(())
}
