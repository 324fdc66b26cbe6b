//! Strategy checkpoint files of a parallel job (`strategy_ckpt_config`), in MindSpore's format:
//! one strategy item `"<Prim>_<param>"` per operator taking a parameter (its per-input splits),
//! one layout item per parameter (device matrix, tensor map, full shape in JSON) and one per
//! optimizer-state tensor of a trainable parameter (`moments.<name>`, `adam_m.<name>`,
//! `adam_v.<name>`), which has its parameter's layout, so that the rank checkpoints can be
//! merged and resharded whole by any tool; with `only_trainable_params = false` also the frozen
//! parameters. A parameter the parallel optimizer shards records its shard (step and size).

use std::path::Path;

use autopar_checkpoint::{GroupInfo, LayoutItem, StrategyFile, StrategyItem};
use autopar_graph::NodeId;
use autopar_layout::Strategy;
use autopar_parallel::pipeline::PipelinePlan;
use autopar_parallel::{group_name, ParallelContext, ParallelPlan, RankProgram, StrategyItems};

use crate::error::{Result, RuntimeError};

/// The strategy file of `plan`: every trainable parameter and its optimizer state (`state_keys`
/// names it); with `only_trainable_params` frozen parameters are left out (MindSpore's default).
pub fn strategy_file(plan: &ParallelPlan, only_trainable_params: bool, state_keys: &dyn Fn(&str) -> Vec<String>) -> StrategyFile {
    stage_file(plan, 0, &|_| true, &|_| true, only_trainable_params, state_keys)
}

