//! Which pipeline stage runs each op.
//!
//! An op's stage is the one the model gave it (`GraphBuilder::set_pipeline_stage`, MindSpore's
//! `cell.pipeline_stage`), else the latest stage among its inputs. Parameters, network inputs
//! and constants (ops without inputs) have no stage: every stage that uses one holds its own
//! copy (a parameter used on several stages is a shared parameter).

use autopar_graph::Graph;

use crate::error::{ParallelError, PipelineProblem, Result};

/// Whether the model placed any op on a stage.
pub fn has_stages(graph: &Graph) -> bool {
    graph.nodes().iter().any(|n| !n.is_stageless() && n.pipeline_stage.is_some())
}

/// Cut a graph the model did not place into `stages` contiguous runs of ops (in graph order,
/// which is execution order) whose largest forward FLOPs is as small as it can be (the stage
/// that bounds the pipeline's pace), every run holding at least one op when the graph has that
/// many. Cuts fall where the fewest values cross (between the blocks of a transformer or the
/// residual blocks of a ResNet, where one value does) when there are enough such places;
/// otherwise anywhere. Every op's stage is set.
pub fn balance_stages(graph: &mut Graph, stages: usize) {
    let ops: Vec<usize> = (0..graph.len()).filter(|&i| !graph.node(autopar_graph::NodeId(i)).is_stageless()).collect();
    let weights: Vec<f64> = ops
        .iter()
        .map(|&i| {
            let n = graph.node(autopar_graph::NodeId(i));
            let ins: Vec<autopar_graph::TensorType> = n.inputs.iter().map(|x| graph.node(*x).ty.clone()).collect();
            // Every op weighs at least one FLOP per output element, so cheap ops spread too.
            n.op.def().cost(&autopar_graph::CostCx { inputs: &ins, output: &n.ty, rank: 0 }).flops.max(n.ty.numel() as f64)
        })
        .collect();
    // Runs between the places where the fewest values cross.
    let crossing = crossing_values(graph, &ops);
    let fewest = crossing.iter().skip(1).copied().min().unwrap_or(0);
    let starts: Vec<usize> = (0..ops.len()).filter(|&k| k == 0 || crossing[k] == fewest).collect();
    let parts = if starts.len() >= stages {
        let run_weights: Vec<f64> =
            starts.iter().enumerate().map(|(r, &a)| weights[a..starts.get(r + 1).copied().unwrap_or(ops.len())].iter().sum()).collect();
        let of_run = partition(&run_weights, stages);
        let mut parts = Vec::with_capacity(ops.len());
        for (r, &a) in starts.iter().enumerate() {
            parts.extend(std::iter::repeat_n(of_run[r], starts.get(r + 1).copied().unwrap_or(ops.len()) - a));
        }
        parts
    } else {
        partition(&weights, stages)
    };
    for (&i, stage) in ops.iter().zip(parts) {
        graph.node_mut(autopar_graph::NodeId(i)).pipeline_stage = Some(stage);
    }
    casts_with_their_readers(graph);
}

/// The precision policy's casts of values no stage computes (parameters, constants, inputs)
/// on the stage of their first reader, so that a weight lives where it is used; latest first,
/// so a cast read by a cast follows it.
pub(crate) fn casts_with_their_readers(graph: &mut Graph) {
    let users = graph.users();
    for i in (0..graph.len()).rev() {
        let node = graph.node(autopar_graph::NodeId(i));
        let inserted = node.op.is_inserted_cast();
        if !inserted || !graph.node(node.inputs[0]).is_stageless() {
            continue;
        }
        if let Some(stage) = users[i].iter().find_map(|u| graph.node(*u).pipeline_stage) {
            graph.node_mut(autopar_graph::NodeId(i)).pipeline_stage = Some(stage);
        }
    }
}

/// For each position `k` of `ops` (graph indices of the ops, ascending), how many op values
/// produced before `ops[k]` are used by `ops[k]` or later (what a cut there would transfer).
fn crossing_values(graph: &Graph, ops: &[usize]) -> Vec<usize> {
    let users = graph.users();
    let mut delta = vec![0isize; ops.len() + 1];
    for (pos, &v) in ops.iter().enumerate() {
        let Some(last) = users[v].iter().map(|u| u.0).max() else { continue };
        // Live at the positions after its own up to the last op at or before its last use.
        let end = ops.partition_point(|&o| o <= last);
        if end > pos + 1 {
            delta[pos + 1] += 1;
            delta[end] -= 1;
        }
    }
    let mut live = 0isize;
    delta[..ops.len()]
        .iter()
        .map(|d| {
            live += d;
            live as usize
        })
        .collect()
}

