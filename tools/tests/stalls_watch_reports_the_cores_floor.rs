//! `strata-bench stalls` watches a core for the gaps the machine takes from a spinning thread: its report
//! is self-consistent, and bad arguments are clear errors.

use std::process::Command;

use serde_json::Value;

fn stalls(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata-bench")).arg("stalls").args(args).output().expect("run strata-bench")
}

#[test]
fn a_watch_reports_consistent_figures() {
    // A threshold of 1 us catches the timer interrupts at least, so there is something to count.
    let output = stalls(&["--cpu", "0", "--runtime", "300ms", "--threshold", "1us", "--output-format", "json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).expect("json");
    let runtime = report["runtime_s"].as_f64().unwrap();
    assert!((0.29..2.0).contains(&runtime), "runtime {runtime}");
    let count = report["stalls"].as_u64().unwrap();
    assert!(count > 0, "no gap of 1 us in 300 ms: {report}");
    assert!((report["stalls_per_sec"].as_f64().unwrap() - count as f64 / runtime).abs() < 1e-6 * count as f64 + 1e-9);
    let lost = report["lost_fraction"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&lost), "lost {lost}");
    let (p50, p99, max) =
        (report["p50_us"].as_u64().unwrap(), report["p99_us"].as_u64().unwrap(), report["max_us"].as_u64().unwrap());
    assert!(1 <= p50 && p50 <= p99 && p99 <= max + max / 100 + 1, "p50 {p50} p99 {p99} max {max}");
    let longest: Vec<u64> =
        report["longest"].as_array().unwrap().iter().map(|stall| stall["us"].as_u64().unwrap()).collect();
    assert!(!longest.is_empty() && longest.len() <= 8 && longest.windows(2).all(|pair| pair[0] >= pair[1]));
    assert!(longest[0] >= max - max / 100 - 1, "the longest stall {} vs max {max}", longest[0]);
    assert_eq!(report["threshold_us"], 1);
    // Linux reports steal per CPU; the watch's share of it is a fraction of its runtime.
    let steal = report["steal_fraction"].as_f64().expect("steal reported on Linux");
    assert!((0.0..=1.0).contains(&steal), "steal {steal}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    for cpu in ["1000", "4095"] {
        let output = stalls(&["--cpu", cpu, "--runtime", "10ms"]);
        assert!(!output.status.success());
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains(&format!("CPU {cpu}")) && !message.contains("panicked"), "{message}");
    }
    let output = stalls(&["--runtime", "10ms", "--threshold", "0us"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("threshold"));
}
