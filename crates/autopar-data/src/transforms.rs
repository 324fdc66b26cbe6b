//! Per-sample transforms: the augmentations of MindSpore's CIFAR-10 tutorial (random crop with
//! padding, random horizontal flip, resize, rescale, normalize, HWC->CHW).
//!
//! Images enter as HWC (`[height, width, channels]`, as the readers give them) and stay HWC until
//! [`Transform::HwcToChw`]; the spatial transforms work in either layout. A [`Transforms`] list
//! checks every step against the shape it will see before any sample is read, so a bad pipeline
//! fails when the loader is built, not in the middle of an epoch. Random steps draw from the
//! generator of the sample (keyed by seed, epoch and global sample index) in list order.

use crate::error::{DataError, Result};
use crate::rng::Rng;

/// Where the channels are in a 3-D sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[height, width, channels]`.
    Hwc,
    /// `[channels, height, width]`.
    Chw,
}

/// One per-sample transform.
#[derive(Debug, Clone, PartialEq)]
pub enum Transform {
    /// Pads the image (`padding` = left, top, right, bottom, as MindSpore's `RandomCrop`) with
    /// `fill`, then cuts a `height` x `width` window at a uniformly drawn offset.
    RandomCrop {
        /// Output height in pixels.
        height: usize,
        /// Output width in pixels.
        width: usize,
        /// Padding in pixels: left, top, right, bottom.
        padding: [usize; 4],
        /// Value of the padded pixels.
        fill: f32,
    },
    /// Mirrors the image left-right with probability `prob`.
    RandomHorizontalFlip {
        /// Probability of mirroring, in `[0, 1]`.
        prob: f32,
    },
    /// Bilinear resize with half-pixel centres (OpenCV's and MindSpore's `Inter.LINEAR`).
    Resize {
        /// Output height in pixels.
        height: usize,
        /// Output width in pixels.
        width: usize,
    },
    /// `x * scale + shift`.
    Rescale {
        /// Factor each value is multiplied by.
        scale: f32,
        /// Offset added after scaling.
        shift: f32,
    },
    /// `(x - mean[c]) / std[c]` per channel (one value for all channels when the lists have one entry).
    Normalize {
        /// Mean per channel (or one for all).
        mean: Vec<f32>,
        /// Standard deviation per channel (or one for all).
        std: Vec<f32>,
    },
    /// HWC to CHW.
    HwcToChw,
}

impl Transform {
    fn name(&self) -> &'static str {
        match self {
            Transform::RandomCrop { .. } => "RandomCrop",
            Transform::RandomHorizontalFlip { .. } => "RandomHorizontalFlip",
            Transform::Resize { .. } => "Resize",
            Transform::Rescale { .. } => "Rescale",
            Transform::Normalize { .. } => "Normalize",
            Transform::HwcToChw => "HWC2CHW",
        }
    }

    /// Whether the transform draws random numbers.
    pub fn is_random(&self) -> bool {
        matches!(self, Transform::RandomCrop { .. } | Transform::RandomHorizontalFlip { .. })
    }
}

/// The CIFAR-10 channel means of MindSpore's tutorial (after rescaling to [0, 1]).
pub const CIFAR10_MEAN: [f32; 3] = [0.4465, 0.4822, 0.4914];
/// The CIFAR-10 channel standard deviations of MindSpore's tutorial.
pub const CIFAR10_STD: [f32; 3] = [0.2010, 0.1994, 0.2023];
/// The usual MNIST mean and standard deviation (after rescaling to [0, 1]).
pub const MNIST_MEAN_STD: (f32, f32) = (0.1307, 0.3081);

/// An ordered list of transforms applied to every sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transforms {
    steps: Vec<Transform>,
}

/// Reusable buffers for [`Transforms::apply`].
#[derive(Debug, Default)]
pub struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    h: usize,
    w: usize,
    c: usize,
    layout: Layout,
}

