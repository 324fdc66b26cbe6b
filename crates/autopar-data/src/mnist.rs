//! MNIST in the IDX format, plain or gzip-compressed as distributed.
//!
//! An IDX file is a 4-byte magic `00 00 <type> <ndim>`, `ndim` big-endian `u32` dimensions, then
//! the values big-endian and row-major. MNIST images are type `0x08` (unsigned byte) with 3
//! dimensions (magic `0x00000803`), labels type `0x08` with 1 dimension (`0x00000801`). Samples come
//! out as MindSpore's `MnistDataset` gives them: HWC images `[28, 28, 1]` with values 0..=255.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::fsio;
use crate::{Dataset, Split};

/// Number of classes.
pub const NUM_CLASSES: usize = 10;

/// The element type of an IDX file (the third magic byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdxType {
    /// Unsigned byte (`0x08`).
    U8 = 0x08,
    /// Signed byte (`0x09`).
    I8 = 0x09,
    /// Big-endian `i16` (`0x0B`).
    I16 = 0x0B,
    /// Big-endian `i32` (`0x0C`).
    I32 = 0x0C,
    /// Big-endian `f32` (`0x0D`).
    F32 = 0x0D,
    /// Big-endian `f64` (`0x0E`).
    F64 = 0x0E,
}

impl IdxType {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }
}

/// A decoded IDX file: its type, dimensions and the raw big-endian values.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxArray {
    /// The element type.
    pub dtype: IdxType,
    /// The dimensions, outermost first.
    pub dims: Vec<usize>,
    /// The values as stored: big-endian, row-major.
    pub data: Vec<u8>,
}

impl IdxArray {
    /// The magic number this array is written with.
    pub fn magic(&self) -> u32 {
        ((self.dtype as u32) << 8) | self.dims.len() as u32
    }

    /// The values as `f64` (exact for every IDX type).
    pub fn to_f64(&self) -> Vec<f64> {
        let s = self.dtype.size();
        self.data
            .chunks_exact(s)
            .map(|c| match self.dtype {
                IdxType::U8 => c[0] as f64,
                IdxType::I8 => c[0] as i8 as f64,
                IdxType::I16 => i16::from_be_bytes([c[0], c[1]]) as f64,
                IdxType::I32 => i32::from_be_bytes([c[0], c[1], c[2], c[3]]) as f64,
                IdxType::F32 => f32::from_be_bytes([c[0], c[1], c[2], c[3]]) as f64,
                IdxType::F64 => f64::from_be_bytes(c.try_into().expect("chunk of 8")),
            })
            .collect()
    }
}

/// Reads an IDX file (gzip-compressed or not) and checks it against `expected_magic` when given.
pub fn read_idx(path: impl AsRef<Path>, what: &'static str, expected_magic: Option<u32>) -> Result<IdxArray> {
    let path = path.as_ref();
    let bytes = fsio::read_maybe_gz(path)?;
    let magic = if bytes.len() >= 4 { u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) } else { 0 };
    let dtype = if bytes.len() >= 4 && bytes[0] == 0 && bytes[1] == 0 { IdxType::from_code(bytes[2]) } else { None };
    let ndim = if bytes.len() >= 4 { bytes[3] as usize } else { 0 };
    let bad_magic = |expected: u32| DataError::IdxMagic { path: path.to_path_buf(), what, found: magic, expected };
    let dtype = match (dtype, expected_magic) {
        (Some(t), Some(e)) if magic == e => t,
        (_, Some(e)) => return Err(bad_magic(e)),
        (Some(t), None) if ndim > 0 => t,
        (_, None) => return Err(bad_magic(0x0000_0800 | ndim.max(1) as u32)),
    };
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(DataError::IdxSize {
            path: path.to_path_buf(),
            dims: vec![],
            elem_size: dtype.size(),
            header,
            expected: header as u64,
            actual: bytes.len() as u64,
        });
    }
    let dims: Vec<usize> =
        (0..ndim).map(|d| u32::from_be_bytes(bytes[4 + 4 * d..8 + 4 * d].try_into().expect("4 bytes")) as usize).collect();
    let count = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
    let expected = count.and_then(|c| c.checked_mul(dtype.size() as u64)).and_then(|b| b.checked_add(header as u64));
    if expected != Some(bytes.len() as u64) {
        return Err(DataError::IdxSize {
            path: path.to_path_buf(),
            dims,
            elem_size: dtype.size(),
            header,
            expected: expected.unwrap_or(u64::MAX),
            actual: bytes.len() as u64,
        });
    }
    Ok(IdxArray { dtype, dims, data: bytes[header..].to_vec() })
}

