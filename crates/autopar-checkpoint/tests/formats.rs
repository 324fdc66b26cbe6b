//! Both checkpoint formats written and read for every dtype, interoperability with the reference
//! decoders (prost for `.ckpt`, the safetensors crate), and every corrupted or truncated file
//! giving a clear error, never a panic.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use autopar_checkpoint::proto::ckpt as pb;
use autopar_checkpoint::{
    collect_rank_files, load_segmented, save, save_with, transform_checkpoint_by_rank, transform_checkpoints, CheckpointError,
    CheckpointFile, CkptWriter, DType, Format, NameFilter, StrategyFile, TensorSpec, TransformOptions,
};
use prost::Message;

fn sample(dtype: DType, shape: &[usize], seed: u8) -> Vec<u8> {
    let n = shape.iter().product::<usize>() * dtype.size();
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn all_dtypes() -> Vec<(TensorSpec, Vec<u8>)> {
    DType::ALL
        .into_iter()
        .filter(|d| *d != DType::Str)
        .enumerate()
        .map(|(i, d)| {
            let shape = vec![3, 1 + i % 4];
            (TensorSpec { name: format!("t.{d}"), dtype: d, shape: shape.clone() }, sample(d, &shape, i as u8))
        })
        .chain([(TensorSpec { name: "scalar".into(), dtype: DType::Int64, shape: vec![] }, 42i64.to_le_bytes().to_vec())])
        .collect()
}

#[test]
fn every_dtype_round_trips_through_both_formats() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["ckpt", "safetensors"] {
        let path = dir.path().join(format!("x.{ext}"));
        let tensors = all_dtypes();
        save(&path, &tensors, &BTreeMap::new()).unwrap();
        let f = CheckpointFile::open(&path).unwrap();
        assert_eq!(f.tensors().len(), tensors.len());
        for (spec, data) in &tensors {
            let e = f.get(&spec.name).unwrap();
            assert_eq!((e.dtype, &e.shape), (spec.dtype, &spec.shape), "{ext} {}", spec.name);
            assert_eq!(&f.read(&spec.name).unwrap(), data, "{ext} {}", spec.name);
        }
    }
}

#[test]
fn ckpt_files_decode_with_prost_as_one_checkpoint_message_and_chunks_concatenate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.ckpt");
    let big = sample(DType::Float32, &[10, 10], 7);
    let mut w = CkptWriter::with_chunk_bytes(&path, true, 96).unwrap();
    w.write_tensor("big", DType::Float32, &[10, 10], &big).unwrap();
    w.write_tensor("s", DType::Int32, &[], &5i32.to_le_bytes()).unwrap();
    let note: Vec<u8> = "hi".chars().flat_map(|c| (c as u32).to_le_bytes()).collect();
    w.write_tensor("note", DType::Str, &[0], &note).unwrap();
    w.finish().unwrap();
    let bytes = fs::read(&path).unwrap();
    assert_eq!(&bytes[bytes.len() - 17..bytes.len() - 10], b"crc_num");
    let stored = u32::from_be_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
    assert_eq!(stored, crc32fast::hash(&bytes[..bytes.len() - 17]));
    let msg = pb::Checkpoint::decode(&bytes[..bytes.len() - 17]).unwrap();
    // 400 bytes in chunks of 96: 5 values with the same tag and full dims, then 2 more
    assert_eq!(msg.value.len(), 7);
    let chunks: Vec<&pb::checkpoint::Value> = msg.value.iter().filter(|v| v.tag == "big").collect();
    assert_eq!(chunks.len(), 5);
    let mut joined = Vec::new();
    for v in chunks {
        let Some(pb::checkpoint::value::Value::Tensor(t)) = &v.value else { panic!("not a tensor") };
        assert_eq!((t.dims.as_slice(), t.tensor_type.as_str()), (&[10i64, 10][..], "Float32"));
        joined.extend_from_slice(&t.tensor_content);
    }
    assert_eq!(joined, big);
    let f = CheckpointFile::open(&path).unwrap();
    assert_eq!(f.stored_crc(), Some(stored));
    assert_eq!(f.read("big").unwrap(), big);
    assert_eq!(f.get("note").unwrap().dtype, DType::Str);
    assert_eq!(f.read("note").unwrap(), note);
    // a box crossing chunk boundaries
    let mut out = vec![0u8; 3 * 4 * 4];
    f.copy_region("big", &[2..5, 3..7], &mut out, &[3, 4], &[0, 0]).unwrap();
    let mut exp = Vec::new();
    for r in 2..5 {
        exp.extend_from_slice(&big[(r * 10 + 3) * 4..(r * 10 + 7) * 4]);
    }
    assert_eq!(out, exp);
}

