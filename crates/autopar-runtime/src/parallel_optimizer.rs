//! The parallel optimizer at run time. A sharded parameter is stored as the rank's dimension-0
//! piece of its model-parallel slice: [`gather_values`] all-gathers the slices before the
//! forward pass (fused per bucket), [`scatter_gradients`] reduce-scatters their gradients after
//! the backward pass, so the optimizer updates, and keeps state for, the piece alone.

use autopar_comm::{Buf, BufMut, Communicator};
use autopar_parallel::{RankProgram, RankShardBucket};
use autopar_tensor::{DType, ExecCtx, Tensor};

use crate::collective::CommGroups;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::{tensor_dtype, ParamStore};

fn kernel(kind: &'static str, name: &str) -> impl FnOnce(autopar_tensor::TensorError) -> RuntimeError {
    let name = name.to_string();
    move |e| RuntimeError::Kernel { kind, name, source: Box::new(e) }
}

fn group_comm<'a>(comm: Option<&'a CommGroups>, b: &RankShardBucket, kind: &'static str) -> Result<&'a dyn Communicator> {
    comm.ok_or_else(|| RuntimeError::NeedsCommunicator { kind, name: b.params.join(", "), group: b.group.clone() })?.get(&b.group)
}

/// The all-gathered slices of the sharded parameters, kept from one step to the next so that
/// every step gathers into the same buffers: no allocation, no zero fill, no page faults (a
/// buffer another owner still shares, or of another shape or dtype, is replaced by a new one).
#[derive(Clone, Debug, Default)]
pub(crate) struct GatherBuffers(std::collections::HashMap<String, Tensor>);

impl GatherBuffers {
    /// A buffer for parameter `name`'s gathered slice: last step's when it is unshared and of
    /// this shape and dtype, else a new one.
    fn take(&mut self, name: &str, shape: &[usize], dtype: DType) -> Tensor {
        match self.0.remove(name) {
            Some(t) if t.shape() == shape && t.dtype() == dtype && t.is_contiguous() && t.is_unique() => t,
            _ => Tensor::zeros(shape, dtype),
        }
    }

    /// Keep `t` as parameter `name`'s buffer for the next step, unless one is kept already
    /// (the bucket-dtype buffer of a parameter the step saw cast to its own dtype).
    fn keep(&mut self, name: &str, t: Tensor) {
        self.0.entry(name.to_string()).or_insert(t);
    }
}

/// Runs `f` with every sharded parameter of `params` all-gathered to its model-parallel slice
/// (into `buffers`), then puts the stored pieces back (whatever `f` returns) and keeps the
/// gathered slices in `buffers` for the next call. (They stay allocated between steps; every
/// step holds them during its passes anyway, so the peak memory is the same.) Collective.
pub(crate) fn with_gathered<T>(
    program: &RankProgram,
    params: &mut ParamStore,
    comm: Option<&CommGroups>,
    buffers: &mut GatherBuffers,
    f: impl FnOnce(&mut ParamStore) -> Result<T>,
) -> Result<T> {
    let stored = gather_values(program, params, comm, buffers)?;
    let out = f(params);
    for (name, t) in stored {
        if let Some(full) = params.insert(&name, t) {
            buffers.keep(&name, full);
        }
    }
    out
}

/// Replaces every sharded parameter's stored piece in `params` by its model-parallel slice,
/// all-gathered over its shard group into `buffers`; returns the pieces. Collective. On an
/// error the pieces already replaced are put back.
fn gather_values(
    program: &RankProgram,
    params: &mut ParamStore,
    comm: Option<&CommGroups>,
    buffers: &mut GatherBuffers,
) -> Result<Vec<(String, Tensor)>> {
    let mut stored = Vec::new();
    match gather_into(program, params, comm, buffers, &mut stored) {
        Ok(()) => Ok(stored),
        Err(e) => {
            for (name, t) in stored {
                params.insert(&name, t);
            }
            Err(e)
        }
    }
}

/// [`gather_values`]' work: each replaced piece pushed onto `stored`.
fn gather_into(
    program: &RankProgram,
    params: &mut ParamStore,
    comm: Option<&CommGroups>,
    buffers: &mut GatherBuffers,
    stored: &mut Vec<(String, Tensor)>,
) -> Result<()> {
    for b in &program.all_gather {
        let c = group_comm(comm, b, "AllGather")?;
        let dtype = tensor_dtype(b.dtype);
        let mut pieces = Vec::with_capacity(b.params.len());
        let mut full = Vec::with_capacity(b.params.len());
        for name in &b.params {
            let slot = program.param(name).ok_or_else(|| RuntimeError::MissingParameter { name: name.clone() })?;
            let t = params.require(name)?;
            pieces.push(t.cast(dtype).contiguous());
            full.push(buffers.take(name, &slot.layout.slice_shape(), dtype));
        }
        with_element!(dtype, T => gather_parts::<T>(c, b, &pieces, &mut full)?);
        for (name, t) in b.params.iter().zip(full) {
            let own = params.require(name)?.dtype();
            let full = if t.dtype() == own {
                t
            } else {
                // The parameter sees a cast copy; the bucket-dtype buffer is kept for next step.
                let cast = t.cast(own);
                buffers.keep(name, t);
                cast
            };
            let piece = params.insert(name, full);
            stored.push((name.clone(), piece.expect("required above")));
        }
    }
    Ok(())
}

