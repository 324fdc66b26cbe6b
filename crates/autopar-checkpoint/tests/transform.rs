//! Transforms between synthetic strategies: round trips, pipeline stages, missing strategies,
//! extras, dtypes, and agreement with autopar-layout's redistribution simulator.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use autopar_checkpoint::{
    rank_list_for_transform, transform_checkpoint_by_rank, transform_checkpoints, CheckpointFile, DType, Format, TensorSpec,
    TransformOptions,
};
use autopar_layout::{plan, scatter, simulate, TensorMap};
use common::{bytes_of, piece, strategy_file, write_ranks, PLayout, Param, Rng};

fn random_layout(rng: &mut Rng, n: usize, ndim: usize, allow_opt: bool) -> PLayout {
    // split log2(n) into a random number of axes
    let mut bits = n.trailing_zeros() as usize;
    let mut dev = Vec::new();
    while bits > 0 {
        let take = 1 + rng.below(bits);
        dev.push(1 << take);
        bits -= take;
    }
    if dev.is_empty() {
        dev.push(1);
    }
    let nd = dev.len();
    let mut per_dim: Vec<Vec<i64>> = vec![Vec::new(); ndim];
    let mut axes: Vec<usize> = (0..nd).collect();
    for i in (1..axes.len()).rev() {
        axes.swap(i, rng.below(i + 1));
    }
    for a in axes {
        let d = rng.below(ndim + 1);
        if d < ndim && dev[a] > 1 {
            per_dim[d].push((nd - 1 - a) as i64);
        }
    }
    let map = TensorMap(per_dim.into_iter().map(|e| if e.is_empty() { vec![-1] } else { e }).collect());
    let mut l = PLayout { dev, map, opt: 0 };
    if allow_opt {
        let layout = l.layout(&vec![16; ndim]);
        let replicas = layout.mesh().num_devices() / layout.num_slices();
        if replicas > 1 && rng.below(2) == 0 {
            l.opt = if rng.below(2) == 0 { -1 } else { 1 << (1 + rng.below(replicas.trailing_zeros() as usize)) };
        }
    }
    l
}

fn random_params(rng: &mut Rng) -> Vec<Param> {
    let dtypes = [DType::Float32, DType::BFloat16, DType::Int64, DType::UInt8, DType::Float16, DType::Bool];
    (0..3)
        .map(|i| {
            let ndim = 1 + rng.below(3);
            let shape: Vec<usize> = (0..ndim).map(|d| if d == 0 { 16 * (1 + rng.below(2)) } else { 8 * (1 + rng.below(2)) }).collect();
            Param::new(&format!("layer{i}.w"), dtypes[rng.below(dtypes.len())], shape, rng.next())
        })
        .collect()
}

fn opts(format: Format, jobs: usize) -> TransformOptions {
    TransformOptions { format, prefix: "net_".into(), jobs, ..Default::default() }
}

fn write_strategy(dir: &Path, name: &str, params: &[(&Param, &PLayout, u32)], json: bool) -> PathBuf {
    let mut s = strategy_file(params);
    let path = dir.join(if json { format!("{name}.json") } else { format!("{name}.ckpt") });
    if json {
        for (item, (p, _, _)) in s.layout_items.iter_mut().zip(params) {
            item.tensor_shape = Some(p.shape.clone());
        }
    }
    s.save(&path).unwrap();
    path
}

