//! One training step, for every mode: a rank's program ([`RankProgram`]: its forward and
//! backward pass), the all-reduce of its gradient buckets, and the optimizer update. A
//! stand-alone job is the program of its one rank; every parallel mode, in process or under
//! MPI, runs the same code with the rank's communicators.

use autopar_graph::{Graph, NodeId};
use autopar_parallel::{plan_job, rank_program, ParallelContext, PlanRequest, RankBucket, RankProgram};
use autopar_tensor::kernels::shape as sh;
use autopar_tensor::{DType, ExecCtx, Tensor};

use crate::collective::CommGroups;
use crate::error::{CommPhase, Result, RuntimeError};
use crate::executor::{tensor_dtype, Executor, ParamStore, RunOutput};
use crate::optim::Optimizer;

/// What [`TrainStep::gradients`] returns.
#[derive(Clone, Debug)]
pub struct StepOutput {
    /// The job's loss (what every rank sees).
    pub loss: Tensor,
    /// Synchronised gradients by parameter name.
    pub grads: Vec<(String, Tensor)>,
    /// The run's statistics (timings when profiling, peak live memory); its `values` are
    /// empty (they became `loss` and `grads`).
    pub run: RunOutput,
}

/// A rank's program made executable: forward, backward, gradient sync, update.
#[derive(Clone, Debug)]
pub struct TrainStep {
    program: RankProgram,
    executor: Executor,
    step: u64,
    buckets: Vec<BucketBuffer>,
    /// The parallel optimizer's all-gathered parameter slices, reused every step.
    gathered: crate::shard::GatherBuffers,
    /// Clip the synchronised gradients to this global norm (over every rank's pieces).
    clip_grad_norm: Option<f64>,
}

impl TrainStep {
    /// One device: `graph` planned stand-alone, differentiating `loss` (the sum of its
    /// elements) with respect to every trainable parameter. Collectives of one rank and backward
    /// ops run whole. The program keeps the graph's node ids, so feeds may use them.
    pub fn new(graph: Graph, loss: NodeId) -> Result<Self> {
        let ctx = ParallelContext::default();
        let plan = plan_job(&PlanRequest { graph: &graph, loss: Some(loss), context: &ctx, strategy_file: None, profile: None })?;
        Self::from_program(rank_program(&plan, 0)?)
    }

    /// The step of one rank's program (it must be a training program: a plan with a loss).
    pub fn from_program(program: RankProgram) -> Result<Self> {
        let executor = Executor::new(program.graph.clone(), &program.fetch())?;
        let buckets = program.buckets.iter().map(|b| BucketBuffer::new(b, &program)).collect::<Result<_>>()?;
        Ok(Self { program, executor, step: 0, buckets, gathered: Default::default(), clip_grad_norm: None })
    }

    /// Sets the kernels' execution context (e.g. [`ExecCtx::serial`] for simulated ranks).
    pub fn with_ctx(mut self, ctx: ExecCtx) -> Self {
        self.executor = self.executor.with_ctx(ctx);
        self
    }

    /// Records each op's wall time in [`StepOutput::run`] (see [`Executor::with_profiling`]).
    pub fn with_profiling(mut self, on: bool) -> Self {
        self.executor = self.executor.with_profiling(on);
        self
    }

    /// Clip the synchronised gradients of every step to global norm `max_norm` (None: no
    /// clipping), MindSpore's `ClipByGlobalNorm` over the whole job's gradients: each distinct
    /// piece is counted once (on the first rank holding it) and the sum is all-reduced, so
    /// sharded and replicated runs clip as one device does.
    pub fn set_clip_grad_norm(&mut self, max_norm: Option<f64>) -> Result<()> {
        if let Some(m) = max_norm {
            crate::optim::check_max_norm(m)?;
        }
        self.clip_grad_norm = max_norm;
        Ok(())
    }

    /// The rank's program.
    pub fn program(&self) -> &RankProgram {
        &self.program
    }

    /// The forward+backward graph.
    pub fn graph(&self) -> &Graph {
        self.executor.graph()
    }

    /// The executor running the forward+backward graph.
    pub fn executor(&self) -> &Executor {
        &self.executor
    }

    /// Steps run so far (the key of the dropout masks).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Continue counting from `step` (a resumed run draws the masks the uninterrupted run would).
    pub fn set_steps(&mut self, step: u64) {
        self.step = step;
    }

