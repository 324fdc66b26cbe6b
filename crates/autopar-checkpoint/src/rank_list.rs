//! MindSpore's `rank_list_for_transform`, exactly: which source ranks' files MindSpore's
//! `transform_checkpoint_by_rank` reads to build one destination rank's file.
//!
//! MindSpore answers by simulating its redistribution operators on a shape-independent
//! stand-in tensor and collecting the ranks of every `AllConcat` group it would run. That list is
//! often larger than what the data needs (a device axis is gathered whole even when the
//! destination keeps part of its split), but it is the contract between the tools: a user who
//! fetches the files MindSpore names must be able to run autopar, and the other way round.
//!
//! The steps, each a small pure function:
//! 1. [`ListedLayout`]: a parameter's layout as MindSpore's `_convert_to_list` reads it from a
//!    strategy file (a nested tensor map when the file holds one message per dimension).
//! 2. [`expand_opt_shard`]: the optimizer shard rewritten as an ordinary split of a new
//!    dimension after dimension 0 (`_construct_tensor_layout_for_opt_shard`, including its
//!    special case that renumbers device axes in tensor order).
//! 3. [`equalise`]: the smaller device count gets a leading replicated axis.
//! 4. [`gathered_ranks`]: the ranks whose pieces the redistribution gathers. MindSpore first
//!    refines both device matrices and both tensor shapes to a common factorisation (giving up
//!    when the factors do not nest, and then gathering every split axis), then gathers each
//!    refined device axis that the source uses and the destination does not use for the same
//!    refined tensor dimension. The ranks are those that differ from the destination rank only
//!    along the gathered axes.
//! 5. [`mindspore_rank_list`]: the union over parameters, repeated for every source pipeline
//!    stage, highest rank first.

use std::collections::BTreeSet;

use crate::error::{CheckpointError, Result};
use crate::strategy::StrategyFile;

/// One tensor-map entry as MindSpore's Python reads it: a plain value when the strategy file
/// holds the whole map in one message, a list when it holds one message per dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapEntry {
    /// A plain tensor-map value.
    One(i64),
    /// The values of one tensor dimension split over several device axes.
    Many(Vec<i64>),
}

impl MapEntry {
    fn values(&self) -> &[i64] {
        match self {
            MapEntry::One(v) => std::slice::from_ref(v),
            MapEntry::Many(v) => v,
        }
    }
}

/// A parameter's layout as `_convert_to_list` builds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedLayout {
    /// Parameter name, without a `"<stage>-"` prefix.
    pub name: String,
    /// The device matrix (MindSpore's `dev_matrix`).
    pub dev_matrix: Vec<usize>,
    /// The tensor map, one entry per tensor dimension.
    pub tensor_map: Vec<MapEntry>,
    /// MindSpore's `opt_weight_shard_step`: the rank distance between members of an optimizer-shard group (0 = not sharded).
    pub opt_shard_step: i64,
    /// MindSpore's `opt_weight_shard_size`: 0 = not sharded, -1 = the whole replica group, k > 0 = groups of k.
    pub opt_shard_size: i64,
    /// Pipeline stages holding the parameter, in file order.
    pub stages: Vec<u32>,
}

impl ListedLayout {
    fn device_num(&self) -> usize {
        self.dev_matrix.iter().product()
    }
}

/// Why MindSpore's rank-list computation refuses a pair of layouts.
fn refuse(tensor: &str, reason: String) -> CheckpointError {
    CheckpointError::RankListLayout { tensor: tensor.to_string(), reason }
}

/// `_convert_to_list(strategy, rank_id)`: the layouts in file order. A name held by several
/// pipeline stages (`"<stage>-<name>"`) lists every stage; which stage's layout it keeps follows
/// MindSpore: without a rank the lowest stage's (the later entry on ties); for a rank in stage 0
/// the last stage-0 entry, for a rank in a later stage the last entry of any later stage.
pub fn convert_to_list(file: &StrategyFile, rank: Option<usize>) -> Vec<ListedLayout> {
    let mut out: Vec<ListedLayout> = Vec::new();
    for l in &file.layout_items {
        let (stage, name) = l.split_stage().unwrap_or((0, l.name.as_str()));
        let tensor_map = if l.per_dimension() {
            l.tensor_map.iter().filter(|m| !m.is_empty()).map(|m| MapEntry::Many(m.iter().map(|&v| v as i64).collect())).collect()
        } else {
            l.tensor_map.first().map(|m| m.iter().map(|&v| MapEntry::One(v as i64)).collect()).unwrap_or_default()
        };
        let item = ListedLayout {
            name: name.to_string(),
            dev_matrix: l.devices(),
            tensor_map,
            opt_shard_step: l.opt_weight_shard_step as i64,
            opt_shard_size: l.opt_weight_shard_size as i64,
            stages: vec![stage],
        };
        match out.iter_mut().find(|o| o.name == name) {
            None => out.push(item),
            Some(old) => {
                let mut stages = old.stages.clone();
                stages.push(stage);
                let replace = match rank {
                    Some(r) => {
                        let rank_stage = r / item.device_num().max(1);
                        (rank_stage == 0 && stage == 0) || (rank_stage > 0 && stage > 0)
                    }
                    None => stages.iter().all(|&s| stage <= s),
                };
                if replace {
                    *old = item;
                }
                old.stages = stages;
            }
        }
    }
    out
}