/// Every rank file under `dir` holds exactly the expected pieces.
fn assert_pieces(dir: &Path, fmt: Format, params: &[(&Param, &PLayout, u32)], what: &str) {
    let n: usize = params[0].1.dev.iter().product();
    let stages = params.iter().map(|p| p.2).max().unwrap() as usize + 1;
    for g in 0..n * stages {
        let f = CheckpointFile::open(dir.join(format!("rank_{g}/net_{g}.{}", fmt.extension()))).unwrap();
        for (p, l, s) in params {
            if *s as usize != g / n {
                assert!(f.get(&p.name).is_none(), "{what}: rank {g} holds {} of another stage", p.name);
                continue;
            }
            let exp = piece(p, l, g % n);
            let e = f.get(&p.name).unwrap_or_else(|| panic!("{what}: rank {g} lacks {}", p.name));
            assert_eq!((e.dtype, e.shape.as_slice()), (p.dtype, exp.shape()), "{what}: rank {g} {}", p.name);
            assert!(f.read(&p.name).unwrap() == bytes_of(&exp, p.dtype), "{what}: rank {g} {} has wrong bytes", p.name);
        }
    }
}

/// Writes `params` under layouts `la` (random format and strategy format), transforms A -> B
/// (checking B's pieces) and B -> A, and asserts every rank's tensors came back bit for bit.
fn assert_round_trip(rng: &mut Rng, what: &str, params: &[Param], la: &[PLayout], lb: &[PLayout]) {
    let a: Vec<_> = params.iter().zip(la).map(|(p, l)| (p, l, 0)).collect();
    let b: Vec<_> = params.iter().zip(lb).map(|(p, l)| (p, l, 0)).collect();
    let na: usize = la[0].dev.iter().product();
    let fa = if rng.below(2) == 0 { Format::Ckpt } else { Format::Safetensors };
    let fb = if rng.below(2) == 0 { Format::Ckpt } else { Format::Safetensors };
    let tmp = tempfile::tempdir().unwrap();
    let sa = write_strategy(tmp.path(), "a", &a, rng.below(2) == 0);
    let sb = write_strategy(tmp.path(), "b", &b, rng.below(2) == 0);
    write_ranks(&tmp.path().join("a"), fa.extension(), &a, &[]);
    transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&sa), Some(&sb), &opts(fb, 1 + rng.below(3)))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_pieces(&tmp.path().join("b"), fb, &b, what);
    transform_checkpoints(&tmp.path().join("b"), &tmp.path().join("a2"), Some(&sb), Some(&sa), &opts(fa, 2))
        .unwrap_or_else(|e| panic!("{what}: B -> A: {e}"));
    for r in 0..na {
        let orig = CheckpointFile::open(tmp.path().join(format!("a/rank_{r}/net_{r}.{}", fa.extension()))).unwrap();
        let back = CheckpointFile::open(tmp.path().join(format!("a2/rank_{r}/net_{r}.{}", fa.extension()))).unwrap();
        for p in params {
            let (o, bk) = (orig.get(&p.name).unwrap(), back.get(&p.name).unwrap());
            assert_eq!((o.dtype, &o.shape), (bk.dtype, &bk.shape), "{what}: rank {r} {} after A -> B -> A", p.name);
            assert!(orig.read(&p.name).unwrap() == back.read(&p.name).unwrap(), "{what}: rank {r} {} after A -> B -> A", p.name);
        }
    }
}

#[test]
fn a_to_b_to_a_round_trips_are_bit_exact_over_random_layouts_and_device_counts() {
    for case in 0..24u64 {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (case * 7919 + 1));
        let params = random_params(&mut rng);
        let (na, nb) = (1 << rng.below(4), 1 << rng.below(4));
        let la: Vec<PLayout> = params.iter().map(|p| random_layout(&mut rng, na, p.shape.len(), true)).collect();
        let lb: Vec<PLayout> = params.iter().map(|p| random_layout(&mut rng, nb, p.shape.len(), true)).collect();
        let what = format!("case {case}: A {:?} -> B {:?}", la, lb);
        assert_round_trip(&mut rng, &what, &params, &la, &lb);
    }
}

