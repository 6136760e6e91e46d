//! `strata-bench kv` against a `strata-node` process on loopback: what one run writes, a later run reads
//! back and verifies by key index and seed; the JSON report carries the fields the node issue names, the
//! node's CPU time per key read from its metrics, and, with `--subscribe`, every event the puts caused with
//! the subscriber's own CPU time; `--subscribe-windows` compares windows with and without a subscriber.

mod common;

use std::process::Command;

use serde_json::Value;

/// The address after `marker` in the node's start-up summary, up to the next space or slash.
fn address_after(summary: &str, marker: &str) -> String {
    let at = summary.find(marker).unwrap_or_else(|| panic!("no {marker:?} in:\n{summary}")) + marker.len();
    summary[at..].split([' ', '/', '\n']).next().expect("address").to_string()
}

/// Runs `strata-bench kv` with `flags`; `clean`: whether the run must exit 0 (it exits 1, after its report,
/// when any key failed or mismatched).
fn bench_kv(server: &str, metrics: &str, flags: &[&str], clean: bool) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["kv", "--server", server, "--metrics", metrics, "--output-format=json"])
        .args(flags)
        .output()
        .expect("strata-bench runs");
    assert_eq!(
        output.status.success(),
        clean,
        "strata-bench kv {flags:?}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!("not JSON ({error}): {}", String::from_utf8_lossy(&output.stdout));
    })
}

fn count(report: &Value, field: &str) -> u64 {
    report[field].as_u64().unwrap_or_else(|| panic!("{field} missing or not a count: {report}"))
}

