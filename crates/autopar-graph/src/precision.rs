//! The precision policy (MindSpore's `amp_level`, PyTorch's autocast): one graph pass that
//! decides which ops run in half precision and inserts the casts between them.
//!
//! | level | low precision (bf16 or f16) | float32 |
//! |---|---|---|
//! | O0 | nothing | everything |
//! | O1 | MatMul, BatchMatMul, Conv2D, ReLU (MindSpore's white list) | the rest |
//! | O2 | every op but those on the right | normalisations, softmax, losses, reductions, exp/log/sqrt |
//! | O3 | every op (the loss's result cast to float32) | nothing |
//!
//! Parameters stay float32 (the master weights the optimizer updates); a low-precision op reads
//! a cast of them, whose gradient is cast back, so the gradients and their synchronisation are
//! float32 too. Ops that only move values (reshapes, transposes, slices, gathers, dropout,
//! communication) run in whatever precision their input has. Under O2 and O3 a network output
//! or loss left in low precision is cast to float32 (MindSpore's `_OutputTo32`). Every cast the
//! pass inserts is a [`Cast`] with `inserted` set: it takes its input's layout, so a parameter
//! keeps the layout its consumer needs and a cast never moves data between devices.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{GraphError, Result};
use crate::graph::{Graph, Recompute};
use crate::ops::{Cast, OpKind};
use crate::types::{DType, NodeId};

/// MindSpore's `amp_level`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AmpLevel {
    /// Everything in float32.
    #[default]
    O0,
    /// The matrix products, convolutions and ReLU in low precision.
    O1,
    /// Everything in low precision but normalisations, softmax, losses and reductions.
    O2,
    /// Everything in low precision (the loss cast to float32).
    O3,
}

impl fmt::Display for AmpLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AmpLevel::O0 => "O0",
            AmpLevel::O1 => "O1",
            AmpLevel::O2 => "O2",
            AmpLevel::O3 => "O3",
        })
    }
}

impl FromStr for AmpLevel {
    type Err = GraphError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "O0" => Ok(AmpLevel::O0),
            "O1" => Ok(AmpLevel::O1),
            "O2" => Ok(AmpLevel::O2),
            "O3" => Ok(AmpLevel::O3),
            _ => Err(GraphError::BadPrecision { what: "amp level", given: s.to_string(), expected: "O0, O1, O2 or O3" }),
        }
    }
}

/// A precision policy: the level and the low-precision type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Precision {
    /// Which ops run in low precision.
    pub level: AmpLevel,
    /// The low-precision type: bf16 (the default) or f16.
    pub dtype: DType,
}

impl Default for Precision {
    fn default() -> Self {
        Self { level: AmpLevel::O0, dtype: DType::BF16 }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.level {
            AmpLevel::O0 => write!(f, "O0 (float32)"),
            level => write!(f, "{level} ({})", self.dtype),
        }
    }
}

impl Precision {
    /// The policy of `level` in `dtype`; `dtype` must be bf16 or f16.
    pub fn new(level: AmpLevel, dtype: DType) -> Result<Self> {
        if !dtype.is_half() {
            return Err(GraphError::BadPrecision { what: "amp dtype", given: dtype.to_string(), expected: "bf16 or f16" });
        }
        Ok(Self { level, dtype })
    }

    /// Whether the policy changes anything.
    pub fn is_mixed(&self) -> bool {
        self.level != AmpLevel::O0
    }
}

/// The low-precision type by name: `bf16` / `bfloat16` or `f16` / `float16`.
pub fn half_dtype(name: &str) -> Result<DType> {
    match name.trim().to_ascii_lowercase().as_str() {
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "fp16" | "float16" => Ok(DType::F16),
        _ => Err(GraphError::BadPrecision { what: "amp dtype", given: name.to_string(), expected: "bf16 or f16" }),
    }
}

/// How an op takes the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// No float inputs to cast (inputs, parameters, constants, explicit casts).
    Source,
    /// Runs in its input's precision (moves values, or communicates them).
    Moves,
    /// Low precision from O1 (MindSpore's white list).
    White,
    /// Float32 up to O2 (normalisations, softmax, losses, reductions, exp/log/sqrt).
    Black,
    /// Low precision from O2.
    Other,
}

