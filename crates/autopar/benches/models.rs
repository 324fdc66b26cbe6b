//! Training-step throughput (samples/s) of ResNet-18 (CIFAR stem, 3x32x32, 10 classes, SGD with
//! momentum), a small GPT (vocab 256, context 64, width 128, 4 heads, 4 blocks, AdamW) and a
//! small Llama (the same sizes, 2 key/value heads, MLP 344, AdamW).
//! PyTorch beside them, interleaved: `cargo bench -p autopar --bench versus`.
//!
//! `cargo bench -p autopar --bench models`
//!
//! Knobs (environment): `RAYON_NUM_THREADS` (default all cores), `BENCH_SECONDS` (timed seconds
//! per model and round, default 5), `BENCH_ROUNDS` (3), `RESNET_BATCH` (32), `GPT_BATCH` (16, the
//! Llama's too), `BENCH_MODELS` (`resnet18`, `gpt`, `llama`, comma-separated; default all), `BENCH_PROFILE`
//! (print op time by kind for one step of each model).

use std::time::Instant;

use autopar_graph::{DType, Rng};
use autopar_models::{Gpt, GptConfig, Llama, LlamaConfig, Mode, Model, ResNet, ResNetConfig};
use autopar_parallel::ParallelContext;
use autopar_runtime::{AdamW, Job, LrSchedule, Momentum, Optimizer, ParamSource, ParamStore, RankTrainer};
use autopar_tensor::Tensor;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One model ready to train on a fixed random batch.
struct Runner {
    batch: usize,
    job: Job,
    step: RankTrainer,
    feeds: Vec<(String, Tensor)>,
    opt: Box<dyn Optimizer>,
}

impl Runner {
    fn new(model: &dyn Model, batch: usize, opt: Box<dyn Optimizer>) -> Self {
        let (graph, m) = model.build_graph(batch, Mode::Train, 1).expect("model builds");
        let params = ParamStore::init(&graph).expect("parameters initialise");
        let mut rng = Rng::new(7);
        let mut x_shape = vec![batch];
        x_shape.extend(model.input_shape());
        let mut y_shape = vec![batch];
        y_shape.extend(model.label_shape());
        let (nx, ny): (usize, usize) = (x_shape.iter().product(), y_shape.iter().product());
        let classes = model.num_classes() as u64;
        let x = match model.input_dtype() {
            DType::I64 => Tensor::from_vec(&x_shape, (0..nx).map(|_| (rng.next_u64() % classes) as i64).collect()),
            _ => Tensor::from_vec(&x_shape, (0..nx).map(|_| rng.normal() as f32).collect()),
        }
        .expect("input tensor");
        let y = Tensor::from_vec(&y_shape, (0..ny).map(|_| (rng.next_u64() % classes) as i64).collect()).expect("label tensor");
        let job = Job::new(&graph, m.loss, &ParallelContext::default()).expect("model differentiates");
        let step = RankTrainer::alone(&job, ParamSource::Local(params)).expect("one device");
        let feeds = vec![(graph.node(m.x).name.clone(), x), (graph.node(m.labels).name.clone(), y)];
        let mut r = Self { batch, job, step, feeds, opt };
        for _ in 0..2 {
            r.one();
        }
        r
    }

    fn one(&mut self) -> f64 {
        self.step.step(self.opt.as_mut(), &self.feeds).expect("training step")
    }

    /// Samples/s over at least `seconds` (and 3 steps).
    fn time(&mut self, seconds: f64) -> f64 {
        let (mut steps, start) = (0, Instant::now());
        while steps < 3 || start.elapsed().as_secs_f64() < seconds {
            self.one();
            steps += 1;
        }
        (self.batch * steps) as f64 / start.elapsed().as_secs_f64()
    }

