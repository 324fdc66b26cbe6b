//! [`ParallelPlan`]: every parallel decision of a job, as data. The planner ([`crate::plan()`],
//! [`crate::plan_hybrid`]) makes it; [`crate::rank_program`] turns it into one rank's program;
//! [`crate::RankCost`] predicts what a rank sends, computes and holds; `autopar plan` prints it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use autopar_graph::{DType, Graph, NodeId, OpKind};
use autopar_layout::{DeviceAxis, NamedLayout, RedistributionPlan, Step, Strategy, TensorLayout};

use crate::context::{DatasetStrategy, ParallelContext, ParallelMode};

/// The parallel optimizer's decision for one parameter (defined with its rule).
pub use crate::shard_rule::{sorted_group, OptDecision, OptShard};

/// Where an op's strategy came from (defined with the searches, which choose most).
pub use crate::search::StrategySource;

/// How a rank's op is tied to the whole tensor, in device-matrix terms (resolved per rank by
/// [`crate::rank_program`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InOpSync {
    /// Nothing: each slice is computed on its own.
    None,
    /// Statistics reduced over the ranks differing along these axes (synchronised BatchNorm,
    /// Softmax, LayerNorm).
    Stats(Vec<DeviceAxis>),
    /// A Dropout whose input is split: it draws its block of the whole mask.
    Block,
    /// A Gather whose table (input `input`) is split on its rows `dim`: it looks up its rows.
    Rows {
        /// The table's input position, counted from 0.
        input: usize,
        /// The table's row dimension, which is split.
        dim: usize,
    },
}

impl InOpSync {
    /// The group of `rank` for [`InOpSync::Stats`] (ascending; empty otherwise).
    pub fn group(&self, rank: usize) -> Vec<usize> {
        match self {
            InOpSync::Stats(axes) => sorted_group(rank, axes),
            InOpSync::None | InOpSync::Block | InOpSync::Rows { .. } => Vec::new(),
        }
    }

    /// The tie in words for reports; empty for [`InOpSync::None`].
    pub fn describe(&self) -> String {
        match self {
            InOpSync::None => String::new(),
            InOpSync::Stats(axes) => format!("statistics over {} ranks", axes.iter().map(|a| a.size).product::<usize>()),
            InOpSync::Block => "its block of the whole tensor (mask, positions)".into(),
            InOpSync::Rows { input, dim } => format!("rows of input {input} dim {dim}"),
        }
    }
}

/// The plan of one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// The node.
    pub id: NodeId,
    /// The node's name.
    pub name: String,
    /// The op's kind.
    pub kind: &'static str,
    /// The strategy the op runs with; None for leaves and ops whose layout follows their input
    /// or that run replicated.
    pub strategy: Option<Strategy>,
    /// Where `strategy` came from; None when there is none.
    pub source: Option<StrategySource>,
    /// The user's MindSpore `Layout` the op runs with (named device axes), when it was given
    /// one and kept it; `strategy` then holds its split counts.
    pub layout: Option<NamedLayout>,
    /// Layouts the inputs must have when the op runs.
    pub inputs: Vec<TensorLayout>,
    /// Layout of the op's result (may be a pending partial sum).
    pub output: TensorLayout,
    /// Factor each rank applies to its local result (means over split reduced dimensions).
    pub output_scale: Option<f64>,
    /// How the op's slice is tied to the whole.
    pub sync: InOpSync,
}

impl NodePlan {
    /// The op's strategy as the user would write it: its `Layout` when it runs with one, else
    /// its split counts (`-` when it has neither).
    pub fn strategy_text(&self) -> String {
        match (&self.layout, &self.strategy) {
            (Some(l), _) => l.to_string(),
            (None, Some(s)) => s.to_string(),
            (None, None) => "-".into(),
        }
    }

    /// How many devices compute each slice of the op: the product of the device-matrix axes
    /// that neither its inputs nor its output use (1 when every device computes a slice of its
    /// own). A strategy that splits the op over fewer devices than its stage has repeats it so
    /// (MindSpore's repeated calculation).
    pub fn repeats(&self) -> usize {
        let mesh = self.output.mesh();
        let layouts = || std::iter::once(&self.output).chain(&self.inputs);
        if layouts().any(|l| l.mesh() != mesh) {
            return 1;
        }
        (0..mesh.ndim()).filter(|a| layouts().all(|l| l.replica_axes().contains(a))).map(|a| mesh.dims()[a]).product()
    }
}

