//! Which ranks hold the same piece of a parameter, and which one of them owns it: MindSpore's
//! `get_parameter_redundancy` and `remove_param_redundancy` (`mindspore.train._utils`), the
//! owner choice of `parameter_broadcast` and of checkpoints saved without redundancy.
//!
//! The inputs are MindSpore's own (a device matrix and a right-counted tensor map per
//! parameter), so a layout dict or a strategy file written by either system gives the same
//! groups and owners:
//!
//! * a rank's *row* has one entry per device axis; for every tensor-map value `i != -1` entry
//!   `i` is the rank's coordinate along device axis `len - 1 - i`, the others are 0;
//! * ranks with equal rows hold the same slice; the groups (ranks offset by `initial_rank`,
//!   ascending) are listed in the order of their rows;
//! * with an optimizer shard of `k` pieces, every group is cut into the `k` stride groups
//!   `group[i::k]` (ranks holding the same piece); a group `k` does not divide is dropped;
//! * the owner of a parameter in a group is the group's member at the parameter's position,
//!   round-robin, among the parameters (in name order) that have that group.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{LayoutError, Result};

/// The groups of ranks holding the same slice of a parameter laid out by `dev_matrix` and
/// MindSpore's (flattened, right-counted) `tensor_map`, as global ranks from `initial_rank`.
pub fn replica_groups(dev_matrix: &[usize], tensor_map: &[i64], initial_rank: usize) -> Result<Vec<Vec<usize>>> {
    let n = dev_matrix.len();
    if let Some(axis) = dev_matrix.iter().position(|&d| d == 0) {
        return Err(LayoutError::ZeroAxis { dims: dev_matrix.to_vec(), axis });
    }
    let mut seen = BTreeMap::new();
    for (dim, &v) in tensor_map.iter().enumerate() {
        if v == -1 {
            continue;
        }
        if v < -1 || v >= n as i64 {
            return Err(LayoutError::TensorMapOutOfRange { dim, value: v, dims: dev_matrix.to_vec() });
        }
        if let Some(first) = seen.insert(v, dim) {
            return Err(LayoutError::AxisUsedTwice { axis: n - 1 - v as usize, value: v, first, second: dim });
        }
    }
    let devices: usize = dev_matrix.iter().product();
    let mut rows: BTreeMap<Vec<usize>, Vec<usize>> = BTreeMap::new();
    for local in 0..devices {
        let mut coord = vec![0; n];
        let mut rest = local;
        for a in (0..n).rev() {
            coord[a] = rest % dev_matrix[a];
            rest /= dev_matrix[a];
        }
        let mut row = vec![0; n];
        for &i in seen.keys() {
            row[i as usize] = coord[n - 1 - i as usize];
        }
        rows.entry(row).or_default().push(initial_rank + local);
    }
    Ok(rows.into_values().collect())
}

/// The number of optimizer-shard pieces a strategy file's `opt_weight_shard_step` and
/// `opt_weight_shard_size` give over `groups` (`None`: not sharded; -1: every rank of the
/// stage divided by the step).
pub fn opt_pieces(step: i64, size: i64, groups: &[Vec<usize>]) -> Option<usize> {
    match size {
        0 => None,
        -1 => {
            let total = groups.len() * groups.first().map_or(0, Vec::len);
            Some(if step > 0 { total / step as usize } else { 1 })
        }
        k => Some(k.max(1) as usize),
    }
}

/// `groups` cut by an optimizer shard of `pieces`: every group `g` becomes the `pieces`
/// stride groups `g[i::pieces]`; a group `pieces` does not divide is dropped (as MindSpore does).
pub fn split_by_opt_shard(groups: Vec<Vec<usize>>, pieces: usize) -> Vec<Vec<usize>> {
    if pieces <= 1 {
        return groups;
    }
    let mut out = Vec::new();
    for g in groups.iter().filter(|g| g.len() % pieces == 0) {
        for i in 0..pieces {
            out.push(g.iter().skip(i).step_by(pieces).copied().collect());
        }
    }
    out
}

/// The owner of every parameter in every group that holds it: `(parameter, group) -> rank`
/// ([`single_owners`] by rank).
pub fn group_owners(redundancy: &BTreeMap<String, Vec<Vec<usize>>>) -> BTreeMap<(String, Vec<usize>), usize> {
    let mut next: BTreeMap<&[usize], usize> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (name, groups) in redundancy {
        for g in groups.iter().filter(|g| !g.is_empty()) {
            let k = next.entry(g.as_slice()).or_insert(0);
            out.insert((name.clone(), g.clone()), g[*k % g.len()]);
            *k += 1;
        }
    }
    out
}

