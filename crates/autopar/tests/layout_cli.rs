//! `autopar layout` end to end.

use std::process::Command;

fn autopar(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_autopar")).args(args).output().expect("run autopar");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn layout_prints_each_ranks_slice_and_replica_group() {
    let (code, out, err) = autopar(&["layout", "--dev-matrix", "2,4", "--tensor-map", "-1,0", "--shape", "64,128"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("slice shape [64, 32]"), "{out}");
    let rank5 = out.lines().find(|l| l.trim_start().starts_with("5 ")).expect("a row for rank 5");
    assert!(rank5.contains("[0:64, 32:64]") && rank5.ends_with("1,5"), "{rank5}");
}

#[test]
fn layout_json_lists_every_rank() {
    let (code, out, _) = autopar(&["layout", "--dev-matrix", "2,2,2", "--tensor-map", "-1,(1,0)", "--shape", "64,128", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ranks"].as_array().unwrap().len(), 8);
    assert_eq!(v["ranks"][2]["slice"][1], serde_json::json!([64, 96]));
    assert_eq!(v["slice_shape"], serde_json::json!([64, 32]));
}

#[test]
fn layout_prints_a_redistribution_plan() {
    let (code, out, err) = autopar(&["layout", "--dev-matrix", "4", "--tensor-map", "0,-1", "--shape", "8,8", "--to-tensor-map", "-1,0"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("all_to_all"), "{out}");
}

#[test]
fn layout_strategy_shows_mindspores_maps() {
    let (code, out, err) = autopar(&["layout", "--strategy", "((2,1),(1,4))", "--devices", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dev_matrix [2, 4]") && out.contains("input 1: tensor_map [-1, 0]"), "{out}");
}

#[test]
fn bad_layouts_are_clear_errors_with_exit_code_2() {
    let (code, _, err) = autopar(&["layout", "--dev-matrix", "2,4", "--tensor-map", "-1,0", "--shape", "64,6"]);
    assert_eq!(code, 2);
    assert!(err.starts_with("autopar: tensor dimension 1 of size 6 is not divisible by its split 4"), "{err}");
    assert!(err.contains("hint:"), "{err}");
    let (code, _, err) = autopar(&["layout", "--dev-matrix", "4096,2", "--tensor-map", "0", "--shape", "8"]);
    assert_eq!(code, 2);
    assert!(err.contains("8192 devices"), "{err}");
    let (code, _, err) = autopar(&["layout", "--strategy", "((3,1),(1,1))", "--devices", "8"]);
    assert_eq!(code, 2);
    assert!(err.contains("does not divide the device count 8"), "{err}");
}
