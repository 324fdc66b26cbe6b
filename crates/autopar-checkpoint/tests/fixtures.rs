//! Compatibility with files MindSpore 2.10 wrote: strategy files, group files and transforms.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use autopar_checkpoint::{
    collect_rank_files, merge_strategies, transform_checkpoints, CheckpointFile, Format, GroupInfo, StrategyFile, TransformOptions,
};
use autopar_layout::{ParameterLayout, TensorMap};
use common::{strategies, transforms};

fn strategy_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![strategies()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().unwrap().to_string_lossy().contains("strategy") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 19, "expected every fixture strategy file, found {}", out.len());
    out
}

#[test]
fn every_fixture_strategy_file_parses_and_rewrites_to_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    for p in strategy_files() {
        let s = StrategyFile::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!s.layout_items.is_empty() || !s.strategy_items.is_empty(), "{}", p.display());
        let out = dir.path().join(p.file_name().unwrap());
        s.save(&out).unwrap();
        assert_eq!(fs::read(&out).unwrap(), fs::read(&p).unwrap(), "re-written {} differs", p.display());
        assert_eq!(StrategyFile::load(&out).unwrap(), s);
    }
}

#[test]
fn protobuf_and_json_forms_of_the_same_strategy_agree() {
    let pb = StrategyFile::load(strategies().join("semi_all/strategy_rank0.ckpt")).unwrap().layout_map().unwrap();
    let js = StrategyFile::load(strategies().join("semi_json/strategy_rank0.json")).unwrap().layout_map().unwrap();
    assert_eq!(pb.params.keys().collect::<Vec<_>>(), js.params.keys().collect::<Vec<_>>());
    for (name, p) in &pb.params {
        let j = &js.params[name];
        assert_eq!((&p.dev_matrix, &p.tensor_map, p.opt_shard_step), (&j.dev_matrix, &j.tensor_map, j.opt_shard_step), "{name}");
    }
    assert_eq!(js.params["l1.w"].tensor_shape, Some(vec![64, 128]));
    // a JSON file converts to protobuf and back without loss (apart from the JSON-only shape)
    let s = StrategyFile::load(strategies().join("semi_json/strategy_rank0.json")).unwrap();
    let back = StrategyFile::from_protobuf(Path::new("x"), &s.to_protobuf()).unwrap();
    assert_eq!(back.layout_map().unwrap().params["l2.w"].tensor_map, TensorMap::single(&[0, -1]));
}

fn group_ranks(dir: &Path, rank: usize) -> BTreeMap<String, Vec<usize>> {
    let g = GroupInfo::load(dir.join(format!("group_info_rank{rank}.pb"))).unwrap();
    g.groups.into_iter().map(|(n, r)| (n, r.into_iter().map(|x| x as usize).collect())).collect()
}

