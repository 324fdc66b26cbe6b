//! A view of some samples of another dataset (a quick run on part of CIFAR-10, a validation
//! split carved out of a training set).

use std::sync::Arc;

use crate::error::{DataError, Result};
use crate::Dataset;

/// The samples `indices` of `inner`, renumbered `0..indices.len()`.
#[derive(Debug, Clone)]
pub struct Subset {
    inner: Arc<dyn Dataset>,
    indices: Vec<usize>,
}

impl Subset {
    /// The given samples of `inner`, in the given order; every index must be a sample of `inner`.
    pub fn new(inner: Arc<dyn Dataset>, indices: Vec<usize>) -> Result<Self> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= inner.len()) {
            return Err(DataError::IndexOutOfRange { dataset: inner.name(), index: bad, len: inner.len() });
        }
        if indices.is_empty() {
            return Err(DataError::InvalidOption {
                param: "subset",
                value: "0 samples".into(),
                expected: "at least one sample".into(),
                hint: "pick a positive number of samples".into(),
            });
        }
        Ok(Subset { inner, indices })
    }

    /// The first `n` samples of `inner` (all of them when it has fewer).
    pub fn first(inner: Arc<dyn Dataset>, n: usize) -> Result<Self> {
        let n = n.min(inner.len());
        Subset::new(inner, (0..n).collect())
    }

    /// Samples `range` of `inner`, e.g. the last 5000 of CIFAR-10 train as a validation set.
    pub fn range(inner: Arc<dyn Dataset>, range: std::ops::Range<usize>) -> Result<Self> {
        Subset::new(inner, range.collect())
    }
}

impl Dataset for Subset {
    fn name(&self) -> String {
        format!("{} samples of {}", self.indices.len(), self.inner.name())
    }
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn sample_shape(&self) -> &[usize] {
        self.inner.sample_shape()
    }
    fn label_shape(&self) -> Option<&[usize]> {
        self.inner.label_shape()
    }
    fn num_classes(&self) -> Option<usize> {
        self.inner.num_classes()
    }
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> Result<()> {
        self.check_index(index)?;
        self.inner.read(self.indices[index], x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{SyntheticDataset, SyntheticTask};

    fn base() -> Arc<dyn Dataset> {
        Arc::new(SyntheticDataset::new(SyntheticTask::Teacher { num_classes: 3, shape: vec![4] }, 20, 1).unwrap())
    }

    #[test]
    fn a_subset_reads_the_samples_it_names() {
        let b = base();
        let s = Subset::range(b.clone(), 15..20).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.get(2).unwrap(), b.get(17).unwrap());
        assert_eq!(Subset::first(b.clone(), 100).unwrap().len(), 20);
        assert!(s.get(5).is_err());
    }

    #[test]
    fn indices_outside_the_dataset_and_empty_subsets_are_rejected() {
        let err = Subset::new(base(), vec![3, 20]).unwrap_err();
        assert!(matches!(err, DataError::IndexOutOfRange { index: 20, len: 20, .. }), "{err}");
        assert!(Subset::first(base(), 0).is_err());
    }
}
