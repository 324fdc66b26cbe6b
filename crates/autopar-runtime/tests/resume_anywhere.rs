//! Resume anywhere: a run saved on N devices under one strategy continues on M devices under
//! another and equals the uninterrupted run; merging a model-parallel run's checkpoints gives
//! the stand-alone run's parameters and optimizer state.

mod common;

use std::path::{Path, PathBuf};

use autopar_layout::Strategy;
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{CheckpointConfig, OptimizerConfig, OptimizerKind, TrainError};
use autopar_runtime::{LrSchedule, ParamStore, TrainConfig, TrainReport, Trainer};
use common::{builder, clusters, context, small_mlp, source};

type Strategies = Vec<(&'static str, Strategy)>;

fn momentum() -> OptimizerConfig {
    OptimizerConfig::default()
}

fn adamw() -> OptimizerConfig {
    OptimizerConfig {
        kind: OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        schedule: LrSchedule::WarmupCosine { base_lr: 0.01, min_lr: 0.001, warmup_steps: 4, total_steps: 12 },
        weight_decay: 0.01,
        decay_except_norm: true,
        clip_grad_norm: None,
    }
}

/// A run of `steps` (counted from step 0) on `ctx` with `strategies`, checkpointing into
/// `save` every 4 steps, resumed from `resume` when given.
fn run(
    opt: &OptimizerConfig,
    ctx: ParallelContext,
    strategies: Strategies,
    steps: u64,
    save: Option<&Path>,
    resume: Option<PathBuf>,
) -> Result<TrainReport, TrainError> {
    let cfg = TrainConfig {
        epochs: 1000,
        max_steps: Some(steps),
        batch_size: 16,
        prefetch: 0,
        optimizer: opt.clone(),
        parallel: ctx,
        checkpoint: save.map(|d| CheckpointConfig { dir: d.to_path_buf(), prefix: "net".into(), every_steps: 4, keep_max: 0 }),
        resume,
        ..Default::default()
    };
    Trainer::new("mlp", builder("mlp", small_mlp(), strategies), source(clusters(&[16], 4, 96)), cfg).fit(vec![])
}

/// Equal within float32 rounding of differently ordered sums: relative 1e-4, plus 1e-5 of the
/// largest magnitude in `b` for entries near zero.
fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-4 * y.abs() + 1e-5 * scale, "{what}[{i}]: {x} vs {y}");
    }
}

fn params_close(a: &ParamStore, b: &ParamStore, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: parameter count");
    for ((n, x), (m, y)) in a.iter().zip(b.iter()) {
        assert_eq!(n, m);
        close(&x.to_f64_vec(), &y.to_f64_vec(), &format!("{what} {n}"));
    }
}

/// 8 devices: fc1 split over rows and columns, fc2 over its output.
fn strategies_8() -> Strategies {
    vec![("fc1.matmul", Strategy(vec![vec![2, 2], vec![2, 2]])), ("fc2.matmul", Strategy(vec![vec![1, 2], vec![4, 2]]))]
}

/// 4 devices: another split of both.
fn strategies_4() -> Strategies {
    vec![("fc1.matmul", Strategy(vec![vec![1, 2], vec![2, 2]])), ("fc2.matmul", Strategy(vec![vec![2, 1], vec![2, 1]]))]
}