#[test]
fn fixture_layouts_match_mindspores_parameter_layout_dict() {
    let mut checked = 0;
    for dir in fs::read_dir(strategies()).unwrap().map(|e| e.unwrap().path()) {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let fname = p.file_name().unwrap().to_string_lossy().into_owned();
            let Some(rank) = fname.strip_prefix("layout_rank").and_then(|r| r.strip_suffix(".txt")) else { continue };
            let rank: usize = rank.parse().unwrap();
            let sfile = ["ckpt", "json"].iter().map(|x| dir.join(format!("strategy_rank{rank}.{x}"))).find(|p| p.exists()).unwrap();
            let map = StrategyFile::load(&sfile).unwrap().layout_map().unwrap();
            let groups = group_ranks(&dir, rank);
            let text = fs::read_to_string(&p).unwrap();
            let layouts: BTreeMap<String, ParameterLayout> =
                text.lines().filter(|l| !l.trim().is_empty()).map(|l| ParameterLayout::parse_line(l).unwrap()).collect();
            for (name, ours) in &map.params {
                let theirs = layouts.get(name).unwrap_or_else(|| panic!("{}: {name} not in {fname}", dir.display()));
                assert_eq!(ours.dev_matrix, theirs.dev_matrix, "{name} in {}", dir.display());
                assert_eq!(ours.tensor_map.flattened(), theirs.tensor_map, "{name}");
                let local = rank % ours.device_num();
                let layout = ours.tensor_layout(&theirs.full_shape).unwrap();
                assert_eq!(layout.slice_shape(), theirs.slice_shape, "{name}");
                // the optimizer-shard group: the chunk of the sorted replica group holding this rank
                let opt = ours.opt_group_size(&layout);
                assert_eq!(
                    opt > 1,
                    !theirs.opt_shard_group.is_empty(),
                    "{name}: opt shard size {opt} vs group {:?}",
                    theirs.opt_shard_group
                );
                if opt > 1 {
                    let replicas = layout.replica_group(local).unwrap();
                    let at = replicas.iter().position(|&r| r == local).unwrap();
                    let chunk: Vec<usize> = replicas[at / opt * opt..at / opt * opt + opt].to_vec();
                    let expected = match theirs.opt_shard_group.as_str() {
                        "hccl_world_group" => (0..ours.device_num()).collect(),
                        g => groups[g].clone(),
                    };
                    assert_eq!(chunk, expected, "{name} optimizer group in {}", dir.display());
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 60, "only {checked} layouts compared");
}

#[test]
fn multi_axis_tensor_maps_and_pipeline_stages_are_read() {
    let s = StrategyFile::load(strategies().join("layout/strategy_rank0.ckpt")).unwrap();
    let m = s.layout_map().unwrap();
    let p = m.params.values().next().unwrap();
    assert!(p.tensor_map.0.iter().any(|e| e.len() == 2), "expected a tuple entry, got {}", p.tensor_map);

    let merged = StrategyFile::load(strategies().join("pp2/merged_strategy.ckpt")).unwrap();
    assert_eq!(merged.current_stage, 1);
    let m = merged.layout_map().unwrap();
    assert_eq!(m.stages(), vec![0, 1]);
    assert_eq!(m.params["l1.w"].stages, vec![0]);
    assert_eq!(m.params["l2.w"].stages, vec![1]);
    assert_eq!(m.stage_device_num(), 4);
}

#[test]
fn merging_per_stage_files_reproduces_mindspores_merged_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("merged.ckpt");
    let stages = merge_strategies(&strategies().join("pp2/src"), &out).unwrap();
    assert_eq!(stages, vec![0, 1]);
    let ours = StrategyFile::load(&out).unwrap();
    let theirs = StrategyFile::load(strategies().join("pp2/merged_strategy.ckpt")).unwrap();
    let key = |s: &StrategyFile| {
        let mut l: Vec<_> = s.layout_items.iter().map(|l| format!("{l:?}")).collect();
        l.sort();
        let mut st: Vec<_> = s.strategy_items.iter().map(|l| format!("{l:?}")).collect();
        st.sort();
        (s.current_stage, l, st)
    };
    assert_eq!(key(&ours), key(&theirs));
}

#[test]
fn group_info_files_are_read_and_rewritten_identically() {
    let g = GroupInfo::load(strategies().join("semi_train_optshard/group_info_rank0.pb")).unwrap();
    let map: BTreeMap<_, _> = g.groups.iter().cloned().collect();
    assert_eq!(map["2-16453000547691086251"], vec![0, 4]);
    assert_eq!(g.to_protobuf(), fs::read(strategies().join("semi_train_optshard/group_info_rank0.pb")).unwrap());
}

/// Transform a fixture's `src/` and compare every destination tensor with MindSpore's `dst/`.
fn check_transform(case: &str, src: &str, dst: &str, format: Format, jobs: usize) {
    let case = transforms().join(case);
    let out = tempfile::tempdir().unwrap();
    let opts = TransformOptions { format, prefix: "net_".into(), jobs, ..Default::default() };
    let src_s = strategies().join(src).join("strategy_rank0.ckpt");
    let dst_s = strategies().join(dst).join("strategy_rank0.ckpt");
    let report = transform_checkpoints(&case.join("src"), out.path(), Some(&src_s), Some(&dst_s), &opts).unwrap();
    let (expected, _) = collect_rank_files(&case.join("dst")).unwrap();
    assert_eq!(report.files.len(), expected.len());
    for (rank, exp_path) in expected {
        let got = CheckpointFile::open(out.path().join(format!("rank_{rank}/net_{rank}.{}", format.extension()))).unwrap();
        let exp = CheckpointFile::open(&exp_path).unwrap();
        if Format::of_path(&exp_path) == Some(format) {
            // same format: the whole file is byte-identical to MindSpore's
            let ours = fs::read(got.path()).unwrap();
            assert!(ours == fs::read(&exp_path).unwrap(), "rank {rank}: {} differs from MindSpore's file", got.path().display());
        }
        assert_eq!(got.tensors().len(), exp.tensors().len(), "rank {rank}");
        for t in exp.tensors() {
            let g = got.get(&t.name).unwrap_or_else(|| panic!("rank {rank}: {} missing", t.name));
            assert_eq!((g.dtype, &g.shape), (t.dtype, &t.shape), "rank {rank} {}", t.name);
            assert!(got.read(&t.name).unwrap() == exp.read(&t.name).unwrap(), "rank {rank} {} differs from MindSpore's", t.name);
        }
    }
}

#[test]
fn ckpt_transform_from_model_and_optimizer_sharding_to_data_parallel_matches_mindspore() {
    check_transform("ckpt_out_semi_train_optshard_to_out_dp4", "semi_train_optshard", "dp4", Format::Ckpt, 1);
    check_transform("ckpt_out_semi_train_optshard_to_out_dp4", "semi_train_optshard", "dp4", Format::Safetensors, 3);
}

#[test]
fn safetensors_transform_dropping_optimizer_sharding_matches_mindspore() {
    check_transform("safetensors_out_semi_train_optshard_to_out_semi_train", "semi_train_optshard", "semi_train", Format::Safetensors, 2);
    check_transform("safetensors_out_semi_train_optshard_to_out_semi_train", "semi_train_optshard", "semi_train", Format::Ckpt, 1);
}

#[test]
fn merging_refuses_a_file_a_mixed_folder_and_files_without_items() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out/merged.ckpt");
    let one = strategies().join("pp2/src/strategy_rank0.ckpt");
    let e = merge_strategies(&one, &out).unwrap_err();
    assert!(matches!(e, autopar_checkpoint::CheckpointError::NotADirectory { .. }), "{e:?}");
    let mixed = dir.path().join("mixed");
    fs::create_dir_all(&mixed).unwrap();
    fs::copy(&one, mixed.join("a.ckpt")).unwrap();
    fs::copy(strategies().join("semi_json/strategy_rank0.json"), mixed.join("b.json")).unwrap();
    let e = merge_strategies(&mixed, &out).unwrap_err();
    assert!(e.to_string().contains("all '.ckpt' or all '.json'"), "{e}");
    let empty = dir.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    fs::copy(strategies().join("pp_shared/strategy_rank1.ckpt"), empty.join("s.ckpt")).unwrap();
    let e = merge_strategies(&empty, &out).unwrap_err();
    assert!(e.to_string().contains("holds no layout items"), "{e}");
    assert!(!out.exists());
    // JSON per-stage files merge into JSON
    let js = dir.path().join("js");
    fs::create_dir_all(&js).unwrap();
    for r in [0, 4] {
        let s = StrategyFile::load(strategies().join(format!("pp2/src/strategy_rank{r}.ckpt"))).unwrap();
        s.save(js.join(format!("strategy_rank{r}.json"))).unwrap();
        s.save(js.join(format!("copy_of_rank{r}.json"))).unwrap();
    }
    assert_eq!(merge_strategies(&js, &dir.path().join("m.json")).unwrap(), vec![0, 1]);
    let m = StrategyFile::load(dir.path().join("m.json")).unwrap().layout_map().unwrap();
    assert_eq!(m.stages(), vec![0, 1]);
}