/// `_get_tensor_strategy`: how many pieces each tensor dimension is cut into.
fn tensor_strategy(dev: &[usize], map: &[MapEntry]) -> Vec<usize> {
    let n = dev.len() as i64;
    map.iter().map(|e| e.values().iter().filter(|&&v| v >= 0 && v < n).map(|&v| dev[(n - 1 - v) as usize]).product()).collect()
}

/// `_expand_layout`: a dimension split over several axes becomes one dimension per axis.
fn expand_layout(tensor: &str, dev: &[usize], map: &[MapEntry], shape: &[usize]) -> Result<(Vec<i64>, Vec<usize>)> {
    let n = dev.len() as i64;
    let mut new_map = Vec::new();
    let mut new_shape = Vec::new();
    for (i, e) in map.iter().enumerate() {
        let size = *shape
            .get(i)
            .ok_or_else(|| refuse(tensor, format!("the tensor map has {} entries for {} dimensions", map.len(), shape.len())))?;
        match e {
            MapEntry::One(v) => {
                new_map.push(*v);
                new_shape.push(size);
            }
            MapEntry::Many(vs) => {
                let (last, outer) = vs.split_last().ok_or_else(|| refuse(tensor, "an empty tensor-map entry".into()))?;
                let mut accu = 1;
                for &v in outer {
                    if v < 0 || v >= n {
                        return Err(refuse(tensor, format!("tensor-map value {v} is not an axis of device matrix {dev:?}")));
                    }
                    let d = dev[(n - 1 - v) as usize];
                    new_map.push(v);
                    new_shape.push(d);
                    accu *= d;
                }
                new_map.push(*last);
                new_shape.push(size / accu.max(1));
            }
        }
    }
    Ok((new_map, new_shape))
}

/// A layout with a flat map: (device matrix, tensor map, full shape).
type Flat = (Vec<usize>, Vec<i64>, Vec<usize>);

/// `_construct_tensor_layout_helper`: take the optimizer shard from the replicated device axes,
/// innermost first (splitting one axis when the shard ends inside it), and insert one tensor
/// dimension per used axis after dimension 0.
fn opt_helper(
    tensor: &str,
    dev: &[usize],
    map: &[MapEntry],
    size: i64,
    origin: &[usize],
    strategy: &[usize],
    repeated: &[usize],
) -> Result<(Vec<usize>, Vec<MapEntry>, Vec<usize>)> {
    let mut new_dev = dev.to_vec();
    let mut renumber: Vec<i64> = (0..dev.len() as i64).collect();
    let mut opt_dims: Vec<usize> = Vec::new();
    let mut remained = if size == -1 { repeated.iter().map(|&i| dev[i]).product::<usize>() } else { size as usize };
    for &dim in repeated.iter().rev() {
        let mut s = dev[dim];
        if remained < s {
            if !s.is_multiple_of(remained) {
                return Err(refuse(tensor, format!("device-matrix value {s} cannot be divided by the optimizer shard size {remained}")));
            }
            s = remained;
            new_dev[dim] = dev[dim] / s;
            new_dev.insert(dim + 1, s);
            for r in renumber.iter_mut().skip(dev.len() - dim - 1) {
                *r += 1;
            }
        }
        if remained % s != 0 {
            return Err(refuse(tensor, format!("the remaining optimizer shard size {remained} cannot be divided by {s}")));
        }
        remained /= s;
        opt_dims.insert(0, dim);
        if remained == 1 {
            break;
        }
    }
    let re = |v: i64| if v >= 0 { renumber.get(v as usize).copied().unwrap_or(v) } else { v };
    let mut new_map: Vec<MapEntry> = map.to_vec();
    if new_dev.len() != dev.len() {
        for d in opt_dims.iter_mut() {
            *d += 1;
        }
        for e in new_map.iter_mut() {
            *e = match e {
                MapEntry::One(v) => MapEntry::One(re(*v)),
                MapEntry::Many(vs) => MapEntry::Many(vs.iter().map(|&v| re(v)).collect()),
            };
        }
    }
    let s0 = strategy.first().copied().unwrap_or(1).max(1);
    let first_rest = origin.first().copied().unwrap_or(1) / s0;
    let mut shape = origin.to_vec();
    if let Some(x) = shape.first_mut() {
        *x = s0;
    }
    let mut accu = 1;
    for (i, &d) in opt_dims.iter().take(opt_dims.len().saturating_sub(1)).enumerate() {
        shape.insert(i + 1, new_dev[d]);
        accu *= new_dev[d];
    }
    shape.insert(opt_dims.len().min(shape.len()), first_rest / accu.max(1));
    for (i, &d) in opt_dims.iter().enumerate() {
        new_map.insert((i + 1).min(new_map.len()), MapEntry::One((new_dev.len() - d - 1) as i64));
    }
    Ok((new_dev, new_map, shape))
}

