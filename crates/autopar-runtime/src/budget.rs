//! The plan is the memory budget. Before a run allocates any tensor, it compares what its plan
//! needs in this process (every simulated rank in process; its own rank under mpirun) with what
//! the machine allows, and refuses with the figures when the plan does not fit; after the run,
//! the process's true peak since it started (`VmHWM`) is what it reports beside the plan.
//!
//! What the machine allows, each checked where present:
//! * `MemAvailable` (`/proc/meminfo`): what the kernel can give without swapping;
//! * a cgroup's `memory.max` less its `memory.current` (cgroup v2; v1's
//!   `memory.limit_in_bytes` less `memory.usage_in_bytes`): a container's or scheduler's limit;
//! * the address-space limit (`ulimit -v`, `RLIMIT_AS`) less the process's `VmSize`, which
//!   the simulated ranks' thread stacks count against too;
//! * `device_memory_capacity`, when the parallel context sets it: each rank's plan against it.
//!
//! Processes that mpirun starts on one host share its memory and its cgroup: each takes its
//! share (`OMPI_COMM_WORLD_LOCAL_SIZE` / `MPI_LOCALNRANKS`). The resident memory this process
//! already holds counts as part of the runtime's overhead, so it is added back to what is left,
//! up to that overhead.

use std::fmt;
use std::path::{Path, PathBuf};

use autopar_comm::{Buf, BufMut, Communicator};
use autopar_parallel::{JobPlan, JobProgram, Memory};

use crate::error::{CommPhase, Result, RuntimeError};

/// The runtime's own resident memory besides the plan's tensors, per process: the program's
/// code and data (under mpirun, MPI's libraries and their buffers too), the allocator's slack,
/// the data loader's prefetched batches, graphs and schedules. Stated here and in
/// `docs/memory.md`, measured there (27 to 60 MiB beyond the plan in one process, 79 to 112
/// MiB per rank under mpirun).
pub const PROCESS_OVERHEAD: u64 = 128 << 20;

/// What a simulated rank adds besides its plan (its graphs, executors, the touched part of its
/// thread's stack).
pub const RANK_OVERHEAD: u64 = 4 << 20;

/// The runtime's overhead beside the plan of a process running `ranks` ranks: the process's own
/// and each rank's.
pub fn overhead(ranks: usize) -> u64 {
    PROCESS_OVERHEAD.saturating_add(RANK_OVERHEAD.saturating_mul(ranks as u64))
}

/// A rank's plan as it runs over `comm`: the in-process communicator reduces and gathers
/// where the parts lie, so there a fused collective packs nothing; MPI's packs them.
pub fn on_backend(program: &JobProgram, job: &JobPlan, optimizer_slots: usize, comm: &dyn Communicator) -> Result<Memory> {
    Ok(program.memory_on(job, optimizer_slots, comm.backend() != "local")?)
}

/// A limit on this process's memory, and how much of it is left for the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `MemAvailable` of `/proc/meminfo`, this process's share of it.
    Available {
        /// Bytes left for this process.
        left: u64,
        /// Processes of the job on this host sharing it.
        share: usize,
    },
    /// A cgroup's limit less its current use, this process's share of it.
    Cgroup {
        /// The limit file.
        path: PathBuf,
        /// The limit, bytes.
        max: u64,
        /// Bytes left for this process.
        left: u64,
        /// Processes of the job on this host sharing it.
        share: usize,
    },
    /// The address-space limit (`RLIMIT_AS`) less the process's current virtual size.
    AddressSpace {
        /// The limit, bytes.
        max: u64,
        /// Bytes of address space left.
        left: u64,
    },
    /// `device_memory_capacity`: each rank's plan against it.
    DeviceCapacity {
        /// Bytes per device.
        bytes: u64,
    },
}

impl Limit {
    /// What this limit holds, as the subject of "needs": the process or the largest rank.
    pub fn needing(&self) -> &'static str {
        match self {
            Limit::DeviceCapacity { .. } => "the largest rank's plan needs",
            _ => "this process needs, by the plan,",
        }
    }

    /// The bytes this limit leaves for the run's plan.
    pub fn left(&self) -> u64 {
        match self {
            Limit::Available { left, .. } | Limit::Cgroup { left, .. } | Limit::AddressSpace { left, .. } => *left,
            Limit::DeviceCapacity { bytes } => *bytes,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared =
            |share: usize| if share > 1 { format!(", shared by the {share} processes of the job on this host") } else { String::new() };
        match self {
            Limit::Available { left, share } => {
                write!(f, "the machine's available memory (MemAvailable) leaves {}{}", size(*left), shared(*share))
            }
            Limit::Cgroup { path, max, left, share } => {
                write!(f, "the cgroup limit {} ({}) leaves {}{}", path.display(), size(*max), size(*left), shared(*share))
            }
            Limit::AddressSpace { max, left } => write!(f, "the address-space limit (ulimit -v, {}) leaves {}", size(*max), size(*left)),
            Limit::DeviceCapacity { bytes } => write!(f, "device_memory_capacity is {} ({bytes} bytes) per device", size(*bytes)),
        }
    }
}

