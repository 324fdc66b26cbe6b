//! hybrid_parallel: a hand-written Megatron-style MLP (column-parallel first layer, row-parallel
//! second layer, one all-reduce written by the user, layerwise-parallel weights) equals the
//! stand-alone MLP it slices; a batch split by hand with a synchronised BatchNorm equals the
//! whole batch on one device.
#![allow(clippy::single_range_in_vec_init)] // one-dimensional slices are written as [start..end]

use std::collections::BTreeSet;

use autopar_comm::{Communicator, LocalComm};
use autopar_graph::{DType, Graph, GraphBuilder, Initializer, NodeId, ParamSpec, ReduceOp};
use autopar_parallel::ParallelContext;
use autopar_runtime::ParamSource;
use autopar_runtime::{rank_batches, slice_tensor, Job, RankTrainer};
use autopar_runtime::{LrSchedule, Momentum, ParamStore};
use autopar_tensor::Tensor;
use serde_json::json;

const B: usize = 8;
const IN: usize = 6;
const H: usize = 16;
const OUT: usize = 4;

/// The model; with `rank: Some((r, n))` the rank-`r` slice of `n` with the all-reduce.
fn model(rank: Option<(usize, usize)>) -> (Graph, NodeId) {
    let h = rank.map_or(H, |(_, n)| H / n);
    let mut b = GraphBuilder::new(3);
    let x = b.input("x", &[B, IN], DType::F32).unwrap();
    let y = b.input("y", &[B], DType::I64).unwrap();
    let w1 = b.parameter("w1", &[IN, h], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b1 = b.parameter("b1", &[h], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let w2 = b.parameter("w2", &[h, OUT], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let b2 = b.parameter("b2", &[OUT], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let a = b.matmul("mm1", x, w1).unwrap();
    let a = b.add("add1", a, b1).unwrap();
    let a = b.relu("act", a).unwrap();
    let mut o = b.matmul("mm2", a, w2).unwrap();
    if let Some((_, n)) = rank {
        o = b.all_reduce("mm2.sum", o, ReduceOp::Sum, &(0..n).collect::<Vec<_>>()).unwrap();
    }
    let o = b.add("add2", o, b2).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[o, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

fn batch(step: u64) -> Vec<(String, Tensor)> {
    let mut rng = autopar_data::Rng::new(step * 977 + 1);
    let mut next = move || rng.next_u64();
    let x: Vec<f32> = (0..B * IN).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
    let y: Vec<i64> = (0..B).map(|_| (next() % OUT as u64) as i64).collect();
    vec![("x".into(), Tensor::from_vec(&[B, IN], x).unwrap()), ("y".into(), Tensor::from_vec(&[B], y).unwrap())]
}

/// Three steps of the stand-alone reference: the initial parameters, the losses and the final
/// parameters.
fn stand_alone(serial: &Graph, loss: NodeId) -> (ParamStore, Vec<f64>, ParamStore) {
    let init = ParamStore::init(serial).unwrap();
    let job = Job::new(serial, loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Full(&init)).unwrap();
    let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9).unwrap();
    let mut losses = Vec::new();
    for s in 0..3 {
        losses.push(step.step(&mut opt, &batch(s)).unwrap());
    }
    let want = step.params().clone();
    (init, losses, want)
}

fn cols(r: usize, n: usize, rows: usize) -> Vec<std::ops::Range<usize>> {
    vec![0..rows, r * H / n..(r + 1) * H / n]
}

#[test]
fn megatron_mlp_in_hybrid_parallel_equals_stand_alone() {
    let (serial, sloss) = model(None);
    let (init, want_losses, want) = stand_alone(&serial, sloss);
    for n in [2usize, 4] {
        let graphs: Vec<Graph> = (0..n).map(|r| model(Some((r, n))).0).collect();
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(n)).unwrap();
        ctx.set("parallel_mode", &json!("hybrid_parallel")).unwrap();
        ctx.set("gradients_mean", &json!(true)).unwrap();
        let layerwise: BTreeSet<String> = ["w1", "b1", "w2"].iter().map(|s| s.to_string()).collect();
        let job = Job::hybrid(graphs, "loss", &ctx, layerwise).unwrap();
        let results = LocalComm::run(n, |comm| -> autopar_runtime::Result<(Vec<f64>, ParamStore)> {
            let r = comm.rank();
            let mut local = ParamStore::new();
            local.insert("w1", slice_tensor(init.require("w1")?, &cols(r, n, IN))?);
            local.insert("b1", slice_tensor(init.require("b1")?, &[r * H / n..(r + 1) * H / n])?);
            local.insert("w2", slice_tensor(init.require("w2")?, &[r * H / n..(r + 1) * H / n, 0..OUT])?);
            local.insert("b2", init.require("b2")?.clone());
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Local(local))?;
            let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9)?;
            let mut losses = Vec::new();
            for s in 0..3 {
                losses.push(t.step(&mut opt, &batch(s))?);
            }
            Ok((losses, t.params().clone()))
        })
        .unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 + 1e-5 * b.abs();
        for (r, (losses, params)) in results.iter().enumerate() {
            for (a, b) in losses.iter().zip(&want_losses) {
                assert!(close(*a, *b), "{n} ranks, rank {r}: loss {a} vs stand-alone {b}");
            }
            for (name, ranges) in [
                ("w1", cols(r, n, IN)),
                ("b1", vec![r * H / n..(r + 1) * H / n]),
                ("w2", vec![r * H / n..(r + 1) * H / n, 0..OUT]),
                ("b2", vec![0..OUT]),
            ] {
                let expect = slice_tensor(want.require(name).unwrap(), &ranges).unwrap();
                for (i, (a, b)) in params.require(name).unwrap().to_f64_vec().iter().zip(expect.to_f64_vec()).enumerate() {
                    assert!(close(*a, b), "{n} ranks, rank {r}: {name}[{i}] {a} vs stand-alone {b}");
                }
            }
        }
    }
}

#[test]
fn hybrid_errors_name_the_problem() {
    let graphs: Vec<Graph> = (0..2).map(|r| model(Some((r, 2))).0).collect();
    let mut ctx = ParallelContext::default();
    ctx.set("device_num", &json!(2)).unwrap();
    ctx.set("parallel_mode", &json!("hybrid_parallel")).unwrap();
    let e = Job::hybrid(graphs.clone(), "loss", &ctx, ["w9".to_string()].into()).unwrap_err().to_string();
    assert!(e.contains("w9"), "{e}");
    let e = Job::hybrid(graphs[..1].to_vec(), "loss", &ctx, BTreeSet::new()).unwrap_err().to_string();
    assert!(e.contains("1 rank graphs for device_num 2"), "{e}");
    // Recomputation: each rank would replay its own collectives; refused up front.
    let mut marked = graphs.clone();
    let op = marked[1].nodes().iter().position(|n| !n.inputs.is_empty() && !n.op.is_communication()).unwrap();
    marked[1].recompute(NodeId(op)).unwrap();
    let e = Job::hybrid(marked, "loss", &ctx, BTreeSet::new()).unwrap_err().to_string();
    assert!(e.contains("rank 1") && e.contains("recomputation"), "{e}");
    let (g, loss) = model(Some((0, 2)));
    let e = Job::new(&g, loss, &ctx).unwrap_err().to_string();
    assert!(e.contains("one hand-written graph per rank"), "{e}");

    // Replicated parameters: rank 1's extra one, or one whose dtype or trainability differs.
    let variant = |name: &str, rank1: ParamSpec| {
        let graphs: Vec<Graph> = (0..2)
            .map(|r| {
                let mut b = GraphBuilder::from_graph(model(Some((r, 2))).0, 3);
                if r == 1 {
                    b.parameter_with(name, rank1.clone()).unwrap();
                } else if name != "only1" {
                    b.parameter_with(name, ParamSpec::new(&[2], Initializer::Zeros)).unwrap();
                }
                b.finish()
            })
            .collect();
        Job::hybrid(graphs, "loss", &ctx, BTreeSet::new()).map(|_| ()).unwrap_err().to_string()
    };
    let e = variant("only1", ParamSpec::new(&[2], Initializer::Zeros));
    assert!(e.contains("\"only1\" of rank 1 is missing from rank 0's graph"), "{e}");
    let e = variant("p", ParamSpec::new(&[2], Initializer::Zeros).dtype(DType::F16));
    assert!(e.contains("\"p\" has dtype f16 on rank 1 but f32 on rank 0"), "{e}");
    let e = variant("p", ParamSpec::new(&[2], Initializer::Zeros).frozen());
    assert!(e.contains("\"p\" has trainable false on rank 1 but true on rank 0"), "{e}");

    // Point-to-point transfers and collectives the ranks do not agree on.
    let transfer = |send: Transfer, recv: Option<&[usize]>| {
        let graphs = vec![p2p_rank0(send), p2p_rank1(recv)];
        Job::hybrid(graphs, "loss", &ctx, BTreeSet::from(["w".to_string()])).map(|_| ()).map_err(|e| e.to_string())
    };
    let e = transfer(Transfer::Input, None).unwrap_err();
    assert!(e.contains("\"to1\" on rank 0 (rank 0 -> rank 1, tag 7): no Receive"), "{e}");
    let e = transfer(Transfer::Input, Some(&[B, IN + 1])).unwrap_err();
    assert!(e.contains("\"to1\" on rank 0 (rank 0 -> rank 1, tag 7): the Send sends"), "{e}");
    let e = transfer(Transfer::Weight, Some(&[IN, OUT])).unwrap_err();
    assert!(e.contains("\"to1\" on rank 0") && e.contains("gradients do not cross"), "{e}");
    let e = transfer(Transfer::ToItself, None).unwrap_err();
    assert!(e.contains("cannot send to itself"), "{e}");
    let e = transfer(Transfer::OffThePath, Some(&[B, IN])).unwrap_err();
    assert!(e.contains("Send \"to1\" on rank 0 does not lead to the loss"), "{e}");
    let e = transfer(Transfer::AllReduce, None).unwrap_err();
    assert!(e.contains("group [0, 1] call different collectives") && e.contains("rank 1 calls []"), "{e}");
    transfer(Transfer::Input, Some(&[B, IN])).unwrap();
    // The accepted pair runs, forward and backward, on both ranks.
    let job =
        Job::hybrid(vec![p2p_rank0(Transfer::Input), p2p_rank1(Some(&[B, IN]))], "loss", &ctx, BTreeSet::from(["w".to_string()])).unwrap();
    let full = ParamStore::init(job.graph()).unwrap();
    let got = LocalComm::run(2, |comm| -> autopar_runtime::Result<Vec<f64>> {
        let mut t = RankTrainer::new(&job, &comm, ParamSource::Full(&full))?;
        let mut data = batch(comm.rank() as u64);
        data.push(("template".to_string(), Tensor::from_vec(&[B, IN], vec![0f32; B * IN]).unwrap()));
        Ok(vec![t.gradients(&data)?.loss])
    })
    .unwrap();
    assert!(got.iter().flatten().all(|l| l.is_finite()), "{got:?}");
}

#[derive(Clone, Copy)]
enum Transfer {
    /// Rank 0 sends its input x to rank 1 and trains on what it sent.
    Input,
    /// Rank 0 sends its weight (whose gradient would have to come back).
    Weight,
    ToItself,
    /// The Send's output is not used.
    OffThePath,
    /// No transfer, an all-reduce over both ranks on rank 0 only.
    AllReduce,
}

/// x [B, IN] -> dense (w [IN, OUT]) -> loss, with rank 0's side of a transfer.
fn p2p_rank0(how: Transfer) -> Graph {
    use autopar_graph::ops::{Send, SoftmaxCrossEntropy};
    let mut b = GraphBuilder::new(3);
    let mut x = b.input("x", &[B, IN], DType::F32).unwrap();
    let y = b.input("y", &[B], DType::I64).unwrap();
    let mut w = b.parameter("w", &[IN, OUT], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    match how {
        Transfer::Input => x = b.op("to1", Send { peer: 1, tag: 7 }, &[x]).unwrap(),
        Transfer::Weight => w = b.op("to1", Send { peer: 1, tag: 7 }, &[w]).unwrap(),
        Transfer::ToItself => x = b.op("to1", Send { peer: 0, tag: 7 }, &[x]).unwrap(),
        Transfer::OffThePath => {
            b.op("to1", Send { peer: 1, tag: 7 }, &[x]).unwrap();
        }
        Transfer::AllReduce => x = b.all_reduce("sum", x, ReduceOp::Sum, &[0, 1]).unwrap(),
    }
    let h = b.matmul("mm", x, w).unwrap();
    let loss = b.op("loss", SoftmaxCrossEntropy, &[h, y]).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

/// Rank 1: the same network; with `recv: Some(shape)` it receives a tensor of that shape from
/// rank 0 and adds none of it (0 x its mean) to the loss.
fn p2p_rank1(recv: Option<&[usize]>) -> Graph {
    use autopar_graph::ops::{Recv, Scale, SoftmaxCrossEntropy};
    let mut b = GraphBuilder::new(3);
    let x = b.input("x", &[B, IN], DType::F32).unwrap();
    let y = b.input("y", &[B], DType::I64).unwrap();
    let w = b.parameter("w", &[IN, OUT], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let h = b.matmul("mm", x, w).unwrap();
    let Some(shape) = recv else {
        let loss = b.op("loss", SoftmaxCrossEntropy, &[h, y]).unwrap();
        b.output(loss).unwrap();
        return b.finish();
    };
    let ce = b.op("ce", SoftmaxCrossEntropy, &[h, y]).unwrap();
    let template = b.input("template", shape, DType::F32).unwrap();
    let got = b.op("from0", Recv { peer: 0, tag: 7 }, &[template]).unwrap();
    let mean = b.reduce_mean("got.mean", got, &[], false).unwrap();
    let none = b.op("got.none", Scale { factor: 0.0 }, &[mean]).unwrap();
    let loss = b.add("loss", ce, none).unwrap();
    b.output(loss).unwrap();
    b.finish()
}

/// x -> BatchNorm -> dense -> loss; with `rank: Some((r, n))` rank `r`'s rows of the batch and a
/// BatchNorm synchronised over all `n` ranks.
fn bn_model(rank: Option<(usize, usize)>) -> (Graph, NodeId) {
    let rows = rank.map_or(B, |(_, n)| B / n);
    let mut b = GraphBuilder::new(5);
    let x = b.input("x", &[rows, IN], DType::F32).unwrap();
    let y = b.input("y", &[rows], DType::I64).unwrap();
    let gamma = b.parameter("bn.gamma", &[IN], Initializer::Uniform { low: 0.5, high: 1.5 }).unwrap();
    let beta = b.parameter("bn.beta", &[IN], Initializer::Uniform { low: -0.1, high: 0.1 }).unwrap();
    let mean = b.parameter_with("bn.moving_mean", ParamSpec::new(&[IN], Initializer::Zeros).frozen()).unwrap();
    let var = b.parameter_with("bn.moving_variance", ParamSpec::new(&[IN], Initializer::Ones).frozen()).unwrap();
    let inputs = [x, gamma, beta, mean, var];
    let h = match rank {
        None => b.batch_norm("bn", inputs, true, 1e-5, 0.9).unwrap(),
        Some((_, n)) => b.batch_norm_synced("bn", inputs, 1e-5, 0.9, &(0..n).collect::<Vec<_>>()).unwrap(),
    };
    let w = b.parameter("w", &[IN, OUT], Initializer::XavierUniform { gain: 1.0 }).unwrap();
    let o = b.matmul("mm", h, w).unwrap();
    let loss = b.op("loss", autopar_graph::ops::SoftmaxCrossEntropy, &[o, y]).unwrap();
    b.output(loss).unwrap();
    (b.finish(), loss)
}

#[test]
fn a_hand_split_batch_with_synchronised_batch_norm_equals_the_whole_batch() {
    let (serial, sloss) = bn_model(None);
    let (init, want_losses, want) = stand_alone(&serial, sloss);
    for n in [2usize, 4] {
        let graphs: Vec<Graph> = (0..n).map(|r| bn_model(Some((r, n))).0).collect();
        let mut ctx = ParallelContext::default();
        ctx.set("device_num", &json!(n)).unwrap();
        ctx.set("parallel_mode", &json!("hybrid_parallel")).unwrap();
        ctx.set("gradients_mean", &json!(true)).unwrap();
        let job = Job::hybrid(graphs, "loss", &ctx, BTreeSet::new()).unwrap();
        let results = LocalComm::run(n, |comm| -> autopar_runtime::Result<(Vec<f64>, ParamStore)> {
            let r = comm.rank();
            let mut t = RankTrainer::new(&job, &comm, ParamSource::Local(init.clone()))?;
            let mut opt = Momentum::new(LrSchedule::Constant(0.1), 0.9)?;
            let mut losses = Vec::new();
            for s in 0..3 {
                let mine = &rank_batches(&[batch(s)], n)?[r];
                losses.push(t.step(&mut opt, mine)?);
            }
            Ok((losses, t.params().clone()))
        })
        .unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 + 1e-5 * b.abs();
        let mean_losses: Vec<f64> = (0..3).map(|s| results.iter().map(|(l, _)| l[s]).sum::<f64>() / n as f64).collect();
        for (a, b) in mean_losses.iter().zip(&want_losses) {
            assert!(close(*a, *b), "{n} ranks: mean loss {a} vs stand-alone {b}");
        }
        for (r, (_, params)) in results.iter().enumerate() {
            for (name, w) in want.iter() {
                for (i, (a, b)) in params.require(name).unwrap().to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                    assert!(close(*a, b), "{n} ranks, rank {r}: {name}[{i}] {a} vs stand-alone {b}");
                }
            }
        }
    }
}