/// `_construct_tensor_layout_for_opt_shard` (and its `_by_layout` twin for nested maps):
/// the layout with its optimizer shard as an ordinary split.
pub fn expand_opt_shard(tensor: &str, item: &ListedLayout, origin: &[usize]) -> Result<Flat> {
    let dev = &item.dev_matrix;
    let map = &item.tensor_map;
    let (step, size) = (item.opt_shard_step, opt_size(item));
    let nested = map.iter().any(|e| matches!(e, MapEntry::Many(_)));
    let n = dev.len() as i64;
    if nested {
        if step == 0 || size == 0 {
            let (m, s) = expand_layout(tensor, dev, map, origin)?;
            return Ok((dev.clone(), m, s));
        }
        let strategy = tensor_strategy(dev, map);
        let (expanded, _) = expand_layout(tensor, dev, map, origin)?;
        let sharded: Vec<i64> = expanded.iter().filter(|&&v| v != -1).map(|&v| n - v - 1).collect();
        let repeated: Vec<usize> = (0..dev.len()).filter(|&i| !sharded.contains(&(i as i64)) && dev[i] > 1).collect();
        if repeated.is_empty() {
            return Err(refuse(tensor, format!("device matrix {dev:?} has no replicated axis for the optimizer shard")));
        }
        let (d, m, s) = opt_helper(tensor, dev, map, size, origin, &strategy, &repeated)?;
        let (m, s) = expand_layout(tensor, &d, &m, &s)?;
        return Ok((d, m, s));
    }
    let flat: Vec<i64> = map.iter().map(|e| e.values()[0]).collect();
    if step == 0 || size == 0 {
        return Ok((dev.clone(), flat, origin.to_vec()));
    }
    let strategy = tensor_strategy(dev, map);
    let sharded: Vec<i64> = flat.iter().filter(|&&v| v != -1).map(|&v| n - v - 1).collect();
    let repeated: Vec<usize> = (0..dev.len()).filter(|&i| !sharded.contains(&(i as i64)) && dev[i] > 1).collect();
    let Some(&first_rep) = repeated.first() else {
        return Err(refuse(tensor, format!("device matrix {dev:?} has no replicated axis for the optimizer shard")));
    };
    if repeated.len() == 1 && dev[first_rep + 1..].iter().product::<usize>() as i64 != step {
        return Err(refuse(
            tensor,
            format!(
                "the optimizer shard step {step} is not the model-parallel size {} to the right of the replicated axis",
                dev[first_rep + 1..].iter().product::<usize>()
            ),
        ));
    }
    if (repeated.len() < dev.len() && repeated.len() > 1) || first_rep > 0 {
        let (d, m, s) = opt_helper(tensor, dev, map, size, origin, &strategy, &repeated)?;
        return Ok((d, m.iter().map(|e| e.values()[0]).collect(), s));
    }
    // MindSpore's special case: the device matrix is rebuilt in tensor-dimension order.
    let s0 = strategy.first().copied().unwrap_or(1).max(1);
    let mut shape = origin.to_vec();
    let first_rest = shape.first().copied().unwrap_or(1) / s0;
    if let Some(x) = shape.first_mut() {
        *x = s0;
    }
    shape.insert(1.min(shape.len()), first_rest);
    let k = strategy.len() as i64;
    let mut new_map: Vec<i64> = strategy.iter().enumerate().map(|(i, &v)| if v == 1 { -1 } else { k - 1 - i as i64 }).collect();
    new_map.insert(1.min(new_map.len()), k);
    let mut new_dev = strategy.clone();
    new_dev.insert(0, size as usize);
    let repeat = dev.iter().product::<usize>() as i64 / (step * size).max(1);
    if repeat > 1 {
        new_dev.insert(0, repeat as usize);
    }
    Ok((new_dev, new_map, shape))
}

