//! Which pipeline stage runs each op.
//!
//! An op's stage is the one the model gave it (`GraphBuilder::set_pipeline_stage`, MindSpore's
//! `cell.pipeline_stage`), else the latest stage among its inputs. Parameters, network inputs
//! and constants (ops without inputs) have no stage: every stage that uses one holds its own
//! copy (a parameter used on several stages is a shared parameter).

use autopar_graph::{Graph, Node};

use crate::error::{ParallelError, PipelineProblem, Result};

/// Whether `node` belongs to every stage that uses it rather than to one.
pub fn is_stageless(node: &Node) -> bool {
    node.op.is_leaf() || node.inputs.is_empty()
}

/// Whether the model placed any op on a stage.
pub fn has_stages(graph: &Graph) -> bool {
    graph.nodes().iter().any(|n| !is_stageless(n) && n.pipeline_stage.is_some())
}

/// Cut a graph the model did not place into `stages` contiguous runs of ops (in graph order,
/// which is execution order) of about equal forward FLOPs: every op's stage is set, so blocks
/// of a transformer or stages of a ResNet fall on stages in order.
pub fn balance_stages(graph: &mut Graph, stages: usize) {
    let flops: Vec<f64> = graph
        .nodes()
        .iter()
        .map(|n| {
            if is_stageless(n) {
                return 0.0;
            }
            let ins: Vec<autopar_graph::TensorType> = n.inputs.iter().map(|x| graph.node(*x).ty.clone()).collect();
            // Every op weighs at least one FLOP per output element, so cheap ops spread too.
            n.op.def().cost(&autopar_graph::CostCx { inputs: &ins, output: &n.ty, rank: 0 }).flops.max(n.ty.numel() as f64)
        })
        .collect();
    let total: f64 = flops.iter().sum();
    let mut before = 0.0;
    for (i, f) in flops.iter().enumerate() {
        let node = graph.node_mut(autopar_graph::NodeId(i));
        if is_stageless(node) {
            continue;
        }
        let mid = before + f / 2.0;
        before += f;
        node.pipeline_stage = Some(((mid / total.max(f64::MIN_POSITIVE) * stages as f64) as usize).min(stages - 1));
    }
}

/// Every node's stage (None for stage-less nodes), checked: stages in `0..stages`, no op before
/// one of its inputs, no empty stage, the loss (if any) on the last stage.
pub fn assign_stages(graph: &Graph, stages: usize, loss: Option<autopar_graph::NodeId>) -> Result<Vec<Option<usize>>> {
    let err = |problem| Err(ParallelError::Pipeline { problem });
    let mut out: Vec<Option<usize>> = vec![None; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        if is_stageless(node) {
            continue;
        }
        let from_inputs = node.inputs.iter().filter_map(|x| out[x.0].map(|s| (s, x))).max_by_key(|(s, _)| *s);
        let stage = match (node.pipeline_stage, from_inputs) {
            (Some(s), Some((is, x))) if s < is => {
                return err(PipelineProblem::ConsumerBeforeProducer {
                    kind: node.op.kind(),
                    name: node.name.clone(),
                    stage: s,
                    input: graph.node(*x).name.clone(),
                    input_stage: is,
                })
            }
            (Some(s), _) => s,
            (None, Some((s, _))) => s,
            (None, None) => 0,
        };
        if stage >= stages {
            return err(PipelineProblem::StageOutOfRange { kind: node.op.kind(), name: node.name.clone(), stage, stages });
        }
        out[i] = Some(stage);
    }
    for stage in 0..stages {
        if !out.contains(&Some(stage)) {
            return err(PipelineProblem::EmptyStage { stage, stages });
        }
    }
    if let Some(l) = loss {
        let stage = out[l.0].unwrap_or(0);
        if stage + 1 != stages {
            return err(PipelineProblem::LossNotOnLastStage { name: graph.node(l).name.clone(), stage, stages });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopar_graph::{DType, GraphBuilder, Initializer};

    fn mlp(stages: &[Option<usize>; 3]) -> (Graph, autopar_graph::NodeId) {
        let mut b = GraphBuilder::new(1);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let w1 = b.parameter("w1", &[8, 8], Initializer::Zeros).unwrap();
        let w2 = b.parameter("w2", &[8, 2], Initializer::Zeros).unwrap();
        b.set_pipeline_stage(stages[0]);
        let h = b.matmul("fc1", x, w1).unwrap();
        b.set_pipeline_stage(stages[1]);
        let r = b.relu("act", h).unwrap();
        let y = b.matmul("fc2", r, w2).unwrap();
        b.set_pipeline_stage(stages[2]);
        let l = b.reduce_mean("loss", y, &[0, 1], false).unwrap();
        b.output(l).unwrap();
        (b.finish(), l)
    }

    #[test]
    fn ops_inherit_the_latest_stage_of_their_inputs_and_leaves_have_none() {
        let (g, l) = mlp(&[Some(0), Some(1), None]);
        let s = assign_stages(&g, 2, Some(l)).unwrap();
        for (node, stage) in g.nodes().iter().zip(&s) {
            let want = match node.name.as_str() {
                "x" | "w1" | "w2" => None,
                "fc1" => Some(0),
                _ => Some(1),
            };
            assert_eq!(*stage, want, "{}", node.name);
        }
    }

    #[test]
    fn balanced_stages_are_contiguous_and_even_in_flops() {
        let (mut g, l) = mlp(&[None, None, None]);
        assert!(!has_stages(&g));
        balance_stages(&mut g, 2);
        let s = assign_stages(&g, 2, Some(l)).unwrap();
        // fc1 and fc2 cost the most: one on each stage.
        let stage = |name: &str| s[g.find(name).unwrap().0];
        assert_eq!((stage("fc1"), stage("fc2"), stage("loss")), (Some(0), Some(1), Some(1)));
    }

    #[test]
    fn misplaced_stages_are_errors_naming_the_op() {
        let (g, l) = mlp(&[Some(1), Some(0), None]);
        let e = assign_stages(&g, 2, Some(l)).unwrap_err().to_string();
        assert!(e.contains("before its input") && e.contains("stage 0"), "{e}");
        let (g, l) = mlp(&[Some(0), Some(0), None]);
        let e = assign_stages(&g, 2, Some(l)).unwrap_err().to_string();
        assert!(e.contains("stage 1 of 2 has no operator"), "{e}");
        let (g, l) = mlp(&[Some(0), Some(3), None]);
        let e = assign_stages(&g, 2, Some(l)).unwrap_err().to_string();
        assert!(e.contains("placed on stage 3") && e.contains("2 stages"), "{e}");
        let (g, l) = mlp(&[Some(0), Some(2), Some(1)]);
        assert!(assign_stages(&g, 3, Some(l)).unwrap_err().to_string().contains("before its input"));
    }
}
