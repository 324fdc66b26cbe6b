//! The parallel optimizer (`enable_parallel_optimizer`): memory per rank, communication and
//! step time, sharded against unsharded, on 8 simulated devices (data parallel, AdamW: two state
//! tensors per parameter), with `optimizer_weight_shard_size` off, 2, 4 and 8. Memory is the
//! plan's (parameters, gradients and optimizer state a rank holds between steps, and the peak of
//! its step's values); communication is the plan's bytes a rank sends per step (all-reduce,
//! reduce-scatter and all-gather send buffers); time is measured in this process (threads
//! sharing the machine's cores): the median over the repetitions of (long - short) / steps.
//! The models: the MLP 784-512-512-10 and a GPT of 8 blocks of width 512 (about 25M parameters).
//!
//! `cargo bench -p autopar --bench parallel_optimizer`

use std::time::Instant;

use autopar::runtime::{run_local, Job};
use autopar::runtime::{AdamW, LrSchedule, Optimizer};
use autopar_graph::DType;
use autopar_models::{model_by_name, Mode, ModelOptions};
use autopar_parallel::{ParallelContext, RankCost};
use autopar_tensor::Tensor;
use serde_json::json;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// A model of the bench: label, zoo name, options, global batch, the (short, long) step
/// counts timed, repetitions.
type Case = (&'static str, &'static str, ModelOptions, usize, (usize, usize), usize);

fn main() {
    println!("parallel optimizer on 8 simulated devices, data_parallel, AdamW");
    println!(
        "{:<24} {:<8} {:>11} {:>10} {:>10} {:>12} {:>10} {:>10} {:>9}",
        "model", "shard", "params MiB", "grads MiB", "state MiB", "peak act MiB", "total MiB", "comm MiB", "step ms"
    );
    let models: Vec<Case> = vec![
        ("mlp 784-512-512-10", "mlp", ModelOptions::default(), 64, (2, 7), 3),
        (
            "gpt 8 blocks w512 (25M)",
            "gpt",
            ModelOptions { depth: Some(8), width: Some(512), heads: Some(8), ..ModelOptions::default() },
            8,
            (1, 3),
            1,
        ),
    ];
    for (label, name, opts, batch, (short, long), reps) in &models {
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
        let data: Vec<_> = (0..*long).map(|s| vec![input(m.x, s), input(m.labels, s)]).collect();
        let mut state_whole = 0;
        for shard in [None, Some(2i64), Some(4), Some(8)] {
            let mut ctx = ParallelContext::default();
            ctx.set("device_num", &json!(8)).unwrap();
            ctx.set("parallel_mode", &json!("data_parallel")).unwrap();
            ctx.set("gradients_mean", &json!(true)).unwrap();
            if let Some(k) = shard {
                ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
                ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": k}))
                    .unwrap();
            }
            let job = Job::new(&graph, m.loss, &ctx).unwrap();
            let cost = RankCost::of(&job.program(0).unwrap().program, 2).unwrap();
            let mem = &cost.memory;
            let comm: usize = cost.comm.iter().map(|c| c.bytes).sum();
            let opt = || -> autopar::runtime::Result<Box<dyn Optimizer>> { Ok(Box::new(AdamW::new(LrSchedule::Constant(1e-3))?)) };
            let time = |steps: usize| {
                let t0 = Instant::now();
                run_local(&job, &data[..steps], opt).unwrap();
                t0.elapsed().as_secs_f64()
            };
            let mut times: Vec<f64> = (0..*reps).map(|_| (time(*long) - time(*short)) / (long - short) as f64).collect();
            times.sort_by(f64::total_cmp);
            if shard.is_none() {
                state_whole = mem.optimizer_state;
            }
            println!(
                "{:<24} {:<8} {:>11.2} {:>10.2} {:>10.2} {:>12.2} {:>10.2} {:>10.2} {:>9.1}   state 1/{:.2}",
                label,
                shard.map_or("off".to_string(), |k| k.to_string()),
                mib(mem.parameters),
                mib(mem.gradients),
                mib(mem.optimizer_state),
                mib(mem.peak_activations),
                mib(mem.total()),
                mib(comm),
                times[times.len() / 2] * 1e3,
                state_whole as f64 / mem.optimizer_state.max(1) as f64,
            );
        }
    }
}
