//! What one rank's training step is predicted to cost: floating-point work, bytes handed to
//! the communicator per collective kind and group, and memory (parameters, gradients,
//! optimizer state, the peak of the values alive during the step). Everything is read off the
//! rank's program: each op's cost rule ([`autopar_graph::OpDef::cost`]) on its local types, the
//! gradient buckets, and the executor's schedule ([`autopar_graph::Graph::schedule`]).

use std::collections::BTreeMap;

use autopar_graph::{Collective, CostCx, DType, NodeId, OpKind, Recompute, TensorType};

use crate::error::Result;
use crate::program::RankProgram;

/// The bytes a rank hands to one kind of collective over one group in a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommVolume {
    /// The collective's kind.
    pub kind: Collective,
    /// World ranks, ascending.
    pub group: Vec<usize>,
    /// The number of calls of this kind over this group in the step.
    pub calls: usize,
    /// Payload of the send buffers (what the rank passes to the communicator).
    pub bytes: usize,
}

/// Memory a rank holds for a step, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// What this rank stores of every parameter (trainable and frozen) between steps: its
    /// slices, or its optimizer shards of them.
    pub parameters: usize,
    /// Gradients of the trainable slices, and the flat buffers that gradient buckets which
    /// cannot be reduced where their gradients lie (a bucket of f16/bf16, or of another dtype
    /// than its gradients) keep from step to step ([`Memory::bucket_buffers`]).
    pub gradients: usize,
    /// Optimizer state: `slots` tensors per trainable slice, or optimizer shard (Momentum 1,
    /// Adam 2).
    pub optimizer_state: usize,
    /// The most bytes the step's values hold at once (activations, the gradients as they are
    /// formed, the inputs), as the executor schedules them, beyond the gradients counted in
    /// `gradients`: the step's values never take less than its gradients, which it keeps to
    /// its end, so the parts together are the step's peak. Parameters' values are the
    /// stored tensors, counted in `parameters`, but for the parallel optimizer's: their
    /// shards are all-gathered into slices kept from step to step, counted here.
    pub peak_activations: usize,
    /// The most bytes the step's activations hold at once, the parameters' gradients aside:
    /// the forward values the backward pass reads, the temporaries of both passes and the
    /// gradients of activations (and the parallel optimizer's gathered slices, as in
    /// `peak_activations`); in a pipeline, the saved values of the micro-batches in flight
    /// and the largest pass. What recomputation cuts. Not a part of [`Memory::total`]: the
    /// step's peak may come later, when the gradients are formed and fewer activations are
    /// left (`peak_activations` is the step's values then, beyond the gradients).
    pub activations: usize,
    /// What the buffers and copies of the fused collectives add to the step's peak: the
    /// packing of their parts into one buffer where the communicator makes it (MPI's does; the
    /// in-process one works where they lie), and on any communicator the copies the runtime
    /// makes around them ([`Memory::largest_packing`]). A gradient bucket's all-reduce and the
    /// parallel optimizer's reduce-scatter come after the backward pass, beside the gradients
    /// but not the activations; its all-gather before the forward pass, beside neither (but
    /// the buckets' flat buffers). So this is the largest such figure less the room the
    /// activations (and, before the forward pass, the gradients) leave it, or nothing.
    pub comm_buffers: usize,
}

impl Memory {
    /// The parameters, gradients and optimizer state (`optimizer_slots` tensors per trainable
    /// parameter) of the parameters of `program` that `held` keeps; no activations, no
    /// communication buffers ([`Memory::with_comm_buffers`] adds them).
    pub fn of_params(program: &RankProgram, optimizer_slots: usize, held: impl Fn(&str) -> bool) -> Self {
        let held = |n: &str| held(n);
        let g = &program.graph;
        let slice_bytes = |p: &&crate::program::ParamSlot| p.layout.slice_len() * g.node(p.local).ty.dtype.size();
        let stored_bytes = |p: &&crate::program::ParamSlot| p.stored_shape().iter().product::<usize>() * g.node(p.local).ty.dtype.size();
        let params: Vec<_> = program.params.iter().filter(|p| held(&p.name)).collect();
        let state: usize = params.iter().filter(|p| p.trainable).map(stored_bytes).sum();
        Memory {
            parameters: params.iter().map(stored_bytes).sum(),
            // Level2 and level3 keep only the rank's shard of a sharded weight's gradient.
            gradients: params
                .iter()
                .filter(|p| p.trainable)
                .map(|p| if program.scatter_in_pass.iter().any(|b| b.params.contains(&p.name)) { stored_bytes(p) } else { slice_bytes(p) })
                .sum::<usize>()
                + Memory::bucket_buffers(program, held),
            optimizer_state: optimizer_slots * state,
            peak_activations: 0,
            activations: 0,
            comm_buffers: 0,
        }
    }

