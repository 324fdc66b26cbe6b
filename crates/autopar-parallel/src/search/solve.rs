//! The problem every cost-graph search solves, without the network: pick one candidate per op
//! so that the sum of the ops' own costs and the edges' costs (a redistribution between a
//! producer's candidate and a consumer's) is smallest.
//!
//! * [`eliminate`] is variable elimination: ops are eliminated one by one, each leaving a
//!   table over its remaining neighbours of the best cost of the eliminated part; replaying
//!   the eliminations backwards picks every op's candidate. It is exact whatever the order, so
//!   dynamic_programming returns the optimum over the candidates it keeps (those using every
//!   device). [`Order::Eliminations`] follows MindSpore's dynamic_programming (ops with one or
//!   two neighbours first, as its merge, contract, op, edge and triangle eliminations remove
//!   them; then the op with the fewest neighbours, as its star elimination and final
//!   enumeration); [`Order::MinFill`] is the classic min-fill heuristic, the exact solver's
//!   order for graphs of small treewidth.
//! * [`brute_force`] enumerates every combination (tests).
//! * [`eliminate_within`] is the same elimination with MindSpore's (time, memory) cost lists:
//!   every table entry keeps the Pareto front of the eliminated part (less memory, or less
//!   time), points above the memory budget dropped, so the plan is the fastest whose memory
//!   summed over the ops fits `device_memory_capacity` (exact while the fronts are short).
//!   [`eliminate_priced_within`] meets the budget by pricing memory into the objective
//!   instead (fast at any size). dynamic_programming runs them when the fastest plan does not
//!   fit.
//! * [`tandem_repeats`] finds identical blocks repeated back to back in a sequence of op
//!   signatures (the layers of a deep network); the cost graph merges the copies into one op
//!   each (`CostGraph::tied_problem`), so dynamic_programming searches one block however deep
//!   the network is.

use std::collections::BTreeSet;

/// What the searches read of a cost graph: each op's own cost per candidate and each edge's
/// cost per pair of candidates. [`CostProblem`] holds them all; the cost graph computes them
/// on demand (sharding propagation reads one row per edge).
pub trait Costs {
    /// The number of ops.
    fn ops(&self) -> usize;
    /// The number of candidates of `op`.
    fn domain(&self, op: usize) -> usize;
    /// The own cost of `op` taking candidate `c` (weighted seconds).
    fn unary(&self, op: usize, c: usize) -> f64;
    /// The number of edges.
    fn edge_count(&self) -> usize;
    /// (producer op, consumer op) of edge `e`.
    fn ends(&self, e: usize) -> (usize, usize);
    /// Edge `e`'s cost when its producer takes candidate `a` and its consumer `b`.
    fn edge(&self, e: usize, a: usize, b: usize) -> f64;
    /// Sharding propagation's view of `op`'s inputs: how many tensors it reads, and how many
    /// of them are network inputs (edges from the dataset, which propagation starts from as
    /// MindSpore's `_VirtualDataset`). An op reading two or more waits until every one is
    /// decided.
    fn inputs(&self, _op: usize) -> (usize, usize) {
        (0, 0)
    }
    /// The part of `op`'s own cost under candidate `c` that brings the network inputs it
    /// reads to that candidate's layouts (its dataset edges).
    fn dataset(&self, _op: usize, _c: usize) -> f64 {
        0.0
    }
    /// The candidate of `op` that keeps every tensor whole, if it has one (what propagation
    /// gives an op it never reaches, as MindSpore's first candidate).
    fn replicated(&self, _op: usize) -> Option<usize> {
        None
    }
    /// Where candidate `c` of `op` comes in MindSpore's generation order (smaller first):
    /// among equally cheap candidates of an op reading several tensors, MindSpore keeps the
    /// first it generated.
    fn generation_key(&self, _op: usize, c: usize) -> Vec<usize> {
        vec![c]
    }

    /// The objective of a whole choice.
    fn total(&self, choice: &[usize]) -> f64 {
        let unary: f64 = (0..self.ops()).map(|k| self.unary(k, choice[k])).sum();
        unary
            + (0..self.edge_count())
                .map(|e| {
                    let (f, t) = self.ends(e);
                    self.edge(e, choice[f], choice[t])
                })
                .sum::<f64>()
    }
}

/// Costs of a cost graph: `unary[op][candidate]`, plus edges.
#[derive(Clone, Debug, PartialEq)]
pub struct CostProblem {
    /// Each op's own cost per candidate.
    pub unary: Vec<Vec<f64>>,
    /// Every edge with its costs.
    pub edges: Vec<EdgeCost>,
}

/// An edge from op `from` (producer) to op `to` (consumer): `cost[a * to_candidates + b]` when
/// `from` takes candidate `a` and `to` candidate `b`.
#[derive(Clone, Debug, PartialEq)]
pub struct EdgeCost {
    /// The producer op.
    pub from: usize,
    /// The consumer op.
    pub to: usize,
    /// The cost of every pair of candidates, producer's major.
    pub cost: Vec<f64>,
}

impl Costs for CostProblem {
    fn ops(&self) -> usize {
        self.unary.len()
    }
    fn domain(&self, op: usize) -> usize {
        self.unary[op].len()
    }
    fn unary(&self, op: usize, c: usize) -> f64 {
        self.unary[op][c]
    }
    fn edge_count(&self) -> usize {
        self.edges.len()
    }
    fn ends(&self, e: usize) -> (usize, usize) {
        (self.edges[e].from, self.edges[e].to)
    }
    fn edge(&self, e: usize, a: usize, b: usize) -> f64 {
        let e = &self.edges[e];
        e.cost[a * self.unary[e.to].len() + b]
    }
}

