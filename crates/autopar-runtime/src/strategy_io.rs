//! Strategy checkpoint files of a parallel job (`strategy_ckpt_config`), in MindSpore's format:
//! one strategy item `"<Prim>_<param>"` per operator taking a parameter (its per-input splits),
//! one layout item per parameter (device matrix, tensor map, full shape in JSON).

use std::path::Path;

use autopar_checkpoint::{LayoutItem, StrategyFile, StrategyItem};
use autopar_graph::{Graph, OpKind};
use autopar_layout::Strategy;
use autopar_parallel::ParallelPlan;

use crate::error::{Result, RuntimeError};

/// The strategy file of `plan`. With `only_trainable_params`, frozen parameters are left out
/// (MindSpore's default).
pub fn strategy_file(graph: &Graph, plan: &ParallelPlan, only_trainable_params: bool) -> StrategyFile {
    let mut strategy_items = Vec::new();
    for np in &plan.nodes {
        let node = graph.node(np.id);
        let Some(strategy) = &np.strategy else { continue };
        let Some(param) = node.inputs.iter().map(|x| graph.node(*x)).find(|x| matches!(x.op, OpKind::Parameter(_))) else { continue };
        let name = format!("{}_{}", node.op.kind(), param.name);
        if strategy_items.iter().any(|s: &StrategyItem| s.node_name == name) {
            continue;
        }
        strategy_items.push(StrategyItem {
            node_name: name,
            stage: node.pipeline_stage.unwrap_or(0) as u32,
            parallel_strategy: strategy.0.iter().map(|d| d.iter().map(|&s| s as u32).collect()).collect(),
        });
    }
    let mut layout_items = Vec::new();
    for np in &plan.nodes {
        let node = graph.node(np.id);
        let OpKind::Parameter(p) = &node.op else { continue };
        if only_trainable_params && !p.trainable {
            continue;
        }
        let l = &np.output;
        let dev_matrix = l.mesh().dims().iter().map(|&d| d as u32).collect();
        let tensor_map = vec![l.tensor_map().flattened().iter().map(|&v| v as i32).collect()];
        layout_items
            .push(LayoutItem { tensor_shape: Some(l.shape().to_vec()), ..LayoutItem::new(node.name.clone(), dev_matrix, tensor_map) });
    }
    StrategyFile { current_stage: 2, strategy_items, layout_items }
}

/// Write the strategy file of `plan` to `path` (`.json` -> JSON, else protobuf), atomically.
pub fn save_strategy_file(graph: &Graph, plan: &ParallelPlan, path: &Path, only_trainable_params: bool) -> Result<()> {
    strategy_file(graph, plan, only_trainable_params)
        .save(path)
        .map_err(|e| RuntimeError::Parallel { message: format!("cannot write strategy file {}: {e}", path.display()) })
}

/// Set the strategies a strategy file records on the ops of `graph` (MindSpore's
/// `strategy_ckpt_config.load_file`): item `"<Prim>_<param>"` applies to every op of that kind
/// taking that parameter. Returns the number of ops annotated; an item matching no op is an
/// error naming it.
pub fn apply_strategy_file(graph: &mut Graph, file: &StrategyFile, path: &Path) -> Result<usize> {
    let mut applied = 0;
    for item in &file.strategy_items {
        let strategy = Strategy(item.parallel_strategy.iter().map(|d| d.iter().map(|&s| s as usize).collect()).collect());
        let mut hit = false;
        for i in 0..graph.len() {
            let id = autopar_graph::NodeId(i);
            let node = graph.node(id);
            let takes = node.inputs.iter().any(|x| {
                let p = graph.node(*x);
                matches!(p.op, OpKind::Parameter(_)) && format!("{}_{}", node.op.kind(), p.name) == item.node_name
            });
            if takes {
                graph.set_strategy(id, strategy.clone()).map_err(|e| RuntimeError::Parallel {
                    message: format!("strategy file {}: item {} does not fit the network: {e}", path.display(), item.node_name),
                })?;
                hit = true;
                applied += 1;
            }
        }
        if !hit {
            return Err(RuntimeError::Parallel {
                message: format!(
                    "strategy file {}: item {} matches no operator of the network\nhint: the file was saved for another network; operators are named <Prim>_<parameter>",
                    path.display(),
                    item.node_name
                ),
            });
        }
    }
    Ok(applied)
}