impl Dims {
    fn shape(self) -> Vec<usize> {
        match self.layout {
            Layout::Hwc => vec![self.h, self.w, self.c],
            Layout::Chw => vec![self.c, self.h, self.w],
        }
    }
    #[inline]
    fn at(self, y: usize, x: usize, ch: usize) -> usize {
        match self.layout {
            Layout::Hwc => (y * self.w + x) * self.c + ch,
            Layout::Chw => (ch * self.h + y) * self.w + x,
        }
    }
}

impl Transforms {
    /// No transforms.
    pub fn new() -> Self {
        Transforms::default()
    }

    /// Appends a transform.
    pub fn then(mut self, t: Transform) -> Self {
        self.steps.push(t);
        self
    }

    /// The steps in order.
    pub fn steps(&self) -> &[Transform] {
        &self.steps
    }

    /// The tutorial's CIFAR-10 training pipeline without its resize to 224: random crop 32 with
    /// padding 4, random horizontal flip, rescale 1/255, normalize, HWC->CHW.
    pub fn cifar10_train() -> Self {
        Transforms::new()
            .then(Transform::RandomCrop { height: 32, width: 32, padding: [4; 4], fill: 0.0 })
            .then(Transform::RandomHorizontalFlip { prob: 0.5 })
            .then(Transform::Rescale { scale: 1.0 / 255.0, shift: 0.0 })
            .then(Transform::Normalize { mean: CIFAR10_MEAN.to_vec(), std: CIFAR10_STD.to_vec() })
            .then(Transform::HwcToChw)
    }

    /// The tutorial's CIFAR-10 chain exactly, resize included: random crop 32 with padding 4,
    /// random horizontal flip, resize to `size` x `size` (224 in the tutorial), rescale 1/255,
    /// normalize, HWC->CHW.
    pub fn cifar10_tutorial(size: usize) -> Self {
        Transforms::new()
            .then(Transform::RandomCrop { height: 32, width: 32, padding: [4; 4], fill: 0.0 })
            .then(Transform::RandomHorizontalFlip { prob: 0.5 })
            .then(Transform::Resize { height: size, width: size })
            .then(Transform::Rescale { scale: 1.0 / 255.0, shift: 0.0 })
            .then(Transform::Normalize { mean: CIFAR10_MEAN.to_vec(), std: CIFAR10_STD.to_vec() })
            .then(Transform::HwcToChw)
    }

    /// CIFAR-10 evaluation: rescale 1/255, normalize, HWC->CHW.
    pub fn cifar10_eval() -> Self {
        Transforms::new()
            .then(Transform::Rescale { scale: 1.0 / 255.0, shift: 0.0 })
            .then(Transform::Normalize { mean: CIFAR10_MEAN.to_vec(), std: CIFAR10_STD.to_vec() })
            .then(Transform::HwcToChw)
    }

    /// MNIST: rescale 1/255, normalize, HWC->CHW (`[1, 28, 28]`).
    pub fn mnist() -> Self {
        Transforms::new()
            .then(Transform::Rescale { scale: 1.0 / 255.0, shift: 0.0 })
            .then(Transform::Normalize { mean: vec![MNIST_MEAN_STD.0], std: vec![MNIST_MEAN_STD.1] })
            .then(Transform::HwcToChw)
    }

    /// Whether any step draws random numbers.
    pub fn is_random(&self) -> bool {
        self.steps.iter().any(Transform::is_random)
    }

