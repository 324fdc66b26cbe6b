//! The strategy files autopar writes for optimizer-sharded and pipeline runs are committed in
//! `fixtures/autopar/strategies/`, where `fixtures/mindspore/generate_rank_lists.py` gives them to
//! MindSpore 2.10 for its rank lists (checked by `autopar-checkpoint`'s `rank_lists` test). This
//! test plans each of those jobs again and asserts that autopar still writes exactly the committed
//! file, so the MindSpore lists keep describing what autopar writes.
//!
//! After a deliberate change of the strategy files, rewrite them and then the lists:
//!
//! ```text
//! AUTOPAR_WRITE_FIXTURES=1 cargo test -p autopar --test written_strategies
//! python fixtures/mindspore/generate_rank_lists.py   # in a venv with mindspore==2.10.0
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use autopar::prelude::*;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/autopar/strategies")
}

/// The zoo's MLP 32-64-64-8 (the network of the other files here) (parameters `fc1`, `fc2`, `fc3`), as `autopar train --model mlp
/// --input-shape 32 --width 64 --depth 2 --num-classes 8` builds it.
fn mlp() -> BuildNetwork {
    let opts = ModelOptions { input_shape: Some(vec![32]), width: Some(64), depth: Some(2), num_classes: Some(8), ..Default::default() };
    autopar::model_network(Arc::from(model_by_name("mlp", &opts).unwrap()), 0)
}

/// A network cut into two pipeline stages whose operators are split over each stage's 4 devices
/// (a [2, 2] grid), with a weight used on both stages (`embed.weight`, a shared parameter).
fn tied_stages(batch: usize, _training: bool) -> Result<Network, BuildError> {
    let mut b = GraphBuilder::new(3);
    let x = b.input("x", &[batch, 16], DType::F32)?;
    let labels = b.input("labels", &[batch], DType::I32)?;
    let embed = b.parameter("embed.weight", &[32, 16], Initializer::HeUniform)?;
    b.set_pipeline_stage(Some(0));
    let mut h = b.matmul_t("embed", x, embed, false, true)?;
    b.shard(h, "((2, 1), (2, 1))".parse()?)?;
    for i in 0..4 {
        b.set_pipeline_stage(Some(i / 2));
        let w = b.parameter(&format!("block{i}.weight"), &[32, 32], Initializer::HeUniform)?;
        h = b.matmul(&format!("block{i}"), h, w)?;
        b.shard(h, if i % 2 == 0 { "((1, 2), (2, 2))" } else { "((2, 2), (2, 1))" }.parse()?)?;
        h = b.relu(&format!("block{i}.relu"), h)?;
    }
    let logits = b.matmul("head", h, embed)?;
    b.shard(logits, "((2, 1), (1, 2))".parse()?)?;
    let loss = b.softmax_cross_entropy("loss", logits, labels)?;
    Ok(Network { graph: b.finish(), x, labels, logits, loss })
}

struct Case {
    file: &'static str,
    network: BuildNetwork,
    features: usize,
    optimizer: &'static str,
    parallel: ParallelContext,
}

fn ctx(options: &[(&str, serde_json::Value)]) -> ParallelContext {
    options.iter().fold(ParallelContext::new(), |c, (k, v)| c.with(k, v.clone()).unwrap_or_else(|e| panic!("{k}: {e}")))
}

