//! The planner: a forward graph and a parallel context become a [`ParallelPlan`], for every
//! mode. A pure function of its inputs: nothing here runs anything.
//!
//! * **stand_alone** plans one device (every layout whole).
//! * **semi_auto_parallel**: an op keeps its strategy from a strategy file, else the model's
//!   `.shard()`, else MindSpore's default (its batch split: [`default_splits`]).
//! * **data_parallel** is planned like semi_auto_parallel with every op on its default
//!   strategy: inputs split on the batch, parameters replicated, ops that need the whole batch
//!   (training BatchNorm, Dropout on data, the loss) tied to it. `.shard()` is ignored, as
//!   MindSpore ignores it in this mode.
//! * **hybrid_parallel** ([`plan_hybrid`]): the user's rank graphs, checked (collective groups
//!   and the order the ranks call them in, point-to-point pairs, replicated parameters) and
//!   described by the same plan type; nothing is inserted.
//!
//! Semantics (what makes parallel equal stand-alone): every local op computes exactly its slice
//! of the global op (or, for a split reduced dimension, a partial sum of it); redistributions
//! between a producer's layout and the layout its consumer needs are exact; the loss (every
//! output of a forward-only plan) ends replicated on every rank. Autodiff of each rank's local graph uses the exact adjoints of
//! the collectives, so with the loss seeded as [`crate::GradientPlan::loss_seed`] says, the sum of
//! a parameter slice's gradients over its mirror group is the gradient of the job's loss.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;

use autopar_graph::{CostCx, Graph, Node, NodeId, OpKind, ShardingRule, StrategyProblem, TensorType, Tie};
use autopar_layout::{plan_with, DeviceAxis, DeviceMatrix, Strategy, TensorLayout};

use crate::context::SearchMode;
use crate::context::{DatasetStrategy, FusionMode, ParallelContext, ParallelMode};
use crate::error::{DatasetProblem, HybridProblem, ParallelError, Result, TransferProblem};
use crate::optimizer_shard::{self, OptDecision};
use crate::plan::{BucketPlan, GradientPlan, InOpSync, NodePlan, ParallelPlan, ParamPlan, Redistribution, Site, StrategySource};
use crate::search::{DeviceProfile, Search, SearchRow};

/// Default AllReduce fusion threshold (MindSpore's `comm_fusion` auto mode): 64 MB.
pub const DEFAULT_FUSION_BYTES: usize = 64 << 20;

/// Operator strategies read from a file: a strategy checkpoint's items `"<Prim>_<param>"`,
/// each applying to every op of that kind taking that parameter, or an operator strategy file
/// (`op_strategy_config`) naming every operator.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategyItems {
    /// The strategy file they were read from.
    pub path: PathBuf,
    /// Each item's name (`"<Prim>_<param>"`, or an operator's name) with its strategy, in file order.
    pub items: Vec<(String, Strategy)>,
    /// The items name operators, and every operator must have one (an operator strategy file).
    pub by_operator: bool,
}

/// What to plan.
#[derive(Clone, Copy, Debug)]
pub struct PlanRequest<'a> {
    /// The network: a forward graph.
    pub graph: &'a Graph,
    /// The loss of a training job (None: a forward-only plan, an inference job; recursive_programming
    /// then takes MindSpore's inference rules and runs the inputs whole); one of several elements
    /// trains their sum.
    pub loss: Option<NodeId>,
    /// The parallel options to plan under.
    pub context: &'a ParallelContext,
    /// Strategies of a strategy file (semi_auto_parallel, auto_parallel), applied before the
    /// model's own.
    pub strategy_file: Option<&'a StrategyItems>,
    /// The device profile of auto_parallel's cost model (None: the built-in one).
    pub profile: Option<&'a DeviceProfile>,
}

/// Plan `graph` (a forward graph) under `ctx`, forward only: an inference job (see
/// [`PlanRequest::loss`]).
pub fn plan(graph: &Graph, ctx: &ParallelContext) -> Result<ParallelPlan> {
    plan_job(&PlanRequest { graph, loss: None, context: ctx, strategy_file: None, profile: None })
}

/// Plan a job: every mode but hybrid_parallel (see [`plan_hybrid`]).
pub fn plan_job(req: &PlanRequest<'_>) -> Result<ParallelPlan> {
    let started = std::time::Instant::now();
    let plan = plan_job_with(req, Search::Mode(req.context.search_mode))?;
    tracing::info!(
        mode = plan.mode.name(),
        devices = plan.device_num,
        ops = plan.nodes.len(),
        redistributions = plan.redistributions.len(),
        parameters = plan.params.len(),
        search = ?plan.search.as_ref().map(|_| req.context.search_mode),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "planned"
    );
    Ok(plan)
}

/// auto_parallel's plan of a job under each search side by side: recursive_programming,
/// sharding_propagation, dynamic_programming, pure data parallel and the exact optimum of the
/// cost model, each with the seconds it took to plan, or why it could not plan (a search that
/// fails does not hide the others).
pub fn compare_searches(req: &PlanRequest<'_>) -> Result<Vec<SearchRow>> {
    let mut ctx = req.context.clone();
    if ctx.parallel_mode != ParallelMode::AutoParallel {
        ctx.set("parallel_mode", &serde_json::json!("auto_parallel"))?;
    }
    let req = PlanRequest { context: &ctx, ..*req };
    let searches = [
        Search::Mode(SearchMode::RecursiveProgramming),
        Search::Mode(SearchMode::ShardingPropagation),
        Search::Mode(SearchMode::DynamicProgramming),
        Search::DataParallel,
        Search::Exact,
    ];
    Ok(searches
        .into_iter()
        .map(|s| {
            let started = std::time::Instant::now();
            let row = plan_job_with(&req, s).map(|plan| {
                let seconds = started.elapsed().as_secs_f64();
                (plan.search.expect("an auto_parallel plan has a search report"), seconds)
            });
            (s, row)
        })
        .collect())
}

