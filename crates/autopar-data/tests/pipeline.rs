//! End-to-end: files written to a temp folder, opened by format detection, batched per shard.

use std::collections::BTreeMap;
use std::sync::Arc;

use autopar_data::{
    open, write_cifar10_file, write_mnist, write_tensor_dataset, DataError, DataLoader, Dataset, DatasetKind, LoaderConfig, ShardPadding,
    Split, SyntheticDataset, SyntheticTask, Transforms,
};
use proptest::prelude::*;

/// Writes `n` CIFAR records split over two training files; image `i` has every byte `i % 251`
/// except the top-left pixel, which holds `(i, i / 256, 7)`, and label `i % 10`.
fn cifar_dir(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let image = |i: usize| {
        let mut img = vec![(i % 251) as u8; 3072];
        img[..3].copy_from_slice(&[(i % 256) as u8, (i / 256) as u8, 7]);
        img
    };
    let half = n / 2;
    for (k, range) in [(1, 0..half), (2, half..n)] {
        let imgs: Vec<u8> = range.clone().flat_map(image).collect();
        let labels: Vec<u8> = range.map(|i| (i % 10) as u8).collect();
        write_cifar10_file(dir.path().join(format!("data_batch_{k}.bin")), &imgs, &labels).unwrap();
    }
    dir
}

fn all_batches(l: &DataLoader, epoch: u64) -> Vec<autopar_data::Batch> {
    l.epoch(epoch).collect::<Result<Vec<_>, _>>().unwrap()
}

#[test]
fn cifar_training_pipeline_yields_normalized_chw_batches_of_the_right_samples() {
    let dir = cifar_dir(40);
    let (kind, ds) = open(dir.path(), Split::Train).unwrap();
    assert_eq!(kind, DatasetKind::Cifar10);
    // eval transforms are deterministic: check values by hand
    let cfg = LoaderConfig { batch_size: 8, seed: 3, prefetch: 2, ..Default::default() };
    let l = DataLoader::new(ds.clone(), DatasetKind::Cifar10.default_transforms(Split::Test), cfg.clone()).unwrap();
    assert_eq!(l.sample_shape(), &[3, 32, 32]);
    let b = &all_batches(&l, 0)[1];
    assert_eq!(b.x_shape, vec![8, 3, 32, 32]);
    let s = b.indices[0];
    assert_eq!(b.y.as_ref().unwrap()[0], (s % 10) as i64);
    let norm = |v: f32, c: usize| (v / 255.0 - autopar_data::CIFAR10_MEAN[c]) / autopar_data::CIFAR10_STD[c];
    // channel 0 plane starts at 0, channel 2 plane at 2048; pixel (0,0) holds (s, s/256, 7)
    assert!((b.x[0] - norm(s as f32, 0)).abs() < 1e-5);
    assert!((b.x[2 * 1024] - norm(7.0, 2)).abs() < 1e-5);
    assert!((b.x[1] - norm((s % 251) as f32, 0)).abs() < 1e-5);

    // training transforms: random, but the same for the same (seed, epoch) and different across epochs
    let t = DataLoader::new(ds, Transforms::cifar10_train(), cfg).unwrap();
    assert_eq!(all_batches(&t, 2), all_batches(&t, 2));
    assert_ne!(all_batches(&t, 2)[0].x, all_batches(&t, 3)[0].x);
}

#[test]
fn mnist_gz_files_batch_as_one_channel_images() {
    let dir = tempfile::tempdir().unwrap();
    let images: Vec<u8> = (0..6 * 28 * 28).map(|i| (i % 256) as u8).collect();
    write_mnist(dir.path(), "t10k", &images, 28, 28, &[0, 1, 2, 3, 4, 5], true).unwrap();
    let (kind, ds) = open(dir.path(), Split::Test).unwrap();
    let cfg = LoaderConfig { batch_size: 4, shuffle: false, ..Default::default() };
    let l = DataLoader::new(ds, kind.default_transforms(Split::Test), cfg).unwrap();
    let bs = all_batches(&l, 0);
    assert_eq!(bs[0].x_shape, vec![4, 1, 28, 28]);
    assert_eq!(bs[1].y, Some(vec![4, 5]));
    let want = (((28 * 28 + 3) % 256) as f32 / 255.0 - 0.1307) / 0.3081;
    assert!((bs[0].x[28 * 28 + 3] - want).abs() < 1e-5);
}

