//! # autopar: distributed, automatically parallel deep-learning training
//!
//! Write the network once with a [`GraphBuilder`](prelude::GraphBuilder), say how its ops are
//! split across devices (`shard`, MindSpore's `op.shard(strategy)`) or let the planner choose
//! (`auto_parallel`), and train it on 1 to N devices with the same numbers as on one device:
//! N simulated devices as threads of one process, or one process per rank under `mpirun` (cargo
//! feature `mpi`). This crate is the facade over the workspace (see docs/README.md): everything a
//! program needs is in [`prelude`]; the crates behind it are re-exported as modules
//! ([`graph`], [`parallel`], [`runtime`], [`checkpoint`], ...) for the rest. The `autopar`
//! binary's command line is [`cli`].
//!
//! A network of your own, split over 4 devices (data x model) and checked equal to one device:
//!
//! ```
//! use std::sync::Arc;
//! use autopar::prelude::*;
//!
//! fn mlp(batch: usize, _training: bool) -> Result<Network, BuildError> {
//!     let mut b = GraphBuilder::new(7);
//!     let x = b.input("x", &[batch, 16], DType::F32)?;
//!     let labels = b.input("labels", &[batch], DType::I32)?;
//!     let w1 = b.parameter("fc1.weight", &[32, 16], Initializer::HeUniform)?;
//!     let h = b.matmul_t("fc1", x, w1, false, true)?;
//!     b.shard(h, "((2, 1), (2, 1))".parse()?)?; // rows over 2 devices, fc1's outputs over 2
//!     let h = b.relu("relu", h)?;
//!     let w2 = b.parameter("fc2.weight", &[4, 32], Initializer::HeUniform)?;
//!     let logits = b.matmul_t("fc2", h, w2, false, true)?;
//!     b.shard(logits, "((2, 2), (1, 2))".parse()?)?; // the contracted dimension over 2: a partial sum
//!     let loss = b.softmax_cross_entropy("loss", logits, labels)?;
//!     Ok(Network { graph: b.finish(), x, labels, logits, loss })
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let data = DataSource::new(SyntheticDataset::classification(&[16], 4, 256, 1)?);
//! let mut cfg = TrainConfig { batch_size: 32, max_steps: Some(8), ..Default::default() };
//! cfg.parallel = ParallelContext::new().with("parallel_mode", "semi_auto_parallel")?.with("device_num", 4)?;
//! let trainer = Trainer::new("mlp", Arc::new(mlp), data, cfg);
//! let report = trainer.fit(vec![])?;
//! let reference = verify::stand_alone(&trainer)?;
//! assert!(verify::compare(&report, &reference)?.within(verify::RTOL));
//! # Ok(())
//! # }
//! ```
//!
//! More in `crates/autopar/examples/`: a network trained semi_auto on 8 devices
//! (`custom_network`), a dataset of your own with a callback (`custom_dataset`), pipeline
//! stages (`pipeline_stages`) and resharding checkpoints from code (`reshard_checkpoint`).

#![warn(missing_docs)]

pub use autopar_checkpoint as checkpoint;
pub use autopar_comm as comm;
pub use autopar_data as data;
pub use autopar_graph as graph;
pub use autopar_layout as layout;
pub use autopar_models as models;
pub use autopar_parallel as parallel;
pub use autopar_runtime as runtime;
pub use autopar_tensor as tensor;

pub mod cli;
pub mod config;
pub mod logging;
pub mod verify;

use std::sync::Arc;

use autopar_models::{Mode, Model};
use autopar_runtime::trainer::{BuildError, BuildNetwork, Network};

pub use autopar_runtime::keep_freed_memory;

/// The network a model of the zoo builds, as [`Trainer::new`](prelude::Trainer::new) takes it:
/// for each batch size, the training graph (batch statistics, dropout) or the evaluation graph,
/// parameters seeded from `seed` and their names.
pub fn model_network(model: Arc<dyn Model>, seed: u64) -> BuildNetwork {
    Arc::new(move |batch, training| {
        let mode = if training { Mode::Train } else { Mode::Eval };
        let (graph, m) = model.build_graph(batch, mode, seed).map_err(|e| Box::new(e) as BuildError)?;
        Ok(Network { graph, x: m.x, labels: m.labels, logits: m.logits, loss: m.loss })
    })
}

pub mod prelude {
    //! The names a training program needs, in one import: `use autopar::prelude::*;`.
    //!
    //! * the network: [`GraphBuilder`] and its types, [`Strategy`] for `shard`, the model zoo's [`Model`];
    //! * the parallel context: [`ParallelContext`] (MindSpore's `set_auto_parallel_context`) and [`ParallelMode`];
    //! * training: [`Trainer`], [`TrainConfig`], [`Network`], [`DataSource`], optimizers, callbacks;
    //! * data: the [`Dataset`] trait and the built-in datasets;
    //! * checkpoints: the transforms of MindSpore's `checkpoint_transform` module, [`CheckpointFile`], [`StrategyFile`];
    //! * [`verify`]: a run beside stand-alone.

    pub use crate::{model_network, verify};
    pub use autopar_checkpoint::{
        rank_list_for_transform, transform_checkpoint_by_rank, transform_checkpoints, CheckpointFile, Format, StrategyFile,
        TransformOptions,
    };
    pub use autopar_data::{Cifar10, DataError, Dataset, Mnist, Split, SyntheticDataset, TensorDataset, Transforms};
    pub use autopar_graph::{ConvAttrs, DType, Graph, GraphBuilder, GraphError, Initializer, NodeId, ParamSpec, PoolAttrs, ReduceOp};
    pub use autopar_layout::{DeviceMatrix, LayoutError, Strategy, TensorLayout, TensorMap};
    pub use autopar_models::{model_by_name, Mode, Model, ModelGraph, ModelOptions};
    pub use autopar_parallel::{ParallelContext, ParallelError, ParallelMode};
    pub use autopar_runtime::callbacks::{Callback, LossMonitor, MetricsWriter, StepEvent};
    pub use autopar_runtime::trainer::{
        BuildError, BuildNetwork, CheckpointConfig, DataSource, Network, OptimizerConfig, OptimizerKind, TrainConfig, TrainError,
        TrainReport, Trainer,
    };
    pub use autopar_runtime::{LrSchedule, ParamStore};
    pub use autopar_tensor::Tensor;
    pub use serde_json::json;
}
