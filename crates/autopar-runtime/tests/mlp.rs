//! A 3-layer MLP with fixed weights trained by SGD for 3 steps through the graph, the autodiff and
//! the executor, against an independent reference written with plain loops in f64.

use autopar_graph::{DType, GraphBuilder, Initializer};
use autopar_parallel::ParallelContext;
use autopar_runtime::{Job, LrSchedule, Optimizer, ParamSource, ParamStore, RankTrainer, Sgd};
use autopar_tensor::Tensor;

const N: usize = 4;
const DIMS: [usize; 4] = [5, 6, 7, 3];
const LR: f64 = 0.5;

type Mat = Vec<Vec<f64>>;

/// Weight `[out, in]` and bias `[out]` of layer `l`, from a fixed formula.
fn initial(l: usize) -> (Mat, Vec<f64>) {
    let (i, o) = (DIMS[l], DIMS[l + 1]);
    let w = (0..o).map(|r| (0..i).map(|c| 0.3 * ((r * 7 + c * 3 + l * 11) as f64).sin()).collect()).collect();
    let b = (0..o).map(|r| 0.05 * ((r + l) as f64).cos()).collect();
    (w, b)
}

fn input() -> (Mat, Vec<usize>) {
    let x = (0..N).map(|n| (0..DIMS[0]).map(|c| ((n * 5 + c) as f64 * 0.7).cos()).collect()).collect();
    (x, vec![0, 2, 1, 2])
}

/// One reference SGD step; returns the loss before the update.
fn reference_step(layers: &mut [(Mat, Vec<f64>)], x: &Mat, labels: &[usize]) -> f64 {
    // Forward, keeping pre-activations.
    let mut acts = vec![x.clone()];
    let mut pres = Vec::new();
    for (l, (w, b)) in layers.iter().enumerate() {
        let a = acts.last().unwrap();
        let pre: Mat = a
            .iter()
            .map(|row| w.iter().zip(b).map(|(wr, bb)| wr.iter().zip(row).map(|(p, q)| p * q).sum::<f64>() + bb).collect())
            .collect();
        let act = if l + 1 < layers.len() { pre.iter().map(|r| r.iter().map(|v| v.max(0.0)).collect()).collect() } else { pre.clone() };
        pres.push(pre);
        acts.push(act);
    }
    let logits = acts.last().unwrap();
    let mut loss = 0.0;
    let mut dz: Mat = Vec::new();
    for (row, &y) in logits.iter().zip(labels) {
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        let p: Vec<f64> = row.iter().map(|v| (v - m).exp() / s).collect();
        loss -= p[y].ln();
        dz.push(p.iter().enumerate().map(|(c, &pc)| (pc - if c == y { 1.0 } else { 0.0 }) / N as f64).collect());
    }
    loss /= N as f64;
    // Backward and update, last layer first.
    let mut delta = dz;
    for l in (0..layers.len()).rev() {
        let a = &acts[l];
        let w = &layers[l].0;
        let (o, i) = (w.len(), w[0].len());
        let dw: Mat = (0..o).map(|r| (0..i).map(|c| (0..N).map(|n| delta[n][r] * a[n][c]).sum()).collect()).collect();
        let db: Vec<f64> = (0..o).map(|r| (0..N).map(|n| delta[n][r]).sum()).collect();
        let da: Mat = (0..N).map(|n| (0..i).map(|c| (0..o).map(|r| delta[n][r] * w[r][c]).sum()).collect()).collect();
        if l > 0 {
            delta = da
                .iter()
                .zip(&pres[l - 1])
                .map(|(dr, pr)| dr.iter().zip(pr).map(|(d, p)| if *p > 0.0 { *d } else { 0.0 }).collect())
                .collect();
        }
        let (w, b) = &mut layers[l];
        for r in 0..o {
            for c in 0..i {
                w[r][c] -= LR * dw[r][c];
            }
            b[r] -= LR * db[r];
        }
    }
    loss
}

fn flat(m: &Mat) -> Vec<f64> {
    m.iter().flatten().cloned().collect()
}

