//! Neural-network ops: matrix products, bias, convolution, pooling, normalisation, dropout and
//! the classification loss. Layouts follow MindSpore: NCHW activations, `[out, in/groups, kh, kw]`
//! filters, `[in, out]`-free matrix products with transpose flags.

use super::GradCx;
use crate::error::Result;
use crate::ops::activation::BACKWARD_OP;
use crate::ops::{Arity, InferCx, OpDef, OpKind};
use crate::sharding::{
    group_reduce, matmul_spec, same_dims, unary_spec, CostCx, DropoutBlock, LocalCx, LogicalDim, OpCost, OpSpec, RuleCx, ShardingRule, Tie,
};
use crate::types::{normalize_axis, DType, Shape, TensorType};
use crate::NodeId;

/// A backward op's rule: never split by the planner (autodiff makes it on the local graph).
fn backward_rule() -> ShardingRule {
    ShardingRule::Unsupported(BACKWARD_OP)
}

/// `2 * output elements * k`: a product contracting `k` values per output element.
fn product_cost(cx: &CostCx<'_>, k: usize) -> OpCost {
    OpCost { flops: 2.0 * cx.out_numel() as f64 * k as f64, bytes: cx.traffic(), comm: Vec::new() }
}

/// `[N, C, ...]` split on N and C only (the rest, spatial, whole); every input `[N, C, ...]`.
fn batch_channel_spec(x: &[usize], out: &[usize]) -> OpSpec {
    let dims = vec![LogicalDim::free(x[0]), LogicalDim::free(x[1])];
    let mut input = vec![Some(0), Some(1)];
    input.resize(x.len(), None);
    let mut output = vec![Some(0), Some(1)];
    output.resize(out.len(), None);
    OpSpec { dims, inputs: vec![input], output, mean_over_reduced: false, tie: Tie::None }
}

fn matmul_infer(cx: &InferCx<'_>, ta: bool, tb: bool, batched: bool) -> Result<TensorType> {
    let d = cx.float(0)?;
    cx.same_dtype(0, 1)?;
    let (a, b) = (cx.shape(0), cx.shape(1));
    let expected = if batched { "rank >= 3" } else { "rank 2" };
    let ok = |s: &Shape| if batched { s.len() >= 3 } else { s.len() == 2 };
    if !ok(a) {
        return Err(cx.bad_shape(0, expected));
    }
    if !ok(b) {
        return Err(cx.bad_shape(1, expected));
    }
    if a.len() != b.len() {
        return Err(cx.bad_shape(1, "the rank of input 0"));
    }
    let r = a.len();
    for i in 0..r - 2 {
        if a[i] != b[i] {
            return Err(cx.dim_mismatch("batch dimensions", a[i], b[i]));
        }
    }
    let (m, ka) = if ta { (a[r - 1], a[r - 2]) } else { (a[r - 2], a[r - 1]) };
    let (kb, n) = if tb { (b[r - 1], b[r - 2]) } else { (b[r - 2], b[r - 1]) };
    if ka != kb {
        return Err(cx.dim_mismatch("inner dimensions", ka, kb));
    }
    let mut out = a[..r - 2].to_vec();
    out.extend([m, n]);
    Ok(TensorType::new(out, d))
}

/// Gradients of `y = op_a(a) op_b(b)` through products of the same kind.
fn matmul_grad(g: &mut GradCx<'_>, ta: bool, tb: bool, make: fn(bool, bool) -> crate::OpKind) -> Result<()> {
    let (a, b, dy) = (g.x(0), g.x(1), g.dy());
    if g.needs(0) {
        let d = match (ta, tb) {
            (false, false) => g.op(make(false, true), &[dy, b])?,
            (false, true) => g.op(make(false, false), &[dy, b])?,
            (true, false) => g.op(make(false, true), &[b, dy])?,
            (true, true) => g.op(make(true, true), &[b, dy])?,
        };
        g.set(0, d);
    }
    if g.needs(1) {
        let d = match (ta, tb) {
            (false, false) => g.op(make(true, false), &[a, dy])?,
            (false, true) => g.op(make(true, false), &[dy, a])?,
            (true, false) => g.op(make(false, false), &[a, dy])?,
            (true, true) => g.op(make(true, true), &[dy, a])?,
        };
        g.set(1, d);
    }
    Ok(())
}

/// 2-D matrix product `op(a) op(b)`, `op` transposing when the flag is set.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMul {
    /// Use `a` transposed.
    pub transpose_a: bool,
    /// Use `b` transposed.
    pub transpose_b: bool,
}

impl OpDef for MatMul {
    fn kind(&self) -> &'static str {
        "MatMul"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        matmul_infer(cx, self.transpose_a, self.transpose_b, false)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        matmul_grad(g, self.transpose_a, self.transpose_b, |a, b| MatMul { transpose_a: a, transpose_b: b }.into())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(matmul_spec(cx.shape(0), cx.shape(1), self.transpose_a, self.transpose_b))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let a = &cx.inputs[0].shape;
        let r = a.len();
        product_cost(cx, if self.transpose_a { a[r - 2] } else { a[r - 1] })
    }
}

/// Batched matrix product over equal leading dimensions.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchMatMul {
    /// Transpose the last two dimensions of `a`.
    pub transpose_a: bool,
    /// Transpose the last two dimensions of `b`.
    pub transpose_b: bool,
}

impl OpDef for BatchMatMul {
    fn kind(&self) -> &'static str {
        "BatchMatMul"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        matmul_infer(cx, self.transpose_a, self.transpose_b, true)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        matmul_grad(g, self.transpose_a, self.transpose_b, |a, b| BatchMatMul { transpose_a: a, transpose_b: b }.into())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(matmul_spec(cx.shape(0), cx.shape(1), self.transpose_a, self.transpose_b))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let a = &cx.inputs[0].shape;
        let r = a.len();
        product_cost(cx, if self.transpose_a { a[r - 2] } else { a[r - 1] })
    }
}

/// Adds a `[C]` bias along dimension 1 of `x` (`[N, C, ...]`).
#[derive(Clone, Debug, PartialEq)]
pub struct BiasAdd;

