//! Deterministic, counter-based random numbers: element `i` of a draw with seed `s` depends only
//! on `(s, i)`, so results are identical serially, in parallel and on any shard of the tensor.

use ndarray::{ArrayD, IxDyn};

use crate::{DType, Tensor};

/// SplitMix64 finaliser of `seed` and `index`.
pub fn hash(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uniform in `[0, 1)` with 53 random bits.
pub fn uniform01(seed: u64, index: u64) -> f64 {
    (hash(seed, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Standard normal (Box-Muller on two counter draws).
pub fn normal01(seed: u64, index: u64) -> f64 {
    let u1 = uniform01(seed, 2 * index).max(f64::MIN_POSITIVE);
    let u2 = uniform01(seed, 2 * index + 1);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn fill(shape: &[usize], dtype: DType, f: impl Fn(u64) -> f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n as u64).map(f).collect();
    Tensor::from_array(ArrayD::from_shape_vec(IxDyn(shape), v).expect("count")).cast(dtype)
}

/// Uniform in `[lo, hi)`.
pub fn uniform(shape: &[usize], lo: f64, hi: f64, seed: u64, dtype: DType) -> Tensor {
    fill(shape, dtype, |i| lo + (hi - lo) * uniform01(seed, i))
}

/// Normal with `mean`, `std`.
pub fn normal(shape: &[usize], mean: f64, std: f64, seed: u64, dtype: DType) -> Tensor {
    fill(shape, dtype, |i| mean + std * normal01(seed, i))
}

/// Normal with `mean`, `std`, redrawn until within two standard deviations.
pub fn truncated_normal(shape: &[usize], mean: f64, std: f64, seed: u64, dtype: DType) -> Tensor {
    fill(shape, dtype, |i| {
        let mut k = 0u64;
        loop {
            let z = normal01(seed.wrapping_add(k.wrapping_mul(0x5851_F42D_4C95_7F2D)), i);
            if z.abs() <= 2.0 {
                return mean + std * z;
            }
            k += 1;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_depend_only_on_seed_and_index() {
        let a = normal(&[1000], 0.0, 1.0, 3, DType::F64);
        assert!(a.bit_eq(&normal(&[1000], 0.0, 1.0, 3, DType::F64)));
        assert!(!a.bit_eq(&normal(&[1000], 0.0, 1.0, 4, DType::F64)));
        let v = a.to_vec::<f64>().unwrap();
        let mean = v.iter().sum::<f64>() / 1000.0;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 1000.0;
        assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.15, "mean {mean} var {var}");
        // A prefix of a larger draw equals the smaller draw.
        assert_eq!(
            uniform(&[10], 0.0, 1.0, 9, DType::F64).to_vec::<f64>().unwrap()[..],
            uniform(&[20], 0.0, 1.0, 9, DType::F64).to_vec::<f64>().unwrap()[..10]
        );
    }

    #[test]
    fn uniform_and_truncated_normal_stay_in_range() {
        assert!(uniform(&[500], -2.0, 3.0, 1, DType::F32).to_f64_vec().iter().all(|&x| (-2.0..3.0).contains(&x)));
        assert!(truncated_normal(&[500], 1.0, 0.5, 1, DType::F64).to_f64_vec().iter().all(|&x| (0.0..=2.0).contains(&x)));
    }
}
