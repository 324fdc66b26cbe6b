//! The layouts the planner gives what no strategy splits: the network's inputs (the dataset
//! strategy), parameters (their first consumer's), and ops run whole.

use autopar_graph::{Graph, Node, NodeId};
use autopar_layout::{DeviceMatrix, TensorLayout};

use crate::analysis::first_use;
use crate::context::{DatasetStrategy, ParallelMode};
use crate::error::{DatasetProblem, ParallelError, Result};
use crate::plan::{InOpSync, NodePlan};

pub(super) fn input_layout(
    node: &Node,
    ds: &DatasetStrategy,
    index: usize,
    n: usize,
    flat: &DeviceMatrix,
    mode: ParallelMode,
) -> Result<TensorLayout> {
    let shape = node.ty.shape.clone();
    let layout_err = |e| ParallelError::Layout { node: node.name.clone(), source: e };
    match ds {
        _ if n == 1 => Ok(TensorLayout::replicated(flat.clone(), shape)),
        DatasetStrategy::FullBatch => Ok(TensorLayout::replicated(flat.clone(), shape)),
        DatasetStrategy::DataParallel => {
            if shape.is_empty() || !shape[0].is_multiple_of(n) {
                return Err(ParallelError::BatchNotDivisible { input: node.name.clone(), shape, devices: n, mode: mode.name() });
            }
            let mut map = vec![Vec::new(); shape.len()];
            map[0].push(0);
            TensorLayout::new(flat.clone(), map, shape).map_err(layout_err)
        }
        DatasetStrategy::Explicit(all) => {
            let problem = |p| ParallelError::DatasetStrategy { problem: p };
            let splits = all
                .get(index)
                .ok_or_else(|| problem(DatasetProblem::MissingInput { input: node.name.clone(), index, given: all.len() }))?;
            if splits.len() != shape.len() {
                return Err(problem(DatasetProblem::Rank { input: node.name.clone(), shape, splits: splits.clone() }));
            }
            let product: usize = splits.iter().product();
            if product == 0 || !n.is_multiple_of(product) {
                return Err(problem(DatasetProblem::Devices {
                    input: node.name.clone(),
                    splits: splits.clone(),
                    used: product,
                    devices: n,
                }));
            }
            if shape.iter().zip(splits).any(|(d, s)| !d.is_multiple_of(*s)) {
                return Err(problem(DatasetProblem::NotDivisible { input: node.name.clone(), shape, splits: splits.clone() }));
            }
            let (mesh, axes) = DeviceMatrix::of_splits(splits, n).map_err(layout_err)?;
            let map = axes.into_iter().map(|a| a.into_iter().collect()).collect();
            TensorLayout::new(mesh, map, shape).map_err(layout_err)
        }
    }
}

pub(super) fn first_use_layout(graph: &Graph, plans: &[Option<NodePlan>], id: NodeId) -> Option<TensorLayout> {
    let (j, slot) = first_use(graph, id)?;
    plans[j.0].as_ref().map(|p| p.inputs[slot].clone())
}

/// The plan of an op no strategy splits (a leaf, an op following its input, an op run whole),
/// with the layouts it takes and gives.
pub(super) fn unsplit_plan(node: &Node, id: NodeId, inputs: Vec<TensorLayout>, output: TensorLayout) -> NodePlan {
    NodePlan {
        id,
        name: node.name.clone(),
        kind: node.op.kind(),
        strategy: None,
        layout: None,
        source: None,
        inputs,
        output,
        output_scale: None,
        sync: InOpSync::None,
    }
}

/// The plan of op `id` of `graph` run whole on every device of `flat`.
pub(super) fn replicated_plan(graph: &Graph, id: NodeId, flat: &DeviceMatrix) -> NodePlan {
    let node = graph.node(id);
    let inputs = node.inputs.iter().map(|x| TensorLayout::replicated(flat.clone(), graph.node(*x).ty.shape.clone())).collect();
    unsplit_plan(node, id, inputs, TensorLayout::replicated(flat.clone(), node.ty.shape.clone()))
}
