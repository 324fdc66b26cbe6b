//! The error type of autopar-parallel.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParallelError {
    #[error("unknown parallel option {option:?}\n  valid options: {}\nhint: check the spelling; options use MindSpore's set_auto_parallel_context names", valid.join(", "))]
    UnknownOption { option: String, valid: Vec<String> },

    #[error("invalid value {value} for parallel option {option}\n  expected {expected}")]
    InvalidOption { option: String, value: String, expected: String },

    #[error("parallel option {option} conflicts with the other options\n  {why}")]
    Conflict { option: String, why: String },

    #[error("parallel option {option} = {value} is not supported yet\n  autopar parses and validates it, but does not implement its behaviour\nhint: remove it from the configuration")]
    NotSupportedYet { option: String, value: String },
}

pub type Result<T, E = ParallelError> = std::result::Result<T, E>;
