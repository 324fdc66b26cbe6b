//! `recursive_programming`: placeholder, filled in below.

use autopar_graph::Graph;

use super::costgraph::CostGraph;

/// What the recursive search reads besides the cost graph.
pub struct RecInput<'a> {
    pub graph: &'a Graph,
    pub devices: usize,
    pub training: bool,
}

/// Each op's candidate index.
pub fn choose(cg: &CostGraph, _rec: &RecInput<'_>) -> Vec<usize> {
    vec![0; cg.ops.len()]
}