/// `_extract_layout_item`: an optimizer shard size of -1 is the whole replica group.
fn opt_size(item: &ListedLayout) -> i64 {
    if item.opt_shard_size == -1 {
        let mp: usize = tensor_strategy(&item.dev_matrix, &item.tensor_map).iter().product();
        (item.device_num() / mp.max(1)) as i64
    } else {
        item.opt_shard_size
    }
}

/// `_construct_from_to_tensor_layout`: the smaller device count gets a leading replicated axis.
pub fn equalise(tensor: &str, mut from: Flat, mut to: Flat) -> Result<(Flat, Flat)> {
    for (which, l) in [("source", &from), ("destination", &to)] {
        if l.1.len() != l.2.len() {
            return Err(refuse(tensor, format!("the {which} tensor map has {} entries for {} dimensions", l.1.len(), l.2.len())));
        }
    }
    let (a, b): (usize, usize) = (from.0.iter().product(), to.0.iter().product());
    if a.max(b) % a.min(b).max(1) != 0 {
        return Err(refuse(tensor, format!("cannot transform {a} devices to {b}")));
    }
    if a > b {
        to.0.insert(0, a / b);
    } else if a < b {
        from.0.insert(0, b / a);
    }
    Ok((from, to))
}

/// Prefix products from the left: the cut points of a factorisation.
fn cuts(sizes: &[usize]) -> Vec<usize> {
    let mut out = vec![1];
    for &s in sizes {
        out.push(out[out.len() - 1] * s);
    }
    out
}

/// Sorted cut points, if each divides the next (a common refinement exists).
fn chain(set: &BTreeSet<usize>) -> Option<Vec<usize>> {
    let v: Vec<usize> = set.iter().copied().collect();
    v.windows(2).all(|w| w[1] % w[0] == 0).then_some(v)
}

/// A split tensor dimension: device interval `[p, q)` and tensor interval starting at `t` of
/// size `s`, all as cut points (prefix products).
#[derive(Clone, Copy)]
struct Link {
    p: usize,
    q: usize,
    t: usize,
    s: usize,
}

fn links(dev: &[usize], map: &[i64], shape: &[usize]) -> Vec<Link> {
    let keep: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] != 1).collect();
    let shape: Vec<usize> = keep.iter().map(|&i| shape[i]).collect();
    let map: Vec<i64> = keep.iter().map(|&i| map[i]).collect();
    let (tc, dc) = (cuts(&shape), cuts(dev));
    let n = dev.len() as i64;
    map.iter()
        .enumerate()
        .filter(|(_, &v)| v >= 0 && v < n)
        .map(|(i, &v)| {
            let a = (n - 1 - v) as usize;
            Link { p: dc[a], q: dc[a + 1], t: tc[i], s: shape[i] }
        })
        .collect()
}

/// The refined device cut points of a transform, or `None` when MindSpore cannot unify the two
/// layouts (and gathers every split axis instead).
fn unify(from: &Flat, to: &Flat, fl: &[Link], tl: &[Link]) -> Option<Vec<usize>> {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    let mut dcuts: BTreeSet<usize> = cuts(&from.0).into_iter().chain(cuts(&to.0)).collect();
    chain(&dcuts)?;
    let mut tcuts: BTreeSet<usize> = cuts(&squeeze(&from.2)).into_iter().chain(cuts(&squeeze(&to.2))).collect();
    loop {
        let mut changed = false;
        for l in fl.iter().chain(tl) {
            let axis = l.q / l.p;
            for c in dcuts.clone() {
                if l.p < c && c < l.q {
                    if c % l.p != 0 || l.s % (c / l.p) != 0 {
                        return None;
                    }
                    changed |= tcuts.insert(l.t * (c / l.p));
                }
            }
            for t in tcuts.clone() {
                if l.t < t && t < l.t * l.s {
                    if t % l.t != 0 {
                        return None;
                    }
                    let k = t / l.t;
                    if k < axis {
                        if axis % k != 0 {
                            return None;
                        }
                        changed |= dcuts.insert(l.p * k);
                    } else if k % axis != 0 {
                        return None;
                    }
                }
            }
        }
        chain(&dcuts)?;
        chain(&tcuts)?;
        if !changed {
            return chain(&dcuts);
        }
    }
}

