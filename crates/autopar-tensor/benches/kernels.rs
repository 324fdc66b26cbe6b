//! Kernel benchmark: GEMM 1024x1024 (f32, and bf16 with f32 accumulation), the MLP 784-512-512-10 training step at batch 64 (forward,
//! loss, backward, SGD update), Conv2D 64->64 3x3 (pad 1) on 32x32 at batch 32 forward and
//! backward. Each case runs single-threaded and on every core of the rayon pool; each figure
//! is the median of several runs.
//!
//! `cargo bench -p autopar-tensor --bench kernels` prints the table. With
//! `AUTOPAR_BENCH_PYTHON=/path/to/python` (an interpreter with torch and numpy), the same cases
//! run in PyTorch (and GEMM in numpy) at the same thread counts, interleaved with autopar round
//! by round (`AUTOPAR_BENCH_ROUNDS`, 3): the table gives each side's median over the rounds and
//! the median of the per-round ratios time(autopar) / time(PyTorch) (below 1: autopar faster).

use std::process::Command;
use std::time::Instant;

use autopar_tensor::kernels::{conv, elementwise as ew, loss, matmul};
use autopar_tensor::{random, Conv2dParams, DType, ExecCtx, Tensor};

fn median_ms(iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    let t: Vec<f64> = (0..iters)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(t)
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

struct Mlp {
    ws: Vec<Tensor>,
    bs: Vec<Tensor>,
}

fn mlp_step(c: &ExecCtx, m: &mut Mlp, x: &Tensor, labels: &Tensor, lr: f64) -> f64 {
    // Forward.
    let mut acts = vec![x.clone()];
    let mut pre = vec![];
    for (i, (w, b)) in m.ws.iter().zip(&m.bs).enumerate() {
        let z = ew::bias_add(c, &matmul::matmul(c, acts.last().unwrap(), w, false, false).unwrap(), b, 1).unwrap();
        if i + 1 < m.ws.len() {
            acts.push(ew::relu(c, &z).unwrap());
        }
        pre.push(z);
    }
    let (l, probs) = loss::softmax_cross_entropy_sparse(c, pre.last().unwrap(), labels).unwrap();
    // Backward and SGD.
    let mut dz = loss::softmax_cross_entropy_sparse_backward(c, &probs, labels, &Tensor::scalar(1.0f32)).unwrap();
    for i in (0..m.ws.len()).rev() {
        let dw = matmul::matmul_grad_b(c, &acts[i], &dz, false, false).unwrap();
        let db = ew::bias_add_grad(c, &dz, 1).unwrap();
        if i > 0 {
            let da = matmul::matmul_grad_a(c, &m.ws[i], &dz, false, false).unwrap();
            dz = ew::relu_backward(c, &pre[i - 1], &da).unwrap();
        }
        m.ws[i] = ew::sub(c, &m.ws[i], &ew::scale(c, &dw, lr).unwrap()).unwrap();
        m.bs[i] = ew::sub(c, &m.bs[i], &ew::scale(c, &db, lr).unwrap()).unwrap();
    }
    l.item().unwrap()
}

fn run_cases(threads: usize) -> Vec<(String, f64, f64)> {
    let c = if threads == 1 { ExecCtx::serial() } else { ExecCtx::parallel() };
    let mut rows = vec![];
    // GEMM.
    let a = random::uniform(&[1024, 1024], -1.0, 1.0, 1, DType::F32);
    let b = random::uniform(&[1024, 1024], -1.0, 1.0, 2, DType::F32);
    let ms = median_ms(15, || {
        matmul::matmul(&c, &a, &b, false, false).unwrap();
    });
    rows.push(("gemm 1024x1024x1024 f32".to_string(), ms, 2.0 * 1024f64.powi(3) / ms / 1e6));
    // The same product in bf16 (f32 accumulation; bf16 dot products where the CPU has them).
    let (a16, b16) = (a.cast(DType::BF16), b.cast(DType::BF16));
    let ms = median_ms(15, || {
        matmul::matmul(&c, &a16, &b16, false, false).unwrap();
    });
    let path = if autopar_tensor::kernels::bf16_gemm::has_bf16_dot() { "vdpbf16ps" } else { "widened" };
    rows.push((format!("gemm 1024x1024x1024 bf16 ({path})"), ms, 2.0 * 1024f64.powi(3) / ms / 1e6));
    // MLP step.
    let dims = [784, 512, 512, 10];
    let mut m = Mlp {
        ws: (0..3).map(|i| random::normal(&[dims[i], dims[i + 1]], 0.0, 0.05, 10 + i as u64, DType::F32)).collect(),
        bs: (0..3).map(|i| Tensor::zeros(&[dims[i + 1]], DType::F32)).collect(),
    };
    let x = random::uniform(&[64, 784], 0.0, 1.0, 3, DType::F32);
    let labels = Tensor::from_vec(&[64], (0..64).map(|i| (i * 7 % 10) as i64).collect()).unwrap();
    let flops = 3.0 * 2.0 * 64.0 * (784.0 * 512.0 + 512.0 * 512.0 + 512.0 * 10.0);
    let ms = median_ms(50, || {
        mlp_step(&c, &mut m, &x, &labels, 0.01);
    });
    rows.push(("mlp 784-512-512-10 step, batch 64".to_string(), ms, flops / ms / 1e6));
    // Conv2D, batch 32: ResNet-18's (CIFAR stem) layers: the 3x3 stride-1 layer of each stage,
    // the stride-2 3x3 entering stages 2-4, the 1x1 stride-2 shortcut and the stem.
    let shapes = [
        (64usize, 64usize, 32usize, 3usize, 1usize),
        (128, 128, 16, 3, 1),
        (256, 256, 8, 3, 1),
        (512, 512, 4, 3, 1),
        (64, 128, 32, 3, 2),
        (128, 256, 16, 3, 2),
        (256, 512, 8, 3, 2),
        (256, 512, 8, 1, 2),
        (3, 64, 32, 3, 1),
    ];
    for (k, (cin, cout, hw, kernel, stride)) in shapes.into_iter().enumerate() {
        let p = Conv2dParams::new(stride, kernel / 2);
        let seed = 4 + 3 * k as u64;
        let out = hw / stride;
        let xi = random::uniform(&[32, cin, hw, hw], -1.0, 1.0, seed, DType::F32);
        let w = random::normal(&[cout, cin, kernel, kernel], 0.0, 0.05, seed + 1, DType::F32);
        let dy = random::uniform(&[32, cout, out, out], -1.0, 1.0, seed + 2, DType::F32);
        let cflops = 2.0 * 32.0 * (cout * out * out * cin * kernel * kernel) as f64;
        let name = format!("conv2d {cin}->{cout} {kernel}x{kernel}/{stride} {hw}x{hw} b32");
        let ms = median_ms(7, || {
            conv::conv2d(&c, &xi, &w, &p).unwrap();
        });
        rows.push((format!("{name} forward"), ms, cflops / ms / 1e6));
        let ms = median_ms(5, || {
            conv::conv2d_backward_input(&c, &dy, &w, xi.shape(), &p).unwrap();
        });
        rows.push((format!("  {name} dx"), ms, cflops / ms / 1e6));
        let ms = median_ms(5, || {
            conv::conv2d_backward_weight(&c, &dy, &xi, w.shape(), &p).unwrap();
        });
        rows.push((format!("  {name} dw"), ms, cflops / ms / 1e6));
    }
    rows
}

fn reference(python: &str, threads: usize) -> Option<Vec<(String, f64)>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/torch_reference.py");
    let out = Command::new(python).arg(script).arg(threads.to_string()).output().ok()?;
    if !out.status.success() {
        eprintln!("reference run failed: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.rsplit_once('\t')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect(),
    )
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let all = rayon::current_num_threads();
    let python = std::env::var("AUTOPAR_BENCH_PYTHON").ok();
    let rounds: usize = std::env::var("AUTOPAR_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3).max(1);
    println!(
        "autopar-tensor kernels ({} threads available, backend {}), medians of {rounds} interleaved rounds",
        all,
        ExecCtx::default().backend().name()
    );
    println!("{:<48} {:>7} {:>11} {:>9} {:>12} {:>12} {:>8}", "case", "threads", "autopar ms", "GFLOP/s", "torch ms", "numpy ms", "ratio");
    let mut counts = vec![1];
    if all > 1 {
        counts.push(all);
    }
    for threads in counts {
        // Per case: autopar's ms and GFLOP/s, PyTorch's and numpy's ms, one entry per round.
        let mut ours: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
        let mut peers: Vec<(Vec<f64>, Vec<f64>)> = Vec::new();
        for _ in 0..rounds {
            let cases = run_cases(threads);
            let refs = python.as_deref().and_then(|p| reference(p, threads)).unwrap_or_default();
            let find = |k: &str| refs.iter().find(|(n, _)| n == k).map(|r| r.1);
            for (i, (name, ms, gflops)) in cases.into_iter().enumerate() {
                if ours.len() <= i {
                    ours.push((name.clone(), Vec::new(), Vec::new()));
                    peers.push((Vec::new(), Vec::new()));
                }
                ours[i].1.push(ms);
                ours[i].2.push(gflops);
                peers[i].0.extend(find(&format!("torch {name}")));
                peers[i].1.extend(find(&format!("numpy {name}")));
            }
        }
        for ((name, ms, gflops), (torch, numpy)) in ours.into_iter().zip(peers) {
            let fmt = |v: &[f64]| if v.len() == rounds { format!("{:.3}", median(v.to_vec())) } else { "-".into() };
            let ratio = if torch.len() == rounds {
                format!("{:.2}", median(ms.iter().zip(&torch).map(|(a, t)| a / t).collect()))
            } else {
                "-".into()
            };
            let (m, g) = (median(ms), median(gflops));
            println!("{name:<48} {threads:>7} {m:>11.3} {g:>9.1} {:>12} {:>12} {ratio:>8}", fmt(&torch), fmt(&numpy));
        }
    }
    println!("ratio = median over rounds of time(autopar) / time(PyTorch) (below 1: autopar is faster)");
}