/// A random layout of `shape` over `n` devices (a power of two) whose every split divides its
/// dimension; optimizer-sharded (dimension 0 of the slice over part or all of the replica
/// group) when `allow_opt` and the shard divides it.
fn random_valid_layout(rng: &mut Rng, n: usize, shape: &[usize], allow_opt: bool) -> PLayout {
    let mut l = loop {
        let l = random_layout(rng, n, shape.len(), false);
        if autopar_layout::TensorLayout::from_mindspore(&l.dev, &l.map, shape).is_ok() {
            break l;
        }
    };
    let layout = l.layout(shape);
    let replicas = layout.mesh().num_devices() / layout.num_slices();
    let rows = layout.slice_shape()[0];
    if allow_opt && replicas > 1 && rng.below(2) == 0 {
        let k = 1usize << (1 + rng.below(replicas.trailing_zeros() as usize));
        if rows % k == 0 {
            l.opt = if k == replicas && rng.below(2) == 0 { -1 } else { k as i32 };
        }
    }
    l
}

#[test]
fn a_to_b_to_a_round_trips_are_bit_exact_up_to_64_devices_and_every_dtype() {
    // Issue: random strategies A and B over 1-64 devices, random dtypes (every numeric one
    // MindSpore writes), random formats: A -> B -> A gives back the original files' tensors bit
    // for bit, and B holds exactly the pieces B's layouts give.
    let dtypes: Vec<DType> = DType::ALL.into_iter().filter(|d| *d != DType::Str).collect();
    for case in 0..24u64 {
        let mut rng = Rng(0x64de_71ce ^ (case * 2_654_435_761 + 7));
        let params: Vec<Param> = (0..3)
            .map(|i| {
                let ndim = 1 + rng.below(3);
                let shape: Vec<usize> = (0..ndim).map(|d| if d == 0 { 64 << rng.below(2) } else { 8 << rng.below(3) }).collect();
                Param::new(&format!("block{i}.w"), dtypes[rng.below(dtypes.len())], shape, rng.next())
            })
            .collect();
        let (na, nb) = (1usize << rng.below(7), 1usize << rng.below(7));
        let la: Vec<PLayout> = params.iter().map(|p| random_valid_layout(&mut rng, na, &p.shape, true)).collect();
        let lb: Vec<PLayout> = params.iter().map(|p| random_valid_layout(&mut rng, nb, &p.shape, true)).collect();
        let what =
            format!("case {case}: {na} -> {nb} devices, {:?}, A {la:?} -> B {lb:?}", params.iter().map(|p| p.dtype).collect::<Vec<_>>());
        assert_round_trip(&mut rng, &what, &params, &la, &lb);
    }
}

#[test]
fn transforms_agree_with_the_redistribution_simulator() {
    for case in 0..16u64 {
        let mut rng = Rng(0x1234_5678 + case * 31);
        let n = 1 << (1 + rng.below(3));
        let p = Param::new("w", DType::UInt32, vec![16, 8], rng.next());
        let la = random_layout(&mut rng, n, 2, false);
        let lb = random_layout(&mut rng, n, 2, false);
        let (src, dst) = (la.layout(&p.shape), lb.layout(&p.shape));
        let expected = simulate(&plan(&src, &dst).unwrap(), scatter(&p.full, &src).unwrap()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let sa = write_strategy(tmp.path(), "a", &[(&p, &la, 0)], false);
        let sb = write_strategy(tmp.path(), "b", &[(&p, &lb, 0)], false);
        write_ranks(&tmp.path().join("a"), "safetensors", &[(&p, &la, 0)], &[]);
        transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&sa), Some(&sb), &opts(Format::Safetensors, 1)).unwrap();
        for (r, block) in expected.iter().enumerate() {
            let f = CheckpointFile::open(tmp.path().join(format!("b/rank_{r}/net_{r}.safetensors"))).unwrap();
            assert_eq!(f.read("w").unwrap(), bytes_of(block, DType::UInt32), "case {case} rank {r}: {la:?} -> {lb:?}");
        }
    }
}

