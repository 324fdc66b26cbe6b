//! auto_parallel: the strategy search. The planner hands it the network, the sharding rules
//! and the strategies the user (or a strategy file) fixed; it returns a strategy for every
//! other op, with what each costs and why it won. The plan made from them is an ordinary plan.
//!
//! * [`costgraph`]: candidates per op and the cost model (compute, in-op communication,
//!   redistribution, gradient synchronisation, memory) under a [`DeviceProfile`], or in
//!   MindSpore's own units ([`mindspore_costs`]), which dynamic_programming optimises unless a
//!   profile is given.
//! * [`solve`]: the searches over the cost graph, pure functions: variable elimination
//!   (`dynamic_programming`, and the exact solver), with a memory budget too.
//! * [`propagate`]: `sharding_propagation`, MindSpore's walk from the configured ops.
//! * [`recursive`]: `recursive_programming`, MindSpore's default: binary cuts of the ops that
//!   matter, greedy, without the cost graph; the other ops copy their neighbours' strategies by
//!   MindSpore's rules (`rec_rules`).

pub mod costgraph;
pub mod mindspore_costs;
pub mod profile;
pub mod propagate;
mod rec_adjacency;
mod rec_rules;
pub mod recursive;
pub mod solve;

use autopar_graph::{Node, NodeId};
use autopar_layout::{NamedLayout, Strategy};

pub use costgraph::{CostGraph, CostSplit, CostUnits};
pub use profile::{DeviceProfile, Link};
pub use solve::{CostProblem, Costs, EdgeCost, Order, Repeat};

use crate::context::{OptimizerLevel, SearchMode};
use crate::error::{ParallelError, Result};

/// Where an op's strategy came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrategySource {
    /// The model's `.shard(strategy)` annotation.
    User,
    /// A strategy file (`--strategy`, `strategy_ckpt_config.load_file`).
    StrategyFile,
    /// MindSpore's default for an unannotated op: its batch dimension split (data parallel).
    Default,
    /// auto_parallel, sharding_propagation: taken over from its neighbours (the cheapest
    /// redistribution from the ops, or the dataset, decided before it).
    Propagated,
    /// auto_parallel: chosen by the strategy search.
    Searched,
}

impl StrategySource {
    /// The source's short name, as reports print it ("user", "file", "default", "propagated", "searched").
    pub fn name(self) -> &'static str {
        match self {
            StrategySource::User => "user",
            StrategySource::StrategyFile => "file",
            StrategySource::Default => "default",
            StrategySource::Propagated => "propagated",
            StrategySource::Searched => "searched",
        }
    }

    /// The user's MindSpore `Layout` of `node` where the op runs on it: a strategy from this
    /// source that is the user's own, with the layout's split counts.
    pub fn user_layout<'a>(self, node: &'a Node, strategy: &Strategy) -> Option<&'a NamedLayout> {
        node.layout.as_ref().filter(|l| self == StrategySource::User && l.strategy() == *strategy)
    }
}

/// The most work one elimination of the exact searches may do: entries of the new table times
/// the candidates eliminated.
pub const TABLE_LIMIT: u128 = 1 << 30;

/// dynamic_programming with `fully_use_devices` off searches every split while its edges
/// hold at most this many candidate pairs to price...
const PARTIAL_PAIRS: u128 = 1 << 22;
/// ...and each elimination step at most this many entries; beyond, the splits using every
/// device or none (seconds instead of minutes).
const PARTIAL_ENTRIES: u128 = 1 << 24;

/// Which search made a plan: one of MindSpore's three, the exact optimum of the cost model, or
/// every op on its data-parallel default (for comparison).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// One of MindSpore's search modes.
    Mode(SearchMode),
    /// The exact optimum of the cost model.
    Exact,
    /// Every op on its data-parallel default.
    DataParallel,
    /// dynamic_programming optimising the cost model in these units whatever the profile
    /// (`--compare` shows both).
    DynamicProgrammingIn(CostUnits),
}