/// Writes an IDX file atomically; gzip-compressed when `gzip` is set.
pub fn write_idx(path: impl AsRef<Path>, array: &IdxArray, gzip: bool) -> Result<()> {
    let path = path.as_ref();
    let count: usize = array.dims.iter().product();
    if array.data.len() != count * array.dtype.size() || array.dims.len() > 255 {
        return Err(DataError::InvalidOption {
            param: "idx data",
            value: format!("{} bytes for dims {:?}", array.data.len(), array.dims),
            expected: format!("{} bytes", count * array.dtype.size()),
            hint: "pass big-endian values matching the dimensions".into(),
        });
    }
    let mut out = Vec::with_capacity(4 + 4 * array.dims.len() + array.data.len());
    out.extend_from_slice(&array.magic().to_be_bytes());
    for &d in &array.dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    out.extend_from_slice(&array.data);
    if gzip {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&out)
            .and_then(|_| enc.finish())
            .map(|b| out = b)
            .map_err(|source| DataError::Write { path: path.to_path_buf(), source })?;
    }
    fsio::write_atomic(path, &out)
}

/// Writes MNIST-style images `[n, rows, cols]` and labels (0..=9) as `<prefix>-images-idx3-ubyte` and
/// `<prefix>-labels-idx1-ubyte` in `dir` (with `.gz` when `gzip`); `prefix` is `train` or `t10k`.
pub fn write_mnist(dir: impl AsRef<Path>, prefix: &str, images: &[u8], rows: usize, cols: usize, labels: &[u8], gzip: bool) -> Result<()> {
    let dir = dir.as_ref();
    let gz = if gzip { ".gz" } else { "" };
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l as usize >= NUM_CLASSES) {
        let path = dir.join(format!("{prefix}-labels-idx1-ubyte{gz}"));
        return Err(DataError::LabelOutOfRange { path, index: i, label: l as i64, num_classes: NUM_CLASSES });
    }
    let imgs = IdxArray { dtype: IdxType::U8, dims: vec![labels.len(), rows, cols], data: images.to_vec() };
    write_idx(dir.join(format!("{prefix}-images-idx3-ubyte{gz}")), &imgs, gzip)?;
    let labs = IdxArray { dtype: IdxType::U8, dims: vec![labels.len()], data: labels.to_vec() };
    write_idx(dir.join(format!("{prefix}-labels-idx1-ubyte{gz}")), &labs, gzip)
}

/// MNIST held in memory as bytes.
#[derive(Debug, Clone)]
pub struct Mnist {
    images_path: PathBuf,
    split: Split,
    images: Vec<u8>,
    labels: Vec<u8>,
    shape: [usize; 3],
}

