//! The plan as people and tools read it: a text report and the same as JSON (`autopar plan`),
//! an SVG of how the biggest tensors are split over the device matrix, and MindSpore's
//! `parameter_layout_dict`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use autopar_graph::OpKind;
use autopar_layout::TensorLayout;
use serde_json::{json, Value};

use crate::context::SearchMode;
use crate::cost::RankCost;
use crate::optimizer_shard::OptDecision;
use crate::plan::{AdjointStep, ParallelPlan, Redistribution, Site};
use crate::search::{Search, SearchReport};

pub mod html;
pub mod pipeline;
pub mod split;
pub mod summary;

pub use pipeline::{pipeline_layout_dict, pipeline_report, PipelineReport, StageReport};
pub use split::split_svg;
pub use summary::{MemoryLimit, Predicted, SummaryFacts};

/// MindSpore's `parameter_layout_dict` of a plan on `rank`: the 12-tuple of every network
/// input and parameter, in graph order, each trainable parameter followed by its optimizer
/// state (`state_keys` names it; MindSpore lists `moments.*`, `adam_m.*`, ... with their
/// parameter's layout). Field 5 names the rank's optimizer-shard group as MindSpore does
/// ([`crate::group_name`]); a pipeline's fields 8-11 come from [`pipeline_layout_dict`].
pub fn parameter_layout_dict(
    plan: &ParallelPlan,
    rank: usize,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> Vec<(String, autopar_layout::ParameterLayout)> {
    let mut out = Vec::new();
    for p in plan.nodes.iter().filter(|p| matches!(plan.graph.node(p.id).op, OpKind::Input(_) | OpKind::Parameter(_))) {
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
        let param = plan.param(&p.name);
        let opt_shard_group =
            param.and_then(|pp| pp.opt.shard()).map(|s| crate::group_name(&s.group(rank), plan.device_num)).unwrap_or_default();
        let layout = autopar_layout::ParameterLayout {
            dev_matrix: dims.to_vec(),
            tensor_map: l.tensor_map().flattened(),
            slice_shape: l.slice_shape(),
            field_size: 0,
            uniform_split: true,
            opt_shard_group,
            full_shape: l.shape().to_vec(),
            after_reshape_slice_shape: after,
            pipeline_shared: false,
            is_send: false,
            peer_rank: 0,
            sr_tag: 0,
        };
        let states = match param {
            Some(pp) if pp.trainable && plan.loss.is_some() => state_keys(&p.name),
            _ => Vec::new(),
        };
        out.push((p.name.clone(), layout.clone()));
        out.extend(states.into_iter().map(|k| (k, layout.clone())));
    }
    out
}

/// The recomputed regions of a rank's step: per region, the values no longer kept from the
/// forward to the backward pass, and what running its ops again costs (empty without any).
fn recompute_text(cost: &RankCost) -> String {
    if cost.recompute.is_empty() {
        return String::new();
    }
    let mut s = format!("\nrecomputation (rank {}): the backward pass runs these regions' ops again\n", cost.rank);
    let mut rows = vec![["region", "ops", "not kept", "recompute FLOPs", "comm again"].map(String::from)];
    for r in &cost.recompute {
        rows.push([r.region.clone(), r.ops.to_string(), human_bytes(r.not_kept), human_flops(r.flops), human_bytes(r.comm_bytes)]);
    }
    let (ops, kept, flops, comm) =
        cost.recompute.iter().fold((0, 0, 0.0, 0), |a, r| (a.0 + r.ops, a.1 + r.not_kept, a.2 + r.flops, a.3 + r.comm_bytes));
    rows.push(["total".into(), ops.to_string(), human_bytes(kept), human_flops(flops), human_bytes(comm)]);
    s.push_str(&aligned(&rows));
    s
}

/// A layout as `[2, 4] S(0)R`: the device matrix, then per axis what it does to the tensor.
pub fn layout_text(l: &TensorLayout) -> String {
    format!("{:?} {}", l.mesh().dims(), l)
}

/// Bytes as `12.0 MiB`.
pub fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub(crate) fn human_flops(f: f64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut v = f;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.2} {}FLOP", UNITS[u])
}

