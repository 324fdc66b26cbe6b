//! MindSpore's cost model in its own units, the one dynamic_programming prices strategies with
//! by default: every figure is bytes of the slices an op reads and sends
//! (`operator_costmodel.cc`), and of the slices a redistribution moves
//! (`tensor_redistribution.cc::ComputeCost`), weighted `α · computation + β · communication`
//! (α 1, β 400, γ 0.001 unless the context sets `costmodel_alpha/beta/gamma`).
//!
//! * An op's **computation** is its forward pass only: MatMul `|A| + |B|` (plus `|C|` when its
//!   contraction is split), element-wise binary ops `|in0| + |in1|`, unary ops and casts `|in0|`,
//!   softmax `|out|`, reductions `|in| + |out|` (twice `|out|` for a mean) when a reduced
//!   dimension is split, dropout `1.125 |in|`, the norms and convolutions all their inputs.
//! * Its **forward communication** is the all-reduce completing a split contraction or
//!   reduction: `|out|`.
//! * Its **backward communication** is, for each trainable parameter it reads directly in the
//!   inputs its class counts (MatMul: the second; element-wise: both; ...), that parameter's
//!   slice when the parameter's strategy does not use every device (the gradient's all-reduce).
//! * Then MindSpore's tie-break (a strategy splitting input 0's first dimension over every
//!   device takes 1 off each figure above 1) and its latency refinement: a positive forward
//!   communication of at most 2048 becomes 3072, a larger one gains 1024. The op's share of
//!   the objective is `α · computation + β · (forward + γ · backward)` in training, `α ·
//!   computation + β · forward` in inference.
//! * A **redistribution** between a producer's output and a consumer's input costs, with `p`
//!   the producer's slice elements: a slice `p` computation; an all-gather over `k` ranks `p k /
//!   2` forward and `p / 2` backward communication, and `p` computation (`p + 2 k p` along a
//!   dimension other than the first); an all-to-all `2 p` each way. A change of device
//!   arrangement or a size-1 dimension adds MindSpore's reshape, `2 p` computation. Forward and
//!   backward are refined separately; everything is times the element size.
//!
//! Where this differs from MindSpore: a redistribution's steps are autopar's (the same kinds,
//! in the order its planner finds them), and the reshape MindSpore inserts when it unifies two
//! device arrangements is assumed whenever they differ.

use autopar_layout::{RedistributionPlan, Step, TensorLayout};

/// MindSpore's default `costmodel_alpha` (computation's weight).
pub const ALPHA: f64 = 1.0;
/// MindSpore's default `costmodel_beta` (communication's weight, every target but GPU).
pub const BETA: f64 = 400.0;
/// MindSpore's default `costmodel_gamma` (the weight of a parameter's gradient all-reduce
/// within communication).
pub const GAMMA: f64 = 0.001;
/// `costmodel_communi_threshold`, `costmodel_communi_const`, `costmodel_communi_bias`.
const THRESHOLD: f64 = 2048.0;
const CONST: f64 = 3072.0;
const BIAS: f64 = 1024.0;
const EPS: f64 = 1e-6;

/// The objective's weights `(α, β, γ)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weights {
    /// Computation's weight.
    pub alpha: f64,
    /// Communication's weight.
    pub beta: f64,
    /// A parameter gradient's all-reduce, within communication.
    pub gamma: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights { alpha: ALPHA, beta: BETA, gamma: GAMMA }
    }
}

/// Which inputs' parameters an op's cost class charges a gradient all-reduce for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradientInputs {
    /// None (SoftmaxCrossEntropyWithLogits, OneHot, Dropout).
    None,
    /// The first input (unary ops, softmax, reductions).
    First,
    /// The second input (MatMul's B).
    Second,
    /// Every input (element-wise binary ops, norms, convolutions, Gather).
    All,
}

impl GradientInputs {
    /// Whether input `slot` counts.
    pub fn counts(self, slot: usize) -> bool {
        match self {
            GradientInputs::None => false,
            GradientInputs::First => slot == 0,
            GradientInputs::Second => slot == 1,
            GradientInputs::All => true,
        }
    }
}

/// An op's forward computation and forward communication (bytes) under one strategy, by
/// MindSpore's cost class for its kind: `inputs` and `output` are slice bytes, `split` says
/// whether the strategy splits a contracted or reduced dimension (the output is a partial sum).
pub fn op_bytes(kind: &str, inputs: &[f64], output: f64, split: bool) -> (f64, f64) {
    let first = inputs.first().copied().unwrap_or(0.0);
    let all: f64 = inputs.iter().sum();
    let completed = if split { output } else { 0.0 };
    match kind {
        "MatMul" | "BatchMatMul" => (first + inputs.get(1).copied().unwrap_or(0.0) + completed, completed),
        "Softmax" | "LogSoftmax" | "BroadcastTo" => (output, 0.0),
        "ReduceSum" | "ReduceMax" => (first + completed, completed),
        "ReduceMean" => (first + 2.0 * completed, completed),
        "SoftmaxCrossEntropyWithLogits" => (first + inputs.get(1).copied().unwrap_or(0.0), 0.0),
        "OneHot" => (first, 0.0),
        "Dropout" => (1.125 * first, 0.0),
        "Add" | "Sub" | "Mul" | "Div" | "BiasAdd" | "LayerNorm" | "RmsNorm" | "BatchNorm" | "Conv2D" | "Gather" | "Attention" => {
            (all, completed)
        }
        // Unary ops, casts, transposes, slices, pooling: MindSpore's CastCost family.
        _ => (first, completed),
    }
}

