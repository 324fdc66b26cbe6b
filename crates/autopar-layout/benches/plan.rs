//! Planning time for an [8192, 8192] tensor on 4096 devices between different layouts, and the
//! simulation of a smaller case. Prints a table; run with `cargo bench -p autopar-layout`.

use std::hint::black_box;
use std::time::Instant;

use autopar_layout::{plan, scatter, simulate, Block, TensorLayout, TensorMap};

fn layout(dev: &[usize], map: &str, shape: &[usize]) -> TensorLayout {
    TensorLayout::from_mindspore(dev, &map.parse::<TensorMap>().unwrap(), shape).unwrap()
}

fn time_plan(name: &str, src: &TensorLayout, dst: &TensorLayout) {
    let p = plan(src, dst).unwrap();
    let iters = 200;
    let start = Instant::now();
    for _ in 0..iters {
        black_box(plan(black_box(src), black_box(dst)).unwrap());
    }
    let per = start.elapsed().as_secs_f64() / iters as f64;
    println!("{:<44} {:>10.1} us/plan  {:>2} steps  {:>12} bytes/rank  {}", name, per * 1e6, p.steps.len(), p.bytes_sent_per_rank(4), p);
}

fn main() {
    let shape = [8192, 8192];
    println!("planning, [8192, 8192] f32 on 4096 devices");
    time_plan("[64,64] S0S1 -> [4096] S0 (gathers + a2a)", &layout(&[64, 64], "1,0", &shape), &layout(&[4096], "0,-1", &shape));
    time_plan("[64,64] S0S1 -> [64,64] S1S0 (permutation)", &layout(&[64, 64], "1,0", &shape), &layout(&[64, 64], "0,1", &shape));
    time_plan("[16,16,16] -> [16,256] (refined meshes)", &layout(&[16, 16, 16], "2,(1,0)", &shape), &layout(&[16, 256], "-1,1", &shape));
    time_plan(
        "[64,64] partial -> [64,64] S0 (reduce-scatter)",
        &layout(&[64, 64], "1,-1", &shape).with_partial(vec![1]).unwrap(),
        &layout(&[64, 64], "(1,0),-1", &shape),
    );
    time_plan("[4096] R -> [64,64] S0S1 (local slices)", &layout(&[4096], "-1,-1", &shape), &layout(&[64, 64], "1,0", &shape));

    println!();
    println!("simulation, [1024, 1024] f32 on 16 devices");
    let shape = [1024, 1024];
    let src = layout(&[4, 4], "1,0", &shape);
    let dst = layout(&[16], "-1,0", &shape);
    let p = plan(&src, &dst).unwrap();
    let full = Block::<f32>::from_fn(shape.to_vec(), |i| i as f32);
    let locals = scatter(&full, &src).unwrap();
    let start = Instant::now();
    let iters = 10;
    for _ in 0..iters {
        black_box(simulate(&p, locals.clone()).unwrap());
    }
    let per = start.elapsed().as_secs_f64() / iters as f64;
    let bytes = (full.data().len() * 4) as f64;
    println!("{:<44} {:>10.2} ms/run  ({:.2} GB/s of tensor)  {}", "[4,4] S0S1 -> [16] S1", per * 1e3, bytes / per / 1e9, p);
}
