//! What a pipeline plan says, for people: each stage's ranks, operators, FLOPs, parameters
//! (shared ones named), what it sends per micro-batch and the activations it keeps, the
//! schedule's simulated bubble beside the ideal one, an SVG timeline of every stage's passes,
//! and MindSpore's `parameter_layout_dict` with its pipeline fields (8-11).

use std::fmt::Write as _;
use std::ops::Range;

use autopar_graph::{CostCx, OpKind, TensorType};
use serde_json::{json, Value};

use super::{human_bytes, human_flops};
use crate::error::{ParallelError, Result};
use crate::job::JobPlan;
use crate::pipeline::schedule::{ideal_bubble, simulate, Pass, SimCosts, Simulation};

/// One stage as one of its ranks sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct StageReport {
    /// The stage, counted from 0.
    pub stage: usize,
    /// The stage's global ranks.
    pub ranks: Range<usize>,
    /// Operators of the stage (its forward pass).
    pub ops: usize,
    /// Forward FLOPs of one micro-batch on one rank.
    pub forward_flops: f64,
    /// Parameters the stage holds, and their bytes on one rank.
    pub params: usize,
    /// Bytes of the stage's parameters on one rank.
    pub param_bytes: usize,
    /// Parameters other stages hold copies of too.
    pub shared: Vec<String>,
    /// What one rank sends per micro-batch: (name, local shape, bytes, receiving stage).
    pub sends: Vec<(String, Vec<usize>, usize, usize)>,
    /// Bytes of the values one micro-batch's forward of one chunk keeps for its backward
    /// (the mean over the stage's chunks, so an estimate when chunks differ).
    pub saved_bytes: usize,
    /// The most (chunk, micro-batch) forwards whose activations the schedule keeps at once.
    pub peak_in_flight: usize,
}

impl StageReport {
    /// Peak activation bytes: the saved values of every micro-batch in flight.
    pub fn activation_bytes(&self) -> usize {
        self.saved_bytes * self.peak_in_flight
    }
}

/// A pipeline plan summarised.
#[derive(Clone, Debug)]
pub struct PipelineReport {
    /// Every stage, in order.
    pub stages: Vec<StageReport>,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Chunks (virtual stages) per stage: more than 1 with `pipeline_interleave`.
    pub chunks: usize,
    /// `pipeline_result_broadcast`: the rank that sends inference outputs to every rank.
    pub result_broadcast_root: Option<usize>,
    /// The schedule's name as `pipeline_config.pipeline_scheduler` takes it.
    pub scheduler: &'static str,
    /// The schedule run with equal stages (forward 1, backward 2, free transfers).
    pub simulation: Simulation,
    /// The ideal bubble, `(P-1)/(v*M+P-1)` (`v` chunks per stage): the share of the step a stage is idle.
    pub ideal_bubble: f64,
}

fn bytes_of(ty: &TensorType) -> usize {
    ty.numel() * ty.dtype.size()
}

