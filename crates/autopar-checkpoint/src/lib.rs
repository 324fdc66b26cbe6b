//! # autopar-checkpoint: distributed checkpoints and strategy files
//!
//! Reads and writes what a distributed run leaves on disk, compatible with MindSpore 2.10:
//! per-rank checkpoints (safetensors, autopar's native format, and MindSpore `.ckpt`), strategy
//! files (protobuf `ParallelStrategyMap` and its JSON variant), group-info files, and transforms
//! checkpoints between strategies (MindSpore's `checkpoint_transform` module).
//!
//! ```no_run
//! use std::path::Path;
//! use autopar_checkpoint::{rank_list_for_transform, transform_checkpoints, CheckpointFile, TransformOptions};
//!
//! // A run's per-rank files `src/rank_<k>/*.ckpt`, saved under src_strategy.ckpt, resharded for
//! // the strategy of another job (MindSpore's `transform_checkpoints`).
//! let (src, dst) = (Path::new("src_strategy.ckpt"), Path::new("dst_strategy.ckpt"));
//! println!("rank 0 needs {:?}", rank_list_for_transform(0, Some(src), Some(dst))?);
//! let report = transform_checkpoints(Path::new("src"), Path::new("dst"), Some(src), Some(dst), &TransformOptions::default())?;
//! let rank0 = CheckpointFile::open(&report.files[0])?;
//! for t in rank0.tensors() {
//!     println!("{} {:?} {:?}", t.name, t.dtype, t.shape);
//! }
//! # Ok::<(), autopar_checkpoint::CheckpointError>(())
//! ```
//!
//! Key decisions:
//! * **Index first, bytes on demand.** Opening a checkpoint reads only its index (the safetensors
//!   header; for `.ckpt` a walk over the protobuf wire format that records where each tensor's
//!   bytes lie, chunks included). Whole tensors are read through short-lived memory maps, boxes
//!   of them with positioned reads of their rows, so a transform copies slice ranges straight
//!   from the source file into the destination buffer and never reads what it does not need,
//!   and a rank reads its own slices of a checkpoint saved under another strategy
//!   ([`PieceReader`]) without another rank's bytes entering its process.
//! * **Boxes, not simulated collectives.** MindSpore turns a layout change into `AllConcat` /
//!   `StridedSlice` programs run on whole numpy copies of every needed file. Every stored piece
//!   (model-parallel slice, then optimizer shard of dim 0) is a box of the full tensor, so a
//!   destination piece is the union of its intersections with the source boxes: the same bytes,
//!   one destination tensor in memory per job. The layout algebra comes from `autopar-layout`.
//! * **Files as MindSpore writes them.** [`StrategyFile`] keeps message counts and field values as
//!   read, so re-writing a file gives the same bytes; `.ckpt` values over 512 MiB are chunked and
//!   the optional CRC trailer is written and verified; safetensors names are sorted.
//! * **No silent mismatches.** Protobuf strategies carry no full shapes, so the full shape is
//!   derived from the source slices and checked against the JSON `tensor_shape` when present,
//!   every read slice's shape is checked, and two ranks the source strategy calls replicas must
//!   agree on their bytes (sampled), which catches a checkpoint saved under another strategy.
//! * **Crash safety.** Every output goes to a temp file in its folder, then fsync and rename
//!   ([`io::AtomicFile`]); inputs are opened read-only.
//! * **Errors name the file, tensor and rank** and say what was expected ([`CheckpointError`]).

pub mod checkpoint;
pub mod ckpt;
pub mod dtype;
pub mod error;
pub mod hf;
pub mod io;
pub mod pieces;
pub mod rank_list;
pub mod safetensors;
pub mod strategy;
pub mod transform;

/// Types generated from MindSpore's protobuf schemas (`proto/*.proto`).
pub mod proto {
    /// `node_strategy.proto`, package `mindspore.straspb`.
    #[allow(clippy::all, missing_docs)]
    pub mod straspb {
        include!(concat!(env!("OUT_DIR"), "/mindspore.straspb.rs"));
    }
    /// `checkpoint.proto` (no package).
    #[allow(clippy::all, missing_docs)]
    pub mod ckpt {
        include!(concat!(env!("OUT_DIR"), "/_.rs"));
    }
}

pub use checkpoint::{
    collect_rank_files, load_segmented, save, save_from, save_with, ByteSink, CheckpointFile, CheckpointWriter, Format, NameFilter,
    OpenOptions, Tensor, TensorEntry, TensorSpec,
};
pub use ckpt::CkptWriter;
pub use dtype::DType;
pub use error::{CheckpointError, Misuse, Result};
pub use pieces::PieceReader;
pub use safetensors::SafetensorsWriter;
pub use strategy::{merge_stage_files, merge_strategies, GroupInfo, LayoutItem, LayoutMap, ParamLayout, StrategyFile, StrategyItem};
pub use transform::{
    rank_list_for_transform, transform_checkpoint_by_rank, transform_checkpoints, TransformOptions, TransformPlanner, TransformReport,
};