    /// This memory with its `comm_buffers` set from `program`'s fused collectives over the
    /// parameters `held` keeps, given its gradients and peak activations (of which `gathered`
    /// bytes are the parallel optimizer's slices, held at every moment); `packs`: the
    /// communicator packs the parts of a fused collective into one buffer (MPI's does).
    pub fn with_comm_buffers(mut self, program: &RankProgram, held: impl Fn(&str) -> bool, gathered: usize, packs: bool) -> Self {
        let held = |n: &str| held(n);
        let (after_backward, before_forward) = Memory::largest_packing(program, held, packs);
        let transient = self.peak_activations.saturating_sub(gathered);
        // Before the forward pass the gradients are gone, but for the buckets' flat buffers.
        let free = self.gradients.saturating_sub(Memory::bucket_buffers(program, held));
        self.comm_buffers = after_backward.saturating_sub(transient).max(before_forward.saturating_sub(transient + free));
        self
    }

    /// The flat buffers of `program`'s gradient buckets (over the parameters `held` keeps)
    /// whose gradients are copied into one buffer of the bucket's dtype to be reduced: a
    /// bucket of f16/bf16 or integers, or one whose gradients are of another dtype (f16
    /// gradients synced in f32). The runtime keeps each such buffer from step to step; an f32
    /// or f64 bucket of its own dtype's gradients is reduced where they lie.
    pub fn bucket_buffers(program: &RankProgram, held: impl Fn(&str) -> bool) -> usize {
        Memory::packed_buckets(program)
            .into_iter()
            .map(|i| &program.buckets[i])
            .map(|b| {
                b.params.iter().filter(|n| held(n)).filter_map(|n| program.param(n)).map(|p| p.layout.slice_len()).sum::<usize>()
                    * b.dtype.size()
            })
            .sum()
    }

    /// The positions of `program`'s gradient buckets reduced in a flat buffer of their own:
    /// those over more than one rank of f16/bf16 or integers, or whose gradients are of
    /// another dtype than the bucket's.
    fn packed_buckets(program: &RankProgram) -> Vec<usize> {
        let g = &program.graph;
        let own = |b: &crate::program::RankBucket, n: &String| program.param(n).is_some_and(|p| g.node(p.local).ty.dtype == b.dtype);
        (0..program.buckets.len())
            .filter(|&i| {
                let b = &program.buckets[i];
                b.group.len() > 1 && (!matches!(b.dtype, DType::F32 | DType::F64) || !b.params.iter().all(|n| own(b, n)))
            })
            .collect()
    }

