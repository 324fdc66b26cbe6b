//! hybrid_parallel: every rank's hand-written graph checked and described by the plan type.

use std::collections::{BTreeMap, BTreeSet};

use autopar_graph::{CostCx, Graph, Node, NodeId, OpKind, TensorType};
use autopar_layout::{DeviceAxis, DeviceMatrix, TensorLayout};

use super::buckets::fusion_buckets;
use super::layouts::replicated_plan;
use super::with_loss_first;
use crate::context::{DatasetStrategy, ParallelContext, ParallelMode};
use crate::error::{HybridProblem, ParallelError, Result, TransferProblem};
use crate::optimizer_shard::OptDecision;
use crate::plan::{GradientPlan, ParallelPlan, ParamPlan};

/// Plan hybrid_parallel: every rank runs its own hand-written graph (local shapes, the
/// collectives the user placed, world-rank groups; nothing is inserted). Parameters named in
/// `layerwise` are each rank's own (MindSpore's `layerwise_parallel`); every other parameter is
/// replicated (the same name, shape, dtype and trainability on every rank) and its gradient
/// all-reduced over all ranks. Checked: one graph per rank, the loss in each, every
/// collective's group holding its rank, every Send met by a Receive of the same tag, shape and
/// dtype on its peer (and the reverse), replicated parameters alike on every rank.
pub fn plan_hybrid(graphs: Vec<Graph>, loss_name: &str, ctx: &ParallelContext, layerwise: &BTreeSet<String>) -> Result<ParallelPlan> {
    ctx.validate()?;
    ctx.check_supported()?;
    let hybrid = |problem| Err(ParallelError::Hybrid { problem });
    if ctx.parallel_mode != ParallelMode::HybridParallel {
        return hybrid(HybridProblem::WrongMode { mode: ctx.parallel_mode });
    }
    let n = ctx.device_num;
    if graphs.len() != n {
        return hybrid(HybridProblem::GraphCount { graphs: graphs.len(), devices: n });
    }
    let mut rank_graphs = Vec::with_capacity(n);
    let mut groups: BTreeSet<Vec<usize>> = BTreeSet::new();
    // (sender, receiver, tag) -> (the node on that side, its type).
    let mut sends: BTreeMap<(usize, usize, u32), (String, TensorType)> = BTreeMap::new();
    let mut recvs: BTreeMap<(usize, usize, u32), (String, TensorType)> = BTreeMap::new();
    let mut sequences = CallSequences::new();
    for (r, g) in graphs.into_iter().enumerate() {
        let Ok(loss) = g.find(loss_name) else {
            return hybrid(HybridProblem::MissingLoss { rank: r, loss: loss_name.to_string() });
        };
        for name in layerwise {
            if g.find(name).map(|id| !matches!(g.node(id).op, OpKind::Parameter(_))).unwrap_or(true) {
                return hybrid(HybridProblem::NotAParameter { rank: r, name: name.clone() });
            }
        }
        if let Some(marked) = g.nodes().iter().find(|n| n.recompute != autopar_graph::Recompute::Keep) {
            return hybrid(HybridProblem::Recompute { rank: r, name: marked.name.clone() });
        }
        let (trained, to_loss) = dependencies(&g, loss);
        for (i, node) in g.nodes().iter().enumerate() {
            let ins: Vec<TensorType> = node.inputs.iter().map(|x| g.node(*x).ty.clone()).collect();
            let calls = node.op.def().cost(&CostCx { inputs: &ins, output: &node.ty, rank: r }).comm;
            if calls.is_empty() {
                continue;
            }
            let (kind, name) = (node.op.kind(), node.name.clone());
            for call in calls {
                if !call.group.contains(&r) || call.group.iter().any(|&m| m >= n) {
                    return hybrid(HybridProblem::BadGroup { rank: r, kind, name, group: call.group });
                }
                if !matches!(node.op, OpKind::Send(_) | OpKind::Recv(_)) {
                    sequences.entry(call.group.clone()).or_default().entry(r).or_default().push((kind, trained[i]));
                }
                groups.insert(call.group);
            }
            // The step computes what the loss needs: communication off that path would be
            // skipped here while the peers wait for it.
            if !to_loss[i] {
                return hybrid(HybridProblem::OffLossPath { rank: r, kind, name });
            }
            let mut transfer = None;
            if let OpKind::Send(s) = &node.op {
                transfer = Some(((r, s.peer, s.tag), &mut sends));
            }
            if let OpKind::Recv(s) = &node.op {
                transfer = Some(((s.peer, r, s.tag), &mut recvs));
            }
            if let Some((key, side)) = transfer {
                let (from, to, tag) = key;
                let fail = |problem| hybrid(HybridProblem::Transfer { rank: r, name: name.clone(), from, to, tag, problem });
                if from == to {
                    return fail(TransferProblem::ToItself);
                }
                // Gradients do not cross hand-written transfers: what is sent (or the
                // Receive's template) must not depend on a trainable parameter.
                if trained[node.inputs[0].0] {
                    return fail(TransferProblem::NeedsGradient);
                }
                if side.insert(key, (name.clone(), node.ty.clone())).is_some() {
                    return fail(TransferProblem::Repeated);
                }
            }
        }
        rank_graphs.push(with_loss_first(&g, Some(loss))?);
    }
    check_transfers(&sends, &recvs)?;
    check_sequences(&sequences)?;
    let graph = rank_graphs[0].clone();
    let flat = DeviceMatrix::flat(n).map_err(|e| ParallelError::Layout { node: "device matrix".into(), source: e })?;
    let all = flat.axis(0);
    let mut params = Vec::new();
    for (r, g) in rank_graphs.iter().enumerate() {
        for id in g.parameters() {
            let node = g.node(id);
            let OpKind::Parameter(p) = &node.op else { continue };
            if layerwise.contains(&node.name) {
                if r == 0 {
                    params.push(hybrid_param(node, id, p, &flat, Vec::new()));
                }
                continue;
            }
            // A replicated parameter: rank 0 holds it and every rank's copy is alike.
            let Some(first) = find_parameter(&graph, &node.name) else {
                return hybrid(HybridProblem::MissingParameter { name: node.name.clone(), rank: r, missing_from: 0 });
            };
            if r == 0 {
                for (q, other) in rank_graphs.iter().enumerate().skip(1) {
                    if find_parameter(other, &node.name).is_none() {
                        return hybrid(HybridProblem::MissingParameter { name: node.name.clone(), rank: 0, missing_from: q });
                    }
                }
                params.push(hybrid_param(node, id, p, &flat, if n == 1 { Vec::new() } else { vec![all] }));
                continue;
            }
            let (rank0, p0) = first;
            let differs = |what: &'static str, here: String, there: String| {
                hybrid(HybridProblem::ParameterDiffers { name: node.name.clone(), rank: r, what, here, rank0: there })
            };
            if node.ty.shape != rank0.ty.shape {
                return differs("shape", format!("{:?}", node.ty.shape), format!("{:?}", rank0.ty.shape));
            }
            if p.dtype != p0.dtype {
                return differs("dtype", p.dtype.to_string(), p0.dtype.to_string());
            }
            if p.trainable != p0.trainable {
                return differs("trainable", p.trainable.to_string(), p0.trainable.to_string());
            }
        }
    }
    let nodes = (0..graph.len()).map(|i| replicated_plan(&graph, NodeId(i), &flat)).collect();
    let loss_seed = if ctx.gradients_mean { 1.0 / n as f64 } else { 1.0 };
    let gradients = GradientPlan {
        loss_seed,
        mirror_mean: false,
        buckets: fusion_buckets(&params, ctx),
        reduce_scatter: Vec::new(),
        all_gather: Vec::new(),
    };
    Ok(ParallelPlan {
        device_num: n,
        mode: ParallelMode::HybridParallel,
        context: ctx.clone(),
        loss: Some(graph.outputs[0]),
        graph,
        rank_graphs,
        nodes,
        redistributions: Vec::new(),
        params,
        gradients,
        dataset: DatasetStrategy::DataParallel,
        strategy_file: None,
        all_to_all: ctx.enable_alltoall,
        collective_groups: groups.into_iter().collect(),
        search: None,
    })
}

