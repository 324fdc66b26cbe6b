//! Sharding propagation ([`propagate`]), as MindSpore's `CostGraph::StrategyPropagate`: from
//! the configured ops and the dataset, breadth first, each neighbour takes the candidate with
//! the cheapest edges to the ops decided before it (ties: its own cost, then MindSpore's
//! generation order). It solves the same problem as the eliminations of [`super::solve`], the
//! cost graph's, without its optimum.

use std::collections::{BTreeSet, VecDeque};

use super::solve::{below, Costs};

/// Sharding propagation, as MindSpore's `CostGraph::StrategyPropagate`. Ops with
/// `Some(candidate)` in `configured` keep it. Breadth first from each configured op in index
/// order, then from the dataset (the network inputs: MindSpore's `_VirtualDataset`, a
/// configured op too, whose name sorts after the others). A popped op's consumers, then its
/// producers, are reached: a producer, or a consumer reading one tensor, takes the candidate
/// whose edge to the popped op costs least (ties: its own cost, then index); a consumer
/// reading several tensors (a parameter or constant counts, as in MindSpore) waits until
/// every one comes from an op already walked, then takes the candidate whose edges from the
/// walked ops (and the dataset, once walked) cost least (ties: its own cost, then MindSpore's
/// generation order). When the queue runs dry, the waiting op first in topological order is
/// decided so, unless the next configured op comes after it (its walk may reach it from
/// below first). An op never reached takes its all-ones candidate where it has one, else its
/// cheapest given its decided neighbours. Returns each op's candidate and whether it was
/// reached over an edge (false: configured, or never reached). Edges from an op to itself
/// are left out (the cost graph folds them into the op's own cost).
pub fn propagate(p: &impl Costs, configured: &[Option<usize>]) -> (Vec<usize>, Vec<bool>) {
    let n = p.ops();
    let mut w = Walk {
        p,
        choice: configured.to_vec(),
        reached: vec![false; n],
        walked: vec![false; n],
        outs: vec![Vec::new(); n],
        ins: vec![Vec::new(); n],
        waiting: BTreeSet::new(),
        dataset_walked: false,
        next_seed: None,
    };
    for e in 0..p.edge_count() {
        let (from, to) = p.ends(e);
        if from != to {
            w.outs[from].push(e);
            w.ins[to].push(e);
        }
    }
    let seeds: Vec<usize> = (0..n).filter(|&v| configured[v].is_some()).collect();
    for (i, &v) in seeds.iter().enumerate() {
        w.next_seed = seeds.get(i + 1).copied();
        w.walk(VecDeque::from([v]));
    }
    // The dataset, popped as one more configured op: its consumers are the ops reading
    // network inputs.
    w.dataset_walked = true;
    let mut queue = VecDeque::new();
    for v in (0..n).filter(|&v| p.inputs(v).1 > 0) {
        w.consumer(v, &mut queue, None);
    }
    w.walk(queue);
    for v in 0..n {
        if w.choice[v].is_none() {
            let c = p.replicated(v).unwrap_or_else(|| w.cheapest_given_neighbours(v));
            w.choice[v] = Some(c);
        }
    }
    (w.choice.into_iter().map(|c| c.expect("every op is decided")).collect(), w.reached)
}

/// The state of [`propagate`]'s walk.
struct Walk<'a, C: Costs> {
    p: &'a C,
    choice: Vec<Option<usize>>,
    reached: Vec<bool>,
    /// Popped from a walk's queue: its edges to its consumers count as visited.
    walked: Vec<bool>,
    /// Per op, the edges it produces and those it consumes.
    outs: Vec<Vec<usize>>,
    ins: Vec<Vec<usize>>,
    /// Ops reading several tensors, reached before all of them were walked.
    waiting: BTreeSet<usize>,
    /// The dataset's walk has begun: its edges count as visited.
    dataset_walked: bool,
    /// The configured op whose walk comes next (None: the dataset's, or none).
    next_seed: Option<usize>,
}