/// Ranks that differ from `rank` only along the given axes of device matrix `dev`.
fn span(dev: &[usize], axes: &BTreeSet<usize>, rank: usize) -> BTreeSet<usize> {
    let strides: Vec<usize> = (0..dev.len()).map(|i| dev[i + 1..].iter().product()).collect();
    let mut out = BTreeSet::from([rank]);
    for &a in axes {
        let (st, size) = (strides[a], dev[a]);
        out = out.iter().flat_map(|&x| (0..size).map(move |v| x - (x / st % size) * st + v * st)).collect();
    }
    out
}

/// The ranks (of the equalised device count) whose pieces MindSpore's redistribution from
/// `from` to `to` gathers for `rank`, `rank` included.
pub fn gathered_ranks(from: &Flat, to: &Flat, rank: usize) -> BTreeSet<usize> {
    let fl = links(&from.0, &from.1, &from.2);
    let tl = links(&to.0, &to.1, &to.2);
    let Some(dc) = unify(from, to, &fl, &tl) else {
        let n = from.0.len() as i64;
        let axes = from.1.iter().filter(|&&v| v >= 0 && v < n).map(|&v| (n - 1 - v) as usize).collect();
        return span(&from.0, &axes, rank);
    };
    let dev: Vec<usize> = dc.windows(2).map(|w| w[1] / w[0]).collect();
    // where each layout puts each refined axis: the start of the refined tensor dimension it splits
    let place = |ls: &[Link], u: usize| {
        let (c0, c1) = (dc[u], dc[u + 1]);
        ls.iter().find(|l| l.p <= c0 && c1 <= l.q).map(|l| l.t * (c0 / l.p))
    };
    let gathered: BTreeSet<usize> =
        (0..dev.len()).filter(|&u| dev[u] > 1).filter(|&u| place(&fl, u).is_some_and(|t| place(&tl, u) != Some(t))).collect();
    span(&dev, &gathered, rank)
}

/// The source ranks (local to a stage) one parameter needs for destination `local`.
fn param_ranks(src: &ListedLayout, dst: Option<&ListedLayout>, local: usize) -> Result<BTreeSet<usize>> {
    let name = src.name.as_str();
    let unsplit;
    let dst = match dst {
        Some(d) => d,
        None => {
            unsplit = ListedLayout {
                name: src.name.clone(),
                dev_matrix: vec![1],
                tensor_map: vec![MapEntry::One(-1); src.tensor_map.len()],
                opt_shard_step: 0,
                opt_shard_size: 0,
                stages: vec![0],
            };
            &unsplit
        }
    };
    for (which, l) in [("source", src), ("destination", dst)] {
        if l.dev_matrix.is_empty() || l.dev_matrix.contains(&0) {
            return Err(refuse(name, format!("the {which} device matrix {:?} has an empty axis", l.dev_matrix)));
        }
        if l.opt_shard_size < -1 || l.opt_shard_step < 0 {
            return Err(refuse(
                name,
                format!("the {which} optimizer shard (step {}, size {}) is not a MindSpore value", l.opt_shard_step, l.opt_shard_size),
            ));
        }
        let n = l.dev_matrix.len() as i64;
        if let Some(v) = l.tensor_map.iter().flat_map(|e| e.values()).find(|&&v| v < -1 || v >= n) {
            return Err(refuse(name, format!("{which} tensor-map value {v} is not an axis of device matrix {:?}", l.dev_matrix)));
        }
    }
    let (from_n, to_n) = (src.device_num().max(1), dst.device_num().max(1));
    let strategy = tensor_strategy(&src.dev_matrix, &src.tensor_map);
    let from_opt = opt_size(src);
    let origin: Vec<usize> = strategy
        .iter()
        .enumerate()
        .map(|(i, &s)| from_n.max(to_n) * s * if i == 0 && from_opt > 0 { from_opt as usize } else { 1 })
        .collect();
    let from = expand_opt_shard(name, src, &origin)?;
    let to = expand_opt_shard(name, dst, &origin)?;
    let (from, to) = equalise(name, from, to)?;
    Ok(gathered_ranks(&from, &to, local).into_iter().map(|r| r % from_n).collect())
}

