//! The error type of autopar-parallel.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ParallelError {
    #[error("unknown parallel option {option:?}\n  valid options: {}\nhint: check the spelling; options use MindSpore's set_auto_parallel_context names", valid.join(", "))]
    UnknownOption { option: String, valid: Vec<String> },

    #[error("invalid value {value} for parallel option {option}\n  expected {expected}")]
    InvalidOption { option: String, value: String, expected: String },

    #[error("parallel option {option} conflicts with the other options\n  {why}")]
    Conflict { option: String, why: String },

    #[error("invalid strategy {strategy} for {kind} {name:?}\n  {why}\nhint: autopar layout --strategy '{strategy}' --devices N shows what a strategy does")]
    InvalidStrategy { kind: &'static str, name: String, strategy: String, why: String },

    #[error("{kind} {name:?} cannot be planned\n  {why}")]
    UnsupportedOp { kind: &'static str, name: String, why: String },

    #[error("input {input:?} with shape {shape:?} cannot be split over {devices} devices by its batch dimension ({mode})\nhint: use a batch size divisible by {devices}, or dataset_strategy = \"full_batch\"")]
    BatchNotDivisible { input: String, shape: Vec<usize>, devices: usize, mode: &'static str },

    #[error("invalid dataset_strategy\n  {why}")]
    DatasetStrategy { why: String },

    #[error("{context}: {source}")]
    Layout {
        context: String,
        #[source]
        source: autopar_layout::LayoutError,
    },

    #[error("{context}: {source}")]
    Graph {
        context: String,
        #[source]
        source: Box<autopar_graph::GraphError>,
    },

    #[error("rank {rank} is out of range for {devices} devices")]
    RankOutOfRange { rank: usize, devices: usize },

    #[error("internal planner error: {what}\nhint: this is a bug in autopar; please report it with the graph and strategies")]
    Internal { what: String },

    #[error("parallel option {option} = {value} is not supported yet\n  autopar parses and validates it, but does not implement its behaviour\nhint: remove it from the configuration")]
    NotSupportedYet { option: String, value: String },
}

pub type Result<T, E = ParallelError> = std::result::Result<T, E>;
