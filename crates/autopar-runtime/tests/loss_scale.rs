//! Loss scaling in the trainer: a power-of-two scale changes no bit of the run in any mode; a
//! scale so large that the gradients overflow skips the update on every rank, lowers a dynamic
//! scale and leaves the parameters as they were; a resumed run continues with the saved scale
//! and equals the uninterrupted one.

mod common;

use std::sync::{Arc, Mutex};

use autopar_layout::Strategy;
use autopar_parallel::ParallelContext;
use autopar_runtime::callbacks::{Callback, StepEvent};
use autopar_runtime::trainer::{CheckpointConfig, OptimizerConfig, OptimizerKind, TrainResult};
use autopar_runtime::{LossScale, ParamStore, TrainConfig, TrainReport, Trainer};
use common::{builder, clusters, context, gpt, small_mlp, source, tokens};
use serde_json::json;

fn cfg(steps: u64, scale: LossScale, parallel: ParallelContext) -> TrainConfig {
    TrainConfig { epochs: 1000, max_steps: Some(steps), batch_size: 16, prefetch: 0, loss_scale: scale, parallel, ..Default::default() }
}

/// A step's loss scale and overflow flag.
type Seen = (Option<f64>, bool);

/// Records each step's loss scale and overflow flag.
#[derive(Clone, Default)]
struct Scales(Arc<Mutex<Vec<Seen>>>);

impl Callback for Scales {
    fn on_step_end(&mut self, e: &StepEvent) -> TrainResult<()> {
        self.0.lock().unwrap().push((e.loss_scale, e.overflow));
        Ok(())
    }
}

impl Scales {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// The jobs every check runs: stand-alone, data parallel, model parallel, the parallel
/// optimizer (level1 and level2), and a GPT pipeline of two stages.
fn jobs() -> Vec<(&'static str, Trainer)> {
    let mlp = |name, ctx: ParallelContext, strategies: Vec<(&'static str, Strategy)>, scale, steps| {
        (name, Trainer::new("mlp", builder("mlp", small_mlp(), strategies), source(clusters(&[16], 4, 96)), cfg(steps, scale, ctx)))
    };
    let mut optimizer = context("semi_auto_parallel", 4);
    optimizer.set("enable_parallel_optimizer", &json!(true)).unwrap();
    // Level2 unscales the gradients after the backward pass has reduce-scattered them.
    let mut level2 = optimizer.clone();
    level2.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0, "optimizer_level": "level2"})).unwrap();
    let mut pipeline = context("semi_auto_parallel", 4);
    pipeline.set("pipeline_stages", &json!(2)).unwrap();
    let split = vec![("fc1.matmul", Strategy(vec![vec![2, 2], vec![2, 2]])), ("fc2.matmul", Strategy(vec![vec![1, 2], vec![4, 2]]))];
    let none = LossScale::None;
    vec![
        mlp("stand-alone", ParallelContext::default(), vec![], none, 6),
        mlp("data parallel on 4", context("data_parallel", 4), vec![], none, 6),
        mlp("model parallel on 8", context("semi_auto_parallel", 8), split, none, 6),
        mlp("the parallel optimizer on 4", optimizer, vec![], none, 6),
        mlp("the parallel optimizer at level2 on 4", level2, vec![], none, 6),
        (
            "a GPT pipeline on 2 x 2",
            Trainer::new("gpt", gpt(), source(tokens()), TrainConfig { micro_batches: Some(4), ..cfg(6, none, pipeline) }),
        ),
    ]
}

fn adamw() -> OptimizerConfig {
    OptimizerConfig {
        kind: OptimizerKind::AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
        schedule: autopar_runtime::LrSchedule::WarmupCosine { base_lr: 0.01, min_lr: 0.001, warmup_steps: 2, total_steps: 6 },
        weight_decay: 0.01,
        decay_except_norm: true,
        clip_grad_norm: Some(1.0),
    }
}

