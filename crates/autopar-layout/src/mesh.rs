//! `DeviceMatrix`: the multi-dimensional arrangement of a stage's ranks.
//!
//! Ranks are numbered row-major, the last axis fastest (MindSpore's `_rank_to_coordinate`).
//! Inside autopar an axis is named by its position from the **left** (`0` = first element of
//! the dims list); MindSpore's right-counted tensor-map values are converted in [`crate::mindspore`].

use std::fmt;

use crate::error::{LayoutError, Result, MAX_DEVICES};

/// Axis sizes of the device mesh; the product is the number of devices (1..=4096).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DeviceMatrix {
    dims: Vec<usize>,
}

impl DeviceMatrix {
    /// A device matrix with the given axis sizes. Every size is at least 1 and the product
    /// is at most [`MAX_DEVICES`].
    pub fn new(dims: impl Into<Vec<usize>>) -> Result<Self> {
        let dims = dims.into();
        if dims.is_empty() {
            return Err(LayoutError::ZeroAxis { dims, axis: 0 });
        }
        if let Some(axis) = dims.iter().position(|&d| d == 0) {
            return Err(LayoutError::ZeroAxis { dims, axis });
        }
        let mut count: usize = 1;
        for &d in &dims {
            count = count.saturating_mul(d);
        }
        if count > MAX_DEVICES {
            return Err(LayoutError::TooManyDevices { dims, count, max: MAX_DEVICES });
        }
        Ok(Self { dims })
    }

    /// One axis holding `n` devices.
    pub fn flat(n: usize) -> Result<Self> {
        if n == 0 || n > MAX_DEVICES {
            return Err(LayoutError::DeviceCountOutOfRange { count: n, max: MAX_DEVICES });
        }
        Self::new(vec![n])
    }

    /// The device matrix of a strategy's splits on `n` devices: one axis per split above 1, in
    /// order, then the repeated-calculation axis of `n / product` devices (on the right, as
    /// MindSpore places it) when the splits use fewer than `n`. Returns the matrix and the axis
    /// of each split (`None` for a split of 1). The product must divide `n`.
    pub fn of_splits(splits: &[usize], n: usize) -> Result<(Self, Vec<Option<usize>>)> {
        let product = splits.iter().try_fold(1usize, |acc, &s| acc.checked_mul(s)).unwrap_or(usize::MAX);
        if product == 0 || !n.is_multiple_of(product) {
            return Err(LayoutError::StrategyNotDividing { strategy: format!("{splits:?}"), product, devices: n });
        }
        let mut dims = Vec::new();
        let mut axis_of = vec![None; splits.len()];
        for (l, &s) in splits.iter().enumerate() {
            if s > 1 {
                axis_of[l] = Some(dims.len());
                dims.push(s);
            }
        }
        if n / product > 1 {
            dims.push(n / product);
        }
        if dims.is_empty() {
            dims.push(1);
        }
        Ok((Self::new(dims)?, axis_of))
    }

    /// Used by the planner for refined meshes, which may have no axis at all (one device).
    pub(crate) fn new_unchecked(dims: Vec<usize>) -> Self {
        Self { dims }
    }

    /// The axis sizes, from the left (MindSpore's `device_matrix`).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of axes.
    pub fn ndim(&self) -> usize {
        self.dims.len()
    }

    /// Number of devices (product of the axis sizes).
    pub fn num_devices(&self) -> usize {
        self.dims.iter().product()
    }

    /// The axis descriptor (size and rank stride) of axis `axis` (counted from the left).
    pub fn axis(&self, axis: usize) -> DeviceAxis {
        let stride = self.dims[axis + 1..].iter().product();
        DeviceAxis { size: self.dims[axis], stride }
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        let devices = self.num_devices();
        if rank >= devices {
            return Err(LayoutError::RankOutOfRange { rank, devices });
        }
        Ok(())
    }

    /// Coordinate of `rank` (row-major, last axis fastest).
    pub fn coordinate(&self, rank: usize) -> Result<Vec<usize>> {
        self.check_rank(rank)?;
        Ok(self.coordinate_unchecked(rank))
    }

    pub(crate) fn coordinate_unchecked(&self, mut rank: usize) -> Vec<usize> {
        let mut coord = vec![0; self.dims.len()];
        for i in (0..self.dims.len()).rev() {
            coord[i] = rank % self.dims[i];
            rank /= self.dims[i];
        }
        coord
    }

    /// Rank at `coord`.
    pub fn rank_of(&self, coord: &[usize]) -> Result<usize> {
        if coord.len() != self.dims.len() || coord.iter().zip(&self.dims).any(|(c, d)| c >= d) {
            return Err(LayoutError::CoordinateOutOfRange { coord: coord.to_vec(), dims: self.dims.clone() });
        }
        Ok(coord.iter().zip(&self.dims).fold(0, |r, (c, d)| r * d + c))
    }

