//! Communication ops, first-class in the graph so the planner can insert them and autodiff can
//! differentiate through them. `group` lists the global ranks taking part; on one device (a
//! group of one rank) every one of them is the identity.
//!
//! Backward rules (the adjoint of each collective):
//! | forward | backward |
//! |---|---|
//! | AllReduce(sum) | AllReduce(sum) |
//! | AllReduce(mean) | AllReduce(mean) |
//! | AllGather(dim) | ReduceScatter(dim) |
//! | ReduceScatter(dim) | AllGather(dim) |
//! | AllToAll(split, concat) | AllToAll(concat, split) |
//! | Broadcast(root) | Reduce(sum, root) |
//! | Reduce(sum, root) | Broadcast(root) |
//! | Send(peer) | Recv(peer) |
//! | Recv(peer) | Send(peer) |

use std::fmt;

use super::GradCx;
use crate::error::Result;
use crate::ops::{Arity, InferCx, OpDef, OpKind};
use crate::sharding::{collective_cost, Collective, CommCall, CostCx, LocalCx, OpCost, RuleCx, ShardingRule};
use crate::types::TensorType;

/// Communication ops are inserted by the planner, or written by hand in hybrid_parallel graphs.
fn placed_by_planner() -> ShardingRule {
    ShardingRule::Unsupported(
        "communication is inserted automatically in semi_auto_parallel; write collectives by hand under hybrid_parallel",
    )
}

/// A point-to-point call between this rank and `peer`.
fn pair_call(cx: &CostCx<'_>, kind: Collective, peer: usize, bytes: usize) -> OpCost {
    let group = if cx.rank < peer { vec![cx.rank, peer] } else { vec![peer, cx.rank] };
    cx.movement().with_comm(vec![CommCall { kind, group, bytes }])
}

/// The reduction of AllReduce / Reduce / ReduceScatter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean: the sum divided by the group size.
    Mean,
    /// Element-wise maximum (not differentiable).
    Max,
    /// Element-wise minimum (not differentiable).
    Min,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        })
    }
}

fn check_group(cx: &InferCx<'_>, group: &[usize]) -> Result<usize> {
    let mut sorted = group.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if group.is_empty() || sorted.len() != group.len() {
        return Err(cx.bad_attr("group", group, "a non-empty list of distinct ranks"));
    }
    Ok(group.len())
}

fn linear_reduce(g: &mut GradCx<'_>, op: ReduceOp) -> Result<ReduceOp> {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => Ok(op),
        ReduceOp::Max | ReduceOp::Min => Err(g.not_differentiable(0)),
    }
}

/// Element-wise reduction across `group`; every rank gets the result.
#[derive(Clone, Debug, PartialEq)]
pub struct AllReduce {
    /// The reduction.
    pub op: ReduceOp,
    /// The global ranks taking part: non-empty and distinct.
    pub group: Vec<usize>,
}

impl OpDef for AllReduce {
    fn kind(&self) -> &'static str {
        "AllReduce"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        check_group(cx, &self.group)?;
        Ok(cx.ty(0).clone())
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let op = linear_reduce(g, self.op)?;
        let d = g.op(AllReduce { op, group: self.group.clone() }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        collective_cost(cx, Collective::AllReduce, &self.group)
    }
}

/// Concatenation of every rank's tensor along `dim`, in group order.
#[derive(Clone, Debug, PartialEq)]
pub struct AllGather {
    /// The dimension to concatenate along, counted from 0.
    pub dim: usize,
    /// The global ranks taking part, in concatenation order: non-empty and distinct.
    pub group: Vec<usize>,
}