fn assert_bit_equal(what: &str, a: &TrainReport, b: &TrainReport) {
    assert_eq!(a.losses, b.losses, "{what}: losses");
    let (pa, pb): (ParamStore, ParamStore) = (a.params().unwrap(), b.params().unwrap());
    assert_eq!(pa.len(), pb.len());
    for ((n, x), (_, y)) in pa.iter().zip(pb.iter()) {
        assert!(x.bit_eq(y), "{what}: parameter {n} differs");
    }
}

#[test]
fn a_power_of_two_scale_changes_no_bit_in_any_mode() {
    for (what, mut t) in jobs() {
        let plain = t.fit(vec![]).unwrap();
        for scale in
            [LossScale::Fixed { scale: 1024.0, drop_overflow_update: true }, LossScale::Dynamic { init: 65536.0, factor: 2.0, window: 2 }]
        {
            t.config_mut().loss_scale = scale;
            let scales = Scales::default();
            let scaled = t.fit(vec![Box::new(scales.clone())]).unwrap();
            assert_bit_equal(&format!("{what} under {scale}"), &plain, &scaled);
            let seen = scales.take();
            assert_eq!(seen.len(), 6, "{what}");
            assert!(seen.iter().all(|&(s, overflow)| s.is_some() && !overflow), "{what} under {scale}: {seen:?}");
            if let LossScale::Dynamic { .. } = scale {
                // A window of 2: the scale doubles every second step without overflow.
                let want: Vec<f64> = [1.0, 1.0, 2.0, 2.0, 4.0, 4.0].iter().map(|f| 65536.0 * f).collect();
                assert_eq!(seen.iter().map(|s| s.0.unwrap()).collect::<Vec<_>>(), want, "{what}");
            }
        }
    }
}

#[test]
fn overflowed_steps_are_skipped_on_every_rank_and_lower_the_scale() {
    // 2^200 times the loss seed is infinite in f32: every gradient overflows; 2^80 does not.
    let huge = LossScale::Dynamic { init: 2f64.powi(200), factor: 2f64.powi(120), window: 1000 };
    let mut first_seen = None;
    for (what, mut t) in jobs() {
        t.config_mut().max_steps = Some(1);
        let before = t.fit(vec![]).unwrap();
        t.config_mut().loss_scale = huge;
        t.config_mut().max_steps = Some(4);
        let scales = Scales::default();
        let run = t.fit(vec![Box::new(scales.clone())]).unwrap();
        let seen = scales.take();
        assert_eq!(seen[0], (Some(2f64.powi(200)), true), "{what}: the first step overflows");
        assert_eq!(seen[1].0, Some(2f64.powi(80)), "{what}: and lowers the scale by its factor");
        assert!(seen.iter().skip(1).all(|s| !s.1), "{what}: a scale of 2^80 does not overflow: {seen:?}");
        // The forward pass is not scaled: the first loss is the unscaled run's.
        assert_eq!(run.losses[0], before.losses[0], "{what}");
        if first_seen.is_none() {
            first_seen = Some(seen.clone());
        }
        assert_eq!(Some(seen), first_seen, "{what}: the same steps overflow in every mode");
    }
}

#[test]
fn a_skipped_update_leaves_the_parameters_as_they_were() {
    let huge = 2f64.powi(200);
    for (what, mut t) in jobs() {
        // One step at a learning rate of 0 gives the starting parameters.
        t.config_mut().max_steps = Some(1);
        t.config_mut().optimizer.schedule = autopar_runtime::LrSchedule::Constant(0.0);
        let start = t.fit(vec![]).unwrap();
        t.config_mut().optimizer.schedule = autopar_runtime::LrSchedule::Constant(0.01);
        t.config_mut().loss_scale = LossScale::Fixed { scale: huge, drop_overflow_update: true };
        t.config_mut().max_steps = Some(3);
        let scales = Scales::default();
        let run = t.fit(vec![Box::new(scales.clone())]).unwrap();
        assert!(scales.take().iter().all(|s| s.1), "{what}: a fixed huge scale overflows every step");
        let (a, b) = (start.params().unwrap(), run.params().unwrap());
        for ((n, x), (_, y)) in a.iter().zip(b.iter()) {
            assert!(x.bit_eq(y), "{what}: parameter {n} changed by a skipped update");
        }
        // Kept (drop_overflow_update off), the overflowed gradients reach the parameters.
        t.config_mut().loss_scale = LossScale::Fixed { scale: huge, drop_overflow_update: false };
        t.config_mut().max_steps = Some(1);
        let kept = t.fit(vec![]).unwrap();
        assert!(kept.params().unwrap().iter().any(|(_, p)| !p.all_finite()), "{what}: a kept overflow is applied");
    }
}

