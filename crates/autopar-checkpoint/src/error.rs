//! The one error type of this crate. Variants carry the facts (file, tensor, rank, sizes); the
//! text is a first line, indented facts and at most one `hint:`.

use std::path::PathBuf;

use autopar_layout::LayoutError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("cannot {op} {path}\n  {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },

    #[error("{what} {path} not found\n  hint: check the path")]
    NotFound { what: &'static str, path: PathBuf },

    #[error("{path} is not a directory\n  hint: pass the folder that holds the {what}")]
    NotADirectory { path: PathBuf, what: &'static str },

    #[error("cannot decode {what} {path}\n  {reason}\n  hint: is this file a MindSpore {what}?")]
    Decode { what: &'static str, path: PathBuf, reason: String },

    #[error("invalid strategy file {path}\n  {reason}")]
    InvalidStrategy { path: PathBuf, reason: String },

    #[error("strategy file {path} holds no {missing}\n  hint: MindSpore writes it with strategy_ckpt_config save_file; merge per-stage files with `autopar ckpt merge-strategies`")]
    EmptyStrategy { path: PathBuf, missing: &'static str },

    #[error("strategy folder {dir} mixes .ckpt and .json files\n  hint: the strategy files must be all '.ckpt' or all '.json'")]
    MixedStrategyFormats { dir: PathBuf },

    #[error("strategy folder {dir} holds no strategy files (*.ckpt or *.json)")]
    NoStrategyFiles { dir: PathBuf },

    #[error("pipeline stages {stages:?} of strategy {path} are not 0..{count}\n  hint: the strategy file for pipeline parallel must contain all stages; merge one file per stage with `autopar ckpt merge-strategies`")]
    MissingStages { path: PathBuf, stages: Vec<u32>, count: usize },

    #[error("checkpoint folder {dir} mixes .ckpt and .safetensors files\n  hint: convert or move one of the formats away")]
    MixedCheckpointFormats { dir: PathBuf },

    #[error("checkpoint folder {dir} holds no rank_<k>/*.ckpt or rank_<k>/*.safetensors files\n  hint: the layout is <dir>/rank_<k>/<name>.ckpt|safetensors")]
    NoCheckpoints { dir: PathBuf },

    #[error("unknown checkpoint format of {path}\n  hint: checkpoints end in .ckpt (MindSpore) or .safetensors")]
    UnknownFormat { path: PathBuf },

    #[error("tensor {tensor:?} in {path} has unknown dtype {dtype:?}\n  hint: supported: Float16 Float32 Float64 BFloat16 Int8..Int64 UInt8..UInt64 Bool (safetensors F16 F32 F64 BF16 I8..I64 U8..U64 BOOL)")]
    UnknownDtype { path: PathBuf, tensor: String, dtype: String },

    #[error("{path} is truncated\n  {what}: needs bytes up to {needed}, the file has {len}\n  hint: the file was cut short (interrupted copy or write); copy it again")]
    Truncated { path: PathBuf, what: String, needed: u64, len: u64 },

    #[error("{path} fails its CRC check\n  stored CRC-32 {stored:#010x}, computed {computed:#010x}\n  hint: the file is corrupted; restore it from another copy")]
    BadCrc { path: PathBuf, stored: u32, computed: u32 },

    #[error("{path} has an absurd header length {len} (file size {file_len})\n  hint: the file is corrupted or not a safetensors file")]
    HeaderTooLarge { path: PathBuf, len: u64, file_len: u64 },

    #[error("malformed checkpoint {path}\n  {reason}")]
    Malformed { path: PathBuf, reason: String },

    #[error("tensor {tensor:?} in {path} holds {actual} bytes, but {dtype} {shape:?} needs {expected}\n  hint: the file is corrupted")]
    TensorSize { path: PathBuf, tensor: String, dtype: String, shape: Vec<usize>, expected: u64, actual: u64 },

    #[error("tensor {tensor:?} not found in {path}")]
    MissingTensor { path: PathBuf, tensor: String },

    #[error("tensor {tensor:?}: {reason}")]
    Unsupported { tensor: String, reason: String },

    #[error("destination rank {dst_rank} needs source rank {src_rank}: {path} not found\n  hint: copy rank {src_rank}'s checkpoint into {path}, or check --src-strategy")]
    MissingRank { dst_rank: usize, src_rank: usize, path: PathBuf },

    #[error("tensor {tensor:?} of source rank {rank} has shape {actual:?}, but the source strategy gives it {expected:?}\n  file: {path}\n  hint: the checkpoint was saved under another strategy; pass the strategy file it was saved with")]
    ShapeMismatch { tensor: String, rank: usize, path: PathBuf, expected: Vec<usize>, actual: Vec<usize> },

    #[error("tensor {tensor:?}: the {which} strategy gives full shape {strategy:?}, the checkpoint gives {checkpoint:?}\n  hint: the strategy file does not belong to this network")]
    StrategyShapeMismatch { tensor: String, which: &'static str, strategy: Vec<usize>, checkpoint: Vec<usize> },

    #[error("tensor {tensor:?}: source ranks {rank_a} and {rank_b} should hold the same slice under the source strategy, but their bytes differ\n  files: {path_a}, {path_b}\n  hint: the checkpoint was saved under another strategy (optimizer sharding?); pass the strategy file it was saved with")]
    ReplicasDiffer { tensor: String, rank_a: usize, rank_b: usize, path_a: PathBuf, path_b: PathBuf },

    #[error("tensor {tensor:?} of source rank {rank} is {actual}, but the other source ranks hold it as {expected}\n  file: {path}")]
    DtypeMismatch { tensor: String, rank: usize, path: PathBuf, expected: String, actual: String },

    #[error("{count} tensor(s) are in the {present} strategy but not in the {missing} strategy: {names}\n  hint: without --strict they are copied unchanged from the paired source rank, as MindSpore does; or use strategy files of the same network")]
    NotInBothStrategies { count: usize, present: &'static str, missing: &'static str, names: String },

    #[error(
        "tensor {tensor:?}: dimension {dim} of size {size} does not divide into {split} ({what})\n  hint: uneven splits are not supported"
    )]
    NotDivisible { tensor: String, dim: usize, size: usize, split: usize, what: &'static str },

    #[error("tensor {tensor:?}: invalid {which} layout\n  {source}")]
    Layout { tensor: String, which: &'static str, source: LayoutError },

    #[error("rank {rank} is out of range: the destination has {devices} ranks")]
    RankOutOfRange { rank: usize, devices: usize },

    #[error("no checkpoint file given for source rank {rank}\n  hint: rank-list names the source ranks a destination rank needs")]
    MissingRankFile { rank: usize },

    #[error("tensor {tensor:?}: MindSpore's rank list cannot be computed for these layouts\n  {reason}\n  hint: check that both strategy files belong to this network (`autopar ckpt inspect FILE` prints them)")]
    RankListLayout { tensor: String, reason: String },

    #[error("the {which} strategy holds no parameter for this destination rank's pipeline stage\n  hint: check the rank and the --dst-strategy file")]
    RankListEmpty { which: &'static str },

    #[error("invalid argument: {0}")]
    InvalidArgument(Misuse),
}

/// A call the checkpoint code cannot carry out, with the facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misuse {
    /// A parallel job stopped because another failed first.
    StoppedAfterOtherError,
    /// A worker thread panicked.
    WorkerPanicked {
        what: &'static str,
    },
    ZeroChunkSize,
    DuplicateTensor {
        name: String,
    },
    /// A tensor written after every declared one, or out of the declared order.
    UnexpectedTensor {
        name: String,
        expected: Option<String>,
    },
    WrongByteCount {
        name: String,
        dtype: String,
        shape: Vec<usize>,
        needs: usize,
        got: usize,
    },
    MissingTensors {
        written: usize,
        declared: usize,
    },
    TooManyTensors {
        declared: usize,
    },
    UnknownFormat {
        format: String,
    },
    RegionOutside {
        name: String,
        region: Vec<std::ops::Range<usize>>,
        shape: Vec<usize>,
    },
    NothingSelected {
        dir: PathBuf,
    },
}

impl std::fmt::Display for Misuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misuse::StoppedAfterOtherError => write!(f, "stopped after an error in another job"),
            Misuse::WorkerPanicked { what } => write!(f, "the {what} thread panicked"),
            Misuse::ZeroChunkSize => write!(f, "chunk size must be positive"),
            Misuse::DuplicateTensor { name } => write!(f, "tensor {name:?} given twice"),
            Misuse::UnexpectedTensor { name, expected: None } => write!(f, "tensor {name:?} written after the last one"),
            Misuse::UnexpectedTensor { name, expected: Some(want) } => write!(f, "tensor {name:?} written where {want:?} was expected"),
            Misuse::WrongByteCount { name, dtype, shape, needs, got } => {
                write!(f, "tensor {name:?} {dtype} {shape:?} needs {needs} bytes, got {got}")
            }
            Misuse::MissingTensors { written, declared } => write!(f, "only {written} of {declared} tensors were written"),
            Misuse::TooManyTensors { declared } => write!(f, "more tensors written than the {declared} declared"),
            Misuse::UnknownFormat { format } => write!(f, "unknown format {format:?}: expected ckpt or safetensors"),
            Misuse::RegionOutside { name, region, shape } => write!(f, "region {region:?} is outside tensor {name:?} of shape {shape:?}"),
            Misuse::NothingSelected { dir } => write!(f, "no tensor of {} passes the name filters", dir.display()),
        }
    }
}

impl CheckpointError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| {
            if source.kind() == std::io::ErrorKind::NotFound && op == "open" {
                CheckpointError::NotFound { what: "file", path }
            } else {
                CheckpointError::Io { op, path, source }
            }
        }
    }
}

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