/// [`plan_job`] with auto_parallel's search chosen here.
fn plan_job_with(req: &PlanRequest<'_>, search: Search) -> Result<ParallelPlan> {
    let ctx = req.context;
    ctx.validate()?;
    ctx.check_supported()?;
    let mode = ctx.parallel_mode;
    if mode == ParallelMode::HybridParallel {
        return Err(ParallelError::Hybrid { problem: HybridProblem::NeedsRankGraphs });
    }
    if ctx.pipeline_stages > 1 {
        return Err(ParallelError::Pipeline { problem: crate::error::PipelineProblem::NeedsPipelinePlanner });
    }
    // The planner reads no file: a LOAD context comes with the operator strategies read from it.
    if let Some(path) = ctx.op_strategy_load_file() {
        if !req.strategy_file.is_some_and(|f| f.by_operator) {
            return Err(ParallelError::OperatorStrategiesNotGiven { path: path.into() });
        }
    }
    let n = ctx.devices();
    // Refused before anything else (an indivisible batch, say) is found wrong.
    if mode == ParallelMode::AutoParallel && search == Search::Mode(SearchMode::RecursiveProgramming) && !n.is_power_of_two() {
        return Err(ParallelError::SearchDevices { search: "recursive_programming", devices: n });
    }
    let graph = with_loss_first(req.graph, req.loss)?;
    let use_strategies = mode.is_auto();
    let nodes = graph.nodes();
    let flat = DeviceMatrix::flat(n).map_err(|e| ParallelError::Layout { node: "device matrix".into(), source: e })?;
    let types = |node: &Node| -> Vec<&TensorType> { node.inputs.iter().map(|x| &graph.node(*x).ty).collect() };
    let from_file = match (req.strategy_file, use_strategies) {
        (Some(file), true) => file_strategies(&graph, file)?,
        _ => vec![None; nodes.len()],
    };
    let on_data = depends_on_inputs(&graph);
    let rules: Vec<ShardingRule> = nodes
        .iter()
        .map(|node| {
            let ins = types(node);
            match node.op.def().sharding(&autopar_graph::RuleCx { inputs: &ins, output: &node.ty }) {
                // On one device nothing is split: backward ops and communication among rank 0
                // alone (the identity) run whole; a group naming other ranks stays an error.
                ShardingRule::Unsupported(_) if n == 1 && on_rank0_alone(node, &ins) => ShardingRule::Replicated,
                rule => rule,
            }
        })
        .collect();
    // An operator strategy file names operators that take a strategy, nothing else.
    if let Some(file) = req.strategy_file.filter(|f| f.by_operator && use_strategies) {
        if let Some(i) = (0..nodes.len()).find(|&i| from_file[i].is_some() && !matches!(rules[i], ShardingRule::Spec(_))) {
            return Err(ParallelError::UnknownOperator { file: file.path.clone(), op: nodes[i].name.clone() });
        }
    }
    // recursive_programming on an inference graph runs the network's inputs whole: MindSpore's
    // `AjustToNoTraining` sets the dataset's strategy back to nothing split once the ops have
    // theirs (the search itself sees the batch split, as MindSpore's does); in a pipeline the
    // first stage's ranks then each read whole micro-batches. A dataset strategy the user chose
    // is kept.
    let whole_inputs = mode == ParallelMode::AutoParallel
        && search == Search::Mode(SearchMode::RecursiveProgramming)
        && req.loss.is_none()
        && !ctx.is_set("dataset_strategy");
    let mut input_layouts: Vec<Option<TensorLayout>> = vec![None; nodes.len()];
    let mut input_index = 0usize;
    for (i, node) in nodes.iter().enumerate() {
        if let OpKind::Input(_) = &node.op {
            input_layouts[i] = Some(match input_layout(node, &ctx.dataset_strategy, input_index, n, &flat, mode) {
                Err(ParallelError::BatchNotDivisible { .. }) if whole_inputs => {
                    TensorLayout::replicated(flat.clone(), node.ty.shape.clone())
                }
                layout => layout?,
            });
            input_index += 1;
        }
    }
    if let DatasetStrategy::Explicit(all) = &ctx.dataset_strategy {
        if all.len() > input_index && n > 1 {
            return Err(ParallelError::DatasetStrategy { problem: DatasetProblem::ExtraLists { given: all.len(), inputs: input_index } });
        }
    }
    // The strategies fixed by a strategy file or the model's `.shard()`.
    let mut fixed: Vec<Option<(Vec<usize>, StrategySource)>> = vec![None; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        if let ShardingRule::Spec(spec) = &rules[i] {
            let kind = node.op.kind();
            if let (Some(file), None) = (req.strategy_file.filter(|f| f.by_operator && use_strategies), &from_file[i]) {
                return Err(ParallelError::MissingOperator { file: file.path.clone(), op: node.name.clone(), kind });
            }
            fixed[i] = match (&from_file[i], &node.strategy) {
                (Some(s), _) => {
                    let splits = spec.splits_from_strategy(kind, &node.name, s).map_err(|e| in_strategy_file(req, e.into()))?;
                    Some((splits, StrategySource::StrategyFile))
                }
                (None, Some(s)) if use_strategies => Some((spec.splits_from_strategy(kind, &node.name, s)?, StrategySource::User)),
                _ => None,
            };
        }
    }
    // auto_parallel: the search decides the rest.
    let mut search_report = None;
    if mode == ParallelMode::AutoParallel {
        // Pure data parallel, the baseline `--compare` prints: every op at its default, the
        // strategies of a file or of `.shard()` too.
        if search == Search::DataParallel {
            for (i, node) in nodes.iter().enumerate() {
                if let ShardingRule::Spec(spec) = &rules[i] {
                    fixed[i] = Some((default_splits(spec, node, &on_data, n), StrategySource::Default));
                }
            }
        }
        let builtin = DeviceProfile::builtin();
        let profile = req.profile.unwrap_or(&builtin);
        let report = crate::search::search_plan(&crate::search::SearchJob {
            graph: &graph,
            rules: &rules,
            context: ctx,
            profile,
            training: req.loss.is_some(),
            fixed: &fixed,
            input_layouts: &input_layouts,
            search,
        })?;
        for op in &report.ops {
            fixed[op.node.0] = Some((op.splits.clone(), op.source));
        }
        search_report = Some(report);
        if whole_inputs {
            for (i, node) in nodes.iter().enumerate() {
                if input_layouts[i].is_some() {
                    input_layouts[i] = Some(TensorLayout::replicated(flat.clone(), node.ty.shape.clone()));
                }
            }
        }
    }

    // Pass 1: every op with a rule gets its strategy and layouts.
    let mut plans: Vec<Option<NodePlan>> = vec![None; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let ins = types(node);
        let kind = node.op.kind();
        let plan = match &rules[i] {
            ShardingRule::Spec(spec) => {
                let (splits, source) = match &fixed[i] {
                    Some((s, source)) => (s.clone(), *source),
                    None => (default_splits(spec, node, &on_data, n), StrategySource::Default),
                };
                let l = spec.layouts(kind, &node.name, &ins, &node.ty, &splits, n).map_err(|e| match source {
                    StrategySource::StrategyFile => in_strategy_file(req, e.into()),
                    _ => e.into(),
                })?;
                let sync = match &spec.tie {
                    Tie::None => InOpSync::None,
                    Tie::Stats(dims) => {
                        let axes: Vec<DeviceAxis> = dims.iter().filter_map(|&d| l.logical_axes[d]).map(|a| l.mesh.axis(a)).collect();
                        if axes.is_empty() {
                            InOpSync::None
                        } else {
                            InOpSync::Stats(axes)
                        }
                    }
                    Tie::Block if l.inputs[0].splits().iter().any(|&s| s > 1) => InOpSync::Block,
                    Tie::Block => InOpSync::None,
                    Tie::Rows { input, dim } if l.inputs[*input].split(*dim) > 1 => InOpSync::Rows { input: *input, dim: *dim },
                    Tie::Rows { .. } => InOpSync::None,
                };
                NodePlan {
                    id: NodeId(i),
                    name: node.name.clone(),
                    kind,
                    strategy: Some(l.strategy),
                    source: Some(source),
                    inputs: l.inputs,
                    output: l.output,
                    output_scale: l.output_scale,
                    sync,
                }
            }
            ShardingRule::Replicated if node.op.is_leaf() => continue,
            ShardingRule::Replicated => {
                let given = from_file[i].as_ref().or(node.strategy.as_ref().filter(|_| use_strategies));
                if let Some(s) = given.filter(|s| s.0.iter().flatten().any(|&x| x > 1)) {
                    let e = autopar_graph::GraphError::InvalidStrategy {
                        kind,
                        name: node.name.clone(),
                        strategy: s.to_string(),
                        problem: StrategyProblem::NoShardedForm,
                    }
                    .into();
                    return Err(if from_file[i].is_some() { in_strategy_file(req, e) } else { e });
                }
                replicated_plan(&graph, NodeId(i), &flat)
            }
            ShardingRule::FollowInput => continue,
            ShardingRule::Unsupported(why) => return Err(ParallelError::UnsupportedOp { kind, name: node.name.clone(), why }),
        };
        plans[i] = Some(plan);
    }

    // Pass 2: leaves. Parameters take the layout their first consumer needs; inputs the
    // dataset strategy's.
    for (i, node) in nodes.iter().enumerate() {
        let layout = if let OpKind::Parameter(_) = &node.op {
            first_use_layout(&graph, &plans, NodeId(i)).unwrap_or_else(|| TensorLayout::replicated(flat.clone(), node.ty.shape.clone()))
        } else if let Some(l) = &input_layouts[i] {
            l.clone()
        } else {
            continue;
        };
        plans[i] = Some(unsplit_plan(node, NodeId(i), Vec::new(), layout));
    }

    // Pass 3: ops whose layout follows their input, in order.
    for (i, node) in nodes.iter().enumerate() {
        if plans[i].is_some() {
            continue;
        }
        let src = whole_values(&plans[node.inputs[0].0].as_ref().expect("inputs are planned before their users").output);
        let (input, output) = match reshape_layout(&src, &node.ty.shape) {
            Some(out) => (src, out),
            None => (
                TensorLayout::replicated(flat.clone(), src.shape().to_vec()),
                TensorLayout::replicated(flat.clone(), node.ty.shape.clone()),
            ),
        };
        plans[i] = Some(unsplit_plan(node, NodeId(i), vec![input], output));
    }
    let nodes_plan: Vec<NodePlan> = plans.into_iter().map(|p| p.expect("every node is planned")).collect();

    // Redistributions: before every input whose producer's layout is not the one the op needs,
    // and before the outputs gathered whole (below).
    let all_to_all = ctx.enable_alltoall;
    let fp32 = ctx.force_fp32_communication;
    let mut redistributions = Vec::new();
    let mut add = |site: Site, producer: NodeId, src: &TensorLayout, dst: &TensorLayout, node: &str| -> Result<()> {
        if src == dst {
            return Ok(());
        }
        let mut p = plan_with(src, dst, false).map_err(|e| ParallelError::Layout { node: node.to_string(), source: e })?;
        // The same slices on every rank, written over another device matrix (a reshape's).
        if p.is_empty() {
            return Ok(());
        }
        if !all_to_all {
            p = p.without_all_to_all().map_err(|e| ParallelError::Layout { node: node.to_string(), source: e })?;
        }
        let dtype = graph.node(producer).ty.dtype;
        redistributions.push(Redistribution {
            site,
            producer,
            dtype,
            in_f32: fp32 && dtype.is_half() && p.num_communications() > 0,
            plan: p,
        });
        Ok(())
    };
    for (i, node) in nodes.iter().enumerate() {
        if node.op.is_leaf() {
            continue;
        }
        for (slot, x) in node.inputs.iter().enumerate() {
            add(Site::Input { consumer: NodeId(i), slot }, *x, &nodes_plan[x.0].output, &nodes_plan[i].inputs[slot], &node.name)?;
        }
    }
    // Outputs are gathered whole; a training job gathers only its loss (the step fetches the
    // loss and the gradients, nothing else).
    let gathered = if req.loss.is_some() { 1 } else { graph.outputs.len() };
    for (slot, &o) in graph.outputs.iter().enumerate().take(gathered) {
        let src = &nodes_plan[o.0].output;
        let full = TensorLayout::replicated(src.mesh().clone(), src.shape().to_vec());
        add(Site::Output { slot }, o, src, &full, &graph.node(o).name)?;
    }

    let params: Vec<ParamPlan> = graph
        .parameters()
        .into_iter()
        .filter_map(|id| {
            let node = graph.node(id);
            let OpKind::Parameter(p) = &node.op else { return None };
            let layout = nodes_plan[id.0].output.clone();
            let mirror: Vec<DeviceAxis> = layout.replica_axes().iter().map(|&a| layout.mesh().axis(a)).collect();
            let bytes = layout.shape().iter().product::<usize>() * p.dtype.size();
            let opt = optimizer_shard::decide(&layout.slice_shape(), bytes, &mirror, p.trainable && req.loss.is_some(), ctx);
            Some(ParamPlan { name: node.name.clone(), node: id, layout, dtype: p.dtype, trainable: p.trainable, mirror, opt })
        })
        .collect();
    let loss_seed = match mode {
        ParallelMode::SemiAutoParallel | ParallelMode::AutoParallel if ctx.loss_repeated_mean => 1.0 / n as f64,
        ParallelMode::DataParallel if ctx.gradients_mean => 1.0 / n as f64,
        _ => 1.0,
    };
    let gradients = GradientPlan {
        loss_seed,
        mirror_mean: mode.is_auto() && ctx.gradients_mean,
        buckets: fusion_buckets(&params, ctx),
        reduce_scatter: optimizer_shard::shard_buckets(&params, ctx, false, |d| gradient_comm_dtype(d, ctx)),
        all_gather: optimizer_shard::shard_buckets(&params, ctx, true, |d| d),
    };
    Ok(ParallelPlan {
        device_num: n,
        mode,
        context: ctx.clone(),
        loss: req.loss.map(|_| graph.outputs[0]),
        graph,
        rank_graphs: Vec::new(),
        nodes: nodes_plan,
        redistributions,
        params,
        gradients,
        dataset: if whole_inputs { DatasetStrategy::FullBatch } else { ctx.dataset_strategy.clone() },
        strategy_file: req.strategy_file.filter(|_| use_strategies).map(|f| f.path.clone()),
        all_to_all,
        collective_groups: Vec::new(),
        search: search_report,
    })
}