/// The inputs whose parameters kind's cost class charges a gradient all-reduce for.
pub fn gradient_inputs(kind: &str) -> GradientInputs {
    match kind {
        "MatMul" | "BatchMatMul" => GradientInputs::Second,
        "SoftmaxCrossEntropyWithLogits" | "OneHot" | "Dropout" => GradientInputs::None,
        "Add" | "Sub" | "Mul" | "Div" | "BiasAdd" | "LayerNorm" | "RmsNorm" | "BatchNorm" | "Conv2D" | "Gather" | "Attention" => {
            GradientInputs::All
        }
        _ => GradientInputs::First,
    }
}

/// MindSpore's latency refinement of a communication figure: at most the threshold becomes
/// the constant, more gains the bias; nothing stays nothing.
pub fn refine(f: f64) -> f64 {
    if f <= EPS {
        f
    } else if f <= THRESHOLD {
        CONST
    } else {
        f + BIAS
    }
}

/// An op's cost under one strategy as the objective sees it, `(computation, communication)`:
/// forward computation, forward and backward communication (bytes) through MindSpore's
/// tie-break for data parallelism (`first_split_all`: the strategy splits input 0's first
/// dimension over every device) and its refinement; communication is `forward + γ · backward`
/// in training, the forward alone in inference.
pub fn op_cost(computation: f64, forward: f64, backward: f64, first_split_all: bool, gamma: f64, training: bool) -> (f64, f64) {
    let mut comp = computation;
    let mut comm = forward + backward;
    let mut without = forward;
    let mut partial = forward + gamma * backward;
    if first_split_all {
        for x in [&mut comp, &mut comm, &mut without, &mut partial] {
            if *x > 1.0 {
                *x -= 1.0;
            }
        }
    }
    let b = if (comm - without).abs() <= EPS { 0.0 } else { comm - without };
    without = refine(without);
    if partial > EPS {
        partial = without + gamma * b;
    }
    (comp, if training { partial } else { without })
}

/// A redistribution's `(computation, forward, backward)` bytes: `plan`'s steps from `src`
/// (whose slice sets `p`) at `elem` bytes an element, with MindSpore's reshape where the
/// device arrangements differ or the tensor has a size-1 dimension; forward and backward
/// refined.
pub fn redistribution_bytes(src: &TensorLayout, dst: &TensorLayout, plan: &RedistributionPlan, elem: usize) -> (f64, f64, f64) {
    let p = src.slice_len() as f64;
    let (mut comp, mut fwd, mut bwd) = (0.0, 0.0, 0.0);
    let gathered = |dim: usize, k: f64| if dim == 0 { p } else { p + 2.0 * k * p };
    for s in &plan.steps {
        match &s.step {
            Step::Slice { .. } => comp += p,
            Step::AllGather { dim, axis } => {
                let k = axis.size as f64;
                fwd += 0.5 * p * k;
                bwd += 0.5 * p;
                comp += gathered(*dim, k);
            }
            Step::AllToAll { concat_dim, axis, .. } => {
                fwd += 2.0 * p;
                bwd += 2.0 * p;
                comp += gathered(*concat_dim, axis.size as f64);
            }
            Step::Permute { .. } if s.step.is_communication() => {
                fwd += 2.0 * p;
                bwd += 2.0 * p;
                comp += p;
            }
            Step::AllReduce { .. } | Step::ReduceScatter { .. } => {
                fwd += p;
                bwd += p;
            }
            Step::Permute { .. } | Step::MakePartial { .. } => {}
        }
    }
    if !plan.steps.is_empty() && (src.mesh().dims() != dst.mesh().dims() || src.shape().contains(&1)) {
        comp += 2.0 * p;
    }
    let e = elem as f64;
    (comp * e, refine(fwd * e), refine(bwd * e))
}