fn resume_8_4_2(opt: OptimizerConfig) {
    let uninterrupted = run(&opt, context("data_parallel", 2), vec![], 12, None, None).unwrap();
    let alone = run(&opt, ParallelContext::default(), vec![], 12, None, None).unwrap();
    close(&uninterrupted.losses, &alone.losses, "2 devices vs stand-alone");

    let (a, b, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = run(&opt, context("semi_auto_parallel", 8), strategies_8(), 4, Some(a.path()), None).unwrap();
    close(&first.losses, &uninterrupted.losses[..4], "8 devices, steps 1-4");
    let second = run(&opt, context("semi_auto_parallel", 4), strategies_4(), 8, Some(b.path()), Some(a.path().to_path_buf())).unwrap();
    assert_eq!(second.first_step, 4);
    close(&second.losses, &uninterrupted.losses[4..8], "resumed on 4 devices, steps 5-8");
    let third =
        run(&opt, context("data_parallel", 2), vec![], 12, Some(c.path()), Some(b.path().join("rank_0/net-8_0.safetensors"))).unwrap();
    assert_eq!(third.first_step, 8);
    close(&third.losses, &uninterrupted.losses[8..], "resumed on 2 devices, steps 9-12");
    params_close(&third.params().unwrap(), &uninterrupted.params().unwrap(), "after 8 -> 4 -> 2");

    // And back to one device from the 4-device model-parallel checkpoint.
    let d = tempfile::tempdir().unwrap();
    let alone_rest = run(&opt, ParallelContext::default(), vec![], 12, Some(d.path()), Some(b.path().to_path_buf())).unwrap();
    close(&alone_rest.losses, &alone.losses[8..], "resumed on 1 device, steps 9-12");
    params_close(&alone_rest.params().unwrap(), &alone.params().unwrap(), "after 8 -> 4 -> 1");
}

#[test]
fn momentum_run_resumed_8_to_4_to_2_devices_under_other_strategies_equals_the_uninterrupted_run() {
    resume_8_4_2(momentum());
}

#[test]
fn adamw_run_with_a_schedule_resumed_8_to_4_to_2_devices_equals_the_uninterrupted_run() {
    resume_8_4_2(adamw());
}

/// Every tensor of a stand-alone checkpoint against the same tensor merged from a
/// model-parallel run's rank files.
fn merged_state_equals_stand_alone(opt: OptimizerConfig, state_prefixes: &[&str]) {
    let (alone_dir, mp_dir, merged_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(&opt, ParallelContext::default(), vec![], 8, Some(alone_dir.path()), None).unwrap();
    run(&opt, context("semi_auto_parallel", 8), strategies_8(), 8, Some(mp_dir.path()), None).unwrap();
    let strategy = mp_dir.path().join("strategy.json");
    let opts = autopar_checkpoint::TransformOptions::default();
    // The transform reads the newest file of each rank folder: step 8's.
    let report = autopar_checkpoint::transform_checkpoints(mp_dir.path(), merged_dir.path(), Some(&strategy), None, &opts).unwrap();
    assert_eq!(report.files.len(), 1);
    let merged = autopar_runtime::checkpoint_io::load_checkpoint(&report.files[0]).unwrap();
    let alone = autopar_runtime::checkpoint_io::load_checkpoint(&alone_dir.path().join("net-8.safetensors")).unwrap();
    let mut state = 0;
    for (name, want) in alone.iter() {
        let got = merged.get(name).unwrap_or_else(|| panic!("{name} is not in the merged checkpoint"));
        assert_eq!(got.shape(), want.shape(), "{name}");
        close(&got.to_f64_vec(), &want.to_f64_vec(), name);
        state += usize::from(state_prefixes.iter().any(|p| name.starts_with(p)));
    }
    // fc1..fc3, weight and bias, each with its state tensors.
    assert_eq!(state, 6 * state_prefixes.len(), "optimizer state tensors compared");
}

#[test]
fn merged_momentum_state_of_a_model_parallel_run_equals_stand_alone() {
    merged_state_equals_stand_alone(momentum(), &["moments."]);
}

#[test]
fn merged_adamw_state_of_a_model_parallel_run_equals_stand_alone() {
    merged_state_equals_stand_alone(adamw(), &["adam_m.", "adam_v."]);
}

#[test]
fn resharding_into_the_folder_it_reads_or_without_its_strategy_is_refused() {
    let a = tempfile::tempdir().unwrap();
    let opt = momentum();
    run(&opt, context("semi_auto_parallel", 8), strategies_8(), 4, Some(a.path()), None).unwrap();
    let err = run(&opt, context("semi_auto_parallel", 4), strategies_4(), 8, Some(a.path()), Some(a.path().to_path_buf())).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("`checkpoint_dir`") && msg.contains(&a.path().display().to_string()), "{msg}");

    // Same devices and strategy: resuming into the same folder is fine.
    let same = run(&opt, context("semi_auto_parallel", 8), strategies_8(), 8, Some(a.path()), Some(a.path().to_path_buf())).unwrap();
    assert_eq!(same.first_step, 4);

    std::fs::remove_file(a.path().join("strategy.json")).unwrap();
    let err = run(&opt, context("data_parallel", 2), vec![], 12, None, Some(a.path().to_path_buf())).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("strategy.json") && msg.contains("is missing"), "{msg}");
}

/// An auto_parallel run (its strategies found by the search, its slices described by the
/// strategy.json it writes) resumes on 2 devices under data_parallel equal to the uninterrupted run.
#[test]
fn auto_parallel_run_resumes_on_another_device_count() {
    let opt = momentum();
    let uninterrupted = run(&opt, context("data_parallel", 2), vec![], 8, None, None).unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut auto = context("auto_parallel", 8);
    auto.set_str("search_mode", "dynamic_programming").unwrap();
    let first = run(&opt, auto, vec![], 4, Some(a.path()), None).unwrap();
    close(&first.losses, &uninterrupted.losses[..4], "auto_parallel on 8 devices, steps 1-4");
    assert!(a.path().join("strategy.json").is_file());
    let second = run(&opt, context("data_parallel", 2), vec![], 8, Some(b.path()), Some(a.path().to_path_buf())).unwrap();
    assert_eq!(second.first_step, 4);
    close(&second.losses, &uninterrupted.losses[4..], "resumed on 2 devices, steps 5-8");
    params_close(&second.params().unwrap(), &uninterrupted.params().unwrap(), "after auto_parallel 8 -> 2");
}