impl Search {
    /// The search's name: the search mode's MindSpore name, "exact", "data_parallel",
    /// "dynamic_programming (seconds)" or "dynamic_programming (MindSpore)".
    pub fn name(self) -> &'static str {
        match self {
            Search::Mode(m) => m.name(),
            Search::Exact => "exact",
            Search::DataParallel => "data_parallel",
            Search::DynamicProgrammingIn(CostUnits::Seconds) => "dynamic_programming (seconds)",
            Search::DynamicProgrammingIn(CostUnits::MindSpore) => "dynamic_programming (MindSpore)",
        }
    }
}

/// One row of a comparison of searches: the search and its report with the seconds planning
/// took, or why it could not plan.
pub type SearchRow = (Search, Result<(SearchReport, f64)>);

/// One op's decision and its explanation.
#[derive(Clone, Debug, PartialEq)]
pub struct OpChoice {
    /// The op's node.
    pub node: NodeId,
    /// The op's name.
    pub name: String,
    /// The op's kind.
    pub kind: &'static str,
    /// The chosen split count per logical dimension of the op.
    pub splits: Vec<usize>,
    /// The chosen strategy, per input and per tensor dimension.
    pub strategy: Strategy,
    /// Where the strategy came from.
    pub source: StrategySource,
    /// Its cost, the redistributions before its inputs included.
    pub cost: CostSplit,
    /// The next best strategy with the rest of the plan unchanged, and how much more the
    /// objective would be with it (seconds).
    pub runner_up: Option<(Strategy, f64)>,
    /// Strategies it had to choose from.
    pub candidates: usize,
}

/// Identical blocks that a search tied to one choice: every copy's op takes the choice of the
/// first copy's op at the same position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiedBlocks {
    /// The first copy's first op.
    pub first: String,
    /// The first copy's last op.
    pub last: String,
    /// Ops in a copy.
    pub ops: usize,
    /// Copies, back to back.
    pub copies: usize,
}

/// What a search decided.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchReport {
    /// The search that decided.
    pub search: Search,
    /// The name of the device profile the costs were computed under.
    pub profile: String,
    /// Every op of the cost graph with its decision, in cost-graph order.
    pub ops: Vec<OpChoice>,
    /// The objective of the plan (weighted seconds per step).
    pub objective: f64,
    /// When the search optimised MindSpore's cost model (dynamic_programming without a device
    /// profile): the plan's objective in it (`α · computation + β · communication`, bytes).
    /// Every other figure of the report is seconds under the profile.
    pub mindspore_objective: Option<f64>,
    /// The repeated blocks the search tied to one choice (dynamic_programming).
    pub tied: Vec<TiedBlocks>,
    /// `device_memory_capacity` the search planned under (bytes per device).
    pub capacity: u64,
    /// When the fastest plan did not fit the capacity (the elimination searches): its memory
    /// (the ops' summed, bytes) and objective.
    pub fastest: Option<(u64, f64)>,
    /// The ops whose `.shard()` strategy recursive_programming overwrote (MindSpore 2.10's
    /// default; `MS_INTERFERED_SAPP=1` keeps them).
    pub overwritten: Vec<String>,
    /// dynamic_programming searched only the strategies using every device or none, as
    /// `fully_use_devices` does, because every split was more than its elimination does in
    /// seconds.
    pub fully_use_fallback: bool,
    /// The search took only the strategies using every device or none (`fully_use_devices`
    /// set, or the fallback); the exact solver takes every split.
    pub fully_use: bool,
    /// The memory levers (recomputation, the parallel optimizer's level) auto_parallel chose,
    /// and why: set when no plan fitted `device_memory_capacity` without them.
    pub levers: Option<LeversChosen>,
}

/// The memory levers auto_parallel chose because no plan fitted `device_memory_capacity`
/// without them, and what it tried.
#[derive(Clone, Debug, PartialEq)]
pub struct LeversChosen {
    /// The blocks it recomputes ([`autopar_graph::Graph::blocks`], the first ones; empty: none).
    pub blocks: Vec<String>,
    /// The blocks the network has.
    pub of_blocks: usize,
    /// The parallel optimizer's level it chose where it changed it (None: unchanged).
    pub optimizer_level: Option<OptimizerLevel>,
    /// Why: the search's error without them.
    pub without: String,
    /// Every combination it planned, in the order tried.
    pub tried: Vec<LeverTry>,
}

