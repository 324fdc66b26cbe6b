//! autopar: distributed, automatically parallel deep-learning training.
//!
//! This crate is the facade over the workspace (see DESIGN.md): the `autopar` binary and
//! [`prelude`], which re-exports what a user program needs.

pub use autopar_layout as layout;

pub mod cli;
pub mod config;
pub mod logging;

/// The names a user program needs, in one import.
pub mod prelude {
    pub use autopar_layout::{
        plan, strategy_layouts, DevMatrixRule, DeviceMatrix, LayoutError, RedistributionPlan, Strategy, TensorLayout, TensorMap,
    };
}
