//! Distributed checkpoints of a parallel job: per-rank files of local slices, and
//! `load_distributed_checkpoint` (MindSpore's name): start a job from per-rank checkpoints saved
//! under another strategy or device count, resharded at load by `autopar-checkpoint`'s transform
//! (the same code as `autopar ckpt transform-rank`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use autopar_checkpoint::{
    collect_rank_files, transform_checkpoint_by_rank, CheckpointFile, DType as CkDType, TensorSpec, TransformOptions,
};
use autopar_tensor::{DType, Tensor};
use half::{bf16, f16};

use crate::error::{Result, RuntimeError};
use crate::executor::ParamStore;
use crate::parallel::ParallelJob;

fn ck_err(what: impl Into<String>) -> impl FnOnce(autopar_checkpoint::CheckpointError) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::Parallel { message: format!("{what}: {e}") }
}

/// A tensor's element type and little-endian bytes, as checkpoints store them.
pub fn tensor_bytes(t: &Tensor) -> Result<(CkDType, Vec<u8>)> {
    let k = |e| RuntimeError::Kernel { kind: "checkpoint", name: String::new(), source: Box::new(e) };
    Ok(match t.dtype() {
        DType::F32 => (CkDType::Float32, t.to_vec::<f32>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F64 => (CkDType::Float64, t.to_vec::<f64>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::F16 => (CkDType::Float16, t.to_vec::<f16>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::BF16 => (CkDType::BFloat16, t.to_vec::<bf16>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I32 => (CkDType::Int32, t.to_vec::<i32>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        DType::I64 => (CkDType::Int64, t.to_vec::<i64>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
    })
}

/// A tensor from checkpoint bytes; `name` and `path` appear in errors.
pub fn tensor_from_bytes(dtype: CkDType, shape: &[usize], bytes: &[u8], name: &str, path: &Path) -> Result<Tensor> {
    fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        b.chunks_exact(N).map(|c| c.try_into().expect("exact chunks"))
    }
    let k = |e| RuntimeError::Kernel { kind: "checkpoint", name: name.to_string(), source: Box::new(e) };
    match dtype {
        CkDType::Float32 => Tensor::from_vec(shape, chunks::<4>(bytes).map(f32::from_le_bytes).collect()).map_err(k),
        CkDType::Float64 => Tensor::from_vec(shape, chunks::<8>(bytes).map(f64::from_le_bytes).collect()).map_err(k),
        CkDType::Float16 => Tensor::from_vec(shape, chunks::<2>(bytes).map(f16::from_le_bytes).collect()).map_err(k),
        CkDType::BFloat16 => Tensor::from_vec(shape, chunks::<2>(bytes).map(bf16::from_le_bytes).collect()).map_err(k),
        CkDType::Int32 => Tensor::from_vec(shape, chunks::<4>(bytes).map(i32::from_le_bytes).collect()).map_err(k),
        CkDType::Int64 => Tensor::from_vec(shape, chunks::<8>(bytes).map(i64::from_le_bytes).collect()).map_err(k),
        other => Err(RuntimeError::Parallel {
            message: format!("checkpoint {}: tensor {name} has element type {other:?}, which autopar cannot train\nhint: store parameters as float16/bfloat16/float32/float64", path.display()),
        }),
    }
}

/// Write `store` (a rank's local slices, or full tensors) to `path` (`.safetensors` or `.ckpt`),
/// atomically, with `metadata`.
pub fn save_checkpoint(store: &ParamStore, path: &Path, metadata: &BTreeMap<String, String>) -> Result<()> {
    let mut tensors = Vec::with_capacity(store.len());
    for (name, t) in store.iter() {
        let (dtype, bytes) = tensor_bytes(t)?;
        tensors.push((TensorSpec { name: name.clone(), dtype, shape: t.shape().to_vec() }, bytes));
    }
    autopar_checkpoint::save(path, &tensors, metadata).map_err(ck_err(format!("cannot write checkpoint {}", path.display())))
}

/// Every tensor of checkpoint `path`.
pub fn load_checkpoint(path: &Path) -> Result<ParamStore> {
    let f = CheckpointFile::open(path).map_err(ck_err(format!("cannot open checkpoint {}", path.display())))?;
    let mut store = ParamStore::new();
    for e in f.tensors() {
        let bytes = f.read(&e.name).map_err(ck_err(format!("cannot read {} from {}", e.name, path.display())))?;
        store.insert(&e.name, tensor_from_bytes(e.dtype, &e.shape, &bytes, &e.name, path)?);
    }
    Ok(store)
}

/// This rank's parameters (local slices) under `job`'s strategy,
/// read from the per-rank checkpoints `src_dir/rank_<k>/*` saved under `src_strategy` (`None`:
/// one unsplit checkpoint in `src_dir/rank_0`). Every parameter of the job must be found, with
/// its full shape; errors name the file, tensor and rank.
pub fn load_distributed_checkpoint(job: &ParallelJob, rank: usize, src_dir: &Path, src_strategy: Option<&Path>) -> Result<ParamStore> {
    let program = job.program(rank)?;
    let scratch = scratch_dir(rank)?;
    let dst_strategy = scratch.join("destination_strategy.json");
    crate::strategy_io::save_strategy_file(job.graph(), &job.plan()?, &dst_strategy, false)?;
    let (files, _) = collect_rank_files(src_dir).map_err(ck_err(format!("cannot read checkpoints in {}", src_dir.display())))?;
    let out = scratch.join(format!("rank_{rank}.safetensors"));
    let opts = TransformOptions { allow_missing: true, ..TransformOptions::default() };
    let result = transform_checkpoint_by_rank(rank, &files, &out, src_strategy, Some(&dst_strategy), &opts)
        .map_err(ck_err(format!("cannot reshard {} for rank {rank}", src_dir.display())))
        .and_then(|_| load_checkpoint(&out));
    let _ = std::fs::remove_dir_all(&scratch);
    let loaded = result?;
    let mut store = ParamStore::new();
    for slot in &program.params {
        let t = loaded.get(&slot.name).ok_or_else(|| RuntimeError::Parallel {
            message: format!(
                "load_distributed_checkpoint: parameter {} of rank {rank} is in no checkpoint of {}\nhint: the checkpoints were saved from another network, or its strategy file lacks this parameter",
                slot.name,
                src_dir.display()
            ),
        })?;
        let want = slot.layout.slice_shape();
        if t.shape() != want.as_slice() {
            return Err(RuntimeError::Parallel {
                message: format!(
                    "load_distributed_checkpoint: parameter {} of rank {rank} resharded to shape {:?}, the job needs {want:?} (full {:?})\nhint: check the source strategy file",
                    slot.name,
                    t.shape(),
                    slot.layout.shape()
                ),
            });
        }
        store.insert(&slot.name, t.clone());
    }
    Ok(store)
}

fn scratch_dir(rank: usize) -> Result<PathBuf> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("autopar-reshard-{}-{rank}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).map_err(|e| RuntimeError::Parallel { message: format!("cannot create {}: {e}", dir.display()) })?;
    Ok(dir)
}
