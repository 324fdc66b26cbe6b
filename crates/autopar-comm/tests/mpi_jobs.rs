//! MpiComm under mpirun with 2 and 4 processes: the conformance suite passes on every rank,
//! and a failing rank ends the whole job with its message instead of hanging it.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use autopar_comm::launch::{mpirun_command, LaunchSpec};

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} is missing: build it with cargo build -p autopar-comm --features mpi --examples", path.display());
    path
}

/// Run under mpirun; fail the test if the job is still running after `limit`.
fn mpirun(n: usize, args: &[&str], limit: Duration) -> Output {
    let mut command = vec![example("mpi_collectives").into_os_string()];
    command.extend(args.iter().map(Into::into));
    let spec = LaunchSpec { ranks: n, command, ..Default::default() };
    let mut cmd: Command = mpirun_command(&spec).expect("the mpi feature needs OpenMPI's mpirun on PATH");
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().ok();
            let out = child.wait_with_output().unwrap();
            panic!("mpirun -n {n} {args:?} hung for {limit:?}\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn the_conformance_suite_passes_under_mpirun_with_2_and_4_processes() {
    for n in [2, 4] {
        let out = mpirun(n, &[], Duration::from_secs(300));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "mpirun -n {n} failed\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for r in 0..n {
            assert!(stdout.contains(&format!("rank {r} of {n}: ")), "rank {r} did not report\n{stdout}");
        }
    }
}

#[test]
fn a_failing_rank_aborts_the_whole_job_with_its_message() {
    for (mode, text) in [("fail", "injected failure on rank 3"), ("panic", "injected panic on rank 3")] {
        let out = mpirun(4, &[mode], Duration::from_secs(120));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{mode}: job succeeded");
        assert!(stderr.contains("autopar[3]: ") && stderr.contains(text), "{mode}: {stderr}");
    }
}

#[test]
fn a_rank_process_that_exits_abruptly_ends_the_job() {
    let out = mpirun(4, &["exit"], Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("rank 3 exits abruptly"), "{stderr}");
}
