//! `strata-node`'s configuration: flags, a TOML file (`--config`), and the embedded default, merged into
//! the engine's [`EngineConfig`]. Flags override the file; the file overrides the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use strata_engine::EngineConfig;
use strata_engine::tenants::TenantConfig;
use strata_nvme::DeviceSpec;
use strata_proto::WritePolicy;

use crate::byte_size::parse_byte_size;
use crate::cluster_settings::ClusterSettings;
use crate::file_dirs::ensure_parent_dir;
use crate::kv_events::{KvEventsConfig, KvEventsSettings};
use crate::pool::{PoolDescription, parse_duration};

/// Where the embedded default keeps its NVMe tier.
pub const DEFAULT_NVME: &str = "file:./strata-data/ns0.img,size=4GiB";

/// A tenant as the TOML file has it.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TenantSettings {
    /// Its name.
    pub name: String,
    /// Its clients' token.
    pub token: String,
    /// DRAM bytes its objects may take (whole node), e.g. "2GiB".
    pub dram_quota: Option<String>,
    /// NVMe bytes its objects may take.
    pub nvme_quota: Option<String>,
    /// Bytes of its objects that may be pinned.
    pub max_pinned: Option<String>,
}

/// The node's settings as flags and TOML keys have them (every field optional; the same names in both).
#[derive(Clone, Debug, Default, PartialEq, clap::Args, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeSettings {
    /// TOML file with any of these settings (flags given too override it).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Address of shard 0; shard i listens on port + i. [default: 127.0.0.1:7600]
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Shards (one pinned core each). [default: every CPU the process may use]
    #[arg(long)]
    pub cores: Option<usize>,
    /// CPUs to pin the shards to, e.g. 0,1 (implies --cores). [default: the first --cores CPUs the process
    /// may use, as taskset left them]
    #[arg(long, value_delimiter = ',')]
    pub cpus: Option<Vec<usize>>,
    /// DRAM tier, split evenly between shards. [default: 1GiB]
    #[arg(long)]
    pub dram: Option<String>,
    /// NVMe tier namespace (repeatable): file:PATH[,size=SIZE], nvmf:trtype=tcp,traddr=..,trsvcid=..,subnqn=..,ns=N
    /// (with, for that controller, any of nvme connect's hdr_digest, data_digest, queue_size=N, and in
    /// seconds keep_alive_tmo, ctrl_loss_tmo, reconnect_delay, and io_timeout: the command timeout), or
    /// memory:SIZE.
    /// [default: file:./strata-data/ns0.img,size=4GiB]
    #[arg(long)]
    pub nvme: Option<Vec<String>>,
    /// Pool description written by strata-pool create: its namespaces become the NVMe tier.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// Create the missing directories of `file:` namespaces given by --nvme (without it they are refused,
    /// naming the path; the embedded default's ./strata-data is always created).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub create_dirs: Option<bool>,
    /// No NVMe tier (DRAM only).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub dram_only: Option<bool>,
    /// Default write policy: write-through (ack from DRAM, written to NVMe right after), write-back (written
    /// to NVMe only when evicted), durable (ack after the NVMe write). [default: write-through]
    #[arg(long)]
    pub write_policy: Option<String>,
    /// Address for /metrics and /healthz, or "off". [default: 127.0.0.1:9600]
    #[arg(long)]
    pub metrics: Option<String>,
    /// Region size of the NVMe tier's log. [default: 16MiB]
    #[arg(long)]
    pub region_size: Option<String>,
    /// Erase the NVMe tier at start-up instead of recovering it.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub format: Option<bool>,
    /// Token clients must present in HELLO: a single tenant named "default" (none: the node is open;
    /// keep it on loopback). Several tenants, with quotas, are configured in the TOML file (`[[tenants]]`).
    #[arg(long)]
    pub token: Option<String>,
    /// Tenants (TOML only): `[[tenants]]` tables with `name`, `token`, and optional `dram-quota`,
    /// `nvme-quota`, `max-pinned` byte sizes for the whole node.
    #[arg(skip)]
    pub tenants: Option<Vec<TenantSettings>>,
    /// Use 2 MiB hugepages for DRAM when reserved (--hugepages=false: never). [default: true]
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub hugepages: Option<bool>,
    /// How long a read keeps an object from being evicted, e.g. 5s. [default: 5s]
    #[arg(long)]
    pub read_lease: Option<String>,
    /// Evict above this share of a tier's capacity. [default: 0.95]
    #[arg(long)]
    pub high_watermark: Option<f64>,
    /// Evict down to this share. [default: 0.90]
    #[arg(long)]
    pub low_watermark: Option<f64>,
    /// Busy-poll each shard this long before sleeping, e.g. 50us (lower latency, busier cores).
    #[arg(long)]
    pub spin_before_park: Option<String>,
    /// Promote an NVMe hit to DRAM when the object was hit within this window before (0s: never). [default: 60s]
    #[arg(long)]
    pub promote_window: Option<String>,
    /// NVMe-tier reads a shard keeps in flight at most (its queue depth on the device): a batch of gets
    /// reads its items from the tier together, up to this many at once. [default: 32]
    #[arg(long)]
    pub nvme_queue_depth: Option<usize>,
    /// Busy-poll client sockets (non-blocking system calls) and read file tiers on a ring the shard polls,
    /// instead of the reactor: lower latency per frame, and the setting for a node whose gets hit its NVMe
    /// tier at depth (docs/BENCHMARKS.md); a shard's core is kept busy while its clients are active
    /// (see --busy-poll-idle).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub busy_poll: Option<bool>,
    /// With --busy-poll, a connection with nothing to read for this long waits on the reactor until its
    /// next request, so a shard whose clients are all quiet sleeps; 0 polls for as long as a client is
    /// connected (SPDK style). [default: 1ms]
    #[arg(long)]
    pub busy_poll_idle: Option<String>,
    /// Offer clients on this host the shared-memory path (values copied between the node's DRAM and memory
    /// the client registered, requests over an abstract Unix socket); `--shared-memory false` turns it
    /// off. [default: true]
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub shared_memory: Option<bool>,
    /// Move values by RDMA on this device (as `ibv_devices` names it, e.g. mlx5_0 or rxe0) for clients that
    /// have one: gets are RDMA-written into, and puts RDMA-read from, memory the client registered. Needs a
    /// build with feature rdma (cargo build --release -p strata-tools --features rdma).
    #[arg(long)]
    pub rdma_device: Option<String>,
    /// Close a connection whose peer stalls mid-frame this long (a value or a progressive put's next part
    /// that stops arriving, a reply it stops reading), freeing what it held; 0s: never. [default: 30s]
    #[arg(long)]
    pub stall_timeout: Option<String>,
    /// A frame may wait on its peer this long before the minimum transfer rate applies. [default: 10s]
    #[arg(long)]
    pub frame_grace: Option<String>,
    /// Bytes per second a frame blocked on its peer must move after its grace, e.g. 1MiB (0: no minimum);
    /// a slower one is closed. [default: 1MiB]
    #[arg(long)]
    pub min_transfer_rate: Option<String>,
    /// Bytes of values still arriving, over all connections; a put past it is refused with QUOTA.
    /// [default: half the DRAM tier]
    #[arg(long)]
    pub max_partial_bytes: Option<String>,
    /// The same for each tenant. [default: half of --max-partial-bytes]
    #[arg(long)]
    pub tenant_max_partial_bytes: Option<String>,
    /// Open client connections; one more is refused with QUOTA. [default: 4096]
    #[arg(long)]
    pub max_connections: Option<u64>,
    /// Open connections of each tenant. [default: half of --max-connections]
    #[arg(long)]
    pub tenant_max_connections: Option<u64>,
    /// Where subscribers' event frames are written: `spare` (a thread per subscriber on the CPUs the process
    /// may use that no shard is pinned to, or the shards themselves if there are none), `inline` (the
    /// shards), or a CPU list such as 0,2-3 for those threads. [default: spare]
    #[arg(long)]
    pub event_cpus: Option<String>,
    /// vLLM's KV events publisher (`--kv-events ENDPOINT`, …; the `[kv-events]` table in the file).
    #[command(flatten)]
    #[serde(default)]
    pub kv_events: KvEventsSettings,
    /// Cluster membership on etcd (`--cluster etcd://…`, …; the `[cluster]` table in the file).
    #[command(flatten)]
    #[serde(default)]
    pub cluster: ClusterSettings,
}