/// MindSpore's `remove_param_redundancy`: the parameters each rank is the single owner of.
pub fn single_owners(redundancy: &BTreeMap<String, Vec<Vec<usize>>>) -> BTreeMap<usize, BTreeSet<String>> {
    let mut out: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for ((name, _), rank) in group_owners(redundancy) {
        out.entry(rank).or_default().insert(name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TensorLayout, TensorMap};
    use proptest::prelude::*;

    fn groups(v: &[&[usize]]) -> Vec<Vec<usize>> {
        v.iter().map(|g| g.to_vec()).collect()
    }

    #[test]
    fn groups_and_owners_are_mindspores() {
        // Outputs of MindSpore 2.10's get_parameter_redundancy / remove_param_redundancy.
        assert_eq!(replica_groups(&[2, 4], &[-1, 0], 0).unwrap(), groups(&[&[0, 4], &[1, 5], &[2, 6], &[3, 7]]));
        assert_eq!(replica_groups(&[2, 2, 2], &[1], 0).unwrap(), groups(&[&[0, 1, 4, 5], &[2, 3, 6, 7]]));
        assert_eq!(replica_groups(&[2, 2, 2], &[2, 0], 4).unwrap(), groups(&[&[4, 6], &[8, 10], &[5, 7], &[9, 11]]));
        assert_eq!(replica_groups(&[4, 2], &[1, -1], 4).unwrap(), groups(&[&[4, 5], &[6, 7], &[8, 9], &[10, 11]]));
        assert_eq!(
            replica_groups(&[2, 2, 4], &[2, -1, 0], 0).unwrap(),
            groups(&[&[0, 4], &[8, 12], &[1, 5], &[9, 13], &[2, 6], &[10, 14], &[3, 7], &[11, 15]])
        );
        assert_eq!(replica_groups(&[8], &[-1, -1], 0).unwrap(), groups(&[&[0, 1, 2, 3, 4, 5, 6, 7]]));
        let mut r = BTreeMap::new();
        for (name, dev, map) in [
            ("l1.w", &[2, 4][..], &[-1, 0][..]),
            ("head.w", &[8], &[-1, -1]),
            ("l1.b", &[2, 4], &[-1]),
            ("l2.w", &[2, 2, 2], &[2, -1]),
            ("l2.b", &[2, 2, 2], &[1]),
        ] {
            r.insert(name.to_string(), replica_groups(dev, map, 0).unwrap());
        }
        let owners = single_owners(&r);
        let want: BTreeMap<usize, BTreeSet<String>> =
            [(0, &["head.w", "l1.w", "l2.b", "l2.w"][..]), (1, &["l1.b", "l1.w"]), (2, &["l1.w", "l2.b"]), (3, &["l1.w"]), (4, &["l2.w"])]
                .into_iter()
                .map(|(k, v)| (k, v.iter().map(|s| s.to_string()).collect()))
                .collect();
        assert_eq!(owners, want);
    }

    #[test]
    fn optimizer_shards_cut_groups_into_stride_groups() {
        // MindSpore: w2 ([2, 4], [-1, 0]) with a 2-rank shard group.
        let g = split_by_opt_shard(replica_groups(&[2, 4], &[-1, 0], 0).unwrap(), 2);
        assert_eq!(g, groups(&[&[0], &[4], &[1], &[5], &[2], &[6], &[3], &[7]]));
        let g = split_by_opt_shard(replica_groups(&[8], &[-1, -1], 0).unwrap(), 4);
        assert_eq!(g, groups(&[&[0, 4], &[1, 5], &[2, 6], &[3, 7]]));
        assert_eq!(split_by_opt_shard(groups(&[&[0, 1, 2]]), 2), Vec::<Vec<usize>>::new());
        assert_eq!(opt_pieces(0, 0, &groups(&[&[0, 1]])), None);
        assert_eq!(opt_pieces(1, -1, &groups(&[&[0, 1, 2, 3]])), Some(4));
        assert_eq!(opt_pieces(2, -1, &groups(&[&[0, 1], &[2, 3]])), Some(2));
        assert_eq!(opt_pieces(1, 2, &groups(&[&[0, 1, 2, 3]])), Some(2));
    }

    #[test]
    fn bad_tensor_maps_are_refused() {
        assert!(matches!(replica_groups(&[2, 4], &[2], 0), Err(LayoutError::TensorMapOutOfRange { value: 2, .. })));
        assert!(matches!(replica_groups(&[2, 4], &[0, 0], 0), Err(LayoutError::AxisUsedTwice { .. })));
        assert!(matches!(replica_groups(&[2, 0], &[0], 0), Err(LayoutError::ZeroAxis { axis: 1, .. })));
    }

    proptest! {
        /// Ranks share a group exactly when autopar's layout gives them the same slice, and
        /// every parameter of a group has exactly one owner in it.
        #[test]
        fn groups_are_the_ranks_with_equal_slices(
            dims in prop::collection::vec(1usize..4, 1..4),
            picks in prop::collection::vec(any::<bool>(), 3),
            offset in 0usize..3,
        ) {
            let n = dims.len();
            let map: Vec<i64> = (0..n).filter(|&a| picks[a]).map(|a| (n - 1 - a) as i64).collect();
            let shape: Vec<usize> = map.iter().map(|&v| dims[n - 1 - v as usize] * 2).collect();
            let devices: usize = dims.iter().product();
            let initial = offset * devices;
            let layout = TensorLayout::from_mindspore(&dims, &TensorMap::single(&map), &shape).unwrap();
            let groups = replica_groups(&dims, &map, initial).unwrap();
            let mut all: Vec<usize> = groups.iter().flatten().copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (initial..initial + devices).collect::<Vec<_>>());
            for a in 0..devices {
                for b in 0..devices {
                    let same_group = groups.iter().any(|g| g.contains(&(a + initial)) && g.contains(&(b + initial)));
                    prop_assert_eq!(same_group, layout.slice_of(a).unwrap() == layout.slice_of(b).unwrap());
                }
            }
            let mut r = BTreeMap::new();
            r.insert("p".to_string(), groups.clone());
            r.insert("q".to_string(), groups.clone());
            let owners = group_owners(&r);
            for g in &groups {
                let o = owners[&("p".to_string(), g.clone())];
                prop_assert!(g.contains(&o));
                if g.len() > 1 {
                    prop_assert_ne!(o, owners[&("q".to_string(), g.clone())]);
                }
            }
        }
    }
}
