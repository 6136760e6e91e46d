//! `strata-bench alloc` as a user runs it: JSON lines with the documented fields, a readable table, and clear
//! errors for bad options.

use std::process::Command;

fn strata_bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata-bench")).args(args).output().expect("strata-bench runs")
}

#[test]
fn json_output_is_one_object_per_workload_and_mode() {
    let output = strata_bench(&["alloc", "--arena", "256MiB", "--churn-factor", "2", "--output-format=json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<serde_json::Value> = stdout.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(rows.len(), 8, "4 workloads × 2 modes:\n{stdout}");
    for row in &rows {
        for field in ["utilization_at_first_failure", "steady_state_utilization", "ops_per_sec"] {
            let value = row[field].as_f64().unwrap_or_else(|| panic!("{field} missing in {row}"));
            assert!(value > 0.0, "{field} = {value}");
        }
        for field in ["utilization_at_first_failure", "steady_state_utilization"] {
            assert!(row[field].as_f64().unwrap() <= 1.0, "{field} above 1 in {row}");
        }
    }
    let pairs: Vec<(&str, &str)> =
        rows.iter().map(|row| (row["workload"].as_str().unwrap(), row["mode"].as_str().unwrap())).collect();
    for workload in ["uniform", "two-class", "three-class-noise", "random"] {
        for mode in ["bins", "classes"] {
            assert!(pairs.contains(&(workload, mode)), "missing {workload}/{mode}");
        }
    }
}

#[test]
fn normal_output_is_a_table() {
    let output = strata_bench(&["alloc", "--arena", "128MiB", "--workload", "uniform", "--mode", "classes"]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.lines().any(|line| line.starts_with("workload") && line.contains("steady-state")), "{stdout}");
    assert!(stdout.lines().any(|line| line.starts_with("uniform") && line.contains("classes")), "{stdout}");
}

#[test]
fn bad_options_are_refused_with_a_message() {
    for args in [
        &["alloc", "--workload", "nonsense"][..],
        &["alloc", "--arena", "8 zettabytes"],
        &["alloc", "--alignment", "3000"],
    ] {
        let output = strata_bench(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.trim().is_empty(), "{args:?}: no message");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}