impl NodeSettings {
    /// These settings over those of `file` (flags win).
    pub fn over(self, file: NodeSettings) -> NodeSettings {
        macro_rules! pick {
            ($($field:ident),*) => {
                NodeSettings {
                    config: self.config,
                    kv_events: self.kv_events.over(file.kv_events),
                    cluster: self.cluster.over(file.cluster),
                    $($field: self.$field.or(file.$field)),*
                }
            };
        }
        pick!(
            listen,
            cores,
            cpus,
            dram,
            nvme,
            pool,
            create_dirs,
            dram_only,
            write_policy,
            metrics,
            region_size,
            format,
            token,
            tenants,
            hugepages,
            read_lease,
            high_watermark,
            low_watermark,
            spin_before_park,
            busy_poll,
            busy_poll_idle,
            shared_memory,
            rdma_device,
            promote_window,
            nvme_queue_depth,
            stall_timeout,
            frame_grace,
            min_transfer_rate,
            max_partial_bytes,
            tenant_max_partial_bytes,
            max_connections,
            tenant_max_connections,
            event_cpus
        )
    }

    /// Reads `--config` (if given) and merges.
    pub fn resolve(self) -> anyhow::Result<NodeSettings> {
        let Some(path) = self.config.clone() else { return Ok(self) };
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let file: NodeSettings = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(self.over(file))
    }

