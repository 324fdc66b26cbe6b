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
//!   [`simulate`] to run a plan on real data for all ranks at once.
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

pub mod error;
pub mod layout;
pub mod mesh;
pub mod mindspore;
pub mod redistribution;
pub mod redundancy;
pub mod simulate;
pub mod strategy;

pub use error::{LayoutError, Result, MAX_DEVICES};
pub use layout::TensorLayout;
pub use mesh::{group_of, DeviceAxis, DeviceMatrix};
pub use mindspore::{ParameterLayout, TensorMap};
pub use redistribution::{plan, plan_with, PlannedStep, RedistributionPlan, Step};
pub use simulate::{assemble, scatter, simulate, Block, Element};
pub use strategy::{strategy_layouts, DevMatrixRule, OpLayout, Strategy};