/// The report of `pp`, from the program of each stage's first rank.
pub fn pipeline_report(pp: &JobPlan) -> Result<PipelineReport> {
    let d = pp.stage_devices();
    let simulation = simulate(&pp.schedule, SimCosts::unit(pp.schedule.shape)).map_err(ParallelError::Schedule)?;
    let param_stages = pp.param_stages();
    let mut stages = Vec::with_capacity(pp.stages);
    for s in 0..pp.stages {
        let sp = pp.program(s * d)?;
        let (mut ops, mut flops, mut params, mut param_bytes) = (0, 0.0, 0, 0);
        let mut counted: Vec<&str> = Vec::new();
        let mut sends = Vec::new();
        let mut saved_total = 0;
        for chunk in sp.chunks() {
            let g = &chunk.graph;
            // The forward pass: the chunk's graph up to what it sends and its loss.
            let mut forward = vec![false; g.len()];
            for v in chunk.forward_fetch() {
                forward[v.0] = true;
            }
            for i in (0..g.len()).rev() {
                if forward[i] {
                    for x in &g.nodes()[i].inputs {
                        forward[x.0] = true;
                    }
                }
            }
            for (i, n) in g.nodes().iter().enumerate() {
                match &n.op {
                    OpKind::Parameter(_) if !counted.contains(&n.name.as_str()) => {
                        counted.push(&n.name);
                        params += 1;
                        param_bytes += bytes_of(&n.ty);
                    }
                    OpKind::Parameter(_) | OpKind::Input(_) => {}
                    _ if forward[i] && !n.inputs.is_empty() => {
                        ops += 1;
                        let ins: Vec<TensorType> = n.inputs.iter().map(|x| g.node(*x).ty.clone()).collect();
                        flops += n.op.def().cost(&CostCx { inputs: &ins, output: &n.ty, rank: 0 }).flops;
                    }
                    _ => {}
                }
            }
            let to = (chunk.piece + 1) % pp.stages;
            sends.extend(chunk.send.iter().map(|&v| (g.node(v).name.clone(), g.node(v).ty.shape.to_vec(), bytes_of(&g.node(v).ty), to)));
            saved_total += chunk.saved.iter().map(|&v| bytes_of(&g.node(v).ty)).sum::<usize>();
        }
        let shared = param_stages.iter().filter(|(_, st)| st.len() > 1 && st.contains(&s)).map(|(n, _)| n.clone()).collect();
        stages.push(StageReport {
            stage: s,
            ranks: s * d..(s + 1) * d,
            ops,
            forward_flops: flops,
            params,
            param_bytes,
            shared,
            sends,
            saved_bytes: saved_total / pp.chunks,
            peak_in_flight: simulation.peak_in_flight[s],
        });
    }
    Ok(PipelineReport {
        stages,
        micro_batches: pp.micro_batches,
        chunks: pp.chunks,
        result_broadcast_root: pp.result_broadcast.then_some((pp.stages - 1) * d),
        scheduler: pp.schedule.scheduler.name(),
        ideal_bubble: ideal_bubble(pp.schedule.shape),
        simulation,
    })
}

impl PipelineReport {
    /// The report as text for people: the pipeline's shape and bubble, then one line per stage.
    pub fn text(&self) -> String {
        let mut o = String::new();
        let p = self.stages.len();
        let interleave = if self.chunks > 1 { format!(", {} chunks per stage (interleaved)", self.chunks) } else { String::new() };
        let _ = writeln!(
            o,
            "pipeline: {p} stages of {} device(s){interleave}, {} micro-batches, {} schedule",
            self.stages.first().map_or(0, |s| s.ranks.len()),
            self.micro_batches,
            self.scheduler
        );
        let ideal = if self.chunks > 1 { "(P-1)/(v*M+P-1)" } else { "(P-1)/(M+P-1)" };
        let _ = writeln!(
            o,
            "  bubble {:.1}% simulated with equal stages ({ideal} = {:.1}%)",
            100.0 * self.simulation.bubble(),
            100.0 * self.ideal_bubble
        );
        if let Some(root) = self.result_broadcast_root {
            let _ = writeln!(
                o,
                "  inference outputs: broadcast from rank {root} (the last stage's first) to every rank (pipeline_result_broadcast)"
            );
        }
        for s in &self.stages {
            let _ = writeln!(
                o,
                "stage {} (ranks {}..{}): {} ops, {} forward per micro-batch, {} parameters ({}), activations {} per micro-batch x {} in flight = {}",
                s.stage,
                s.ranks.start,
                s.ranks.end,
                s.ops,
                human_flops(s.forward_flops),
                s.params,
                human_bytes(s.param_bytes),
                human_bytes(s.saved_bytes),
                s.peak_in_flight,
                human_bytes(s.activation_bytes())
            );
            if !s.shared.is_empty() {
                let _ = writeln!(o, "  shared with other stages: {}", s.shared.join(", "));
            }
            for (name, shape, bytes, to) in &s.sends {
                let _ = writeln!(
                    o,
                    "  sends {name} {shape:?} ({}) to stage {to} (rank r{:+}) per micro-batch",
                    human_bytes(*bytes),
                    (*to as i64 - s.stage as i64) * s.ranks.len() as i64
                );
            }
        }
        o
    }

