//! autopar beside PyTorch on the same work, interleaved round by round, PyTorch at its defaults
//! (only its thread count set where a row names one). One table: each side's median and the
//! median of the per-round ratios, time(autopar) / time(PyTorch) (below 1: autopar is faster).
//!
//! Rows: the README's quick-start job (the exact command README.md shows; PyTorch does the same
//! job in one process, `benches/peers/quickstart_torch.py`: same data recipe, model, optimizer,
//! schedule, evaluation and checkpoint; its time is measured inside the script, so Python's
//! start-up and `import torch` are not counted against it), the same job on one device, and the
//! training steps of the MLP 784-512-512-10 (batch 64 and 256), ResNet-18 (CIFAR, batch 32) and
//! the small GPT and Llama (batch 16; the Llama beside `transformers`' LlamaForCausalLM) on 1
//! and 2 threads (`benches/peers/{step,models}_torch.py`); then
//! data_parallel on 2 and 4 in-process ranks of 64 rows each beside PyTorch DDP over gloo with
//! one single-threaded process per rank (`peers/ddp_torch.py`), and 8 simulated devices with
//! the (2, 4) data x model strategy at global batch 128 beside JAX on 8 CPU devices with the
//! same sharding (`peers/mesh_jax.py`; that row needs `jax` in the same Python). Last, the
//! simulated devices against one: data_parallel on 2 and 8 devices and the (2, 4) strategy on
//! 8, global batch 128, beside autopar's stand-alone step on every core (no Python needed).
//!
//! `AUTOPAR_BENCH_PYTHON=/path/to/python cargo bench -p autopar --bench versus`
//! (a Python with torch; without it the PyTorch columns say n/a). `AUTOPAR_BENCH_ROUNDS` (3),
//! `AUTOPAR_BENCH_SECONDS` per step row and side (3), `AUTOPAR_BENCH_EPOCHS` of the quick-start (3),
//! `AUTOPAR_BENCH_ROWS` (only the rows whose name contains it, e.g. `DDP`).

use std::process::Command;
use std::time::Instant;

use autopar_models::{Gpt, GptConfig, Llama, LlamaConfig, Mlp, MlpConfig, Mode, Model, ResNet, ResNetConfig};
use autopar_parallel::ParallelContext;
use autopar_runtime::{AdamW, LrSchedule, Momentum, Optimizer, ParamSource, ParamStore, Sgd};
use autopar_tensor::Tensor;

#[path = "common/mesh24.rs"]
mod mesh24;

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn peer(script: &str, args: &[String]) -> Result<String, String> {
    let python = std::env::var("AUTOPAR_BENCH_PYTHON").map_err(|_| "AUTOPAR_BENCH_PYTHON is not set".to_string())?;
    let path = format!("{}/benches/peers/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python).arg(&path).args(args).output().map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{path} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let at = text.rfind(key)? + key.len();
    text[at..]
        .trim_start_matches([':', ' ', '"'])
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-'))
        .next()?
        .parse()
        .ok()
}

#[path = "common/quickstart.rs"]
mod quickstart;

/// The README's quick-start command (with `devices`), run as a user runs it; wall seconds.
fn quickstart_autopar(devices: &str, epochs: &str) -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    quickstart::run(dir.path(), epochs, &["--devices", devices]).0
}

fn quickstart_torch(epochs: &str) -> Result<f64, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let args = ["--samples", "65536", "--epochs", epochs, "--batch-size", "64", "--lr", "0.05", "--warmup-steps", "100", "--out"];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(dir.path().display().to_string());
    let text = peer("quickstart_torch.py", &args)?;
    number_after(&text, "wall ").ok_or_else(|| format!("no wall time in {text}"))
}

/// The models of the step rows, with the optimizer PyTorch's side uses.
#[derive(Clone, Copy)]
enum StepModel {
    /// MLP 784-512-512-10, SGD.
    Mlp,
    /// ResNet-18 (CIFAR stem, 3x32x32, 10 classes), Momentum 0.9.
    ResNet18,
    /// GPT (vocab 256, context 64, width 128, 4 heads, 4 blocks, tied embeddings), AdamW.
    Gpt,
    /// Llama (vocab 256, context 64, width 128, 4 heads over 2 key/value heads, 4 blocks, MLP
    /// 344), AdamW.
    Llama,
}

