//! `autopar ckpt` end to end on MindSpore's fixtures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

/// A scratch folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!("autopar-ckpt-cli-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn autopar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopar")).args(args).output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn ckpt_transform_reproduces_mindspores_output_files_tensor_for_tensor() {
    let case = fixtures().join("transforms/ckpt_out_semi_train_optshard_to_out_dp4");
    let src_s = fixtures().join("strategies/semi_train_optshard/strategy_rank0.ckpt");
    let dst_s = fixtures().join("strategies/dp4/strategy_rank0.ckpt");
    let out = TempDir::new();
    let o = autopar(&[
        "ckpt",
        "transform",
        s(&case.join("src")),
        s(out.path()),
        "--prefix",
        "net_",
        "--src-strategy",
        s(&src_s),
        "--dst-strategy",
        s(&dst_s),
        "--format",
        "ckpt",
        "--jobs",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("wrote 4 file(s)"));
    for r in 0..4 {
        let name = format!("rank_{r}/net_{r}.ckpt");
        let ours = autopar(&["ckpt", "inspect", s(&out.path().join(&name)), "--json"]);
        let theirs = autopar(&["ckpt", "inspect", s(&case.join("dst").join(&name)), "--json"]);
        let tensors = |o: &Output| -> serde_json::Value {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            let mut t = v["tensors"].as_array().unwrap().clone();
            t.sort_by_key(|x| x["name"].as_str().unwrap().to_string());
            serde_json::Value::Array(t)
        };
        assert_eq!(tensors(&ours), tensors(&theirs), "rank {r}");
    }
}

