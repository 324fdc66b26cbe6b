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
//! * [`propagate`] is sharding propagation: from the configured ops, breadth first, each
//!   neighbour takes the candidate with the cheapest edge to the op it was reached from (ties:
//!   its own cost).

use std::collections::{BTreeSet, VecDeque};

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
    /// For each op, the other ops it shares an edge with.
    fn neighbours(&self) -> Vec<BTreeSet<usize>> {
        let mut adj = vec![BTreeSet::new(); self.unary.len()];
        for e in &self.edges {
            if e.from != e.to {
                adj[e.from].insert(e.to);
                adj[e.to].insert(e.from);
            }
        }
        adj
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
}

/// The best choice by variable elimination in `order`; tables are limited to `limit` entries.
/// Ties go to the lower candidate index.
pub fn eliminate(p: &CostProblem, order: Order, limit: u128) -> Result<Vec<usize>, TooWide> {
    let n = p.unary.len();
    let domains: Vec<usize> = p.unary.iter().map(|u| u.len()).collect();
    let mut pool: Vec<Factor> = p.unary.iter().enumerate().map(|(v, u)| Factor { scope: vec![v], table: u.clone() }).collect();
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
    let mut adj = p.neighbours();
    let mut alive = vec![true; n];
    let mut steps: Vec<(usize, Vec<Factor>)> = Vec::with_capacity(n);
    let mut assign = vec![0usize; n];
    for _ in 0..n {
        let v = next_var(order, &adj, &alive, &domains);
        alive[v] = false;
        let (bucket, rest): (Vec<Factor>, Vec<Factor>) = pool.into_iter().partition(|f| f.scope.contains(&v));
        pool = rest;
        let scope: Vec<usize> = adj[v].iter().copied().collect();
        let entries = scope.iter().chain([&v]).try_fold(1u128, |acc, &u| acc.checked_mul(domains[u] as u128)).unwrap_or(u128::MAX);
        if entries > limit {
            return Err(TooWide { op: v, entries });
        }
        let size: usize = scope.iter().map(|&u| domains[u]).product();
        let mut table = vec![0.0; size];
        for (i, slot) in table.iter_mut().enumerate() {
            let mut rem = i;
            for &u in scope.iter().rev() {
                assign[u] = rem % domains[u];
                rem /= domains[u];
            }
            let mut best = f64::INFINITY;
            for x in 0..domains[v] {
                assign[v] = x;
                let c: f64 = bucket.iter().map(|f| f.table[f.index(&assign, &domains)]).sum();
                if c < best {
                    best = c;
                }
            }
            *slot = best;
        }
        // The neighbours become one clique.
        for &a in &scope {
            adj[a].remove(&v);
            for &b in &scope {
                if a != b {
                    adj[a].insert(b);
                }
            }
        }
        adj[v].clear();
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

/// Every combination, the first best one (tests; tiny problems only).
pub fn brute_force(p: &CostProblem) -> Vec<usize> {
    let n = p.unary.len();
    let mut cur = vec![0usize; n];
    let mut best = (p.total(&cur), cur.clone());
    loop {
        let mut i = n;
        loop {
            if i == 0 {
                return best.1;
            }
            i -= 1;
            cur[i] += 1;
            if cur[i] < p.domain(i) {
                break;
            }
            cur[i] = 0;
        }
        let t = p.total(&cur);
        if t < best.0 {
            best = (t, cur.clone());
        }
    }
}

/// `a` is cheaper than `b` beyond rounding.
fn below(a: f64, b: f64) -> bool {
    a < b - 1e-9 * a.abs().max(b.abs()).max(1e-300)
}

/// Sharding propagation. Ops with `Some(candidate)` in `configured` keep it; breadth first from
/// them (in index order), an op reached over an edge takes the candidate whose edge cost to the
/// op it was reached from is smallest, ties broken by its own cost, then by index. When the
/// walk stops with ops left, the first of them takes its cheapest candidate given its decided
/// neighbours and the walk goes on from it. Returns each op's candidate and whether it was
/// reached over an edge (false: configured, or the start of a walk).
pub fn propagate(p: &impl Costs, configured: &[Option<usize>]) -> (Vec<usize>, Vec<bool>) {
    let n = p.ops();
    let mut choice: Vec<Option<usize>> = configured.to_vec();
    let mut incident: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in 0..p.edge_count() {
        let (from, to) = p.ends(i);
        incident[from].push(i);
        if to != from {
            incident[to].push(i);
        }
    }
    let mut reached = vec![false; n];
    let mut queue: VecDeque<usize> = (0..n).filter(|&v| choice[v].is_some()).collect();
    loop {
        while let Some(u) = queue.pop_front() {
            let cu = choice[u].expect("queued ops are decided");
            for &ei in &incident[u] {
                let (from, to) = p.ends(ei);
                let (w, forward) = if from == u { (to, true) } else { (from, false) };
                if choice[w].is_some() {
                    continue;
                }
                let mut best: Option<(f64, f64, usize)> = None;
                for cw in 0..p.domain(w) {
                    let edge = if forward { p.edge(ei, cu, cw) } else { p.edge(ei, cw, cu) };
                    let own = p.unary(w, cw);
                    let better = match best {
                        None => true,
                        Some((be, bo, _)) => below(edge, be) || (!below(be, edge) && below(own, bo)),
                    };
                    if better {
                        best = Some((edge, own, cw));
                    }
                }
                if let Some((_, _, cw)) = best {
                    choice[w] = Some(cw);
                    reached[w] = true;
                    queue.push_back(w);
                }
            }
        }
        let Some(v) = (0..n).find(|&v| choice[v].is_none()) else { break };
        let decided: Vec<usize> = choice.iter().map(|c| c.unwrap_or(0)).collect();
        let mut best = (f64::INFINITY, 0);
        for c in 0..p.domain(v) {
            let mut x = p.unary(v, c);
            for &ei in &incident[v] {
                let (from, to) = p.ends(ei);
                let other = if from == v { to } else { from };
                if other == v || choice[other].is_some() {
                    x += if from == v { p.edge(ei, c, if to == v { c } else { decided[to] }) } else { p.edge(ei, decided[from], c) };
                }
            }
            if below(x, best.0) {
                best = (x, c);
            }
        }
        choice[v] = Some(best.1);
        queue.push_back(v);
    }
    (choice.into_iter().map(|c| c.expect("every op is decided")).collect(), reached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        let clique: Vec<(usize, usize)> = (0..8).flat_map(|a| (a + 1..8).map(move |b| (a, b))).collect();
        let p = problem(&[4; 8], &clique, 3);
        assert!(eliminate(&p, Order::MinFill, 1000).is_err());
    }

    #[test]
    fn propagation_follows_the_configured_op() {
        // 0 -> 1 -> 2; 0 configured to candidate 1; edges cost 0 on equal candidates.
        let same = |d: usize| (0..d * d).map(|i| if i / d == i % d { 0.0 } else { 5.0 }).collect::<Vec<f64>>();
        let p = CostProblem {
            unary: vec![vec![0.0, 9.0], vec![0.0, 1.0], vec![0.0, 1.0]],
            edges: vec![EdgeCost { from: 0, to: 1, cost: same(2) }, EdgeCost { from: 1, to: 2, cost: same(2) }],
        };
        assert_eq!(propagate(&p, &[Some(1), None, None]), (vec![1, 1, 1], vec![false, true, true]));
        // Nothing configured: the first op takes its cheapest candidate and the rest follow.
        assert_eq!(propagate(&p, &[None, None, None]).0, vec![0, 0, 0]);
    }
}
