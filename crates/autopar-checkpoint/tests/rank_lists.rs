//! Rank lists equal MindSpore 2.10's, on the lists MindSpore itself wrote
//! (`fixtures/mindspore/generate_rank_lists.py`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use autopar_checkpoint::rank_list::{mindspore_rank_list, stage_rank_list, ListedLayout, MapEntry};
use autopar_checkpoint::StrategyFile;
use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> Value {
    let path = root().join("fixtures/mindspore/rank_lists").join(name);
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

fn layout(v: &Value) -> ListedLayout {
    ListedLayout {
        name: "w".into(),
        dev_matrix: ints(&v["dev_matrix"]).into_iter().map(|d| d as usize).collect(),
        tensor_map: v["tensor_map"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| if e.is_array() { MapEntry::Many(ints(e)) } else { MapEntry::One(e.as_i64().unwrap()) })
            .collect(),
        opt_shard_step: v["opt_shard_step"].as_i64().unwrap(),
        opt_shard_size: v["opt_shard_size"].as_i64().unwrap(),
        stages: vec![0],
    }
}

#[test]
fn random_layout_pairs_give_mindspores_lists() {
    let cases = fixture("random_layouts.json");
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 500);
    let mut checked = 0;
    for (i, c) in cases.iter().enumerate() {
        let (src, dst) = (layout(&c["src"]), layout(&c["dst"]));
        for (local, want) in c["lists"].as_array().unwrap().iter().enumerate() {
            let want: BTreeSet<usize> = ints(want).into_iter().map(|r| r as usize).collect();
            let got = stage_rank_list(local, std::slice::from_ref(&src), Some(std::slice::from_ref(&dst)))
                .unwrap_or_else(|e| panic!("case {i} rank {local}: {e}\n  {src:?}\n  {dst:?}"));
            assert_eq!(got, want, "case {i} rank {local}\n  src {src:?}\n  dst {dst:?}");
            checked += 1;
        }
    }
    assert!(checked > 5000, "{checked} lists");
}

#[test]
fn every_pair_of_strategy_files_gives_mindspores_lists() {
    let pairs = fixture("strategy_pairs.json");
    let load = |v: &Value| v.as_str().map(|p| StrategyFile::load(root().join(p)).unwrap());
    let mut refused = 0;
    let mut checked = 0;
    for p in pairs.as_array().unwrap() {
        let (src, dst) = (load(&p["src"]), load(&p["dst"]));
        for (rank, want) in p["lists"].as_array().unwrap().iter().enumerate() {
            let got = mindspore_rank_list(rank, src.as_ref(), dst.as_ref());
            let what = format!("{} -> {} rank {rank}", p["src"], p["dst"]);
            match want.as_array() {
                Some(_) => {
                    let want: Vec<usize> = ints(want).into_iter().map(|r| r as usize).collect();
                    assert_eq!(got.unwrap_or_else(|e| panic!("{what}: {e}")), want, "{what}");
                }
                None => {
                    assert!(got.is_err(), "{what}: MindSpore refuses ({}), autopar gives {got:?}", want["error"]);
                    refused += 1;
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 2000, "{checked} lists");
    assert!(refused > 0);
}