    /// The largest buffers `program`'s fused collectives over the parameters `held` keeps
    /// make, in each collective's dtype: after the backward pass (the parallel optimizer's
    /// reduce-scatters: the gradients cast to the bucket's dtype where theirs differs,
    /// rearranged by shard where a shard group is smaller than the replica group, the received
    /// parts and their all-gather among the ranks holding a shard; with `packs`, also the sends
    /// and receives packed, and a gradient bucket's all-reduce of gradients where they lie
    /// packed) and before the forward pass (the parallel optimizer's all-gathers: the stored
    /// pieces cast to the all-gather's dtype where theirs differs; with `packs`, the sends and
    /// receives packed). A gradient bucket's flat buffer is no packing: it is kept from step
    /// to step, in [`Memory::gradients`].
    pub fn largest_packing(program: &RankProgram, held: impl Fn(&str) -> bool, packs: bool) -> (usize, usize) {
        type Slot = crate::program::ParamSlot;
        let g = &program.graph;
        let packed = usize::from(packs);
        let elements = |names: &[String], len: &dyn Fn(&Slot) -> usize| -> usize {
            names.iter().filter(|n| held(n)).filter_map(|n| program.param(n)).map(len).sum()
        };
        let differs = |p: &Slot, dtype: DType| usize::from(g.node(p.local).ty.dtype != dtype);
        let flat = Memory::packed_buckets(program);
        let largest = |names: &[String], len: &dyn Fn(&Slot) -> usize| -> usize {
            names.iter().filter(|n| held(n)).filter_map(|n| program.param(n)).map(len).max().unwrap_or(0)
        };
        // A bucket reduced where its gradients lie: packed by the communicator. One with a
        // flat buffer: after the reduction each gradient of another dtype, or scaled in a
        // half or integer buffer, goes through a copy, a wide (f32) copy, its scaled result
        // and the cast back, one gradient at a time.
        let all_reduce = program.buckets.iter().enumerate().filter(|(_, b)| b.group.len() > 1).map(|(i, b)| {
            if !flat.contains(&i) {
                return packed * elements(&b.params, &|p| p.layout.slice_len()) * b.dtype.size();
            }
            largest(&b.params, &|p| {
                let own = g.node(p.local).ty.dtype;
                let unscaled = b.scale == 1.0 && matches!(b.dtype, DType::F32 | DType::F64) && own == b.dtype;
                if unscaled {
                    0
                } else {
                    p.layout.slice_len() * (b.dtype.size() + 8 + own.size())
                }
            })
        });
        let all_gather = program.all_gather.iter().map(|b| {
            let stored = |p: &Slot| p.stored_shape().iter().product::<usize>();
            elements(&b.params, &|p| differs(p, b.dtype) * stored(p) + packed * (stored(p) + p.layout.slice_len())) * b.dtype.size()
        });
        let reduce_scatter = program.reduce_scatter.iter().map(|b| {
            let (group, holders) = (b.group.len(), b.group.len() / b.shard_size);
            let parts = |p: &Slot| (p.layout.slice_len() / b.shard_size).div_ceil(holders);
            let total = |len: &dyn Fn(&Slot) -> usize| elements(&b.params, len) * b.dtype.size();
            // Held throughout: the gradients cast to the bucket's dtype, rearranged by shard
            // (when a shard group is smaller than the replica group) and the received parts.
            let held_through =
                total(&|p| differs(p, b.dtype) * p.layout.slice_len() + if holders > 1 { parts(p) * group } else { 0 } + parts(p));
            // The reduce-scatter's packed sends and receives, then (when the parts of a shard
            // lie on several ranks) their all-gather: its receives and its packing.
            let scatter = packed * total(&|p| parts(p) * (group + 1));
            let gather = if holders > 1 { total(&|p| parts(p) * holders + packed * parts(p) * (holders + 1)) } else { 0 };
            // A gradient scaled after its shard is formed: a wide copy and its cast back.
            let scaled = if b.scale == 1.0 { 0 } else { largest(&b.params, &|p| p.layout.slice_len() / b.shard_size) * 8 };
            held_through + scatter.max(gather) + scaled
        });
        (all_reduce.chain(reduce_scatter).max().unwrap_or(0), all_gather.max().unwrap_or(0))
    }

    /// The bytes of the model-parallel slices that the parallel optimizer all-gathers the
    /// shards of `program`'s parameters (those `held` keeps) into for a step: buffers of the
    /// all-gather's dtype kept from step to step, beside the stored shards, and where a
    /// parameter's own dtype differs, the copy cast to it that the step uses.
    pub fn gathered_slices(program: &RankProgram, held: impl Fn(&str) -> bool) -> usize {
        let g = &program.graph;
        program
            .all_gather
            .iter()
            .flat_map(|b| b.params.iter().map(move |n| (b, n)))
            .filter(|(_, n)| held(n))
            .filter_map(|(b, n)| program.param(n).map(|p| (b, p)))
            .map(|(b, p)| {
                let own = g.node(p.local).ty.dtype;
                p.layout.slice_len() * (b.dtype.size() + if own == b.dtype { 0 } else { own.size() })
            })
            .sum()
    }