    /// The KV events publisher these settings ask for, if any.
    pub fn kv_events_config(&self) -> anyhow::Result<Option<KvEventsConfig>> {
        let has_tenants = self.tenants.as_ref().is_some_and(|tenants| !tenants.is_empty());
        self.kv_events.config(self.token.as_deref(), has_tenants)
    }

    /// The engine configuration these settings describe.
    pub fn engine_config(&self) -> anyhow::Result<EngineConfig> {
        let mut config = EngineConfig::default();
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        // The CPUs `taskset` (or a cgroup) left the process: shards go there unless told otherwise.
        let allowed = strata_engine::node::allowed_cpus();
        config.cpus = match (&self.cpus, self.cores) {
            (Some(cpus), Some(cores)) if cpus.len() != cores => {
                bail!("--cpus lists {} CPUs but --cores is {cores}", cpus.len())
            }
            (Some(cpus), _) => cpus.clone(),
            (None, Some(cores)) => (0..cores).map(|core| allowed[core % allowed.len()]).collect(),
            (None, None) => allowed,
        };
        if let Some(dram) = &self.dram {
            config.dram_bytes = parse_byte_size(dram)?;
        }
        let size = |text: &str| parse_byte_size(text).ok();
        if self.dram_only == Some(true) {
            if self.nvme.is_some() || self.pool.is_some() {
                bail!("--dram-only contradicts --nvme / --pool");
            }
        } else if let Some(pool) = &self.pool {
            if self.nvme.is_some() {
                bail!("give either --nvme or --pool, not both");
            }
            let description = PoolDescription::load(pool)?;
            config.pool_uuid = Some(description.uuid_bytes()?);
            if description.namespaces.is_empty() {
                bail!("pool {:?} has no namespaces: strata-pool add one", description.name);
            }
            for namespace in &description.namespaces {
                config.nvme.push(DeviceSpec::parse(&namespace.spec, size)?);
            }
        } else {
            let create_dirs = self.create_dirs.unwrap_or(false) || self.nvme.is_none();
            let specs = self.nvme.clone().unwrap_or_else(|| vec![DEFAULT_NVME.to_string()]);
            for spec in specs {
                let parsed = DeviceSpec::parse(&spec, size)?;
                ensure_parent_dir(&parsed, create_dirs)?;
                config.nvme.push(parsed);
            }
        }
        if let Some(policy) = &self.write_policy {
            config.write_policy = WritePolicy::parse(policy)
                .with_context(|| format!("write policy {policy:?}: expected write-through, write-back or durable"))?;
        }
        match self.metrics.as_deref() {
            None => {}
            Some("off") => config.metrics = None,
            Some(addr) => config.metrics = Some(addr.parse().with_context(|| format!("metrics address {addr:?}"))?),
        }
        if let Some(region) = &self.region_size {
            config.region_bytes = parse_byte_size(region)?;
        }
        config.format = self.format.unwrap_or(false);
        if let Some(token) = &self.token {
            if self.tenants.is_some() {
                bail!("give either --token or [[tenants]], not both");
            }
            config.tenants.push(TenantConfig {
                name: "default".into(),
                token: token.as_bytes().to_vec(),
                dram_quota: None,
                nvme_quota: None,
                max_pinned: None,
            });
        }
        for tenant in self.tenants.iter().flatten() {
            let quota = |text: &Option<String>| text.as_deref().map(parse_byte_size).transpose();
            config.tenants.push(TenantConfig {
                name: tenant.name.clone(),
                token: tenant.token.as_bytes().to_vec(),
                dram_quota: quota(&tenant.dram_quota).with_context(|| format!("tenant {:?}", tenant.name))?,
                nvme_quota: quota(&tenant.nvme_quota).with_context(|| format!("tenant {:?}", tenant.name))?,
                max_pinned: quota(&tenant.max_pinned).with_context(|| format!("tenant {:?}", tenant.name))?,
            });
        }
        if let Some(hugepages) = self.hugepages {
            config.hugepages = hugepages;
        }
        if let Some(lease) = &self.read_lease {
            config.read_lease = parse_duration(lease)?;
        }
        if let Some(high) = self.high_watermark {
            config.high_watermark = high;
        }
        if let Some(low) = self.low_watermark {
            config.low_watermark = low;
        }
        if let Some(spin) = &self.spin_before_park {
            config.spin_before_park = Some(parse_duration(spin)?);
        }
        config.busy_poll = self.busy_poll.unwrap_or(false);
        if let Some(idle) = &self.busy_poll_idle {
            config.busy_poll_idle = parse_duration(idle)?;
        }
        config.shared_memory = self.shared_memory.unwrap_or(true);
        config.rdma_device = self.rdma_device.clone();
        if let Some(window) = &self.promote_window {
            config.promote_window = parse_duration(window)?;
        }
        if let Some(depth) = self.nvme_queue_depth {
            config.nvme_queue_depth = depth;
        }
        if let Some(timeout) = &self.stall_timeout {
            config.stall_timeout = parse_duration(timeout)?;
        }
        self.peer_limits(&mut config.peers)?;
        if let Some(cpus) = &self.event_cpus {
            config.event_cpus =
                strata_engine::config::EventCpus::parse(cpus).map_err(|why| anyhow::anyhow!("--event-cpus: {why}"))?;
        }
        config.validate().map_err(anyhow::Error::msg)?;
        Ok(config)
    }
}

