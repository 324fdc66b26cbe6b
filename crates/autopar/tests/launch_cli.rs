//! `autopar launch`: the mpirun command line, the missing-OpenMPI message, real jobs.

use std::process::{Command, Output};

fn autopar(args: &[&str], path: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_autopar"));
    cmd.args(args);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    cmd.output().unwrap()
}

fn have_mpirun() -> bool {
    autopar_comm::launch::find_in_path("mpirun", None).is_some()
}

#[test]
fn launch_without_openmpi_says_so_and_how_to_install_it() {
    let empty = std::env::temp_dir().join(format!("autopar-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = autopar(&["launch", "-n", "2", "--", "/bin/true"], Some(&empty));
    std::fs::remove_dir_all(&empty).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("autopar: mpirun not found"), "{stderr}");
    assert!(stderr.contains("hint: install OpenMPI: apt-get install openmpi-bin libopenmpi-dev"), "{stderr}");
}

#[test]
fn dry_run_prints_the_mpirun_command_with_the_program_last() {
    let out =
        autopar(&["launch", "-n", "3", "--dry-run", "--mpirun-arg=--bind-to", "--mpirun-arg=none", "--", "./job", "--steps", "10"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line = String::from_utf8(out.stdout).unwrap();
    assert!(line.starts_with("mpirun -n 3 "), "{line}");
    assert!(line.trim_end().ends_with("--bind-to none ./job --steps 10"), "{line}");
    assert_eq!(line.contains("--allow-run-as-root"), autopar_comm::launch::running_as_root(), "{line}");
}

#[test]
fn zero_ranks_and_a_missing_hostfile_are_clear_errors() {
    let out = autopar(&["launch", "-n", "0", "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid number of ranks: 0"));
    let out = autopar(&["launch", "-n", "2", "--hostfile", "/nonexistent/hosts.txt", "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hostfile \"/nonexistent/hosts.txt\" not found"));
    let dir = std::env::temp_dir();
    let out = autopar(&["launch", "-n", "2", "--hostfile", dir.to_str().unwrap(), "--", "/bin/true"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
}

#[test]
fn launch_runs_the_command_on_every_rank_and_reports_a_failed_job() {
    if !have_mpirun() {
        eprintln!("mpirun is not installed: the missing-OpenMPI path is tested instead");
        return;
    }
    let out = autopar(&["launch", "-n", "3", "--", "/bin/echo", "hello from a rank"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("hello from a rank").count(), 3);

    let out = autopar(&["launch", "-n", "2", "--", "/bin/sh", "-c", "exit 3"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("the job of 2 ranks failed"), "{stderr}");
}

#[test]
fn the_version_says_whether_the_build_runs_under_mpirun() {
    let out = autopar(&["--version"], None);
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(v.starts_with("autopar ") && (v.contains("(mpi)") || v.contains("(no mpi)")), "{v}");
}

#[test]
fn launch_refuses_an_autopar_built_without_mpi_before_starting_any_rank() {
    let me = env!("CARGO_BIN_EXE_autopar");
    let v = String::from_utf8_lossy(&autopar(&["--version"], None).stdout).into_owned();
    if v.contains("(mpi)") {
        eprintln!("this autopar is built with MPI support: nothing to refuse");
        return;
    }
    // Also without OpenMPI installed: the check comes before looking for mpirun.
    let empty = std::env::temp_dir().join(format!("autopar-empty-path-check-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = autopar(&["launch", "-n", "4", "--", me, "train", "--model", "mlp", "--data", "synthetic"], Some(&empty));
    std::fs::remove_dir_all(&empty).ok();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("built without MPI support") && stderr.contains("--features mpi"), "{stderr}");
}

#[test]
fn train_started_by_mpirun_without_mpi_support_refuses_instead_of_running_a_duplicate_job() {
    let v = String::from_utf8_lossy(&autopar(&["--version"], None).stdout).into_owned();
    if v.contains("(mpi)") {
        return;
    }
    // What mpirun sets for each process it starts.
    let out = Command::new(env!("CARGO_BIN_EXE_autopar"))
        .args(["train", "--model", "mlp", "--data", "synthetic", "--steps", "1"])
        .env("OMPI_COMM_WORLD_SIZE", "4")
        .env("OMPI_COMM_WORLD_RANK", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("started by mpirun (4 processes)") && stderr.contains("--features mpi"), "{stderr}");
    assert!(out.stdout.is_empty(), "no training output: {}", String::from_utf8_lossy(&out.stdout));
}
