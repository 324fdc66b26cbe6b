//! Redistribution planning: the steps that turn every rank's slice under one layout into its
//! slice under another layout of the same tensor.
//!
//! Transition table (per device axis; each row names the test that pins it):
//!
//! | from -> to          | step                      | test                                        |
//! |---------------------|---------------------------|---------------------------------------------|
//! | same layout         | nothing                   | `identical_layouts_give_an_empty_plan`      |
//! | S(d) -> R           | all-gather along d        | `shard_to_replicate_is_one_all_gather`      |
//! | R -> S(d)           | local slice, no comm      | `replicate_to_shard_is_a_local_slice`       |
//! | S(i) -> S(j)        | all-to-all                | `shard_dim0_to_dim1_is_one_all_to_all`      |
//! | P -> R              | all-reduce                | `partial_to_replicate_is_all_reduce`        |
//! | P -> S(d)           | reduce-scatter along d    | `partial_to_shard_uses_reduce_scatter`      |
//! | R -> P              | local zeroing (keep on coordinate 0) | `replicate_to_partial_is_local`  |
//! | same slices, other ranks | point-to-point permutation | `moving_a_dim_to_another_axis_is_a_permutation` |
//!
//! How: both device matrices are refined to a common one (`[2,4]` and `[4,2]` become
//! `[2,2,2]`), each layout rewritten onto it (a dimension may then use several axes, most
//! significant first). On that mesh the planner walks from the source state to the destination
//! one, preferring steps that shrink or keep the local data (reduce-scatter, all-to-all, local
//! slice) over all-reduce and all-gather; each step acts on the least significant axis of a
//! dimension, so every intermediate state is again a valid layout. When the meshes have no
//! common refinement (`[2,3]` vs `[3,2]`) the plan gathers on the source mesh and slices on
//! the destination one. When source and destination hold the same set of slices on different
//! ranks, a single point-to-point permutation replaces the collective plan. Shapes never change
//! (both layouts describe one tensor), so no reshape step is needed.

use std::collections::HashMap;
use std::fmt;

use crate::error::{LayoutError, Result};
use crate::layout::TensorLayout;
use crate::mesh::{group_of, DeviceAxis, DeviceMatrix};

/// One collective or local operation, executed by every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Keep piece `axis.coord(rank)` of `axis.size` pieces along `dim`. Local.
    Slice {
        /// The tensor dimension sliced, counted from 0.
        dim: usize,
        /// The device axis whose coordinate picks the piece.
        axis: DeviceAxis,
    },
    /// Concatenate the pieces of the group along `axis`, in coordinate order, along `dim`.
    AllGather {
        /// The tensor dimension concatenated, counted from 0.
        dim: usize,
        /// The device axis of the group.
        axis: DeviceAxis,
    },
    /// Split along `split_dim` into `axis.size` pieces, send piece k to the k-th group member,
    /// concatenate what arrives along `concat_dim`.
    AllToAll {
        /// The tensor dimension split, counted from 0.
        split_dim: usize,
        /// The tensor dimension concatenated, counted from 0.
        concat_dim: usize,
        /// The device axis of the group.
        axis: DeviceAxis,
    },
    /// Sum over the group along `axes` (partial sums become whole values).
    AllReduce {
        /// The device axes of the group.
        axes: Vec<DeviceAxis>,
    },
    /// Sum over the group along `axis`, each member keeping piece `coord` along `dim`.
    ReduceScatter {
        /// The tensor dimension scattered, counted from 0.
        dim: usize,
        /// The device axis of the group.
        axis: DeviceAxis,
    },
    /// Make the tensor a partial sum along `axis`: coordinate 0 keeps its values, the others
    /// hold zeros. Local.
    MakePartial {
        /// The device axis of the partial sum.
        axis: DeviceAxis,
    },
    /// Point-to-point: rank `r` receives the local data of rank `source[r]`.
    Permute {
        /// For every rank, the rank whose local data it receives.
        source: Vec<usize>,
    },
}