impl CostProblem {
    /// The costs it holds: every op's candidates and every edge's pairs.
    pub fn size(&self) -> u128 {
        self.unary.iter().map(|u| u.len() as u128).sum::<u128>() + self.edges.iter().map(|e| e.cost.len() as u128).sum::<u128>()
    }
}

/// The order of [`eliminate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// MindSpore's dynamic_programming: ops with at most two neighbours first, lowest index
    /// first, then the op with the fewest neighbours.
    Eliminations,
    /// Fewest edges added among the neighbours, then the smallest table.
    MinFill,
}

/// The table an elimination would need is larger than the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooWide {
    /// The op whose elimination would need the table.
    pub op: usize,
    /// The entries the table would need.
    pub entries: u128,
}

#[derive(Clone, Debug)]
struct Factor {
    scope: Vec<usize>,
    table: Vec<f64>,
}

impl Factor {
    fn index(&self, assign: &[usize], domains: &[usize]) -> usize {
        let mut i = 0;
        for &v in &self.scope {
            i = i * domains[v] + assign[v];
        }
        i
    }

    /// The step of this factor's index per unit of variable `v` (0 when `v` is not in scope).
    fn stride(&self, v: usize, domains: &[usize]) -> usize {
        let mut stride = 1;
        for &u in self.scope.iter().rev() {
            if u == v {
                return stride;
            }
            stride *= domains[u];
        }
        0
    }
}

/// The best choice by variable elimination in `order`; tables are limited to `limit` entries.
/// Ties go to the lower candidate index.
pub fn eliminate(p: &CostProblem, order: Order, limit: u128) -> Result<Vec<usize>, TooWide> {
    eliminate_priced(p, None, order, limit)
}

/// [`eliminate`] with each op's own cost raised by `lambda * memory[op][candidate]` when
/// `priced` is `Some((memory, lambda))`.
fn eliminate_priced(p: &CostProblem, priced: Option<(&[Vec<f64>], f64)>, order: Order, limit: u128) -> Result<Vec<usize>, TooWide> {
    let n = p.unary.len();
    let domains: Vec<usize> = p.unary.iter().map(|u| u.len()).collect();
    let own = |v: usize, u: &[f64]| -> Vec<f64> {
        match priced {
            Some((memory, lambda)) => u.iter().zip(&memory[v]).map(|(t, m)| t + lambda * m).collect(),
            None => u.to_vec(),
        }
    };
    let mut pool: Vec<Factor> = p.unary.iter().enumerate().map(|(v, u)| Factor { scope: vec![v], table: own(v, u) }).collect();
    for e in &p.edges {
        if e.from == e.to {
            let d = domains[e.from];
            pool.push(Factor { scope: vec![e.from], table: (0..d).map(|c| e.cost[c * d + c]).collect() });
        } else if e.from < e.to {
            pool.push(Factor { scope: vec![e.from, e.to], table: e.cost.clone() });
        } else {
            let (df, dt) = (domains[e.from], domains[e.to]);
            let mut t = vec![0.0; df * dt];
            for a in 0..df {
                for b in 0..dt {
                    t[b * df + a] = e.cost[a * dt + b];
                }
            }
            pool.push(Factor { scope: vec![e.to, e.from], table: t });
        }
    }
    let plan = elimination_plan(p, order, limit, MAX_TABLE)?;
    let mut steps: Vec<(usize, Vec<Factor>)> = Vec::with_capacity(n);
    let mut assign = vec![0usize; n];
    for (v, scope) in plan {
        let (bucket, rest): (Vec<Factor>, Vec<Factor>) = pool.into_iter().partition(|f| f.scope.contains(&v));
        pool = rest;
        let size: usize = scope.iter().map(|&u| domains[u]).product();
        let mut table = vec![0.0; size];
        // Each factor's step per candidate of v; its offset for an entry of the new table is
        // found once per entry, so the loop over v's candidates is a strided sum.
        let strides: Vec<usize> = bucket.iter().map(|f| f.stride(v, &domains)).collect();
        let mut bases = vec![0usize; bucket.len()];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut rem = i;
            for &u in scope.iter().rev() {
                assign[u] = rem % domains[u];
                rem /= domains[u];
            }
            assign[v] = 0;
            for (base, f) in bases.iter_mut().zip(&bucket) {
                *base = f.index(&assign, &domains);
            }
            let mut best = f64::INFINITY;
            for x in 0..domains[v] {
                let mut c = 0.0;
                for ((f, &base), &stride) in bucket.iter().zip(&bases).zip(&strides) {
                    c += f.table[base + x * stride];
                }
                if c < best {
                    best = c;
                }
            }
            *slot = best;
        }
        pool.push(Factor { scope, table });
        steps.push((v, bucket));
    }
    let mut choice = vec![0usize; n];
    for (v, bucket) in steps.iter().rev() {
        let mut best = (f64::INFINITY, 0);
        for x in 0..domains[*v] {
            choice[*v] = x;
            let c: f64 = bucket.iter().map(|f| f.table[f.index(&choice, &domains)]).sum();
            if c < best.0 {
                best = (c, x);
            }
        }
        choice[*v] = best.1;
    }
    Ok(choice)
}