impl OpDef for BiasAdd {
    fn kind(&self) -> &'static str {
        "BiasAdd"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        if cx.shape(0).len() < 2 {
            return Err(cx.bad_shape(0, "rank >= 2 (N, C, ...)"));
        }
        cx.rank(1, 1, "rank 1 (C)")?;
        if cx.shape(0)[1] != cx.shape(1)[0] {
            return Err(cx.dim_mismatch("channel dimensions", cx.shape(0)[1], cx.shape(1)[0]));
        }
        Ok(TensorType::new(cx.shape(0).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let dy = g.dy();
        g.set(0, dy);
        if g.needs(1) {
            let axes: Vec<usize> = (0..g.x_shape(0).len()).filter(|&a| a != 1).collect();
            let d = g.reduce_sum(dy, &axes, false)?;
            g.set(1, d);
        }
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        ShardingRule::Spec(OpSpec {
            dims: x.iter().map(|&s| LogicalDim::free(s)).collect(),
            inputs: vec![same_dims(x), vec![Some(1)]],
            output: same_dims(x),
            mean_over_reduced: false,
            tie: Tie::None,
        })
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        BiasAdd.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(1.0)
    }
}

/// Convolution settings shared by the convolution ops. `padding` is `[top, bottom, left, right]`
/// (MindSpore's `pad` list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvAttrs {
    /// Stride along height and width.
    pub stride: [usize; 2],
    /// Zero padding `[top, bottom, left, right]`.
    pub padding: [usize; 4],
    /// Dilation along height and width (1: none).
    pub dilation: [usize; 2],
    /// Groups the channels are split into (1: an ordinary convolution).
    pub groups: usize,
}

impl Default for ConvAttrs {
    fn default() -> Self {
        Self { stride: [1, 1], padding: [0; 4], dilation: [1, 1], groups: 1 }
    }
}

impl ConvAttrs {
    /// Stride `stride` and padding `pad` on every side, no dilation, one group.
    pub fn new(stride: usize, pad: usize) -> Self {
        Self { stride: [stride, stride], padding: [pad; 4], ..Self::default() }
    }
}

/// Output spatial size of a window op, `None` when the window does not fit.
fn window_out(size: usize, k: usize, stride: usize, pad: [usize; 2], dilation: usize) -> Option<usize> {
    let span = dilation * (k.max(1) - 1) + 1;
    let padded = size + pad[0] + pad[1];
    (stride > 0 && k > 0 && padded >= span).then(|| (padded - span) / stride + 1)
}

fn conv_out_shape(cx: &InferCx<'_>, c: &ConvAttrs, x: &Shape, w: &Shape) -> Result<Shape> {
    if c.groups == 0 || c.stride.contains(&0) || c.dilation.contains(&0) {
        return Err(cx.bad_attr("stride/dilation/groups", c, "stride, dilation and groups >= 1"));
    }
    if !x[1].is_multiple_of(c.groups) || !w[0].is_multiple_of(c.groups) {
        return Err(cx.bad_attr("groups", c.groups, "a divisor of the input and output channels"));
    }
    if x[1] / c.groups != w[1] {
        return Err(cx.dim_mismatch("input channels per group", x[1] / c.groups, w[1]));
    }
    let oh = window_out(x[2], w[2], c.stride[0], [c.padding[0], c.padding[1]], c.dilation[0]);
    let ow = window_out(x[3], w[3], c.stride[1], [c.padding[2], c.padding[3]], c.dilation[1]);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok(vec![x[0], w[0], oh, ow]),
        _ => Err(cx.bad_attr("kernel", &w[2..], "a kernel that fits the padded input")),
    }
}

/// 2-D convolution. Inputs `(x [N, Cin, H, W], w [Cout, Cin/groups, kh, kw])`.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2D {
    /// Stride, padding, dilation and groups.
    pub conv: ConvAttrs,
}

impl OpDef for Conv2D {
    fn kind(&self) -> &'static str {
        "Conv2D"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        cx.rank(0, 4, "rank 4 (N, C, H, W)")?;
        cx.rank(1, 4, "rank 4 (Cout, Cin/groups, kh, kw)")?;
        Ok(TensorType::new(conv_out_shape(cx, &self.conv, cx.shape(0), cx.shape(1))?, d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let (x, w, dy) = (g.x(0), g.x(1), g.dy());
        if g.needs(0) {
            let d = g.op(Conv2DGradInput { conv: self.conv, input_shape: g.shape(x) }, &[dy, w])?;
            g.set(0, d);
        }
        if g.needs(1) {
            let d = g.op(Conv2DGradFilter { conv: self.conv, filter_shape: g.shape(w) }, &[dy, x])?;
            g.set(1, d);
        }
        Ok(())
    }
    // x [N, Cin, H, W], w [Cout, Cin/g, kh, kw] -> [N, Cout, H', W']; logical [n, c_out, c_in],
    // c_in reduced (a split input channel leaves a partial sum); spatial dimensions whole.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let (x, w) = (cx.shape(0), cx.shape(1));
        let grouped = self.conv.groups != 1;
        let dims = vec![
            LogicalDim::free(x[0]),
            if grouped {
                LogicalDim::fixed(w[0], "output channels of a grouped convolution cannot be split")
            } else {
                LogicalDim::free(w[0])
            },
            if grouped {
                LogicalDim::fixed(x[1], "input channels of a grouped convolution cannot be split")
            } else {
                LogicalDim::reduced(x[1])
            },
        ];
        ShardingRule::Spec(OpSpec {
            dims,
            inputs: vec![vec![Some(0), Some(2), None, None], vec![Some(1), Some(2), None, None]],
            output: vec![Some(0), Some(1), None, None],
            mean_over_reduced: false,
            tie: Tie::None,
        })
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let w = &cx.inputs[1].shape;
        product_cost(cx, w[1] * w[2] * w[3])
    }
}

/// Gradient of a convolution's input (the transposed convolution). Inputs `(dy, w)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2DGradInput {
    /// The forward convolution's settings.
    pub conv: ConvAttrs,
    /// Shape of the forward convolution's input `x` (the output's shape).
    pub input_shape: Shape,
}

