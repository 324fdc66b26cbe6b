//! ResNet-18/34 (basic blocks) and ResNet-50 (bottleneck blocks, stride on the 3x3 convolution as
//! in MindSpore's model zoo and torchvision), with a CIFAR stem (3x3 convolution, no pooling) or
//! an ImageNet stem (7x7/2 convolution + 3x3/2 max-pool).
//!
//! Names follow MindSpore's model-zoo `resnet.py`: stem `conv1.weight`, `bn1.{gamma, beta,
//! moving_mean, moving_variance}`; block `j` of stage `i` holds `layer<i>.<j>.conv1.weight`,
//! `layer<i>.<j>.bn1.gamma`, ... (`conv3`/`bn3` in bottlenecks) and, where the shape changes,
//! the projection shortcut `layer<i>.<j>.down_sample_layer.0.weight` (1x1 convolution) and
//! `layer<i>.<j>.down_sample_layer.1.*` (its batch norm); the classifier is `end_point.weight
//! [classes, features]` and `end_point.bias`. Convolutions have no bias. Ops are named after
//! their layer (`layer1.0.conv1`, `layer1.0.bn1`, `layer1.0.relu1`, `layer1.0.add`,
//! `layer1.0.relu`, `maxpool`, `avgpool`, `end_point.matmul`).

use autopar_graph::{DType, GraphBuilder, Initializer, NodeId, PoolAttrs};

use crate::error::{GraphContext, ModelError, Result};
use crate::layers::{conv_bn, dense, fan_in_uniform, BatchNormConfig};
use crate::{positive, Mode, Model, ModelGraph};

/// Residual block type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// Two 3x3 convolutions (ResNet-18/34); expansion 1.
    Basic,
    /// 1x1, 3x3 (strided), 1x1 convolutions (ResNet-50); expansion 4.
    Bottleneck,
}

impl Block {
    /// Output channels per base channel.
    pub fn expansion(self) -> usize {
        match self {
            Block::Basic => 1,
            Block::Bottleneck => 4,
        }
    }
}

/// The first layers, before the residual stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stem {
    /// 3x3 stride-1 convolution, batch norm, ReLU (32x32 images).
    Cifar,
    /// 7x7 stride-2 convolution, batch norm, ReLU, 3x3 stride-2 max-pool (224x224 images).
    ImageNet,
}

impl Stem {
    /// `[3, 32, 32]` or `[3, 224, 224]`.
    pub fn default_input_shape(self) -> Vec<usize> {
        match self {
            Stem::Cifar => vec![3, 32, 32],
            Stem::ImageNet => vec![3, 224, 224],
        }
    }
}

impl std::str::FromStr for Stem {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cifar" => Ok(Stem::Cifar),
            "imagenet" => Ok(Stem::ImageNet),
            _ => Err(ModelError::BadConfig {
                model: "resnet".into(),
                field: "stem",
                value: format!("{s:?}"),
                expected: "cifar or imagenet".into(),
            }),
        }
    }
}

/// Architecture and sizes of a [`ResNet`].
#[derive(Clone, Debug, PartialEq)]
pub struct ResNetConfig {
    /// Residual block type: basic (ResNet-18/34) or bottleneck (ResNet-50 and deeper).
    pub block: Block,
    /// Blocks per stage.
    pub layers: [usize; 4],
    /// Output classes: the width of the classifier `end_point`.
    pub num_classes: usize,
    /// The layers before the residual stages.
    pub stem: Stem,
    /// Channels of the stem and the first stage (64 in the papers); stage `s` has `width << s`
    /// base channels. Small widths make test-sized models.
    pub width: usize,
    /// `[C, H, W]` of one image.
    pub input_shape: Vec<usize>,
    /// Settings of every batch norm.
    pub bn: BatchNormConfig,
    /// Start the gamma of each block's last batch norm at zero, so every residual block begins
    /// as the identity (MindSpore's model zoo `_bn_last`; torchvision's `zero_init_residual`).
    /// Deep, narrow networks train much faster from there.
    pub zero_init_residual: bool,
}

