//! The parallel optimizer (`enable_parallel_optimizer`, MindSpore's ZeRO-like sharding): which
//! parameters have their optimizer state and, between steps, their value split along dimension
//! 0 of their model-parallel slice over a chunk of their replica group, and the buckets their
//! all-gathers and reduce-scatters are fused into. Pure functions of the layouts and the
//! options, so every decision (and the reason for every parameter left whole) is in the plan.

use std::collections::HashMap;

use autopar_graph::DType;
use autopar_layout::DeviceAxis;

use crate::context::{FusionMode, ParallelContext};
use crate::plan::ParamPlan;
/// The shard decisions as the plan records them.
pub use crate::plan::{OptDecision, OptShard, ShardBucketPlan};
/// The rule deciding them.
pub use crate::shard_rule::decide;

/// The all-gather (`gather = true`: values before use) or reduce-scatter (gradients) buckets of
/// the sharded parameters, in parameter order, as `comm_fusion.allgather` /
/// `comm_fusion.reducescatter` say (MindSpore's size mode: the threshold counts elements, 1 MB
/// = 262144; auto = 64 MB; `openstate = false`: one collective per parameter).
pub fn shard_buckets(
    params: &[ParamPlan],
    ctx: &ParallelContext,
    gather: bool,
    comm_dtype: impl Fn(DType) -> DType,
) -> Vec<ShardBucketPlan> {
    let fusion = &ctx.comm_fusion;
    let mode = if gather { &fusion.allgather } else { &fusion.reducescatter };
    let limit = match (mode, fusion.openstate) {
        (_, false) => 0,
        (FusionMode::Auto, true) => 64 * 262_144,
        (FusionMode::Size(mb), true) => (mb.get() * 262_144.0) as usize,
        (FusionMode::Index(_), true) => usize::MAX,
    };
    let mut buckets: Vec<ShardBucketPlan> = Vec::new();
    let mut open: HashMap<(Vec<DeviceAxis>, Vec<DeviceAxis>, DType), usize> = HashMap::new();
    for p in params {
        let Some(s) = p.opt.shard() else { continue };
        let dtype = if gather { p.dtype } else { comm_dtype(p.dtype) };
        let elements = if gather { p.layout.slice_len() / s.size } else { p.layout.slice_len() };
        let (axes, rest) = if gather {
            (s.axes.clone(), Vec::new())
        } else {
            let mut all = p.mirror.clone();
            all.sort_by_key(|a| std::cmp::Reverse(a.stride));
            (all, s.rest.clone())
        };
        let key = (axes.clone(), rest.clone(), dtype);
        match open.get(&key) {
            Some(&b) if buckets[b].elements + elements <= limit => {
                buckets[b].params.push(p.name.clone());
                buckets[b].elements += elements;
            }
            _ => {
                open.insert(key, buckets.len());
                buckets.push(ShardBucketPlan { axes, rest, shard_size: s.size, dtype, params: vec![p.name.clone()], elements });
            }
        }
    }
    buckets
}

/// MindSpore's name of the communication group of `ranks`: `"<size>-"` and libstdc++'s
/// `std::hash<std::string>` of the ranks joined by `-` (`2-16453000547691086251` for 0 and
/// 4); the group of every rank is `hccl_world_group`.
pub fn group_name(ranks: &[usize], world: usize) -> String {
    if ranks.len() == world && ranks.iter().enumerate().all(|(i, &r)| i == r) {
        return "hccl_world_group".into();
    }
    let joined = ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join("-");
    format!("{}-{}", ranks.len(), std_hash(joined.as_bytes()))
}