/// The all-gather of one bucket: each parameter's pieces, from every rank of the group in
/// order, joined along dimension 0 into its model-parallel slice `full` (one fused call of
/// parts, written where the slices lie).
fn gather_parts<T: autopar_tensor::Element + autopar_comm::Element>(
    comm: &dyn Communicator,
    b: &RankShardBucket,
    pieces: &[Tensor],
    full: &mut [Tensor],
) -> Result<()> {
    let send: Vec<Buf<'_>> = pieces.iter().map(|t| T::buf(t.as_slice::<T>().expect("contiguous, of the bucket's dtype"))).collect();
    let mut recv: Vec<BufMut<'_>> = Vec::with_capacity(full.len());
    for (t, name) in full.iter_mut().zip(&b.params) {
        recv.push(T::buf_mut(t.as_mut_slice::<T>().map_err(kernel("AllGather", name))?));
    }
    comm.all_gather_parts(&send, &mut recv)
        .map_err(RuntimeError::comm(CommPhase::OptimizerShard { kind: "all-gather of the sharded parameters", group: b.group.clone() }))
}

/// Replaces the gradient (a model-parallel slice) of every sharded parameter in `grads` by the
/// rank's shard of its sum over the replica group, scaled by the bucket's factor. Collective.
pub(crate) fn scatter_gradients(program: &RankProgram, grads: &mut [(String, Tensor)], comm: Option<&CommGroups>) -> Result<()> {
    scatter_buckets(&program.reduce_scatter, grads, comm)
}

/// [`scatter_gradients`] over the reduce-scatter buckets `buckets` (a program's, or those of
/// the gradients one pipeline chunk computes). Collective.
pub(crate) fn scatter_buckets(buckets: &[RankShardBucket], grads: &mut [(String, Tensor)], comm: Option<&CommGroups>) -> Result<()> {
    for b in buckets {
        let c = group_comm(comm, b, "ReduceScatter")?;
        let rest = if b.rest.len() > 1 {
            let groups = comm.expect("checked by group_comm");
            Some(groups.get(&b.rest)?)
        } else {
            None
        };
        let dtype = tensor_dtype(b.dtype);
        let idx: Vec<usize> = b
            .params
            .iter()
            .map(|n| grads.iter().position(|(g, _)| g == n).ok_or_else(|| RuntimeError::MissingGradient { name: n.clone() }))
            .collect::<Result<_>>()?;
        let slices: Vec<Tensor> = idx.iter().map(|&i| grads[i].1.cast(dtype).contiguous()).collect();
        let pieces = with_element!(dtype, T => scatter_parts::<T>(c, rest, b, &slices)?);
        for (&i, piece) in idx.iter().zip(pieces) {
            let (name, g) = &mut grads[i];
            let piece = if b.scale == 1.0 {
                piece
            } else {
                let wide = if piece.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
                autopar_tensor::kernels::elementwise::scale(&ExecCtx::serial(), &piece.cast(wide), b.scale)
                    .map_err(kernel("ReduceScatter", name))?
            };
            *g = if piece.dtype() == g.dtype() { piece } else { piece.cast(g.dtype()) };
        }
    }
    Ok(())
}

/// `gradient_accumulation_shard`: one micro-batch's gradients (`values`, in the order of
/// `names`) reduce-scattered at once over `buckets` ([`scatter_buckets`]) and only the rank's
/// pieces added to `acc`, gradient `i` at `acc[at[i]]` (None: at `acc[i]`). Collective.
pub(crate) fn accumulate_scattered<'a>(
    buckets: &[RankShardBucket],
    names: impl IntoIterator<Item = &'a String>,
    values: impl IntoIterator<Item = Tensor>,
    acc: &mut [Option<Tensor>],
    at: Option<&[usize]>,
    comm: Option<&CommGroups>,
) -> Result<()> {
    let mut grads: Vec<(String, Tensor)> = names.into_iter().cloned().zip(values).collect();
    scatter_buckets(buckets, &mut grads, comm)?;
    crate::gradient_sync::accumulate_at(acc, at, grads.into_iter().map(|(_, g)| g))
}