impl ResNetConfig {
    fn new(block: Block, layers: [usize; 4], num_classes: usize, stem: Stem) -> Self {
        Self {
            block,
            layers,
            num_classes,
            stem,
            width: 64,
            input_shape: stem.default_input_shape(),
            bn: BatchNormConfig::default(),
            zero_init_residual: true,
        }
    }

    /// ResNet-18 with the CIFAR stem on 3x32x32 images.
    pub fn resnet18(num_classes: usize) -> Self {
        Self::new(Block::Basic, [2, 2, 2, 2], num_classes, Stem::Cifar)
    }

    /// ResNet-34 with the CIFAR stem on 3x32x32 images.
    pub fn resnet34(num_classes: usize) -> Self {
        Self::new(Block::Basic, [3, 4, 6, 3], num_classes, Stem::Cifar)
    }

    /// ResNet-50 with the ImageNet stem on 3x224x224 images.
    pub fn resnet50(num_classes: usize) -> Self {
        Self::new(Block::Bottleneck, [3, 4, 6, 3], num_classes, Stem::ImageNet)
    }

    /// The distributed-training tutorial's network: ResNet-50, ImageNet stem, CIFAR-10 images
    /// resized to 224x224, 10 classes.
    pub fn resnet50_tutorial() -> Self {
        Self::resnet50(10)
    }

    /// This configuration with another stem and image shape `[C, H, W]`.
    pub fn with_stem(mut self, stem: Stem, input_shape: &[usize]) -> Self {
        self.stem = stem;
        self.input_shape = input_shape.to_vec();
        self
    }

    /// This configuration with another base channel count (`width`).
    pub fn with_width(mut self, width: usize) -> Self {
        self.width = width;
        self
    }
}

/// A residual network for image classification.
#[derive(Clone, Debug, PartialEq)]
pub struct ResNet {
    cfg: ResNetConfig,
    name: String,
}

impl ResNet {
    /// Checks the configuration (positive class count, width and blocks per stage; `input_shape` is `[C, H, W]` with
    /// positive sizes), otherwise [`ModelError::BadConfig`]. The model's name (`resnet18`, ..., or `resnet`) follows
    /// from the block type and stage sizes.
    pub fn new(cfg: ResNetConfig) -> Result<Self> {
        let name = match (cfg.block, cfg.layers) {
            (Block::Basic, [2, 2, 2, 2]) => "resnet18".to_string(),
            (Block::Basic, [3, 4, 6, 3]) => "resnet34".to_string(),
            (Block::Bottleneck, [3, 4, 6, 3]) => "resnet50".to_string(),
            (Block::Bottleneck, [3, 4, 23, 3]) => "resnet101".to_string(),
            (Block::Bottleneck, [3, 8, 36, 3]) => "resnet152".to_string(),
            _ => "resnet".to_string(),
        };
        positive(&name, "num_classes", cfg.num_classes)?;
        positive(&name, "width", cfg.width)?;
        for &n in &cfg.layers {
            positive(&name, "blocks per stage", n)?;
        }
        if cfg.input_shape.len() != 3 || cfg.input_shape.contains(&0) {
            return Err(ModelError::BadConfig {
                model: name,
                field: "input_shape",
                value: format!("{:?}", cfg.input_shape),
                expected: "[C, H, W] with positive sizes, e.g. [3, 32, 32]".into(),
            });
        }
        Ok(Self { cfg, name })
    }

    /// The configuration this model was built from.
    pub fn config(&self) -> &ResNetConfig {
        &self.cfg
    }