/// Where a redistribution is needed: before input `slot` of `consumer`, or before graph output
/// `slot` (gathered whole: the loss of a training plan, every output of a forward-only one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// Before an input of an op.
    Input {
        /// The op consuming the value.
        consumer: NodeId,
        /// The input's position, counted from 0.
        slot: usize,
    },
    /// Before a graph output.
    Output {
        /// The output's position, counted from 0.
        slot: usize,
    },
}

/// One redistribution of the forward pass; its backward is the adjoint of every step in
/// reverse order (run when a gradient flows through it).
#[derive(Clone, Debug, PartialEq)]
pub struct Redistribution {
    /// Where it runs.
    pub site: Site,
    /// The node producing the value.
    pub producer: NodeId,
    /// The value's dtype.
    pub dtype: DType,
    /// The steps from the producer's layout to the one needed.
    pub plan: RedistributionPlan,
    /// `force_fp32_communication` on a f16/bf16 value: the collectives run in f32 (the value
    /// is cast around them).
    pub in_f32: bool,
}

/// A step of a redistribution's backward pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdjointStep {
    /// Local: zero padding around the slice (the adjoint of a local slice; the gradient becomes
    /// a partial sum completed by the gradient synchronisation).
    Pad {
        /// The dimension padded, counted from 0.
        dim: usize,
        /// The device axis the forward slice was taken along.
        axis: DeviceAxis,
    },
    /// Local: the same scale (the adjoint of making a value partial).
    Scale,
    /// A collective (the adjoint of a collective step).
    Collective(Step),
}

impl Redistribution {
    /// The steps of the backward pass, in execution order.
    pub fn backward(&self) -> Vec<AdjointStep> {
        self.plan
            .steps
            .iter()
            .rev()
            .map(|s| match &s.step {
                Step::Slice { dim, axis } => AdjointStep::Pad { dim: *dim, axis: *axis },
                Step::MakePartial { .. } => AdjointStep::Scale,
                Step::AllGather { dim, axis } => AdjointStep::Collective(Step::ReduceScatter { dim: *dim, axis: *axis }),
                Step::ReduceScatter { dim, axis } => AdjointStep::Collective(Step::AllGather { dim: *dim, axis: *axis }),
                Step::AllReduce { axes } => AdjointStep::Collective(Step::AllReduce { axes: axes.clone() }),
                Step::AllToAll { split_dim, concat_dim, axis } => {
                    AdjointStep::Collective(Step::AllToAll { split_dim: *concat_dim, concat_dim: *split_dim, axis: *axis })
                }
                Step::Permute { source } => AdjointStep::Collective(Step::Permute { source: source.clone() }),
            })
            .collect()
    }

    /// Bytes the busiest rank sends in the forward steps (ring algorithms).
    pub fn forward_bytes(&self) -> usize {
        self.plan.bytes_sent_per_rank(if self.in_f32 { 4 } else { self.dtype.size() })
    }
}

/// A parameter: its layout and the ranks its gradient is summed over.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamPlan {
    /// The parameter's name.
    pub name: String,
    /// The parameter's node.
    pub node: NodeId,
    /// The parameter's layout: its model-parallel slices.
    pub layout: TensorLayout,
    /// The parameter's dtype.
    pub dtype: DType,
    /// Whether the optimizer updates it.
    pub trainable: bool,
    /// Axes along which ranks hold the same slice: the gradient is summed over them (the
    /// mirror group). Empty: this rank's own slice.
    pub mirror: Vec<DeviceAxis>,
    /// What the parallel optimizer does with it (`enable_parallel_optimizer`).
    pub opt: OptDecision,
}

impl ParamPlan {
    /// The mirror group of `rank` (ascending).
    pub fn mirror_group(&self, rank: usize) -> Vec<usize> {
        sorted_group(rank, &self.mirror)
    }

    /// The piece of the full tensor `rank` stores between steps: its model-parallel slice, or
    /// the rank's dimension-0 part of it when the optimizer shards the parameter.
    pub fn stored_slice(&self, rank: usize) -> Result<Vec<std::ops::Range<usize>>, autopar_layout::LayoutError> {
        let mp = self.layout.slice_of(rank)?;
        Ok(match self.opt.shard() {
            Some(s) => s.piece(&mp, rank),
            None => mp,
        })
    }