impl NodeSettings {
    fn peer_limits(&self, limits: &mut strata_engine::peer_limits::PeerLimits) -> anyhow::Result<()> {
        if let Some(grace) = &self.frame_grace {
            limits.frame_grace = parse_duration(grace)?;
        }
        if let Some(rate) = &self.min_transfer_rate {
            limits.min_transfer_rate = parse_byte_size(rate).context("--min-transfer-rate")?;
        }
        let size = |text: &Option<String>, what: &str| {
            text.as_deref().map(parse_byte_size).transpose().with_context(|| what.to_string())
        };
        if let Some(bytes) = size(&self.max_partial_bytes, "--max-partial-bytes")? {
            limits.partial_frame_bytes = Some(bytes);
        }
        if let Some(bytes) = size(&self.tenant_max_partial_bytes, "--tenant-max-partial-bytes")? {
            limits.tenant_partial_frame_bytes = Some(bytes);
        }
        if let Some(count) = self.max_connections {
            limits.max_connections = count;
        }
        if let Some(count) = self.tenant_max_connections {
            limits.tenant_max_connections = Some(count);
        }
        Ok(())
    }
}

/// Blocks SIGINT, SIGTERM and SIGUSR1 (drain) in this thread (and the threads it starts afterwards), so
/// that [`wait_for_stop_signal_within`] receives them instead of the default handler killing the process.
pub fn block_stop_signals() -> anyhow::Result<()> {
    // SAFETY: sigset operations on a local set, and pthread_sigmask on the calling thread.
    #[allow(unsafe_code)]
    let result = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if result != 0 {
        bail!("blocking SIGINT/SIGTERM/SIGUSR1: error {result}");
    }
    Ok(())
}

