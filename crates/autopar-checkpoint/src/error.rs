//! The one error type of this crate. Variants carry the facts (file, tensor, rank, sizes); the
//! text is a first line, indented facts and at most one `hint:`.

use std::path::PathBuf;

use autopar_layout::LayoutError;
use thiserror::Error;

/// Everything that can go wrong while reading, writing or transforming checkpoints and strategy files.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// A file-system operation failed.
    #[error("cannot {op} {path}\n  {source}")]
    Io {
        /// What was being done (`open`, `read`, `write`, `list`, ...).
        op: &'static str,
        /// The file or folder it was done on.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A file that was asked for does not exist.
    #[error("{what} {path} not found\n  hint: check the path")]
    NotFound {
        /// What the file should be, in words (`checkpoint`, `strategy file`, ...).
        what: &'static str,
        /// The path that was given.
        path: PathBuf,
    },

    /// The source checkpoints of a transform hold none of the tensors the strategies place.
    #[error("the source checkpoints (such as {path}) hold none of the {placed} tensors the strategies place (such as {first})\n  hint: check that they are this network's checkpoints, saved under the source strategy")]
    NoSourceTensors {
        /// One of the source files.
        path: PathBuf,
        /// How many tensors the strategies place.
        placed: usize,
        /// The first of them.
        first: String,
    },

    /// A checkpoint changed length on disk after it was opened (rewritten in place).
    #[error("checkpoint {path} changed on disk while it was open: {opened} bytes when opened, {now} now\n  hint: another program rewrote it in place; open it again once it is written")]
    ChangedOnDisk {
        /// The file.
        path: PathBuf,
        /// Its length when opened.
        opened: u64,
        /// Its length now.
        now: u64,
    },

    /// The source and destination strategies of a transform place no parameter in common.
    #[error("strategy files {src} and {dst} have no parameter in common (such as {src_example:?} and {dst_example:?}): they describe different networks\n  hint: give the strategies the checkpoints were saved under and the one to transform to, of one network")]
    DisjointStrategies {
        /// The source strategy file.
        src: PathBuf,
        /// The destination strategy file.
        dst: PathBuf,
        /// One of the source's parameters.
        src_example: String,
        /// One of the destination's parameters.
        dst_example: String,
    },

    /// A path that should be a file is a folder.
    #[error("{path} is a directory, expected a {what} file\n  hint: pass the file itself (`ls {path}` shows what the folder holds)")]
    IsADirectory {
        /// The path that was given.
        path: PathBuf,
        /// What the file should be, in words (`checkpoint`, `strategy`, ...).
        what: &'static str,
    },

    /// A path that should be a folder is not one.
    #[error("{path} is not a directory\n  hint: pass the folder that holds the {what}")]
    NotADirectory {
        /// The path that was given.
        path: PathBuf,
        /// What the folder should hold, in words.
        what: &'static str,
    },

    /// A protobuf or JSON file could not be decoded.
    #[error("cannot decode {what} {path}\n  {reason}\n  hint: is this file a MindSpore {what}?")]
    Decode {
        /// What the file should be, in words.
        what: &'static str,
        /// The file that was read.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },

    /// A strategy file decodes but its content is inconsistent.
    #[error("invalid strategy file {path}\n  {reason}")]
    InvalidStrategy {
        /// The file that was read.
        path: PathBuf,
        /// What is wrong, in words.
        reason: String,
    },

    /// A strategy file holds no strategy items or no layout items.
    #[error("strategy file {path} holds no {missing}\n  hint: MindSpore writes it with strategy_ckpt_config save_file; merge per-stage files with `autopar ckpt merge-strategies`")]
    EmptyStrategy {
        /// The file that was read.
        path: PathBuf,
        /// What it lacks, in words (`strategy items`, `layout items`).
        missing: &'static str,
    },

    /// A folder of per-stage strategy files holds both `.ckpt` and `.json` files.
    #[error("strategy folder {dir} mixes .ckpt and .json files\n  hint: the strategy files must be all '.ckpt' or all '.json'")]
    MixedStrategyFormats {
        /// The folder that was searched.
        dir: PathBuf,
    },

    /// A folder of per-stage strategy files holds no `.ckpt` or `.json` file.
    #[error("strategy folder {dir} holds no strategy files (*.ckpt or *.json)")]
    NoStrategyFiles {
        /// The folder that was searched.
        dir: PathBuf,
    },

    /// The pipeline stages of a strategy file are not 0, 1, ... without gaps.
    #[error("pipeline stages {stages:?} of strategy {path} are not 0..{count}\n  hint: the strategy file for pipeline parallel must contain all stages; merge one file per stage with `autopar ckpt merge-strategies`")]
    MissingStages {
        /// The file that was read.
        path: PathBuf,
        /// The stages the file names, in ascending order.
        stages: Vec<u32>,
        /// How many distinct stages the file names.
        count: usize,
    },

    /// The `rank_<k>` folders of a checkpoint folder hold both `.ckpt` and `.safetensors` files.
    #[error("checkpoint folder {dir} mixes .ckpt and .safetensors files\n  hint: convert or move one of the formats away")]
    MixedCheckpointFormats {
        /// The checkpoint folder.
        dir: PathBuf,
    },

    /// A checkpoint folder holds no checkpoint file where one is looked for.
    #[error("checkpoint folder {dir} holds no rank_<k>/*.ckpt or rank_<k>/*.safetensors files\n  hint: the layout is <dir>/rank_<k>/<name>.ckpt|safetensors")]
    NoCheckpoints {
        /// The checkpoint folder.
        dir: PathBuf,
    },

    /// A checkpoint path ends neither in `.ckpt` nor in `.safetensors`.
    #[error("unknown checkpoint format of {path}\n  hint: checkpoints end in .ckpt (MindSpore) or .safetensors")]
    UnknownFormat {
        /// The path that was given.
        path: PathBuf,
    },

    /// A tensor's element type is not one autopar knows.
    #[error("tensor {tensor:?} in {path} has unknown dtype {dtype:?}\n  hint: supported: Float16 Float32 Float64 BFloat16 Int8..Int64 UInt8..UInt64 Bool (safetensors F16 F32 F64 BF16 I8..I64 U8..U64 BOOL)")]
    UnknownDtype {
        /// The file that was read.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The type's name as stored.
        dtype: String,
    },

    /// A file ends before the data its structure promises.
    #[error("{path} is truncated\n  {what}: needs bytes up to {needed}, the file has {len}\n  hint: the file was cut short (interrupted copy or write); copy it again")]
    Truncated {
        /// The file that was read.
        path: PathBuf,
        /// The part that is cut short, in words.
        what: String,
        /// The file length in bytes the part needs.
        needed: u64,
        /// The file length in bytes.
        len: u64,
    },

    /// The CRC-32 stored in a file differs from the one computed over its content.
    #[error("{path} fails its CRC check\n  stored CRC-32 {stored:#010x}, computed {computed:#010x}\n  hint: the file is corrupted; restore it from another copy")]
    BadCrc {
        /// The file that was read.
        path: PathBuf,
        /// The CRC-32 stored in the file.
        stored: u32,
        /// The CRC-32 computed from the file's content.
        computed: u32,
    },

    /// A safetensors file declares a header longer than any real one.
    #[error("{path} has an absurd header length {len} (file size {file_len})\n  hint: the file is corrupted or not a safetensors file")]
    HeaderTooLarge {
        /// The file that was read.
        path: PathBuf,
        /// The declared header length in bytes.
        len: u64,
        /// The file length in bytes.
        file_len: u64,
    },

    /// A checkpoint file's structure is invalid.
    #[error("malformed checkpoint {path}\n  {reason}")]
    Malformed {
        /// The file that was read.
        path: PathBuf,
        /// What is wrong, in words.
        reason: String,
    },

    /// A tensor holds a different number of bytes than its dtype and shape call for.
    #[error("tensor {tensor:?} in {path} holds {actual} bytes, but {dtype} {shape:?} needs {expected}\n  hint: the file is corrupted")]
    TensorSize {
        /// The file that was read.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The tensor's element type, in words.
        dtype: String,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Bytes the dtype and shape call for.
        expected: u64,
        /// Bytes the file holds.
        actual: u64,
    },

    /// A checkpoint file lacks a tensor that was asked for.
    #[error("tensor {tensor:?} not found in {path}")]
    MissingTensor {
        /// The file that was read.
        path: PathBuf,
        /// The tensor that was asked for.
        tensor: String,
    },

    /// A tensor is of a kind autopar cannot handle (e.g. a MindSpore map parameter).
    #[error("tensor {tensor:?}: {reason}")]
    Unsupported {
        /// The tensor's name.
        tensor: String,
        /// What is not supported, in words.
        reason: String,
    },

    /// A destination rank needs a source rank whose checkpoint is missing.
    #[error("destination rank {dst_rank} needs source rank {src_rank}: {path} not found\n  hint: copy rank {src_rank}'s checkpoint into {path}, or check `src_strategy`")]
    MissingRank {
        /// The destination rank, counted in the world.
        dst_rank: usize,
        /// The source rank it needs, counted in the world.
        src_rank: usize,
        /// Where the source rank's checkpoint was looked for.
        path: PathBuf,
    },

    /// A source checkpoint holds a tensor slice of another shape than the source strategy gives it.
    #[error("tensor {tensor:?} of source rank {rank} has shape {actual:?}, but the source strategy gives it {expected:?}\n  file: {path}\n  hint: the checkpoint was saved under another strategy; pass the strategy file it was saved with")]
    ShapeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The source rank, counted in the world.
        rank: usize,
        /// The source rank's checkpoint file.
        path: PathBuf,
        /// The slice shape the source strategy gives.
        expected: Vec<usize>,
        /// The shape in the checkpoint.
        actual: Vec<usize>,
    },

    /// A strategy file records a full tensor shape that differs from the checkpoint's.
    #[error("tensor {tensor:?}: the {which} strategy{} gives full shape {strategy:?}, the checkpoint gives {checkpoint:?}\n  hint: the strategy file does not belong to this network", file.as_ref().map(|f| format!(" {}", f.display())).unwrap_or_default())]
    StrategyShapeMismatch {
        /// The tensor's name.
        tensor: String,
        /// Which strategy: `source` or `destination`.
        which: &'static str,
        /// The strategy file, when known.
        file: Option<PathBuf>,
        /// The full shape the strategy records.
        strategy: Vec<usize>,
        /// The full shape from the checkpoint.
        checkpoint: Vec<usize>,
    },

    /// Two source ranks that should hold the same slice under the source strategy hold different bytes.
    #[error("tensor {tensor:?}: source ranks {rank_a} and {rank_b} should hold the same slice under the source strategy, but their bytes differ\n  files: {path_a}, {path_b}\n  hint: the checkpoint was saved under another strategy (optimizer sharding?); pass the strategy file it was saved with")]
    ReplicasDiffer {
        /// The tensor's name.
        tensor: String,
        /// The first source rank, counted in the world.
        rank_a: usize,
        /// The second source rank, counted in the world.
        rank_b: usize,
        /// The first rank's checkpoint file.
        path_a: PathBuf,
        /// The second rank's checkpoint file.
        path_b: PathBuf,
    },

    /// Source ranks hold the same tensor with different element types.
    #[error("tensor {tensor:?} of source rank {rank} is {actual}, but the other source ranks hold it as {expected}\n  file: {path}")]
    DtypeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The source rank that differs, counted in the world.
        rank: usize,
        /// That rank's checkpoint file.
        path: PathBuf,
        /// The element type the other source ranks hold.
        expected: String,
        /// The element type this rank holds.
        actual: String,
    },

    /// Under `strict`, tensors are in one strategy but not in the other.
    #[error("{count} tensor(s) are in the {present} strategy but not in the {missing} strategy: {names}\n  hint: without `strict` they are copied unchanged from the paired source rank, as MindSpore does; or use strategy files of the same network")]
    NotInBothStrategies {
        /// Number of such tensors.
        count: usize,
        /// The strategy that has them: `source` or `destination`.
        present: &'static str,
        /// The strategy that lacks them.
        missing: &'static str,
        /// Their names, comma-separated.
        names: String,
    },

    /// A tensor dimension (or a replica group) does not divide evenly into the pieces a layout needs.
    #[error(
        "tensor {tensor:?}: dimension {dim} of size {size} does not divide into {split} ({what})\n  hint: uneven splits are not supported"
    )]
    NotDivisible {
        /// The tensor's name.
        tensor: String,
        /// The dimension, counted from 0.
        dim: usize,
        /// The size that is split.
        size: usize,
        /// Into how many pieces.
        split: usize,
        /// What is being split, in words.
        what: &'static str,
    },

    /// A strategy's layout of a tensor is invalid for the tensor's shape.
    #[error("tensor {tensor:?}: invalid {which} layout\n  {source}")]
    Layout {
        /// The tensor's name.
        tensor: String,
        /// Which strategy: `source` or `destination`.
        which: &'static str,
        /// The layout error.
        source: LayoutError,
    },

    /// A destination rank is not below the destination's device count.
    #[error("rank {rank} is out of range: the destination has {devices} ranks")]
    RankOutOfRange {
        /// The rank that was given, counted in the world.
        rank: usize,
        /// The destination's device count.
        devices: usize,
    },

    /// No checkpoint file was given for a source rank the transform needs.
    #[error("no checkpoint file given for source rank {rank}\n  hint: rank-list names the source ranks a destination rank needs")]
    MissingRankFile {
        /// The source rank, counted in the world.
        rank: usize,
    },

    /// MindSpore's rank-list computation refuses a tensor's pair of layouts.
    #[error("tensor {tensor:?}: MindSpore's rank list cannot be computed for these layouts\n  {reason}\n  hint: check that both strategy files belong to this network (`autopar ckpt inspect FILE` prints them)")]
    RankListLayout {
        /// The tensor's name.
        tensor: String,
        /// Why, in words.
        reason: String,
    },

    /// A strategy holds no parameter for the destination rank's pipeline stage.
    #[error("the {which} strategy holds no parameter for this destination rank's pipeline stage\n  hint: check the rank and the `dst_strategy` file")]
    RankListEmpty {
        /// Which strategy: `source` or `destination`.
        which: &'static str,
    },

    /// A transform would write its output over its own source files.
    #[error("the output {output} is the source {source_path}: the transform would overwrite the checkpoints it reads\n  hint: write the transformed checkpoints into another folder")]
    OverwritesSource {
        /// The output folder or file.
        output: PathBuf,
        /// The source folder or file it coincides with.
        source_path: PathBuf,
    },

    /// A call the checkpoint code cannot carry out.
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
        /// The thread's job, in words (e.g. `writer`).
        what: &'static str,
    },
    /// A `.ckpt` writer was asked to chunk values into pieces of 0 bytes.
    ZeroChunkSize,
    /// A tensor name was given twice to a writer.
    DuplicateTensor {
        /// The name given twice.
        name: String,
    },
    /// A tensor written after every declared one, or out of the declared order.
    UnexpectedTensor {
        /// The tensor that was written.
        name: String,
        /// The tensor expected at this point; `None` when every declared tensor was already written.
        expected: Option<String>,
    },
    /// A tensor was written with a byte count its dtype and shape do not call for.
    WrongByteCount {
        /// The tensor's name.
        name: String,
        /// The tensor's element type, in words.
        dtype: String,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Bytes the dtype and shape call for.
        needs: usize,
        /// Bytes given.
        got: usize,
    },
    /// A writer was finished before every declared tensor was written.
    MissingTensors {
        /// Tensors written.
        written: usize,
        /// Tensors declared.
        declared: usize,
    },
    /// More tensors were written than declared.
    TooManyTensors {
        /// Tensors declared.
        declared: usize,
    },
    /// A format name is neither `ckpt` nor `safetensors`.
    UnknownFormat {
        /// The name that was given.
        format: String,
    },
    /// A region to read is outside the tensor's shape or has a start after its end.
    RegionOutside {
        /// The tensor's name.
        name: String,
        /// The region: one range of indices per dimension.
        region: Vec<std::ops::Range<usize>>,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// No tensor of a checkpoint folder passes the name filters.
    NothingSelected {
        /// The checkpoint folder.
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

impl From<autopar_files::FileError> for CheckpointError {
    fn from(e: autopar_files::FileError) -> Self {
        CheckpointError::io(e.op, e.path)(e.source)
    }
}

/// Short for `Result<T, CheckpointError>`.
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