/// Whether `node` communicates with no rank but 0 (so that on one device it is the identity).
fn on_rank0_alone(node: &Node, ins: &[&TensorType]) -> bool {
    let ins: Vec<TensorType> = ins.iter().map(|t| (*t).clone()).collect();
    let cost = node.op.def().cost(&CostCx { inputs: &ins, output: &node.ty, rank: 0 });
    cost.comm.iter().all(|call| call.group.iter().all(|&m| m == 0))
}

/// The graph with `loss` (checked to be floating-point) as its first output. A loss of several
/// elements trains their sum (the backward starts from ones, like MindSpore's sens).
fn with_loss_first(graph: &Graph, loss: Option<NodeId>) -> Result<Graph> {
    let mut graph = graph.clone();
    if let Some(loss) = loss {
        graph.check_id(loss)?;
        let node = graph.node(loss);
        if !node.ty.dtype.is_float() {
            return Err(ParallelError::LossNotFloat { name: node.name.clone(), dtype: node.ty.dtype });
        }
        if graph.outputs.first() != Some(&loss) {
            graph.outputs.retain(|o| *o != loss);
            graph.outputs.insert(0, loss);
        }
    }
    Ok(graph)
}

/// The plan of an op no strategy splits (a leaf, an op following its input, an op run whole),
/// with the layouts it takes and gives.
fn unsplit_plan(node: &Node, id: NodeId, inputs: Vec<TensorLayout>, output: TensorLayout) -> NodePlan {
    NodePlan {
        id,
        name: node.name.clone(),
        kind: node.op.kind(),
        strategy: None,
        source: None,
        inputs,
        output,
        output_scale: None,
        sync: InOpSync::None,
    }
}

