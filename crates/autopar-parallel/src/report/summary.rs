//! The summary `autopar plan` prints first: in at most 30 lines, the model and its size, the
//! mode and devices, who chose the strategies, the memory per device against what the device
//! has, the predicted step time split into compute, communication and the pipeline's bubble,
//! the costliest ops and redistributions, and the warnings. The full tables follow on request.

use std::fmt::Write as _;

use autopar_graph::{CostCx, TensorType};

use super::{human_bytes, human_flops, site_text, PipelineReport, PlanReport};
use crate::plan::{NodePlan, ParallelPlan};
use crate::search::{DeviceProfile, StrategySource};

/// What the summary needs beside the plan and its rank's cost.
pub struct SummaryFacts<'a> {
    /// The device profile that prices the step's time (`--profile`, else the built-in one).
    pub profile: &'a DeviceProfile,
    /// The memory a device has for the plan, and what says so (`device_memory_capacity`, the
    /// machine's available memory); None when unknown.
    pub limit: Option<(u64, String)>,
    /// Micro-batches per step: the rank's figures are one micro-batch's when more than 1.
    pub micro_batches: usize,
    /// The pipeline's report, for a pipelined job.
    pub pipeline: Option<&'a PipelineReport>,
}

/// A step's predicted time, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Predicted {
    /// Arithmetic and memory traffic.
    pub compute: f64,
    /// The collectives (in-graph and gradient sync).
    pub comm: f64,
    /// A pipeline stage's idle time: the bubble.
    pub bubble: f64,
    /// The micro-batches the step runs.
    pub micro_batches: usize,
}

impl Predicted {
    /// The whole step.
    pub fn total(&self) -> f64 {
        self.compute + self.comm + self.bubble
    }

    /// A pipeline's time unit (its schedule's simulation: a stage's forward pass over one
    /// micro-batch takes 1, its backward 2), in seconds.
    pub fn pipeline_unit(&self) -> f64 {
        (self.compute + self.comm) / (3.0 * self.micro_batches.max(1) as f64)
    }
}

/// How many ops and redistributions the summary lists.
const TOP: usize = 5;

/// The forward FLOPs of `p`'s slice on one device: its cost on the slices of its inputs.
fn slice_flops(plan: &ParallelPlan, p: &NodePlan) -> f64 {
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
    let search = plan.search.as_ref().map(|r| format!(" (search: {})", r.search.name())).unwrap_or_default();
    if parts.is_empty() {
        format!("none: every op follows its inputs{search}")
    } else {
        format!("{}{search}", parts.join(", "))
    }
}

