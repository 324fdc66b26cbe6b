//! 3x3 stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3) (Lavin and Gray,
//! "Fast Algorithms for Convolutional Neural Networks", 2016).
//!
//! Each 2x2 tile of output comes from a 4x4 tile of input: `Y = Aᵀ [U ⊙ V] A` with the
//! transformed filter `U = G g Gᵀ` and the transformed input tile `V = Bᵀ d B`. Summed over the
//! input channels, the 16 element-wise products become 16 matrix products
//! `M_e [og, tiles] = U_e [og, cg] x V_e [cg, tiles]`, one per position `e` of the 4x4
//! transform: 16 multiplies per tile and channel pair instead of the direct form's 36, so 2.25x
//! fewer flops. The products run on the same GEMM as the rest of the kernels; the transforms
//! are additions and halvings. The results differ from the direct form's in the last bits (the
//! transforms round; the error stays within a few ulp of the products' magnitude), and depend on
//! the shapes alone (images per block are fixed by the plane size), not on the thread count.

use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

use super::{chunks_on, gemm_on, mat_mut, per_block, per_image, sum_partials, transpose_into, Geo};
use crate::simd::{vectorized, VectorLoop};
use crate::{ExecCtx, Float};

/// The 16 positions of a 4x4 transformed tile.
const E: usize = 16;

/// Channels per group below which the products are too thin for the transforms to pay.
const MIN_CHANNELS: usize = 16;

/// Tiles (GEMM columns) a block of images aims at: the block's transformed tiles and products
/// (`16 * (cg + o) * tiles` values) stay near the core's cache (ResNet-18 layers at 2 threads:
/// 64 and 128 tiles were the fastest forward passes, 64 made the weight gradient's partial sums
/// dearer).
const BLOCK_TILES: usize = 128;

/// Tiles per image above which an image is not transformed whole (its transformed tiles and
/// products, `16 * (cg + o)` values per tile, would be far from cache): outputs up to 64x64.
const MAX_IMAGE_TILES: usize = 1024;

/// Whether the forward convolution of `g` runs as F(2x2, 3x3): a 3x3 kernel, stride 1, no
/// dilation, at least 16 input and output channels per group, an output of at least 2x2 (a
/// tile of one row or column saves little) and at most [`MAX_IMAGE_TILES`] tiles per image.
pub(super) fn applies(g: &Geo) -> bool {
    let (th, tw) = tiles(g);
    g.kh == 3
        && g.kw == 3
        && g.sh == 1
        && g.sw == 1
        && g.dh == 1
        && g.dw == 1
        && g.cg >= MIN_CHANNELS
        && g.og >= MIN_CHANNELS
        && g.ho >= 2
        && g.wo >= 2
        && th * tw <= MAX_IMAGE_TILES
}

/// Output tiles per image below which the weight gradient is not taken by Winograd. Its
/// transforms mix neighbouring taps, so a tap whose gradient is exactly zero (every input pixel
/// it meets is zero, such as a channel a ReLU silenced at the border of a small plane) comes out
/// at rounding level instead, about 1e-9, which Adam's update divides by a square root of about
/// the same size: a step of a third of the learning rate where im2col (and PyTorch) take none.
/// On a plane of 4x4 tiles (an 8x8 output) a tap meets 49 of its 64 pixels in every image.
const MIN_WEIGHT_GRADIENT_TILES: usize = 16;

/// Whether the weight gradient of `g` runs as F(3x3, 2x2): [`applies`], at least
/// [`MIN_WEIGHT_GRADIENT_TILES`] tiles an image, and a block of images has at least half as
/// many tiles as a group has channels. Each block's 16 products sum over its tiles into a full
/// `[cg, og]` matrix, so with few tiles for many channels (deep layers of small planes) the
/// products are thin and writing their outputs costs more than the flops saved (ResNet-18's
/// 512-channel layer, 128 tiles a block: 55-63 ms against 33 ms for im2col; its 256-channel
/// layer, 128 tiles: 22 against 30 ms). The block is counted as if the batch filled it, so the
/// choice depends on the shapes alone: a device holding part of the batch takes the same
/// algorithm as one holding all of it.
pub(super) fn applies_to_weight_gradient(g: &Geo) -> bool {
    let (th, tw) = tiles(g);
    let full_block = BLOCK_TILES.div_ceil((th * tw).max(1));
    applies(g) && th * tw >= MIN_WEIGHT_GRADIENT_TILES && 2 * full_block * th * tw >= g.cg.max(g.og)
}

