//! A tensor dataset: a safetensors file with an `x` tensor (samples along dim 0, any float or
//! integer dtype, read as `f32`) and an optional `y` tensor of integer labels whose first
//! dimension matches. `__metadata__` may hold `num_classes`; without it the class count is the
//! largest label plus one, up to [`MAX_INFERRED_CLASSES`] (beyond it, none is inferred).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::error::{DataError, Result};
use crate::fsio;
use crate::Dataset;

/// The most classes inferred from a file's labels (a larger label is more likely a mistake than
/// a class: declare `num_classes` or pass it to the model).
pub const MAX_INFERRED_CLASSES: u64 = 1 << 20;

/// A dataset read from a safetensors file and held in memory.
#[derive(Debug, Clone)]
pub struct TensorDataset {
    path: PathBuf,
    x: Vec<f32>,
    sample_shape: Vec<usize>,
    y: Option<Vec<i64>>,
    label_shape: Vec<usize>,
    num_classes: Option<usize>,
    len: usize,
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1f) as i32;
    let frac = (h & 0x3ff) as f32;
    match exp {
        0 => sign * frac * 2f32.powi(-24),
        31 if frac == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + frac / 1024.0) * 2f32.powi(exp - 15),
    }
}

fn to_f32(path: &Path, dtype: Dtype, data: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::F64 => data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect(),
        _ => to_i64(path, "x", "f32", dtype, data)?.into_iter().map(|v| v as f32).collect(),
    })
}

fn to_i64(path: &Path, tensor: &'static str, wanted: &'static str, dtype: Dtype, data: &[u8]) -> Result<Vec<i64>> {
    Ok(match dtype {
        Dtype::U8 => data.iter().map(|&b| b as i64).collect(),
        Dtype::I8 => data.iter().map(|&b| b as i8 as i64).collect(),
        Dtype::I16 => data.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as i64).collect(),
        Dtype::U16 => data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect(),
        Dtype::I32 => data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
        Dtype::U32 => data.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
        Dtype::I64 => data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
        Dtype::U64 => {
            data.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")).min(i64::MAX as u64) as i64).collect()
        }
        other => return Err(DataError::UnsupportedDtype { path: path.to_path_buf(), tensor, dtype: format!("{other:?}"), wanted }),
    })
}

impl TensorDataset {
    /// Opens a safetensors file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = fsio::read(path)?;
        let st = SafeTensors::deserialize(&bytes).map_err(|source| DataError::Safetensors { path: path.to_path_buf(), source })?;
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|source| DataError::Safetensors { path: path.to_path_buf(), source })?;
        let names = || {
            let mut n: Vec<String> = st.names().into_iter().map(String::from).collect();
            n.sort();
            n
        };
        let xv = st.tensor("x").map_err(|_| DataError::MissingTensor { path: path.to_path_buf(), name: "x", found: names() })?;
        let x_shape = xv.shape().to_vec();
        if x_shape.is_empty() || x_shape[0] == 0 {
            return Err(DataError::BadTensorShape { path: path.to_path_buf(), shape: x_shape });
        }
        let x = to_f32(path, xv.dtype(), xv.data())?;
        let len = x_shape[0];
        let (y, label_shape) = match st.tensor("y") {
            Ok(yv) => {
                let y_shape = yv.shape().to_vec();
                if y_shape.first() != Some(&len) {
                    return Err(DataError::TensorShapeMismatch { path: path.to_path_buf(), x_shape, y_shape });
                }
                (Some(to_i64(path, "y", "i64 labels", yv.dtype(), yv.data())?), y_shape[1..].to_vec())
            }
            Err(_) => (None, vec![]),
        };
        let declared = meta.metadata().as_ref().and_then(|m| m.get("num_classes")).map(|v| {
            v.trim().parse::<usize>().map_err(|_| DataError::InvalidOption {
                param: "num_classes",
                value: v.clone(),
                expected: format!("a positive integer in the __metadata__ of {}", path.display()),
                hint: "write num_classes as a decimal string, or leave it out".into(),
            })
        });
        let declared = declared.transpose()?;
        let num_classes = match &y {
            None => None,
            Some(labels) => {
                let per = label_shape.iter().product::<usize>().max(1);
                if let Some((i, &l)) = labels.iter().enumerate().find(|(_, &l)| l < 0 || declared.is_some_and(|c| l as u64 >= c as u64)) {
                    let num_classes = declared.unwrap_or_else(|| labels.iter().copied().max().unwrap_or(0).max(0) as usize + 1);
                    return Err(DataError::LabelOutOfRange { path: path.to_path_buf(), index: i / per, label: l, num_classes });
                }
                // Inferred from the labels only up to a plausible class count: a larger label
                // is left to the model's class count, whose range check names it.
                declared.or_else(|| {
                    let classes = labels.iter().copied().max().unwrap_or(0) as u64 + 1;
                    (classes <= MAX_INFERRED_CLASSES).then_some(classes as usize)
                })
            }
        };
        Ok(TensorDataset { path: path.to_path_buf(), x, sample_shape: x_shape[1..].to_vec(), y, label_shape, num_classes, len })
    }
}