/// Every reader refuses the same broken layouts, naming the file and the parameter: a variant
/// of MindSpore's JSON strategy file with one field of one layout made impossible (too many
/// devices, overflowing ones, an axis used twice or out of range, a split that does not divide
/// the recorded shape, a map longer than the shape, optimizer-shard values MindSpore never
/// writes, a layout on another device count than its stage's), and an empty file.
#[test]
fn broken_layouts_and_empty_files_are_refused_naming_the_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let original: serde_json::Value =
        serde_json::from_slice(&fs::read(strategies().join("semi_json/strategy_rank0.json")).unwrap()).unwrap();
    assert!(StrategyFile::from_json(Path::new("x.json"), original.to_string().as_bytes()).is_ok());
    let cases: &[(&str, &str, serde_json::Value, &str)] = &[
        ("l1.w", "dev_matrix", serde_json::json!([65536, 65536]), "more than the maximum of 4096"),
        ("l1.w", "dev_matrix", serde_json::json!([2, 4096]), "more than the maximum of 4096"),
        ("l1.w", "dev_matrix", serde_json::json!([2, 0]), "axis of size 0"),
        ("l1.w", "tensor_map", serde_json::json!([0, 0]), "used twice"),
        ("l1.w", "tensor_map", serde_json::json!([-1, 2]), "out of range"),
        ("l1.w", "tensor_map", serde_json::json!([-1, -1, 0]), "3"),
        ("l1.w", "tensor_shape", serde_json::json!([64, 127]), "127"),
        ("l1.w", "opt_weight_shard_size", serde_json::json!(-5), "not a MindSpore value"),
        ("l1.w", "opt_weight_shard_size", serde_json::json!(2), "not a MindSpore value"),
        ("head.w", "dev_matrix", serde_json::json!([4]), "spans"),
    ];
    for (param, field, value, needle) in cases {
        let mut v = original.clone();
        v["parallel_layout_item"][param][field] = value.clone();
        if *field == "opt_weight_shard_size" && *value == serde_json::json!(2) {
            // A size without a step.
            v["parallel_layout_item"][param]["opt_weight_shard_step"] = serde_json::json!(0);
        }
        let path = dir.path().join(format!("{param}-{field}.json"));
        fs::write(&path, v.to_string()).unwrap();
        let e = StrategyFile::load(&path).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()) && e.contains(needle), "{param}.{field} = {value}: {e}");
        if *field != "dev_matrix" || *param != "head.w" {
            assert!(e.contains(param), "{param}.{field} = {value}: {e}");
        }
    }
    // A shard of 3 does not divide l1.w's 2 replicas ([2, 4], split 4 ways by its columns).
    let mut v = original.clone();
    v["parallel_layout_item"]["l1.w"]["opt_weight_shard_size"] = serde_json::json!(3);
    v["parallel_layout_item"]["l1.w"]["opt_weight_shard_step"] = serde_json::json!(4);
    let path = dir.path().join("shard3.json");
    fs::write(&path, v.to_string()).unwrap();
    let e = StrategyFile::load(&path).unwrap_err().to_string();
    assert!(e.contains("l1.w") && e.contains("does not divide its 2 replicas"), "{e}");
    // A shard of 2 does.
    v["parallel_layout_item"]["l1.w"]["opt_weight_shard_size"] = serde_json::json!(2);
    fs::write(&path, v.to_string()).unwrap();
    StrategyFile::load(&path).unwrap();
    for (name, bytes) in [("empty.ckpt", &b""[..]), ("empty.json", &b"{}"[..]), ("items.json", &br#"{"parallel_strategy_item": {}}"#[..])] {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        let e = StrategyFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("holds no strategy items and no layout items"), "{name}: {e}");
    }
}