fn cases() -> Vec<Case> {
    let mp8 = fixtures().join("mp8.json").display().to_string();
    // The zoo MLP under `parallel`, with the parallel optimizer (threshold 0) and `shard_size`.
    let sharded = |file, optimizer, parallel: &[(&str, serde_json::Value)], shard_size: i64| {
        let mut options = parallel.to_vec();
        options.push(("enable_parallel_optimizer", json!(true)));
        options
            .push(("parallel_optimizer_config", json!({ "parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": shard_size })));
        Case { file, network: mlp(), features: 32, optimizer, parallel: ctx(&options) }
    };
    let mp8 = [("parallel_mode", json!("semi_auto_parallel")), ("device_num", json!(8)), ("strategy_ckpt_load_file", json!(mp8))];
    let stages = [("parallel_mode", json!("semi_auto_parallel")), ("device_num", json!(8)), ("pipeline_stages", json!(2))];
    vec![
        // semi_auto_parallel under mp8.json with every qualifying parameter's AdamW state sharded
        // over its whole replica group, then over 2 ranks of each replica group
        sharded("mp8_optshard.json", "adamw", &mp8, -1),
        sharded("mp8_optshard2.json", "adamw", &mp8, 2),
        // data_parallel on 4 devices with Momentum's state sharded
        sharded("dp4_optshard.json", "momentum", &[("parallel_mode", json!("data_parallel")), ("device_num", json!(4))], -1),
        // 2 pipeline stages of 4 devices, data parallel within each (the merged file)
        Case { file: "pp2_dp8_merged.json", network: mlp(), features: 32, optimizer: "momentum", parallel: ctx(&stages) },
        // 2 pipeline stages of 4 devices, model parallel within each, a shared weight (merged)
        Case {
            file: "pp2_mp8_shared_merged.json",
            network: Arc::new(tied_stages),
            features: 16,
            optimizer: "adamw",
            parallel: ctx(&stages),
        },
    ]
}

fn trainer(case: Case, checkpoint: Option<CheckpointConfig>) -> Trainer {
    let data = DataSource::new(SyntheticDataset::classification(&[case.features], 8, 256, 1).unwrap());
    let optimizer = OptimizerConfig { kind: OptimizerKind::by_name(case.optimizer, 0.9).unwrap(), ..Default::default() };
    let micro_batches = if case.parallel.pipeline_stages() > 1 { 4 } else { 1 };
    let cfg = TrainConfig {
        batch_size: 32,
        micro_batches: Some(micro_batches),
        max_steps: Some(2),
        optimizer,
        parallel: case.parallel,
        checkpoint,
        ..Default::default()
    };
    Trainer::new("fixture", case.network, data, cfg)
}

#[test]
fn the_committed_strategy_files_are_what_autopar_writes() {
    let write = std::env::var_os("AUTOPAR_WRITE_FIXTURES").is_some_and(|v| v == "1");
    let dir = tempfile::tempdir().unwrap();
    for case in cases() {
        let file = case.file;
        let planned = trainer(case, None).strategy_file().unwrap_or_else(|e| panic!("{file}: {e}"));
        let path = fixtures().join(file);
        if write {
            planned.save(&path).unwrap();
            continue;
        }
        // what autopar reads back from the committed file equals what it plans, and writing it
        // again gives the committed bytes
        let committed = StrategyFile::load(&path).unwrap_or_else(|e| panic!("{e}\nhint: AUTOPAR_WRITE_FIXTURES=1 writes it"));
        let again = dir.path().join(file);
        planned.save(&again).unwrap();
        assert_eq!(
            std::fs::read(&again).unwrap(),
            std::fs::read(&path).unwrap(),
            "{file}: autopar now writes another strategy file; rewrite it (AUTOPAR_WRITE_FIXTURES=1) and MindSpore's rank lists \
             (fixtures/mindspore/generate_rank_lists.py)",
        );
        assert_eq!(committed.to_json(), planned.to_json(), "{file}");
    }
}

/// One list per destination rank; `None` where MindSpore refuses.
type RankLists = Vec<Option<Vec<usize>>>;

/// MindSpore's rank lists for the committed pairs, by `(src, dst)` (paths from the repository
/// root, `None` for one unsplit device).
fn mindspore_lists() -> std::collections::HashMap<(Option<String>, Option<String>), RankLists> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/mindspore/rank_lists/strategy_pairs.json");
    let pairs: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let name = |v: &serde_json::Value| v.as_str().map(str::to_string);
    pairs
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let lists = p["lists"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_array().map(|a| a.iter().map(|r| r.as_u64().unwrap() as usize).collect()))
                .collect();
            ((name(&p["src"]), name(&p["dst"])), lists)
        })
        .collect()
}