/// A collective as ring algorithms run it, for the bytes each rank sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// All-gather: each rank's buffer passes every other rank.
    AllGather,
    /// Reduce-scatter or all-to-all: each rank sends all but its own share.
    Scatter,
    /// All-reduce: a reduce-scatter then an all-gather of the shares.
    AllReduce,
}

impl Ring {
    /// The bytes the busiest rank sends for a send buffer of `bytes` over `ranks` ranks.
    pub fn bytes_sent(self, ranks: usize, bytes: usize) -> usize {
        let n = ranks.max(1);
        match self {
            Ring::AllGather => bytes * (n - 1),
            Ring::Scatter => (bytes * (n - 1)).div_ceil(n),
            Ring::AllReduce => (2 * bytes * (n - 1)).div_ceil(n),
        }
    }
}

impl Step {
    /// Whether this step moves data between ranks.
    pub fn is_communication(&self) -> bool {
        match self {
            Step::Slice { .. } | Step::MakePartial { .. } => false,
            Step::Permute { source } => source.iter().enumerate().any(|(r, &s)| r != s),
            _ => true,
        }
    }

    /// Bytes the busiest rank sends in this step, for `input_len` local elements before the
    /// step (ring algorithms for the collectives).
    pub fn bytes_sent(&self, input_len: usize, elem_size: usize) -> usize {
        let b = input_len * elem_size;
        match self {
            Step::Slice { .. } | Step::MakePartial { .. } => 0,
            Step::AllGather { axis, .. } => Ring::AllGather.bytes_sent(axis.size, b),
            Step::AllToAll { axis, .. } | Step::ReduceScatter { axis, .. } => Ring::Scatter.bytes_sent(axis.size, b),
            Step::AllReduce { axes } => Ring::AllReduce.bytes_sent(axes.iter().map(|a| a.size).product(), b),
            Step::Permute { source } => {
                let mut sends: HashMap<usize, usize> = HashMap::new();
                for (r, &s) in source.iter().enumerate() {
                    if r != s {
                        *sends.entry(s).or_default() += 1;
                    }
                }
                sends.values().copied().max().unwrap_or(0) * b
            }
        }
    }

    /// The ranks `rank` exchanges data with in this step (itself included), in group order.
    pub fn group(&self, rank: usize) -> Vec<usize> {
        match self {
            Step::Slice { .. } | Step::MakePartial { .. } => vec![rank],
            Step::AllGather { axis, .. } | Step::AllToAll { axis, .. } | Step::ReduceScatter { axis, .. } => axis.group(rank),
            Step::AllReduce { axes } => {
                let mut g = group_of(rank, axes);
                g.sort_unstable();
                g
            }
            Step::Permute { source } => {
                let mut g = vec![rank, source[rank]];
                g.extend(source.iter().enumerate().filter(|(_, &s)| s == rank).map(|(r, _)| r));
                g.sort_unstable();
                g.dedup();
                g
            }
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ax = |a: &DeviceAxis| format!("{} ranks, stride {}", a.size, a.stride);
        match self {
            Step::Slice { dim, axis } => write!(f, "slice dim {dim} into {} (local)", axis.size),
            Step::AllGather { dim, axis } => write!(f, "all_gather dim {dim} over {}", ax(axis)),
            Step::AllToAll { split_dim, concat_dim, axis } => {
                write!(f, "all_to_all split dim {split_dim}, concat dim {concat_dim} over {}", ax(axis))
            }
            Step::AllReduce { axes } => {
                let p: usize = axes.iter().map(|a| a.size).product();
                write!(f, "all_reduce sum over {p} ranks")
            }
            Step::ReduceScatter { dim, axis } => write!(f, "reduce_scatter dim {dim} over {}", ax(axis)),
            Step::MakePartial { axis } => write!(f, "make partial over {} (local)", ax(axis)),
            Step::Permute { source } => {
                let moved = source.iter().enumerate().filter(|(r, s)| r != *s).count();
                write!(f, "permute ({moved} ranks receive a slice)")
            }
        }
    }
}

/// A step with the local element count before it and the layout after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedStep {
    /// The operation.
    pub step: Step,
    /// Local elements per rank before the step.
    pub input_len: usize,
    /// The layout after the step.
    pub after: TensorLayout,
}

