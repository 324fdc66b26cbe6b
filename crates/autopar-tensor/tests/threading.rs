//! Serial and multi-threaded execution give bit-identical results for every kernel.

use autopar_tensor::kernels::{conv, dropout, elementwise as ew, loss, matmul, norm, pool, reduce, shape};
use autopar_tensor::{random, Conv2dParams, DType, ExecCtx, Pool2dParams, Tensor};

fn r(shape: &[usize], seed: u64) -> Tensor {
    random::uniform(shape, -1.0, 1.0, seed, DType::F32)
}

/// Runs `f` serially and on a 4-thread pool with every size going parallel; all outputs must match bitwise.
fn same(name: &str, f: impl Fn(&ExecCtx) -> Vec<Tensor> + Sync) {
    let serial = f(&ExecCtx::serial());
    let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
    let par_ctx = ExecCtx::parallel().with_min_parallel_len(0);
    let parallel = pool.install(|| f(&par_ctx));
    let default = pool.install(|| f(&ExecCtx::parallel()));
    assert_eq!(serial.len(), parallel.len());
    for (i, ((s, p), d)) in serial.iter().zip(&parallel).zip(&default).enumerate() {
        assert!(s.bit_eq(p), "{name}: output {i} differs between serial and parallel (max diff {:?})", s.max_abs_diff(p));
        assert!(s.bit_eq(d), "{name}: output {i} differs between serial and default-threshold parallel");
    }
}

#[test]
fn matrix_products_are_identical_serial_and_parallel() {
    let (a, b) = (r(&[300, 257], 1), r(&[257, 190], 2));
    same("matmul", |c| vec![matmul::matmul(c, &a, &b, false, false).unwrap()]);
    let dy = r(&[300, 190], 3);
    same("matmul_grads", |c| {
        let (x, y) = matmul::matmul_grads(c, &a, &b, &dy, false, false).unwrap();
        vec![x, y]
    });
    let (p, q) = (r(&[6, 40, 33], 4), r(&[6, 40, 21], 5));
    same("batch_matmul", |c| vec![matmul::batch_matmul(c, &p, &q, true, false).unwrap()]);
}

#[test]
fn element_wise_kernels_and_reductions_are_identical_serial_and_parallel() {
    let x = r(&[64, 37, 29], 6);
    let y = r(&[37, 1], 7);
    same("binary", |c| {
        let dy = r(&[64, 37, 29], 8);
        let (ga, gb) = ew::binary_grads(c, ew::BinaryOp::Div, &x, &ew::add_scalar(c, &y, 3.0).unwrap(), &dy).unwrap();
        vec![ew::mul(c, &x, &y).unwrap(), ga, gb]
    });
    same("unary", |c| {
        vec![
            ew::gelu(c, &x, true).unwrap(),
            ew::gelu(c, &x, false).unwrap(),
            ew::sigmoid(c, &x).unwrap(),
            ew::relu_backward(c, &x, &x).unwrap(),
            ew::bias_add_grad(c, &x, 1).unwrap(),
        ]
    });
    same("reduce", |c| {
        vec![
            reduce::reduce_sum(c, &x, &[], false).unwrap(),
            reduce::reduce_sum(c, &x, &[0], false).unwrap(),
            reduce::reduce_sum(c, &x, &[0, 1], true).unwrap(),
            ew::bias_add_grad(c, &r(&[512, 300], 17), 1).unwrap(),
            reduce::reduce_mean(c, &x, &[0, 2], true).unwrap(),
            reduce::reduce_max(c, &x, &[1], false).unwrap(),
            reduce::softmax(c, &x, 1).unwrap(),
            reduce::log_softmax(c, &x, -1).unwrap(),
        ]
    });
}

