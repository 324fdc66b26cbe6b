//! Gradient synchronisation after a step's micro-batches: their gradients accumulated, and
//! each gradient bucket all-reduced over its group (fused, in place where it can be) and
//! scaled by its factor. Used by the one train step ([`crate::RankTrainer::step`]).

use autopar_parallel::RankBucket;
use autopar_tensor::kernels::shape as sh;
use autopar_tensor::{DType, ExecCtx, Tensor};

use crate::collective::CommGroups;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::tensor_dtype;

/// Adds value `i` of `values` to `acc[at[i]]` (None: to `acc[i]`), or puts it there when empty.
pub(crate) fn accumulate_at(acc: &mut [Option<Tensor>], at: Option<&[usize]>, values: impl IntoIterator<Item = Tensor>) -> Result<()> {
    for (i, g) in values.into_iter().enumerate() {
        let k = match at {
            Some(at) => match at.get(i) {
                Some(&k) => k,
                None => break,
            },
            None => i,
        };
        let Some(a) = acc.get_mut(k) else { break };
        *a =
            Some(match a.take() {
                None => g,
                Some(prev) => autopar_tensor::kernels::elementwise::add(&ExecCtx::serial(), &prev, &g)
                    .map_err(|e| RuntimeError::Kernel { kind: "Add", name: "gradient accumulation".into(), source: Box::new(e) })?,
            });
    }
    Ok(())
}

/// Gradient accumulation over `count` micro-batches: each summed gradient scaled by
/// `1/count` (in f32 or f64, then back to its dtype), the gradient of the whole batch's mean
/// loss.
pub(crate) fn mean_of_micro_batches(grads: &mut [(String, Tensor)], count: usize) -> Result<()> {
    if count <= 1 {
        return Ok(());
    }
    for (name, g) in grads.iter_mut() {
        let wide = if g.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        *g = autopar_tensor::kernels::elementwise::scale(&ExecCtx::serial(), &g.cast(wide), 1.0 / count as f64)
            .map_err(|e| RuntimeError::Kernel { kind: "Scale", name: name.clone(), source: Box::new(e) })?
            .cast(g.dtype());
    }
    Ok(())
}

/// A gradient bucket as the step runs it: where its gradients sit among the program's, and
/// its flat buffer, allocated at the first step and reused by every later one.
#[derive(Clone, Debug)]
pub(crate) struct BucketBuffer {
    grads: Vec<usize>,
    flat: Option<Tensor>,
}

impl BucketBuffer {
    /// The bucket's gradients among `names`.
    pub(crate) fn over_names(b: &RankBucket, names: &[&str]) -> Result<Self> {
        let grads = b
            .params
            .iter()
            .map(|n| names.iter().position(|g| g == n).ok_or_else(|| RuntimeError::MissingGradient { name: n.clone() }))
            .collect::<Result<_>>()?;
        Ok(Self { grads, flat: None })
    }
}

/// All-reduce one bucket's gradients, scaled by the bucket's factor. Gradients all of the
/// bucket's dtype (f32 or f64) are reduced where they lie, as one collective over the parts
/// ([`autopar_comm::Communicator::all_reduce_parts`]) and scaled in place. Otherwise they are
/// copied (cast where their dtype differs) into the bucket's flat buffer, reduced there, and
/// become views of it (copies for gradients of another dtype), which must be dropped before
/// the next step, or its packing copies the buffer first. Either way the same bits.
pub(crate) fn sync_bucket(
    b: &RankBucket,
    buffer: &mut BucketBuffer,
    grads: &mut [(String, Tensor)],
    comm: Option<&CommGroups>,
) -> Result<()> {
    if b.group.len() < 2 {
        return Ok(());
    }
    let comm = comm
        .ok_or_else(|| RuntimeError::NeedsCommunicator { kind: "AllReduce", name: "gradient bucket".into(), group: b.group.clone() })?
        .get(&b.group)?;
    let dtype = tensor_dtype(b.dtype);
    let distinct = buffer.grads.iter().enumerate().all(|(k, i)| !buffer.grads[..k].contains(i));
    if distinct && buffer.grads.iter().all(|&i| grads[i].1.dtype() == dtype) {
        match dtype {
            DType::F32 => return reduce_in_place::<f32>(comm, grads, &buffer.grads, b),
            DType::F64 => return reduce_in_place::<f64>(comm, grads, &buffer.grads, b),
            DType::F16 | DType::BF16 | DType::I32 | DType::I64 => {}
        }
    }
    let total: usize = buffer.grads.iter().map(|&i| grads[i].1.numel()).sum();
    let flat = match &mut buffer.flat {
        Some(t) if t.dtype() == dtype && t.numel() == total => t,
        slot => slot.insert(Tensor::zeros(&[total], dtype)),
    };
    let idx = &buffer.grads;
    with_element!(dtype, T => reduce_packed::<T>(comm, flat, grads, idx, b))
}