#[test]
fn bench_kv_writes_verifies_and_reports_with_the_nodes_cpu_and_events() {
    let (node, _lines, summary) = common::start_until_ready(|command| {
        command.args(["--listen", "127.0.0.1:0", "--cores", "1", "--dram", "64MiB", "--dram-only", "--metrics"]).arg(
            // A fixed metrics port would collide with a parallel test; the summary names the one bound.
            "127.0.0.1:0",
        )
    });
    let node_pid = node.id().to_string();
    let _node = common::NodeProcess(node);
    let server = address_after(&summary, "listening on ");
    let metrics = address_after(&summary, "metrics: http://");
    assert!(metrics.starts_with("127.0.0.1:") && !metrics.ends_with(":0"), "metrics on {metrics}:\n{summary}");

    // Every key once, in batches: 2,000 keys of 4 KiB.
    let put = bench_kv(
        &server,
        &metrics,
        &["--op", "put", "--value-size", "4k", "--keys", "2000", "--batch", "16", "--no-preload", "--once"],
        true,
    );
    assert_eq!(put["op"], "put", "{put}");
    assert_eq!(put["value_size"].as_u64(), Some(4096), "{put}");
    assert_eq!(put["batch"].as_u64(), Some(16), "{put}");
    assert_eq!(count(&put, "keys_done"), 2000, "{put}");
    assert_eq!(count(&put, "errors"), 0, "{put}");
    let cpu = put["server_cpu_ns_per_op"].as_f64().unwrap_or_else(|| panic!("no node CPU per key: {put}"));
    assert!(cpu >= 0.0, "{put}");

    // A second process reads them back by index and seed, checking every byte.
    let get = bench_kv(
        &server,
        &metrics,
        &[
            "--op",
            "get",
            "--value-size",
            "4k",
            "--keys",
            "2000",
            "--connections",
            "2",
            "--no-preload",
            "--once",
            "--verify",
        ],
        true,
    );
    assert_eq!(count(&get, "keys_done"), 2000, "{get}");
    assert_eq!((count(&get, "errors"), count(&get, "mismatches"), count(&get, "not_found")), (0, 0, 0), "{get}");
    assert_eq!(get["connections"].as_u64(), Some(2), "{get}");
    assert!(get["ops_per_sec"].as_f64().is_some_and(|rate| rate > 0.0), "{get}");
    assert!(get["bytes_per_sec"].as_f64().is_some_and(|rate| rate >= 4096.0), "{get}");
    let (p50, p99, p999) = (count(&get["lat_ns"], "p50"), count(&get["lat_ns"], "p99"), count(&get["lat_ns"], "p999"));
    assert!(0 < p50 && p50 <= p99 && p99 <= p999, "{get}");

    // Keys another seed would have written are not there: failures counted as not found (the run exits 1),
    // never taken for data.
    let other = bench_kv(
        &server,
        "off",
        &[
            "--op",
            "get",
            "--value-size",
            "4k",
            "--keys",
            "100",
            "--seed",
            "9",
            "--no-preload",
            "--once",
            "--verify",
            "--log-avg-msec",
            "20",
        ],
        false,
    );
    assert_eq!((count(&other, "not_found"), count(&other, "errors")), (100, 100), "{other}");
    // In intervals (--log-avg-msec): every call and every failed key falls in one, each in order.
    let intervals = other["intervals"].as_array().unwrap_or_else(|| panic!("intervals: {other}"));
    let sum = |field: &str| intervals.iter().map(|interval| count(interval, field)).sum::<u64>();
    assert_eq!((sum("calls"), sum("errors")), (100, 100), "{other}");
    let starts: Vec<u64> = intervals.iter().map(|interval| count(interval, "start_ms")).collect();
    assert!(starts.iter().enumerate().all(|(at, &start)| start == 20 * at as u64), "{starts:?}");
    assert!(get["intervals"].is_null(), "no intervals unless asked: {get}");
    assert_eq!(count(&other, "mismatches"), 0, "{other}");
    assert!(other["server_cpu_ns_per_op"].is_null(), "metrics off: no node CPU figure: {other}");

    // A subscriber beside the puts sees one BlockStored per new key, and nothing is reported missed.
    let observed = bench_kv(
        &server,
        &metrics,
        &[
            "--op",
            "put",
            "--value-size",
            "64",
            "--keys",
            "3000",
            "--seed",
            "3",
            "--batch",
            "32",
            "--no-preload",
            "--once",
            "--subscribe",
        ],
        true,
    );
    assert_eq!(count(&observed, "keys_done"), 3000, "{observed}");
    assert!(count(&observed, "events_received") >= 3000, "{observed}");
    // Events on the wire name one key or many.
    let wire = count(&observed, "wire_events_received");
    assert!(wire >= 1 && wire <= count(&observed, "events_received"), "{observed}");
    assert_eq!(count(&observed, "events_missed"), 0, "{observed}");
    assert!(observed["subscriber_cpu_ns_per_event"].as_f64().is_some_and(|ns| ns >= 0.0), "{observed}");
    assert!(get["events_received"].is_null() && get["subscriber_cpu_ns_per_event"].is_null(), "{get}");

    // Windows: a subscriber connected in alternate pairs of 100 ms windows (off, on, on, off) of a paced run;
    // both kinds are counted, and the closed half of the run delivers nothing.
    let flags = format!(
        "--op put --value-size 64 --keys 3000 --batch 16 --rate 1000 --no-preload --runtime 0.8 \
         --subscribe-windows 100ms --node-pid {node_pid}"
    );
    let unix_now =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64();
    let before = unix_now();
    let windowed = bench_kv(&server, &metrics, &flags.split_whitespace().collect::<Vec<_>>(), true);
    let windows = &windowed["windows"];
    // Window 0's start, for splitting a `perf record -k CLOCK_REALTIME` profile: within this call.
    let started = windows["started_unix_s"].as_f64().expect("a start time");
    assert!(started >= before && started <= unix_now() - 0.8, "window 0 began at {started}, the call at {before}");
    assert_eq!(windows["windows_each"].as_u64(), Some(4), "{windowed}");
    for kind in ["unobserved", "observed"] {
        let rate = windows[format!("puts_per_sec_{kind}")].as_f64().expect("a rate");
        assert!(rate > 0.0, "{kind}: {windowed}");
        let node_ns = windows[format!("node_cpu_ns_per_op_{kind}")].as_f64();
        assert!(node_ns.is_some_and(|ns| ns > 0.0), "the node's CPU per put, {kind}: {windowed}");
    }
    let (received, puts) = (count(windows, "events_received"), count(&windowed, "keys_done"));
    assert!(received > 0 && received < puts * 3 / 4, "events only while subscribed: {received} of {puts} puts");
    assert_eq!(count(windows, "events_missed"), 0, "{windowed}");
    assert!(windowed["events_received"].is_null(), "--subscribe's fields stay empty: {windowed}");

    // A run too short for one group of four windows is refused, with the reason.
    let short = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["kv", "--server", &server, "--metrics", &metrics, "--op", "put", "--no-preload"])
        .args(["--runtime", "0.2", "--subscribe-windows", "100ms"])
        .output()
        .expect("strata-bench runs");
    assert!(!short.status.success());
    let stderr = String::from_utf8_lossy(&short.stderr);
    assert!(stderr.contains("at least four windows"), "{stderr}");
}