/// The plan of op `id` of `graph` run whole on every device of `flat`.
fn replicated_plan(graph: &Graph, id: NodeId, flat: &DeviceMatrix) -> NodePlan {
    let node = graph.node(id);
    let inputs = node.inputs.iter().map(|x| TensorLayout::replicated(flat.clone(), graph.node(*x).ty.shape.clone())).collect();
    unsplit_plan(node, id, inputs, TensorLayout::replicated(flat.clone(), node.ty.shape.clone()))
}

/// The names a strategy file may give op `id`: `"<Prim>_<param>"` for each parameter it takes
/// (MindSpore keys items by operator; autopar by the weight, which names the op across graphs).
/// Written under the first; read under any. Empty for an op taking no parameter.
pub fn strategy_item_names(graph: &Graph, id: NodeId) -> Vec<String> {
    let node = graph.node(id);
    node.inputs
        .iter()
        .map(|x| graph.node(*x))
        .filter(|x| matches!(x.op, OpKind::Parameter(_)))
        .map(|p| format!("{}_{}", node.op.kind(), p.name))
        .collect()
}

/// For each node, the strategy a strategy file gives it: item `"<Prim>_<param>"` applies to
/// every op of that kind taking that parameter; an operator strategy file's item to the node
/// of that name. An item matching no node is an error naming it.
fn file_strategies(graph: &Graph, file: &StrategyItems) -> Result<Vec<Option<Strategy>>> {
    let mut out = vec![None; graph.len()];
    if file.by_operator {
        let by_name: HashMap<&str, usize> = graph.nodes().iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        for (op, strategy) in &file.items {
            let i = by_name.get(op.as_str()).ok_or_else(|| ParallelError::UnknownOperator { file: file.path.clone(), op: op.clone() })?;
            out[*i] = Some(strategy.clone());
        }
        return Ok(out);
    }
    for (key, strategy) in &file.items {
        let mut hit = false;
        for (i, slot) in out.iter_mut().enumerate() {
            if strategy_item_names(graph, NodeId(i)).contains(key) {
                *slot = Some(strategy.clone());
                hit = true;
            }
        }
        if !hit {
            return Err(ParallelError::UnknownStrategyItem { file: file.path.clone(), item: key.clone() });
        }
    }
    Ok(out)
}