pub(crate) fn site_text(plan: &ParallelPlan, r: &Redistribution) -> String {
    match r.site {
        Site::Input { consumer, slot } => format!("input {slot} of {}", plan.graph.node(consumer).name),
        Site::Output { slot } => format!("graph output {slot} ({})", plan.graph.node(plan.graph.outputs[slot]).name),
    }
}

fn adjoint_text(s: &AdjointStep) -> String {
    match s {
        AdjointStep::Pad { dim, axis } => format!("pad dim {dim} from 1/{} (local)", axis.size),
        AdjointStep::Scale => "scale (local)".into(),
        AdjointStep::Collective(step) => step.to_string(),
    }
}

/// A group as `4 ranks [0, 1, 2, 3]` (long groups shortened).
fn group_text(g: &[usize]) -> String {
    if g.len() <= 8 {
        format!("{} ranks {g:?}", g.len())
    } else {
        format!("{} ranks [{}, {}, ..., {}]", g.len(), g[0], g[1], g[g.len() - 1])
    }
}

/// The world rank of a position of a pipeline stage, for a parameter (by name) of that stage.
pub type WorldRankOf<'a> = dyn Fn(&str, usize) -> usize + 'a;

/// What `autopar plan` prints: the plan, with the predicted cost of one rank's step.
pub struct PlanReport<'a> {
    /// The plan reported.
    pub plan: &'a ParallelPlan,
    /// The predicted cost of one rank's step.
    pub cost: &'a RankCost,
    /// A line describing the model (name, sizes).
    pub model: String,
    /// The optimizer the memory figure counts state for, as printed beside it (e.g. "1 slot(s)
    /// per trainable parameter: momentum").
    pub optimizer: String,
    /// Seconds planning took (wall clock).
    pub planning_seconds: f64,
    /// For a pipeline's stage plan, whose ranks are positions in a stage: the world rank of
    /// position `p` on the stage the report shows parameter `name` for, and the job's ranks; groups
    /// are then printed and named in world ranks, as MindSpore names them. None: the plan's
    /// ranks are the world's.
    pub world: Option<(&'a WorldRankOf<'a>, usize)>,
}