/// Writes a tensor dataset atomically: `x` as `f32` `x_shape`, `y` (if given) as `i64` with
/// shape `[n, ...]`, and `num_classes` in `__metadata__` when given.
pub fn write_tensor_dataset(
    path: impl AsRef<Path>,
    x: &[f32],
    x_shape: &[usize],
    y: Option<(&[i64], &[usize])>,
    num_classes: Option<usize>,
) -> Result<()> {
    let path = path.as_ref();
    let invalid = |param: &'static str, value: String, expected: String| DataError::InvalidOption {
        param,
        value,
        expected,
        hint: "the values must fill the shape exactly".into(),
    };
    if x.len() != x_shape.iter().product::<usize>() {
        return Err(invalid(
            "x",
            format!("{} values", x.len()),
            format!("{} values for shape {x_shape:?}", x_shape.iter().product::<usize>()),
        ));
    }
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let yb: Option<(Vec<u8>, Vec<usize>)> = match y {
        Some((yv, ys)) => {
            if yv.len() != ys.iter().product::<usize>() {
                return Err(invalid(
                    "y",
                    format!("{} values", yv.len()),
                    format!("{} values for shape {ys:?}", ys.iter().product::<usize>()),
                ));
            }
            Some((yv.iter().flat_map(|v| v.to_le_bytes()).collect(), ys.to_vec()))
        }
        None => None,
    };
    let st_err = |source| DataError::Safetensors { path: path.to_path_buf(), source };
    let mut tensors = vec![("x".to_string(), safetensors::tensor::TensorView::new(Dtype::F32, x_shape.to_vec(), &xb).map_err(st_err)?)];
    if let Some((b, s)) = &yb {
        tensors.push(("y".to_string(), safetensors::tensor::TensorView::new(Dtype::I64, s.clone(), b).map_err(st_err)?));
    }
    let meta = num_classes.map(|c| HashMap::from([("num_classes".to_string(), c.to_string())]));
    let bytes = safetensors::serialize(tensors, meta).map_err(st_err)?;
    fsio::write_atomic(path, &bytes)
}