impl OpDef for AllGather {
    fn kind(&self) -> &'static str {
        "AllGather"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let n = check_group(cx, &self.group)?;
        if self.dim >= cx.shape(0).len() {
            return Err(cx.bad_attr("dim", self.dim, "a dimension of the input"));
        }
        let mut s = cx.shape(0).clone();
        s[self.dim] *= n;
        Ok(TensorType::new(s, cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(ReduceScatter { op: ReduceOp::Sum, dim: self.dim, group: self.group.clone() }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        collective_cost(cx, Collective::AllGather, &self.group)
    }
}

/// Reduction across `group`, rank `k` of the group keeping block `k` of `dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceScatter {
    /// The reduction.
    pub op: ReduceOp,
    /// The dimension to scatter, counted from 0; its size must be divisible by the group size.
    pub dim: usize,
    /// The global ranks taking part, in block order: non-empty and distinct.
    pub group: Vec<usize>,
}

impl OpDef for ReduceScatter {
    fn kind(&self) -> &'static str {
        "ReduceScatter"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let n = check_group(cx, &self.group)?;
        let s = cx.shape(0);
        if self.dim >= s.len() || !s[self.dim].is_multiple_of(n) {
            return Err(cx.bad_attr("dim", self.dim, "a dimension of the input divisible by the group size"));
        }
        let mut s = s.clone();
        s[self.dim] /= n;
        Ok(TensorType::new(s, cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let op = linear_reduce(g, self.op)?;
        let gathered = g.op(AllGather { dim: self.dim, group: self.group.clone() }, &[g.dy()])?;
        let d = if op == ReduceOp::Mean { g.scale(gathered, 1.0 / self.group.len() as f64)? } else { gathered };
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        collective_cost(cx, Collective::ReduceScatter, &self.group)
    }
}

/// Splits `split_dim` into one block per rank, exchanges blocks, concatenates along `concat_dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct AllToAll {
    /// The dimension split into one block per rank, counted from 0; its size must be divisible by the group size.
    pub split_dim: usize,
    /// The dimension the received blocks are concatenated along, counted from 0.
    pub concat_dim: usize,
    /// The global ranks taking part, in block order: non-empty and distinct.
    pub group: Vec<usize>,
}

impl OpDef for AllToAll {
    fn kind(&self) -> &'static str {
        "AllToAll"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        let n = check_group(cx, &self.group)?;
        let s = cx.shape(0);
        if self.split_dim >= s.len() || !s[self.split_dim].is_multiple_of(n) {
            return Err(cx.bad_attr("split_dim", self.split_dim, "a dimension of the input divisible by the group size"));
        }
        if self.concat_dim >= s.len() {
            return Err(cx.bad_attr("concat_dim", self.concat_dim, "a dimension of the input"));
        }
        let mut s = s.clone();
        s[self.split_dim] /= n;
        s[self.concat_dim] *= n;
        Ok(TensorType::new(s, cx.dtype(0)))
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(AllToAll { split_dim: self.concat_dim, concat_dim: self.split_dim, group: self.group.clone() }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        collective_cost(cx, Collective::AllToAll, &self.group)
    }
}

/// Every rank receives `root`'s tensor (`root` is a global rank in `group`).
#[derive(Clone, Debug, PartialEq)]
pub struct Broadcast {
    /// The global rank whose tensor is sent; must be in `group`.
    pub root: usize,
    /// The global ranks taking part: non-empty and distinct.
    pub group: Vec<usize>,
}

impl OpDef for Broadcast {
    fn kind(&self) -> &'static str {
        "Broadcast"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        check_group(cx, &self.group)?;
        if !self.group.contains(&self.root) {
            return Err(cx.bad_attr("root", self.root, "a rank of the group"));
        }
        Ok(cx.ty(0).clone())
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(Reduce { op: ReduceOp::Sum, root: self.root, group: self.group.clone() }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        collective_cost(cx, Collective::Broadcast, &self.group)
    }
}

/// Reduction across `group` delivered to `root`; the other ranks get zeros.
#[derive(Clone, Debug, PartialEq)]
pub struct Reduce {
    /// The reduction.
    pub op: ReduceOp,
    /// The global rank that receives the result; must be in `group`.
    pub root: usize,
    /// The global ranks taking part: non-empty and distinct.
    pub group: Vec<usize>,
}

impl OpDef for Reduce {
    fn kind(&self) -> &'static str {
        "Reduce"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        check_group(cx, &self.group)?;
        if !self.group.contains(&self.root) {
            return Err(cx.bad_attr("root", self.root, "a rank of the group"));
        }
        Ok(cx.ty(0).clone())
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let op = linear_reduce(g, self.op)?;
        let b = g.op(Broadcast { root: self.root, group: self.group.clone() }, &[g.dy()])?;
        let d = if op == ReduceOp::Mean { g.scale(b, 1.0 / self.group.len() as f64)? } else { b };
        g.set(0, d);
        Ok(())
    }
    // Executed as an all-reduce; ranks other than the root then hold zeros.
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        collective_cost(cx, Collective::AllReduce, &self.group)
    }
}

/// Sends the input to global rank `peer` (pipeline stage boundary). Its output is the input,
/// which keeps the send ordered before its users; on one device it is the identity.
#[derive(Clone, Debug, PartialEq)]
pub struct Send {
    /// The receiving global rank.
    pub peer: usize,
    /// Tag pairing this send with the matching [`Recv`] on `peer` (MindSpore's `sr_tag`).
    pub tag: u32,
}

impl OpDef for Send {
    fn kind(&self) -> &'static str {
        "Send"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        Ok(cx.ty(0).clone())
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(Recv { peer: self.peer, tag: self.tag }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        pair_call(cx, Collective::Send, self.peer, CostCx::bytes_of(&cx.inputs[0]))
    }
}

/// Receives a tensor from global rank `peer`. Its input gives the shape and dtype (and is the
/// value itself on one device, where Recv is the identity).
#[derive(Clone, Debug, PartialEq)]
pub struct Recv {
    /// The sending global rank.
    pub peer: usize,
    /// Tag pairing this receive with the matching [`Send`] on `peer` (MindSpore's `sr_tag`).
    pub tag: u32,
}

impl OpDef for Recv {
    fn kind(&self) -> &'static str {
        "Receive"
    }
    fn arity(&self) -> Arity {
        Arity::Exactly(1)
    }
    fn infer(&self, cx: &InferCx<'_>) -> Result<TensorType> {
        Ok(cx.ty(0).clone())
    }
    fn grad(&self, g: &mut GradCx<'_>) -> Result<()> {
        let d = g.op(Send { peer: self.peer, tag: self.tag }, &[g.dy()])?;
        g.set(0, d);
        Ok(())
    }
    fn sharding(&self, _: &RuleCx<'_>) -> ShardingRule {
        placed_by_planner()
    }
    fn local(&self, _: &LocalCx<'_>) -> OpKind {
        self.clone().into()
    }
    fn cost(&self, cx: &CostCx<'_>) -> OpCost {
        pair_call(cx, Collective::Recv, self.peer, 0)
    }
}
