//! # autopar-runtime: running graphs and updating parameters
//!
//! * [`Executor`]: plans a graph once (only the nodes the fetched values need, last use of every
//!   value) and runs it on `autopar-tensor` kernels, freeing each intermediate after its last
//!   user; optional per-op timing.
//! * [`ParamStore`]: named persistent tensors (parameters, running statistics), materialised
//!   from the graph's seeded initialisers.
//! * [`optim`]: SGD, Momentum (MindSpore's `ApplyMomentum`, state `moments.<name>`), AdamW
//!   (`adam_m.<name>`, `adam_v.<name>`), weight decay and learning-rate schedules.
//! * [`TrainStep`]: forward + backward + optimizer for one batch.
//!
//! Key decisions:
//! * Optimizers are runtime updates, not graph ops: they are element-wise and fused per
//!   parameter, and their state has MindSpore's names so checkpoints interoperate.
//! * The executor owns no threads: kernels use the current rayon pool, or run serially with
//!   `ExecCtx::serial()` (the simulated ranks of the parallel runtime).

pub mod error;
pub mod executor;
pub mod optim;
pub mod train;

pub use error::{Result, RuntimeError};
pub use executor::{graph_dtype, tensor_dtype, Executor, OpTiming, ParamStore, RunOutput};
pub use optim::{clip_by_global_norm, decay_except_norm, AdamW, DecayFilter, LrSchedule, Momentum, Optimizer, Sgd};
pub use train::{StepOutput, TrainStep};