/// The elimination's steps, worked out before any table is built: each variable in `order`
/// and the scope of the table its elimination makes. The sizes depend on the graph alone, so
/// a problem too wide for `limit` entries of work (or `max_table` entries of table) in some
/// step is refused at once, before the steps before it are computed.
fn elimination_plan(p: &impl Costs, order: Order, limit: u128, max_table: u128) -> Result<Vec<(usize, Vec<usize>)>, TooWide> {
    let n = p.ops();
    let domains: Vec<usize> = (0..n).map(|k| p.domain(k)).collect();
    let mut adj = vec![BTreeSet::new(); n];
    for e in 0..p.edge_count() {
        let (a, b) = p.ends(e);
        if a != b {
            adj[a].insert(b);
            adj[b].insert(a);
        }
    }
    let mut alive = vec![true; n];
    let mut plan = Vec::with_capacity(n);
    for _ in 0..n {
        let v = next_var(order, &adj, &alive, &domains);
        alive[v] = false;
        let scope: Vec<usize> = adj[v].iter().copied().collect();
        let entries = scope.iter().chain([&v]).try_fold(1u128, |acc, &u| acc.checked_mul(domains[u] as u128)).unwrap_or(u128::MAX);
        if entries > limit || entries / domains[v].max(1) as u128 > max_table {
            return Err(TooWide { op: v, entries });
        }
        eliminated(&mut adj, v, &scope);
        plan.push((v, scope));
    }
    Ok(plan)
}

/// A problem's shape without its costs: each op's candidate count and each edge's ends,
/// all [`check_width`] reads (its costs are never asked for).
pub struct Shape {
    /// Candidates per op.
    pub domains: Vec<usize>,
    /// (producer, consumer) per edge.
    pub ends: Vec<(usize, usize)>,
}

impl Costs for Shape {
    fn ops(&self) -> usize {
        self.domains.len()
    }
    fn domain(&self, op: usize) -> usize {
        self.domains[op]
    }
    fn unary(&self, _: usize, _: usize) -> f64 {
        unreachable!("a problem's shape has no costs")
    }
    fn edge_count(&self) -> usize {
        self.ends.len()
    }
    fn ends(&self, e: usize) -> (usize, usize) {
        self.ends[e]
    }
    fn edge(&self, _: usize, _: usize, _: usize) -> f64 {
        unreachable!("a problem's shape has no costs")
    }
}

/// Whether [`eliminate`] in `order` stays within `limit` entries of work per step (and
/// [`MAX_TABLE`] per table) on a problem of `p`'s shape: checked from its candidate counts and
/// edges alone, before any edge is priced.
pub fn check_width(p: &impl Costs, order: Order, limit: u128) -> Result<(), TooWide> {
    elimination_plan(p, order, limit, MAX_TABLE).map(|_| ())
}

/// `v` leaves the graph `adj`: its neighbours `scope` become one clique.
fn eliminated(adj: &mut [BTreeSet<usize>], v: usize, scope: &[usize]) {
    for &a in scope {
        adj[a].remove(&v);
        for &b in scope {
            if a != b {
                adj[a].insert(b);
            }
        }
    }
    adj[v].clear();
}

fn next_var(order: Order, adj: &[BTreeSet<usize>], alive: &[bool], domains: &[usize]) -> usize {
    let live = (0..adj.len()).filter(|&v| alive[v]);
    match order {
        Order::Eliminations => live.min_by_key(|&v| (adj[v].len().max(2), v)).expect("a variable is left"),
        Order::MinFill => live
            .min_by_key(|&v| {
                let nb: Vec<usize> = adj[v].iter().copied().collect();
                let mut fill = 0usize;
                for (i, &a) in nb.iter().enumerate() {
                    for &b in &nb[i + 1..] {
                        if !adj[a].contains(&b) {
                            fill += 1;
                        }
                    }
                }
                let size = nb.iter().try_fold(1u128, |acc, &u| acc.checked_mul(domains[u] as u128)).unwrap_or(u128::MAX);
                (fill, size, v)
            })
            .expect("a variable is left"),
    }
}

/// The most points a cost list keeps (MindSpore's `Simplify` keeps every Pareto point; past
/// this many, every k-th point of the front is kept, its two ends always).
pub const LIST_LIMIT: usize = 64;

/// Why [`eliminate_within`] found no plan.
#[derive(Clone, Debug, PartialEq)]
pub enum NoPlan {
    /// A table too large to build.
    TooWide(TooWide),
    /// No choice's memory fits the budget; the least any choice needs.
    OverBudget {
        /// The least memory a choice needs (the sum over the ops).
        least: f64,
    },
}

/// The most sums of list points [`eliminate_within`] forms before it gives up: about a second
/// on a 2-core x86-64 machine (the 4-block GPT on 8 devices, under a budget, forms 17 million).
pub const LIST_WORK: u64 = 1 << 25;

/// The most points [`eliminate_within`]'s tables keep before it gives up, counting each cost
/// it starts from (about 100 MiB with their origins, besides a list header per table entry).
pub const LIST_POINTS: usize = 1 << 21;

/// One point of a cost list: the time and memory of the eliminated part, and where it came from.
#[derive(Clone, Copy, Debug)]
struct Point {
    time: f64,
    memory: f64,
    /// Index of its origin in the factor's `origins` (created factors only).
    origin: u32,
}

/// A table of cost lists over `scope`; a factor made by an elimination remembers, per point,
/// the eliminated op's candidate and the point taken from each factor of its bucket.
struct ListFactor {
    scope: Vec<usize>,
    lists: Vec<Vec<Point>>,
    /// (eliminated op, the factors of its bucket) for a factor made by an elimination.
    made: Option<(usize, Vec<usize>)>,
    /// Per origin: the eliminated op's candidate, then one point index per bucket factor.
    origins: Vec<u32>,
    /// The least memory of the ops whose own costs its points include.
    least: f64,
}

impl ListFactor {
    fn index(&self, assign: &[usize], domains: &[usize]) -> usize {
        let mut i = 0;
        for &v in &self.scope {
            i = i * domains[v] + assign[v];
        }
        i
    }
}