/// libstdc++'s 64-bit `_Hash_bytes` (MurmurHash2 variant, seed 0xc70f6907): what
/// `std::hash<std::string>` returns.
pub fn std_hash(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4a793u64 << 32) + 0x5bd1e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash: u64 = 0xc70f6907u64 ^ (bytes.len() as u64).wrapping_mul(MUL);
    let aligned = bytes.len() & !7;
    for chunk in bytes[..aligned].chunks_exact(8) {
        let data = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let data = shift_mix(data.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = &bytes[aligned..];
    if !tail.is_empty() {
        let data = tail.iter().rev().fold(0u64, |acc, &b| (acc << 8) + b as u64);
        hash ^= data;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::sorted_group;
    use proptest::prelude::*;
    use serde_json::json;

    fn ctx(size: i64, threshold: u64) -> ParallelContext {
        let mut c = ParallelContext::default();
        c.set("device_num", &json!(8)).unwrap();
        c.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
        c.set("enable_parallel_optimizer", &json!(true)).unwrap();
        c.set("parallel_optimizer_config", &json!({"optimizer_weight_shard_size": size, "parallel_optimizer_threshold": threshold}))
            .unwrap();
        c
    }

    #[test]
    fn group_names_are_mindspores() {
        assert_eq!(group_name(&[0, 4], 8), "2-16453000547691086251");
        assert_eq!(group_name(&[0, 1, 2, 3], 8), "4-6301172352641561019");
        assert_eq!(group_name(&[1, 5], 8), "2-12944936785892925600");
        assert_eq!(group_name(&[4, 5], 8), "2-6541264347459079684");
        assert_eq!(group_name(&[1, 3, 5, 7], 8), "4-2688051859485673701");
        assert_eq!(group_name(&(0..8).collect::<Vec<_>>(), 8), "hccl_world_group");
    }

    #[test]
    fn fixture_parameters_shard_as_mindspore_records() {
        // l1.w of the fixtures: dev [2,4], split on the axis of 4 -> replicas {r, r+4}
        let l1 = [DeviceAxis { size: 2, stride: 4 }];
        let OptDecision::Sharded(s) = decide(&[64, 32], 64 * 128 * 4, &l1, true, &ctx(-1, 0)) else { panic!() };
        assert_eq!((s.step, s.size, s.group(5), s.index(5)), (4, 2, vec![1, 5], 1));
        // head.w replicated on 8 with shard size 2: groups {0,1},.. and mirrors {0,2,4,6},..
        let head = [DeviceAxis { size: 8, stride: 1 }];
        let OptDecision::Sharded(s) = decide(&[32, 16], 32 * 16 * 4, &head, true, &ctx(2, 0)) else { panic!() };
        assert_eq!((s.step, s.group(5), s.rest_group(5), s.index(4)), (1, vec![4, 5], vec![1, 3, 5, 7], 0));
        // 64 KB threshold: 32 KB is left whole, exactly 64 KB is sharded
        assert!(matches!(decide(&[64, 32], 64 * 128 * 4, &l1, true, &ctx(-1, 64)), OptDecision::Whole(w) if w.contains("threshold")));
        assert!(decide(&[128, 32], 65536, &l1, true, &ctx(-1, 64)).shard().is_some());
        assert!(matches!(decide(&[3, 32], 1 << 20, &l1, true, &ctx(-1, 0)), OptDecision::Whole(w) if w.contains("not divisible")));
        assert!(matches!(decide(&[64, 32], 1 << 20, &[], true, &ctx(-1, 0)), OptDecision::Whole(_)));
        assert!(matches!(decide(&[64, 32], 1 << 20, &l1, false, &ctx(-1, 0)), OptDecision::Whole(w) if w.contains("frozen")));
        assert_eq!(decide(&[64], 1 << 20, &l1, true, &ParallelContext::default()), OptDecision::Disabled);
    }

    proptest! {
        /// Shard groups tile the replica group into chunks of k consecutive ranks (sorted), the
        /// rest groups pair equal positions, and the pieces of one chunk tile the slice.
        #[test]
        fn shard_groups_are_contiguous_chunks_of_the_sorted_replica_group(
            sizes in proptest::collection::vec(1usize..4, 1..4), inner in 1usize..3, k_pow in 0u32..4,
        ) {
            let mut stride = inner;
            let mut mirror = Vec::new();
            for s in sizes.iter().rev() {
                mirror.push(DeviceAxis { size: *s, stride });
                stride *= s;
            }
            mirror.reverse();
            let replicas: usize = sizes.iter().product();
            let k = 1usize << k_pow;
            let c = ctx(k as i64, 0);
            let group = sorted_group(0, &mirror);
            match decide(&[replicas * 4, 3], 1 << 20, &mirror, true, &c) {
                OptDecision::Sharded(s) => {
                    prop_assert!(replicas > 1);
                    for (i, chunk) in group.chunks(s.size).enumerate() {
                        for (pos, &r) in chunk.iter().enumerate() {
                            prop_assert_eq!(&s.group(r), &chunk.to_vec());
                            prop_assert_eq!(s.index(r), pos);
                            let rest: Vec<usize> = group.iter().skip(pos).step_by(s.size).copied().collect();
                            prop_assert_eq!(s.rest_group(r), rest);
                            prop_assert_eq!(s.piece(&[0..replicas * 4, 0..3], r)[0].start, pos * replicas * 4 / s.size);
                        }
                        prop_assert!(i < replicas / s.size);
                    }
                }
                OptDecision::Whole(_) => prop_assert!(replicas == 1 || k == 1 || !replicas.is_multiple_of(k.min(replicas)) || k < replicas),
                OptDecision::Disabled => prop_assert!(false),
            }
        }
    }
}
