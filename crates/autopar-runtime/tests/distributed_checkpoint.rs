//! load_distributed_checkpoint: per-rank checkpoints saved under one strategy and device count
//! start a job with another, resharded at load; training then continues exactly.

use std::collections::BTreeMap;
use std::path::Path;

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::strategy_files::save_strategy_file;
use autopar_parallel::{assign_random_strategies, ParallelContext};
use autopar_runtime::checkpoint_io::{load_distributed_checkpoint, save_checkpoint};
use autopar_runtime::ParamSource;
use autopar_runtime::{assemble_params, Job, RankTrainer};
use autopar_runtime::{LrSchedule, ParamStore, Sgd};
use autopar_tensor::Tensor;
use serde_json::json;

fn mlp(batch: usize) -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(5);
    let x = b.input("x", &[batch, 8], DType::F32).unwrap();
    let y = b.input("y", &[batch], DType::I64).unwrap();
    let w1 = b.parameter("fc1.weight", &[16, 8], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[16], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let h = b.matmul_t("fc1.mm", x, w1, false, true).unwrap();
    let h = b.add("fc1.add", h, b1).unwrap();
    let h = b.relu("act", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[16, 4], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc2.mm", h, w2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batch(seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = autopar_data::Rng::new(seed | 1);
    let mut next = move || rng.next_u64();
    let x: Vec<f32> = (0..16 * 8).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
    let y: Vec<i64> = (0..16).map(|_| (next() % 4) as i64).collect();
    vec![("x".into(), Tensor::from_vec(&[16, 8], x).unwrap()), ("y".into(), Tensor::from_vec(&[16], y).unwrap())]
}

fn job(n: usize, seed: u64) -> Job {
    let (mut g, loss) = mlp(16);
    assign_random_strategies(&mut g, n, seed);
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!("semi_auto_parallel")).unwrap();
    Job::new(&g, loss, &ctx).unwrap()
}

/// Train `job` one step from `full`, save per-rank checkpoints and the strategy under `dir`;
/// returns the full parameters after the step.
fn train_and_save(job: &Job, dir: &Path) -> ParamStore {
    let full = ParamStore::init(job.graph()).unwrap();
    let stores = LocalComm::run(job.device_num(), |comm| -> autopar_runtime::Result<ParamStore> {
        let mut t = RankTrainer::new(job, &comm, ParamSource::Full(&full))?;
        let mut opt = Sgd::new(LrSchedule::Constant(0.5))?;
        t.step(&mut opt, &batch(1))?;
        let r = comm.rank();
        let meta = BTreeMap::from([("rank".to_string(), r.to_string())]);
        save_checkpoint(t.params(), &dir.join(format!("rank_{r}/net_{r}.safetensors")), &meta)?;
        Ok(t.params().clone())
    })
    .unwrap();
    save_strategy_file(job.network(), &dir.join("strategy.json"), true, &|_| Vec::new()).unwrap();
    assemble_params(job, &stores).unwrap()
}

#[test]
fn checkpoints_saved_under_one_strategy_load_under_another() {
    let root = tempfile::tempdir().unwrap();
    for (src_n, dst_n, seed) in [(4usize, 2usize, 1u64), (2, 8, 2), (8, 4, 3), (4, 1, 4)] {
        let dir = root.path().join(format!("{src_n}_{dst_n}_{seed}"));
        let src = job(src_n, seed);
        let want = train_and_save(&src, &dir);
        let dst = job(dst_n, seed + 100);
        let per_rank: Vec<ParamStore> =
            (0..dst_n).map(|r| load_distributed_checkpoint(&dst, r, &dir, Some(&dir.join("strategy.json"))).unwrap()).collect();
        let got = assemble_params(&dst, &per_rank).unwrap();
        for (name, w) in want.iter() {
            let g = got.require(name).unwrap();
            assert!(g.bit_eq(w), "{src_n} -> {dst_n} devices: {name} differs after resharding");
        }
        // Training continues from the loaded slices.
        LocalComm::run(dst_n, |comm| -> autopar_runtime::Result<()> {
            let local = per_rank[comm.rank()].clone();
            let mut t = RankTrainer::new(&dst, &comm, ParamSource::Local(local))?;
            let mut opt = Sgd::new(LrSchedule::Constant(0.5))?;
            assert!(t.step(&mut opt, &batch(2))?.is_finite());
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn a_missing_rank_file_is_an_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let src = job(4, 9);
    train_and_save(&src, root.path());
    std::fs::remove_dir_all(root.path().join("rank_2")).unwrap();
    let dst = job(1, 0);
    let e = load_distributed_checkpoint(&dst, 0, root.path(), Some(&root.path().join("strategy.json"))).unwrap_err().to_string();
    assert!(e.contains("rank 2") || e.contains("rank_2"), "{e}");
}