/// One combination of memory levers auto_parallel planned: the first `blocks` blocks
/// recomputed, the parallel optimizer at `optimizer_level` (None: off), and the search's memory
/// (bytes per device) and objective (seconds) when a plan fitted.
#[derive(Clone, Debug, PartialEq)]
pub struct LeverTry {
    /// Blocks recomputed (the first ones).
    pub blocks: usize,
    /// The parallel optimizer's level (None: not sharding).
    pub optimizer_level: Option<OptimizerLevel>,
    /// The plan's memory and objective when one fitted.
    pub fitted: Option<(u64, f64)>,
}

impl LeverTry {
    /// In words: `level2, 2 blocks recomputed`.
    pub fn describe(&self) -> String {
        let level = match self.optimizer_level {
            Some(l) => format!("parallel optimizer {}", l.name()),
            None => "no parallel optimizer".to_string(),
        };
        format!("{level}, {} block(s) recomputed", self.blocks)
    }
}

impl SearchReport {
    /// The predicted cost of the whole step, by part.
    pub fn total(&self) -> CostSplit {
        let mut t = CostSplit::default();
        for o in &self.ops {
            t.compute += o.cost.compute;
            t.communication += o.cost.communication;
            t.redistribution += o.cost.redistribution;
            t.gradient_sync += o.cost.gradient_sync;
            t.memory += o.cost.memory;
        }
        t
    }
}

/// What the planner hands the search.
pub(crate) struct SearchJob<'a> {
    pub graph: &'a autopar_graph::Graph,
    pub rules: &'a [autopar_graph::ShardingRule],
    pub context: &'a crate::context::ParallelContext,
    pub profile: &'a DeviceProfile,
    pub training: bool,
    pub fixed: &'a [Option<(Vec<usize>, StrategySource)>],
    pub input_layouts: &'a [Option<autopar_layout::TensorLayout>],
    pub search: Search,
    /// The user gave the profile: dynamic_programming prices in seconds under it.
    pub profile_given: bool,
}