impl<C: Costs> Walk<'_, C> {
    /// Breadth first from the ops in `queue` (decided), then from the ops left waiting.
    fn walk(&mut self, mut queue: VecDeque<usize>) {
        loop {
            while let Some(u) = queue.pop_front() {
                self.walked[u] = true;
                for i in 0..self.outs[u].len() {
                    let e = self.outs[u][i];
                    self.consumer(self.p.ends(e).1, &mut queue, Some(e));
                }
                let cu = self.choice[u].expect("queued ops are decided");
                for i in 0..self.ins[u].len() {
                    let e = self.ins[u][i];
                    let v = self.p.ends(e).0;
                    if self.choice[v].is_none() {
                        let c = self.least(v, false, |c| self.p.edge(e, c, cu));
                        self.arrive(v, c, &mut queue);
                    }
                }
            }
            self.waiting.retain(|&v| self.choice[v].is_none());
            // The first waiting op waits on for the next configured op's walk when it comes
            // after it (MindSpore's `ExistPrevConfiguredOps`).
            let Some(&v) = self.waiting.first() else { return };
            if self.next_seed.is_some_and(|seed| v < seed) {
                return;
            }
            self.waiting.remove(&v);
            let c = self.over_walked(v);
            self.arrive(v, c, &mut queue);
        }
    }

    /// Consumer `v` reached over edge `e` from the op just popped (None: from the dataset).
    fn consumer(&mut self, v: usize, queue: &mut VecDeque<usize>, e: Option<usize>) {
        if self.choice[v].is_some() {
            return;
        }
        if self.p.inputs(v).0 >= 2 {
            if self.all_inputs_walked(v) {
                let c = self.over_walked(v);
                self.arrive(v, c, queue);
            } else {
                self.waiting.insert(v);
            }
            return;
        }
        let c = match e {
            Some(e) => {
                let cu = self.choice[self.p.ends(e).0].expect("a walked op is decided");
                self.least(v, false, |c| self.p.edge(e, cu, c))
            }
            None => self.least(v, false, |c| self.p.dataset(v, c)),
        };
        self.arrive(v, c, queue);
    }

    /// Decide `v`, as reached over an edge, and queue it.
    fn arrive(&mut self, v: usize, c: usize, queue: &mut VecDeque<usize>) {
        self.choice[v] = Some(c);
        self.reached[v] = true;
        queue.push_back(v);
    }

    /// Every tensor `v` reads comes from a walked op or the walked dataset.
    fn all_inputs_walked(&self, v: usize) -> bool {
        let (tensors, dataset) = self.p.inputs(v);
        let walked = self.ins[v].iter().filter(|&&e| self.walked[self.p.ends(e).0]).count();
        walked + if self.dataset_walked { dataset } else { 0 } >= tensors
    }

    /// `v`'s candidate whose edges from walked ops (and the dataset, once walked) cost least.
    /// Ties: its own cost, then MindSpore's generation order.
    fn over_walked(&self, v: usize) -> usize {
        self.least(v, true, |c| {
            let mut x = if self.dataset_walked { self.p.dataset(v, c) } else { 0.0 };
            for &e in &self.ins[v] {
                let from = self.p.ends(e).0;
                if self.walked[from] {
                    x += self.p.edge(e, self.choice[from].expect("a walked op is decided"), c);
                }
            }
            x
        })
    }

    /// `v`'s candidate cheapest with its own cost and its edges to decided neighbours.
    fn cheapest_given_neighbours(&self, v: usize) -> usize {
        let mut best = (f64::INFINITY, 0);
        for c in 0..self.p.domain(v) {
            let mut x = self.p.unary(v, c);
            for &e in self.ins[v].iter().chain(&self.outs[v]) {
                let (from, to) = self.p.ends(e);
                x += match (from == v, self.choice[from], self.choice[to]) {
                    (false, Some(a), _) => self.p.edge(e, a, c),
                    (true, _, Some(b)) => self.p.edge(e, c, b),
                    _ => 0.0,
                };
            }
            if below(x, best.0) {
                best = (x, c);
            }
        }
        best.1
    }

    /// The candidate of `v` with the least `key`, ties broken by its own cost (without its
    /// dataset edges, which MindSpore's operator cost leaves out), then by MindSpore's
    /// generation order (`generated`) or index.
    fn least(&self, v: usize, generated: bool, key: impl Fn(usize) -> f64) -> usize {
        let mut best: Option<(f64, f64, usize)> = None;
        let mut best_key: Option<Vec<usize>> = None;
        for c in 0..self.p.domain(v) {
            let (k, own) = (key(c), self.p.unary(v, c) - self.p.dataset(v, c));
            let better = match best {
                None => true,
                Some((bk, bo, bc)) => {
                    below(k, bk)
                        || (!below(bk, k)
                            && (below(own, bo)
                                || (!below(bo, own) && generated && {
                                    let theirs = best_key.get_or_insert_with(|| self.p.generation_key(v, bc));
                                    self.p.generation_key(v, c) < *theirs
                                })))
                }
            };
            if better {
                best = Some((k, own, c));
                best_key = None;
            }
        }
        best.map_or(0, |b| b.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::solve::{CostProblem, EdgeCost};

    /// Ops with MindSpore's view of their inputs: (tensors read, how many from the dataset),
    /// the dataset's cost per candidate, and an all-ones candidate. Edges cost 0 between equal
    /// candidates and 5 otherwise; own costs are 0.
    struct Walked {
        domains: Vec<usize>,
        edges: Vec<(usize, usize)>,
        inputs: Vec<(usize, usize)>,
        dataset: Vec<Vec<f64>>,
        replicated: Vec<Option<usize>>,
    }

    impl Costs for Walked {
        fn ops(&self) -> usize {
            self.domains.len()
        }
        fn domain(&self, op: usize) -> usize {
            self.domains[op]
        }
        fn unary(&self, op: usize, c: usize) -> f64 {
            self.dataset(op, c)
        }
        fn edge_count(&self) -> usize {
            self.edges.len()
        }
        fn ends(&self, e: usize) -> (usize, usize) {
            self.edges[e]
        }
        fn edge(&self, _: usize, a: usize, b: usize) -> f64 {
            if a == b {
                0.0
            } else {
                5.0
            }
        }
        fn inputs(&self, op: usize) -> (usize, usize) {
            self.inputs[op]
        }
        fn dataset(&self, op: usize, c: usize) -> f64 {
            self.dataset[op].get(c).copied().unwrap_or(0.0)
        }
        fn replicated(&self, op: usize) -> Option<usize> {
            self.replicated[op]
        }
    }

    #[test]
    fn propagation_walks_as_mindspores() {
        // 0 (configured 1) -> 1 (reads 0 and the dataset, which prefers its candidate 0) -> 2;
        // 3 is reached by nothing and has an all-ones candidate, 2.
        let p = Walked {
            domains: vec![2, 2, 2, 3],
            edges: vec![(0, 1), (1, 2)],
            inputs: vec![(1, 0), (2, 1), (1, 0), (1, 0)],
            dataset: vec![vec![], vec![0.0, 3.0], vec![], vec![]],
            replicated: vec![None, None, None, Some(2)],
        };
        // 1 waits for the dataset, whose walk comes after the configured op's: when the walk
        // runs dry it follows op 0 alone.
        assert_eq!(propagate(&p, &[Some(1), None, None, None]), (vec![1, 1, 1, 2], vec![false, true, true, false]));
        // Nothing configured: the dataset's walk decides 1 over its dataset edge, then 0 (its
        // producer) and 2 follow.
        assert_eq!(propagate(&p, &[None, None, None, None]).0, vec![0, 0, 0, 2]);
        // 0 (configured 1) -> 1 (reads 0 and a parameter: never every input walked) -> 2
        // (configured 0): 1 comes before the next configured op, so it waits for that op's
        // walk, which reaches it from below.
        let p = Walked {
            domains: vec![2, 2, 2],
            edges: vec![(0, 1), (1, 2)],
            inputs: vec![(1, 0), (2, 0), (1, 0)],
            dataset: vec![vec![]; 3],
            replicated: vec![None; 3],
        };
        assert_eq!(propagate(&p, &[Some(1), None, Some(0)]).0, vec![1, 0, 0]);
        // The same op after both configured ones: decided when the first walk runs dry.
        let p = Walked { edges: vec![(0, 2), (2, 1)], inputs: vec![(1, 0), (1, 0), (2, 0)], ..p };
        assert_eq!(propagate(&p, &[Some(1), Some(0), None]).0, vec![1, 0, 1]);
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