    /// Forward and backward on this rank's feeds, then the gradient buckets all-reduced over
    /// `comm` (needed when the program communicates). Returns the loss, the gradients and the
    /// run's statistics.
    pub fn gradients(&mut self, params: &mut ParamStore, feeds: &[(NodeId, Tensor)], comm: Option<&CommGroups>) -> Result<StepOutput> {
        let collectives = self.collectives(comm);
        let executor = &self.executor;
        let mut out = crate::shard::with_gathered(&self.program, params, comm, &mut self.gathered, |p| {
            executor.run_with(p, feeds, self.step, collectives)
        })?;
        self.step += 1;
        // The values move out of the run's output, so the gradients are their tensors' only
        // owners and a bucket reduces them in place.
        let mut values = std::mem::take(&mut out.values).into_iter();
        let loss = values.next().expect("the loss is fetched first");
        let mut grads: Vec<(String, Tensor)> = self.program.grads.iter().map(|(n, _)| n.clone()).zip(values).collect();
        crate::shard::scatter_gradients(&self.program, &mut grads, comm)?;
        for (b, buffer) in self.program.buckets.iter().zip(&mut self.buckets) {
            sync_bucket(b, buffer, &mut grads, comm)?;
        }
        self.clip(&mut grads, comm)?;
        Ok(StepOutput { loss, grads, run: out })
    }

    /// Gradient accumulation: forward and backward on each micro-batch's feeds in turn (equal
    /// parts of the step's batch, in order), their gradients summed and scaled by
    /// `1/micro-batches` (the gradient of the whole batch's mean loss), then the buckets
    /// all-reduced once. Returns the mean of the micro-batches' losses and the gradients. The
    /// step counter advances once.
    pub fn accumulate(
        &mut self,
        params: &mut ParamStore,
        micro_feeds: &[Vec<(NodeId, Tensor)>],
        comm: Option<&CommGroups>,
    ) -> Result<(f64, Vec<(String, Tensor)>)> {
        let count = micro_feeds.len().max(1);
        let collectives = self.collectives(comm);
        let mut loss = 0.0;
        let mut acc: Vec<Option<Tensor>> = vec![None; self.program.grads.len()];
        // gradient_accumulation_shard: each micro-batch's gradients are reduce-scattered at
        // once, so only the rank's pieces accumulate.
        let shard_each = self.program.accumulation_shard;
        let (executor, program, step) = (&self.executor, &self.program, self.step);
        loss += crate::shard::with_gathered(program, params, comm, &mut self.gathered, |params| {
            let mut loss = 0.0;
            for (index, feeds) in micro_feeds.iter().enumerate() {
                let micro = crate::executor::MicroBatch { index, count };
                let out = executor.run_micro(params, feeds, step, collectives, micro)?;
                let mut values = out.values.into_iter();
                loss += values.next().expect("the loss is fetched first").to_f64_vec().iter().sum::<f64>();
                if shard_each {
                    crate::shard::accumulate_scattered(
                        &program.reduce_scatter,
                        program.grads.iter().map(|(n, _)| n),
                        values,
                        &mut acc,
                        None,
                        comm,
                    )?;
                } else {
                    accumulate_into(&mut acc, values)?;
                }
            }
            Ok(loss)
        })?;
        self.step += 1;
        let mut grads = Vec::with_capacity(acc.len());
        for ((name, _), g) in self.program.grads.iter().zip(acc) {
            let g = g.ok_or_else(|| RuntimeError::MissingGradient { name: name.clone() })?;
            let g = if count > 1 {
                let wide = if g.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
                autopar_tensor::kernels::elementwise::scale(&ExecCtx::serial(), &g.cast(wide), 1.0 / count as f64)
                    .map_err(|e| RuntimeError::Kernel { kind: "Scale", name: name.clone(), source: Box::new(e) })?
                    .cast(g.dtype())
            } else {
                g
            };
            grads.push((name.clone(), g));
        }
        if !shard_each {
            crate::shard::scatter_gradients(&self.program, &mut grads, comm)?;
        }
        for (b, buffer) in self.program.buckets.iter().zip(&mut self.buckets) {
            sync_bucket(b, buffer, &mut grads, comm)?;
        }
        self.clip(&mut grads, comm)?;
        Ok((loss / count as f64, grads))
    }