/// A protobuf file of another kind (MindSpore's strategy file, or two stray bytes) is not
/// read as a checkpoint without tensors: opening it names the file and what it found.
#[test]
fn a_strategy_file_is_not_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let stray = dir.path().join("two.ckpt");
    fs::write(&stray, b"\x08\x02").unwrap();
    for path in [strategies().join("dp4/strategy_rank0.ckpt"), stray] {
        let e = CheckpointFile::open(&path).err().unwrap().to_string();
        assert!(e.contains(&path.display().to_string()) && e.contains("is not a checkpoint value"), "{e}");
    }
}

/// A folder given where a checkpoint or strategy file belongs is named as a folder.
#[test]
fn a_folder_is_not_a_checkpoint_or_strategy_file() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("adir.ckpt");
    fs::create_dir_all(&folder).unwrap();
    let e = CheckpointFile::open(&folder).err().unwrap().to_string();
    assert!(e.contains("is a directory, expected a checkpoint file"), "{e}");
    let e = StrategyFile::load(&folder).unwrap_err().to_string();
    assert!(e.contains("is a directory, expected a strategy file"), "{e}");
}

/// A transform whose source files hold none of the tensors the strategies place (an empty
/// `.ckpt`, here) is refused before any output is written, rather than writing empty files.
#[test]
fn a_transform_from_sources_without_the_networks_tensors_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("rank_0")).unwrap();
    fs::write(src.join("rank_0/net_0.ckpt"), b"").unwrap();
    let out = dir.path().join("out");
    let dst_s = strategies().join("dp4/strategy_rank0.ckpt");
    let opts = TransformOptions { format: Format::Ckpt, prefix: "net_".into(), ..Default::default() };
    let e = transform_checkpoints(&src, &out, None, Some(&dst_s), &opts).unwrap_err().to_string();
    assert!(e.contains("hold none of the") && e.contains("net_0.ckpt"), "{e}");
    assert!(!out.exists() || fs::read_dir(&out).unwrap().next().is_none(), "outputs were written");
}