impl OpDef for Conv2DGradInput {
    fn kind(&self) -> &'static str {
        "Conv2DBackpropInput"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        cx.rank(1, 4, "rank 4 (Cout, Cin/groups, kh, kw)")?;
        if self.input_shape.len() != 4 {
            return Err(cx.bad_attr("input_shape", &self.input_shape, "rank 4 (N, C, H, W)"));
        }
        if conv_out_shape(cx, &self.conv, &self.input_shape, cx.shape(1))? != *cx.shape(0) {
            return Err(cx.bad_shape(0, "the convolution's output shape"));
        }
        Ok(TensorType::new(self.input_shape.clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // dx = T(dy, w) is bilinear: <G, T(dy, w)> = <conv(G, w), dy>.
        let (dy, w, gg) = (g.x(0), g.x(1), g.dy());
        if g.needs(0) {
            let d = g.op(Conv2D { conv: self.conv }, &[gg, w])?;
            g.set(0, d);
        }
        if g.needs(1) {
            let d = g.op(Conv2DGradFilter { conv: self.conv, filter_shape: g.shape(w) }, &[dy, gg])?;
            g.set(1, d);
        }
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Conv2DGradInput { conv: self.conv, input_shape: cx.output.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        // As many multiply-adds as the forward convolution: dy elements x (Cin/g kh kw).
        let w = &cx.inputs[1].shape;
        OpCost { flops: 2.0 * cx.inputs[0].numel() as f64 * (w[1] * w[2] * w[3]) as f64, bytes: cx.traffic(), comm: Vec::new() }
    }
}

/// Gradient of a convolution's filter. Inputs `(dy, x)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2DGradFilter {
    /// The forward convolution's settings.
    pub conv: ConvAttrs,
    /// Shape of the forward convolution's filter `w` (the output's shape).
    pub filter_shape: Shape,
}

impl OpDef for Conv2DGradFilter {
    fn kind(&self) -> &'static str {
        "Conv2DBackpropFilter"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        cx.rank(1, 4, "rank 4 (N, C, H, W)")?;
        if self.filter_shape.len() != 4 {
            return Err(cx.bad_attr("filter_shape", &self.filter_shape, "rank 4 (Cout, Cin/groups, kh, kw)"));
        }
        if conv_out_shape(cx, &self.conv, cx.shape(1), &self.filter_shape)? != *cx.shape(0) {
            return Err(cx.bad_shape(0, "the convolution's output shape"));
        }
        Ok(TensorType::new(self.filter_shape.clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // dw = F(dy, x) is bilinear: <G, F(dy, x)> = <conv(x, G), dy>.
        let (dy, x, gg) = (g.x(0), g.x(1), g.dy());
        if g.needs(0) {
            let d = g.op(Conv2D { conv: self.conv }, &[x, gg])?;
            g.set(0, d);
        }
        if g.needs(1) {
            let d = g.op(Conv2DGradInput { conv: self.conv, input_shape: g.shape(x) }, &[dy, gg])?;
            g.set(1, d);
        }
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Conv2DGradFilter { conv: self.conv, filter_shape: cx.output.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let f = &self.filter_shape;
        OpCost { flops: 2.0 * cx.inputs[0].numel() as f64 * (f[1] * f[2] * f[3]) as f64, bytes: cx.traffic(), comm: Vec::new() }
    }
}

/// Pooling window settings; `padding` is `[top, bottom, left, right]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolAttrs {
    /// Window height and width.
    pub kernel: [usize; 2],
    /// Stride along height and width.
    pub stride: [usize; 2],
    /// Padding `[top, bottom, left, right]`.
    pub padding: [usize; 4],
}

impl PoolAttrs {
    /// A `k x k` window with stride `stride`, no padding.
    pub fn new(k: usize, stride: usize) -> Self {
        Self { kernel: [k, k], stride: [stride, stride], padding: [0; 4] }
    }
}

fn pool_infer(cx: &InferCx<'_>, p: &PoolAttrs) -> Result<TensorType> {
    let d = cx.float(0)?;
    cx.rank(0, 4, "rank 4 (N, C, H, W)")?;
    let x = cx.shape(0);
    if p.padding[0].max(p.padding[1]) * 2 > p.kernel[0] || p.padding[2].max(p.padding[3]) * 2 > p.kernel[1] {
        return Err(cx.bad_attr("padding", p.padding, "at most half the kernel"));
    }
    let oh = window_out(x[2], p.kernel[0], p.stride[0], [p.padding[0], p.padding[1]], 1);
    let ow = window_out(x[3], p.kernel[1], p.stride[1], [p.padding[2], p.padding[3]], 1);
    match (oh, ow) {
        (Some(oh), Some(ow)) => Ok(TensorType::new(vec![x[0], x[1], oh, ow], d)),
        _ => Err(cx.bad_attr("kernel/stride", p, "a window that fits the padded input and stride >= 1")),
    }
}

/// Max pooling over NCHW.
#[derive(Clone, Debug, PartialEq)]
pub struct MaxPool {
    /// Window, stride and padding.
    pub pool: PoolAttrs,
}

impl OpDef for MaxPool {
    fn kind(&self) -> &'static str {
        "MaxPool"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        pool_infer(cx, &self.pool)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(MaxPoolGrad { pool: self.pool }, &[g.x(0), g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(batch_channel_spec(cx.shape(0), cx.out()))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element((self.pool.kernel[0] * self.pool.kernel[1]) as f64)
    }
}

/// Routes each window's gradient to its maximum (first on ties). Inputs `(x, dy)`.
#[derive(Clone, Debug, PartialEq)]
pub struct MaxPoolGrad {
    /// The forward pooling's window, stride and padding.
    pub pool: PoolAttrs,
}

impl OpDef for MaxPoolGrad {
    fn kind(&self) -> &'static str {
        "MaxPoolGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.same_dtype(0, 1)?;
        let y = pool_infer(cx, &self.pool)?;
        if y.shape != *cx.shape(1) {
            return Err(cx.bad_shape(1, "the pooled shape of input 0"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), y.dtype))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = if g.needs(0) { 0 } else { 1 };
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        // The forward pooling again (for the argmax), then one add per dy element.
        cx.per_input_element(1, (self.pool.kernel[0] * self.pool.kernel[1] + 1) as f64)
    }
}

/// Average pooling over NCHW (padding counts as zeros in the average).
#[derive(Clone, Debug, PartialEq)]
pub struct AvgPool {
    /// Window, stride and padding.
    pub pool: PoolAttrs,
}

impl OpDef for AvgPool {
    fn kind(&self) -> &'static str {
        "AvgPool"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        pool_infer(cx, &self.pool)
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(AvgPoolGrad { pool: self.pool, input_shape: g.x_shape(0) }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(batch_channel_spec(cx.shape(0), cx.out()))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element((self.pool.kernel[0] * self.pool.kernel[1]) as f64)
    }
}

/// Spreads each window's gradient evenly over it (the adjoint of [`AvgPool`]). Input `dy`.
#[derive(Clone, Debug, PartialEq)]
pub struct AvgPoolGrad {
    /// The forward pooling's window, stride and padding.
    pub pool: PoolAttrs,
    /// Shape of the forward pooling's input (the output's shape).
    pub input_shape: Shape,
}

impl OpDef for AvgPoolGrad {
    fn kind(&self) -> &'static str {
        "AvgPoolGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        let fake = [TensorType::new(self.input_shape.clone(), d)];
        let y = pool_infer(&InferCx { kind: cx.kind, name: cx.name, inputs: &fake }, &self.pool)?;
        if y.shape != *cx.shape(0) {
            return Err(cx.bad_shape(0, "the pooled shape of input_shape"));
        }
        Ok(TensorType::new(self.input_shape.clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(AvgPool { pool: self.pool }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        AvgPoolGrad { pool: self.pool, input_shape: cx.output.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, (self.pool.kernel[0] * self.pool.kernel[1]) as f64)
    }
}

/// Mean over the spatial dimensions: `[N, C, H, W] -> [N, C]`.
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalAvgPool;

impl OpDef for GlobalAvgPool {
    fn kind(&self) -> &'static str {
        "GlobalAvgPool"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.rank(0, 4, "rank 4 (N, C, H, W)")?;
        let x = cx.shape(0);
        Ok(TensorType::new(vec![x[0], x[1]], d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let x = g.x_shape(0);
        let s = g.scale(g.dy(), 1.0 / (x[2] * x[3]).max(1) as f64)?;
        let r = g.reshape(s, &[x[0], x[1], 1, 1])?;
        let d = g.broadcast_to(r, &x)?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Spec(batch_channel_spec(cx.shape(0), cx.out()))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        GlobalAvgPool.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 1.0)
    }
}

/// Which input a normalisation's gradient op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormGradOf {
    /// The gradient of the normalised input `x`.
    Input,
    /// The gradient of the scale `gamma`.
    Gamma,
}

/// Batch normalisation over dimension 1 of `[N, C]` or `[N, C, H, W]`.
/// Inputs `(x, gamma, beta, running_mean, running_var)`, the last four `[C]`. In training the
/// batch statistics (biased variance) normalise and the executor updates the running statistics
/// as MindSpore does: `running = momentum * running + (1 - momentum) * batch` (unbiased variance).
/// In evaluation the running statistics normalise.
///
/// `group` makes it a synchronised batch norm: in training, the world ranks (ascending) whose
/// batch slices together form the batch the statistics are taken over. The executor sums the
/// per-channel statistics over the group (forward) and the per-channel sums of the gradient
/// (backward), so every rank normalises with the statistics of the whole batch. Empty (or this
/// rank alone): the statistics of this rank's batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm {
    /// Normalise with the batch statistics and update the running ones; else use the running statistics.
    pub training: bool,
    /// Epsilon added to the variance before the square root.
    pub eps: f64,
    /// Weight of the old running statistics in their update (MindSpore's convention; 0.9 by default there).
    pub momentum: f64,
    /// World ranks (ascending) of a synchronised batch norm; empty for this rank's batch alone.
    pub group: Vec<usize>,
}

fn channel_params(cx: &InferCx<'_>, from: usize, to: usize, c: usize) -> Result<()> {
    for i in from..to {
        cx.same_dtype(0, i)?;
        if *cx.shape(i) != [c] {
            return Err(cx.bad_shape(i, "[C], C the channel dimension of x"));
        }
    }
    Ok(())
}

impl OpDef for BatchNorm {
    fn kind(&self) -> &'static str {
        "BatchNorm"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(5)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        let r = cx.shape(0).len();
        if r != 2 && r != 4 {
            return Err(cx.bad_shape(0, "rank 2 (N, C) or rank 4 (N, C, H, W)"));
        }
        channel_params(cx, 1, 5, cx.shape(0)[1])?;
        if self.eps.is_nan() || self.eps <= 0.0 || !(0.0..=1.0).contains(&self.momentum) {
            return Err(cx.bad_attr("eps/momentum", (self.eps, self.momentum), "eps > 0 and momentum in [0, 1]"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let ins = [g.dy(), g.x(0), g.x(1), g.x(3), g.x(4)];
        for (i, which) in [(0, NormGradOf::Input), (1, NormGradOf::Gamma)] {
            if g.needs(i) {
                let d = g.op(BatchNormGrad { training: self.training, eps: self.eps, of: which, group: self.group.clone() }, &ins)?;
                g.set(i, d);
            }
        }
        if g.needs(2) {
            let axes: Vec<usize> = (0..g.x_shape(0).len()).filter(|&a| a != 1).collect();
            let d = g.reduce_sum(g.dy(), &axes, false)?;
            g.set(2, d);
        }
        Ok(()) // running statistics are state, not differentiated
    }
    // N and C split freely; a split batch in training takes its statistics over the ranks that
    // split it (synchronised batch norm).
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        let mut spec = batch_channel_spec(x, cx.out());
        let c = vec![Some(1)];
        spec.inputs.extend([c.clone(), c.clone(), c.clone(), c]);
        if self.training {
            spec.tie = Tie::Stats(vec![0]);
        }
        ShardingRule::Spec(spec)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        BatchNorm { group: if self.training { cx.group.to_vec() } else { Vec::new() }, ..self.clone() }.into()
    }
    /// Synchronised in training: the per-channel sums with the element count (C + 1 values),
    /// then the squared deviations (C), summed in f64 over the group.
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let c = cx.inputs[0].shape[1];
        let group: &[usize] = if self.training { &self.group } else { &[] };
        let comm = [group_reduce(group, c + 1, DType::F64), group_reduce(group, c, DType::F64)].into_iter().flatten().collect();
        cx.per_element(if self.training { 6.0 } else { 2.0 }).with_comm(comm)
    }
}

/// Gradient of [`BatchNorm`] with respect to `x` or `gamma`.
/// Inputs `(dy, x, gamma, running_mean, running_var)`. With a `group` (synchronised batch norm)
/// the gradient of `x` uses the sums of `dy` over the whole batch; the gradient of `gamma` is
/// this rank's share (summed over the group by the gradient synchronisation).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNormGrad {
    /// Whether the forward [`BatchNorm`] used batch statistics (training) or the running ones.
    pub training: bool,
    /// The forward [`BatchNorm`]'s epsilon.
    pub eps: f64,
    /// Which gradient this op computes.
    pub of: NormGradOf,
    /// The forward [`BatchNorm`]'s synchronisation group.
    pub group: Vec<usize>,
}

impl OpDef for BatchNormGrad {
    fn kind(&self) -> &'static str {
        "BatchNormGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(5)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        if cx.shape(0) != cx.shape(1) {
            return Err(cx.bad_shape(1, "the shape of dy"));
        }
        let r = cx.shape(1).len();
        if r != 2 && r != 4 {
            return Err(cx.bad_shape(1, "rank 2 (N, C) or rank 4 (N, C, H, W)"));
        }
        let c = cx.shape(1)[1];
        channel_params(cx, 2, 5, c)?;
        let shape = match self.of {
            NormGradOf::Input => cx.shape(1).clone(),
            NormGradOf::Gamma => vec![c],
        };
        Ok(TensorType::new(shape, d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = (0..5).find(|&i| g.needs(i)).unwrap_or(0);
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    /// Synchronised in training, the gradient of x sums dy and dy * x_hat per channel (2C
    /// values, f64) over the group, once for the pair of siblings (counted on the x node).
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let c = cx.inputs[1].shape[1];
        let synced = self.training && self.of == NormGradOf::Input;
        let comm = group_reduce(if synced { &self.group } else { &[] }, 2 * c, DType::F64).into_iter().collect();
        cx.per_input_element(1, 8.0).with_comm(comm)
    }
}

/// Layer normalisation over the dimensions from `begin_norm_axis` on; `gamma` and `beta` have
/// the shape of those dimensions. Inputs `(x, gamma, beta)`.
///
/// `group`: the world ranks (ascending) whose slices together form the normalised dimensions
/// when they are split across ranks; the executor sums each row's statistics (forward) and the
/// gradient's row sums (backward) over the group. Empty: the normalised dimensions are whole.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNorm {
    /// The first normalised dimension; negative counts from the end.
    pub begin_norm_axis: i64,
    /// Epsilon added to the variance before the square root.
    pub eps: f64,
    /// World ranks (ascending) whose slices together form the normalised dimensions; empty when they are whole.
    pub group: Vec<usize>,
}

