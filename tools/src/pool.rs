//! `strata-pool`: the NVMe-oF pool tool. Today: `target` (serve subsystems over NVMe/TCP) and `discover`
//! (print a discovery log as `nvme discover` does).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use strata_nvme::host::{HostOptions, resolve};
use strata_nvme::spec::{DiscoveryEntry, DiscoveryLog};
use strata_nvme::target::{NamespaceConfig, SubsystemConfig, TargetConfig};

use crate::byte_size::parse_byte_size;

/// Usage of `strata-pool target`.
pub const TARGET_USAGE: &str = "\
strata-pool target --listen ADDR:PORT --subsystem NQN --namespace SPEC [--namespace SPEC ...]
                   [--allow-host HOSTNQN ...] [--subsystem NQN ...] [--cpus 0,1] [--busy-poll 200us]
                   [--tcp-congestion reno]
  SPEC: memory:SIZE | file:PATH[,size=SIZE][,block=512|4096]   (sizes: 1GiB, 512m, ...)
  --namespace and --allow-host apply to the --subsystem before them; without --allow-host any host may connect.
  --busy-poll: how long an idle core spins before sleeping; non-zero also busy-polls the sockets (SPDK style).
  --tcp-congestion: congestion control of accepted connections (default: the system's; pacing ones such
    as bbr cap deep queues on loopback).";

/// Parses `strata-pool target` arguments (order matters: namespaces and hosts follow their subsystem).
pub fn parse_target_args(args: &[String]) -> anyhow::Result<TargetConfig> {
    let mut listen: Option<SocketAddr> = None;
    let mut subsystems: Vec<SubsystemConfig> = Vec::new();
    let mut cpus = vec![0];
    let mut busy_poll = Duration::ZERO;
    let mut tcp_congestion = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_string())),
            None => (arg.as_str(), None),
        };
        let mut value =
            || inline.clone().or_else(|| iter.next().cloned()).ok_or_else(|| anyhow!("{flag} needs a value"));
        match flag {
            "--listen" => {
                let text = value()?;
                let (host, port) =
                    text.rsplit_once(':').ok_or_else(|| anyhow!("--listen {text}: expected ADDR:PORT"))?;
                let port = port.parse().with_context(|| format!("--listen {text}: bad port"))?;
                listen = Some(resolve(host, port).map_err(|error| anyhow!("--listen: {error}"))?);
            }
            "--subsystem" => {
                subsystems.push(SubsystemConfig { nqn: value()?, namespaces: Vec::new(), allowed_hosts: Vec::new() })
            }
            "--namespace" | "--ns" => {
                let spec = value()?;
                let subsystem =
                    subsystems.last_mut().ok_or_else(|| anyhow!("--namespace {spec} comes before any --subsystem"))?;
                let namespace =
                    NamespaceConfig::parse(&spec, |text| parse_byte_size(text).ok()).map_err(|error| anyhow!(error))?;
                subsystem.namespaces.push(namespace);
            }
            "--allow-host" => {
                let host = value()?;
                let subsystem =
                    subsystems.last_mut().ok_or_else(|| anyhow!("--allow-host {host} comes before any --subsystem"))?;
                subsystem.allowed_hosts.push(host);
            }
            "--cpus" => {
                cpus = value()?
                    .split(',')
                    .map(|cpu| cpu.trim().parse::<usize>().map_err(|_| anyhow!("--cpus: {cpu:?} is not a CPU number")))
                    .collect::<anyhow::Result<_>>()?;
            }
            "--busy-poll" => busy_poll = parse_duration(&value()?)?,
            "--tcp-congestion" => tcp_congestion = Some(value()?),
            "-h" | "--help" => bail!("{TARGET_USAGE}"),
            other => bail!("unknown option {other}\n{TARGET_USAGE}"),
        }
    }
    let listen = listen.ok_or_else(|| anyhow!("--listen ADDR:PORT is required\n{TARGET_USAGE}"))?;
    if subsystems.is_empty() {
        bail!("at least one --subsystem NQN with a --namespace is required\n{TARGET_USAGE}");
    }
    if let Some(empty) = subsystems.iter().find(|subsystem| subsystem.namespaces.is_empty()) {
        bail!("subsystem {} has no --namespace", empty.nqn);
    }
    Ok(TargetConfig { cpus, busy_poll, tcp_congestion, ..TargetConfig::new(listen, subsystems) })
}

/// Parses `200us`, `5ms`, `1s` or a bare number of microseconds.
pub fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    let value: u64 = digits.parse().map_err(|_| anyhow!("{text:?} is not a duration (200us, 5ms, 1s)"))?;
    Ok(match unit {
        "" | "us" => Duration::from_micros(value),
        "ms" => Duration::from_millis(value),
        "s" => Duration::from_secs(value),
        _ => bail!("{text:?}: unit must be us, ms or s"),
    })
}