    /// The shape of [`ParamPlan::stored_slice`].
    pub fn stored_shape(&self) -> Vec<usize> {
        let mut shape = self.layout.slice_shape();
        if let (Some(s), Some(d0)) = (self.opt.shard(), shape.first_mut()) {
            *d0 /= s.size;
        }
        shape
    }

    /// One rank per distinct stored piece (the lowest holding it).
    pub fn stored_owners(&self) -> Vec<usize> {
        let owners = self.layout.slice_owners();
        match self.opt.shard() {
            Some(s) => owners.iter().flat_map(|&o| s.group(o)).collect(),
            None => owners,
        }
    }
}

/// Gradients all-reduced together in one buffer: same mirror axes, same communication dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketPlan {
    /// The mirror axes shared by the bucket's parameters: the buffer is all-reduced over them.
    pub mirror: Vec<DeviceAxis>,
    /// The dtype the buffer is reduced in.
    pub dtype: DType,
    /// The names of the bucket's parameters, in order in the buffer.
    pub params: Vec<String>,
    /// Elements of the buffer.
    pub elements: usize,
}

impl BucketPlan {
    /// Bytes of the buffer, in its communication dtype.
    pub fn bytes(&self) -> usize {
        self.elements * self.dtype.size()
    }
}

/// How the gradients are formed and synchronised.
#[derive(Clone, Debug, PartialEq)]
pub struct GradientPlan {
    /// Where each rank's backward pass starts. semi_auto_parallel: the loss is gathered whole
    /// on all N ranks, so `loss_repeated_mean` (the default) starts each from `1/N` and the
    /// replicas' gradients add up to stand-alone's; without it from 1. data_parallel and
    /// hybrid_parallel: `1/N` with `gradients_mean` (the mean of the ranks' gradients), else 1
    /// (their sum).
    pub loss_seed: f64,
    /// Divide each synchronised gradient by its mirror group's size (`gradients_mean` under
    /// semi_auto_parallel: MindSpore's mirror mean).
    pub mirror_mean: bool,
    /// The gradient all-reduce buckets (fused as `comm_fusion` says).
    pub buckets: Vec<BucketPlan>,
    /// Parallel optimizer: the gradients of sharded parameters reduce-scattered over their
    /// replica groups, the parts then gathered into each rank's shard (no `buckets` entry).
    pub reduce_scatter: Vec<ShardBucketPlan>,
    /// Parallel optimizer: the sharded values all-gathered before each step's forward pass.
    pub all_gather: Vec<ShardBucketPlan>,
}

/// Every parallel decision of one job.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelPlan {
    /// The number of devices the plan is for.
    pub device_num: usize,
    /// The parallel mode planned.
    pub mode: ParallelMode,
    /// The options the plan was made under.
    pub context: ParallelContext,
    /// The forward graph (hybrid_parallel: rank 0's graph).
    pub graph: Graph,
    /// hybrid_parallel: every rank's graph (empty in the other modes).
    pub rank_graphs: Vec<Graph>,
    /// The loss, when the job trains (a loss of several elements trains their sum).
    pub loss: Option<NodeId>,
    /// The plan of every node of `graph`, indexed by node.
    pub nodes: Vec<NodePlan>,
    /// Every redistribution of the forward pass.
    pub redistributions: Vec<Redistribution>,
    /// Every parameter, in graph order.
    pub params: Vec<ParamPlan>,
    /// How the gradients are formed and synchronised.
    pub gradients: GradientPlan,
    /// How the dataset is split over the ranks.
    pub dataset: DatasetStrategy,
    /// The strategy file the plan applied, if any.
    pub strategy_file: Option<PathBuf>,
    /// AllToAll steps were lowered to AllGather + Slice (`enable_alltoall` off).
    pub all_to_all: bool,
    /// hybrid_parallel: every group the ranks' hand-placed collectives use, ascending (empty in
    /// the other modes, whose groups come from the layouts).
    pub collective_groups: Vec<Vec<usize>>,
    /// auto_parallel: what the strategy search decided and why (None in the other modes).
    pub search: Option<crate::search::SearchReport>,
}