/// Blocks of images whose products one partial weight gradient accumulates: at most 16
/// partials whatever the batch, fixed by the shapes.
fn blocks_per_partial(blocks: usize) -> usize {
    blocks.div_ceil(16).max(1)
}

/// Output tiles per image, `(rows, columns)`.
fn tiles(g: &Geo) -> (usize, usize) {
    (g.ho.div_ceil(2), g.wo.div_ceil(2))
}

/// Images per block: enough for about [`BLOCK_TILES`] tiles. Fixed by the shapes.
pub(super) fn image_block(g: &Geo) -> usize {
    let (th, tw) = tiles(g);
    BLOCK_TILES.div_ceil((th * tw).max(1)).clamp(1, g.n.max(1))
}

/// `G g Gᵀ` for each filter, laid out `[O][e][cg]` (so `U_e` of group `grp` is a view with rows
/// `16 * cg` apart), with `G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]]`. Each
/// output channel's filters are first laid out tap-major (`[9][cg]`), so the transform runs
/// along whole rows; output channels run in parallel.
fn filter_transform<T: Float>(ctx: &ExecCtx, w: Filters<'_, T>, g: &Geo) -> Vec<T> {
    let cg = g.cg;
    let mut u = vec![T::zero(); g.o * E * cg];
    ctx.for_chunks(&mut u, E * cg, |o, uo| {
        let mut taps = vec![T::zero(); 9 * cg];
        let mut gw = vec![T::zero(); 12 * cg];
        match w {
            Filters::Given(w) => {
                for (i, src) in w[o * cg * 9..][..cg * 9].chunks_exact(9).enumerate() {
                    for (t, &v) in src.iter().enumerate() {
                        taps[t * cg + i] = v;
                    }
                }
            }
            Filters::Flipped(w) => {
                // Filter `o` (input channel `c` of group `grp` of the convolution flipped)
                // against channel `i`: that convolution's filter `grp * cg + i` against `c`,
                // taps reversed.
                let (grp, c) = (o / g.og, o % g.og);
                for i in 0..cg {
                    let src = &w[((grp * cg + i) * g.og + c) * 9..][..9];
                    for (t, &v) in src.iter().rev().enumerate() {
                        taps[t * cg + i] = v;
                    }
                }
            }
        }
        // G g: column j of the 3x3 kernel (taps j, 3 + j, 6 + j) into rows 3a + j ...
        for j in 0..3 {
            let x: [_; 3] = std::array::from_fn(|i| &taps[(3 * i + j) * cg..][..cg]);
            vectorized(GRows { x, out: rows_mut(&mut gw, j * cg, 3 * cg, cg) });
        }
        // ... then G along each row a of G g, into e = 4a + b.
        for a in 0..4 {
            let x: [_; 3] = std::array::from_fn(|j| &gw[(3 * a + j) * cg..][..cg]);
            vectorized(GRows { x, out: rows_mut(uo, 4 * a * cg, cg, cg) });
        }
    });
    u
}

/// The filters of a Winograd convolution.
#[derive(Clone, Copy)]
pub(super) enum Filters<'a, T> {
    /// `[O, C/g, 3, 3]`, as given.
    Given(&'a [T]),
    /// The filters of the convolution whose input gradient this one computes: filter `(o, c)`
    /// here is that convolution's `(c, o)` with its taps reversed (`[C, O/g, 3, 3]` of
    /// `[O, C/g, 3, 3]` given), so the input gradient needs no flipped copy of the weight.
    Flipped(&'a [T]),
}

/// `G x` for the 3-vectors `(x0[i], x1[i], x2[i])` into `(out0[i], .., out3[i])`.
struct GRows<'a, T> {
    x: [&'a [T]; 3],
    out: [&'a mut [T]; 4],
}

impl<T: Float> VectorLoop for GRows<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let half = T::c(0.5);
        let [o0, o1, o2, o3] = self.out;
        let n = o0.len();
        let (x0, x1, x2) = (&self.x[0][..n], &self.x[1][..n], &self.x[2][..n]);
        let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
        for i in 0..n {
            let (a, b, c) = (x0[i], x1[i], x2[i]);
            o0[i] = a;
            o1[i] = (a + b + c) * half;
            o2[i] = (a - b + c) * half;
            o3[i] = c;
        }
    }
}