/// The steps from `src` to `dst`. Plans are plain data: print, compare, simulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedistributionPlan {
    /// The source layout, as given.
    pub src: TensorLayout,
    /// The destination layout, as given.
    pub dst: TensorLayout,
    /// The source layout on the planning mesh (the start of the chain `Display` prints).
    pub start: TensorLayout,
    /// The steps, in execution order.
    pub steps: Vec<PlannedStep>,
}

impl RedistributionPlan {
    /// Whether the plan has no step (the layouts are the same).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Number of steps that move data between ranks.
    pub fn num_communications(&self) -> usize {
        self.steps.iter().filter(|s| s.step.is_communication()).count()
    }

    /// Bytes the busiest rank sends over the whole plan.
    pub fn bytes_sent_per_rank(&self, elem_size: usize) -> usize {
        self.steps.iter().map(|s| s.step.bytes_sent(s.input_len, elem_size)).sum()
    }

    /// The steps alone.
    pub fn ops(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().map(|s| &s.step)
    }

    /// One line per step with the bytes each rank sends.
    pub fn describe(&self, elem_size: usize) -> String {
        let mut out = format!("{} -> {}: {} step(s)\n", self.src, self.dst, self.steps.len());
        for (i, s) in self.steps.iter().enumerate() {
            out += &format!(
                "  {}. {:<60} -> {}  ({} bytes sent per rank)\n",
                i + 1,
                s.step.to_string(),
                s.after,
                s.step.bytes_sent(s.input_len, elem_size)
            );
        }
        out
    }
}

/// `S(0)R -> RR -> RS(1)`: the chain of layouts on the planning mesh.
impl fmt::Display for RedistributionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.start)?;
        for s in &self.steps {
            write!(f, " -> {}", s.after)?;
        }
        Ok(())
    }
}

impl RedistributionPlan {
    /// The same plan with every all-to-all replaced by an all-gather of its concatenation
    /// dimension followed by a local slice of its split dimension: MindSpore's lowering when
    /// `enable_alltoall` is off (AllGather, then Split/Concat and StridedSlice). Every rank ends
    /// with the same slices; each step's layout stays valid.
    pub fn without_all_to_all(self) -> Result<Self> {
        let mut steps = Vec::with_capacity(self.steps.len());
        let mut before = self.start.clone();
        for s in self.steps {
            let Step::AllToAll { split_dim, concat_dim, axis } = s.step else {
                before = s.after.clone();
                steps.push(s);
                continue;
            };
            // After the all-gather `axis` splits neither dimension.
            let mesh = before.mesh().clone();
            let a = (0..mesh.ndim()).find(|&k| mesh.axis(k) == axis).ok_or_else(|| LayoutError::Simulation {
                what: format!("all-to-all over an axis of size {} that {} lacks", axis.size, before),
            })?;
            let mut map = before.dim_axes().to_vec();
            map[concat_dim].retain(|&x| x != a);
            let gathered = TensorLayout::new(mesh, map, before.shape().to_vec())?.with_partial(before.partial_axes().to_vec())?;
            steps.push(PlannedStep { step: Step::AllGather { dim: concat_dim, axis }, input_len: s.input_len, after: gathered });
            steps.push(PlannedStep {
                step: Step::Slice { dim: split_dim, axis },
                input_len: s.input_len * axis.size,
                after: s.after.clone(),
            });
            before = s.after;
        }
        Ok(Self { steps, ..self })
    }
}

/// Plan the redistribution of one tensor from `src` to `dst`.
pub fn plan(src: &TensorLayout, dst: &TensorLayout) -> Result<RedistributionPlan> {
    plan_with(src, dst, true)
}