#[test]
fn mindspore_ckpt_fixtures_read_the_same_as_prost_decodes_them() {
    let (files, fmt) = collect_rank_files(&common::transforms().join("ckpt_out_semi_train_optshard_to_out_dp4/src")).unwrap();
    assert_eq!((files.len(), fmt), (8, Format::Ckpt));
    for p in files.values() {
        let msg = pb::Checkpoint::decode(fs::read(p).unwrap().as_slice()).unwrap();
        let f = CheckpointFile::open(p).unwrap();
        assert_eq!(msg.value.len(), f.tensors().len());
        for v in msg.value {
            let Some(pb::checkpoint::value::Value::Tensor(t)) = v.value else { panic!() };
            let e = f.get(&v.tag).unwrap();
            assert_eq!(e.shape, t.dims.iter().map(|&d| d as usize).collect::<Vec<_>>());
            assert_eq!(e.dtype.mindspore_name(), t.tensor_type);
            assert_eq!(f.read(&v.tag).unwrap(), t.tensor_content);
        }
    }
}

#[test]
fn safetensors_files_interoperate_with_the_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.safetensors");
    let tensors = all_dtypes();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "ms".to_string());
    save(&path, &tensors, &meta).unwrap();
    let bytes = fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (spec, data) in &tensors {
        let v = st.tensor(&spec.name).unwrap();
        assert_eq!(v.shape(), spec.shape.as_slice());
        assert_eq!(v.data(), data.as_slice());
    }
    let (_, m) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(m.metadata().as_ref().unwrap()["format"], "ms");
    // and the other way round
    let data = sample(DType::BFloat16, &[4, 2], 1);
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4, 2], &data).unwrap();
    let other = dir.path().join("b.safetensors");
    safetensors::serialize_to_file([("w", view)], None, &other).unwrap();
    let f = CheckpointFile::open(&other).unwrap();
    assert_eq!(f.get("w").unwrap().dtype, DType::BFloat16);
    assert_eq!(f.read("w").unwrap(), data);
}

#[test]
fn a_safetensors_tensor_written_in_parts_equals_it_written_whole_and_a_wrong_count_is_refused() {
    use autopar_checkpoint::SafetensorsWriter;
    let dir = tempfile::tempdir().unwrap();
    let tensors = all_dtypes();
    let list: Vec<_> = tensors.iter().map(|(s, _)| (s.name.clone(), s.dtype, s.shape.clone())).collect();
    let whole = dir.path().join("whole.safetensors");
    let parts = dir.path().join("parts.safetensors");
    let by_name: BTreeMap<&str, &[u8]> = tensors.iter().map(|(s, d)| (s.name.as_str(), d.as_slice())).collect();
    let mut w = SafetensorsWriter::create(&whole, &BTreeMap::new(), &list).unwrap();
    let order: Vec<String> = w.write_order().map(|t| t.0.clone()).collect();
    for name in &order {
        w.write_tensor(name, by_name[name.as_str()]).unwrap();
    }
    w.finish().unwrap();
    let mut w = SafetensorsWriter::create(&parts, &BTreeMap::new(), &list).unwrap();
    for name in &order {
        for chunk in by_name[name.as_str()].chunks(5) {
            w.write_part(name, chunk).unwrap();
        }
    }
    w.finish().unwrap();
    assert_eq!(fs::read(&whole).unwrap(), fs::read(&parts).unwrap());
    // More bytes than the tensor has, or the next tensor before this one is complete: refused.
    let mut w = SafetensorsWriter::create(&dir.path().join("bad.safetensors"), &BTreeMap::new(), &list).unwrap();
    let first = by_name[order[0].as_str()];
    let e = w.write_part(&order[0], &[first, &[0u8]].concat()).unwrap_err().to_string();
    assert!(e.contains(&format!("needs {} bytes", first.len())), "{e}");
    w.write_part(&order[0], &first[..1]).unwrap();
    assert!(w.write_part(&order[1], by_name[order[1].as_str()]).is_err());
    assert!(w.finish().is_err());
    assert!(!dir.path().join("bad.safetensors").exists());
}