impl StepModel {
    fn build(self) -> (Box<dyn Model>, Box<dyn Optimizer>) {
        let lr = LrSchedule::Constant(0.01);
        match self {
            StepModel::Mlp => (
                Box::new(Mlp::new(MlpConfig { input_shape: vec![784], hidden: vec![512, 512], num_classes: 10 }).expect("mlp")),
                Box::new(Sgd::new(lr).expect("sgd")),
            ),
            StepModel::ResNet18 => {
                (Box::new(ResNet::new(ResNetConfig::resnet18(10)).expect("resnet18")), Box::new(Momentum::new(lr, 0.9).expect("momentum")))
            }
            StepModel::Gpt => {
                (Box::new(Gpt::new(GptConfig::default()).expect("gpt")), Box::new(AdamW::new(LrSchedule::Constant(1e-3)).expect("adamw")))
            }
            StepModel::Llama => (
                Box::new(Llama::new(LlamaConfig::default()).expect("llama")),
                Box::new(AdamW::new(LrSchedule::Constant(1e-3)).expect("adamw")),
            ),
        }
    }
}

/// One training step of `model` at `batch` on `threads` threads, on a fixed random batch;
/// seconds per step.
fn step_autopar(model: StepModel, batch: usize, threads: usize, seconds: f64) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    pool.install(|| {
        let (m, mut opt) = model.build();
        let (graph, io) = m.build_graph(batch, Mode::Train, 1).expect("graph");
        let params = ParamStore::init(&graph).expect("init");
        let mut rng = autopar_graph::Rng::new(7);
        let classes = m.num_classes() as u64;
        let shape = |tail: Vec<usize>| [vec![batch], tail].concat();
        let (xs, ys) = (shape(m.input_shape()), shape(m.label_shape()));
        let (nx, ny): (usize, usize) = (xs.iter().product(), ys.iter().product());
        let x = match m.input_dtype() {
            autopar_graph::DType::I64 => Tensor::from_vec(&xs, (0..nx).map(|_| (rng.next_u64() % classes) as i64).collect()),
            _ => Tensor::from_vec(&xs, (0..nx).map(|_| rng.normal() as f32).collect()),
        }
        .expect("x");
        let y = Tensor::from_vec(&ys, (0..ny).map(|_| (rng.next_u64() % classes) as i64).collect::<Vec<i64>>()).expect("y");
        let y = y.cast(autopar_runtime::tensor_dtype(graph.node(io.labels).ty.dtype));
        let feeds = vec![(graph.node(io.x).name.clone(), x), (graph.node(io.labels).name.clone(), y)];
        let job = autopar_runtime::Job::new(&graph, io.loss, &ParallelContext::default()).expect("job");
        let mut step = autopar_runtime::RankTrainer::alone(&job, ParamSource::Local(params)).expect("step");
        for _ in 0..3 {
            step.step(opt.as_mut(), &feeds).expect("step runs");
        }
        let (mut steps, start) = (0usize, Instant::now());
        while steps < 3 || start.elapsed().as_secs_f64() < seconds {
            step.step(opt.as_mut(), &feeds).expect("step runs");
            steps += 1;
        }
        start.elapsed().as_secs_f64() / steps as f64
    })
}

fn step_torch(model: StepModel, batch: usize, threads: usize, seconds: f64) -> Result<f64, String> {
    let (t, b, s) = (threads.to_string(), batch.to_string(), seconds.to_string());
    let (script, args): (&str, Vec<String>) = match model {
        StepModel::Mlp => ("step_torch.py", ["--batch", &b, "--threads", &t, "--seconds", &s].map(String::from).to_vec()),
        StepModel::ResNet18 => {
            ("models_torch.py", ["--models", "resnet18", "--resnet-batch", &b, "--threads", &t, "--seconds", &s].map(String::from).to_vec())
        }
        StepModel::Gpt => {
            ("models_torch.py", ["--models", "gpt", "--gpt-batch", &b, "--threads", &t, "--seconds", &s].map(String::from).to_vec())
        }
        StepModel::Llama => {
            ("models_torch.py", ["--models", "llama", "--llama-batch", &b, "--threads", &t, "--seconds", &s].map(String::from).to_vec())
        }
    };
    let text = peer(script, &args)?;
    match model {
        StepModel::Mlp => number_after(&text, "\"seconds_per_step\""),
        StepModel::ResNet18 | StepModel::Gpt | StepModel::Llama => number_after(&text, "\"samples_per_s\"").map(|r| batch as f64 / r),
    }
    .ok_or_else(|| format!("no timing in the output of {script}: {text}"))
}