#[test]
fn pipeline_stage_counts_may_differ_between_source_and_destination() {
    let p1 = Param::new("l1.w", DType::Float32, vec![16, 8], 1);
    let p2 = Param::new("l2.w", DType::BFloat16, vec![8, 16], 2);
    // source: 2 stages of 4 devices, l1 on stage 0, l2 on stage 1
    let s1 = PLayout { dev: vec![2, 2], map: TensorMap::single(&[1, 0]), opt: 0 };
    let s2 = PLayout { dev: vec![4], map: TensorMap::single(&[-1, -1]), opt: -1 };
    let src = [(&p1, &s1, 0), (&p2, &s2, 1)];
    // destination: one stage of 2 devices
    let d1 = PLayout { dev: vec![2], map: TensorMap::single(&[-1, 0]), opt: 0 };
    let d2 = PLayout { dev: vec![2], map: TensorMap::single(&[0, -1]), opt: 0 };
    let dst = [(&p1, &d1, 0), (&p2, &d2, 0)];
    let tmp = tempfile::tempdir().unwrap();
    let ss = write_strategy(tmp.path(), "src", &src, false);
    let ds = write_strategy(tmp.path(), "dst", &dst, false);
    write_ranks(&tmp.path().join("a"), "ckpt", &src, &[]);
    // destination rank 1 needs stage 0's rank for l1 and stage 1's ranks for l2
    let list = rank_list_for_transform(1, Some(&ss), Some(&ds)).unwrap();
    assert!(list.iter().any(|&r| r < 4) && list.iter().any(|&r| r >= 4), "{list:?}");
    transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&ss), Some(&ds), &opts(Format::Ckpt, 2)).unwrap();
    assert_pieces(&tmp.path().join("b"), Format::Ckpt, &dst, "2 stages -> 1");
    // and back: one stage -> two stages
    transform_checkpoints(&tmp.path().join("b"), &tmp.path().join("c"), Some(&ds), Some(&ss), &opts(Format::Safetensors, 3)).unwrap();
    assert_pieces(&tmp.path().join("c"), Format::Safetensors, &src, "1 stage -> 2");
}

#[test]
fn a_missing_strategy_means_one_unsplit_device_on_that_side() {
    let p = Param::new("w", DType::Int32, vec![16, 8], 5);
    let l = PLayout { dev: vec![2, 4], map: TensorMap::single(&[-1, 0]), opt: -1 };
    let step = TensorSpec { name: "global_step".into(), dtype: DType::Int64, shape: vec![] };
    let tmp = tempfile::tempdir().unwrap();
    let s = write_strategy(tmp.path(), "s", &[(&p, &l, 0)], false);
    write_ranks(&tmp.path().join("a"), "ckpt", &[(&p, &l, 0)], &[(step.clone(), 7i64.to_le_bytes().to_vec())]);
    // sharded -> merged: one file with the full tensor, the step copied unchanged
    let rep =
        transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("full"), Some(&s), None, &opts(Format::Safetensors, 1)).unwrap();
    assert_eq!(rep.files.len(), 1);
    assert_eq!(rep.copied, vec!["global_step".to_string()]);
    let f = CheckpointFile::open(tmp.path().join("full/rank_0/net_0.safetensors")).unwrap();
    assert_eq!(f.read("w").unwrap(), bytes_of(&p.full, DType::Int32));
    assert_eq!(f.read("global_step").unwrap(), 7i64.to_le_bytes());
    // merged -> sharded again
    assert_eq!(rank_list_for_transform(5, None, Some(&s)).unwrap(), vec![0]);
    transform_checkpoints(&tmp.path().join("full"), &tmp.path().join("b"), None, Some(&s), &opts(Format::Ckpt, 4)).unwrap();
    assert_pieces(&tmp.path().join("b"), Format::Ckpt, &[(&p, &l, 0)], "full -> sharded");
}