impl PlanReport<'_> {
    /// The parallel optimizer's decisions: per parameter its shard group on `rank` (or why it
    /// stays whole), then the fused all-gather and reduce-scatter buckets.
    fn optimizer_text(&self) -> String {
        let (plan, rank) = (self.plan, self.cost.rank);
        let mut s = String::new();
        let cfg = &plan.context.parallel_optimizer_config;
        let _ = writeln!(
            s,
            "\nparallel optimizer (threshold {} KB, shard size {}, gradient_accumulation_shard {}, optimizer_level {})",
            cfg.parallel_optimizer_threshold,
            cfg.optimizer_weight_shard_size,
            cfg.gradient_accumulation_shard,
            cfg.optimizer_level.name()
        );
        let slices: usize = plan.params.iter().filter(|p| p.opt.shard().is_some()).map(|p| p.layout.slice_len() * p.dtype.size()).sum();
        let _ = match cfg.optimizer_level {
            crate::context::OptimizerLevel::Level1 => writeln!(
                s,
                "  level1: the sharded weights' slices ({}) are all-gathered before the forward pass and held to the step's end, their buffers from step to step; their gradients ({0}) are whole until the backward pass ends",
                human_bytes(slices)
            ),
            crate::context::OptimizerLevel::Level2 => writeln!(
                s,
                "  level2: the sharded weights' slices ({}) are all-gathered before the forward pass and held to the step's end; each gradient is reduce-scattered as the backward pass forms it, so only its shard is kept (level1 keeps the {0} of whole gradients to the pass's end)",
                human_bytes(slices)
            ),
            crate::context::OptimizerLevel::Level3 => writeln!(
                s,
                "  level3: each sharded weight's slice is all-gathered just before its forward use and again before its backward pass reads it, and freed after each, and each gradient is reduce-scattered as the backward pass forms it: none of the {} of slices level1 holds, nor their whole gradients, is kept between uses (the extra all-gathers and the reduce-scatters are in the communication below)",
                human_bytes(slices)
            ),
        };
        for p in &plan.params {
            let what = match &p.opt {
                OptDecision::Disabled => continue,
                OptDecision::Sharded(sh) => {
                    let (group, name) = self.world_group(&p.name, &sh.group(rank));
                    format!(
                        "sharded over {} ({name}), stores {:?}, step {}; gradient summed over {}",
                        group_text(&group),
                        p.stored_shape(),
                        sh.step,
                        group_text(&self.world_group(&p.name, &p.mirror_group(rank)).0),
                    )
                }
                OptDecision::Whole(why) => format!("whole: {why}"),
            };
            let _ = writeln!(s, "  {:<34} {what}", p.name);
        }
        // Level3 gathers each weight in the program, per use: no fused all-gather runs; level2
        // and level3 reduce-scatter each gradient in the backward pass.
        let gathers: &[_] = if cfg.optimizer_level.gathers_per_use() { &[] } else { &plan.gradients.all_gather };
        let scatter =
            if cfg.optimizer_level.shards_gradients() { "reduce-scatter (in the backward pass, per gradient)" } else { "reduce-scatter" };
        for (kind, buckets) in [("all-gather", gathers), (scatter, &plan.gradients.reduce_scatter[..])] {
            for (i, b) in buckets.iter().enumerate() {
                let ranks: usize = b.axes.iter().map(|a| a.size).product();
                let _ = writeln!(
                    s,
                    "  {kind} bucket {i}: {} params, {} elements of {}, over {ranks} ranks",
                    b.params.len(),
                    b.elements,
                    b.dtype
                );
            }
        }
        s
    }

    /// Group `g` of the plan's ranks, for parameter `name`, in world ranks, and its MindSpore name.
    fn world_group(&self, name: &str, g: &[usize]) -> (Vec<usize>, String) {
        match self.world {
            Some((rank_of, n)) => {
                let w: Vec<usize> = g.iter().map(|&r| rank_of(name, r)).collect();
                let label = crate::group_name(&w, n);
                (w, label)
            }
            None => (g.to_vec(), crate::group_name(g, self.plan.device_num)),
        }
    }

    /// The bucket each parameter's gradient is synchronised in.
    fn bucket_of(&self) -> BTreeMap<&str, usize> {
        let mut out = BTreeMap::new();
        for (i, b) in self.plan.gradients.buckets.iter().enumerate() {
            for p in &b.params {
                out.insert(p.as_str(), i);
            }
        }
        out
    }

    /// The report as text: operators, parameters, redistributions, communication per step,
    /// memory per device.
    /// The report's first lines: the model, devices and mode, the plan's size, the dataset
    /// strategy, the strategy file.
    pub fn header(&self) -> String {
        let (plan, cost) = (self.plan, self.cost);
        let mut s = String::new();
        let params: usize = plan.params.iter().map(|p| p.layout.shape().iter().product::<usize>()).sum();
        let bytes: usize = plan.params.iter().map(|p| p.layout.shape().iter().product::<usize>() * p.dtype.size()).sum();
        let devices = if plan.device_num == 1 { "1 device".to_string() } else { format!("{} devices", plan.device_num) };
        let _ = writeln!(s, "autopar plan: {} on {devices} ({})", self.model, plan.mode);
        let _ = writeln!(
            s,
            "  {} operators, {} parameters ({} values, {}), planned in {}; per-rank figures for rank {} of {}",
            plan.nodes.len(),
            plan.params.len(),
            params,
            human_bytes(bytes),
            if self.planning_seconds < 1.0 {
                format!("{:.1} ms", self.planning_seconds * 1e3)
            } else {
                format!("{:.2} s", self.planning_seconds)
            },
            cost.rank,
            plan.device_num
        );
        // Only recursive_programming on an inference graph makes the inputs whole unasked.
        let why = if plan.dataset == crate::context::DatasetStrategy::FullBatch && !plan.context.is_set("dataset_strategy") {
            " (recursive_programming runs an inference graph's inputs whole, as MindSpore does; set dataset_strategy to choose)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "  dataset strategy {:?}{why}; all-to-all {}",
            plan.dataset,
            if plan.all_to_all { "on" } else { "off (all-gather + slice)" }
        );
        if let Some(f) = &plan.strategy_file {
            let _ = writeln!(s, "  strategies from {}", f.display());
        }
        s
    }

    /// Every table: the ops, the search, the parameters, the parallel optimizer, the
    /// redistributions, the gradient buckets, the communication, the memory, the compute and
    /// what recomputation does.
    pub fn tables(&self) -> String {
        let (plan, cost) = (self.plan, self.cost);
        let mut s = String::new();
        let _ = writeln!(s, "\noperators");
        let mut rows = vec![["name", "op", "strategy", "source", "inputs -> output", "in-op"].map(String::from)];
        for p in &plan.nodes {
            let node = plan.graph.node(p.id);
            if node.op.is_leaf() {
                continue;
            }
            let strategy = p.strategy_text();
            let ins: Vec<String> = p.inputs.iter().map(|l| l.to_string()).collect();
            let out = format!("{}{}", p.output, if p.output.is_partial() { " (partial)" } else { "" });
            rows.push([
                p.name.clone(),
                p.kind.to_string(),
                strategy,
                p.source.map(|x| x.name()).unwrap_or("-").to_string(),
                format!("{:?} {} -> {}", p.output.mesh().dims(), ins.join(" "), out),
                p.sync.describe(),
            ]);
        }
        s.push_str(&aligned(&rows));
        if let Some(r) = &plan.search {
            s.push_str(&search_text(r));
        }
        let buckets = self.bucket_of();
        let _ = writeln!(s, "\nparameters");
        let _ = writeln!(
            s,
            "  {:<34} {:<16} {:<14} {:<14} {:<16} {:<10} bucket",
            "name", "shape", "dev_matrix", "tensor_map", "slice", "mirror"
        );
        for p in &plan.params {
            let l = &p.layout;
            let mirror: usize = p.mirror.iter().map(|a| a.size).product();
            let _ = writeln!(
                s,
                "  {:<34} {:<16} {:<14} {:<14} {:<16} {:<10} {}",
                p.name,
                format!("{:?}", l.shape()),
                format!("{:?}", l.mesh().dims()),
                l.tensor_map().to_string(),
                format!("{:?}", l.slice_shape()),
                if p.trainable { format!("{mirror} ranks") } else { "frozen".into() },
                buckets.get(p.name.as_str()).map(|b| b.to_string()).unwrap_or_else(|| "-".into())
            );
        }
        if plan.context.enable_parallel_optimizer {
            s.push_str(&self.optimizer_text());
        }
        let _ = writeln!(s, "\nredistributions ({})", plan.redistributions.len());
        for r in &plan.redistributions {
            let _ = writeln!(
                s,
                "  before {}: {} -> {}{}",
                site_text(plan, r),
                layout_text(&r.plan.src),
                layout_text(&r.plan.dst),
                if r.in_f32 { " (in f32)" } else { "" }
            );
            let fwd: Vec<String> = r.plan.steps.iter().map(|st| st.step.to_string()).collect();
            let _ = writeln!(s, "    forward:  {}  ({} sent by the busiest rank)", fwd.join("; "), human_bytes(r.forward_bytes()));
            let bwd: Vec<String> = r.backward().iter().map(adjoint_text).collect();
            let _ = writeln!(s, "    backward: {}", bwd.join("; "));
        }
        let g = &plan.gradients;
        let _ = writeln!(
            s,
            "\ngradients: backward seeded with {}, {}; {} bucket(s)",
            g.loss_seed,
            if g.mirror_mean { "mirror sums divided by the group size (gradients_mean)" } else { "mirror sums" },
            g.buckets.len()
        );
        for (i, b) in g.buckets.iter().enumerate() {
            let mirror: usize = b.mirror.iter().map(|a| a.size).product();
            let _ = writeln!(
                s,
                "  bucket {i}: {} params, {} in {}, all-reduced over {mirror} ranks",
                b.params.len(),
                human_bytes(b.bytes()),
                b.dtype
            );
        }
        let _ = writeln!(s, "\ncommunication per step (rank {})", cost.rank);
        for c in &cost.comm {
            let _ =
                writeln!(s, "  {:<15} over {:<32} {:>6} calls {:>12}", c.kind.name(), group_text(&c.group), c.calls, human_bytes(c.bytes));
        }
        let _ = writeln!(
            s,
            "  {:<15} {:<37} {:>6} calls {:>12}",
            "total",
            "",
            cost.comm.iter().map(|c| c.calls).sum::<usize>(),
            human_bytes(cost.comm_bytes())
        );
        let m = &cost.memory;
        let _ = writeln!(s, "\nmemory per device (rank {})", cost.rank);
        let _ = writeln!(s, "  parameters        {:>12}", human_bytes(m.parameters));
        let _ = writeln!(s, "  gradients         {:>12}", human_bytes(m.gradients));
        let _ = writeln!(s, "  optimizer state   {:>12}  ({})", human_bytes(m.optimizer_state), self.optimizer);
        let _ = writeln!(s, "  peak activations  {:>12}  (at the step's peak)", human_bytes(m.peak_activations));
        let _ = writeln!(s, "  comm buffers      {:>12}", human_bytes(m.comm_buffers));
        let _ = writeln!(s, "  total             {:>12}", human_bytes(m.total()));
        let _ = writeln!(
            s,
            "  activations alone {:>12}  (their own peak, gradients aside; what recomputation cuts; not added to the total)",
            human_bytes(m.activations)
        );
        let _ =
            writeln!(s, "\ncompute per step (rank {}): {}, {} moved", cost.rank, human_flops(cost.flops), human_bytes(cost.bytes_moved));
        s.push_str(&recompute_text(cost));
        s
    }

    /// The report as data.
    pub fn json(&self) -> Value {
        let (plan, cost) = (self.plan, self.cost);
        let layout = |l: &TensorLayout| {
            json!({
                "dev_matrix": l.mesh().dims(),
                "tensor_map": l.tensor_map().flattened(),
                "shape": l.shape(),
                "slice_shape": l.slice_shape(),
                "partial": l.is_partial(),
                "text": l.to_string(),
            })
        };
        let buckets = self.bucket_of();
        let operators: Vec<Value> = plan
            .nodes
            .iter()
            .filter(|p| !plan.graph.node(p.id).op.is_leaf())
            .map(|p| {
                json!({
                    "name": p.name,
                    "op": p.kind,
                    "strategy": p.strategy.as_ref().map(|x| x.0.clone()),
                    "layout": p.layout.as_ref().map(|l| l.to_string()),
                    "source": p.source.map(|x| x.name()),
                    "inputs": p.inputs.iter().map(layout).collect::<Vec<_>>(),
                    "output": layout(&p.output),
                    "output_scale": p.output_scale,
                    "in_op": p.sync.describe(),
                })
            })
            .collect();
        let parameters: Vec<Value> = plan
            .params
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "layout": layout(&p.layout),
                    "dtype": p.dtype.to_string(),
                    "trainable": p.trainable,
                    "mirror_ranks": p.mirror.iter().map(|a| a.size).product::<usize>(),
                    "mirror_group": p.mirror_group(cost.rank),
                    "bucket": buckets.get(p.name.as_str()),
                    "optimizer_shard": match &p.opt {
                        OptDecision::Disabled => Value::Null,
                        OptDecision::Sharded(sh) => {
                            let (group, name) = self.world_group(&p.name, &sh.group(cost.rank));
                            json!({
                                "size": sh.size,
                                "step": sh.step,
                                "group": group,
                                "group_name": name,
                                "rest_group": self.world_group(&p.name, &sh.rest_group(cost.rank)).0,
                            })
                        }
                        OptDecision::Whole(why) => json!({ "unsharded": why }),
                    },
                })
            })
            .collect();
        let redistributions: Vec<Value> = plan
            .redistributions
            .iter()
            .map(|r| {
                json!({
                    "site": site_text(plan, r),
                    "producer": plan.graph.node(r.producer).name,
                    "from": layout(&r.plan.src),
                    "to": layout(&r.plan.dst),
                    "in_f32": r.in_f32,
                    "forward": r.plan.steps.iter().map(|st| st.step.to_string()).collect::<Vec<_>>(),
                    "backward": r.backward().iter().map(adjoint_text).collect::<Vec<_>>(),
                    "forward_bytes_busiest_rank": r.forward_bytes(),
                })
            })
            .collect();
        json!({
            "model": self.model,
            "device_num": plan.device_num,
            "mode": plan.mode.name(),
            "rank": cost.rank,
            "planning_seconds": self.planning_seconds,
            "dataset_strategy": format!("{:?}", plan.dataset),
            "all_to_all": plan.all_to_all,
            "strategy_file": plan.strategy_file.as_ref().map(|p| p.display().to_string()),
            "operators": operators,
            "warnings": plan.warnings(),
            "search": plan.search.as_ref().map(search_json),
            "parameters": parameters,
            "redistributions": redistributions,
            "gradients": {
                "loss_seed": plan.gradients.loss_seed,
                "mirror_mean": plan.gradients.mirror_mean,
                "buckets": plan.gradients.buckets.iter().map(|b| json!({
                    "params": b.params,
                    "dtype": b.dtype.to_string(),
                    "bytes": b.bytes(),
                    "mirror_ranks": b.mirror.iter().map(|a| a.size).product::<usize>(),
                })).collect::<Vec<_>>(),
            },
            "communication": cost.comm.iter().map(|c| json!({
                "kind": c.kind.name(), "group": c.group, "calls": c.calls, "bytes": c.bytes,
            })).collect::<Vec<_>>(),
            "communication_bytes": cost.comm_bytes(),
            "recompute": cost.recompute.iter().map(|r| json!({
                "region": r.region, "ops": r.ops, "flops": r.flops, "comm_bytes": r.comm_bytes, "not_kept": r.not_kept,
            })).collect::<Vec<_>>(),
            "flops": cost.flops,
            "bytes_moved": cost.bytes_moved,
            "memory": {
                "parameters": cost.memory.parameters,
                "gradients": cost.memory.gradients,
                "optimizer_state": cost.memory.optimizer_state,
                "peak_activations": cost.memory.peak_activations,
                "activations": cost.memory.activations,
                "comm_buffers": cost.memory.comm_buffers,
                "total": cost.memory.total(),
            },
        })
    }
}