fn find(dir: &Path, prefix: &str, kind: &str, idx: &str) -> Option<PathBuf> {
    for sep in ["-", "."] {
        for gz in ["", ".gz"] {
            let p = dir.join(format!("{prefix}-{kind}{sep}{idx}-ubyte{gz}"));
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn prefix(split: Split) -> &'static str {
    match split {
        Split::Train => "train",
        Split::Test => "t10k",
    }
}

/// Whether `dir` holds MNIST IDX files of either split.
pub fn looks_like_mnist(dir: &Path) -> bool {
    ["train", "t10k"].iter().any(|p| find(dir, p, "images", "idx3").is_some())
}

impl Mnist {
    /// Opens the split in `dir` (`train-*` or `t10k-*` files, `-idx3-ubyte` or `.idx3-ubyte`, plain or `.gz`).
    pub fn open(dir: impl AsRef<Path>, split: Split) -> Result<Self> {
        let dir = dir.as_ref();
        fsio::require_dir(dir)?;
        let p = prefix(split);
        let missing = || DataError::MissingFiles {
            dataset: "MNIST",
            dir: dir.to_path_buf(),
            expected: format!("{p}-images-idx3-ubyte and {p}-labels-idx1-ubyte (or .gz)"),
        };
        let images_path = find(dir, p, "images", "idx3").ok_or_else(missing)?;
        let labels_path = find(dir, p, "labels", "idx1").ok_or_else(missing)?;
        Mnist::open_files(images_path, labels_path, split)
    }

    /// Opens an images file and a labels file.
    pub fn open_files(images_path: impl AsRef<Path>, labels_path: impl AsRef<Path>, split: Split) -> Result<Self> {
        let (images_path, labels_path) = (images_path.as_ref(), labels_path.as_ref());
        let imgs = read_idx(images_path, "images", Some(0x0000_0803))?;
        let labs = read_idx(labels_path, "labels", Some(0x0000_0801))?;
        if imgs.dims[0] != labs.dims[0] {
            return Err(DataError::CountMismatch {
                images_path: images_path.to_path_buf(),
                images: imgs.dims[0],
                labels_path: labels_path.to_path_buf(),
                labels: labs.dims[0],
            });
        }
        if let Some((i, &l)) = labs.data.iter().enumerate().find(|(_, &l)| l as usize >= NUM_CLASSES) {
            return Err(DataError::LabelOutOfRange {
                path: labels_path.to_path_buf(),
                index: i,
                label: l as i64,
                num_classes: NUM_CLASSES,
            });
        }
        Ok(Mnist {
            images_path: images_path.to_path_buf(),
            split,
            shape: [imgs.dims[1], imgs.dims[2], 1],
            images: imgs.data,
            labels: labs.data,
        })
    }

    /// The labels, one per sample.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }
}

impl Dataset for Mnist {
    fn name(&self) -> String {
        format!("MNIST {} ({})", self.split, self.images_path.display())
    }
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }
    fn label_shape(&self) -> Option<&[usize]> {
        Some(&[])
    }
    fn num_classes(&self) -> Option<usize> {
        Some(NUM_CLASSES)
    }
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> Result<()> {
        self.check_index(index)?;
        let n = self.shape.iter().product::<usize>();
        for (o, &b) in x.iter_mut().zip(&self.images[index * n..(index + 1) * n]) {
            *o = b as f32;
        }
        y[0] = self.labels[index] as i64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn images(n: usize) -> Vec<u8> {
        (0..n * 4 * 3).map(|i| (i * 7 % 256) as u8).collect()
    }

    #[test]
    fn reader_parses_what_the_writer_wrote_plain_and_gzipped() {
        for gzip in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            write_mnist(dir.path(), "train", &images(5), 4, 3, &[0, 9, 3, 3, 1], gzip).unwrap();
            assert!(looks_like_mnist(dir.path()));
            let ds = Mnist::open(dir.path(), Split::Train).unwrap();
            assert_eq!(ds.len(), 5);
            assert_eq!(ds.sample_shape(), &[4, 3, 1]);
            let mut x = vec![0f32; 12];
            let mut y = [0i64];
            ds.read(2, &mut x, &mut y).unwrap();
            assert_eq!(y[0], 3);
            assert_eq!(x[1], 175.0, "image 2, value 1 = byte 25 * 7");
        }
    }

    #[test]
    fn hand_written_idx_bytes_are_decoded_big_endian() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.idx");
        // int16, 1 dim of 2: values 258 and -2
        fs::write(&p, [0, 0, 0x0B, 1, 0, 0, 0, 2, 1, 2, 0xFF, 0xFE]).unwrap();
        let a = read_idx(&p, "values", None).unwrap();
        assert_eq!(a.dims, vec![2]);
        assert_eq!(a.to_f64(), vec![258.0, -2.0]);
    }

    #[test]
    fn the_dotted_file_names_of_some_mirrors_are_found() {
        let dir = tempfile::tempdir().unwrap();
        write_mnist(dir.path(), "t10k", &images(2), 4, 3, &[1, 2], false).unwrap();
        fs::rename(dir.path().join("t10k-images-idx3-ubyte"), dir.path().join("t10k-images.idx3-ubyte")).unwrap();
        assert_eq!(Mnist::open(dir.path(), Split::Test).unwrap().len(), 2);
    }

    #[test]
    fn wrong_magic_is_rejected_with_found_and_expected_values() {
        let dir = tempfile::tempdir().unwrap();
        write_mnist(dir.path(), "train", &images(2), 4, 3, &[1, 2], false).unwrap();
        // swap: labels file where images are expected
        let imgs = dir.path().join("train-images-idx3-ubyte");
        fs::copy(dir.path().join("train-labels-idx1-ubyte"), &imgs).unwrap();
        let err = Mnist::open(dir.path(), Split::Train).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::IdxMagic { found: 0x801, expected: 0x803, .. }), "{msg}");
        assert!(msg.contains("train-images-idx3-ubyte") && msg.contains("0x00000801") && msg.contains("0x00000803"), "{msg}");
    }

    #[test]
    fn a_truncated_idx_file_is_rejected_with_both_sizes() {
        let dir = tempfile::tempdir().unwrap();
        write_mnist(dir.path(), "train", &images(2), 4, 3, &[1, 2], false).unwrap();
        let p = dir.path().join("train-images-idx3-ubyte");
        let bytes = fs::read(&p).unwrap();
        fs::write(&p, &bytes[..bytes.len() - 5]).unwrap();
        let err = Mnist::open(dir.path(), Split::Train).unwrap_err();
        assert!(matches!(err, DataError::IdxSize { expected: 40, actual: 35, .. }), "{err}");
    }

    #[test]
    fn labels_out_of_range_and_count_mismatches_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        write_mnist(dir.path(), "train", &images(2), 4, 3, &[1, 10], false).unwrap_err();
        // the MNIST writer refuses the bad label; write it through the raw IDX writer
        let labs = IdxArray { dtype: IdxType::U8, dims: vec![2], data: vec![1, 10] };
        write_idx(dir.path().join("train-labels-idx1-ubyte"), &labs, false).unwrap();
        let imgs = IdxArray { dtype: IdxType::U8, dims: vec![2, 4, 3], data: images(2) };
        write_idx(dir.path().join("train-images-idx3-ubyte"), &imgs, false).unwrap();
        let err = Mnist::open(dir.path(), Split::Train).unwrap_err();
        assert!(matches!(err, DataError::LabelOutOfRange { index: 1, label: 10, .. }), "{err}");
        let labs = IdxArray { dtype: IdxType::U8, dims: vec![3], data: vec![1, 2, 3] };
        write_idx(dir.path().join("train-labels-idx1-ubyte"), &labs, false).unwrap();
        let err = Mnist::open(dir.path(), Split::Train).unwrap_err();
        assert!(matches!(err, DataError::CountMismatch { images: 2, labels: 3, .. }), "{err}");
    }

    #[test]
    fn a_missing_split_names_the_expected_files() {
        let dir = tempfile::tempdir().unwrap();
        let err = Mnist::open(dir.path(), Split::Test).unwrap_err();
        assert!(err.to_string().contains("t10k-images-idx3-ubyte"), "{err}");
    }
}
