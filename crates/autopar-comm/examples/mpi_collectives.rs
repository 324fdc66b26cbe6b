//! The conformance suite (every collective, every element type, odd sizes, sub-groups) on
//! MpiComm, and failure injection, for runs under mpirun:
//!
//! ```text
//! cargo build -p autopar-comm --features mpi --examples
//! mpirun -n 4 --oversubscribe target/debug/examples/mpi_collectives          # the suite
//! mpirun -n 4 --oversubscribe target/debug/examples/mpi_collectives fail     # last rank errs
//! mpirun -n 4 --oversubscribe target/debug/examples/mpi_collectives panic    # last rank panics
//! mpirun -n 4 --oversubscribe target/debug/examples/mpi_collectives exit     # last rank exits
//! ```
//! The failure modes must end the whole job quickly with the failing rank's message.

use std::time::Duration;

use autopar_comm::conformance::run_suite;
use autopar_comm::{CommError, Communicator, MpiComm, ReduceOp};

fn main() -> std::process::ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "suite".to_string());
    let out = MpiComm::run(|comm| -> Result<(), CommError> {
        let (rank, size) = (comm.rank(), comm.size());
        match mode.as_str() {
            "suite" => {
                let checks = run_suite(&comm)?;
                println!("rank {rank} of {size}: {checks} checks passed");
                Ok(())
            }
            "fail" | "panic" | "exit" => {
                if rank == size - 1 {
                    std::thread::sleep(Duration::from_millis(300));
                    if mode == "panic" {
                        panic!("injected panic on rank {rank}");
                    }
                    if mode == "exit" {
                        // A process that dies without MPI's knowledge (killed, exit() deep in a library).
                        eprintln!("rank {rank} exits abruptly");
                        std::process::exit(3);
                    }
                    return Err(CommError::RankFailed { rank, message: format!("injected failure on rank {rank}") });
                }
                // The others wait in a collective the failed rank never joins.
                let mut v = vec![1.0f32; 1024];
                comm.all_reduce((&mut v).into(), ReduceOp::Sum)?;
                Ok(())
            }
            other => Err(CommError::Mpi { what: format!("unknown mode {other:?}"), hint: "use suite, fail, panic or exit" }),
        }
    });
    match out {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("autopar: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
