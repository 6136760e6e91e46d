//! The binaries' log: `tracing` events, one a line with their fields, on stderr. The filter comes from
//! `--log`, else `RUST_LOG`, else `info`. A log that cannot be written (a full disk, a closed pipe) is
//! dropped: logging must never stop a node.

use anyhow::Context;
use tracing_subscriber::EnvFilter;

/// Installs the process's log; `filter` is an `EnvFilter` directive such as `debug` or
/// `strata_engine=debug,info`.
pub fn init(filter: Option<&str>) -> anyhow::Result<()> {
    let filter = match filter {
        Some(directives) => EnvFilter::try_new(directives).with_context(|| format!("--log {directives:?}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        // Its own report of a failed write goes through `eprintln!`, which panics when stderr is full.
        .log_internal_errors(false)
        .try_init()
        .map_err(|error| anyhow::anyhow!("installing the log: {error}"))
}

/// Writes a line to stdout for the user to read, ignoring a failure to write it.
pub fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_fmt(line);
    let _ = stdout.write_all(b"\n");
    let _ = stdout.flush();
}
