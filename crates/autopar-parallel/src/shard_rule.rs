//! The parallel optimizer's rule for one parameter ([`decide`]): whether its value, gradient
//! and optimizer state are sharded between steps, over which ranks, or why not. A leaf of the
//! crate's modules (options and layouts only), so that the planner and the searches' memory
//! model both apply it.

use std::ops::Range;

use autopar_layout::{group_of, DeviceAxis};

use crate::context::ParallelContext;

/// The ranks differing from `rank` only along `axes`, ascending.
pub fn sorted_group(rank: usize, axes: &[DeviceAxis]) -> Vec<usize> {
    let mut g = group_of(rank, axes);
    g.sort_unstable();
    g
}

/// A parameter's optimizer shard: its replica group cut into contiguous chunks of `size`
/// ranks (sorted global ranks, innermost device axes first); a rank's position in its chunk
/// selects its dimension-0 piece of the model-parallel slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptShard {
    /// Axes of the shard group (the chunk), outermost first.
    pub axes: Vec<DeviceAxis>,
    /// The other replica axes: the ranks along them store the same shard (and gather its
    /// gradient's parts).
    pub rest: Vec<DeviceAxis>,
    /// Ranks in the shard group (k).
    pub size: usize,
    /// MindSpore's `opt_weight_shard_step`: the rank stride between consecutive replicas.
    pub step: usize,
    /// `optimizer_weight_shard_size` as configured (-1: the whole replica group), as strategy
    /// files record it.
    pub configured: i64,
}

impl OptShard {
    /// The shard group of `rank` (ascending).
    pub fn group(&self, rank: usize) -> Vec<usize> {
        sorted_group(rank, &self.axes)
    }

    /// The ranks holding the same shard as `rank` (ascending).
    pub fn rest_group(&self, rank: usize) -> Vec<usize> {
        sorted_group(rank, &self.rest)
    }

    /// `rank`'s position in its shard group: which dimension-0 piece it holds.
    pub fn index(&self, rank: usize) -> usize {
        self.axes.iter().fold(0, |acc, a| acc * a.size + a.coord(rank))
    }

    /// The piece of a model-parallel slice `mp` (ranges in the full tensor) that `rank` stores.
    pub fn piece(&self, mp: &[Range<usize>], rank: usize) -> Vec<Range<usize>> {
        let mut out = mp.to_vec();
        if let Some(d0) = out.first_mut() {
            let chunk = d0.len() / self.size;
            let start = d0.start + self.index(rank) * chunk;
            *d0 = start..start + chunk;
        }
        out
    }
}

/// What the parallel optimizer does with one parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptDecision {
    /// `enable_parallel_optimizer` is off.
    Disabled,
    /// Sharded over the given shard group.
    Sharded(OptShard),
    /// Left whole, and why.
    Whole(String),
}

impl OptDecision {
    /// The shard, when the parameter is sharded.
    pub fn shard(&self) -> Option<&OptShard> {
        match self {
            OptDecision::Sharded(s) => Some(s),
            OptDecision::Disabled | OptDecision::Whole(_) => None,
        }
    }
}

/// The decision for a parameter with model-parallel `slice` shape, full size `bytes`, replica
/// axes `mirror`, under `ctx` (MindSpore's rules: trainable, replicated, at least
/// `parallel_optimizer_threshold` KB in full, dimension 0 of the slice divisible by the shard
/// size).
pub fn decide(slice: &[usize], bytes: usize, mirror: &[DeviceAxis], trainable: bool, ctx: &ParallelContext) -> OptDecision {
    if !ctx.enable_parallel_optimizer {
        return OptDecision::Disabled;
    }
    let cfg = &ctx.parallel_optimizer_config;
    let replicas: usize = mirror.iter().map(|a| a.size).product();
    let whole = |why: String| OptDecision::Whole(why);
    if !trainable {
        return whole("frozen: the optimizer does not update it".into());
    }
    if replicas <= 1 {
        return whole("already split over every device of its stage (no replicas)".into());
    }
    let threshold = cfg.parallel_optimizer_threshold.saturating_mul(1024);
    if (bytes as u64) < threshold {
        return whole(format!("{bytes} bytes, below parallel_optimizer_threshold {} KB", cfg.parallel_optimizer_threshold));
    }
    let configured = cfg.optimizer_weight_shard_size;
    let size = if configured < 0 || configured as usize >= replicas { replicas } else { configured as usize };
    if size <= 1 {
        return whole("optimizer_weight_shard_size 1".into());
    }
    if !replicas.is_multiple_of(size) {
        return whole(format!("optimizer_weight_shard_size {size} does not divide its {replicas} replicas"));
    }
    match slice.first() {
        None => return whole("a scalar has no dimension 0 to split".into()),
        Some(&d0) if !d0.is_multiple_of(size) => {
            return whole(format!("dimension 0 of its slice ({d0}) is not divisible by the shard size {size}"))
        }
        Some(_) => {}
    }
    // The replica axes innermost first; the shard takes the innermost factors of size `size`.
    let mut axes: Vec<DeviceAxis> = mirror.to_vec();
    axes.sort_by_key(|a| a.stride);
    let step = axes[0].stride;
    let (mut shard, mut rest) = (Vec::new(), Vec::new());
    let mut left = size;
    for a in axes {
        if left == 1 {
            rest.push(a);
        } else if left.is_multiple_of(a.size) {
            shard.push(a);
            left /= a.size;
        } else if a.size.is_multiple_of(left) {
            shard.push(DeviceAxis { size: left, stride: a.stride });
            rest.push(DeviceAxis { size: a.size / left, stride: a.stride * left });
            left = 1;
        } else {
            return whole(format!("a shard of {size} ranks does not align with its replica axes"));
        }
    }
    shard.reverse();
    rest.reverse();
    OptDecision::Sharded(OptShard { axes: shard, rest, size, step, configured })
}
