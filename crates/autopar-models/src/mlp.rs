//! The multi-layer perceptron of MindSpore's MNIST examples (784-512-512-10 with ReLU),
//! generalised to any layer sizes.
//!
//! Graph: input `x [N, ...input_shape]` (flattened by op `flatten` when it has more than one
//! dimension), then for `k = 1..=L` a dense layer `fck` (`fck.weight [out, in]` applied with
//! MatMul `transpose_b`, `fck.bias [out]`, ops `fck.matmul` and `fck.bias_add`) followed by ReLU
//! `reluk` except after the last; loss `loss` against `labels [N]`.

use autopar_graph::{DType, GraphBuilder, NodeId};

use crate::error::{GraphContext, ModelError, Result};
use crate::layers::{dense, fan_in_uniform};
use crate::{positive, Mode, Model, ModelGraph};

/// Layer sizes of an [`Mlp`].
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    /// Shape of one sample; flattened to `prod(input_shape)` features.
    pub input_shape: Vec<usize>,
    /// Width of each hidden layer.
    pub hidden: Vec<usize>,
    /// Output classes: the width of the last layer (the logits).
    pub num_classes: usize,
}

impl Default for MlpConfig {
    /// 784-512-512-10.
    fn default() -> Self {
        Self { input_shape: vec![784], hidden: vec![512, 512], num_classes: 10 }
    }
}

/// A ReLU multi-layer perceptron. Weights and biases start as `U(-1/sqrt(in), 1/sqrt(in))`
/// (the default of MindSpore's `nn.Dense` and PyTorch's `nn.Linear`).
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    cfg: MlpConfig,
}

impl Mlp {
    /// Checks that the class count, the input size and every hidden width are positive; otherwise `ModelError::BadConfig`.
    pub fn new(cfg: MlpConfig) -> Result<Self> {
        positive("mlp", "num_classes", cfg.num_classes)?;
        let size = cfg.input_shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let Some(size) = size.filter(|&s| s <= isize::MAX as usize) else {
            let value = format!("{:?}", cfg.input_shape);
            return Err(ModelError::BadConfig {
                model: "mlp".into(),
                field: "input shape",
                value,
                expected: "fewer than 2^63 values".into(),
            });
        };
        positive("mlp", "input size", size)?;
        for &h in &cfg.hidden {
            positive("mlp", "hidden width", h)?;
        }
        Ok(Self { cfg })
    }

    /// The configuration this model was built from.
    pub fn config(&self) -> &MlpConfig {
        &self.cfg
    }

    fn build_inner(&self, b: &mut GraphBuilder, batch: usize) -> autopar_graph::Result<(NodeId, NodeId, NodeId, NodeId)> {
        let mut shape = vec![batch];
        shape.extend_from_slice(&self.cfg.input_shape);
        let x = b.input("x", &shape, DType::F32)?;
        let labels = b.input("labels", &[batch], DType::I64)?;
        let mut h = if self.cfg.input_shape.len() == 1 { x } else { b.flatten("flatten", x)? };
        let widths: Vec<usize> = self.cfg.hidden.iter().copied().chain([self.cfg.num_classes]).collect();
        for (i, &out) in widths.iter().enumerate() {
            let k = i + 1;
            let fan_in = *b.graph().node(h).ty.shape.last().expect("rank 2");
            h = dense(b, &format!("fc{k}"), h, out, fan_in_uniform(fan_in), Some(fan_in_uniform(fan_in)))?;
            if k < widths.len() {
                h = b.relu(&format!("relu{k}"), h)?;
            }
        }
        let loss = b.softmax_cross_entropy("loss", h, labels)?;
        b.output(loss)?;
        b.output(h)?;
        Ok((x, labels, h, loss))
    }
}

