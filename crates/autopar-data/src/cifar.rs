//! CIFAR-10 binary format: files of 3073-byte records, one label byte (0..=9) followed by the
//! 32x32 image as 1024 red, 1024 green and 1024 blue bytes (row-major within each plane).
//!
//! The training split is every `data_batch_<k>.bin` in the folder (normally 1..=5, 10000 records
//! each), in `k` order; the test split is `test_batch.bin`. Samples come out as MindSpore's
//! `Cifar10Dataset` gives them: HWC images `[32, 32, 3]` with values 0..=255, and an `i64` label.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::fsio;
use crate::{Dataset, Split};

/// Image side length.
pub const SIDE: usize = 32;
/// Colour channels.
pub const CHANNELS: usize = 3;
/// Bytes of one image.
pub const IMAGE_BYTES: usize = SIDE * SIDE * CHANNELS;
/// Bytes of one record: one label byte and the image.
pub const RECORD_BYTES: usize = 1 + IMAGE_BYTES;
/// Number of classes.
pub const NUM_CLASSES: usize = 10;
/// The class names of `batches.meta.txt`.
pub const CLASS_NAMES: [&str; 10] = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"];

/// CIFAR-10 held in memory as HWC bytes.
#[derive(Debug, Clone)]
pub struct Cifar10 {
    dir: PathBuf,
    split: Split,
    images: Vec<u8>,
    labels: Vec<u8>,
    shape: [usize; 3],
}

impl Cifar10 {
    /// Opens the split in `dir`. `dir` may also be a folder holding `cifar-10-batches-bin`.
    pub fn open(dir: impl AsRef<Path>, split: Split) -> Result<Self> {
        let dir = resolve_dir(dir.as_ref())?;
        let files = split_files(&dir, split)?;
        let mut images = Vec::new();
        let mut labels = Vec::new();
        for f in &files {
            read_file_into(f, &mut images, &mut labels)?;
        }
        Ok(Cifar10 { dir, split, images, labels, shape: [SIDE, SIDE, CHANNELS] })
    }

    /// Reads one CIFAR-10 binary file.
    pub fn open_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let mut images = Vec::new();
        let mut labels = Vec::new();
        read_file_into(path, &mut images, &mut labels)?;
        let split = if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test")) { Split::Test } else { Split::Train };
        Ok(Cifar10 { dir: path.to_path_buf(), split, images, labels, shape: [SIDE, SIDE, CHANNELS] })
    }

    /// The labels, one per sample.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// Image `index` as HWC bytes.
    pub fn image(&self, index: usize) -> &[u8] {
        &self.images[index * IMAGE_BYTES..(index + 1) * IMAGE_BYTES]
    }
}

/// Whether `dir` (or its `cifar-10-batches-bin` subfolder) holds CIFAR-10 binary files.
pub fn looks_like_cifar10(dir: &Path) -> bool {
    let has = |d: &Path| d.join("test_batch.bin").is_file() || !train_files(d).unwrap_or_default().is_empty();
    has(dir) || has(&dir.join("cifar-10-batches-bin"))
}

fn resolve_dir(dir: &Path) -> Result<PathBuf> {
    fsio::require_dir(dir)?;
    let nested = dir.join("cifar-10-batches-bin");
    if nested.is_dir() && !looks_flat(dir) {
        return Ok(nested);
    }
    Ok(dir.to_path_buf())
}

fn looks_flat(dir: &Path) -> bool {
    dir.join("test_batch.bin").is_file() || !train_files(dir).unwrap_or_default().is_empty()
}

fn train_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|source| DataError::Read { path: dir.to_path_buf(), source })?;
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(k) = name.strip_prefix("data_batch_").and_then(|r| r.strip_suffix(".bin")).and_then(|k| k.parse::<u64>().ok()) {
            found.push((k, entry.path()));
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

fn split_files(dir: &Path, split: Split) -> Result<Vec<PathBuf>> {
    match split {
        Split::Train => {
            let files = train_files(dir)?;
            if files.is_empty() {
                return Err(DataError::MissingFiles {
                    dataset: "CIFAR-10 training",
                    dir: dir.to_path_buf(),
                    expected: "data_batch_1.bin .. data_batch_5.bin".into(),
                });
            }
            Ok(files)
        }
        Split::Test => {
            let f = dir.join("test_batch.bin");
            if !f.is_file() {
                return Err(DataError::MissingFiles {
                    dataset: "CIFAR-10 test",
                    dir: dir.to_path_buf(),
                    expected: "test_batch.bin".into(),
                });
            }
            Ok(vec![f])
        }
    }
}

fn read_file_into(path: &Path, images: &mut Vec<u8>, labels: &mut Vec<u8>) -> Result<()> {
    let bytes = fsio::read(path)?;
    let len = bytes.len() as u64;
    let rest = len % RECORD_BYTES as u64;
    if rest != 0 || bytes.is_empty() {
        return Err(DataError::TruncatedCifar {
            path: path.to_path_buf(),
            len,
            record: RECORD_BYTES,
            full: len / RECORD_BYTES as u64,
            rest,
        });
    }
    let n = bytes.len() / RECORD_BYTES;
    images.reserve(n * IMAGE_BYTES);
    labels.reserve(n);
    let plane = SIDE * SIDE;
    for (i, rec) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
        let label = rec[0];
        if label as usize >= NUM_CLASSES {
            return Err(DataError::LabelOutOfRange { path: path.to_path_buf(), index: i, label: label as i64, num_classes: NUM_CLASSES });
        }
        labels.push(label);
        let img = &rec[1..];
        for p in 0..plane {
            images.extend_from_slice(&[img[p], img[plane + p], img[2 * plane + p]]);
        }
    }
    Ok(())
}

