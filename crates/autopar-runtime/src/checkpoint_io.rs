//! Distributed checkpoints of a parallel job: per-rank files of local slices, and
//! `load_distributed_checkpoint` (MindSpore's name): start a job from per-rank checkpoints saved
//! under another strategy or device count, each rank reading its own pieces from the source
//! files ([`autopar_checkpoint::PieceReader`], the layout algebra of `autopar ckpt transform`).

use std::collections::BTreeMap;
use std::path::Path;

use autopar_checkpoint::{collect_rank_files, CheckpointFile, DType as CkDType, PieceReader, TensorSpec};
use autopar_tensor::{DType, Tensor};
use half::{bf16, f16};

use crate::error::{Result, RuntimeError};
use crate::executor::ParamStore;
use crate::job::Job;

fn ck_err(path: &Path) -> impl FnOnce(autopar_checkpoint::CheckpointError) -> RuntimeError {
    let path = path.to_path_buf();
    move |e| RuntimeError::Checkpoint { path, error: Box::new(e) }
}

/// A tensor's element type and little-endian bytes, as checkpoints store them.
pub fn tensor_bytes(t: &Tensor) -> Result<(CkDType, Vec<u8>)> {
    let k = |e| RuntimeError::Kernel { kind: "checkpoint", name: String::new(), source: Box::new(e) };
    let bytes = with_element!(t.dtype(), T => t.to_vec::<T>().map_err(k)?.iter().flat_map(|v| v.to_le_bytes()).collect());
    Ok((ck_dtype(t.dtype()), bytes))
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
        other => Err(RuntimeError::CheckpointDType { path: path.to_path_buf(), name: name.to_string(), dtype: format!("{other:?}") }),
    }
}

/// Write `store` (a rank's local slices, or full tensors) to `path` (`.safetensors` or `.ckpt`),
/// atomically, with `metadata`.
pub fn save_checkpoint(store: &ParamStore, path: &Path, metadata: &BTreeMap<String, String>) -> Result<()> {
    save_tensors(path, store.iter(), metadata).map_err(ck_err(path))
}

/// Write named tensors to `path` (`.safetensors` or `.ckpt`), atomically, with `metadata`,
/// each tensor's bytes handed to the writer from its own memory when it is contiguous (a copy
/// of one tensor at a time otherwise): no copy of them all.
pub fn save_tensors<'a>(
    path: &Path,
    tensors: impl Iterator<Item = (&'a String, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> autopar_checkpoint::Result<()> {
    let tensors: Vec<(&String, &Tensor)> = tensors.collect();
    let specs =
        tensors.iter().map(|(n, t)| TensorSpec { name: n.to_string(), dtype: ck_dtype(t.dtype()), shape: t.shape().to_vec() }).collect();
    let by_name: std::collections::HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), *t)).collect();
    autopar_checkpoint::save_from(path, specs, metadata, &mut |name, sink| match by_name.get(name) {
        Some(t) => with_tensor_bytes(t, sink),
        None => sink(&[]),
    })
}

/// The checkpoint element type of a tensor's.
fn ck_dtype(d: DType) -> CkDType {
    match d {
        DType::F32 => CkDType::Float32,
        DType::F64 => CkDType::Float64,
        DType::F16 => CkDType::Float16,
        DType::BF16 => CkDType::BFloat16,
        DType::I32 => CkDType::Int32,
        DType::I64 => CkDType::Int64,
    }
}

/// `f` of `t`'s little-endian bytes: the tensor's own memory when it is contiguous on a
/// little-endian machine, else a copy.
fn with_tensor_bytes<R>(t: &Tensor, f: &mut dyn FnMut(&[u8]) -> R) -> R {
    fn as_bytes<T: autopar_tensor::Element>(s: &[T]) -> &[u8] {
        // SAFETY: the element types are plain numbers without padding; any byte of them may be read.
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
    }
    if cfg!(target_endian = "little") {
        let t = t.contiguous();
        if let Some(bytes) = with_element!(t.dtype(), T => t.as_slice::<T>().map(as_bytes)) {
            return f(bytes);
        }
    }
    match tensor_bytes(t) {
        Ok((_, bytes)) => f(&bytes),
        // Not reached (the dtype is the tensor's own); the writer refuses the empty bytes.
        Err(_) => f(&[]),
    }
}

/// Every tensor of checkpoint `path`.
pub fn load_checkpoint(path: &Path) -> Result<ParamStore> {
    let f = CheckpointFile::open(path).map_err(ck_err(path))?;
    let mut store = ParamStore::new();
    for e in f.tensors() {
        let bytes = f.read(&e.name).map_err(ck_err(path))?;
        store.insert(&e.name, tensor_from_bytes(e.dtype, &e.shape, &bytes, &e.name, path)?);
    }
    Ok(store)
}

/// This rank's parameters (the pieces it stores) under `job`'s strategy, read from the
/// per-rank checkpoints `src_dir/rank_<k>/*` saved under `src_strategy` (`None`: whole tensors,
/// as in one unsplit checkpoint in `src_dir/rank_0`): each piece straight from the bytes of the
/// source files that hold it, so no full tensor and no other rank's piece is built. Every
/// parameter of the job must be found, with its full shape; errors name the file, tensor and
/// rank.
pub fn load_distributed_checkpoint(job: &Job, rank: usize, src_dir: &Path, src_strategy: Option<&Path>) -> Result<ParamStore> {
    let program = job.program(rank)?;
    let held = program.held_params();
    let (files, _) = collect_rank_files(src_dir).map_err(ck_err(src_dir))?;
    let mut reader = PieceReader::new(files, src_strategy, rank).map_err(ck_err(src_dir))?;
    let mut store = ParamStore::new();
    for slot in program.program.params.iter().filter(|s| held.contains(&s.name)) {
        let missing = || RuntimeError::NotResharded { name: slot.name.clone(), rank, dir: src_dir.to_path_buf() };
        let (dtype, full) = reader.full_shape(&slot.name).map_err(ck_err(src_dir))?.ok_or_else(missing)?;
        if full != slot.layout.shape() {
            return Err(RuntimeError::ReshardedShape {
                name: slot.name.clone(),
                rank,
                got: full,
                want: slot.layout.shape().to_vec(),
                dir: src_dir.to_path_buf(),
            });
        }
        let (_, bytes) = reader.read_box(&slot.name, &slot.slice).map_err(ck_err(src_dir))?.ok_or_else(missing)?;
        store.insert(&slot.name, tensor_from_bytes(dtype, &slot.stored_shape(), &bytes, &slot.name, src_dir)?);
    }
    Ok(store)
}
