//! Evaluation in parallel equals evaluation on one device: after training (every rank on its
//! own pieces, moved to the inference job's layouts where they differ), from a checkpoint
//! folder on another device count and strategy, and from full tensors; in data_parallel,
//! semi_auto_parallel, auto_parallel, a pipeline and the parallel optimizer, with a last batch
//! the devices cannot split (repeated until they can).

mod common;

use std::sync::Arc;

use autopar_data::{Dataset, Subset, SyntheticDataset};
use autopar_layout::Strategy;
use autopar_models::ModelOptions;
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::{CheckpointConfig, EvalResult};
use autopar_runtime::{TrainConfig, Trainer};
use common::{builder, clusters, context, small_gpt, small_mlp, source};
use serde_json::json;

/// Strategies by op name.
type Strategies = Vec<(&'static str, Strategy)>;

fn cfg(ctx: ParallelContext, steps: u64) -> TrainConfig {
    TrainConfig {
        epochs: 1000,
        max_steps: Some(steps),
        batch_size: 16,
        eval_batch_size: 16,
        prefetch: 0,
        parallel: ctx,
        ..Default::default()
    }
}

fn close(got: &EvalResult, want: &EvalResult, what: &str) {
    assert_eq!((got.samples, got.predictions), (want.samples, want.predictions), "{what}: {got:?} vs {want:?}");
    assert!((got.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1.0), "{what}: loss {} vs {}", got.loss, want.loss);
    let one = 1.0 / want.predictions as f64;
    assert!((got.accuracy - want.accuracy).abs() <= one + 1e-12, "{what}: accuracy {} vs {}", got.accuracy, want.accuracy);
}

/// Trains `model` under `ctx` (ops split by `strategies`), evaluating at the end of the run,
/// and returns that evaluation beside the one-device evaluation of the same parameters.
fn parallel_and_alone(
    model: &str,
    opts: ModelOptions,
    strategies: Strategies,
    data: Arc<dyn Dataset>,
    ctx: ParallelContext,
) -> (EvalResult, EvalResult) {
    let train = Arc::new(Subset::range(data.clone(), 0..64).unwrap());
    let held = Arc::new(Subset::range(data.clone(), 64..data.len()).unwrap());
    let t =
        Trainer::new(model, builder(model, opts.clone(), strategies), source(train.clone()), cfg(ctx, 3)).with_eval(source(held.clone()));
    let report = t.fit(vec![]).unwrap();
    let got = report.eval.clone().expect("an evaluation after training");
    let alone = Trainer::new(model, builder(model, opts, vec![]), source(train), cfg(ParallelContext::default(), 3));
    let want = alone.evaluate(&report.params().unwrap(), &source(held)).unwrap();
    (got, want)
}

#[test]
fn evaluation_after_training_equals_one_device_in_every_mode() {
    // 37 held-out samples: batches of 16, 16 and 5 (5 rows cannot be split over 4 or 8 devices).
    let mlp = || clusters(&[16], 4, 64 + 37);
    let mut pipeline = context("semi_auto_parallel", 4);
    pipeline.set("pipeline_stages", &json!(2)).unwrap();
    let mut sharded = context("data_parallel", 4);
    sharded.set("enable_parallel_optimizer", &json!(true)).unwrap();
    let split = Strategy(vec![vec![1, 4], vec![1, 4]]);
    let cases: Vec<(&str, ParallelContext, Strategies)> = vec![
        ("data_parallel", context("data_parallel", 4), vec![]),
        ("semi_auto_parallel, fc2 split 4 ways", context("semi_auto_parallel", 4), vec![("fc2.matmul", split)]),
        ("auto_parallel on 8", context("auto_parallel", 8), vec![]),
        ("a pipeline of 2 stages", pipeline, vec![]),
        ("the parallel optimizer", sharded, vec![]),
    ];
    for (what, ctx, strategies) in cases {
        let (got, want) = parallel_and_alone("mlp", small_mlp(), strategies, mlp(), ctx);
        assert_eq!(got.samples, 37, "{what}");
        close(&got, &want, what);
    }
    // A GPT: every token position scored.
    let gpt = small_gpt();
    let tokens: Arc<dyn Dataset> = Arc::new(SyntheticDataset::tokens(16, 8, 64 + 20, 5).unwrap());
    let (got, want) = parallel_and_alone("gpt", gpt, vec![], tokens, context("auto_parallel", 4));
    assert_eq!((got.samples, got.predictions), (20, 160));
    close(&got, &want, "gpt, auto_parallel on 4");
}

#[test]
fn a_checkpoint_folder_is_evaluated_on_another_device_count_and_strategy_from_its_pieces() {
    let data = clusters(&[16], 4, 64 + 21);
    let train = Arc::new(Subset::range(data.clone(), 0..64).unwrap());
    let held = source(Arc::new(Subset::range(data, 64..85).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(context("semi_auto_parallel", 4), 2);
    c.checkpoint = Some(CheckpointConfig { dir: dir.path().to_path_buf(), prefix: "net".into(), every_steps: 2, keep_max: 0 });
    let split4 = Strategy(vec![vec![4, 1], vec![1, 1]]);
    let report =
        Trainer::new("mlp", builder("mlp", small_mlp(), vec![("fc1.matmul", split4)]), source(train.clone()), c).fit(vec![]).unwrap();
    let alone = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(train.clone()), cfg(ParallelContext::default(), 2));
    let want = alone.evaluate(&report.params().unwrap(), &held).unwrap();
    let split2 = Strategy(vec![vec![1, 1], vec![2, 1]]);
    let other = Trainer::new(
        "mlp",
        builder("mlp", small_mlp(), vec![("fc2.matmul", split2)]),
        source(train),
        cfg(context("semi_auto_parallel", 2), 2),
    );
    let got = other.evaluate_checkpoint(dir.path(), &held).unwrap();
    close(&got, &want, "4 ranks' folder on 2 devices");
    // From full tensors on 2 devices too.
    close(&other.evaluate(&report.params().unwrap(), &held).unwrap(), &want, "full tensors on 2 devices");
    // A folder of another network: named.
    let wrong = Trainer::new(
        "mlp",
        builder("mlp", ModelOptions { width: Some(24), ..small_mlp() }, vec![]),
        source(clusters(&[16], 4, 8)),
        cfg(ParallelContext::default(), 1),
    );
    let e = wrong.evaluate_checkpoint(dir.path(), &held).unwrap_err().to_string();
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
}

#[test]
fn pieces_move_to_another_jobs_layouts_equal_to_the_slices_of_the_full_tensors() {
    use autopar_comm::{Communicator, LocalComm};
    use autopar_runtime::{relayout_params, slice_tensor, Job, ParamStore};
    let net = |strategies| builder("mlp", small_mlp(), strategies)(16, true).unwrap();
    let full = ParamStore::init(&net(vec![]).graph).unwrap();
    let job = |strategies, ctx: &ParallelContext| {
        let n = net(strategies);
        Job::new(&n.graph, n.loss, ctx).unwrap()
    };
    let mut sharded = context("data_parallel", 4);
    sharded.set("enable_parallel_optimizer", &json!(true)).unwrap();
    let rows = Strategy(vec![vec![2, 2], vec![1, 2]]);
    let cols = Strategy(vec![vec![1, 1], vec![4, 1]]);
    let pairs = [
        (
            job(vec![("fc1.matmul", rows.clone())], &context("semi_auto_parallel", 4)),
            job(vec![("fc1.matmul", cols.clone())], &context("semi_auto_parallel", 4)),
        ),
        (job(vec![], &sharded), job(vec![("fc1.matmul", cols)], &context("semi_auto_parallel", 4))),
        (job(vec![("fc1.matmul", rows)], &context("semi_auto_parallel", 4)), job(vec![], &context("data_parallel", 4))),
    ];
    for (k, (from, to)) in pairs.iter().enumerate() {
        LocalComm::run(4, |comm| -> Result<(), String> {
            let r = comm.rank();
            let mine = |j: &Job| -> ParamStore {
                let mut s = ParamStore::new();
                for slot in &j.program(r).unwrap().program.params {
                    s.insert(&slot.name, slice_tensor(full.require(&slot.name).unwrap(), &slot.slice).unwrap());
                }
                s
            };
            let moved = relayout_params(from, to, &comm, &mine(from)).map_err(|e| e.to_string())?;
            let want = mine(to);
            assert_eq!(moved.len(), want.len(), "pair {k}, rank {r}");
            for (name, t) in want.iter() {
                assert!(moved.require(name).unwrap().bit_eq(t), "pair {k}, rank {r}: {name}");
            }
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn an_evaluation_after_training_that_fails_says_training_finished_and_where_its_checkpoint_is() {
    let train = clusters(&[16], 4, 64);
    // Held-out samples of another shape than the network's input: the evaluation fails.
    let held = source(clusters(&[12], 4, 16));
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(context("data_parallel", 2), 2);
    c.checkpoint = Some(CheckpointConfig { dir: dir.path().to_path_buf(), prefix: "net".into(), every_steps: 2, keep_max: 0 });
    let e = Trainer::new("mlp", builder("mlp", small_mlp(), vec![]), source(train), c).with_eval(held).fit(vec![]).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("training finished at step 2"), "{text}");
    assert!(text.contains(&format!("in {} (", dir.path().display())), "{text}");
    assert!(text.contains("batch shape"), "{text}");
    assert!(text.contains("can be evaluated once the cause is fixed"), "{text}");
}
