//! autopar-tensor: the CPU tensor type and the kernel of every op, forward and the pieces the
//! backward rules need.
//!
//! # Key decisions
//! - **One dynamically typed [`Tensor`]** over `ndarray::ArcArray<T, IxDyn>` for f32, f64, f16,
//!   bf16, i32 and i64 ([`DType`]). Clones share storage; [`kernels::shape::slice`],
//!   [`kernels::shape::slice_axis`], [`kernels::shape::split`], [`kernels::shape::transpose`] and
//!   reshapes of contiguous tensors are zero-copy views (sharding cuts tensors everywhere).
//!   Kernels accept any strides and return row-major tensors.
//! - **Kernels are generic over [`Float`]** (f32 for training, f64 for gradient checks) and
//!   dispatch on the runtime dtype. f16/bf16 are storage types: cast to f32 to compute
//!   ([`Tensor::cast`]); kernels reject them with an error saying so. Labels and indices are
//!   i32 or i64; integer add/sub/mul/div/neg also work.
//! - **Every matrix product goes through GEMM** (`gemm` 0.19 with AVX-512 kernels), behind the
//!   small [`Backend`] trait so a GPU backend can replace it. Transpose flags are stride swaps;
//!   a column-major operand is repacked (tiled) because the GEMM kernels are 4x slower on it.
//!   Conv2D runs per image: stride-1 kernels as a sum of shifted GEMMs over zero-padded planes
//!   (forward and weight gradient), other strides as im2col + GEMM, 1x1 kernels as a plain GEMM;
//!   the stride-1 input gradient is a convolution with the flipped kernel, otherwise GEMM +
//!   col2im.
//! - **[`ExecCtx`] per call**: [`ExecCtx::parallel`] uses rayon for element-wise work and
//!   reductions above a size threshold (and parallel GEMM); [`ExecCtx::serial`] keeps everything
//!   on the calling thread (many simulated ranks share two cores). Work is split over outputs or
//!   fixed chunks, never over a reduction in a thread-dependent way, so **serial and parallel
//!   results are bit-identical**.
//! - **Backward pieces are plain functions** that take what the forward saved (named in each
//!   doc comment): e.g. [`kernels::matmul::matmul_grads`], [`kernels::conv::conv2d_backward_input`],
//!   [`kernels::norm::batch_norm_backward`]. Broadcasting's backward is
//!   [`kernels::elementwise::reduce_to_shape`].
//! - **Errors, never panics, on bad input**: one [`TensorError`] enum carrying op, shapes and
//!   values, printed with a `hint:` line.
//! - **Randomness is counter-based** ([`random`]): dropout masks and initialisers depend only on
//!   the seed and the element index.
//!
//! # Kernel index (module `kernels`)
//! | op | forward | backward |
//! |---|---|---|
//! | MatMul | `matmul::matmul(a, b, ta, tb)` | `matmul::matmul_grads` (`matmul_grad_a`, `matmul_grad_b`) |
//! | BatchMatMul | `matmul::batch_matmul` | `matmul::batch_matmul_grads` |
//! | Add/Sub/Mul/Div | `elementwise::{add, sub, mul, div, binary}` | `elementwise::binary_grads`, `reduce_to_shape` |
//! | BiasAdd | `elementwise::bias_add(x, b, axis)` | dx = dy, `elementwise::bias_add_grad` |
//! | ReLU, Tanh, Sigmoid, Exp, Log, Sqrt, Neg | `elementwise::{relu, tanh, ...}` | `elementwise::{relu_backward, ...}` |
//! | GELU | `elementwise::gelu(x, approximate)` | `elementwise::gelu_backward` |
//! | Softmax, LogSoftmax | `reduce::{softmax, log_softmax}` | `reduce::{softmax_backward, log_softmax_backward}` (from y) |
//! | ReduceSum/Mean/Max | `reduce::{reduce_sum, reduce_mean, reduce_max}` | `reduce::{reduce_backward, reduce_max_backward}` |
//! | Reshape, Flatten | `shape::{reshape, reshape_to, flatten}` | `shape::reshape_to(input shape)` |
//! | Transpose | `shape::transpose(x, perm)` | transpose by `shape::inverse_permutation` |
//! | Slice | `shape::{slice, slice_axis, split}` (views) | `shape::slice_backward` |
//! | Concat | `shape::concat` | `shape::concat_backward` (views) |
//! | Gather | `shape::gather(params, idx, axis)`, `shape::gather_rows` (a block of a split table) | `shape::gather_backward`, `shape::gather_rows_backward` (scatter-add) |
//! | OneHot | `shape::one_hot` | — |
//! | ArgMax (metrics) | `reduce::argmax` | — |
//! | Conv2D | `conv::conv2d(x, w, params)` | `conv::conv2d_backward_input`, `conv::conv2d_backward_weight` |
//! | BatchNorm | `norm::batch_norm_train` / `batch_norm_eval`; synchronised (batch split over ranks): `norm::channel_sums`, `batch_norm_train_with` | `norm::batch_norm_backward` / `batch_norm_eval_backward`; synchronised: `batch_norm_grad_sums`, `batch_norm_backward_input` |
//! | LayerNorm | `norm::layer_norm` | `norm::layer_norm_backward` |
//! | RMSNorm | `norm::rms_norm` | `norm::rms_norm_backward` |
//! | RotaryEmbedding | `rotary::rotary_embedding(x, theta, offset, false)` | the same with `inverse` true |
//! | Attention (fused, causal, grouped-query) | `attention::attention` | `attention::attention_backward` (dq, dk, dv) |
//! | RouterTopK | `routing::top_k_weights` | `routing::top_k_weights_backward` |
//! | MaxPool, AvgPool | `pool::{max_pool2d, avg_pool2d}` | `pool::{max_pool2d_backward, avg_pool2d_backward}` |
//! | global average pool | `pool::global_avg_pool` | `pool::global_avg_pool_backward` |
//! | Dropout | `dropout::dropout(x, p, seed)`, `dropout::dropout_slice` (a shard draws the full tensor's mask) | `dropout::dropout_backward(dy, mask)` |
//! | SoftmaxCrossEntropy | `loss::softmax_cross_entropy_sparse` | `loss::softmax_cross_entropy_sparse_backward` |
//!
//! ```
//! use autopar_tensor::{kernels::matmul::matmul, ExecCtx, Tensor};
//! let ctx = ExecCtx::serial();
//! let a = Tensor::from_vec(&[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
//! let b = Tensor::from_vec(&[2, 2], vec![1.0f32, 0.0, 0.0, 1.0]).unwrap();
//! let c = matmul(&ctx, &a, &b, false, true).unwrap();
//! assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
//! ```

#![warn(missing_docs)]

pub mod backend;
mod dtype;
mod error;
pub mod fastmath;
pub mod kernels;
pub mod random;
pub mod simd;
mod tensor;

pub use backend::{Backend, Cpu, ExecCtx};
pub use dtype::{DType, Element, Float, Index};
pub use error::{Result, TensorError};
pub use kernels::conv::Conv2dParams;
pub use kernels::norm::{BatchNormOutput, BatchStats, NormSaved};
pub use kernels::pool::Pool2dParams;
pub use tensor::{broadcast_shapes, normalize_axis, Shape, Tensor};
