//! Planning time of a large job: a 32-block GPT (width 1024, 16 heads, context 64, vocab 256)
//! for 4096 devices, under the default data-parallel strategies and under a Megatron-style
//! model-parallel split of every block (attention heads and MLP over 8 devices, data parallel
//! over 512). Each figure is the median of 9 runs of the whole pipeline `autopar plan` runs:
//! build the graph, plan it, make rank 0's program (forward, backward, buckets) and predict its
//! cost.
//!
//! `cargo bench -p autopar --bench plan`

use std::time::Instant;

use autopar_graph::Graph;
use autopar_layout::Strategy;
use autopar_models::{Gpt, GptConfig, Mode, Model};
use autopar_parallel::{plan_network, rank_program, ParallelContext, PlanRequest, RankCost};
use serde_json::json;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Megatron-style strategies on every block: q/k/v and the first MLP layer split on their
/// output columns over `mp` devices, the attention output and second MLP layer on their rows.
fn megatron(g: &mut Graph, mp: usize, dp: usize) {
    for i in 0..g.len() {
        let id = autopar_graph::NodeId(i);
        let name = g.node(id).name.clone();
        let s = if name.ends_with("q_proj.matmul")
            || name.ends_with("k_proj.matmul")
            || name.ends_with("v_proj.matmul")
            || name.ends_with("mlp.fc1.matmul")
        {
            format!("(({dp}, 1), ({mp}, 1))")
        } else if name.ends_with("out_proj.matmul") || name.ends_with("mlp.fc2.matmul") {
            format!("(({dp}, {mp}), (1, {mp}))")
        } else {
            continue;
        };
        g.set_strategy(id, s.parse::<Strategy>().unwrap()).unwrap();
    }
}

fn main() {
    let devices = 4096;
    let cfg = GptConfig { layers: 32, width: 1024, heads: 16, context: 64, vocab: 256, ..GptConfig::default() };
    let gpt = Gpt::new(cfg).unwrap();
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(devices)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    for (label, split) in [("default (data parallel)", false), ("Megatron 8-way model parallel x 512 data parallel", true)] {
        let mut times = Vec::new();
        let mut summary = String::new();
        for _ in 0..9 {
            let start = Instant::now();
            let (mut graph, m) = gpt.build_graph(devices, Mode::Train, 1).unwrap();
            if split {
                megatron(&mut graph, 8, devices / 8);
            }
            let plan = plan_network(&PlanRequest { graph: &graph, loss: Some(m.loss), context: &ctx, strategy_file: None, profile: None })
                .unwrap();
            let program = rank_program(&plan, 0).unwrap();
            let cost = RankCost::of(&program, 1).unwrap();
            times.push(start.elapsed().as_secs_f64());
            summary = format!(
                "{} ops, {} redistributions, rank 0: {} program nodes, {:.1} GFLOP, {:.1} MiB sent, {:.1} MiB memory",
                graph.len(),
                plan.redistributions.len(),
                program.graph.len(),
                cost.flops / 1e9,
                cost.comm_bytes() as f64 / (1 << 20) as f64,
                cost.memory.total() as f64 / (1 << 20) as f64
            );
        }
        println!("plan a 32-block GPT for {devices} devices, {label}: {:.3} s (median of 9)\n  {summary}", median(times));
    }
}