    /// The report as JSON.
    pub fn json(&self) -> Value {
        json!({
            "stages": self.stages.iter().map(|s| json!({
                "stage": s.stage,
                "ranks": [s.ranks.start, s.ranks.end],
                "ops": s.ops,
                "forward_flops": s.forward_flops,
                "params": s.params,
                "param_bytes": s.param_bytes,
                "shared": s.shared,
                "sends": s.sends.iter().map(|(n, sh, b, to)| json!({"name": n, "shape": sh, "bytes": b, "to_stage": to})).collect::<Vec<_>>(),
                "saved_bytes_per_micro_batch": s.saved_bytes,
                "peak_in_flight": s.peak_in_flight,
                "activation_bytes": s.activation_bytes(),
            })).collect::<Vec<_>>(),
            "micro_batches": self.micro_batches,
            "chunks": self.chunks,
            "result_broadcast_root": self.result_broadcast_root,
            "scheduler": self.scheduler,
            "bubble": self.simulation.bubble(),
            "ideal_bubble": self.ideal_bubble,
        })
    }

    /// The simulated schedule as an SVG timeline: one row per stage, a box per pass (forward
    /// light, backward dark) labelled with its micro-batch (`micro.chunk` when interleaved),
    /// the stage's idle time hatched behind them and its share written at the row's end, a
    /// legend, and a time axis: in predicted milliseconds when `unit_seconds` gives the
    /// simulation's unit (a stage's forward pass over one micro-batch) in seconds, else in
    /// that unit.
    pub fn svg(&self, unit_seconds: Option<f64>) -> String {
        let sim = &self.simulation;
        let (row, left, width, top) = (28.0, 70.0, 900.0, 50.0);
        let scale = if sim.makespan > 0.0 { width / sim.makespan } else { 0.0 };
        let axis_y = top + row * sim.spans.len() as f64 + 8.0;
        let height = axis_y + 40.0;
        let mut o = String::new();
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
            left + width + 80.0
        );
        let _ = writeln!(
            o,
            r##"<defs><pattern id="idle" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#f0f0f0"/><line x1="0" y1="0" x2="0" y2="6" stroke="#bbb" stroke-width="2"/></pattern></defs>"##
        );
        let _ = writeln!(
            o,
            r#"<text x="4" y="14">{} schedule, {} stages, {} micro-batches: bubble {:.1}% (ideal {:.1}%)</text>"#,
            self.scheduler,
            sim.spans.len(),
            self.micro_batches,
            100.0 * sim.bubble(),
            100.0 * self.ideal_bubble
        );
        // The legend.
        for (k, (fill, what)) in [("#9ecae1", "forward"), ("#3182bd", "backward"), ("url(#idle)", "idle")].iter().enumerate() {
            let x = left + k as f64 * 110.0;
            let _ = writeln!(
                o,
                r##"<rect x="{x}" y="22" width="16" height="12" fill="{fill}" stroke="#888"/><text x="{}" y="32">{what}</text>"##,
                x + 20.0
            );
        }
        let _ = writeln!(o, r#"<text x="{}" y="32">box label: micro-batch (.chunk)</text>"#, left + 330.0);
        for (s, spans) in sim.spans.iter().enumerate() {
            let y = top + row * s as f64;
            let _ = writeln!(o, r#"<text x="4" y="{}">stage {s}</text>"#, y + row * 0.6);
            let _ = writeln!(o, r##"<rect x="{left}" y="{y:.1}" width="{width}" height="{:.1}" fill="url(#idle)"/>"##, row - 4.0);
            for (w, start, end) in spans {
                let (fill, color) = if w.pass == Pass::Forward { ("#9ecae1", "#000") } else { ("#3182bd", "#fff") };
                let x = left + start * scale;
                let wd = ((end - start) * scale).max(1.0);
                let label = if w.chunk > 0 { format!("{}.{}", w.micro, w.chunk) } else { w.micro.to_string() };
                let _ = write!(
                    o,
                    r##"<rect x="{x:.1}" y="{y:.1}" width="{wd:.1}" height="{:.1}" fill="{fill}" stroke="#fff"><title>{label}</title></rect>"##,
                    row - 4.0
                );
                // The label where it fits (about 6.2 px a character at 11 px), else in the title.
                if wd >= label.len() as f64 * 6.2 + 2.0 {
                    let _ = write!(
                        o,
                        r##"<text x="{:.1}" y="{:.1}" fill="{color}" text-anchor="middle">{label}</text>"##,
                        x + wd / 2.0,
                        y + row * 0.6
                    );
                }
                o.push('\n');
            }
            let idle = if sim.makespan > 0.0 { 1.0 - sim.busy.get(s).copied().unwrap_or(0.0) / sim.makespan } else { 0.0 };
            let _ = writeln!(o, r#"<text x="{}" y="{}">idle {:.0}%</text>"#, left + width + 6.0, y + row * 0.6, 100.0 * idle);
        }
        // The time axis: five intervals.
        let _ = writeln!(o, r##"<line x1="{left}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="#000"/>"##, left + width);
        let unit = match unit_seconds {
            Some(u) if u > 0.0 => ("ms, predicted", 1e3 * u),
            _ => ("units (a stage's forward pass over one micro-batch: 1)", 1.0),
        };
        for k in 0..=5 {
            let t = sim.makespan * k as f64 / 5.0;
            let x = left + t * scale;
            let _ = writeln!(
                o,
                r##"<line x1="{x:.1}" y1="{axis_y}" x2="{x:.1}" y2="{}" stroke="#000"/><text x="{x:.1}" y="{}" text-anchor="middle">{:.1}</text>"##,
                axis_y + 4.0,
                axis_y + 16.0,
                t * unit.1
            );
        }
        let _ = writeln!(o, r#"<text x="{left}" y="{}">time, {}</text>"#, axis_y + 32.0, unit.0);
        o.push_str("</svg>\n");
        o
    }
}

/// MindSpore's `parameter_layout_dict` on global rank `rank` of a pipeline job: every network
/// input and parameter laid out on its stage's devices, and for a parameter that several
/// stages use (a shared parameter) the pipeline fields: `pipeline_shared`; `is_send` on the
/// first stage using it, which owns the master copy, with `peer_rank` the same position on the
/// next stage using it; on the others `peer_rank` is the owner's rank; `sr_tag` numbers the
/// shared parameters from 1 in graph order.
pub fn pipeline_layout_dict(pp: &JobPlan, rank: usize) -> Vec<(String, autopar_layout::ParameterLayout)> {
    let (stage, pos) = pp.place(rank);
    let d = pp.stage_devices();
    let shared: Vec<(String, Vec<usize>)> = pp.param_stages().into_iter().filter(|(_, s)| s.len() > 1).collect();
    crate::report::parameter_layout_dict(&pp.plan, pos, &|_| Vec::new())
        .into_iter()
        .map(|(name, mut l)| {
            // The optimizer-shard group in world ranks (the stage's plan names positions).
            if let Some(shard) = pp.plan.param(&name).and_then(|p| p.opt.shard()) {
                let group: Vec<usize> = shard.group(pos).iter().map(|&r| stage * d + r).collect();
                l.opt_shard_group = crate::group_name(&group, pp.device_num);
            }
            if let Some(k) = shared.iter().position(|(n, _)| *n == name) {
                let stages = &shared[k].1;
                l.pipeline_shared = true;
                l.sr_tag = k as i64 + 1;
                l.is_send = stage == stages[0];
                l.peer_rank = if l.is_send { stages[1] * d + pos } else { stages[0] * d + pos } as i64;
            }
            (name, l)
        })
        .collect()
}
