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

mod buckets;
mod hybrid;
mod layouts;

use std::collections::HashMap;
use std::path::PathBuf;

use autopar_graph::{CostCx, Graph, Node, NodeId, OpKind, ShardingRule, StrategyProblem, TensorType, Tie};
use autopar_layout::{plan_with, DeviceAxis, DeviceMatrix, Strategy, TensorLayout};

use crate::analysis::{default_splits, depends_on_inputs, reshape_layout, whole_values};
use crate::context::{DatasetStrategy, ParallelContext, ParallelMode, SearchMode};
use crate::error::{DatasetProblem, HybridProblem, ParallelError, Result};
use crate::optimizer_shard;
use crate::plan::{GradientPlan, InOpSync, NodePlan, ParallelPlan, ParamPlan, Redistribution, Site, StrategySource};
use crate::search::{CostUnits, DeviceProfile, Search, SearchRow};
use buckets::gradient_comm_dtype;
pub use buckets::{fusion_buckets, DEFAULT_FUSION_BYTES};
pub use hybrid::plan_hybrid;
use layouts::{first_use_layout, input_layout, replicated_plan, unsplit_plan};

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
    /// The device profile of auto_parallel's cost model (None: the built-in one, and dynamic_programming optimises MindSpore's own cost model instead of seconds).
    pub profile: Option<&'a DeviceProfile>,
}

/// Plan `graph` (a forward graph) under `ctx`, forward only: an inference job (see
/// [`PlanRequest::loss`]).
pub fn plan(graph: &Graph, ctx: &ParallelContext) -> Result<ParallelPlan> {
    plan_network(&PlanRequest { graph, loss: None, context: ctx, strategy_file: None, profile: None })
}

/// Plan a job: every mode but hybrid_parallel (see [`plan_hybrid`]).
pub fn plan_network(req: &PlanRequest<'_>) -> Result<ParallelPlan> {
    let started = std::time::Instant::now();
    let plan = plan_network_with(req, Search::Mode(req.context.search_mode))?;
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
        // dynamic_programming under the other cost model too: seconds under the device
        // profile, or MindSpore's when a profile was given.
        Search::DynamicProgrammingIn(if req.profile.is_some() { CostUnits::MindSpore } else { CostUnits::Seconds }),
        Search::DataParallel,
        Search::Exact,
    ];
    Ok(searches
        .into_iter()
        .map(|s| {
            let started = std::time::Instant::now();
            let row = plan_network_with(&req, s).map(|plan| {
                let seconds = started.elapsed().as_secs_f64();
                (plan.search.expect("an auto_parallel plan has a search report"), seconds)
            });
            (s, row)
        })
        .collect())
}

/// What every phase of planning one network reads: the request, the graph (its loss first),
/// the devices, each op's sharding rule, the strategies a file gives, which values depend on
/// the data.
struct Network<'a> {
    req: &'a PlanRequest<'a>,
    ctx: &'a ParallelContext,
    graph: &'a Graph,
    n: usize,
    flat: DeviceMatrix,
    rules: Vec<ShardingRule>,
    from_file: Vec<Option<Strategy>>,
    on_data: Vec<bool>,
    /// Strategies (a file's, the model's `.shard()`) apply: semi_auto_parallel and auto_parallel.
    use_strategies: bool,
}

/// The strategy fixed for an op and where it came from.
type Fixed = Option<(Vec<usize>, StrategySource)>;