/// Rows of a layer norm: the elements of the dimensions before `begin_norm_axis`.
fn layer_norm_rows(x: &[usize], begin_norm_axis: i64) -> usize {
    let b = normalize_axis(begin_norm_axis, x.len()).expect("graph nodes hold axes within their input's rank");
    x[..b].iter().product()
}

fn layer_norm_check(cx: &InferCx<'_>, axis: i64, x: usize, params: &[usize]) -> Result<usize> {
    let a = cx.axis(x, "begin_norm_axis", axis)?;
    let tail = &cx.shape(x)[a..];
    for &i in params {
        cx.same_dtype(x, i)?;
        if cx.shape(i) != tail {
            return Err(cx.bad_shape(i, "the normalised dimensions of x"));
        }
    }
    Ok(a)
}

impl OpDef for LayerNorm {
    fn kind(&self) -> &'static str {
        "LayerNorm"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(3)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        layer_norm_check(cx, self.begin_norm_axis, 0, &[1, 2])?;
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err(cx.bad_attr("eps", self.eps, "eps > 0"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let ins = [g.dy(), g.x(0), g.x(1)];
        for (i, which) in [(0, NormGradOf::Input), (1, NormGradOf::Gamma)] {
            if g.needs(i) {
                let d = g.op(
                    LayerNormGrad { begin_norm_axis: self.begin_norm_axis, eps: self.eps, of: which, group: self.group.clone() },
                    &ins,
                )?;
                g.set(i, d);
            }
        }
        if g.needs(2) {
            let xs = g.x_shape(0);
            let a = normalize_axis(self.begin_norm_axis, xs.len()).expect("checked at build");
            let d = g.sum_to(g.dy(), &xs[a..])?;
            g.set(2, d);
        }
        Ok(())
    }
    // Split normalised dimensions sum each row's statistics over the ranks that split them.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        let b = normalize_axis(self.begin_norm_axis, x.len()).expect("graph nodes hold axes within their input's rank");
        let mut spec = unary_spec(x, &[], "");
        let param: Vec<Option<usize>> = (b..x.len()).map(Some).collect();
        spec.inputs.push(param.clone());
        spec.inputs.push(param);
        spec.tie = Tie::Stats((b..x.len()).collect());
        ShardingRule::Spec(spec)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        LayerNorm { group: cx.group.to_vec(), ..self.clone() }.into()
    }
    /// Synchronised: each row's sum with the element count (rows + 1 values), then the squared
    /// deviations (rows), summed in f64 over the group.
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let rows = layer_norm_rows(&cx.inputs[0].shape, self.begin_norm_axis);
        let comm =
            [group_reduce(&self.group, rows + 1, DType::F64), group_reduce(&self.group, rows, DType::F64)].into_iter().flatten().collect();
        cx.per_element(6.0).with_comm(comm)
    }
}

