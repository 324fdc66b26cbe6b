//! Every op kind's forward pass through the executor on small hand-computed cases.

// Cases read uniformly as `run(op, &[inputs...])`; cloning a tensor is a reference-count bump.
#![allow(clippy::cloned_ref_to_slice_refs)]

use std::collections::BTreeSet;

use autopar_graph::ops::*;
use autopar_graph::{ConvAttrs, DType, GraphBuilder, Initializer, NormGradOf, OpKind, PoolAttrs, ReduceOp};
use autopar_runtime::{graph_dtype, Executor, ParamStore};
use autopar_tensor::Tensor;

fn t(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

fn idx(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

fn seq(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    t(shape, &(1..=n).map(|i| i as f64).collect::<Vec<_>>())
}

/// Runs `op` on `inputs` (fed as graph inputs) and returns the output.
fn run(op: impl Into<OpKind>, inputs: &[Tensor], covered: &mut BTreeSet<String>) -> Tensor {
    let op = op.into();
    covered.insert(variant(&op));
    let mut b = GraphBuilder::new(0);
    let ids: Vec<_> =
        inputs.iter().enumerate().map(|(i, x)| b.input(&format!("in{i}"), x.shape(), graph_dtype(x.dtype())).unwrap()).collect();
    let y = b.op("op", op, &ids).unwrap();
    let exec = Executor::new(b.finish(), &[y]).unwrap();
    let feeds: Vec<_> = ids.into_iter().zip(inputs.iter().cloned()).collect();
    exec.run(&mut ParamStore::new(), &feeds, 0).unwrap().values.remove(0)
}

fn variant(op: &OpKind) -> String {
    format!("{op:?}").split(['(', ' ', '{']).next().unwrap().to_string()
}

fn check(got: &Tensor, shape: &[usize], want: &[f64]) {
    assert_eq!(got.shape(), shape);
    let g = got.to_f64_vec();
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "got {g:?}, want {want:?}");
    }
    assert_eq!(g.len(), want.len());
}