/// Parameter `name` of `g`, if `g` has a parameter of that name.
fn find_parameter<'g>(g: &'g Graph, name: &str) -> Option<(&'g Node, &'g autopar_graph::ops::Parameter)> {
    let node = g.node(g.find(name).ok()?);
    if let OpKind::Parameter(p) = &node.op {
        return Some((node, p));
    }
    None
}

fn hybrid_param(node: &Node, id: NodeId, p: &autopar_graph::ops::Parameter, flat: &DeviceMatrix, mirror: Vec<DeviceAxis>) -> ParamPlan {
    ParamPlan {
        name: node.name.clone(),
        node: id,
        layout: TensorLayout::replicated(flat.clone(), node.ty.shape.clone()),
        dtype: p.dtype,
        trainable: p.trainable,
        mirror,
        opt: OptDecision::Disabled,
    }
}

/// Per node of a rank graph: whether it depends on a trainable parameter (so the backward pass
/// reaches it; a received value depends on the peer's tensor, not on its template), and whether
/// it leads to `loss`.
fn dependencies(g: &Graph, loss: NodeId) -> (Vec<bool>, Vec<bool>) {
    let nodes = g.nodes();
    let mut trained = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        let own = matches!(&node.op, OpKind::Parameter(p) if p.trainable);
        let through = !matches!(node.op, OpKind::Recv(_)) && node.inputs.iter().any(|x| trained[x.0]);
        trained[i] = node.ty.dtype.is_float() && (own || through);
    }
    let mut to_loss = vec![false; nodes.len()];
    to_loss[loss.0] = true;
    for i in (0..=loss.0).rev() {
        if to_loss[i] {
            for x in &nodes[i].inputs {
                to_loss[x.0] = true;
            }
        }
    }
    (trained, to_loss)
}