/// `Bᵀ d` along a 4-vector: `Bᵀ = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`.
#[inline(always)]
fn bt<T: Float>(d0: T, d1: T, d2: T, d3: T) -> [T; 4] {
    [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
}

/// `Aᵀ m` along a 4-vector: `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, -1]]`.
#[inline(always)]
fn at<T: Float>(m0: T, m1: T, m2: T, m3: T) -> [T; 2] {
    [m0 + m1 + m2, m1 - m2 - m3]
}

/// `N` disjoint rows of `len` values, `stride` apart from `at` on.
fn rows_mut<T, const N: usize>(v: &mut [T], at: usize, stride: usize, len: usize) -> [&mut [T]; N] {
    let mut rest = &mut v[at..];
    std::array::from_fn(|e| {
        let (row, tail) = std::mem::take(&mut rest).split_at_mut(len);
        if e + 1 < N {
            rest = &mut tail[stride - len..];
        }
        row
    })
}

/// A 4-point transform applied in place across four rows, value by value.
struct Across4<'a, T, const IN: bool> {
    rows: [&'a mut [T]; 4],
}

impl<T: Float, const IN: bool> VectorLoop for Across4<'_, T, IN> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let [r0, r1, r2, r3] = self.rows;
        for (((a, b), c), d) in r0.iter_mut().zip(r1.iter_mut()).zip(r2.iter_mut()).zip(r3.iter_mut()) {
            if IN {
                [*a, *b, *c, *d] = bt(*a, *b, *c, *d);
            } else {
                [*a, *b] = at(*a, *b, *c, *d);
            }
        }
    }
}

/// Applies `Bᵀ · B` (`input`) or `Aᵀ · A` to every 4x4 tile of `t`, laid out `[e][cols]` (tile
/// position `e = 4a + b` of tile `p` at `t[e * cols + p]`), along whole rows of tiles. `Aᵀ M A`
/// leaves output position `(i, j)` in row `4i + j`.
fn transform_tiles<T: Float>(t: &mut [T], cols: usize, input: bool) {
    let run = |t: &mut [T], at: usize, stride: usize| {
        let rows = rows_mut(t, at, stride, cols);
        if input {
            vectorized(Across4::<T, true> { rows })
        } else {
            vectorized(Across4::<T, false> { rows })
        }
    };
    // Down the columns of each tile (rows b, 4 + b, 8 + b, 12 + b): `Bᵀ d` or `Aᵀ M` (whose
    // two values land in rows b and 4 + b) ...
    for b in 0..4 {
        run(t, b * cols, 4 * cols);
    }
    // ... then along the rows (4a .. 4a + 3) that hold values.
    for a in 0..if input { 4 } else { 2 } {
        run(t, 4 * a * cols, cols);
    }
}

/// Gathers the 4x4 input tiles of one plane (tiles 2 apart, over the zero-padded plane) into
/// `out[e * cols + first + tile]`; `pad` is scratch. The padded plane is kept as its even and
/// its odd columns, so that each tile position of a row of tiles is one contiguous copy.
fn gather_tiles<T: Float>(plane: &[T], g: &Geo, out: &mut [T], cols: usize, first: usize, pad: &mut Vec<T>) {
    let (th, tw) = tiles(g);
    let (hp, wp, half) = (2 * th + 2, 2 * tw + 2, tw + 1);
    pad.clear();
    pad.resize(wp + 2 * hp * half, T::zero());
    let (row, planes) = pad.split_at_mut(wp);
    let (even, odd) = planes.split_at_mut(hp * half);
    let ws = g.w.min(wp.saturating_sub(g.pl));
    for r in 0..hp {
        let ih = r as isize - g.pt as isize;
        if ih < 0 || ih as usize >= g.h || ws == 0 {
            continue;
        }
        row.fill(T::zero());
        row[g.pl..][..ws].copy_from_slice(&plane[ih as usize * g.w..][..ws]);
        let (pairs, _) = row.as_chunks::<2>();
        for ((&[a, b], e), o) in pairs.iter().zip(&mut even[r * half..][..half]).zip(&mut odd[r * half..][..half]) {
            (*e, *o) = (a, b);
        }
    }
    for e in 0..E {
        // Column 2tj + s is even[tj + s/2] for even s, odd[tj + s/2] for odd s.
        let (r, s) = (e / 4, e % 4);
        let src = if s % 2 == 0 { &*even } else { &*odd };
        let dst = &mut out[e * cols + first..][..th * tw];
        for (ti, d) in dst.chunks_exact_mut(tw).enumerate() {
            d.copy_from_slice(&src[(2 * ti + r) * half + s / 2..][..tw]);
        }
    }
}