/// The reduce-scatter of one bucket. With `g` replicas in shard groups of `k` (`r = g / k`
/// groups), every gradient's shard `i` (part `i` of `k` along dimension 0) is cut into `r`
/// parts (the last padded with zeros where `r` does not divide it); the rank at position
/// `c * k + i` of the replica group (shard index `i`, `c` its place among the ranks holding
/// shard `i`) receives part `c` of shard `i`, summed over the replicas, and the ranks holding
/// shard `i` then all-gather their parts, in order `c`, into the shard. When the shard group
/// is the whole replica group (`r = 1`, the default) each gradient is sent as it lies.
fn scatter_parts<T: autopar_tensor::Element + autopar_comm::Element>(
    comm: &dyn Communicator,
    rest: Option<&dyn Communicator>,
    b: &RankShardBucket,
    slices: &[Tensor],
) -> Result<Vec<Tensor>> {
    let g = b.group.len();
    let k = b.shard_size;
    let r = g / k;
    let data: Vec<&[T]> = slices.iter().map(|t| t.as_slice::<T>().expect("contiguous, of the bucket's dtype")).collect();
    let shards: Vec<usize> = slices.iter().map(|t| t.numel() / k).collect();
    let parts: Vec<usize> = shards.iter().map(|s| s.div_ceil(r)).collect();
    // Each gradient's blocks in the order of the replica group (block `c * k + i`: part `c`
    // of shard `i`), when that is not the gradient's own order.
    let arranged: Vec<Vec<T>> = if r == 1 {
        Vec::new()
    } else {
        data.iter()
            .zip(&shards)
            .zip(&parts)
            .map(|((data, &shard), &len)| {
                let mut v = Vec::with_capacity(len * g);
                for pos in 0..g {
                    let (i, c) = (pos % k, pos / k);
                    let start = (i * shard + c * len).min((i + 1) * shard);
                    let end = (start + len).min((i + 1) * shard);
                    v.extend_from_slice(&data[start..end]);
                    v.resize(v.len() + len - (end - start), T::default());
                }
                v
            })
            .collect()
    };
    let send: Vec<Buf<'_>> = if r == 1 { data.iter().map(|d| T::buf(d)).collect() } else { arranged.iter().map(|v| T::buf(v)).collect() };
    let mut mine: Vec<Vec<T>> = parts.iter().map(|&len| vec![T::default(); len]).collect();
    comm.reduce_scatter_parts(&send, &mut mine.iter_mut().map(|v| T::buf_mut(v)).collect::<Vec<_>>(), autopar_comm::ReduceOp::Sum)
        .map_err(RuntimeError::comm(CommPhase::OptimizerShard { kind: "reduce-scatter of the gradients", group: b.group.clone() }))?;
    let gathered = match rest {
        Some(rest) => {
            let mut all: Vec<Vec<T>> = parts.iter().map(|&len| vec![T::default(); len * r]).collect();
            let send: Vec<Buf<'_>> = mine.iter().map(|v| T::buf(v)).collect();
            rest.all_gather_parts(&send, &mut all.iter_mut().map(|v| T::buf_mut(v)).collect::<Vec<_>>()).map_err(RuntimeError::comm(
                CommPhase::OptimizerShard { kind: "all-gather of the gradient parts", group: b.rest.clone() },
            ))?;
            all
        }
        None => mine,
    };
    b.params
        .iter()
        .zip(slices)
        .zip(gathered)
        .zip(&shards)
        .map(|(((name, t), mut v), &shard)| {
            let mut shape = t.shape().to_vec();
            if let Some(d0) = shape.first_mut() {
                *d0 /= k;
            }
            v.truncate(shard);
            Tensor::from_vec(&shape, v).map_err(kernel("ReduceScatter", name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gathered_slice_buffer_is_reused_only_when_unshared_and_of_the_same_shape_and_dtype() {
        let mut buffers = GatherBuffers::default();
        let first = buffers.take("w", &[4, 2], DType::F32);
        let address = first.as_slice::<f32>().unwrap().as_ptr();
        buffers.keep("w", first);
        let again = buffers.take("w", &[4, 2], DType::F32);
        assert_eq!(again.as_slice::<f32>().unwrap().as_ptr(), address, "the same buffer");
        // Shared with another owner (e.g. a value a caller kept): a new buffer, the other's data untouched.
        let held = again.clone();
        buffers.keep("w", again);
        let fresh = buffers.take("w", &[4, 2], DType::F32);
        assert_ne!(fresh.as_slice::<f32>().unwrap().as_ptr(), held.as_slice::<f32>().unwrap().as_ptr());
        buffers.keep("w", fresh);
        assert_eq!(buffers.take("w", &[2, 4], DType::F32).shape(), &[2, 4]);
        assert_eq!(buffers.take("w", &[4, 2], DType::F64).dtype(), DType::F64);
    }
}