/// Writes a CIFAR-10 binary file (atomically) from HWC images `[n, 32, 32, 3]` and labels 0..=9.
pub fn write_cifar10_file(path: impl AsRef<Path>, images_hwc: &[u8], labels: &[u8]) -> Result<()> {
    let path = path.as_ref();
    if images_hwc.len() != labels.len() * IMAGE_BYTES {
        return Err(DataError::InvalidOption {
            param: "images",
            value: format!("{} bytes", images_hwc.len()),
            expected: format!("{} bytes ({} labels x {IMAGE_BYTES})", labels.len() * IMAGE_BYTES, labels.len()),
            hint: "pass one 32x32x3 HWC image per label".into(),
        });
    }
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l as usize >= NUM_CLASSES) {
        return Err(DataError::LabelOutOfRange { path: path.to_path_buf(), index: i, label: l as i64, num_classes: NUM_CLASSES });
    }
    let plane = SIDE * SIDE;
    let mut out = Vec::with_capacity(labels.len() * RECORD_BYTES);
    for (i, &l) in labels.iter().enumerate() {
        out.push(l);
        let img = &images_hwc[i * IMAGE_BYTES..(i + 1) * IMAGE_BYTES];
        for c in 0..CHANNELS {
            out.extend((0..plane).map(|p| img[p * CHANNELS + c]));
        }
    }
    fsio::write_atomic(path, &out)
}

impl Dataset for Cifar10 {
    fn name(&self) -> String {
        format!("CIFAR-10 {} ({})", self.split, self.dir.display())
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
        for (o, &b) in x.iter_mut().zip(self.image(index)) {
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

    /// One record by hand: label 7, red plane all 1, green plane = pixel index % 256, blue 200.
    fn hand_record() -> Vec<u8> {
        let mut r = vec![7u8];
        r.extend(std::iter::repeat_n(1u8, 1024));
        r.extend((0..1024).map(|p| (p % 256) as u8));
        r.extend(std::iter::repeat_n(200u8, 1024));
        r
    }

    #[test]
    fn reader_turns_planar_records_into_hwc_images() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("test_batch.bin"), hand_record()).unwrap();
        let ds = Cifar10::open(dir.path(), Split::Test).unwrap();
        assert_eq!(ds.len(), 1);
        let mut x = vec![0f32; IMAGE_BYTES];
        let mut y = [0i64];
        ds.read(0, &mut x, &mut y).unwrap();
        assert_eq!(y[0], 7);
        // pixel (row 1, col 2) = planar index 34
        let p = 32 + 2;
        assert_eq!(&x[p * 3..p * 3 + 3], &[1.0, 34.0, 200.0]);
    }

    #[test]
    fn writer_and_reader_round_trip_every_training_file_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for k in 1..=3u8 {
            let images: Vec<u8> = (0..2 * IMAGE_BYTES).map(|i| (i as u8).wrapping_mul(k)).collect();
            write_cifar10_file(dir.path().join(format!("data_batch_{k}.bin")), &images, &[k, k + 1]).unwrap();
        }
        let ds = Cifar10::open(dir.path(), Split::Train).unwrap();
        assert_eq!(ds.labels(), &[1, 2, 2, 3, 3, 4]);
        assert_eq!(ds.image(5)[10], (IMAGE_BYTES as u8 + 10u8).wrapping_mul(3));
        assert!(looks_like_cifar10(dir.path()));
    }

    #[test]
    fn the_nested_cifar_folder_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("cifar-10-batches-bin");
        fs::create_dir(&nested).unwrap();
        fs::write(nested.join("test_batch.bin"), hand_record()).unwrap();
        assert_eq!(Cifar10::open(dir.path(), Split::Test).unwrap().len(), 1);
    }

    #[test]
    fn a_truncated_file_is_rejected_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = hand_record();
        bytes.extend(hand_record());
        bytes.truncate(RECORD_BYTES + 100);
        fs::write(dir.path().join("data_batch_1.bin"), bytes).unwrap();
        let err = Cifar10::open(dir.path(), Split::Train).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::TruncatedCifar { full: 1, rest: 100, .. }), "{msg}");
        assert!(msg.contains("data_batch_1.bin") && msg.contains("3173 bytes"), "{msg}");
    }

    #[test]
    fn a_label_above_nine_is_rejected_with_record_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = hand_record();
        let mut bad = hand_record();
        bad[0] = 12;
        bytes.extend(bad);
        fs::write(dir.path().join("test_batch.bin"), bytes).unwrap();
        let err = Cifar10::open(dir.path(), Split::Test).unwrap_err();
        assert!(matches!(err, DataError::LabelOutOfRange { index: 1, label: 12, num_classes: 10, .. }), "{err}");
        assert!(err.to_string().contains("test_batch.bin"));
    }

    #[test]
    fn a_missing_folder_and_missing_files_are_named() {
        let err = Cifar10::open("/nonexistent/cifar", Split::Train).unwrap_err();
        assert!(matches!(err, DataError::MissingFolder { .. }));
        assert!(err.to_string().contains("/nonexistent/cifar"));
        let dir = tempfile::tempdir().unwrap();
        let err = Cifar10::open(dir.path(), Split::Train).unwrap_err();
        assert!(err.to_string().contains("data_batch_1.bin"), "{err}");
        let err = Cifar10::open(dir.path(), Split::Test).unwrap_err();
        assert!(err.to_string().contains("test_batch.bin"), "{err}");
    }

    #[test]
    fn an_empty_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("test_batch.bin"), b"").unwrap();
        assert!(matches!(Cifar10::open(dir.path(), Split::Test), Err(DataError::TruncatedCifar { .. })));
    }
}
