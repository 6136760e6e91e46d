//! Running the `strata-node` binary from tests.

pub mod etcd;

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `strata-node` with `configure`'s arguments and waits (60 s at most) for its "ready" line; returns
/// the child, the rest of its stdout, and what it printed up to "ready".
pub fn start_until_ready(
    configure: impl FnOnce(&mut Command) -> &mut Command,
) -> (Child, Lines<BufReader<ChildStdout>>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strata-node"));
    configure(&mut command);
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

/// An empty directory of this test run, `name` and the process id under Cargo's scratch directory.
#[allow(dead_code)]
pub fn fresh_directory(name: &str) -> std::path::PathBuf {
    let directory =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&directory);
    std::fs::create_dir_all(&directory).expect("directory");
    directory
}
