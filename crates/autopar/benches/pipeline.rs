//! Pipeline schedules: bubbles and activation memory, simulated and measured.
//!
//! (a) Simulated bubble of GPipe, 1F1B and interleaved 1F1B (2 virtual stages) against the
//!     textbook fractions (P-1)/(M+P-1) and (P-1)/(vM+P-1), and the most micro-batches a stage
//!     holds activations for (1F1B: P-s on stage s; GPipe: M).
//! (b) Measured on 8 simulated devices (threads): the GPT (4 blocks, width 64, batch M*4) cut
//!     into P stages of equal FLOPs, the ranks' mean idle share of a step beside the simulated
//!     bubble, and samples per second, for P in {2, 4}, M in {4, 8}, GPipe, 1F1B and
//!     interleaved 1F1B with 2 chunks per stage (`1f1b-i2`); beside
//!     it the same work without stages (data parallel over the 8 devices, P = 1).
//! (c) Peak activation memory per rank against M (the plan's figures: the values one
//!     micro-batch's forward keeps for its backward times the micro-batches a stage holds at
//!     once, largest stage): the same GPT on 8 devices in 4 stages, 4 rows per device and
//!     micro-batch, GPipe against 1F1B.
//!
//! `cargo bench -p autopar --bench pipeline`

use std::time::Instant;

use autopar_models::{model_by_name, Mode, ModelOptions};
use autopar_parallel::pipeline::{build, ideal_bubble, simulate, PipelineShape, SimCosts};
use autopar_parallel::report::pipeline_report;
use autopar_parallel::{ParallelContext, PipelineScheduler, PlanRequest};
use autopar_runtime::{run_local, Job};
use autopar_runtime::{LrSchedule, Momentum, Optimizer};
use autopar_tensor::Tensor;
use serde_json::json;

