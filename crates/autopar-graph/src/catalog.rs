//! One small, valid graph per op kind, with random shapes: what tests iterate over to check
//! every op (backward against finite differences, executor against hand-computed values) and
//! what the planner's rule checks run on. [`op_cases`] covers [`OpKind::ALL_KINDS`]; a test in
//! this module fails when a new op kind has no case.

use crate::builder::{GraphBuilder, ParamSpec};
use crate::error::Result;
use crate::graph::Graph;
use crate::init::{Initializer, Rng};
use crate::ops::*;
use crate::types::{DType, NodeId};

/// What values an input of a case must hold for the op to be well defined and smooth there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Values {
    /// Standard normal.
    Normal,
    /// In [0.5, 2] (logarithms, square roots, variances, denominators).
    Positive,
    /// Integers in `0..bound` (labels, indices).
    Index(usize),
}

/// A one-op graph: `output = op(inputs...)`.
#[derive(Clone, Debug)]
pub struct OpCase {
    /// The [`OpKind`] variant name (as in [`OpKind::ALL_KINDS`]).
    pub kind: &'static str,
    /// The graph: the leaves, any helper ops that shape their values, and the op under test.
    pub graph: Graph,
    /// The node of the op under test.
    pub output: NodeId,
    /// The leaves feeding the op (inputs, or parameters for the Parameter case) and their values.
    pub leaves: Vec<(NodeId, Values)>,
    /// The leaves whose gradient the op's backward rule defines (a subset of `leaves`).
    pub wrt: Vec<NodeId>,
}

struct Maker {
    b: GraphBuilder,
    rng: Rng,
    dtype: DType,
    leaves: Vec<(NodeId, Values)>,
}

impl Maker {
    fn dim(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.rng.next_u64() % (hi - lo + 1) as u64) as usize
    }

    fn input(&mut self, shape: &[usize], v: Values) -> Result<NodeId> {
        let name = format!("in{}", self.leaves.len());
        let dtype = if let Values::Index(_) = v { DType::I64 } else { self.dtype };
        let id = self.b.input(&name, shape, dtype)?;
        self.leaves.push((id, v));
        Ok(id)
    }

    fn x(&mut self, shape: &[usize]) -> Result<NodeId> {
        self.input(shape, Values::Normal)
    }
}

fn case(kind: &'static str, m: Maker, output: NodeId, wrt: Option<Vec<NodeId>>) -> OpCase {
    let wrt = wrt.unwrap_or_else(|| m.leaves.iter().filter(|(_, v)| !matches!(v, Values::Index(_))).map(|(id, _)| *id).collect());
    OpCase { kind, graph: m.b.finish(), output, leaves: m.leaves, wrt }
}

