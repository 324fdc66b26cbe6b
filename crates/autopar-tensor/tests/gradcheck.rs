//! Every backward piece against central finite differences in f64, on random shapes.
//!
//! The checker evaluates `L(x) = sum(f(x) * r)` for a fixed random `r`, perturbs each input
//! element by +-h and compares `(L(x+h) - L(x-h)) / 2h` with the analytic gradient the kernels
//! give for `dy = r`.

use autopar_tensor::kernels::{conv, dropout, elementwise as ew, loss, matmul, norm, pool, reduce, shape};
use autopar_tensor::{random, Conv2dParams, DType, ExecCtx, Pool2dParams, Tensor};

type Fwd = Box<dyn Fn(&[Tensor]) -> Tensor>;
type Bwd = Box<dyn Fn(&[Tensor], &Tensor, &Tensor) -> Vec<Tensor>>;

struct Case {
    name: String,
    inputs: Vec<Tensor>,
    /// Indices of the inputs that get gradients, in the order `bwd` returns them.
    wrt: Vec<usize>,
    fwd: Fwd,
    bwd: Bwd,
}

fn ctx() -> ExecCtx {
    ExecCtx::serial()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 += 1;
        random::hash(0xC0FFEE, self.0)
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn seed(&mut self) -> u64 {
        self.next()
    }
}

fn rand(rng: &mut Rng, shape: &[usize]) -> Tensor {
    random::uniform(shape, -1.0, 1.0, rng.seed(), DType::F64)
}

fn rand_pos(rng: &mut Rng, shape: &[usize]) -> Tensor {
    random::uniform(shape, 0.5, 2.0, rng.seed(), DType::F64)
}

fn with_value(t: &Tensor, i: usize, v: f64) -> Tensor {
    let mut d = t.to_vec::<f64>().unwrap();
    d[i] = v;
    Tensor::from_vec(t.shape(), d).unwrap()
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| x * y).sum()
}

fn check(case: &Case, rng: &mut Rng) {
    let y = (case.fwd)(&case.inputs);
    let r = rand(rng, y.shape());
    let grads = (case.bwd)(&case.inputs, &y, &r);
    assert_eq!(grads.len(), case.wrt.len(), "{}: gradient count", case.name);
    let h = 1e-6;
    for (g, &k) in grads.iter().zip(&case.wrt) {
        let x = &case.inputs[k];
        assert_eq!(g.shape(), x.shape(), "{}: gradient {k} shape", case.name);
        assert_eq!(g.dtype(), DType::F64, "{}: gradient dtype", case.name);
        let xv = x.to_vec::<f64>().unwrap();
        let gv = g.to_f64_vec();
        for i in 0..xv.len() {
            let eval = |v: f64| {
                let mut ins = case.inputs.clone();
                ins[k] = with_value(x, i, v);
                dot(&(case.fwd)(&ins), &r)
            };
            let num = (eval(xv[i] + h) - eval(xv[i] - h)) / (2.0 * h);
            let tol = 1e-5 * (1.0 + num.abs().max(gv[i].abs()));
            assert!(
                (num - gv[i]).abs() <= tol,
                "{}: d/d input{k}[{i}] analytic {} vs numeric {num} (input shapes {:?})",
                case.name,
                gv[i],
                case.inputs.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>()
            );
        }
    }
}

fn run(cases: Vec<Case>, rng: &mut Rng) {
    for c in &cases {
        check(c, rng);
    }
}

#[test]
fn matmul_gradients_match_finite_differences_for_every_transpose_combination() {
    let mut rng = Rng(1);
    let mut cases = vec![];
    for _ in 0..3 {
        let (m, k, n) = (rng.range(1, 4), rng.range(1, 4), rng.range(1, 4));
        for ta in [false, true] {
            for tb in [false, true] {
                let a = rand(&mut rng, &if ta { [k, m] } else { [m, k] });
                let b = rand(&mut rng, &if tb { [n, k] } else { [k, n] });
                cases.push(Case {
                    name: format!("matmul ta={ta} tb={tb}"),
                    inputs: vec![a, b],
                    wrt: vec![0, 1],
                    fwd: Box::new(move |x| matmul::matmul(&ctx(), &x[0], &x[1], ta, tb).unwrap()),
                    bwd: Box::new(move |x, _, dy| {
                        let (da, db) = matmul::matmul_grads(&ctx(), &x[0], &x[1], dy, ta, tb).unwrap();
                        vec![da, db]
                    }),
                });
            }
        }
    }
    run(cases, &mut rng);
}