#[test]
fn load_segmented_merges_a_folder_with_name_filters() {
    let dir = tempfile::tempdir().unwrap();
    let t = |n: &str, v: u8| (TensorSpec { name: n.into(), dtype: DType::UInt8, shape: vec![2] }, vec![v, v]);
    save(&dir.path().join("a.ckpt"), &[t("net.a", 1), t("adam_m.net.a", 2)], &BTreeMap::new()).unwrap();
    save(&dir.path().join("b.safetensors"), &[t("net.b", 3)], &BTreeMap::new()).unwrap();
    let all = load_segmented(dir.path(), &NameFilter::default()).unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), vec!["adam_m.net.a", "net.a", "net.b"]);
    let f = NameFilter { specify_prefix: vec!["net.".into()], filter_prefix: vec!["net.b".into()] };
    let some = load_segmented(dir.path(), &f).unwrap();
    assert_eq!(some.keys().collect::<Vec<_>>(), vec!["net.a"]);
    assert_eq!(some["net.a"].data, vec![1, 1]);
    assert!(matches!(load_segmented(&dir.path().join("a.ckpt"), &f), Err(CheckpointError::NotADirectory { .. })));
}

fn open_err(path: &Path) -> CheckpointError {
    match CheckpointFile::open(path) {
        Ok(_) => panic!("{} opened without error", path.display()),
        Err(e) => e,
    }
}

#[test]
fn every_truncation_of_a_ckpt_file_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.ckpt");
    let mut w = CkptWriter::create(&good, false).unwrap();
    w.write_tensor("w", DType::Float32, &[4, 4], &sample(DType::Float32, &[4, 4], 3)).unwrap();
    w.write_tensor("b", DType::Float16, &[4], &sample(DType::Float16, &[4], 4)).unwrap();
    w.finish().unwrap();
    let bytes = fs::read(&good).unwrap();
    let cut = dir.path().join("cut.ckpt");
    for n in 1..bytes.len() {
        fs::write(&cut, &bytes[..n]).unwrap();
        // a cut exactly between two values is a valid shorter checkpoint
        if let Ok(f) = CheckpointFile::open(&cut) {
            assert_eq!(f.tensors().len(), 1, "cut at {n} parsed as {:?}", f.tensors());
            continue;
        }
        let e = open_err(&cut);
        let text = e.to_string();
        assert!(text.contains("cut.ckpt"), "cut at {n}: {text}");
        assert!(
            matches!(e, CheckpointError::Truncated { .. } | CheckpointError::Malformed { .. } | CheckpointError::TensorSize { .. }),
            "cut at {n}: {e:?}"
        );
    }
}

#[test]
fn a_ckpt_with_a_bad_crc_or_an_unknown_dtype_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.ckpt");
    let mut w = CkptWriter::create(&path, true).unwrap();
    w.write_tensor("w", DType::Int8, &[8], &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    w.finish().unwrap();
    let mut bytes = fs::read(&path).unwrap();
    let i = bytes.len() - 20;
    bytes[i] ^= 0x40; // a tensor byte
    fs::write(&path, &bytes).unwrap();
    let e = open_err(&path);
    assert!(matches!(e, CheckpointError::BadCrc { .. }), "{e:?}");
    assert!(e.to_string().contains("CRC"));
    // unknown dtype: MindSpore's qint4x2
    let msg = pb::Checkpoint {
        value: vec![pb::checkpoint::Value {
            tag: "q".into(),
            value: Some(pb::checkpoint::value::Value::Tensor(pb::TensorProto {
                dims: vec![2],
                tensor_type: "Int4".into(),
                tensor_content: vec![0],
            })),
        }],
    };
    fs::write(&path, msg.encode_to_vec()).unwrap();
    let e = open_err(&path);
    assert!(matches!(&e, CheckpointError::UnknownDtype { dtype, tensor, .. } if dtype == "Int4" && tensor == "q"), "{e:?}");
    // content length disagreeing with dims
    let msg = pb::Checkpoint {
        value: vec![pb::checkpoint::Value {
            tag: "w".into(),
            value: Some(pb::checkpoint::value::Value::Tensor(pb::TensorProto {
                dims: vec![2, 2],
                tensor_type: "Float32".into(),
                tensor_content: vec![0; 12],
            })),
        }],
    };
    fs::write(&path, msg.encode_to_vec()).unwrap();
    assert!(matches!(open_err(&path), CheckpointError::TensorSize { expected: 16, actual: 12, .. }));
    // garbage
    fs::write(&path, [0xffu8; 64]).unwrap();
    let e = open_err(&path);
    assert!(e.to_string().contains("c.ckpt"), "{e}");
}

