//! The plan in MindSpore's words: `parameter_layout_dict`.

use autopar_graph::OpKind;

use crate::plan::ParallelPlan;

/// MindSpore's `parameter_layout_dict` of a plan: the 12-tuple of every network input and
/// parameter, in graph order (what `Cell.parameter_layout_dict` prints after compiling; the
/// optimizer-shard and pipeline fields are empty: autopar does not shard optimizer state or
/// pipeline yet).
pub fn parameter_layout_dict(plan: &ParallelPlan) -> Vec<(String, autopar_layout::ParameterLayout)> {
    plan.nodes
        .iter()
        .filter(|p| matches!(plan.graph.node(p.id).op, OpKind::Input(_) | OpKind::Parameter(_)))
        .map(|p| {
            let l = &p.output;
            let dims = l.mesh().dims();
            let mut after = Vec::new();
            for (d, axes) in l.dim_axes().iter().enumerate() {
                let full = l.shape()[d];
                if axes.len() <= 1 {
                    after.push(full / l.split(d));
                } else {
                    // A dimension over several axes is viewed as one dimension per axis.
                    let lead: usize = axes[..axes.len() - 1].iter().map(|&a| dims[a]).product();
                    after.extend(std::iter::repeat_n(1, axes.len() - 1));
                    after.push(full / lead / dims[axes[axes.len() - 1]]);
                }
            }
            (
                p.name.clone(),
                autopar_layout::ParameterLayout {
                    dev_matrix: dims.to_vec(),
                    tensor_map: l.tensor_map().flattened(),
                    slice_shape: l.slice_shape(),
                    field_size: 0,
                    uniform_split: true,
                    opt_shard_group: String::new(),
                    full_shape: l.shape().to_vec(),
                    after_reshape_slice_shape: after,
                    pipeline_shared: false,
                    is_send: false,
                    peer_rank: 0,
                    sr_tag: 0,
                },
            )
        })
        .collect()
}