#[test]
fn transform_by_rank_reads_only_the_ranks_of_its_rank_list() {
    let p = Param::new("w", DType::Float64, vec![16, 16], 9);
    let a = PLayout { dev: vec![2, 4], map: TensorMap::single(&[-1, 0]), opt: 0 };
    let b = PLayout { dev: vec![4, 2], map: TensorMap::single(&[1, -1]), opt: 0 };
    let tmp = tempfile::tempdir().unwrap();
    let sa = write_strategy(tmp.path(), "a", &[(&p, &a, 0)], false);
    let sb = write_strategy(tmp.path(), "b", &[(&p, &b, 0)], true);
    write_ranks(&tmp.path().join("a"), "ckpt", &[(&p, &a, 0)], &[]);
    for r in 0..8 {
        let list = rank_list_for_transform(r, Some(&sa), Some(&sb)).unwrap();
        // a row block of the destination needs one replica of each column block: 4 files
        assert_eq!(list.len(), 4, "rank {r}: {list:?}");
        assert!(list.windows(2).all(|w| w[0] > w[1]), "highest first: {list:?}");
        let files: BTreeMap<usize, PathBuf> = list.iter().map(|&s| (s, tmp.path().join(format!("a/rank_{s}/net_{s}.ckpt")))).collect();
        let out = tmp.path().join(format!("out/net_{r}.safetensors"));
        transform_checkpoint_by_rank(r, &files, &out, Some(&sa), Some(&sb), &opts(Format::Ckpt, 1)).unwrap();
        let f = CheckpointFile::open(&out).unwrap();
        assert_eq!(f.read("w").unwrap(), bytes_of(&piece(&p, &b, r), DType::Float64));
    }
    // destination rank 5 pairs with source rank 5: it reads the replicas in its own row of the mesh
    assert_eq!(rank_list_for_transform(5, Some(&sa), Some(&sb)).unwrap(), vec![7, 6, 5, 4]);
}

#[test]
fn transform_by_rank_accepts_exactly_the_files_mindspore_lists() {
    // MindSpore's list is the contract: given exactly those files (optimizer-sharded sources
    // included), every destination rank is written correctly.
    for case in 0..16u64 {
        let mut rng = Rng(0x5151_7e57 ^ (case * 104_729 + 3));
        let params = random_params(&mut rng);
        let (na, nb) = (1 << rng.below(4), 1 << rng.below(4));
        // MindSpore reads the one message of a 1-d tensor split over two axes as a 2-d map
        // (and refuses): such files are left to the other tests
        let mut draw = |n: usize, nd: usize| loop {
            let l = random_layout(&mut rng, n, nd, true);
            if !(nd == 1 && l.map.0[0].len() > 1) {
                break l;
            }
        };
        let la: Vec<PLayout> = params.iter().map(|p| draw(na, p.shape.len())).collect();
        let lb: Vec<PLayout> = params.iter().map(|p| draw(nb, p.shape.len())).collect();
        let a: Vec<_> = params.iter().zip(&la).map(|(p, l)| (p, l, 0)).collect();
        let b: Vec<_> = params.iter().zip(&lb).map(|(p, l)| (p, l, 0)).collect();
        let tmp = tempfile::tempdir().unwrap();
        let sa = write_strategy(tmp.path(), "a", &a, false);
        let sb = write_strategy(tmp.path(), "b", &b, false);
        write_ranks(&tmp.path().join("a"), "ckpt", &a, &[]);
        for r in 0..nb {
            let what = format!("case {case} rank {r}: A {la:?} -> B {lb:?}");
            let list = rank_list_for_transform(r, Some(&sa), Some(&sb)).unwrap_or_else(|e| panic!("{what}: {e}"));
            let files: BTreeMap<usize, PathBuf> = list.iter().map(|&s| (s, tmp.path().join(format!("a/rank_{s}/net_{s}.ckpt")))).collect();
            let out = tmp.path().join(format!("out/net_{r}.ckpt"));
            transform_checkpoint_by_rank(r, &files, &out, Some(&sa), Some(&sb), &opts(Format::Ckpt, 1))
                .unwrap_or_else(|e| panic!("{what}: given {list:?}: {e}"));
            let f = CheckpointFile::open(&out).unwrap();
            for (p, l, _) in &b {
                assert!(f.read(&p.name).unwrap() == bytes_of(&piece(p, l, r), p.dtype), "{what}: {} has wrong bytes", p.name);
            }
        }
    }
}