/// Keeps the Pareto front of `items` by (time, memory) (sorted by memory, each kept item
/// strictly faster than the one before), then at most [`LIST_LIMIT`] of them: every k-th of
/// the front, its least-memory and fastest ends always kept.
fn keep_front<T>(items: &mut Vec<T>, cost: impl Fn(&T) -> (f64, f64)) {
    items.sort_by(|a, b| {
        let (a, b) = (cost(a), cost(b));
        a.1.total_cmp(&b.1).then(a.0.total_cmp(&b.0))
    });
    let mut kept: Vec<T> = Vec::with_capacity(items.len());
    for x in items.drain(..) {
        if kept.last().is_none_or(|l| below(cost(&x).0, cost(l).0)) {
            kept.push(x);
        }
    }
    if kept.len() > LIST_LIMIT {
        let last = kept.len() - 1;
        let picked: BTreeSet<usize> = (0..LIST_LIMIT).map(|i| i * last / (LIST_LIMIT - 1)).collect();
        kept = kept.into_iter().enumerate().filter(|(j, _)| picked.contains(j)).map(|(_, x)| x).collect();
    }
    *items = kept;
}

/// The largest table an elimination builds (entries), whatever the work limit: 128 MiB of
/// costs.
pub const MAX_TABLE: u128 = 1 << 24;

/// The largest table of cost lists [`eliminate_within`] builds (entries, each a list of up to
/// [`LIST_LIMIT`] points).
pub const MAX_LIST_TABLE: u128 = 1 << 18;

/// Each op's least memory over its candidates (memory is the ops' own, so a choice needs at
/// least their sum).
fn least_memory(memory: &[Vec<f64>]) -> Vec<f64> {
    memory.iter().map(|m| m.iter().copied().fold(f64::INFINITY, f64::min)).collect()
}

/// The fastest choice whose memory, `memory[op][candidate]` summed over the ops, is at most
/// `budget`: variable elimination in `order` with a cost list per table entry (the Pareto
/// front of time and memory, points over the budget dropped). Exact while no front is longer
/// than [`LIST_LIMIT`]; past it, the thinned fronts may miss the fastest plan that fits.
/// `Ok(None)` when the lists grow past [`LIST_WORK`] sums formed or [`LIST_POINTS`] points
/// kept (how long they grow depends on the costs, not only on the tables' sizes).
pub fn eliminate_within(
    p: &CostProblem,
    memory: &[Vec<f64>],
    budget: f64,
    order: Order,
    limit: u128,
) -> Result<Option<Vec<usize>>, NoPlan> {
    let n = p.unary.len();
    let domains: Vec<usize> = p.unary.iter().map(|u| u.len()).collect();
    // Memory is the ops' own: a point covering some ops needs at least the others' least too.
    let least = least_memory(memory);
    let total_least: f64 = least.iter().sum();
    if total_least > budget {
        return Err(NoPlan::OverBudget { least: total_least });
    }
    // Every cost starts as a list of one point.
    if p.size() > LIST_POINTS as u128 {
        return Ok(None);
    }
    let slack = 1e-9 * budget.abs().max(1.0);
    let fits = |m: f64, covered: f64| m + (total_least - covered) <= budget + slack;
    let mut factors = list_factors(p, memory, &least, &fits);
    let mut pool: Vec<usize> = (0..factors.len()).collect();
    // Each entry's work is a product of lists: a sixteenth of the plain limit.
    let plan = elimination_plan(p, order, limit / 16, MAX_LIST_TABLE).map_err(NoPlan::TooWide)?;
    let mut assign = vec![0usize; n];
    let (mut work, mut kept) = (0u64, p.size() as usize);
    for (v, scope) in plan {
        let (bucket, rest): (Vec<usize>, Vec<usize>) = pool.into_iter().partition(|&f| factors[f].scope.contains(&v));
        pool = rest;
        let size: usize = scope.iter().map(|&u| domains[u]).product();
        let mut lists = Vec::with_capacity(size);
        let mut origins: Vec<u32> = Vec::new();
        // Sums over the bucket's factors, one point of each: (time, memory, trail node); the
        // trail holds (previous node, point taken) so sums are not copied to extend them.
        let mut trail: Vec<(u32, u32)> = Vec::new();
        let mut sums: Vec<(f64, f64, u32)> = Vec::new();
        let mut next: Vec<(f64, f64, u32, u32)> = Vec::new();
        let mut found: Vec<(u32, u32)> = Vec::new();
        for i in 0..size {
            let mut rem = i;
            for &u in scope.iter().rev() {
                assign[u] = rem % domains[u];
                rem /= domains[u];
            }
            trail.clear();
            found.clear();
            let mut points: Vec<Point> = Vec::new();
            for x in 0..domains[v] {
                assign[v] = x;
                sums.clear();
                sums.push((0.0, 0.0, u32::MAX));
                let mut covered = 0.0;
                for &f in &bucket {
                    let fac = &factors[f];
                    let list = &fac.lists[fac.index(&assign, &domains)];
                    covered += fac.least;
                    next.clear();
                    work += (sums.len() * list.len()) as u64;
                    if work > LIST_WORK {
                        return Ok(None);
                    }
                    for &(t, m, node) in &sums {
                        for (j, q) in list.iter().enumerate() {
                            if fits(m + q.memory, covered) {
                                next.push((t + q.time, m + q.memory, node, j as u32));
                            }
                        }
                    }
                    keep_front(&mut next, |c| (c.0, c.1));
                    sums.clear();
                    for &(t, m, node, j) in &next {
                        trail.push((node, j));
                        sums.push((t, m, (trail.len() - 1) as u32));
                    }
                }
                for &(t, m, node) in &sums {
                    points.push(Point { time: t, memory: m, origin: found.len() as u32 });
                    found.push((x as u32, node));
                }
            }
            keep_front(&mut points, |p| (p.time, p.memory));
            for pt in &mut points {
                let (x, mut node) = found[pt.origin as usize];
                pt.origin = (origins.len() / (bucket.len() + 1)) as u32;
                origins.push(x);
                let at = origins.len();
                origins.resize(at + bucket.len(), 0);
                for slot in (at..at + bucket.len()).rev() {
                    let (prev, j) = trail[node as usize];
                    origins[slot] = j;
                    node = prev;
                }
            }
            // Stored: only the front's room (it was sized for every sum).
            points.shrink_to_fit();
            kept += points.len();
            if kept > LIST_POINTS {
                return Ok(None);
            }
            lists.push(points);
        }
        let covered = bucket.iter().map(|&f| factors[f].least).sum();
        factors.push(ListFactor { scope, lists, made: Some((v, bucket)), origins, least: covered });
        pool.push(factors.len() - 1);
    }
    let Some(picks) = fastest_within(&factors, &pool, budget) else {
        return Err(NoPlan::OverBudget { least: total_least });
    };
    Ok(Some(replay_lists(&factors, &pool, picks, &domains)))
}