/// `e`, about a strategy the request's strategy file gave, as an error naming the file.
fn in_strategy_file(req: &PlanRequest<'_>, e: ParallelError) -> ParallelError {
    match req.strategy_file {
        Some(f) => ParallelError::InStrategyFile { file: f.path.clone(), source: Box::new(e) },
        None => e,
    }
}

/// Whether each node's value depends on a network input (nodes are in topological order).
pub(crate) fn depends_on_inputs(graph: &Graph) -> Vec<bool> {
    let mut on_data = vec![false; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        on_data[i] = matches!(node.op, OpKind::Input(_)) || node.inputs.iter().any(|x| on_data[x.0]);
    }
    on_data
}

/// MindSpore's default strategy for an unannotated op: data parallel. The batch is the first
/// dimension of the op's first input computed from the network's inputs (the data); the
/// logical dimension it runs along is split over as many of the `n` devices as divide it.
/// Ops on parameters alone are not split. A split reduced dimension (a loss's mean over the
/// batch) leaves a partial sum, completed by an all-reduce.
pub fn default_splits(spec: &autopar_graph::OpSpec, node: &Node, on_data: &[bool], n: usize) -> Vec<usize> {
    let mut splits = vec![1; spec.dims.len()];
    if let Some(l) = batch_dim(spec, node, on_data) {
        let dim = &spec.dims[l];
        if dim.splittable {
            splits[l] = gcd(n, dim.size);
        }
    }
    splits
}

