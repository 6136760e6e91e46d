//! fio is the oracle of the JSON contract: for the same job, every field strata-bench reports exists in
//! fio 3.33's JSON at the same path with the same type, and the amounts a size-based job moves are equal.
//! Needs fio (`scripts/test.sh` installs it); without it this test fails and says so.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// Paths that strata-bench promises are fio's.
const SHARED_PATHS: &[&str] = &[
    "jobname",
    "groupid",
    "error",
    "usr_cpu",
    "sys_cpu",
    "ctx",
    "write/io_bytes",
    "write/io_kbytes",
    "write/bw",
    "write/bw_bytes",
    "write/iops",
    "write/runtime",
    "write/total_ios",
    "write/clat_ns/min",
    "write/clat_ns/max",
    "write/clat_ns/mean",
    "write/clat_ns/stddev",
    "write/clat_ns/N",
    "write/clat_ns/percentile",
    "write/slat_ns/min",
    "write/slat_ns/max",
    "write/slat_ns/mean",
    "write/slat_ns/stddev",
    "write/slat_ns/N",
    "write/lat_ns/min",
    "write/lat_ns/max",
    "write/lat_ns/mean",
    "write/lat_ns/stddev",
    "write/lat_ns/N",
    "write/lat_ns/percentile",
    "read/io_bytes",
    "read/bw",
    "read/iops",
    "read/runtime",
    // fio reports the direction without I/O too, but without percentiles (strata-bench prints zeroes).
    "read/total_ios",
];

fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('/').try_fold(value, |value, key| value.get(key))
}

fn same_kind(a: &Value, b: &Value) -> bool {
    matches!(
        (a, b),
        (Value::Number(_), Value::Number(_))
            | (Value::String(_), Value::String(_))
            | (Value::Object(_), Value::Object(_))
    )
}

#[test]
fn strata_bench_json_uses_fio_field_names() {
    let fio_present = Command::new("fio").arg("--version").output().is_ok_and(|output| output.status.success());
    assert!(fio_present, "fio is not installed: run ./scripts/test.sh, which installs it (apt-get install fio)");
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fio-oracle-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let filename = format!("--filename={}", file.display());
    let options = [
        "--name=oracle",
        filename.as_str(),
        "--rw=write",
        "--bs=64k",
        "--iodepth=4",
        "--size=8m",
        "--direct=1",
        "--lat_percentiles=1",
        "--output-format=json",
    ];

    let fio = Command::new("fio").args(options).arg("--ioengine=io_uring").output().unwrap();
    assert!(fio.status.success(), "fio failed: {}", String::from_utf8_lossy(&fio.stderr));
    let ours =
        Command::new(env!("CARGO_BIN_EXE_strata-bench")).args(options).arg("--ioengine=io_uring").output().unwrap();
    assert!(ours.status.success(), "strata-bench failed: {}", String::from_utf8_lossy(&ours.stderr));
    let fio: Value = serde_json::from_slice(&fio.stdout).unwrap();
    let ours: Value = serde_json::from_slice(&ours.stdout).unwrap();
    let (fio_job, our_job) = (&fio["jobs"][0], &ours["jobs"][0]);

    for path in SHARED_PATHS {
        let fio_value = at(fio_job, path).unwrap_or_else(|| panic!("fio has no {path}: the contract is wrong"));
        let our_value = at(our_job, path).unwrap_or_else(|| panic!("strata-bench has no {path}"));
        assert!(same_kind(fio_value, our_value), "{path}: fio {fio_value} vs ours {our_value}");
    }
    for latency in ["clat_ns", "lat_ns"] {
        let fio_percentiles: Vec<&String> =
            fio_job["write"][latency]["percentile"].as_object().unwrap().keys().collect();
        for key in our_job["write"][latency]["percentile"].as_object().unwrap().keys() {
            assert!(fio_percentiles.contains(&key), "{latency} percentile key {key} is not one of fio's");
        }
    }
    // Every I/O's total latency includes its completion latency, so each percentile of `lat` is at least
    // the same percentile of `clat`.
    for (key, clat) in our_job["write"]["clat_ns"]["percentile"].as_object().unwrap() {
        let lat = &our_job["write"]["lat_ns"]["percentile"][key];
        assert!(lat.as_u64().unwrap() >= clat.as_u64().unwrap(), "p{key}: lat {lat} < clat {clat}");
    }
    for path in ["write/io_bytes", "write/io_kbytes", "write/total_ios", "jobname"] {
        assert_eq!(at(fio_job, path), at(our_job, path), "{path} differs for the same size-based job");
    }
    // Units: bw is KiB/s in both, derived from bw_bytes.
    for job in [fio_job, our_job] {
        let bw = job["write"]["bw"].as_f64().unwrap();
        let bw_bytes = job["write"]["bw_bytes"].as_f64().unwrap();
        assert!((bw - bw_bytes / 1024.0).abs() <= 1.0, "bw {bw} vs bw_bytes {bw_bytes}");
    }
    std::fs::remove_file(file).unwrap();
}