#[test]
fn rank_list_prints_the_needed_source_ranks_highest_first() {
    let st = fixtures().join("strategies");
    let o = autopar(&[
        "ckpt",
        "rank-list",
        "1",
        "--src-strategy",
        s(&st.join("semi_all/strategy_rank0.ckpt")),
        "--dst-strategy",
        s(&st.join("dp4/strategy_rank0.ckpt")),
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let list: Vec<usize> = serde_json::from_slice(&o.stdout).unwrap();
    assert!(!list.is_empty() && list.windows(2).all(|w| w[0] > w[1]) && list.iter().all(|&r| r < 8), "{list:?}");
}

#[test]
fn inspect_shows_strategy_layouts_and_group_files() {
    let st = fixtures().join("strategies");
    let o = autopar(&["ckpt", "inspect", s(&st.join("semi_train_optshard/strategy_rank0.ckpt"))]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("l1.w") && text.contains("[2, 4]") && text.contains("[-1, 0]"), "{text}");
    let o = autopar(&["ckpt", "inspect", s(&st.join("semi_all/group_info_rank0.pb"))]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("2-16453000547691086251: [0, 4]"));
    // A strategy file saved as .pb (strategy_ckpt_save_file takes either): read as one.
    let tmp = TempDir::new();
    let pb = tmp.path().join("strategy.pb");
    std::fs::copy(st.join("semi_train_optshard/strategy_rank0.ckpt"), &pb).unwrap();
    let o = autopar(&["ckpt", "inspect", s(&pb)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("l1.w") && text.contains("[-1, 0]"), "{text}{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn merge_strategies_writes_one_file_with_stage_prefixes() {
    let out = TempDir::new();
    let merged = out.path().join("merged.json");
    let o = autopar(&["ckpt", "merge-strategies", s(&fixtures().join("strategies/pp2/src")), s(&merged)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    assert!(v["parallel_layout_item"]["0-l1.w"].is_object() && v["parallel_layout_item"]["1-l2.w"].is_object(), "{v}");
    let o = autopar(&["ckpt", "merge-strategies", s(&merged), s(&out.path().join("x.ckpt"))]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("autopar: "), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_missing_rank_fails_with_exit_code_2_and_names_it() {
    let case = fixtures().join("transforms/ckpt_out_semi_train_optshard_to_out_dp4/src");
    let tmp = TempDir::new();
    for r in [0usize, 1, 2, 3, 4, 6, 7] {
        let d = tmp.path().join(format!("src/rank_{r}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(case.join(format!("rank_{r}/net_{r}.ckpt")), d.join(format!("net_{r}.ckpt"))).unwrap();
    }
    let st = fixtures().join("strategies");
    let o = autopar(&[
        "ckpt",
        "transform",
        s(&tmp.path().join("src")),
        s(&tmp.path().join("dst")),
        "--src-strategy",
        s(&st.join("semi_train_optshard/strategy_rank0.ckpt")),
        "--dst-strategy",
        s(&st.join("dp4/strategy_rank0.ckpt")),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("autopar: destination rank 0 needs source rank 5"), "{err}");
    assert!(err.contains("hint:"), "{err}");
}

#[test]
fn transform_rank_writes_one_rank_from_the_files_it_is_given() {
    let case = fixtures().join("transforms/safetensors_out_semi_train_optshard_to_out_semi_train");
    let st = fixtures().join("strategies");
    let (src_s, dst_s) = (st.join("semi_train_optshard/strategy_rank0.ckpt"), st.join("semi_train/strategy_rank0.ckpt"));
    let out = TempDir::new();
    let list = autopar(&["ckpt", "rank-list", "6", "--src-strategy", s(&src_s), "--dst-strategy", s(&dst_s), "--json"]);
    let list: Vec<usize> = serde_json::from_slice(&list.stdout).unwrap();
    let mut args: Vec<String> = ["ckpt", "transform-rank", "6", "--out"].iter().map(|x| x.to_string()).collect();
    args.push(s(&out.path().join("net_6.safetensors")).into());
    for r in &list {
        args.push("--file".into());
        args.push(format!("{r}={}", s(&case.join(format!("src/rank_{r}/net_{r}.safetensors")))));
    }
    args.extend(["--src-strategy".into(), s(&src_s).into(), "--dst-strategy".into(), s(&dst_s).into()]);
    let o = autopar(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = std::fs::read(out.path().join("net_6.safetensors")).unwrap();
    assert!(ours == std::fs::read(case.join("dst/rank_6/net_6.safetensors")).unwrap(), "rank 6 differs from MindSpore's file");
    // one file fewer than the rank list needs
    let skip = format!("{}=", list[0]);
    let mut short: Vec<&str> = Vec::new();
    for (i, a) in args.iter().enumerate() {
        let dropped = a.starts_with(&skip) || (a == "--file" && args.get(i + 1).is_some_and(|n| n.starts_with(&skip)));
        if !dropped {
            short.push(a);
        }
    }
    let o = autopar(&short);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("source rank {}", list[0])), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn inspect_into_a_closed_pipe_ends_quietly() {
    // `autopar ckpt inspect FILE | head -1`: far more output than a pipe buffers
    use autopar_checkpoint::{DType, TensorSpec};
    use std::io::{BufRead, BufReader};
    let dir = TempDir::new();
    let path = dir.path().join("many.safetensors");
    let tensors: Vec<(TensorSpec, Vec<u8>)> = (0..4000)
        .map(|i| (TensorSpec { name: format!("layer{i:05}.weight"), dtype: DType::Float32, shape: vec![1] }, vec![0u8; 4]))
        .collect();
    autopar_checkpoint::save(&path, &tensors, &Default::default()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_autopar"))
        .args(["ckpt", "inspect", s(&path)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains("many.safetensors"), "{first}");
    // the reader is gone now
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
}

#[test]
fn ckpt_redundancy_gives_mindspores_groups_and_owners_for_its_files() {
    // MindSpore 2.10: get_parameter_redundancy(file, initial_rank) and remove_param_redundancy.
    let run = |file: &str, initial: &str| -> serde_json::Value {
        let o = autopar(&["ckpt", "redundancy", s(&fixtures().join("strategies").join(file)), "--initial-rank", initial, "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let v = run("optshard_thr64/strategy_rank0.ckpt", "0");
    assert_eq!(v["redundancy"]["l1.w"], serde_json::json!([[0, 4], [1, 5], [2, 6], [3, 7]]));
    assert_eq!(v["redundancy"]["head.w"], serde_json::json!([[0, 1, 2, 3, 4, 5, 6, 7]]));
    assert_eq!(v["owners"]["0"], serde_json::json!(["head.w", "l1.b", "l2.w", "moments.l1.w"]));
    assert_eq!(v["owners"]["1"], serde_json::json!(["l1.b", "l2.b", "l2.w", "moments.l1.w"]));
    assert_eq!(v["owners"]["4"], serde_json::json!(["l1.w", "moments.l1.b", "moments.l2.w"]));
    let v = run("optshard2/strategy_rank0.ckpt", "0");
    assert_eq!(v["redundancy"]["head.w"], serde_json::json!([[0, 2, 4, 6], [1, 3, 5, 7]]));
    assert_eq!(v["redundancy"]["l1.w"], serde_json::json!([[0], [4], [1], [5], [2], [6], [3], [7]]));
    assert_eq!(
        v["owners"]["6"],
        serde_json::json!(["l1.b", "l1.w", "l2.w", "moments.l1.b", "moments.l1.w", "moments.l2.b", "moments.l2.w"])
    );
    let v = run("pp2/strategy_rank4.ckpt", "4");
    assert_eq!(v["redundancy"]["l2.w"], serde_json::json!([[4, 5, 6, 7]]));
    assert_eq!(v["owners"]["4"], serde_json::json!(["accu_grads.head.w", "l2.b", "moments.l2.w"]));
    assert_eq!(v["owners"]["7"], serde_json::json!(["head.w", "moments.l2.b"]));
    // The layout dict of the optimizer-sharded fixture: every group is one rank.
    let v = run("semi_train_optshard/layout_rank0.txt", "0");
    assert!(v["redundancy"].as_object().unwrap().values().all(|gs| gs
        .as_array()
        .unwrap()
        .iter()
        .all(|g| g.as_array().unwrap().len() == 1)));
    // A job smaller than the layout's devices.
    let o = autopar(&["ckpt", "redundancy", s(&fixtures().join("strategies/semi_all/layout_rank0.txt")), "--world-size", "3"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("the layout spans 8 devices from rank 0, beyond a job of 3 ranks"), "{o:?}");
    let o = autopar(&["ckpt", "redundancy", "/nonexistent/strategy.ckpt"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/strategy.ckpt"));
}

/// Trains a pipeline run (an MLP in 2 stages of 4 devices, AdamW, 2 steps) into `dir/folder`,
/// with `extra` flags; returns the folder.
fn train_pipeline(dir: &Path, folder: &str, extra: &[&str]) -> PathBuf {
    let run = dir.join(folder);
    let mut a = vec![
        "train",
        "--model",
        "mlp",
        "--input-shape",
        "32",
        "--width",
        "64",
        "--depth",
        "3",
        "--num-classes",
        "8",
        "--data",
        "synthetic",
        "--synthetic-samples",
        "256",
        "--devices",
        "8",
        "--parallel",
        "pipeline_stages=2",
        "--micro-batches",
        "2",
        "--steps",
        "2",
        "--batch-size",
        "32",
        "--optimizer",
        "adamw",
        "--eval",
        "false",
        "--checkpoint-dir",
        s(&run),
    ];
    a.extend(extra);
    let o = autopar(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run
}

/// The checkpoint file of rank `r` under `root` (`rank_<r>/*.safetensors`).
fn rank_file(root: &Path, r: usize) -> PathBuf {
    let d = root.join(format!("rank_{r}"));
    std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "safetensors")).unwrap()
}

/// `ckpt transform` of `src` (`--src-strategy`/`--dst-strategy` as given) into `dst`, as safetensors.
fn transform(src: &Path, dst: &Path, strategies: &[&str]) {
    let mut a = vec!["ckpt", "transform", s(src), s(dst), "--format", "safetensors", "--prefix", "net_"];
    a.extend(strategies);
    let o = autopar(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Every rank file of `back` holds the tensors of `was`'s, byte for byte.
fn assert_same_rank_files(was: &Path, back: &Path, ranks: usize) {
    use autopar::checkpoint::CheckpointFile;
    for r in 0..ranks {
        let (was, now) = (CheckpointFile::open(rank_file(was, r)).unwrap(), CheckpointFile::open(rank_file(back, r)).unwrap());
        let held: Vec<&str> = was.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(now.tensors().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), held, "rank {r}");
        assert!(held.iter().any(|n| n.starts_with("adam_m.")), "rank {r}: {held:?}");
        for name in held {
            assert!(now.read(name).unwrap() == was.read(name).unwrap(), "rank {r}: {name} differs after the round trip");
        }
    }
}

/// A pipeline run (2 stages of 4 devices, AdamW) moves to one device with `ckpt transform` and
/// its merged `strategy.json`, every parameter and optimizer-state tensor whole; and from there
/// back to the pipeline's rank files, tensor for tensor.
#[test]
fn a_pipeline_run_transforms_to_one_device_and_back() {
    use autopar::checkpoint::CheckpointFile;
    let dir = TempDir::new();
    let run = train_pipeline(dir.path(), "run", &[]);
    let strategy = run.join("strategy.json");
    let one = dir.path().join("one");
    transform(&run, &one, &["--src-strategy", s(&strategy)]);
    let whole = CheckpointFile::open(rank_file(&one, 0)).unwrap();
    let names: Vec<String> = whole.tensors().iter().map(|t| t.name.clone()).collect();
    // Each stage holds its layers whole (data parallel inside a stage): rank 0 the first, rank 4 the last.
    let (first, last) = (CheckpointFile::open(rank_file(&run, 0)).unwrap(), CheckpointFile::open(rank_file(&run, 4)).unwrap());
    for (f, param) in [(&first, "fc1.weight"), (&last, "fc4.weight")] {
        for name in [param.to_string(), format!("adam_m.{param}"), format!("adam_v.{param}")] {
            assert!(names.contains(&name), "{name} missing from the one-device file: {names:?}");
            assert!(whole.read(&name).unwrap() == f.read(&name).unwrap(), "{name} differs from the stage's rank file");
        }
    }
    assert!(!names.iter().any(|n| n.contains("fc1.weight") && n.starts_with("1-")), "stage prefixes stay out of tensor names");
    let back = dir.path().join("back");
    transform(&one, &back, &["--dst-strategy", s(&strategy)]);
    assert_same_rank_files(&run, &back, 8);
}

/// A pipeline run with the parallel optimizer (each stage's replicas store quarter shards of
/// parameters and AdamW state) moves to one device and back like any other: on one device it
/// equals the same run unsharded, tensor for tensor, and back on its strategy it gives its own
/// rank files again.
#[test]
fn a_sharded_pipeline_run_transforms_like_the_unsharded_one() {
    use autopar::checkpoint::CheckpointFile;
    let dir = TempDir::new();
    let shard = [
        "--parallel",
        "enable_parallel_optimizer=true",
        "--parallel",
        r#"parallel_optimizer_config={"parallel_optimizer_threshold": 0, "gradient_accumulation_shard": false}"#,
    ];
    let (sharded, whole) = (train_pipeline(dir.path(), "sharded", &shard), train_pipeline(dir.path(), "whole", &[]));
    let shapes = |f: &CheckpointFile| f.tensors().iter().map(|t| (t.name.clone(), t.shape.clone())).collect::<Vec<_>>();
    let (a, b) = (CheckpointFile::open(rank_file(&sharded, 0)).unwrap(), CheckpointFile::open(rank_file(&whole, 0)).unwrap());
    assert_ne!(shapes(&a), shapes(&b), "the sharded run stores smaller pieces");
    let to_one = |run: &Path, out: &str| -> CheckpointFile {
        let dst = dir.path().join(out);
        transform(run, &dst, &["--src-strategy", s(&run.join("strategy.json"))]);
        CheckpointFile::open(rank_file(&dst, 0)).unwrap()
    };
    let (one_sharded, one_whole) = (to_one(&sharded, "one_sharded"), to_one(&whole, "one_whole"));
    assert_eq!(shapes(&one_sharded), shapes(&one_whole));
    for t in one_whole.tensors() {
        assert!(one_sharded.read(&t.name).unwrap() == one_whole.read(&t.name).unwrap(), "{} differs on one device", t.name);
    }
    let back = dir.path().join("back");
    transform(&dir.path().join("one_sharded"), &back, &["--dst-strategy", s(&sharded.join("strategy.json"))]);
    assert_same_rank_files(&sharded, &back, 8);
}

/// An interleaved pipeline run (2 chunks per stage) stores both of its chunks' parameters in
/// each stage's rank files, and moves to one device and back like the plain pipeline.
#[test]
fn an_interleaved_pipeline_run_transforms_to_one_device_and_back() {
    use autopar::checkpoint::CheckpointFile;
    let dir = TempDir::new();
    let run = train_pipeline(dir.path(), "run", &["--parallel", r#"pipeline_config={"pipeline_interleave": true}"#]);
    let held =
        |r: usize| -> Vec<String> { CheckpointFile::open(rank_file(&run, r)).unwrap().tensors().iter().map(|t| t.name.clone()).collect() };
    // Pieces 0 and 2 on stage 0, 1 and 3 on stage 1: the first and the last layer on different stages.
    let (first, last) = (held(0), held(4));
    assert!(first.contains(&"fc1.weight".to_string()) && !first.contains(&"fc4.weight".to_string()), "{first:?}");
    assert!(last.contains(&"fc4.weight".to_string()) && last.contains(&"fc2.weight".to_string()), "{last:?}");
    assert!(first.contains(&"fc3.weight".to_string()), "stage 0's second chunk holds fc3: {first:?}");
    let one = dir.path().join("one");
    transform(&run, &one, &["--src-strategy", s(&run.join("strategy.json"))]);
    let whole = CheckpointFile::open(rank_file(&one, 0)).unwrap();
    for name in ["fc1.weight", "fc2.weight", "fc3.weight", "fc4.weight", "adam_v.fc3.weight"] {
        assert!(whole.tensors().iter().any(|t| t.name == name), "{name} missing on one device");
    }
    let back = dir.path().join("back");
    transform(&one, &back, &["--dst-strategy", s(&run.join("strategy.json"))]);
    assert_same_rank_files(&run, &back, 8);
}

/// `ckpt rank-list` (MindSpore's list and `--minimal`) and `ckpt redundancy` read strategy
/// files through one validation: each refuses the same broken layout at once, naming the file
/// and the parameter (a device matrix of 2^32 devices once panicked in one and hung the other).
#[test]
fn rank_lists_and_redundancy_refuse_the_same_broken_layouts() {
    let dir = TempDir::new();
    let src = fixtures().join("strategies/semi_json/strategy_rank0.json");
    let original: serde_json::Value = serde_json::from_slice(&std::fs::read(&src).unwrap()).unwrap();
    let dp4 = fixtures().join("strategies/dp4/strategy_rank0.ckpt");
    let mut only_strategies = original.clone();
    only_strategies["parallel_layout_item"] = serde_json::json!({});
    let mut cases = vec![("no_layouts.json", only_strategies, "no parameter layouts")];
    for (name, field, value, needle) in [
        ("huge.json", "dev_matrix", serde_json::json!([65536, 65536]), "more than the maximum"),
        ("twice.json", "tensor_map", serde_json::json!([0, 0]), "used twice"),
        ("shard.json", "opt_weight_shard_size", serde_json::json!(-5), "not a MindSpore value"),
    ] {
        let mut v = original.clone();
        v["parallel_layout_item"]["l1.w"][field] = value;
        cases.push((name, v, needle));
    }
    for (name, v, needle) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, v.to_string()).unwrap();
        let p = s(&path);
        let mut runs = vec![vec!["ckpt", "redundancy", p]];
        if name != "no_layouts.json" {
            runs.push(vec!["ckpt", "rank-list", "0", "--src-strategy", p, "--dst-strategy", s(&dp4)]);
            runs.push(vec!["ckpt", "rank-list", "0", "--src-strategy", s(&dp4), "--dst-strategy", p, "--minimal"]);
        }
        for args in runs {
            let o = autopar(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(name) && err.contains(needle), "{args:?}: {err}");
            if name != "no_layouts.json" {
                assert!(err.contains("l1.w"), "{args:?}: {err}");
            }
        }
    }
}

/// A rank folder holding several `.ckpt` files: MindSpore's choice (the last by name) is made,
/// and said.
#[test]
fn a_rank_folder_with_several_checkpoints_says_which_one_it_uses() {
    let dir = TempDir::new();
    let case = fixtures().join("transforms/ckpt_out_semi_train_optshard_to_out_dp4");
    let src = dir.path().join("src");
    for e in std::fs::read_dir(case.join("src")).unwrap() {
        let e = e.unwrap();
        let to = src.join(e.file_name());
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(e.path()).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
        }
    }
    std::fs::copy(src.join("rank_1/net_1.ckpt"), src.join("rank_3/z_stray.ckpt")).unwrap();
    let strategies = fixtures().join("strategies");
    let o = autopar(&[
        "ckpt",
        "transform",
        s(&src),
        s(&dir.path().join("out")),
        "--prefix",
        "net_",
        "--src-strategy",
        s(&strategies.join("semi_train_optshard/strategy_rank0.ckpt")),
        "--dst-strategy",
        s(&strategies.join("dp4/strategy_rank0.ckpt")),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank_3 holds 2 .ckpt files; using z_stray.ckpt"), "{err}");
}

/// `ckpt inspect` of a path that does not exist says so, whatever its extension.
#[test]
fn inspect_names_a_missing_path() {
    for p in ["/nonexistent/x", "/nonexistent/x.ckpt"] {
        let o = autopar(&["ckpt", "inspect", p]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(&format!("{p} not found")), "{err}");
    }
}