fn sharded(mut ctx: ParallelContext, size: i64) -> ParallelContext {
    ctx.set_str("enable_parallel_optimizer", "true").unwrap();
    ctx.set("parallel_optimizer_config", &serde_json::json!({"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": size}))
        .unwrap();
    ctx
}

/// The parallel optimizer in the trainer: a sharded run equals the unsharded one; its rank
/// files hold shard-sized parameters and optimizer state that `strategy.json` describes, so
/// they merge to the stand-alone state, resume on the same layout, and resume on another
/// device count and mode (8 semi_auto sharded -> 4 data_parallel sharded -> 2 data_parallel).
#[test]
fn optimizer_sharded_runs_save_merge_and_resume_anywhere() {
    let opt = adamw();
    let uninterrupted = run(&opt, context("data_parallel", 2), vec![], 12, None, None).unwrap();
    let plain8 = run(&opt, context("semi_auto_parallel", 8), strategies_8(), 4, None, None).unwrap();
    let (a, b, c, merged_dir) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = run(&opt, sharded(context("semi_auto_parallel", 8), 2), strategies_8(), 4, Some(a.path()), None).unwrap();
    assert_eq!(first.losses, plain8.losses, "sharded vs unsharded on 8 devices");
    params_close(&first.params().unwrap(), &plain8.params().unwrap(), "sharded vs unsharded on 8 devices");

    // A rank file holds its shard: fc1.weight [32,16] split 2x2 -> slice [16,8], shard [8,8].
    let rank1 = autopar_runtime::checkpoint_io::load_checkpoint(&a.path().join("rank_1/net-4_1.safetensors")).unwrap();
    let strategy = autopar_checkpoint::StrategyFile::load(a.path().join("strategy.json")).unwrap();
    for name in ["fc1.weight", "adam_m.fc1.weight", "adam_v.fc1.weight"] {
        let item = strategy.layout_items.iter().find(|l| l.name == name).unwrap();
        assert_eq!((item.opt_weight_shard_size, item.opt_weight_shard_step), (2, 4), "{name}: replicas 4 ranks apart");
        let slice: usize = item.tensor_shape.as_ref().unwrap().iter().product::<usize>() / 4;
        assert_eq!(rank1.require(name).unwrap().numel(), slice / 2, "{name}");
    }
    // The rank files merge to the run's parameters.
    let report = autopar_checkpoint::transform_checkpoints(
        a.path(),
        merged_dir.path(),
        Some(&a.path().join("strategy.json")),
        None,
        &autopar_checkpoint::TransformOptions::default(),
    )
    .unwrap();
    let merged = autopar_runtime::checkpoint_io::load_checkpoint(&report.files[0]).unwrap();
    for (name, want) in first.params().unwrap().iter() {
        close(&merged.require(name).unwrap().to_f64_vec(), &want.to_f64_vec(), name);
    }

    // Same layout: the rank files are restored as they are.
    let same = run(&opt, sharded(context("semi_auto_parallel", 8), 2), strategies_8(), 8, None, Some(a.path().to_path_buf())).unwrap();
    assert_eq!(same.first_step, 4);
    close(&same.losses, &uninterrupted.losses[4..8], "resumed sharded on 8 devices");
    // Other layouts: 4 devices data_parallel sharded over the whole group, then 2 unsharded.
    let second = run(&opt, sharded(context("data_parallel", 4), -1), vec![], 8, Some(b.path()), Some(a.path().to_path_buf())).unwrap();
    assert_eq!(second.first_step, 4);
    close(&second.losses, &uninterrupted.losses[4..8], "resumed on 4 devices, steps 5-8");
    params_close(&second.params().unwrap(), &same.params().unwrap(), "4-device sharded vs 8-device sharded");
    let third = run(&opt, context("data_parallel", 2), vec![], 12, Some(c.path()), Some(b.path().to_path_buf())).unwrap();
    assert_eq!(third.first_step, 8);
    close(&third.losses, &uninterrupted.losses[8..], "resumed on 2 devices, steps 9-12");
    params_close(&third.params().unwrap(), &uninterrupted.params().unwrap(), "after sharded 8 -> 4 -> 2");
}
