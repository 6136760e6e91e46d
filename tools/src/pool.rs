//! `strata-pool`: the NVMe-oF pool tool: `target` (serve subsystems over NVMe/TCP), `discover` (print a
//! discovery log as `nvme discover` does), and the pool itself — `create`, `add`, `remove`, `status` — over
//! local files or devices (`file:PATH`) and remote namespaces (`nvmf:trtype=tcp,...`), recorded in a pool
//! description file (TOML) that the storage node reads.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use strata_nvme::host::{HostOptions, resolve};
use strata_nvme::spec::{DiscoveryEntry, DiscoveryLog};
use strata_nvme::target::{NamespaceConfig, SubsystemConfig, TargetConfig};
use strata_nvme::{AnyDevice, BlockDevice};

use crate::byte_size::parse_byte_size;

/// Usage of `strata-pool target`.
pub const TARGET_USAGE: &str = "\
strata-pool target --config TARGET.toml   (the same settings as a file; see strata_tools::pool docs)
strata-pool target --listen ADDR:PORT [--listen rdma:IPV4:PORT] --subsystem NQN --namespace SPEC
                   [--namespace SPEC ...] [--allow-host HOSTNQN ...] [--subsystem NQN ...] [--cpus 0,1]
                   [--busy-poll 200us] [--tcp-congestion reno]
  SPEC: memory:SIZE | file:PATH[,size=SIZE][,block=512|4096]   (sizes: 1GiB, 512m, ...)
  --namespace and --allow-host apply to the --subsystem before them; without --allow-host any host may connect.
  --listen rdma:IPV4:PORT: NVMe/RDMA beside NVMe/TCP, on the RDMA device that owns IPV4 (builds with
    feature rdma); the TCP --listen is still required.
  --busy-poll: how long an idle core spins before sleeping; non-zero also busy-polls the sockets (SPDK style).
  --tcp-congestion: congestion control of accepted connections (default: the system's; pacing ones such
    as bbr cap deep queues on loopback).";

/// Parses `strata-pool target` arguments (order matters: namespaces and hosts follow their subsystem).
pub fn parse_target_args(args: &[String]) -> anyhow::Result<TargetConfig> {
    let mut listen: Option<SocketAddr> = None;
    let mut rdma_listen = None;
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
                if text.starts_with("rdma:") {
                    rdma_listen = Some(parse_rdma_listen(&text)?);
                    continue;
                }
                let text = text.strip_prefix("tcp:").unwrap_or(&text).to_string();
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
    Ok(TargetConfig { cpus, busy_poll, tcp_congestion, rdma_listen, ..TargetConfig::new(listen, subsystems) })
}

/// `rdma:IPV4:PORT`: RDMA_CM binds IPv4 addresses of an RDMA device's interface.
fn parse_rdma_listen(text: &str) -> anyhow::Result<std::net::SocketAddrV4> {
    text.strip_prefix("rdma:")
        .and_then(|address| address.parse().ok())
        .ok_or_else(|| anyhow!("--listen {text}: expected rdma:IPV4:PORT (an address of the RDMA device's interface)"))
}

