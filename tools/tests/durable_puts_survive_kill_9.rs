//! Every put the node acknowledged in `durable` mode is readable, bit-exact, after the node is killed with
//! SIGKILL in the middle of a stream of durable puts and restarted; a put that was in flight is either
//! absent or whole, never torn. A frame of removals acknowledged just before another SIGKILL stays
//! removed.

mod common;

use std::time::{Duration, Instant};

use strata_client::{Client, ClientError, ClientOptions, PutOptions, WritePolicy};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn value_of(index: u64) -> Vec<u8> {
    let len = 1000 + (index as usize * 7919) % (8 << 10);
    (0..len).map(|at| (index as usize * 31 + at * 7) as u8).collect()
}

fn key_of(index: u64) -> Vec<u8> {
    format!("durable/{index}").into_bytes()
}

/// Starts the node and waits for its "ready" line; returns it with its start-up summary.
fn start_node(port: u16, image: &std::path::Path) -> (common::NodeProcess, String) {
    let (child, lines, summary) = common::start_until_ready(|command| {
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "--cores", "1", "--dram", "64MiB", "--metrics", "off"])
            .args(["--nvme", &format!("file:{},size=128MiB", image.display()), "--write-policy", "durable"])
            .args(["--region-size", "1MiB", "--hugepages=false"])
    });
    // Keep draining stdout so the node never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (common::NodeProcess(child), summary)
}

#[test]
fn acknowledged_durable_puts_survive_sigkill() {
    let directory = common::fresh_directory("kill-9");
    let image = directory.join("ns0.img");
    let port = free_port();
    let (mut node, _) = start_node(port, &image);

    let progress = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let acknowledged_so_far = std::sync::Arc::clone(&progress);
    let writer = std::thread::spawn(move || {
        let mut client = Client::connect(("127.0.0.1", port), ClientOptions::default()).expect("connect");
        let mut acknowledged = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut index = 0u64;
        let mut bytes = 0usize;
        // Bounded by count, bytes (well inside the tier, so that no region is reclaimed: durable is not
        // "never evicted") and time; ends when the node is killed.
        while index < 1_000_000 && bytes < 48 << 20 && Instant::now() < deadline {
            // Alternate single puts and batches of 8, so some syncs are group commits.
            let count = if index.is_multiple_of(3) { 8 } else { 1 };
            let owned: Vec<(Vec<u8>, Vec<u8>)> = (index..index + count).map(|i| (key_of(i), value_of(i))).collect();
            let items: Vec<(&[u8], &[u8])> = owned.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            bytes += owned.iter().map(|(_, value)| value.len()).sum::<usize>();
            let durable = PutOptions { policy: Some(WritePolicy::Durable), ..PutOptions::default() };
            let results = client.batch_put_with(&items, durable);
            let mut failed = false;
            for (offset, result) in results.into_iter().enumerate() {
                match result {
                    Ok(()) => {
                        acknowledged.push(index + offset as u64);
                        acknowledged_so_far.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Err(_) => failed = true,
                }
            }
            index += count;
            if failed {
                return (acknowledged, index, true);
            }
        }
        (acknowledged, index, false)
    });
    // Kill in the middle of the stream: once a few thousand puts are acknowledged, long before the writer's
    // byte budget runs out.
    let deadline = Instant::now() + Duration::from_secs(60);
    while progress.load(std::sync::atomic::Ordering::SeqCst) < 2000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    node.kill();
    let (acknowledged, attempted, cut_by_the_kill) = writer.join().expect("writer");
    assert!(acknowledged.len() > 50, "only {} puts acknowledged before the kill", acknowledged.len());
    assert!(cut_by_the_kill, "the writer finished before the kill ({attempted} puts): nothing was in flight");

    let (mut node, summary) = start_node(port, &image);
    let mut client = Client::connect(("127.0.0.1", port), ClientOptions::default()).expect("connect");
    for &index in &acknowledged {
        match client.get(&key_of(index)) {
            Ok(value) => assert!(value == value_of(index), "key {index} came back with other bytes"),
            Err(error) => panic!("acknowledged key {index} lost: {error}\n{summary}"),
        }
    }
    let last_acknowledged = acknowledged.iter().max().copied().unwrap_or(0);
    for index in last_acknowledged + 1..attempted {
        match client.get(&key_of(index)) {
            Ok(value) => assert!(value == value_of(index), "in-flight key {index} is torn"),
            Err(ClientError::NotFound) => {}
            Err(error) => panic!("in-flight key {index}: {error}"),
        }
    }
    assert!(summary.contains("recovered"), "{summary}");

    // Removals acknowledged in one frame (their tombstones synced once per region) stay removed after a
    // kill that follows at once.
    let removed: Vec<u64> = acknowledged.iter().copied().filter(|index| index % 3 == 0).take(200).collect();
    let keys: Vec<Vec<u8>> = removed.iter().map(|&index| key_of(index)).collect();
    let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    for result in client.batch_remove(&key_refs) {
        assert_eq!(result, Ok(()), "every removal acknowledged");
    }
    node.kill();
    let (mut node, _) = start_node(port, &image);
    let mut client = Client::connect(("127.0.0.1", port), ClientOptions::default()).expect("connect");
    for (index, result) in removed.iter().zip(client.batch_get(&key_refs)) {
        let status = result.map(|value| value.len());
        assert_eq!(status, Err(ClientError::NotFound), "key {index}: an acknowledged removal came back after the kill");
    }
    for &index in acknowledged.iter().filter(|index| *index % 3 != 0).take(200) {
        assert_eq!(client.get(&key_of(index)).expect("kept"), value_of(index), "key {index}");
    }
    node.kill();
    let _ = std::fs::remove_dir_all(&directory);
}
