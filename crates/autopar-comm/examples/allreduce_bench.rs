//! All-reduce benchmark: f32 sum of 4 KiB to 64 MiB on 2 and 4 ranks; latency, algorithm
//! bandwidth (bytes / time) and bus bandwidth (algbw x 2(n-1)/n, as NCCL reports it).
//!
//! ```text
//! # LocalComm (threads) and a plain memcpy figure:
//! cargo run --release -p autopar-comm --example allreduce_bench
//! # MpiComm side by side with raw MPI_Allreduce loops through the mpi crate, same run:
//! cargo build --release -p autopar-comm --features mpi --example allreduce_bench
//! autopar launch -n 2 -- target/release/examples/allreduce_bench
//! autopar launch -n 4 -- target/release/examples/allreduce_bench
//! ```
//!
//! Every figure is the median of `REPS` timed blocks; a block is `iters(bytes)` back-to-back
//! calls between two barriers. The memcpy baseline is measured the same way: one thread copies
//! the same number of bytes from one buffer into another, again and again, so that its caches are
//! as warm as the all-reduce's (which works in place on buffers it touched in the previous call).
//! Under MPI the loops being compared run in interleaved blocks, in rotating order, so that load
//! from elsewhere on the machine affects them alike.
//!
//! What bounds LocalComm's bus/memcpy ratio: below ~64 KiB, the two barriers of a call (a few
//! cross-core cache-line hand-offs, the 64-byte row) cost more than copying the bytes; with more
//! ranks than cores, every barrier also needs context switches. For large buffers an in-place
//! shared-memory all-reduce reads and writes all n buffers (2n bytes of traffic per byte) while
//! bus bandwidth credits 2(n-1)/n, so once memory bound the ratio is at most about
//! 2 / (n^2 / (n-1)) times the speed-up of all cores over one: 0.5x for 2 ranks, 0.375x for 4.

use std::time::Instant;

use autopar_comm::{Communicator, LocalComm, ReduceOp};

const SIZES: [usize; 8] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];
/// LocalComm's table starts with a 64-byte all-reduce: the cost of the call's synchronization
/// alone, which bounds what small messages can reach.
const SYNC_ONLY: usize = 64;
const REPS: usize = 9;
const WARMUP: usize = 2;

fn iters(bytes: usize) -> usize {
    ((256usize << 20) / bytes).clamp(4, 5_000)
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes < 1 << 10 {
        format!("{bytes} B")
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn busbw(bytes: usize, n: usize, secs: f64) -> f64 {
    bytes as f64 / secs * 2.0 * (n - 1) as f64 / n as f64 / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds per call of `f` over one block of `iters` calls between two barriers of `comm`.
fn block(comm: &dyn Communicator, iters: usize, mut f: impl FnMut()) -> f64 {
    comm.barrier().unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    comm.barrier().unwrap();
    t.elapsed().as_secs_f64() / iters as f64
}

fn all_reduce(comm: &dyn Communicator, buf: &mut [f32]) {
    comm.all_reduce(buf.into(), ReduceOp::Sum).unwrap();
}

/// Median seconds per all-reduce on `comm` (the closing barrier makes it the same on every rank).
fn time_comm(comm: &dyn Communicator, buf: &mut [f32], iters: usize) -> f64 {
    for _ in 0..WARMUP {
        all_reduce(comm, buf);
    }
    median((0..REPS).map(|_| block(comm, iters, || all_reduce(comm, buf))).collect())
}

/// Median seconds per copy of `bytes` bytes by one thread, warm caches, measured like `time_comm`.
fn memcpy_secs(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let it = iters(bytes);
    let mut copy = || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    };
    for _ in 0..WARMUP {
        copy();
    }
    median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..it {
                    copy();
                }
                t.elapsed().as_secs_f64() / it as f64
            })
            .collect(),
    )
}

fn local() {
    println!("LocalComm all-reduce (f32 sum, in place), threads in one process; median of {REPS} blocks");
    println!("memcpy = one thread copying the same bytes between two warm buffers, measured the same way");
    println!(
        "{:>8} {:>5} {:>12} {:>12} {:>12} {:>14} {:>10}",
        "size", "ranks", "latency_us", "algbw_GB/s", "busbw_GB/s", "memcpy_GB/s", "bus/memcpy"
    );
    for n in [2, 4] {
        for bytes in std::iter::once(SYNC_ONLY).chain(SIZES) {
            let len = bytes / 4;
            let mc = bytes as f64 / memcpy_secs(bytes) / 1e9;
            let secs = LocalComm::run(n, |comm| -> Result<f64, autopar_comm::CommError> {
                let mut buf = vec![0f32; len];
                Ok(time_comm(&comm, &mut buf, iters(bytes)))
            })
            .unwrap()[0];
            let bus = busbw(bytes, n, secs);
            println!(
                "{:>8} {:>5} {:>12.2} {:>12.2} {:>12.2} {:>14.2} {:>10.2}",
                human(bytes),
                n,
                secs * 1e6,
                bytes as f64 / secs / 1e9,
                bus,
                mc,
                bus / mc
            );
        }
    }
}