    /// The executor's collectives: none on one device, where every group has one rank and the
    /// executor runs communication as identities (and may run the graph on a pool thread).
    fn collectives<'a>(&self, comm: Option<&'a CommGroups>) -> Option<&'a dyn crate::executor::Collectives> {
        comm.filter(|_| self.program.device_num > 1).map(|c| c as &dyn crate::executor::Collectives)
    }

    /// Clipping by global norm ([`TrainStep::set_clip_grad_norm`]) of the synchronised
    /// gradients: this rank counts the pieces it is the first holder of.
    fn clip(&self, grads: &mut [(String, Tensor)], comm: Option<&CommGroups>) -> Result<()> {
        let Some(max_norm) = self.clip_grad_norm else { return Ok(()) };
        let program = &self.program;
        let first_holder = |name: &str| program.param(name).is_none_or(|p| p.mirror.iter().min().is_none_or(|&r| r == program.rank));
        let n = program.device_num;
        crate::optim::clip_gradients(grads, max_norm, first_holder, |local| match comm {
            Some(groups) if n > 1 => {
                let all: Vec<usize> = (0..n).collect();
                let mut v = vec![local];
                groups
                    .get(&all)?
                    .all_reduce((&mut v).into(), autopar_comm::ReduceOp::Sum)
                    .map_err(RuntimeError::comm(CommPhase::GradientSync { group: all }))?;
                Ok(v[0])
            }
            Some(_) => Ok(local),
            None if n <= 1 => Ok(local),
            None => {
                Err(RuntimeError::NeedsCommunicator { kind: "ClipByGlobalNorm", name: "the global norm".into(), group: (0..n).collect() })
            }
        })?;
        Ok(())
    }

    /// One step on one device (or a program that does not communicate): forward, backward,
    /// `opt.step`. Returns the loss.
    pub fn run(&mut self, params: &mut ParamStore, opt: &mut dyn Optimizer, feeds: &[(NodeId, Tensor)]) -> Result<f64> {
        self.run_with(params, opt, feeds, None)
    }

    /// One step with the rank's communicators: forward, backward, gradient sync, `opt.step`.
    pub fn run_with(
        &mut self,
        params: &mut ParamStore,
        opt: &mut dyn Optimizer,
        feeds: &[(NodeId, Tensor)],
        comm: Option<&CommGroups>,
    ) -> Result<f64> {
        let StepOutput { loss, grads, .. } = self.gradients(params, feeds, comm)?;
        opt.step(params, &grads)?;
        finite_loss(loss.to_f64_vec().iter().sum::<f64>(), self.step)
    }
}

/// Add each of `values` to its slot of `acc` (gradient accumulation over micro-batches; an
/// empty slot takes the value).
pub(crate) fn accumulate_into(acc: &mut [Option<Tensor>], values: impl IntoIterator<Item = Tensor>) -> Result<()> {
    accumulate_at(acc, None, values)
}

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

/// A gradient bucket as the step runs it: where its gradients sit among the program's, and
/// its flat buffer, allocated at the first step and reused by every later one.
#[derive(Clone, Debug)]
pub(crate) struct BucketBuffer {
    grads: Vec<usize>,
    flat: Option<Tensor>,
}

impl BucketBuffer {
    fn new(b: &RankBucket, program: &RankProgram) -> Result<Self> {
        Self::over(b, &program.grads)
    }

    /// The bucket's gradients among `grads` (by parameter name).
    pub(crate) fn over(b: &RankBucket, grads: &[(String, NodeId)]) -> Result<Self> {
        Self::over_names(b, &grads.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>())
    }

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
    match dtype {
        DType::F64 => reduce_packed::<f64>(comm, flat, grads, idx, b),
        DType::F32 => reduce_packed::<f32>(comm, flat, grads, idx, b),
        DType::F16 => reduce_packed::<half::f16>(comm, flat, grads, idx, b),
        DType::BF16 => reduce_packed::<half::bf16>(comm, flat, grads, idx, b),
        DType::I32 => reduce_packed::<i32>(comm, flat, grads, idx, b),
        DType::I64 => reduce_packed::<i64>(comm, flat, grads, idx, b),
    }
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