impl Dataset for TensorDataset {
    fn name(&self) -> String {
        format!("tensor dataset {}", self.path.display())
    }
    fn len(&self) -> usize {
        self.len
    }
    fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }
    fn label_shape(&self) -> Option<&[usize]> {
        self.y.as_ref().map(|_| &self.label_shape[..])
    }
    fn num_classes(&self) -> Option<usize> {
        self.num_classes
    }
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> Result<()> {
        self.check_index(index)?;
        let n = self.sample_len();
        x.copy_from_slice(&self.x[index * n..(index + 1) * n]);
        if let Some(labels) = &self.y {
            let m = self.label_len();
            y.copy_from_slice(&labels[index * m..(index + 1) * m]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_parses_what_the_writer_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.safetensors");
        let x: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
        write_tensor_dataset(&p, &x, &[3, 2, 2], Some((&[2, 0, 1], &[3])), None).unwrap();
        let ds = TensorDataset::open(&p).unwrap();
        assert_eq!((ds.len(), ds.sample_shape(), ds.label_shape(), ds.num_classes()), (3, &[2usize, 2][..], Some(&[][..]), Some(3)));
        let (xs, ys) = ds.get(1).unwrap();
        assert_eq!(xs, vec![2.0, 2.5, 3.0, 3.5]);
        assert_eq!(ys, vec![0]);
    }

    #[test]
    fn labels_are_optional_and_num_classes_comes_from_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("u.safetensors");
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], None, None).unwrap();
        let ds = TensorDataset::open(&p).unwrap();
        assert_eq!((ds.label_shape(), ds.num_classes()), (None, None));
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], Some((&[0, 1], &[2])), Some(5)).unwrap();
        assert_eq!(TensorDataset::open(&p).unwrap().num_classes(), Some(5));
        // A label too large to be a class (2^40) infers no class count (a model of 2^40
        // outputs would not fit anywhere); the largest plausible one still does.
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], Some((&[0, 1 << 40], &[2])), None).unwrap();
        assert_eq!(TensorDataset::open(&p).unwrap().num_classes(), None);
        let last = MAX_INFERRED_CLASSES as i64 - 1;
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], Some((&[0, last], &[2])), None).unwrap();
        assert_eq!(TensorDataset::open(&p).unwrap().num_classes(), Some(MAX_INFERRED_CLASSES as usize));
    }

    #[test]
    fn other_dtypes_are_converted_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.safetensors");
        // f16: 1.0 = 0x3C00, -2.5 = 0xC100, smallest subnormal 0x0001; y as u8
        let xb: Vec<u8> = [0x3C00u16, 0xC100, 0x0001].iter().flat_map(|v| v.to_le_bytes()).collect();
        let yb = [4u8, 7, 1];
        let t = vec![
            ("x", safetensors::tensor::TensorView::new(Dtype::F16, vec![3], &xb).unwrap()),
            ("y", safetensors::tensor::TensorView::new(Dtype::U8, vec![3], &yb).unwrap()),
        ];
        std::fs::write(&p, safetensors::serialize(t, None).unwrap()).unwrap();
        let ds = TensorDataset::open(&p).unwrap();
        assert_eq!(ds.x, vec![1.0, -2.5, 2f32.powi(-24)]);
        assert_eq!(ds.y, Some(vec![4, 7, 1]));
        assert_eq!(ds.num_classes(), Some(8));
    }

    #[test]
    fn a_file_without_x_is_rejected_listing_its_tensors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("n.safetensors");
        let b = 1f32.to_le_bytes();
        let t = vec![("features", safetensors::tensor::TensorView::new(Dtype::F32, vec![1], &b).unwrap())];
        std::fs::write(&p, safetensors::serialize(t, None).unwrap()).unwrap();
        let err = TensorDataset::open(&p).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DataError::MissingTensor { name: "x", .. }), "{msg}");
        assert!(msg.contains("n.safetensors") && msg.contains("features"), "{msg}");
    }

    #[test]
    fn mismatched_labels_float_labels_and_out_of_range_labels_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], Some((&[0, 1, 1], &[3])), None).unwrap();
        assert!(matches!(TensorDataset::open(&p), Err(DataError::TensorShapeMismatch { .. })));
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], Some((&[0, -1], &[2])), None).unwrap();
        assert!(matches!(TensorDataset::open(&p), Err(DataError::LabelOutOfRange { index: 1, label: -1, .. })));
        write_tensor_dataset(&p, &[1.0, 2.0], &[2, 1], Some((&[0, 5], &[2])), Some(3)).unwrap();
        let err = TensorDataset::open(&p).unwrap_err();
        assert!(matches!(err, DataError::LabelOutOfRange { index: 1, label: 5, num_classes: 3, .. }), "{err}");
        let xb = 1f32.to_le_bytes();
        let yb = 1f32.to_le_bytes();
        let t = vec![
            ("x", safetensors::tensor::TensorView::new(Dtype::F32, vec![1], &xb).unwrap()),
            ("y", safetensors::tensor::TensorView::new(Dtype::F32, vec![1], &yb).unwrap()),
        ];
        std::fs::write(&p, safetensors::serialize(t, None).unwrap()).unwrap();
        let err = TensorDataset::open(&p).unwrap_err();
        assert!(matches!(err, DataError::UnsupportedDtype { tensor: "y", .. }), "{err}");
    }

    #[test]
    fn a_truncated_file_is_a_safetensors_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.safetensors");
        write_tensor_dataset(&p, &[1.0; 16], &[4, 4], None, None).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let err = TensorDataset::open(&p).unwrap_err();
        assert!(matches!(err, DataError::Safetensors { .. }), "{err}");
        assert!(err.to_string().contains("t.safetensors"));
    }
}