#[test]
fn corrupted_safetensors_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.safetensors");
    save(&path, &all_dtypes(), &BTreeMap::new()).unwrap();
    let good = fs::read(&path).unwrap();
    let bad = dir.path().join("bad.safetensors");
    // absurd header length
    let mut b = good.clone();
    b[..8].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
    fs::write(&bad, &b).unwrap();
    assert!(matches!(open_err(&bad), CheckpointError::HeaderTooLarge { .. }));
    // every truncation
    for n in 0..good.len() {
        fs::write(&bad, &good[..n]).unwrap();
        let e = open_err(&bad);
        assert!(matches!(e, CheckpointError::Truncated { .. }), "cut at {n}: {e:?}");
        assert!(e.to_string().contains("bad.safetensors"));
    }
    // unknown dtype, malformed JSON, wrong sizes
    let header = |json: &str| {
        let mut v = (json.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(json.as_bytes());
        v.extend_from_slice(&[0u8; 16]);
        v
    };
    fs::write(&bad, header(r#"{"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#)).unwrap();
    assert!(matches!(open_err(&bad), CheckpointError::UnknownDtype { .. }));
    fs::write(&bad, header(r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,4]}}"#)).unwrap();
    assert!(matches!(open_err(&bad), CheckpointError::TensorSize { expected: 16, actual: 4, .. }));
    fs::write(&bad, header(r#"{"w":{"dtype":"F32""#)).unwrap();
    assert!(matches!(open_err(&bad), CheckpointError::Malformed { .. }));
    fs::write(&bad, header(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#)).unwrap();
    assert!(matches!(open_err(&bad), CheckpointError::Malformed { .. }));
    // MindSpore's crc_num metadata
    let data = sample(DType::Float32, &[2], 9);
    let mut h = crc32fast::Hasher::new();
    h.update(b"w");
    h.update(&data);
    let mut meta = BTreeMap::new();
    let h_value = h.finalize().to_string();
    meta.insert("crc_num".to_string(), h_value.clone());
    let spec = TensorSpec { name: "w".into(), dtype: DType::Float32, shape: vec![2] };
    save_with(&path, &[(spec.clone(), data.clone())], &meta, false).unwrap();
    CheckpointFile::open(&path).unwrap();
    meta.insert("crc_num".to_string(), "12345".into());
    save_with(&path, &[(spec.clone(), data.clone())], &meta, false).unwrap();
    assert!(matches!(open_err(&path), CheckpointError::BadCrc { stored: 12345, .. }));
    // `save` writes the crc_num itself: a value flipped later fails the check.
    save(&path, &[(spec, data)], &BTreeMap::new()).unwrap();
    assert_eq!(CheckpointFile::open(&path).unwrap().metadata().get("crc_num").map(String::as_str), Some(h_value.as_str()));
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let e = open_err(&path);
    assert!(matches!(e, CheckpointError::BadCrc { .. }) && e.to_string().contains("s.safetensors fails its CRC check"), "{e}");
}

#[test]
fn corrupted_strategy_files_and_missing_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.ckpt");
    fs::write(&p, [0x0a, 0xff, 0xff, 0x01]).unwrap();
    let e = StrategyFile::load(&p).unwrap_err();
    assert!(matches!(e, CheckpointError::Decode { .. }) && e.to_string().contains("s.ckpt"), "{e}");
    let j = dir.path().join("s.json");
    fs::write(&j, "{\"parallel_layout_item\": {\"w\": {\"dev_matrix\": [2]}}}").unwrap();
    let e = StrategyFile::load(&j).unwrap_err();
    assert!(e.to_string().contains("tensor_map"), "{e}");
    fs::write(&j, "{not json").unwrap();
    assert!(matches!(StrategyFile::load(&j), Err(CheckpointError::Decode { .. })));
    assert!(matches!(StrategyFile::load(dir.path().join("nope.ckpt")), Err(CheckpointError::NotFound { .. })));
    assert!(matches!(CheckpointFile::open(dir.path().join("nope.ckpt")), Err(CheckpointError::NotFound { .. })));
    assert!(matches!(CheckpointFile::open(dir.path().join("x.bin")), Err(CheckpointError::UnknownFormat { .. })));
}

fn fixture_case(tmp: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let src = tmp.join("src");
    let case = common::transforms().join("ckpt_out_semi_train_optshard_to_out_dp4/src");
    for r in 0..8 {
        fs::create_dir_all(src.join(format!("rank_{r}"))).unwrap();
        fs::copy(case.join(format!("rank_{r}/net_{r}.ckpt")), src.join(format!("rank_{r}/net_{r}.ckpt"))).unwrap();
    }
    let s = common::strategies();
    (src, s.join("semi_train_optshard/strategy_rank0.ckpt"), s.join("dp4/strategy_rank0.ckpt"))
}

fn no_files_under(dir: &Path) -> bool {
    if !dir.exists() {
        return true;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                return false;
            }
        }
    }
    true
}

#[test]
fn a_missing_source_rank_is_named_with_the_destination_rank_and_path() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, s, d) = fixture_case(tmp.path());
    fs::remove_dir_all(src.join("rank_5")).unwrap();
    let out = tmp.path().join("out");
    let opts = TransformOptions { prefix: "net_".into(), ..Default::default() };
    let e = transform_checkpoints(&src, &out, Some(&s), Some(&d), &opts).unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("destination rank 0 needs source rank 5: "), "{text}");
    assert!(text.contains("rank_5"), "{text}");
    assert!(no_files_under(&out));
}