    /// Op time by kind over one profiled forward + backward, on stderr.
    fn profile(&mut self, label: &str) {
        let mut prof = RankTrainer::alone(&self.job, ParamSource::Full(self.step.params())).expect("one device").with_profiling(true);
        let out = prof.gradients(&self.feeds).expect("profiled step");
        let mut by_kind: Vec<(&str, f64, usize)> = Vec::new();
        for t in &out.run.timings {
            match by_kind.iter_mut().find(|(k, _, _)| *k == t.kind) {
                Some(e) => {
                    e.1 += t.seconds;
                    e.2 += 1;
                }
                None => by_kind.push((t.kind, t.seconds, 1)),
            }
        }
        by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
        let total: f64 = by_kind.iter().map(|e| e.1).sum();
        eprintln!("{label}: forward+backward op time {:.1} ms", total * 1e3);
        for (kind, secs, n) in by_kind.iter().take(10) {
            eprintln!("  {:>9.1} ms {:>5.1}%  {kind} (x{n})", secs * 1e3, 100.0 * secs / total);
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // As the `autopar` binary runs.
    autopar_runtime::keep_freed_memory();
    let threads = env_or("RAYON_NUM_THREADS", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let seconds: f64 = env_or("BENCH_SECONDS", 5.0);
    let rounds: usize = env_or("BENCH_ROUNDS", 3usize).max(1);
    let resnet_batch = env_or("RESNET_BATCH", 32usize);
    let gpt_batch = env_or("GPT_BATCH", 16usize);
    let gpt_cfg = GptConfig::default();

    let resnet = ResNet::new(ResNetConfig::resnet18(10)).expect("resnet18");
    let gpt = Gpt::new(gpt_cfg.clone()).expect("gpt");
    let llama = Llama::new(LlamaConfig::default()).expect("llama");
    let wanted = std::env::var("BENCH_MODELS").unwrap_or_else(|_| "resnet18,gpt,llama".into());
    let wanted: Vec<&str> = wanted.split(',').map(str::trim).collect();
    let mut runners = Vec::new();
    if wanted.contains(&"resnet18") {
        let opt = Box::new(Momentum::new(LrSchedule::Constant(0.01), 0.9).expect("momentum"));
        runners.push(("resnet18", "resnet18 (cifar stem)", Runner::new(&resnet, resnet_batch, opt)));
    }
    if wanted.contains(&"gpt") {
        runners.push((
            "gpt",
            "gpt (small)",
            Runner::new(&gpt, gpt_batch, Box::new(AdamW::new(LrSchedule::Constant(1e-3)).expect("adamw"))),
        ));
    }
    if wanted.contains(&"llama") {
        runners.push((
            "llama",
            "llama (small)",
            Runner::new(&llama, gpt_batch, Box::new(AdamW::new(LrSchedule::Constant(1e-3)).expect("adamw"))),
        ));
    }
    if runners.is_empty() {
        eprintln!("BENCH_MODELS={wanted:?} names no model; use resnet18, gpt, llama (comma-separated)");
        std::process::exit(2);
    }
    if std::env::var_os("BENCH_PROFILE").is_some() {
        for (name, _, r) in runners.iter_mut() {
            r.profile(name);
        }
    }

    let mut ours = vec![Vec::new(); runners.len()];
    for round in 0..rounds {
        for (i, (name, _, r)) in runners.iter_mut().enumerate() {
            ours[i].push(r.time(seconds));
            eprintln!("round {}: {name} {:.1} samples/s", round + 1, ours[i].last().unwrap());
        }
    }
    println!("training step, f32, {threads} threads; median of {rounds} rounds of {seconds} s per model");
    println!(
        "gpt = vocab {} context {} width {} heads {} layers {} (tied embeddings)",
        gpt_cfg.vocab, gpt_cfg.context, gpt_cfg.width, gpt_cfg.heads, gpt_cfg.layers
    );
    println!("{:<22} {:>6} {:>18}", "model", "batch", "samples/s");
    for (i, (_, label, r)) in runners.iter().enumerate() {
        println!("{:<22} {:>6} {:>18.1}", label, r.batch, median(&mut ours[i]));
    }
}