/// The strategy files of a pipeline job, one per stage as MindSpore's ranks write them: the
/// operators of the stage (their `stage` field set) and the parameters it holds (with their
/// optimizer state), laid out on the stage's devices.
pub fn pipeline_strategy_files(
    pp: &PipelinePlan,
    only_trainable_params: bool,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> Vec<StrategyFile> {
    let param_stages = pp.param_stages();
    (0..pp.stages)
        .map(|s| {
            let holds = |name: &str| param_stages.iter().any(|(n, st)| n == name && st.contains(&s));
            stage_file(&pp.plan, s as u32, &|id| pp.stage_of[id.0] == Some(s), &holds, only_trainable_params, state_keys)
        })
        .collect()
}

/// The merged strategy file of a pipeline job (MindSpore's `merge_pipeline_strategys`: layout
/// names `"<stage>-<name>"`), which describes every rank's checkpoint.
pub fn merged_pipeline_strategy_file(
    pp: &PipelinePlan,
    only_trainable_params: bool,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> StrategyFile {
    let files = pipeline_strategy_files(pp, only_trainable_params, state_keys);
    autopar_checkpoint::merge_stage_files(files.into_iter().enumerate().map(|(s, f)| (s as u32, f))).0
}

/// The strategy file of the operators `on_stage` takes and the parameters `holds` takes, with
/// `stage` in every strategy item.
fn stage_file(
    plan: &ParallelPlan,
    stage: u32,
    on_stage: &dyn Fn(NodeId) -> bool,
    holds: &dyn Fn(&str) -> bool,
    only_trainable_params: bool,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> StrategyFile {
    let graph = &plan.graph;
    let mut strategy_items = Vec::new();
    for np in plan.nodes.iter().filter(|np| on_stage(np.id)) {
        let Some(strategy) = &np.strategy else { continue };
        let Some(name) = autopar_parallel::strategy_item_names(graph, np.id).into_iter().next() else { continue };
        if strategy_items.iter().any(|s: &StrategyItem| s.node_name == name) {
            continue;
        }
        strategy_items.push(StrategyItem {
            node_name: name,
            stage,
            parallel_strategy: strategy.0.iter().map(|d| d.iter().map(|&s| s as u32).collect()).collect(),
        });
    }
    let mut layout_items = Vec::new();
    for p in plan.params.iter().filter(|p| holds(&p.name)) {
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
        // The parallel optimizer's shard (MindSpore's opt_weight_shard_step / _size).
        let (step, size) = p.opt.shard().map_or((0, 0), |s| (s.step as i32, s.configured as i32));
        for name in names {
            layout_items.push(LayoutItem {
                tensor_shape: Some(l.shape().to_vec()),
                opt_weight_shard_step: step,
                opt_weight_shard_size: size,
                ..LayoutItem::new(name, dev_matrix.clone(), tensor_map.clone())
            });
        }
    }
    StrategyFile { current_stage: 2, strategy_items, layout_items }
}

/// MindSpore's group-info file (`group_ckpt_save_file`) of `program`'s rank: its
/// communication groups under MindSpore's names ([`RankProgram::communication_groups`]) and
/// the ranks whose checkpoints can restore its own: for a training job the ranks storing the
/// same piece of every trainable parameter (MindSpore 2.10 records the rank alone once
/// `enable_parallel_optimizer` is on, whatever it shards), none for a forward-only job.
pub fn group_info(plan: &ParallelPlan, program: &RankProgram) -> GroupInfo {
    let n = plan.device_num;
    let groups = program.communication_groups().into_iter().map(|g| (group_name(&g, n), g.iter().map(|&r| r as u32).collect())).collect();
    let restore: Vec<usize> = if plan.loss.is_none() {
        Vec::new()
    } else if plan.context.enable_parallel_optimizer {
        vec![program.rank]
    } else {
        (0..n).filter(|r| program.params.iter().filter(|p| p.trainable).all(|p| p.mirror.contains(r))).collect()
    };
    GroupInfo { groups, restore_rank_list: restore.into_iter().map(|r| r as u32).collect() }
}

/// Write the strategy file of `plan` to `path` (`.json` -> JSON, else protobuf), atomically.
pub fn save_strategy_file(
    plan: &ParallelPlan,
    path: &Path,
    only_trainable_params: bool,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> Result<()> {
    strategy_file(plan, only_trainable_params, state_keys).save(path).map_err(|e| RuntimeError::StrategyFile { error: Box::new(e) })
}

/// The operator strategies a strategy file records, for the planner (MindSpore's
/// `strategy_ckpt_config.load_file`). A missing or malformed file is an error naming it.
pub fn load_strategy_items(path: &Path) -> Result<StrategyItems> {
    let file = StrategyFile::load(path).map_err(|e| RuntimeError::StrategyFile { error: Box::new(e) })?;
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
    StrategyItems { path: path.to_path_buf(), items, by_operator: false }
}

/// The strategies a job under `ctx` plans with, read from their file: the strategy checkpoint
/// (`strategy_ckpt_config.load_file`) or the operator strategy file (`op_strategy_config` in
/// mode `LOAD`, which must name every operator); None without either.
pub fn load_plan_strategies(ctx: &ParallelContext) -> Result<Option<StrategyItems>> {
    if let Some(path) = ctx.strategy_load_file() {
        return load_strategy_items(Path::new(path)).map(Some);
    }
    match ctx.op_strategy_load_file() {
        Some(path) => {
            let path = Path::new(path);
            let mut items = load_strategy_items(path)?;
            items.by_operator = true;
            Ok(Some(items))
        }
        None => Ok(None),
    }
}

/// The operator strategy file of `plan` (MindSpore's `save_operator_strategy_file`): every
/// operator's strategy under its name, stage 0, no parameter layouts.
pub fn operator_strategy_file(plan: &ParallelPlan) -> StrategyFile {
    let strategy_items = plan
        .nodes
        .iter()
        .filter_map(|np| {
            let strategy = np.strategy.as_ref()?;
            Some(StrategyItem {
                node_name: plan.graph.node(np.id).name.clone(),
                stage: 0,
                parallel_strategy: strategy.0.iter().map(|d| d.iter().map(|&s| s as u32).collect()).collect(),
            })
        })
        .collect();
    StrategyFile { current_stage: 0, strategy_items, layout_items: Vec::new() }
}