#[test]
fn a_resumed_run_continues_with_the_saved_scale() {
    let dir = tempfile::tempdir().unwrap();
    // Scales 2^200 (overflows), 2^136 (overflows), 2^72, 2^72, 2^136 (grown after a window of
    // 2; overflows), 2^72: the checkpoint at step 3 holds a lowered scale and two skipped steps.
    let scale = LossScale::Dynamic { init: 2f64.powi(200), factor: 2f64.powi(64), window: 2 };
    for (i, (what, mut t)) in jobs().into_iter().enumerate() {
        let ck = dir.path().join(format!("job{i}"));
        t.config_mut().loss_scale = scale;
        // AdamW under a warm-up and cosine schedule: both follow the updates applied, which a
        // resume must count without the skipped steps.
        t.config_mut().optimizer = adamw();
        let scales = Scales::default();
        let full = t.fit(vec![Box::new(scales.clone())]).unwrap();
        let full_scales = scales.take();
        let want = [(200, true), (136, true), (72, false), (72, false), (136, true), (72, false)];
        assert_eq!(full_scales, want.map(|(e, o)| (Some(2f64.powi(e)), o)).to_vec(), "{what}");
        t.config_mut().checkpoint = Some(CheckpointConfig { dir: ck.clone(), prefix: "net".into(), every_steps: 3, keep_max: 0 });
        t.config_mut().max_steps = Some(3);
        t.fit(vec![]).unwrap();
        t.config_mut().checkpoint = None;
        t.config_mut().max_steps = Some(6);
        t.config_mut().resume = Some(ck);
        let rest = t.fit(vec![Box::new(scales.clone())]).unwrap();
        t.config_mut().resume = None;
        assert_eq!(rest.first_step, 3, "{what}");
        assert_eq!(scales.take(), full_scales[3..].to_vec(), "{what}: the scale continues");
        assert_eq!(rest.losses, full.losses[3..].to_vec(), "{what}: losses");
        let (a, b) = (rest.params().unwrap(), full.params().unwrap());
        for ((n, x), (_, y)) in a.iter().zip(b.iter()) {
            assert!(x.bit_eq(y), "{what}: parameter {n} differs after resuming");
        }
    }
}

