//! Training step of the MLP 784-512-512-10 at batch 64 (f32, SGD) through the graph, autodiff
//! and executor. Prints steps/s and the ops taking the most time.
//!
//! `cargo bench -p autopar-runtime --bench mlp` (set RAYON_NUM_THREADS to pin the thread count).
//! PyTorch's step beside it: `cargo bench -p autopar --bench versus` (`crates/autopar/benches/peers/step_torch.py`).

use std::time::Instant;

use autopar_graph::{DType, GraphBuilder, Initializer, Rng};
use autopar_parallel::ParallelContext;
use autopar_runtime::{Job, LrSchedule, ParamSource, ParamStore, RankTrainer, Sgd};
use autopar_tensor::Tensor;

fn main() {
    // As the `autopar` binary runs.
    autopar_runtime::keep_freed_memory();
    let (batch, dims) = (64usize, [784usize, 512, 512, 10]);
    let mut b = GraphBuilder::new(1);
    let x = b.input("x", &[batch, dims[0]], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I32).unwrap();
    let init = Initializer::HeUniform;
    let h = b.dense("fc1", x, dims[1], init.clone()).unwrap();
    let h = b.relu("relu1", h).unwrap();
    let h = b.dense("fc2", h, dims[2], init.clone()).unwrap();
    let h = b.relu("relu2", h).unwrap();
    let z = b.dense("fc3", h, dims[3], init).unwrap();
    let loss = b.softmax_cross_entropy("loss", z, y).unwrap();
    let graph = b.finish();

    let params = ParamStore::init(&graph).unwrap();
    let mut rng = Rng::new(7);
    let xs: Vec<f32> = (0..batch * dims[0]).map(|_| rng.normal() as f32).collect();
    let ys: Vec<i32> = (0..batch).map(|_| (rng.next_u64() % 10) as i32).collect();
    let feeds = vec![
        (graph.node(x).name.clone(), Tensor::from_vec(&[batch, dims[0]], xs).unwrap()),
        (graph.node(y).name.clone(), Tensor::from_vec(&[batch], ys).unwrap()),
    ];
    let job = Job::new(&graph, loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Local(params)).unwrap();
    let mut opt = Sgd::new(LrSchedule::Constant(0.01)).unwrap();

    for _ in 0..10 {
        step.step(&mut opt, &feeds).unwrap();
    }
    let iters = 200;
    let start = Instant::now();
    let mut last = 0.0;
    for _ in 0..iters {
        last = step.step(&mut opt, &feeds).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "mlp 784-512-512-10 batch {batch} f32 sgd: {:.1} steps/s ({:.3} ms/step, {} threads, final loss {last:.4})",
        iters as f64 / secs,
        1e3 * secs / iters as f64,
        rayon_threads()
    );

    // Forward + backward alone, and the optimizer alone.
    let start = Instant::now();
    let mut grads = Vec::new();
    for _ in 0..iters {
        grads = step.gradients(&feeds).unwrap().grads;
    }
    let fb = start.elapsed().as_secs_f64() / iters as f64;
    let start = Instant::now();
    for _ in 0..iters {
        autopar_runtime::Optimizer::step(&mut opt, step.params_mut(), &grads).unwrap();
    }
    let upd = start.elapsed().as_secs_f64() / iters as f64;
    println!("  forward+backward {:.3} ms, sgd update {:.3} ms", fb * 1e3, upd * 1e3);

    // Per-op profile of one step (forward + backward; the optimizer is outside the graph).
    let mut prof = RankTrainer::alone(&job, ParamSource::Full(step.params())).unwrap().with_profiling(true);
    let out = prof.gradients(&feeds).unwrap().run;
    let program = &prof.program().program;
    let scheduled = autopar_runtime::Executor::new(program.graph.clone(), &program.fetch()).unwrap().num_scheduled();
    let mut t = out.timings.clone();
    t.sort_by(|a, b| b.seconds.partial_cmp(&a.seconds).unwrap());
    let total: f64 = t.iter().map(|o| o.seconds).sum();
    println!(
        "graph ops {} (executed {}), op time {:.3} ms, peak live {} values / {:.1} MiB",
        program.graph.len(),
        scheduled,
        total * 1e3,
        out.peak_live,
        out.peak_live_bytes as f64 / (1 << 20) as f64
    );
    for o in t.iter().take(8) {
        println!("  {:>8.3} ms  {:<22} {}", o.seconds * 1e3, o.kind, o.name);
    }
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}
