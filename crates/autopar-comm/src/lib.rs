//! # autopar-comm: how autopar's ranks talk to each other
//!
//! One trait, [`Communicator`], with the collectives every parallel mode needs (gradient
//! all-reduce, redistribution steps, optimizer-shard gathers, pipeline send/recv) and two
//! backends:
//!
//! * [`LocalComm`]: N ranks as N threads of one process (`LocalComm::run(8, |comm| ...)`). The
//!   default for `--devices N` on one machine.
//! * `MpiComm` (cargo feature `mpi`): one rank per process over OpenMPI, started by
//!   `mpirun -n N` (or `autopar launch -n N`), across hosts with a hostfile.
//!
//! ```
//! use autopar_comm::{Communicator, LocalComm, ReduceOp};
//!
//! // Four ranks as four threads; each contributes its rank + 1.
//! let sums = LocalComm::run(4, |comm| -> Result<Vec<f32>, autopar_comm::CommError> {
//!     let mut v = vec![comm.rank() as f32 + 1.0; 3];
//!     comm.all_reduce((&mut v).into(), ReduceOp::Sum)?;
//!     Ok(v)
//! })?;
//! assert!(sums.iter().all(|v| v == &vec![10.0; 3]));
//! # Ok::<(), autopar_comm::CommError>(())
//! ```
//!
//! Key decisions:
//! * **Trait objects.** `Communicator` is object safe; the runtime holds a
//!   `Box<dyn Communicator>` and sub-groups come back from [`Communicator::split`] as
//!   `Box<dyn Communicator>`. Buffers are type-tagged ([`Buf`]/[`BufMut`] over f16, bf16, f32,
//!   f64, i32, i64) so one method serves every element type without generics;
//!   `(&mut grad).into()` makes one from a `Vec<f32>` or slice.
//! * **One reduction semantics** ([`dtype`]): f16/bf16 combine in f32 and round once; integers
//!   wrap; mean = sum / group size; NaN propagates through max/min. [`reduce_serial`] is that
//!   definition, used by the backends' tests as the serial reference.
//! * **Bit-reproducible runs, on either backend.** Both backends reduce in rank order
//!   `((x0 + x1) + x2) + ...` with one kernel, whatever the chunking, so a run repeats exactly
//!   and a checkpoint saved in process continues under `mpirun` (and back) bit for bit.
//! * **No hangs.** `LocalComm` poisons the whole world when a rank panics, errs, times out or
//!   finds a peer gone, and wakes every waiter; [`LocalComm::run`] returns the first failure
//!   with its rank. Under MPI, `MpiComm::run` prints the failing rank's message and calls
//!   `MPI_Abort`, which ends every process of the job.
//! * **Sub-groups from rank lists**, the lists `DeviceMatrix::groups_along` builds (data-,
//!   model-, optimizer- and pipeline-parallel groups). Every member of the parent calls `split`
//!   with the same lists; ranks agree on them or get [`CommError::Mismatch`].
//! * Ranks in error messages are world ranks; ranks in arguments are group ranks.
//! * **One conformance suite** ([`conformance::run_suite`]) checks any backend against the
//!   serial reference (every collective, every element type, odd sizes, sub-groups); it runs
//!   on `LocalComm` for 1 to 8 ranks in the tests and on `MpiComm` under `mpirun -n 2`/`-n 4`.
//! * [`Metered`] wraps any communicator and records every call's kind, group and payload, to
//!   check predicted communication against what a step does.
//! * [`launch`] builds the `mpirun` command line (`autopar launch`): root, oversubscription and
//!   container flags, and an install hint when OpenMPI is missing.

#![warn(missing_docs)]

pub mod comm;
pub mod conformance;
pub mod dtype;
pub mod error;
mod fold;
pub mod launch;
pub mod local;
pub mod metered;
#[cfg(feature = "mpi")]
pub mod mpi;

pub use comm::Communicator;
pub use dtype::{reduce_serial, Buf, BufMut, DType, Element, ReduceOp};
pub use error::{CallDesc, CommError, GroupProblem, Result, MAX_TAG};
pub use local::{LocalComm, LocalOptions};
pub use metered::{Metered, MeteredCall};
#[cfg(feature = "mpi")]
pub use mpi::MpiComm;
