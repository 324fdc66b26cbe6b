//! Errors of the trainer: what failed, the facts (file, parameter, value), one `hint:`.

use std::path::PathBuf;

use autopar_checkpoint::CheckpointError;
use autopar_data::DataError;
use thiserror::Error;

use crate::error::RuntimeError;

/// Everything that can go wrong while setting up or running a training job.
#[derive(Debug, Error)]
pub enum TrainError {
    /// Running the graph, updating parameters or communicating failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),

    /// Opening or reading the dataset failed.
    #[error(transparent)]
    Data(Box<DataError>),

    /// Building the network failed.
    #[error("cannot build the network {model}: {source}")]
    Network {
        /// The network's name.
        model: String,
        /// The builder's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The network's loss is not a scalar.
    #[error("the network {model} has a loss of shape {shape:?}; the trainer reports the mean loss per sample and needs a scalar loss\nhint: end the network with a mean over the batch (ReduceMean), or train it with a RankTrainer (RankTrainer::alone for one device), which takes any float loss")]
    LossNotScalar {
        /// The network's name.
        model: String,
        /// The loss's shape.
        shape: Vec<usize>,
    },

    /// A training option has an invalid value, or options contradict each other.
    #[error("invalid training option {option} = {value}\n  expected {expected}\nhint: {hint}")]
    Config {
        /// The option's name.
        option: &'static str,
        /// The value that was given, as text.
        value: String,
        /// What was expected, in words.
        expected: String,
        /// How to fix it.
        hint: String,
    },

    /// The data's samples or labels do not fit the network's input or labels.
    #[error("the data do not fit the network\n  {what}: the data give {data:?}, the network {network} expects {expected:?}\nhint: {hint}")]
    DataMismatch {
        /// What does not fit (e.g. "batch shape", "labels").
        what: &'static str,
        /// The network's name.
        network: String,
        /// The shape the data give.
        data: Vec<usize>,
        /// The shape the network expects.
        expected: Vec<usize>,
        /// How to fix it.
        hint: String,
    },

    /// Reading or writing a checkpoint file failed.
    #[error("checkpoint {}: {error}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// The checkpoint crate's error (in this message, not repeated as its cause).
        error: Box<CheckpointError>,
    },

    /// Writing the predictions file failed.
    #[error("writing the predictions to {}: {error}", path.display())]
    Predictions {
        /// The predictions file.
        path: PathBuf,
        /// The checkpoint crate's error.
        error: Box<CheckpointError>,
    },

    /// The checkpoint lacks a parameter the network needs.
    #[error("checkpoint {} has no parameter {name}\n  the network needs {name} {shape:?}\nhint: the checkpoint was saved from another network; check `model` and its sizes", path.display())]
    InitMissing {
        /// The checkpoint file.
        path: PathBuf,
        /// The parameter's name.
        name: String,
        /// The parameter's shape in the network.
        shape: Vec<usize>,
    },

    /// A parameter in the checkpoint has another shape than the network's.
    #[error("parameter {name} in checkpoint {} has shape {got:?}, the network expects {shape:?}\nhint: the checkpoint was saved from a network of other sizes (check the model options: width, depth, classes, input shape), or it is one rank's slice of a parallel run (pass the run's checkpoint folder, whose strategy.json describes the slices, or its strategy file with `init_strategy`)", path.display())]
    InitShape {
        /// The checkpoint file.
        path: PathBuf,
        /// The parameter's name.
        name: String,
        /// The shape the network expects.
        shape: Vec<usize>,
        /// The shape in the checkpoint.
        got: Vec<usize>,
    },

    /// The checkpoint to resume from is missing or does not record a training position.
    #[error("cannot resume from {}\n  {problem}\nhint: {hint}", path.display())]
    Resume {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it, in words.
        problem: String,
        /// How to fix it.
        hint: String,
    },

    /// Writing a file (metrics, a loss curve) or creating a folder failed.
    #[error("cannot write {}: {source}\nhint: check that the folder exists and is writable", path.display())]
    Write {
        /// The file or folder that was written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// The folder checkpoints go to, or one of its parents, is a file.
    #[error("the checkpoint folder {} {} is a file, not a folder\nhint: name a folder (it is created if missing), or move the file away", path.display(), if path == file { "itself".to_string() } else { format!("cannot be made: {}", file.display()) })]
    NotAFolder {
        /// The path given as the checkpoint folder.
        path: PathBuf,
        /// The file on that path: the folder itself, or a parent.
        file: PathBuf,
    },

    /// A rank of a run simulated in one process failed.
    #[error("rank {rank} failed: {source}")]
    Rank {
        /// The rank that failed, global.
        rank: usize,
        /// That rank's error.
        source: Box<TrainError>,
    },

    /// The run was asked to stop (Ctrl-C in the Python package) and stopped after a step.
    #[error("interrupted after step {step}")]
    Interrupted {
        /// The last step taken.
        step: u64,
    },

    /// Training finished, but the evaluation after it failed.
    #[error("training finished at step {last_step}{}, but the evaluation after it failed: {source}", saved_note(checkpoint))]
    EvalAfterTraining {
        /// The step training ended at.
        last_step: u64,
        /// The folder of the run's checkpoints, the last of them at `last_step` (None: the run
        /// saved none).
        checkpoint: Option<PathBuf>,
        /// The evaluation's error.
        source: Box<TrainError>,
    },

    /// The process was started by mpirun, but autopar was built without the `mpi` feature.
    #[error("this process was started by mpirun ({size} processes), but autopar was built without MPI support\nhint: build with MPI: cargo build --release --features mpi (needs libopenmpi-dev and libclang-dev), then start it with mpirun or autopar launch")]
    MpiNotBuilt {
        /// The number of processes mpirun started.
        size: usize,
    },
}

fn saved_note(checkpoint: &Option<PathBuf>) -> String {
    match checkpoint {
        Some(p) => {
            format!(" and saved the trained parameters in its checkpoint of that step in {} (with its strategy file), which can be evaluated once the cause is fixed", p.display())
        }
        None => " without a checkpoint (the trained parameters are not kept)".into(),
    }
}

impl TrainError {
    /// The error behind this one: an evaluation after training's own error, else this.
    pub fn cause(&self) -> &TrainError {
        match self {
            TrainError::EvalAfterTraining { source, .. } => source,
            e => e,
        }
    }
}

impl From<DataError> for TrainError {
    fn from(e: DataError) -> Self {
        TrainError::Data(Box::new(e))
    }
}

impl From<autopar_parallel::ParallelError> for TrainError {
    fn from(e: autopar_parallel::ParallelError) -> Self {
        TrainError::Runtime(RuntimeError::from(e))
    }
}

/// Short for `Result<T, TrainError>`.
pub type TrainResult<T, E = TrainError> = std::result::Result<T, E>;
