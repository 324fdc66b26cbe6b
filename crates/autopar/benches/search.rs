//! auto_parallel's searches measured against the exact optimum of their cost model.
//!
//! (a) Plan cost / exact optimum of each search (and of pure data parallel) for the MLP
//!     784-512-512-10, one ResNet-18 (CIFAR stem, width 16), and a 1- and a 2-block GPT
//!     (width 128, 4 heads), batch 32, on 2, 4, 8 and 16 devices.
//! (b) Planning time of each search (the whole plan: search, layouts, redistributions) for a
//!     GPT of `--depth` blocks (default 32, about 1500 ops; width 256, batch 4096) on 8, 64, 512
//!     and 4096 devices. A search that refuses shows its reason.
//!
//! `cargo bench -p autopar --bench search [-- --depth 8]`

use std::time::Instant;

use autopar_models::{model_by_name, Mode, ModelOptions};
use autopar_parallel::{compare_searches, ParallelContext, PlanRequest};
use serde_json::json;

fn context(n: usize) -> ParallelContext {
    let mut c = ParallelContext::default();
    c.set("device_num", &json!(n)).unwrap();
    c.set("parallel_mode", &json!("auto_parallel")).unwrap();
    c
}

fn options(depth: usize, width: usize) -> ModelOptions {
    ModelOptions { depth: Some(depth), width: Some(width), heads: Some(4), ..ModelOptions::default() }
}

fn main() {
    let depth: usize = std::env::args().skip_while(|a| a != "--depth").nth(1).and_then(|d| d.parse().ok()).unwrap_or(32);
    println!("(a) predicted step cost / exact optimum (1.000 = optimal); batch 32");
    println!("{:<22} {:>4}  {:>9} {:>9} {:>9} {:>9}", "model", "n", "rec", "shardprop", "dp", "data_par");
    let models: Vec<(&str, &str, ModelOptions)> = vec![
        ("mlp", "mlp", ModelOptions::default()),
        ("resnet18 (w16)", "resnet18", ModelOptions { width: Some(16), ..ModelOptions::default() }),
        ("gpt 1 block", "gpt", options(1, 128)),
        ("gpt 2 blocks", "gpt", options(2, 128)),
    ];
    for (label, name, opts) in &models {
        let model = model_by_name(name, opts).unwrap();
        let (graph, m) = model.build_graph(32, Mode::Train, 1).unwrap();
        for n in [2usize, 4, 8, 16] {
            let ctx = context(n);
            let rows =
                compare_searches(&PlanRequest { graph: &graph, loss: Some(m.loss), context: &ctx, strategy_file: None, profile: None })
                    .unwrap();
            let objective = |s: &str| rows.iter().find(|(x, _)| x.name() == s).and_then(|(_, r)| r.as_ref().ok()).map(|(r, _)| r.objective);
            let exact = objective("exact");
            let ratio = |s: &str| match (objective(s), exact) {
                (Some(o), Some(e)) if e > 0.0 => format!("{:.3}", o / e),
                _ => "-".into(),
            };
            println!(
                "{:<22} {:>4}  {:>9} {:>9} {:>9} {:>9}",
                label,
                n,
                ratio("recursive_programming"),
                ratio("sharding_propagation"),
                ratio("dynamic_programming"),
                ratio("data_parallel")
            );
        }
    }
    println!("\n(b) planning time (s), GPT {depth} blocks, width 256, 8 heads, batch 4096");
    let gpt =
        model_by_name("gpt", &ModelOptions { depth: Some(depth), width: Some(256), heads: Some(8), ..ModelOptions::default() }).unwrap();
    let (graph, m) = gpt.build_graph(4096, Mode::Train, 1).unwrap();
    println!("{} ops", graph.nodes().len());
    println!("{:>6}  {:>9} {:>9} {:>9}", "n", "rec", "shardprop", "dp");
    for n in [8usize, 64, 512, 4096] {
        let mut times = Vec::new();
        for search in ["recursive_programming", "sharding_propagation", "dynamic_programming"] {
            let mut ctx = context(n);
            ctx.set("search_mode", &json!(search)).unwrap();
            let start = Instant::now();
            let plan = autopar_parallel::plan_job(&PlanRequest {
                graph: &graph,
                loss: Some(m.loss),
                context: &ctx,
                strategy_file: None,
                profile: None,
            });
            times.push(match plan {
                Ok(_) => format!("{:.3}", start.elapsed().as_secs_f64()),
                Err(autopar_parallel::ParallelError::SearchTooWide { .. }) => "too wide".into(),
                Err(e) => format!("error: {e}"),
            });
        }
        println!("{:>6}  {:>9} {:>9} {:>9}", n, times[0], times[1], times[2]);
    }
}
