//! auto_parallel's searches measured against the exact optimum of their cost model.
//!
//! (a) Plan cost / exact optimum of each search (and of pure data parallel) for the MLP
//!     784-512-512-10, one ResNet-18 (CIFAR stem, width 16), and a 1- and a 2-block GPT
//!     (width 128, 4 heads), batch 32, on 2, 4, 8 and 16 devices.
//! (b) Planning time of each search (the whole plan: search, layouts, redistributions) for a
//!     GPT of `--depth` blocks (default 32, about 1500 ops; width 256, batch 4096) on 8, 64, 512
//!     and 4096 devices. A search that refuses shows its reason.
//! (c) Predicted against measured step time: the distinct plans the searches (and pure data
//!     parallel and the exact optimum) give four small models on 8 simulated devices, each
//!     replayed from its operators' strategies and trained in this process (median over 3
//!     repetitions of the time of 5 steps); Spearman's rank correlation of the two columns.
//!     The devices are threads sharing this machine's cores, where the model assumes a device
//!     each: the correlation says how well the model orders plans here.
//!
//! `cargo bench -p autopar --bench search [-- --depth 8] [-- --skip-measured]`

use std::time::Instant;

use autopar::runtime::{run_local, Job};
use autopar::runtime::{LrSchedule, Momentum, Optimizer};
use autopar_graph::{DType, Graph};
use autopar_models::{model_by_name, Mode, ModelGraph, ModelOptions};
use autopar_parallel::{compare_searches, ParallelContext, PlanRequest, StrategyItems};
use autopar_tensor::Tensor;
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

/// Random batches for a zoo model's graph: inputs in [-1, 1] (token ids below the vocabulary),
/// labels below the class count.
fn batches(graph: &Graph, m: &ModelGraph, steps: usize) -> Vec<Vec<(String, Tensor)>> {
    let classes = *graph.node(m.logits).ty.shape.last().unwrap() as u64;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..steps)
        .map(|_| {
            [m.x, m.labels]
                .iter()
                .map(|&id| {
                    let node = graph.node(id);
                    let (shape, n) = (&node.ty.shape, node.ty.numel());
                    let t = match node.ty.dtype {
                        DType::I64 => Tensor::from_vec(shape, (0..n).map(|_| (next() % classes) as i64).collect()),
                        DType::I32 => Tensor::from_vec(shape, (0..n).map(|_| (next() % classes) as i32).collect()),
                        _ => Tensor::from_vec(shape, (0..n).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect()),
                    };
                    (node.name.clone(), t.unwrap())
                })
                .collect()
        })
        .collect()
}

/// Seconds per training step of `job` on in-process devices: the median over 3 repetitions of
/// (time of 7 steps - time of 2 steps) / 5, which leaves out the set-up.
fn measured_step(job: &Job, data: &[Vec<(String, Tensor)>]) -> f64 {
    let opt = || -> autopar::runtime::Result<Box<dyn Optimizer>> { Ok(Box::new(Momentum::new(LrSchedule::Constant(0.01), 0.9)?)) };
    let time = |steps: usize| {
        let start = Instant::now();
        run_local(job, &data[..steps], opt).unwrap();
        start.elapsed().as_secs_f64()
    };
    let mut reps: Vec<f64> = (0..3).map(|_| (time(7) - time(2)) / 5.0).collect();
    reps.sort_by(f64::total_cmp);
    reps[1]
}

/// Spearman's rank correlation (ties take their mean rank).
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let ranks = |v: &[f64]| -> Vec<f64> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut r = vec![0.0; v.len()];
        let mut k = 0;
        while k < idx.len() {
            let mut e = k;
            while e + 1 < idx.len() && v[idx[e + 1]] == v[idx[k]] {
                e += 1;
            }
            for &i in &idx[k..=e] {
                r[i] = (k + e) as f64 / 2.0;
            }
            k = e + 1;
        }
        r
    };
    let (ra, rb) = (ranks(a), ranks(b));
    let mean = (a.len() as f64 - 1.0) / 2.0;
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - mean) * (y - mean)).sum();
    let var = |r: &[f64]| r.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>();
    cov / (var(&ra) * var(&rb)).sqrt()
}

