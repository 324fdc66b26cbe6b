//! A reference executor for redistribution plans: every rank's local data as a dense
//! row-major [`Block`], every step applied to all ranks at once from the values before the step.
//! Tests use it to check plans; the checkpoint transform reuses `Block` slicing and `scatter`.

use std::ops::Range;

use crate::error::{LayoutError, Result};
use crate::layout::TensorLayout;
use crate::mesh::group_of;
use crate::redistribution::{RedistributionPlan, Step};

/// An element type the simulator can move and (for partial sums) add.
pub trait Element: Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// `self + other` (wrapping for integers).
    fn add(self, other: Self) -> Self;
}

macro_rules! float_element {
    ($($t:ty),*) => {$(impl Element for $t { fn add(self, other: Self) -> Self { self + other } })*};
}
macro_rules! int_element {
    ($($t:ty),*) => {$(impl Element for $t { fn add(self, other: Self) -> Self { self.wrapping_add(other) } })*};
}
float_element!(f32, f64, half::f16, half::bf16);
int_element!(i8, i16, i32, i64, u8, u16, u32, u64);

/// A dense row-major n-dimensional array.
#[derive(Clone, Debug, PartialEq)]
pub struct Block<T> {
    shape: Vec<usize>,
    data: Vec<T>,
}

impl<T: Element> Block<T> {
    /// A block of `shape` holding `data` row-major; errors unless `data` has exactly the shape's element count.
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(LayoutError::Simulation { what: format!("shape {shape:?} needs {n} elements, got {}", data.len()) });
        }
        Ok(Self { shape, data })
    }

    /// A block of `shape` filled with `T::default()` (zero).
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Self { shape, data: vec![T::default(); n] }
    }

    /// A block whose element at flat index `i` is `f(i)`.
    pub fn from_fn(shape: Vec<usize>, f: impl FnMut(usize) -> T) -> Self {
        let n = shape.iter().product();
        Self { shape, data: (0..n).map(f).collect() }
    }

    /// The block's shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// The elements, row-major, for changing them.
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// The elements, row-major, consuming the block.
    pub fn into_data(self) -> Vec<T> {
        self.data
    }

    /// The sub-block `[start, end)` per dimension.
    pub fn slice(&self, ranges: &[Range<usize>]) -> Result<Block<T>> {
        if ranges.len() != self.shape.len() || ranges.iter().zip(&self.shape).any(|(r, &s)| r.start > r.end || r.end > s) {
            return Err(LayoutError::Simulation { what: format!("slice {ranges:?} out of bounds of shape {:?}", self.shape) });
        }
        let out_shape: Vec<usize> = ranges.iter().map(|r| r.end - r.start).collect();
        let mut out = Vec::with_capacity(out_shape.iter().product());
        copy_region(&self.data, &self.shape, ranges, &mut out);
        Ok(Block { shape: out_shape, data: out })
    }

    /// Piece `idx` of `parts` equal pieces along `dim`.
    pub fn chunk(&self, dim: usize, parts: usize, idx: usize) -> Result<Block<T>> {
        if dim >= self.shape.len() || parts == 0 || !self.shape[dim].is_multiple_of(parts) || idx >= parts {
            return Err(LayoutError::Simulation {
                what: format!("cannot take piece {idx} of {parts} along dim {dim} of shape {:?}", self.shape),
            });
        }
        let size = self.shape[dim] / parts;
        let ranges: Vec<Range<usize>> =
            self.shape.iter().enumerate().map(|(d, &s)| if d == dim { idx * size..(idx + 1) * size } else { 0..s }).collect();
        self.slice(&ranges)
    }

    /// Concatenate blocks along `dim` (all other dimensions equal).
    pub fn concat(blocks: &[Block<T>], dim: usize) -> Result<Block<T>> {
        let first = blocks.first().ok_or_else(|| LayoutError::Simulation { what: "concat of no blocks".into() })?;
        let nd = first.shape.len();
        if dim >= nd || blocks.iter().any(|b| b.shape.len() != nd || (0..nd).any(|d| d != dim && b.shape[d] != first.shape[d])) {
            return Err(LayoutError::Simulation { what: format!("cannot concat blocks along dim {dim}") });
        }
        let mut shape = first.shape.clone();
        shape[dim] = blocks.iter().map(|b| b.shape[dim]).sum();
        let outer: usize = first.shape[..dim].iter().product();
        let inner: usize = first.shape[dim + 1..].iter().product();
        let mut data = Vec::with_capacity(shape.iter().product());
        for o in 0..outer {
            for b in blocks {
                let run = b.shape[dim] * inner;
                data.extend_from_slice(&b.data[o * run..(o + 1) * run]);
            }
        }
        Ok(Block { shape, data })
    }

    /// Copy `piece` into the sub-block `region` (`[start, end)` per dimension, the piece's shape).
    pub fn write(&mut self, region: &[Range<usize>], piece: &Block<T>) -> Result<()> {
        let full = self;
        if region.len() != full.shape.len()
            || region.iter().zip(&full.shape).any(|(r, &s)| r.end > s)
            || region.iter().map(|r| r.end - r.start).ne(piece.shape.iter().copied())
        {
            return Err(LayoutError::Simulation {
                what: format!("cannot write a {:?} piece at {region:?} of shape {:?}", piece.shape, full.shape),
            });
        }
        let shape = full.shape.clone();
        let nd = shape.len();
        let mut strides = vec![1usize; nd];
        for d in (0..nd.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let n: usize = piece.data.len();
        let pshape = piece.shape.clone();
        for (flat, &v) in piece.data.iter().enumerate().take(n) {
            let mut rem = flat;
            let mut off = 0;
            for d in (0..nd).rev() {
                let i = rem % pshape[d];
                rem /= pshape[d];
                off += (region[d].start + i) * strides[d];
            }
            full.data[off] = v;
        }
        Ok(())
    }

    /// Element-wise sum (same shapes).
    pub fn add(&self, other: &Block<T>) -> Result<Block<T>> {
        if self.shape != other.shape {
            return Err(LayoutError::Simulation { what: format!("cannot add shapes {:?} and {:?}", self.shape, other.shape) });
        }
        Ok(Block { shape: self.shape.clone(), data: self.data.iter().zip(&other.data).map(|(a, b)| a.add(*b)).collect() })
    }
}

