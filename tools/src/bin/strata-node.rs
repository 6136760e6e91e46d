//! `strata-node`: a Strata storage node. With no arguments it runs the embedded default: 1 GiB of DRAM
//! and a 4 GiB file-backed NVMe tier under ./strata-data, on 127.0.0.1:7600, metrics on 127.0.0.1:9600.

use clap::Parser;
use strata_tools::node::{NodeSettings, block_stop_signals, wait_for_stop_signal};

#[derive(Parser, Debug)]
#[command(name = "strata-node", version, about = "A Strata storage node (KV cache store for LLM inference)")]
struct Cli {
    #[command(flatten)]
    settings: NodeSettings,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = cli.settings.resolve()?.engine_config()?;
    block_stop_signals()?;
    let node = strata_engine::start(config)?;
    println!("{}", node.summary());
    if node.summary().metrics.is_none() {
        println!("  (metrics off)");
    }
    println!("  ready; SIGINT or SIGTERM stops it cleanly");
    let signal = wait_for_stop_signal();
    println!("strata-node: {signal}: stopping (flushing open regions)");
    node.shutdown()?;
    println!("strata-node: stopped");
    Ok(())
}