/// Like [`plan`]; with `allow_permute` false the plan uses collectives and local steps only
/// (no point-to-point permutation), as graph programs with differentiable steps need.
pub fn plan_with(src: &TensorLayout, dst: &TensorLayout, allow_permute: bool) -> Result<RedistributionPlan> {
    if src.shape() != dst.shape() {
        return Err(LayoutError::ShapeMismatch { src: src.shape().to_vec(), dst: dst.shape().to_vec() });
    }
    let (ns, nd) = (src.mesh().num_devices(), dst.mesh().num_devices());
    if ns != nd {
        return Err(LayoutError::DeviceCountMismatch { src: ns, dst: nd });
    }
    if src == dst {
        return Ok(RedistributionPlan { src: src.clone(), dst: dst.clone(), start: src.clone(), steps: Vec::new() });
    }
    let (start, mut steps) = match refine(src.mesh().dims(), dst.mesh().dims()) {
        Some((mesh, rs, rd)) => {
            let a = expand(src, &mesh, &rs)?;
            let b = expand(dst, &mesh, &rd)?;
            let steps = plan_on_mesh(&a, &b)?;
            (a, steps)
        }
        None => {
            let full_src = TensorLayout::replicated(src.mesh().clone(), src.shape().to_vec());
            let full_dst = TensorLayout::replicated(dst.mesh().clone(), dst.shape().to_vec());
            let mut steps = plan_on_mesh(src, &full_src)?;
            steps.extend(plan_on_mesh(&full_dst, dst)?);
            (src.clone(), steps)
        }
    };
    if allow_permute
        && steps.iter().any(|s| s.step.is_communication())
        && !src.is_partial()
        && !dst.is_partial()
        && src.slice_shape() == dst.slice_shape()
    {
        if let Some(source) = permutation(src, dst) {
            steps = vec![PlannedStep { step: Step::Permute { source }, input_len: src.slice_len(), after: dst.clone() }];
        }
    }
    Ok(RedistributionPlan { src: src.clone(), dst: dst.clone(), start, steps })
}

/// A common refinement of two factorisations of the same device count, with the refined axes
/// each original axis covers. `None` if the prefix products do not form a divisor chain.
#[allow(clippy::type_complexity)]
fn refine(a: &[usize], b: &[usize]) -> Option<(DeviceMatrix, Vec<std::ops::Range<usize>>, Vec<std::ops::Range<usize>>)> {
    let prefixes = |d: &[usize]| {
        let mut p = vec![1usize];
        for &x in d {
            p.push(p.last().unwrap() * x);
        }
        p
    };
    let (pa, pb) = (prefixes(a), prefixes(b));
    let mut all: Vec<usize> = pa.iter().chain(&pb).copied().collect();
    all.sort_unstable();
    all.dedup();
    if all.windows(2).any(|w| w[1] % w[0] != 0) {
        return None;
    }
    let dims: Vec<usize> = all.windows(2).map(|w| w[1] / w[0]).collect();
    let ranges = |p: &[usize]| {
        p.windows(2)
            .map(|w| {
                let s = all.iter().position(|&x| x == w[0]).unwrap();
                let e = all.iter().position(|&x| x == w[1]).unwrap();
                s..e
            })
            .collect::<Vec<_>>()
    };
    let (ra, rb) = (ranges(&pa), ranges(&pb));
    Some((DeviceMatrix::new_unchecked(dims), ra, rb))
}

fn expand(l: &TensorLayout, mesh: &DeviceMatrix, ranges: &[std::ops::Range<usize>]) -> Result<TensorLayout> {
    let map = l.dim_axes().iter().map(|axes| axes.iter().flat_map(|&a| ranges[a].clone()).collect()).collect();
    let partial = l.partial_axes().iter().flat_map(|&a| ranges[a].clone()).collect();
    TensorLayout::new(mesh.clone(), map, l.shape().to_vec())?.with_partial(partial)
}

struct State<'a> {
    mesh: &'a DeviceMatrix,
    shape: &'a [usize],
    dims: Vec<Vec<usize>>,
    partial: Vec<usize>,
}

impl State<'_> {
    fn len(&self) -> usize {
        self.shape.iter().zip(&self.dims).map(|(&s, axes)| s / axes.iter().map(|&a| self.mesh.dims()[a]).product::<usize>()).product()
    }

    fn layout(&self) -> Result<TensorLayout> {
        TensorLayout::new(self.mesh.clone(), self.dims.clone(), self.shape.to_vec())?.with_partial(self.partial.clone())
    }

    fn is_free(&self, a: usize) -> bool {
        !self.partial.contains(&a) && !self.dims.iter().any(|d| d.contains(&a))
    }
}

