//! Gradient buckets: which gradients are all-reduced together, and in which dtype
//! (MindSpore's `comm_fusion`, `all_reduce_fusion_config`, `gradient_fp32_sync`).

use std::collections::HashMap;

use autopar_layout::DeviceAxis;

use crate::context::{FusionMode, ParallelContext};
use crate::plan::{BucketPlan, ParamPlan};

/// Default AllReduce fusion threshold (MindSpore's `comm_fusion` auto mode): 64 MB.
pub const DEFAULT_FUSION_BYTES: usize = 64 << 20;

/// The dtype a gradient of `dtype` is all-reduced in: f16/bf16 gradients in f32 when
/// `force_fp32_communication` is on, or under the auto modes with `gradient_fp32_sync` (the
/// default); otherwise their own.
pub(super) fn gradient_comm_dtype(dtype: autopar_graph::DType, ctx: &ParallelContext) -> autopar_graph::DType {
    use autopar_graph::DType;
    if dtype.is_half() && (ctx.force_fp32_communication || (ctx.parallel_mode.is_auto() && ctx.gradient_fp32_sync)) {
        DType::F32
    } else {
        dtype
    }
}

/// Group trainable parameters with a mirror group of several ranks into all-reduce buckets as
/// `comm_fusion` (or `all_reduce_fusion_config`) says: parameters with the same mirror axes and
/// communication dtype share a bucket up to the size threshold (bytes of the communication
/// dtype); the index mode cuts the list of such parameters before the given indices;
/// `openstate = false` gives every parameter its own all-reduce.
pub fn fusion_buckets(params: &[ParamPlan], ctx: &ParallelContext) -> Vec<BucketPlan> {
    // The parallel optimizer synchronises the gradients of the parameters it shards itself.
    let synced: Vec<&ParamPlan> = params
        .iter()
        .filter(|p| p.trainable && p.opt.shard().is_none() && p.mirror.iter().map(|a| a.size).product::<usize>() > 1)
        .collect();
    let fusion = &ctx.comm_fusion;
    let limit = match (&fusion.allreduce, fusion.openstate) {
        (_, false) => 0,
        (FusionMode::Auto, true) => DEFAULT_FUSION_BYTES,
        (FusionMode::Size(mb), true) => (mb.get() * 1024.0 * 1024.0) as usize,
        (FusionMode::Index(_), true) => usize::MAX,
    };
    let boundaries: Vec<usize> = match &fusion.allreduce {
        FusionMode::Index(idx) if fusion.openstate => idx.clone(),
        _ => Vec::new(),
    };
    let mut buckets: Vec<BucketPlan> = Vec::new();
    let mut open: HashMap<(Vec<DeviceAxis>, autopar_graph::DType), usize> = HashMap::new();
    for (i, p) in synced.iter().enumerate() {
        let dtype = gradient_comm_dtype(p.dtype, ctx);
        let elements = p.layout.slice_len();
        if boundaries.contains(&i) {
            open.clear();
        }
        let key = (p.mirror.clone(), dtype);
        let fits = open.get(&key).is_some_and(|&b| buckets[b].bytes() + elements * dtype.size() <= limit);
        if fits {
            let b = open[&key];
            buckets[b].params.push(p.name.clone());
            buckets[b].elements += elements;
        } else {
            buckets.push(BucketPlan { mirror: p.mirror.clone(), dtype, params: vec![p.name.clone()], elements });
            open.insert(key, buckets.len() - 1);
        }
    }
    buckets
}