/// Gradients that overflow on one rank only (its rows of the batch are huge): every rank skips
/// the update, so the replicas stay equal and unchanged; the next batch, ordinary everywhere,
/// trains.
#[test]
fn an_overflow_on_one_rank_skips_the_update_on_every_rank() {
    use autopar_graph::{DType, GraphBuilder, Initializer};
    use autopar_runtime::{Job, LocalRanks, Sgd};
    use autopar_tensor::Tensor;
    let (n, rows) = (4usize, 16usize);
    let mut b = GraphBuilder::new(3);
    let x = b.input("x", &[rows, 8], DType::F32).unwrap();
    let y = b.input("y", &[rows], DType::I64).unwrap();
    let w = b.parameter("w", &[8, 4], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("mm", x, w).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    let graph = b.finish();
    let batch = |huge_rows: std::ops::Range<usize>| {
        let xs: Vec<f32> =
            (0..rows * 8).map(|i| if huge_rows.contains(&(i / 8)) { 1e30 } else { ((i * 7) % 11) as f32 / 10.0 - 0.5 }).collect();
        let ys: Vec<i64> = (0..rows as i64).map(|i| i % 4).collect();
        vec![("x".to_string(), Tensor::from_vec(&[rows, 8], xs).unwrap()), ("y".to_string(), Tensor::from_vec(&[rows], ys).unwrap())]
    };
    let job = Job::new(&graph, loss, &context("data_parallel", n)).unwrap();
    let full = ParamStore::init(&graph).unwrap();
    let mut ranks = LocalRanks::start(
        job,
        Some(full.clone()),
        Some(Arc::new(|| Ok(Box::new(Sgd::new(autopar_runtime::LrSchedule::Constant(0.1))?) as _))),
    )
    .unwrap();
    // 2^64: ordinary rows' gradients stay far below f32's range; rank 2's (rows 8..12) of 1e30 do not.
    ranks.set_loss_scale(LossScale::Fixed { scale: 2f64.powi(64), drop_overflow_update: true }).unwrap();
    let loss = ranks.step(batch(8..12)).unwrap();
    assert!(loss.is_finite(), "the forward pass is not scaled: {loss}");
    assert!(ranks.last_loss_scale().unwrap().overflow);
    let after = ranks.params().unwrap();
    assert!(after.get("w").unwrap().bit_eq(full.get("w").unwrap()), "every rank skipped the update");
    ranks.step(batch(0..0)).unwrap();
    assert!(!ranks.last_loss_scale().unwrap().overflow);
    let trained = ranks.params().unwrap();
    assert!(!trained.get("w").unwrap().bit_eq(full.get("w").unwrap()), "an ordinary step updates");
}

/// A checkpoint written after overflowed steps only (no update applied, no optimizer state
/// yet) resumes, with loss scaling switched off, as the run that kept it on: the optimizer
/// counts the updates applied, not the steps. Switched on again from a checkpoint without it,
/// a dynamic scale starts at its first value.
#[test]
fn resumes_after_skipped_steps_only_with_scaling_switched_off_and_on() {
    let dir = tempfile::tempdir().unwrap();
    // Step 1 overflows (2^200); steps 2 to 4 run at 2^10, a power of two: no bit changes.
    let scale = LossScale::Dynamic { init: 2f64.powi(200), factor: 2f64.powi(190), window: 1000 };
    for (i, (what, mut t)) in jobs().into_iter().enumerate() {
        let ck = |k: &str| dir.path().join(format!("job{i}{k}"));
        t.config_mut().optimizer = adamw();
        t.config_mut().loss_scale = scale;
        t.config_mut().max_steps = Some(4);
        let kept = t.fit(vec![]).unwrap();
        t.config_mut().max_steps = Some(1);
        t.config_mut().checkpoint = Some(CheckpointConfig { dir: ck("a"), prefix: "net".into(), every_steps: 0, keep_max: 0 });
        t.fit(vec![]).unwrap();
        t.config_mut().loss_scale = LossScale::None;
        t.config_mut().max_steps = Some(4);
        t.config_mut().resume = Some(ck("a"));
        t.config_mut().checkpoint = Some(CheckpointConfig { dir: ck("b"), prefix: "net".into(), every_steps: 0, keep_max: 0 });
        let off = t.fit(vec![]).unwrap();
        assert_eq!(off.first_step, 1, "{what}");
        assert_eq!(off.losses, kept.losses[1..].to_vec(), "{what}: losses");
        for ((n, x), (_, y)) in off.params().unwrap().iter().zip(kept.params().unwrap().iter()) {
            assert!(x.bit_eq(y), "{what}: parameter {n} differs after resuming past a skipped step");
        }
        // On again: a dynamic scale from its first value, its window counted from step 4.
        t.config_mut().loss_scale = LossScale::Dynamic { init: 2f64.powi(200), factor: 2f64.powi(190), window: 2 };
        t.config_mut().max_steps = Some(7);
        t.config_mut().resume = Some(ck("b"));
        t.config_mut().checkpoint = None;
        let scales = Scales::default();
        let on = t.fit(vec![Box::new(scales.clone())]).unwrap();
        assert_eq!(on.first_step, 4, "{what}");
        assert_eq!(scales.take(), [(200, true), (10, false), (10, false)].map(|(e, o)| (Some(2f64.powi(e)), o)).to_vec(), "{what}");
    }
}