/// Append the elements of `region` of a row-major array to `out`, copying contiguous runs.
pub fn copy_region<T: Copy>(data: &[T], shape: &[usize], region: &[Range<usize>], out: &mut Vec<T>) {
    let nd = shape.len();
    if nd == 0 {
        out.extend_from_slice(&data[..1.min(data.len())]);
        return;
    }
    if region.iter().any(|r| r.is_empty()) {
        return;
    }
    let mut strides = vec![1usize; nd];
    for d in (0..nd - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    // Merge trailing full dimensions into one contiguous run.
    let mut last = nd - 1;
    while last > 0 && region[last].start == 0 && region[last].end == shape[last] {
        last -= 1;
    }
    let run = (region[last].end - region[last].start) * strides[last];
    let mut idx: Vec<usize> = region[..last].iter().map(|r| r.start).collect();
    loop {
        let off: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>() + region[last].start * strides[last];
        out.extend_from_slice(&data[off..off + run]);
        // advance the multi-index over dims 0..last
        let mut d = last;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < region[d].end {
                break;
            }
            idx[d] = region[d].start;
        }
    }
}

/// Every rank's local data of `full` under `layout`. For a partial layout, the ranks at
/// coordinate 0 of every partial axis hold the values and the others zeros (the sum is right).
pub fn scatter<T: Element>(full: &Block<T>, layout: &TensorLayout) -> Result<Vec<Block<T>>> {
    if full.shape() != layout.shape() {
        return Err(LayoutError::Simulation {
            what: format!("tensor shape {:?} differs from layout shape {:?}", full.shape(), layout.shape()),
        });
    }
    let partial = layout.axis_descs(layout.partial_axes());
    (0..layout.mesh().num_devices())
        .map(|r| {
            if partial.iter().any(|a| a.coord(r) != 0) {
                Ok(Block::zeros(layout.slice_shape()))
            } else {
                full.slice(&layout.slice_of_unchecked(r))
            }
        })
        .collect()
}

