//! `TensorLayout`: how one tensor is spread over a device matrix.
//!
//! Per tensor dimension, the list of device axes that split it (counted from the left, the
//! first axis most significant; empty = not split), the full shape, and the device axes along
//! which every rank holds a pending partial sum. Axes used by neither are replica axes.

use std::fmt;
use std::ops::Range;

use crate::error::{LayoutError, Result};
use crate::mesh::{group_of, DeviceAxis, DeviceMatrix};
use crate::mindspore::{ParameterLayout, TensorMap};

/// A tensor's full shape, its device matrix, the axes splitting each dimension and its
/// partial-sum axes. Always valid: constructors check every invariant.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    mesh: DeviceMatrix,
    map: Vec<Vec<usize>>,
    shape: Vec<usize>,
    partial: Vec<usize>,
}

impl TensorLayout {
    /// A layout from per-dimension device axes (counted from the left, most significant first).
    pub fn new(mesh: DeviceMatrix, map: Vec<Vec<usize>>, shape: Vec<usize>) -> Result<Self> {
        let layout = Self { mesh, map, shape, partial: Vec::new() };
        layout.validate()?;
        Ok(layout)
    }

    /// A layout in MindSpore's words: device matrix, right-counted tensor map, full shape.
    pub fn from_mindspore(dev_matrix: &[usize], tensor_map: &TensorMap, shape: &[usize]) -> Result<Self> {
        let mesh = DeviceMatrix::new(dev_matrix.to_vec())?;
        let map = tensor_map.to_axes(&mesh, shape)?;
        Self::new(mesh, map, shape.to_vec())
    }

    /// The layout a MindSpore `parameter_layout_dict` entry describes (device matrix, tensor
    /// map, full shape). A flattened multi-axis map (longer than the shape) cannot be regrouped
    /// without the strategy file and is an error.
    pub fn of_parameter(p: &ParameterLayout) -> Result<Self> {
        Self::from_mindspore(&p.dev_matrix, &TensorMap::single(&p.tensor_map), &p.full_shape)
    }

    /// The fully replicated layout of `shape` on `mesh`.
    pub fn replicated(mesh: DeviceMatrix, shape: Vec<usize>) -> Self {
        let map = vec![Vec::new(); shape.len()];
        Self { mesh, map, shape, partial: Vec::new() }
    }

    /// The same layout with the tensor a pending partial sum along `axes` (counted from the left).
    pub fn with_partial(mut self, axes: Vec<usize>) -> Result<Self> {
        let mut axes = axes;
        axes.sort_unstable();
        axes.dedup();
        self.partial = axes;
        self.validate()?;
        Ok(self)
    }

    fn validate(&self) -> Result<()> {
        let ndim = self.mesh.ndim();
        if self.map.len() != self.shape.len() {
            return Err(LayoutError::ShapeMapLengthMismatch {
                shape: self.shape.clone(),
                shape_len: self.shape.len(),
                map: TensorMap::from_axes(self.mesh.ndim(), &self.map).to_string(),
                map_len: self.map.len(),
            });
        }
        let mut owner: Vec<Option<usize>> = vec![None; ndim];
        for (dim, axes) in self.map.iter().enumerate() {
            for &axis in axes {
                if axis >= ndim {
                    return Err(LayoutError::TensorMapOutOfRange {
                        dim,
                        value: ndim as i64 - 1 - axis as i64,
                        dims: self.mesh.dims().to_vec(),
                    });
                }
                if let Some(first) = owner[axis] {
                    return Err(LayoutError::AxisUsedTwice { axis, value: (ndim - 1 - axis) as i64, first, second: dim });
                }
                owner[axis] = Some(dim);
            }
        }
        for &axis in &self.partial {
            if axis >= ndim {
                return Err(LayoutError::PartialAxisOutOfRange { axis, dims: self.mesh.dims().to_vec() });
            }
            if let Some(dim) = owner[axis] {
                return Err(LayoutError::PartialAxisAlsoSplits { axis, dim });
            }
        }
        for (dim, &size) in self.shape.iter().enumerate() {
            let split = self.split(dim);
            if size % split != 0 {
                return Err(LayoutError::NotDivisible { dim, size, split, shape: self.shape.clone() });
            }
        }
        Ok(())
    }

    /// The device matrix the tensor is laid out on.
    pub fn mesh(&self) -> &DeviceMatrix {
        &self.mesh
    }

    /// Device axes (from the left) splitting each tensor dimension, most significant first.
    pub fn dim_axes(&self) -> &[Vec<usize>] {
        &self.map
    }

