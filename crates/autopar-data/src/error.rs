//! The crate's one error type. Every variant carries the facts (file, value, expected value); the
//! message is a first line, indented facts and one `hint:`.

use std::path::PathBuf;

/// Everything that can go wrong while opening, reading or iterating a dataset.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The data folder does not exist.
    #[error("data folder {} does not exist\nhint: pass the folder that holds the dataset files (e.g. cifar-10-batches-bin)", path.display())]
    MissingFolder {
        /// The folder that was given.
        path: PathBuf,
    },

    /// The data file does not exist.
    #[error("data file {} does not exist\nhint: check the path, or pass `synthetic` to train on generated data", path.display())]
    MissingFile {
        /// The file that was given.
        path: PathBuf,
    },

    /// The folder lacks the files of the dataset or split that was asked for.
    #[error("{dataset} files not found in {}\n  expected: {expected}\nhint: extract the dataset archive into this folder", dir.display())]
    MissingFiles {
        /// The dataset (and split) whose files are missing, in words.
        dataset: &'static str,
        /// The folder that was searched.
        dir: PathBuf,
        /// The file names that were expected, in words.
        expected: String,
    },

    /// The folder holds neither CIFAR-10 binary files nor MNIST IDX files.
    #[error("folder {} holds no dataset autopar can read\n  expected CIFAR-10 binary files (data_batch_1.bin .. data_batch_5.bin, test_batch.bin) or MNIST IDX files (train-images-idx3-ubyte[.gz], ...)\nhint: pass a CIFAR-10 or MNIST folder, a .safetensors file, or `synthetic`", dir.display())]
    UnknownFormat {
        /// The folder that was searched.
        dir: PathBuf,
    },

    /// A file could not be read.
    #[error("cannot read {}: {source}\nhint: check that the file exists and is readable", path.display())]
    Read {
        /// The file that was read.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A file could not be written.
    #[error("cannot write {}: {source}\nhint: check that the folder exists and is writable", path.display())]
    Write {
        /// The file that was written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A CIFAR-10 binary file is empty or not a whole number of records.
    #[error("CIFAR-10 file {} is truncated or corrupted\n  {len} bytes is not a whole number of {record}-byte records ({full} full records, {rest} bytes over)\nhint: extract cifar-10-binary.tar.gz again", path.display())]
    TruncatedCifar {
        /// The file that was read.
        path: PathBuf,
        /// The file's size in bytes.
        len: u64,
        /// The size of one record in bytes (label byte plus image).
        record: usize,
        /// Whole records in the file.
        full: u64,
        /// Bytes left over after the whole records.
        rest: u64,
    },

    /// A sample's label is negative or not below the number of classes.
    #[error("label out of range in {}\n  sample {index} has label {label}; labels must be in 0..{num_classes}\nhint: the file is corrupted or is not a {num_classes}-class dataset", path.display())]
    LabelOutOfRange {
        /// The file that was read.
        path: PathBuf,
        /// The sample, counted from 0 in the file.
        index: usize,
        /// The label that was found.
        label: i64,
        /// The number of classes; labels must be below it.
        num_classes: usize,
    },

    /// An IDX file starts with the wrong magic number.
    #[error("{} is not an IDX {what} file\n  magic number 0x{found:08x}, expected 0x{expected:08x}\nhint: pass the uncompressed or .gz file as distributed with MNIST", path.display())]
    IdxMagic {
        /// The file that was read.
        path: PathBuf,
        /// What the file should hold (e.g. `images`, `labels`).
        what: &'static str,
        /// The magic number in the file.
        found: u32,
        /// The magic number that was expected.
        expected: u32,
    },

    /// An IDX file's length does not match the size its header declares.
    #[error("IDX file {} has the wrong size\n  its header promises {expected} bytes ({dims:?} of {elem_size}-byte values after a {header}-byte header), the file holds {actual}\nhint: the file is truncated or corrupted; download it again", path.display())]
    IdxSize {
        /// The file that was read.
        path: PathBuf,
        /// The dimensions from the header (empty when the header itself is cut short).
        dims: Vec<usize>,
        /// Bytes per value.
        elem_size: usize,
        /// Header length in bytes (magic plus dimensions).
        header: usize,
        /// The file length in bytes the header implies (`u64::MAX` on overflow).
        expected: u64,
        /// The length in bytes of the file (after decompression for `.gz` files).
        actual: u64,
    },

    /// A gzip-compressed file could not be decompressed.
    #[error("cannot decompress {}: {source}\nhint: the .gz file is truncated or corrupted; download it again", path.display())]
    Gzip {
        /// The file that was read.
        path: PathBuf,
        /// The decompression error.
        source: std::io::Error,
    },

    /// The MNIST images file and labels file hold different numbers of samples.
    #[error("MNIST images and labels disagree\n  {} holds {images} images, {} holds {labels} labels\nhint: take both files from the same split (train or t10k)", images_path.display(), labels_path.display())]
    CountMismatch {
        /// The images file.
        images_path: PathBuf,
        /// Images in the images file.
        images: usize,
        /// The labels file.
        labels_path: PathBuf,
        /// Labels in the labels file.
        labels: usize,
    },

    /// A safetensors file could not be parsed.
    #[error("cannot parse safetensors file {}: {source}\nhint: the file is truncated or not a safetensors file", path.display())]
    Safetensors {
        /// The file that was read.
        path: PathBuf,
        /// The parser's error.
        source: safetensors::SafeTensorError,
    },

    /// A safetensors dataset lacks a required tensor.
    #[error("safetensors file {} has no tensor named `{name}`\n  tensors present: {found:?}\nhint: a tensor dataset needs `x` (samples along dim 0) and may have `y` (integer labels)", path.display())]
    MissingTensor {
        /// The file that was read.
        path: PathBuf,
        /// The tensor that is missing (`x`).
        name: &'static str,
        /// The names of the tensors the file holds.
        found: Vec<String>,
    },

    /// A safetensors tensor has a dtype the dataset cannot convert.
    #[error("tensor `{tensor}` in {} has dtype {dtype}, which a dataset cannot hold as {wanted}\nhint: store `x` as a float or integer tensor and `y` as an integer tensor", path.display())]
    UnsupportedDtype {
        /// The file that was read.
        path: PathBuf,
        /// The tensor's name (`x` or `y`).
        tensor: &'static str,
        /// The tensor's dtype, in words.
        dtype: String,
        /// What the tensor is converted to, in words (e.g. `i64 labels`).
        wanted: &'static str,
    },

    /// Tensors `x` and `y` of a safetensors dataset have different first dimensions.
    #[error("tensors `x` and `y` in {} disagree\n  x has shape {x_shape:?}, y has shape {y_shape:?}; both must have the same first dimension (the sample count)\nhint: store one label per sample in `y`", path.display())]
    TensorShapeMismatch {
        /// The file that was read.
        path: PathBuf,
        /// The shape of `x`.
        x_shape: Vec<usize>,
        /// The shape of `y`.
        y_shape: Vec<usize>,
    },

    /// Tensor `x` of a safetensors dataset is a scalar or holds no samples.
    #[error("tensor `x` in {} has shape {shape:?}\n  a dataset needs at least one dimension (the sample count) and at least one sample\nhint: stack the samples along dim 0", path.display())]
    BadTensorShape {
        /// The file that was read.
        path: PathBuf,
        /// The shape of `x`.
        shape: Vec<usize>,
    },

    /// A data option has a value outside its allowed range.
    #[error("invalid data option {param} = {value}\n  expected {expected}\nhint: {hint}")]
    InvalidOption {
        /// The option's name.
        param: &'static str,
        /// The value that was given, in words.
        value: String,
        /// What was expected, in words.
        expected: String,
        /// How to fix it.
        hint: String,
    },

    /// A shard would get no batch: it holds fewer samples than one batch and `drop_remainder` is on.
    #[error("shard {shard_id} of {num_shards} gets no batch from {dataset}\n  the shard holds {shard_len} samples, batch_size is {batch_size} with drop_remainder\nhint: lower the batch size or the number of shards, or turn off drop_remainder")]
    EmptyShard {
        /// The dataset, in words.
        dataset: String,
        /// Number of shards (data-parallel ranks).
        num_shards: usize,
        /// The empty shard, counted from 0.
        shard_id: usize,
        /// Samples in the shard.
        shard_len: usize,
        /// Samples per batch.
        batch_size: usize,
    },

    /// A transform in the pipeline cannot take the sample shape it would see.
    #[error("transform {transform} cannot take input shape {shape:?}\n  expected {expected}\nhint: {hint}")]
    TransformShape {
        /// The transform's name (e.g. `RandomCrop`).
        transform: &'static str,
        /// The sample shape the transform would get.
        shape: Vec<usize>,
        /// What was expected, in words.
        expected: String,
        /// How to fix it.
        hint: String,
    },

    /// A sample index is not below the dataset's length.
    #[error("sample {index} is out of range for {dataset} with {len} samples\nhint: indices run from 0 to len-1")]
    IndexOutOfRange {
        /// The dataset, in words.
        dataset: String,
        /// The index that was asked for.
        index: usize,
        /// Samples in the dataset.
        len: usize,
    },

    /// The background prefetch thread could not start, panicked or ended before its last batch.
    #[error("the prefetch thread stopped unexpectedly at epoch {epoch}, batch {batch}: {message}\nhint: run with prefetch 0 to see the failure on the calling thread")]
    PrefetchFailed {
        /// The epoch, counted from 0.
        epoch: u64,
        /// The batch at which it stopped, counted from 0 in the shard's epoch.
        batch: usize,
        /// What happened, in words.
        message: String,
    },
}

/// Short for `Result<T, DataError>`.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