/// Every op's class: a new op without one does not compile.
fn class(op: &OpKind) -> Class {
    use OpKind as K;
    match op {
        K::Input(_) | K::Parameter(_) | K::Fill(_) | K::Cast(_) | K::OneHot(_) => Class::Source,
        K::Reshape(_)
        | K::Transpose(_)
        | K::Flatten(_)
        | K::BroadcastTo(_)
        | K::SumTo(_)
        | K::Concat(_)
        | K::Slice(_)
        | K::Pad(_)
        | K::Gather(_)
        | K::GatherGrad(_)
        | K::Dropout(_)
        | K::RotaryEmbedding(_)
        | K::MaxPool(_)
        | K::MaxPoolGrad(_)
        | K::AllReduce(_)
        | K::AllGather(_)
        | K::ReduceScatter(_)
        | K::AllToAll(_)
        | K::Broadcast(_)
        | K::Reduce(_)
        | K::Send(_)
        | K::Recv(_) => Class::Moves,
        K::MatMul(_)
        | K::BatchMatMul(_)
        | K::Attention(_)
        | K::AttentionGrad(_)
        | K::Conv2D(_)
        | K::Conv2DGradInput(_)
        | K::Conv2DGradFilter(_)
        | K::Relu(_)
        | K::ReluGrad(_) => Class::White,
        K::BatchNorm(_)
        | K::BatchNormGrad(_)
        | K::LayerNorm(_)
        | K::LayerNormGrad(_)
        | K::RmsNorm(_)
        | K::RmsNormGrad(_)
        | K::RouterTopK(_)
        | K::RouterTopKGrad(_)
        | K::Softmax(_)
        | K::LogSoftmax(_)
        | K::SoftmaxCrossEntropy(_)
        | K::ReduceSum(_)
        | K::ReduceMean(_)
        | K::ReduceMax(_)
        | K::ReduceMaxGrad(_)
        | K::Exp(_)
        | K::Log(_)
        | K::Sqrt(_)
        | K::LossScale(_) => Class::Black,
        K::Add(_)
        | K::Sub(_)
        | K::Mul(_)
        | K::Div(_)
        | K::Neg(_)
        | K::Scale(_)
        | K::Gelu(_)
        | K::GeluGrad(_)
        | K::Silu(_)
        | K::SiluGrad(_)
        | K::Tanh(_)
        | K::Sigmoid(_)
        | K::BiasAdd(_)
        | K::AvgPool(_)
        | K::AvgPoolGrad(_)
        | K::GlobalAvgPool(_) => Class::Other,
    }
}

/// The precision an op of `class` computes in under `p` (None: its inputs' own).
fn compute_dtype(class: Class, p: &Precision) -> Option<DType> {
    let low = Some(p.dtype);
    match (class, p.level) {
        (Class::Source | Class::Moves, _) => None,
        (_, AmpLevel::O0) => None,
        (Class::White, _) => low,
        (_, AmpLevel::O1) | (Class::Black, AmpLevel::O2) => Some(DType::F32),
        (Class::Black | Class::Other, AmpLevel::O3) | (Class::Other, AmpLevel::O2) => low,
    }
}

/// A graph under a precision policy, and where the old graph's nodes went.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The graph with its casts.
    pub graph: Graph,
    /// The loss (cast to float32 when it was left in low precision), if one was given.
    pub loss: Option<NodeId>,
    /// Each node of the old graph: its node in the new one.
    pub map: Vec<NodeId>,
    /// How many casts were inserted.
    pub casts: usize,
}