/// Bytes in the largest binary unit that keeps the figure at 1 or more, one decimal:
/// `512 B`, `4.0 KiB`, `1.5 MiB`, `2.0 GiB`, `4.0 TiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// What the ranks of this process need, by the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demand {
    /// The ranks this process runs.
    pub ranks: usize,
    /// The plan's memory of those ranks, summed.
    pub plan: u64,
    /// The plan's memory of the largest of them.
    pub largest: Memory,
    /// The largest rank's number, counted in the world.
    pub largest_rank: usize,
}

impl Demand {
    /// The resident bytes the process needs: the plan and the runtime's overhead.
    pub fn resident(&self) -> u64 {
        self.plan.saturating_add(overhead(self.ranks))
    }
}

/// The demand in words: the ranks, the largest rank's plan by part, the runtime's overhead.
pub fn describe(d: &Demand) -> String {
    let m = &d.largest;
    let parts = format!(
        "parameters {}, gradients {}, optimizer state {}, activations {}, communication buffers {}",
        size(m.parameters as u64),
        size(m.gradients as u64),
        size(m.optimizer_state as u64),
        size(m.peak_activations as u64),
        size(m.comm_buffers as u64)
    );
    let overhead = size(d.resident() - d.plan);
    if d.ranks == 1 {
        format!("rank {}'s plan: {} ({parts}); the runtime adds {overhead}", d.largest_rank, size(d.plan))
    } else {
        format!(
            "{} ranks' plans: {} in all; the largest, rank {}: {} ({parts}); the runtime adds {overhead}",
            d.ranks,
            size(d.plan),
            d.largest_rank,
            size(m.total() as u64)
        )
    }
}

/// The first of `limits` the demand does not fit, with the bytes it needed there. A cgroup's
/// or the machine's memory and the address space must hold the process's resident bytes; what
/// the process holds now (`held`) is part of the runtime's overhead, already taken from what
/// the limits leave, so it counts back, up to that overhead (not the plan's tensors, none of
/// which exists yet); `device_memory_capacity` must hold the largest rank's plan.
pub fn first_exceeded<'a>(demand: &Demand, limits: &'a [Limit], held: u64) -> Option<(&'a Limit, u64)> {
    limits.iter().find_map(|l| {
        let (need, left) = match l {
            Limit::DeviceCapacity { bytes } => (demand.largest.total() as u64, *bytes),
            _ => (demand.resident(), l.left().saturating_add(held.min(PROCESS_OVERHEAD))),
        };
        (need > left).then_some((l, need))
    })
}

/// Refuses, before any parameter is made, a rank whose process cannot hold the plan: the ranks
/// of this process (every rank of `world` when it is simulated in process, whose plans are
/// gathered over it: collective; this rank alone under mpirun), each with its plan's `memory`,
/// against [`machine_limits`] and `device_capacity`. Every simulated rank gives the same answer.
pub fn check_plan_fits(world: &dyn Communicator, memory: &Memory, device_capacity: Option<u64>) -> Result<()> {
    let simulated = world.backend() == "local";
    // Read before the gather, which no rank leaves before every rank has read.
    let limits = machine_limits(if simulated { 1 } else { processes_on_host() }, device_capacity);
    let held = ProcessMemory::now().map_or(0, |m| m.resident);
    let own = [memory.total(), memory.parameters, memory.gradients, memory.optimizer_state, memory.peak_activations, memory.comm_buffers]
        .map(|v| v as f64);
    let rows: Vec<f64> = if simulated && world.size() > 1 {
        let mut all = vec![0.0; own.len() * world.size()];
        world.all_gather(Buf::F64(&own), BufMut::F64(&mut all)).map_err(RuntimeError::comm(CommPhase::MemoryCheck))?;
        all
    } else {
        own.to_vec()
    };
    let rows: Vec<&[f64]> = rows.chunks(own.len()).collect();
    let (k, row) = rows.iter().enumerate().fold((0, rows[0]), |best, (k, r)| if r[0] > best.1[0] { (k, r) } else { best });
    let demand = Demand {
        ranks: rows.len(),
        plan: rows.iter().map(|r| r[0] as u64).sum(),
        largest: Memory {
            parameters: row[1] as usize,
            gradients: row[2] as usize,
            optimizer_state: row[3] as usize,
            peak_activations: row[4] as usize,
            // Within the step's peak, which `peak_activations` states.
            activations: 0,
            comm_buffers: row[5] as usize,
        },
        largest_rank: if rows.len() > 1 { k } else { world.rank() },
    };
    match first_exceeded(&demand, &limits, held) {
        None => Ok(()),
        Some((limit, need)) => Err(RuntimeError::DoesNotFit { need, demand: Box::new(demand), limit: Box::new(limit.clone()) }),
    }
}

