//! The trainer end to end: models learn, resume equals an uninterrupted run, `--init` checks
//! names and shapes, checkpoints are kept and written atomically, parallel runs equal
//! stand-alone.

mod common;

use std::path::Path;
use std::sync::Arc;

use autopar_data::{Dataset, Subset, SyntheticDataset};
use autopar_layout::Strategy;
use autopar_models::{Mode, Model, ModelOptions};
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{BuildNetwork, CheckpointConfig, Network, OptimizerConfig, OptimizerKind, TrainError};
use autopar_runtime::{LrSchedule, ParamStore, TrainConfig, Trainer};
use common::{builder, clusters, context, small_gpt, small_mlp, source};

fn cfg(batch: usize, steps: u64) -> TrainConfig {
    TrainConfig { epochs: 1000, max_steps: Some(steps), batch_size: batch, prefetch: 0, ..Default::default() }
}

fn mlp_trainer(cfg: TrainConfig) -> Trainer {
    Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(clusters(&[16], 4, 256)), cfg)
}

fn assert_bit_equal(a: &ParamStore, b: &ParamStore) {
    assert_eq!(a.len(), b.len());
    for ((na, ta), (nb, tb)) in a.iter().zip(b.iter()) {
        assert_eq!(na, nb);
        assert!(ta.bit_eq(tb), "parameter {na} differs");
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn the_mlp_learns_and_scores_well_on_held_out_samples() {
    let all = clusters(&[16], 4, 320);
    let train = Arc::new(Subset::range(all.clone(), 0..256).unwrap());
    let held = Arc::new(Subset::range(all, 256..320).unwrap());
    let mut c = cfg(16, 64);
    c.optimizer.schedule = LrSchedule::Constant(0.05);
    let t = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(train), c);
    let report = t.fit(vec![]).unwrap();
    assert_eq!(report.losses.len(), 64);
    assert!(mean(&report.losses[56..]) < 0.3 * mean(&report.losses[..8]), "{:?}", report.losses);
    let eval = t.evaluate(&report.params().unwrap(), &source(held)).unwrap();
    assert_eq!((eval.samples, eval.predictions), (64, 64));
    assert!(eval.accuracy > 0.9, "{eval:?}");
}

#[test]
fn a_small_resnet_learns() {
    let opts = ModelOptions { input_shape: Some(vec![3, 8, 8]), width: Some(4), num_classes: Some(3), ..Default::default() };
    let mut c = cfg(8, 24);
    c.optimizer.schedule = LrSchedule::Constant(0.05);
    let t = Trainer::new("resnet18", builder("resnet18", opts, vec![]), source(clusters(&[3, 8, 8], 3, 64)), c);
    let report = t.fit(vec![]).unwrap();
    assert!(mean(&report.losses[20..]) < 0.5 * mean(&report.losses[..4]), "{:?}", report.losses);
}

#[test]
fn a_small_gpt_learns_next_tokens() {
    let opts = small_gpt();
    let data: Arc<dyn Dataset> = Arc::new(SyntheticDataset::tokens(16, 8, 128, 5).unwrap());
    let mut c = cfg(8, 60);
    c.optimizer = OptimizerConfig {
        kind: OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        schedule: LrSchedule::Constant(0.01),
        weight_decay: 0.0,
        decay_except_norm: true,
        clip_grad_norm: None,
    };
    let t = Trainer::new("gpt", builder("gpt", opts, vec![]), source(data), c);
    let report = t.fit(vec![]).unwrap();
    assert!(mean(&report.losses[55..]) < 0.6 * mean(&report.losses[..5]), "{:?}", report.losses);
}

#[test]
fn a_gpt_with_dropout_resumes_with_the_uninterrupted_dropout_masks() {
    let gpt = autopar_models::Gpt::new(autopar_models::GptConfig {
        vocab: 16,
        context: 8,
        width: 16,
        heads: 2,
        layers: 1,
        dropout: 0.2,
        ..Default::default()
    })
    .unwrap();
    let model: Arc<dyn Model> = Arc::new(gpt);
    let build: BuildNetwork = Arc::new(move |batch, train| {
        let (graph, m) = model.build_graph(batch, if train { Mode::Train } else { Mode::Eval }, 7).map_err(|e| e.to_string())?;
        Ok(Network { graph, x: m.x, labels: m.labels, logits: m.logits, loss: m.loss })
    });
    let data: Arc<dyn Dataset> = Arc::new(SyntheticDataset::tokens(16, 8, 64, 5).unwrap());
    // One device, and two (the dropout masks drawn block by block on every rank).
    for parallel in [ParallelContext::default(), context("semi_auto_parallel", 2)] {
        let dir = tempfile::tempdir().unwrap();
        let trainer = |steps: u64| {
            let mut c = cfg(8, steps);
            c.parallel = parallel.clone();
            Trainer::new("gpt", build.clone(), source(data.clone()), c)
        };
        let full = trainer(12).fit(vec![]).unwrap();
        let mut first = trainer(5);
        first.config_mut().checkpoint = checkpoints(dir.path(), 0, 0);
        let part = first.fit(vec![]).unwrap();
        let mut second = trainer(12);
        second.config_mut().resume = Some(part.checkpoints[0].clone());
        let rest = second.fit(vec![]).unwrap();
        assert_eq!(rest.losses[..], full.losses[5..], "{}", parallel.parallel_mode());
        assert_bit_equal(&rest.params().unwrap(), &full.params().unwrap());
    }
}

fn checkpoints(dir: &Path, every: u64, keep: usize) -> Option<CheckpointConfig> {
    Some(CheckpointConfig { dir: dir.to_path_buf(), prefix: "net".into(), every_steps: every, keep_max: keep })
}

fn resume_matches(optimizer: OptimizerConfig, parallel: ParallelContext) {
    let dir = tempfile::tempdir().unwrap();
    let mut base = cfg(16, 28);
    base.optimizer = optimizer;
    base.parallel = parallel;
    let full = mlp_trainer(base.clone()).fit(vec![]).unwrap();

    let mut first = base.clone();
    first.max_steps = Some(10);
    first.checkpoint = checkpoints(dir.path(), 5, 0);
    let part = mlp_trainer(first).fit(vec![]).unwrap();
    assert_eq!(part.losses[..], full.losses[..10]);
    let ck = part.checkpoints.last().unwrap().clone();
    assert!(ck.to_string_lossy().contains("net-10"), "{ck:?}");

    let mut second = base.clone();
    second.resume = Some(ck);
    let rest = mlp_trainer(second).fit(vec![]).unwrap();
    assert_eq!(rest.first_step, 10);
    assert_eq!(rest.losses[..], full.losses[10..], "the resumed loss trajectory differs");
    assert_bit_equal(&rest.params().unwrap(), &full.params().unwrap());
}

#[test]
fn resume_equals_an_uninterrupted_run_with_momentum() {
    resume_matches(OptimizerConfig::default(), ParallelContext::default());
}

#[test]
fn resume_equals_an_uninterrupted_run_with_adamw_and_a_warmup_cosine_schedule() {
    let opt = OptimizerConfig {
        kind: OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        schedule: LrSchedule::WarmupCosine { base_lr: 0.01, min_lr: 0.001, warmup_steps: 6, total_steps: 28 },
        weight_decay: 0.01,
        decay_except_norm: true,
        clip_grad_norm: None,
    };
    resume_matches(opt, ParallelContext::default());
}

#[test]
fn a_parallel_run_resumes_from_its_per_rank_checkpoints() {
    resume_matches(OptimizerConfig::default(), context("semi_auto_parallel", 2));
}

#[test]
fn the_checkpoint_callback_keeps_at_most_keep_checkpoint_max_files_and_leaves_no_temp_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(16, 10);
    c.checkpoint = checkpoints(dir.path(), 2, 3);
    let report = mlp_trainer(c).fit(vec![]).unwrap();
    assert_eq!(report.checkpoints.len(), 5);
    let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["net-10.safetensors", "net-6.safetensors", "net-8.safetensors"]);
    let f = autopar_checkpoint::CheckpointFile::open(dir.path().join("net-10.safetensors")).unwrap();
    assert_eq!(f.metadata()["step"], "10");
    assert_eq!(f.metadata()["world_size"], "1");
    assert!(f.get("fc1.weight").is_some() && f.get("moments.fc1.weight").is_some());
}