/// The list factors elimination starts from: each op's own costs (a point per candidate that
/// `fits` with the others' least memory, else none), each edge's costs.
fn list_factors(p: &CostProblem, memory: &[Vec<f64>], least: &[f64], fits: &dyn Fn(f64, f64) -> bool) -> Vec<ListFactor> {
    let domains: Vec<usize> = p.unary.iter().map(|u| u.len()).collect();
    let single = |time: f64, memory: f64| vec![Point { time, memory, origin: 0 }];
    let mut factors: Vec<ListFactor> = Vec::new();
    for (v, u) in p.unary.iter().enumerate() {
        let lists = u.iter().zip(&memory[v]).map(|(&t, &m)| if fits(m, least[v]) { single(t, m) } else { Vec::new() }).collect();
        factors.push(ListFactor { scope: vec![v], lists, made: None, origins: Vec::new(), least: least[v] });
    }
    for e in &p.edges {
        let (df, dt) = (domains[e.from], domains[e.to]);
        let (scope, lists) = if e.from == e.to {
            (vec![e.from], (0..df).map(|c| single(e.cost[c * df + c], 0.0)).collect())
        } else {
            (vec![e.from, e.to], (0..df * dt).map(|i| single(e.cost[i], 0.0)).collect())
        };
        factors.push(ListFactor { scope, lists, made: None, origins: Vec::new(), least: 0.0 });
    }
    factors
}

/// Once every factor left (`pool`) has an empty scope, the whole problem's front is their sum:
/// the point each takes in the fastest sum within `budget` (None: none fits).
fn fastest_within(factors: &[ListFactor], pool: &[usize], budget: f64) -> Option<Vec<u32>> {
    let mut partial: Vec<(f64, f64, Vec<u32>)> = vec![(0.0, 0.0, Vec::new())];
    for &f in pool {
        let list = &factors[f].lists[0];
        partial = partial
            .iter()
            .flat_map(|(t, m, picks)| {
                list.iter().enumerate().filter(move |(_, q)| m + q.memory <= budget).map(move |(j, q)| {
                    let mut picks = picks.clone();
                    picks.push(j as u32);
                    (t + q.time, m + q.memory, picks)
                })
            })
            .collect();
        keep_front(&mut partial, |c| (c.0, c.1));
    }
    let mut best: Option<(f64, Vec<u32>)> = None;
    for (t, _, picks) in partial {
        if best.as_ref().is_none_or(|b| below(t, b.0)) {
            best = Some((t, picks));
        }
    }
    best.map(|(_, picks)| picks)
}

/// Replay: each made factor's point names its op's candidate and its bucket's points, from
/// the final factors' `picks` down.
fn replay_lists(factors: &[ListFactor], pool: &[usize], picks: Vec<u32>, domains: &[usize]) -> Vec<usize> {
    let mut choice = vec![0usize; domains.len()];
    let mut stack: Vec<(usize, u32)> = pool.iter().copied().zip(picks).collect();
    while let Some((f, j)) = stack.pop() {
        let fac = &factors[f];
        let Some((v, bucket)) = &fac.made else { continue };
        let point = fac.lists[fac.index(&choice, domains)][j as usize];
        let at = point.origin as usize * (bucket.len() + 1);
        choice[*v] = fac.origins[at] as usize;
        stack.extend(bucket.iter().copied().zip(fac.origins[at + 1..at + 1 + bucket.len()].iter().copied()));
    }
    choice
}

/// `count` copies of a block of `period` consecutive ops, the first starting at op `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repeat {
    /// The first op of the first copy.
    pub start: usize,
    /// The ops in a copy.
    pub period: usize,
    /// The copies, back to back (at least 2).
    pub count: usize,
}

impl Repeat {
    /// The ops the copies cover: `start..start + period * count`.
    pub fn span(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.period * self.count
    }
}