#[test]
fn a_tensor_dataset_with_multi_dim_labels_batches_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("seq.safetensors");
    let x: Vec<f32> = (0..5 * 4).map(|v| v as f32).collect();
    let y: Vec<i64> = (0..5 * 4).collect();
    write_tensor_dataset(&p, &x, &[5, 4], Some((&y, &[5, 4])), Some(20)).unwrap();
    let (_, ds) = open(&p, Split::Train).unwrap();
    let l = DataLoader::new(ds, Transforms::new(), LoaderConfig { batch_size: 2, shuffle: false, ..Default::default() }).unwrap();
    let b = &all_batches(&l, 0)[2];
    assert_eq!((b.x_shape.clone(), b.y_shape.clone()), (vec![1, 4], vec![1, 4]));
    assert_eq!(b.y, Some(vec![16, 17, 18, 19]));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn sharded_loaders_cover_every_sample_exactly_once_per_epoch(
        len in 1usize..120, num_shards in 1usize..7, batch_size in 1usize..9, seed in any::<u64>(), epoch in 0u64..3, prefetch in 0usize..3
    ) {
        prop_assume!(len >= num_shards);
        let ds: Arc<dyn Dataset> = Arc::new(SyntheticDataset::new(SyntheticTask::Teacher { num_classes: 3, shape: vec![2] }, len, seed).unwrap());
        let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
        for shard_id in 0..num_shards {
            let cfg = LoaderConfig { batch_size, seed, num_shards, shard_id, prefetch, ..Default::default() };
            let l = DataLoader::new(ds.clone(), Transforms::new(), cfg).unwrap();
            let mut n = 0;
            for b in l.epoch(epoch) {
                let b = b.unwrap();
                prop_assert!(b.len() <= batch_size && !b.is_empty());
                n += 1;
                for (i, s) in b.indices.iter().enumerate() {
                    *seen.entry(*s).or_default() += 1;
                    // the batch row is the sample it names
                    prop_assert_eq!(&b.x[2 * i..2 * i + 2], &ds.get(*s).unwrap().0[..]);
                }
            }
            prop_assert_eq!(n, l.batches_per_epoch());
        }
        prop_assert_eq!(seen.len(), len);
        prop_assert!(seen.values().all(|&c| c == 1));
    }

    #[test]
    fn wrap_around_shards_give_every_rank_the_same_step_count(len in 1usize..100, num_shards in 1usize..7, batch_size in 1usize..5) {
        prop_assume!(len.div_ceil(num_shards) >= batch_size);
        let ds: Arc<dyn Dataset> = Arc::new(SyntheticDataset::new(SyntheticTask::Teacher { num_classes: 2, shape: vec![1] }, len, 0).unwrap());
        let steps: Vec<usize> = (0..num_shards).map(|shard_id| {
            let cfg = LoaderConfig { batch_size, num_shards, shard_id, drop_remainder: true, padding: ShardPadding::WrapAround, prefetch: 0, ..Default::default() };
            DataLoader::new(ds.clone(), Transforms::new(), cfg).unwrap().epoch(0).count()
        }).collect();
        prop_assert!(steps.iter().all(|&s| s == steps[0]), "{:?}", steps);
    }
}

#[test]
fn corrupted_files_are_rejected_at_open_with_the_file_named() {
    let dir = cifar_dir(4);
    let f = dir.path().join("data_batch_2.bin");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() - 1]).unwrap();
    let err = open(dir.path(), Split::Train).unwrap_err();
    assert!(matches!(err, DataError::TruncatedCifar { .. }));
    let msg = err.to_string();
    assert!(msg.contains("data_batch_2.bin") && msg.contains("6145 bytes") && msg.contains("hint:"), "{msg}");

    let mdir = tempfile::tempdir().unwrap();
    write_mnist(mdir.path(), "train", &[0; 8], 2, 2, &[1, 1], false).unwrap();
    let imgs = mdir.path().join("train-images-idx3-ubyte");
    let mut b = std::fs::read(&imgs).unwrap();
    b[2] = 0x42;
    std::fs::write(&imgs, b).unwrap();
    let err = open(mdir.path(), Split::Train).unwrap_err();
    assert!(matches!(err, DataError::IdxMagic { found: 0x4203, .. }), "{err}");
}