/// The objective's share of a redistribution's bytes: `α · computation + β · (forward +
/// backward)` in training, the forward alone in inference.
pub fn redistribution_cost((comp, fwd, bwd): (f64, f64, f64), w: Weights, training: bool) -> f64 {
    w.alpha * comp + w.beta * if training { fwd + bwd } else { fwd }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_layout::{plan_with, DeviceMatrix};
    use proptest::prelude::*;

    #[test]
    fn refinement_models_latency() {
        assert_eq!(refine(0.0), 0.0);
        assert_eq!(refine(1.0), 3072.0);
        assert_eq!(refine(2048.0), 3072.0);
        assert_eq!(refine(4096.0), 5120.0);
    }

    /// A MatMul [32, 64] x [64, 16] on 8 devices, f32: data parallel `((8,1),(1,1))` against
    /// the contraction split `((1,8),(8,1))`, B a parameter.
    #[test]
    fn a_matmul_costs_as_mindspores_formulas() {
        // Data parallel: A's slice 4x64, B whole 64x16, output 4x16; B's gradient all-reduced.
        let (comp, fwd) = op_bytes("MatMul", &[4.0 * 64.0 * 4.0, 64.0 * 16.0 * 4.0], 4.0 * 16.0 * 4.0, false);
        assert_eq!((comp, fwd), (1024.0 + 4096.0, 0.0));
        let (c, m) = op_cost(comp, fwd, 4096.0, true, GAMMA, true);
        assert_eq!(c, 5119.0);
        assert!((m - GAMMA * 4095.0).abs() < 1e-9, "{m}");
        // The contraction split: the output all-reduced (refined), B split over every device.
        let (comp, fwd) = op_bytes("MatMul", &[32.0 * 8.0 * 4.0, 8.0 * 16.0 * 4.0], 32.0 * 16.0 * 4.0, true);
        assert_eq!((comp, fwd), (1024.0 + 512.0 + 2048.0, 2048.0));
        assert_eq!(op_cost(comp, fwd, 0.0, false, GAMMA, true), (3584.0, 3072.0));
        // Inference drops the gradient's share.
        assert_eq!(op_cost(5120.0, 0.0, 4096.0, false, GAMMA, false), (5120.0, 0.0));
    }

    #[test]
    fn each_class_charges_its_inputs_gradients() {
        assert!(gradient_inputs("MatMul").counts(1) && !gradient_inputs("MatMul").counts(0));
        assert!(gradient_inputs("Add").counts(0) && gradient_inputs("Add").counts(1));
        assert!(gradient_inputs("ReLU").counts(0) && !gradient_inputs("ReLU").counts(1));
        assert!(!gradient_inputs("SoftmaxCrossEntropyWithLogits").counts(0));
    }

    /// [64, 32] split by rows over 8 devices, gathered whole: one all-gather of 8 along the
    /// first dimension, 256 elements a slice.
    #[test]
    fn an_all_gather_costs_as_mindspores_concat() {
        let mesh = DeviceMatrix::new(vec![8]).unwrap();
        let src = TensorLayout::new(mesh.clone(), vec![vec![0], vec![]], vec![64, 32]).unwrap();
        let dst = TensorLayout::replicated(mesh, vec![64, 32]);
        let plan = plan_with(&src, &dst, false).unwrap();
        let (comp, fwd, bwd) = redistribution_bytes(&src, &dst, &plan, 4);
        assert_eq!(comp, 256.0 * 4.0);
        assert_eq!(fwd, refine(0.5 * 256.0 * 8.0 * 4.0));
        assert_eq!(bwd, refine(0.5 * 256.0 * 4.0));
        assert_eq!(redistribution_cost((comp, fwd, bwd), Weights::default(), true), comp + BETA * (fwd + bwd));
        // Slicing a whole tensor moves nothing.
        let back = plan_with(&dst, &src, false).unwrap();
        assert_eq!(redistribution_bytes(&dst, &src, &back, 4), (64.0 * 32.0 * 4.0, 0.0, 0.0));
    }

    proptest! {
        /// The tie-break never raises a cost: it takes exactly 1 off a computation above 1,
        /// and at most 1 off the communication of a forward figure above the threshold (where
        /// the refinement is linear).
        #[test]
        fn the_tie_break_only_lowers_costs(comp in 0.0f64..1e7, fwd in 0.0f64..1e7, bwd in 0.0f64..1e7) {
            let (c0, m0) = op_cost(comp, fwd, bwd, false, GAMMA, true);
            let (c1, m1) = op_cost(comp, fwd, bwd, true, GAMMA, true);
            prop_assert_eq!(c0 - c1, if comp > 1.0 { 1.0 } else { 0.0 });
            prop_assert!(m1 <= m0 + 1e-9, "{} > {}", m1, m0);
            if fwd > THRESHOLD + 1.0 {
                prop_assert!(m0 - m1 <= 1.0 + 1e-6, "{} - {}", m0, m1);
            }
        }
    }

    /// MindSpore's order: the tie-break first, then the refinement, so a forward figure the
    /// tie-break takes to nothing is not raised to the constant.
    #[test]
    fn the_tie_break_comes_before_the_refinement() {
        assert_eq!(op_cost(10.0, 1.0 + 5e-7, 0.0, false, GAMMA, true).1, CONST);
        assert!(op_cost(10.0, 1.0 + 5e-7, 0.0, true, GAMMA, true).1 < 1e-6);
    }
}
