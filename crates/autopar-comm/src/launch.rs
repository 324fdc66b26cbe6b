//! Building the `mpirun` command line that starts an MPI job (used by `autopar launch` and by
//! the MPI tests). Nothing here needs the `mpi` feature: it only finds and spawns a program.
//!
//! Flags added, each for a measured reason (OpenMPI 4.1):
//! * `--allow-run-as-root` when running as root (OpenMPI refuses otherwise);
//! * `--oversubscribe` when more ranks than cores are asked for on this machine without a
//!   hostfile (OpenMPI refuses otherwise, and then yields when idle instead of busy-polling);
//! * `--mca btl_vader_single_copy_mechanism none` inside containers, where the shared-memory
//!   transport's single-copy (CMA) mechanism is usually forbidden and fails at run time;
//! * `-x NAME` for every `AUTOPAR_*` variable set here, so ranks on other hosts see them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{CommError, Result};

/// What to start.
#[derive(Clone, Debug, Default)]
pub struct LaunchSpec {
    /// Number of processes (ranks).
    pub ranks: usize,
    /// An OpenMPI hostfile (`host slots=N` lines) for runs across hosts.
    pub hostfile: Option<PathBuf>,
    /// Extra arguments passed to mpirun before the program.
    pub mpirun_args: Vec<OsString>,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// The number of processes when this process was started by `mpirun` (OpenMPI's or MPICH's
/// environment), else `None`.
pub fn mpi_world_size() -> Option<usize> {
    env_number(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
}

/// The processes `mpirun` started on this host (OpenMPI's or MPICH's environment), else `None`.
pub fn mpi_local_size() -> Option<usize> {
    env_number(&["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"])
}

/// This process's rank when it was started by `mpirun`, else `None`.
pub fn mpi_rank() -> Option<usize> {
    env_number(&["OMPI_COMM_WORLD_RANK", "PMI_RANK"])
}

fn env_number(keys: &[&str]) -> Option<usize> {
    keys.iter().find_map(|k| std::env::var(k).ok()).and_then(|v| v.trim().parse().ok())
}

/// Find an executable named `name` in the `PATH` given (or this process's `PATH`).
pub fn find_in_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let path = path.map(OsString::from).or_else(|| std::env::var_os("PATH"))?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// Find `mpirun`, or explain how to install OpenMPI.
pub fn find_mpirun() -> Result<PathBuf> {
    find_in_path("mpirun", None).ok_or_else(|| CommError::MpirunMissing { path: std::env::var("PATH").unwrap_or_default() })
}

/// Whether this process runs as root (effective uid 0).
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Whether this process runs inside a container (Docker, Podman, Kubernetes, LXC).
pub fn in_container() -> bool {
    if Path::new("/.dockerenv").exists() || Path::new("/run/.containerenv").exists() || std::env::var_os("container").is_some() {
        return true;
    }
    std::fs::read_to_string("/proc/1/cgroup")
        .map(|s| ["docker", "kubepods", "containerd", "lxc", "podman"].iter().any(|k| s.contains(k)))
        .unwrap_or(false)
}

/// The mpirun arguments for `spec` (everything after the `mpirun` program name).
pub fn mpirun_args(spec: &LaunchSpec) -> Result<Vec<OsString>> {
    if spec.ranks == 0 {
        return Err(CommError::NoRanks { n: 0 });
    }
    let mut a: Vec<OsString> = vec!["-n".into(), spec.ranks.to_string().into()];
    if running_as_root() {
        a.push("--allow-run-as-root".into());
    }
    match &spec.hostfile {
        Some(h) => {
            a.push("--hostfile".into());
            a.push(h.clone().into());
        }
        None => {
            let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            if spec.ranks > cores {
                a.push("--oversubscribe".into());
            }
        }
    }
    if in_container() {
        a.extend(["--mca", "btl_vader_single_copy_mechanism", "none"].map(OsString::from));
    }
    let mut names: Vec<String> =
        std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).filter(|k| k.starts_with("AUTOPAR_")).collect();
    names.sort();
    for k in names {
        a.push("-x".into());
        a.push(k.into());
    }
    a.extend(spec.mpirun_args.iter().cloned());
    a.extend(spec.command.iter().cloned());
    Ok(a)
}

/// The full `mpirun` command for `spec`, or [`CommError::MpirunMissing`].
pub fn mpirun_command(spec: &LaunchSpec) -> Result<Command> {
    let mpirun = find_mpirun()?;
    let mut cmd = Command::new(mpirun);
    cmd.args(mpirun_args(spec)?);
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_ranks_than_cores_oversubscribe_and_the_command_comes_last() {
        let spec = LaunchSpec { ranks: 4096, command: vec!["prog".into(), "--x".into()], ..Default::default() };
        let args: Vec<String> = mpirun_args(&spec).unwrap().into_iter().map(|s| s.into_string().unwrap()).collect();
        assert_eq!(&args[..2], ["-n", "4096"]);
        assert!(args.contains(&"--oversubscribe".to_string()));
        assert_eq!(&args[args.len() - 2..], ["prog", "--x"]);
        assert_eq!(args.contains(&"--allow-run-as-root".to_string()), running_as_root());
    }

    #[test]
    fn a_hostfile_replaces_oversubscription() {
        let spec = LaunchSpec { ranks: 4096, hostfile: Some("hosts".into()), command: vec!["p".into()], ..Default::default() };
        let args: Vec<String> = mpirun_args(&spec).unwrap().into_iter().map(|s| s.into_string().unwrap()).collect();
        assert!(args.windows(2).any(|w| w == ["--hostfile", "hosts"]));
        assert!(!args.contains(&"--oversubscribe".to_string()));
    }

    #[test]
    fn mpirun_is_not_found_in_an_empty_path() {
        let dir = std::env::temp_dir();
        assert!(find_in_path("mpirun-that-does-not-exist", Some(dir.as_os_str())).is_none());
        assert!(find_in_path("sh", Some(std::ffi::OsStr::new("/bin:/usr/bin"))).is_some());
    }
}