/// Every op kind applied once to random small shapes of `dtype` (a float type).
pub fn op_cases(dtype: DType, seed: u64) -> Result<Vec<OpCase>> {
    let mut out = Vec::new();
    for &kind in OpKind::ALL_KINDS {
        let mut m = Maker {
            b: GraphBuilder::new(seed),
            rng: Rng::new(seed ^ kind.len() as u64 ^ crate::init::derive_seed(seed, kind)),
            dtype,
            leaves: Vec::new(),
        };
        let (a, b2, c) = (m.dim(2, 4), m.dim(2, 4), m.dim(2, 4));
        let y;
        let mut wrt = None;
        match kind {
            "Input" => y = m.x(&[a, b2])?,
            "Parameter" => {
                y = m.b.parameter_with("p", ParamSpec::new(&[a, b2], Initializer::Normal { mean: 0.0, std: 1.0 }).dtype(dtype))?;
                m.leaves.push((y, Values::Normal));
            }
            "Fill" => y = m.b.fill("op", &[a, b2], dtype, 1.5)?,
            "Cast" => {
                // To the case's own float type, so finite differences stay exact.
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", Cast::to(dtype), &[p])?;
            }
            "Add" | "Sub" | "Mul" => {
                let (p, q) = (m.x(&[a, 1, c])?, m.x(&[b2, 1])?);
                y = m.b.op("op", binary(kind), &[p, q])?;
            }
            "Div" => {
                let p = m.x(&[a, b2])?;
                let q = m.input(&[b2], Values::Positive)?;
                y = m.b.op("op", Div, &[p, q])?;
            }
            "Neg" | "Exp" | "Relu" | "Tanh" | "Sigmoid" => {
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", unary(kind), &[p])?;
            }
            "Gelu" => {
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", Gelu { approximate: true }, &[p])?;
            }
            "Silu" => {
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", Silu, &[p])?;
            }
            "Log" | "Sqrt" => {
                let p = m.input(&[a, b2], Values::Positive)?;
                y = m.b.op("op", unary(kind), &[p])?;
            }
            "Scale" => {
                let p = m.x(&[a, b2])?;
                y = m.b.scale("op", p, -0.75)?;
            }
            "LossScale" => {
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", LossScale { factor: 0.5 }, &[p])?;
            }
            "ReluGrad" => {
                let (d, p) = (m.x(&[a, b2])?, m.input(&[a, b2], Values::Positive)?);
                let r = m.b.relu("relu", p)?;
                let q = m.b.neg("negate_some", r)?;
                let mixed = m.b.concat("mixed", &[r, q], 1)?;
                let d2 = m.b.concat("dy", &[d, d], 1)?;
                y = m.b.op("op", ReluGrad, &[d2, mixed])?;
                wrt = Some(vec![d]);
            }
            "GeluGrad" => {
                let (d, p) = (m.x(&[a, b2])?, m.x(&[a, b2])?);
                y = m.b.op("op", GeluGrad { approximate: true }, &[d, p])?;
                wrt = Some(vec![d]);
            }
            "SiluGrad" => {
                let (d, p) = (m.x(&[a, b2])?, m.x(&[a, b2])?);
                y = m.b.op("op", SiluGrad, &[d, p])?;
                wrt = Some(vec![d]);
            }
            "Softmax" | "LogSoftmax" => {
                let p = m.x(&[a, b2, c])?;
                y = if kind == "Softmax" { m.b.softmax("op", p, 1)? } else { m.b.log_softmax("op", p, -1)? };
            }
            "ReduceSum" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.reduce_sum("op", p, &[0, 2], false)?;
            }
            "ReduceMean" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.reduce_mean("op", p, &[-1], true)?;
            }
            "ReduceMax" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.reduce_max("op", p, &[1], false)?;
            }
            "ReduceMaxGrad" => {
                let p = m.x(&[a, b2, c])?;
                let d = m.x(&[a, c])?;
                y = m.b.op("op", ReduceMaxGrad { axes: vec![1], keep_dims: false }, &[p, d])?;
                wrt = Some(vec![]);
            }
            "Reshape" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.reshape("op", p, &[-1, c as i64])?;
            }
            "Transpose" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.transpose("op", p, &[2, 0, 1])?;
            }
            "Flatten" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.flatten("op", p)?;
            }
            "BroadcastTo" => {
                let p = m.x(&[b2, 1])?;
                y = m.b.op("op", BroadcastTo { shape: vec![a, b2, c] }, &[p])?;
            }
            "SumTo" => {
                let p = m.x(&[a, b2, c])?;
                y = m.b.op("op", SumTo { shape: vec![b2, 1] }, &[p])?;
            }
            "Concat" => {
                let (p, q) = (m.x(&[a, b2])?, m.x(&[a, c])?);
                y = m.b.concat("op", &[p, q], -1)?;
            }
            // Dimension 0 sliced or padded, dimension 1 whole (so that a strategy may split it).
            "Slice" => {
                let p = m.x(&[a + 2, b2])?;
                y = m.b.slice("op", p, &[1, 0], &[a, b2])?;
            }
            "Pad" => {
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", Pad { before: vec![1, 0], after: vec![2, 0] }, &[p])?;
            }
            "Gather" => {
                let p = m.x(&[a + 2, b2])?;
                let i = m.input(&[c, 2], Values::Index(a + 2))?;
                y = m.b.gather("op", p, i, 0)?;
            }
            "GatherGrad" => {
                let i = m.input(&[c], Values::Index(b2))?;
                let d = m.x(&[a, c])?;
                y = m.b.op("op", GatherGrad { axis: 1, dim_size: b2, shard: None }, &[i, d])?;
            }
            "OneHot" => {
                let i = m.input(&[a], Values::Index(b2))?;
                y = m.b.one_hot("op", i, b2, dtype)?;
            }
            "MatMul" => {
                let (p, q) = (m.x(&[b2, a])?, m.x(&[c, b2])?);
                y = m.b.matmul_t("op", p, q, true, true)?;
            }
            "BatchMatMul" => {
                let (p, q) = (m.x(&[2, a, b2])?, m.x(&[2, c, b2])?);
                y = m.b.batch_matmul("op", p, q, false, true)?;
            }
            "BiasAdd" => {
                let (p, q) = (m.x(&[a, b2, c])?, m.x(&[b2])?);
                y = m.b.bias_add("op", p, q)?;
            }
            "Conv2D" | "Conv2DGradInput" | "Conv2DGradFilter" => {
                let conv = ConvAttrs { stride: [2, 1], padding: [1, 0, 1, 1], dilation: [1, 2], groups: 2 };
                let (x_shape, w_shape) = (vec![2, 4, 5 + a, 4 + b2], vec![4, 2, 3, 2]);
                let x = m.x(&x_shape)?;
                let w = m.x(&w_shape)?;
                let conv_y = m.b.conv2d("conv", x, w, conv)?;
                if kind == "Conv2D" {
                    y = conv_y;
                } else {
                    let dy_shape = m.b.graph().node(conv_y).ty.shape.clone();
                    let dy = m.x(&dy_shape)?;
                    y = if kind == "Conv2DGradInput" {
                        m.b.op("op", Conv2DGradInput { conv, input_shape: x_shape }, &[dy, w])?
                    } else {
                        m.b.op("op", Conv2DGradFilter { conv, filter_shape: w_shape }, &[dy, x])?
                    };
                    wrt = Some(if kind == "Conv2DGradInput" { vec![dy, w] } else { vec![dy, x] });
                }
            }
            "MaxPool" | "AvgPool" | "MaxPoolGrad" | "AvgPoolGrad" => {
                let pool = PoolAttrs { kernel: [3, 2], stride: [2, 1], padding: [1, 1, 0, 1] };
                let x_shape = vec![2, b2, 4 + a, 3 + c];
                let x = m.x(&x_shape)?;
                let pooled = if kind.starts_with("Max") { m.b.max_pool("pool", x, pool)? } else { m.b.avg_pool("pool", x, pool)? };
                if !kind.ends_with("Grad") {
                    y = pooled;
                } else {
                    let dy_shape = m.b.graph().node(pooled).ty.shape.clone();
                    let dy = m.x(&dy_shape)?;
                    if kind == "MaxPoolGrad" {
                        y = m.b.op("op", MaxPoolGrad { pool }, &[x, dy])?;
                        wrt = Some(vec![]);
                    } else {
                        y = m.b.op("op", AvgPoolGrad { pool, input_shape: x_shape }, &[dy])?;
                        wrt = Some(vec![dy]);
                    }
                }
            }
            "GlobalAvgPool" => {
                let p = m.x(&[a, b2, c, 3])?;
                y = m.b.global_avg_pool("op", p)?;
            }
            "BatchNorm" | "BatchNormGrad" => {
                let x = m.x(&[a + 1, c, b2, 2])?;
                let gamma = m.x(&[c])?;
                let beta = m.x(&[c])?;
                let mean = m.x(&[c])?;
                let var = m.input(&[c], Values::Positive)?;
                let training = seed.is_multiple_of(2);
                if kind == "BatchNorm" {
                    y = m.b.batch_norm("op", [x, gamma, beta, mean, var], training, 1e-5, 0.9)?;
                    wrt = Some(vec![x, gamma, beta]);
                } else {
                    let dy = m.x(&[a + 1, c, b2, 2])?;
                    y = m.b.op(
                        "op",
                        BatchNormGrad { training, eps: 1e-5, of: NormGradOf::Input, group: Vec::new() },
                        &[dy, x, gamma, mean, var],
                    )?;
                    wrt = Some(vec![]);
                }
            }
            "LayerNorm" | "LayerNormGrad" => {
                let x = m.x(&[a, b2, c])?;
                let gamma = m.x(&[b2, c])?;
                let beta = m.x(&[b2, c])?;
                if kind == "LayerNorm" {
                    y = m.b.layer_norm("op", x, gamma, beta, 1, 1e-5)?;
                    wrt = Some(vec![x, gamma, beta]);
                } else {
                    let dy = m.x(&[a, b2, c])?;
                    y = m.b.op(
                        "op",
                        LayerNormGrad { begin_norm_axis: 1, eps: 1e-5, of: NormGradOf::Gamma, group: Vec::new() },
                        &[dy, x, gamma],
                    )?;
                    let _ = beta;
                    wrt = Some(vec![]);
                }
            }
            "RmsNorm" | "RmsNormGrad" => {
                let x = m.x(&[a, b2, c])?;
                let gamma = m.x(&[b2, c])?;
                if kind == "RmsNorm" {
                    y = m.b.rms_norm("op", x, gamma, 1, 1e-5)?;
                    wrt = Some(vec![x, gamma]);
                } else {
                    let dy = m.x(&[a, b2, c])?;
                    y = m.b.op(
                        "op",
                        RmsNormGrad { begin_norm_axis: 1, eps: 1e-5, of: NormGradOf::Gamma, group: Vec::new() },
                        &[dy, x, gamma],
                    )?;
                    wrt = Some(vec![]);
                }
            }
            "Attention" | "AttentionGrad" => {
                let (t, d, e, g) = (c + 1, b2, 3, 2);
                let q = m.x(&[a, 2, g, t, d])?;
                let k = m.x(&[a, 2, t, d])?;
                let v = m.x(&[a, 2, t, e])?;
                if kind == "Attention" {
                    y = m.b.attention("op", q, k, v, 0.5, seed.is_multiple_of(2))?;
                    wrt = Some(vec![q, k, v]);
                } else {
                    let dy = m.x(&[a, 2, g, t, e])?;
                    y =
                        m.b.op("op", AttentionGrad { scale: 0.5, causal: true, row_offset: 0, of: AttentionGradOf::Key }, &[dy, q, k, v])?;
                    wrt = Some(vec![]);
                }
            }
            "RouterTopK" | "RouterTopKGrad" => {
                let e = c + 2;
                let p = m.input(&[a, b2, e], Values::Positive)?;
                if kind == "RouterTopK" && seed == 2 {
                    // The assignments: no gradient to check.
                    y = m.b.router_top_k_mask("op", p, 2)?;
                    wrt = Some(vec![]);
                } else if kind == "RouterTopK" {
                    // Seed 1: under a capacity of rows / experts: with two choices a row, some dropped.
                    let capacity = (seed == 1).then_some((a * b2).div_ceil(e));
                    y = m.b.router_top_k("op", p, 2, seed.is_multiple_of(2), capacity)?;
                } else {
                    let dy = m.x(&[a, b2, e])?;
                    y = m.b.op("op", RouterTopKGrad { k: 2, renormalize: true, capacity: None }, &[dy, p])?;
                    wrt = Some(vec![]);
                }
            }
            "RotaryEmbedding" => {
                let x = m.x(&[a, b2, c, 4])?;
                y = m.b.rotary_embedding("op", x, 100.0)?;
            }
            "Dropout" => {
                let p = m.x(&[a, b2, 8])?;
                y = m.b.dropout("op", p, 0.3, seed)?;
            }
            "SoftmaxCrossEntropy" => {
                let l = m.x(&[a, b2 + 1])?;
                let t = m.input(&[a], Values::Index(b2 + 1))?;
                y = m.b.softmax_cross_entropy("op", l, t)?;
            }
            "AllReduce" => {
                let p = m.x(&[a, b2])?;
                y = m.b.all_reduce("op", p, ReduceOp::Sum, &[0])?;
            }
            "AllGather" => {
                let p = m.x(&[a, b2])?;
                y = m.b.all_gather("op", p, 1, &[0])?;
            }
            "ReduceScatter" => {
                let p = m.x(&[a, b2])?;
                y = m.b.reduce_scatter("op", p, ReduceOp::Sum, 0, &[0])?;
            }
            "AllToAll" => {
                let p = m.x(&[a, b2])?;
                y = m.b.all_to_all("op", p, 0, 1, &[0])?;
            }
            "Broadcast" => {
                let p = m.x(&[a, b2])?;
                y = m.b.broadcast("op", p, 0, &[0])?;
            }
            "Reduce" => {
                let p = m.x(&[a, b2])?;
                y = m.b.op("op", Reduce { op: ReduceOp::Sum, root: 0, group: vec![0] }, &[p])?;
            }
            "Send" => {
                let p = m.x(&[a, b2])?;
                y = m.b.send("op", p, 0, 7)?;
            }
            "Recv" => {
                let p = m.x(&[a, b2])?;
                y = m.b.recv("op", p, 0, 7)?;
            }
            other => unreachable!("op kind {other} has no catalog case; add one above"),
        }
        out.push(case(kind, m, y, wrt));
    }
    Ok(out)
}

fn binary(kind: &str) -> OpKind {
    match kind {
        "Add" => Add.into(),
        "Sub" => Sub.into(),
        "Mul" => Mul.into(),
        other => unreachable!("{other} is not an element-wise binary op of the catalog"),
    }
}

fn unary(kind: &str) -> OpKind {
    match kind {
        "Neg" => Neg.into(),
        "Exp" => Exp.into(),
        "Relu" => Relu.into(),
        "Tanh" => Tanh.into(),
        "Sigmoid" => Sigmoid.into(),
        "Log" => Log.into(),
        "Sqrt" => Sqrt.into(),
        other => unreachable!("{other} is not an element-wise unary op of the catalog"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_kind_has_a_case_that_builds() {
        for seed in 0..4 {
            let cases = op_cases(DType::F64, seed).unwrap();
            let kinds: Vec<&str> = cases.iter().map(|c| c.kind).collect();
            assert_eq!(kinds, OpKind::ALL_KINDS);
            // Each case's op under test is the op it is named for (a case built from another
            // op would test that one instead).
            for c in &cases {
                assert_eq!(c.graph.node(c.output).op.variant_name(), c.kind, "the case named {} builds another op", c.kind);
            }
        }
    }
}
