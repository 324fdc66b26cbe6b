//! Compatibility with layouts MindSpore 2.10 computed (`fixtures/mindspore/strategies`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use autopar_layout::{strategy_layouts, DevMatrixRule, ParameterLayout, Strategy, TensorMap};

fn fixtures() -> PathBuf {
    match std::env::var_os("AUTOPAR_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/mindspore")),
    }
}

fn read_layouts(path: &std::path::Path) -> BTreeMap<String, ParameterLayout> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| ParameterLayout::parse_line(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

#[test]
fn every_fixture_layout_gives_mindspores_slice_shape() {
    let root = fixtures().join("strategies");
    let mut files = 0;
    let mut entries = 0;
    for dir in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("cannot list {}: {e}", root.display())) {
        let dir = dir.unwrap().path();
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().to_string();
            let Some(rank) = name.strip_prefix("layout_rank").and_then(|s| s.strip_suffix(".txt")) else { continue };
            let rank: usize = rank.parse().unwrap();
            files += 1;
            for (param, p) in read_layouts(&f) {
                let layout = autopar_layout::TensorLayout::of_parameter(&p).unwrap_or_else(|e| panic!("{} {param}: {e}", f.display()));
                assert_eq!(layout.slice_shape(), p.slice_shape, "{} {param}", f.display());
                assert_eq!(layout.tensor_map().flattened(), p.tensor_map, "{} {param}", f.display());
                // The stage-local rank (pipeline stages own consecutive ranks) holds that shape.
                let local = rank % layout.mesh().num_devices();
                let slice = layout.slice_of(local).unwrap();
                let shape: Vec<usize> = slice.iter().map(|r| r.end - r.start).collect();
                assert_eq!(shape, p.slice_shape, "{} {param} rank {rank}", f.display());
                entries += 1;
            }
        }
    }
    assert!(files >= 14, "expected the fixture layout files, found {files} under {}", root.display());
    assert!(entries > 100);
}

#[test]
fn semi_all_strategies_give_mindspores_device_matrices_and_tensor_maps() {
    let layouts = read_layouts(&fixtures().join("strategies/semi_all/layout_rank0.txt"));
    let mm = DevMatrixRule::MatMul { transpose_a: false, transpose_b: false };
    let ew = DevMatrixRule::Elementwise;
    // (parameter, op rule, strategy, input index of the parameter) as in generate_strategies.py.
    let cases = [
        ("x", ew, "((8, 1),)", 0),           // dataset strategy: data parallel
        ("l1.w", mm, "((2, 1), (1, 4))", 1), // l1 MatMul
        ("l1.b", ew, "((2, 4), (4,))", 1),   // l1 Add
        ("l2.w", mm, "((2, 4), (4, 1))", 1), // l2 MatMul
        ("l2.b", ew, "((2, 1), (1,))", 1),   // l2 Add
        ("head.w", mm, "((8, 1), (1, 1))", 1),
    ];
    for (param, rule, strategy, input) in cases {
        let s: Strategy = strategy.parse().unwrap();
        let op = strategy_layouts(rule, &s, 8, true).unwrap();
        let want = &layouts[param];
        assert_eq!(op.dev_matrix.dims(), want.dev_matrix.as_slice(), "{param} under {strategy}");
        assert_eq!(op.inputs[input], TensorMap::single(&want.tensor_map), "{param} under {strategy}");
        let l = op.input_layout(input, &want.full_shape).unwrap();
        assert_eq!(l.slice_shape(), want.slice_shape, "{param}");
    }
}

#[test]
fn rec_big_mixed_model_parallel_layouts_are_reproduced_from_their_strategies() {
    // auto_parallel (recursive programming) chose these; the strategies that give them:
    let layouts = read_layouts(&fixtures().join("strategies/rec_big/layout_rank0.txt"));
    let mm = DevMatrixRule::MatMul { transpose_a: false, transpose_b: false };
    for (param, strategy) in [("l1.w", "((4, 1), (1, 2))"), ("l2.w", "((2, 4), (4, 1))"), ("head.w", "((2, 1), (1, 4))")] {
        let op = strategy_layouts(mm, &strategy.parse().unwrap(), 8, true).unwrap();
        let want = &layouts[param];
        assert_eq!(op.dev_matrix.dims(), want.dev_matrix.as_slice(), "{param}");
        assert_eq!(op.inputs[1], TensorMap::single(&want.tensor_map), "{param}");
    }
}
