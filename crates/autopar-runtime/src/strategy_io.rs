//! Strategy checkpoint files of a parallel job (`strategy_ckpt_config`), in MindSpore's format:
//! one strategy item `"<Prim>_<param>"` per operator taking a parameter (its per-input splits),
//! one layout item per parameter (device matrix, tensor map, full shape in JSON) and one per
//! optimizer-state tensor of a trainable parameter (`moments.<name>`, `adam_m.<name>`,
//! `adam_v.<name>`), which has its parameter's layout, so that the rank checkpoints can be
//! merged and resharded whole by any tool; with `only_trainable_params = false` also the frozen
//! parameters.

use std::path::Path;

use autopar_checkpoint::{LayoutItem, StrategyFile, StrategyItem};
use autopar_layout::Strategy;
use autopar_parallel::{ParallelPlan, StrategyItems};

use crate::error::{Result, RuntimeError};

/// The strategy file of `plan`: every trainable parameter and its optimizer state (`state_keys`
/// names it); with `only_trainable_params` frozen parameters are left out (MindSpore's default).
pub fn strategy_file(plan: &ParallelPlan, only_trainable_params: bool, state_keys: &dyn Fn(&str) -> Vec<String>) -> StrategyFile {
    let graph = &plan.graph;
    let mut strategy_items = Vec::new();
    for np in &plan.nodes {
        let node = graph.node(np.id);
        let Some(strategy) = &np.strategy else { continue };
        let Some(name) = autopar_parallel::strategy_item_names(graph, np.id).into_iter().next() else { continue };
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
    for p in &plan.params {
        if only_trainable_params && !p.trainable {
            continue;
        }
        let l = &p.layout;
        let dev_matrix: Vec<u32> = l.mesh().dims().iter().map(|&d| d as u32).collect();
        let tensor_map = vec![l.tensor_map().flattened().iter().map(|&v| v as i32).collect::<Vec<i32>>()];
        let mut names = vec![p.name.clone()];
        if p.trainable {
            names.extend(state_keys(&p.name));
        }
        for name in names {
            layout_items.push(LayoutItem {
                tensor_shape: Some(l.shape().to_vec()),
                ..LayoutItem::new(name, dev_matrix.clone(), tensor_map.clone())
            });
        }
    }
    StrategyFile { current_stage: 2, strategy_items, layout_items }
}

/// Write the strategy file of `plan` to `path` (`.json` -> JSON, else protobuf), atomically.
pub fn save_strategy_file(
    plan: &ParallelPlan,
    path: &Path,
    only_trainable_params: bool,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> Result<()> {
    strategy_file(plan, only_trainable_params, state_keys)
        .save(path)
        .map_err(|e| RuntimeError::Checkpoint { path: path.to_path_buf(), source: Box::new(e) })
}

/// The operator strategies a strategy file records, for the planner (MindSpore's
/// `strategy_ckpt_config.load_file`). A missing or malformed file is an error naming it.
pub fn load_strategy_items(path: &Path) -> Result<StrategyItems> {
    let file = StrategyFile::load(path).map_err(|e| RuntimeError::Checkpoint { path: path.to_path_buf(), source: Box::new(e) })?;
    Ok(strategy_items(&file, path))
}

/// The operator strategies of `file` (read from `path`).
pub fn strategy_items(file: &StrategyFile, path: &Path) -> StrategyItems {
    let items = file
        .strategy_items
        .iter()
        .map(|item| {
            (item.node_name.clone(), Strategy(item.parallel_strategy.iter().map(|d| d.iter().map(|&s| s as usize).collect()).collect()))
        })
        .collect();
    StrategyItems { path: path.to_path_buf(), items }
}