/// Refuses `ranks` simulated ranks whose threads' stacks of `stack` bytes each do not fit the
/// address-space limit, before the threads are started.
pub fn check_stacks_fit(ranks: usize, stack: u64) -> Result<()> {
    let need = stack.saturating_mul(ranks as u64);
    match machine_limits(1, None).into_iter().find(|l| matches!(l, Limit::AddressSpace { .. })) {
        Some(l) if need > l.left() => Err(RuntimeError::StacksDoNotFit { ranks, stack, limit: Box::new(l) }),
        _ => Ok(()),
    }
}

/// The limits of this process: the machine's available memory and its cgroup's limit (each
/// shared by `share` processes), the address-space limit, and `device_capacity` when given.
/// Files that do not exist (not Linux, no cgroup) give no limit.
pub fn machine_limits(share: usize, device_capacity: Option<u64>) -> Vec<Limit> {
    let share = share.max(1);
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut limits = Vec::new();
    if let Some(bytes) = read(Path::new("/proc/meminfo")).as_deref().and_then(|t| meminfo_field(t, "MemAvailable:")) {
        limits.push(Limit::Available { left: bytes / share as u64, share });
    }
    if let Some((path, max, used)) = cgroup_limit() {
        limits.push(Limit::Cgroup { path, max, left: max.saturating_sub(used) / share as u64, share });
    }
    let status = read(Path::new("/proc/self/status"));
    let limits_text = read(Path::new("/proc/self/limits"));
    if let (Some(max), Some(size)) =
        (limits_text.as_deref().and_then(address_space_limit), status.as_deref().and_then(|t| meminfo_field(t, "VmSize:")))
    {
        limits.push(Limit::AddressSpace { max, left: max.saturating_sub(size) });
    }
    if let Some(bytes) = device_capacity {
        limits.push(Limit::DeviceCapacity { bytes });
    }
    limits
}

/// The processes of this job on this host (mpirun's local size), 1 when not started by mpirun.
pub fn processes_on_host() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok())
        .unwrap_or(1)
        .max(1)
}

/// This process's memory: peak and current resident set and virtual size (`VmHWM`, `VmRSS`,
/// `VmSize` of `/proc/self/status`), bytes; None where `/proc` does not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    /// The most resident memory since the process started.
    pub peak: u64,
    /// Resident memory now.
    pub resident: u64,
    /// Address space now.
    pub virtual_size: u64,
}

impl ProcessMemory {
    /// This process's figures now.
    pub fn now() -> Option<Self> {
        let t = std::fs::read_to_string("/proc/self/status").ok()?;
        Self::parse(&t)
    }

    /// The figures of a `/proc/<pid>/status` text.
    pub fn parse(status: &str) -> Option<Self> {
        Some(Self {
            peak: meminfo_field(status, "VmHWM:")?,
            resident: meminfo_field(status, "VmRSS:")?,
            virtual_size: meminfo_field(status, "VmSize:")?,
        })
    }
}

/// The value in bytes of a `Name:   123 kB` line of `/proc/meminfo` or `/proc/*/status`.
pub fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let rest = line[name.len()..].trim();
    let (num, unit) = rest.split_once(char::is_whitespace).map_or((rest, ""), |(n, u)| (n, u.trim()));
    let n: u64 = num.parse().ok()?;
    match unit {
        "kB" => n.checked_mul(1024),
        "" => Some(n),
        _ => None,
    }
}

/// The soft address-space limit of a `/proc/self/limits` text, bytes; None when unlimited.
pub fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..].split_whitespace().next()?;
    soft.parse().ok()
}

/// A cgroup limit file's value (`max`: no limit).
pub fn cgroup_value(text: &str) -> Option<u64> {
    let t = text.trim();
    // cgroup v1 writes an unlimited limit as a huge page-aligned number.
    t.parse::<u64>().ok().filter(|&v| v < 1 << 60)
}

