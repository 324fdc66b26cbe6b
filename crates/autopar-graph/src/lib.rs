//! # autopar-graph: the computation graph, its ops and their gradients
//!
//! A model is a [`Graph`]: a list of [`Node`]s in topological order, each applying one op
//! ([`OpKind`]) to earlier nodes and producing one tensor whose type was inferred when the node
//! was added. [`GraphBuilder`] is the user-facing way to build one (MindSpore's Cell/ops style:
//! seeded parameters, `.shard(strategy)` and pipeline-stage annotations), [`differentiate`]
//! appends the backward pass, and the executor in `autopar-runtime` runs it.
//!
//! ```
//! use autopar_graph::{backward, DType, GraphBuilder, Initializer};
//!
//! let mut b = GraphBuilder::new(0); // the seed of every parameter's initial values
//! let x = b.input("x", &[8, 4], DType::F32)?;
//! let y = b.input("y", &[8], DType::I32)?;
//! let w = b.parameter("fc.weight", &[6, 4], Initializer::HeUniform)?;
//! let logits = b.matmul_t("fc", x, w, false, true)?;
//! b.shard(logits, "((2, 1), (2, 1))".parse()?)?; // MindSpore's ops.MatMul().shard(...)
//! let loss = b.softmax_cross_entropy("loss", logits, y)?;
//! let mut graph = b.finish();
//! assert_eq!(graph.node(logits).ty.shape, vec![8, 6]);
//!
//! let grads = backward(&mut graph, loss)?; // the backward pass, appended to the graph
//! let dw = grads.of(w).expect("fc.weight is trainable");
//! assert_eq!(graph.node(dw).ty.shape, vec![6, 4]);
//! println!("{graph}"); // one line per node
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Key decisions:
//! * **Plain data.** The graph is a `Vec<Node>` with public fields for annotations; the planner
//!   (`autopar-parallel`) reads it and builds each rank's local graph from it, inserting
//!   communication ops and giving nodes their local shapes; [`Graph::validate`] re-checks a graph
//!   edited in place. `Display` prints one line per node.
//! * **One output per node.** Ops that are naturally multi-output in other systems (batch-norm
//!   backward) are split into one op per output (`BatchNormGrad { of: Input | Gamma }`), which
//!   keeps ids, liveness and layouts one-to-one with values.
//! * **One definition block per op** in `ops/<family>.rs` implementing [`OpDef`] (shape and dtype
//!   inference, backward rule, sharding rule, local form on a rank's slice, cost), one [`OpKind`]
//!   variant, exhaustive matches: a forgotten rule does not compile. Backward rules are written with other ops, dedicated `*Grad` ops only where the
//!   kernel is genuinely different (ReLU mask, convolution and pooling adjoints, normalisation).
//!   Many `*Grad` ops have their own backward rule (they are linear in `dy`), so second-order
//!   gradients work for them; the rest return [`GraphError::NotDifferentiable`].
//! * **Communication ops are ops.** AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast,
//!   Reduce, Send and Recv have shapes and adjoints (all-gather <-> reduce-scatter, ...) like any
//!   other op, and are identities on a one-rank group.
//! * **Determinism.** Parameter values depend only on initialiser, shape and seed (derived from
//!   the builder seed and the parameter name, not creation order); dropout masks only on seed,
//!   step and element index.
//! * **Every op is exercised.** [`catalog::op_cases`] builds one small graph per op kind; the
//!   runtime's tests check each op's forward pass and backward rule (against finite differences)
//!   on them, and a test fails when a new op kind has no case.
//! * Shape errors name the op kind, the node and the facts: `MatMul l2: inner dimensions 128 and
//!   64 differ`.

#![warn(missing_docs)]

pub mod autodiff;
pub mod builder;
pub mod catalog;
pub mod error;
pub mod graph;
pub mod init;
pub mod ops;
pub mod precision;
pub mod sharding;
pub mod types;

pub use autodiff::{backward, differentiate, differentiate_with, Gradients};
/// A strategy as `GraphBuilder::shard` takes it (the layout crate's, for models that need no other).
pub use autopar_layout::Strategy;
pub use builder::{GraphBuilder, ParamSpec};
pub use error::{GraphError, Result};
pub use graph::{Graph, Node, Recompute, RecomputeChoice, Schedule};
pub use init::{derive_seed, Initializer, Rng};
pub use ops::{Arity, CollectiveOp, ConvAttrs, GradCx, GradGraph, InferCx, NormGradOf, OpDef, OpKind, PoolAttrs, ReduceOp};
pub use precision::{AmpLevel, Precision};
pub use sharding::{
    Collective, CommCall, CostCx, LocalCx, LogicalDim, OpCost, OpLayouts, OpSpec, RuleCx, ShardingRule, StrategyProblem, Tie,
};
pub use types::{broadcast_shapes, normalize_axis, DType, NodeId, Shape, TensorType};