/// The bucket's gradients `grads[idx]` (all of dtype `T`) all-reduced in place, in bucket
/// order, then scaled in place by the bucket's factor.
fn reduce_in_place<T: autopar_tensor::Float + autopar_comm::Element>(
    comm: &dyn autopar_comm::Communicator,
    grads: &mut [(String, Tensor)],
    idx: &[usize],
    b: &RankBucket,
) -> Result<()> {
    let mut in_order: Vec<Option<&mut (String, Tensor)>> = (0..idx.len()).map(|_| None).collect();
    for (i, g) in grads.iter_mut().enumerate() {
        if let Some(at) = idx.iter().position(|&j| j == i) {
            in_order[at] = Some(g);
        }
    }
    let mut slices: Vec<&mut [T]> = Vec::with_capacity(idx.len());
    for g in in_order {
        let (name, t) = g.expect("a bucket lists each gradient once");
        let slice =
            t.as_mut_slice::<T>().map_err(|e| RuntimeError::Kernel { kind: "AllReduce", name: name.clone(), source: Box::new(e) })?;
        slices.push(slice);
    }
    let mut parts: Vec<autopar_comm::BufMut<'_>> = slices.iter_mut().map(|s| autopar_comm::BufMut::from(&mut **s)).collect();
    comm.all_reduce_parts(&mut parts, autopar_comm::ReduceOp::Sum)
        .map_err(RuntimeError::comm(CommPhase::GradientSync { group: b.group.clone() }))?;
    drop(parts);
    if b.scale != 1.0 {
        slices.into_iter().for_each(|s| scale_slice(s, b.scale));
    }
    Ok(())
}

fn reduce_packed<T: autopar_tensor::Element + autopar_comm::Element>(
    comm: &dyn autopar_comm::Communicator,
    flat: &mut Tensor,
    grads: &mut [(String, Tensor)],
    idx: &[usize],
    b: &RankBucket,
) -> Result<()> {
    let dtype = flat.dtype();
    let k = |name: &str| {
        let name = name.to_string();
        move |e| RuntimeError::Kernel { kind: "AllReduce", name, source: Box::new(e) }
    };
    {
        let flat = flat.as_mut_slice::<T>().map_err(k("gradient bucket"))?;
        let mut off = 0;
        for &i in idx {
            let (name, g) = &grads[i];
            let part = &mut flat[off..off + g.numel()];
            off += part.len();
            if g.dtype() == dtype { g.copy_to_slice(part) } else { g.cast(dtype).copy_to_slice(part) }.map_err(k(name))?;
        }
        comm.all_reduce(flat.into(), autopar_comm::ReduceOp::Sum)
            .map_err(RuntimeError::comm(CommPhase::GradientSync { group: b.group.clone() }))?;
    }
    // Scale the bucket in place where its dtype can hold the product (f32, f64); the
    // gradients of the bucket's dtype then become views of it (no copy back).
    let scaled = b.scale == 1.0 || scale_in_place(flat, b.scale);
    let mut off = 0;
    for &i in idx {
        let (name, g) = &mut grads[i];
        let range = off..off + g.numel();
        off = range.end;
        if g.dtype() == dtype && scaled {
            let part = sh::slice(flat, &[range.start], &[range.len() as isize]).map_err(k(name))?;
            *g = sh::reshape_to(&part, g.shape()).map_err(k(name))?;
            continue;
        }
        // Another dtype (or a half or integer bucket with a factor): through a wide copy.
        let own = g.dtype();
        let part = &flat.as_slice::<T>().expect("the bucket is contiguous")[range];
        let mut t = Tensor::from_vec(g.shape(), part.to_vec()).map_err(k(name))?;
        if !scaled {
            let wide = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
            t = autopar_tensor::kernels::elementwise::scale(&ExecCtx::serial(), &t.cast(wide), b.scale).map_err(k(name))?;
        }
        *g = if t.dtype() == own { t } else { t.cast(own) };
    }
    Ok(())
}