/// Scatters output tiles (position `(i, j)` of tile `first + tile` at `m[(4i + j) * cols +
/// first + tile]`) into one output plane, cropped to it.
fn scatter_tiles<T: Float>(m: &[T], g: &Geo, cols: usize, first: usize, y: &mut [T]) {
    let (th, tw) = tiles(g);
    for ti in 0..th {
        for i in 0..2 {
            let oh = 2 * ti + i;
            if oh >= g.ho {
                break;
            }
            let c0 = &m[4 * i * cols + first + ti * tw..][..tw];
            let c1 = &m[(4 * i + 1) * cols + first + ti * tw..][..tw];
            let row = &mut y[oh * g.wo..][..g.wo];
            let (pairs, tail) = row.as_chunks_mut::<2>();
            for ((p, &a), &b) in pairs.iter_mut().zip(c0).zip(c1) {
                *p = [a, b];
            }
            if let Some(last) = tail.first_mut() {
                *last = c0[tw - 1];
            }
        }
    }
}

/// The transformed input tiles `Bᵀ d B` of group `grp` of the images from `first` on, as many
/// as `v` (`[cg][e][tiles]`) holds, channels in parallel when `par`.
fn input_tiles<T: Float>(ctx: &ExecCtx, par: bool, x: &[T], g: &Geo, grp: usize, first: usize, v: &mut [T]) {
    let (th, tw) = tiles(g);
    let cols = v.len() / (g.cg * E).max(1);
    chunks_on(ctx, par, v, E * cols, |c, out| {
        let mut pad = Vec::new();
        for k in 0..cols / (th * tw) {
            let plane = &x[((first + k) * g.c + grp * g.cg + c) * g.h * g.w..][..g.h * g.w];
            gather_tiles(plane, g, out, cols, k * th * tw, &mut pad);
        }
        transform_tiles(out, cols, true);
    });
}

/// The forward convolution `y [N, O, Ho, Wo]` of `x` by `w` as F(2x2, 3x3); `g` must satisfy
/// [`applies`].
pub(super) fn conv_fwd<T: Float>(ctx: &ExecCtx, x: &[T], w: Filters<'_, T>, g: &Geo) -> Vec<T> {
    debug_assert!(applies(g));
    conv_fwd_blocks(ctx, x, w, g, image_block(g))
}

/// [`conv_fwd`] with `block` images per set of 16 products.
pub(super) fn conv_fwd_blocks<T: Float>(ctx: &ExecCtx, x: &[T], w: Filters<'_, T>, g: &Geo, block: usize) -> Vec<T> {
    let hwo = g.hwo();
    let (th, tw) = tiles(g);
    let per_image_tiles = th * tw;
    let u = filter_transform(ctx, w, g);
    let cap = block * per_image_tiles;
    let mut y = vec![T::zero(); g.n * g.o * hwo];
    // Scratch: the transformed input of one group [cg][e][cols] and the products of every
    // group [o][e][cols].
    per_block(ctx, &mut y, block, g.o * hwo, (g.cg + g.o) * E * cap, |first, count, yb, buf, par| {
        let cols = count * per_image_tiles;
        let (v, m) = buf.split_at_mut(g.cg * E * cap);
        let (v, m) = (&mut v[..g.cg * E * cols], &mut m[..g.o * E * cols]);
        for grp in 0..g.g {
            input_tiles(ctx, par, x, g, grp, first, v);
            let mg = &mut m[grp * g.og * E * cols..][..g.og * E * cols];
            for e in 0..E {
                let ue = ArrayView2::from_shape((g.og, g.cg).strides((E * g.cg, 1)), &u[(grp * g.og * E + e) * g.cg..])
                    .expect("view inside the filters");
                let ve = ArrayView2::from_shape((g.cg, cols).strides((E * cols, 1)), &v[e * cols..]).expect("view inside the tiles");
                let me =
                    ArrayViewMut2::from_shape((g.og, cols).strides((E * cols, 1)), &mut mg[e * cols..]).expect("view inside the products");
                gemm_on(ctx, par, ue, ve, me, false);
            }
        }
        chunks_on(ctx, par, m, E * cols, |_, mo| transform_tiles(mo, cols, false));
        let m = &*m;
        chunks_on(ctx, par, yb, hwo, |plane, y| {
            let (k, o) = (plane / g.o, plane % g.o);
            scatter_tiles(&m[o * E * cols..][..E * cols], g, cols, k * per_image_tiles, y);
        });
    });
    y
}