#[test]
fn every_op_forward_matches_hand_computed_values() {
    let c = &mut BTreeSet::new();
    let m22 = t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);

    // Sources.
    {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2], DType::F64).unwrap();
        let p = b.parameter_with("p", autopar_graph::ParamSpec::new(&[2], Initializer::Constant(0.5)).dtype(DType::F64)).unwrap();
        let f = b.fill("f", &[2], DType::F64, 3.0).unwrap();
        let s = b.add("s", x, p).unwrap();
        let y = b.add("y", s, f).unwrap();
        let g = b.finish();
        let mut params = ParamStore::init(&g).unwrap();
        let out = Executor::new(g, &[y]).unwrap().run(&mut params, &[(x, t(&[2], &[1.0, 2.0]))], 0).unwrap();
        check(&out.values[0], &[2], &[4.5, 5.5]);
        c.extend(["Input", "Parameter", "Fill"].map(String::from));
    }

    // Element-wise, with broadcasting.
    let col = t(&[2, 1], &[1.0, 2.0]);
    let row = t(&[3], &[10.0, 20.0, 40.0]);
    check(&run(Add, &[col.clone(), row.clone()], c), &[2, 3], &[11.0, 21.0, 41.0, 12.0, 22.0, 42.0]);
    check(&run(Sub, &[col.clone(), row.clone()], c), &[2, 3], &[-9.0, -19.0, -39.0, -8.0, -18.0, -38.0]);
    check(&run(Mul, &[col.clone(), row.clone()], c), &[2, 3], &[10.0, 20.0, 40.0, 20.0, 40.0, 80.0]);
    check(&run(Div, &[col, row], c), &[2, 3], &[0.1, 0.05, 0.025, 0.2, 0.1, 0.05]);
    check(&run(Neg, &[m22.clone()], c), &[2, 2], &[-1.0, -2.0, -3.0, -4.0]);
    check(&run(Scale { factor: 0.5 }, &[m22.clone()], c), &[2, 2], &[0.5, 1.0, 1.5, 2.0]);
    // Without loss scaling the run's scale is 1; an executor told a scale multiplies by it too.
    check(&run(LossScale { factor: 0.5 }, &[m22.clone()], c), &[2, 2], &[0.5, 1.0, 1.5, 2.0]);
    {
        let mut b = GraphBuilder::new(0);
        let x = b.input("x", &[2, 2], DType::F64).unwrap();
        let y = b.op("op", LossScale { factor: 0.5 }, &[x]).unwrap();
        let mut exec = Executor::new(b.finish(), &[y]).unwrap();
        exec.set_loss_scale(4.0);
        check(&exec.run(&mut ParamStore::new(), &[(x, m22.clone())], 0).unwrap().values[0], &[2, 2], &[2.0, 4.0, 6.0, 8.0]);
    }
    let e = std::f64::consts::E;
    check(&run(Exp, &[t(&[2], &[0.0, 1.0])], c), &[2], &[1.0, e]);
    check(&run(Log, &[t(&[2], &[1.0, e])], c), &[2], &[0.0, 1.0]);
    check(&run(Sqrt, &[t(&[2], &[4.0, 9.0])], c), &[2], &[2.0, 3.0]);

    // Activations.
    check(&run(Relu, &[t(&[3], &[-1.0, 0.0, 2.0])], c), &[3], &[0.0, 0.0, 2.0]);
    check(&run(ReluGrad, &[t(&[3], &[5.0, 6.0, 7.0]), t(&[3], &[0.0, 0.0, 2.0])], c), &[3], &[0.0, 0.0, 7.0]);
    check(&run(Gelu { approximate: true }, &[t(&[3], &[0.0, 1.0, -1.0])], c), &[3], &[0.0, 0.8411919906082768, -0.15880800939172324]);
    // x / (1 + e^-x): torch.nn.functional.silu's values.
    check(&run(Silu, &[t(&[3], &[0.0, 1.0, -2.0])], c), &[3], &[0.0, 0.7310585786300049, -0.2384058440442351]);
    // dy * s(x) (1 + x (1 - s(x))), inputs (dy, x).
    check(
        &run(SiluGrad, &[t(&[3], &[1.0, 2.0, 3.0]), t(&[3], &[0.0, 1.0, -2.0])], c),
        &[3],
        &[0.5, 1.8553410237429737, -0.2723527463546864],
    );
    check(&run(GeluGrad { approximate: true }, &[t(&[1], &[2.0]), t(&[1], &[1.0])], c), &[1], &[2.0 * 1.0829640837983767]);
    check(&run(Tanh, &[t(&[2], &[0.0, 0.5])], c), &[2], &[0.0, 0.5f64.tanh()]);
    check(&run(Sigmoid, &[t(&[2], &[0.0, 2.0])], c), &[2], &[0.5, 1.0 / (1.0 + (-2.0f64).exp())]);
    let l = t(&[1, 3], &[1.0, 2.0, 3.0]);
    check(
        &run(Softmax { axis: -1, group: Vec::new() }, &[l.clone()], c),
        &[1, 3],
        &[0.09003057317038046, 0.24472847105479767, 0.6652409557748219],
    );
    check(
        &run(LogSoftmax { axis: 1, group: Vec::new() }, &[l], c),
        &[1, 3],
        &[-2.40760596444438, -1.4076059644443801, -0.4076059644443803],
    );

    // Reductions.
    check(&run(ReduceSum { axes: vec![0], keep_dims: false }, &[m22.clone()], c), &[2], &[4.0, 6.0]);
    check(&run(ReduceMean { axes: vec![1], keep_dims: true }, &[m22.clone()], c), &[2, 1], &[1.5, 3.5]);
    check(&run(ReduceMax { axes: vec![], keep_dims: false }, &[m22.clone()], c), &[], &[4.0]);
    let x = t(&[2, 2], &[1.0, 3.0, 4.0, 2.0]);
    check(&run(ReduceMaxGrad { axes: vec![1], keep_dims: false }, &[x, t(&[2], &[10.0, 20.0])], c), &[2, 2], &[0.0, 10.0, 20.0, 0.0]);

    // Shapes.
    let m23 = seq(&[2, 3]);
    check(&run(Reshape { shape: vec![3, -1] }, &[m23.clone()], c), &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check(&run(Transpose { perm: vec![1, 0] }, &[m23.clone()], c), &[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    check(&run(Flatten, &[seq(&[2, 2, 2])], c), &[2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    check(&run(BroadcastTo { shape: vec![2, 2] }, &[t(&[1, 2], &[7.0, 8.0])], c), &[2, 2], &[7.0, 8.0, 7.0, 8.0]);
    check(&run(SumTo { shape: vec![1, 2] }, &[m22.clone()], c), &[1, 2], &[4.0, 6.0]);
    check(&run(Concat { axis: 1 }, &[m22.clone(), t(&[2, 1], &[9.0, 8.0])], c), &[2, 3], &[1.0, 2.0, 9.0, 3.0, 4.0, 8.0]);
    check(&run(Slice { begin: vec![1, 1], size: vec![1, 2] }, &[m23.clone()], c), &[1, 2], &[5.0, 6.0]);
    check(&run(Pad { before: vec![0, 1], after: vec![1, 0] }, &[m22.clone()], c), &[3, 3], &[0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0]);
    let table = seq(&[3, 2]);
    check(&run(Gather { axis: 0, shard: None }, &[table, idx(&[2], &[2, 0])], c), &[2, 2], &[5.0, 6.0, 1.0, 2.0]);
    let dy = t(&[3, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    check(
        &run(GatherGrad { axis: 0, dim_size: 3, shard: None }, &[idx(&[3], &[2, 0, 2]), dy], c),
        &[3, 2],
        &[2.0, 2.0, 0.0, 0.0, 4.0, 4.0],
    );
    check(
        &run(OneHot { depth: 3, on_value: 1.0, off_value: 0.0, dtype: DType::F32 }, &[idx(&[2], &[1, 0])], c),
        &[2, 3],
        &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
    );

    // Matrix products.
    let b22 = t(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    check(&run(MatMul { transpose_a: false, transpose_b: false }, &[m22.clone(), b22.clone()], c), &[2, 2], &[19.0, 22.0, 43.0, 50.0]);
    check(&run(MatMul { transpose_a: false, transpose_b: true }, &[m22.clone(), b22.clone()], c), &[2, 2], &[17.0, 23.0, 39.0, 53.0]);
    check(&run(MatMul { transpose_a: true, transpose_b: false }, &[m22.clone(), b22.clone()], c), &[2, 2], &[26.0, 30.0, 38.0, 44.0]);
    let a3 = t(&[2, 2, 2], &[1.0, 2.0, 3.0, 4.0, 1.0, 0.0, 0.0, 1.0]);
    let b3 = t(&[2, 2, 2], &[5.0, 6.0, 7.0, 8.0, 2.0, 3.0, 4.0, 5.0]);
    check(
        &run(BatchMatMul { transpose_a: false, transpose_b: false }, &[a3, b3], c),
        &[2, 2, 2],
        &[19.0, 22.0, 43.0, 50.0, 2.0, 3.0, 4.0, 5.0],
    );
    check(&run(BiasAdd, &[m22.clone(), t(&[2], &[10.0, 20.0])], c), &[2, 2], &[11.0, 22.0, 13.0, 24.0]);

    // Convolution and its adjoints: a 3x3 image 1..9 and a 2x2 filter of ones.
    let img = seq(&[1, 1, 3, 3]);
    let ones = t(&[1, 1, 2, 2], &[1.0; 4]);
    let conv = ConvAttrs::default();
    check(&run(Conv2D { conv }, &[img.clone(), ones.clone()], c), &[1, 1, 2, 2], &[12.0, 16.0, 24.0, 28.0]);
    check(
        &run(Conv2DGradInput { conv, input_shape: vec![1, 1, 3, 3] }, &[ones.clone(), ones.clone()], c),
        &[1, 1, 3, 3],
        &[1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0],
    );
    check(
        &run(Conv2DGradFilter { conv, filter_shape: vec![1, 1, 2, 2] }, &[ones.clone(), img], c),
        &[1, 1, 2, 2],
        &[12.0, 16.0, 24.0, 28.0],
    );
    let padded = ConvAttrs::new(2, 1);
    check(&run(Conv2D { conv: padded }, &[seq(&[1, 1, 2, 2]), ones], c), &[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);

    // Pooling on a 4x4 image 1..16.
    let img = seq(&[1, 1, 4, 4]);
    let pool = PoolAttrs::new(2, 2);
    check(&run(MaxPool { pool }, &[img.clone()], c), &[1, 1, 2, 2], &[6.0, 8.0, 14.0, 16.0]);
    let mut want = vec![0.0; 16];
    for (i, v) in [(5, 1.0), (7, 2.0), (13, 3.0), (15, 4.0)] {
        want[i] = v;
    }
    check(&run(MaxPoolGrad { pool }, &[img.clone(), t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0])], c), &[1, 1, 4, 4], &want);
    check(&run(AvgPool { pool }, &[img.clone()], c), &[1, 1, 2, 2], &[3.5, 5.5, 11.5, 13.5]);
    check(&run(AvgPoolGrad { pool, input_shape: vec![1, 1, 4, 4] }, &[t(&[1, 1, 2, 2], &[4.0; 4])], c), &[1, 1, 4, 4], &[1.0; 16]);
    check(&run(GlobalAvgPool, &[seq(&[1, 2, 2, 2])], c), &[1, 2], &[2.5, 6.5]);

    // Normalisation: two samples 1 and 3 of one channel normalise to -1 and 1.
    let x = t(&[2, 1], &[1.0, 3.0]);
    let (one, zero) = (t(&[1], &[1.0]), t(&[1], &[0.0]));
    let s = 1.0 / (1.0f64 + 1e-5).sqrt();
    let bn = |training| BatchNorm { training, eps: 1e-5, momentum: 0.9, group: Vec::new() };
    check(&run(bn(true), &[x.clone(), one.clone(), zero.clone(), zero.clone(), one.clone()], c), &[2, 1], &[-s, s]);
    let (rm, rv) = (t(&[1], &[1.0]), t(&[1], &[4.0]));
    check(
        &run(bn(false), &[x.clone(), one.clone(), zero.clone(), rm.clone(), rv.clone()], c),
        &[2, 1],
        &[0.0, 2.0 / (4.0f64 + 1e-5).sqrt()],
    );
    // dgamma = sum(dy * xhat) = 1 * -s + 2 * s
    let dy = t(&[2, 1], &[1.0, 2.0]);
    check(
        &run(
            BatchNormGrad { training: true, eps: 1e-5, of: NormGradOf::Gamma, group: Vec::new() },
            &[dy.clone(), x.clone(), one.clone(), rm, rv],
            c,
        ),
        &[1],
        &[s],
    );
    let xr = t(&[1, 2], &[1.0, 3.0]);
    check(
        &run(LayerNorm { begin_norm_axis: 1, eps: 1e-5, group: Vec::new() }, &[xr.clone(), t(&[2], &[1.0, 2.0]), t(&[2], &[0.0, 1.0])], c),
        &[1, 2],
        &[-s, 2.0 * s + 1.0],
    );
    check(
        &run(
            LayerNormGrad { begin_norm_axis: 1, eps: 1e-5, of: NormGradOf::Gamma, group: Vec::new() },
            &[t(&[1, 2], &[1.0, 2.0]), xr, t(&[2], &[1.0, 1.0])],
            c,
        ),
        &[2],
        &[-s, 2.0 * s],
    );

    // RMSNorm of [1, 3]: mean square 5; dgamma = dy * x_hat.
    let r = 1.0 / (5.0f64 + 1e-5).sqrt();
    let x13 = t(&[1, 2], &[1.0, 3.0]);
    check(
        &run(RmsNorm { begin_norm_axis: 1, eps: 1e-5, group: Vec::new() }, &[x13.clone(), t(&[2], &[1.0, 2.0])], c),
        &[1, 2],
        &[r, 6.0 * r],
    );
    check(
        &run(
            RmsNormGrad { begin_norm_axis: 1, eps: 1e-5, of: NormGradOf::Gamma, group: Vec::new() },
            &[t(&[1, 2], &[1.0, 2.0]), x13, t(&[2], &[1.0, 1.0])],
            c,
        ),
        &[2],
        &[r, 6.0 * r],
    );
    // RoPE with D = 2: position 0 unchanged, position 1 rotated by 1 radian.
    let (cos1, sin1) = (1.0f64.cos(), 1.0f64.sin());
    check(
        &run(RotaryEmbedding { theta: 10000.0, offset: 0, inverse: false }, &[t(&[2, 2], &[1.0, 2.0, 1.0, 2.0])], c),
        &[2, 2],
        &[1.0, 2.0, cos1 - 2.0 * sin1, 2.0 * cos1 + sin1],
    );

    // Attention: a zero query weighs two keys alike (the mean of the values); causal, the first
    // row sees the first key alone. dv = pᵀ dy.
    let (q0, k2, v2) = (t(&[1, 1, 1, 2, 2], &[0.0; 4]), t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]), t(&[1, 1, 2, 2], &[1.0, 2.0, 5.0, 6.0]));
    check(
        &run(Attention { scale: 1.0, causal: false, row_offset: 0 }, &[q0.clone(), k2.clone(), v2.clone()], c),
        &[1, 1, 1, 2, 2],
        &[3.0, 4.0, 3.0, 4.0],
    );
    check(
        &run(Attention { scale: 1.0, causal: true, row_offset: 0 }, &[q0.clone(), k2.clone(), v2.clone()], c),
        &[1, 1, 1, 2, 2],
        &[1.0, 2.0, 3.0, 4.0],
    );
    let dy = t(&[1, 1, 1, 2, 2], &[1.0, 2.0, 0.0, 0.0]);
    check(
        &run(AttentionGrad { scale: 1.0, causal: false, row_offset: 0, of: AttentionGradOf::Value }, &[dy, q0, k2, v2], c),
        &[1, 1, 2, 2],
        &[0.5, 1.0, 0.5, 1.0],
    );

    // Router: the two largest of four, renormalised.
    check(
        &run(RouterTopK { k: 2, renormalize: true, mask: false, capacity: None }, &[t(&[1, 4], &[0.1, 0.4, 0.2, 0.3])], c),
        &[1, 4],
        &[0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],
    );
    check(
        &run(RouterTopK { k: 2, renormalize: false, mask: true, capacity: None }, &[t(&[1, 4], &[0.1, 0.4, 0.2, 0.3])], c),
        &[1, 4],
        &[0.0, 1.0, 0.0, 1.0],
    );
    check(
        &run(
            RouterTopKGrad { k: 1, renormalize: false, capacity: None },
            &[t(&[1, 4], &[1.0, 2.0, 3.0, 4.0]), t(&[1, 4], &[0.1, 0.4, 0.2, 0.3])],
            c,
        ),
        &[1, 4],
        &[0.0, 2.0, 0.0, 0.0],
    );

    // Dropout with p = 0 is the identity; with p = 0.5 every element is 0 or doubled.
    check(&run(Dropout { p: 0.0, seed: 1, block: None }, &[m22.clone()], c), &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let big = t(&[1000], &[1.0; 1000]);
    let d = run(Dropout { p: 0.5, seed: 1, block: None }, &[big], c).to_f64_vec();
    assert!(d.iter().all(|&v| v == 0.0 || v == 2.0));
    let kept = d.iter().filter(|&&v| v == 2.0).count();
    assert!((400..600).contains(&kept), "{kept} of 1000 kept");

    // Loss: two equal logits give ln 2.
    check(&run(SoftmaxCrossEntropy, &[t(&[2, 2], &[0.0, 0.0, 5.0, 5.0]), idx(&[2], &[1, 0])], c), &[], &[std::f64::consts::LN_2]);

    // Communication ops on a one-rank group are identities.
    let g = vec![0];
    for op in [
        OpKind::from(AllReduce { op: ReduceOp::Sum, group: g.clone() }),
        AllGather { dim: 0, group: g.clone() }.into(),
        ReduceScatter { op: ReduceOp::Sum, dim: 1, group: g.clone() }.into(),
        AllToAll { split_dim: 0, concat_dim: 1, group: g.clone() }.into(),
        Broadcast { root: 0, group: g.clone() }.into(),
        Reduce { op: ReduceOp::Sum, root: 0, group: g.clone() }.into(),
        Send { peer: 0, tag: 1 }.into(),
        Recv { peer: 0, tag: 1 }.into(),
    ] {
        check(&run(op, &[m22.clone()], c), &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    }

    // Cast: f64 -> f32 keeps these values exactly.
    let cast = run(Cast::to(DType::F32), &[m22.clone()], c);
    assert_eq!(cast.dtype(), autopar_tensor::DType::F32);
    check(&cast, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);

    let all: BTreeSet<String> = OpKind::ALL_KINDS.iter().map(|s| s.to_string()).collect();
    let missing: Vec<_> = all.difference(c).collect();
    assert!(missing.is_empty(), "op kinds without a forward case: {missing:?}");
}