#[cfg(feature = "mpi")]
mod raw_mpi {
    use std::ffi::c_void;

    use mpi::collective::SystemOperation;
    use mpi::ffi;
    use mpi::raw::AsRaw;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::*;

    extern "C" {
        /// `MPI_IN_PLACE`, from autopar-comm's C shim (the constant is a macro in mpi.h).
        fn autopar_mpi_in_place() -> *mut c_void;
    }

    /// MPI_Allreduce with separate send and receive buffers, through the mpi crate's safe API.
    pub fn all_reduce_into(raw: &SimpleCommunicator, send: &[f32], recv: &mut [f32]) {
        raw.all_reduce_into(send, recv, SystemOperation::sum());
    }

    /// MPI_Allreduce in place through the mpi crate's bindings (MPI picks the reduction order).
    pub fn all_reduce_in_place(raw: &SimpleCommunicator, buf: &mut [f32]) {
        // SAFETY: `buf` is valid for `buf.len()` f32; an in-place sum over the communicator.
        let rc = unsafe {
            ffi::MPI_Allreduce(
                autopar_mpi_in_place(),
                buf.as_mut_ptr() as *mut c_void,
                buf.len() as i32,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                raw.as_raw(),
            )
        };
        assert_eq!(rc, 0, "MPI_Allreduce failed");
    }
}

#[cfg(feature = "mpi")]
fn mpi_mode() {
    use autopar_comm::MpiComm;

    MpiComm::run(|comm| -> Result<(), autopar_comm::CommError> {
        let n = comm.size();
        if comm.rank() == 0 {
            println!("all-reduce (f32 sum) on {n} MPI processes; median of {REPS} blocks of each, interleaved in rotating order");
            println!("raw_ip = MPI_Allreduce(MPI_IN_PLACE) through the mpi crate's bindings (MPI's own reduction order);");
            println!("raw_oop = MPI_Allreduce with separate send/recv buffers through the mpi crate's safe API;");
            println!("comm = MpiComm: all-to-all, a rank-order fold of each chunk, all-gather (LocalComm's bits)");
            println!(
                "{:>8} {:>5} {:>13} {:>13} {:>13} {:>13} {:>13} {:>9}",
                "size", "ranks", "raw_oop_us", "raw_ip_us", "raw_ip_GB/s", "comm_us", "comm_bus_GB/s", "comm/raw"
            );
        }
        let raw = comm.raw();
        for bytes in SIZES {
            let len = bytes / 4;
            let it = iters(bytes);
            let send = vec![0f32; len];
            let (mut recv, mut ip, mut buf) = (vec![0f32; len], vec![0f32; len], vec![0f32; len]);
            for _ in 0..WARMUP {
                raw_mpi::all_reduce_into(raw, &send, &mut recv);
                raw_mpi::all_reduce_in_place(raw, &mut ip);
                all_reduce(&comm, &mut buf);
            }
            let mut times = [Vec::new(), Vec::new(), Vec::new()];
            for rep in 0..REPS {
                for k in 0..3 {
                    let which = (rep + k) % 3;
                    times[which].push(match which {
                        0 => block(&comm, it, || raw_mpi::all_reduce_into(raw, &send, &mut recv)),
                        1 => block(&comm, it, || raw_mpi::all_reduce_in_place(raw, &mut ip)),
                        _ => block(&comm, it, || all_reduce(&comm, &mut buf)),
                    });
                }
            }
            let [oop, ip, mine] = times.map(median);
            if comm.rank() == 0 {
                println!(
                    "{:>8} {:>5} {:>13.1} {:>13.1} {:>13.2} {:>13.1} {:>13.2} {:>9.3}",
                    human(bytes),
                    n,
                    oop * 1e6,
                    ip * 1e6,
                    busbw(bytes, n, ip),
                    mine * 1e6,
                    busbw(bytes, n, mine),
                    mine / ip
                );
            }
        }
        Ok(())
    })
    .unwrap();
}

fn main() {
    let under_mpirun = autopar_comm::launch::mpi_world_size().is_some();
    if under_mpirun {
        #[cfg(feature = "mpi")]
        {
            mpi_mode();
            return;
        }
        #[cfg(not(feature = "mpi"))]
        {
            eprintln!("allreduce_bench: built without the `mpi` feature; rebuild with --features mpi to measure MpiComm");
            std::process::exit(2);
        }
    }
    local();
}