/// Gradient of [`LayerNorm`] with respect to `x` or `gamma`. Inputs `(dy, x, gamma)`. With a
/// `group` the gradient of `x` uses the row sums over the whole normalised dimensions; the
/// gradient of `gamma` is that of this rank's slice of it from this rank's rows (summed over
/// the ranks holding the same slice by the gradient synchronisation).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormGrad {
    /// The forward [`LayerNorm`]'s first normalised dimension.
    pub begin_norm_axis: i64,
    /// The forward [`LayerNorm`]'s epsilon.
    pub eps: f64,
    /// Which gradient this op computes.
    pub of: NormGradOf,
    /// The forward [`LayerNorm`]'s group.
    pub group: Vec<usize>,
}

impl OpDef for LayerNormGrad {
    fn kind(&self) -> &'static str {
        "LayerNormGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(3)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        if cx.shape(0) != cx.shape(1) {
            return Err(cx.bad_shape(1, "the shape of dy"));
        }
        layer_norm_check(cx, self.begin_norm_axis, 1, &[2])?;
        let shape = match self.of {
            NormGradOf::Input => cx.shape(1).clone(),
            NormGradOf::Gamma => cx.shape(2).clone(),
        };
        Ok(TensorType::new(shape, d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = (0..3).find(|&i| g.needs(i)).unwrap_or(0);
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    /// Synchronised, the gradient of x sums two row statistics (2 values per row, f64) over the
    /// group, once for the pair of siblings (counted on the x node).
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let rows = layer_norm_rows(&cx.inputs[1].shape, self.begin_norm_axis);
        let group: &[usize] = if self.of == NormGradOf::Input { &self.group } else { &[] };
        cx.per_input_element(1, 8.0).with_comm(group_reduce(group, 2 * rows, DType::F64).into_iter().collect())
    }
}

/// Root-mean-square normalisation (Llama's RMSNorm, MindSpore's `RmsNorm`) over the dimensions
/// from `begin_norm_axis` on: `y = x / sqrt(mean(x²) + eps) * gamma`, `gamma` the shape of those
/// dimensions. Inputs `(x, gamma)`.
///
/// `group`: as [`LayerNorm`]'s, the world ranks (ascending) whose slices together form the
/// normalised dimensions when they are split; the executor sums each row's `Σ x²` (forward) and
/// the gradient's row sums (backward) over the group. Empty: the normalised dimensions are whole.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNorm {
    /// The first normalised dimension; negative counts from the end.
    pub begin_norm_axis: i64,
    /// Epsilon added to the mean square before the square root.
    pub eps: f64,
    /// World ranks (ascending) whose slices together form the normalised dimensions; empty when they are whole.
    pub group: Vec<usize>,
}

