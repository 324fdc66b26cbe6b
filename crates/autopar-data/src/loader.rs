//! Batching with per-rank sharding, seeded shuffling, augmentation and background prefetching.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{DataError, Result};
use crate::rng::{Rng, Stream};
use crate::sampler::{ShardPadding, ShardSampler};
use crate::transforms::{Scratch, Transforms};
use crate::Dataset;

/// How a [`DataLoader`] cuts a dataset into batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// Samples per batch on this rank.
    pub batch_size: usize,
    /// Reshuffle the samples every epoch (from `seed` and the epoch number).
    pub shuffle: bool,
    /// Seeds the shuffle and the random augmentations.
    pub seed: u64,
    /// Drop the last batch of an epoch when it is short.
    pub drop_remainder: bool,
    /// Number of data-parallel shards (ranks).
    pub num_shards: usize,
    /// This rank's shard.
    pub shard_id: usize,
    /// Exactly-once shards, or equal shards that wrap around.
    pub padding: ShardPadding,
    /// Batches prepared ahead on a background thread; 0 prepares each on the caller's thread.
    pub prefetch: usize,
    /// Read only these rows of each batch (a parallel rank's part of the global batch); the
    /// batch count and every batch's samples are those of the whole batches. `None`: all rows.
    pub rows: Option<std::ops::Range<usize>>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 32,
            shuffle: true,
            seed: 0,
            drop_remainder: false,
            num_shards: 1,
            shard_id: 0,
            padding: ShardPadding::None,
            prefetch: 2,
            rows: None,
        }
    }
}

impl LoaderConfig {
    /// Evaluation: the shard's samples in file order, the last short batch kept, so that the
    /// shards together score every sample exactly once.
    pub fn eval(batch_size: usize, num_shards: usize, shard_id: usize) -> Self {
        LoaderConfig { batch_size, shuffle: false, drop_remainder: false, num_shards, shard_id, ..LoaderConfig::default() }
    }
}

/// One batch: `x` is `x_shape = [n, ...sample shape]` row-major, `y` (if the dataset has labels)
/// is `y_shape = [n, ...label shape]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The samples, row-major, shape `x_shape`.
    pub x: Vec<f32>,
    /// Shape of `x`: `[n, ...sample shape]`.
    pub x_shape: Vec<usize>,
    /// The labels, row-major, shape `y_shape`; `None` when the dataset has no labels.
    pub y: Option<Vec<i64>>,
    /// Shape of `y`: `[n, ...label shape]`.
    pub y_shape: Vec<usize>,
    /// The dataset index of each sample.
    pub indices: Vec<usize>,
    /// The epoch the batch belongs to, counted from 0.
    pub epoch: u64,
    /// The batch's position in this shard's epoch.
    pub step: usize,
}

impl Batch {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch has no samples (never true for a batch a loader yields).
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

struct Inner {
    dataset: Arc<dyn Dataset>,
    transforms: Transforms,
    config: LoaderConfig,
    sampler: ShardSampler,
    out_shape: Vec<usize>,
}

/// Batches of one shard of a dataset, deterministic given `(seed, epoch, shard)`.
///
/// A sample's augmentation is drawn from `(seed, epoch, sample index)`, so it does not depend on
/// the shard layout, the batch size or prefetching. Cloning is cheap (shared state).
#[derive(Clone)]
pub struct DataLoader {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLoader")
            .field("dataset", &self.inner.dataset.name())
            .field("transforms", &self.inner.transforms)
            .field("config", &self.inner.config)
            .field("sample_shape", &self.inner.out_shape)
            .finish()
    }
}

