//! autopar-data: datasets, per-rank sharding, augmentations and prefetching for training.
//!
//! # Shape of the API
//! A [`Dataset`] is random access to samples (`read(index)` into an `f32` buffer plus `i64`
//! labels). A [`DataLoader`] cuts one shard of it into [`Batch`]es (`x: Vec<f32>` with
//! `x_shape = [n, ...]`, `y: Option<Vec<i64>>`) per epoch, applying [`Transforms`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use autopar_data::{Cifar10, DataLoader, LoaderConfig, Split, Transforms};
//! let train = Arc::new(Cifar10::open("cifar-10-batches-bin", Split::Train)?);
//! let cfg = LoaderConfig { batch_size: 32, drop_remainder: true, num_shards: 8, shard_id: 3, seed: 1, ..Default::default() };
//! let loader = DataLoader::new(train, Transforms::cifar10_train(), cfg)?;
//! for epoch in 0..10 {
//!     for batch in loader.epoch(epoch) {
//!         let batch = batch?; // [32, 3, 32, 32] f32 and 32 labels
//!     }
//! }
//! # Ok::<(), autopar_data::DataError>(())
//! ```
//!
//! # Key decisions
//! - **Plain buffers, no tensor type.** Batches are `Vec<f32>` plus a shape, so this crate depends
//!   on nothing of autopar's and any executor can wrap them without a copy.
//! - **Datasets in memory, in their stored type.** CIFAR-10 and MNIST stay as bytes (150 MB for
//!   CIFAR-10 train) and become `f32` one sample at a time: random access is free and no epoch
//!   reads the disk. Readers check everything up front (record sizes, IDX magic and sizes, label
//!   ranges, tensor names and shapes), so a bad file fails at open with its path and values.
//! - **Randomness keyed by purpose, not drawn in sequence.** The crate carries its own small
//!   generator (xoshiro256**). The epoch's permutation comes from `(seed, epoch)`; a sample's
//!   augmentation from `(seed, epoch, sample index)`; a synthetic sample from `(seed, index)`. So
//!   the data are bit-identical whatever the shard count, batch size, prefetching or crate
//!   versions, and a resumed run can start at any batch ([`DataLoader::epoch_from`]).
//! - **MindSpore's sharding.** Every shard shuffles the whole dataset identically and takes every
//!   `num_shards`-th position from `shard_id` ([`ShardSampler`]). Every sample is seen exactly once
//!   per epoch across shards, and the shards' `j`-th batches together are the `j`-th batch of a
//!   serial run with the global batch size, which is what makes data parallelism equal serial
//!   training. [`ShardPadding::WrapAround`] gives MindSpore's equal-size shards instead.
//! - **One prefetch thread, bounded.** With `prefetch > 0` a background thread prepares batches
//!   into a bounded channel; a read error or a panic there arrives as an `Err` item, and dropping
//!   the iterator stops and joins the thread.
//! - **Transforms checked before reading.** A [`Transforms`] list computes its output shape from
//!   the dataset's sample shape when the loader is built; a step that cannot apply fails then.

#![warn(missing_docs)]

mod cifar;
mod error;
mod fsio;
mod loader;
mod mnist;
mod rng;
mod sampler;
mod subset;
mod synthetic;
mod tensor;
mod transforms;

use std::path::Path;
use std::sync::Arc;

pub use cifar::{looks_like_cifar10, write_cifar10_file, Cifar10};
pub use error::{DataError, Result};
pub use fsio::write_atomic;
pub use loader::{Batch, Batches, DataLoader, LoaderConfig};
pub use mnist::{looks_like_mnist, read_idx, write_idx, write_mnist, IdxArray, IdxType, Mnist};
pub use rng::Rng;
pub use sampler::{ShardPadding, ShardSampler};
pub use subset::Subset;
pub use synthetic::{SyntheticDataset, SyntheticTask};
pub use tensor::{write_tensor_dataset, TensorDataset};
pub use transforms::{Layout, Scratch, Transform, Transforms, CIFAR10_MEAN, CIFAR10_STD, MNIST_MEAN_STD};

/// Constants of the CIFAR-10 binary format.
pub mod cifar10 {
    pub use crate::cifar::{CHANNELS, CLASS_NAMES, IMAGE_BYTES, NUM_CLASSES, RECORD_BYTES, SIDE};
}

/// Training or test part of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The training part (CIFAR-10's `data_batch_*.bin`, MNIST's `train-*` files).
    Train,
    /// The test part (CIFAR-10's `test_batch.bin`, MNIST's `t10k-*` files).
    Test,
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Test => "test",
        })
    }
}

/// Random access to the samples of a dataset.
pub trait Dataset: Send + Sync + std::fmt::Debug {
    /// What the dataset is and where it comes from, for messages.
    fn name(&self) -> String;
    /// Number of samples.
    fn len(&self) -> usize;
    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Shape of one sample (images: HWC).
    fn sample_shape(&self) -> &[usize];
    /// Shape of one sample's label (`[]` for one class index), `None` without labels.
    fn label_shape(&self) -> Option<&[usize]>;
    /// Number of classes, when labels are class indices.
    fn num_classes(&self) -> Option<usize>;
    /// Writes sample `index` into `x` (length [`Dataset::sample_len`]) and its label into `y`
    /// (length [`Dataset::label_len`]).
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> Result<()>;