impl Model for Mlp {
    fn name(&self) -> &str {
        "mlp"
    }
    fn input_shape(&self) -> Vec<usize> {
        self.cfg.input_shape.clone()
    }
    fn num_classes(&self) -> usize {
        self.cfg.num_classes
    }
    fn describe(&self) -> String {
        let sizes: Vec<String> = [self.cfg.input_shape.iter().product::<usize>()]
            .into_iter()
            .chain(self.cfg.hidden.iter().copied())
            .chain([self.cfg.num_classes])
            .map(|n| n.to_string())
            .collect();
        format!("mlp ({}, ReLU)", sizes.join("-"))
    }
    fn build(&self, b: &mut GraphBuilder, batch: usize, _mode: Mode) -> Result<ModelGraph> {
        positive("mlp", "batch size", batch)?;
        let start = b.graph().len();
        let (x, labels, logits, loss) = self.build_inner(b, batch).model("mlp")?;
        Ok(ModelGraph::collect("mlp", b, start, _mode, [x, labels, logits, loss]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_graph::{Initializer, OpKind};

    #[test]
    fn the_reference_mlp_has_dense_weights_out_by_in_and_535818_parameters() {
        let m = Mlp::new(MlpConfig::default()).unwrap();
        let (g, mg) = m.build_graph(64, Mode::Train, 0).unwrap();
        let shapes: Vec<(String, Vec<usize>)> = mg.params.iter().map(|(n, &id)| (n.clone(), g.node(id).ty.shape.clone())).collect();
        let expected = [
            ("fc1.bias", vec![512]),
            ("fc1.weight", vec![512, 784]),
            ("fc2.bias", vec![512]),
            ("fc2.weight", vec![512, 512]),
            ("fc3.bias", vec![10]),
            ("fc3.weight", vec![10, 512]),
        ];
        assert_eq!(shapes, expected.iter().map(|(n, s)| (n.to_string(), s.clone())).collect::<Vec<_>>());
        let count = mg.parameter_count(&g);
        assert_eq!((count.trainable, count.frozen), (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10, 0));
        assert_eq!(g.node(mg.logits).ty.shape, vec![64, 10]);
        assert!(matches!(&g.node(mg.ops["fc1.matmul"]).op, OpKind::MatMul(mm) if mm.transpose_b && !mm.transpose_a));
        assert_eq!(g.node(mg.ops["relu2"]).ty.shape, vec![64, 512]);
        assert!(!mg.ops.contains_key("relu3"), "no activation after the last layer");
        let OpKind::Parameter(p) = &g.node(mg.params["fc2.weight"]).op else { panic!("a parameter") };
        let a = 1.0 / 512f64.sqrt();
        assert_eq!(p.init, Initializer::Uniform { low: -a, high: a });
    }

    #[test]
    fn image_shaped_inputs_are_flattened_and_any_batch_size_builds() {
        let m = Mlp::new(MlpConfig { input_shape: vec![1, 28, 28], hidden: vec![16], num_classes: 3 }).unwrap();
        for batch in [1, 3, 17] {
            let (g, mg) = m.build_graph(batch, Mode::Eval, 0).unwrap();
            assert_eq!(g.node(mg.x).ty.shape, vec![batch, 1, 28, 28]);
            assert_eq!(g.node(mg.ops["flatten"]).ty.shape, vec![batch, 784]);
            assert_eq!(g.node(mg.logits).ty.shape, vec![batch, 3]);
            assert!(g.node(mg.loss).ty.shape.is_empty());
        }
    }

    #[test]
    fn zero_sizes_are_rejected_with_the_field_named() {
        let err = Mlp::new(MlpConfig { hidden: vec![8, 0], ..Default::default() }).unwrap_err();
        assert_eq!(err.to_string(), "model mlp: hidden width = 0 is invalid; expected a positive number");
        let m = Mlp::new(MlpConfig::default()).unwrap();
        let err = m.build_graph(0, Mode::Train, 0).unwrap_err();
        assert!(err.to_string().contains("batch size = 0"), "{err}");
    }

    #[test]
    fn the_model_can_be_added_to_a_builder_that_already_holds_other_nodes() {
        let mut b = GraphBuilder::new(3);
        b.input("other", &[2], DType::F32).unwrap();
        let m = Mlp::new(MlpConfig { input_shape: vec![4], hidden: vec![], num_classes: 2 }).unwrap();
        let mg = m.build(&mut b, 5, Mode::Train).unwrap();
        assert_eq!(mg.params.len(), 2);
        assert!(!mg.ops.contains_key("other"));
        let err = m.build(&mut b, 5, Mode::Train).unwrap_err();
        assert!(err.to_string().starts_with("model mlp: an op named \"x\" already exists"), "{err}");
    }
}