/// The fixture network's parameters with their layouts in a MindSpore strategy file.
fn fixture_params(strategy: &Path) -> Vec<(Param, PLayout)> {
    let shapes = [("l1.w", vec![64, 128]), ("l1.b", vec![128]), ("l2.w", vec![128, 32]), ("l2.b", vec![32]), ("head.w", vec![32, 16])];
    let s = autopar_checkpoint::StrategyFile::load(strategy).unwrap();
    let m = s.layout_map().unwrap();
    shapes
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let l = &m.params[*name];
            let opt = if l.opt_shard_step == 0 { 0 } else { l.opt_shard_size as i32 };
            (
                Param::new(name, DType::Float32, shape.clone(), 40 + i as u64),
                PLayout { dev: l.dev_matrix.clone(), map: l.tensor_map.clone(), opt },
            )
        })
        .collect()
}

#[test]
fn optimizer_sharded_sources_transform_from_mindspores_file_set() {
    // optshard2 (groups of 2 replicas) -> semi_train: MindSpore lists [4, 1, 0] for destination
    // rank 0, so the rows that rank 0's own replica group {0, 4} does not hold come from rank 1
    let (src, dst) =
        (common::strategies().join("optshard2/strategy_rank0.ckpt"), common::strategies().join("semi_train/strategy_rank0.ckpt"));
    let a = fixture_params(&src);
    let b = fixture_params(&dst);
    let tmp = tempfile::tempdir().unwrap();
    let pa: Vec<_> = a.iter().map(|(p, l)| (p, l, 0)).collect();
    write_ranks(&tmp.path().join("a"), "ckpt", &pa, &[]);
    for r in 0..8 {
        let list = rank_list_for_transform(r, Some(&src), Some(&dst)).unwrap();
        if r == 0 {
            assert_eq!(list, vec![4, 1, 0]);
        }
        let files: BTreeMap<usize, PathBuf> = list.iter().map(|&s| (s, tmp.path().join(format!("a/rank_{s}/net_{s}.ckpt")))).collect();
        let out = tmp.path().join(format!("out/net_{r}.ckpt"));
        transform_checkpoint_by_rank(r, &files, &out, Some(&src), Some(&dst), &opts(Format::Ckpt, 1))
            .unwrap_or_else(|e| panic!("rank {r}: {e}"));
        let f = CheckpointFile::open(&out).unwrap();
        for (p, l) in &b {
            assert!(f.read(&p.name).unwrap() == bytes_of(&piece(p, l, r), p.dtype), "rank {r}: {} has wrong bytes", p.name);
        }
    }
}

#[test]
fn tensors_in_one_strategy_only_are_copied_as_mindspore_does_and_listed_unless_strict() {
    let p = Param::new("w", DType::Float32, vec![8, 8], 3);
    let q = Param::new("extra.w", DType::Float32, vec![8], 4);
    let l = PLayout { dev: vec![2], map: TensorMap::single(&[0, -1]), opt: 0 };
    let l1 = PLayout { dev: vec![2], map: TensorMap::single(&[0]), opt: 0 };
    let tmp = tempfile::tempdir().unwrap();
    let sa = write_strategy(tmp.path(), "a", &[(&p, &l, 0), (&q, &l1, 0)], false);
    let sb = write_strategy(tmp.path(), "b", &[(&p, &l, 0)], false);
    write_ranks(&tmp.path().join("a"), "ckpt", &[(&p, &l, 0), (&q, &l1, 0)], &[]);
    let mut strict = opts(Format::Ckpt, 1);
    strict.strict = true;
    let err = transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&sa), Some(&sb), &strict).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("extra.w") && text.contains("`strict`"), "{text}");
    let rep = transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&sa), Some(&sb), &opts(Format::Ckpt, 1)).unwrap();
    assert_eq!(rep.one_strategy, vec!["extra.w".to_string()]);
    for r in 0..2 {
        // MindSpore copies the paired source rank's slice as it is
        let f = CheckpointFile::open(tmp.path().join(format!("b/rank_{r}/net_{r}.ckpt"))).unwrap();
        assert_eq!(f.read("extra.w").unwrap(), bytes_of(&piece(&q, &l1, r), DType::Float32), "rank {r}");
        assert_eq!(f.read("w").unwrap(), bytes_of(&piece(&p, &l, r), DType::Float32));
    }
}