#[test]
fn init_loads_parameters_by_name_and_names_a_missing_or_misshaped_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(16, 4);
    c.checkpoint = checkpoints(dir.path(), 0, 0);
    let trained = mlp_trainer(c).fit(vec![]).unwrap();
    let ck = trained.checkpoints[0].clone();

    let mut c = cfg(16, 0);
    c.init = Some(ck.clone());
    let loaded = mlp_trainer(c).fit(vec![]).unwrap();
    assert_bit_equal(&loaded.params().unwrap(), &trained.params().unwrap());

    let wide = ModelOptions { width: Some(48), ..small_mlp() };
    let mut c = cfg(16, 1);
    c.init = Some(ck.clone());
    let t = Trainer::new("mlp", builder("mlp", wide, vec![]), source(clusters(&[16], 4, 256)), c);
    let err = t.fit(vec![]).unwrap_err();
    assert!(
        matches!(&err, TrainError::InitShape { name, shape, got, .. } if name == "fc1.bias" && shape == &[48] && got == &[32]),
        "{err}"
    );
    assert!(err.to_string().contains("fc1.bias") && err.to_string().contains(&ck.display().to_string()), "{err}");

    let partial = dir.path().join("partial.safetensors");
    let mut only = ParamStore::new();
    only.insert("fc1.weight", trained.params().unwrap().get("fc1.weight").unwrap().clone());
    let pos = autopar_runtime::trainer::RunPosition {
        step: 0,
        epoch: 0,
        step_in_epoch: 0,
        world_size: 1,
        rank: 0,
        batch_size: 16,
        parallel_mode: "stand_alone".into(),
        run_id: "0123456789abcdef".into(),
        data: None,
        optimizer_steps: None,
        loss_scale: None,
    };
    autopar_runtime::trainer::save_checkpoint(&partial, &only, &ParamStore::new(), &pos).unwrap();
    let mut c = cfg(16, 1);
    c.init = Some(partial);
    let err = mlp_trainer(c).fit(vec![]).unwrap_err();
    assert!(matches!(&err, TrainError::InitMissing { name, shape, .. } if name == "fc1.bias" && shape == &[32]), "{err}");
    assert!(err.to_string().contains("has no parameter fc1.bias"), "{err}");
}

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * y.abs().max(1e-6), "{what}: step {i}: {x} vs {y}");
    }
}

