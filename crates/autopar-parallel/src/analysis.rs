//! What the planner and the strategy searches read off a network, shared by both (a search must
//! not depend on the planner that calls it): which values depend on the network's inputs,
//! each op's batch dimension and MindSpore's default split, where a value is first used, and
//! the layout a reshape carries its input's split through.

use std::collections::VecDeque;

use autopar_graph::{Graph, Node, NodeId, OpKind};
use autopar_layout::{DeviceMatrix, TensorLayout};

/// Whether each node's value depends on a network input (nodes are in topological order).
pub(crate) fn depends_on_inputs(graph: &Graph) -> Vec<bool> {
    let mut on_data = vec![false; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        on_data[i] = matches!(node.op, OpKind::Input(_)) || node.inputs.iter().any(|x| on_data[x.0]);
    }
    on_data
}

/// MindSpore's default strategy for an unannotated op: data parallel. The batch is the first
/// dimension of the op's first input computed from the network's inputs (the data); the
/// logical dimension it runs along is split over as many of the `n` devices as divide it.
/// Ops on parameters alone are not split. A split reduced dimension (a loss's mean over the
/// batch) leaves a partial sum, completed by an all-reduce.
pub fn default_splits(spec: &autopar_graph::OpSpec, node: &Node, on_data: &[bool], n: usize) -> Vec<usize> {
    let mut splits = vec![1; spec.dims.len()];
    if let Some(l) = batch_dim(spec, node, on_data) {
        let dim = &spec.dims[l];
        if dim.splittable {
            splits[l] = gcd(n, dim.size);
        }
    }
    splits
}

/// The logical dimension an op's batch runs along: the first dimension of its first input
/// computed from the network's inputs (None: an op on parameters alone).
pub(crate) fn batch_dim(spec: &autopar_graph::OpSpec, node: &Node, on_data: &[bool]) -> Option<usize> {
    let i = node.inputs.iter().position(|x| on_data[x.0])?;
    spec.inputs[i].first().copied().flatten()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The first op reading value `id` and the input slot it reads it in: a parameter takes the
/// layout this use needs. A cast the precision policy inserted is looked through (it takes its
/// input's layout): the use is its own first reader's.
pub(crate) fn first_use(graph: &Graph, id: NodeId) -> Option<(NodeId, usize)> {
    let (j, slot) = graph
        .nodes()
        .iter()
        .enumerate()
        .skip(id.0 + 1)
        .find_map(|(j, node)| node.inputs.iter().position(|x| *x == id).map(|slot| (NodeId(j), slot)))?;
    match &graph.node(j).op {
        autopar_graph::OpKind::Cast(c) if c.inserted => first_use(graph, j).or(Some((j, slot))),
        _ => Some((j, slot)),
    }
}

/// `l` without pending partial sums: the layout of the values once they are completed.
pub(crate) fn whole_values(l: &TensorLayout) -> TensorLayout {
    TensorLayout::new(l.mesh().clone(), l.dim_axes().to_vec(), l.shape().to_vec()).expect("dropping partial sums keeps a layout valid")
}

/// The layout of a reshape's output when its input has layout `src`, such that every rank's
/// slice, reshaped, is its slice of the output (no communication). The dimensions pair up in
/// groups whose sizes multiply to the same number. Within a group the input's split must cut
/// the flattened group into contiguous blocks (every dimension before a split one split
/// whole), and the output group takes the same blocks: its leading dimensions split whole,
/// the next one by what is left. A device axis that straddles two output dimensions is
/// factored into two axes (MindSpore's device-matrix expansion): a 16-way split of
/// `[B * T, H]` with `B = 8` becomes 8 ways over `B` and 2 over `T` of `[B, T, heads, d]`.
/// `None` when the split cannot follow the reshape (the planner then gathers around it).
pub fn reshape_layout(src: &TensorLayout, out: &[usize]) -> Option<TensorLayout> {
    let inp = src.shape();
    let mesh = src.mesh().dims();
    // Axes of one device split nothing: left out (they stay in the matrix, mapping nothing).
    let axes: Vec<Vec<usize>> = src.dim_axes().iter().map(|d| d.iter().copied().filter(|&a| mesh[a] > 1).collect()).collect();
    // The sizes each source axis is factored into (major first; empty: kept whole), and each
    // output dimension's axes as (source axis, piece).
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); mesh.len()];
    let mut assigned: Vec<Vec<(usize, usize)>> = vec![Vec::new(); out.len()];
    let (mut i, mut o) = (0usize, 0usize);
    while i < inp.len() || o < out.len() {
        // Skip size-1 dims (they are never split).
        if i < inp.len() && inp[i] == 1 && axes[i].is_empty() {
            i += 1;
            continue;
        }
        if o < out.len() && out[o] == 1 {
            o += 1;
            continue;
        }
        if i >= inp.len() || o >= out.len() {
            return None;
        }
        // Grow the smallest groups [gi, i) and [go, o) with equal products.
        let (gi, go) = (i, o);
        let (mut pi, mut po) = (inp[i], out[o]);
        i += 1;
        o += 1;
        while pi != po {
            if pi < po {
                if i >= inp.len() {
                    return None;
                }
                pi *= inp[i];
                i += 1;
            } else {
                if o >= out.len() {
                    return None;
                }
                po *= out[o];
                o += 1;
            }
        }
        // The input group's blocks, as (axis, size not yet handed out), major first.
        let mut blocks: VecDeque<(usize, usize)> = VecDeque::new();
        let mut whole = true;
        for d in gi..i {
            if axes[d].is_empty() {
                whole &= inp[d] == 1;
                continue;
            }
            if !whole {
                return None;
            }
            blocks.extend(axes[d].iter().map(|&a| (a, mesh[a])));
            whole = src.split(d) == inp[d];
        }
        // Hand them to the output dimensions, major first.
        for d in go..o {
            let left: usize = blocks.iter().map(|b| b.1).product();
            if left == 1 {
                break;
            }
            let mut need = if out[d].is_multiple_of(left) {
                left
            } else if left.is_multiple_of(out[d]) {
                out[d]
            } else {
                return None;
            };
            while need > 1 {
                let (a, size) = blocks.front_mut().expect("the blocks hold `left`");
                let take = if need.is_multiple_of(*size) {
                    *size
                } else if size.is_multiple_of(need) {
                    need
                } else {
                    return None;
                };
                pieces[*a].push(take);
                assigned[d].push((*a, pieces[*a].len() - 1));
                need /= take;
                *size /= take;
                if *size == 1 {
                    blocks.pop_front();
                }
            }
        }
        if !blocks.is_empty() {
            return None;
        }
    }
    // The output's device matrix: each factored axis replaced by its pieces.
    let mut dims = Vec::with_capacity(mesh.len());
    let mut first = Vec::with_capacity(mesh.len());
    for (a, &size) in mesh.iter().enumerate() {
        first.push(dims.len());
        match pieces[a].as_slice() {
            [] => dims.push(size),
            p => dims.extend(p),
        }
    }
    let all = |a: usize| first[a]..first[a] + pieces[a].len().max(1);
    let map = assigned.iter().map(|d| d.iter().map(|&(a, k)| first[a] + k).collect()).collect();
    let partial = src.partial_axes().iter().flat_map(|&a| all(a)).collect();
    let mesh = DeviceMatrix::new(dims).ok()?;
    TensorLayout::new(mesh, map, out.to_vec()).ok()?.with_partial(partial).ok()
}