    /// Values in one sample.
    fn sample_len(&self) -> usize {
        self.sample_shape().iter().product()
    }
    /// Values in one label (0 without labels).
    fn label_len(&self) -> usize {
        self.label_shape().map_or(0, |s| s.iter().product())
    }
    /// Sample `index` as new vectors.
    fn get(&self, index: usize) -> Result<(Vec<f32>, Vec<i64>)> {
        let mut x = vec![0.0; self.sample_len()];
        let mut y = vec![0; self.label_len()];
        self.read(index, &mut x, &mut y)?;
        Ok((x, y))
    }
    /// `Ok` when `index` is a sample of this dataset.
    fn check_index(&self, index: usize) -> Result<()> {
        if index < self.len() {
            Ok(())
        } else {
            Err(DataError::IndexOutOfRange { dataset: self.name(), index, len: self.len() })
        }
    }
}

/// The on-disk formats [`open`] recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetKind {
    /// CIFAR-10 binary (a folder, or one `.bin` file).
    Cifar10,
    /// MNIST IDX (a folder).
    Mnist,
    /// safetensors with `x` and optional `y` (a file, or a folder with `train`/`test.safetensors`).
    Tensor,
}

impl DatasetKind {
    /// Finds the format of `path`: a `.safetensors` file, a CIFAR-10 binary folder or an MNIST folder.
    pub fn detect(path: &Path) -> Result<Self> {
        if path.is_file() {
            let bin = path.extension().is_some_and(|e| e == "bin");
            return Ok(if bin { DatasetKind::Cifar10 } else { DatasetKind::Tensor });
        }
        if !path.exists() {
            let looks_like_file = path.extension().is_some_and(|e| e == "safetensors" || e == "bin");
            return Err(if looks_like_file {
                DataError::MissingFile { path: path.to_path_buf() }
            } else {
                DataError::MissingFolder { path: path.to_path_buf() }
            });
        }
        if looks_like_cifar10(path) {
            Ok(DatasetKind::Cifar10)
        } else if looks_like_mnist(path) {
            Ok(DatasetKind::Mnist)
        } else if path.join("train.safetensors").is_file() || path.join("test.safetensors").is_file() {
            Ok(DatasetKind::Tensor)
        } else {
            Err(DataError::UnknownFormat { dir: path.to_path_buf() })
        }
    }

    /// The usual transforms: the tutorial's augmentations for CIFAR-10 training, rescale and
    /// normalize to CHW for CIFAR-10 evaluation and MNIST, none for tensor datasets.
    pub fn default_transforms(self, split: Split) -> Transforms {
        match (self, split) {
            (DatasetKind::Cifar10, Split::Train) => Transforms::cifar10_train(),
            (DatasetKind::Cifar10, Split::Test) => Transforms::cifar10_eval(),
            (DatasetKind::Mnist, _) => Transforms::mnist(),
            (DatasetKind::Tensor, _) => Transforms::new(),
        }
    }
}

/// Opens the dataset at `path` (format from [`DatasetKind::detect`]): a CIFAR-10 or MNIST folder
/// (the split picks the files), one CIFAR-10 `.bin` file or one `.safetensors` file (either split
/// gives the file), or a folder with `train.safetensors` / `test.safetensors`.
pub fn open(path: impl AsRef<Path>, split: Split) -> Result<(DatasetKind, Arc<dyn Dataset>)> {
    let path = path.as_ref();
    let kind = DatasetKind::detect(path)?;
    let ds: Arc<dyn Dataset> = match kind {
        DatasetKind::Cifar10 if path.is_file() => Arc::new(Cifar10::open_file(path)?),
        DatasetKind::Cifar10 => Arc::new(Cifar10::open(path, split)?),
        DatasetKind::Mnist => Arc::new(Mnist::open(path, split)?),
        DatasetKind::Tensor if path.is_file() => Arc::new(TensorDataset::open(path)?),
        DatasetKind::Tensor => Arc::new(TensorDataset::open(path.join(format!("{split}.safetensors")))?),
    };
    Ok((kind, ds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_detects_each_format_and_names_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("c");
        std::fs::create_dir(&c).unwrap();
        write_cifar10_file(c.join("test_batch.bin"), &[0; 3072], &[4]).unwrap();
        let (kind, ds) = open(&c, Split::Test).unwrap();
        assert_eq!((kind, ds.len()), (DatasetKind::Cifar10, 1));
        let m = dir.path().join("m");
        std::fs::create_dir(&m).unwrap();
        write_mnist(&m, "train", &[0; 8], 2, 2, &[1, 2], true).unwrap();
        assert_eq!(open(&m, Split::Train).unwrap().0, DatasetKind::Mnist);
        let t = dir.path().join("t.safetensors");
        write_tensor_dataset(&t, &[0.0; 4], &[2, 2], None, None).unwrap();
        assert_eq!(open(&t, Split::Train).unwrap().0, DatasetKind::Tensor);
        assert_eq!(open(c.join("test_batch.bin"), Split::Train).unwrap().0, DatasetKind::Cifar10);
        let tdir = dir.path().join("tdir");
        std::fs::create_dir(&tdir).unwrap();
        write_tensor_dataset(tdir.join("train.safetensors"), &[0.0; 6], &[3, 2], None, None).unwrap();
        assert_eq!(open(&tdir, Split::Train).unwrap().1.len(), 3);
        let err = open(&tdir, Split::Test).unwrap_err();
        assert!(matches!(err, DataError::MissingFile { .. }) && err.to_string().contains("test.safetensors"), "{err}");

        let err = open(dir.path().join("nope"), Split::Train).unwrap_err();
        assert!(matches!(err, DataError::MissingFolder { .. }) && err.to_string().contains("nope"), "{err}");
        let err = open(dir.path().join("nope.safetensors"), Split::Train).unwrap_err();
        assert!(matches!(err, DataError::MissingFile { .. }), "{err}");
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(matches!(open(&empty, Split::Train), Err(DataError::UnknownFormat { .. })));
    }
}
