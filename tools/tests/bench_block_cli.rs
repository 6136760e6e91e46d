//! `strata-bench` block mode as a storage engineer runs it: fio's options and job files, fio's JSON field
//! names, verification that fails the run on a corrupted block, and clear errors.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn strata_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata-bench")).args(args).output().expect("strata-bench runs")
}

fn scratch(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-cli-{name}-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).expect("valid JSON on stdout")
}

#[test]
fn a_verified_write_then_read_reports_fio_json_fields() {
    let file = scratch("verify");
    let filename = format!("--filename={}", file.display());
    let written = json(&strata_bench(&[
        "--name=seqwrite",
        &filename,
        "--rw=write",
        "--bs=64k",
        "--iodepth=4",
        "--size=8m",
        "--verify=crc32c",
        "--direct=1",
        "--ioengine=io_uring",
        "--output-format=json",
    ]));
    let job = &written["jobs"][0];
    assert_eq!(job["jobname"], "seqwrite");
    assert_eq!(job["error"], 0);
    let write = &job["write"];
    assert_eq!(write["io_bytes"], 8 << 20);
    assert_eq!(write["total_ios"], 128);
    assert!(write["iops"].as_f64().unwrap() > 0.0);
    assert!(write["bw"].as_u64().unwrap() > 0, "bw in KiB/s");
    assert_eq!(write["bw"].as_u64().unwrap(), (write["bw_bytes"].as_f64().unwrap() / 1024.0).round() as u64);
    assert!(write["runtime"].as_u64().is_some(), "runtime in ms");
    let clat = &write["clat_ns"];
    for key in ["min", "max", "mean"] {
        assert!(clat[key].as_f64().unwrap() > 0.0, "clat_ns.{key}");
    }
    for key in ["1.000000", "50.000000", "99.000000", "99.900000", "99.990000"] {
        assert!(clat["percentile"][key].as_u64().unwrap() > 0, "percentile {key}");
    }
    assert!(clat["percentile"]["50.000000"].as_u64() <= clat["percentile"]["99.000000"].as_u64());
    assert!(job["usr_cpu"].as_f64().is_some() && job["sys_cpu"].as_f64().is_some());
    assert_eq!(job["verify"]["mismatches"], 0);
    assert_eq!(job["verify"]["blocks_checked"], 128);
    assert_eq!(job["read"]["total_ios"], 0);

    let read = json(&strata_bench(&[
        "--name=randread",
        &filename,
        "--rw=randread",
        "--bs=64k",
        "--iodepth=8",
        "--size=8m",
        "--verify=crc32c",
        "--runtime=1",
        "--time_based",
        "--random_distribution=zipf:1.1",
        "--output-format=json",
    ]));
    let job = &read["jobs"][0];
    assert!(job["read"]["total_ios"].as_u64().unwrap() > 128, "time_based keeps reading");
    assert_eq!(job["verify"]["mismatches"], 0);
    let runtime = job["read"]["runtime"].as_u64().unwrap();
    assert!((900..3000).contains(&runtime), "runtime {runtime} ms for --runtime=1");

    // Corrupt one byte of block 3 behind the bench's back: a verified read must fail the run and say where.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[3 * 65536 + 1000] ^= 0xFF;
    std::fs::write(&file, bytes).unwrap();
    let output = strata_bench(&[
        "--name=check",
        &filename,
        "--rw=read",
        "--bs=64k",
        "--size=8m",
        "--verify=crc32c",
        "--output-format=json",
    ]);
    assert_eq!(output.status.code(), Some(1), "a mismatch fails the run");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let verify = &report["jobs"][0]["verify"];
    assert_eq!(verify["mismatches"], 1);
    assert_eq!(verify["first_mismatches"][0]["offset"], 3 * 65536);
    assert_eq!(verify["first_mismatches"][0]["reason"], "crc32c mismatch");
    std::fs::remove_file(file).unwrap();
}

#[test]
fn ring_moves_verified_blocks_through_its_registered_buffers() {
    // `ring` writes from and reads into registered (fixed) buffers: every block written with its verify
    // header must read back intact, sequentially and at random, at a size that spans many pages.
    let file = scratch("ring-verify");
    let filename = format!("--filename={}", file.display());
    let bench = |rw: &str, extra: &[&str]| {
        let rw = format!("--rw={rw}");
        let mut arguments =
            vec!["--name=ring", &filename, rw.as_str(), "--bs=1m", "--iodepth=4", "--size=16m", "--verify=crc32c"];
        arguments.extend_from_slice(extra);
        arguments.extend_from_slice(&["--ioengine=ring", "--output-format=json"]);
        json(&strata_bench(&arguments))["jobs"][0].clone()
    };
    assert_verified_round_trip(bench, &[("read", &[]), ("randread", &["--runtime=1", "--time_based"])]);
    std::fs::remove_file(file).unwrap();
}