impl OpDef for RmsNorm {
    fn kind(&self) -> &'static str {
        "RmsNorm"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        layer_norm_check(cx, self.begin_norm_axis, 0, &[1])?;
        if self.eps.is_nan() || self.eps <= 0.0 {
            return Err(cx.bad_attr("eps", self.eps, "eps > 0"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let ins = [g.dy(), g.x(0), g.x(1)];
        for (i, which) in [(0, NormGradOf::Input), (1, NormGradOf::Gamma)] {
            if g.needs(i) {
                let d =
                    g.op(RmsNormGrad { begin_norm_axis: self.begin_norm_axis, eps: self.eps, of: which, group: self.group.clone() }, &ins)?;
                g.set(i, d);
            }
        }
        Ok(())
    }
    // Split normalised dimensions sum each row's mean square over the ranks that split them.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        let b = normalize_axis(self.begin_norm_axis, x.len()).expect("graph nodes hold axes within their input's rank");
        let mut spec = unary_spec(x, &[], "");
        spec.inputs.push((b..x.len()).map(Some).collect());
        spec.tie = Tie::Stats((b..x.len()).collect());
        ShardingRule::Spec(spec)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        RmsNorm { group: cx.group.to_vec(), ..self.clone() }.into()
    }
    /// Synchronised: each row's sum of squares with the element count (rows + 1 values, f64)
    /// summed over the group.
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let rows = layer_norm_rows(&cx.inputs[0].shape, self.begin_norm_axis);
        cx.per_element(4.0).with_comm(group_reduce(&self.group, rows + 1, DType::F64).into_iter().collect())
    }
}

/// Gradient of [`RmsNorm`] with respect to `x` or `gamma`. Inputs `(dy, x, gamma)`. With a
/// `group` the gradient of `x` uses the row sums of `dy·γ·x̂` over the whole normalised
/// dimensions; the gradient of `gamma` is that of this rank's slice from this rank's rows.
#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormGrad {
    /// The forward [`RmsNorm`]'s first normalised dimension.
    pub begin_norm_axis: i64,
    /// The forward [`RmsNorm`]'s epsilon.
    pub eps: f64,
    /// Which gradient this op computes.
    pub of: NormGradOf,
    /// The forward [`RmsNorm`]'s group.
    pub group: Vec<usize>,
}

impl OpDef for RmsNormGrad {
    fn kind(&self) -> &'static str {
        "RmsNormGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(3)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        if cx.shape(0) != cx.shape(1) {
            return Err(cx.bad_shape(1, "the shape of dy"));
        }
        layer_norm_check(cx, self.begin_norm_axis, 1, &[2])?;
        let shape = match self.of {
            NormGradOf::Input => cx.shape(1).clone(),
            NormGradOf::Gamma => cx.shape(2).clone(),
        };
        Ok(TensorType::new(shape, d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = (0..3).find(|&i| g.needs(i)).unwrap_or(0);
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    /// Synchronised, the gradient of x sums one row statistic (f64) over the group.
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let rows = layer_norm_rows(&cx.inputs[1].shape, self.begin_norm_axis);
        let group: &[usize] = if self.of == NormGradOf::Input { &self.group } else { &[] };
        cx.per_input_element(1, 6.0).with_comm(group_reduce(group, rows, DType::F64).into_iter().collect())
    }
}

/// Rotary position embedding of `x [..., T, D]` (Llama's RoPE, Hugging Face's layout): the two
/// halves of the last dimension rotated pairwise by `p · theta^(-2i/D)`, `p` the position along
/// dimension -2 counted from `offset`. Its gradient is the same op with `inverse` flipped (the
/// rotation by the opposite angles).
///
/// Every dimension but the last may be split; a rank holding positions from `b` on runs the op
/// with `offset + b` (from its block of the whole tensor).
#[derive(Clone, Debug, PartialEq)]
pub struct RotaryEmbedding {
    /// The base of the rotation frequencies (Llama: 10000; `rope_theta` in `transformers`).
    pub theta: f64,
    /// The position of the first row along dimension -2.
    pub offset: usize,
    /// Rotate by the opposite angles (the backward pass).
    pub inverse: bool,
}

impl OpDef for RotaryEmbedding {
    fn kind(&self) -> &'static str {
        "RotaryEmbedding"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        let x = cx.shape(0);
        if x.len() < 2 || !x[x.len() - 1].is_multiple_of(2) {
            return Err(cx.bad_shape(0, "rank >= 2 [..., T, D] with an even D"));
        }
        if self.theta.is_nan() || self.theta <= 1.0 {
            return Err(cx.bad_attr("theta", self.theta, "a base greater than 1"));
        }
        Ok(TensorType::new(x.clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        if g.needs(0) {
            let d = g.op(RotaryEmbedding { inverse: !self.inverse, ..self.clone() }, &[g.dy()])?;
            g.set(0, d);
        }
        Ok(())
    }
    // The last dimension pairs its halves: whole. The positions may be split (each rank knows
    // where its rows start).
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        let mut spec = unary_spec(x, &[x.len() - 1], "its halves are rotated together");
        spec.tie = Tie::Block;
        ShardingRule::Spec(spec)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        let begin = cx.block.as_ref().and_then(|b| b.begin.len().checked_sub(2).map(|i| b.begin[i])).unwrap_or(0);
        RotaryEmbedding { offset: self.offset + begin, ..self.clone() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(3.0)
    }
}

/// Fused scaled dot-product attention (MindSpore's `FlashAttentionScore`):
/// `softmax(scale · q kᵀ) v` over `q [N, KV, G, T, D]` (the `G` query heads of each of `KV`
/// key/value heads: grouped-query attention without repeating keys and values),
/// `k [N, KV, S, D]` and `v [N, KV, S, E]`, output `[N, KV, G, T, E]`. With `causal`, query row
/// `t` sits at position `row_offset + t` and sees keys `0..=row_offset + t` only (self-attention:
/// `T = S`; the last query position must be a key's). The kernel works in blocks of query rows and never holds the `[T, S]` scores whole;
/// the backward pass recomputes them.
///
/// Batch, heads, query groups, query rows and the value width may be split; the head size and
/// the keys may not (a rank holding query rows from `b` on runs the op with `row_offset + b`).
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// Multiplies the scores before the softmax (usually `1 / sqrt(D)`).
    pub scale: f64,
    /// Mask the keys after each query's position.
    pub causal: bool,
    /// The position of the first query row.
    pub row_offset: usize,
}