/// Text for HTML and SVG: `&`, `<`, `>` and double quotes escaped.
fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn ms(seconds: f64) -> String {
    format!("{:.4} ms", seconds * 1e3)
}

/// The strategy search's explanation: per op the chosen strategy, where it came from, its
/// predicted cost by part and the runner-up with its extra cost.
pub fn search_text(r: &SearchReport) -> String {
    let mut s = String::new();
    let t = r.total();
    let _ = writeln!(
        s,
        "\nstrategy search: {} (device profile: {}); objective {} per step\n  predicted: compute {}, communication {}, redistribution {}, gradient sync {}",
        r.search.name(),
        r.profile,
        ms(r.objective),
        ms(t.compute),
        ms(t.communication),
        ms(t.redistribution),
        ms(t.gradient_sync)
    );
    if let Some(bytes) = r.mindspore_objective {
        let _ = writeln!(
            s,
            "  optimised MindSpore's cost model (alpha * computation + beta * communication, in bytes): {bytes:.1}; the figures here are seconds under the device profile (--profile FILE optimises those instead)"
        );
    }
    if !r.overwritten.is_empty() {
        let _ = writeln!(
            s,
            "  overwritten: the .shard() strategies of {} (recursive_programming searches every op, as MindSpore 2.10 does; MS_INTERFERED_SAPP=1 keeps them)",
            r.overwritten.join(", ")
        );
    }
    if let Some(chosen) = &r.levers {
        let first = chosen.without.lines().next().unwrap_or_default();
        let mut levers = Vec::new();
        if !chosen.blocks.is_empty() {
            levers.push(format!(
                "{} of {} blocks recomputed ({}; what each saves and costs: `recomputation` below)",
                chosen.blocks.len(),
                chosen.of_blocks,
                chosen.blocks.join(", ")
            ));
        }
        if let Some(level) = chosen.optimizer_level {
            levers.push(format!("the parallel optimizer at {} (`parallel optimizer` below)", level.name()));
        }
        let _ = writeln!(s, "  memory levers chosen: {}, because without them {first}", levers.join(" and "));
        for t in &chosen.tried {
            let outcome = match t.fitted {
                Some((memory, objective)) => format!("{} per device, objective {objective:.6} s", human_bytes(memory as usize)),
                None => "no plan fits".to_string(),
            };
            let _ = writeln!(s, "    tried {}: {outcome}", t.describe());
        }
    }
    if r.fully_use_fallback {
        let _ = writeln!(
            s,
            "  fully_use_devices fallback: every split of every op is more than dynamic_programming searches in seconds here; it searched the strategies using every device or none (`fully_use_devices=true` does so always; --compare's exact solver searches every split)"
        );
    }
    for tie in &r.tied {
        let _ = writeln!(
            s,
            "  tied: the {} ops {} .. {} repeat {} times back to back; every copy takes the first copy's strategies (searched once)",
            tie.ops, tie.first, tie.last, tie.copies
        );
    }
    if let Some((need, objective)) = r.fastest {
        let _ = writeln!(
            s,
            "  memory: the fastest plan ({}) needs {need} bytes per device (its ops' outputs, parameters, gradients and one optimizer slot, summed), over device_memory_capacity = {} bytes; this plan needs {} bytes",
            ms(objective),
            r.capacity,
            t.memory
        );
    } else if t.memory > r.capacity {
        let _ = writeln!(
            s,
            "  memory: this plan needs {} bytes per device (its ops' summed), over device_memory_capacity = {} bytes: {} checks each op alone",
            t.memory,
            r.capacity,
            r.search.name()
        );
    }
    let mut rows =
        vec![["name", "strategy", "source", "compute", "comm", "redist", "grad sync", "memory", "runner-up (extra)"].map(String::from)];
    let mut cheaper = false;
    for o in &r.ops {
        let runner = match &o.runner_up {
            Some((st, extra)) if *extra < 0.0 => {
                cheaper = true;
                format!("{st} ({:+.4} ms)*", extra * 1e3)
            }
            Some((st, extra)) => format!("{st} ({:+.4} ms)", extra * 1e3),
            None if o.candidates == 1 => "- (the only one)".into(),
            None => "-".into(),
        };
        rows.push([
            o.name.clone(),
            o.strategy.to_string(),
            o.source.name().to_string(),
            ms(o.cost.compute),
            ms(o.cost.communication),
            ms(o.cost.redistribution),
            ms(o.cost.gradient_sync),
            human_bytes(o.cost.memory as usize),
            runner,
        ]);
    }
    s.push_str(&aligned(&rows));
    if cheaper {
        let _ = writeln!(
            s,
            "  * cheaper with the rest of the plan unchanged, not chosen: {}",
            match r.search {
                Search::Mode(SearchMode::RecursiveProgramming) => "recursive_programming cuts greedily, without the cost graph",
                Search::Mode(SearchMode::ShardingPropagation) => "sharding_propagation follows the ops decided before it",
                _ if r.mindspore_objective.is_some() => "dynamic_programming minimises MindSpore's cost model (bytes), not these seconds",
                _ if r.fastest.is_some() => "with it the plan would not fit device_memory_capacity",
                _ => "ties to a repeated block's first copy",
            }
        );
    }
    s
}