#[test]
fn batch_matmul_gradients_match_finite_differences_with_broadcast_batches() {
    let mut rng = Rng(2);
    let mut cases = vec![];
    for (ba, bb) in [(vec![2], vec![2]), (vec![2, 1], vec![3]), (vec![1], vec![2, 2]), (vec![], vec![3])] {
        let (m, k, n) = (rng.range(1, 3), rng.range(1, 3), rng.range(1, 3));
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut sa = ba.clone();
            sa.extend(if ta { [k, m] } else { [m, k] });
            let mut sb = bb.clone();
            sb.extend(if tb { [n, k] } else { [k, n] });
            cases.push(Case {
                name: format!("batch_matmul {sa:?} x {sb:?} ta={ta} tb={tb}"),
                inputs: vec![rand(&mut rng, &sa), rand(&mut rng, &sb)],
                wrt: vec![0, 1],
                fwd: Box::new(move |x| matmul::batch_matmul(&ctx(), &x[0], &x[1], ta, tb).unwrap()),
                bwd: Box::new(move |x, _, dy| {
                    let (da, db) = matmul::batch_matmul_grads(&ctx(), &x[0], &x[1], dy, ta, tb).unwrap();
                    vec![da, db]
                }),
            });
        }
    }
    run(cases, &mut rng);
}

#[test]
fn broadcasting_arithmetic_gradients_match_finite_differences() {
    let mut rng = Rng(3);
    let pairs: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![2, 3], vec![2, 3]),
        (vec![2, 3, 4], vec![3, 1]),
        (vec![1, 3], vec![2, 1]),
        (vec![4], vec![2, 3, 4]),
        (vec![2, 3], vec![]),
    ];
    let mut cases = vec![];
    for (sa, sb) in pairs {
        for op in [ew::BinaryOp::Add, ew::BinaryOp::Sub, ew::BinaryOp::Mul, ew::BinaryOp::Div] {
            let b = if op == ew::BinaryOp::Div { rand_pos(&mut rng, &sb) } else { rand(&mut rng, &sb) };
            cases.push(Case {
                name: format!("{op:?} {sa:?} {sb:?}"),
                inputs: vec![rand(&mut rng, &sa), b],
                wrt: vec![0, 1],
                fwd: Box::new(move |x| ew::binary(&ctx(), op, &x[0], &x[1]).unwrap()),
                bwd: Box::new(move |x, _, dy| {
                    let (da, db) = ew::binary_grads(&ctx(), op, &x[0], &x[1], dy).unwrap();
                    vec![da, db]
                }),
            });
        }
    }
    run(cases, &mut rng);
}

#[test]
fn bias_add_gradients_match_finite_differences() {
    let mut rng = Rng(4);
    let mut cases = vec![];
    for (shape, axis) in [(vec![3, 4], 1isize), (vec![2, 3, 2, 2], 1), (vec![2, 2, 3], -1)] {
        let c = shape[if axis < 0 { shape.len() - 1 } else { axis as usize }];
        cases.push(Case {
            name: format!("bias_add {shape:?} axis {axis}"),
            inputs: vec![rand(&mut rng, &shape), rand(&mut rng, &[c])],
            wrt: vec![0, 1],
            fwd: Box::new(move |x| ew::bias_add(&ctx(), &x[0], &x[1], axis).unwrap()),
            bwd: Box::new(move |_, _, dy| vec![dy.clone(), ew::bias_add_grad(&ctx(), dy, axis).unwrap()]),
        });
    }
    run(cases, &mut rng);
}

#[test]
fn unary_gradients_match_finite_differences() {
    let mut rng = Rng(5);
    let ops = [
        ew::UnaryOp::Relu,
        ew::UnaryOp::Gelu { approximate: true },
        ew::UnaryOp::Gelu { approximate: false },
        ew::UnaryOp::Silu,
        ew::UnaryOp::Tanh,
        ew::UnaryOp::Sigmoid,
        ew::UnaryOp::Exp,
        ew::UnaryOp::Log,
        ew::UnaryOp::Sqrt,
        ew::UnaryOp::Neg,
    ];
    let mut cases = vec![];
    for op in ops {
        let shape = [rng.range(1, 3), rng.range(1, 4)];
        let x = if matches!(op, ew::UnaryOp::Log | ew::UnaryOp::Sqrt) {
            rand_pos(&mut rng, &shape)
        } else {
            random::uniform(&shape, -2.0, 2.0, rng.seed(), DType::F64)
        };
        cases.push(Case {
            name: format!("{op:?}"),
            inputs: vec![x],
            wrt: vec![0],
            fwd: Box::new(move |x| ew::unary(&ctx(), op, &x[0]).unwrap()),
            bwd: Box::new(move |x, y, dy| {
                let saved = match op.backward_uses() {
                    ew::Saved::Input => &x[0],
                    ew::Saved::Output => y,
                    ew::Saved::Nothing => dy,
                };
                vec![ew::unary_backward(&ctx(), op, saved, dy).unwrap()]
            }),
        });
    }
    run(cases, &mut rng);
}