/// `flat *= scale` in place for an f32 or f64 tensor; false (nothing done) for other dtypes.
fn scale_in_place(flat: &mut Tensor, scale: f64) -> bool {
    fn run<F: autopar_tensor::Float>(flat: &mut Tensor, scale: f64) -> bool {
        scale_slice(flat.as_mut_slice::<F>().expect("dtype checked"), scale);
        true
    }
    match flat.dtype() {
        DType::F32 => run::<f32>(flat, scale),
        DType::F64 => run::<f64>(flat, scale),
        DType::F16 | DType::BF16 | DType::I32 | DType::I64 => false,
    }
}

/// `v *= scale` in the element type (the factor rounded to it once).
fn scale_slice<F: autopar_tensor::Float>(v: &mut [F], scale: f64) {
    let c = <F as autopar_tensor::Element>::from_f64(scale);
    v.iter_mut().for_each(|x| *x *= c);
}

/// `loss`, or an error when training has diverged (a NaN or infinite loss).
pub(crate) fn finite_loss(loss: f64, step: u64) -> Result<f64> {
    if !loss.is_finite() {
        return Err(RuntimeError::NonFiniteLoss { step, loss });
    }
    Ok(loss)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_comm::{reduce_serial, Communicator, LocalComm, ReduceOp};

    /// Rank `r`'s value of element `i` of gradient `g`: arbitrary, so sums round and their order
    /// shows in the bits.
    fn value(r: usize, g: usize, i: usize) -> f32 {
        ((r * 131 + g * 17 + i) as f32 * 0.377).sin() * 10f32.powi((i % 5) as i32 - 2)
    }

    /// The bucket's result: the rank-order fold of the three ranks' values, times `scale`.
    fn expected(g: usize, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|i| reduce_serial(&(0..3).map(|r| value(r, g, i)).collect::<Vec<_>>(), ReduceOp::Sum) * scale).collect()
    }

    #[test]
    fn a_buckets_gradients_are_reduced_where_they_lie_with_the_packed_buffers_bits() {
        let shapes: [&[usize]; 3] = [&[3, 5], &[4], &[7]];
        let names = ["a", "b", "c"];
        let scale = 1.0 / 3.0;
        let bucket = RankBucket { group: vec![0, 1, 2], dtype: autopar_graph::DType::F32, params: vec!["a".into(), "c".into()], scale };
        LocalComm::run(3, |comm| -> Result<()> {
            let groups = CommGroups::create(&comm, &[vec![vec![0, 1, 2]]])?;
            let r = comm.rank();
            let grads = |c_dtype: DType| -> Vec<(String, Tensor)> {
                names
                    .iter()
                    .zip(shapes)
                    .enumerate()
                    .map(|(g, (n, s))| {
                        let len = s.iter().product();
                        let t = Tensor::from_vec(s, (0..len).map(|i| value(r, g, i)).collect::<Vec<f32>>()).unwrap();
                        (n.to_string(), if g == 2 { t.cast(c_dtype) } else { t })
                    })
                    .collect()
            };
            let c = <f32 as autopar_tensor::Element>::from_f64(scale);
            // All of the bucket's dtype: reduced where they lie.
            let mut gs = grads(DType::F32);
            let before: Vec<usize> = gs.iter().map(|(_, t)| t.as_slice::<f32>().unwrap().as_ptr() as usize).collect();
            let mut buffer = BucketBuffer::over_names(&bucket, &names)?;
            sync_bucket(&bucket, &mut buffer, &mut gs, Some(&groups))?;
            let after: Vec<usize> = gs.iter().map(|(_, t)| t.as_slice::<f32>().unwrap().as_ptr() as usize).collect();
            assert_eq!(before, after, "reduced in place");
            assert!(buffer.flat.is_none(), "no bucket buffer");
            for (g, len) in [(0, 15), (2, 7)] {
                let got: Vec<u32> = gs[g].1.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
                let want: Vec<u32> = expected(g, len, c).iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "gradient {g}");
            }
            assert_eq!(gs[1].1.to_vec::<f32>().unwrap(), (0..4).map(|i| value(r, 1, i)).collect::<Vec<_>>(), "outside the bucket");
            // A gradient of another dtype: through the packed buffer, the same bits.
            let mut gs = grads(DType::F64);
            sync_bucket(&bucket, &mut buffer, &mut gs, Some(&groups))?;
            assert!(buffer.flat.is_some(), "packed");
            assert_eq!(gs[0].1.to_vec::<f32>().unwrap(), expected(0, 15, c));
            assert_eq!(gs[2].1.dtype(), DType::F64);
            assert_eq!(gs[2].1.to_f64_vec(), expected(2, 7, c).iter().map(|&v| v as f64).collect::<Vec<_>>());
            Ok(())
        })
        .unwrap();
    }
}