/// The output-gradient tiles of one image for the weight gradient, laid out `[tile][e][og]`:
/// each 2x2 tile of `dy` (zero past the plane) as `G dy Gᵀ` with F(3, 2)'s
/// `G = [[1, 0], [1/2, 1/2], [1/2, -1/2], [0, 1]]`, every output channel side by side.
/// `dyt` is the image's gradient laid out `[Ho * Wo][og]`, `zeros` `og` zeros.
struct GradientTiles<'a, T> {
    dyt: &'a [T],
    zeros: &'a [T],
    g: &'a Geo,
    out: &'a mut [T],
}

impl<T: Float> VectorLoop for GradientTiles<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let GradientTiles { dyt, zeros, g, out } = self;
        let (og, half) = (g.og, T::c(0.5));
        let (th, tw) = tiles(g);
        let gx = |x0: T, x1: T| [x0, (x0 + x1) * half, (x0 - x1) * half, x1];
        for (p, tile) in out.chunks_exact_mut(E * og).take(th * tw).enumerate() {
            let (oh, ow) = (2 * (p / tw), 2 * (p % tw));
            let at = |u: usize, v: usize| {
                if oh + u < g.ho && ow + v < g.wo {
                    &dyt[((oh + u) * g.wo + ow + v) * og..][..og]
                } else {
                    &zeros[..og]
                }
            };
            let (x00, x01, x10, x11) = (at(0, 0), at(0, 1), at(1, 0), at(1, 1));
            let rows: [&mut [T]; E] = rows_mut(tile, 0, og, og);
            for o in 0..og {
                // G down the two columns, then G along each of the four rows: e = 4a + b.
                let (c0, c1) = (gx(x00[o], x10[o]), gx(x01[o], x11[o]));
                for a in 0..4 {
                    let r = gx(c0[a], c1[a]);
                    for b in 0..4 {
                        rows[4 * a + b][o] = r[b];
                    }
                }
            }
        }
    }
}

/// The weight gradient `dW [O, C/g, 3, 3]` as F(3x3, 2x2): per tile, `Aᵀ [(G dy Gᵀ) ⊙ (Bᵀ d B)] A`
/// with `d` the same 4x4 input tiles as the forward pass and `dy` the tile's 2x2 output
/// gradient; summed over tiles and images inside 16 products `M_eᵀ [cg, og] = V_e [cg, tiles] x
/// DY_e [tiles, og]` (both operands with their rows contiguous, the GEMM's fast layout).
/// F(3, 2)'s `Bᵀ` is F(2, 3)'s with its last row negated, so its input tiles are the forward
/// pass's with that sign moved into `Aᵀ = [[1, 1, 1, 0], [0, 1, -1, 0], [0, 1, 1, -1]]`.
/// Blocks of images (fixed by the shapes) accumulate, a fixed number of blocks each, into at
/// most 16 partial sums, added in order.
pub(super) fn conv_bwd_weight<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo) -> Vec<T> {
    debug_assert!(applies_to_weight_gradient(g));
    conv_bwd_weight_blocks(ctx, dy, x, g, image_block(g))
}