#[test]
fn a_corrupted_or_mismatched_source_fails_the_transform_without_partial_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, s, d) = fixture_case(tmp.path());
    let out = tmp.path().join("out");
    let opts = TransformOptions { prefix: "net_".into(), jobs: 2, ..Default::default() };
    // truncated source
    let f = src.join("rank_3/net_3.ckpt");
    let bytes = fs::read(&f).unwrap();
    fs::write(&f, &bytes[..bytes.len() - 100]).unwrap();
    let e = transform_checkpoints(&src, &out, Some(&s), Some(&d), &opts).unwrap_err();
    assert!(matches!(e, CheckpointError::Truncated { .. }) && e.to_string().contains("net_3.ckpt"), "{e}");
    assert!(no_files_under(&out));
    fs::write(&f, &bytes).unwrap();
    // a checkpoint saved under another strategy: shapes disagree with the source strategy
    let e = transform_checkpoints(&src, &out, Some(&d), Some(&s), &opts).unwrap_err();
    assert!(
        matches!(e, CheckpointError::ShapeMismatch { .. } | CheckpointError::MissingRank { .. } | CheckpointError::NotDivisible { .. }),
        "{e:?}"
    );
    // a protobuf strategy without optimizer sharding: the slices' shapes agree with it, but the
    // ranks it says are replicas hold different optimizer shards
    let semi = common::strategies().join("semi_train/strategy_rank0.ckpt");
    let e = transform_checkpoints(&src, &out, Some(&semi), Some(&d), &opts).unwrap_err();
    assert!(matches!(&e, CheckpointError::ReplicasDiffer { .. } | CheckpointError::NotDivisible { .. }), "{e:?}");
    let e = transform_checkpoints(&src, &out, Some(&semi), None, &opts).unwrap_err();
    assert!(matches!(&e, CheckpointError::ReplicasDiffer { .. }), "{e:?}");
    assert!(e.to_string().contains("hint: the checkpoint was saved under another strategy"), "{e}");
    assert!(no_files_under(&out));
    // a JSON strategy whose full shape disagrees with the checkpoint's slices
    let mut wrong = StrategyFile::load(&s).unwrap();
    for l in &mut wrong.layout_items {
        l.tensor_shape = Some(if l.name == "l1.w" { vec![64, 64] } else { vec![] });
    }
    wrong.layout_items.retain(|l| l.name == "l1.w");
    let wrong_path = tmp.path().join("wrong.json");
    wrong.save(&wrong_path).unwrap();
    let e = transform_checkpoints(&src, &out, Some(&wrong_path), Some(&d), &opts).unwrap_err();
    assert!(matches!(&e, CheckpointError::StrategyShapeMismatch { tensor, .. } if tensor == "l1.w"), "{e:?}");
    assert!(e.to_string().contains("[64, 64]") && e.to_string().contains("[64, 128]"), "{e}");
    assert!(no_files_under(&out));
    // a mixed folder
    save(&src.join("rank_0/extra.safetensors"), &[], &BTreeMap::new()).unwrap();
    assert!(matches!(transform_checkpoints(&src, &out, Some(&s), Some(&d), &opts), Err(CheckpointError::MixedCheckpointFormats { .. })));
}