    /// The shape that comes out for `input`, or the first step that cannot take what it gets.
    pub fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        let mut shape = input.to_vec();
        let mut layout = Layout::Hwc;
        for t in &self.steps {
            let (s, l) = step_shape(t, &shape, layout)?;
            shape = s;
            layout = l;
        }
        Ok(shape)
    }

    /// Transforms one sample of shape `shape` into `out` (whose length is that of
    /// [`Transforms::output_shape`]). Call `output_shape` first: this assumes the steps fit.
    pub fn apply(&self, input: &[f32], shape: &[usize], rng: &mut Rng, out: &mut [f32], scratch: &mut Scratch) -> Result<()> {
        if self.steps.is_empty() {
            out.copy_from_slice(input);
            return Ok(());
        }
        let Scratch { a, b } = scratch;
        a.clear();
        a.extend_from_slice(input);
        let mut shape = shape.to_vec();
        let mut layout = Layout::Hwc;
        for t in &self.steps {
            let (next_shape, next_layout) = step_shape(t, &shape, layout)?;
            let d = dims(&shape, layout);
            match t {
                Transform::RandomCrop { height, width, padding, fill } => {
                    let d = d.expect("checked by step_shape");
                    let oy = rng.below((d.h + padding[1] + padding[3] - height + 1) as u64) as usize;
                    let ox = rng.below((d.w + padding[0] + padding[2] - width + 1) as u64) as usize;
                    crop(a, d, b, *height, *width, oy as isize - padding[1] as isize, ox as isize - padding[0] as isize, *fill);
                    std::mem::swap(a, b);
                }
                Transform::RandomHorizontalFlip { prob } => {
                    if rng.uniform() < *prob as f64 {
                        hflip(a, d.expect("checked by step_shape"));
                    }
                }
                Transform::Resize { height, width } => {
                    resize_bilinear(a, d.expect("checked by step_shape"), b, *height, *width);
                    std::mem::swap(a, b);
                }
                Transform::Rescale { scale, shift } => a.iter_mut().for_each(|v| *v = *v * scale + shift),
                Transform::Normalize { mean, std } => normalize(a, &shape, layout, mean, std),
                Transform::HwcToChw => {
                    hwc_to_chw(a, d.expect("checked by step_shape"), b);
                    std::mem::swap(a, b);
                }
            }
            shape = next_shape;
            layout = next_layout;
        }
        out.copy_from_slice(a);
        Ok(())
    }
}

fn dims(shape: &[usize], layout: Layout) -> Option<Dims> {
    match (shape, layout) {
        (&[h, w, c], Layout::Hwc) => Some(Dims { h, w, c, layout }),
        (&[c, h, w], Layout::Chw) => Some(Dims { h, w, c, layout }),
        _ => None,
    }
}

fn step_shape(t: &Transform, shape: &[usize], layout: Layout) -> Result<(Vec<usize>, Layout)> {
    let err = |expected: String, hint: &str| DataError::TransformShape {
        transform: t.name(),
        shape: shape.to_vec(),
        expected,
        hint: hint.into(),
    };
    let image = || {
        dims(shape, layout).ok_or_else(|| err("a 3-D image (HWC, or CHW after HWC2CHW)".into(), "image transforms apply to image datasets"))
    };
    match t {
        Transform::RandomCrop { height, width, padding, .. } => {
            let d = image()?;
            if *height == 0 || *width == 0 || d.h + padding[1] + padding[3] < *height || d.w + padding[0] + padding[2] < *width {
                return Err(err(
                    format!("a padded image of at least {height}x{width} (padding left, top, right, bottom = {padding:?})"),
                    "crop to at most the image size plus its padding",
                ));
            }
            Ok((Dims { h: *height, w: *width, ..d }.shape(), layout))
        }
        Transform::RandomHorizontalFlip { prob } => {
            image()?;
            if !(0.0..=1.0).contains(prob) {
                return Err(err(format!("a flip probability in [0, 1], got {prob}"), "0.5 flips half the images"));
            }
            Ok((shape.to_vec(), layout))
        }
        Transform::Resize { height, width } => {
            let d = image()?;
            if *height == 0 || *width == 0 || d.h == 0 || d.w == 0 {
                return Err(err(format!("non-empty sizes, got a resize to {height}x{width}"), "give a positive height and width"));
            }
            Ok((Dims { h: *height, w: *width, ..d }.shape(), layout))
        }
        Transform::Rescale { .. } => Ok((shape.to_vec(), layout)),
        Transform::Normalize { mean, std } => {
            let channels = dims(shape, layout).map(|d| d.c);
            let ok_len = |n: usize| n == 1 || Some(n) == channels;
            if mean.len() != std.len() || !ok_len(mean.len()) {
                return Err(err(
                    format!(
                        "one mean and one std per channel ({} channels) or one of each, got {} and {}",
                        channels.unwrap_or(1),
                        mean.len(),
                        std.len()
                    ),
                    "give as many means and stds as the image has channels",
                ));
            }
            if std.iter().any(|s| *s == 0.0 || !s.is_finite()) {
                return Err(err(format!("non-zero finite stds, got {std:?}"), "a zero std would divide by zero"));
            }
            Ok((shape.to_vec(), layout))
        }
        Transform::HwcToChw => {
            if layout != Layout::Hwc || shape.len() != 3 {
                return Err(err("an HWC image (HWC2CHW can appear once)".into(), "remove the second HWC2CHW"));
            }
            let d = image()?;
            Ok((vec![d.c, d.h, d.w], Layout::Chw))
        }
    }
}