#[test]
fn optimizer_state_the_strategies_do_not_list_follows_its_parameter() {
    // a run whose strategy file lists only the parameters (MindSpore's only_trainable_params):
    // its moments.* / adam_*.* / accu_grads.* slices are resharded with their parameter
    let w = Param::new("fc.w", DType::Float32, vec![16, 8], 21);
    let la = PLayout { dev: vec![2, 2], map: TensorMap::single(&[1, 0]), opt: 0 };
    let lb = PLayout { dev: vec![4, 2], map: TensorMap::single(&[-1, 0]), opt: 0 };
    let states: Vec<Param> = ["moments.fc.w", "adam_m.fc.w", "adam_v.fc.w", "accu_grads.fc.w"]
        .iter()
        .enumerate()
        .map(|(i, n)| Param::new(n, DType::Float32, vec![16, 8], 30 + i as u64))
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let sa = write_strategy(tmp.path(), "a", &[(&w, &la, 0)], false);
    let sb = write_strategy(tmp.path(), "b", &[(&w, &lb, 0)], true);
    let mut all: Vec<(&Param, &PLayout, u32)> = vec![(&w, &la, 0)];
    all.extend(states.iter().map(|s| (s, &la, 0)));
    write_ranks(&tmp.path().join("a"), "safetensors", &all, &[]);
    let rep = transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&sa), Some(&sb), &opts(Format::Ckpt, 2)).unwrap();
    assert!(rep.one_strategy.is_empty() && rep.copied.is_empty(), "{rep:?}");
    let b: Vec<(&Param, &PLayout, u32)> = std::iter::once(&w).chain(&states).map(|p| (p, &lb, 0)).collect();
    assert_pieces(&tmp.path().join("b"), Format::Ckpt, &b, "state follows its parameter");
    // and merged into one file, every state tensor is whole
    let rep =
        transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("full"), Some(&sa), None, &opts(Format::Safetensors, 1)).unwrap();
    assert!(rep.copied.is_empty(), "{rep:?}");
    let f = CheckpointFile::open(tmp.path().join("full/rank_0/net_0.safetensors")).unwrap();
    for s in &states {
        assert_eq!(f.get(&s.name).unwrap().shape, vec![16, 8], "{}", s.name);
    }
    // a source strategy that lists the state (MindSpore's training runs) into one that does not
    let sa2 = write_strategy(tmp.path(), "a2", &all, false);
    let rep = transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b2"), Some(&sa2), Some(&sb), &opts(Format::Ckpt, 1)).unwrap();
    assert!(rep.one_strategy.is_empty() && rep.copied.is_empty(), "{rep:?}");
    assert_pieces(&tmp.path().join("b2"), Format::Ckpt, &b, "state listed by the source only");
}