    /// The ranks that differ from `rank` only along `axes` (counted from the left), in
    /// ascending order. `rank` itself is included. With no axes: just `[rank]`.
    ///
    /// MindSpore builds its communication groups this way: the data-parallel (mirror) group of a
    /// parameter is the group along the axes its tensor map leaves unused, the model-parallel
    /// group of an operator the group along the axes it splits.
    pub fn group_along(&self, rank: usize, axes: &[usize]) -> Result<Vec<usize>> {
        self.check_rank(rank)?;
        if let Some(&axis) = axes.iter().find(|&&a| a >= self.dims.len()) {
            return Err(LayoutError::PartialAxisOutOfRange { axis, dims: self.dims.clone() });
        }
        let descs: Vec<DeviceAxis> = axes.iter().map(|&a| self.axis(a)).collect();
        let mut group = group_of(rank, &descs);
        group.sort_unstable();
        Ok(group)
    }

    /// Every group along `axes`: a partition of all ranks, each group sorted, groups ordered by
    /// their first rank.
    pub fn groups_along(&self, axes: &[usize]) -> Result<Vec<Vec<usize>>> {
        let n = self.num_devices();
        let mut seen = vec![false; n];
        let mut groups = Vec::new();
        for r in 0..n {
            if !seen[r] {
                let g = self.group_along(r, axes)?;
                for &m in &g {
                    seen[m] = true;
                }
                groups.push(g);
            }
        }
        Ok(groups)
    }
}

impl fmt::Debug for DeviceMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceMatrix{:?}", self.dims)
    }
}

impl fmt::Display for DeviceMatrix {
    /// `{a0: 2, a1: 4}`: axes named by their position from the left.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "a{i}: {d}")?;
        }
        write!(f, "}}")
    }
}

/// One mesh axis described independently of the mesh: its size and the rank distance between
/// neighbours along it. Plans store these so that a step can be executed without its mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceAxis {
    /// Devices along the axis.
    pub size: usize,
    /// Rank distance between neighbours along the axis.
    pub stride: usize,
}

impl DeviceAxis {
    /// Coordinate of `rank` along this axis.
    pub fn coord(&self, rank: usize) -> usize {
        (rank / self.stride) % self.size
    }

    /// Ranks that differ from `rank` only along this axis, ordered by coordinate.
    pub fn group(&self, rank: usize) -> Vec<usize> {
        let base = rank - self.coord(rank) * self.stride;
        (0..self.size).map(|k| base + k * self.stride).collect()
    }
}

/// Ranks that differ from `rank` only along the given axes, ordered row-major over the axes
/// in the order given (the first axis most significant).
pub fn group_of(rank: usize, axes: &[DeviceAxis]) -> Vec<usize> {
    let mut base = rank;
    for a in axes {
        base -= a.coord(rank) * a.stride;
    }
    let mut group = vec![base];
    for a in axes {
        let mut next = Vec::with_capacity(group.len() * a.size);
        for &g in &group {
            for k in 0..a.size {
                next.push(g + k * a.stride);
            }
        }
        group = next;
    }
    group
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mesh_of_splits_has_an_axis_per_split_and_the_repeat_axis_last() {
        let (m, axes) = super::DeviceMatrix::of_splits(&[2, 1, 4], 16).unwrap();
        assert_eq!((m.dims(), axes), (&[2, 4, 2][..], vec![Some(0), None, Some(1)]));
        let (m, axes) = super::DeviceMatrix::of_splits(&[1, 1], 1).unwrap();
        assert_eq!((m.dims(), axes), (&[1][..], vec![None, None]));
        assert!(super::DeviceMatrix::of_splits(&[3], 8).is_err());
        assert!(super::DeviceMatrix::of_splits(&[0], 8).is_err());
    }

    use super::*;

    #[test]
    fn coordinates_are_row_major_last_axis_fastest() {
        let m = DeviceMatrix::new(vec![2, 4]).unwrap();
        assert_eq!(m.coordinate(5).unwrap(), vec![1, 1]);
        assert_eq!(m.coordinate(3).unwrap(), vec![0, 3]);
        assert_eq!(m.rank_of(&[1, 2]).unwrap(), 6);
        for r in 0..8 {
            assert_eq!(m.rank_of(&m.coordinate(r).unwrap()).unwrap(), r);
        }
    }

    #[test]
    fn groups_along_axes_match_mindspore_groups() {
        let m = DeviceMatrix::new(vec![2, 4]).unwrap();
        // model-parallel group of l1 (axis of size 4): ranks 0-1-2-3
        assert_eq!(m.group_along(0, &[1]).unwrap(), vec![0, 1, 2, 3]);
        // mirror group of l1.w (unused axis of size 2): ranks 0 and 4
        assert_eq!(m.group_along(0, &[0]).unwrap(), vec![0, 4]);
        assert_eq!(m.groups_along(&[0]).unwrap(), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        assert_eq!(m.group_along(6, &[]).unwrap(), vec![6]);
        assert_eq!(m.group_along(6, &[0, 1]).unwrap(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn device_matrix_rejects_too_many_devices_and_zero_axes() {
        assert!(matches!(DeviceMatrix::new(vec![64, 128]), Err(LayoutError::TooManyDevices { count: 8192, .. })));
        assert!(matches!(DeviceMatrix::new(vec![2, 0]), Err(LayoutError::ZeroAxis { axis: 1, .. })));
        assert!(matches!(DeviceMatrix::new(vec![]), Err(LayoutError::ZeroAxis { .. })));
        assert!(DeviceMatrix::new(vec![4096]).is_ok());
        assert!(matches!(DeviceMatrix::new(vec![2, 2]).unwrap().coordinate(4), Err(LayoutError::RankOutOfRange { .. })));
    }
}
