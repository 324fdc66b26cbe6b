//! Whether two ops of `recursive_programming`'s partition graph exchange a tensor of one shape
//! (MindSpore's `isAdjacent`): only then does a cut that disagrees with a neighbour's cost a
//! redistribution. Between the two lie the ops left out of the partition; a transpose or a
//! reshape among them maps the producer's dimensions to the consumer's, and MindSpore compares
//! the shapes through that mapping (its rec_cost, rec_graph and rec_parse_graph). Shapes are
//! 4-D, padded with 1s in front, as the partition's are.
//!
//! Ported as MindSpore has it, including where its arithmetic is odd: a transpose of fewer than
//! 4 dimensions maps a padded 4-D shape by the wrong positions (on its own it never matches), a
//! reshape that merges dimensions compares products of the producer's dimensions, and one that
//! splits them divides with truncation. Where MindSpore stops with an error (mappings of
//! different lengths on one path), the shapes are compared as they are.

/// A 4-D shape (outermost first).
pub(super) type Dims = [usize; 4];

/// What the ops between two partition ops do to the tensor's dimensions.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ShapeMap {
    /// Dimension `i` of the result is dimension `transpose[i]` of the source; empty: none.
    transpose: Vec<usize>,
    /// MindSpore's `reshape_mapping`: per dimension of the result, the source dimensions it
    /// comes from (one each where a reshape splits, several where it merges); empty: none.
    reshape: Vec<Vec<usize>>,
    /// Mappings of different lengths met on one path (MindSpore stops with an error there):
    /// the shapes are compared as they are.
    broken: bool,
}

impl ShapeMap {
    /// A transpose by `perm` (MindSpore's `transpose_mapping`).
    pub(super) fn transpose(perm: &[usize]) -> Self {
        Self { transpose: perm.to_vec(), ..Self::default() }
    }

    /// A reshape from `input` to `output` (MindSpore's `HandleShapeRelatedOp`): a reshape that
    /// keeps or adds dimensions maps each output dimension to the input dimension it is carved
    /// out of; one that removes dimensions maps each 4-D position to the output dimensions
    /// carved out of it. No mapping where the shapes do not decompose so.
    pub(super) fn reshape(input: &[usize], output: &[usize]) -> Self {
        let (a, b) = (padded(input), padded(output));
        let reshape = if input.len() <= output.len() {
            decompose(a, b).map(|d| d.into_iter().map(|x| vec![x]).collect()).unwrap_or_default()
        } else {
            decompose(b, a).map(|d| to_combine(&d)).unwrap_or_default()
        };
        Self { reshape, ..Self::default() }
    }

    /// `self` (an op nearer the producer) followed by `next` (MindSpore's
    /// `ShapeMappingCombine`: `TransposeCombine` and `ReshapeCombine`).
    pub(super) fn then(&self, next: &ShapeMap) -> ShapeMap {
        let mut broken = self.broken || next.broken;
        let transpose = combined(&self.transpose, &next.transpose, &mut broken, || {
            next.transpose.iter().map(|&i| self.transpose.get(i).copied().unwrap_or(i)).collect()
        });
        let reshape = combined(&self.reshape, &next.reshape, &mut broken, || {
            next.reshape
                .iter()
                .enumerate()
                .map(|(i, from)| {
                    let mut dims: Vec<usize> = if from.is_empty() { vec![i] } else { Vec::new() };
                    for &j in from {
                        dims.extend(self.reshape.get(j).into_iter().flatten());
                    }
                    dims.sort_unstable();
                    dims.dedup();
                    dims
                })
                .collect()
        });
        ShapeMap { transpose, reshape, broken }
    }

    /// Whether a producer's output `incoming` reaches a consumer's input `current` through
    /// this mapping with the same shape (MindSpore's `isAdjacent`).
    pub(super) fn adjacent(&self, incoming: &Dims, current: &Dims) -> bool {
        if self.broken {
            return incoming == current;
        }
        match (self.transpose.is_empty(), self.reshape.is_empty()) {
            (false, false) => same_after_reshape(incoming, &rearranged(&self.transpose, &self.reshape), current),
            (false, true) => permuted(incoming, &self.transpose) == *current,
            (true, false) => same_after_reshape(incoming, &self.reshape, current),
            (true, true) => incoming == current,
        }
    }
}

/// One kind of mapping, `first` followed by `next`: `compose` where both are set, either alone
/// where the other is empty; mappings of different lengths break the path.
fn combined<T: Clone>(first: &[T], next: &[T], broken: &mut bool, compose: impl FnOnce() -> Vec<T>) -> Vec<T> {
    match (first.is_empty(), next.is_empty()) {
        (true, _) => next.to_vec(),
        (_, true) => first.to_vec(),
        _ if first.len() != next.len() => {
            *broken = true;
            Vec::new()
        }
        _ => compose(),
    }
}

/// `shape` as 4-D: its last 4 dimensions, 1s in front (MindSpore's `complete_shape_to_4D`).
pub(super) fn padded(shape: &[usize]) -> Dims {
    let mut d = [1; 4];
    let r = shape.len().min(4);
    d[4 - r..].copy_from_slice(&shape[shape.len() - r..]);
    d
}