/// A checkpoint rewritten in place while open (`cp other.ckpt it.ckpt`) is an error on the
/// next read, not a bus error from a mapping past its new end.
#[test]
fn a_checkpoint_rewritten_in_place_while_open_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.ckpt");
    let src = transforms().join("ckpt_out_semi_train_optshard_to_out_dp4/src/rank_0/net_0.ckpt");
    fs::copy(&src, &path).unwrap();
    let f = CheckpointFile::open(&path).unwrap();
    let name = f.tensors()[0].name.clone();
    assert!(f.read(&name).is_ok());
    // Same inode, shorter contents.
    fs::write(&path, b"\x0a\x00").unwrap();
    let e = f.read(&name).unwrap_err().to_string();
    assert!(e.contains("changed on disk while it was open"), "{e}");
}

/// Strategy files of two networks (no parameter in common) are refused by transforms, rather
/// than every tensor copied unchanged as "in one strategy only"; their rank list stays
/// MindSpore's (empty).
#[test]
fn strategies_of_two_networks_are_refused() {
    let (other, dp4) = (strategies().join("pp_shared/strategy_rank0.ckpt"), strategies().join("dp4/strategy_rank0.ckpt"));
    assert_eq!(autopar_checkpoint::rank_list_for_transform(0, Some(&other), Some(&dp4)).unwrap(), Vec::<usize>::new());
    let files: BTreeMap<usize, std::path::PathBuf> =
        (0..8).map(|r| (r, transforms().join(format!("ckpt_out_semi_train_optshard_to_out_dp4/src/rank_{r}/net_{r}.ckpt")))).collect();
    let dir = tempfile::tempdir().unwrap();
    let e = autopar_checkpoint::transform_checkpoint_by_rank(
        0,
        &files,
        &dir.path().join("x/n.ckpt"),
        Some(&other),
        Some(&dp4),
        &Default::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("have no parameter in common") && e.contains("pp_shared"), "{e}");
    assert!(!dir.path().join("x").exists());
    let out = tempfile::tempdir().unwrap();
    let opts = TransformOptions { format: Format::Ckpt, prefix: "net_".into(), ..Default::default() };
    let src = transforms().join("ckpt_out_semi_train_optshard_to_out_dp4/src");
    let e = transform_checkpoints(&src, &out.path().join("o"), Some(&other), Some(&dp4), &opts).unwrap_err().to_string();
    assert!(e.contains("have no parameter in common"), "{e}");
}

/// MindSpore before 2.10 wrote the device matrix of a one-device stage as `[]` (every axis of
/// size 1 removed); its readers take it as one device, and so does every reader here.
#[test]
fn an_empty_device_matrix_is_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(strategies().join("semi_json/strategy_rank0.json")).unwrap()).unwrap();
    for (_, item) in v["parallel_layout_item"].as_object_mut().unwrap() {
        let dims = item["tensor_map"].as_array().unwrap().len();
        item["dev_matrix"] = serde_json::json!([]);
        item["tensor_map"] = serde_json::json!(vec![-1; dims]);
    }
    let path = dir.path().join("one_device.json");
    fs::write(&path, v.to_string()).unwrap();
    let f = StrategyFile::load(&path).unwrap();
    let map = f.layout_map().unwrap();
    assert!(map.params.values().all(|p| p.dev_matrix == vec![1]), "{map:?}");
    assert_eq!(autopar_checkpoint::rank_list_for_transform(0, Some(&path), None).unwrap(), vec![0]);
}