/// [`search_text`] as data.
pub fn search_json(r: &SearchReport) -> Value {
    let t = r.total();
    json!({
        "search": r.search.name(),
        "profile": r.profile,
        "objective_seconds": r.objective,
        "mindspore_objective_bytes": r.mindspore_objective,
        "predicted_seconds": {"compute": t.compute, "communication": t.communication, "redistribution": t.redistribution, "gradient_sync": t.gradient_sync},
        "tied_blocks": r.tied.iter().map(|t| json!({"first_copy_first_op": t.first, "first_copy_last_op": t.last, "ops_per_copy": t.ops, "copies": t.copies})).collect::<Vec<_>>(),
        "memory_bytes": t.memory,
        "device_memory_capacity": r.capacity,
        "fastest_over_capacity": r.fastest.map(|(bytes, objective)| json!({"memory_bytes": bytes, "objective_seconds": objective})),
        "overwritten_user_strategies": r.overwritten,
        "fully_use_devices_fallback": r.fully_use_fallback,
        "levers_chosen": r.levers.as_ref().map(|c| json!({
            "blocks": c.blocks,
            "of_blocks": c.of_blocks,
            "optimizer_level": c.optimizer_level.map(|l| l.name()),
            "without": c.without,
            "tried": c.tried.iter().map(|t| json!({
                "blocks": t.blocks,
                "optimizer_level": t.optimizer_level.map(|l| l.name()),
                "memory_bytes": t.fitted.map(|f| f.0),
                "objective_seconds": t.fitted.map(|f| f.1),
            })).collect::<Vec<_>>(),
        })),
        "operators": r.ops.iter().map(|o| json!({
            "name": o.name,
            "op": o.kind,
            "strategy": o.strategy.0,
            "source": o.source.name(),
            "candidates": o.candidates,
            "compute_seconds": o.cost.compute,
            "communication_seconds": o.cost.communication,
            "redistribution_seconds": o.cost.redistribution,
            "gradient_sync_seconds": o.cost.gradient_sync,
            "memory_bytes": o.cost.memory,
            "runner_up": o.runner_up.as_ref().map(|(st, extra)| json!({"strategy": st.0, "extra_seconds": extra})),
        })).collect::<Vec<_>>(),
    })
}