/// A verified write of 16 blocks, then each read of `reads` (its rw and extra flags) over them: every block
/// checked and intact. `bench` runs one job (rw, extra flags) and returns its JSON job report.
fn assert_verified_round_trip(bench: impl Fn(&str, &[&str]) -> Value, reads: &[(&str, &[&str])]) {
    let written = bench("write", &[]);
    assert_eq!(written["write"]["total_ios"], 16, "{written}");
    assert_eq!(written["verify"]["mismatches"], 0, "{written}");
    for (rw, extra) in reads {
        let read = bench(rw, extra);
        assert_eq!(read["error"], 0, "{rw}: {read}");
        assert_eq!(read["verify"]["mismatches"], 0, "{rw}: {read}");
        assert!(read["verify"]["blocks_checked"].as_u64().unwrap() >= 16, "{rw}: {read}");
    }
}

#[test]
fn ring_runs_within_a_small_memlock_budget_and_says_what_it_could_not_register() {
    // Without CAP_IPC_LOCK (setpriv removes it from root's processes) and with 4 MiB of memlock, a ring job
    // of eight 1 MiB I/Os in flight registers what fits, takes the rest from the heap, says so on stderr, and
    // still moves every block intact. (It used to be refused up front for glommio memory it never uses.)
    let file = scratch("ring-memlock");
    let filename = format!("--filename={}", file.display());
    let bench = |rw: &str, extra: &[&str]| {
        let output = Command::new("prlimit")
            .args(["--memlock=4194304:4194304", "setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"])
            .arg(env!("CARGO_BIN_EXE_strata-bench"))
            .args(["--name=ring", &filename, &format!("--rw={rw}"), "--bs=1m", "--iodepth=8", "--size=16m"])
            .args(["--verify=crc32c", "--ioengine=ring", "--output-format=json"])
            .args(extra)
            .output()
            .expect("prlimit and setpriv (util-linux) run strata-bench");
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert!(stderr.contains("ring: a 1024 KiB buffer was refused"), "no warning on stderr: {stderr}");
        json(&output)["jobs"][0].clone()
    };
    assert_verified_round_trip(bench, &[("randread", &["--runtime=1", "--time_based"])]);
    std::fs::remove_file(file).unwrap();
}

#[test]
fn latency_is_split_into_submission_and_completion_as_fio_splits_it() {
    let file = scratch("latency-split");
    let filename = format!("--filename={}", file.display());
    let run = |engine: &str| {
        let engine = format!("--ioengine={engine}");
        let report = json(&strata_bench(&[
            "--name=split",
            &filename,
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=4",
            "--size=4m",
            engine.as_str(),
            "--output-format=json",
        ]));
        report["jobs"][0]["write"].clone()
    };
    // `ring` sees its own submission: each part is measured, and the parts add up to the whole (means add
    // exactly; allow for the ±1 ns floor per sample and float rounding).
    let ring = run("ring");
    assert_eq!(ring["total_ios"], 1024);
    let mean = |part: &str| ring[part]["mean"].as_f64().unwrap();
    assert!(mean("slat_ns") > 0.0 && mean("clat_ns") > 0.0, "{ring}");
    let parts = mean("slat_ns") + mean("clat_ns");
    assert!(
        (parts - mean("lat_ns")).abs() <= 2.0 + mean("lat_ns") * 1e-3,
        "slat + clat {parts} vs lat {}",
        mean("lat_ns")
    );
    assert_eq!(ring["slat_ns"]["N"], 1024);
    // `uring` cannot see glommio's submission: all of it is completion latency, none submission.
    let uring = run("uring");
    assert!(uring["slat_ns"]["mean"].as_f64().unwrap() < 1_000.0, "uring slat {}", uring["slat_ns"]);
    assert!(uring["clat_ns"]["mean"].as_f64().unwrap() >= uring["lat_ns"]["mean"].as_f64().unwrap() - 1_000.0);
    std::fs::remove_file(file).unwrap();
}