/// [`conv_bwd_weight`] with `block` images per set of 16 products.
pub(super) fn conv_bwd_weight_blocks<T: Float>(ctx: &ExecCtx, dy: &[T], x: &[T], g: &Geo, block: usize) -> Vec<T> {
    let (th, tw) = tiles(g);
    let cap = block * th * tw;
    let part = g.g * E * g.og * g.cg;
    let blocks = g.n.div_ceil(block).max(1);
    let per_part = blocks_per_partial(blocks);
    let parts = blocks.div_ceil(per_part);
    let mut partial = vec![T::zero(); parts * part];
    per_image(ctx, &mut partial, part, (g.cg + g.og) * E * cap, |pi, mw, buf, par| {
        for (kb, bi) in (pi * per_part..((pi + 1) * per_part).min(blocks)).enumerate() {
            let (first, count) = (bi * block, block.min(g.n.saturating_sub(bi * block)));
            weight_block(ctx, par, (dy, x, g), (first, count, cap), buf, mw, kb > 0);
        }
    });
    let sum = sum_partials(ctx, &partial, part);
    // Aᵀ M A per (o, c): 16 products (`M_eᵀ [cg, og]` each), `cg * og` apart, into the 3x3
    // kernel. One output channel reads a column of each product: 16 x cg cache lines, which the
    // next output channel reads again while they are still in cache.
    let at3 = |m0: T, m1: T, m2: T, m3: T| [m0 + m1 + m2, m1 - m2, m1 + m2 - m3];
    let mut dw = vec![T::zero(); g.o * g.cg * 9];
    let plane = g.og * g.cg;
    ctx.for_chunks(&mut dw, g.cg * 9, |go, out| {
        let (grp, o) = (go / g.og, go % g.og);
        let m = &sum[grp * E * plane + o..];
        for (c, k) in out.chunks_exact_mut(9).enumerate() {
            let me = |e: usize| m[e * plane + c * g.og];
            let s: [[T; 3]; 4] = std::array::from_fn(|a| at3(me(4 * a), me(4 * a + 1), me(4 * a + 2), me(4 * a + 3)));
            for j in 0..3 {
                let col = at3(s[0][j], s[1][j], s[2][j], s[3][j]);
                for i in 0..3 {
                    k[i * 3 + j] = col[i];
                }
            }
        }
    });
    dw
}

