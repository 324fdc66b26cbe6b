//! # autopar-layout: the algebra of sharded tensors
//!
//! Everything else in autopar stands on four nouns, kept apart as JAX and PyTorch DTensor do:
//!
//! * [`DeviceMatrix`]: the mesh of a stage's ranks (row-major, last axis fastest);
//! * [`TensorLayout`]: one tensor's full shape, the device axes splitting each dimension and the
//!   axes along which it is a pending partial sum; from it every rank's slice and replica group;
//! * [`Strategy`] -> [`OpLayout`]: MindSpore's per-input split counts turned into a device
//!   matrix and tensor maps, repeat axis included;
//! * [`RedistributionPlan`]: the steps (slice, all-gather, all-to-all, all-reduce,
//!   reduce-scatter, permutation) between two layouts, with the bytes each rank sends, and
//!   [`simulate()`] to run a plan on real data for all ranks at once.
//!
//! ```
//! use autopar_layout::{plan, strategy_layouts, DevMatrixRule, Strategy, TensorLayout};
//!
//! // MatMul x[64, 32] @ w[32, 16] with MindSpore's strategy ((2, 4), (4, 1)) on 8 devices:
//! // rows of x over 2 devices, the contracted dimension over 4.
//! let strategy: Strategy = "((2, 4), (4, 1))".parse()?;
//! let op = strategy_layouts(DevMatrixRule::MatMul { transpose_a: false, transpose_b: false }, &strategy, 8, true)?;
//! assert_eq!(op.dev_matrix.dims(), &[2, 4]);
//! let x = op.input_layout(0, &[64, 32])?;
//! assert_eq!(x.slice_shape(), vec![32, 8]);
//! assert_eq!(x.slice_of(5)?, vec![32..64, 8..16]); // rank 5 = row 1, column 1 of the grid
//!
//! // To rows only (columns gathered): one all-gather over each row of the grid.
//! let rows = TensorLayout::new(x.mesh().clone(), vec![vec![0], vec![]], vec![64, 32])?;
//! let plan = plan(&x, &rows)?;
//! assert_eq!(plan.num_communications(), 1);
//! println!("{plan}: {}", plan.describe(4));
//! # Ok::<(), autopar_layout::LayoutError>(())
//! ```
//!
//! Key decisions:
//! * Inside autopar a device axis is counted from the **left**; MindSpore's right-counted
//!   tensor-map values exist only at the boundary, in [`mindspore`] ([`TensorMap`]).
//! * Layouts are validated at construction: a `TensorLayout` value is always consistent, so the
//!   derived functions never fail on it.
//! * Plans are data: print them (`S(0)R -> RR -> RS(1)`), compare them, simulate them. The
//!   planner's transition table is at the top of [`redistribution`].
//! * Only uniform splits exist (as in MindSpore's checkpoint tools): every split must divide
//!   its dimension.

#![warn(missing_docs)]

pub mod error;
pub mod layout;
pub mod mesh;
pub mod mindspore;
pub mod named;
pub mod redistribution;
pub mod redundancy;
pub mod simulate;
pub mod strategy;

pub use error::{LayoutError, Result, MAX_DEVICES};
pub use layout::TensorLayout;
pub use mesh::{group_of, DeviceAxis, DeviceMatrix};
pub use mindspore::{ParameterLayout, TensorMap};
pub use named::{NamedLayout, INTERLEAVED};
pub use redistribution::{plan, plan_with, PlannedStep, RedistributionPlan, Ring, Step};
pub use simulate::{assemble, scatter, simulate, Block, Element};
pub use strategy::{strategy_layouts, DevMatrixRule, OpLayout, Strategy};