#[test]
fn softmax_and_log_softmax_gradients_match_finite_differences_on_any_axis() {
    let mut rng = Rng(6);
    let mut cases = vec![];
    for axis in [-1isize, 0, 1] {
        let shape = [rng.range(2, 3), rng.range(2, 4), rng.range(1, 3)];
        cases.push(Case {
            name: format!("softmax axis {axis}"),
            inputs: vec![rand(&mut rng, &shape)],
            wrt: vec![0],
            fwd: Box::new(move |x| reduce::softmax(&ctx(), &x[0], axis).unwrap()),
            bwd: Box::new(move |_, y, dy| vec![reduce::softmax_backward(&ctx(), y, dy, axis).unwrap()]),
        });
        cases.push(Case {
            name: format!("log_softmax axis {axis}"),
            inputs: vec![rand(&mut rng, &shape)],
            wrt: vec![0],
            fwd: Box::new(move |x| reduce::log_softmax(&ctx(), &x[0], axis).unwrap()),
            bwd: Box::new(move |_, y, dy| vec![reduce::log_softmax_backward(&ctx(), y, dy, axis).unwrap()]),
        });
    }
    run(cases, &mut rng);
}

#[test]
fn reduction_gradients_match_finite_differences() {
    let mut rng = Rng(7);
    let mut cases = vec![];
    for axes in [vec![], vec![0], vec![-1], vec![0, 2], vec![1]] {
        for keep in [false, true] {
            let shape = [rng.range(1, 3), rng.range(2, 3), rng.range(1, 4)];
            for op in [reduce::ReduceOp::Sum, reduce::ReduceOp::Mean, reduce::ReduceOp::Max] {
                let axes = axes.clone();
                let axes2 = axes.clone();
                cases.push(Case {
                    name: format!("{op:?} axes {axes:?} keep {keep}"),
                    inputs: vec![rand(&mut rng, &shape)],
                    wrt: vec![0],
                    fwd: Box::new(move |x| reduce::reduce(&ctx(), op, &x[0], &axes, keep).unwrap()),
                    bwd: Box::new(move |x, _, dy| {
                        vec![match op {
                            reduce::ReduceOp::Max => reduce::reduce_max_backward(&ctx(), &x[0], dy, &axes2).unwrap(),
                            _ => reduce::reduce_backward(&ctx(), op, dy, x[0].shape(), &axes2).unwrap(),
                        }]
                    }),
                });
            }
        }
    }
    run(cases, &mut rng);
}