/// The in-process parallel rows: the MLP trained by `ranks` simulated devices (`LocalComm`,
/// one thread each, kernels serial on each) on a fixed global batch of `global` rows, either
/// data_parallel or the (2, 4) data x model strategy on 8 devices; seconds per step (the
/// slowest rank's).
#[derive(Clone, Copy)]
enum Parallel {
    /// data_parallel over `ranks` on a global batch of `global` rows; `shard`: with the
    /// parallel optimizer (each rank updates its part of every parameter).
    Data { ranks: usize, global: usize, shard: bool },
    /// semi_auto_parallel on 8 devices: the batch split 2 ways, the hidden layers 4 ways
    /// (column- then row-parallel), the global batch `global`. Every op of a layer has its
    /// strategy (the first layer's bias and ReLU stay split by column, as JAX's propagation
    /// keeps them), not only the matrix products.
    Mesh24 { global: usize },
}

fn parallel_autopar(run: Parallel, seconds: f64) -> f64 {
    use autopar_comm::{Communicator, LocalComm};

    use autopar_runtime::{Job, RankTrainer};
    let (ranks, global) = match run {
        Parallel::Data { ranks, global, .. } => (ranks, global),
        Parallel::Mesh24 { global } => (8, global),
    };
    let model = Mlp::new(MlpConfig { input_shape: vec![784], hidden: vec![512, 512], num_classes: 10 }).expect("mlp");
    let (mut g, m) = model.build_graph(global, Mode::Train, 1).expect("graph");
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &serde_json::json!(ranks)).expect("device_num");
    match run {
        Parallel::Data { shard, .. } => {
            ctx.set("parallel_mode", &serde_json::json!("data_parallel")).expect("mode");
            ctx.set("gradients_mean", &serde_json::json!(true)).expect("gradients_mean");
            ctx.set("enable_parallel_optimizer", &serde_json::json!(shard)).expect("enable_parallel_optimizer");
        }
        Parallel::Mesh24 { .. } => {
            ctx.set("parallel_mode", &serde_json::json!("semi_auto_parallel")).expect("mode");
            for (op, st) in mesh24::MESH_2X4 {
                m.shard_graph(&mut g, op, st.parse().expect("strategy")).expect("shard");
            }
        }
    }
    let job = Job::new(&g, m.loss, &ctx).expect("job");
    let full = ParamStore::init(job.graph()).expect("init");
    let mut rng = autopar_graph::Rng::new(7);
    let x = Tensor::from_vec(&[global, 784], (0..global * 784).map(|_| rng.normal() as f32).collect()).expect("x");
    let y = Tensor::from_vec(&[global], (0..global).map(|_| (rng.next_u64() % 10) as i64).collect::<Vec<i64>>()).expect("y");
    let global_feeds = vec![("x".to_string(), x), ("labels".to_string(), y)];
    let times = LocalComm::run(ranks, |comm| -> autopar_runtime::Result<f64> {
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        let mut opt = Sgd::new(LrSchedule::Constant(0.01))?;
        let feeds = &global_feeds;
        for _ in 0..10 {
            t.step(&mut opt, feeds)?;
        }
        // Every rank runs the same number of steps: rank 0 sizes the run from 10 probe steps
        // and broadcasts it (ranks deciding on their own clocks would leave a collective).
        let comm_err = || autopar_runtime::RuntimeError::comm(autopar_runtime::CommPhase::Run);
        let start = Instant::now();
        for _ in 0..10 {
            t.step(&mut opt, feeds)?;
        }
        let per_step = start.elapsed().as_secs_f64() / 10.0;
        let mut total = [((seconds / per_step) as i64).max(5)];
        comm.broadcast(autopar_comm::BufMut::I64(&mut total), 0).map_err(comm_err())?;
        comm.barrier().map_err(comm_err())?;
        let start = Instant::now();
        for _ in 0..total[0] {
            t.step(&mut opt, feeds)?;
        }
        Ok(start.elapsed().as_secs_f64() / total[0] as f64)
    })
    .expect("parallel run");
    times.into_iter().fold(0.0, f64::max)
}

