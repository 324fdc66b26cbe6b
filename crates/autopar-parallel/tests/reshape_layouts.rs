//! A split carried through a reshape (`reshape_layout`) gives every rank exactly the elements
//! its input slice holds, in the same order, so the reshape runs locally.

use std::collections::BTreeSet;

use autopar_layout::{DeviceMatrix, TensorLayout};
use autopar_parallel::reshape_layout;
use proptest::prelude::*;

/// The row-major flat indices of `rank`'s slice.
fn flat_slice(l: &TensorLayout, rank: usize) -> BTreeSet<usize> {
    let ranges = l.slice_of(rank).unwrap();
    let mut all = BTreeSet::from([0usize]);
    for (d, r) in ranges.iter().enumerate() {
        all = all.iter().flat_map(|&f| r.clone().map(move |i| f * l.shape()[d] + i)).collect();
    }
    all
}

fn layout(mesh: &[usize], map: Vec<Vec<usize>>, shape: &[usize]) -> TensorLayout {
    TensorLayout::new(DeviceMatrix::new(mesh.to_vec()).unwrap(), map, shape.to_vec()).unwrap()
}

fn same_slices(src: &TensorLayout, out: &TensorLayout) {
    let n = src.mesh().num_devices();
    assert_eq!(out.mesh().num_devices(), n);
    for rank in 0..n {
        assert_eq!(flat_slice(src, rank), flat_slice(out, rank), "rank {rank}: {src:?} -> {out:?}");
        // Pending partial sums stay pending over the same ranks.
        assert_eq!(src.partial_group(rank).unwrap(), out.partial_group(rank).unwrap(), "rank {rank}: {src:?} -> {out:?}");
    }
}

#[test]
fn a_split_wider_than_the_first_output_dimension_is_factored_onto_the_next() {
    // [B * T, H] rows over 16 devices, B = 8: 8 ways over B, 2 over T.
    let src = layout(&[16], vec![vec![0], vec![]], &[16, 12]);
    let out = reshape_layout(&src, &[8, 2, 3, 4]).expect("the rows' split follows the reshape");
    assert_eq!(out.mesh().dims(), &[8, 2]);
    assert_eq!(out.splits(), vec![8, 2, 1, 1]);
    same_slices(&src, &out);
    // And back: [B, T, heads, d] split (8, 2) merges into 16 ways over the rows.
    let back = reshape_layout(&out, &[16, 12]).expect("whole B then T merge");
    assert_eq!(back.splits(), vec![16, 1]);
    same_slices(&out, &back);
    // A split straddling three output dimensions, with a replica axis left alone.
    let src = layout(&[8, 3], vec![vec![0], vec![]], &[8, 5]);
    let out = reshape_layout(&src, &[2, 2, 2, 5]).unwrap();
    assert_eq!(out.mesh().dims(), &[2, 2, 2, 3]);
    assert_eq!(out.splits(), vec![2, 2, 2, 1]);
    same_slices(&src, &out);
    // Axes of one device (MindSpore's layouts may carry them) split nothing and block nothing.
    for (shape, out) in [(vec![4, 1], vec![4]), (vec![4, 6], vec![24])] {
        let src = layout(&[2, 1], vec![vec![0], vec![1]], &shape);
        let l = reshape_layout(&src, &out).expect("a size-1 axis does not stop the split");
        assert_eq!(l.splits()[0], 2);
        same_slices(&src, &l);
    }
}

#[test]
fn splits_that_would_cut_non_contiguous_blocks_are_refused() {
    // [4, 6] split (2, 2): each rank holds two half rows, not one run of the flattened 24.
    assert!(reshape_layout(&layout(&[2, 2], vec![vec![0], vec![1]], &[4, 6]), &[24]).is_none());
    // [6] split 2 into [2, 3]: 2 ways over the first dimension is whole, fine; 3 ways over a
    // split of 6 into [3, 2] by 2 is not (3 is not a multiple of 2 nor 2 of 3).
    assert!(reshape_layout(&layout(&[2], vec![vec![0]], &[6]), &[2, 3]).is_some());
    assert!(reshape_layout(&layout(&[2], vec![vec![0]], &[6]), &[3, 2]).is_none());
    // 4 ways over 6 rows cannot be.
    assert!(reshape_layout(&layout(&[4], vec![vec![0], vec![]], &[8, 3]), &[2, 12]).is_some());
    assert!(reshape_layout(&layout(&[4], vec![vec![0], vec![]], &[8, 3]), &[6, 4]).is_none());
}

/// A shape made of `atoms` grouped by the cut points in `cuts` (a bit per gap).
fn grouped(atoms: &[usize], cuts: u32) -> Vec<usize> {
    let mut shape = vec![atoms[0]];
    for (k, &a) in atoms.iter().enumerate().skip(1) {
        if cuts >> (k - 1) & 1 == 1 {
            shape.push(a);
        } else {
            *shape.last_mut().unwrap() *= a;
        }
    }
    shape
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Any layout of any shape, reshaped to any regrouping of its factors: when the split can
    /// follow, every rank's slice is the same run of elements.
    #[test]
    fn a_carried_split_keeps_every_ranks_elements(
        atoms in prop::collection::vec(prop::sample::select(vec![1usize, 2, 2, 3, 4, 4, 8]), 1..6),
        in_cuts in any::<u32>(),
        out_cuts in any::<u32>(),
        mesh in prop::collection::vec(prop::sample::select(vec![1usize, 2, 3, 4]), 1..4),
        homes in prop::collection::vec(0usize..4, 3),
        order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        partial in any::<bool>(),
    ) {
        let inp = grouped(&atoms, in_cuts);
        let out = grouped(&atoms, out_cuts);
        // Axis k goes to dimension homes[k] (past the last: a replica axis, or one of pending
        // partial sums), the axes of a dimension in a random order.
        let mut map = vec![Vec::new(); inp.len()];
        let mut rest = Vec::new();
        for k in order.into_iter().filter(|&k| k < mesh.len()) {
            match map.get_mut(homes[k]) {
                Some(d) => d.push(k),
                None => rest.push(k),
            }
        }
        let Ok(src) = TensorLayout::new(DeviceMatrix::new(mesh.clone()).unwrap(), map, inp.clone()) else {
            return Ok(());
        };
        let src = if partial { src.with_partial(rest).unwrap() } else { src };
        if let Some(l) = reshape_layout(&src, &out) {
            prop_assert_eq!(l.shape(), out.as_slice());
            same_slices(&src, &l);
            // And the way back.
            let back = reshape_layout(&l, &inp).expect("a carried split carries back");
            same_slices(&l, &back);
        }
    }
}