#[test]
fn shape_op_gradients_match_finite_differences() {
    let mut rng = Rng(8);
    let x = rand(&mut rng, &[2, 3, 4]);
    let cases = vec![
        Case {
            name: "reshape".into(),
            inputs: vec![x.clone()],
            wrt: vec![0],
            fwd: Box::new(|x| shape::reshape(&x[0], &[4, -1]).unwrap()),
            bwd: Box::new(|x, _, dy| vec![shape::reshape_to(dy, x[0].shape()).unwrap()]),
        },
        Case {
            name: "flatten".into(),
            inputs: vec![x.clone()],
            wrt: vec![0],
            fwd: Box::new(|x| shape::flatten(&x[0]).unwrap()),
            bwd: Box::new(|x, _, dy| vec![shape::reshape_to(dy, x[0].shape()).unwrap()]),
        },
        Case {
            name: "transpose".into(),
            inputs: vec![x.clone()],
            wrt: vec![0],
            fwd: Box::new(|x| shape::transpose(&x[0], &[2, 0, 1]).unwrap()),
            bwd: Box::new(|_, _, dy| vec![shape::transpose(dy, &shape::inverse_permutation(&[2, 0, 1])).unwrap().contiguous()]),
        },
        Case {
            name: "slice".into(),
            inputs: vec![x.clone()],
            wrt: vec![0],
            fwd: Box::new(|x| shape::slice(&x[0], &[1, 0, 1], &[1, -1, 2]).unwrap()),
            bwd: Box::new(|x, _, dy| vec![shape::slice_backward(dy, x[0].shape(), &[1, 0, 1]).unwrap()]),
        },
        Case {
            name: "concat".into(),
            inputs: vec![x.clone(), rand(&mut rng, &[2, 1, 4]), rand(&mut rng, &[2, 2, 4])],
            wrt: vec![0, 1, 2],
            fwd: Box::new(|x| shape::concat(&[&x[0], &x[1], &x[2]], 1).unwrap()),
            bwd: Box::new(|_, _, dy| shape::concat_backward(dy, &[3, 1, 2], 1).unwrap()),
        },
        Case {
            name: "gather axis 0 (embedding, repeated indices)".into(),
            inputs: vec![rand(&mut rng, &[5, 3])],
            wrt: vec![0],
            fwd: Box::new(|x| shape::gather(&ctx(), &x[0], &Tensor::from_vec(&[2, 3], vec![4i64, 0, 4, 2, 2, 4]).unwrap(), 0).unwrap()),
            bwd: Box::new(|x, _, dy| {
                vec![shape::gather_backward(&ctx(), dy, &Tensor::from_vec(&[2, 3], vec![4i64, 0, 4, 2, 2, 4]).unwrap(), x[0].shape(), 0)
                    .unwrap()]
            }),
        },
        Case {
            name: "gather axis 1".into(),
            inputs: vec![rand(&mut rng, &[2, 4, 3])],
            wrt: vec![0],
            fwd: Box::new(|x| shape::gather(&ctx(), &x[0], &Tensor::from_vec(&[3], vec![3i32, 1, 3]).unwrap(), 1).unwrap()),
            bwd: Box::new(|x, _, dy| {
                vec![shape::gather_backward(&ctx(), dy, &Tensor::from_vec(&[3], vec![3i32, 1, 3]).unwrap(), x[0].shape(), 1).unwrap()]
            }),
        },
    ];
    run(cases, &mut rng);
}

#[test]
fn conv2d_gradients_match_finite_differences_with_stride_padding_dilation_and_groups() {
    let mut rng = Rng(9);
    let configs = [
        (Conv2dParams::default(), 2usize, 3usize, 3usize),
        (Conv2dParams::new(2, 1), 2, 2, 3),
        (Conv2dParams { stride: [1, 2], padding: [1, 0, 2, 1], dilation: [2, 1], groups: 1 }, 1, 2, 2),
        (Conv2dParams { stride: [1, 1], padding: [1; 4], dilation: [1, 1], groups: 2 }, 4, 4, 3),
        (Conv2dParams { groups: 2, ..Default::default() }, 4, 2, 1),
        (Conv2dParams { stride: [3, 2], padding: [2, 0, 1, 2], dilation: [1, 2], groups: 1 }, 1, 2, 3),
        // 32 channels per group: the shifted-GEMM forward and the flipped-kernel input gradient.
        (Conv2dParams { stride: [1, 1], padding: [1, 0, 0, 1], dilation: [1, 1], groups: 1 }, 32, 2, 2),
    ];
    let mut cases = vec![];
    for (p, c, o, k) in configs {
        let n = rng.range(1, 2);
        let (h, w) = (rng.range(4, 5), rng.range(4, 6));
        let xs = [n, c, h, w];
        let ws = [o, c / p.groups, k, if k == 1 { 1 } else { k - 1 }];
        cases.push(Case {
            name: format!("conv2d {xs:?} w {ws:?} {p:?}"),
            inputs: vec![rand(&mut rng, &xs), rand(&mut rng, &ws)],
            wrt: vec![0, 1],
            fwd: Box::new(move |x| conv::conv2d(&ctx(), &x[0], &x[1], &p).unwrap()),
            bwd: Box::new(move |x, _, dy| {
                vec![
                    conv::conv2d_backward_input(&ctx(), dy, &x[1], x[0].shape(), &p).unwrap(),
                    conv::conv2d_backward_weight(&ctx(), dy, &x[0], x[1].shape(), &p).unwrap(),
                ]
            }),
        });
    }
    run(cases, &mut rng);
}

