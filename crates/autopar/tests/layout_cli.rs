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

/// `--shapes` is checked before anything is printed: one shape per input, a MatMul's
/// contracted dimensions equal; with `--json` each input's slices are in the JSON.
#[test]
fn strategy_shapes_are_checked_first_and_go_into_the_json() {
    let base = ["layout", "--strategy", "((2,1),(1,4))", "--devices", "8", "--op", "matmul", "--shapes"];
    for (shapes, needle) in [
        ("256,64", "--shapes gives 1 shape(s), and strategy ((2, 1), (1, 4)) has 2 inputs"),
        ("256,64;64,128;5", "--shapes gives 3 shape(s)"),
        ("256,64;32,128", "do not multiply: the MatMul contracts 64 with 32"),
    ] {
        let (code, out, err) = autopar(&[&base[..], &[shapes]].concat());
        assert_eq!(code, 2, "{shapes}: {err}");
        assert!(out.is_empty() && err.contains(needle), "{shapes}: {out}\n{err}");
    }
    let (code, out, err) = autopar(&[&base[..], &["256,64;64,128", "--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["input_slices"][1]["slice_shape"], serde_json::json!([64, 32]), "{v}");
}

/// Partial-sum axes are named as the user gave them (right-counted), each once; a missing
/// layout flag is named.
#[test]
fn partial_axes_and_missing_flags_are_named_as_given() {
    let base = ["layout", "--dev-matrix", "2,4", "--tensor-map", "-1,0", "--shape", "64,128", "--partial"];
    let (code, _, err) = autopar(&[&base[..], &["0"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("partial-sum axis 0 (right-counted, as given) also splits tensor dimension 1"), "{err}");
    let (code, _, err) = autopar(&[&base[..], &["1,1"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--partial names axis 1 twice"), "{err}");
    let (code, _, err) = autopar(&["layout", "--dev-matrix", "2,4", "--tensor-map", "-1,0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing layout: no --shape"), "{err}");
}