/// Applies `policy` to `graph` (whose loss is `loss`): the ops of the policy's low precision
/// read their float inputs cast to it, the others theirs cast to float32; the loss and the
/// outputs end in float32. O0 returns the graph unchanged.
pub fn apply(graph: &Graph, policy: &Precision, loss: Option<NodeId>) -> Result<Applied> {
    let mut g = Graph::new();
    g.blocks = graph.blocks.clone();
    let mut map: Vec<NodeId> = Vec::with_capacity(graph.len());
    // One cast per (value, type, stage), shared by the readers of a stage.
    let mut casts: HashMap<(NodeId, DType, Option<usize>), NodeId> = HashMap::new();
    let mut count = 0;
    // A cast read by a recomputed op is recomputed with it (else the backward pass would keep
    // the cast value the recomputation drops).
    let mut cast = |g: &mut Graph, x: NodeId, to: DType, reader: (Option<usize>, Recompute), count: &mut usize| -> Result<NodeId> {
        let (stage, recompute) = reader;
        let from = g.node(x).ty.dtype;
        if from == to || !from.is_float() {
            return Ok(x);
        }
        if let Some(&c) = casts.get(&(x, to, stage)) {
            if recompute == Recompute::Marked {
                g.node_mut(c).recompute = Recompute::Marked;
            }
            return Ok(c);
        }
        // A name neither graph has: the network's later ops keep theirs.
        let base = format!("{}.to_{to}", g.node(x).name);
        let name = (0..)
            .map(|k| if k == 0 { base.clone() } else { format!("{base}_{k}") })
            .find(|n| g.find(n).is_err() && graph.find(n).is_err())
            .expect("an unused name exists");
        let c = g.add(&name, Cast { dtype: to, inserted: true }, &[x])?;
        g.node_mut(c).pipeline_stage = stage;
        if recompute == Recompute::Marked {
            g.node_mut(c).recompute = Recompute::Marked;
        }
        casts.insert((x, to, stage), c);
        *count += 1;
        Ok(c)
    };
    for node in graph.nodes() {
        let mut inputs: Vec<NodeId> = node.inputs.iter().map(|x| map[x.0]).collect();
        let class = class(&node.op);
        let target = match (compute_dtype(class, policy), &node.op) {
            (target @ Some(_), _) => target,
            // A concatenation's inputs agree: the first float input's type.
            (None, OpKind::Concat(_)) => inputs.iter().map(|x| g.node(*x).ty.dtype).find(|d| d.is_float()),
            (None, _) => None,
        };
        if let Some(to) = target {
            for x in inputs.iter_mut() {
                *x = cast(&mut g, *x, to, (node.pipeline_stage, node.recompute), &mut count)?;
            }
        }
        // The op's own type follows its inputs' (an attribute keeps its own: Fill, OneHot).
        let id = g.add(&node.name, node.op.clone(), &inputs)?;
        let n = g.node_mut(id);
        n.strategy = node.strategy.clone();
        n.layout = node.layout.clone();
        n.pipeline_stage = node.pipeline_stage;
        n.recompute = node.recompute;
        map.push(id);
    }
    let mut to_f32 = |g: &mut Graph, old: NodeId, count: &mut usize| -> Result<NodeId> {
        let x = map[old.0];
        match policy.level {
            // No stage of its own: the cast takes its producer's piece.
            AmpLevel::O2 | AmpLevel::O3 => cast(g, x, DType::F32, (None, Recompute::Keep), count),
            _ => Ok(x),
        }
    };
    g.outputs = Vec::with_capacity(graph.outputs.len());
    for &o in &graph.outputs {
        let x = to_f32(&mut g, o, &mut count)?;
        g.outputs.push(x);
    }
    let loss = match loss {
        Some(l) => Some(to_f32(&mut g, l, &mut count)?),
        None => None,
    };
    Ok(Applied { graph: g, loss, map, casts: count })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GraphBuilder, Initializer};

    /// x -> dense -> gelu -> layer norm -> dense -> softmax cross-entropy.
    fn net() -> (Graph, NodeId) {
        let mut b = GraphBuilder::new(1);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let y = b.input("y", &[4], DType::I64).unwrap();
        let w1 = b.parameter("w1", &[8, 16], Initializer::XavierUniform { gain: 1.0 }).unwrap();
        let h = b.matmul("mm1", x, w1).unwrap();
        let h = b.gelu("act", h).unwrap();
        let g = b.parameter("ln.gamma", &[16], Initializer::Ones).unwrap();
        let be = b.parameter("ln.beta", &[16], Initializer::Zeros).unwrap();
        let h = b.layer_norm("ln", h, g, be, -1, 1e-5).unwrap();
        let w2 = b.parameter("w2", &[16, 4], Initializer::XavierUniform { gain: 1.0 }).unwrap();
        let logits = b.matmul("mm2", h, w2).unwrap();
        let loss = b.op("loss", crate::ops::SoftmaxCrossEntropy, &[logits, y]).unwrap();
        b.output(logits).unwrap();
        (b.finish(), loss)
    }

    fn dtype_of(a: &Applied, name: &str) -> DType {
        a.graph.node(a.graph.find(name).unwrap()).ty.dtype
    }

    #[test]
    fn each_level_runs_its_ops_in_its_precision() {
        let (graph, loss) = net();
        let o0 = apply(&graph, &Precision::default(), Some(loss)).unwrap();
        assert_eq!((o0.casts, o0.graph.len()), (0, graph.len()));
        let bf = DType::BF16;
        let o1 = apply(&graph, &Precision::new(AmpLevel::O1, bf).unwrap(), Some(loss)).unwrap();
        assert_eq!(
            [dtype_of(&o1, "mm1"), dtype_of(&o1, "act"), dtype_of(&o1, "ln"), dtype_of(&o1, "mm2")],
            [bf, DType::F32, DType::F32, bf]
        );
        let o2 = apply(&graph, &Precision::new(AmpLevel::O2, DType::F16).unwrap(), Some(loss)).unwrap();
        let f16 = DType::F16;
        assert_eq!([dtype_of(&o2, "mm1"), dtype_of(&o2, "act"), dtype_of(&o2, "ln"), dtype_of(&o2, "mm2")], [f16, f16, DType::F32, f16]);
        // The loss reads its logits in f32; the output logits end in f32; parameters stay f32.
        assert_eq!(dtype_of(&o2, "loss"), DType::F32);
        assert_eq!(o2.graph.node(o2.graph.outputs[0]).ty.dtype, DType::F32);
        assert_eq!(dtype_of(&o2, "w1"), DType::F32);
        assert_eq!(o2.graph.node(o2.loss.unwrap()).name, "loss");
        let o3 = apply(&graph, &Precision::new(AmpLevel::O3, bf).unwrap(), Some(loss)).unwrap();
        assert_eq!(dtype_of(&o3, "ln"), bf);
        let l = o3.graph.node(o3.loss.unwrap());
        assert_eq!((l.ty.dtype, l.name.as_str()), (DType::F32, "loss.to_f32"), "the loss is cast to f32");
        // Every inserted cast is marked as the policy's; the names of the network's ops stay.
        for a in [&o1, &o2, &o3] {
            let inserted = a.graph.nodes().iter().filter(|n| n.op.is_inserted_cast()).count();
            assert_eq!(inserted, a.casts);
            assert!(a.casts > 0);
            for (old, new) in graph.nodes().iter().zip(&a.map) {
                assert_eq!(old.name, a.graph.node(*new).name);
            }
        }
    }

    #[test]
    fn a_value_read_by_several_ops_is_cast_once() {
        let mut b = GraphBuilder::new(1);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let w = b.parameter("w", &[8, 8], Initializer::Ones).unwrap();
        let a = b.matmul("a", x, w).unwrap();
        let c = b.matmul("c", a, w).unwrap();
        b.output(c).unwrap();
        let graph = b.finish();
        let o1 = apply(&graph, &Precision::new(AmpLevel::O1, DType::BF16).unwrap(), None).unwrap();
        // x and w cast once each; a already bf16.
        assert_eq!(o1.casts, 2);
    }

    #[test]
    fn bad_names_are_refused() {
        assert_eq!("o2".parse::<AmpLevel>().unwrap(), AmpLevel::O2);
        assert!(AmpLevel::from_str("O4").unwrap_err().to_string().contains("O0, O1, O2 or O3"));
        assert_eq!(half_dtype("bfloat16").unwrap(), DType::BF16);
        assert!(half_dtype("f32").unwrap_err().to_string().contains("bf16 or f16"));
        assert!(Precision::new(AmpLevel::O2, DType::F32).is_err());
    }
}
