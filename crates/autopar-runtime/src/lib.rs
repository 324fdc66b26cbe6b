//! # autopar-runtime: running jobs and updating parameters
//!
//! * [`Job`]: the one job type, every mode and shape (a job without pipeline stages is a
//!   pipeline of one stage), assembled by `autopar-parallel`'s one entry point.
//! * [`RankTrainer`]: one rank of a job, with the one train step of every job: its
//!   micro-batches (passes of the whole network, or a pipeline stage's pieces in schedule
//!   order), then gradient sync, clipping and the optimizer update ([`rank`]).
//! * [`run_local`]: every rank as a thread of this process; [`assemble_params`] /
//!   [`gather_full_params`]: full parameters from the ranks' pieces, only where asked for;
//!   [`relayout_params`]: a job's pieces moved to another job's layouts, piece by piece.
//! * [`budget`]: the plan's memory checked against what the machine allows, before any tensor.
//! * [`Executor`]: plans a graph once (only the nodes the fetched values need, last use of every
//!   value) and runs it on `autopar-tensor` kernels, freeing each intermediate after its last
//!   user; optional per-op timing.
//! * [`ParamStore`]: named persistent tensors (parameters, running statistics), materialised
//!   from the graph's seeded initialisers.
//! * [`optim`]: SGD, Momentum (MindSpore's `ApplyMomentum`, state `moments.<name>`), AdamW
//!   (`adam_m.<name>`, `adam_v.<name>`), weight decay and learning-rate schedules.
//! * [`Trainer`]: epochs or steps over a dataset on `device_num` ranks (threads over `LocalComm`,
//!   or one per process under MPI), with [`callbacks`] (loss monitor, JSON metrics, loss-curve
//!   SVG), per-rank checkpoints, resume with the uninterrupted run's trajectory, `--init` by
//!   parameter name, and evaluation.
//!
//! ```
//! use autopar_graph::{DType, GraphBuilder, Initializer};
//! use autopar_parallel::ParallelContext;
//! use autopar_runtime::{Job, LrSchedule, Momentum, ParamSource, ParamStore, RankTrainer};
//! use autopar_tensor::Tensor;
//!
//! let mut b = GraphBuilder::new(0);
//! let x = b.input("x", &[8, 4], DType::F32).unwrap();
//! let y = b.input("y", &[8], DType::I32).unwrap();
//! let h = b.dense("fc1", x, 16, Initializer::HeUniform).unwrap();
//! let h = b.relu("relu", h).unwrap();
//! let logits = b.dense("fc2", h, 3, Initializer::HeUniform).unwrap();
//! let loss = b.softmax_cross_entropy("loss", logits, y).unwrap();
//! let graph = b.finish();
//!
//! let job = Job::new(&graph, loss, &ParallelContext::default()).unwrap();
//! let params = ParamStore::init(&graph).unwrap();
//! let mut rank = RankTrainer::alone(&job, ParamSource::Full(&params)).unwrap();
//! let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap();
//! let batch = vec![
//!     ("x".to_string(), Tensor::from_vec(&[8, 4], (0..32).map(|i| (i % 7) as f32 / 7.0).collect::<Vec<f32>>()).unwrap()),
//!     ("y".to_string(), Tensor::from_vec(&[8], (0..8).map(|i| i % 3).collect::<Vec<i32>>()).unwrap()),
//! ];
//! let first = rank.step(&mut opt, &batch).unwrap();
//! for _ in 0..20 {
//!     rank.step(&mut opt, &batch).unwrap();
//! }
//! assert!(rank.step(&mut opt, &batch).unwrap() < first);
//! assert!(rank.params().get("fc1.weight").is_some());
//! ```
//!
//! Key decisions:
//! * One rank trainer and one step for every mode, stand-alone, data parallel, model parallel,
//!   hybrid and pipelines alike, so an option is applied by one path or refused up front.
//! * Optimizers are runtime updates, not graph ops: they are element-wise and fused per
//!   parameter, and their state has MindSpore's names so checkpoints interoperate.
//! * The executor owns no threads: kernels use the current rayon pool, or run serially with
//!   `ExecCtx::serial()` (the simulated ranks of the parallel runtime).

#![warn(missing_docs)]

/// `$body` with `$T` the element type of `$dtype` (an `autopar_tensor::DType`): the one place
/// the runtime turns a tensor's element-type tag into a type for generic code.
macro_rules! with_element {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            autopar_tensor::DType::F32 => {
                type $T = f32;
                $body
            }
            autopar_tensor::DType::F64 => {
                type $T = f64;
                $body
            }
            autopar_tensor::DType::F16 => {
                type $T = half::f16;
                $body
            }
            autopar_tensor::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            autopar_tensor::DType::I32 => {
                type $T = i32;
                $body
            }
            autopar_tensor::DType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}

pub mod assemble;
pub mod broadcast;
pub mod budget;
pub mod checkpoint_io;
pub mod collective;
pub mod error;
pub mod executor;
mod gradient_sync;
mod init_replicas;
pub mod job;
pub mod local;
pub mod loss_scale;
pub mod optim;
mod parallel_optimizer;
pub mod rank;
pub mod relayout;
pub mod trainer;

/// Callbacks of the trainer (MindSpore's `LossMonitor`, metrics, the loss curve).
pub use trainer::callbacks;
mod transfer;

pub use assemble::{assemble_params, assemble_refs, gather_full_params};
pub use broadcast::{parameter_broadcast, BroadcastError, BroadcastReport, LayoutSource, Replicas};
pub use error::{CommPhase, Result, RuntimeError};
pub use executor::{graph_dtype, tensor_dtype, Collectives, Executor, MicroBatch, OpTiming, ParamStore, RunOutput, SharedInit};
pub use job::{rank_batches, slice_tensor, Job};
pub use local::{run_local, LocalRanks, LocalRun, MakeOptimizer};
pub use loss_scale::{LossScale, LossScaleState, LossScaler, ScaledStep};
pub use optim::{clip_by_global_norm, decay_except_norm, AdamW, DecayFilter, LrSchedule, Momentum, Optimizer, ParamGroups, Sgd};
pub use rank::{ParamSource, RankTrainer, StepOutput};
pub use relayout::relayout_params;
pub use trainer::{TrainConfig, TrainError, TrainReport, Trainer};

/// Keep the memory of large freed buffers in the process for the next step's tensors instead
/// of returning it to the system and page-faulting it in again at every step: glibc's mmap
/// threshold is raised to its 32 MiB maximum (buffers below it come from the heap and are
/// reused), its trim threshold to 256 MiB, and its top pad to 64 MiB. The pad matters where the
/// kernels run: on the worker threads, whose arenas are heaps of their own that glibc unmaps
/// whole as soon as they empty (whatever the trim threshold) unless the pad keeps them.
/// Measured on ResNet-18 (batch 32, 2 threads): the thresholds 8% more samples/s, the pad
/// another 7% (935,000 -> 136,000 page faults in 15 s). The `autopar` binary, the Python
/// package's `run_cli` and the benchmarks call it first; a program embedding autopar may. The
/// memory is then kept until the process exits (the resident size stays at its high-water
/// mark). Does nothing outside glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; any value is safe.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}
