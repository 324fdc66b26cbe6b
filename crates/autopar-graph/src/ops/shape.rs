//! Shape manipulation, broadcasting, concatenation, slicing and index ops.

use super::GradCx;
use crate::error::Result;
use crate::ops::activation::BACKWARD_OP;
use crate::ops::{Arity, InferCx, OpDef, OpKind};
use crate::sharding::{same_dims, unary_spec, CostCx, LocalCx, LogicalDim, OpCost, OpSpec, RuleCx, ShardingRule, TableShard, Tie};
use crate::types::{broadcast_shapes, normalize_axis, DType, Shape, TensorType};

/// An axis attribute of a node whose shapes were checked when it was built.
fn checked_axis(a: i64, rank: usize) -> usize {
    normalize_axis(a, rank).expect("graph nodes hold axes within their input's rank")
}

/// View with a new shape of the same size; one entry may be `-1` (inferred).
#[derive(Clone, Debug, PartialEq)]
pub struct Reshape {
    /// The new shape; at most one entry may be `-1`, inferred from the element count.
    pub shape: Vec<i64>,
}

impl OpDef for Reshape {
    fn kind(&self) -> &'static str {
        "Reshape"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let total: usize = cx.shape(0).iter().product();
        let mut out = Vec::with_capacity(self.shape.len());
        let mut infer_at = None;
        for (i, &d) in self.shape.iter().enumerate() {
            match d {
                -1 if infer_at.is_none() => {
                    infer_at = Some(i);
                    out.push(1);
                }
                d if d >= 0 => out.push(d as usize),
                _ => return Err(cx.bad_attr("shape", &self.shape, "sizes >= 0 and at most one -1")),
            }
        }
        let known: usize = out.iter().product();
        if let Some(i) = infer_at {
            if known == 0 || !total.is_multiple_of(known) {
                return Err(cx.bad_attr("shape", &self.shape, "a shape with as many elements as the input"));
            }
            out[i] = total / known;
        } else if known != total {
            return Err(cx.bad_attr("shape", &self.shape, "a shape with as many elements as the input"));
        }
        Ok(TensorType::new(out, cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.reshape(g.dy(), &g.x_shape(0))?;
        g.set(0, d);
        Ok(())
    }
    // The output's layout follows the input's (split on the leading dimension of a group).
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::FollowInput
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Reshape { shape: cx.output.iter().map(|&d| d as i64).collect() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// Permutes dimensions: output dimension `i` is input dimension `perm[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Transpose {
    /// The permutation: output dimension `i` is input dimension `perm[i]`.
    pub perm: Vec<usize>,
}

impl OpDef for Transpose {
    fn kind(&self) -> &'static str {
        "Transpose"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let s = cx.shape(0);
        let mut seen = vec![false; s.len()];
        if self.perm.len() != s.len() || self.perm.iter().any(|&p| p >= s.len() || std::mem::replace(&mut seen[p], true)) {
            return Err(cx.bad_attr("perm", &self.perm, "a permutation of the input's dimensions"));
        }
        Ok(TensorType::new(self.perm.iter().map(|&p| s[p]).collect::<Shape>(), cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let mut inv = vec![0; self.perm.len()];
        for (i, &p) in self.perm.iter().enumerate() {
            inv[p] = i;
        }
        let d = g.op(Transpose { perm: inv }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        ShardingRule::Spec(OpSpec {
            dims: x.iter().map(|&s| LogicalDim::free(s)).collect(),
            inputs: vec![same_dims(x)],
            output: self.perm.iter().map(|&p| Some(p)).collect(),
            mean_over_reduced: false,
            tie: Tie::None,
        })
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// `[N, d1, d2, ...] -> [N, d1 * d2 * ...]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Flatten;

impl OpDef for Flatten {
    fn kind(&self) -> &'static str {
        "Flatten"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let s = cx.shape(0);
        if s.is_empty() {
            return Err(cx.bad_shape(0, "rank >= 1"));
        }
        Ok(TensorType::new(vec![s[0], s[1..].iter().product()], cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.reshape(g.dy(), &g.x_shape(0))?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::FollowInput
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        Flatten.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// Broadcasts to `shape` (NumPy rules).
#[derive(Clone, Debug, PartialEq)]
pub struct BroadcastTo {
    /// The output shape.
    pub shape: Shape,
}

impl OpDef for BroadcastTo {
    fn kind(&self) -> &'static str {
        "BroadcastTo"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        if broadcast_shapes(cx.shape(0), &self.shape).as_ref() != Some(&self.shape) {
            return Err(cx.bad_attr("shape", &self.shape, "a shape the input broadcasts to"));
        }
        Ok(TensorType::new(self.shape.clone(), cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.sum_to(g.dy(), &g.x_shape(0))?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Replicated
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        BroadcastTo { shape: cx.output.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// Sums a tensor down to `shape`, a shape that broadcasts to the input's (the adjoint of
/// [`BroadcastTo`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SumTo {
    /// The output shape; it must broadcast to the input's shape.
    pub shape: Shape,
}

impl OpDef for SumTo {
    fn kind(&self) -> &'static str {
        "SumTo"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        if broadcast_shapes(cx.shape(0), &self.shape).as_ref() != Some(cx.shape(0)) {
            return Err(cx.bad_attr("shape", &self.shape, "a shape that broadcasts to the input's"));
        }
        Ok(TensorType::new(self.shape.clone(), cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.broadcast_to(g.dy(), &g.x_shape(0))?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Replicated
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        SumTo { shape: cx.output.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(0, 1.0)
    }
}

/// Concatenation along `axis`; all other dimensions must agree.
#[derive(Clone, Debug, PartialEq)]
pub struct Concat {
    /// The axis to concatenate along; negative counts from the end.
    pub axis: i64,
}

impl OpDef for Concat {
    fn kind(&self) -> &'static str {
        "Concat"
    }
    fn arity(&self) -> Arity {
        Arity::AtLeast(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let axis = cx.axis(0, "axis", self.axis)?;
        let first = cx.shape(0);
        let mut out = first.clone();
        out[axis] = 0;
        for i in 0..cx.inputs.len() {
            cx.same_dtype(0, i)?;
            let s = cx.shape(i);
            if s.len() != first.len() {
                return Err(cx.bad_shape(i, "the rank of input 0"));
            }
            for d in 0..s.len() {
                if d != axis && s[d] != first[d] {
                    return Err(cx.dim_mismatch("non-concatenated dimensions", first[d], s[d]));
                }
            }
            out[axis] += s[axis];
        }
        Ok(TensorType::new(out, cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let dy = g.dy();
        let n = g.x_shape(0).len();
        let axis = normalize_axis(self.axis, n).expect("checked at build");
        let mut offset = 0;
        for i in 0..g.num_inputs() {
            let shape = g.x_shape(i);
            if g.needs(i) {
                let mut begin = vec![0; n];
                begin[axis] = offset;
                let d = g.op(Slice { begin, size: shape.clone() }, &[dy])?;
                g.set(i, d);
            }
            offset += shape[axis];
        }
        Ok(())
    }
    // Any dimension but the concatenation axis.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let out = cx.out();
        let a = checked_axis(self.axis, out.len());
        let dims = out
            .iter()
            .enumerate()
            .map(|(d, &s)| if d == a { LogicalDim::fixed(s, "the concatenation axis cannot be split") } else { LogicalDim::free(s) })
            .collect();
        let inputs = cx.inputs.iter().map(|t| (0..t.shape.len()).map(|d| (d != a).then_some(d)).collect()).collect();
        ShardingRule::Spec(OpSpec {
            dims,
            inputs,
            output: (0..out.len()).map(|d| (d != a).then_some(d)).collect(),
            mean_over_reduced: false,
            tie: Tie::None,
        })
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// The block `begin .. begin + size`.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// Start of the block in each dimension.
    pub begin: Vec<usize>,
    /// Size of the block in each dimension.
    pub size: Vec<usize>,
}

impl OpDef for Slice {
    fn kind(&self) -> &'static str {
        "Slice"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let s = cx.shape(0);
        if self.begin.len() != s.len() || self.size.len() != s.len() {
            return Err(cx.bad_attr("begin/size", (&self.begin, &self.size), "one begin and one size per input dimension"));
        }
        if (0..s.len()).any(|d| self.begin[d] + self.size[d] > s[d]) {
            return Err(cx.bad_attr("begin/size", (&self.begin, &self.size), "a block inside the input"));
        }
        Ok(TensorType::new(self.size.clone(), cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let xs = g.x_shape(0);
        let after = (0..xs.len()).map(|d| xs[d] - self.begin[d] - self.size[d]).collect();
        let d = g.op(Pad { before: self.begin.clone(), after }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    // Any dimension the slice keeps whole.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let x = cx.shape(0);
        let fixed: Vec<usize> = (0..x.len()).filter(|&d| self.begin[d] != 0 || self.size[d] != x[d]).collect();
        ShardingRule::Spec(unary_spec(x, &fixed, "a sliced dimension cannot be split"))
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        // A split dimension is taken whole (it was not sliced), so it starts at 0.
        let begin = self.begin.iter().zip(&self.size).zip(cx.output).map(|((&b, &sz), &l)| if sz == l { b } else { 0 }).collect();
        Slice { begin, size: cx.output.to_vec() }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// Zero padding: `before[d]` zeros before and `after[d]` after along each dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct Pad {
    /// Zeros added before the data, per dimension.
    pub before: Vec<usize>,
    /// Zeros added after the data, per dimension.
    pub after: Vec<usize>,
}

impl OpDef for Pad {
    fn kind(&self) -> &'static str {
        "Pad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let s = cx.shape(0);
        if self.before.len() != s.len() || self.after.len() != s.len() {
            return Err(cx.bad_attr("before/after", (&self.before, &self.after), "one padding pair per input dimension"));
        }
        Ok(TensorType::new((0..s.len()).map(|d| self.before[d] + s[d] + self.after[d]).collect::<Shape>(), cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(Slice { begin: self.before.clone(), size: g.x_shape(0) }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    // Any dimension without padding.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let (x, out) = (cx.shape(0), cx.out());
        let fixed: Vec<usize> = (0..x.len()).filter(|&d| self.before[d] != 0 || self.after[d] != 0).collect();
        let mut spec = unary_spec(x, &fixed, "a padded dimension cannot be split");
        for &d in &fixed {
            spec.dims[d].size = out[d];
            spec.inputs[0][d] = None;
            spec.output[d] = None;
        }
        ShardingRule::Spec(spec)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// `params` indexed by integer `indices` along `axis` (embedding lookup with axis 0).
/// Inputs `(params, indices)`; output `params[..axis] ++ indices.shape ++ params[axis+1..]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gather {
    /// The axis of `params` to index; negative counts from the end.
    pub axis: i64,
    /// Set when `params` holds only some rows (along `axis`) of a table split across ranks.
    pub shard: Option<TableShard>,
}

impl OpDef for Gather {
    fn kind(&self) -> &'static str {
        "Gather"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let axis = cx.axis(0, "axis", self.axis)?;
        cx.integer(1)?;
        let p = cx.shape(0);
        if let Some(sh) = self.shard {
            if sh.start.checked_add(p[axis]).is_none_or(|end| end > sh.total) {
                return Err(cx.bad_attr("shard", (sh.start, sh.total), "rows start..start + len within the table's total rows"));
            }
        }
        let mut out = p[..axis].to_vec();
        out.extend_from_slice(cx.shape(1));
        out.extend_from_slice(&p[axis + 1..]);
        Ok(TensorType::new(out, cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let ps = g.x_shape(0);
        let axis = normalize_axis(self.axis, ps.len()).expect("checked at build");
        let d = g.op(GatherGrad { axis, dim_size: ps[axis], shard: self.shard }, &[g.x(1), g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    // table [V, H..] gathered along axis 0 by indices [B..] -> [B.., H..]: the indices and the
    // hidden dimensions split freely; a split vocabulary makes each rank gather its own rows
    // (zeros elsewhere), a partial sum like a split contraction.
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let (table, idx) = (cx.shape(0), cx.shape(1));
        if checked_axis(self.axis, table.len()) != 0 {
            return ShardingRule::Replicated;
        }
        let mut dims: Vec<LogicalDim> = idx.iter().map(|&s| LogicalDim::free(s)).collect();
        let vocab = dims.len();
        dims.push(LogicalDim::reduced(table[0]));
        let mut tmap = vec![Some(vocab)];
        for &s in &table[1..] {
            tmap.push(Some(dims.len()));
            dims.push(LogicalDim::free(s));
        }
        let output: Vec<Option<usize>> = (0..idx.len()).map(Some).chain((vocab + 1..dims.len()).map(Some)).collect();
        ShardingRule::Spec(OpSpec {
            dims,
            inputs: vec![tmap, same_dims(idx)],
            output,
            mean_over_reduced: false,
            tie: Tie::Rows { input: 0, dim: 0 },
        })
    }
    fn local(&self, cx: &LocalCx<'_>) -> OpKind {
        Gather { axis: self.axis, shard: cx.rows }.into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}

/// Scatter-add of `dy` rows into a zero tensor of the gathered parameter's shape (the adjoint of
/// [`Gather`]; MindSpore's `UnsortedSegmentSum`). Inputs `(indices, dy)`.
///
/// With a `shard` the result is the gradient of this rank's rows only.
#[derive(Clone, Debug, PartialEq)]
pub struct GatherGrad {
    /// The gathered axis, counted from 0.
    pub axis: usize,
    /// Size of the gathered parameter along `axis` (the output's size there).
    pub dim_size: usize,
    /// Set when the parameter holds only some rows of a table split across ranks (as for [`Gather`]).
    pub shard: Option<TableShard>,
}

impl OpDef for GatherGrad {
    fn kind(&self) -> &'static str {
        "GatherGrad"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(2)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.integer(0)?;
        let (ir, dy) = (cx.shape(0).len(), cx.shape(1));
        if dy.len() < self.axis + ir {
            return Err(cx.bad_shape(1, "rank >= axis + rank of the indices"));
        }
        if dy[self.axis..self.axis + ir] != cx.shape(0)[..] {
            return Err(cx.bad_shape(1, "the indices' shape at the gathered axis"));
        }
        let mut out = dy[..self.axis].to_vec();
        out.push(self.dim_size);
        out.extend_from_slice(&dy[self.axis + ir..]);
        Ok(TensorType::new(out, cx.dtype(1)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        // Linear in dy: the adjoint of a scatter-add is the gather.
        let d = g.op(Gather { axis: self.axis as i64, shard: self.shard }, &[g.dy(), g.x(0)])?;
        g.set(1, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        ShardingRule::Unsupported(BACKWARD_OP)
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.per_input_element(1, 1.0)
    }
}

/// One-hot encoding of integer `indices` along a new last axis of size `depth`.
#[derive(Clone, Debug, PartialEq)]
pub struct OneHot {
    /// Size of the new last axis (the number of classes); at least 1.
    pub depth: usize,
    /// Value at the index's position.
    pub on_value: f64,
    /// Value everywhere else.
    pub off_value: f64,
    /// Output element type.
    pub dtype: DType,
}

impl OpDef for OneHot {
    fn kind(&self) -> &'static str {
        "OneHot"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        cx.integer(0)?;
        if self.depth == 0 {
            return Err(cx.bad_attr("depth", self.depth, "depth >= 1"));
        }
        let mut out = cx.shape(0).clone();
        out.push(self.depth);
        Ok(TensorType::new(out, self.dtype))
    }
    fn grad(&self, _: &mut GradCx<'_>) -> Result<()> {
        Ok(()) // integer input: no gradient
    }
    fn sharding(&self, cx: &RuleCx<'_>) -> ShardingRule {
        let (idx, out) = (cx.shape(0), cx.out());
        let mut dims: Vec<LogicalDim> = idx.iter().map(|&s| LogicalDim::free(s)).collect();
        dims.push(LogicalDim::fixed(out[out.len() - 1], "the one-hot depth cannot be split"));
        ShardingRule::Spec(OpSpec {
            dims,
            inputs: vec![same_dims(idx)],
            output: (0..out.len()).map(Some).collect(),
            mean_over_reduced: false,
            tie: Tie::None,
        })
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        cx.movement()
    }
}
