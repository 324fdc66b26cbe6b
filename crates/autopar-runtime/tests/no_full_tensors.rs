//! No process builds a full tensor of a split parameter in a run: not when each rank makes its
//! pieces from the initialisers, not when it reads them from a checkpoint (`init` from a file of
//! whole tensors or from a folder of rank files, a resume under another strategy and device
//! count, `load_distributed_checkpoint`), not while it trains, checkpoints and evaluates after
//! training, not in the report (which carries each rank's pieces), nor when a checkpoint folder
//! is evaluated. Every allocation of the process is watched: the largest one, from the start of
//! `fit` until it returns, stays below the bytes of the split weight's full tensor.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use autopar_layout::Strategy;
use autopar_models::ModelOptions;
use autopar_parallel::ParallelContext;
use autopar_runtime::trainer::CheckpointConfig;
use autopar_runtime::{ParamStore, TrainConfig, Trainer};
use common::{builder, clusters, context, source};

/// The system allocator, remembering the largest allocation since the last reset.
struct Watch;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Watch = Watch;

/// fc2's weight, [WIDTH, WIDTH] f32: the tensor no process may build whole.
const WIDTH: usize = 1024;
const FULL_BYTES: usize = WIDTH * WIDTH * 4;

fn model() -> ModelOptions {
    ModelOptions { input_shape: Some(vec![16]), width: Some(WIDTH), depth: Some(2), num_classes: Some(4), ..Default::default() }
}

/// A run of `steps` on `ctx` splitting fc2 by `fc2` (none: replicated), saving into `save`
/// at its last step and evaluating after it; returns the largest allocation of the run.
fn run(
    ctx: ParallelContext,
    fc2: Option<Strategy>,
    steps: u64,
    save: Option<&Path>,
    init: Option<PathBuf>,
    resume: Option<PathBuf>,
) -> usize {
    let strategies: Vec<(&'static str, Strategy)> = fc2.into_iter().map(|s| ("fc2.matmul", s)).collect();
    let cfg = TrainConfig {
        epochs: 1000,
        max_steps: Some(steps),
        batch_size: 16,
        prefetch: 0,
        parallel: ctx,
        checkpoint: save.map(|d| CheckpointConfig { dir: d.to_path_buf(), prefix: "net".into(), every_steps: steps, keep_max: 0 }),
        init,
        resume,
        ..Default::default()
    };
    let trainer = Trainer::new("mlp", builder("mlp", model(), strategies), source(clusters(&[16], 4, 96)), cfg)
        .with_eval(source(clusters(&[16], 4, 40)));
    LARGEST.store(0, Ordering::Relaxed);
    let report = trainer.fit(vec![]).unwrap();
    let largest = LARGEST.load(Ordering::Relaxed);
    assert_eq!(report.eval.expect("evaluated").samples, 40);
    largest
}

fn below_full(largest: usize, what: &str) {
    assert!(largest < FULL_BYTES, "{what}: an allocation of {largest} bytes, as large as fc2.weight whole ({FULL_BYTES})");
}

#[test]
fn no_process_builds_a_split_weight_whole_at_init_init_from_checkpoints_resume_or_load() {
    // The watch sees a full tensor when one is built (the check can fail).
    let graph = builder("mlp", model(), vec![])(16, true).unwrap().graph;
    LARGEST.store(0, Ordering::Relaxed);
    let full = ParamStore::init(&graph).unwrap();
    assert!(LARGEST.load(Ordering::Relaxed) >= FULL_BYTES);
    drop(full);

    let split4 = Strategy(vec![vec![1, 4], vec![1, 4]]);
    let split2 = Strategy(vec![vec![1, 2], vec![1, 2]]);
    let (a, b, c, whole) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    // Each of 4 ranks generates its pieces.
    below_full(run(context("semi_auto_parallel", 4), Some(split4.clone()), 2, Some(a.path()), None, None), "initialisers, 4 devices");
    // Resumed on 2 devices under another split: each rank reads its pieces, optimizer state too.
    below_full(
        run(context("semi_auto_parallel", 2), Some(split2.clone()), 4, Some(b.path()), None, Some(a.path().to_path_buf())),
        "resume from 4 ranks on 2 under another strategy",
    );
    // Started from the 4 ranks' folder (its strategy.json beside it).
    below_full(
        run(context("semi_auto_parallel", 2), Some(split2.clone()), 1, None, Some(a.path().to_path_buf()), None),
        "init from a rank folder",
    );

    // A file of whole tensors, written by a stand-alone run (which holds them whole, before the watch).
    run(ParallelContext::default(), None, 1, Some(whole.path()), None, None);
    let file = whole.path().join("net-1.safetensors");
    below_full(run(context("semi_auto_parallel", 4), Some(split4.clone()), 1, None, Some(file.clone()), None), "init from a whole file");
    below_full(
        run(context("semi_auto_parallel", 4), Some(split4), 2, Some(c.path()), None, Some(file)),
        "resume from a stand-alone checkpoint on 4 devices",
    );

    // The library's loader.
    let net = builder("mlp", model(), vec![("fc2.matmul", split2)])(16, true).unwrap();
    let job = autopar_runtime::Job::new(&net.graph, net.loss, &context("semi_auto_parallel", 2)).unwrap();
    LARGEST.store(0, Ordering::Relaxed);
    let piece =
        autopar_runtime::checkpoint_io::load_distributed_checkpoint(&job, 1, a.path(), Some(&a.path().join("strategy.json"))).unwrap();
    below_full(LARGEST.load(Ordering::Relaxed), "load_distributed_checkpoint");
    assert_eq!(piece.get("fc2.weight").unwrap().shape(), &[WIDTH, WIDTH / 2]);

    // Evaluation of the 4 ranks' folder on 2 devices under another split: pieces only.
    let cfg =
        TrainConfig { batch_size: 16, eval_batch_size: 16, prefetch: 0, parallel: context("semi_auto_parallel", 2), ..Default::default() };
    let held = source(clusters(&[16], 4, 40));
    let trainer =
        Trainer::new("mlp", builder("mlp", model(), vec![("fc2.matmul", Strategy(vec![vec![1, 2], vec![1, 2]]))]), held.clone(), cfg);
    LARGEST.store(0, Ordering::Relaxed);
    let eval = trainer.evaluate_checkpoint(a.path(), &held).unwrap();
    below_full(LARGEST.load(Ordering::Relaxed), "evaluate_checkpoint");
    assert_eq!(eval.samples, 40);
}