#[test]
fn a_transform_into_its_own_source_is_refused_and_leaves_the_source_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, s, d) = fixture_case(tmp.path());
    let before: Vec<Vec<u8>> = (0..8).map(|r| fs::read(src.join(format!("rank_{r}/net_{r}.ckpt"))).unwrap()).collect();
    let opts = TransformOptions { prefix: "net_".into(), ..Default::default() };
    // The same folder, however it is spelled.
    for dst in [src.clone(), src.join("."), src.join("../src")] {
        let e = transform_checkpoints(&src, &dst, Some(&s), Some(&d), &opts).unwrap_err();
        assert!(matches!(e, CheckpointError::OverwritesSource { .. }), "{dst:?}: {e:?}");
        assert!(e.to_string().contains("would overwrite the checkpoints it reads"), "{e}");
    }
    // One destination rank written over one of its source files.
    let files: BTreeMap<usize, std::path::PathBuf> = (0..8).map(|r| (r, src.join(format!("rank_{r}/net_{r}.ckpt")))).collect();
    let e = transform_checkpoint_by_rank(0, &files, &src.join("rank_4/../rank_0/net_0.ckpt"), Some(&s), Some(&d), &opts).unwrap_err();
    assert!(matches!(e, CheckpointError::OverwritesSource { .. }), "{e:?}");
    for (r, b) in before.iter().enumerate() {
        assert!(fs::read(src.join(format!("rank_{r}/net_{r}.ckpt"))).unwrap() == *b, "rank {r}'s source changed");
    }
}

#[test]
fn splits_that_do_not_divide_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let spec = TensorSpec { name: "w".into(), dtype: DType::Float32, shape: vec![6, 4] };
    save(&src.join("rank_0/w.ckpt"), &[(spec, sample(DType::Float32, &[6, 4], 0))], &BTreeMap::new()).unwrap();
    let strat = StrategyFile::from_json(
        Path::new("d.json"),
        br#"{"current_stage":2,"parallel_layout_item":{"w":{"dev_matrix":[4],"field":0,"opt_weight_shard_size":0,"opt_weight_shard_step":0,"tensor_map":[0,-1]}},"parallel_strategy_item":{"MatMul_w":{"parallel_strategy":[[4,1]],"stage":0}}}"#,
    )
    .unwrap();
    let d = tmp.path().join("d.json");
    strat.save(&d).unwrap();
    let e = transform_checkpoints(&src, &tmp.path().join("out"), None, Some(&d), &TransformOptions::default()).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("\"w\"") && text.contains("not divisible"), "{text}");
}

#[test]
fn flipping_any_byte_of_a_checkpoint_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["ckpt", "safetensors"] {
        let good = dir.path().join(format!("good.{ext}"));
        let t = |n: &str, d: DType, shape: Vec<usize>| {
            let data = sample(d, &shape, 1);
            (TensorSpec { name: n.into(), dtype: d, shape }, data)
        };
        save(
            &good,
            &[t("a", DType::Float32, vec![2, 3]), t("b", DType::BFloat16, vec![4]), t("c", DType::Int64, vec![])],
            &BTreeMap::new(),
        )
        .unwrap();
        let bytes = fs::read(&good).unwrap();
        let bad = dir.path().join(format!("bad.{ext}"));
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                fs::write(&bad, &b).unwrap();
                if let Ok(f) = CheckpointFile::open(&bad) {
                    for e in f.tensors() {
                        let data = f.read(&e.name).unwrap();
                        assert_eq!(data.len() as u64, e.byte_len());
                    }
                }
            }
        }
    }
}