/// A target configuration file (`strata-pool target --config FILE`):
///
/// ```toml
/// listen = "127.0.0.1:4420"
/// rdma_listen = "10.0.0.1:4420"   # optional: NVMe/RDMA too (feature rdma)
/// cpus = [0, 1]              # optional, default [0]
/// busy_poll = "200us"        # optional, default 0
/// tcp_congestion = "reno"    # optional, default: the system's
/// [[subsystem]]
/// nqn = "nqn.2026-12.io.strata:pool"
/// namespaces = ["memory:1GiB", "file:/var/tmp/ns.img,size=8GiB"]
/// allow_hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."]   # optional: any host when absent
/// ```
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetFile {
    listen: String,
    #[serde(default)]
    rdma_listen: Option<String>,
    #[serde(default)]
    cpus: Option<Vec<usize>>,
    #[serde(default)]
    busy_poll: Option<String>,
    #[serde(default)]
    tcp_congestion: Option<String>,
    #[serde(default)]
    subsystem: Vec<SubsystemFile>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SubsystemFile {
    nqn: String,
    namespaces: Vec<String>,
    #[serde(default)]
    allow_hosts: Vec<String>,
}

/// Reads a target configuration file into the same command line `target` takes, so both paths are
/// checked by one parser.
pub fn target_args_from_file(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let file: TargetFile = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let mut args = vec!["--listen".to_string(), file.listen];
    if let Some(address) = file.rdma_listen {
        args.extend(["--listen".to_string(), format!("rdma:{address}")]);
    }
    if let Some(cpus) = file.cpus {
        args.push("--cpus".into());
        args.push(cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
    }
    if let Some(busy_poll) = file.busy_poll {
        args.extend(["--busy-poll".to_string(), busy_poll]);
    }
    if let Some(algorithm) = file.tcp_congestion {
        args.extend(["--tcp-congestion".to_string(), algorithm]);
    }
    for subsystem in file.subsystem {
        args.extend(["--subsystem".to_string(), subsystem.nqn]);
        for namespace in subsystem.namespaces {
            args.extend(["--namespace".to_string(), namespace]);
        }
        for host in subsystem.allow_hosts {
            args.extend(["--allow-host".to_string(), host]);
        }
    }
    Ok(args)
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
    run_on_executor(move || async move {
        strata_nvme::host::discover(addr, &options).await.with_context(|| format!("discovery at {addr}"))
    })
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
        if entry.trtype == DiscoveryEntry::TRTYPE_RDMA {
            text += &format!("rdma_cms: {}\n", name_of(entry.tsas[2], &[(1, "rdma-cm")]));
        } else {
            text += &format!("sectype: {}\n", name_of(entry.tsas[0], &[(0, "none"), (1, "tls13")]));
        }
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
                "trtype": match entry.trtype {
                    DiscoveryEntry::TRTYPE_TCP => "tcp".to_string(),
                    DiscoveryEntry::TRTYPE_RDMA => "rdma".to_string(),
                    other => other.to_string(),
                },
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

/// The pool description file: what the storage node reads to find its NVMe tier.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolDescription {
    /// The pool's name.
    pub name: String,
    /// The pool's UUID, also in every namespace's superblock.
    pub uuid: String,
    /// Its namespaces.
    #[serde(default)]
    pub namespaces: Vec<PoolNamespace>,
}

/// One namespace of a pool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolNamespace {
    /// Its index in the pool (as in its superblock).
    pub index: u32,
    /// Where it is: `file:PATH[,size=SIZE]` or `nvmf:trtype=tcp,traddr=...,trsvcid=...,subnqn=...,ns=N`.
    pub spec: String,
    /// What it holds.
    pub role: String,
    /// Capacity when formatted.
    pub capacity_bytes: u64,
    /// Logical block size.
    pub block_bytes: u64,
}

impl PoolDescription {
    /// Reads a description file.
    pub fn load(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Writes it (to a temporary file renamed over the old one, so a crash leaves one or the other).
    pub fn save(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let text = format!("# Strata pool description, written by strata-pool.\n{}", toml::to_string_pretty(self)?);
        let temporary = path.with_extension("toml.tmp");
        std::fs::write(&temporary, text).with_context(|| format!("writing {}", temporary.display()))?;
        std::fs::rename(&temporary, path).with_context(|| format!("renaming to {}", path.display()))
    }

    /// The pool UUID as bytes.
    pub fn uuid_bytes(&self) -> anyhow::Result<[u8; 16]> {
        let hex: String = self.uuid.chars().filter(|c| *c != '-').collect();
        let mut uuid = [0u8; 16];
        if hex.len() != 32 {
            bail!("pool UUID {:?} is not a UUID", self.uuid);
        }
        for (index, byte) in uuid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * index..2 * index + 2], 16)
                .map_err(|_| anyhow!("pool UUID {:?} is not a UUID", self.uuid))?;
        }
        Ok(uuid)
    }
}

/// Opens a pool namespace spec on the current executor (keep-alive off: the tool's connections are short).
async fn open_namespace(spec: &str) -> anyhow::Result<AnyDevice> {
    let parsed = strata_nvme::DeviceSpec::parse(spec, |size| parse_byte_size(size).ok())?;
    if matches!(parsed, strata_nvme::DeviceSpec::Memory { .. }) {
        bail!("namespace {spec:?}: a pool needs file: or nvmf: namespaces (memory: would vanish with the tool)");
    }
    let options = HostOptions { keep_alive_ms: 0, ..HostOptions::default() };
    Ok(AnyDevice::open(&parsed, &options).await?)
}