/// Rebuild the full tensor from every rank's local data under `layout` (summing partial sums
/// and checking that replicas agree).
pub fn assemble<T: Element>(locals: &[Block<T>], layout: &TensorLayout) -> Result<Block<T>> {
    let n = layout.mesh().num_devices();
    if locals.len() != n {
        return Err(LayoutError::Simulation { what: format!("expected {n} local blocks, got {}", locals.len()) });
    }
    let mut full = Block::zeros(layout.shape().to_vec());
    let partial = layout.axis_descs(layout.partial_axes());
    for owner in layout.slice_owners() {
        let mut sum = Block::zeros(layout.slice_shape());
        for m in group_of(owner, &partial) {
            sum = sum.add(&locals[m])?;
        }
        full.write(&layout.slice_of_unchecked(owner), &sum)?;
    }
    Ok(full)
}

/// Apply `plan` to every rank's local data (`inputs[r]` has the source slice shape) and return
/// every rank's result.
pub fn simulate<T: Element>(plan: &RedistributionPlan, inputs: Vec<Block<T>>) -> Result<Vec<Block<T>>> {
    let n = plan.src.mesh().num_devices();
    if inputs.len() != n {
        return Err(LayoutError::Simulation { what: format!("plan spans {n} ranks, got {} inputs", inputs.len()) });
    }
    let want = plan.src.slice_shape();
    if let Some((r, b)) = inputs.iter().enumerate().find(|(_, b)| b.shape() != want.as_slice()) {
        return Err(LayoutError::Simulation { what: format!("rank {r} input has shape {:?}, source slices are {want:?}", b.shape()) });
    }
    let mut cur = inputs;
    for ps in &plan.steps {
        cur = apply(&ps.step, &cur)?;
    }
    Ok(cur)
}

fn apply<T: Element>(step: &Step, cur: &[Block<T>]) -> Result<Vec<Block<T>>> {
    let n = cur.len();
    (0..n)
        .map(|r| match step {
            Step::Slice { dim, axis } => cur[r].chunk(*dim, axis.size, axis.coord(r)),
            Step::AllGather { dim, axis } => {
                let parts: Vec<Block<T>> = axis.group(r).into_iter().map(|m| cur[m].clone()).collect();
                Block::concat(&parts, *dim)
            }
            Step::AllToAll { split_dim, concat_dim, axis } => {
                let k = axis.coord(r);
                let parts = axis.group(r).into_iter().map(|m| cur[m].chunk(*split_dim, axis.size, k)).collect::<Result<Vec<_>>>()?;
                Block::concat(&parts, *concat_dim)
            }
            Step::AllReduce { axes } => sum_over(cur, &group_of(r, axes)),
            Step::ReduceScatter { dim, axis } => {
                let k = axis.coord(r);
                let mut sum: Option<Block<T>> = None;
                for m in axis.group(r) {
                    let piece = cur[m].chunk(*dim, axis.size, k)?;
                    sum = Some(match sum {
                        None => piece,
                        Some(s) => s.add(&piece)?,
                    });
                }
                sum.ok_or_else(|| LayoutError::Simulation { what: "empty group".into() })
            }
            Step::MakePartial { axis } => Ok(if axis.coord(r) == 0 { cur[r].clone() } else { Block::zeros(cur[r].shape().to_vec()) }),
            Step::Permute { source } => Ok(cur[source[r]].clone()),
        })
        .collect()
}

fn sum_over<T: Element>(cur: &[Block<T>], group: &[usize]) -> Result<Block<T>> {
    let mut sorted = group.to_vec();
    sorted.sort_unstable();
    let mut sum = cur[sorted[0]].clone();
    for &m in &sorted[1..] {
        sum = sum.add(&cur[m])?;
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_and_concat_are_inverse() {
        let b = Block::<i64>::from_fn(vec![4, 6], |i| i as i64);
        let parts: Vec<_> = (0..3).map(|k| b.chunk(1, 3, k).unwrap()).collect();
        assert_eq!(parts[1].data(), &[2, 3, 8, 9, 14, 15, 20, 21]);
        assert_eq!(Block::concat(&parts, 1).unwrap(), b);
        let s = b.slice(&[1..3, 2..5]).unwrap();
        assert_eq!(s.data(), &[8, 9, 10, 14, 15, 16]);
    }
}