/// The logical dimension an op's batch runs along: the first dimension of its first input
/// computed from the network's inputs (None: an op on parameters alone).
pub(crate) fn batch_dim(spec: &autopar_graph::OpSpec, node: &Node, on_data: &[bool]) -> Option<usize> {
    let i = node.inputs.iter().position(|x| on_data[x.0])?;
    spec.inputs[i].first().copied().flatten()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn first_use_layout(graph: &Graph, plans: &[Option<NodePlan>], id: NodeId) -> Option<TensorLayout> {
    let (j, slot) = first_use(graph, id)?;
    plans[j.0].as_ref().map(|p| p.inputs[slot].clone())
}

/// The first op reading value `id` and the input slot it reads it in: a parameter takes the
/// layout this use needs.
pub(crate) fn first_use(graph: &Graph, id: NodeId) -> Option<(NodeId, usize)> {
    graph
        .nodes()
        .iter()
        .enumerate()
        .skip(id.0 + 1)
        .find_map(|(j, node)| node.inputs.iter().position(|x| *x == id).map(|slot| (NodeId(j), slot)))
}

/// `l` without pending partial sums: the layout of the values once they are completed.
pub(crate) fn whole_values(l: &TensorLayout) -> TensorLayout {
    TensorLayout::new(l.mesh().clone(), l.dim_axes().to_vec(), l.shape().to_vec()).expect("dropping partial sums keeps a layout valid")
}

fn input_layout(
    node: &Node,
    ds: &DatasetStrategy,
    index: usize,
    n: usize,
    flat: &DeviceMatrix,
    mode: ParallelMode,
) -> Result<TensorLayout> {
    let shape = node.ty.shape.clone();
    let layout_err = |e| ParallelError::Layout { node: node.name.clone(), source: e };
    match ds {
        _ if n == 1 => Ok(TensorLayout::replicated(flat.clone(), shape)),
        DatasetStrategy::FullBatch => Ok(TensorLayout::replicated(flat.clone(), shape)),
        DatasetStrategy::DataParallel => {
            if shape.is_empty() || !shape[0].is_multiple_of(n) {
                return Err(ParallelError::BatchNotDivisible { input: node.name.clone(), shape, devices: n, mode: mode.name() });
            }
            let mut map = vec![Vec::new(); shape.len()];
            map[0].push(0);
            TensorLayout::new(flat.clone(), map, shape).map_err(layout_err)
        }
        DatasetStrategy::Explicit(all) => {
            let problem = |p| ParallelError::DatasetStrategy { problem: p };
            let splits = all
                .get(index)
                .ok_or_else(|| problem(DatasetProblem::MissingInput { input: node.name.clone(), index, given: all.len() }))?;
            if splits.len() != shape.len() {
                return Err(problem(DatasetProblem::Rank { input: node.name.clone(), shape, splits: splits.clone() }));
            }
            let product: usize = splits.iter().product();
            if product == 0 || !n.is_multiple_of(product) {
                return Err(problem(DatasetProblem::Devices {
                    input: node.name.clone(),
                    splits: splits.clone(),
                    used: product,
                    devices: n,
                }));
            }
            if shape.iter().zip(splits).any(|(d, s)| !d.is_multiple_of(*s)) {
                return Err(problem(DatasetProblem::NotDivisible { input: node.name.clone(), shape, splits: splits.clone() }));
            }
            let (mesh, axes) = DeviceMatrix::of_splits(splits, n).map_err(layout_err)?;
            let map = axes.into_iter().map(|a| a.into_iter().collect()).collect();
            TensorLayout::new(mesh, map, shape).map_err(layout_err)
        }
    }
}

/// The layout of a reshape's output when its input has layout `src`, such that every rank's
/// slice, reshaped, is its slice of the output (no communication). The dimensions pair up in
/// groups whose sizes multiply to the same number. Within a group the input's split must cut
/// the flattened group into contiguous blocks (every dimension before a split one split
/// whole), and the output group takes the same blocks: its leading dimensions split whole,
/// the next one by what is left. A device axis that straddles two output dimensions is
/// factored into two axes (MindSpore's device-matrix expansion): a 16-way split of
/// `[B * T, H]` with `B = 8` becomes 8 ways over `B` and 2 over `T` of `[B, T, heads, d]`.
/// `None` when the split cannot follow the reshape (the planner then gathers around it).
pub fn reshape_layout(src: &TensorLayout, out: &[usize]) -> Option<TensorLayout> {
    let inp = src.shape();
    let mesh = src.mesh().dims();
    // Axes of one device split nothing: left out (they stay in the matrix, mapping nothing).
    let axes: Vec<Vec<usize>> = src.dim_axes().iter().map(|d| d.iter().copied().filter(|&a| mesh[a] > 1).collect()).collect();
    // The sizes each source axis is factored into (major first; empty: kept whole), and each
    // output dimension's axes as (source axis, piece).
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); mesh.len()];
    let mut assigned: Vec<Vec<(usize, usize)>> = vec![Vec::new(); out.len()];
    let (mut i, mut o) = (0usize, 0usize);
    while i < inp.len() || o < out.len() {
        // Skip size-1 dims (they are never split).
        if i < inp.len() && inp[i] == 1 && axes[i].is_empty() {
            i += 1;
            continue;
        }
        if o < out.len() && out[o] == 1 {
            o += 1;
            continue;
        }
        if i >= inp.len() || o >= out.len() {
            return None;
        }
        // Grow the smallest groups [gi, i) and [go, o) with equal products.
        let (gi, go) = (i, o);
        let (mut pi, mut po) = (inp[i], out[o]);
        i += 1;
        o += 1;
        while pi != po {
            if pi < po {
                if i >= inp.len() {
                    return None;
                }
                pi *= inp[i];
                i += 1;
            } else {
                if o >= out.len() {
                    return None;
                }
                po *= out[o];
                o += 1;
            }
        }
        // The input group's blocks, as (axis, size not yet handed out), major first.
        let mut blocks: VecDeque<(usize, usize)> = VecDeque::new();
        let mut whole = true;
        for d in gi..i {
            if axes[d].is_empty() {
                whole &= inp[d] == 1;
                continue;
            }
            if !whole {
                return None;
            }
            blocks.extend(axes[d].iter().map(|&a| (a, mesh[a])));
            whole = src.split(d) == inp[d];
        }
        // Hand them to the output dimensions, major first.
        for d in go..o {
            let left: usize = blocks.iter().map(|b| b.1).product();
            if left == 1 {
                break;
            }
            let mut need = if out[d].is_multiple_of(left) {
                left
            } else if left.is_multiple_of(out[d]) {
                out[d]
            } else {
                return None;
            };
            while need > 1 {
                let (a, size) = blocks.front_mut().expect("the blocks hold `left`");
                let take = if need.is_multiple_of(*size) {
                    *size
                } else if size.is_multiple_of(need) {
                    need
                } else {
                    return None;
                };
                pieces[*a].push(take);
                assigned[d].push((*a, pieces[*a].len() - 1));
                need /= take;
                *size /= take;
                if *size == 1 {
                    blocks.pop_front();
                }
            }
        }
        if !blocks.is_empty() {
            return None;
        }
    }
    // The output's device matrix: each factored axis replaced by its pieces.
    let mut dims = Vec::with_capacity(mesh.len());
    let mut first = Vec::with_capacity(mesh.len());
    for (a, &size) in mesh.iter().enumerate() {
        first.push(dims.len());
        match pieces[a].as_slice() {
            [] => dims.push(size),
            p => dims.extend(p),
        }
    }
    let all = |a: usize| first[a]..first[a] + pieces[a].len().max(1);
    let map = assigned.iter().map(|d| d.iter().map(|&(a, k)| first[a] + k).collect()).collect();
    let partial = src.partial_axes().iter().flat_map(|&a| all(a)).collect();
    let mesh = DeviceMatrix::new(dims).ok()?;
    TensorLayout::new(mesh, map, out.to_vec()).ok()?.with_partial(partial).ok()
}