impl DataLoader {
    /// Checks the configuration and the transforms against the dataset.
    pub fn new(dataset: Arc<dyn Dataset>, transforms: Transforms, config: LoaderConfig) -> Result<Self> {
        if config.batch_size == 0 {
            return Err(DataError::InvalidOption {
                param: "batch_size",
                value: "0".into(),
                expected: "at least 1".into(),
                hint: "the tutorial uses batch_size 32".into(),
            });
        }
        if let Some(r) = &config.rows {
            if r.start >= r.end || r.end > config.batch_size {
                return Err(DataError::InvalidOption {
                    param: "rows",
                    value: format!("{r:?}"),
                    expected: format!("a non-empty range of rows within the batch of {}", config.batch_size),
                    hint: "a rank reads the rows of each batch its inputs' layouts give it".into(),
                });
            }
        }
        let sampler = ShardSampler::new(dataset.len(), config.num_shards, config.shard_id, config.shuffle, config.seed, config.padding)?;
        let out_shape = transforms.output_shape(dataset.sample_shape())?;
        let loader = DataLoader { inner: Arc::new(Inner { dataset, transforms, config, sampler, out_shape }) };
        // Every shard must get a batch, or ranks would disagree on whether there is an epoch at all.
        let cfg = &loader.inner.config;
        for shard in 0..cfg.num_shards {
            if loader.batches_per_epoch_of(shard) == 0 {
                return Err(DataError::EmptyShard {
                    dataset: loader.inner.dataset.name(),
                    num_shards: cfg.num_shards,
                    shard_id: shard,
                    shard_len: loader.inner.sampler.shard_len_of(shard),
                    batch_size: cfg.batch_size,
                });
            }
        }
        Ok(loader)
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.inner.dataset
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.inner.config
    }

    /// The sampler (which samples this shard sees).
    pub fn sampler(&self) -> &ShardSampler {
        &self.inner.sampler
    }

    /// The transforms.
    pub fn transforms(&self) -> &Transforms {
        &self.inner.transforms
    }

    /// Shape of one sample after the transforms.
    pub fn sample_shape(&self) -> &[usize] {
        &self.inner.out_shape
    }

    /// Shape of one sample's label (`[]` for a class index), or `None` for an unlabelled dataset.
    pub fn label_shape(&self) -> Option<&[usize]> {
        self.inner.dataset.label_shape()
    }

    /// Number of classes, when the dataset has class labels.
    pub fn num_classes(&self) -> Option<usize> {
        self.inner.dataset.num_classes()
    }

    /// Batches this shard yields per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.batches_per_epoch_of(self.inner.config.shard_id)
    }

    /// Batches shard `shard` yields per epoch.
    pub fn batches_per_epoch_of(&self, shard: usize) -> usize {
        let n = self.inner.sampler.shard_len_of(shard);
        let b = self.inner.config.batch_size;
        if self.inner.config.drop_remainder {
            n / b
        } else {
            n.div_ceil(b)
        }
    }

    /// The fewest batches any shard yields per epoch: the step count at which data-parallel
    /// ranks that must stay in lockstep end an epoch.
    pub fn min_batches_per_epoch(&self) -> usize {
        (0..self.inner.config.num_shards).map(|s| self.batches_per_epoch_of(s)).min().unwrap_or(0)
    }

    /// The batches of `epoch` (counted from 0), prefetched when the configuration says so.
    pub fn epoch(&self, epoch: u64) -> Batches {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from batch `first` on (to resume in the middle of an epoch).
    pub fn epoch_from(&self, epoch: u64, first: usize) -> Batches {
        let end = self.batches_per_epoch();
        let first = first.min(end);
        if self.inner.config.prefetch == 0 {
            return Batches { state: State::Direct { work: Work::new(self.clone(), epoch), next: first, end } };
        }
        let (tx, rx) = mpsc::sync_channel(self.inner.config.prefetch);
        let stop = Arc::new(AtomicBool::new(false));
        let stop_w = Arc::clone(&stop);
        let loader = self.clone();
        let spawned = std::thread::Builder::new().name("autopar-data-prefetch".into()).spawn(move || {
            let mut work = Work::new(loader, epoch);
            for b in first..end {
                if stop_w.load(Ordering::Relaxed) {
                    return;
                }
                let item = work.batch(b);
                let failed = item.is_err();
                if tx.send(item).is_err() || failed {
                    return;
                }
            }
        });
        match spawned {
            Ok(handle) => Batches { state: State::Prefetch { rx: Some(rx), stop, handle: Some(handle), epoch, next: first, end } },
            Err(e) => Batches {
                state: State::Failed(Some(DataError::PrefetchFailed {
                    epoch,
                    batch: first,
                    message: format!("cannot start the prefetch thread: {e}"),
                })),
            },
        }
    }

    /// Batch `step` of `epoch` on this shard (computes the epoch's order; iterate with
    /// [`DataLoader::epoch`] to read many batches).
    pub fn batch(&self, epoch: u64, step: usize) -> Result<Batch> {
        if step >= self.batches_per_epoch() {
            return Err(DataError::InvalidOption {
                param: "step",
                value: step.to_string(),
                expected: format!("a batch in 0..{} of shard {}", self.batches_per_epoch(), self.inner.config.shard_id),
                hint: "the data hold fewer batches than that; check `batch_size` and `data`".into(),
            });
        }
        Work::new(self.clone(), epoch).batch(step)
    }
}