/// Cuts an `oh` x `ow` window whose top-left corner sits at `(y0, x0)` of the source (negative or
/// past the edge = padding filled with `fill`).
#[allow(clippy::too_many_arguments)]
fn crop(src: &[f32], d: Dims, dst: &mut Vec<f32>, oh: usize, ow: usize, y0: isize, x0: isize, fill: f32) {
    let od = Dims { h: oh, w: ow, ..d };
    dst.clear();
    dst.resize(oh * ow * d.c, fill);
    for y in 0..oh {
        let sy = y as isize + y0;
        if sy < 0 || sy >= d.h as isize {
            continue;
        }
        let xs = (0..ow).filter(|&x| {
            let sx = x as isize + x0;
            sx >= 0 && sx < d.w as isize
        });
        match d.layout {
            Layout::Hwc => {
                let (first, count) = match xs.clone().next() {
                    Some(f) => (f, xs.count()),
                    None => continue,
                };
                let s = d.at(sy as usize, (first as isize + x0) as usize, 0);
                let o = od.at(y, first, 0);
                dst[o..o + count * d.c].copy_from_slice(&src[s..s + count * d.c]);
            }
            Layout::Chw => {
                for x in xs {
                    for ch in 0..d.c {
                        dst[od.at(y, x, ch)] = src[d.at(sy as usize, (x as isize + x0) as usize, ch)];
                    }
                }
            }
        }
    }
}

fn hflip(a: &mut [f32], d: Dims) {
    for ch in 0..d.c {
        for y in 0..d.h {
            for x in 0..d.w / 2 {
                a.swap(d.at(y, x, ch), d.at(y, d.w - 1 - x, ch));
            }
        }
    }
}

fn resize_bilinear(src: &[f32], d: Dims, dst: &mut Vec<f32>, oh: usize, ow: usize) {
    let od = Dims { h: oh, w: ow, ..d };
    dst.clear();
    dst.resize(oh * ow * d.c, 0.0);
    let axis = |o: usize, out_n: usize, in_n: usize| -> (usize, usize, f32) {
        let s = ((o as f64 + 0.5) * in_n as f64 / out_n as f64 - 0.5).max(0.0);
        let i0 = (s.floor() as usize).min(in_n - 1);
        let i1 = (i0 + 1).min(in_n - 1);
        (i0, i1, (s - i0 as f64).min(1.0) as f32)
    };
    for y in 0..oh {
        let (y0, y1, wy) = axis(y, oh, d.h);
        for x in 0..ow {
            let (x0, x1, wx) = axis(x, ow, d.w);
            for ch in 0..d.c {
                let top = src[d.at(y0, x0, ch)] * (1.0 - wx) + src[d.at(y0, x1, ch)] * wx;
                let bot = src[d.at(y1, x0, ch)] * (1.0 - wx) + src[d.at(y1, x1, ch)] * wx;
                dst[od.at(y, x, ch)] = top * (1.0 - wy) + bot * wy;
            }
        }
    }
}