impl ParallelPlan {
    /// What a person should know before running the plan, one sentence each with a hint:
    /// strategies given by the model or a strategy file that split their ops over fewer
    /// devices than the job has, so that each slice is computed several times over.
    pub fn warnings(&self) -> Vec<String> {
        let mut by_split: BTreeMap<(usize, usize, &str), Vec<&str>> = BTreeMap::new();
        for p in &self.nodes {
            let given = match p.source {
                Some(StrategySource::User) => "the model",
                Some(StrategySource::StrategyFile) => "the strategy file",
                _ => continue,
            };
            let repeats = p.repeats();
            if repeats > 1 {
                let devices = p.output.mesh().num_devices();
                by_split.entry((devices / repeats, devices, given)).or_default().push(&p.name);
            }
        }
        by_split
            .into_iter()
            .map(|((used, devices, given), ops)| {
                let shown = if ops.len() > 4 { format!("{}, ...", ops[..4].join(", ")) } else { ops.join(", ") };
                format!(
                    "{} op(s) ({shown}) have strategies from {given} that split them over {used} of {devices} devices: each slice is computed {} times over\nhint: if that is not meant (a strategy file written for {used} devices, applied to {devices}), give strategies that multiply to {devices}",
                    ops.len(),
                    devices / used,
                )
            })
            .collect()
    }

    /// Layout of every parameter, by name, in graph order.
    pub fn parameter_layouts(&self) -> Vec<(String, TensorLayout)> {
        self.params.iter().map(|p| (p.name.clone(), p.layout.clone())).collect()
    }

    /// The plan of parameter `name`.
    pub fn param(&self, name: &str) -> Option<&ParamPlan> {
        self.params.iter().find(|p| p.name == name)
    }

    /// The redistribution before input `slot` of `consumer`, if one is needed.
    pub fn redistribution(&self, site: Site) -> Option<&Redistribution> {
        self.redistributions.iter().find(|r| r.site == site)
    }

    /// Network inputs with their layouts (the dataset strategy applied), in graph order.
    pub fn input_layouts(&self) -> Vec<(String, TensorLayout)> {
        self.nodes
            .iter()
            .filter(|p| matches!(self.graph.node(p.id).op, OpKind::Input(_)))
            .map(|p| (p.name.clone(), p.output.clone()))
            .collect()
    }

    /// One line per node: name, op, strategy and its source, output layout, in-op sync.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for p in &self.nodes {
            let strategy = p.strategy.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "-".into());
            let source = p.source.map(|s| s.name()).unwrap_or("");
            let _ = writeln!(
                s,
                "{:<28} {:<20} {:<24} {:<8} dev_matrix {:?} tensor_map {} {}{}",
                p.name,
                p.kind,
                strategy,
                source,
                p.output.mesh().dims(),
                p.output.tensor_map(),
                if p.output.is_partial() { "(partial) " } else { "" },
                p.sync.describe()
            );
        }
        s
    }
}

/// Sharded parameters whose all-gathers (or reduce-scatters) run fused: same groups, same
/// dtype, up to the fusion threshold.
///
/// An all-gather bucket gathers the values over the shard group (`axes`). A reduce-scatter
/// bucket sums the gradients over the whole replica group (`axes`), each rank receiving
/// 1/replicas of every slice, and (when the shard group is smaller than the replica group)
/// all-gathers those parts over the other replicas (`rest`), which rebuilds the rank's shard:
/// the same bytes as a reduce-scatter over the shard group followed by an all-reduce over the
/// rest, with the sum taken over the replicas in one pass, in the order an unsharded
/// all-reduce takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardBucketPlan {
    /// The collective's group axes: the shard group (all-gather) or the whole replica group (reduce-scatter), outermost first.
    pub axes: Vec<DeviceAxis>,
    /// Reduce-scatter buckets: the replica axes outside the shard group.
    pub rest: Vec<DeviceAxis>,
    /// Ranks in the shard group.
    pub shard_size: usize,
    /// The dtype communicated (for reduce-scatters, the gradients' communication dtype).
    pub dtype: DType,
    /// The names of the bucket's parameters, in parameter order.
    pub params: Vec<String>,
    /// Elements of the collective's input (MindSpore's fusion size: the shard for an
    /// all-gather, the slice for a reduce-scatter).
    pub elements: usize,
}