fn assert_params_close(a: &ParamStore, b: &ParamStore, what: &str) {
    for ((n, x), (_, y)) in a.iter().zip(b.iter()) {
        assert_close(&x.to_f64_vec(), &y.to_f64_vec(), &format!("{what} {n}"));
    }
}

#[test]
fn semi_auto_and_data_parallel_runs_on_2_and_4_devices_equal_stand_alone() {
    let reference = mlp_trainer(cfg(16, 12)).fit(vec![]).unwrap();
    for n in [2, 4] {
        for mode in ["semi_auto_parallel", "data_parallel"] {
            let mut c = cfg(16, 12);
            c.parallel = context(mode, n);
            let run = mlp_trainer(c).fit(vec![]).unwrap();
            assert_eq!(run.device_num, n);
            assert_close(&run.losses, &reference.losses, &format!("{mode} on {n}"));
            assert_params_close(&run.params().unwrap(), &reference.params().unwrap(), &format!("{mode} on {n}"));
        }
    }
}

#[test]
fn a_model_parallel_strategy_trains_like_stand_alone_and_saves_per_rank_files_and_the_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let reference = mlp_trainer(cfg(16, 8)).fit(vec![]).unwrap();
    let strategies = vec![("fc1.matmul", Strategy(vec![vec![2, 1], vec![2, 1]])), ("fc2.matmul", Strategy(vec![vec![1, 2], vec![1, 2]]))];
    let mut c = cfg(16, 8);
    c.parallel = context("semi_auto_parallel", 4);
    c.checkpoint = checkpoints(dir.path(), 4, 0);
    let t = Trainer::new("mlp", builder("mlp", small_mlp(), strategies), source(clusters(&[16], 4, 256)), c);
    let run = t.fit(vec![]).unwrap();
    assert_close(&run.losses, &reference.losses, "model parallel");
    assert_params_close(&run.params().unwrap(), &reference.params().unwrap(), "model parallel");
    for k in 0..4 {
        let f = autopar_checkpoint::CheckpointFile::open(dir.path().join(format!("rank_{k}/net-8_{k}.safetensors"))).unwrap();
        assert_eq!(f.metadata()["rank"], k.to_string());
        assert_eq!(f.metadata()["world_size"], "4");
        // fc1.weight [32, 16] is split 2 ways on its rows: each rank holds its slice.
        assert_eq!(f.get("fc1.weight").unwrap().shape, vec![16, 16]);
    }
    // The strategy beside the checkpoints describes everything they hold: parameters and
    // their optimizer state.
    let s = autopar_checkpoint::StrategyFile::load(dir.path().join("strategy.json")).unwrap();
    let f = autopar_checkpoint::CheckpointFile::open(dir.path().join("rank_0/net-8_0.safetensors")).unwrap();
    let held: Vec<String> = f.tensors().iter().map(|t| t.name.clone()).filter(|n| n.contains('.')).collect();
    assert!(held.iter().any(|n| n == "moments.fc1.weight"), "{held:?}");
    for name in held {
        assert!(s.layout_items.iter().any(|l| l.name == name), "{name} is in the checkpoint but not in strategy.json");
    }
}