/// The dtype a gradient of `dtype` is all-reduced in: f16/bf16 gradients in f32 when
/// `force_fp32_communication` is on, or under the auto modes with `gradient_fp32_sync` (the
/// default); otherwise their own.
fn gradient_comm_dtype(dtype: autopar_graph::DType, ctx: &ParallelContext) -> autopar_graph::DType {
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

/// Plan hybrid_parallel: every rank runs its own hand-written graph (local shapes, the
/// collectives the user placed, world-rank groups; nothing is inserted). Parameters named in
/// `layerwise` are each rank's own (MindSpore's `layerwise_parallel`); every other parameter is
/// replicated (the same name, shape, dtype and trainability on every rank) and its gradient
/// all-reduced over all ranks. Checked: one graph per rank, the loss in each, every
/// collective's group holding its rank, every Send met by a Receive of the same tag, shape and
/// dtype on its peer (and the reverse), replicated parameters alike on every rank.
pub fn plan_hybrid(graphs: Vec<Graph>, loss_name: &str, ctx: &ParallelContext, layerwise: &BTreeSet<String>) -> Result<ParallelPlan> {
    ctx.validate()?;
    ctx.check_supported()?;
    let hybrid = |problem| Err(ParallelError::Hybrid { problem });
    if ctx.parallel_mode != ParallelMode::HybridParallel {
        return hybrid(HybridProblem::WrongMode { mode: ctx.parallel_mode });
    }
    let n = ctx.device_num;
    if graphs.len() != n {
        return hybrid(HybridProblem::GraphCount { graphs: graphs.len(), devices: n });
    }
    let mut rank_graphs = Vec::with_capacity(n);
    let mut groups: BTreeSet<Vec<usize>> = BTreeSet::new();
    // (sender, receiver, tag) -> (the node on that side, its type).
    let mut sends: BTreeMap<(usize, usize, u32), (String, TensorType)> = BTreeMap::new();
    let mut recvs: BTreeMap<(usize, usize, u32), (String, TensorType)> = BTreeMap::new();
    let mut sequences = CallSequences::new();
    for (r, g) in graphs.into_iter().enumerate() {
        let Ok(loss) = g.find(loss_name) else {
            return hybrid(HybridProblem::MissingLoss { rank: r, loss: loss_name.to_string() });
        };
        for name in layerwise {
            if g.find(name).map(|id| !matches!(g.node(id).op, OpKind::Parameter(_))).unwrap_or(true) {
                return hybrid(HybridProblem::NotAParameter { rank: r, name: name.clone() });
            }
        }
        let (trained, to_loss) = dependencies(&g, loss);
        for (i, node) in g.nodes().iter().enumerate() {
            let ins: Vec<TensorType> = node.inputs.iter().map(|x| g.node(*x).ty.clone()).collect();
            let calls = node.op.def().cost(&CostCx { inputs: &ins, output: &node.ty, rank: r }).comm;
            if calls.is_empty() {
                continue;
            }
            let (kind, name) = (node.op.kind(), node.name.clone());
            for call in calls {
                if !call.group.contains(&r) || call.group.iter().any(|&m| m >= n) {
                    return hybrid(HybridProblem::BadGroup { rank: r, kind, name, group: call.group });
                }
                if !matches!(node.op, OpKind::Send(_) | OpKind::Recv(_)) {
                    sequences.entry(call.group.clone()).or_default().entry(r).or_default().push((kind, trained[i]));
                }
                groups.insert(call.group);
            }
            // The step computes what the loss needs: communication off that path would be
            // skipped here while the peers wait for it.
            if !to_loss[i] {
                return hybrid(HybridProblem::OffLossPath { rank: r, kind, name });
            }
            let mut transfer = None;
            if let OpKind::Send(s) = &node.op {
                transfer = Some(((r, s.peer, s.tag), &mut sends));
            }
            if let OpKind::Recv(s) = &node.op {
                transfer = Some(((s.peer, r, s.tag), &mut recvs));
            }
            if let Some((key, side)) = transfer {
                let (from, to, tag) = key;
                let fail = |problem| hybrid(HybridProblem::Transfer { rank: r, name: name.clone(), from, to, tag, problem });
                if from == to {
                    return fail(TransferProblem::ToItself);
                }
                // Gradients do not cross hand-written transfers: what is sent (or the
                // Receive's template) must not depend on a trainable parameter.
                if trained[node.inputs[0].0] {
                    return fail(TransferProblem::NeedsGradient);
                }
                if side.insert(key, (name.clone(), node.ty.clone())).is_some() {
                    return fail(TransferProblem::Repeated);
                }
            }
        }
        rank_graphs.push(with_loss_first(&g, Some(loss))?);
    }
    check_transfers(&sends, &recvs)?;
    check_sequences(&sequences)?;
    let graph = rank_graphs[0].clone();
    let flat = DeviceMatrix::flat(n).map_err(|e| ParallelError::Layout { node: "device matrix".into(), source: e })?;
    let all = flat.axis(0);
    let mut params = Vec::new();
    for (r, g) in rank_graphs.iter().enumerate() {
        for id in g.parameters() {
            let node = g.node(id);
            let OpKind::Parameter(p) = &node.op else { continue };
            if layerwise.contains(&node.name) {
                if r == 0 {
                    params.push(hybrid_param(node, id, p, &flat, Vec::new()));
                }
                continue;
            }
            // A replicated parameter: rank 0 holds it and every rank's copy is alike.
            let Some(first) = find_parameter(&graph, &node.name) else {
                return hybrid(HybridProblem::MissingParameter { name: node.name.clone(), rank: r, missing_from: 0 });
            };
            if r == 0 {
                for (q, other) in rank_graphs.iter().enumerate().skip(1) {
                    if find_parameter(other, &node.name).is_none() {
                        return hybrid(HybridProblem::MissingParameter { name: node.name.clone(), rank: 0, missing_from: q });
                    }
                }
                params.push(hybrid_param(node, id, p, &flat, if n == 1 { Vec::new() } else { vec![all] }));
                continue;
            }
            let (rank0, p0) = first;
            let differs = |what: &'static str, here: String, there: String| {
                hybrid(HybridProblem::ParameterDiffers { name: node.name.clone(), rank: r, what, here, rank0: there })
            };
            if node.ty.shape != rank0.ty.shape {
                return differs("shape", format!("{:?}", node.ty.shape), format!("{:?}", rank0.ty.shape));
            }
            if p.dtype != p0.dtype {
                return differs("dtype", p.dtype.to_string(), p0.dtype.to_string());
            }
            if p.trainable != p0.trainable {
                return differs("trainable", p.trainable.to_string(), p0.trainable.to_string());
            }
        }
    }
    let nodes = (0..graph.len()).map(|i| replicated_plan(&graph, NodeId(i), &flat)).collect();
    let loss_seed = if ctx.gradients_mean { 1.0 / n as f64 } else { 1.0 };
    let gradients = GradientPlan {
        loss_seed,
        mirror_mean: false,
        buckets: fusion_buckets(&params, ctx),
        reduce_scatter: Vec::new(),
        all_gather: Vec::new(),
    };
    Ok(ParallelPlan {
        device_num: n,
        mode: ParallelMode::HybridParallel,
        context: ctx.clone(),
        loss: Some(graph.outputs[0]),
        graph,
        rank_graphs,
        nodes,
        redistributions: Vec::new(),
        params,
        gradients,
        dataset: DatasetStrategy::DataParallel,
        strategy_file: None,
        all_to_all: ctx.enable_alltoall,
        collective_groups: groups.into_iter().collect(),
        search: None,
    })
}

