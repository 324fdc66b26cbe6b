//! Training-step throughput (samples/s) of ResNet-18 (CIFAR stem, 3x32x32, 10 classes, SGD with
//! momentum) and a small GPT (vocab 256, context 64, width 128, 4 heads, 4 blocks, AdamW), and,
//! in the same run, the same models in PyTorch on CPU with the same thread count.
//!
//! `cargo bench -p autopar-models --bench models`
//!
//! Knobs (environment): `RAYON_NUM_THREADS` (threads for both sides), `BENCH_SECONDS` (timed
//! seconds per model, default 10), `RESNET_BATCH` (32), `GPT_BATCH` (16), `TORCH_PYTHON` (a
//! Python with torch; default `/tmp/venv/bin/python`, skipped with a note when missing),
//! `BENCH_PROFILE` (print op time by kind for one step of each model).

use std::process::Command;
use std::time::Instant;

use autopar_graph::{NodeId, Rng};
use autopar_models::{Gpt, GptConfig, Mode, Model, ResNet, ResNetConfig};
use autopar_runtime::{AdamW, LrSchedule, Momentum, Optimizer, ParamStore, TrainStep};
use autopar_tensor::Tensor;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Figure {
    model: String,
    batch: usize,
    steps: usize,
    seconds: f64,
}

impl Figure {
    fn samples_per_s(&self) -> f64 {
        (self.batch * self.steps) as f64 / self.seconds
    }
}

fn time_model(label: &str, model: &dyn Model, batch: usize, opt: &mut dyn Optimizer, seconds: f64) -> Figure {
    let (graph, m) = model.build_graph(batch, Mode::Train, 1).expect("model builds");
    let mut params = ParamStore::init(&graph).expect("parameters initialise");
    let mut rng = Rng::new(7);
    let mut x_shape = vec![batch];
    x_shape.extend(model.input_shape());
    let mut y_shape = vec![batch];
    y_shape.extend(model.label_shape());
    let nx: usize = x_shape.iter().product();
    let ny: usize = y_shape.iter().product();
    let classes = model.num_classes() as u64;
    let x = match model.input_dtype() {
        autopar_graph::DType::I64 => Tensor::from_vec(&x_shape, (0..nx).map(|_| (rng.next_u64() % classes) as i64).collect()),
        _ => Tensor::from_vec(&x_shape, (0..nx).map(|_| rng.normal() as f32).collect()),
    }
    .expect("input tensor");
    let y = Tensor::from_vec(&y_shape, (0..ny).map(|_| (rng.next_u64() % classes) as i64).collect()).expect("label tensor");
    let feeds: Vec<(NodeId, Tensor)> = vec![(m.x, x), (m.labels, y)];
    let mut step = TrainStep::new(graph, m.loss).expect("model differentiates");
    for _ in 0..2 {
        step.run(&mut params, opt, &feeds).expect("warm-up step");
    }
    let (mut steps, start) = (0, Instant::now());
    while steps < 3 || start.elapsed().as_secs_f64() < seconds {
        step.run(&mut params, opt, &feeds).expect("training step");
        steps += 1;
    }
    let fig = Figure { model: label.to_string(), batch, steps, seconds: start.elapsed().as_secs_f64() };
    eprintln!("autopar {label}: {steps} steps in {:.2} s", fig.seconds);
    if std::env::var_os("BENCH_PROFILE").is_some() {
        // Op time by kind over one profiled forward + backward.
        let mut prof = step.clone().with_profiling(true);
        let out = prof.gradients(&mut params, &feeds).expect("profiled step");
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
        eprintln!("  forward+backward op time {:.1} ms:", total * 1e3);
        for (kind, secs, n) in by_kind.iter().take(10) {
            eprintln!("  {:>9.1} ms {:>5.1}%  {kind} (x{n})", secs * 1e3, 100.0 * secs / total);
        }
    }
    fig
}