/// Deallocates everything after block 0, showing progress on a terminal.
async fn wipe(device: &AnyDevice, spec: &str, show_progress: bool) -> anyhow::Result<()> {
    let geometry = device.geometry();
    let chunk = (1u64 << 30) / geometry.logical_block_bytes * geometry.logical_block_bytes;
    let mut at = block0_len(&geometry) as u64;
    while at < geometry.capacity_bytes {
        let len = chunk.min(geometry.capacity_bytes - at);
        device.deallocate(at, len).await?;
        at += len;
        if show_progress {
            eprint!("\r\x1b[Kformatting {spec}: {:.0}%", 100.0 * at as f64 / geometry.capacity_bytes as f64);
        }
    }
    if show_progress {
        eprint!("\r\x1b[K");
    }
    Ok(())
}

use strata_nvme::superblock::{NamespaceRole, PoolSuperblock, block0_len, read_superblock, uuid_text, write_block0};

/// Runs `work` on a glommio executor of its own (the NVMe-oF host is glommio's) and waits for it.
pub(crate) fn run_on_executor<T: Send + 'static, F: Future<Output = anyhow::Result<T>> + 'static>(
    work: impl FnOnce() -> F + Send + 'static,
) -> anyhow::Result<T> {
    glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("strata-pool")
        .io_memory(4 << 20)
        .spawn(work)
        .map_err(|error| anyhow!("starting an executor: {error}"))?
        .join()
        .map_err(|error| anyhow!("pool executor: {error:?}"))?
}

fn new_uuid() -> anyhow::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .context("reading a UUID from the kernel")?
        .trim()
        .to_string())
}

/// How `create` and `add` treat the namespaces they are given.
#[derive(Clone, Copy, Debug, Default)]
pub struct FormatOptions {
    /// Take namespaces that belong to another pool, or whose superblock is damaged.
    pub force: bool,
    /// Create the missing directories of `file:` namespaces (otherwise they are refused, naming the path).
    pub create_dirs: bool,
    /// Show the wipe's progress on stderr.
    pub show_progress: bool,
}

/// Formats `specs` as namespaces `first_index..` of `pool`: refuses a namespace that belongs to another
/// pool (or whose superblock is damaged) unless `force`, wipes it, writes its superblock.
fn format_namespaces(
    pool: &PoolDescription,
    specs: Vec<String>,
    first_index: u32,
    count: u32,
    options: FormatOptions,
) -> anyhow::Result<Vec<PoolNamespace>> {
    let uuid = pool.uuid_bytes()?;
    let name = pool.name.clone();
    let FormatOptions { force, create_dirs, show_progress } = options;
    for spec in &specs {
        let parsed = strata_nvme::DeviceSpec::parse(spec, |size| parse_byte_size(size).ok())?;
        crate::file_dirs::ensure_parent_dir(&parsed, create_dirs)?;
    }
    run_on_executor(move || async move {
        let mut devices = Vec::new();
        // Check every namespace before changing any, so a refusal leaves them all as they were.
        for spec in &specs {
            let device = open_namespace(spec).await.with_context(|| format!("opening {spec}"))?;
            match read_superblock(&device).await? {
                Ok(found) if found.pool_uuid != uuid && !force => bail!(
                    "{spec} belongs to pool {:?} ({}); add --force to take it into {name:?}",
                    found.pool_name,
                    uuid_text(&found.pool_uuid)
                ),
                Err(strata_nvme::superblock::SuperblockError::NotFormatted) => {}
                Err(error) if !force => bail!("{spec}: {error}; add --force to format it anyway"),
                _ => {}
            }
            devices.push((spec.clone(), device));
        }
        let formatted_at =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_secs());
        let mut namespaces = Vec::new();
        for (offset, (spec, device)) in devices.into_iter().enumerate() {
            let geometry = device.geometry();
            wipe(&device, &spec, show_progress).await?;
            let superblock = PoolSuperblock {
                pool_name: name.clone(),
                pool_uuid: uuid,
                index: first_index + offset as u32,
                count,
                role: NamespaceRole::Data,
                block_bytes: geometry.logical_block_bytes,
                capacity_bytes: geometry.capacity_bytes,
                formatted_at,
            };
            write_block0(&device, &superblock.encode()).await?;
            namespaces.push(PoolNamespace {
                index: superblock.index,
                spec,
                role: "data".into(),
                capacity_bytes: geometry.capacity_bytes,
                block_bytes: geometry.logical_block_bytes,
            });
        }
        Ok(namespaces)
    })
}