/// Identical blocks repeated back to back in `sig` (one signature per op, in graph order; two
/// ops with equal signatures are interchangeable): greedily the repeat that covers the most
/// ops beyond its first copy (ties: the shorter period, then the earlier start), then again
/// among the ops no repeat covers yet, until no block of at least `min_period` ops repeats.
/// The repeats do not overlap and are sorted by start.
pub fn tandem_repeats(sig: &[usize], min_period: usize) -> Vec<Repeat> {
    let n = sig.len();
    let mut used = vec![false; n];
    let mut found = Vec::new();
    loop {
        // (ops saved, period, start) of the best repeat.
        let mut best: Option<(usize, usize, usize)> = None;
        for period in min_period.max(1)..=n / 2 {
            // run: how many k in a row have sig[k] == sig[k + period], both free.
            let mut run = 0usize;
            for k in 0..n - period {
                if sig[k] == sig[k + period] && !used[k] && !used[k + period] {
                    run += 1;
                } else {
                    run = 0;
                }
                // sig[k + 1 - run ..= k + period] repeats with this period.
                let count = (run + period) / period;
                if count >= 2 {
                    let saved = (count - 1) * period;
                    let start = k + 1 - run;
                    let better = match best {
                        None => true,
                        Some((s, p, st)) => saved > s || (saved == s && (period < p || (period == p && start < st))),
                    };
                    if better {
                        best = Some((saved, period, start));
                    }
                }
            }
        }
        let Some((saved, period, start)) = best else { break };
        let r = Repeat { start, period, count: saved / period + 1 };
        used[r.span()].iter_mut().for_each(|u| *u = true);
        found.push(r);
    }
    found.sort_by_key(|r| r.start);
    found
}

/// Each op's index among the merged ops of `rep` (numbered in order of first appearance) and
/// each merged op's domain; tied ops must have the same domain.
pub(crate) fn tied_index(rep: &[usize], domains: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut number = vec![usize::MAX; rep.len()];
    let mut merged = Vec::new();
    let index = rep
        .iter()
        .enumerate()
        .map(|(k, &r)| {
            assert_eq!(domains[k], domains[r], "tied ops {k} and {r} have different candidates");
            if number[r] == usize::MAX {
                number[r] = merged.len();
                merged.push(domains[r]);
            }
            number[r]
        })
        .collect();
    (index, merged)
}