/// Runs the PyTorch script; `None` (with the reason on stderr) when Python or torch is missing.
fn torch_figures(threads: usize, resnet_batch: usize, gpt_batch: usize, gpt: &GptConfig, seconds: f64) -> Option<(Vec<Figure>, String)> {
    let python = std::env::var("TORCH_PYTHON").unwrap_or_else(|_| "/tmp/venv/bin/python".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_models.py");
    let out = Command::new(&python)
        .args([
            script,
            "--threads",
            &threads.to_string(),
            "--resnet-batch",
            &resnet_batch.to_string(),
            "--gpt-batch",
            &gpt_batch.to_string(),
        ])
        .args([
            "--gpt",
            &format!("{},{},{},{},{}", gpt.vocab, gpt.context, gpt.width, gpt.heads, gpt.layers),
            "--seconds",
            &seconds.to_string(),
        ])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            eprintln!("pytorch side skipped: {python} {script} failed:\n{}", String::from_utf8_lossy(&o.stderr));
            return None;
        }
        Err(e) => {
            eprintln!("pytorch side skipped: cannot run {python}: {e} (set TORCH_PYTHON to a Python with torch)");
            return None;
        }
    };
    let (mut figs, mut version) = (Vec::new(), String::from("?"));
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let field = |key: &str| -> Option<String> {
            let at = line.find(&format!("\"{key}\": "))? + key.len() + 4;
            let rest = &line[at..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            Some(rest[..end].trim().trim_matches('"').to_string())
        };
        if let Some(v) = field("torch") {
            version = v;
        } else if let (Some(model), Some(batch), Some(steps), Some(secs)) =
            (field("model"), field("batch"), field("steps"), field("seconds"))
        {
            figs.push(Figure { model, batch: batch.parse().ok()?, steps: steps.parse().ok()?, seconds: secs.parse().ok()? });
        }
    }
    Some((figs, version))
}

fn main() {
    let threads = env_or("RAYON_NUM_THREADS", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let seconds: f64 = env_or("BENCH_SECONDS", 10.0);
    let resnet_batch = env_or("RESNET_BATCH", 32usize);
    let gpt_batch = env_or("GPT_BATCH", 16usize);
    let gpt_cfg = GptConfig::default();

    let resnet = ResNet::new(ResNetConfig::resnet18(10)).expect("resnet18");
    let gpt = Gpt::new(gpt_cfg.clone()).expect("gpt");
    let mut sgd = Momentum::new(LrSchedule::Constant(0.01), 0.9).expect("momentum");
    let mut adamw = AdamW::new(LrSchedule::Constant(1e-3)).expect("adamw");
    let ours = [time_model("resnet18", &resnet, resnet_batch, &mut sgd, seconds), time_model("gpt", &gpt, gpt_batch, &mut adamw, seconds)];
    let torch = torch_figures(threads, resnet_batch, gpt_batch, &gpt_cfg, seconds);

    println!("training step, f32, {threads} threads, {seconds} s per model");
    println!(
        "gpt = vocab {} context {} width {} heads {} layers {} (tied embeddings)",
        gpt_cfg.vocab, gpt_cfg.context, gpt_cfg.width, gpt_cfg.heads, gpt_cfg.layers
    );
    println!("{:<22} {:>6} {:>16} {:>16} {:>8}", "model", "batch", "autopar samples/s", "pytorch samples/s", "ratio");
    for (fig, name) in ours.iter().zip(["resnet18 (cifar stem)", "gpt (small)"]) {
        let theirs = torch.as_ref().and_then(|(t, _)| t.iter().find(|f| f.model == fig.model));
        let (t, ratio) = match theirs {
            Some(t) => (format!("{:.1}", t.samples_per_s()), format!("{:.2}", fig.samples_per_s() / t.samples_per_s())),
            None => ("n/a".into(), "n/a".into()),
        };
        println!("{:<22} {:>6} {:>16.1} {:>16} {:>8}", name, fig.batch, fig.samples_per_s(), t, ratio);
    }
    match &torch {
        Some((_, version)) => println!("pytorch {version} on CPU, torch.set_num_threads({threads}); ratio = autopar / pytorch"),
        None => println!("pytorch: not available in this run (see stderr)"),
    }
}