/// Reads the discovery log at `addr` on a short-lived executor.
pub fn discover(addr: SocketAddr, options: HostOptions) -> anyhow::Result<DiscoveryLog> {
    let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("strata-pool-discover")
        .spawn(move || async move { strata_nvme::host::discover(addr, &options).await })
        .map_err(|error| anyhow!("starting an executor: {error}"))?;
    let log = handle.join().map_err(|error| anyhow!("discovery executor: {error:?}"))?;
    log.with_context(|| format!("discovery at {addr}"))
}

fn name_of(value: u8, names: &[(u8, &'static str)]) -> String {
    names
        .iter()
        .find(|(code, _)| *code == value)
        .map_or_else(|| format!("unrecognized ({value})"), |(_, name)| name.to_string())
}

/// The discovery log as `nvme discover` prints it.
pub fn format_discovery(log: &DiscoveryLog) -> String {
    let mut text =
        format!("\nDiscovery Log Number of Records {}, Generation counter {}\n", log.entries.len(), log.generation);
    for (index, entry) in log.entries.iter().enumerate() {
        text += &format!("=====Discovery Log Entry {index}======\n");
        text += &format!(
            "trtype:  {}\n",
            name_of(entry.trtype, &[(DiscoveryEntry::TRTYPE_TCP, "tcp"), (1, "rdma"), (2, "fc")])
        );
        text += &format!("adrfam:  {}\n", name_of(entry.adrfam, &[(1, "ipv4"), (2, "ipv6")]));
        text += &format!(
            "subtype: {}\n",
            name_of(
                entry.subtype,
                &[(1, "discovery subsystem referral"), (2, "nvme subsystem"), (3, "current discovery subsystem")]
            )
        );
        text += &format!(
            "treq:    {}\n",
            name_of(entry.treq & 0b11, &[(0, "not specified"), (1, "required"), (2, "not required")])
        );
        text += &format!("portid:  {}\n", entry.portid);
        text += &format!("trsvcid: {}\n", entry.trsvcid);
        text += &format!("subnqn:  {}\n", entry.subnqn);
        text += &format!("traddr:  {}\n", entry.traddr);
        text += &format!("sectype: {}\n", name_of(entry.sectype, &[(0, "none"), (1, "tls13")]));
    }
    text
}

/// The discovery log as JSON, with nvme-cli's field names.
pub fn discovery_json(log: &DiscoveryLog) -> serde_json::Value {
    let records: Vec<serde_json::Value> = log
        .entries
        .iter()
        .map(|entry| {
            serde_json::json!({
                "trtype": if entry.trtype == DiscoveryEntry::TRTYPE_TCP { "tcp".to_string() } else { entry.trtype.to_string() },
                "adrfam": if entry.adrfam == 1 { "ipv4" } else { "ipv6" },
                "subtype": if entry.subtype == DiscoveryEntry::SUBTYPE_NVM { "nvme subsystem" } else { "current discovery subsystem" },
                "portid": entry.portid,
                "trsvcid": entry.trsvcid,
                "subnqn": entry.subnqn,
                "traddr": entry.traddr,
            })
        })
        .collect();
    serde_json::json!({ "genctr": log.generation, "records": records })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_nvme::target::NamespaceBackend;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn target_arguments_attach_namespaces_and_hosts_to_their_subsystem() {
        let config = parse_target_args(&args(
            "--listen 127.0.0.1:4420 --subsystem nqn.a --namespace memory:1GiB --allow-host nqn.h \
             --subsystem nqn.b --ns file:/tmp/x,size=8GiB --cpus 0,1 --busy-poll=200us",
        ))
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(config.subsystems.len(), 2);
        assert_eq!(config.subsystems[0].namespaces[0].backend, NamespaceBackend::Memory { bytes: 1 << 30 });
        assert_eq!(config.subsystems[0].allowed_hosts, vec!["nqn.h".to_string()]);
        assert!(config.subsystems[1].allowed_hosts.is_empty());
        assert_eq!(config.cpus, vec![0, 1]);
        assert_eq!(config.busy_poll, Duration::from_micros(200));
    }

    #[test]
    fn bad_target_arguments_say_what_is_wrong() {
        for (line, expected) in [
            ("--subsystem nqn.a --namespace memory:1g", "--listen"),
            ("--listen 127.0.0.1:1 --namespace memory:1g", "before any --subsystem"),
            ("--listen 127.0.0.1:1 --subsystem nqn.a", "no --namespace"),
            ("--listen 127.0.0.1:1 --subsystem nqn.a --namespace tape:1", "memory:SIZE"),
            ("--listen nowhere --subsystem nqn.a --namespace memory:1g", "ADDR:PORT"),
        ] {
            let error = parse_target_args(&args(line)).unwrap_err().to_string();
            assert!(error.contains(expected), "{line}: {error}");
        }
    }
}