/// Build the cost graph of a job and search it.
pub(crate) fn search_plan(job: &SearchJob<'_>) -> Result<SearchReport> {
    // dynamic_programming optimises MindSpore's own cost model unless the user gave a device
    // profile to price it in seconds.
    let dp = Search::Mode(SearchMode::DynamicProgramming);
    let (search, units) = match job.search {
        Search::DynamicProgrammingIn(units) => (dp, units),
        s if s == dp && !job.profile_given => (s, CostUnits::MindSpore),
        s => (s, CostUnits::Seconds),
    };
    // recursive_programming overwrites the model's `.shard()` strategies, as MindSpore 2.10
    // does unless MS_INTERFERED_SAPP=1 (a strategy file's are kept).
    let overwrite = search == Search::Mode(SearchMode::RecursiveProgramming) && !job.context.search.interfered_sapp;
    let is_user = |f: &Option<(Vec<usize>, StrategySource)>| matches!(f, Some((_, StrategySource::User)));
    let overwritten: Vec<String> = if overwrite {
        (0..job.fixed.len()).filter(|&i| is_user(&job.fixed[i])).map(|i| job.graph.nodes()[i].name.clone()).collect()
    } else {
        Vec::new()
    };
    let kept: Vec<Option<(Vec<usize>, StrategySource)>>;
    let fixed = if overwritten.is_empty() {
        job.fixed
    } else {
        tracing::warn!(
            ops = overwritten.len(),
            "recursive_programming overwrites the strategies the model's .shard() set (as MindSpore does); MS_INTERFERED_SAPP=1 keeps them"
        );
        kept = job.fixed.iter().map(|f| if is_user(f) { None } else { f.clone() }).collect();
        &kept
    };
    // With `fully_use_devices` set, dynamic_programming and sharding_propagation take the
    // candidates using every device or none, as MindSpore's; the recursive search's cuts may
    // leave devices idle whatever the key, and the exact optimum is over every candidate.
    let honours = matches!(search, Search::Mode(SearchMode::DynamicProgramming | SearchMode::ShardingPropagation));
    let search_units = units;
    let build = |full_use: bool, units: CostUnits, weights: Option<mindspore_costs::Weights>| {
        costgraph::build(&costgraph::Build {
            graph: job.graph,
            rules: job.rules,
            context: job.context,
            profile: job.profile,
            training: job.training,
            fixed,
            input_layouts: job.input_layouts,
            full_use,
            units,
            weights,
            // The report's seconds graph keeps the searched graph's candidates, in its order.
            generation_order: search_units == CostUnits::MindSpore,
        })
    };
    let rec = recursive::RecInput {
        graph: job.graph,
        devices: job.context.devices(),
        pipelined: job.context.search.pipelined,
        matmul_mem_coef: job.context.search.rp_matmul_mem_coef.get(),
        training: job.training,
        full_batch: matches!(job.context.dataset_strategy(), crate::context::DatasetStrategy::FullBatch),
    };
    let full_use = honours && job.context.search.fully_use_devices;
    let mut cg = build(full_use, units, None)?;
    // Every split of every op is more than dynamic_programming's elimination does in seconds
    // (a deep or wide network on hundreds of devices): the strategies using every device or
    // none, as `fully_use_devices` keeps.
    let fully_used = search == dp && !full_use && !cg.small_for_elimination(PARTIAL_PAIRS, PARTIAL_ENTRIES);
    if fully_used {
        tracing::info!("dynamic_programming: every split is more than it searches in seconds; searching those using every device or none");
        cg = build(true, units, None)?;
    }
    let chosen = choose(&cg, search, &rec)?;
    let mut report = match units {
        CostUnits::Seconds => describe(&cg, search, &chosen, job.profile),
        // The figures of the report are seconds under the profile, of the plan MindSpore's
        // costs chose.
        CostUnits::MindSpore => {
            let total = cg.total(&chosen.choice);
            if total >= costgraph::FORBIDDEN {
                return Err(ParallelError::SearchNoPlan {
                    search: search.name(),
                    why: "every plan has a pair of layouts the cost model forbids: the ops that read one parameter need it in different layouts (MindSpore's cost model gives a shared parameter one layout for all its users), or an element-wise op's input needs a redistribution under elementwise_op_strategy_follow".into(),
                });
            }
            // The `costmodel_*` keys weighed MindSpore's bytes; the seconds are unweighted.
            let unweighted = mindspore_costs::Weights { alpha: 1.0, beta: 1.0, gamma: 1.0 };
            let seconds = build(full_use || fully_used, CostUnits::Seconds, Some(unweighted))?;
            let mut r = describe(&seconds, search, &chosen, job.profile);
            r.mindspore_objective = Some(total);
            r
        }
    };
    report.search = job.search;
    report.fully_use_fallback = fully_used;
    report.fully_use = full_use || fully_used;
    report.overwritten = overwritten;
    Ok(report)
}

/// What a search chose over a cost graph: a candidate per op, the ops sharding propagation
/// reached, the repeated blocks it tied, and the fastest choice when it did not fit the memory.
struct Chosen {
    choice: Vec<usize>,
    reached: Vec<bool>,
    repeats: Vec<Repeat>,
    fastest: Option<Vec<usize>>,
}

/// Run `search` over the cost graph `cg` (built for it).
fn choose(cg: &CostGraph, search: Search, rec: &recursive::RecInput<'_>) -> Result<Chosen> {
    let configured: Vec<Option<usize>> = cg.ops.iter().map(|op| op.configured.map(|_| 0)).collect();
    let mut repeats = Vec::new();
    let mut fastest = None;
    let (choice, reached) = match search {
        // Propagation reads one row per edge: the cost graph computes them on demand.
        Search::Mode(SearchMode::ShardingPropagation) => propagate::propagate(cg, &configured),
        // The copies of a repeated block (a network's layers) are tied to one choice, so the
        // search sees one block however deep the network is.
        Search::Mode(SearchMode::DynamicProgramming) | Search::DynamicProgrammingIn(_) => {
            let (rep, found) = cg.tied_ops();
            let fit = eliminate_fitting(cg, search, (!found.is_empty()).then_some(&rep[..]), Order::Eliminations)?;
            if fit.tied {
                repeats = found;
            }
            fastest = fit.fastest;
            (fit.choice, vec![false; cg.ops.len()])
        }
        Search::Exact => {
            let fit = eliminate_fitting(cg, search, None, Order::MinFill)?;
            fastest = fit.fastest;
            (fit.choice, vec![false; cg.ops.len()])
        }
        // Every op is fixed: its one candidate.
        Search::DataParallel => (vec![0; cg.ops.len()], vec![false; cg.ops.len()]),
        Search::Mode(SearchMode::RecursiveProgramming) => recursive::choose(cg, rec)?,
    };
    Ok(Chosen { choice, reached, repeats, fastest })
}

