//! Each rank's parameter pieces made from the initialisers, as the runs make them, equal bit for
//! bit the same pieces of the full tensors, over random strategies, device counts, data parallel
//! and the parallel optimizer: whether the ranks holding a piece alike make it together (each a
//! part, all-gathered) or the simulated ranks of one process share it (made once).

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId};
use autopar_parallel::{assign_random_strategies, ParallelContext};
use autopar_runtime::{slice_tensor, Job, ParamSource, ParamStore, RankTrainer, SharedInit};
use serde_json::json;

fn network() -> (Graph, NodeId) {
    let mut b = GraphBuilder::new(9);
    let x = b.input("x", &[16, 8], DType::F32).unwrap();
    let y = b.input("y", &[16], DType::I64).unwrap();
    // Odd element counts, so that parts of a piece split unevenly among its holders.
    let w1 = b.parameter("fc1.weight", &[24, 8], Initializer::Normal { mean: 0.0, std: 0.5 }).unwrap();
    let b1 = b.parameter("fc1.bias", &[24], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let h = b.matmul_t("fc1.mm", x, w1, false, true).unwrap();
    let h = b.add("fc1.add", h, b1).unwrap();
    let h = b.relu("act", h).unwrap();
    let w2 = b.parameter("fc2.weight", &[24, 4], Initializer::XavierNormal { gain: 1.0 }).unwrap();
    let logits = b.matmul("fc2.mm", h, w2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn job(mode: &str, n: usize, seed: u64, shard: bool) -> Job {
    let (mut g, loss) = network();
    if mode == "semi_auto_parallel" {
        assign_random_strategies(&mut g, n, seed);
    }
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(n)).unwrap();
    ctx.set("parallel_mode", &json!(mode)).unwrap();
    if shard {
        ctx.set("enable_parallel_optimizer", &json!(true)).unwrap();
        ctx.set("parallel_optimizer_config", &json!({"parallel_optimizer_threshold": 0})).unwrap();
    }
    Job::new(&g, loss, &ctx).unwrap()
}

/// Every rank's pieces from `source` (made per rank), checked against the full tensors; returns
/// the elements the ranks hold in all.
fn check(job: &Job, source: impl Fn() -> ParamSource<'static> + Sync, what: &str) -> usize {
    let full = ParamStore::init(job.graph()).unwrap();
    let held = LocalComm::run(job.device_num(), |comm| -> autopar_runtime::Result<usize> {
        let t = RankTrainer::new(job, &comm, source())?;
        let program = job.plan().program(comm.rank())?;
        let mut elements = 0;
        for slot in &program.program.params {
            let got = t.params().require(&slot.name)?;
            let want = slice_tensor(full.require(&slot.name)?, &slot.slice)?;
            assert!(got.bit_eq(&want), "{what}: rank {} piece {:?} of {}", comm.rank(), slot.slice, slot.name);
            elements += got.numel();
        }
        Ok(elements)
    })
    .unwrap();
    held.iter().sum()
}

#[test]
fn pieces_made_together_equal_the_full_tensors_pieces() {
    for n in [2, 4, 8] {
        for seed in 0..6 {
            let j = job("semi_auto_parallel", n, seed, seed % 2 == 1);
            check(&j, || ParamSource::Init, &format!("semi_auto on {n}, seed {seed}"));
        }
        check(&job("data_parallel", n, 0, false), || ParamSource::Init, &format!("data_parallel on {n}"));
        check(&job("data_parallel", n, 0, true), || ParamSource::Init, &format!("data_parallel, sharded, on {n}"));
    }
}

#[test]
fn simulated_ranks_make_each_distinct_piece_once() {
    let model: usize = 24 * 8 + 24 + 24 * 4;
    for (mode, n, seed) in [("data_parallel", 4, 0), ("semi_auto_parallel", 4, 1), ("semi_auto_parallel", 8, 2)] {
        let j = job(mode, n, seed, false);
        let shared: &'static SharedInit = Box::leak(Box::new(SharedInit::new(n)));
        let held = check(&j, || ParamSource::InitShared(shared), &format!("{mode} on {n}, shared"));
        // Each distinct piece once: the model's elements, however many replicas the ranks hold.
        assert_eq!(shared.elements_made(), model, "{mode} on {n}");
        if mode == "data_parallel" {
            assert_eq!(held, n * model);
        }
    }
}
