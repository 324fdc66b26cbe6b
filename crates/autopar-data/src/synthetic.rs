//! Seeded synthetic data that models can learn, generated per sample on demand (no memory
//! beyond the task's parameters; sample `i` is a pure function of `(seed, i)`).
//!
//! - [`SyntheticTask::Clusters`]: one Gaussian centre per class (entries ~ N(0, 1)); a sample is
//!   its class's centre plus N(0, noise^2) per entry. Classes are balanced on average.
//! - [`SyntheticTask::Teacher`]: `x ~ N(0, 1)`, label = argmax of a fixed random linear map `W x`.
//! - [`SyntheticTask::Tokens`]: token sequences from a random successor table: each next token is
//!   the current token's successor with probability `1 - noise`, else uniform. `x` holds the first
//!   `seq_len` token ids (as exact `f32`), the label the `seq_len` next tokens (language modelling).

use crate::error::{DataError, Result};
use crate::rng::{Rng, Stream};
use crate::Dataset;

/// What a synthetic dataset generates.
#[derive(Debug, Clone, PartialEq)]
pub enum SyntheticTask {
    /// Gaussian clusters, one per class.
    Clusters {
        /// Number of classes.
        num_classes: usize,
        /// Shape of one sample.
        shape: Vec<usize>,
        /// Standard deviation of the noise added to each entry.
        noise: f32,
    },
    /// Labels from a random linear teacher.
    Teacher {
        /// Number of classes.
        num_classes: usize,
        /// Shape of one sample.
        shape: Vec<usize>,
    },
    /// Next-token prediction on sequences with learnable successor structure.
    Tokens {
        /// Number of token ids.
        vocab: usize,
        /// Tokens per sample (input and label alike).
        seq_len: usize,
        /// Probability that a token is drawn uniformly instead of being the successor.
        noise: f32,
    },
}

/// A synthetic dataset.
#[derive(Debug, Clone)]
pub struct SyntheticDataset {
    task: SyntheticTask,
    len: usize,
    seed: u64,
    sample_shape: Vec<usize>,
    label_shape: Vec<usize>,
    /// Cluster centres `[classes, d]`, teacher weights `[classes, d]` or the successor table.
    params: Vec<f32>,
    successor: Vec<u32>,
}

/// `a . b` in eight interleaved partial sums (vector code).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn positive(param: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(DataError::InvalidOption {
            param,
            value: "0".into(),
            expected: "a positive number".into(),
            hint: format!("set {param} to at least 1"),
        });
    }
    Ok(())
}

impl SyntheticDataset {
    /// `len` samples of `task`, all determined by `seed`.
    pub fn new(task: SyntheticTask, len: usize, seed: u64) -> Result<Self> {
        positive("len", len)?;
        let mut prng = Rng::keyed(Stream::SyntheticParams, &[seed]);
        let (sample_shape, label_shape, params, successor) = match &task {
            SyntheticTask::Clusters { num_classes, shape, noise } => {
                positive("num_classes", *num_classes)?;
                let d: usize = shape.iter().product();
                positive("sample size", d)?;
                if !(noise.is_finite() && *noise >= 0.0) {
                    return Err(DataError::InvalidOption {
                        param: "noise",
                        value: noise.to_string(),
                        expected: "a finite number >= 0".into(),
                        hint: "1.0 gives clusters that overlap a little in few dimensions".into(),
                    });
                }
                let centres = (0..num_classes * d).map(|_| prng.normal() as f32).collect();
                (shape.clone(), vec![], centres, vec![])
            }
            SyntheticTask::Teacher { num_classes, shape } => {
                positive("num_classes", *num_classes)?;
                let d: usize = shape.iter().product();
                positive("sample size", d)?;
                let scale = 1.0 / (d as f64).sqrt();
                let w = (0..num_classes * d).map(|_| (prng.normal() * scale) as f32).collect();
                (shape.clone(), vec![], w, vec![])
            }
            SyntheticTask::Tokens { vocab, seq_len, noise } => {
                positive("vocab", *vocab)?;
                positive("seq_len", *seq_len)?;
                if *vocab > (1 << 24) {
                    return Err(DataError::InvalidOption {
                        param: "vocab",
                        value: vocab.to_string(),
                        expected: "at most 16777216 (token ids travel as exact f32)".into(),
                        hint: "use a smaller vocabulary".into(),
                    });
                }
                if !(0.0..=1.0).contains(noise) {
                    return Err(DataError::InvalidOption {
                        param: "noise",
                        value: noise.to_string(),
                        expected: "a probability in [0, 1]".into(),
                        hint: "0.1 leaves the successor structure easy to learn".into(),
                    });
                }
                let mut succ: Vec<u32> = (0..*vocab as u32).collect();
                prng.shuffle(&mut succ);
                (vec![*seq_len], vec![*seq_len], vec![], succ)
            }
        };
        Ok(SyntheticDataset { task, len, seed, sample_shape, label_shape, params, successor })
    }