/// Group -> rank -> the collectives it calls over the group, in graph order (kind, whether the
/// backward pass calls one too).
type CallSequences = BTreeMap<Vec<usize>, BTreeMap<usize, Vec<(&'static str, bool)>>>;

/// Every rank of a group calls the same collectives over it in the same order, each with a
/// backward on all of them or on none (else one rank would wait for a call the others never make).
fn check_sequences(sequences: &CallSequences) -> Result<()> {
    let describe = |calls: Option<&Vec<(&'static str, bool)>>| -> Vec<String> {
        calls
            .into_iter()
            .flatten()
            .map(|&(kind, back)| if back { format!("{kind} (and its backward)") } else { kind.to_string() })
            .collect()
    };
    for (group, by_rank) in sequences {
        let first = group[0];
        for &r in &group[1..] {
            if by_rank.get(&r) != by_rank.get(&first) {
                return Err(ParallelError::Hybrid {
                    problem: HybridProblem::CollectivesDiffer {
                        group: group.clone(),
                        rank: r,
                        here: describe(by_rank.get(&r)),
                        first,
                        there: describe(by_rank.get(&first)),
                    },
                });
            }
        }
    }
    Ok(())
}

/// Every Send has its Receive on the peer (same tag, shape and dtype), and every Receive its Send.
fn check_transfers(
    sends: &BTreeMap<(usize, usize, u32), (String, TensorType)>,
    recvs: &BTreeMap<(usize, usize, u32), (String, TensorType)>,
) -> Result<()> {
    let fail = |rank, name: &str, (from, to, tag): (usize, usize, u32), problem| {
        Err(ParallelError::Hybrid { problem: HybridProblem::Transfer { rank, name: name.to_string(), from, to, tag, problem } })
    };
    for (&key, (name, ty)) in sends {
        match recvs.get(&key) {
            None => return fail(key.0, name, key, TransferProblem::NoReceive),
            Some((_, there)) if there != ty => {
                return fail(key.0, name, key, TransferProblem::TypeDiffers { send: ty.to_string(), receive: there.to_string() })
            }
            Some(_) => {}
        }
    }
    for (&key, (name, _)) in recvs {
        if !sends.contains_key(&key) {
            return fail(key.1, name, key, TransferProblem::NoSend);
        }
    }
    Ok(())
}