    /// The sum of the five parts, in bytes.
    pub fn total(&self) -> usize {
        self.parameters
            .saturating_add(self.gradients)
            .saturating_add(self.optimizer_state)
            .saturating_add(self.peak_activations)
            .saturating_add(self.comm_buffers)
    }
}

/// The region the recomputed copy `i` (`recompute/<op>`) of `program`'s graph belongs to, given
/// the regions of the copies before it: a level3 weight's all-gather; else the graph's block
/// whose prefix names the op; else, for a redistribution (`<consumer>.in<slot>...`), the region
/// of the copy it moves; else the marked op whose name the copy's local node starts with (a
/// redistribution `<op>.in0.<step>` or scaling `<op>.share` emitted for it); else the node.
fn recompute_region(program: &RankProgram, region_of: &BTreeMap<usize, String>, i: usize) -> String {
    let g = &program.graph;
    let node = g.node(NodeId(i));
    if matches!(node.op, OpKind::AllGather(_)) && program.params.iter().any(|p| p.gathered.is_some() && node.inputs == [p.local]) {
        return "weights gathered again (optimizer_level level3)".to_string();
    }
    let op = node.name.strip_prefix("recompute/").unwrap_or(&node.name);
    if let Some(block) = g.blocks.iter().filter(|b| op.starts_with(b.as_str())).max_by_key(|b| b.len()) {
        return block.clone();
    }
    if let Some(moved) = node.inputs.iter().find_map(|x| region_of.get(&x.0)).filter(|_| op.contains(".in")) {
        return moved.clone();
    }
    let marked = |name: &str| g.find(name).is_ok_and(|id| g.node(id).recompute == Recompute::Marked);
    op.match_indices('.').map(|(k, _)| &op[..k]).find(|prefix| marked(prefix)).unwrap_or(op).to_string()
}

/// The predicted cost of one rank's step.
#[derive(Clone, Debug, PartialEq)]
pub struct RankCost {
    /// The rank, counted in the world.
    pub rank: usize,
    /// Floating-point operations of the step (forward and backward).
    pub flops: f64,
    /// Bytes the step's ops read and write.
    pub bytes_moved: usize,
    /// Communication by (kind, group), sorted.
    pub comm: Vec<CommVolume>,
    /// The memory the rank holds for the step.
    pub memory: Memory,
    /// What the backward pass recomputes, per region (a block, or an op marked alone), in the
    /// order it recomputes them: already counted in `flops`, `comm` and `memory`.
    pub recompute: Vec<Recomputed>,
}

/// One recomputed region of a rank's step: what recomputing it costs and what it saves.
#[derive(Clone, Debug, PartialEq)]
pub struct Recomputed {
    /// The block's name prefix (`blocks.0.`), or the name of an op recomputed alone.
    pub region: String,
    /// The ops the backward pass runs again.
    pub ops: usize,
    /// Their floating-point operations.
    pub flops: f64,
    /// The bytes their collectives hand to the communicator again.
    pub comm_bytes: usize,
    /// The bytes of the forward values the backward pass reads from the copies, which without
    /// recomputation the forward pass would keep until then.
    pub not_kept: usize,
}