/// A search's name in the tables.
fn short(search: &'static str) -> &'static str {
    match search {
        "recursive_programming" => "rec",
        "sharding_propagation" => "shardprop",
        "dynamic_programming" => "dp",
        "data_parallel" => "data_par",
        other => other,
    }
}

/// Part (c): the distinct plans of every search for four small models on 8 devices, predicted
/// and measured.
fn predicted_against_measured() {
    println!("\n(c) predicted vs measured step time, 8 simulated devices (threads on this machine's cores)");
    println!("{:<24} {:<30} {:>13} {:>12}", "model", "plan (searches giving it)", "predicted ms", "measured ms");
    let models: Vec<(&str, &str, ModelOptions, usize)> = vec![
        ("mlp 784-512-512-10", "mlp", ModelOptions::default(), 64),
        (
            "mlp 256-2048-2048-10",
            "mlp",
            ModelOptions { input_shape: Some(vec![256]), width: Some(2048), depth: Some(2), ..ModelOptions::default() },
            16,
        ),
        ("gpt 1 block (w128)", "gpt", options(1, 128), 16),
        (
            "resnet18 (w8, 16x16)",
            "resnet18",
            ModelOptions { width: Some(8), input_shape: Some(vec![3, 16, 16]), ..ModelOptions::default() },
            32,
        ),
    ];
    let (mut predicted, mut measured) = (Vec::new(), Vec::new());
    for (label, name, opts, batch) in &models {
        let model = model_by_name(name, opts).unwrap();
        let (graph, m) = model.build_graph(*batch, Mode::Train, 1).unwrap();
        let ctx = context(8);
        let rows = compare_searches(&PlanRequest { graph: &graph, loss: Some(m.loss), context: &ctx, strategy_file: None, profile: None })
            .unwrap();
        let data = batches(&graph, &m, 7);
        let mut seen: Vec<(Vec<String>, Vec<&str>)> = Vec::new();
        for (search, row) in &rows {
            let Ok((report, _)) = row else { continue };
            let strategies: Vec<String> = report.ops.iter().map(|o| format!("{:?}", o.strategy)).collect();
            if let Some((_, names)) = seen.iter_mut().find(|(s, _)| *s == strategies) {
                names.push(short(search.name()));
                continue;
            }
            seen.push((strategies, vec![short(search.name())]));
            // The plan replayed from its operators' strategies (an operator strategy file).
            let items = StrategyItems {
                path: "search-bench".into(),
                items: report.ops.iter().map(|o| (o.name.clone(), o.strategy.clone())).collect(),
                by_operator: true,
            };
            let mut replay = context(8);
            replay.set("search_mode", &json!("sharding_propagation")).unwrap();
            let req = PlanRequest { graph: &graph, loss: Some(m.loss), context: &replay, strategy_file: Some(&items), profile: None };
            let job = Job::from_plan(autopar::parallel::plan_stages(&req, 1).unwrap());
            predicted.push(report.objective);
            measured.push(measured_step(&job, &data));
        }
        for (k, (_, names)) in seen.iter().enumerate() {
            let at = predicted.len() - seen.len() + k;
            println!("{:<24} {:<30} {:>13.3} {:>12.3}", label, names.join(" = "), predicted[at] * 1e3, measured[at] * 1e3);
        }
    }
    println!("{} plans; Spearman rank correlation (predicted, measured): {:.2}", predicted.len(), spearman(&predicted, &measured));
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
    // At 8 devices this GPT needs about 41 GB per device; a large device_memory_capacity keeps
    // the rows about planning time (dynamic_programming refuses plans that do not fit).
    println!("\n(b) planning time (s), GPT {depth} blocks, width 256, 8 heads, batch 4096 (device_memory_capacity 1 TiB)");
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
            ctx.set("device_memory_capacity", &json!(1u64 << 40)).unwrap();
            let start = Instant::now();
            let plan = autopar_parallel::plan_network(&PlanRequest {
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
    if !std::env::args().any(|a| a == "--skip-measured") {
        predicted_against_measured();
    }
}