/// The report of a search's choice, its figures priced by the cost graph `cg` (of the same
/// ops and candidates as the one searched).
fn describe(cg: &CostGraph, search: Search, chosen: &Chosen, profile: &DeviceProfile) -> SearchReport {
    let mut r = report(cg, search, &chosen.choice, &chosen.reached, profile);
    r.tied = chosen
        .repeats
        .iter()
        .map(|t| TiedBlocks {
            first: cg.ops[t.start].name.clone(),
            last: cg.ops[t.start + t.period - 1].name.clone(),
            ops: t.period,
            copies: t.count,
        })
        .collect();
    r.fastest = chosen.fastest.as_ref().map(|f| (cg.memory_of(f), cg.total(f)));
    r
}

/// What [`eliminate_fitting`] chose.
struct Fitted {
    choice: Vec<usize>,
    /// The ties held.
    tied: bool,
    /// The fastest plan, when it did not fit.
    fastest: Option<Vec<usize>>,
}

/// The most costs an untied problem may hold for the search under a memory budget to drop
/// the ties (1 GiB).
const UNTIED_LIMIT: u128 = 1 << 27;

/// The fastest choice of an elimination search over the cost graph (its ops tied to
/// `rep[k]`, if given) whose memory fits `device_memory_capacity`, and whether the ties
/// held. The plain elimination first; when its plan's memory summed over the ops does not
/// fit, the fastest plan that fits of two searches: the elimination with memory priced into
/// the objective (the price bisected), and the elimination with MindSpore's (time, memory)
/// cost lists where they stay within their work and memory bounds. Untied when the whole
/// problem is small enough: under a budget, layers may do best with different strategies.
fn eliminate_fitting(cg: &CostGraph, search: Search, rep: Option<&[usize]>, order: Order) -> Result<Fitted> {
    let untied = || (cg.problem(), (0..cg.ops.len()).collect::<Vec<usize>>());
    let too_wide = |index: &[usize], e: solve::TooWide| {
        let op = index.iter().position(|&i| i == e.op).expect("every merged op has a member");
        ParallelError::SearchTooWide { search: search.name(), name: cg.ops[op].name.clone(), entries: e.entries }
    };
    // A problem too wide to eliminate is refused before its edges are priced (the pricing
    // of a wide problem's every candidate pair is most of its time).
    match rep {
        None => solve::check_width(cg, order, TABLE_LIMIT).map_err(|e| too_wide(&(0..cg.ops.len()).collect::<Vec<_>>(), e))?,
        Some(rep) => {
            let (shape, index) = cg.tied_shape(rep);
            solve::check_width(&shape, order, TABLE_LIMIT).map_err(|e| too_wide(&index, e))?
        }
    }
    let (problem, index) = match rep {
        Some(rep) => cg.tied_problem(rep),
        None => untied(),
    };
    let expand = |index: &[usize], merged: Vec<usize>| -> Vec<usize> { index.iter().map(|&i| merged[i]).collect() };
    let merged = solve::eliminate(&problem, order, TABLE_LIMIT).map_err(|e| too_wide(&index, e))?;
    let choice = expand(&index, merged.clone());
    // Tying prices the merged edges once: the tied problem's cost of its choice is the whole
    // graph's cost of the expanded choice (unless a forbidden pair is in it).
    debug_assert!({
        let (tied, whole) = (problem.total(&merged), cg.total(&choice));
        whole >= costgraph::FORBIDDEN || (tied - whole).abs() <= 1e-9 * whole.abs().max(1e-12)
    });
    let capacity = cg.options.device_memory_capacity;
    let need = cg.memory_of(&choice);
    if need <= capacity {
        return Ok(Fitted { choice, tied: rep.is_some(), fastest: None });
    }
    let fastest = Some(choice.clone());
    let (problem, index, tied) = if rep.is_some() && cg.problem_size() <= UNTIED_LIMIT {
        let (p, i) = untied();
        (p, i, false)
    } else {
        (problem, index, rep.is_some())
    };
    let memory = cg.memory_table(&index, problem.unary.len());
    let budget = capacity as f64;
    // Memory priced into the objective (fast, any size), and MindSpore's cost lists (exact
    // while their fronts are short) unless they outgrow their work and memory bounds: the
    // faster plan that fits.
    let mut found = solve::eliminate_priced_within(&problem, &memory, budget, order, TABLE_LIMIT);
    if let Ok(Some(listed)) = solve::eliminate_within(&problem, &memory, budget, order, TABLE_LIMIT) {
        if found.as_ref().is_ok_and(|priced| problem.total(&listed) < problem.total(priced)) || found.is_err() {
            found = Ok(listed);
        }
    }
    match found {
        Ok(merged) => Ok(Fitted { choice: expand(&index, merged), tied, fastest }),
        Err(solve::NoPlan::TooWide(e)) => Err(too_wide(&index, e)),
        Err(solve::NoPlan::OverBudget { least }) => {
            // The ops whose least memory is largest.
            let mut need: Vec<(u64, &str)> =
                cg.ops.iter().map(|op| (op.candidates.iter().map(|c| c.cost.memory).min().unwrap_or(0), op.name.as_str())).collect();
            need.sort_by_key(|n| std::cmp::Reverse(n.0));
            let largest = need.iter().take(3).map(|(b, n)| format!("{n} ({b} bytes)")).collect::<Vec<_>>().join(", ");
            Err(ParallelError::PlanOverMemory { search: search.name(), capacity, least: least as u64, largest })
        }
    }
}