/// Waits at most `limit` for SIGINT, SIGTERM or SIGUSR1; returns its name, or `None` when none came.
pub fn wait_for_stop_signal_within(limit: Duration) -> Option<&'static str> {
    let timeout = libc::timespec { tv_sec: limit.as_secs() as libc::time_t, tv_nsec: limit.subsec_nanos() as _ };
    // SAFETY: sigtimedwait on a local set of signals blocked by `block_stop_signals`, with a local timeout.
    #[allow(unsafe_code)]
    let signal = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout)
    };
    match signal {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGUSR1 => Some("SIGUSR1"),
        libc::SIGTERM => Some("SIGTERM"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        settings: NodeSettings,
    }

    #[test]
    fn every_flag_has_its_own_name_and_the_kv_events_table_reads_from_the_file() {
        Flags::command().debug_assert();
        let flags = Flags::try_parse_from(["strata-node", "--token", "t", "--kv-events", "tcp://127.0.0.1:5557"]);
        let settings = flags.map(|flags| flags.settings).unwrap();
        let file: NodeSettings =
            toml::from_str("[kv-events]\nreplay-endpoint = \"tcp://127.0.0.1:5558\"\ntopic = \"kv\"\n").unwrap();
        let config = settings.over(file).kv_events_config().unwrap().unwrap();
        assert_eq!(config.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(config.replay_endpoint.as_deref(), Some("tcp://127.0.0.1:5558"));
        assert_eq!((config.topic.as_str(), config.token.as_deref()), ("kv", Some(&b"t"[..])));
    }

    #[test]
    fn flags_override_the_file_and_defaults_fill_the_rest() {
        let file: NodeSettings = toml::from_str(
            "listen = \"127.0.0.1:7700\"\ndram = \"64MiB\"\nwrite-policy = \"durable\"\nnvme = [\"memory:64MiB\"]\ncores = 1\n",
        )
        .expect("toml");
        let flags = NodeSettings { dram: Some("32MiB".into()), ..NodeSettings::default() };
        let config = flags.over(file).engine_config().expect("config");
        assert_eq!(config.listen.port(), 7700);
        assert_eq!(config.dram_bytes, 32 << 20);
        assert_eq!(config.write_policy, WritePolicy::Durable);
        assert_eq!(config.nvme, vec![DeviceSpec::Memory { capacity_bytes: 64 << 20 }]);
        assert_eq!(config.cpus.len(), 1);
        assert!(strata_engine::node::allowed_cpus().contains(&config.cpus[0]), "shards go where the process may run");
        assert_eq!(config.metrics, EngineConfig::default().metrics);
        assert_eq!(config.event_cpus, strata_engine::config::EventCpus::Spare);
        let file: NodeSettings = toml::from_str("event-cpus = \"inline\"\ndram-only = true\n").expect("toml");
        assert_eq!(file.engine_config().expect("config").event_cpus, strata_engine::config::EventCpus::Inline);
        let flags = NodeSettings { event_cpus: Some("0-1".into()), dram_only: Some(true), ..NodeSettings::default() };
        assert_eq!(
            flags.engine_config().expect("config").event_cpus,
            strata_engine::config::EventCpus::These(vec![0, 1])
        );
        let bad = NodeSettings { event_cpus: Some("some".into()), dram_only: Some(true), ..NodeSettings::default() };
        assert!(bad.engine_config().is_err());
        assert_eq!(config.busy_poll_idle, strata_engine::config::DEFAULT_BUSY_POLL_IDLE);
        let file: NodeSettings =
            toml::from_str("busy-poll = true\nbusy-poll-idle = \"200us\"\ndram-only = true\n").unwrap();
        let config = file.engine_config().expect("config");
        assert!(config.busy_poll);
        assert_eq!(config.busy_poll_idle, std::time::Duration::from_micros(200));
    }

    #[test]
    fn contradictions_and_unknown_keys_are_refused() {
        assert!(toml::from_str::<NodeSettings>("colour = \"blue\"\n").is_err());
        let both =
            NodeSettings { dram_only: Some(true), nvme: Some(vec!["memory:1GiB".into()]), ..NodeSettings::default() };
        assert!(both.engine_config().is_err());
        let policy =
            NodeSettings { write_policy: Some("sometimes".into()), dram_only: Some(true), ..NodeSettings::default() };
        assert!(policy.engine_config().is_err());
    }

    #[test]
    fn tenants_come_from_the_file_with_their_quotas() {
        let file: NodeSettings = toml::from_str(
            "dram-only = true\n[[tenants]]\nname = \"a\"\ntoken = \"ta\"\ndram-quota = \"64MiB\"\n\n[[tenants]]\nname = \"b\"\ntoken = \"tb\"\n",
        )
        .expect("toml");
        let config = file.engine_config().expect("config");
        assert_eq!(config.tenants.len(), 2);
        assert_eq!(config.tenants[0].dram_quota, Some(64 << 20));
        assert_eq!(config.tenants[1].token, b"tb");
        let both = NodeSettings { token: Some("t".into()), ..file };
        assert!(both.engine_config().is_err());
        assert!(toml::from_str::<NodeSettings>("[[tenants]]\nname = \"a\"\n").is_err(), "a token is required");
    }

    #[test]
    fn a_file_namespace_in_a_missing_directory_is_refused_unless_create_dirs() {
        let root = std::env::temp_dir().join(format!("strata-node-dirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let spec = format!("file:{}/ns0.img,size=64MiB", root.join("typo").display());
        let settings = NodeSettings { nvme: Some(vec![spec]), ..NodeSettings::default() };
        let error = format!("{:#}", settings.clone().engine_config().expect_err("refused"));
        assert!(error.contains(&root.join("typo").display().to_string()), "names the path: {error}");
        assert!(!root.exists(), "nothing was created");
        let asked = NodeSettings { create_dirs: Some(true), ..settings };
        asked.engine_config().expect("created when asked");
        assert!(root.join("typo").is_dir());
        std::fs::remove_dir_all(&root).expect("cleanup");
    }
}