/// MindSpore's `ReshapeDecompose`: for each dimension of `to`, the dimension of `from` it is
/// carved out of, left to right; None when `to` does not decompose `from` so.
fn decompose(mut from: Dims, mut to: Dims) -> Option<Vec<usize>> {
    let mut dep = [None; 4];
    let (mut i, mut o) = (0, 0);
    while i < 4 && o < 4 {
        if from[i] >= to[o] {
            if to[o] != 0 && from[i].is_multiple_of(to[o]) {
                from[i] /= to[o];
                to[o] = 1;
                dep[o] = Some(i);
            }
            o += 1;
            if from[i] == 1 {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    if to.iter().any(|&x| x != 1) {
        return None;
    }
    dep.into_iter().collect()
}

/// MindSpore's `ReshapeDecomToCombine`: per 4-D position, the positions that depend on it.
fn to_combine(dep: &[usize]) -> Vec<Vec<usize>> {
    let mut at = 0;
    (0..4)
        .map(|pos| {
            let mut dims = Vec::new();
            while dep.get(at) == Some(&pos) {
                dims.push(at);
                at += 1;
            }
            dims
        })
        .collect()
}

fn merges(reshape: &[Vec<usize>]) -> bool {
    reshape.iter().any(|d| d.len() > 1)
}

/// MindSpore's `ShapeConversion`: position `i < perm.len()` takes dimension `perm[i]`, the
/// rest are 0 (so a permutation of fewer than 4 dimensions never matches a padded shape).
fn permuted(shape: &Dims, perm: &[usize]) -> Dims {
    let mut out = [0; 4];
    for (o, &p) in out.iter_mut().zip(perm) {
        *o = shape.get(p).copied().unwrap_or(0);
    }
    out
}

/// MindSpore's `RearrangeReshape`: a reshape mapping read through a transpose.
fn rearranged(perm: &[usize], reshape: &[Vec<usize>]) -> Vec<Vec<usize>> {
    if merges(reshape) {
        reshape.iter().map(|dims| dims.iter().filter_map(|&d| perm.get(d).copied()).collect()).collect()
    } else {
        perm.iter().filter_map(|&p| reshape.get(p).cloned()).collect()
    }
}

/// MindSpore's `SameShapeAfterReshape`: a merging mapping multiplies the source dimensions it
/// names and compares the result; a splitting one divides (truncating, a zero divisor
/// skipped) each source dimension by the dimensions carved out of it and asks that 1 is left
/// of each.
fn same_after_reshape(origin: &Dims, reshape: &[Vec<usize>], compared: &Dims) -> bool {
    if merges(reshape) {
        let merged: Vec<usize> = reshape.iter().map(|dims| dims.iter().map(|&d| origin.get(d).copied().unwrap_or(1)).product()).collect();
        // MindSpore converts a mapping of another length to the all-ones shape.
        let shape: Dims = merged.try_into().unwrap_or([1; 4]);
        return shape == *compared;
    }
    let mut left = *origin;
    for (i, dims) in reshape.iter().enumerate() {
        let (Some(&d), Some(&c)) = (dims.first(), compared.get(i)) else { continue };
        if let Some(x) = left.get_mut(d) {
            *x = x.checked_div(c).unwrap_or(*x);
        }
    }
    left == [1; 4]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_combine_as_mindspores_unit_test_says() {
        // MindSpore's test_transpose_combine: {3,2,1,0} then {2,3,0,1} is {1,0,3,2}.
        let m = ShapeMap::transpose(&[3, 2, 1, 0]).then(&ShapeMap::transpose(&[2, 3, 0, 1]));
        assert_eq!(m.transpose, vec![1, 0, 3, 2]);
    }

    #[test]
    fn a_heads_split_and_merge_round_trip_is_adjacent() {
        // [b*s, h] -> [b, s, H, d] -> transpose (0,2,1,3) ... transpose (0,2,1,3) -> [b*s, h].
        let (b, s, heads, d) = (4, 16, 8, 32);
        let split = ShapeMap::reshape(&[b * s, heads * d], &[b, s, heads, d]);
        assert_eq!(split.reshape, vec![vec![2], vec![2], vec![3], vec![3]]);
        let merge = ShapeMap::reshape(&[b, s, heads, d], &[b * s, heads * d]);
        assert_eq!(merge.reshape, vec![vec![], vec![], vec![0, 1], vec![2, 3]]);
        let t = ShapeMap::transpose(&[0, 2, 1, 3]);
        let path = split.then(&t).then(&t).then(&merge);
        let flat = [1, 1, b * s, heads * d];
        assert!(path.adjacent(&flat, &flat));
        assert!(!path.adjacent(&flat, &[1, 1, b * s, 2 * heads * d]));
        // Through the split alone, the heads' 4-D shape.
        assert!(split.adjacent(&flat, &[b, s, heads, d]));
        assert!(t.adjacent(&[b, s, heads, d], &[b, heads, s, d]));
    }

    #[test]
    fn a_two_dimensional_transpose_never_matches_as_in_mindspore() {
        let t = ShapeMap::transpose(&[1, 0]);
        assert!(!t.adjacent(&[1, 1, 8, 8], &[1, 1, 8, 8]));
        assert!(ShapeMap::default().adjacent(&[1, 1, 8, 8], &[1, 1, 8, 8]));
    }

    #[test]
    fn a_reshape_that_does_not_decompose_has_no_mapping() {
        // [n, c, 1, 1] -> [n, c]: the trailing 1s depend on nothing.
        assert_eq!(ShapeMap::reshape(&[8, 64, 1, 1], &[8, 64]), ShapeMap::default());
        assert_eq!(ShapeMap::reshape(&[6, 4], &[4, 6]).reshape, Vec::<Vec<usize>>::new());
    }

    #[test]
    fn mappings_of_different_lengths_fall_back_to_the_shapes() {
        let m = ShapeMap::transpose(&[1, 0]).then(&ShapeMap::transpose(&[0, 2, 1, 3]));
        assert!(m.broken);
        assert!(m.adjacent(&[1, 1, 4, 4], &[1, 1, 4, 4]));
    }
}