    fn block(
        &self,
        b: &mut GraphBuilder,
        prefix: &str,
        x: NodeId,
        planes: usize,
        stride: usize,
        training: bool,
    ) -> autopar_graph::Result<NodeId> {
        let bn = self.cfg.bn;
        let cin = b.graph().node(x).ty.shape[1];
        let out = planes * self.cfg.block.expansion();
        let p = |s: &str| format!("{prefix}.{s}");
        b.block(&p(""));
        let one = Initializer::Ones;
        let last = if self.cfg.zero_init_residual { Initializer::Zeros } else { Initializer::Ones };
        let h = match self.cfg.block {
            Block::Basic => {
                let h = conv_bn(b, &p("conv1"), &p("bn1"), x, planes, 3, stride, bn, one, training)?;
                let h = b.relu(&p("relu1"), h)?;
                conv_bn(b, &p("conv2"), &p("bn2"), h, planes, 3, 1, bn, last, training)?
            }
            Block::Bottleneck => {
                let h = conv_bn(b, &p("conv1"), &p("bn1"), x, planes, 1, 1, bn, one.clone(), training)?;
                let h = b.relu(&p("relu1"), h)?;
                let h = conv_bn(b, &p("conv2"), &p("bn2"), h, planes, 3, stride, bn, one, training)?;
                let h = b.relu(&p("relu2"), h)?;
                conv_bn(b, &p("conv3"), &p("bn3"), h, out, 1, 1, bn, last, training)?
            }
        };
        let shortcut = if stride != 1 || cin != out {
            conv_bn(b, &p("down_sample_layer.0"), &p("down_sample_layer.1"), x, out, 1, stride, bn, Initializer::Ones, training)?
        } else {
            x
        };
        let y = b.add(&p("add"), h, shortcut)?;
        b.relu(&p("relu"), y)
    }

    fn build_inner(&self, b: &mut GraphBuilder, batch: usize, training: bool) -> autopar_graph::Result<(NodeId, NodeId, NodeId, NodeId)> {
        let c = &self.cfg;
        let mut shape = vec![batch];
        shape.extend_from_slice(&c.input_shape);
        let x = b.input("x", &shape, DType::F32)?;
        let labels = b.input("labels", &[batch], DType::I64)?;
        let mut h = match c.stem {
            Stem::Cifar => {
                let h = conv_bn(b, "conv1", "bn1", x, c.width, 3, 1, c.bn, Initializer::Ones, training)?;
                b.relu("relu", h)?
            }
            Stem::ImageNet => {
                let h = conv_bn(b, "conv1", "bn1", x, c.width, 7, 2, c.bn, Initializer::Ones, training)?;
                let h = b.relu("relu", h)?;
                b.max_pool("maxpool", h, PoolAttrs { kernel: [3, 3], stride: [2, 2], padding: [1; 4] })?
            }
        };
        for (s, &blocks) in c.layers.iter().enumerate() {
            let planes = c.width << s;
            for j in 0..blocks {
                let stride = if s > 0 && j == 0 { 2 } else { 1 };
                h = self.block(b, &format!("layer{}.{j}", s + 1), h, planes, stride, training)?;
            }
        }
        let pooled = b.global_avg_pool("avgpool", h)?;
        let features = b.graph().node(pooled).ty.shape[1];
        let logits = dense(b, "end_point", pooled, c.num_classes, fan_in_uniform(features), Some(fan_in_uniform(features)))?;
        let loss = b.softmax_cross_entropy("loss", logits, labels)?;
        b.output(loss)?;
        b.output(logits)?;
        Ok((x, labels, logits, loss))
    }
}

