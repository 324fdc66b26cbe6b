//! The parallel optimizer (`enable_parallel_optimizer`): memory per rank and step time, sharded
//! against unsharded, on 8 simulated devices (data parallel, AdamW: two state tensors per
//! parameter). Memory is the plan's (parameters, gradients and optimizer state a rank holds
//! between steps, and the peak of its step's values); time is measured in this process
//! (threads sharing the machine's cores): the median over 3 repetitions of (7 steps - 2 steps) / 5.
//!
//! `cargo bench -p autopar --bench parallel_optimizer`

use std::time::Instant;

use autopar::runtime::parallel::{run_local, ParallelJob};
use autopar::runtime::{AdamW, LrSchedule, Optimizer};
use autopar_graph::DType;
use autopar_models::{model_by_name, Mode, ModelOptions};
use autopar_parallel::{ParallelContext, RankCost};
use autopar_tensor::Tensor;
use serde_json::json;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn main() {
    println!("parallel optimizer on 8 simulated devices, data_parallel, AdamW");
    println!(
        "{:<22} {:<9} {:>11} {:>10} {:>10} {:>11} {:>10} {:>9}",
        "model", "optimizer", "params MiB", "grads MiB", "state MiB", "peak act MiB", "total MiB", "step ms"
    );
    let models: Vec<(&str, &str, ModelOptions, usize)> = vec![
        ("mlp 784-512-512-10", "mlp", ModelOptions::default(), 64),
        ("gpt 4 blocks (w128)", "gpt", ModelOptions { depth: Some(4), width: Some(128), heads: Some(4), ..ModelOptions::default() }, 16),
    ];
    for (label, name, opts, batch) in &models {
        let model = model_by_name(name, opts).unwrap();
        let (graph, m) = model.build_graph(*batch, Mode::Train, 1).unwrap();
        let classes = *graph.node(m.logits).ty.shape.last().unwrap();
        let input = |id: autopar_graph::NodeId, salt: usize| {
            let n = graph.node(id);
            let t = match n.ty.dtype {
                DType::I64 => {
                    Tensor::from_vec(&n.ty.shape, (0..n.ty.numel()).map(|i| ((i * 7 + salt) % classes) as i64).collect::<Vec<i64>>())
                }
                _ => Tensor::from_vec(
                    &n.ty.shape,
                    (0..n.ty.numel()).map(|i| ((i * 7 + salt) % 19) as f32 / 19.0 - 0.5).collect::<Vec<f32>>(),
                ),
            };
            (n.name.clone(), t.unwrap())
        };
        let data: Vec<_> = (0..7).map(|s| vec![input(m.x, s), input(m.labels, s)]).collect();
        for sharded in [false, true] {
            let mut ctx = ParallelContext::default();
            ctx.set("device_num", &json!(8)).unwrap();
            ctx.set("parallel_mode", &json!("data_parallel")).unwrap();
            ctx.set("gradients_mean", &json!(true)).unwrap();
            if sharded {
                ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
                ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0})).unwrap();
            }
            let job = ParallelJob::new(graph.clone(), m.loss, ctx).unwrap();
            let mem = RankCost::of(&job.program(0).unwrap(), 2).unwrap().memory;
            let opt = || -> autopar::runtime::Result<Box<dyn Optimizer>> { Ok(Box::new(AdamW::new(LrSchedule::Constant(1e-3))?)) };
            let time = |steps: usize| {
                let t0 = Instant::now();
                run_local(&job, &data[..steps], opt).unwrap();
                t0.elapsed().as_secs_f64()
            };
            let mut reps: Vec<f64> = (0..3).map(|_| (time(7) - time(2)) / 5.0).collect();
            reps.sort_by(f64::total_cmp);
            println!(
                "{:<22} {:<9} {:>11.2} {:>10.2} {:>10.2} {:>11.2} {:>10.2} {:>9.2}",
                label,
                if sharded { "sharded" } else { "whole" },
                mib(mem.parameters),
                mib(mem.gradients),
                mib(mem.optimizer_state),
                mib(mem.peak_activations),
                mib(mem.total()),
                reps[1] * 1e3
            );
        }
    }
}