/// One block's 16 products `M_eᵀ [cg, og] = V_e [cg, tiles] x DY_e [tiles, og]` for every
/// group, into `mw` (`[grp][e][cg][og]`), added to it when `acc`.
fn weight_block<T: Float>(
    ctx: &ExecCtx,
    par: bool,
    (dy, x, g): (&[T], &[T], &Geo),
    (first, count, cap): (usize, usize, usize),
    buf: &mut [T],
    mw: &mut [T],
    acc: bool,
) {
    let hwo = g.hwo();
    let (th, tw) = tiles(g);
    let per_image_tiles = th * tw;
    let cols = count * per_image_tiles;
    let (v, d) = buf.split_at_mut(g.cg * E * cap);
    let (v, d) = (&mut v[..g.cg * E * cols], &mut d[..g.og * E * cols]);
    for grp in 0..g.g {
        input_tiles(ctx, par, x, g, grp, first, v);
        chunks_on(ctx, par, d, per_image_tiles * E * g.og, |k, out| {
            let mut dyt = vec![T::zero(); hwo * g.og];
            transpose_into(&dy[((first + k) * g.o + grp * g.og) * hwo..][..g.og * hwo], hwo, 0, &mut dyt, g.og);
            let zeros = vec![T::zero(); g.og];
            vectorized(GradientTiles { dyt: &dyt, zeros: &zeros, g, out });
        });
        for e in 0..E {
            let ve = ArrayView2::from_shape((g.cg, cols).strides((E * cols, 1)), &v[e * cols..]).expect("view inside the tiles");
            let de = ArrayView2::from_shape((cols, g.og).strides((E * g.og, 1)), &d[e * g.og..]).expect("view inside the tiles");
            let out = &mut mw[(grp * E + e) * g.cg * g.og..][..g.cg * g.og];
            gemm_on(ctx, par, ve, de, mat_mut(out, g.cg, g.og), acc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::geometry;
    use super::*;
    use crate::kernels::conv::Conv2dParams;
    use crate::{random, DType};

    fn data(shape: &[usize], seed: u64) -> Vec<f64> {
        random::uniform(shape, -1., 1., seed, DType::F64).to_vec::<f64>().unwrap()
    }

    #[test]
    fn winograd_matches_the_direct_forms_across_shapes_padding_groups_and_blocks() {
        let cases = [
            ([2, 16, 6, 7], [16, 16, 3, 3], Conv2dParams::new(1, 1)),
            ([3, 16, 5, 5], [20, 16, 3, 3], Conv2dParams::new(1, 0)),
            ([1, 32, 7, 4], [32, 16, 3, 3], Conv2dParams { padding: [2, 0, 1, 2], groups: 2, ..Default::default() }),
            ([2, 17, 4, 4], [16, 17, 3, 3], Conv2dParams::new(1, 2)),
            ([5, 16, 2, 2], [16, 16, 3, 3], Conv2dParams::new(1, 1)),
            ([5, 16, 3, 2], [16, 16, 3, 3], Conv2dParams::new(1, 1)),
            // 40 blocks of one image: weight-gradient partials of 3 blocks each.
            ([40, 16, 3, 2], [16, 16, 3, 3], Conv2dParams::new(1, 1)),
        ];
        for (k, (xs, ws, p)) in cases.into_iter().enumerate() {
            let g = geometry("t", &xs, &ws, &p).unwrap();
            assert!(applies(&g), "case {k}");
            let (x, w) = (data(&xs, k as u64), data(&ws, 30 + k as u64));
            let dy = data(&[g.n, g.o, g.ho, g.wo], 60 + k as u64);
            let serial = ExecCtx::serial();
            let want_y = super::super::conv_fwd_blocks(&serial, &x, &w, &g, 1);
            let want_dw = super::super::conv_bwd_weight_im2col(&serial, &dy, &x, &g);
            let worst = |a: &[f64], b: &[f64]| {
                assert_eq!(a.len(), b.len());
                a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max)
            };
            for block in [1, 2, image_block(&g), g.n] {
                for ctx in [ExecCtx::serial(), ExecCtx::parallel().with_min_parallel_len(1)] {
                    let off = worst(&conv_fwd_blocks(&ctx, &x, Filters::Given(&w), &g, block), &want_y);
                    assert!(off < 1e-12, "forward, case {k}, block {block}: off by {off}");
                    let off = worst(&conv_bwd_weight_blocks(&ctx, &dy, &x, &g, block), &want_dw);
                    assert!(off < 1e-11, "weight gradient, case {k}, block {block}: off by {off}");
                }
            }
        }
    }

    #[test]
    fn winograd_results_do_not_depend_on_the_thread_count() {
        // 100 images of 25 tiles: 17 blocks of 6 images (the last one of 4), so blocks run on
        // the pool's threads, and the weight gradient's partials take 2 blocks each.
        let g = geometry("t", &[100, 16, 9, 9], &[24, 16, 3, 3], &Conv2dParams::new(1, 1)).unwrap();
        let blocks = g.n.div_ceil(image_block(&g));
        assert!(blocks == 17 && !g.n.is_multiple_of(image_block(&g)) && blocks_per_partial(blocks) == 2 && applies_to_weight_gradient(&g));
        let f32s = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<f32>>();
        let (x, w, dy) = (f32s(data(&[100, 16, 9, 9], 1)), f32s(data(&[24, 16, 3, 3], 2)), f32s(data(&[100, 24, 9, 9], 3)));
        let serial = (conv_fwd(&ExecCtx::serial(), &x, Filters::Given(&w), &g), conv_bwd_weight(&ExecCtx::serial(), &dy, &x, &g));
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let ctx = ExecCtx::parallel().with_min_parallel_len(1);
        let parallel = pool.install(|| (conv_fwd(&ctx, &x, Filters::Given(&w), &g), conv_bwd_weight(&ctx, &dy, &x, &g)));
        let same = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same(&serial.0, &parallel.0), "forward");
        assert!(same(&serial.1, &parallel.1), "weight gradient");
    }

    #[test]
    fn winograd_input_gradient_matches_col2im() {
        let cases = [
            ([2, 32, 7, 6], [32, 16, 3, 3], Conv2dParams { padding: [1, 2, 0, 1], groups: 2, ..Default::default() }),
            ([3, 16, 5, 5], [24, 16, 3, 3], Conv2dParams::new(1, 1)),
            ([1, 20, 6, 9], [18, 20, 3, 3], Conv2dParams { padding: [2, 2, 1, 0], ..Default::default() }),
            // Groups with more output than input channels each: the flipped filters' group
            // offsets differ from the given ones'.
            ([2, 32, 6, 6], [64, 16, 3, 3], Conv2dParams { padding: [1, 1, 1, 1], groups: 2, ..Default::default() }),
        ];
        for (k, (xs, ws, p)) in cases.into_iter().enumerate() {
            let g = geometry("t", &xs, &ws, &p).unwrap();
            let (w, dy) = (data(&ws, k as u64), data(&[g.n, g.o, g.ho, g.wo], 70 + k as u64));
            let fast = super::super::bwd_input_as_conv(&ExecCtx::serial(), &dy, &w, &g, &p).expect("stride 1, padding within the kernel");
            let flipped = Conv2dParams { padding: p.padding.map(|v| 2 - v), ..p };
            let gq = geometry("t", &[g.n, g.o, g.ho, g.wo], &[g.c, g.og, 3, 3], &flipped).unwrap();
            assert!(applies(&gq), "case {k}: the flipped convolution runs as Winograd");
            let slow = super::super::conv_bwd_input(&ExecCtx::serial(), &dy, &w, &g);
            let worst = fast.iter().zip(&slow).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(fast.len() == slow.len() && worst < 1e-12, "case {k}: off by {worst}");
        }
    }

    #[test]
    fn winograd_in_f32_stays_within_the_direct_forms_rounding() {
        // ResNet-like shapes: the transforms' rounding stays of the order of the products'.
        let g = geometry("t", &[4, 64, 8, 8], &[64, 64, 3, 3], &Conv2dParams::new(1, 1)).unwrap();
        let (x, w, dy) = (data(&[4, 64, 8, 8], 5), data(&[64, 64, 3, 3], 6), data(&[4, 64, 8, 8], 7));
        let f32s = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        let exact_y = super::super::conv_fwd_blocks(&ExecCtx::serial(), &x, &w, &g, 1);
        let exact_dw = super::super::conv_bwd_weight_im2col(&ExecCtx::serial(), &dy, &x, &g);
        let y = conv_fwd(&ExecCtx::serial(), &f32s(&x), Filters::Given(&f32s(&w)), &g);
        let dw = conv_bwd_weight(&ExecCtx::serial(), &f32s(&dy), &f32s(&x), &g);
        // Errors relative to the largest magnitude: f32's epsilon times a small factor.
        let rel = |a: &[f32], b: &[f64]| {
            let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            a.iter().zip(b).map(|(&a, &b)| (a as f64 - b).abs() / scale).fold(0.0, f64::max)
        };
        assert!(rel(&y, &exact_y) < 2e-6, "forward: {}", rel(&y, &exact_y));
        assert!(rel(&dw, &exact_dw) < 2e-6, "weight gradient: {}", rel(&dw, &exact_dw));
    }

    #[test]
    fn only_3x3_stride_1_undilated_kernels_with_enough_channels_apply() {
        let ok = |xs: [usize; 4], ws: [usize; 4], p: Conv2dParams| applies(&geometry("t", &xs, &ws, &p).unwrap());
        assert!(ok([1, 16, 8, 8], [16, 16, 3, 3], Conv2dParams::new(1, 1)));
        assert!(!ok([1, 16, 8, 8], [16, 16, 3, 3], Conv2dParams::new(2, 1)));
        assert!(!ok([1, 16, 8, 8], [16, 16, 3, 3], Conv2dParams { dilation: [2, 2], ..Conv2dParams::new(1, 2) }));
        assert!(!ok([1, 16, 8, 8], [16, 16, 1, 1], Conv2dParams::default()));
        assert!(!ok([1, 8, 8, 8], [16, 8, 3, 3], Conv2dParams::new(1, 1)));
        assert!(!ok([1, 16, 8, 8], [8, 16, 3, 3], Conv2dParams::new(1, 1)));
        assert!(!ok([4, 16, 1, 6], [16, 16, 3, 3], Conv2dParams::new(1, 1)), "one output row");
        assert!(!ok([1, 16, 130, 130], [16, 16, 3, 3], Conv2dParams::new(1, 1)), "65 x 65 tiles an image");
        let weights =
            |xs: [usize; 4], ws: [usize; 4]| applies_to_weight_gradient(&geometry("t", &xs, &ws, &Conv2dParams::new(1, 1)).unwrap());
        assert!(weights([32, 64, 32, 32], [64, 64, 3, 3]));
        assert!(weights([32, 256, 8, 8], [256, 256, 3, 3]), "128 tiles a block for 256 channels");
        assert!(!weights([32, 512, 4, 4], [512, 512, 3, 3]), "128 tiles a block for 512 channels");
        assert!(!weights([256, 512, 4, 4], [512, 512, 3, 3]), "a larger batch has more blocks, no larger ones");
        assert!(weights([2, 256, 8, 8], [256, 256, 3, 3]), "the batch a device holds does not change the choice");
        assert!(!weights([64, 32, 6, 6], [32, 32, 3, 3]), "9 tiles an image: im2col");
        assert!(!weights([64, 32, 2, 2], [32, 32, 3, 3]), "one tile an image: im2col");
    }
}