#[test]
fn a_job_file_runs_every_section_and_group_reporting_merges() {
    let file = scratch("jobfile");
    let job_file = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-cli-{}.fio", std::process::id()));
    std::fs::write(
        &job_file,
        format!(
            "; two jobs sharing a global section\n[global]\nfilename={}\nsize=4m\nbs=4k\ndirect=1\nioengine=io_uring\n\n[writer]\nrw=randwrite\niodepth=4\n\n# a reader too\n[reader]\nrw=randread\niodepth=2\nruntime=1\ntime_based\n",
            file.display()
        ),
    )
    .unwrap();
    let report = json(&strata_bench(&[job_file.to_str().unwrap(), "--output-format=json"]));
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0]["jobname"], "writer");
    assert_eq!(jobs[0]["write"]["io_bytes"], 4 << 20);
    assert_eq!(jobs[1]["jobname"], "reader");
    assert!(jobs[1]["read"]["total_ios"].as_u64().unwrap() > 0);

    let filename = format!("--filename={}", file.display());
    let grouped = json(&strata_bench(&[
        "--name=clones",
        &filename,
        "--rw=randread",
        "--bs=4k",
        "--size=4m",
        "--numjobs=2",
        "--runtime=1",
        "--time_based",
        "--group_reporting",
        "--output-format=json",
    ]));
    assert_eq!(grouped["jobs"].as_array().unwrap().len(), 1, "group_reporting makes one entry");
    std::fs::remove_file(file).unwrap();
    std::fs::remove_file(job_file).unwrap();
}

#[test]
fn the_normal_report_reads_like_fio() {
    let file = scratch("normal");
    let output = strata_bench(&[
        "--name=human",
        &format!("--filename={}", file.display()),
        "--rw=randrw",
        "--size=4m",
        "--iodepth=2",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    for expected in [
        "human: (groupid=0, jobs=1): err= 0",
        "read: IOPS=",
        "write: IOPS=",
        "clat percentiles",
        "99.00th=[",
        "cpu          : usr=",
        "Run status group 0 (all jobs):",
        "READ: bw=",
        "WRITE: bw=",
    ] {
        assert!(text.contains(expected), "missing '{expected}' in:\n{text}");
    }
    assert!(
        output.stderr.is_empty(),
        "nothing extra when not on a terminal: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::remove_file(file).unwrap();
}

#[test]
fn bad_engines_and_options_are_refused_clearly() {
    let file = scratch("refused");
    let filename = format!("--filename={}", file.display());
    for (args, expected) in [
        (vec!["--name=x", filename.as_str(), "--size=1m", "--ioengine=libaio"], "unknown engine"),
        (vec!["--name=x", filename.as_str(), "--size=1m", "--ioengine=nvmf"], "NVMe-oF"),
        (vec!["--name=x", filename.as_str(), "--size=1m", "--ioengine=spdk"], "SPDK"),
        (vec!["--name=x", filename.as_str(), "--size=1m", "--direct=0"], "direct"),
        (vec!["--name=x", "--size=1m"], "no filename"),
        (vec!["--name=x", filename.as_str(), "--size=1m", "--time_based"], "runtime"),
        (vec!["--name=x", filename.as_str(), "--size=1m", "--bs=1000"], "bs"),
        (vec!["--name=x", "--filename=/nonexistent-dir/x.img", "--size=1m"], "No such file"),
    ] {
        let output = strata_bench(&args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: expected '{expected}' in: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
    let _ = std::fs::remove_file(file);
}

#[test]
fn ramp_time_runs_before_measuring() {
    let file = scratch("ramp");
    let started = std::time::Instant::now();
    let report = json(&strata_bench(&[
        "--name=ramp",
        &format!("--filename={}", file.display()),
        "--rw=randread",
        "--size=4m",
        "--ramp_time=1",
        "--runtime=1",
        "--time_based",
        "--output-format=json",
    ]));
    let elapsed = started.elapsed();
    let runtime = report["jobs"][0]["read"]["runtime"].as_u64().unwrap();
    // The runtime alone (about 1 s; a timer that fires late under load only shortens it), not ramp + runtime.
    assert!((500..1600).contains(&runtime), "measured {runtime} ms, the runtime alone");
    assert!(elapsed >= std::time::Duration::from_secs(2), "ramp and runtime both ran: {elapsed:?}");
    std::fs::remove_file(file).unwrap();
}
