//! Strategy checkpoint files of a job, read and written here and nowhere else (`strategy_ckpt_config`), in MindSpore's format:
//! one strategy item `"<Prim>_<param>"` per operator taking a parameter (its per-input splits),
//! one layout item per parameter (device matrix, tensor map, full shape in JSON) and one per
//! optimizer-state tensor of a trainable parameter (`moments.<name>`, `adam_m.<name>`,
//! `adam_v.<name>`), which has its parameter's layout, so that the rank checkpoints can be
//! merged and resharded whole by any tool; with `only_trainable_params = false` also the frozen
//! parameters. A parameter the parallel optimizer shards records its shard (step and size).

use std::path::{Path, PathBuf};

use autopar_checkpoint::{GroupInfo, LayoutItem, StrategyFile, StrategyItem};
use autopar_graph::NodeId;
use autopar_layout::Strategy;

use crate::context::ParallelContext;
use crate::error::{ParallelError, Result};
use crate::job::JobPlan;
use crate::optimizer_shard::group_name;
use crate::plan::{NodePlan, ParallelPlan};
use crate::planner::{strategy_item_names, StrategyItems};
use crate::program::RankProgram;

fn file_err(path: &Path) -> impl FnOnce(autopar_checkpoint::CheckpointError) -> ParallelError {
    let path = path.to_path_buf();
    move |e| ParallelError::StrategyFile { path, error: Box::new(e) }
}

/// The strategy file of `plan`: every trainable parameter and its optimizer state (`state_keys`
/// names it); with `only_trainable_params` frozen parameters are left out (MindSpore's default).
pub fn strategy_file(plan: &ParallelPlan, only_trainable_params: bool, state_keys: &dyn Fn(&str) -> Vec<String>) -> StrategyFile {
    stage_file(plan, 0, &|_| true, &|_| true, only_trainable_params, state_keys)
}