impl Model for ResNet {
    fn name(&self) -> &str {
        &self.name
    }
    fn input_shape(&self) -> Vec<usize> {
        self.cfg.input_shape.clone()
    }
    fn num_classes(&self) -> usize {
        self.cfg.num_classes
    }
    fn describe(&self) -> String {
        let c = &self.cfg;
        let block = match c.block {
            Block::Basic => "basic",
            Block::Bottleneck => "bottleneck",
        };
        let stem = match c.stem {
            Stem::Cifar => "cifar",
            Stem::ImageNet => "imagenet",
        };
        let layers: Vec<String> = c.layers.iter().map(|n| n.to_string()).collect();
        format!(
            "{} ({block} blocks {}, {stem} stem, width {}, {} classes, input {:?})",
            self.name,
            layers.join("-"),
            c.width,
            c.num_classes,
            c.input_shape
        )
    }
    fn build(&self, b: &mut GraphBuilder, batch: usize, mode: Mode) -> Result<ModelGraph> {
        positive(&self.name, "batch size", batch)?;
        let start = b.graph().len();
        let (x, labels, logits, loss) = self.build_inner(b, batch, mode.is_training()).model(&self.name)?;
        Ok(ModelGraph::collect(&self.name, b, start, mode, [x, labels, logits, loss]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_graph::{Graph, OpKind};

    fn build(cfg: ResNetConfig, batch: usize, mode: Mode) -> (Graph, ModelGraph) {
        ResNet::new(cfg).unwrap().build_graph(batch, mode, 0).unwrap()
    }

    fn shape(g: &Graph, m: &ModelGraph, param: &str) -> Vec<usize> {
        g.node(m.params[param]).ty.shape.clone()
    }

    fn is_frozen(g: &Graph, m: &ModelGraph, param: &str) -> bool {
        matches!(&g.node(m.params[param]).op, OpKind::Parameter(p) if !p.trainable)
    }

    #[test]
    fn resnet50_with_the_imagenet_stem_and_1000_classes_has_25_6_million_parameters() {
        let (g, m) = build(ResNetConfig::resnet50(1000), 1, Mode::Train);
        let count = m.parameter_count(&g);
        // torchvision's resnet50: 25,557,032 trainable values in 161 tensors.
        assert_eq!(count.trainable, 25_557_032);
        assert_eq!(count.trainable_tensors, 161);
        // Two running statistics per batch norm, each as large as its gamma.
        let gammas: usize = m.params.iter().filter(|(n, _)| n.ends_with(".gamma")).map(|(_, &id)| g.node(id).ty.numel()).sum();
        assert_eq!(count.frozen, 2 * gammas);
        assert_eq!(count.frozen, 2 * 26_560);
        assert_eq!(g.node(m.ops["maxpool"]).ty.shape, vec![1, 64, 56, 56]);
        assert_eq!(g.node(m.ops["layer4.2.relu"]).ty.shape, vec![1, 2048, 7, 7]);
        assert_eq!(shape(&g, &m, "conv1.weight"), vec![64, 3, 7, 7]);
        assert_eq!(shape(&g, &m, "layer1.0.down_sample_layer.0.weight"), vec![256, 64, 1, 1]);
        assert_eq!(shape(&g, &m, "layer2.0.conv2.weight"), vec![128, 128, 3, 3]);
        assert_eq!(shape(&g, &m, "layer4.2.conv3.weight"), vec![2048, 512, 1, 1]);
        assert_eq!(shape(&g, &m, "end_point.weight"), vec![1000, 2048]);
        assert!(!m.params.contains_key("layer1.1.down_sample_layer.0.weight"));
        // The bottleneck strides its 3x3 convolution.
        assert!(matches!(&g.node(m.ops["layer2.0.conv2"]).op, OpKind::Conv2D(c) if c.conv.stride == [2, 2]));
        assert!(matches!(&g.node(m.ops["layer2.0.conv1"]).op, OpKind::Conv2D(c) if c.conv.stride == [1, 1]));
    }

    #[test]
    fn resnet18_and_34_have_the_well_known_parameter_counts() {
        let (g, m) = build(ResNetConfig::resnet18(10), 2, Mode::Train);
        let count = m.parameter_count(&g);
        assert_eq!((count.trainable, count.trainable_tensors, count.frozen_tensors), (11_173_962, 62, 40));
        let (g, m) = build(ResNetConfig::resnet18(1000).with_stem(Stem::ImageNet, &[3, 224, 224]), 1, Mode::Train);
        assert_eq!(m.parameter_count(&g).trainable, 11_689_512);
        let (g, m) = build(ResNetConfig::resnet34(1000).with_stem(Stem::ImageNet, &[3, 224, 224]), 1, Mode::Train);
        assert_eq!(m.parameter_count(&g).trainable, 21_797_672);
    }

    #[test]
    fn the_cifar_stem_keeps_32x32_through_stage_1_and_has_no_max_pool() {
        let (g, m) = build(ResNetConfig::resnet18(10), 4, Mode::Train);
        assert_eq!(shape(&g, &m, "conv1.weight"), vec![64, 3, 3, 3]);
        assert!(!m.ops.contains_key("maxpool"));
        assert_eq!(g.node(m.ops["layer1.1.relu"]).ty.shape, vec![4, 64, 32, 32]);
        assert_eq!(g.node(m.ops["layer4.1.relu"]).ty.shape, vec![4, 512, 4, 4]);
        assert!(!m.params.contains_key("layer1.0.down_sample_layer.0.weight"), "stage 1 of a basic ResNet keeps its shape");
        assert_eq!(shape(&g, &m, "layer3.0.down_sample_layer.0.weight"), vec![256, 128, 1, 1]);
        for stat in ["bn1.moving_mean", "bn1.moving_variance", "layer3.0.down_sample_layer.1.moving_mean"] {
            assert!(is_frozen(&g, &m, stat), "{stat}");
        }
        for p in ["bn1.gamma", "bn1.beta", "layer2.1.conv2.weight", "end_point.bias"] {
            assert!(!is_frozen(&g, &m, p), "{p}");
        }
        // Each block's last batch norm starts at zero, the others at one.
        let gamma = |name: &str| match &g.node(m.params[name]).op {
            OpKind::Parameter(p) => p.init.clone(),
            _ => unreachable!("a parameter"),
        };
        assert_eq!(gamma("layer2.0.bn2.gamma"), Initializer::Zeros);
        assert_eq!(gamma("layer2.0.bn1.gamma"), Initializer::Ones);
        assert_eq!(gamma("layer2.0.down_sample_layer.1.gamma"), Initializer::Ones);
    }

    #[test]
    fn train_and_eval_graphs_differ_only_in_the_batch_norm_flag() {
        let cfg = ResNetConfig::resnet18(10).with_width(4);
        let (gt, mt) = build(cfg.clone(), 2, Mode::Train);
        let (ge, me) = build(cfg, 2, Mode::Eval);
        assert_eq!(mt.params.keys().collect::<Vec<_>>(), me.params.keys().collect::<Vec<_>>());
        assert_eq!(gt.len(), ge.len());
        assert!(
            matches!(&gt.node(mt.ops["layer2.0.bn1"]).op, OpKind::BatchNorm(bn) if bn.training && bn.momentum == 0.9 && bn.eps == 1e-5)
        );
        assert!(matches!(&ge.node(me.ops["layer2.0.bn1"]).op, OpKind::BatchNorm(bn) if !bn.training));
    }

    #[test]
    fn small_widths_and_any_batch_size_build() {
        for batch in [1, 3, 8] {
            let (g, m) = build(ResNetConfig::resnet50(5).with_width(2).with_stem(Stem::ImageNet, &[3, 32, 32]), batch, Mode::Train);
            assert_eq!(g.node(m.logits).ty.shape, vec![batch, 5]);
            assert_eq!(shape(&g, &m, "end_point.weight"), vec![5, 64]);
        }
    }

    #[test]
    fn bad_configs_name_the_field() {
        let err = ResNet::new(ResNetConfig::resnet18(10).with_width(0)).unwrap_err();
        assert_eq!(err.to_string(), "model resnet18: width = 0 is invalid; expected a positive number");
        let err = ResNet::new(ResNetConfig::resnet18(10).with_stem(Stem::Cifar, &[32, 32])).unwrap_err();
        assert!(err.to_string().contains("input_shape = [32, 32]"), "{err}");
        assert_eq!("ImageNet".parse::<Stem>().unwrap(), Stem::ImageNet);
        assert!("vgg".parse::<Stem>().is_err());
    }
}