    /// The tensor map in MindSpore's right-counted form.
    pub fn tensor_map(&self) -> TensorMap {
        TensorMap::from_axes(self.mesh.ndim(), &self.map)
    }

    /// Full (global) shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Axes along which the tensor is a pending partial sum.
    pub fn partial_axes(&self) -> &[usize] {
        &self.partial
    }

    /// Whether the tensor is a pending partial sum along any device axis.
    pub fn is_partial(&self) -> bool {
        !self.partial.is_empty()
    }

    /// Number of pieces dimension `dim` is split into.
    pub fn split(&self, dim: usize) -> usize {
        self.map[dim].iter().map(|&a| self.mesh.dims()[a]).product()
    }

    /// Split count of every dimension.
    pub fn splits(&self) -> Vec<usize> {
        (0..self.shape.len()).map(|d| self.split(d)).collect()
    }

    /// Shape of every rank's local piece.
    pub fn slice_shape(&self) -> Vec<usize> {
        self.shape.iter().enumerate().map(|(d, &s)| s / self.split(d)).collect()
    }

    /// Elements in one rank's local piece.
    pub fn slice_len(&self) -> usize {
        self.slice_shape().iter().product()
    }

    /// Number of distinct slices (product of the split counts).
    pub fn num_slices(&self) -> usize {
        self.splits().iter().product()
    }

    /// Axes used by neither the tensor map nor the partial sums: ranks differing only along
    /// these hold identical data.
    pub fn replica_axes(&self) -> Vec<usize> {
        (0..self.mesh.ndim()).filter(|a| !self.map.iter().any(|m| m.contains(a)) && !self.partial.contains(a)).collect()
    }

    /// Axes the tensor map uses, in mesh order.
    pub fn split_axes(&self) -> Vec<usize> {
        (0..self.mesh.ndim()).filter(|a| self.map.iter().any(|m| m.contains(a))).collect()
    }

    fn dim_index_unchecked(&self, rank: usize, dim: usize) -> usize {
        self.map[dim].iter().fold(0, |idx, &a| {
            let ax = self.mesh.axis(a);
            idx * ax.size + ax.coord(rank)
        })
    }

    /// The piece of dimension `dim` that `rank` holds (0..split).
    pub fn dim_index(&self, rank: usize, dim: usize) -> Result<usize> {
        self.check_rank(rank)?;
        Ok(self.dim_index_unchecked(rank, dim))
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        let devices = self.mesh.num_devices();
        if rank >= devices {
            return Err(LayoutError::RankOutOfRange { rank, devices });
        }
        Ok(())
    }

    /// `[start, end)` per dimension of the piece that `rank` holds.
    pub fn slice_of(&self, rank: usize) -> Result<Vec<Range<usize>>> {
        self.check_rank(rank)?;
        Ok(self.slice_of_unchecked(rank))
    }

    pub(crate) fn slice_of_unchecked(&self, rank: usize) -> Vec<Range<usize>> {
        (0..self.shape.len())
            .map(|d| {
                let size = self.shape[d] / self.split(d);
                let idx = self.dim_index_unchecked(rank, d);
                idx * size..(idx + 1) * size
            })
            .collect()
    }

    /// Linear slice id of `rank`: row-major over the per-dimension split counts, first
    /// dimension outermost (MindSpore's `_get_tensor_slice_index`).
    pub fn slice_index(&self, rank: usize) -> Result<usize> {
        self.check_rank(rank)?;
        Ok(self.slice_index_unchecked(rank))
    }

    pub(crate) fn slice_index_unchecked(&self, rank: usize) -> usize {
        (0..self.shape.len()).fold(0, |acc, d| acc * self.split(d) + self.dim_index_unchecked(rank, d))
    }

    /// Ranks holding exactly the same data as `rank` (same slice, no partial sum in between),
    /// ascending. These are the ranks a parameter's gradient is all-reduced over (its mirror
    /// group).
    pub fn replica_group(&self, rank: usize) -> Result<Vec<usize>> {
        self.mesh.group_along(rank, &self.replica_axes())
    }

    /// Ranks whose values sum to the true value of `rank`'s slice, ascending.
    pub fn partial_group(&self, rank: usize) -> Result<Vec<usize>> {
        self.mesh.group_along(rank, &self.partial)
    }

    pub(crate) fn axis_descs(&self, axes: &[usize]) -> Vec<DeviceAxis> {
        axes.iter().map(|&a| self.mesh.axis(a)).collect()
    }