/// `autopar plan --compare`: one row per search with its predicted cost by part, the seconds
/// it took and its cost over the exact optimum's.
pub fn compare_text(model: &str, devices: usize, rows: &[crate::search::SearchRow]) -> String {
    let mut s = String::new();
    let exact = rows
        .iter()
        .find(|(search, _)| *search == crate::search::Search::Exact)
        .and_then(|(_, r)| r.as_ref().ok())
        .map(|(r, _)| r.objective)
        .filter(|e| *e > 0.0);
    let _ = writeln!(s, "autopar plan --compare: {model} on {devices} devices, predicted time per step (weighted objective); memory: the ops' outputs, parameters, gradients and one optimizer slot, summed per device");
    let _ = writeln!(
        s,
        "  {:<31} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10} {:>10} {:>9}",
        "search", "objective", "compute", "comm", "redist", "grad sync", "memory", "planned", "/ exact"
    );
    for (search, row) in rows {
        let (r, seconds) = match row {
            Ok(row) => row,
            Err(e) => {
                let first = e.to_string();
                let _ = writeln!(s, "  {:<31} could not plan: {}", search.name(), first.lines().next().unwrap_or(""));
                continue;
            }
        };
        let t = r.total();
        let _ = writeln!(
            s,
            "  {:<31} {:>12} {:>12} {:>12} {:>12} {:>12} {:>10} {:>9.3}s {:>9}",
            r.search.name(),
            ms(r.objective),
            ms(t.compute),
            ms(t.communication),
            ms(t.redistribution),
            ms(t.gradient_sync),
            human_bytes(t.memory as usize),
            seconds,
            exact.map(|e| format!("{:.3}", r.objective / e)).unwrap_or_else(|| "-".into())
        );
    }
    // recursive_programming searched the ops the others keep as `.shard()` set them.
    for (search, row) in rows {
        if let Ok((r, _)) = row {
            if !r.overwritten.is_empty() {
                let _ = writeln!(
                    s,
                    "  {}: searched the {} ops whose .shard() strategy the others keep (as MindSpore 2.10 does; MS_INTERFERED_SAPP=1 keeps them), so it may beat the exact plan",
                    search.name(),
                    r.overwritten.len()
                );
            }
            if let Some(bytes) = r.mindspore_objective {
                let _ = writeln!(
                    s,
                    "  {}: optimised MindSpore's cost model (objective {bytes:.1} in its byte units); its row is the seconds of the plan it chose",
                    search.name()
                );
            }
            if r.fully_use {
                let why = if r.fully_use_fallback { "every split is more than it searches in seconds here" } else { "fully_use_devices" };
                let _ = writeln!(
                    s,
                    "  {}: searched the strategies using every device or none ({why}), the exact solver every split",
                    search.name()
                );
            }
        }
    }
    // Plans over the capacity: the searches that check each op alone.
    for (search, row) in rows {
        if let Ok((r, _)) = row {
            if r.total().memory > r.capacity {
                let _ = writeln!(
                    s,
                    "  {}: its plan needs {} bytes per device (the ops' summed), over device_memory_capacity = {} bytes (it checks each op alone), so it may beat the exact plan, which fits",
                    search.name(),
                    r.total().memory,
                    r.capacity
                );
            }
        }
    }
    s
}

/// `rows` (the first one the header) as text columns, each as wide as its longest cell, two
/// spaces of indent; the last column is not padded.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut s = String::new();
    for r in rows {
        let cells: Vec<String> =
            r.iter().zip(&widths).enumerate().map(|(c, (v, &w))| if c + 1 == N { v.clone() } else { format!("{v:<w$}") }).collect();
        let _ = writeln!(s, "  {}", cells.join(" ").trim_end());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::aligned;

    #[test]
    fn columns_are_as_wide_as_their_longest_cell() {
        let rows = [["name", "op", "in-op"].map(String::from), ["loss", "SoftmaxCrossEntropyWithLogits", ""].map(String::from)];
        let text = aligned(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("  name {:<29} in-op", "op"));
        assert_eq!(lines[1], "  loss SoftmaxCrossEntropyWithLogits");
    }
}
