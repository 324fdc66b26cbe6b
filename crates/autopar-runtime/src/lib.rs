//! # autopar-runtime: running graphs and updating parameters
//!
//! * [`Executor`]: plans a graph once (only the nodes the fetched values need, last use of every
//!   value) and runs it on `autopar-tensor` kernels, freeing each intermediate after its last
//!   user; optional per-op timing.
//! * [`ParamStore`]: named persistent tensors (parameters, running statistics), materialised
//!   from the graph's seeded initialisers.
//! * [`optim`]: SGD, Momentum (MindSpore's `ApplyMomentum`, state `moments.<name>`), AdamW
//!   (`adam_m.<name>`, `adam_v.<name>`), weight decay and learning-rate schedules.
//! * [`TrainStep`]: one training step of a rank's program (forward, backward, gradient sync,
//!   optimizer update): the one step implementation of every mode, stand-alone included.
//! * [`Trainer`]: epochs or steps over a dataset on `device_num` ranks (threads over `LocalComm`),
//!   with [`callbacks`] (loss monitor, JSON metrics, loss-curve SVG), per-rank checkpoints, resume
//!   with the uninterrupted run's trajectory, `--init` by parameter name, and evaluation.
//!
//! ```
//! use autopar_graph::{DType, GraphBuilder, Initializer};
//! use autopar_runtime::{LrSchedule, Momentum, ParamStore, TrainStep};
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
//! let mut params = ParamStore::init(&graph).unwrap();
//! let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap();
//! let mut step = TrainStep::new(graph, loss).unwrap();
//! let feeds = vec![
//!     (x, Tensor::from_vec(&[8, 4], (0..32).map(|i| (i % 7) as f32 / 7.0).collect::<Vec<f32>>()).unwrap()),
//!     (y, Tensor::from_vec(&[8], (0..8).map(|i| i % 3).collect::<Vec<i32>>()).unwrap()),
//! ];
//! let first = step.run(&mut params, &mut opt, &feeds).unwrap();
//! for _ in 0..20 {
//!     step.run(&mut params, &mut opt, &feeds).unwrap();
//! }
//! assert!(step.run(&mut params, &mut opt, &feeds).unwrap() < first);
//! assert!(params.get("fc1.weight").is_some());
//! ```
//!
//! Key decisions:
//! * Optimizers are runtime updates, not graph ops: they are element-wise and fused per
//!   parameter, and their state has MindSpore's names so checkpoints interoperate.
//! * The executor owns no threads: kernels use the current rayon pool, or run serially with
//!   `ExecCtx::serial()` (the simulated ranks of the parallel runtime).

#![warn(missing_docs)]

pub mod broadcast;
pub mod callbacks;
pub mod collective;
pub mod distributed;
pub mod error;
pub mod executor;
pub mod optim;
pub mod parallel;
pub mod pipeline;
mod shard;
pub mod strategy_io;
pub mod train;
pub mod trainer;

pub use broadcast::{parameter_broadcast, BroadcastError, BroadcastReport, LayoutSource, Replicas};
pub use error::{CommPhase, Result, RuntimeError};
pub use executor::{graph_dtype, tensor_dtype, Collectives, Executor, MicroBatch, OpTiming, ParamStore, RunOutput};
pub use optim::{clip_by_global_norm, decay_except_norm, AdamW, DecayFilter, LrSchedule, Momentum, Optimizer, Sgd};
pub use train::{StepOutput, TrainStep};
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
