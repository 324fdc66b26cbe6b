//! Micro-batches in the trainer: pipelines (`pipeline_stages` > 1 with `micro_batches`) and
//! gradient accumulation without stages equal stand-alone on the whole batch (BatchNorm
//! models: stand-alone accumulation over the same micro-batches); a pipeline run writes one
//! strategy file per stage and the merged one, and resumes on another pipeline or none.

mod common;

use autopar_checkpoint::StrategyFile;
use autopar_models::ModelOptions;
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{CheckpointConfig, OptimizerConfig, OptimizerKind};
use autopar_runtime::{LrSchedule, ParamStore, TrainConfig, TrainReport, Trainer};
use common::{builder, clusters, context, gpt, small_mlp, source, tokens};
use serde_json::json;

fn cfg(batch: usize, steps: u64) -> TrainConfig {
    TrainConfig { epochs: 1000, max_steps: Some(steps), batch_size: batch, prefetch: 0, ..Default::default() }
}

fn pipeline(devices: usize, stages: usize, scheduler: &str) -> ParallelContext {
    let mut ctx = context("semi_auto_parallel", devices);
    ctx.set("pipeline_stages", &json!(stages)).unwrap();
    ctx.set("pipeline_config", &json!({ "pipeline_scheduler": scheduler })).unwrap();
    ctx
}

/// Momentum (its state, `moments.*`, is resharded on resume).
fn momentum() -> OptimizerConfig {
    OptimizerConfig {
        kind: OptimizerKind::Momentum { momentum: 0.9, nesterov: false },
        schedule: LrSchedule::Constant(0.05),
        weight_decay: 0.0,
        decay_except_norm: true,
        clip_grad_norm: None,
    }
}

/// Loss and every parameter within a relative 1e-5 (of the value, or of the tensor's largest
/// value for entries near zero).
fn assert_same(what: &str, run: &TrainReport, want_losses: &[f64], want: &ParamStore) {
    assert_eq!(run.losses.len(), want_losses.len(), "{what}");
    for (s, (a, b)) in run.losses.iter().zip(want_losses).enumerate() {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{what}: loss at step {s}: {a} vs {b}");
    }
    assert_eq!(run.params().unwrap().len(), want.len(), "{what}");
    for (name, w) in want.iter() {
        let w = w.to_f64_vec();
        let scale = w.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
        let got = run.params().unwrap().require(name).unwrap().to_f64_vec();
        for (i, (a, b)) in got.iter().zip(&w).enumerate() {
            assert!((a - b).abs() <= 1e-5 * scale, "{what}: {name}[{i}] {a} vs {b}");
        }
    }
}

#[test]
fn pipelines_in_the_trainer_equal_stand_alone_for_a_gpt_with_a_tied_embedding_and_dropout() {
    let steps = 6;
    let alone = Trainer::new("gpt", gpt(), source(tokens()), TrainConfig { optimizer: momentum(), ..cfg(16, steps) }).fit(vec![]).unwrap();
    for (devices, stages, micro, scheduler) in [(8, 2, 4, "1f1b"), (4, 4, 2, "gpipe"), (4, 2, 8, "1f1b")] {
        let c = TrainConfig {
            optimizer: momentum(),
            micro_batches: Some(micro),
            parallel: pipeline(devices, stages, scheduler),
            ..cfg(16, steps)
        };
        let run = Trainer::new("gpt", gpt(), source(tokens()), c).fit(vec![]).unwrap();
        assert_eq!(run.device_num, devices);
        assert_same(&format!("{devices} devices, P={stages}, M={micro}, {scheduler}"), &run, &alone.losses, &alone.params().unwrap());
    }
}

#[test]
fn gradient_accumulation_equals_the_whole_batch_in_every_mode() {
    let data = clusters(&[16], 4, 256);
    let alone = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(data.clone()), cfg(24, 8)).fit(vec![]).unwrap();
    for (parallel, micro) in [(ParallelContext::default(), 3), (context("data_parallel", 2), 4), (context("semi_auto_parallel", 4), 2)] {
        let mode = parallel.parallel_mode();
        let c = TrainConfig { micro_batches: Some(micro), parallel, ..cfg(24, 8) };
        let run = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(data.clone()), c).fit(vec![]).unwrap();
        assert_same(&format!("{mode}, {micro} micro-batches"), &run, &alone.losses, &alone.params().unwrap());
    }
}

#[test]
fn batchnorm_models_in_micro_batches_equal_stand_alone_accumulation_and_not_the_whole_batch() {
    let opts = ModelOptions { input_shape: Some(vec![3, 8, 8]), width: Some(4), num_classes: Some(3), ..Default::default() };
    let data = clusters(&[3, 8, 8], 3, 64);
    let run = |parallel: ParallelContext, micro: usize| {
        let c = TrainConfig { micro_batches: Some(micro), parallel, ..cfg(16, 4) };
        Trainer::new("resnet18", builder("resnet18", opts.clone(), vec![]), source(data.clone()), c).fit(vec![]).unwrap()
    };
    let accumulated = run(ParallelContext::default(), 2);
    let whole = run(ParallelContext::default(), 1);
    // Statistics per micro-batch change the result: the comparison below can fail.
    assert!((accumulated.losses[3] - whole.losses[3]).abs() > 1e-4, "{:?} vs {:?}", accumulated.losses, whole.losses);
    assert_same("resnet18, 2 stages of 2 devices", &run(pipeline(4, 2, "1f1b"), 2), &accumulated.losses, &accumulated.params().unwrap());
    assert_same("resnet18, data_parallel on 2", &run(context("data_parallel", 2), 2), &accumulated.losses, &accumulated.params().unwrap());
}