/// `strata-pool create NAME --ns SPEC ... [--force] [--create-dirs] [--out FILE]`.
pub fn create(
    name: &str,
    specs: Vec<String>,
    out: &std::path::Path,
    options: FormatOptions,
) -> anyhow::Result<PoolDescription> {
    if name.is_empty() || name.len() > strata_nvme::superblock::POOL_NAME_MAX_BYTES || name.contains('\0') {
        bail!("pool name must be 1 to {} bytes", strata_nvme::superblock::POOL_NAME_MAX_BYTES);
    }
    if specs.is_empty() {
        bail!("a pool needs at least one --ns SPEC");
    }
    if out.exists() && !options.force {
        bail!("{} exists; add --force to replace it", out.display());
    }
    let mut pool = PoolDescription { name: name.into(), uuid: new_uuid()?, namespaces: Vec::new() };
    let count = specs.len() as u32;
    pool.namespaces = format_namespaces(&pool, specs, 0, count, options)?;
    pool.save(out)?;
    Ok(pool)
}

/// `strata-pool add FILE --ns SPEC ...`: formats more namespaces into the pool.
pub fn add(
    description: &std::path::Path,
    specs: Vec<String>,
    options: FormatOptions,
) -> anyhow::Result<PoolDescription> {
    let mut pool = PoolDescription::load(description)?;
    if let Some(spec) = specs.iter().find(|spec| pool.namespaces.iter().any(|namespace| &namespace.spec == *spec)) {
        bail!("{spec} is already in pool {:?}", pool.name);
    }
    let first = pool.namespaces.iter().map(|namespace| namespace.index + 1).max().unwrap_or(0);
    let count = pool.namespaces.len() as u32 + specs.len() as u32;
    let added = format_namespaces(&pool, specs, first, count, options)?;
    pool.namespaces.extend(added);
    pool.save(description)?;
    Ok(pool)
}

/// `strata-pool remove FILE --ns SPEC`: takes a namespace out of the pool and clears its superblock.
pub fn remove(description: &std::path::Path, spec: &str) -> anyhow::Result<PoolDescription> {
    let mut pool = PoolDescription::load(description)?;
    let before = pool.namespaces.len();
    pool.namespaces.retain(|namespace| namespace.spec != spec);
    if pool.namespaces.len() == before {
        bail!("{spec} is not in pool {:?}", pool.name);
    }
    let uuid = pool.uuid_bytes()?;
    let target = spec.to_string();
    run_on_executor(move || async move {
        let device = open_namespace(&target).await?;
        // Clear only our own superblock: never destroy another pool's by a wrong spec.
        if let Ok(found) = read_superblock(&device).await?
            && found.pool_uuid == uuid
        {
            write_block0(&device, &[0u8; 8]).await?;
        }
        Ok(())
    })?;
    pool.save(description)?;
    Ok(pool)
}

/// One namespace's state for `status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NamespaceStatus {
    /// Index in the pool.
    pub index: u32,
    /// Where it is.
    pub spec: String,
    /// Whether it could be opened.
    pub reachable: bool,
    /// Capacity now (0 when unreachable).
    pub capacity_bytes: u64,
    /// Bytes the storage node uses; `None` until a node has written its region log there.
    pub used_bytes: Option<u64>,
    /// `ok`, or what is wrong (unreachable, not formatted, another pool's, shrunk, ...).
    pub state: String,
}

/// `strata-pool status FILE`: reachability, capacity and state of every namespace.
pub fn status(description: &std::path::Path) -> anyhow::Result<(PoolDescription, Vec<NamespaceStatus>)> {
    let pool = PoolDescription::load(description)?;
    let uuid = pool.uuid_bytes()?;
    let namespaces = pool.namespaces.clone();
    let statuses = run_on_executor(move || async move {
        let mut statuses = Vec::new();
        for namespace in namespaces {
            let mut status = NamespaceStatus {
                index: namespace.index,
                spec: namespace.spec.clone(),
                reachable: false,
                capacity_bytes: 0,
                used_bytes: None,
                state: String::new(),
            };
            match open_namespace(&namespace.spec).await {
                Err(error) => status.state = format!("unreachable: {error:#}"),
                Ok(device) => {
                    status.reachable = true;
                    status.capacity_bytes = device.geometry().capacity_bytes;
                    status.state = match read_superblock(&device).await {
                        Err(error) => format!("read failed: {error:#}"),
                        Ok(Err(error)) => error.to_string(),
                        Ok(Ok(found)) if found.pool_uuid != uuid => format!("belongs to pool {:?}", found.pool_name),
                        Ok(Ok(found)) if found.index != namespace.index => {
                            format!("superblock says index {}", found.index)
                        }
                        Ok(Ok(_)) if status.capacity_bytes < namespace.capacity_bytes => {
                            "smaller than when formatted".into()
                        }
                        Ok(Ok(_)) => "ok".into(),
                    };
                }
            }
            statuses.push(status);
        }
        Ok(statuses)
    })?;
    Ok((pool, statuses))
}