fn is_prefix(a: &[usize], b: &[usize]) -> bool {
    a.len() <= b.len() && a == &b[..a.len()]
}

/// Plan between two layouts on the same mesh.
fn plan_on_mesh(src: &TensorLayout, dst: &TensorLayout) -> Result<Vec<PlannedStep>> {
    let mesh = src.mesh();
    let mut st = State { mesh, shape: src.shape(), dims: src.dim_axes().to_vec(), partial: src.partial_axes().to_vec() };
    let (ddims, dpartial) = (dst.dim_axes(), dst.partial_axes());
    let ndim = st.dims.len();
    let mut steps = Vec::new();
    let next_needed = |st: &State, j: usize| -> Option<usize> {
        (is_prefix(&st.dims[j], &ddims[j]) && st.dims[j].len() < ddims[j].len()).then(|| ddims[j][st.dims[j].len()])
    };
    // Each iteration makes one step of progress; bound it to stay panic- and hang-free.
    let limit = 4 * (mesh.ndim() + 1) * (ndim + 1) + 8;
    for _ in 0..limit {
        let mut sorted_partial = st.partial.clone();
        sorted_partial.sort_unstable();
        if st.dims == ddims && sorted_partial == dpartial {
            return Ok(steps);
        }
        let input_len = st.len();
        let step = 'choose: {
            // 1. partial -> shard: reduce-scatter onto a dimension ready for that axis.
            let found = st
                .partial
                .iter()
                .copied()
                .filter(|a| !dpartial.contains(a))
                .find_map(|a| (0..ndim).find(|&j| next_needed(&st, j) == Some(a)).map(|j| (a, j)));
            if let Some((a, j)) = found {
                st.partial.retain(|&x| x != a);
                st.dims[j].push(a);
                break 'choose Step::ReduceScatter { dim: j, axis: mesh.axis(a) };
            }
            // 2. shard on one dim -> shard on another: all-to-all.
            for (i, want) in ddims.iter().enumerate() {
                if is_prefix(&st.dims[i], want) {
                    continue;
                }
                let a = *st.dims[i].last().expect("a non-prefix list is not empty");
                if let Some(j) = (0..ndim).find(|&j| j != i && next_needed(&st, j) == Some(a)) {
                    st.dims[i].pop();
                    st.dims[j].push(a);
                    break 'choose Step::AllToAll { split_dim: j, concat_dim: i, axis: mesh.axis(a) };
                }
            }
            // 3. replicate -> shard: local slice.
            for j in 0..ndim {
                if let Some(a) = next_needed(&st, j) {
                    if st.is_free(a) {
                        st.dims[j].push(a);
                        break 'choose Step::Slice { dim: j, axis: mesh.axis(a) };
                    }
                }
            }
            // 4. partial -> replicate: all-reduce every partial axis the destination lacks.
            let reduce: Vec<usize> = st.partial.iter().copied().filter(|a| !dpartial.contains(a)).collect();
            if !reduce.is_empty() {
                st.partial.retain(|a| dpartial.contains(a));
                break 'choose Step::AllReduce { axes: reduce.iter().map(|&a| mesh.axis(a)).collect() };
            }
            // 5. shard -> replicate: all-gather the least significant excess axis, first those
            //    the destination does not split by (an axis it needs elsewhere may later move
            //    there by all-to-all instead).
            let excess = |i: &usize| !is_prefix(&st.dims[*i], &ddims[*i]);
            let needed_elsewhere = |i: &usize| st.dims[*i].last().is_some_and(|a| ddims.iter().any(|d| d.contains(a)));
            // Then those whose removal lets another dimension's excess axis move in by all-to-all.
            let unblocks = |i: &usize| {
                let mut shorter = st.dims[*i].clone();
                shorter.pop();
                is_prefix(&shorter, &ddims[*i])
                    && shorter.len() < ddims[*i].len()
                    && (0..ndim).any(|k| k != *i && excess(&k) && st.dims[k].last() == Some(&ddims[*i][shorter.len()]))
            };
            let choice = (0..ndim)
                .filter(excess)
                .find(|i| !needed_elsewhere(i))
                .or_else(|| (0..ndim).filter(excess).find(unblocks))
                .or_else(|| (0..ndim).find(excess));
            if let Some(i) = choice {
                let a = st.dims[i].pop().expect("a non-prefix list is not empty");
                break 'choose Step::AllGather { dim: i, axis: mesh.axis(a) };
            }
            // 6. replicate -> partial: local.
            for &a in dpartial {
                if st.is_free(a) {
                    st.partial.push(a);
                    break 'choose Step::MakePartial { axis: mesh.axis(a) };
                }
            }
            return Err(LayoutError::Simulation { what: format!("planner made no progress from {src} to {dst}") });
        };
        st.partial.sort_unstable();
        steps.push(PlannedStep { step, input_len, after: st.layout()? });
    }
    Err(LayoutError::Simulation { what: format!("planner did not converge from {src} to {dst}") })
}

