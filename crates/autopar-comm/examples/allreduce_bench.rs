//! All-reduce benchmark: f32 sum of 4 KiB to 64 MiB on 2 and 4 ranks; latency, algorithm
//! bandwidth (bytes / time) and bus bandwidth (algbw x 2(n-1)/n, as NCCL reports it).
//!
//! ```text
//! # LocalComm (threads) and a plain memcpy figure:
//! cargo run --release -p autopar-comm --example allreduce_bench
//! # MpiComm side by side with a raw MPI_Allreduce loop through the mpi crate, same run:
//! cargo build --release -p autopar-comm --features mpi --example allreduce_bench
//! autopar launch -n 2 -- target/release/examples/allreduce_bench
//! autopar launch -n 4 -- target/release/examples/allreduce_bench
//! ```
//! Each figure is the best of 5 timed repetitions (other work on the machine only slows runs).

use std::time::Instant;

use autopar_comm::{Communicator, LocalComm, ReduceOp};

const SIZES: [usize; 8] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];
const REPS: usize = 5;

fn iters(bytes: usize) -> usize {
    ((256usize << 20) / bytes).clamp(4, 2000)
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

fn busbw(bytes: usize, n: usize, secs: f64) -> f64 {
    bytes as f64 / secs * 2.0 * (n - 1) as f64 / n as f64 / 1e9
}

/// Seconds per all-reduce on `comm` (the same on every rank after the closing barrier).
fn time_comm(comm: &dyn Communicator, buf: &mut [f32], iters: usize) -> f64 {
    for _ in 0..2 {
        comm.all_reduce(buf.into(), ReduceOp::Sum).unwrap();
    }
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        comm.barrier().unwrap();
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce((&mut *buf).into(), ReduceOp::Sum).unwrap();
        }
        comm.barrier().unwrap();
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn memcpy_secs(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let it = iters(bytes);
    let mut best = f64::INFINITY;
    for _ in 0..REPS {
        let t = Instant::now();
        for _ in 0..it {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        best = best.min(t.elapsed().as_secs_f64() / it as f64);
    }
    best
}

fn local() {
    println!("LocalComm all-reduce (f32 sum), threads in one process; memcpy = one thread copying the same bytes");
    println!(
        "{:>8} {:>5} {:>12} {:>12} {:>12} {:>14} {:>10}",
        "size", "ranks", "latency_us", "algbw_GB/s", "busbw_GB/s", "memcpy_GB/s", "bus/memcpy"
    );
    for n in [2, 4] {
        for bytes in SIZES {
            let len = bytes / 4;
            let secs = LocalComm::run(n, |comm| -> Result<f64, autopar_comm::CommError> {
                let mut buf = vec![0f32; len];
                Ok(time_comm(&comm, &mut buf, iters(bytes)))
            })
            .unwrap()[0];
            let mc = bytes as f64 / memcpy_secs(bytes) / 1e9;
            let bus = busbw(bytes, n, secs);
            println!(
                "{:>8} {:>5} {:>12.1} {:>12.2} {:>12.2} {:>14.2} {:>10.2}",
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
fn mpi_mode() {
    use autopar_comm::MpiComm;
    use mpi::collective::SystemOperation;
    use mpi::traits::*;

    MpiComm::run(|comm| -> Result<(), autopar_comm::CommError> {
        let n = comm.size();
        if comm.rank() == 0 {
            println!("all-reduce (f32 sum) on {n} MPI processes: raw = MPI_Allreduce through the mpi crate (separate send/recv buffers), MpiComm = in place");
            println!(
                "{:>8} {:>5} {:>13} {:>13} {:>13} {:>13} {:>9}",
                "size", "ranks", "raw_lat_us", "raw_bus_GB/s", "comm_lat_us", "comm_bus_GB/s", "comm/raw"
            );
        }
        for bytes in SIZES {
            let len = bytes / 4;
            let it = iters(bytes);
            let send = vec![0f32; len];
            let mut recv = vec![0f32; len];
            let raw = comm.raw();
            let mut raw_best = f64::INFINITY;
            let mut comm_best = f64::INFINITY;
            let mut buf = vec![0f32; len];
            for _ in 0..2 {
                raw.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            }
            // Interleave the two so that load from elsewhere affects both alike.
            for _ in 0..REPS {
                raw.barrier();
                let t = Instant::now();
                for _ in 0..it {
                    raw.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
                }
                raw.barrier();
                raw_best = raw_best.min(t.elapsed().as_secs_f64() / it as f64);
                comm_best = comm_best.min(time_comm(&comm, &mut buf, it));
            }
            if comm.rank() == 0 {
                println!(
                    "{:>8} {:>5} {:>13.1} {:>13.2} {:>13.1} {:>13.2} {:>9.3}",
                    human(bytes),
                    n,
                    raw_best * 1e6,
                    busbw(bytes, n, raw_best),
                    comm_best * 1e6,
                    busbw(bytes, n, comm_best),
                    comm_best / raw_best
                );
            }
        }
        Ok(())
    })
    .unwrap();
}

fn main() {
    let under_mpirun = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() || std::env::var_os("PMI_SIZE").is_some();
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