/// Builds batches of one epoch, keeping the epoch's order and scratch buffers.
struct Work {
    loader: DataLoader,
    epoch: u64,
    indices: Vec<usize>,
    raw: Vec<f32>,
    scratch: Scratch,
}

impl Work {
    fn new(loader: DataLoader, epoch: u64) -> Self {
        let indices = loader.inner.sampler.indices(epoch);
        let raw = vec![0.0; loader.inner.dataset.sample_len()];
        Work { loader, epoch, indices, raw, scratch: Scratch::default() }
    }

    fn batch(&mut self, step: usize) -> Result<Batch> {
        let inner = &self.loader.inner;
        let ds = &inner.dataset;
        let b = inner.config.batch_size;
        let whole = &self.indices[step * b..((step + 1) * b).min(self.indices.len())];
        let idx = match &inner.config.rows {
            Some(r) => &whole[r.start.min(whole.len())..r.end.min(whole.len())],
            None => whole,
        };
        let n = idx.len();
        let out_len: usize = inner.out_shape.iter().product();
        let label_len = ds.label_len();
        let has_labels = ds.label_shape().is_some();
        let mut x = vec![0.0f32; n * out_len];
        let mut y = vec![0i64; if has_labels { n * label_len } else { 0 }];
        let random = inner.transforms.is_random();
        let mut no_label: [i64; 0] = [];
        for (i, &sample) in idx.iter().enumerate() {
            let ys = if has_labels { &mut y[i * label_len..(i + 1) * label_len] } else { &mut no_label[..] };
            ds.read(sample, &mut self.raw, ys)?;
            let mut rng = if random { Rng::keyed(Stream::Augment, &[inner.config.seed, self.epoch, sample as u64]) } else { Rng::new(0) };
            inner.transforms.apply(&self.raw, ds.sample_shape(), &mut rng, &mut x[i * out_len..(i + 1) * out_len], &mut self.scratch)?;
        }
        let mut x_shape = vec![n];
        x_shape.extend_from_slice(&inner.out_shape);
        let mut y_shape = vec![n];
        y_shape.extend_from_slice(ds.label_shape().unwrap_or(&[]));
        Ok(Batch { x, x_shape, y: has_labels.then_some(y), y_shape, indices: idx.to_vec(), epoch: self.epoch, step })
    }
}

enum State {
    Direct {
        work: Work,
        next: usize,
        end: usize,
    },
    Prefetch {
        rx: Option<Receiver<Result<Batch>>>,
        stop: Arc<AtomicBool>,
        handle: Option<JoinHandle<()>>,
        epoch: u64,
        next: usize,
        end: usize,
    },
    Failed(Option<DataError>),
}

/// The batches of one epoch. Yields `Err` once and then ends when a sample cannot be read.
/// Dropping it stops the prefetch thread and waits for it.
pub struct Batches {
    state: State,
}

