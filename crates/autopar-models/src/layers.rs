//! Building blocks shared by the models: dense layers, convolution + batch norm, layer norm.
//! Each adds its parameters under `<name>.<param>` and its ops under `<name>.<op>` (or `<name>`
//! for a single op), so parameter and op names never collide.

use autopar_graph::{ConvAttrs, GraphBuilder, Initializer, NodeId, ParamSpec, Result};

/// `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`: the default of MindSpore 2's `nn.Dense` and PyTorch's
/// `nn.Linear` for both weight and bias (Kaiming-uniform with `a = sqrt(5)`).
pub(crate) fn fan_in_uniform(fan_in: usize) -> Initializer {
    let a = 1.0 / (fan_in.max(1) as f64).sqrt();
    Initializer::Uniform { low: -a, high: a }
}

/// A fully connected layer on `x [N, fan_in]`: weight `<name>.weight [out, in]` applied transposed
/// (op `<name>.matmul`, MatMul with `transpose_b`), bias `<name>.bias [out]` (op `<name>.bias_add`).
pub(crate) fn dense(
    b: &mut GraphBuilder,
    name: &str,
    x: NodeId,
    out: usize,
    weight: Initializer,
    bias: Option<Initializer>,
) -> Result<NodeId> {
    let fan_in = *b.graph().get(x)?.ty.shape.last().unwrap_or(&0);
    let w = b.parameter(&format!("{name}.weight"), &[out, fan_in], weight)?;
    let y = b.matmul_t(&format!("{name}.matmul"), x, w, false, true)?;
    match bias {
        Some(init) => {
            let bias = b.parameter(&format!("{name}.bias"), &[out], init)?;
            b.bias_add(&format!("{name}.bias_add"), y, bias)
        }
        None => Ok(y),
    }
}

/// Batch-norm settings (MindSpore's `nn.BatchNorm2d` defaults: momentum 0.9, eps 1e-5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormConfig {
    /// `running = momentum * running + (1 - momentum) * batch` (MindSpore's convention).
    pub momentum: f64,
    /// Epsilon added to the variance before the square root.
    pub eps: f64,
}

impl Default for BatchNormConfig {
    fn default() -> Self {
        Self { momentum: 0.9, eps: 1e-5 }
    }
}

/// Batch norm over the channels of `x`: trainable `<name>.gamma` (`gamma`, normally ones) and
/// `<name>.beta` (zeros), frozen running statistics `<name>.moving_mean` (zeros) and
/// `<name>.moving_variance` (ones) that the executor updates in training; op `<name>`.
pub(crate) fn batch_norm(
    b: &mut GraphBuilder,
    name: &str,
    x: NodeId,
    cfg: BatchNormConfig,
    gamma: Initializer,
    training: bool,
) -> Result<NodeId> {
    let c = b.graph().get(x)?.ty.shape.get(1).copied().unwrap_or(0);
    let gamma = b.parameter(&format!("{name}.gamma"), &[c], gamma)?;
    let beta = b.parameter(&format!("{name}.beta"), &[c], Initializer::Zeros)?;
    let mean = b.parameter_with(&format!("{name}.moving_mean"), ParamSpec::new(&[c], Initializer::Zeros).frozen())?;
    let var = b.parameter_with(&format!("{name}.moving_variance"), ParamSpec::new(&[c], Initializer::Ones).frozen())?;
    b.batch_norm(name, [x, gamma, beta, mean, var], training, cfg.eps, cfg.momentum)
}

/// A bias-free `k x k` convolution `<conv>` (weight `<conv>.weight [out, in, k, k]`, He-normal)
/// followed by batch norm `<bn>` whose gamma starts at `gamma`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_bn(
    b: &mut GraphBuilder,
    conv: &str,
    bn: &str,
    x: NodeId,
    out: usize,
    k: usize,
    stride: usize,
    bn_cfg: BatchNormConfig,
    gamma: Initializer,
    training: bool,
) -> Result<NodeId> {
    let cin = b.graph().get(x)?.ty.shape.get(1).copied().unwrap_or(0);
    let w = b.parameter(&format!("{conv}.weight"), &[out, cin, k, k], Initializer::HeNormal)?;
    let y = b.conv2d(conv, x, w, ConvAttrs::new(stride, k / 2))?;
    batch_norm(b, bn, y, bn_cfg, gamma, training)
}

/// Layer norm over the last dimension: `<name>.gamma` (ones), `<name>.beta` (zeros), op `<name>`.
pub(crate) fn layer_norm(b: &mut GraphBuilder, name: &str, x: NodeId, eps: f64) -> Result<NodeId> {
    let d = *b.graph().get(x)?.ty.shape.last().unwrap_or(&0);
    let gamma = b.parameter(&format!("{name}.gamma"), &[d], Initializer::Ones)?;
    let beta = b.parameter(&format!("{name}.beta"), &[d], Initializer::Zeros)?;
    b.layer_norm(name, x, gamma, beta, -1, eps)
}