/// The status as a table.
pub fn format_status(pool: &PoolDescription, statuses: &[NamespaceStatus]) -> String {
    let mut text = format!("pool {} ({}), {} namespaces\n", pool.name, pool.uuid, statuses.len());
    text += &format!(
        "{:<5} {:<10} {:>14} {:>10}  {:<24} {}\n",
        "index", "reachable", "capacity", "used", "state", "namespace"
    );
    for status in statuses {
        let used = status.used_bytes.map_or_else(|| "-".to_string(), |used| used.to_string());
        text += &format!(
            "{:<5} {:<10} {:>14} {:>10}  {:<24} {}\n",
            status.index,
            if status.reachable { "yes" } else { "no" },
            status.capacity_bytes,
            used,
            status.state,
            status.spec
        );
    }
    text
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
        assert_eq!(config.rdma_listen, None);
    }

    #[test]
    fn an_rdma_listener_is_named_beside_the_tcp_one() {
        let config = parse_target_args(&args(
            "--listen rdma:10.0.2.15:4420 --listen tcp:127.0.0.1:4420 --subsystem nqn.a --namespace memory:1GiB",
        ))
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(config.rdma_listen, Some("10.0.2.15:4420".parse().unwrap()));
        let only_rdma =
            parse_target_args(&args("--listen rdma:10.0.2.15:4420 --subsystem nqn.a --namespace memory:1g"));
        assert!(only_rdma.unwrap_err().to_string().contains("--listen ADDR:PORT is required"));
        let named =
            parse_target_args(&args("--listen rdma:[::1]:4420 --listen 127.0.0.1:1 --subsystem a --ns memory:1g"));
        assert!(named.unwrap_err().to_string().contains("rdma:IPV4:PORT"));
    }

    #[test]
    fn a_target_file_says_what_the_command_line_says() {
        let path = std::env::temp_dir().join(format!("strata-target-{}.toml", std::process::id()));
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:4420\"\ncpus = [0, 1]\nbusy_poll = \"200us\"\n[[subsystem]]\nnqn = \"nqn.a\"\n\
             namespaces = [\"memory:1GiB\"]\nallow_hosts = [\"nqn.h\"]\n[[subsystem]]\nnqn = \"nqn.b\"\n\
             namespaces = [\"file:/tmp/x,size=8GiB\"]\n",
        )
        .unwrap();
        let from_file = parse_target_args(&target_args_from_file(&path).unwrap()).unwrap();
        let from_line = parse_target_args(&args(
            "--listen 127.0.0.1:4420 --subsystem nqn.a --namespace memory:1GiB --allow-host nqn.h \
             --subsystem nqn.b --ns file:/tmp/x,size=8GiB --cpus 0,1 --busy-poll=200us",
        ))
        .unwrap();
        assert_eq!(from_file.subsystems, from_line.subsystems);
        assert_eq!((from_file.cpus, from_file.busy_poll), (from_line.cpus, from_line.busy_poll));
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\nrdma_listen = \"10.0.2.15:4420\"\n[[subsystem]]\nnqn = \"a\"\nnamespaces = [\"memory:1g\"]\n").unwrap();
        let rdma = parse_target_args(&target_args_from_file(&path).unwrap()).unwrap();
        assert_eq!(rdma.rdma_listen, Some("10.0.2.15:4420".parse().unwrap()));
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\nlisten_twice = 1\n").unwrap();
        assert!(target_args_from_file(&path).unwrap_err().to_string().contains("parsing"));
        std::fs::remove_file(&path).unwrap();
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