/// (query row, key) pairs an attention of `q [N, KV, G, T, D]` over `s` keys computes: every
/// pair, or causally (rows from position `first`) the keys up to each row's position.
fn attention_pairs(q: &[usize], s: usize, causal: Option<usize>) -> f64 {
    let heads: usize = q[..3].iter().product();
    let t = q[3];
    let per_head = match causal {
        None => (t * s) as f64,
        Some(first) => (0..t).map(|r| (first + r + 1).min(s) as f64).sum(),
    };
    heads as f64 * per_head
}

fn attention_check(cx: &InferCx<'_>, from: usize, causal: Option<usize>) -> Result<()> {
    let (q, k, v) = (cx.shape(from), cx.shape(from + 1), cx.shape(from + 2));
    if q.len() != 5 {
        return Err(cx.bad_shape(from, "[N, KV, G, T, D]"));
    }
    if k.len() != 4 || k[..2] != q[..2] || k[3] != q[4] {
        return Err(cx.bad_shape(from + 1, "[N, KV, S, D], N, KV and D those of the query"));
    }
    if v.len() != 4 || v[..3] != k[..3] {
        return Err(cx.bad_shape(from + 2, "[N, KV, S, E], N, KV and S those of the key"));
    }
    if let Some(offset) = causal.filter(|o| o + q[3] > k[2]) {
        return Err(cx.dim_mismatch("causal attention's last query position and key length", offset + q[3], k[2]));
    }
    cx.same_dtype(from, from + 1)?;
    cx.same_dtype(from, from + 2)?;
    Ok(())
}

impl OpDef for Attention {
    fn kind(&self) -> &'static str {
        "Attention"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(3)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        attention_check(cx, 0, self.causal.then_some(self.row_offset))?;
        if !self.scale.is_finite() {
            return Err(cx.bad_attr("scale", self.scale, "a finite number"));
        }
        let (q, v) = (cx.shape(0), cx.shape(2));
        Ok(TensorType::new(vec![q[0], q[1], q[2], q[3], v[3]], d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let ins = [g.dy(), g.x(0), g.x(1), g.x(2)];
        for (i, of) in [AttentionGradOf::Query, AttentionGradOf::Key, AttentionGradOf::Value].into_iter().enumerate() {
            if g.needs(i) {
                let d = g.op(AttentionGrad { scale: self.scale, causal: self.causal, row_offset: self.row_offset, of }, &ins)?;
                g.set(i, d);
            }
        }
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let (q, k, v) = (cx.shape(0), cx.shape(1), cx.shape(2));
        let dims = vec![
            LogicalDim::free(q[0]),
            LogicalDim::free(q[1]),
            LogicalDim::free(q[2]),
            LogicalDim::free(q[3]),
            LogicalDim::fixed(q[4], "the scores sum over the whole head size"),
            LogicalDim::fixed(k[2], "the softmax runs over every key"),
            LogicalDim::free(v[3]),
        ];
        let inputs = vec![
            vec![Some(0), Some(1), Some(2), Some(3), Some(4)],
            vec![Some(0), Some(1), Some(5), Some(4)],
            vec![Some(0), Some(1), Some(5), Some(6)],
        ];
        let output = vec![Some(0), Some(1), Some(2), Some(3), Some(6)];
        ShardingRule::Spec(OpSpec { dims, inputs, output, mean_over_reduced: false, tie: Tie::Block })
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        let begin = cx.block.as_ref().and_then(|b| b.begin.get(3).copied()).unwrap_or(0);
        Attention { row_offset: self.row_offset + begin, ..self.clone() }.into()
    }
    /// Two products over the keys each query row sees per query head (scores, then values),
    /// and the softmax.
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let (q, v) = (&cx.inputs[0].shape, &cx.inputs[2].shape);
        let pairs = attention_pairs(q, v[2], self.causal.then_some(self.row_offset));
        OpCost { flops: pairs * (2.0 * (q[4] + v[3]) as f64 + 5.0), bytes: cx.traffic(), comm: Vec::new() }
    }
}

/// Which input an [`AttentionGrad`] computes the gradient of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionGradOf {
    /// `q`.
    Query,
    /// `k`.
    Key,
    /// `v`.
    Value,
}

/// Gradient of [`Attention`] with respect to `q`, `k` or `v`. Inputs `(dy, q, k, v)`; the
/// executor computes the three together once (recomputing the probabilities block by block).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrad {
    /// The forward [`Attention`]'s scale.
    pub scale: f64,
    /// The forward [`Attention`]'s mask.
    pub causal: bool,
    /// The forward [`Attention`]'s first query position.
    pub row_offset: usize,
    /// Which gradient this op computes.
    pub of: AttentionGradOf,
}