/// If every destination slice is exactly a source slice (same slice shapes, no partials):
/// for each rank the rank it receives from, preferring itself, else spreading the senders over
/// the replicas of that slice.
fn permutation(src: &TensorLayout, dst: &TensorLayout) -> Option<Vec<usize>> {
    let n = src.mesh().num_devices();
    if src.splits() != dst.splits() {
        return None;
    }
    // Equal splits: slice indices of both layouts name the same pieces.
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); src.num_slices()];
    let src_index: Vec<usize> = (0..n).map(|r| src.slice_index_unchecked(r)).collect();
    for (r, &i) in src_index.iter().enumerate() {
        holders[i].push(r);
    }
    let mut next = vec![0usize; holders.len()];
    let mut source = Vec::with_capacity(n);
    for (r, &mine) in src_index.iter().enumerate() {
        let want = dst.slice_index_unchecked(r);
        if mine == want {
            source.push(r);
            continue;
        }
        let ranks = &holders[want];
        if ranks.is_empty() {
            return None;
        }
        source.push(ranks[next[want] % ranks.len()]);
        next[want] += 1;
    }
    Some(source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mindspore::TensorMap;

    fn l(dev: &[usize], map: &str, shape: &[usize]) -> TensorLayout {
        TensorLayout::from_mindspore(dev, &map.parse::<TensorMap>().unwrap(), shape).unwrap()
    }

    fn kinds(p: &RedistributionPlan) -> Vec<&'static str> {
        p.ops()
            .map(|s| match s {
                Step::Slice { .. } => "slice",
                Step::AllGather { .. } => "all_gather",
                Step::AllToAll { .. } => "all_to_all",
                Step::AllReduce { .. } => "all_reduce",
                Step::ReduceScatter { .. } => "reduce_scatter",
                Step::MakePartial { .. } => "make_partial",
                Step::Permute { .. } => "permute",
            })
            .collect()
    }

    #[test]
    fn identical_layouts_give_an_empty_plan() {
        let a = l(&[2, 4], "1,0", &[8, 8]);
        assert!(plan(&a, &a).unwrap().is_empty());
    }

    #[test]
    fn shard_to_replicate_is_one_all_gather() {
        let p = plan(&l(&[8], "0,-1", &[16, 4]), &l(&[8], "-1,-1", &[16, 4])).unwrap();
        assert_eq!(kinds(&p), ["all_gather"]);
        assert_eq!(p.bytes_sent_per_rank(4), 2 * 4 * 4 * 7);
        assert_eq!(p.to_string(), "S(0) -> R");
    }

    #[test]
    fn replicate_to_shard_is_a_local_slice() {
        let p = plan(&l(&[2, 4], "-1,-1", &[8, 8]), &l(&[2, 4], "-1,0", &[8, 8])).unwrap();
        assert_eq!(kinds(&p), ["slice"]);
        assert_eq!(p.num_communications(), 0);
        assert_eq!(p.bytes_sent_per_rank(4), 0);
    }

    #[test]
    fn shard_dim0_to_dim1_is_one_all_to_all() {
        let p = plan(&l(&[4], "0,-1", &[8, 8]), &l(&[4], "-1,0", &[8, 8])).unwrap();
        assert_eq!(kinds(&p), ["all_to_all"]);
        assert_eq!(p.to_string(), "S(0) -> S(1)");
    }

    #[test]
    fn partial_to_replicate_is_all_reduce() {
        let src = l(&[2, 4], "1,-1", &[8, 8]).with_partial(vec![1]).unwrap();
        let p = plan(&src, &l(&[2, 4], "1,-1", &[8, 8])).unwrap();
        assert_eq!(kinds(&p), ["all_reduce"]);
    }

    #[test]
    fn partial_to_shard_uses_reduce_scatter() {
        let src = l(&[2, 4], "1,-1", &[8, 8]).with_partial(vec![1]).unwrap();
        let p = plan(&src, &l(&[2, 4], "1,0", &[8, 8])).unwrap();
        assert_eq!(kinds(&p), ["reduce_scatter"]);
        assert_eq!(p.to_string(), "S(0)P -> S(0)S(1)");
    }

    #[test]
    fn replicate_to_partial_is_local() {
        let dst = l(&[2, 4], "-1,-1", &[8, 8]).with_partial(vec![0]).unwrap();
        let p = plan(&l(&[2, 4], "-1,-1", &[8, 8]), &dst).unwrap();
        assert_eq!(kinds(&p), ["make_partial"]);
    }

    #[test]
    fn moving_a_dim_to_another_axis_is_a_permutation() {
        let p = plan(&l(&[2, 2], "1,-1", &[8, 8]), &l(&[2, 2], "0,-1", &[8, 8])).unwrap();
        assert_eq!(kinds(&p), ["permute"]);
        // each rank sends at most one slice
        assert_eq!(p.bytes_sent_per_rank(1), 32);
    }

    #[test]
    fn different_device_matrices_are_refined() {
        // [2,4] (dim 0 on the 2-axis) -> [4,2] (dim 0 on the 4-axis): a local slice suffices.
        let p = plan(&l(&[2, 4], "1,-1", &[16, 8]), &l(&[4, 2], "1,-1", &[16, 8])).unwrap();
        assert_eq!(kinds(&p), ["slice"]);
        // non-refinable meshes fall back to gather + slice
        let p = plan(&l(&[2, 3], "1,0", &[6, 6]), &l(&[3, 2], "1,0", &[6, 6])).unwrap();
        assert!(!p.is_empty());
    }

    #[test]
    fn without_all_to_all_an_all_gather_and_a_local_slice_do_the_same() {
        use crate::simulate::{scatter, simulate, Block};
        let (src, dst) = (l(&[2, 4], "1,0", &[8, 16]), l(&[2, 4], "0,1", &[8, 16]));
        let p = plan_with(&src, &dst, false).unwrap();
        assert!(kinds(&p).contains(&"all_to_all"), "{:?}", kinds(&p));
        let q = p.clone().without_all_to_all().unwrap();
        assert!(!kinds(&q).contains(&"all_to_all"), "{:?}", kinds(&q));
        let count = |p: &RedistributionPlan, k: &str| kinds(p).iter().filter(|x| **x == k).count();
        assert_eq!(count(&q, "all_gather"), count(&p, "all_gather") + count(&p, "all_to_all"));
        let full = Block::from_fn(vec![8, 16], |i| i as f64);
        let want = scatter(&full, &dst).unwrap();
        assert_eq!(simulate(&q, scatter(&full, &src).unwrap()).unwrap(), want);
        assert_eq!(simulate(&p, scatter(&full, &src).unwrap()).unwrap(), want);
    }

    #[test]
    fn mismatched_requests_are_errors() {
        assert!(matches!(plan(&l(&[4], "0", &[8]), &l(&[4], "0", &[16])), Err(LayoutError::ShapeMismatch { .. })));
        assert!(matches!(plan(&l(&[4], "0", &[8]), &l(&[2], "0", &[8])), Err(LayoutError::DeviceCountMismatch { src: 4, dst: 2 })));
    }
}
