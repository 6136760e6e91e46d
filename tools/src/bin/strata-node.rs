//! `strata-node`: a Strata storage node. With no arguments it runs the embedded default: 1 GiB of DRAM
//! and a 4 GiB file-backed NVMe tier under ./strata-data, on 127.0.0.1:7600, metrics on 127.0.0.1:9600.

use std::sync::Arc;

use clap::Parser;
use strata_cluster::{ClusterConfig, Registration};
use strata_engine::EngineConfig;
use strata_engine::node::Node;
use strata_engine::reports::Reports;
use strata_tools::kv_events::KvEventsPublisher;
use strata_tools::logging::say;
use strata_tools::node::{NodeSettings, block_stop_signals, wait_for_stop_signal_within};
use strata_tools::rebalance::{Rebalancer, Subject};
use strata_tools::takeover::own::{claim_own_tier, remote_namespaces};
use strata_tools::takeover::{TakeoverConfig, Takeovers};

/// The longest a drain (SIGUSR1) moves keys before the node stops with what is left.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);
/// How often the node looks whether it was fenced off its tier, between signals.
const FENCE_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

#[derive(Parser, Debug)]
#[command(name = "strata-node", version, about = "A Strata storage node (KV cache store for LLM inference)")]
struct Cli {
    #[command(flatten)]
    settings: NodeSettings,
    /// Log filter, e.g. debug or strata_engine=debug,info (the log goes to stderr). [default: $RUST_LOG, else
    /// info]
    #[arg(long)]
    log: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    strata_tools::logging::init(cli.log.as_deref())?;
    let settings = cli.settings.resolve()?;
    let config = settings.engine_config()?;
    let kv_events = settings.kv_events_config()?;
    let cluster = settings.cluster.config()?;
    let rebalance = settings.cluster.rebalance_config()?;
    let tokens: Vec<Option<Vec<u8>>> = match config.tenants.is_empty() {
        true => vec![None],
        false => config.tenants.iter().map(|tenant| Some(tenant.token.clone())).collect(),
    };
    let mut config = config;
    let ownership = cluster.as_ref().map(|_| std::sync::Arc::new(strata_engine::ownership::Ownership::default()));
    config.ownership = ownership.clone();
    let reports = config.reports.clone();
    block_stop_signals()?;
    let (node, registration, template) = join_and_start(cluster.as_ref(), config, &reports)?;
    say(format_args!("{}", node.summary()));
    if node.summary().metrics.is_none() {
        say(format_args!("  (metrics off)"));
    }
    let publisher = kv_events.map(|config| KvEventsPublisher::start(config, node.summary().listen)).transpose()?;
    if let Some(publisher) = &publisher {
        say(format_args!("  kv events (vLLM KVEventBatch) on {}", publisher.endpoint()));
    }
    // The ownership feed first: the node answers MOVED under the membership it has seen, not before. Its
    // watch is the node's one members' watch: the rebalancer and the takeovers follow it too.
    if let (Some(registration), Some(ownership)) = (&registration, &ownership) {
        registration.report_absences_to(Arc::clone(ownership));
    }
    let ownership_feed = match (&cluster, ownership) {
        (Some(config), Some(ownership)) => Some(Arc::new(strata_cluster::feed_ownership(config, ownership)?)),
        _ => None,
    };
    let (rebalancer, takeovers) = match (&cluster, &ownership_feed) {
        (Some(config), Some(members)) => {
            let subject = Subject {
                cluster: config.clone(),
                local: node.summary().listen,
                tokens: tokens.clone(),
                reports: reports.clone(),
                members: Arc::clone(members),
            };
            let rebalancer = Rebalancer::start(rebalance.clone(), subject)?;
            let takeover = TakeoverConfig {
                cluster: config.clone(),
                template,
                replicas: rebalance.replicas,
                rate: rebalance.rate,
                tokens,
                reports: reports.clone(),
            };
            (Some(rebalancer), Some(Takeovers::start(takeover, Arc::clone(members))?))
        }
        _ => (None, None),
    };
    if let Some(registration) = &registration {
        registration.serve(node.metrics.clone());
    }
    say(format_args!("  ready; SIGINT or SIGTERM stops it cleanly, SIGUSR1 drains it first"));
    tracing::info!(listen = %node.summary().listen, shards = node.summary().cpus.len(), "serving");
    let signal = loop {
        let Some(signal) = wait_for_stop_signal_within(FENCE_CHECK) else {
            if fenced(&node, registration.as_ref()) {
                break "fenced";
            }
            continue;
        };
        if signal != "SIGUSR1" {
            break signal;
        }
        match (&registration, &rebalancer) {
            (Some(registration), Some(rebalancer)) => {
                drain(registration, rebalancer);
                break signal;
            }
            _ => say(format_args!("strata-node: SIGUSR1: not in a cluster, nothing to drain; serving on")),
        }
    };
    if signal == "fenced" {
        say(format_args!("strata-node: fenced: another node took its NVMe tier over; stopping without serving"));
        tracing::error!("fenced off the NVMe tier: stopping");
        // The tier is another node's now: nothing of it is flushed, nothing more is served.
        node.stop();
        std::process::exit(3);
    }
    say(format_args!("strata-node: {signal}: stopping (flushing open regions)"));
    tracing::info!(signal, "stopping");
    if let Some(takeovers) = takeovers {
        takeovers.stop();
    }
    if let Some(rebalancer) = rebalancer {
        rebalancer.stop();
    }
    if let Some(registration) = registration {
        registration.stop();
    }
    drop(ownership_feed);
    if let Some(publisher) = publisher {
        publisher.stop();
    }
    node.shutdown()?;
    say(format_args!("strata-node: stopped"));
    Ok(())
}

