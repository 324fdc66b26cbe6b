//! Errors of the trainer: what failed, the facts (file, parameter, value), one `hint:`.

use std::path::PathBuf;

use autopar_checkpoint::CheckpointError;
use autopar_data::DataError;
use thiserror::Error;

use crate::error::RuntimeError;

/// Everything that can go wrong while setting up or running a training job.
#[derive(Debug, Error)]
pub enum TrainError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),

    #[error(transparent)]
    Data(Box<DataError>),

    #[error("cannot build the network {model}: {source}")]
    Network { model: String, source: Box<dyn std::error::Error + Send + Sync> },

    #[error("the network {model} has a loss of shape {shape:?}; the trainer reports the mean loss per sample and needs a scalar loss\nhint: end the network with a mean over the batch (ReduceMean), or train it with TrainStep, which takes any float loss")]
    LossNotScalar { model: String, shape: Vec<usize> },

    #[error("invalid training option {option} = {value}\n  expected {expected}\nhint: {hint}")]
    Config { option: &'static str, value: String, expected: String, hint: String },

    #[error("the data do not fit the network\n  {what}: the data give {data:?}, the network {network} expects {expected:?}\nhint: {hint}")]
    DataMismatch { what: &'static str, network: String, data: Vec<usize>, expected: Vec<usize>, hint: String },

    #[error("checkpoint {}: {source}", path.display())]
    Checkpoint { path: PathBuf, source: Box<CheckpointError> },

    #[error("checkpoint {} has no parameter {name}\n  the network needs {name} {shape:?}\nhint: the checkpoint was saved from another network; check --model and its sizes", path.display())]
    InitMissing { path: PathBuf, name: String, shape: Vec<usize> },

    #[error("parameter {name} in checkpoint {} has shape {got:?}, the network expects {shape:?}\nhint: the checkpoint was saved from a network of other sizes; check the model options (width, depth, classes, input shape)", path.display())]
    InitShape { path: PathBuf, name: String, shape: Vec<usize>, got: Vec<usize> },

    #[error("cannot resume from {}\n  {problem}\nhint: {hint}", path.display())]
    Resume { path: PathBuf, problem: String, hint: String },

    #[error("cannot write {}: {source}\nhint: check that the folder exists and is writable", path.display())]
    Write { path: PathBuf, source: std::io::Error },

    #[error("rank {rank} failed: {source}")]
    Rank { rank: usize, source: Box<TrainError> },

    #[error("this process was started by mpirun ({size} processes), but autopar was built without MPI support\nhint: build with MPI: cargo build --release --features mpi (needs libopenmpi-dev and libclang-dev), then start it with mpirun or autopar launch")]
    MpiNotBuilt { size: usize },
}

impl From<DataError> for TrainError {
    fn from(e: DataError) -> Self {
        TrainError::Data(Box::new(e))
    }
}

/// Short for `Result<T, TrainError>`.
pub type TrainResult<T, E = TrainError> = std::result::Result<T, E>;