impl OpDef for AttentionGrad {
    fn kind(&self) -> &'static str {
        "AttentionGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(4)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        attention_check(cx, 1, self.causal.then_some(self.row_offset))?;
        cx.same_dtype(0, 1)?;
        let (q, v) = (cx.shape(1), cx.shape(3));
        if *cx.shape(0) != [q[0], q[1], q[2], q[3], v[3]] {
            return Err(cx.bad_shape(0, "the attention output's shape [N, KV, G, T, E]"));
        }
        let i = match self.of {
            AttentionGradOf::Query => 1,
            AttentionGradOf::Key => 2,
            AttentionGradOf::Value => 3,
        };
        Ok(TensorType::new(cx.shape(i).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = (0..4).find(|&i| g.needs(i)).unwrap_or(0);
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    /// The scores again and four products (dv, dp, dq, dk): `2 T S (3 D + 2 E)` per query head,
    /// computed once for the three siblings (a third counted on each).
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        let (q, v) = (&cx.inputs[1].shape, &cx.inputs[3].shape);
        let pairs = attention_pairs(q, v[2], self.causal.then_some(self.row_offset));
        OpCost { flops: 2.0 * pairs * (3 * q[4] + 2 * v[3]) as f64 / 3.0, bytes: cx.traffic(), comm: Vec::new() }
    }
}

/// A mixture of experts' router (Mixtral's): of each row of expert probabilities `[.., E]`, the
/// `k` largest kept, renormalised over the chosen when `renormalize`, the rest zero: the
/// weights that combine each token's expert outputs. With `mask`, 1 for the chosen and 0 for
/// the rest instead: the router's assignments, which the load-balancing loss counts; no
/// gradient flows through a choice. Every dimension but the experts' splits. Under a
/// `capacity` each expert takes at most that many rows, granted in MindSpore's order (every
/// row's first choice, in row order, before any second one); a refused choice is dropped, and
/// the rows are counted whole (no dimension splits).
#[derive(Clone, Debug, PartialEq)]
pub struct RouterTopK {
    /// Experts per token.
    pub k: usize,
    /// Divide the kept probabilities by their sum (Mixtral's `norm_topk_prob`).
    pub renormalize: bool,
    /// Give the assignments (1 chosen, 0 not) rather than the weights.
    pub mask: bool,
    /// Rows each expert takes at most (MindSpore's expert capacity); None: every choice kept.
    pub capacity: Option<usize>,
}

fn router_check(cx: &InferCx<'_>, x: usize, k: usize) -> Result<()> {
    let e = cx.shape(x).last().copied().unwrap_or(0);
    if cx.shape(x).is_empty() {
        return Err(cx.bad_shape(x, "[.., experts]"));
    }
    if k == 0 || k > e {
        return Err(cx.bad_attr("k", k, "1 <= k <= the experts (the last dimension)"));
    }
    Ok(())
}

impl OpDef for RouterTopK {
    fn kind(&self) -> &'static str {
        "RouterTopK"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        router_check(cx, 0, self.k)?;
        if self.capacity == Some(0) || (self.mask && self.capacity.is_some()) {
            return Err(cx.bad_attr("capacity", self.capacity.unwrap_or(0), "at least 1 row per expert, and none for the mask form"));
        }
        Ok(TensorType::new(cx.shape(0).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // The assignments are piecewise constant: no gradient.
        if g.needs(0) && !self.mask {
            let d = g.op(RouterTopKGrad { k: self.k, renormalize: self.renormalize, capacity: self.capacity }, &[g.dy(), g.x(0)])?;
            g.set(0, d);
        }
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        if self.capacity.is_some() {
            return ShardingRule::Spec(unary_spec(
                x,
                &(0..x.len()).collect::<Vec<_>>(),
                "an expert's capacity counts every token in order",
            ));
        }
        ShardingRule::Spec(unary_spec(x, &[x.len() - 1], "each token chooses among all the experts"))
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(2.0 * self.k as f64)
    }
}

/// Gradient of [`RouterTopK`]. Inputs `(dy, p)`, `p` the forward's probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterTopKGrad {
    /// The forward [`RouterTopK`]'s experts per token.
    pub k: usize,
    /// The forward [`RouterTopK`]'s renormalisation.
    pub renormalize: bool,
    /// The forward [`RouterTopK`]'s capacity.
    pub capacity: Option<usize>,
}

impl OpDef for RouterTopKGrad {
    fn kind(&self) -> &'static str {
        "RouterTopKGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.same_dtype(0, 1)?;
        if cx.shape(0) != cx.shape(1) {
            return Err(cx.bad_shape(0, "the probabilities' shape"));
        }
        router_check(cx, 1, self.k)?;
        Ok(TensorType::new(cx.shape(1).clone(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let i = (0..2).find(|&i| g.needs(i)).unwrap_or(0);
        Err(g.not_differentiable(i))
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        backward_rule()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(1, 2.0 * self.k as f64)
    }
}

/// Zeroes each element with probability `p` and scales the rest by `1 / (1 - p)`. The mask is a
/// function of `seed`, the step number and the element's index in the whole tensor only, so
/// the backward pass (the same op on `dy`) draws the same mask, and a sharded run draws, slice
/// by slice, the mask of the unsharded tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Dropout {
    /// Drop probability, in `[0, 1)`.
    pub p: f64,
    /// Seed of the mask.
    pub seed: u64,
    /// Set when the input is one block of a larger tensor: the mask is that block of the
    /// larger tensor's mask. None: the input is the whole tensor.
    pub block: Option<DropoutBlock>,
}

impl OpDef for Dropout {
    fn kind(&self) -> &'static str {
        "Dropout"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        if !(0.0..1.0).contains(&self.p) {
            return Err(cx.bad_attr("p", self.p, "a drop probability in [0, 1)"));
        }
        if let Some(b) = &self.block {
            let x = cx.shape(0);
            let fits = b.global_shape.len() == x.len()
                && b.begin.len() == x.len()
                && x.iter().zip(&b.begin).zip(&b.global_shape).all(|((d, o), g)| o.checked_add(*d).is_some_and(|end| end <= *g));
            if !fits {
                return Err(cx.bad_attr("block", (&b.begin, &b.global_shape), "a block of the input's rank inside the global shape"));
            }
        }
        Ok(TensorType::new(cx.shape(0).clone(), cx.float(0)?))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(self.clone(), &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    // Split freely; each slice draws its block of the whole tensor's mask.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let mut spec = unary_spec(cx.out(), &[], "");
        spec.tie = Tie::Block;
        ShardingRule::Spec(spec)
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Dropout { block: cx.block.clone(), ..self.clone() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_element(2.0)
    }
}

/// Mean softmax cross-entropy of `logits [N, C]` against integer `labels [N]`; a scalar.
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxCrossEntropy;

impl OpDef for SoftmaxCrossEntropy {
    fn kind(&self) -> &'static str {
        "SoftmaxCrossEntropyWithLogits"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let d = cx.float(0)?;
        cx.integer(1)?;
        cx.rank(0, 2, "rank 2 (N, C)")?;
        cx.rank(1, 1, "rank 1 (N)")?;
        if cx.shape(0)[0] != cx.shape(1)[0] {
            return Err(cx.dim_mismatch("batch sizes of logits and labels", cx.shape(0)[0], cx.shape(1)[0]));
        }
        Ok(TensorType::new(Vec::new(), d))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // (softmax(logits) - onehot(labels)) * dy / N
        let (logits, labels, dy) = (g.x(0), g.x(1), g.dy());
        let s = g.shape(logits);
        let dtype: DType = g.dtype(logits);
        let p = g.op(crate::ops::Softmax { axis: -1, group: Vec::new() }, &[logits])?;
        let oh = g.op(crate::ops::OneHot { depth: s[1], on_value: 1.0, off_value: 0.0, dtype }, &[labels])?;
        let diff = g.sub(p, oh)?;
        let scaled = g.scale(diff, 1.0 / s[0].max(1) as f64)?;
        let d: NodeId = g.mul(scaled, dy)?;
        g.set(0, d);
        Ok(())
    }
    // The batch splits (a partial sum of the mean), the classes do not.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let logits = cx.shape(0);
        ShardingRule::Spec(OpSpec {
            dims: vec![LogicalDim::reduced(logits[0]), LogicalDim::fixed(logits[1], "the class dimension cannot be split")],
            inputs: vec![vec![Some(0), Some(1)], vec![Some(0)]],
            output: vec![],
            mean_over_reduced: true,
            tie: Tie::None,
        })
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        SoftmaxCrossEntropy.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 5.0)
    }
}
