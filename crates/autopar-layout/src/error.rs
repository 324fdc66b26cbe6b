//! The one error type of this crate. Variants carry the offending values, never preformatted text.

use thiserror::Error;

/// The most devices one job may span (MindSpore's `device_num` range).
pub const MAX_DEVICES: usize = 4096;

/// Everything that can be wrong with a device matrix, a layout, a strategy or a plan request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    #[error("device matrix {dims:?} has an axis of size 0 (axis {axis})\n  hint: every axis needs at least one device")]
    ZeroAxis { dims: Vec<usize>, axis: usize },

    #[error("device matrix {dims:?} spans {count} devices, more than the maximum of {max}\n  hint: device_num must be in 1..={max}")]
    TooManyDevices { dims: Vec<usize>, count: usize, max: usize },

    #[error("device count {count} is out of range\n  hint: device_num must be in 1..={max}")]
    DeviceCountOutOfRange { count: usize, max: usize },

    #[error("rank {rank} is out of range for {devices} devices\n  hint: ranks are 0..{devices}")]
    RankOutOfRange { rank: usize, devices: usize },

    #[error("coordinate {coord:?} does not fit device matrix {dims:?}")]
    CoordinateOutOfRange { coord: Vec<usize>, dims: Vec<usize> },

    #[error("tensor map value {value} (tensor dimension {dim}) is out of range for device matrix {dims:?}\n  hint: values count device axes from the right: 0..={max} or -1 for not split", max = dims.len() as i64 - 1)]
    TensorMapOutOfRange { dim: usize, value: i64, dims: Vec<usize> },

    #[error("device axis {axis} (tensor map value {value}) is used twice, by tensor dimensions {first} and {second}\n  hint: a device axis can split at most one tensor dimension")]
    AxisUsedTwice { axis: usize, value: i64, first: usize, second: usize },

    #[error("partial-sum device axis {axis} also splits tensor dimension {dim}\n  hint: a tensor is either split or a pending partial sum along one device axis, not both")]
    PartialAxisAlsoSplits { axis: usize, dim: usize },

    #[error("partial-sum device axis {axis} is out of range for device matrix {dims:?}")]
    PartialAxisOutOfRange { axis: usize, dims: Vec<usize> },

    #[error("tensor dimension {dim} of size {size} is not divisible by its split {split} (shape {shape:?})\n  hint: uneven splits are not supported; choose a split that divides {size}")]
    NotDivisible { dim: usize, size: usize, split: usize, shape: Vec<usize> },

    #[error("shape {shape:?} has {shape_len} dimensions but the tensor map {map} has {map_len} entries\n  hint: give one tensor-map entry per tensor dimension")]
    ShapeMapLengthMismatch { shape: Vec<usize>, shape_len: usize, map: String, map_len: usize },

    #[error("strategy {strategy} uses {product} devices, which does not divide the device count {devices}\n  hint: the product of the split counts must divide device_num")]
    StrategyNotDividing { strategy: String, product: usize, devices: usize },

    #[error("strategy {strategy} has a split count of 0 (input {input}, dimension {dim})\n  hint: split counts are at least 1")]
    ZeroSplit { strategy: String, input: usize, dim: usize },

    #[error("strategy {strategy}: input {input} splits dimension {dim} {got} ways but the operator's device matrix needs {expected}\n  hint: aligned dimensions of all inputs must use the same split (or 1 for a broadcast dimension)")]
    StrategySplitMismatch { strategy: String, input: usize, dim: usize, got: usize, expected: usize },

    #[error("strategy {strategy}: MatMul splits the contracted dimension {a} ways in input 0 and {b} ways in input 1; they must match\n  hint: use the same split for the contracted dimension of both inputs")]
    ContractedSplitMismatch { strategy: String, a: usize, b: usize },

    #[error("strategy {strategy}: {what}")]
    BadStrategy { strategy: String, what: String },

    #[error("cannot parse {what} from {text:?}: {reason}")]
    Parse { what: &'static str, text: String, reason: String },

    #[error("cannot redistribute: source shape {src:?} differs from destination shape {dst:?}\n  hint: redistribution moves one tensor between layouts; reshape it first")]
    ShapeMismatch { src: Vec<usize>, dst: Vec<usize> },

    #[error("cannot redistribute: source spans {src} devices, destination {dst}\n  hint: both layouts must describe the same devices")]
    DeviceCountMismatch { src: usize, dst: usize },

    #[error("simulation input: {what}")]
    Simulation { what: String },
}

/// Result alias of this crate.
pub type Result<T, E = LayoutError> = std::result::Result<T, E>;