#[test]
fn normalisation_gradients_match_finite_differences() {
    let mut rng = Rng(10);
    let mut cases = vec![];
    for shape in [vec![4, 3], vec![2, 3, 2, 2], vec![3, 2, 3]] {
        let c = shape[1];
        cases.push(Case {
            name: format!("batch_norm train {shape:?}"),
            inputs: vec![rand(&mut rng, &shape), rand_pos(&mut rng, &[c]), rand(&mut rng, &[c])],
            wrt: vec![0, 1, 2],
            fwd: Box::new(move |x| {
                let z = Tensor::zeros(&[c], DType::F64);
                let o = Tensor::ones(&[c], DType::F64);
                norm::batch_norm_train(&ctx(), &x[0], &x[1], &x[2], &z, &o, 0.9, 1e-5).unwrap().y
            }),
            bwd: Box::new(move |x, _, dy| {
                let z = Tensor::zeros(&[c], DType::F64);
                let o = Tensor::ones(&[c], DType::F64);
                let out = norm::batch_norm_train(&ctx(), &x[0], &x[1], &x[2], &z, &o, 0.9, 1e-5).unwrap();
                let (dx, dg, db) = norm::batch_norm_backward(&ctx(), &x[0], &x[1], &out.saved, dy).unwrap();
                vec![dx, dg, db]
            }),
        });
        let rm = rand(&mut rng, &[c]);
        let rv = rand_pos(&mut rng, &[c]);
        let (rm2, rv2) = (rm.clone(), rv.clone());
        cases.push(Case {
            name: format!("batch_norm eval {shape:?}"),
            inputs: vec![rand(&mut rng, &shape), rand_pos(&mut rng, &[c]), rand(&mut rng, &[c])],
            wrt: vec![0, 1, 2],
            fwd: Box::new(move |x| norm::batch_norm_eval(&ctx(), &x[0], &x[1], &x[2], &rm, &rv, 1e-5).unwrap()),
            bwd: Box::new(move |x, _, dy| {
                let inv: Vec<f64> = rv2.to_vec::<f64>().unwrap().iter().map(|v| 1.0 / (v + 1e-5).sqrt()).collect();
                let saved = norm::NormSaved { mean: rm2.clone(), inv_std: Tensor::from_vec(&[c], inv).unwrap() };
                let (dx, dg, db) = norm::batch_norm_eval_backward(&ctx(), &x[0], &x[1], &saved, dy).unwrap();
                vec![dx, dg, db]
            }),
        });
        let axis = -1 - (rng.range(0, 1) as isize);
        let ps: Vec<usize> = shape[(shape.len() as isize + axis) as usize..].to_vec();
        cases.push(Case {
            name: format!("layer_norm {shape:?} axis {axis}"),
            inputs: vec![rand(&mut rng, &shape), rand_pos(&mut rng, &ps), rand(&mut rng, &ps)],
            wrt: vec![0, 1, 2],
            fwd: Box::new(move |x| norm::layer_norm(&ctx(), &x[0], &x[1], &x[2], axis, 1e-5).unwrap().0),
            bwd: Box::new(move |x, _, dy| {
                let (_, saved) = norm::layer_norm(&ctx(), &x[0], &x[1], &x[2], axis, 1e-5).unwrap();
                let (dx, dg, db) = norm::layer_norm_backward(&ctx(), &x[0], &x[1], &saved, dy, axis).unwrap();
                vec![dx, dg, db]
            }),
        });
        cases.push(Case {
            name: format!("rms_norm {shape:?} axis {axis}"),
            inputs: vec![rand(&mut rng, &shape), rand_pos(&mut rng, &ps)],
            wrt: vec![0, 1],
            fwd: Box::new(move |x| norm::rms_norm(&ctx(), &x[0], &x[1], axis, 1e-5).unwrap().0),
            bwd: Box::new(move |x, _, dy| {
                let (_, saved) = norm::rms_norm(&ctx(), &x[0], &x[1], axis, 1e-5).unwrap();
                let (dx, dg) = norm::rms_norm_backward(&ctx(), &x[0], &x[1], &saved, dy, axis).unwrap();
                vec![dx, dg]
            }),
        });
    }
    run(cases, &mut rng);
}