    /// A classification set of `len` samples of `shape` in `num_classes` Gaussian clusters with
    /// unit noise: `[784]` for an MLP, `[3, 32, 32]` (CHW, no transforms needed) for a ResNet.
    pub fn classification(shape: &[usize], num_classes: usize, len: usize, seed: u64) -> Result<Self> {
        SyntheticDataset::new(SyntheticTask::Clusters { num_classes, shape: shape.to_vec(), noise: 1.0 }, len, seed)
    }

    /// A language-modelling set of `len` sequences of `seq_len` tokens over `vocab` ids, 10% noise.
    pub fn tokens(vocab: usize, seq_len: usize, len: usize, seed: u64) -> Result<Self> {
        SyntheticDataset::new(SyntheticTask::Tokens { vocab, seq_len, noise: 0.1 }, len, seed)
    }

    /// The task.
    pub fn task(&self) -> &SyntheticTask {
        &self.task
    }
}

impl Dataset for SyntheticDataset {
    fn name(&self) -> String {
        let what = match &self.task {
            SyntheticTask::Clusters { num_classes, .. } => format!("{num_classes}-class Gaussian clusters"),
            SyntheticTask::Teacher { num_classes, .. } => format!("{num_classes}-class linear teacher"),
            SyntheticTask::Tokens { vocab, .. } => format!("token sequences over {vocab} ids"),
        };
        format!("synthetic {what} (seed {})", self.seed)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }
    fn label_shape(&self) -> Option<&[usize]> {
        Some(&self.label_shape)
    }
    fn num_classes(&self) -> Option<usize> {
        Some(match &self.task {
            SyntheticTask::Clusters { num_classes, .. } | SyntheticTask::Teacher { num_classes, .. } => *num_classes,
            SyntheticTask::Tokens { vocab, .. } => *vocab,
        })
    }
    fn read(&self, index: usize, x: &mut [f32], y: &mut [i64]) -> Result<()> {
        self.check_index(index)?;
        let mut rng = Rng::keyed(Stream::SyntheticSample, &[self.seed, index as u64]);
        match &self.task {
            SyntheticTask::Clusters { num_classes, noise, .. } => {
                let c = rng.below(*num_classes as u64) as usize;
                let d = x.len();
                rng.fill_normal(x);
                for (o, &m) in x.iter_mut().zip(&self.params[c * d..(c + 1) * d]) {
                    *o = m + noise * *o;
                }
                y[0] = c as i64;
            }
            SyntheticTask::Teacher { num_classes, .. } => {
                rng.fill_normal(x);
                let d = x.len();
                let mut best = (f32::NEG_INFINITY, 0usize);
                for c in 0..*num_classes {
                    let s = dot(&self.params[c * d..(c + 1) * d], x);
                    if s > best.0 {
                        best = (s, c);
                    }
                }
                y[0] = best.1 as i64;
            }
            SyntheticTask::Tokens { vocab, seq_len, noise } => {
                let mut t = rng.below(*vocab as u64) as u32;
                for i in 0..=*seq_len {
                    if i < *seq_len {
                        x[i] = t as f32;
                    }
                    if i > 0 {
                        y[i - 1] = t as i64;
                    }
                    t = if rng.uniform() < *noise as f64 { rng.below(*vocab as u64) as u32 } else { self.successor[t as usize] };
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clusters() -> SyntheticDataset {
        SyntheticDataset::new(SyntheticTask::Clusters { num_classes: 4, shape: vec![16], noise: 0.5 }, 400, 11).unwrap()
    }

    #[test]
    fn a_sample_depends_only_on_seed_and_index() {
        let a = clusters();
        let b = clusters();
        assert_eq!(a.get(17).unwrap(), b.get(17).unwrap());
        assert_ne!(a.get(17).unwrap().0, a.get(18).unwrap().0);
        let c = SyntheticDataset::new(SyntheticTask::Clusters { num_classes: 4, shape: vec![16], noise: 0.5 }, 400, 12).unwrap();
        assert_ne!(a.get(17).unwrap().0, c.get(17).unwrap().0);
    }

    #[test]
    fn cluster_samples_are_nearest_to_their_own_centre() {
        let ds = clusters();
        let mut right = 0;
        for i in 0..ds.len() {
            let (x, y) = ds.get(i).unwrap();
            let dist = |c: usize| -> f32 { x.iter().zip(&ds.params[c * 16..(c + 1) * 16]).map(|(a, b)| (a - b) * (a - b)).sum() };
            let nearest = (0..4).min_by(|&a, &b| dist(a).total_cmp(&dist(b))).unwrap();
            right += (nearest as i64 == y[0]) as usize;
        }
        assert!(right > 390, "{right} of 400 nearest to their own centre");
    }

    #[test]
    fn teacher_labels_use_every_class() {
        let ds = SyntheticDataset::new(SyntheticTask::Teacher { num_classes: 3, shape: vec![2, 4] }, 300, 5).unwrap();
        let mut count = [0; 3];
        for i in 0..ds.len() {
            count[ds.get(i).unwrap().1[0] as usize] += 1;
        }
        assert!(count.iter().all(|&c| c > 30), "{count:?}");
    }

    #[test]
    fn a_linear_model_learns_the_teacher_task() {
        let (d, c) = (8, 3);
        let ds = SyntheticDataset::new(SyntheticTask::Teacher { num_classes: c, shape: vec![d] }, 600, 21).unwrap();
        let data: Vec<(Vec<f32>, usize)> = (0..ds.len()).map(|i| ds.get(i).map(|(x, y)| (x, y[0] as usize)).unwrap()).collect();
        let mut w = vec![0f32; c * d];
        let accuracy = |w: &[f32]| {
            let right = data
                .iter()
                .filter(|(x, y)| {
                    let s: Vec<f32> = (0..c).map(|k| w[k * d..(k + 1) * d].iter().zip(x).map(|(a, b)| a * b).sum()).collect();
                    (0..c).max_by(|&a, &b| s[a].total_cmp(&s[b])) == Some(*y)
                })
                .count();
            right as f32 / data.len() as f32
        };
        let before = accuracy(&w);
        for _ in 0..30 {
            for (x, y) in &data {
                let s: Vec<f32> = (0..c).map(|k| w[k * d..(k + 1) * d].iter().zip(x).map(|(a, b)| a * b).sum()).collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
                for k in 0..c {
                    let g = (s[k] - m).exp() / z - (k == *y) as u8 as f32;
                    for (wi, xi) in w[k * d..(k + 1) * d].iter_mut().zip(x) {
                        *wi -= 0.1 * g * xi;
                    }
                }
            }
        }
        let after = accuracy(&w);
        assert!(before < 0.6 && after > 0.9, "accuracy {before} -> {after}");
    }

    #[test]
    fn tokens_follow_their_successor_as_often_as_the_noise_allows() {
        let ds = SyntheticDataset::new(SyntheticTask::Tokens { vocab: 30, seq_len: 16, noise: 0.2 }, 200, 4).unwrap();
        let (mut hit, mut all) = (0, 0);
        for i in 0..ds.len() {
            let (x, y) = ds.get(i).unwrap();
            for (t, next) in x.iter().zip(&y) {
                hit += (ds.successor[*t as usize] as i64 == *next) as usize;
                all += 1;
            }
        }
        let rate = hit as f64 / all as f64;
        assert!((rate - (0.8 + 0.2 / 30.0)).abs() < 0.03, "successor rate {rate}");
    }

    #[test]
    fn token_labels_are_the_inputs_shifted_by_one() {
        let ds = SyntheticDataset::new(SyntheticTask::Tokens { vocab: 50, seq_len: 8, noise: 0.0 }, 10, 2).unwrap();
        let (x, y) = ds.get(3).unwrap();
        assert_eq!((x.len(), y.len()), (8, 8));
        for i in 0..7 {
            assert_eq!(x[i + 1] as i64, y[i]);
            assert_eq!(y[i], ds.successor[x[i] as usize] as i64);
        }
    }

    #[test]
    fn the_shortcuts_give_image_and_token_shapes() {
        let img = SyntheticDataset::classification(&[3, 32, 32], 10, 5, 0).unwrap();
        assert_eq!((img.sample_shape(), img.label_shape(), img.num_classes()), (&[3, 32, 32][..], Some(&[][..]), Some(10)));
        let tok = SyntheticDataset::tokens(100, 12, 5, 0).unwrap();
        assert_eq!((tok.sample_shape(), tok.label_shape(), tok.num_classes()), (&[12][..], Some(&[12][..]), Some(100)));
    }

    #[test]
    fn zero_classes_and_bad_noise_are_rejected() {
        let err = SyntheticDataset::new(SyntheticTask::Teacher { num_classes: 0, shape: vec![2] }, 3, 0).unwrap_err();
        assert!(err.to_string().contains("num_classes"), "{err}");
        let err = SyntheticDataset::new(SyntheticTask::Tokens { vocab: 5, seq_len: 3, noise: 2.0 }, 3, 0).unwrap_err();
        assert!(err.to_string().contains("noise"), "{err}");
    }
}