fn normalize(a: &mut [f32], shape: &[usize], layout: Layout, mean: &[f32], std: &[f32]) {
    if mean.len() == 1 {
        let (m, inv) = (mean[0], 1.0 / std[0]);
        a.iter_mut().for_each(|v| *v = (*v - m) * inv);
        return;
    }
    let d = dims(shape, layout).expect("checked by step_shape");
    let inv: Vec<f32> = std.iter().map(|s| 1.0 / s).collect();
    match layout {
        Layout::Hwc => {
            for px in a.chunks_exact_mut(d.c) {
                for ((v, m), i) in px.iter_mut().zip(mean).zip(&inv) {
                    *v = (*v - m) * i;
                }
            }
        }
        Layout::Chw => {
            for ((plane, m), i) in a.chunks_exact_mut(d.h * d.w).zip(mean).zip(&inv) {
                plane.iter_mut().for_each(|v| *v = (*v - m) * i);
            }
        }
    }
}

fn hwc_to_chw(src: &[f32], d: Dims, dst: &mut Vec<f32>) {
    dst.clear();
    dst.resize(src.len(), 0.0);
    let plane = d.h * d.w;
    for (p, px) in src.chunks_exact(d.c).enumerate() {
        for (ch, &v) in px.iter().enumerate() {
            dst[ch * plane + p] = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(t: &Transforms, input: &[f32], shape: &[usize], seed: u64) -> Vec<f32> {
        let n: usize = t.output_shape(shape).unwrap().iter().product();
        let mut out = vec![0.0; n];
        t.apply(input, shape, &mut Rng::new(seed), &mut out, &mut Scratch::default()).unwrap();
        out
    }

    // 2x3 single-channel image [[1, 2, 3], [4, 5, 6]]
    const IMG: [f32; 6] = [1., 2., 3., 4., 5., 6.];

    #[test]
    fn crop_with_padding_one_gives_one_of_the_nine_hand_computed_windows_and_all_of_them_occur() {
        let t = Transforms::new().then(Transform::RandomCrop { height: 2, width: 3, padding: [1; 4], fill: 0.0 });
        // padded 4x5: rows [0 0 0 0 0], [0 1 2 3 0], [0 4 5 6 0], [0 0 0 0 0]; window offsets y 0..=2, x 0..=2
        let padded = [[0., 0., 0., 0., 0.], [0., 1., 2., 3., 0.], [0., 4., 5., 6., 0.], [0., 0., 0., 0., 0.]];
        let windows: Vec<Vec<f32>> = (0..3)
            .flat_map(|oy| (0..3).map(move |ox| (0..2).flat_map(|y| (0..3).map(move |x| padded[oy + y][ox + x])).collect()))
            .collect();
        assert_eq!(windows[4], IMG.to_vec(), "the centre window is the image itself");
        let mut seen = [false; 9];
        for seed in 0..200 {
            let out = run(&t, &IMG, &[2, 3, 1], seed);
            let k = windows.iter().position(|w| *w == out).expect("output is one of the windows");
            seen[k] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }

    #[test]
    fn crop_keeps_pixels_of_all_channels_together() {
        let mut src = Vec::new();
        for p in 0..4 {
            src.extend([p as f32, 10. + p as f32]);
        }
        // 2x2x2 HWC; window at (-1, 0) of size 2x2: first row padding (fill 9), then source row 0
        let d = Dims { h: 2, w: 2, c: 2, layout: Layout::Hwc };
        let mut dst = Vec::new();
        crop(&src, d, &mut dst, 2, 2, -1, 0, 9.0);
        assert_eq!(dst, vec![9., 9., 9., 9., 0., 10., 1., 11.]);
        let chw = Dims { layout: Layout::Chw, ..d };
        let src_chw = [0., 1., 2., 3., 10., 11., 12., 13.];
        crop(&src_chw, chw, &mut dst, 2, 2, 0, 1, 9.0);
        assert_eq!(dst, vec![1., 9., 3., 9., 11., 9., 13., 9.]);
    }

    #[test]
    fn flip_with_probability_one_mirrors_each_row_and_zero_leaves_the_image() {
        let always = Transforms::new().then(Transform::RandomHorizontalFlip { prob: 1.0 });
        assert_eq!(run(&always, &IMG, &[2, 3, 1], 0), vec![3., 2., 1., 6., 5., 4.]);
        let never = Transforms::new().then(Transform::RandomHorizontalFlip { prob: 0.0 });
        assert_eq!(run(&never, &IMG, &[2, 3, 1], 0), IMG.to_vec());
        // two channels: pixels move as a whole
        let rgb = [1., 10., 2., 20.];
        assert_eq!(run(&always, &rgb, &[1, 2, 2], 0), vec![2., 20., 1., 10.]);
    }

    #[test]
    fn rescale_normalize_and_hwc_to_chw_match_hand_values() {
        // 1x2 image with 3 channels: pixels (255, 0, 51) and (0, 255, 102)
        let px = [255., 0., 51., 0., 255., 102.];
        let t = Transforms::new()
            .then(Transform::Rescale { scale: 1.0 / 255.0, shift: 0.0 })
            .then(Transform::Normalize { mean: vec![0.5, 0.0, 0.2], std: vec![0.5, 1.0, 0.2] })
            .then(Transform::HwcToChw);
        assert_eq!(t.output_shape(&[1, 2, 3]).unwrap(), vec![3, 1, 2]);
        let out = run(&t, &px, &[1, 2, 3], 0);
        let want = [1.0, -1.0, 0.0, 1.0, 0.0, 1.0];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn normalize_after_hwc_to_chw_uses_the_channel_planes() {
        let t = Transforms::new().then(Transform::HwcToChw).then(Transform::Normalize { mean: vec![1.0, 2.0], std: vec![1.0, 2.0] });
        // 1x2x2 HWC: (1, 2), (3, 4) -> CHW planes [1, 3], [2, 4]
        assert_eq!(run(&t, &[1., 2., 3., 4.], &[1, 2, 2], 0), vec![0., 2., 0., 1.]);
    }

    #[test]
    fn resize_to_the_same_size_is_identity_and_doubling_interpolates() {
        let same = Transforms::new().then(Transform::Resize { height: 2, width: 3 });
        assert_eq!(run(&same, &IMG, &[2, 3, 1], 0), IMG.to_vec());
        // 1x2 [0, 4] -> 1x4: half-pixel centres at source x = -0.25 (clamped 0), 0.25, 0.75, 1.25 (clamped)
        let up = Transforms::new().then(Transform::Resize { height: 1, width: 4 });
        assert_eq!(run(&up, &[0., 4.], &[1, 2, 1], 0), vec![0., 1., 3., 4.]);
    }

    #[test]
    fn the_cifar_pipeline_gives_chw_of_the_same_size() {
        assert_eq!(Transforms::cifar10_train().output_shape(&[32, 32, 3]).unwrap(), vec![3, 32, 32]);
        assert_eq!(Transforms::mnist().output_shape(&[28, 28, 1]).unwrap(), vec![1, 28, 28]);
        assert_eq!(Transforms::cifar10_tutorial(224).output_shape(&[32, 32, 3]).unwrap(), vec![3, 224, 224]);
        assert!(Transforms::cifar10_train().is_random() && !Transforms::cifar10_eval().is_random());
    }

    #[test]
    fn steps_that_cannot_take_their_input_are_rejected_by_name() {
        let err = Transforms::cifar10_train().output_shape(&[784]).unwrap_err();
        assert!(err.to_string().contains("RandomCrop") && err.to_string().contains("[784]"), "{err}");
        let err =
            Transforms::new().then(Transform::Normalize { mean: vec![0.; 2], std: vec![1.; 2] }).output_shape(&[4, 4, 3]).unwrap_err();
        assert!(err.to_string().contains("Normalize"), "{err}");
        let err = Transforms::new().then(Transform::HwcToChw).then(Transform::HwcToChw).output_shape(&[4, 4, 3]).unwrap_err();
        assert!(err.to_string().contains("HWC2CHW"), "{err}");
        let big = Transforms::new().then(Transform::RandomCrop { height: 9, width: 9, padding: [0; 4], fill: 0.0 });
        assert!(big.output_shape(&[8, 8, 1]).is_err());
        let z = Transforms::new().then(Transform::Normalize { mean: vec![0.], std: vec![0.] });
        assert!(z.output_shape(&[4]).is_err());
    }
}