/// Checkpoints of real optimizer-sharded and pipeline runs transform one destination rank at a
/// time from exactly the files MindSpore 2.10 lists for it, giving what the whole transform gives.
#[test]
fn runs_transform_by_rank_from_the_files_mindspore_lists() {
    let lists = mindspore_lists();
    let rel = |f: &str| format!("fixtures/autopar/strategies/{f}");
    let mut checked = 0;
    for case in cases() {
        let file = case.file;
        let destinations: &[Option<&str>] = if file.starts_with("pp2_mp8_shared") {
            &[None, Some("pp2_mp8_shared_merged.json")]
        } else {
            &[
                None,
                Some("mp4.json"),
                Some("mp3d8.json"),
                Some("mp8_optshard2.json"),
                Some("dp4_optshard.json"),
                Some("pp2_dp8_merged.json"),
            ]
        };
        let run = tempfile::tempdir().unwrap();
        let ckpt = CheckpointConfig { dir: run.path().to_path_buf(), prefix: "net".into(), every_steps: 0, keep_max: 1 };
        trainer(case, Some(ckpt)).fit(vec![]).unwrap_or_else(|e| panic!("{file}: {e}"));
        let src = fixtures().join(file);
        assert_eq!(StrategyFile::load(run.path().join("strategy.json")).unwrap().to_json(), StrategyFile::load(&src).unwrap().to_json());
        let rank_file = |s: usize| {
            let dir = run.path().join(format!("rank_{s}"));
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "safetensors")).unwrap()
        };
        for dst in destinations {
            let dst_path = dst.map(|d| fixtures().join(d));
            let want = &lists[&(Some(rel(file)), dst.map(rel))];
            let whole = tempfile::tempdir().unwrap();
            let opts = TransformOptions { format: Format::Safetensors, prefix: "net_".into(), ..Default::default() };
            transform_checkpoints(run.path(), whole.path(), Some(&src), dst_path.as_deref(), &opts)
                .unwrap_or_else(|e| panic!("{file} -> {dst:?}: {e}"));
            for (r, list) in want.iter().enumerate() {
                let Some(list) = list else { continue };
                let what = format!("{file} -> {dst:?} rank {r}, given MindSpore's {list:?}");
                let files = list.iter().map(|&s| (s, rank_file(s))).collect();
                let out = whole.path().join(format!("by_rank_{r}.safetensors"));
                transform_checkpoint_by_rank(r, &files, &out, Some(&src), dst_path.as_deref(), &opts)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let (one, all) = (
                    CheckpointFile::open(&out).unwrap(),
                    CheckpointFile::open(whole.path().join(format!("rank_{r}/net_{r}.safetensors"))).unwrap(),
                );
                let names: Vec<&str> = all.tensors().iter().map(|t| t.name.as_str()).collect();
                assert_eq!(one.tensors().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), names, "{what}");
                assert!(names.iter().any(|n| n.starts_with("adam_") || n.starts_with("moments.")), "{what}: optimizer state is moved too");
                for n in names {
                    assert!(one.read(n).unwrap() == all.read(n).unwrap(), "{what}: {n} differs from the whole transform");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked} destination ranks");
}

/// The fixtures hold what they are named for: optimizer shards and merged stages.
#[test]
fn the_written_files_hold_optimizer_shards_and_stages() {
    let load = |f: &str| StrategyFile::load(fixtures().join(f)).unwrap();
    for f in ["mp8_optshard.json", "mp8_optshard2.json", "dp4_optshard.json"] {
        let s = load(f);
        let sharded: Vec<&str> = s.layout_items.iter().filter(|l| l.opt_weight_shard_step > 0).map(|l| l.name.as_str()).collect();
        assert!(sharded.iter().any(|n| n.contains("fc1.weight")), "{f}: {sharded:?}");
        let state = if f.starts_with("dp4") { "moments.fc1.weight" } else { "adam_m.fc1.weight" };
        assert!(sharded.contains(&state), "{f}: the optimizer state is sharded like its parameter: {sharded:?}");
    }
    for f in ["pp2_dp8_merged.json", "pp2_mp8_shared_merged.json"] {
        let s = load(f);
        for stage in 0..2 {
            assert!(s.layout_items.iter().any(|l| l.name.starts_with(&format!("{stage}-"))), "{f}: no layout of stage {stage}");
        }
    }
    let shared = load("pp2_mp8_shared_merged.json");
    assert!(
        shared.layout_items.iter().any(|l| l.name == "0-embed.weight") && shared.layout_items.iter().any(|l| l.name == "1-embed.weight")
    );
}