/// Whether the node lost its tier: a target refused its I/O with a reservation conflict, or its
/// registration found the tier's record claimed by another node.
fn fenced(node: &Node, registration: Option<&Registration>) -> bool {
    strata_engine::metrics::fenced(&node.metrics) || registration.is_some_and(Registration::fenced)
}

/// Marks the node draining, so placement leaves it out, and moves its keys to their replicas.
fn drain(registration: &Registration, rebalancer: &Rebalancer) {
    say(format_args!("strata-node: SIGUSR1: draining (moving every key to its replicas)"));
    registration.drain();
    match rebalancer.drain(DRAIN_LIMIT) {
        Some(report) if report.complete => {
            say(format_args!("strata-node: drained: {} keys moved", report.moved.removed));
        }
        Some(report) => say(format_args!(
            "strata-node: drain incomplete: {} keys moved, {} left (no replica took them)",
            report.moved.removed, report.moved.left
        )),
        None => say(format_args!("strata-node: drain did not end within {DRAIN_LIMIT:?}; stopping anyway")),
    }
}

/// Starts the node: in a cluster, it registers first (as joining, so no survivor takes its tier over while
/// it starts), then claims its tier (fencing the previous holder) before a byte of it is recovered; a failure
/// withdraws the entry. Returns the node, its registration and the engine settings it started with.
fn join_and_start(
    cluster: Option<&ClusterConfig>,
    mut config: EngineConfig,
    reports: &Reports,
) -> anyhow::Result<(Node, Option<Registration>, EngineConfig)> {
    let Some(cluster) = cluster else {
        let template = config.clone();
        return Ok((strata_engine::start(config)?, None, template));
    };
    let registration = register(cluster.clone(), &config, reports.clone())?;
    let limit = cluster.lease_ttl.max(std::time::Duration::from_secs(2));
    // A tier on shared namespaces is claimed only once the joining entry is in etcd.
    let entered = remote_namespaces(&config.nvme).is_empty() || registration.wait_registered(limit);
    let started = if entered {
        claim_own_tier(cluster, &mut config)
    } else {
        Err(anyhow::anyhow!("etcd took no entry within {limit:?}"))
    };
    let started = started.and_then(|tier| {
        if let Some(tier) = tier {
            registration.hold_tier(tier);
        }
        let template = config.clone();
        Ok((strata_engine::start(config)?, template))
    });
    match started {
        Ok((node, template)) => Ok((node, Some(registration), template)),
        Err(error) => {
            registration.stop();
            Err(error)
        }
    }
}

/// Starts the node's registration in its cluster, as joining: its shards' addresses (shard i on port + i).
fn register(config: ClusterConfig, engine: &EngineConfig, reports: Reports) -> anyhow::Result<Registration> {
    let listen = engine.listen;
    if listen.ip().is_unspecified() || listen.port() == 0 {
        anyhow::bail!("--cluster needs --listen on an address and port other nodes and clients reach, not {listen}");
    }
    let shards = (0..engine.cpus.len() as u16)
        .map(|shard| std::net::SocketAddr::new(listen.ip(), listen.port() + shard))
        .collect();
    let label = format!("{} in cluster {} (etcd {})", config.node_id, config.cluster, config.endpoints.join(","));
    let registration = Registration::start(config, shards, reports)?;
    say(format_args!("  cluster: {label}"));
    Ok(registration)
}
