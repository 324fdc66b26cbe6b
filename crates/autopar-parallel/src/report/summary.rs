//! The summary `autopar plan` prints first: in at most 30 lines, the model and its size, the
//! mode and devices, who chose the strategies, the memory per device against what the device
//! has, the predicted step time split into compute, communication and the pipeline's bubble,
//! the costliest ops and redistributions, and the warnings. The full tables follow on request.

use std::fmt::Write as _;

use autopar_graph::{Collective, CostCx, TensorType};
use autopar_layout::Ring;
use serde_json::{json, Value};

use super::{human_bytes, human_flops, site_text, PipelineReport, PlanReport};
use crate::plan::{NodePlan, ParallelPlan};
use crate::search::{DeviceProfile, StrategySource};

/// What the summary needs beside the plan and its rank's cost.
pub struct SummaryFacts<'a> {
    /// The device profile that prices the step's time (`--profile`, else the built-in one).
    pub profile: &'a DeviceProfile,
    /// What a device has for its plan: `device_memory_capacity` (each rank's plan against
    /// it), or a process's limit (every rank run in one process together against it).
    pub limit: Option<MemoryLimit>,
    /// Micro-batches per step: the rank's figures are one micro-batch's when more than 1.
    pub micro_batches: usize,
    /// The pipeline's report, for a pipelined job.
    pub pipeline: Option<&'a PipelineReport>,
    /// The reported rank, global (in a pipeline the cost's rank is its position in its stage).
    pub rank: usize,
}

/// The memory the plan is held against.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryLimit {
    /// Bytes.
    pub bytes: u64,
    /// What sets it, in words ("device_memory_capacity", "available on this machine").
    pub what: String,
    /// Per device (`device_memory_capacity`), or for every rank run in one process.
    pub per_device: bool,
}

/// A step's predicted time, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Predicted {
    /// Arithmetic and memory traffic.
    pub compute: f64,
    /// The collectives: in-graph ones per micro-batch, the gradient sync once.
    pub comm: f64,
    /// A pipeline stage's idle time: the bubble.
    pub bubble: f64,
    /// A pipeline's simulated time unit (a stage's forward pass over one micro-batch), in
    /// seconds; 0 without a pipeline.
    pub unit: f64,
}

impl Predicted {
    /// The whole step.
    pub fn total(&self) -> f64 {
        self.compute + self.comm + self.bubble
    }
}

/// How many ops and redistributions the summary lists, and at most how many warnings.
const TOP: usize = 5;
const WARNINGS: usize = 4;

/// `n` and the noun (singular, plural), the plural unless one.
fn count(n: usize, (one, many): (&str, &str)) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

const STAGES: (&str, &str) = ("stage", "stages");
const DEVICES: (&str, &str) = ("device", "devices");
const MICRO_BATCHES: (&str, &str) = ("micro-batch", "micro-batches");
const RANKS: (&str, &str) = ("rank", "ranks");

/// The bytes the busiest rank sends for a send buffer of `bytes` in a collective over `ranks`
/// ranks (ring algorithms; a broadcast or a send: the buffer once).
fn bytes_sent(kind: Collective, ranks: usize, bytes: usize) -> usize {
    let ring = match kind {
        Collective::AllReduce => Ring::AllReduce,
        Collective::AllGather => Ring::AllGather,
        Collective::ReduceScatter | Collective::AllToAll => Ring::Scatter,
        _ => return bytes,
    };
    ring.bytes_sent(ranks, bytes)
}

/// The forward FLOPs of `p`'s slice on one device: its cost on the slices of its inputs.
pub(super) fn slice_flops(plan: &ParallelPlan, p: &NodePlan) -> f64 {
    let node = plan.graph.node(p.id);
    let inputs: Vec<TensorType> = node
        .inputs
        .iter()
        .zip(&p.inputs)
        .map(|(x, l)| TensorType { shape: l.slice_shape(), dtype: plan.graph.node(*x).ty.dtype })
        .collect();
    if inputs.len() != node.inputs.len() {
        return 0.0;
    }
    let output = TensorType { shape: p.output.slice_shape(), dtype: node.ty.dtype };
    node.op.def().cost(&CostCx { inputs: &inputs, output: &output, rank: 0 }).flops
}