impl Iterator for Batches {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.state {
            State::Direct { work, next, end } => {
                if *next >= *end {
                    return None;
                }
                let item = work.batch(*next);
                *next = if item.is_err() { *end } else { *next + 1 };
                Some(item)
            }
            State::Prefetch { rx, handle, epoch, next, end, .. } => {
                let receiver = rx.as_ref()?;
                match receiver.recv() {
                    Ok(item) => {
                        *next += 1;
                        if item.is_err() {
                            *rx = None;
                        }
                        Some(item)
                    }
                    Err(_) => {
                        // The worker ended without sending every batch: it panicked.
                        *rx = None;
                        let joined = handle.take().map(|h| h.join());
                        match joined {
                            Some(Err(panic)) => {
                                let message = panic
                                    .downcast_ref::<String>()
                                    .cloned()
                                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                    .unwrap_or_else(|| "panic".into());
                                Some(Err(DataError::PrefetchFailed { epoch: *epoch, batch: *next, message }))
                            }
                            _ if *next < *end => Some(Err(DataError::PrefetchFailed {
                                epoch: *epoch,
                                batch: *next,
                                message: "the thread ended early".into(),
                            })),
                            _ => None,
                        }
                    }
                }
            }
            State::Failed(e) => e.take().map(Err),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.state {
            State::Direct { next, end, .. } => (0, Some(end - next)),
            State::Prefetch { next, end, rx, .. } => (0, Some(if rx.is_some() { end.saturating_sub(*next) } else { 0 })),
            State::Failed(e) => (0, Some(e.is_some() as usize)),
        }
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let State::Prefetch { rx, stop, handle, .. } = &mut self.state {
            stop.store(true, Ordering::Relaxed);
            drop(rx.take()); // a worker blocked in `send` wakes with an error
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{SyntheticDataset, SyntheticTask};
    use crate::tensor::TensorDataset;
    use crate::transforms::Transform;

    fn counting(len: usize) -> Arc<dyn Dataset> {
        // x = [i, i], y = i % 3, via a tensor dataset written to disk
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.safetensors");
        let x: Vec<f32> = (0..len).flat_map(|i| [i as f32, i as f32]).collect();
        let y: Vec<i64> = (0..len as i64).map(|i| i % 3).collect();
        crate::tensor::write_tensor_dataset(&p, &x, &[len, 2], Some((&y, &[len])), None).unwrap();
        Arc::new(TensorDataset::open(&p).unwrap())
    }

    fn cfg(batch_size: usize, num_shards: usize, shard_id: usize, prefetch: usize) -> LoaderConfig {
        LoaderConfig { batch_size, num_shards, shard_id, prefetch, seed: 5, ..LoaderConfig::default() }
    }

    fn collect(l: &DataLoader, epoch: u64) -> Vec<Batch> {
        l.epoch(epoch).collect::<Result<Vec<_>>>().unwrap()
    }

    #[test]
    fn batches_carry_the_samples_they_name_and_the_last_one_is_short() {
        let l = DataLoader::new(counting(10), Transforms::new(), cfg(4, 1, 0, 0)).unwrap();
        let bs = collect(&l, 0);
        assert_eq!(bs.iter().map(Batch::len).collect::<Vec<_>>(), vec![4, 4, 2]);
        for b in &bs {
            for (i, &s) in b.indices.iter().enumerate() {
                assert_eq!(&b.x[2 * i..2 * i + 2], &[s as f32, s as f32]);
                assert_eq!(b.y.as_ref().unwrap()[i], s as i64 % 3);
            }
        }
        assert_eq!(bs[2].x_shape, vec![2, 2]);
        assert_eq!(bs[2].y_shape, vec![2]);
    }

    #[test]
    fn drop_remainder_drops_the_short_batch() {
        let l = DataLoader::new(counting(10), Transforms::new(), LoaderConfig { drop_remainder: true, ..cfg(4, 1, 0, 0) }).unwrap();
        assert_eq!(l.batches_per_epoch(), 2);
        assert_eq!(collect(&l, 0).len(), 2);
    }

    #[test]
    fn prefetching_yields_the_same_batches_as_no_prefetching() {
        let ds: Arc<dyn Dataset> =
            Arc::new(SyntheticDataset::new(SyntheticTask::Clusters { num_classes: 3, shape: vec![6, 6, 3], noise: 1.0 }, 50, 1).unwrap());
        let t = Transforms::new()
            .then(Transform::RandomCrop { height: 6, width: 6, padding: [2; 4], fill: 0.0 })
            .then(Transform::RandomHorizontalFlip { prob: 0.5 })
            .then(Transform::HwcToChw);
        for shard in 0..2 {
            let plain = DataLoader::new(ds.clone(), t.clone(), cfg(7, 2, shard, 0)).unwrap();
            let pre = DataLoader::new(ds.clone(), t.clone(), cfg(7, 2, shard, 3)).unwrap();
            for epoch in 0..2 {
                assert_eq!(collect(&plain, epoch), collect(&pre, epoch));
            }
        }
    }

    #[test]
    fn augmentations_do_not_depend_on_shards_or_batch_size() {
        let ds: Arc<dyn Dataset> =
            Arc::new(SyntheticDataset::new(SyntheticTask::Teacher { num_classes: 2, shape: vec![4, 4, 1] }, 24, 3).unwrap());
        let t = Transforms::new().then(Transform::RandomCrop { height: 4, width: 4, padding: [1; 4], fill: 0.0 });
        let by_sample = |l: &DataLoader| {
            let mut m = std::collections::BTreeMap::new();
            for b in collect(l, 2) {
                for (i, s) in b.indices.iter().enumerate() {
                    m.insert(*s, b.x[i * 16..(i + 1) * 16].to_vec());
                }
            }
            m
        };
        let serial = by_sample(&DataLoader::new(ds.clone(), t.clone(), cfg(5, 1, 0, 0)).unwrap());
        let mut sharded = std::collections::BTreeMap::new();
        for s in 0..3 {
            sharded.extend(by_sample(&DataLoader::new(ds.clone(), t.clone(), cfg(3, 3, s, 1)).unwrap()));
        }
        assert_eq!(serial, sharded);
    }

    #[test]
    fn sharded_batches_together_equal_the_serial_batch_of_the_global_size() {
        let ds = counting(48);
        let serial = collect(&DataLoader::new(ds.clone(), Transforms::new(), cfg(12, 1, 0, 0)).unwrap(), 1);
        let shards: Vec<Vec<Batch>> =
            (0..4).map(|s| collect(&DataLoader::new(ds.clone(), Transforms::new(), cfg(3, 4, s, 0)).unwrap(), 1)).collect();
        for (j, global) in serial.iter().enumerate() {
            let mut want = global.indices.clone();
            let mut got: Vec<usize> = shards.iter().flat_map(|s| s[j].indices.clone()).collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(want, got, "global step {j}");
        }
    }

    #[test]
    fn resuming_mid_epoch_continues_with_the_same_batches() {
        let l = DataLoader::new(counting(20), Transforms::new(), cfg(3, 1, 0, 2)).unwrap();
        let all = collect(&l, 4);
        let rest: Vec<Batch> = l.epoch_from(4, 3).collect::<Result<_>>().unwrap();
        assert_eq!(&all[3..], &rest[..]);
        assert_eq!(l.batch(4, 5).unwrap(), all[5]);
        assert!(l.batch(4, 7).is_err());
    }

    #[test]
    fn dropping_a_prefetching_iterator_early_stops_its_thread() {
        let l = DataLoader::new(counting(100), Transforms::new(), cfg(1, 1, 0, 1)).unwrap();
        for _ in 0..20 {
            let mut it = l.epoch(0);
            assert!(it.next().unwrap().is_ok());
            drop(it); // joins the worker; a leak or hang would show as a stuck test
        }
    }

    #[derive(Debug)]
    struct FailsAt(usize);
    impl Dataset for FailsAt {
        fn name(&self) -> String {
            "fails".into()
        }
        fn len(&self) -> usize {
            10
        }
        fn sample_shape(&self) -> &[usize] {
            &[1]
        }
        fn label_shape(&self) -> Option<&[usize]> {
            None
        }
        fn num_classes(&self) -> Option<usize> {
            None
        }
        fn read(&self, index: usize, x: &mut [f32], _y: &mut [i64]) -> Result<()> {
            if index == self.0 {
                return Err(DataError::IndexOutOfRange { dataset: "fails".into(), index, len: 10 });
            }
            x[0] = index as f32;
            Ok(())
        }
    }

    #[test]
    fn a_read_error_reaches_the_caller_once_with_and_without_prefetch() {
        for prefetch in [0, 2] {
            let l = DataLoader::new(Arc::new(FailsAt(7)), Transforms::new(), LoaderConfig { shuffle: false, ..cfg(2, 1, 0, prefetch) })
                .unwrap();
            let items: Vec<Result<Batch>> = l.epoch(0).collect();
            assert_eq!(items.len(), 4, "three good batches, then the error, then the end");
            assert!(items[..3].iter().all(Result::is_ok));
            assert!(matches!(items[3], Err(DataError::IndexOutOfRange { index: 7, .. })));
            assert!(l.batch(0, 1).unwrap().y.is_none());
        }
    }

    #[test]
    fn a_panic_in_the_prefetch_thread_becomes_an_error() {
        struct Panics;
        impl std::fmt::Debug for Panics {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Panics")
            }
        }
        impl Dataset for Panics {
            fn name(&self) -> String {
                "panics".into()
            }
            fn len(&self) -> usize {
                4
            }
            fn sample_shape(&self) -> &[usize] {
                &[1]
            }
            fn label_shape(&self) -> Option<&[usize]> {
                None
            }
            fn num_classes(&self) -> Option<usize> {
                None
            }
            fn read(&self, index: usize, _x: &mut [f32], _y: &mut [i64]) -> Result<()> {
                if index == 3 {
                    panic!("sample 3 is cursed");
                }
                Ok(())
            }
        }
        let p = DataLoader::new(Arc::new(Panics), Transforms::new(), LoaderConfig { shuffle: false, ..cfg(1, 1, 0, 2) }).unwrap();
        let items: Vec<Result<Batch>> = p.epoch(0).collect();
        assert_eq!(items.len(), 4);
        let err = items[3].as_ref().unwrap_err();
        assert!(err.to_string().contains("sample 3 is cursed"), "{err}");
    }