#[test]
fn three_layer_mlp_with_sgd_matches_a_hand_computed_reference_for_three_steps() {
    let mut b = GraphBuilder::new(0);
    let x = b.input("x", &[N, DIMS[0]], DType::F32).unwrap();
    let y = b.input("y", &[N], DType::I32).unwrap();
    let h1 = b.dense("fc1", x, DIMS[1], Initializer::Zeros).unwrap();
    let h1 = b.relu("relu1", h1).unwrap();
    let h2 = b.dense("fc2", h1, DIMS[2], Initializer::Zeros).unwrap();
    let h2 = b.relu("relu2", h2).unwrap();
    let z = b.dense("fc3", h2, DIMS[3], Initializer::Zeros).unwrap();
    let loss = b.softmax_cross_entropy("loss", z, y).unwrap();
    let graph = b.finish();

    let mut layers: Vec<(Mat, Vec<f64>)> = (0..3).map(initial).collect();
    let mut params = ParamStore::init(&graph).unwrap();
    for (l, (w, bias)) in layers.iter().enumerate() {
        let (i, o) = (DIMS[l], DIMS[l + 1]);
        params.insert(&format!("fc{}.weight", l + 1), Tensor::from_vec(&[o, i], flat(w)).unwrap().cast(autopar_tensor::DType::F32));
        params.insert(&format!("fc{}.bias", l + 1), Tensor::from_vec(&[o], bias.clone()).unwrap().cast(autopar_tensor::DType::F32));
    }
    let (xv, labels) = input();
    let feeds = vec![
        (graph.node(x).name.clone(), Tensor::from_vec(&[N, DIMS[0]], flat(&xv)).unwrap().cast(autopar_tensor::DType::F32)),
        (graph.node(y).name.clone(), Tensor::from_vec(&[N], labels.iter().map(|&l| l as i32).collect::<Vec<i32>>()).unwrap()),
    ];

    let job = Job::new(&graph, loss, &ParallelContext::default()).unwrap();
    let mut step = RankTrainer::alone(&job, ParamSource::Local(params)).unwrap();
    let mut sgd = Sgd::new(LrSchedule::Constant(LR)).unwrap();
    let mut losses = Vec::new();
    for _ in 0..3 {
        let got = step.step(&mut sgd, &feeds).unwrap();
        let want = reference_step(&mut layers, &xv, &labels);
        assert!((got - want).abs() < 1e-5, "loss {got} vs reference {want}");
        losses.push(got);
    }
    assert_eq!(sgd.steps(), 3);
    assert!(losses[2] < losses[0], "training lowers the loss: {losses:?}");
    let params = step.params();
    for (l, (w, bias)) in layers.iter().enumerate() {
        let gw = params.get(&format!("fc{}.weight", l + 1)).unwrap().to_f64_vec();
        let gb = params.get(&format!("fc{}.bias", l + 1)).unwrap().to_f64_vec();
        for (a, e) in gw.iter().zip(flat(w)).chain(gb.iter().zip(bias.clone())) {
            assert!((a - e).abs() < 1e-5, "layer {}: parameter {a} vs reference {e}", l + 1);
        }
    }
}

#[test]
fn serial_and_parallel_execution_give_bit_identical_gradients() {
    use autopar_graph::Rng;
    let mut b = GraphBuilder::new(9);
    let x = b.input("x", &[64, 784], DType::F32).unwrap();
    let y = b.input("y", &[64], DType::I32).unwrap();
    let h = b.dense("fc1", x, 256, Initializer::HeUniform).unwrap();
    let h = b.gelu("gelu", h).unwrap();
    let z = b.dense("fc2", h, 10, Initializer::HeUniform).unwrap();
    let loss = b.softmax_cross_entropy("loss", z, y).unwrap();
    let graph = b.finish();
    let params = ParamStore::init(&graph).unwrap();
    let mut rng = Rng::new(1);
    let feeds = vec![
        (
            graph.node(x).name.clone(),
            Tensor::from_vec(&[64, 784], (0..64 * 784).map(|_| rng.normal() as f32).collect::<Vec<f32>>()).unwrap(),
        ),
        (graph.node(y).name.clone(), Tensor::from_vec(&[64], (0..64i32).map(|i| i % 10).collect::<Vec<i32>>()).unwrap()),
    ];
    let job = Job::new(&graph, loss, &ParallelContext::default()).unwrap();
    let run = |ctx: autopar_tensor::ExecCtx| {
        let mut step = RankTrainer::alone(&job, ParamSource::Full(&params)).unwrap().with_exec_ctx(ctx);
        step.gradients(&feeds).unwrap().grads
    };
    let serial = run(autopar_tensor::ExecCtx::serial());
    let parallel = run(autopar_tensor::ExecCtx::parallel().with_min_parallel_len(0));
    assert_eq!(serial.len(), 4);
    for ((n, a), (_, b)) in serial.iter().zip(&parallel) {
        assert!(a.bit_eq(b), "gradient of {n} differs between serial and parallel execution");
    }
}