#[test]
fn bad_options_and_mismatched_data_are_errors_naming_the_value() {
    let mut c = cfg(6, 4);
    c.parallel = context("data_parallel", 4);
    let err = mlp_trainer(c).fit(vec![]).unwrap_err();
    assert!(err.to_string().contains("[6, 16] cannot be split over 4 devices") && err.to_string().contains("`batch_size`"), "{err}");

    let t = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(clusters(&[20], 4, 64)), cfg(8, 2));
    let err = t.fit(vec![]).unwrap_err();
    assert!(matches!(err, TrainError::DataMismatch { what: "sample shape", .. }), "{err}");

    let t = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(clusters(&[16], 7, 64)), cfg(8, 2));
    let err = t.fit(vec![]).unwrap_err();
    assert!(matches!(err, TrainError::DataMismatch { what: "classes", .. }), "{err}");

    // A network whose "loss" is its logits: the trainer's per-sample mean needs a scalar.
    let mlp = builder("mlp", small_mlp(), vec![]);
    let logits_as_loss: BuildNetwork = Arc::new(move |batch, train| {
        let net = mlp(batch, train)?;
        Ok(Network { loss: net.logits, ..net })
    });
    let err = Trainer::new("mlp", logits_as_loss, source(clusters(&[16], 4, 64)), cfg(8, 2)).fit(vec![]).unwrap_err();
    assert!(matches!(&err, TrainError::LossNotScalar { shape, .. } if shape == &[8, 4]), "{err}");
}

/// A dataset counting the samples read from it.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Dataset>,
    reads: std::sync::atomic::AtomicUsize,
}

impl Dataset for Counting {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn sample_shape(&self) -> &[usize] {
        self.inner.sample_shape()
    }
    fn label_shape(&self) -> Option<&[usize]> {
        self.inner.label_shape()
    }
    fn num_classes(&self) -> Option<usize> {
        self.inner.num_classes()
    }
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> autopar_data::Result<()> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.read(index, x, y)
    }
}

#[test]
fn dataset_strategy_makes_each_rank_read_only_its_rows_of_every_batch() {
    let (batch, steps) = (16usize, 6u64);
    let reference = mlp_trainer(cfg(batch, steps)).fit(vec![]).unwrap();
    // (dataset_strategy, samples read per step by the 4 ranks together)
    for (strategy, per_step) in [(None, batch), (Some("\"full_batch\""), 4 * batch), (Some("[[2, 1], [2]]"), 2 * batch)] {
        let data = Arc::new(Counting { inner: clusters(&[16], 4, 256), reads: 0.into() });
        let mut c = cfg(batch, steps);
        c.parallel = context("semi_auto_parallel", 4);
        if let Some(s) = strategy {
            c.parallel.set_str("dataset_strategy", s).unwrap();
        }
        let t = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(data.clone()), c);
        let run = t.fit(vec![]).unwrap();
        assert_close(&run.losses, &reference.losses, &format!("dataset_strategy {strategy:?}"));
        let reads = data.reads.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(reads, per_step * steps as usize, "dataset_strategy {strategy:?}: samples read");
    }
}