fn parallel_peer(run: Parallel, seconds: f64) -> Result<f64, String> {
    let s = seconds.to_string();
    let (script, args): (&str, Vec<String>) = match run {
        Parallel::Data { ranks, global, .. } => (
            "ddp_torch.py",
            ["--ranks", &ranks.to_string(), "--batch", &(global / ranks).to_string(), "--seconds", &s].map(String::from).to_vec(),
        ),
        Parallel::Mesh24 { global } => ("mesh_jax.py", ["--batch", &global.to_string(), "--seconds", &s].map(String::from).to_vec()),
    };
    let text = peer(script, &args)?;
    number_after(&text, "\"seconds_per_step\"").ok_or_else(|| format!("no timing in the output of {script}: {text}"))
}

/// `mpi_dp_bench` (data_parallel over MPI, 64 rows per rank) beside this bench, when it was
/// built: `cargo build --release -p autopar-runtime --features mpi --example mpi_dp_bench`.
fn mpi_dp_bench() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("examples").join("mpi_dp_bench");
    (path.is_file() && Command::new("mpirun").arg("--version").output().is_ok()).then_some(path)
}

/// ms per step of `mpirun -n ranks mpi_dp_bench`.
fn mpi_autopar(bench: &std::path::Path, ranks: usize) -> f64 {
    let mut cmd = Command::new("mpirun");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.arg("--allow-run-as-root");
    }
    let out = cmd.args(["--oversubscribe", "-n", &ranks.to_string()]).arg(bench).output().expect("mpirun runs");
    let text = String::from_utf8_lossy(&out.stdout);
    // "data_parallel over MPI, 2 ranks x batch 64: 1.95 ms/step, ..."
    let ms = text.split(": ").nth(1).and_then(|t| t.split_whitespace().next()).and_then(|v| v.parse().ok());
    ms.filter(|_| out.status.success()).unwrap_or_else(|| panic!("mpi_dp_bench failed: {text}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    // As the `autopar` binary runs (the quick-start rows run the binary itself).
    autopar::keep_freed_memory();
    let rounds: usize = env_or("AUTOPAR_BENCH_ROUNDS", 3usize).max(1);
    let seconds: f64 = env_or("AUTOPAR_BENCH_SECONDS", 3.0);
    let epochs: String = env_or("AUTOPAR_BENCH_EPOCHS", "3".to_string());
    type Side = Box<dyn Fn() -> f64>;
    type Peer = Box<dyn Fn() -> Result<f64, String>>;
    let mut rows: Vec<(String, &str, Side, Peer)> = Vec::new();
    for devices in ["2", "1"] {
        let e = epochs.clone();
        let e2 = epochs.clone();
        rows.push((
            format!("README quick-start, --devices {devices}"),
            "s/job",
            Box::new(move || quickstart_autopar(devices, &e)),
            Box::new(move || quickstart_torch(&e2)),
        ));
    }
    let steps = [
        (StepModel::Mlp, "MLP", 64),
        (StepModel::Mlp, "MLP", 256),
        (StepModel::ResNet18, "ResNet-18", 32),
        (StepModel::Gpt, "GPT", 16),
        (StepModel::Llama, "Llama", 16),
    ];
    for (model, label, batch) in steps {
        for threads in [1, 2] {
            rows.push((
                format!("{label} step, batch {batch}, {threads} thread(s)"),
                "ms/step",
                Box::new(move || 1e3 * step_autopar(model, batch, threads, seconds)),
                Box::new(move || step_torch(model, batch, threads, seconds).map(|s| 1e3 * s)),
            ));
        }
    }
    for ranks in [2, 4] {
        let run = Parallel::Data { ranks, global: 64 * ranks, shard: false };
        rows.push((
            format!("data_parallel {ranks} x 64 vs DDP (gloo)"),
            "ms/step",
            Box::new(move || 1e3 * parallel_autopar(run, seconds)),
            Box::new(move || parallel_peer(run, seconds).map(|s| 1e3 * s)),
        ));
    }
    match mpi_dp_bench() {
        Some(bench) => {
            for ranks in [2, 4] {
                let bench = bench.clone();
                rows.push((
                    format!("data_parallel {ranks} x 64, mpirun vs DDP (gloo)"),
                    "ms/step",
                    Box::new(move || mpi_autopar(&bench, ranks)),
                    Box::new(move || parallel_peer(Parallel::Data { ranks, global: 64 * ranks, shard: false }, seconds).map(|s| 1e3 * s)),
                ));
            }
        }
        None => eprintln!(
            "no MPI rows: build `cargo build --release -p autopar-runtime --features mpi --example mpi_dp_bench` (and have mpirun) for them"
        ),
    }
    let run = Parallel::Mesh24 { global: 128 };
    rows.push((
        "8 devices (2,4), batch 128 vs JAX".to_string(),
        "ms/step",
        Box::new(move || 1e3 * parallel_autopar(run, seconds)),
        Box::new(move || parallel_peer(run, seconds).map(|s| 1e3 * s)),
    ));
    // N simulated devices against one device with every core, the same global batch: the
    // "peer" of these rows is autopar's own stand-alone step (the MLP step rows' code).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (label, run) in [
        ("data_parallel, 2 devices", Parallel::Data { ranks: 2, global: 128, shard: false }),
        ("data_parallel, 8 devices", Parallel::Data { ranks: 8, global: 128, shard: false }),
        ("data_parallel + parallel optimizer, 8 devices", Parallel::Data { ranks: 8, global: 128, shard: true }),
        ("8 devices (2,4)", Parallel::Mesh24 { global: 128 }),
    ] {
        rows.push((
            format!("{label}, batch 128 vs stand-alone"),
            "ms/step",
            Box::new(move || 1e3 * parallel_autopar(run, seconds)),
            Box::new(move || Ok(1e3 * step_autopar(StepModel::Mlp, 128, cores, seconds))),
        ));
    }
    if let Ok(only) = std::env::var("AUTOPAR_BENCH_ROWS") {
        rows.retain(|(name, ..)| name.contains(&only));
    }
    let mut results: Vec<(Vec<f64>, Vec<f64>, Option<String>)> = rows.iter().map(|_| (Vec::new(), Vec::new(), None)).collect();
    for round in 1..=rounds {
        for (i, (name, unit, ours, theirs)) in rows.iter().enumerate() {
            let a = ours();
            results[i].0.push(a);
            if results[i].2.is_none() {
                match theirs() {
                    Ok(t) => results[i].1.push(t),
                    Err(e) => results[i].2 = Some(e),
                }
            }
            eprintln!("round {round}: {name}: autopar {a:.3} {unit}, peer {:?}", results[i].1.last());
        }
    }
    println!("autopar vs PyTorch (JAX, or autopar stand-alone, where the row says) on this machine ({cores} cores), median of {rounds} interleaved rounds");
    println!("{:<52} {:>8} {:>10} {:>10} {:>14}", "work", "unit", "autopar", "peer", "ratio (median)");
    for ((name, unit, _, _), (ours, theirs, err)) in rows.iter().zip(results) {
        let a = median(ours.clone());
        if theirs.len() == ours.len() {
            let ratio = median(ours.iter().zip(&theirs).map(|(a, t)| a / t).collect());
            println!("{name:<52} {unit:>8} {a:>10.3} {:>10.3} {ratio:>14.2}", median(theirs));
        } else {
            println!("{name:<52} {unit:>8} {a:>10.3} {:>10} {:>14}", "n/a", "n/a");
            if let Some(e) = err {
                eprintln!("  peer: {e}");
            }
        }
    }
}