/// MindSpore's `_rank_list_for_transform_parallel_checkpoint`: the source ranks, local to a
/// pipeline stage, that destination rank `local` of its stage needs, over the parameters both
/// lists hold (all of `src` when `dst` is `None`, one unsplit device).
pub fn stage_rank_list(local: usize, src: &[ListedLayout], dst: Option<&[ListedLayout]>) -> Result<BTreeSet<usize>> {
    let mut needed = BTreeSet::new();
    for p in src {
        let d = match dst {
            Some(dl) => match dl.iter().find(|d| d.name == p.name) {
                Some(d) => Some(d),
                None => continue,
            },
            None => None,
        };
        needed.extend(param_ranks(p, d, local)?);
    }
    Ok(needed)
}

/// MindSpore's `rank_list_for_transform(rank, src, dst)`: the global source ranks whose files
/// destination `rank` needs, highest first. `None` is one unsplit device.
pub fn mindspore_rank_list(rank: usize, src: Option<&StrategyFile>, dst: Option<&StrategyFile>) -> Result<Vec<usize>> {
    let Some(src) = src else { return Ok(vec![0]) };
    let mut src_list = convert_to_list(src, None);
    let mut dst_list = dst.map(|d| convert_to_list(d, Some(rank)));
    if let Some(dl) = dst_list.as_mut() {
        let Some(first) = dl.first() else { return Err(CheckpointError::RankListEmpty { which: "destination" }) };
        let stage = (rank / first.device_num().max(1)) as u32;
        let gone: Vec<String> = dl.iter().filter(|p| !p.stages.contains(&stage)).map(|p| p.name.clone()).collect();
        dl.retain(|p| p.stages.contains(&stage));
        src_list.retain(|p| !gone.contains(&p.name));
    }
    let Some(first) = src_list.first() else { return Err(CheckpointError::RankListEmpty { which: "source" }) };
    let src_stage_devs = first.device_num().max(1);
    let dst_stage_devs = match &dst_list {
        Some(dl) => dl.first().map(ListedLayout::device_num).ok_or(CheckpointError::RankListEmpty { which: "destination" })?,
        None => 1,
    };
    let local = if dst_stage_devs > 1 { rank % dst_stage_devs } else { rank };
    let needed = stage_rank_list(local, &src_list, dst_list.as_deref())?;
    let mut out: BTreeSet<usize> = BTreeSet::new();
    let mut seen: Vec<u32> = Vec::new();
    for p in &src_list {
        for &s in &p.stages {
            if !seen.contains(&s) {
                seen.push(s);
                out.extend(needed.iter().map(|&k| s as usize * src_stage_devs + k));
            }
        }
    }
    Ok(out.into_iter().rev().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(dev: &[usize], map: &[i64], step: i64, size: i64) -> ListedLayout {
        ListedLayout {
            name: "w".into(),
            dev_matrix: dev.to_vec(),
            tensor_map: map.iter().map(|&v| MapEntry::One(v)).collect(),
            opt_shard_step: step,
            opt_shard_size: size,
            stages: vec![0],
        }
    }

    #[test]
    fn optimizer_shards_expand_as_mindspore_documents() {
        // the two examples of the reference's section 4.3
        assert_eq!(
            expand_opt_shard("w", &item(&[2, 4], &[-1, 0], 4, 2), &[64, 128]).unwrap(),
            (vec![2, 1, 4], vec![-1, 2, 0], vec![1, 64, 128])
        );
        assert_eq!(
            expand_opt_shard("w", &item(&[2, 4], &[-1, -1], 1, 8), &[32, 16]).unwrap(),
            (vec![8, 1, 1], vec![-1, 2, -1], vec![1, 32, 16])
        );
    }

    #[test]
    fn a_gather_spans_the_axes_the_destination_does_not_keep() {
        // [2,4] split (rows on 2, columns on 4) -> rows on 2 only: the column axis is gathered
        let from = (vec![2, 4], vec![1, 0], vec![64, 128]);
        let to = (vec![2, 4], vec![1, -1], vec![64, 128]);
        assert_eq!(gathered_ranks(&from, &to, 5), BTreeSet::from([4, 5, 6, 7]));
        // devices [2,3] and [3,2] do not refine to a common matrix: every split axis is gathered
        let from = (vec![2, 3], vec![1, -1], vec![6, 6]);
        let to = (vec![3, 2], vec![1, -1], vec![6, 6]);
        assert_eq!(gathered_ranks(&from, &to, 0), BTreeSet::from([0, 3]));
    }
}
