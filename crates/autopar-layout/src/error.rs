//! The one error type of this crate. Variants carry the offending values, never preformatted text.

use thiserror::Error;

/// The most devices one job may span (MindSpore's `device_num` range).
pub const MAX_DEVICES: usize = 4096;

/// Everything that can be wrong with a device matrix, a layout, a strategy or a plan request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// A device matrix has an axis of size 0, or no axis at all.
    #[error("device matrix {dims:?} has an axis of size 0 (axis {axis})\n  hint: every axis needs at least one device")]
    ZeroAxis {
        /// The device matrix.
        dims: Vec<usize>,
        /// The axis of size 0, counted from 0 at the left (0 for an empty matrix).
        axis: usize,
    },

    /// A device matrix spans more than [`MAX_DEVICES`] devices.
    #[error("device matrix {dims:?} spans {count} devices, more than the maximum of {max}\n  hint: device_num must be in 1..={max}")]
    TooManyDevices {
        /// The device matrix.
        dims: Vec<usize>,
        /// The devices it spans (the product of its axes).
        count: usize,
        /// The most devices allowed.
        max: usize,
    },

    /// A device count is 0 or more than [`MAX_DEVICES`].
    #[error("device count {count} is out of range\n  hint: device_num must be in 1..={max}")]
    DeviceCountOutOfRange {
        /// The device count that was given.
        count: usize,
        /// The most devices allowed.
        max: usize,
    },

    /// A rank is not below the device count.
    #[error("rank {rank} is out of range for {devices} devices\n  hint: ranks are 0..{devices}")]
    RankOutOfRange {
        /// The rank that was given.
        rank: usize,
        /// The device count.
        devices: usize,
    },

    /// A coordinate has another length than the device matrix or lies outside it.
    #[error("coordinate {coord:?} does not fit device matrix {dims:?}")]
    CoordinateOutOfRange {
        /// The coordinate, one index per device axis.
        coord: Vec<usize>,
        /// The device matrix.
        dims: Vec<usize>,
    },

    /// A tensor map value names no axis of the device matrix.
    #[error("tensor map value {value} (tensor dimension {dim}) is out of range for device matrix {dims:?}\n  hint: values count device axes from the right: 0..={max} or -1 for not split", max = dims.len() as i64 - 1)]
    TensorMapOutOfRange {
        /// The tensor dimension whose entry it is, counted from 0.
        dim: usize,
        /// The tensor map value (device axes counted from the right; -1: not split).
        value: i64,
        /// The device matrix.
        dims: Vec<usize>,
    },

    /// Two tensor dimensions are split along the same device axis.
    #[error("device axis {axis} (tensor map value {value}) is used twice, by tensor dimensions {first} and {second}\n  hint: a device axis can split at most one tensor dimension")]
    AxisUsedTwice {
        /// The device axis, counted from 0 at the left of the device matrix.
        axis: usize,
        /// The tensor map value naming it (counted from the right).
        value: i64,
        /// The first tensor dimension split along it, counted from 0.
        first: usize,
        /// The second tensor dimension split along it, counted from 0.
        second: usize,
    },

    /// A device axis holding a pending partial sum also splits a tensor dimension.
    #[error("partial-sum device axis {axis} also splits tensor dimension {dim}\n  hint: a tensor is either split or a pending partial sum along one device axis, not both")]
    PartialAxisAlsoSplits {
        /// The device axis, counted from 0 at the left of the device matrix.
        axis: usize,
        /// The tensor dimension it splits, counted from 0.
        dim: usize,
    },

    /// A device axis (of a partial sum, or of a group) is not an axis of the device matrix.
    #[error("partial-sum device axis {axis} is out of range for device matrix {dims:?}")]
    PartialAxisOutOfRange {
        /// The device axis, counted from 0 at the left of the device matrix.
        axis: usize,
        /// The device matrix.
        dims: Vec<usize>,
    },

    /// A tensor dimension's size is not a multiple of the devices splitting it.
    #[error("tensor dimension {dim} of size {size} is not divisible by its split {split} (shape {shape:?})\n  hint: uneven splits are not supported; choose a split that divides {size}")]
    NotDivisible {
        /// The tensor dimension, counted from 0.
        dim: usize,
        /// The dimension's size.
        size: usize,
        /// The number of pieces the layout splits it into.
        split: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },

    /// A tensor map has another number of entries than the shape has dimensions.
    #[error("shape {shape:?} has {shape_len} dimensions but the tensor map {map} has {map_len} entries\n  hint: give one tensor-map entry per tensor dimension")]
    ShapeMapLengthMismatch {
        /// The tensor's shape.
        shape: Vec<usize>,
        /// The shape's number of dimensions.
        shape_len: usize,
        /// The tensor map, as text.
        map: String,
        /// The tensor map's number of entries.
        map_len: usize,
    },

    /// The product of a strategy's split counts does not divide the device count.
    #[error("strategy {strategy} uses {product} devices, which does not divide the device count {devices}\n  hint: the product of the split counts must divide device_num")]
    StrategyNotDividing {
        /// The strategy (or split counts), as text.
        strategy: String,
        /// The devices it uses (the product of its split counts).
        product: usize,
        /// The device count (`device_num`).
        devices: usize,
    },

    /// A strategy has a split count of 0.
    #[error("strategy {strategy} has a split count of 0 (input {input}, dimension {dim})\n  hint: split counts are at least 1")]
    ZeroSplit {
        /// The strategy, as text.
        strategy: String,
        /// The input, counted from 0.
        input: usize,
        /// The input's dimension, counted from 0.
        dim: usize,
    },

    /// An input splits an aligned dimension differently from the operator's device matrix (and not 1).
    #[error("strategy {strategy}: input {input} splits dimension {dim} {got} ways but the operator's device matrix needs {expected}\n  hint: aligned dimensions of all inputs must use the same split (or 1 for a broadcast dimension)")]
    StrategySplitMismatch {
        /// The strategy, as text.
        strategy: String,
        /// The input, counted from 0.
        input: usize,
        /// The input's dimension, counted from 0.
        dim: usize,
        /// The input's split of that dimension.
        got: usize,
        /// The split the operator's device matrix needs.
        expected: usize,
    },

    /// A MatMul strategy splits the contracted dimension differently in its two inputs.
    #[error("strategy {strategy}: MatMul splits the contracted dimension {a} ways in input 0 and {b} ways in input 1; they must match\n  hint: use the same split for the contracted dimension of both inputs")]
    ContractedSplitMismatch {
        /// The strategy, as text.
        strategy: String,
        /// The contracted dimension's split in input 0.
        a: usize,
        /// The contracted dimension's split in input 1.
        b: usize,
    },

    /// A strategy does not fit its operator (wrong number of inputs or dimensions).
    #[error("strategy {strategy}: {what}")]
    BadStrategy {
        /// The strategy, as text.
        strategy: String,
        /// What is wrong, in words.
        what: String,
    },

    /// A MindSpore `Layout` (named device axes) is not well formed or does not fit its op.
    #[error("layout {layout}: {what}\n  hint: write Layout((2, 4), (\"dp\", \"mp\"))((\"dp\", \"None\"), (\"None\", \"mp\")): one tuple of axis names per input, \"None\" for a dimension not split")]
    BadLayout {
        /// The layout, as text.
        layout: String,
        /// What is wrong, in words.
        what: String,
    },

    /// Text (a strategy, a tensor map, a layout line) cannot be parsed.
    #[error("cannot parse {what} from {text:?}: {reason}")]
    Parse {
        /// What was being parsed, in words.
        what: &'static str,
        /// The text that was given.
        text: String,
        /// Why it does not parse.
        reason: String,
    },

    /// The source and destination layouts of a redistribution describe tensors of different shapes.
    #[error("cannot redistribute: source shape {src:?} differs from destination shape {dst:?}\n  hint: redistribution moves one tensor between layouts; reshape it first")]
    ShapeMismatch {
        /// The source layout's tensor shape.
        src: Vec<usize>,
        /// The destination layout's tensor shape.
        dst: Vec<usize>,
    },

    /// The source and destination layouts of a redistribution span different device counts.
    #[error("cannot redistribute: source spans {src} devices, destination {dst}\n  hint: both layouts must describe the same devices")]
    DeviceCountMismatch {
        /// Devices of the source layout's device matrix.
        src: usize,
        /// Devices of the destination layout's device matrix.
        dst: usize,
    },

    /// A simulated redistribution got inconsistent input (block shapes, slices) or its planner did not converge.
    #[error("simulation input: {what}")]
    Simulation {
        /// What is wrong, in words.
        what: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = LayoutError> = std::result::Result<T, E>;