#[test]
fn pooling_gradients_match_finite_differences() {
    let mut rng = Rng(11);
    let mut cases = vec![];
    let params = [
        Pool2dParams::new(2, 2),
        Pool2dParams::new(3, 1),
        Pool2dParams { kernel: [3, 2], stride: [2, 1], padding: [1, 1, 1, 0], count_include_pad: false },
        Pool2dParams { kernel: [3, 3], stride: [2, 2], padding: [1; 4], count_include_pad: true },
    ];
    for p in params {
        let shape = [rng.range(1, 2), rng.range(1, 2), rng.range(4, 5), rng.range(4, 6)];
        cases.push(Case {
            name: format!("max_pool2d {shape:?} {p:?}"),
            inputs: vec![rand(&mut rng, &shape)],
            wrt: vec![0],
            fwd: Box::new(move |x| pool::max_pool2d(&ctx(), &x[0], &p).unwrap().0),
            bwd: Box::new(move |x, _, dy| {
                let (_, am) = pool::max_pool2d(&ctx(), &x[0], &p).unwrap();
                vec![pool::max_pool2d_backward(&ctx(), dy, &am, x[0].shape()).unwrap()]
            }),
        });
        cases.push(Case {
            name: format!("avg_pool2d {shape:?} {p:?}"),
            inputs: vec![rand(&mut rng, &shape)],
            wrt: vec![0],
            fwd: Box::new(move |x| pool::avg_pool2d(&ctx(), &x[0], &p).unwrap()),
            bwd: Box::new(move |x, _, dy| vec![pool::avg_pool2d_backward(&ctx(), dy, x[0].shape(), &p).unwrap()]),
        });
    }
    for keep in [false, true] {
        cases.push(Case {
            name: format!("global_avg_pool keep {keep}"),
            inputs: vec![rand(&mut rng, &[2, 3, 2, 3])],
            wrt: vec![0],
            fwd: Box::new(move |x| pool::global_avg_pool(&ctx(), &x[0], keep).unwrap()),
            bwd: Box::new(|x, _, dy| vec![pool::global_avg_pool_backward(&ctx(), dy, x[0].shape()).unwrap()]),
        });
    }
    run(cases, &mut rng);
}

#[test]
fn dropout_and_loss_gradients_match_finite_differences() {
    let mut rng = Rng(12);
    let labels = Tensor::from_vec(&[4], vec![2i64, 0, 4, 2]).unwrap();
    let l2 = labels.clone();
    let targets = random::uniform(&[3, 4], 0.0, 1.0, 5, DType::F64);
    let t2 = targets.clone();
    let cases = vec![
        Case {
            name: "dropout".into(),
            inputs: vec![rand(&mut rng, &[3, 5])],
            wrt: vec![0],
            fwd: Box::new(|x| dropout::dropout(&ctx(), &x[0], 0.4, 77).unwrap().0),
            bwd: Box::new(|x, _, dy| {
                let (_, mask) = dropout::dropout(&ctx(), &x[0], 0.4, 77).unwrap();
                vec![dropout::dropout_backward(&ctx(), dy, &mask).unwrap()]
            }),
        },
        Case {
            name: "softmax_cross_entropy_sparse".into(),
            inputs: vec![rand(&mut rng, &[4, 5])],
            wrt: vec![0],
            fwd: Box::new(move |x| loss::softmax_cross_entropy_sparse(&ctx(), &x[0], &labels).unwrap().0),
            bwd: Box::new(move |x, _, dy| {
                let (_, probs) = loss::softmax_cross_entropy_sparse(&ctx(), &x[0], &l2).unwrap();
                vec![loss::softmax_cross_entropy_sparse_backward(&ctx(), &probs, &l2, dy).unwrap()]
            }),
        },
        Case {
            name: "softmax_cross_entropy dense".into(),
            inputs: vec![rand(&mut rng, &[3, 4])],
            wrt: vec![0],
            fwd: Box::new(move |x| loss::softmax_cross_entropy(&ctx(), &x[0], &targets).unwrap().0),
            bwd: Box::new(move |x, _, dy| {
                let (_, probs) = loss::softmax_cross_entropy(&ctx(), &x[0], &t2).unwrap();
                vec![loss::softmax_cross_entropy_backward(&ctx(), &probs, &t2, dy).unwrap()]
            }),
        },
    ];
    run(cases, &mut rng);
}

#[test]
#[should_panic(expected = "analytic")]
fn the_checker_rejects_a_gradient_that_is_off_by_a_factor() {
    let mut rng = Rng(13);
    let case = Case {
        name: "tanh with a doubled gradient".into(),
        inputs: vec![rand(&mut rng, &[2, 3])],
        wrt: vec![0],
        fwd: Box::new(|x| ew::tanh(&ctx(), &x[0]).unwrap()),
        bwd: Box::new(|_, y, dy| vec![ew::scale(&ctx(), &ew::tanh_backward(&ctx(), y, dy).unwrap(), 2.0).unwrap()]),
    };
    check(&case, &mut rng);
}