    #[test]
    fn bad_options_and_empty_shards_are_rejected_with_the_values() {
        let err = DataLoader::new(counting(10), Transforms::new(), cfg(0, 1, 0, 0)).unwrap_err();
        assert!(err.to_string().contains("batch_size"), "{err}");
        let err = DataLoader::new(counting(10), Transforms::new(), LoaderConfig { drop_remainder: true, ..cfg(3, 4, 0, 0) }).unwrap_err();
        assert!(matches!(err, DataError::EmptyShard { shard_id: 2, shard_len: 2, batch_size: 3, .. }), "{err}");
        let err = DataLoader::new(counting(3), Transforms::new(), cfg(1, 4, 0, 0)).unwrap_err();
        assert!(matches!(err, DataError::EmptyShard { shard_id: 3, shard_len: 0, .. }), "{err}");
        let err = DataLoader::new(counting(3), Transforms::cifar10_train(), cfg(1, 1, 0, 0)).unwrap_err();
        assert!(matches!(err, DataError::TransformShape { .. }), "{err}");
    }

    #[test]
    fn lockstep_step_count_is_the_smallest_shard() {
        let l = DataLoader::new(counting(10), Transforms::new(), LoaderConfig { drop_remainder: true, ..cfg(2, 3, 0, 0) }).unwrap();
        // shards hold 4, 3, 3 samples
        assert_eq!((l.batches_per_epoch(), l.min_batches_per_epoch()), (2, 1));
    }
}