impl RankCost {
    /// The cost of `program`'s step; `optimizer_slots` state tensors per trainable parameter.
    pub fn of(program: &RankProgram, optimizer_slots: usize) -> Result<Self> {
        let g = &program.graph;
        let fetch = program.fetch();
        let schedule = g.schedule(&fetch)?;
        let mut flops = 0.0;
        let mut bytes_moved = 0;
        let mut comm: BTreeMap<(Collective, Vec<usize>), (usize, usize)> = BTreeMap::new();
        let mut recompute: Vec<Recomputed> = Vec::new();
        let mut region_of: BTreeMap<usize, String> = BTreeMap::new();
        let users = g.users();
        for &i in &schedule.order {
            let node = &g.nodes()[i];
            let ins: Vec<TensorType> = node.inputs.iter().map(|x| g.node(*x).ty.clone()).collect();
            let c = node.op.def().cost(&CostCx { inputs: &ins, output: &node.ty, rank: program.rank });
            flops += c.flops;
            bytes_moved += c.bytes;
            if node.recompute == Recompute::Replay {
                let region = recompute_region(program, &region_of, i);
                region_of.insert(i, region.clone());
                let r = match recompute.iter_mut().position(|r| r.region == region) {
                    Some(k) => &mut recompute[k],
                    None => {
                        recompute.push(Recomputed { region, ops: 0, flops: 0.0, comm_bytes: 0, not_kept: 0 });
                        recompute.last_mut().expect("pushed")
                    }
                };
                r.ops += 1;
                r.flops += c.flops;
                r.comm_bytes += c.comm.iter().map(|call| call.bytes).sum::<usize>();
                // A value a backward op reads (not only another copy): without recomputation
                // the forward pass would have kept it until then.
                if users[i].iter().any(|u| g.node(*u).recompute != Recompute::Replay) {
                    r.not_kept += node.value_bytes();
                }
            }
            for call in c.comm {
                let e = comm.entry((call.kind, call.group)).or_default();
                e.0 += 1;
                e.1 += call.bytes;
            }
        }
        for b in &program.buckets {
            if b.group.len() < 2 {
                continue;
            }
            let elements: usize = b.params.iter().filter_map(|n| program.param(n)).map(|p| p.layout.slice_len()).sum();
            let e = comm.entry((Collective::AllReduce, b.group.clone())).or_default();
            e.0 += 1;
            e.1 += elements * b.dtype.size();
        }
        // The parallel optimizer's collectives, counted like every other one by the send
        // buffer: the stored pieces all-gathered into slices over the shard group; the
        // gradients reduce-scattered over the replica group, each shard cut into one part per
        // rank holding it (the last part padded), then those parts all-gathered over them.
        let params = |names: &[String]| -> Vec<&crate::program::ParamSlot> { names.iter().filter_map(|n| program.param(n)).collect() };
        for b in &program.all_gather {
            let e = comm.entry((Collective::AllGather, b.group.clone())).or_default();
            e.0 += 1;
            e.1 += params(&b.params).iter().map(|p| p.stored_shape().iter().product::<usize>()).sum::<usize>() * b.dtype.size();
        }
        for b in &program.reduce_scatter {
            let (g, k) = (b.group.len(), b.shard_size);
            let holders = g / k;
            let parts: usize = params(&b.params).iter().map(|p| (p.layout.slice_len() / k).div_ceil(holders)).sum();
            let e = comm.entry((Collective::ReduceScatter, b.group.clone())).or_default();
            e.0 += 1;
            e.1 += parts * g * b.dtype.size();
            if b.rest.len() > 1 {
                let e = comm.entry((Collective::AllGather, b.rest.clone())).or_default();
                e.0 += 1;
                e.1 += parts * b.dtype.size();
            }
        }
        // The gradients the step fetches: alive from when they are formed to the step's end.
        let gathered = Memory::gathered_slices(program, |_| true);
        let grad_ids: std::collections::BTreeSet<usize> = program.grads.iter().map(|(_, g)| g.0).collect();
        let grads: usize = grad_ids.iter().map(|&id| g.node(NodeId(id)).value_bytes()).sum();
        Ok(RankCost {
            rank: program.rank,
            flops,
            bytes_moved,
            comm: comm.into_iter().map(|((kind, group), (calls, bytes))| CommVolume { kind, group, calls, bytes }).collect(),
            memory: Memory {
                peak_activations: schedule.peak_bytes(g).saturating_sub(grads) + gathered,
                activations: schedule.peak_bytes_where(g, |i| !grad_ids.contains(&i)) + gathered,
                ..Memory::of_params(program, optimizer_slots, |_| true)
            }
            .with_comm_buffers(program, |_| true, gathered, true),
            recompute,
        })
    }

    /// Bytes handed to the communicator in the step, all kinds.
    pub fn comm_bytes(&self) -> usize {
        self.comm.iter().map(|c| c.bytes).sum()
    }

    /// Bytes per collective kind.
    pub fn bytes_by_kind(&self) -> BTreeMap<Collective, usize> {
        let mut out = BTreeMap::new();
        for c in &self.comm {
            *out.entry(c.kind).or_default() += c.bytes;
        }
        out
    }
}