fn main() {
    println!("(a) simulated bubble vs textbook, and peak micro-batches in flight per stage");
    println!("{:<10} {:>2} {:>3} {:>2}  {:>8} {:>8}  in flight", "schedule", "P", "M", "v", "bubble", "formula");
    for p in [2usize, 4, 8] {
        for m in [p, 2 * p, 4 * p] {
            for (name, sched, v) in [
                ("gpipe", PipelineScheduler::GPipe, 1),
                ("1f1b", PipelineScheduler::OneFOneB, 1),
                ("interleave", PipelineScheduler::OneFOneB, 2),
            ] {
                let shape = PipelineShape::new(p, m, v);
                let sim = simulate(&build(shape, sched).unwrap(), SimCosts::unit(shape)).unwrap();
                println!("{name:<10} {p:>2} {m:>3} {v:>2}  {:>8.4} {:>8.4}  {:?}", sim.bubble(), ideal_bubble(shape), sim.peak_in_flight);
            }
        }
    }
    println!();
    println!("(b) measured on 8 simulated devices: GPT 4 blocks, width 64, 4 rows per device and micro-batch");
    println!("{:<8} {:>2} {:>2}  {:>10} {:>10} {:>10}", "sched", "P", "M", "measured", "simulated", "samples/s");
    let opts = ModelOptions { depth: Some(4), width: Some(64), heads: Some(4), ..ModelOptions::default() };
    let model = model_by_name("gpt", &opts).unwrap();
    for (p, m) in [(2usize, 4usize), (2, 8), (4, 4), (4, 8)] {
        for (name, sched, chunks) in [("gpipe", "gpipe", 1usize), ("1f1b", "1f1b", 1), ("1f1b-i2", "1f1b", 2)] {
            let micro_rows = 4 * (8 / p);
            let (g, mm) = model.build_graph(micro_rows, Mode::Train, 1).unwrap();
            let mut ctx = ParallelContext::default();
            ctx.set("device_num", &json!(8)).unwrap();
            ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
            ctx.set("pipeline_stages", &json!(p)).unwrap();
            ctx.set("pipeline_config", &json!({"pipeline_scheduler": sched, "pipeline_interleave": chunks > 1})).unwrap();
            let job = Job::with_micro_batches(&g, mm.loss, &ctx, m).unwrap();
            let x = g.node(mm.x).clone();
            let y = g.node(mm.labels).clone();
            let rows = micro_rows * m;
            let mut xs = x.ty.shape.clone();
            xs[0] = rows;
            let mut ys = y.ty.shape.clone();
            ys[0] = rows;
            let batch = vec![
                (
                    x.name.clone(),
                    Tensor::from_vec(&xs, (0..xs.iter().product::<usize>()).map(|i| (i % 97) as i64).collect::<Vec<i64>>()).unwrap(),
                ),
                (
                    y.name.clone(),
                    Tensor::from_vec(&ys, (0..ys.iter().product::<usize>()).map(|i| (i % 89) as i64).collect::<Vec<i64>>()).unwrap(),
                ),
            ];
            let steps = 6;
            let data = vec![batch; steps];
            let t0 = Instant::now();
            let run =
                run_local(&job, &data, || Ok(Box::new(Momentum::new(LrSchedule::Constant(0.01), 0.9)?) as Box<dyn Optimizer>)).unwrap();
            let secs = t0.elapsed().as_secs_f64();
            // Steps after the first (warm), every rank.
            let measured: Vec<f64> = run.bubbles.iter().flat_map(|b| b[1..].iter().copied()).collect();
            let measured = measured.iter().sum::<f64>() / measured.len() as f64;
            let shape = PipelineShape::new(p, m, chunks);
            let sched_kind = if sched == "gpipe" { PipelineScheduler::GPipe } else { PipelineScheduler::OneFOneB };
            let sim = simulate(&build(shape, sched_kind).unwrap(), SimCosts::unit(shape)).unwrap();
            println!("{name:<8} {p:>2} {m:>2}  {measured:>10.3} {:>10.3} {:>10.1}", sim.bubble(), (steps * rows) as f64 / secs);
        }
    }
    // P = 1: no stages, the batch of a P = 2, M = 4 step split over the 8 devices.
    let rows = 4 * 4 * 4;
    let (g, mm) = model.build_graph(rows, Mode::Train, 1).unwrap();
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(8)).unwrap();
    ctx.set("parallel_mode", &json!("data_parallel")).unwrap();
    let job = Job::new(&g, mm.loss, &ctx).unwrap();
    let tokens = |id: autopar_graph::NodeId, m: usize| {
        let n = g.node(id);
        (n.name.clone(), Tensor::from_vec(&n.ty.shape, (0..n.ty.numel()).map(|i| (i % m) as i64).collect::<Vec<i64>>()).unwrap())
    };
    let steps = 6;
    let data = vec![vec![tokens(mm.x, 97), tokens(mm.labels, 89)]; steps];
    let t0 = Instant::now();
    run_local(&job, &data, || Ok(Box::new(Momentum::new(LrSchedule::Constant(0.01), 0.9)?) as Box<dyn Optimizer>)).unwrap();
    println!("{:<8} {:>2} {:>2}  {:>10} {:>10} {:>10.1}", "-", 1, 1, "-", "-", (steps * rows) as f64 / t0.elapsed().as_secs_f64());

    println!();
    println!("(c) peak activation memory per rank (MiB, largest stage), GPT 4 blocks width 64, 8 devices in 4 stages");
    println!("{:>3}  {:>10} {:>10}", "M", "gpipe", "1f1b");
    let (g, mm) = model.build_graph(4 * 2, Mode::Train, 1).unwrap();
    for m in [4usize, 8, 16] {
        let mut row = Vec::new();
        for sched in ["gpipe", "1f1b"] {
            let mut ctx = ParallelContext::default();
            ctx.set("device_num", &json!(8)).unwrap();
            ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
            ctx.set("pipeline_stages", &json!(4)).unwrap();
            ctx.set("pipeline_config", &json!({"pipeline_scheduler": sched})).unwrap();
            let req = PlanRequest { graph: &g, loss: Some(mm.loss), context: &ctx, strategy_file: None, profile: None };
            let report = pipeline_report(&autopar_parallel::plan_stages(&req, m).unwrap()).unwrap();
            let peak = report.stages.iter().map(|s| s.activation_bytes()).max().unwrap_or(0);
            row.push(peak as f64 / (1 << 20) as f64);
        }
        println!("{m:>3}  {:>10.2} {:>10.2}", row[0], row[1]);
    }
}
