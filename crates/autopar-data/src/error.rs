//! The crate's one error type. Every variant carries the facts (file, value, expected value); the
//! message is a first line, indented facts and one `hint:`.

use std::path::PathBuf;

/// Everything that can go wrong while opening, reading or iterating a dataset.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("data folder {} does not exist\nhint: pass the folder that holds the dataset files (e.g. cifar-10-batches-bin)", path.display())]
    MissingFolder { path: PathBuf },

    #[error("data file {} does not exist\nhint: check the path, or pass `synthetic` to train on generated data", path.display())]
    MissingFile { path: PathBuf },

    #[error("{dataset} files not found in {}\n  expected: {expected}\nhint: extract the dataset archive into this folder", dir.display())]
    MissingFiles { dataset: &'static str, dir: PathBuf, expected: String },

    #[error("folder {} holds no dataset autopar can read\n  expected CIFAR-10 binary files (data_batch_1.bin .. data_batch_5.bin, test_batch.bin) or MNIST IDX files (train-images-idx3-ubyte[.gz], ...)\nhint: pass a CIFAR-10 or MNIST folder, a .safetensors file, or `synthetic`", dir.display())]
    UnknownFormat { dir: PathBuf },

    #[error("cannot read {}: {source}\nhint: check that the file exists and is readable", path.display())]
    Read { path: PathBuf, source: std::io::Error },

    #[error("cannot write {}: {source}\nhint: check that the folder exists and is writable", path.display())]
    Write { path: PathBuf, source: std::io::Error },

    #[error("CIFAR-10 file {} is truncated or corrupted\n  {len} bytes is not a whole number of {record}-byte records ({full} full records, {rest} bytes over)\nhint: extract cifar-10-binary.tar.gz again", path.display())]
    TruncatedCifar { path: PathBuf, len: u64, record: usize, full: u64, rest: u64 },

    #[error("label out of range in {}\n  sample {index} has label {label}; labels must be in 0..{num_classes}\nhint: the file is corrupted or is not a {num_classes}-class dataset", path.display())]
    LabelOutOfRange { path: PathBuf, index: usize, label: i64, num_classes: usize },

    #[error("{} is not an IDX {what} file\n  magic number 0x{found:08x}, expected 0x{expected:08x}\nhint: pass the uncompressed or .gz file as distributed with MNIST", path.display())]
    IdxMagic { path: PathBuf, what: &'static str, found: u32, expected: u32 },

    #[error("IDX file {} has the wrong size\n  its header promises {expected} bytes ({dims:?} of {elem_size}-byte values after a {header}-byte header), the file holds {actual}\nhint: the file is truncated or corrupted; download it again", path.display())]
    IdxSize { path: PathBuf, dims: Vec<usize>, elem_size: usize, header: usize, expected: u64, actual: u64 },

    #[error("cannot decompress {}: {source}\nhint: the .gz file is truncated or corrupted; download it again", path.display())]
    Gzip { path: PathBuf, source: std::io::Error },

    #[error("MNIST images and labels disagree\n  {} holds {images} images, {} holds {labels} labels\nhint: take both files from the same split (train or t10k)", images_path.display(), labels_path.display())]
    CountMismatch { images_path: PathBuf, images: usize, labels_path: PathBuf, labels: usize },

    #[error("cannot parse safetensors file {}: {source}\nhint: the file is truncated or not a safetensors file", path.display())]
    Safetensors { path: PathBuf, source: safetensors::SafeTensorError },

    #[error("safetensors file {} has no tensor named `{name}`\n  tensors present: {found:?}\nhint: a tensor dataset needs `x` (samples along dim 0) and may have `y` (integer labels)", path.display())]
    MissingTensor { path: PathBuf, name: &'static str, found: Vec<String> },

    #[error("tensor `{tensor}` in {} has dtype {dtype}, which a dataset cannot hold as {wanted}\nhint: store `x` as a float or integer tensor and `y` as an integer tensor", path.display())]
    UnsupportedDtype { path: PathBuf, tensor: &'static str, dtype: String, wanted: &'static str },

    #[error("tensors `x` and `y` in {} disagree\n  x has shape {x_shape:?}, y has shape {y_shape:?}; both must have the same first dimension (the sample count)\nhint: store one label per sample in `y`", path.display())]
    TensorShapeMismatch { path: PathBuf, x_shape: Vec<usize>, y_shape: Vec<usize> },

    #[error("tensor `x` in {} has shape {shape:?}\n  a dataset needs at least one dimension (the sample count) and at least one sample\nhint: stack the samples along dim 0", path.display())]
    BadTensorShape { path: PathBuf, shape: Vec<usize> },

    #[error("invalid data option {param} = {value}\n  expected {expected}\nhint: {hint}")]
    InvalidOption { param: &'static str, value: String, expected: String, hint: String },

    #[error("shard {shard_id} of {num_shards} gets no batch from {dataset}\n  the shard holds {shard_len} samples, batch_size is {batch_size} with drop_remainder\nhint: lower the batch size or the number of shards, or turn off drop_remainder")]
    EmptyShard { dataset: String, num_shards: usize, shard_id: usize, shard_len: usize, batch_size: usize },

    #[error("transform {transform} cannot take input shape {shape:?}\n  expected {expected}\nhint: {hint}")]
    TransformShape { transform: &'static str, shape: Vec<usize>, expected: String, hint: String },

    #[error("sample {index} is out of range for {dataset} with {len} samples\nhint: indices run from 0 to len-1")]
    IndexOutOfRange { dataset: String, index: usize, len: usize },

    #[error("the prefetch thread stopped unexpectedly at epoch {epoch}, batch {batch}: {message}\nhint: run with prefetch 0 to see the failure on the calling thread")]
    PrefetchFailed { epoch: u64, batch: usize, message: String },
}

/// Short for `Result<T, DataError>`.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