fn report(cg: &CostGraph, search: Search, choice: &[usize], reached: &[bool], profile: &DeviceProfile) -> SearchReport {
    let splits = cg.split_of(choice);
    // Each op's share of the objective, with its edges found once.
    let mut incident: Vec<Vec<usize>> = vec![Vec::new(); cg.ops.len()];
    for (i, e) in cg.edges.iter().enumerate() {
        incident[e.from].push(i);
        if e.to != e.from {
            incident[e.to].push(i);
        }
    }
    let local = |k: usize, c: usize| -> f64 {
        let mut x = cg.unary(k, c);
        for &i in &incident[k] {
            let e = &cg.edges[i];
            let (a, b) = if e.from == k { (c, if e.to == k { c } else { choice[e.to] }) } else { (choice[e.from], c) };
            x += cg.edge(i, a, b);
        }
        x
    };
    let ops = cg
        .ops
        .iter()
        .enumerate()
        .map(|(k, op)| {
            let c = &op.candidates[choice[k]];
            let runner_up = if op.configured.is_some() {
                None
            } else {
                let mine = local(k, choice[k]);
                (0..op.candidates.len())
                    .filter(|&x| x != choice[k])
                    .map(|x| (x, local(k, x) - mine))
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(x, extra)| (op.candidates[x].layouts.strategy.clone(), extra))
            };
            let source = match op.configured {
                Some(s) => s,
                None if reached[k] => StrategySource::Propagated,
                None => StrategySource::Searched,
            };
            OpChoice {
                node: op.node,
                name: op.name.clone(),
                kind: op.kind,
                splits: c.splits.clone(),
                strategy: c.layouts.strategy.clone(),
                source,
                cost: splits[k],
                runner_up,
                candidates: op.candidates.len(),
            }
        })
        .collect();
    SearchReport {
        search,
        profile: profile.name.clone(),
        ops,
        objective: cg.total(choice),
        mindspore_objective: None,
        tied: Vec::new(),
        capacity: cg.options.device_memory_capacity,
        fastest: None,
        overwritten: Vec::new(),
        fully_use_fallback: false,
        fully_use: false,
        levers: None,
    }
}
