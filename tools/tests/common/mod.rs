//! Running the `strata-node` binary from tests.

pub mod etcd;

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `strata-node` with `configure`'s arguments and waits (60 s at most) for its "ready" line; returns
/// the child, the rest of its stdout, and what it printed up to "ready".
#[allow(dead_code)]
pub fn start_until_ready(
    configure: impl FnOnce(&mut Command) -> &mut Command,
) -> (Child, Lines<BufReader<ChildStdout>>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strata-node"));
    configure(&mut command);
    start_command_until_ready(command)
}

/// [`start_until_ready`] inside network namespace `netns` (`ip netns exec`, which runs the node itself).
#[allow(dead_code)]
pub fn start_in_netns_until_ready(
    netns: &str,
    configure: impl FnOnce(&mut Command) -> &mut Command,
) -> (Child, Lines<BufReader<ChildStdout>>, String) {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", netns, env!("CARGO_BIN_EXE_strata-node")]);
    configure(&mut command);
    start_command_until_ready(command)
}

fn start_command_until_ready(mut command: Command) -> (Child, Lines<BufReader<ChildStdout>>, String) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("strata-node starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut summary = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in lines.by_ref() {
        let line = line.expect("line");
        summary += &line;
        summary.push('\n');
        if line.contains("ready") {
            break;
        }
        assert!(Instant::now() < deadline, "node did not become ready:\n{summary}");
    }
    assert!(summary.contains("ready"), "node exited before it was ready:\n{summary}");
    (child, lines, summary)
}

/// A node process, killed when dropped, so that a failing test leaves nothing running. (Each test binary
/// compiles this module; not every one uses every helper.)
#[allow(dead_code)]
pub struct NodeProcess(pub Child);

#[allow(dead_code)]
impl NodeProcess {
    /// Kills the node (SIGKILL) and reaps it; a second call does nothing more.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts node `id` of cluster `test` on the etcd at loopback port `etcd`: one shard on CPU 0, 64 MiB of DRAM
/// only, a 2 s lease, metrics on a free port, listening on `listen`, with `extra` flags after those.
#[allow(dead_code)]
pub fn start_cluster_node(id: &str, listen: u16, etcd: u16, extra: &[&str]) -> NodeProcess {
    let (child, _lines, summary) = start_until_ready(|command| {
        command
            .args([
                "--listen",
                &format!("127.0.0.1:{listen}"),
                "--metrics",
                &format!("127.0.0.1:{}", etcd::free_port()),
            ])
            .args(["--cores", "1", "--cpus", "0", "--dram", "64MiB", "--dram-only"])
            .args(["--cluster", &format!("etcd://127.0.0.1:{etcd}"), "--cluster-name", "test"])
            .args(["--node-id", id, "--lease-ttl", "2s"])
            .args(extra)
    });
    assert!(summary.contains(&format!("cluster: {id} in cluster test")), "{summary}");
    NodeProcess(child)
}

/// Waits (at most `limit`) until `watch`'s view serves exactly `ids`, and returns that view.
#[allow(dead_code)]
pub fn wait_for_view(
    watch: &strata_client::MembersWatch,
    ids: &[&str],
    limit: Duration,
) -> std::sync::Arc<strata_cluster::View> {
    let started = Instant::now();
    loop {
        let view = watch.view();
        let serving: Vec<&str> = view.serving().map(|member| member.id.as_str()).collect();
        if serving == ids {
            return view;
        }
        assert!(started.elapsed() < limit, "serving {serving:?}, waited for {ids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An empty directory of this test run, `name` and the process id under Cargo's scratch directory, removed
/// with everything in it when dropped: etcd's data directories alone are over 100 MB each, and a directory
/// left behind by every run filled the disk.
#[allow(dead_code)]
pub fn fresh_directory(name: &str) -> ScratchDirectory {
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).expect("directory");
    ScratchDirectory { path }
}

/// A directory removed when dropped (see `fresh_directory`).
pub struct ScratchDirectory {
    path: std::path::PathBuf,
}

impl std::ops::Deref for ScratchDirectory {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for ScratchDirectory {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ScratchDirectory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Waits (at most `limit`) until every one of `keys` reads back through a cluster client of `options`; a
/// read never returns other bytes than `value(index)`. Returns how long it took.
#[allow(dead_code)]
pub fn wait_until_readable(
    options: &strata_client::ClusterOptions,
    keys: &[Vec<u8>],
    value: impl Fn(usize) -> Vec<u8>,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    loop {
        let mut client = strata_client::Client::connect_cluster(options).expect("cluster client");
        let mut missing = 0;
        for (index, result) in client.batch_get(&refs).into_iter().enumerate() {
            match result {
                Ok(bytes) => assert!(bytes == value(index), "{}: wrong bytes", String::from_utf8_lossy(&keys[index])),
                Err(_) => missing += 1,
            }
        }
        if missing == 0 {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{missing} of {} keys still unreadable", keys.len());
        std::thread::sleep(Duration::from_millis(100));
    }
}