#[test]
fn convolution_normalisation_and_pooling_are_identical_serial_and_parallel() {
    let x = r(&[4, 16, 18, 18], 9);
    let p = Conv2dParams { stride: [1, 1], padding: [1; 4], dilation: [1, 1], groups: 2 };
    // Nine images: three weight-gradient groups summed in order; a 3x3 and a pointwise kernel.
    let xc = r(&[9, 8, 10, 10], 20);
    for (w, p) in [(r(&[12, 4, 3, 3], 10), p), (r(&[6, 8, 1, 1], 21), Conv2dParams::default())] {
        check_conv(&xc, &w, &p);
    }
    // Small planes, one block of all four images: the block's im2col, output copy and dY
    // transpose run on the threads inside the block.
    check_conv(&r(&[4, 8, 6, 6], 24), &r(&[6, 8, 3, 3], 25), &Conv2dParams::new(1, 1));
    // Enough channels per group for the shifted-GEMM forward (and the flipped-kernel dx).
    check_conv(&r(&[5, 32, 9, 9], 22), &r(&[40, 32, 3, 3], 23), &Conv2dParams::new(1, 1));
    let g = r(&[16], 12);
    let b = r(&[16], 13);
    same("batch_norm", |c| {
        let z = Tensor::zeros(&[16], DType::F32);
        let o = Tensor::ones(&[16], DType::F32);
        let out = norm::batch_norm_train(c, &x, &g, &b, &z, &o, 0.9, 1e-5).unwrap();
        let (dx, dg, db) = norm::batch_norm_backward(c, &x, &g, &out.saved, &x).unwrap();
        vec![out.y, out.running_mean, out.running_var, dx, dg, db]
    });
    let g2 = r(&[18, 18], 14);
    same("layer_norm", |c| {
        let (y, s) = norm::layer_norm(c, &x, &g2, &g2, -2, 1e-5).unwrap();
        let (dx, dg, db) = norm::layer_norm_backward(c, &x, &g2, &s, &y, -2).unwrap();
        vec![y, dx, dg, db]
    });
    let pp = Pool2dParams { kernel: [3, 3], stride: [2, 2], padding: [1; 4], count_include_pad: false };
    same("pool", |c| {
        let (y, am) = pool::max_pool2d(c, &x, &pp).unwrap();
        let a = pool::avg_pool2d(c, &x, &pp).unwrap();
        vec![
            pool::max_pool2d_backward(c, &y, &am, x.shape()).unwrap(),
            pool::avg_pool2d_backward(c, &a, x.shape(), &pp).unwrap(),
            y,
            a,
            pool::global_avg_pool(c, &x, true).unwrap(),
        ]
    });
}

fn check_conv(xc: &Tensor, w: &Tensor, p: &Conv2dParams) {
    same("conv2d", |c| {
        let y = conv::conv2d(c, xc, w, p).unwrap();
        let dy = r(y.shape(), 11);
        vec![
            y,
            conv::conv2d_backward_input(c, &dy, w, xc.shape(), p).unwrap(),
            conv::conv2d_backward_weight(c, &dy, xc, w.shape(), p).unwrap(),
        ]
    });
}

#[test]
fn gather_dropout_and_loss_are_identical_serial_and_parallel() {
    let table = r(&[1000, 64], 15);
    let idx = Tensor::from_vec(&[512], (0..512).map(|i| ((i * 7919) % 1000) as i64).collect()).unwrap();
    same("gather", |c| {
        let y = shape::gather(c, &table, &idx, 0).unwrap();
        vec![shape::gather_backward(c, &y, &idx, table.shape(), 0).unwrap(), y]
    });
    let x = r(&[256, 300], 16);
    same("dropout", |c| {
        let (y, m) = dropout::dropout(c, &x, 0.3, 42).unwrap();
        vec![y, m]
    });
    let labels = Tensor::from_vec(&[256], (0..256i32).map(|i| i % 300).collect()).unwrap();
    same("softmax_cross_entropy", |c| {
        let (l, p) = loss::softmax_cross_entropy_sparse(c, &x, &labels).unwrap();
        let g = loss::softmax_cross_entropy_sparse_backward(c, &p, &labels, &Tensor::scalar(1.0f32)).unwrap();
        vec![l, p, g]
    });
}
