//! `strata-pool`: Strata's NVMe-oF pool tool. `target` serves subsystems over NVMe/TCP; `discover` prints
//! a discovery log like `nvme discover`; `create`, `add`, `remove` and `status` manage a pool of namespaces
//! and its description file; `cluster status` shows a cluster's members and who holds each shared NVMe tier,
//! as etcd holds them.

use std::io::IsTerminal;
use std::process::ExitCode;

use strata_nvme::host::{HostOptions, resolve};
use strata_tools::pool;

const USAGE: &str = "\
usage: strata-pool target --listen ADDR:PORT --subsystem NQN --namespace SPEC ... | --config TARGET.toml
       (see strata-pool target --help)
       strata-pool discover ADDR[:PORT] [--hostnqn NQN] [--output-format=normal|json]
       strata-pool create NAME --ns SPEC [--ns SPEC ...] [--force] [--create-dirs] [--out NAME.pool.toml]
       strata-pool add POOL.toml --ns SPEC [--ns SPEC ...] [--force] [--create-dirs]
       strata-pool remove POOL.toml --ns SPEC
       strata-pool status POOL.toml [--output-format=normal|json]
       strata-pool cluster status --cluster etcd://HOST:PORT[,...] [--cluster-name NAME]
       [--output-format=normal|json]
  SPEC: file:PATH[,size=SIZE] | nvmf:trtype=tcp,traddr=ADDR,trsvcid=PORT,subnqn=NQN,ns=N";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("target") => target(&args[1..]),
        Some("discover") => discover(&args[1..]),
        Some(command @ ("create" | "add" | "remove" | "status")) => manage(command, &args[1..]),
        Some("cluster") => cluster(&args[1..]),
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
    let config = match args {
        [flag, path] if flag == "--config" => pool::parse_target_args(&pool::target_args_from_file(path.as_ref())?)?,
        _ => pool::parse_target_args(args)?,
    };
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

fn cluster(args: &[String]) -> anyhow::Result<()> {
    let (mut etcd, mut name, mut json) = (None, "strata".to_string(), false);
    let mut iter = args.iter();
    if iter.next().map(String::as_str) != Some("status") {
        anyhow::bail!("{USAGE}");
    }
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--cluster" => etcd = Some(iter.next().ok_or_else(|| anyhow::anyhow!("--cluster needs etcd://…"))?),
            "--cluster-name" => {
                name = iter.next().cloned().ok_or_else(|| anyhow::anyhow!("--cluster-name needs a name"))?
            }
            "--output-format=json" => json = true,
            "--output-format=normal" => json = false,
            other => anyhow::bail!("unknown option {other}\n{USAGE}"),
        }
    }
    let etcd = etcd.ok_or_else(|| anyhow::anyhow!("cluster status needs --cluster etcd://…"))?;
    let status = strata_tools::cluster_status::read(etcd, &name)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&strata_tools::cluster_status::to_json(&name, &status))?);
    } else {
        print!("{}", strata_tools::cluster_status::format(&name, &status));
    }
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

fn manage(command: &str, args: &[String]) -> anyhow::Result<()> {
    let mut positional = None;
    let mut specs = Vec::new();
    let (mut force, mut create_dirs, mut json, mut out) = (false, false, false, None);
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--ns" | "--namespace" => {
                specs.push(iter.next().cloned().ok_or_else(|| anyhow::anyhow!("--ns needs a SPEC"))?)
            }
            "--force" => force = true,
            "--create-dirs" => create_dirs = true,
            "--out" => {
                out = Some(std::path::PathBuf::from(iter.next().ok_or_else(|| anyhow::anyhow!("--out needs a file"))?))
            }
            "--output-format=json" => json = true,
            "--output-format=normal" => json = false,
            other if positional.is_none() && !other.starts_with('-') => positional = Some(other.to_string()),
            other => anyhow::bail!("unknown option {other}\n{USAGE}"),
        }
    }
    let positional = positional.ok_or_else(|| anyhow::anyhow!("{USAGE}"))?;
    let options = pool::FormatOptions { force, create_dirs, show_progress: std::io::stderr().is_terminal() };
    match command {
        "create" => {
            let out = out.unwrap_or_else(|| format!("{positional}.pool.toml").into());
            let pool = pool::create(&positional, specs, &out, options)?;
            eprintln!(
                "strata-pool: created pool {} ({}) with {} namespaces; description in {}",
                pool.name,
                pool.uuid,
                pool.namespaces.len(),
                out.display()
            );
        }
        "add" => {
            let pool = pool::add(positional.as_ref(), specs, options)?;
            eprintln!("strata-pool: pool {} now has {} namespaces", pool.name, pool.namespaces.len());
        }
        "remove" => {
            let [spec] = specs.as_slice() else { anyhow::bail!("remove takes one --ns SPEC") };
            let pool = pool::remove(positional.as_ref(), spec)?;
            eprintln!("strata-pool: pool {} now has {} namespaces", pool.name, pool.namespaces.len());
        }
        _ => {
            let (pool, statuses) = pool::status(positional.as_ref())?;
            if json {
                let value = serde_json::json!({ "name": pool.name, "uuid": pool.uuid, "namespaces": statuses });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print!("{}", pool::format_status(&pool, &statuses));
            }
            if statuses.iter().any(|status| status.state != "ok") {
                anyhow::bail!("some namespaces are not healthy");
            }
        }
    }
    Ok(())
}