/// Who chose the strategies: ops per source, in the order the sources decide.
fn sources_text(plan: &ParallelPlan) -> String {
    let sources = [
        (StrategySource::User, "by the model"),
        (StrategySource::StrategyFile, "from the strategy file"),
        (StrategySource::Searched, "searched"),
        (StrategySource::Propagated, "propagated"),
        (StrategySource::Default, "data parallel by default"),
    ];
    let parts: Vec<String> = sources
        .iter()
        .filter_map(|(s, what)| {
            let k = plan.nodes.iter().filter(|p| p.source == Some(*s)).count();
            (k > 0).then(|| format!("{k} {what}"))
        })
        .collect();
    let ops = plan.nodes.iter().filter(|p| !plan.graph.node(p.id).op.is_leaf()).count();
    let search = plan.search.as_ref().map(|r| format!(" (search: {})", r.search.name())).unwrap_or_default();
    let given: usize = plan.nodes.iter().filter(|p| p.source.is_some()).count();
    let rest = if given < ops { "; the others follow their inputs" } else { "" };
    if parts.is_empty() {
        format!("of {ops} ops, none has a strategy: they follow their inputs{search}")
    } else {
        format!("of {ops} ops, {}{rest}{search}", parts.join(", "))
    }
}

impl PlanReport<'_> {
    /// The summary: at most 30 lines with the header (see the module's text).
    pub fn summary(&self, f: &SummaryFacts<'_>) -> String {
        let plan = self.plan;
        let devices = self.devices();
        let mut s = String::new();
        let _ = writeln!(s, "summary (rank {} of {devices})", f.rank);
        let shape = match f.pipeline {
            Some(p) => format!(
                "; a pipeline of {} of {}, {}",
                count(p.stages.len(), STAGES),
                count(plan.device_num, DEVICES),
                count(p.micro_batches, MICRO_BATCHES)
            ),
            None if f.micro_batches > 1 => format!("; {} a step, gradients accumulated", count(f.micro_batches, MICRO_BATCHES)),
            None => String::new(),
        };
        let _ = writeln!(s, "  devices     {devices} ({}){shape}", plan.mode);
        let _ = writeln!(s, "  strategies  {}", sources_text(plan));
        s.push_str(&self.memory_text(f));
        let t = self.predicted(f);
        let bubble = f.pipeline.map_or(String::new(), |p| {
            format!(", bubble {:.1} ms ({:.1}% idle, simulated)", 1e3 * t.bubble, 100.0 * p.simulation.bubble())
        });
        let what = if f.pipeline.is_some() { " (the busiest stage)" } else { "" };
        let _ = writeln!(
            s,
            "  step time   {:.1} ms predicted{what}: compute {:.1} ms, communication {:.1} ms{bubble}",
            1e3 * t.total(),
            1e3 * t.compute,
            1e3 * t.comm
        );
        let _ = writeln!(s, "              by the device profile {}", f.profile.name);
        s.push_str(&self.costliest_text());
        let warnings = self.warnings(f);
        if warnings.is_empty() {
            let _ = writeln!(s, "  warnings    none");
        }
        for w in warnings.iter().take(WARNINGS) {
            let _ = writeln!(s, "warning: {}", w.lines().next().unwrap_or(""));
        }
        if warnings.len() > WARNINGS {
            let _ = writeln!(s, "warning: {} more (--json lists them)", warnings.len() - WARNINGS);
        }
        s
    }

    /// The job's devices: every stage's in a pipeline.
    pub(super) fn devices(&self) -> usize {
        self.world.map_or(self.plan.device_num, |(_, n)| n)
    }

    /// The summary's figures as JSON: the predicted step time, the memory limit and every
    /// warning (with its hint).
    pub fn summary_json(&self, f: &SummaryFacts<'_>) -> Value {
        let t = self.predicted(f);
        json!({
            "rank": f.rank,
            "step_seconds": {"total": t.total(), "compute": t.compute, "communication": t.comm, "bubble": t.bubble},
            "profile": f.profile.name,
            "memory_limit": f.limit.as_ref().map(|l| json!({"bytes": l.bytes, "what": l.what, "per_device": l.per_device})),
            "warnings": self.warnings(f),
        })
    }

    /// The memory line: the total against the limit, then the parts.
    fn memory_text(&self, f: &SummaryFacts<'_>) -> String {
        let m = &self.cost.memory;
        let against = match &f.limit {
            Some(l) if l.per_device => format!(" of {} ({})", human_bytes(l.bytes as usize), l.what),
            Some(l) => format!(
                "; the {} in one process: {} of {} ({})",
                count(self.devices(), RANKS),
                human_bytes(m.total().saturating_mul(self.devices())),
                human_bytes(l.bytes as usize),
                l.what
            ),
            None => String::new(),
        };
        format!(
            "  memory      {} per device{against}\n              parameters {}, gradients {}, optimizer state {}, activations {} (their own peak {}), comm buffers {}\n",
            human_bytes(m.total()),
            human_bytes(m.parameters),
            human_bytes(m.gradients),
            human_bytes(m.optimizer_state),
            human_bytes(m.peak_activations),
            human_bytes(m.activations),
            human_bytes(m.comm_buffers)
        )
    }

    /// Every warning: the plan's own, work repeated on several devices, a pipeline's idle
    /// stages, a plan over the memory it has. One sentence each, then a hint.
    pub fn warnings(&self, f: &SummaryFacts<'_>) -> Vec<String> {
        let (plan, m) = (self.plan, &self.cost.memory);
        let mut w = plan.warnings();
        let flops: Vec<(f64, usize)> =
            plan.nodes.iter().filter(|p| !plan.graph.node(p.id).op.is_leaf()).map(|p| (slice_flops(plan, p), p.repeats())).collect();
        let total: f64 = flops.iter().map(|(f, _)| f).sum();
        let repeated: f64 = flops.iter().filter(|(_, r)| *r > 1).map(|(f, _)| f).sum();
        if total > 0.0 && repeated > 0.1 * total {
            let most = flops.iter().map(|(_, r)| *r).max().unwrap_or(1);
            w.push(format!(
                "{:.0}% of the forward FLOPs run on several devices alike (up to {most} times): those devices do the same work\nhint: strategies that split those ops over every device, or fewer devices",
                100.0 * repeated / total
            ));
        }
        if let Some(p) = f.pipeline.filter(|p| p.simulation.bubble() > 0.25) {
            w.push(format!(
                "the pipeline's stages are idle {:.0}% of the step (its bubble)\nhint: more micro-batches shrink it (--micro-batches)",
                100.0 * p.simulation.bubble()
            ));
        }
        if let Some(l) = &f.limit {
            let need = if l.per_device { m.total() } else { m.total().saturating_mul(self.devices()) };
            if need as u64 > l.bytes {
                let whose = if l.per_device { "per device" } else { "for the ranks of one process" };
                w.push(format!(
                    "the plan needs {} {whose}, more than {} ({})\nhint: split the model over more devices, recompute blocks (--recompute blocks), shard the optimizer (enable_parallel_optimizer), or run one rank a process under mpirun",
                    human_bytes(need),
                    human_bytes(l.bytes as usize),
                    l.what
                ));
            }
        }
        w
    }

    /// The step's time predicted under the summary's profile. The rank's figures are one
    /// micro-batch's: a step runs its compute and in-graph collectives once per micro-batch
    /// and syncs the gradients once. In a pipeline the figures are the whole network's on one
    /// stage's devices: the busiest stage does its share of the forward FLOPs of it, and waits
    /// the simulated bubble.
    pub fn predicted(&self, f: &SummaryFacts<'_>) -> Predicted {
        let (plan, cost) = (self.plan, self.cost);
        let price = |kind: Collective, ranks: usize, calls: usize, bytes: usize| {
            if calls == 0 {
                return 0.0;
            }
            calls as f64 * f.profile.comm_time(ranks, bytes_sent(kind, ranks, bytes / calls))
        };
        let comm: f64 = cost.comm.iter().map(|c| price(c.kind, c.group.len(), c.calls, c.bytes)).sum();
        let ranks = |axes: &[autopar_layout::DeviceAxis]| axes.iter().map(|a| a.size).product::<usize>();
        let g = &plan.gradients;
        // Level2 and level3 reduce-scatter in the pass, per micro-batch (in-graph communication).
        let after_pass = !plan.context.parallel_optimizer_config.optimizer_level.shards_gradients();
        let sync: f64 = g.buckets.iter().map(|b| price(Collective::AllReduce, ranks(&b.mirror), 1, b.bytes())).sum::<f64>()
            + g.reduce_scatter
                .iter()
                .filter(|_| after_pass)
                .map(|b| price(Collective::ReduceScatter, ranks(&b.axes), 1, b.elements * b.dtype.size()))
                .sum::<f64>();
        let (sync, in_graph) = (sync.min(comm), (comm - sync).max(0.0));
        let compute = f.profile.compute_time(cost.flops, cost.bytes_moved);
        let (share, micro, bubble) = match f.pipeline {
            Some(p) => {
                let total: f64 = p.stages.iter().map(|s| s.forward_flops).sum();
                let busiest = p.stages.iter().map(|s| s.forward_flops).fold(0.0, f64::max);
                (if total > 0.0 { busiest / total } else { 1.0 }, p.micro_batches, p.simulation.bubble())
            }
            None => (1.0, f.micro_batches.max(1), 0.0),
        };
        let m = micro as f64;
        let (compute, comm) = (compute * share * m + 0.0, (in_graph * m + sync) * share + 0.0);
        let busy = compute + comm;
        let unit = match f.pipeline {
            // The simulation's units: a stage's forward over one micro-batch 1, its backward 2.
            Some(p) if p.simulation.makespan > 0.0 => busy / (1.0 - bubble).max(1e-9) / p.simulation.makespan,
            _ => 0.0,
        };
        Predicted { compute, comm, bubble: busy * bubble / (1.0 - bubble).max(1e-9), unit }
    }

    /// The ops with the most forward FLOPs per device, and the redistributions that send the
    /// most, five each.
    fn costliest_text(&self) -> String {
        let plan = self.plan;
        let mut s = String::new();
        let mut ops: Vec<(f64, &NodePlan)> =
            plan.nodes.iter().filter(|p| !plan.graph.node(p.id).op.is_leaf()).map(|p| (slice_flops(plan, p), p)).collect();
        ops.sort_by(|a, b| b.0.total_cmp(&a.0));
        let total: f64 = ops.iter().map(|(f, _)| f).sum();
        let whole = if self.world.is_some() { ", the whole network's" } else { "" };
        let _ = writeln!(s, "  costliest ops (forward FLOPs per device, of {}{whole}):", human_flops(total));
        for (flops, p) in ops.iter().take(TOP) {
            let strategy = p.strategy_text();
            let _ = writeln!(s, "    {:<32} {:<14} {:>14}  {strategy}", p.name, p.kind, human_flops(*flops));
        }
        let mut redist: Vec<_> = plan.redistributions.iter().map(|r| (r.forward_bytes(), r)).filter(|(b, _)| *b > 0).collect();
        redist.sort_by_key(|r| std::cmp::Reverse(r.0));
        let sent: usize = redist.iter().map(|(b, _)| b).sum();
        if redist.is_empty() {
            let _ = writeln!(s, "  redistributions  none that send");
        } else {
            let _ = writeln!(
                s,
                "  costliest redistributions ({} of {}, {} sent by the busiest rank):",
                TOP.min(redist.len()),
                redist.len(),
                human_bytes(sent)
            );
            for (bytes, r) in redist.iter().take(TOP) {
                let _ = writeln!(s, "    before {:<44} {:>10}", site_text(plan, r), human_bytes(*bytes));
            }
        }
        s
    }
}