    /// One representative rank per distinct slice, by slice index.
    pub fn slice_owners(&self) -> Vec<usize> {
        let split_axes = self.split_axes();
        let descs = self.axis_descs(&split_axes);
        let mut owners = vec![usize::MAX; self.num_slices()];
        for r in group_of(0, &descs) {
            let idx = (0..self.shape.len()).fold(0, |acc, d| acc * self.split(d) + self.dim_index_unchecked(r, d));
            owners[idx] = r;
        }
        owners
    }
}

/// `S(0)R`: per device axis (from the left), `S(d)` if it splits dimension `d`, `P` if it is a
/// partial-sum axis, `R` otherwise.
impl fmt::Display for TensorLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for a in 0..self.mesh.ndim() {
            if let Some(d) = self.map.iter().position(|m| m.contains(&a)) {
                write!(f, "S({d})")?;
            } else if self.partial.contains(&a) {
                write!(f, "P")?;
            } else {
                write!(f, "R")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for TensorLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorLayout")
            .field("dev_matrix", &self.mesh.dims())
            .field("tensor_map", &format_args!("{}", self.tensor_map()))
            .field("shape", &self.shape)
            .field("partial_axes", &self.partial)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(dev: &[usize], map: &str, shape: &[usize]) -> Result<TensorLayout> {
        TensorLayout::from_mindspore(dev, &map.parse().unwrap(), shape)
    }

    #[test]
    fn worked_example_of_the_reference() {
        // dev [2,4], tmap [-1,0], full [64,128]: rank 5 = (1,1) holds columns [32,64).
        let l = ms(&[2, 4], "-1,0", &[64, 128]).unwrap();
        assert_eq!(l.slice_shape(), vec![64, 32]);
        assert_eq!(l.slice_of(5).unwrap(), vec![0..64, 32..64]);
        assert_eq!(l.replica_group(5).unwrap(), vec![1, 5]);
        assert_eq!(l.slice_index(5).unwrap(), 1);
        assert_eq!(l.to_string(), "RS(1)");
    }

    #[test]
    fn multi_axis_entry_puts_the_first_axis_most_significant() {
        // dev [2,2,2], dim 1 split over (mp=1, sp=0) -> axes 1 then 2 from the left.
        let l = ms(&[2, 2, 2], "-1,(1,0)", &[64, 128]).unwrap();
        assert_eq!(l.slice_shape(), vec![64, 32]);
        // rank 1 = (0,0,1): idx = 0*2 + 1 = 1; rank 2 = (0,1,0): idx = 1*2+0 = 2
        assert_eq!(l.slice_of(1).unwrap()[1], 32..64);
        assert_eq!(l.slice_of(2).unwrap()[1], 64..96);
        assert_eq!(l.replica_group(2).unwrap(), vec![2, 6]);
    }

    #[test]
    fn errors_name_the_offending_value() {
        assert!(matches!(ms(&[2, 4], "-1,2", &[64, 128]), Err(LayoutError::TensorMapOutOfRange { dim: 1, value: 2, .. })));
        assert!(matches!(ms(&[2, 4], "0,0", &[64, 128]), Err(LayoutError::AxisUsedTwice { value: 0, first: 0, second: 1, .. })));
        assert!(matches!(ms(&[2, 4], "-1,0", &[64, 6]), Err(LayoutError::NotDivisible { dim: 1, size: 6, split: 4, .. })));
        assert!(matches!(ms(&[2, 4], "-1,0", &[64, 128, 3]), Err(LayoutError::ShapeMapLengthMismatch { shape_len: 3, map_len: 2, .. })));
        assert!(matches!(ms(&[64, 128], "-1,0", &[64, 128]), Err(LayoutError::TooManyDevices { .. })));
        let l = ms(&[2, 4], "-1,0", &[64, 128]).unwrap();
        assert!(matches!(l.clone().with_partial(vec![1]), Err(LayoutError::PartialAxisAlsoSplits { axis: 1, dim: 1 })));
        assert!(matches!(l.slice_of(8), Err(LayoutError::RankOutOfRange { rank: 8, devices: 8 })));
        let msg = ms(&[2, 4], "-1,5", &[64, 128]).unwrap_err().to_string();
        assert!(msg.contains("value 5") && msg.contains("[2, 4]"), "{msg}");
    }

    #[test]
    fn partial_layout_displays_p_and_has_partial_groups() {
        let l = ms(&[2, 4], "1,-1", &[8, 8]).unwrap().with_partial(vec![1]).unwrap();
        assert_eq!(l.to_string(), "S(0)P");
        assert_eq!(l.partial_group(5).unwrap(), vec![4, 5, 6, 7]);
        assert_eq!(l.replica_group(5).unwrap(), vec![5]);
    }
}