#[test]
fn ckpt_outputs_list_the_transformed_tensors_before_the_copied_ones() {
    // MindSpore writes the transformed parameters first, then the entries it copies
    let w = Param::new("w", DType::Float32, vec![8, 4], 5);
    let l = PLayout { dev: vec![2], map: TensorMap::single(&[0, -1]), opt: 0 };
    let tmp = tempfile::tempdir().unwrap();
    let sa = write_strategy(tmp.path(), "a", &[(&w, &l, 0)], false);
    let step = (TensorSpec { name: "global_step".into(), dtype: DType::Int32, shape: vec![1] }, vec![7, 0, 0, 0]);
    let lr = (TensorSpec { name: "a_learning_rate".into(), dtype: DType::Float32, shape: vec![1] }, 0.5f32.to_le_bytes().to_vec());
    write_ranks(&tmp.path().join("a"), "ckpt", &[(&w, &l, 0)], &[step, lr]);
    let rep = transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("full"), Some(&sa), None, &opts(Format::Ckpt, 1)).unwrap();
    assert_eq!(rep.copied.len(), 2, "{rep:?}");
    let f = CheckpointFile::open(tmp.path().join("full/rank_0/net_0.ckpt")).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names[0], "w", "{names:?}");
}

#[test]
fn a_one_stage_source_strategy_of_a_larger_network_transforms_that_stage_into_part_files() {
    let p1 = Param::new("l1.w", DType::Float32, vec![16, 8], 11);
    let p2 = Param::new("l2.w", DType::Float32, vec![8, 16], 12);
    let s1 = PLayout { dev: vec![4], map: TensorMap::single(&[0, -1]), opt: 0 };
    let s2 = PLayout { dev: vec![2, 2], map: TensorMap::single(&[-1, 1]), opt: 0 };
    let tmp = tempfile::tempdir().unwrap();
    // the checkpoints of a 2-stage run: l1 on ranks 0..3, l2 on ranks 4..7
    write_ranks(&tmp.path().join("a"), "ckpt", &[(&p1, &s1, 0), (&p2, &s2, 1)], &[]);
    // stage 1's own strategy file (plain names, operator strategies of stage 1)
    let mut stage1 = common::strategy_file(&[(&p2, &s2, 1)]);
    for l in &mut stage1.layout_items {
        l.name = l.name.trim_start_matches("1-").to_string();
    }
    let ss = tmp.path().join("stage1.ckpt");
    stage1.save(&ss).unwrap();
    // destination: the whole network on 2 devices
    let d1 = PLayout { dev: vec![2], map: TensorMap::single(&[-1, -1]), opt: 0 };
    let d2 = PLayout { dev: vec![2], map: TensorMap::single(&[-1, 0]), opt: 0 };
    let ds = write_strategy(tmp.path(), "dst", &[(&p1, &d1, 0), (&p2, &d2, 0)], false);
    let rep = transform_checkpoints(&tmp.path().join("a"), &tmp.path().join("b"), Some(&ss), Some(&ds), &opts(Format::Ckpt, 2)).unwrap();
    assert_eq!((rep.files.len(), rep.per_stage), (2, Some(1)));
    for r in 0..2 {
        let f = CheckpointFile::open(tmp.path().join(format!("b/rank_{r}/net_{r}_part1.ckpt"))).unwrap();
        assert!(f.get("l1.w").is_none());
        assert_eq!(f.read("l2.w").unwrap(), bytes_of(&piece(&p2, &d2, r), DType::Float32), "rank {r}");
    }

    // From safetensors files MindSpore transforms the whole network (and fails on this pair
    // with a KeyError): no `_part` names; nothing is dropped without a word.
    write_ranks(&tmp.path().join("c"), "safetensors", &[(&p1, &s1, 0), (&p2, &s2, 1)], &[]);
    let rep = transform_checkpoints(&tmp.path().join("c"), &tmp.path().join("d"), Some(&ss), Some(&ds), &opts(Format::Safetensors, 2));
    let rep = rep.unwrap();
    assert_eq!(rep.per_stage, None);
    assert_eq!((rep.one_strategy.as_slice(), rep.absent.as_slice()), (&["l1.w".to_string()][..], &["l2.w".to_string()][..]));
    for r in 0..2 {
        assert!(tmp.path().join(format!("d/rank_{r}/net_{r}.safetensors")).is_file(), "rank {r}");
    }
}