impl PlanReport<'_> {
    /// The summary: at most 30 lines (see the module's text).
    pub fn summary(&self, f: &SummaryFacts<'_>) -> String {
        let (plan, cost) = (self.plan, self.cost);
        let mut s = String::new();
        let _ = writeln!(s, "summary (rank {} of {})", cost.rank, self.world.map_or(plan.device_num, |(_, n)| n));
        let values: usize = plan.params.iter().map(|p| p.layout.shape().iter().product::<usize>()).sum();
        let bytes: usize = plan.params.iter().map(|p| p.layout.shape().iter().product::<usize>() * p.dtype.size()).sum();
        let _ = writeln!(
            s,
            "  model       {} ops, {} parameters: {values} values, {}",
            plan.nodes.len(),
            plan.params.len(),
            human_bytes(bytes)
        );
        let shape = match f.pipeline {
            Some(p) => {
                format!("; a pipeline of {} stages of {} devices, {} micro-batches", p.stages.len(), plan.device_num, p.micro_batches)
            }
            None if f.micro_batches > 1 => format!("; {} micro-batches a step, gradients accumulated", f.micro_batches),
            None => String::new(),
        };
        let _ = writeln!(s, "  devices     {} ({}){shape}", self.world.map_or(plan.device_num, |(_, n)| n), plan.mode);
        let _ = writeln!(s, "  strategies  {}", sources_text(plan));
        let m = &cost.memory;
        let against = match &f.limit {
            Some((limit, what)) if m.total() as u64 > *limit => format!(" OVER {} ({what})", human_bytes(*limit as usize)),
            Some((limit, what)) => format!(" of {} ({what})", human_bytes(*limit as usize)),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "  memory      {} per device{against}\n              parameters {}, gradients {}, optimizer state {}, activations {} at the peak ({} alone), comm buffers {}",
            human_bytes(m.total()),
            human_bytes(m.parameters),
            human_bytes(m.gradients),
            human_bytes(m.optimizer_state),
            human_bytes(m.peak_activations),
            human_bytes(m.activations),
            human_bytes(m.comm_buffers)
        );
        s.push_str(&self.time_text(f));
        s.push_str(&self.costliest_text());
        let mut warnings = plan.warnings();
        if let Some((limit, what)) = f.limit.as_ref().filter(|(limit, _)| m.total() as u64 > *limit) {
            warnings.push(format!(
                "the plan needs {} per device, more than {} ({what})\nhint: split the model over more devices, recompute blocks (--recompute blocks), or shard the optimizer (enable_parallel_optimizer)",
                human_bytes(m.total()),
                human_bytes(*limit as usize)
            ));
        }
        if warnings.is_empty() {
            let _ = writeln!(s, "  warnings    none");
        }
        for w in warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }

    /// The step's time predicted under the summary's profile. The rank's figures are one
    /// micro-batch's; a step runs every micro-batch (the gradient sync counted in each: an
    /// upper bound). In a pipeline the figures are the whole network's on one stage's devices:
    /// the busiest stage does its share of the forward FLOPs of it, and waits the simulated
    /// bubble.
    pub fn predicted(&self, f: &SummaryFacts<'_>) -> Predicted {
        let cost = self.cost;
        let compute = f.profile.compute_time(cost.flops, cost.bytes_moved);
        let comm: f64 =
            cost.comm.iter().filter(|c| c.calls > 0).map(|c| c.calls as f64 * f.profile.comm_time(c.group.len(), c.bytes / c.calls)).sum();
        let (share, micro, bubble) = match f.pipeline {
            Some(p) => {
                let total: f64 = p.stages.iter().map(|s| s.forward_flops).sum();
                let busiest = p.stages.iter().map(|s| s.forward_flops).fold(0.0, f64::max);
                (if total > 0.0 { busiest / total } else { 1.0 }, p.micro_batches, p.simulation.bubble())
            }
            None => (1.0, f.micro_batches.max(1), 0.0),
        };
        let (compute, comm) = (compute * share * micro as f64, comm * share * micro as f64);
        Predicted { compute, comm, bubble: (compute + comm) * bubble / (1.0 - bubble).max(1e-9), micro_batches: micro }
    }

    fn time_text(&self, f: &SummaryFacts<'_>) -> String {
        let t = self.predicted(f);
        let micro = t.micro_batches;
        let what = match (f.pipeline, micro) {
            (Some(_), _) => format!(" (the busiest stage, {micro} micro-batches)"),
            (None, 1) => String::new(),
            (None, m) => format!(" ({m} micro-batches)"),
        };
        let bubble = f.pipeline.map_or(String::new(), |p| {
            format!(", pipeline bubble {:.1} ms ({:.1}% of the step, simulated)", 1e3 * t.bubble, 100.0 * p.simulation.bubble())
        });
        format!(
            "  step time   {:.1} ms predicted{what} by the profile {}: compute {:.1} ms, communication {:.1} ms{bubble}\n",
            1e3 * t.total(),
            f.profile.name,
            1e3 * t.compute,
            1e3 * t.comm
        )
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
        let _ = writeln!(s, "  costliest ops (forward FLOPs per device, of {}):", human_flops(total));
        for (flops, p) in ops.iter().take(TOP) {
            let strategy = p.strategy.as_ref().map(|x| x.to_string()).unwrap_or_else(|| "-".into());
            let _ = writeln!(s, "    {:<32} {:<14} {:>14}  {strategy}", p.name, p.kind, human_flops(*flops));
        }
        let mut redist: Vec<_> = plan.redistributions.iter().map(|r| (r.forward_bytes(), r)).collect();
        redist.sort_by_key(|r| std::cmp::Reverse(r.0));
        let sent: usize = redist.iter().map(|(b, _)| b).sum();
        if redist.is_empty() {
            let _ = writeln!(s, "  redistributions  none");
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