/// The memory cgroup of this process: its limit file, the limit and the current use.
fn cgroup_limit() -> Option<(PathBuf, u64, u64)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let (dir, max_file, cur_file) = if controllers.is_empty() {
            (Path::new("/sys/fs/cgroup").join(rel), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (Path::new("/sys/fs/cgroup/memory").join(rel), "memory.limit_in_bytes", "memory.usage_in_bytes")
        } else {
            continue;
        };
        // The tightest limit on the way up to the root.
        let mut best: Option<(PathBuf, u64, u64)> = None;
        let mut d = Some(dir.as_path());
        while let Some(at) = d {
            if !at.starts_with("/sys/fs/cgroup") {
                break;
            }
            let max_path = at.join(max_file);
            if let (Some(max), Some(cur)) =
                (read(&max_path).as_deref().and_then(cgroup_value), read(&at.join(cur_file)).as_deref().and_then(|t| t.trim().parse().ok()))
            {
                if best.as_ref().is_none_or(|b| max.saturating_sub(cur) < b.1.saturating_sub(b.2)) {
                    best = Some((max_path, max, cur));
                }
            }
            d = at.parent();
        }
        if best.is_some() {
            return best;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn memory(total: usize) -> Memory {
        Memory { parameters: total, ..Memory::default() }
    }

    #[test]
    fn proc_files_are_read() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo_field(meminfo, "MemAvailable:"), Some(20_000_000 * 1024));
        assert_eq!(meminfo_field(meminfo, "SwapTotal:"), None);
        let status = "Name:\tautopar\nVmPeak:\t  300 kB\nVmSize:\t  200 kB\nVmHWM:\t  100 kB\nVmRSS:\t   50 kB\n";
        assert_eq!(ProcessMemory::parse(status), Some(ProcessMemory { peak: 102_400, resident: 51_200, virtual_size: 204_800 }));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max address space         5000000000           unlimited            bytes     \n";
        assert_eq!(address_space_limit(limits), Some(5_000_000_000));
        assert_eq!(address_space_limit(&limits.replace("5000000000", "unlimited ")), None);
        assert_eq!(cgroup_value("max\n"), None);
        assert_eq!(cgroup_value("9223372036854771712\n"), None);
        assert_eq!(cgroup_value("1073741824\n"), Some(1 << 30));
    }

    #[test]
    fn the_first_limit_exceeded_is_named_with_what_was_needed() {
        let d = Demand { ranks: 2, plan: 1 << 30, largest: memory(600 << 20), largest_rank: 1 };
        let need = d.resident();
        let roomy = Limit::Available { left: 8 << 30, share: 1 };
        let tight = Limit::Cgroup { path: "/sys/fs/cgroup/memory.max".into(), max: 1 << 30, left: 900 << 20, share: 1 };
        assert_eq!(first_exceeded(&d, std::slice::from_ref(&roomy), 0), None);
        assert_eq!(first_exceeded(&d, &[roomy.clone(), tight.clone()], 0), Some((&tight, need)));
        // What the process already holds counts back, up to the process's overhead.
        let close = Limit::Cgroup { path: "/sys/fs/cgroup/memory.max".into(), max: 2 << 30, left: need - (50 << 20), share: 1 };
        assert_eq!(first_exceeded(&d, std::slice::from_ref(&close), 1 << 30), None);
        assert_eq!(first_exceeded(&d, std::slice::from_ref(&close), 10 << 20), Some((&close, need)));
        assert_eq!(first_exceeded(&d, std::slice::from_ref(&tight), 1 << 30), Some((&tight, need)));
        let cap = Limit::DeviceCapacity { bytes: 512 << 20 };
        assert_eq!(first_exceeded(&d, std::slice::from_ref(&cap), 0), Some((&cap, 600 << 20)));
        assert_eq!(
            (size(512), size(4096), size(3 << 29), size(5 << 40)),
            ("512 B".into(), "4.0 KiB".into(), "1.5 GiB".into(), "5.0 TiB".into())
        );
        assert!(cap.to_string().contains("512.0 MiB") && tight.to_string().contains("memory.max"), "{cap} / {tight}");
    }

    #[test]
    fn this_machine_has_limits_and_this_process_figures() {
        if !Path::new("/proc/meminfo").exists() {
            return;
        }
        let limits = machine_limits(2, Some(1 << 30));
        assert!(matches!(limits.first(), Some(Limit::Available { share: 2, .. })), "{limits:?}");
        assert_eq!(limits.last(), Some(&Limit::DeviceCapacity { bytes: 1 << 30 }));
        let m = ProcessMemory::now().unwrap();
        assert!(m.peak >= m.resident && m.virtual_size >= m.resident && m.resident > 0, "{m:?}");
    }

    proptest! {
        /// A demand fits exactly the limits that leave at least what it needs.
        #[test]
        fn fits_iff_every_limit_leaves_enough(plan in 0u64..1 << 34, left in 0u64..1 << 34, held in 0u64..1 << 30, ranks in 1usize..64) {
            let d = Demand { ranks, plan, largest: memory(plan as usize / ranks), largest_rank: 0 };
            let l = [Limit::Available { left, share: 1 }];
            let refused = first_exceeded(&d, &l, held).is_some();
            prop_assert_eq!(refused, d.resident() > left + held.min(PROCESS_OVERHEAD));
        }
    }
}