/// [`plan_network`] with auto_parallel's search chosen here.
fn plan_network_with(req: &PlanRequest<'_>, search: Search) -> Result<ParallelPlan> {
    let n = check_request(req, search)?;
    let ctx = req.context;
    let mode = ctx.parallel_mode;
    let graph = with_loss_first(req.graph, req.loss)?;
    let net = Network::new(req, &graph, n)?;
    // recursive_programming on an inference graph runs the network's inputs whole: MindSpore's
    // `AjustToNoTraining` sets the dataset's strategy back to nothing split once the ops have
    // theirs (the search itself sees the batch split, as MindSpore's does); in a pipeline the
    // first stage's ranks then each read whole micro-batches. A dataset strategy the user chose
    // is kept.
    let whole_inputs = mode == ParallelMode::AutoParallel
        && search == Search::Mode(SearchMode::RecursiveProgramming)
        && req.loss.is_none()
        && !ctx.is_set("dataset_strategy");
    let mut input_layouts = net.input_layouts(whole_inputs)?;
    let mut fixed = net.fixed_strategies()?;
    let search_report = if mode == ParallelMode::AutoParallel {
        let report = net.search(search, &mut fixed, &input_layouts)?;
        if whole_inputs {
            for (i, node) in graph.nodes().iter().enumerate() {
                if input_layouts[i].is_some() {
                    input_layouts[i] = Some(TensorLayout::replicated(net.flat.clone(), node.ty.shape.clone()));
                }
            }
        }
        Some(report)
    } else {
        None
    };
    let nodes_plan = net.node_plans(&fixed, &input_layouts)?;
    let redistributions = redistributions(&graph, &nodes_plan, ctx, req.loss.is_some())?;
    let params = param_plans(&graph, &nodes_plan, ctx, req.loss.is_some());
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
        rank_graphs: Vec::new(),
        nodes: nodes_plan,
        redistributions,
        params,
        gradients,
        dataset: if whole_inputs { DatasetStrategy::FullBatch } else { ctx.dataset_strategy.clone() },
        strategy_file: req.strategy_file.filter(|_| net.use_strategies).map(|f| f.path.clone()),
        all_to_all: ctx.enable_alltoall,
        collective_groups: Vec::new(),
        search: search_report,
        graph,
    })
}

/// The request checked as far as it can be before planning: the context valid and supported,
/// a mode and shape this planner plans, the operator strategies of a LOAD context given.
/// Returns the device count.
fn check_request(req: &PlanRequest<'_>, search: Search) -> Result<usize> {
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
    Ok(n)
}