/// The strategy files of a pipeline job, one per stage as MindSpore's ranks write them: the
/// operators of the stage (their `stage` field set) and the parameters it holds (with their
/// optimizer state), laid out on the stage's devices.
pub fn pipeline_strategy_files(pp: &JobPlan, only_trainable_params: bool, state_keys: &dyn Fn(&str) -> Vec<String>) -> Vec<StrategyFile> {
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
pub fn merged_pipeline_strategy_file(pp: &JobPlan, only_trainable_params: bool, state_keys: &dyn Fn(&str) -> Vec<String>) -> StrategyFile {
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
        let Some(name) = strategy_item_names(graph, np.id).into_iter().next() else { continue };
        if strategy_items.iter().any(|s: &StrategyItem| s.node_name == name) {
            continue;
        }
        strategy_items.push(StrategyItem { node_name: name, stage, parallel_strategy: item_strategy(np, strategy) });
    }
    let mut layout_items = Vec::new();
    for p in plan.params.iter().filter(|p| holds(&p.name)) {
        if only_trainable_params && !p.trainable {
            continue;
        }
        let l = &p.layout;
        let dev_matrix: Vec<u32> = l.mesh().dims().iter().map(|&d| d as u32).collect();
        // One TensorMap message holding the whole map, or one per dimension when a dimension
        // is split along several axes (a MindSpore `Layout`), as MindSpore writes them.
        let map = l.tensor_map();
        let tensor_map: Vec<Vec<i32>> = if map.0.iter().all(|d| d.len() == 1) {
            vec![map.flattened().iter().map(|&v| v as i32).collect()]
        } else {
            map.0.iter().map(|d| d.iter().map(|&v| v as i32).collect()).collect()
        };
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
/// `enable_parallel_optimizer` is on, whatever it shards), none for a forward-only job. The
/// program's ranks count from `first` in the world (a pipeline stage's first rank), of `world`
/// ranks in all.
pub fn group_info(plan: &ParallelPlan, program: &RankProgram, first: usize, world: usize) -> GroupInfo {
    let n = plan.device_num;
    let groups = program
        .communication_groups()
        .into_iter()
        .map(|g| {
            let g: Vec<usize> = g.iter().map(|&r| r + first).collect();
            (group_name(&g, world), g.iter().map(|&r| r as u32).collect())
        })
        .collect();
    let restore: Vec<usize> = if plan.loss.is_none() {
        Vec::new()
    } else if plan.context.enable_parallel_optimizer {
        vec![program.rank]
    } else {
        (0..n).filter(|r| program.params.iter().filter(|p| p.trainable).all(|p| p.mirror.contains(r))).collect()
    };
    GroupInfo { groups, restore_rank_list: restore.into_iter().map(|r| (r + first) as u32).collect() }
}

/// Write the strategy file of `plan` to `path` (`.json` -> JSON, else protobuf), atomically.
pub fn save_strategy_file(
    plan: &ParallelPlan,
    path: &Path,
    only_trainable_params: bool,
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> Result<()> {
    strategy_file(plan, only_trainable_params, state_keys).save(path).map_err(file_err(path))
}

/// The operator strategies a strategy file records, for the planner (MindSpore's
/// `strategy_ckpt_config.load_file`). A missing or malformed file is an error naming it.
pub fn load_strategy_items(path: &Path) -> Result<StrategyItems> {
    let file = StrategyFile::load(path).map_err(file_err(path))?;
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

/// An op's strategy as a file item: its split counts, or none (an empty list) for an op that
/// runs with the network's MindSpore `Layout`, as MindSpore writes it: such an item leaves the
/// op to the layout the network gives it when the file is read.
fn item_strategy(np: &NodePlan, strategy: &Strategy) -> Vec<Vec<u32>> {
    if np.layout.is_some() {
        return Vec::new();
    }
    strategy.0.iter().map(|d| d.iter().map(|&s| s as u32).collect()).collect()
}

/// The operator strategy file of `plan` (MindSpore's `save_operator_strategy_file`): every
/// operator's strategy under its name, stage 0, no parameter layouts.
pub fn operator_strategy_file(plan: &ParallelPlan) -> StrategyFile {
    let strategy_items = plan
        .nodes
        .iter()
        .filter_map(|np| {
            let strategy = np.strategy.as_ref()?;
            Some(StrategyItem { node_name: plan.graph.node(np.id).name.clone(), stage: 0, parallel_strategy: item_strategy(np, strategy) })
        })
        .collect();
    StrategyFile { current_stage: 0, strategy_items, layout_items: Vec::new() }
}

impl JobPlan {
    /// The strategy file describing every rank's checkpoint: the network's (a pipeline's: the
    /// per-stage files merged, layout names `"<stage>-<name>"`).
    pub fn strategy_file(&self, only_trainable_params: bool, state_keys: &dyn Fn(&str) -> Vec<String>) -> StrategyFile {
        if self.is_pipeline() {
            merged_pipeline_strategy_file(self, only_trainable_params, state_keys)
        } else {
            strategy_file(&self.plan, only_trainable_params, state_keys)
        }
    }

    /// MindSpore's group-info file of global rank `rank` (`group_ckpt_save_file`).
    pub fn group_info(&self, rank: usize) -> Result<GroupInfo> {
        let p = self.program(rank)?;
        Ok(group_info(&self.plan, &p.program, p.stage * self.stage_devices(), self.device_num))
    }
}

/// The strategy files a job under `ctx` writes, and where: `strategy_ckpt_config.save_file`
/// (`only_trainable_params` applied; a pipeline's per-stage files `<stem>_stage<s>.<ext>`
/// beside it, as MindSpore's ranks of each stage write them, and the merged file at it), the
/// operator strategy file of `op_strategy_config` in mode SAVE, and the group-info file of each
/// rank in `ranks` (`group_ckpt_save_file`: `<stem>_rank<R>.<ext>` beside it).
pub fn job_strategy_files(
    job: &JobPlan,
    ctx: &ParallelContext,
    ranks: &[usize],
    state_keys: &dyn Fn(&str) -> Vec<String>,
) -> Result<Vec<(PathBuf, SavedFile)>> {
    let mut out = Vec::new();
    if let Some(path) = ctx.strategy_save_file() {
        let path = Path::new(path);
        let only = ctx.strategy_ckpt_config.only_trainable_params;
        if job.is_pipeline() {
            for (s, file) in pipeline_strategy_files(job, only, state_keys).into_iter().enumerate() {
                out.push((suffixed(path, &format!("_stage{s}")), SavedFile::Strategy(file)));
            }
        }
        out.push((path.to_path_buf(), SavedFile::Strategy(job.strategy_file(only, state_keys))));
    }
    if let Some(path) = ctx.op_strategy_save_file() {
        out.push((PathBuf::from(path), SavedFile::Strategy(operator_strategy_file(&job.plan))));
    }
    if !ctx.group_ckpt_save_file.is_empty() {
        let path = Path::new(&ctx.group_ckpt_save_file);
        for &r in ranks {
            out.push((suffixed(path, &format!("_rank{r}")), SavedFile::Groups(job.group_info(r)?)));
        }
    }
    Ok(out)
}

/// A file [`job_strategy_files`] names.
#[derive(Clone, Debug)]
pub enum SavedFile {
    /// A strategy file (or an operator strategy file).
    Strategy(StrategyFile),
    /// A rank's group-info file.
    Groups(GroupInfo),
}

impl SavedFile {
    /// Write the file to `path`, atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        match self {
            SavedFile::Strategy(f) => f.save(path),
            SavedFile::Groups(g) => g.save(path),
        }
        .map_err(file_err(path))
    }
}

/// `dir/stem<suffix>.ext` for `path` = `dir/stem.ext`.
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}{suffix}"),
    };
    path.with_file_name(name)
}