#[test]
fn strategy_ckpt_config_saves_the_plan_and_optimizer_state_with_or_without_frozen_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let resnet = ModelOptions { width: Some(4), input_shape: Some(vec![3, 8, 8]), num_classes: Some(4), ..Default::default() };
    let train = |key: &str, value: String| {
        let mut c = cfg(8, 1);
        c.parallel = context("semi_auto_parallel", 2);
        c.parallel.set_str(key, &value).unwrap();
        Trainer::new("resnet18", builder("resnet18", resnet.clone(), vec![]), source(clusters(&[3, 8, 8], 4, 64)), c).fit(vec![]).unwrap();
    };
    let (a, b, old) = (dir.path().join("a.json"), dir.path().join("b.ckpt"), dir.path().join("old.ckpt"));
    train("strategy_ckpt_config", format!(r#"{{"save_file": "{}"}}"#, a.display()));
    train("strategy_ckpt_config", format!(r#"{{"save_file": "{}", "only_trainable_params": false}}"#, b.display()));
    train("strategy_ckpt_save_file", old.display().to_string());
    // JSON by extension, protobuf otherwise.
    assert!(std::fs::read_to_string(&a).unwrap().trim_start().starts_with('{'));
    assert!(std::fs::read_to_string(&b).is_err() || !std::fs::read_to_string(&b).unwrap().trim_start().starts_with('{'));
    let names = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> = autopar_checkpoint::StrategyFile::load(p).unwrap().layout_items.into_iter().map(|l| l.name).collect();
        v.sort();
        v
    };
    let (trainable, all, older) = (names(&a), names(&b), names(&old));
    // frozen parameters only without only_trainable_params; the optimizer state of the
    // trainable ones always, so that the rank checkpoints reshard whole
    assert!(trainable.iter().any(|n| n == "conv1.weight") && !trainable.iter().any(|n| n.contains("moving_mean")), "{trainable:?}");
    assert!(trainable.iter().any(|n| n == "moments.conv1.weight"), "optimizer state: {trainable:?}");
    assert!(all.iter().any(|n| n.ends_with("moving_mean")), "{all:?}");
    assert!(all.iter().any(|n| n == "moments.conv1.weight"), "optimizer state: {all:?}");
    assert_eq!(older, trainable);
}

#[test]
fn a_strategy_load_file_sets_the_strategies_and_a_missing_one_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mp.json");
    std::fs::write(
        &file,
        r#"{"current_stage": 2, "parallel_strategy_item": {"MatMul_fc1.weight": {"stage": 0, "parallel_strategy": [[2, 1], [2, 1]]}}, "parallel_layout_item": {}}"#,
    )
    .unwrap();
    let reference = mlp_trainer(cfg(16, 4)).fit(vec![]).unwrap();
    let mut c = cfg(16, 4);
    c.parallel = context("semi_auto_parallel", 4);
    c.parallel.set_str("strategy_ckpt_config", &format!(r#"{{"load_file": "{}"}}"#, file.display())).unwrap();
    c.checkpoint = checkpoints(dir.path(), 4, 0);
    let run = mlp_trainer(c).fit(vec![]).unwrap();
    assert_close(&run.losses, &reference.losses, "strategy from a file");
    // fc1.weight [32, 16] split 2 ways on its rows, as the file says (the default would not split it).
    let f = autopar_checkpoint::CheckpointFile::open(dir.path().join("rank_0/net-4_0.safetensors")).unwrap();
    assert_eq!(f.get("fc1.weight").unwrap().shape, vec![16, 16]);
    let mut c = cfg(16, 4);
    c.parallel = context("semi_auto_parallel", 4);
    c.parallel.set_str("strategy_ckpt_load_file", &dir.path().join("missing.json").display().to_string()).unwrap();
    let err = mlp_trainer(c).fit(vec![]).unwrap_err().to_string();
    assert!(err.contains("missing.json"), "{err}");
}

#[test]
fn global_rank_is_refused_when_one_process_runs_every_rank() {
    let mut c = cfg(16, 2);
    c.parallel = context("semi_auto_parallel", 2);
    c.parallel.set_str("global_rank", "1").unwrap();
    let err = mlp_trainer(c).fit(vec![]).unwrap_err();
    assert!(matches!(err, TrainError::Runtime(autopar_runtime::RuntimeError::GlobalRankInProcess { devices: 2 })), "{err}");
    assert!(err.to_string().contains("mpirun"), "{err}");
}