/// The fastest choice found within a memory budget by pricing memory (Lagrangian
/// relaxation): [`eliminate`] of time + lambda x memory, lambda bisected between a price whose
/// plan overflows `budget` and one whose plan fits; the fastest plan that fit is returned.
/// Every plan it returns fits; each is the exact optimum of its priced problem, so the plan
/// is optimal among the plans on the convex hull of the (memory, time) front.
pub fn eliminate_priced_within(p: &CostProblem, memory: &[Vec<f64>], budget: f64, order: Order, limit: u128) -> Result<Vec<usize>, NoPlan> {
    let least: f64 = least_memory(memory).iter().sum();
    if least > budget {
        return Err(NoPlan::OverBudget { least });
    }
    let mem = |c: &[usize]| c.iter().enumerate().map(|(k, &x)| memory[k][x]).sum::<f64>();
    let solve = |lambda: f64| eliminate_priced(p, Some((memory, lambda)), order, limit).map_err(NoPlan::TooWide);
    let free = solve(0.0)?;
    if mem(&free) <= budget {
        return Ok(free);
    }
    // A price of time per byte at which memory counts as much as the fastest plan's time.
    let scale = p.total(&free).abs().max(1e-300) / mem(&free).max(1.0);
    let (mut lo, mut hi) = (0.0, scale);
    let mut best: Option<(f64, Vec<usize>)> = None;
    let keep = |c: Vec<usize>, best: &mut Option<(f64, Vec<usize>)>| -> bool {
        if mem(&c) > budget {
            return false;
        }
        let t = p.total(&c);
        if best.as_ref().is_none_or(|b| t < b.0) {
            *best = Some((t, c));
        }
        true
    };
    // Raise the price until a plan fits (the least-memory plan does at a high enough price).
    for _ in 0..200 {
        if keep(solve(hi)?, &mut best) {
            break;
        }
        (lo, hi) = (hi, hi * 4.0);
    }
    for _ in 0..24 {
        let mid = 0.5 * (lo + hi);
        if keep(solve(mid)?, &mut best) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    best.map(|b| b.1).ok_or(NoPlan::OverBudget { least })
}

/// Every combination, the first best one (tests; tiny problems only).
pub fn brute_force(p: &CostProblem) -> Vec<usize> {
    brute_force_where(p, |_| true).expect("a problem has at least one choice")
}

/// Every combination that `keep` accepts, the first best one; None when it accepts none
/// (tests; tiny problems only).
pub fn brute_force_where(p: &CostProblem, keep: impl Fn(&[usize]) -> bool) -> Option<Vec<usize>> {
    let n = p.unary.len();
    let mut cur = vec![0usize; n];
    let mut best: Option<(f64, Vec<usize>)> = None;
    loop {
        if keep(&cur) {
            let t = p.total(&cur);
            if best.as_ref().is_none_or(|b| t < b.0) {
                best = Some((t, cur.clone()));
            }
        }
        let mut i = n;
        loop {
            if i == 0 {
                return best.map(|b| b.1);
            }
            i -= 1;
            cur[i] += 1;
            if cur[i] < p.domain(i) {
                break;
            }
            cur[i] = 0;
        }
    }
}

/// `a` is cheaper than `b` beyond rounding.
pub(crate) fn below(a: f64, b: f64) -> bool {
    a < b - 1e-9 * a.abs().max(b.abs()).max(1e-300)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::propagate::propagate;
    use proptest::prelude::*;

    /// A clique of `n` ops with `d` candidates each: its shape alone (a cost read panics).
    fn clique(n: usize, d: usize) -> Shape {
        Shape { domains: vec![d; n], ends: (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))).collect() }
    }

    /// A problem too wide to eliminate is refused from its shape alone (no cost is read), and
    /// one within the limit passes.
    #[test]
    fn the_width_check_refuses_a_wide_problem_before_pricing_it() {
        let wide = clique(12, 16);
        let e = check_width(&wide, Order::MinFill, 1 << 30).unwrap_err();
        assert!(e.entries > 1 << 30, "{e:?}");
        check_width(&clique(4, 16), Order::MinFill, 1 << 30).unwrap();
    }

    fn problem(domains: &[usize], edges: &[(usize, usize)], seed: u64) -> CostProblem {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 1000) as f64 / 10.0
        };
        let unary = domains.iter().map(|&d| (0..d).map(|_| next()).collect()).collect();
        let edges =
            edges.iter().map(|&(f, t)| EdgeCost { from: f, to: t, cost: (0..domains[f] * domains[t]).map(|_| next()).collect() }).collect();
        CostProblem { unary, edges }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Variable elimination in either order equals brute force on random graphs of up to 8
        /// ops, and propagation is never cheaper than the optimum.
        #[test]
        fn elimination_equals_brute_force(
            domains in proptest::collection::vec(1usize..4, 1..=8),
            raw_edges in proptest::collection::vec((0usize..8, 0usize..8), 0..14),
            seed in any::<u64>(),
        ) {
            let n = domains.len();
            let edges: Vec<(usize, usize)> = raw_edges.into_iter().map(|(a, b)| (a % n, b % n)).collect();
            let p = problem(&domains, &edges, seed);
            let best = p.total(&brute_force(&p));
            for order in [Order::Eliminations, Order::MinFill] {
                let c = eliminate(&p, order, 1 << 30).unwrap();
                prop_assert!((p.total(&c) - best).abs() <= 1e-9 * best.abs().max(1.0), "{order:?}: {} vs {best}", p.total(&c));
            }
            let configured = vec![None; n];
            prop_assert!(p.total(&propagate(&p, &configured).0) >= best - 1e-9 * best.abs().max(1.0));
        }
    }

    /// A sequence of signatures: a random prefix, `count` copies of a random block, a random
    /// suffix (signatures drawn from a small alphabet, so accidental repeats happen too).
    fn repeated(prefix: &[usize], block: &[usize], count: usize, suffix: &[usize]) -> Vec<usize> {
        let mut s = prefix.to_vec();
        for _ in 0..count {
            s.extend_from_slice(block);
        }
        s.extend_from_slice(suffix);
        s
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Every repeat found is real (each copy equals the first), repeats do not overlap,
        /// and a block repeated `count` times is found covering at least `count - 1` copies.
        #[test]
        fn tandem_repeats_are_real_and_found(
            prefix in proptest::collection::vec(0usize..4, 0..6),
            block in proptest::collection::vec(0usize..4, 1..7),
            count in 1usize..6,
            suffix in proptest::collection::vec(0usize..4, 0..6),
            min_period in 1usize..3,
        ) {
            let sig = repeated(&prefix, &block, count, &suffix);
            let found = tandem_repeats(&sig, min_period);
            let mut covered = vec![false; sig.len()];
            for r in &found {
                prop_assert!(r.count >= 2 && r.period >= min_period);
                for i in r.span() {
                    prop_assert!(!covered[i], "{found:?} overlap");
                    covered[i] = true;
                    prop_assert_eq!(sig[i], sig[r.start + (i - r.start) % r.period]);
                }
            }
            let saved: usize = found.iter().map(|r| (r.count - 1) * r.period).sum();
            if block.len() >= min_period && count >= 2 {
                // The greedy first pick alone saves at least what the planted repeat would.
                prop_assert!(saved >= (count - 1) * block.len(), "{sig:?}: {found:?}");
            }
        }

        /// With cost lists, elimination in either order finds the fastest choice whose summed
        /// memory fits the budget (brute force over every choice), and says when none fits;
        /// with no budget it is as fast as the plain elimination. Pricing memory gives a plan
        /// that fits whenever one does, never faster than the optimum.
        #[test]
        fn elimination_within_a_budget_equals_brute_force(
            domains in proptest::collection::vec(1usize..4, 1..=7),
            raw_edges in proptest::collection::vec((0usize..7, 0usize..7), 0..12),
            seed in any::<u64>(),
            budget_share in 0.0f64..1.2,
        ) {
            let n = domains.len();
            let edges: Vec<(usize, usize)> = raw_edges.into_iter().map(|(a, b)| (a % n, b % n)).collect();
            let p = problem(&domains, &edges, seed);
            // Memory per candidate from another stream of the same generator.
            let memory: Vec<Vec<f64>> = problem(&domains, &[], seed ^ 0x9e37_79b9).unary;
            let mem = |c: &[usize]| c.iter().enumerate().map(|(k, &x)| memory[k][x]).sum::<f64>();
            let (least, most): (f64, f64) = (
                memory.iter().map(|m| m.iter().cloned().fold(f64::INFINITY, f64::min)).sum(),
                memory.iter().map(|m| m.iter().cloned().fold(0.0, f64::max)).sum(),
            );
            let budget = least + budget_share * (most - least) - 0.05;
            // Brute force: the fastest choice within the budget.
            let best = brute_force_where(&p, |c| mem(c) <= budget).map(|c| p.total(&c));
            for order in [Order::Eliminations, Order::MinFill] {
                match (eliminate_within(&p, &memory, budget, order, 1 << 30), best) {
                    (Ok(Some(c)), Some(b)) => {
                        prop_assert!(mem(&c) <= budget, "{order:?}: {} over {budget}", mem(&c));
                        prop_assert!((p.total(&c) - b).abs() <= 1e-9 * b.abs().max(1.0), "{order:?}: {} vs {b}", p.total(&c));
                    }
                    (Err(NoPlan::OverBudget { least: l }), None) => prop_assert!((l - least).abs() <= 1e-9 * least.max(1.0)),
                    (got, want) => prop_assert!(false, "{order:?}: {got:?} but brute force {want:?}"),
                }
                match (eliminate_priced_within(&p, &memory, budget, order, 1 << 30), best) {
                    (Ok(c), Some(b)) => prop_assert!(mem(&c) <= budget && p.total(&c) >= b - 1e-9 * b.abs().max(1.0)),
                    (Err(NoPlan::OverBudget { .. }), None) => {}
                    (got, want) => prop_assert!(false, "priced, {order:?}: {got:?} but brute force {want:?}"),
                }
            }
            let free = eliminate_within(&p, &memory, f64::INFINITY, Order::Eliminations, 1 << 30).unwrap().expect("a small problem");
            let plain = eliminate(&p, Order::Eliminations, 1 << 30).unwrap();
            prop_assert!((p.total(&free) - p.total(&plain)).abs() <= 1e-9 * p.total(&plain).abs().max(1.0));
        }
    }

    /// The cost lists run on problems of any size while they stay within their bounds: on a
    /// branching network of 30 ops with 24 candidates each (17,000 costs), under budgets that
    /// bind, they find faster plans than the priced elimination for some budgets (plans that
    /// pricing memory by one number cannot reach; for others their thinned fronts lose, so
    /// dynamic_programming takes the faster of the two); a problem of more costs than the
    /// points bound gives up at once, and so does one whose fronts take more than the work
    /// bound.
    #[test]
    fn cost_lists_run_within_their_bounds_and_beat_pricing_where_they_do() {
        let n = 30;
        let domains = vec![24; n];
        let edges: Vec<(usize, usize)> = (1..n).map(|k| (if k % 5 == 0 { k - 5 } else { k - 1 }, k)).collect();
        let p = problem(&domains, &edges, 7);
        assert!(p.size() > 1 << 14);
        let memory: Vec<Vec<f64>> = problem(&domains, &[], 11).unary;
        let mem = |c: &[usize]| c.iter().enumerate().map(|(k, &x)| memory[k][x]).sum::<f64>();
        let least: f64 = memory.iter().map(|m| m.iter().cloned().fold(f64::INFINITY, f64::min)).sum();
        let free = eliminate(&p, Order::Eliminations, 1 << 30).unwrap();
        let mut better = 0;
        for share in 1..6 {
            let budget = least + (mem(&free) - least) * share as f64 / 6.0;
            let listed = eliminate_within(&p, &memory, budget, Order::Eliminations, 1 << 30).unwrap().expect("within the bounds");
            let priced = eliminate_priced_within(&p, &memory, budget, Order::Eliminations, 1 << 30).unwrap();
            assert!(mem(&listed) <= budget * (1.0 + 1e-12) && mem(&priced) <= budget * (1.0 + 1e-12));
            better += usize::from(p.total(&listed) < p.total(&priced) - 1e-9);
        }
        assert!(better > 0, "the lists never found a faster plan than pricing");
        // More costs than the points bound: no lists at all.
        let wide = problem(&[1500, 1500], &[(0, 1)], 3);
        assert!(wide.size() > LIST_POINTS as u128);
        let wide_memory = problem(&[1500, 1500], &[], 5).unary;
        assert_eq!(eliminate_within(&wide, &wide_memory, 150.0, Order::Eliminations, 1 << 30), Ok(None));
        // Four ops of 64 candidates, all linked: the first elimination's table has 64^3 entries
        // of 64 sums each, past the work bound.
        let clique: Vec<(usize, usize)> = (0..4).flat_map(|a| (a + 1..4).map(move |b| (a, b))).collect();
        let big = problem(&[64; 4], &clique, 13);
        let big_memory = problem(&[64; 4], &[], 17).unary;
        let least: f64 = big_memory.iter().map(|m| m.iter().cloned().fold(f64::INFINITY, f64::min)).sum();
        assert_eq!(eliminate_within(&big, &big_memory, least + 100.0, Order::MinFill, 1 << 30), Ok(None));
    }

    #[test]
    fn the_layers_of_a_network_are_one_repeat() {
        // embed, 5 blocks of [ln, q, k, v, attn, add], head: one repeat of period 6.
        let sig = repeated(&[9, 8], &[1, 2, 2, 3, 4, 5], 5, &[1, 7]);
        assert_eq!(tandem_repeats(&sig, 2), vec![Repeat { start: 2, period: 6, count: 5 }]);
        // Nothing repeats: nothing found; a period below the minimum is not taken.
        assert!(tandem_repeats(&[1, 2, 3, 4], 1).is_empty());
        assert!(tandem_repeats(&[1, 1, 1, 1], 2).len() == 1);
        assert_eq!(tandem_repeats(&[1, 1, 1, 1], 1), vec![Repeat { start: 0, period: 1, count: 4 }]);
    }

    #[test]
    fn a_chain_is_solved_exactly_and_wide_tables_are_refused() {
        // A chain of 30 ops with 4 candidates each.
        let edges: Vec<(usize, usize)> = (0..29).map(|i| (i, i + 1)).collect();
        let p = problem(&[4; 30], &edges, 7);
        let c = eliminate(&p, Order::Eliminations, 1 << 20).unwrap();
        // Any single change makes it no cheaper.
        for v in 0..30 {
            for x in 0..4 {
                let mut d = c.clone();
                d[v] = x;
                assert!(p.total(&d) >= p.total(&c) - 1e-9);
            }
        }
        // A clique of 8 ops with 4 candidates needs a 4^8 table at some point.
        let p = problem(&[4; 8], &clique(8, 4).ends, 3);
        assert!(eliminate(&p, Order::MinFill, 1000).is_err());
    }
}
