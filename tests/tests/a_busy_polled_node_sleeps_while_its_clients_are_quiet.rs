//! A busy-polled node polls while its clients are active and sleeps while they are quiet: a connection
//! with nothing to read for `busy_poll_idle` waits on the reactor until its next request, over TCP and
//! over the shared-memory path, and that request is served as before. With `busy_poll_idle` zero the
//! same node spins for as long as its clients are connected, which is what shows the measure can tell.
//!
//! The shard's CPU time is its executor's threads' (`strata-shard-0-…` in `/proc/self/task`); this file
//! holds one test, so one node of this process at a time has them.

mod common;

use std::time::{Duration, Instant};

use common::{config, start, value_of};
use strata_client::{Client, ClientOptions, Transport};

/// CPU time of this process's threads named for shard 0's executor, from the kernel's ticks.
fn shard_cpu() -> Duration {
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").expect("tasks").flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let Some((name, rest)) = stat.split_once(") ") else { continue };
        // glommio names the executor's threads after it, with a suffix (`strata-shard-0-…`).
        if !name.split_once('(').is_some_and(|(_, name)| name.starts_with("strata-shard-0")) {
            continue;
        }
        // After the name: state is field 3 of stat(5); utime and stime are fields 14 and 15.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    }
    Duration::from_millis(ticks * 1000 / ticks_per_second)
}

/// The shard's share of one core over a second in which no client sends anything.
fn share_of_a_core_while_quiet() -> f64 {
    let (cpu, wall) = (shard_cpu(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    (shard_cpu() - cpu).as_secs_f64() / wall.elapsed().as_secs_f64()
}

#[test]
fn a_busy_polled_node_sleeps_while_its_clients_are_quiet_and_serves_their_next_requests() {
    for (idle, spins) in [(Duration::ZERO, true), (Duration::from_millis(1), false)] {
        let mut node_config = config(&[0], 32 << 20);
        node_config.busy_poll = true;
        node_config.busy_poll_idle = idle;
        let node = start(node_config);
        let tcp_only = ClientOptions { shared_memory: false, ..ClientOptions::default() };
        let mut tcp = Client::connect(node.local_addr(), tcp_only).expect("a TCP client");
        let mut local = Client::connect(node.local_addr(), ClientOptions::default()).expect("a local client");
        assert_eq!(local.shared_transport(), Transport::SharedMemory);
        let value = value_of(1, 70_000);
        tcp.put(b"over-tcp", &value).expect("a put over TCP");
        local.put(b"local", &value).expect("a put over the Unix socket");
        // Quiet past the limit, then measured.
        std::thread::sleep(Duration::from_millis(100));
        let share = share_of_a_core_while_quiet();
        if spins {
            assert!(share > 0.4, "polling for ever, the shard spun only {share:.2} of a core");
        } else {
            assert!(share < 0.2, "quiet clients kept the shard {share:.2} busy");
        }
        // The next requests wake the connections that wait on the reactor.
        for _ in 0..3 {
            assert_eq!(tcp.get(b"local").expect("a get over TCP"), value);
            assert_eq!(local.get(b"over-tcp").expect("a get over the Unix socket"), value);
            std::thread::sleep(Duration::from_millis(20));
        }
        drop((tcp, local));
        drop(node);
    }
}