/// The part of each weight when `weights` (in order) are cut into `parts` contiguous runs whose
/// largest sum is smallest; every run is non-empty when there are at least `parts` weights.
pub fn partition(weights: &[f64], parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    // The runs of greedy packing under `bound`: starts of each run.
    let pack = |bound: f64| -> Vec<usize> {
        let mut starts = vec![0];
        let mut load = 0.0;
        for (i, &w) in weights.iter().enumerate() {
            if load > 0.0 && load + w > bound {
                starts.push(i);
                load = 0.0;
            }
            load += w;
        }
        starts
    };
    let (mut lo, mut hi) = (weights.iter().fold(0.0f64, |m, &w| m.max(w)), weights.iter().sum::<f64>().max(f64::MIN_POSITIVE));
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if mid <= lo || mid >= hi {
            break;
        }
        if pack(mid).len() <= parts {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let mut starts = pack(hi);
    starts.truncate(parts);
    // Fewer runs than parts: split the longest runs (splitting never raises the largest sum).
    while starts.len() < parts.min(weights.len()) {
        let ends: Vec<usize> = starts.iter().skip(1).copied().chain([weights.len()]).collect();
        let (k, _) = starts.iter().zip(&ends).enumerate().max_by_key(|(_, (s, e))| *e - *s).expect("one run at least");
        let (s, e) = (starts[k], ends[k]);
        starts.insert(k + 1, s + (e - s) / 2);
    }
    let mut out = Vec::with_capacity(weights.len());
    for (k, &s) in starts.iter().enumerate() {
        let e = starts.get(k + 1).copied().unwrap_or(weights.len());
        out.extend(std::iter::repeat_n(k, e - s));
    }
    out
}

/// Cut a graph the model did not place into stages at the named ops (`--pipeline-split`):
/// `starts` names, in network order, the first op of each stage after the first, so stage
/// `s + 1` runs from `starts[s]` up to the next one, and the loss (if given) is on the last.
/// With `interleave` it names the first op of each piece after the first, `chunks * stages`
/// pieces whose stages run `0..stages` over and over (chunk `c` of stage `s` is piece
/// `c * stages + s`), as MindSpore's interleaved models place their cells. Every op's stage is set.
pub fn split_before(
    graph: &mut Graph,
    stages: usize,
    starts: &[String],
    loss: Option<autopar_graph::NodeId>,
    interleave: bool,
) -> Result<()> {
    let err = |problem| Err(ParallelError::Pipeline { problem });
    if stages < 2 {
        return err(PipelineProblem::SplitWithoutStages);
    }
    if has_stages(graph) {
        return err(PipelineProblem::SplitOfPlacedModel);
    }
    let pieces = starts.len() + 1;
    if (!interleave && pieces != stages) || (interleave && !pieces.is_multiple_of(stages)) {
        return err(PipelineProblem::SplitCount { given: starts.len(), stages, interleave });
    }
    let first_op = graph.nodes().iter().position(|n| !n.is_stageless());
    let mut at = Vec::with_capacity(starts.len());
    for name in starts {
        let i = graph.nodes().iter().position(|n| n.name == *name && !n.is_stageless());
        let Some(i) = i else { return err(PipelineProblem::SplitNotAnOp { name: name.clone() }) };
        if Some(i) == first_op {
            return err(PipelineProblem::SplitAtFirstOp { name: name.clone() });
        }
        if let Some(l) = loss.filter(|l| l.0 < i) {
            return err(PipelineProblem::SplitAfterLoss { name: name.clone(), loss: graph.node(l).name.clone() });
        }
        if let Some(&prev) = at.last() {
            if i <= prev {
                return err(PipelineProblem::SplitOrder {
                    name: name.clone(),
                    after: graph.node(autopar_graph::NodeId(prev)).name.clone(),
                });
            }
        }
        at.push(i);
    }
    for i in 0..graph.len() {
        let id = autopar_graph::NodeId(i);
        if !graph.node(id).is_stageless() {
            graph.node_mut(id).pipeline_stage = Some(at.iter().filter(|&&a| a <= i).count() % stages);
        }
    }
    Ok(())
}

/// Number the chunks (virtual stages) of an interleaved pipeline whose ops the model placed on
/// stages: walking the ops in execution order, an op placed on a lower stage than the one
/// before starts a new chunk (MindSpore's rule), and its stage becomes its piece
/// `chunk * stages + stage`. Returns the number of chunks, after checking every stage of
/// every chunk has an op.
pub fn number_chunks(graph: &mut Graph, stages: usize) -> Result<usize> {
    let err = |problem| Err(ParallelError::Pipeline { problem });
    let (mut chunk, mut last) = (0, 0);
    for i in 0..graph.len() {
        let id = autopar_graph::NodeId(i);
        let node = graph.node(id);
        let Some(s) = node.pipeline_stage.filter(|_| !node.is_stageless()) else { continue };
        if s >= stages {
            return err(PipelineProblem::StageOutOfRange { kind: node.op.kind(), name: node.name.clone(), stage: s, stages });
        }
        if s < last {
            chunk += 1;
        }
        last = s;
        graph.node_mut(id).pipeline_stage = Some(chunk * stages + s);
    }
    let chunks = chunk + 1;
    let placed: Vec<usize> = graph.nodes().iter().filter(|n| !n.is_stageless()).filter_map(|n| n.pipeline_stage).collect();
    for piece in 0..chunks * stages {
        if !placed.contains(&piece) {
            return err(PipelineProblem::EmptyChunk { stage: piece % stages, chunk: piece / stages, chunks });
        }
    }
    Ok(chunks)
}

/// Every node's stage (None for stage-less nodes), checked: stages in `0..stages`, no op before
/// one of its inputs, no empty stage, the loss (if any) on the last stage.
pub fn assign_stages(graph: &Graph, stages: usize, loss: Option<autopar_graph::NodeId>) -> Result<Vec<Option<usize>>> {
    let err = |problem| Err(ParallelError::Pipeline { problem });
    let mut out: Vec<Option<usize>> = vec![None; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        if node.is_stageless() {
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
    // An unplaced cast of a value no stage computes (a parameter's) sits with its earliest
    // reader, not on stage 0.
    let users = graph.users();
    for (i, node) in graph.nodes().iter().enumerate() {
        let inserted = node.op.is_inserted_cast();
        if inserted && node.pipeline_stage.is_none() && graph.node(node.inputs[0]).is_stageless() {
            if let Some(s) = users[i].iter().filter_map(|u| out[u.0]).min() {
                out[i] = Some(s);
            }
        }
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
    fn a_split_starts_each_stage_at_its_op_and_refuses_bad_names() {
        let (mut g, l) = mlp(&[None, None, None]);
        split_before(&mut g, 3, &["act".into(), "loss".into()], Some(l), false).unwrap();
        let s = assign_stages(&g, 3, Some(l)).unwrap();
        let of = |name: &str| s[g.nodes().iter().position(|n| n.name == name).unwrap()];
        assert_eq!((of("fc1"), of("act"), of("fc2"), of("loss"), of("w1")), (Some(0), Some(1), Some(1), Some(2), None));
        let problem = |starts: &[&str], stages: usize, g: &Graph| {
            let mut g = g.clone();
            match split_before(&mut g, stages, &starts.iter().map(|s| s.to_string()).collect::<Vec<_>>(), None, false) {
                Err(ParallelError::Pipeline { problem }) => problem,
                other => panic!("{starts:?}: {other:?}"),
            }
        };
        let (fresh, _) = mlp(&[None, None, None]);
        assert_eq!(problem(&["act"], 3, &fresh), PipelineProblem::SplitCount { given: 1, stages: 3, interleave: false });
        assert_eq!(problem(&["w2"], 2, &fresh), PipelineProblem::SplitNotAnOp { name: "w2".into() });
        assert_eq!(problem(&["nope"], 2, &fresh), PipelineProblem::SplitNotAnOp { name: "nope".into() });
        assert_eq!(problem(&["fc2", "act"], 3, &fresh), PipelineProblem::SplitOrder { name: "act".into(), after: "fc2".into() });
        assert_eq!(problem(&["fc1"], 2, &fresh), PipelineProblem::SplitAtFirstOp { name: "fc1".into() });
        assert_eq!(problem(&["act"], 1, &fresh), PipelineProblem::SplitWithoutStages);
        let (mut g2, l2) = mlp(&[None, None, None]);
        let after = split_before(&mut g2, 2, &["loss".into()], Some(l2), false);
        assert!(after.is_ok(), "the loss itself may begin the last stage: {after:?}");
        let (placed, _) = mlp(&[Some(0), Some(1), None]);
        assert_eq!(problem(&["act"], 2, &placed), PipelineProblem::SplitOfPlacedModel);
        let msg = ParallelError::Pipeline { problem: problem(&["fc2", "act"], 3, &fresh) }.to_string();
        assert!(msg.contains("\"act\"") && msg.contains("network order"), "{msg}");
    }

    #[test]
    fn interleaved_stages_repeat_and_a_lower_stage_starts_a_new_chunk() {
        // The model's own placement: stages 0, 1, 0, 1 in execution order are pieces 0..4.
        let (g, l) = mlp(&[Some(0), Some(1), None]);
        let mut b = GraphBuilder::new(1);
        let x = b.input("x", &[4, 8], DType::F32).unwrap();
        let w = b.parameter("w", &[8, 8], Initializer::Zeros).unwrap();
        let mut h = x;
        for (k, stage) in [0, 1, 0, 1].into_iter().enumerate() {
            b.set_pipeline_stage(Some(stage));
            h = b.matmul(&format!("fc{k}"), h, w).unwrap();
        }
        let loss = b.reduce_mean("loss", h, &[0, 1], false).unwrap();
        let mut placed = b.finish();
        assert_eq!(number_chunks(&mut placed, 2).unwrap(), 2);
        let s = assign_stages(&placed, 4, Some(loss)).unwrap();
        let of = |name: &str| s[placed.find(name).unwrap().0];
        assert_eq!((of("fc0"), of("fc1"), of("fc2"), of("fc3"), of("loss"), of("w")), (Some(0), Some(1), Some(2), Some(3), Some(3), None));
        // A chunk that skips a stage, and a stage out of range, are named.
        let e = number_chunks(&mut g.clone(), 3).unwrap_err().to_string();
        assert!(e.contains("chunk 0 (virtual stage) of stage 2 has no operator"), "{e}");
        let (mut far, _) = mlp(&[Some(0), Some(2), None]);
        assert!(number_chunks(&mut far, 2).unwrap_err().to_string().contains("placed on stage 2"));
        // A split with interleave names the first op of every piece; its stages repeat.
        let (mut fresh, _) = mlp(&[None, None, None]);
        split_before(&mut fresh, 2, &["act".into(), "fc2".into(), "loss".into()], Some(l), true).unwrap();
        let stage = |g: &Graph, name: &str| g.node(g.find(name).unwrap()).pipeline_stage;
        assert_eq!(
            (stage(&fresh, "fc1"), stage(&fresh, "act"), stage(&fresh, "fc2"), stage(&fresh, "loss")),
            (Some(0), Some(1), Some(0), Some(1))
        );
        assert_eq!(number_chunks(&mut fresh, 2).unwrap(), 2);
        let (mut odd, _) = mlp(&[None, None, None]);
        let e = split_before(&mut odd, 2, &["act".into(), "fc2".into()], Some(l), true).unwrap_err();
        assert!(e.to_string().contains("k*2-1 ops"), "{e}");
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

    /// The smallest largest run sum over every cut of `w` into `parts` non-empty runs.
    fn best(w: &[f64], parts: usize) -> f64 {
        if parts == 1 {
            return w.iter().sum();
        }
        (1..=w.len() + 1 - parts).map(|k| w[..k].iter().sum::<f64>().max(best(&w[k..], parts - 1))).fold(f64::INFINITY, f64::min)
    }

    proptest::proptest! {
        #[test]
        fn partitions_are_contiguous_non_empty_and_minimise_the_largest_run(
            w in proptest::collection::vec(1.0f64..1000.0, 1..12), parts in 1usize..6,
        ) {
            let p = partition(&w, parts);
            proptest::prop_assert_eq!(p.len(), w.len());
            proptest::prop_assert_eq!(p[0], 0);
            for pair in p.windows(2) {
                proptest::prop_assert!(pair[1] == pair[0] || pair[1] == pair[0] + 1, "{:?}", p);
            }
            let used = p[p.len() - 1] + 1;
            proptest::prop_assert_eq!(used, parts.min(w.len()));
            let largest = (0..used).map(|k| w.iter().zip(&p).filter(|(_, &q)| q == k).map(|(x, _)| x).sum::<f64>()).fold(0.0, f64::max);
            let want = best(&w, used);
            proptest::prop_assert!(largest <= want * (1.0 + 1e-9), "largest run {} above the best {} for {:?}", largest, want, p);
        }
    }

    #[test]
    fn a_heavy_first_op_still_leaves_every_stage_an_op() {
        let p = partition(&[100.0, 1.0, 1.0, 1.0], 4);
        assert_eq!(p, vec![0, 1, 2, 3]);
    }
}