impl<'a> Network<'a> {
    fn new(req: &'a PlanRequest<'a>, graph: &'a Graph, n: usize) -> Result<Self> {
        let ctx = req.context;
        let use_strategies = ctx.parallel_mode.is_auto();
        let nodes = graph.nodes();
        let flat = DeviceMatrix::flat(n).map_err(|e| ParallelError::Layout { node: "device matrix".into(), source: e })?;
        let from_file = match (req.strategy_file, use_strategies) {
            (Some(file), true) => file_strategies(graph, file)?,
            _ => vec![None; nodes.len()],
        };
        let rules: Vec<ShardingRule> = nodes
            .iter()
            .map(|node| {
                let ins = input_types(graph, node);
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
        let on_data = depends_on_inputs(graph);
        Ok(Self { req, ctx, graph, n, flat, rules, from_file, on_data, use_strategies })
    }

    /// The layout of every network input (the dataset strategy's); with `whole_inputs` an
    /// input the devices cannot split by its batch runs whole.
    fn input_layouts(&self, whole_inputs: bool) -> Result<Vec<Option<TensorLayout>>> {
        let (ctx, n) = (self.ctx, self.n);
        let mut layouts: Vec<Option<TensorLayout>> = vec![None; self.graph.len()];
        let mut input_index = 0usize;
        for (i, node) in self.graph.nodes().iter().enumerate() {
            if let OpKind::Input(_) = &node.op {
                layouts[i] = Some(match input_layout(node, &ctx.dataset_strategy, input_index, n, &self.flat, ctx.parallel_mode) {
                    Err(ParallelError::BatchNotDivisible { .. }) if whole_inputs => {
                        TensorLayout::replicated(self.flat.clone(), node.ty.shape.clone())
                    }
                    layout => layout?,
                });
                input_index += 1;
            }
        }
        if let DatasetStrategy::Explicit(all) = &ctx.dataset_strategy {
            if all.len() > input_index && n > 1 {
                return Err(ParallelError::DatasetStrategy {
                    problem: DatasetProblem::ExtraLists { given: all.len(), inputs: input_index },
                });
            }
        }
        Ok(layouts)
    }

    /// The strategies fixed by a strategy file or the model's `.shard()`.
    fn fixed_strategies(&self) -> Result<Vec<Fixed>> {
        let req = self.req;
        let mut fixed: Vec<Fixed> = vec![None; self.graph.len()];
        for (i, node) in self.graph.nodes().iter().enumerate() {
            if let ShardingRule::Spec(spec) = &self.rules[i] {
                let kind = node.op.kind();
                if let (Some(file), None) = (req.strategy_file.filter(|f| f.by_operator && self.use_strategies), &self.from_file[i]) {
                    return Err(ParallelError::MissingOperator { file: file.path.clone(), op: node.name.clone(), kind });
                }
                let splits =
                    |s: &Strategy| spec.splits_from_strategy(kind, &node.name, s).map_err(|e| self.weight_note(NodeId(i), spec, s, e));
                fixed[i] = match (&self.from_file[i], &node.strategy) {
                    // An empty item (an op MindSpore ran with a `Layout`) leaves the op to the network.
                    (Some(s), _) if !s.0.is_empty() => {
                        Some((splits(s).map_err(|e| in_strategy_file(req, e))?, StrategySource::StrategyFile))
                    }
                    // A MindSpore `Layout` is checked as one (its named axes), errors naming it.
                    (_, Some(s)) if self.use_strategies => match StrategySource::User.user_layout(node, s) {
                        Some(l) => {
                            let ins = input_types(self.graph, node);
                            Some((spec.named_layouts(kind, &node.name, &ins, &node.ty, l, self.n)?.splits, StrategySource::User))
                        }
                        None => Some((splits(s)?, StrategySource::User)),
                    },
                    _ => None,
                };
            }
        }
        Ok(fixed)
    }

    /// `e`, an invalid strategy `s` of matrix product `id`, with why when the product reads a
    /// weight transposed (stored `[out, in]`, as torch.nn.Linear and MindSpore's nn.Dense store
    /// it) and the strategy fits the weight the other way round (a MatMul written for an
    /// `[in, out]` weight): the strategy that fits, with its weight's last two splits swapped.
    fn weight_note(&self, id: NodeId, spec: &autopar_graph::OpSpec, s: &Strategy, e: autopar_graph::GraphError) -> ParallelError {
        let node = self.graph.node(id);
        let (ta, tb) = match &node.op {
            OpKind::MatMul(m) => (m.transpose_a, m.transpose_b),
            OpKind::BatchMatMul(m) => (m.transpose_a, m.transpose_b),
            _ => return e.into(),
        };
        // A weight read transposed as the second operand: stored [out, in].
        if ta || !tb {
            return e.into();
        }
        let swap_input = 1;
        let Some(&weight) = node.inputs.get(swap_input).filter(|w| matches!(self.graph.node(**w).op, OpKind::Parameter(_))) else {
            return e.into();
        };
        let mut swapped = s.clone();
        match swapped.0.get_mut(swap_input) {
            Some(splits) if splits.len() >= 2 => {
                let k = splits.len();
                splits.swap(k - 2, k - 1);
            }
            _ => return e.into(),
        }
        // The suggestion must plan: its splits agree, divide the shapes and use the devices.
        let kind = node.op.kind();
        let fits = spec
            .splits_from_strategy(kind, &node.name, &swapped)
            .and_then(|splits| spec.layouts(kind, &node.name, &input_types(self.graph, node), &node.ty, &splits, self.n));
        if fits.is_err() {
            return e.into();
        }
        let w = self.graph.node(weight);
        ParallelError::TransposedWeight {
            invalid: Box::new(e),
            weight: w.name.clone(),
            shape: w.ty.shape.clone(),
            fits: swapped.to_string(),
        }
    }

    /// auto_parallel: the search decides every strategy not fixed (pure data parallel, the
    /// baseline `--compare` prints, fixes every op at its default first).
    fn search(&self, search: Search, fixed: &mut [Fixed], input_layouts: &[Option<TensorLayout>]) -> Result<crate::search::SearchReport> {
        if search == Search::DataParallel {
            for (i, node) in self.graph.nodes().iter().enumerate() {
                if let ShardingRule::Spec(spec) = &self.rules[i] {
                    fixed[i] = Some((default_splits(spec, node, &self.on_data, self.n), StrategySource::Default));
                }
            }
        }
        let builtin = DeviceProfile::builtin();
        let report = crate::search::search_plan(&crate::search::SearchJob {
            graph: self.graph,
            rules: &self.rules,
            context: self.ctx,
            profile: self.req.profile.unwrap_or(&builtin),
            training: self.req.loss.is_some(),
            fixed,
            input_layouts,
            search,
            profile_given: self.req.profile.is_some(),
        })?;
        for op in &report.ops {
            fixed[op.node.0] = Some((op.splits.clone(), op.source));
        }
        Ok(report)
    }

    /// Every node's plan: ops with a rule their strategy and layouts; then leaves (parameters
    /// the layout their first consumer needs, inputs the dataset strategy's); then, in order,
    /// ops whose layout follows their input.
    fn node_plans(&self, fixed: &[Fixed], input_layouts: &[Option<TensorLayout>]) -> Result<Vec<NodePlan>> {
        let graph = self.graph;
        let mut plans: Vec<Option<NodePlan>> = vec![None; graph.len()];
        for i in 0..graph.len() {
            plans[i] = self.op_plan(NodeId(i), &fixed[i])?;
        }
        for (i, node) in graph.nodes().iter().enumerate() {
            let layout = if let OpKind::Parameter(_) = &node.op {
                first_use_layout(graph, &plans, NodeId(i))
                    .unwrap_or_else(|| TensorLayout::replicated(self.flat.clone(), node.ty.shape.clone()))
            } else if let Some(l) = &input_layouts[i] {
                l.clone()
            } else {
                continue;
            };
            plans[i] = Some(unsplit_plan(node, NodeId(i), Vec::new(), layout));
        }
        for (i, node) in graph.nodes().iter().enumerate() {
            if plans[i].is_some() {
                continue;
            }
            let given = &plans[node.inputs[0].0].as_ref().expect("inputs are planned before their users").output;
            let widening = node.ty.dtype.size() >= graph.node(node.inputs[0]).ty.dtype.size();
            if node.op.is_inserted_cast() && (widening || given.partial_axes().is_empty()) {
                // The precision policy's cast runs on its input's slices as they are, pending
                // partial sums included when it widens them (a cast is linear up to rounding):
                // its reader redistributes as it would the uncast value. A narrowing cast takes
                // completed sums, rounded once.
                plans[i] = Some(unsplit_plan(node, NodeId(i), vec![given.clone()], given.clone()));
                continue;
            }
            let src = whole_values(given);
            let (input, output) = match reshape_layout(&src, &node.ty.shape) {
                Some(out) => (src, out),
                None => (
                    TensorLayout::replicated(self.flat.clone(), src.shape().to_vec()),
                    TensorLayout::replicated(self.flat.clone(), node.ty.shape.clone()),
                ),
            };
            plans[i] = Some(unsplit_plan(node, NodeId(i), vec![input], output));
        }
        Ok(plans.into_iter().map(|p| p.expect("every node is planned")).collect())
    }

    /// The plan of op `id` under its rule (None: a leaf or an op following its input, planned
    /// later).
    fn op_plan(&self, id: NodeId, fixed: &Fixed) -> Result<Option<NodePlan>> {
        let node = self.graph.node(id);
        let kind = node.op.kind();
        Ok(Some(match &self.rules[id.0] {
            ShardingRule::Spec(spec) => self.spec_plan(id, spec, fixed)?,
            ShardingRule::Replicated if node.op.is_leaf() => return Ok(None),
            ShardingRule::Replicated => {
                let given = self.from_file[id.0].as_ref().or(node.strategy.as_ref().filter(|_| self.use_strategies));
                if let Some(s) = given.filter(|s| s.0.iter().flatten().any(|&x| x > 1)) {
                    let e = autopar_graph::GraphError::InvalidStrategy {
                        kind,
                        name: node.name.clone(),
                        strategy: s.to_string(),
                        problem: StrategyProblem::NoShardedForm,
                    }
                    .into();
                    return Err(if self.from_file[id.0].is_some() { in_strategy_file(self.req, e) } else { e });
                }
                replicated_plan(self.graph, id, &self.flat)
            }
            ShardingRule::FollowInput => return Ok(None),
            ShardingRule::Unsupported(why) => return Err(ParallelError::UnsupportedOp { kind, name: node.name.clone(), why }),
        }))
    }

    /// The plan of op `id` split by its strategy (fixed, or MindSpore's default), with the
    /// statistics, dropout blocks or table rows its tie needs synchronised.
    fn spec_plan(&self, id: NodeId, spec: &autopar_graph::OpSpec, fixed: &Fixed) -> Result<NodePlan> {
        let node = self.graph.node(id);
        let kind = node.op.kind();
        let ins = input_types(self.graph, node);
        let (splits, source) = match fixed {
            Some((s, source)) => (s.clone(), *source),
            None => (default_splits(spec, node, &self.on_data, self.n), StrategySource::Default),
        };
        // The user's MindSpore `Layout` where it is the strategy kept: its device matrix and
        // named axes; otherwise the strategy's device matrix, axes in logical order.
        let named = source.user_layout(node, &spec.strategy_of(&splits));
        let l = spec.layouts_for(kind, &node.name, &ins, &node.ty, &splits, named, self.n).map_err(|e| match source {
            StrategySource::StrategyFile => in_strategy_file(self.req, e.into()),
            _ => e.into(),
        })?;
        let sync = match &spec.tie {
            Tie::None => InOpSync::None,
            Tie::Stats(dims) => {
                let axes: Vec<DeviceAxis> = dims.iter().flat_map(|&d| l.logical_axes[d].iter()).map(|&a| l.mesh.axis(a)).collect();
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
        Ok(NodePlan {
            id,
            name: node.name.clone(),
            kind,
            strategy: Some(l.strategy),
            source: Some(source),
            layout: named.cloned(),
            inputs: l.inputs,
            output: l.output,
            output_scale: l.output_scale,
            sync,
        })
    }
}

/// The types of `node`'s inputs.
fn input_types<'g>(graph: &'g Graph, node: &Node) -> Vec<&'g TensorType> {
    node.inputs.iter().map(|x| &graph.node(*x).ty).collect()
}

/// The redistributions: before every input whose producer's layout is not the one the op
/// needs, and before the outputs gathered whole (a training job gathers only its loss: the step
/// fetches the loss and the gradients, nothing else).
fn redistributions(graph: &Graph, nodes: &[NodePlan], ctx: &ParallelContext, training: bool) -> Result<Vec<Redistribution>> {
    let mut out = Vec::new();
    let mut add = |site: Site, producer: NodeId, src: &TensorLayout, dst: &TensorLayout, node: &str| -> Result<()> {
        if src == dst {
            return Ok(());
        }
        let mut p = plan_with(src, dst, false).map_err(|e| ParallelError::Layout { node: node.to_string(), source: e })?;
        // The same slices on every rank, written over another device matrix (a reshape's).
        if p.is_empty() {
            return Ok(());
        }
        if !ctx.enable_alltoall {
            p = p.without_all_to_all().map_err(|e| ParallelError::Layout { node: node.to_string(), source: e })?;
        }
        let dtype = graph.node(producer).ty.dtype;
        out.push(Redistribution {
            site,
            producer,
            dtype,
            in_f32: ctx.force_fp32_communication && dtype.is_half() && p.num_communications() > 0,
            plan: p,
        });
        Ok(())
    };
    for (i, node) in graph.nodes().iter().enumerate() {
        if node.op.is_leaf() {
            continue;
        }
        for (slot, x) in node.inputs.iter().enumerate() {
            add(Site::Input { consumer: NodeId(i), slot }, *x, &nodes[x.0].output, &nodes[i].inputs[slot], &node.name)?;
        }
    }
    let gathered = if training { 1 } else { graph.outputs.len() };
    for (slot, &o) in graph.outputs.iter().enumerate().take(gathered) {
        let src = &nodes[o.0].output;
        let full = TensorLayout::replicated(src.mesh().clone(), src.shape().to_vec());
        add(Site::Output { slot }, o, src, &full, &graph.node(o).name)?;
    }
    Ok(out)
}

/// Every parameter's plan: its layout, mirror group and the parallel optimizer's decision.
fn param_plans(graph: &Graph, nodes: &[NodePlan], ctx: &ParallelContext, training: bool) -> Vec<ParamPlan> {
    graph
        .parameters()
        .into_iter()
        .filter_map(|id| {
            let node = graph.node(id);
            let OpKind::Parameter(p) = &node.op else { return None };
            let layout = nodes[id.0].output.clone();
            let mirror: Vec<DeviceAxis> = layout.replica_axes().iter().map(|&a| layout.mesh().axis(a)).collect();
            let bytes = layout.shape().iter().product::<usize>() * p.dtype.size();
            let opt = optimizer_shard::decide(&layout.slice_shape(), bytes, &mirror, p.trainable && training, ctx);
            Some(ParamPlan { name: node.name.clone(), node: id, layout, dtype: p.dtype, trainable: p.trainable, mirror, opt })
        })
        .collect()
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

/// The names a strategy file may give op `id`: `"<Prim>_<param>"` for each parameter it takes
/// (MindSpore keys items by operator; autopar by the weight, which names the op across graphs).
/// Written under the first; read under any. Empty for an op taking no parameter.
pub fn strategy_item_names(graph: &Graph, id: NodeId) -> Vec<String> {
    let node = graph.node(id);
    if node.op.is_inserted_cast() {
        return Vec::new();
    }
    // A parameter read through the precision policy's cast is the op's parameter.
    let through = |x: &NodeId| match &graph.node(*x).op {
        OpKind::Cast(c) if c.inserted => graph.node(graph.node(*x).inputs[0]),
        _ => graph.node(*x),
    };
    node.inputs
        .iter()
        .map(through)
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