#[test]
fn a_pipeline_writes_a_strategy_file_per_stage_and_the_merged_one_and_resumes_with_or_without_stages() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("strategy.json");
    let trainer = |steps: u64, parallel: ParallelContext, micro: usize, ck: &str| {
        let mut c = TrainConfig { optimizer: momentum(), micro_batches: Some(micro), parallel, ..cfg(16, steps) };
        c.checkpoint = Some(CheckpointConfig { dir: dir.path().join(ck), prefix: "gpt".into(), every_steps: 0, keep_max: 0 });
        Trainer::new("gpt", gpt(), source(tokens()), c)
    };
    let full = Trainer::new("gpt", gpt(), source(tokens()), TrainConfig { optimizer: momentum(), ..cfg(16, 8) }).fit(vec![]).unwrap();
    let mut first_ctx = pipeline(4, 2, "1f1b");
    first_ctx.set("strategy_ckpt_config", &json!({ "save_file": save.to_str().unwrap() })).unwrap();
    let first = trainer(3, first_ctx, 4, "pp").fit(vec![]).unwrap();

    // One file per stage, each holding only its stage's parameters, and the merged file.
    let stage = |s: usize| StrategyFile::load(dir.path().join(format!("strategy_stage{s}.json"))).unwrap();
    let (s0, s1) = (stage(0), stage(1));
    assert!(s0.strategy_items.iter().all(|i| i.stage == 0) && s1.strategy_items.iter().all(|i| i.stage == 1));
    let names = |f: &StrategyFile| f.layout_items.iter().map(|l| l.name.clone()).collect::<Vec<_>>();
    assert!(names(&s0).iter().any(|n| n.starts_with("blocks.0.")) && !names(&s0).iter().any(|n| n.starts_with("ln_f.")));
    assert!(names(&s1).iter().any(|n| n.starts_with("ln_f.")) && !names(&s1).iter().any(|n| n.starts_with("blocks.0.")));
    let merged = StrategyFile::load(&save).unwrap();
    assert_eq!(merged.layout_items.len(), s0.layout_items.len() + s1.layout_items.len());
    assert!(merged.layout_items.iter().all(|l| l.split_stage().is_some()));
    assert!(dir.path().join("pp/strategy.json").is_file());

    // Resume on 4 stages, on none (another device count), and on the same pipeline.
    let ck = first.checkpoints[0].clone();
    for (what, parallel, micro) in [
        ("4 stages", pipeline(4, 4, "gpipe"), 2),
        ("semi_auto on 2", context("semi_auto_parallel", 2), 1),
        ("the same pipeline", pipeline(4, 2, "1f1b"), 4),
    ] {
        let mut t = trainer(8, parallel, micro, what);
        t.config_mut().resume = Some(ck.clone());
        let rest = t.fit(vec![]).unwrap();
        assert_eq!(rest.first_step, 3, "{what}");
        assert_same(&format!("resumed on {what}"), &rest, &full.losses[3..], &full.params().unwrap());
    }
}

#[test]
fn micro_batches_that_do_not_divide_the_batch_and_a_strategy_file_of_another_network_under_stages_are_refused() {
    let c = TrainConfig { micro_batches: Some(3), parallel: pipeline(4, 2, "1f1b"), ..cfg(16, 1) };
    let err = Trainer::new("gpt", gpt(), source(tokens()), c).fit(vec![]).unwrap_err();
    assert!(err.to_string().contains("3 micro-batches do not divide the batch of 16 rows"), "{err}");

    let c = TrainConfig { micro_batches: Some(0), ..cfg(16, 1) };
    let err = Trainer::new("gpt", gpt(), source(tokens()), c).fit(vec![]).unwrap_err();
    assert!(err.to_string().contains("micro_batches = 0"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.json");
    let mut ctx = pipeline(4, 2, "1f1b");
    ctx.set("strategy_ckpt_config", &json!({ "load_file": file.to_str().unwrap() })).unwrap();
    // A strategy file applies inside the stages: one naming an op the network lacks is refused.
    std::fs::write(
        &file,
        r#"{"current_stage":0,"parallel_layout_item":{},"parallel_strategy_item":{"MatMul_nope.weight":{"parallel_strategy":[[1,1],[1,1]],"stage":0}}}"#,
    )
    .unwrap();
    let c = TrainConfig { micro_batches: Some(2), parallel: ctx, ..cfg(16, 1) };
    let err = Trainer::new("gpt", gpt(), source(tokens()), c).fit(vec![]).unwrap_err();
    assert!(err.to_string().contains("item MatMul_nope.weight matches no operator of the network"), "{err}");
}