/// Parameter `name` of `g`, if `g` has a parameter of that name.
fn find_parameter<'g>(g: &'g Graph, name: &str) -> Option<(&'g Node, &'g autopar_graph::ops::Parameter)> {
    let node = g.node(g.find(name).ok()?);
    if let OpKind::Parameter(p) = &node.op {
        return Some((node, p));
    }
    None
}

fn hybrid_param(node: &Node, id: NodeId, p: &autopar_graph::ops::Parameter, flat: &DeviceMatrix, mirror: Vec<DeviceAxis>) -> ParamPlan {
    ParamPlan {
        name: node.name.clone(),
        node: id,
        layout: TensorLayout::replicated(flat.clone(), node.ty.shape.clone()),
        dtype: p.dtype,
        trainable: p.trainable,
        mirror,
        opt: OptDecision::Disabled,
    }
}

/// Per node of a rank graph: whether it depends on a trainable parameter (so the backward pass
/// reaches it; a received value depends on the peer's tensor, not on its template), and whether
/// it leads to `loss`.
fn dependencies(g: &Graph, loss: NodeId) -> (Vec<bool>, Vec<bool>) {
    let nodes = g.nodes();
    let mut trained = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let own = matches!(&node.op, OpKind::Parameter(p) if p.trainable);
        let through = !matches!(node.op, OpKind::Recv(_)) && node.inputs.iter().any(|x| trained[x.0]);
        trained[i] = node.ty.dtype.is_float() && (own || through);
    }
    let mut to_loss = vec![false; nodes.len()];
    to_loss[loss.0] = true;
    for i in (0..=loss.0).rev() {
        if to_loss[i] {
            for x in &nodes[i].inputs {
                to_loss[x.0] = true;
            }
        }
    }
    (trained, to_loss)
}

/// Group -> rank -> the collectives it calls over the group, in graph order (kind, whether the
/// backward pass calls one too).
type CallSequences = BTreeMap<Vec<usize>, BTreeMap<usize, Vec<(&'static str, bool)>>>;

/// Every rank of a group calls the same collectives over it in the same order, each with a
/// backward on all of them or on none (else one rank would wait for a call the others never make).
fn check_sequences(sequences: &CallSequences) -> Result<()> {
    let describe = |calls: Option<&Vec<(&'static str, bool)>>| -> Vec<String> {
        calls
            .into_iter()
            .flatten()
            .map(|&(kind, back)| if back { format!("{kind} (and its backward)") } else { kind.to_string() })
            .collect()
    };
    for (group, by_rank) in sequences {
        let first = group[0];
        for &r in &group[1..] {
            if by_rank.get(&r) != by_rank.get(&first) {
                return Err(ParallelError::Hybrid {
                    problem: HybridProblem::CollectivesDiffer {
                        group: group.clone(),
                        rank: r,
                        here: describe(by_rank.get(&r)),
                        first,
                        there: describe(by_rank.get(&first)),
                    },
                });
            }
        }
    }
    Ok(())
}

/// Every Send has its Receive on the peer (same tag, shape and dtype), and every Receive its Send.
fn check_transfers(
    sends: &BTreeMap<(usize, usize, u32), (String, TensorType)>,
    recvs: &BTreeMap<(usize, usize, u32), (String, TensorType)>,
) -> Result<()> {
    let fail = |rank, name: &str, (from, to, tag): (usize, usize, u32), problem| {
        Err(ParallelError::Hybrid { problem: HybridProblem::Transfer { rank, name: name.to_string(), from, to, tag, problem } })
    };
    for (&key, (name, ty)) in sends {
        match recvs.get(&key) {
            None => return fail(key.0, name, key, TransferProblem::NoReceive),
            Some((_, there)) if there != ty => {
                return fail(key.0, name, key, TransferProblem::TypeDiffers { send: ty.to_string(), receive: there.to_string() })
            }
            Some(_) => {}
        }
    }
    for (&key, (name, _)) in recvs {
        if !sends.contains_key(&key) {
            return fail(key.1, name, key, TransferProblem::NoSend);
        }
    }
    Ok(())
}
