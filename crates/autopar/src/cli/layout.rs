//! `autopar layout`: debug a strategy by looking at what every rank holds.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use autopar_layout::mindspore::parse_usize_list;
use autopar_layout::{plan, strategy_layouts, DevMatrixRule, Strategy, TensorLayout, TensorMap};
use clap::{Args, ValueEnum};

/// The flags of `autopar layout`.
#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    autopar layout --dev-matrix 2,4 --tensor-map -1,0 --shape 64,128\n  \
    autopar layout --dev-matrix 2,2,2 --tensor-map '-1,(1,0)' --shape 64,128\n  \
    autopar layout --dev-matrix 8 --tensor-map 0,-1 --shape 256,64 --to-dev-matrix 2,4 --to-tensor-map 1,-1\n  \
    autopar layout --strategy '((2,1),(1,4))' --devices 8 --op matmul --shapes '256,64;64,128'")]
pub struct LayoutArgs {
    /// Device matrix, e.g. 2,4 (product = number of devices, at most 4096).
    #[arg(long, value_name = "DIMS", help_heading = "Layout")]
    dev_matrix: Option<String>,
    /// Tensor map in MindSpore's convention: values count device axes from the right, -1 = not
    /// split, a tuple such as (1,0) splits one dimension over several axes.
    #[arg(long, value_name = "MAP", allow_hyphen_values = true, help_heading = "Layout")]
    tensor_map: Option<String>,
    /// Full tensor shape, e.g. 64,128.
    #[arg(long, value_name = "SHAPE", help_heading = "Layout")]
    shape: Option<String>,
    /// Device axes (right-counted, as in tensor maps) along which the tensor is a pending partial sum.
    #[arg(long, value_name = "AXES", help_heading = "Layout")]
    partial: Option<String>,

    /// Destination device matrix: print the redistribution plan from the layout to this one.
    #[arg(long, value_name = "DIMS", help_heading = "Redistribution")]
    to_dev_matrix: Option<String>,
    /// Destination tensor map.
    #[arg(long, value_name = "MAP", allow_hyphen_values = true, help_heading = "Redistribution")]
    to_tensor_map: Option<String>,
    /// Destination partial-sum axes.
    #[arg(long, value_name = "AXES", help_heading = "Redistribution")]
    to_partial: Option<String>,
    /// Bytes per element for the communication volume of the plan.
    #[arg(long, default_value_t = 4, help_heading = "Redistribution")]
    elem_size: usize,

    /// An operator strategy such as ((2,1),(1,4)): print its device matrix and tensor maps.
    #[arg(long, value_name = "STRATEGY", help_heading = "Strategy")]
    strategy: Option<String>,
    /// Number of devices the strategy runs on.
    #[arg(long, value_name = "N", help_heading = "Strategy")]
    devices: Option<usize>,
    /// Operator family deciding the device matrix.
    #[arg(long, value_enum, default_value_t = OpFamily::Matmul, help_heading = "Strategy")]
    op: OpFamily,
    /// MatMul's second input is transposed (its strategy is written as (j, k)).
    #[arg(long, help_heading = "Strategy")]
    transpose_b: bool,
    /// Place the repeated-calculation axis on the left of the device matrix instead of the right.
    #[arg(long, help_heading = "Strategy")]
    repeat_left: bool,
    /// Input shapes separated by ';' (e.g. 256,64;64,128): also print each input's slices.
    #[arg(long, value_name = "SHAPES", help_heading = "Strategy")]
    shapes: Option<String>,

    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OpFamily {
    Matmul,
    Elementwise,
}

/// Runs `autopar layout`: prints slices, layouts or a redistribution plan.
pub fn run(args: LayoutArgs) -> Result<ExitCode> {
    if let Some(strategy) = &args.strategy {
        return run_strategy(&args, strategy);
    }
    let (Some(dev), Some(map), Some(shape)) = (&args.dev_matrix, &args.tensor_map, &args.shape) else {
        let missing: Vec<&str> =
            [("--dev-matrix", args.dev_matrix.is_none()), ("--tensor-map", args.tensor_map.is_none()), ("--shape", args.shape.is_none())]
                .into_iter()
                .filter_map(|(flag, gone)| gone.then_some(flag))
                .collect();
        bail!(
            "missing layout: no {}\n  give --dev-matrix, --tensor-map and --shape, or --strategy and --devices\nhint: autopar layout --dev-matrix 2,4 --tensor-map -1,0 --shape 64,128",
            missing.join(", ")
        );
    };
    let src = parse_layout(dev, map, shape, args.partial.as_deref())?;
    if args.to_dev_matrix.is_some() || args.to_tensor_map.is_some() {
        let to_dev = args.to_dev_matrix.as_deref().unwrap_or(dev);
        let to_map = args.to_tensor_map.as_deref().unwrap_or(map);
        let dst = parse_layout(to_dev, to_map, shape, args.to_partial.as_deref())?;
        let p = plan(&src, &dst)?;
        if args.json {
            let steps: Vec<_> = p
                .steps
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "op": s.step.to_string(),
                        "layout_after": s.after.to_string(),
                        "bytes_sent_per_rank": s.step.bytes_sent(s.input_len, args.elem_size),
                    })
                })
                .collect();
            let out =
                serde_json::json!({"chain": p.to_string(), "steps": steps, "bytes_sent_per_rank": p.bytes_sent_per_rank(args.elem_size)});
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            print!("{}", p.describe(args.elem_size));
            println!("total: {} bytes sent per rank", p.bytes_sent_per_rank(args.elem_size));
        }
        return Ok(ExitCode::SUCCESS);
    }
    print_layout(&src, args.json)?;
    Ok(ExitCode::SUCCESS)
}

fn parse_layout(dev: &str, map: &str, shape: &str, partial: Option<&str>) -> Result<TensorLayout> {
    let dev = parse_usize_list("device matrix", dev)?;
    let map: TensorMap = map.parse()?;
    let shape = parse_usize_list("shape", shape)?;
    let layout = TensorLayout::from_mindspore(&dev, &map, &shape)?;
    match partial {
        None => Ok(layout),
        Some(p) => {
            let n = dev.len();
            let given = parse_usize_list("partial axes", p)?;
            if let Some(v) = given.iter().enumerate().find_map(|(i, v)| given[..i].contains(v).then_some(*v)) {
                bail!("--partial names axis {v} twice\nhint: list each partial-sum axis once, right-counted as in tensor maps");
            }
            let axes = given
                .iter()
                .map(|&v| if v < n { Ok(n - 1 - v) } else { bail!("partial axis {v} is out of range for device matrix {dev:?}") })
                .collect::<Result<Vec<_>>>()?;
            // The layout's own message counts axes from the left: say it as given.
            layout.with_partial(axes).map_err(|e| match e {
                autopar_layout::LayoutError::PartialAxisAlsoSplits { axis, dim } => anyhow::anyhow!(
                    "partial-sum axis {} (right-counted, as given) also splits tensor dimension {dim}\nhint: a tensor is either split or a pending partial sum along one device axis, not both",
                    n - 1 - axis
                ),
                e => e.into(),
            })
        }
    }
}

fn print_layout(l: &TensorLayout, json: bool) -> Result<()> {
    let n = l.mesh().num_devices();
    if json {
        let ranks: Vec<_> = (0..n)
            .map(|r| -> Result<_> {
                Ok(serde_json::json!({
                    "rank": r,
                    "coordinate": l.mesh().coordinate(r)?,
                    "slice": l.slice_of(r)?.iter().map(|x| [x.start, x.end]).collect::<Vec<_>>(),
                    "slice_index": l.slice_index(r)?,
                    "replica_group": l.replica_group(r)?,
                }))
            })
            .collect::<Result<_>>()?;
        let out = serde_json::json!({
            "dev_matrix": l.mesh().dims(),
            "tensor_map": l.tensor_map().to_string(),
            "shape": l.shape(),
            "slice_shape": l.slice_shape(),
            "placements": l.to_string(),
            "ranks": ranks,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "dev_matrix {:?}  tensor_map {}  shape {:?}  ->  slice shape {:?}  ({}; {} distinct slices)",
        l.mesh().dims(),
        l.tensor_map(),
        l.shape(),
        l.slice_shape(),
        l,
        l.num_slices()
    );
    println!("{:>5}  {:<14} {:<28} {:>5}  replica group", "rank", "coordinate", "slice", "index");
    for r in 0..n {
        let coord = l.mesh().coordinate(r)?;
        let slice = l.slice_of(r)?.iter().fold(String::new(), |mut s, x| {
            let _ = write!(s, "{}{}:{}", if s.is_empty() { "" } else { ", " }, x.start, x.end);
            s
        });
        let group = l.replica_group(r)?.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",");
        println!("{:>5}  {:<14} {:<28} {:>5}  {}", r, format!("{coord:?}"), format!("[{slice}]"), l.slice_index(r)?, group);
    }
    Ok(())
}

fn run_strategy(args: &LayoutArgs, strategy: &str) -> Result<ExitCode> {
    let strategy: Strategy = strategy.parse()?;
    let devices = args.devices.context("--strategy needs --devices N")?;
    let rule = match args.op {
        OpFamily::Matmul => DevMatrixRule::MatMul { transpose_a: false, transpose_b: args.transpose_b },
        OpFamily::Elementwise => DevMatrixRule::Elementwise,
    };
    let op = strategy_layouts(rule, &strategy, devices, !args.repeat_left)?;
    // The shapes, all checked before anything is printed: one per input, a MatMul's contracted
    // dimensions equal, each input's layout valid.
    let mut layouts = Vec::new();
    if let Some(shapes) = &args.shapes {
        let shapes: Vec<Vec<usize>> = shapes.split(';').map(|s| parse_usize_list("shape", s)).collect::<std::result::Result<_, _>>()?;
        if shapes.len() != op.inputs.len() {
            bail!(
                "--shapes gives {} shape(s), and strategy {strategy} has {} inputs\nhint: give one shape per input, separated by ';', e.g. --shapes '256,64;64,128'",
                shapes.len(),
                op.inputs.len()
            );
        }
        if let (OpFamily::Matmul, [a, b]) = (args.op, &shapes[..]) {
            let k_b = if args.transpose_b { 1 } else { 0 };
            if a.len() == 2 && b.len() == 2 && a[1] != b[k_b] {
                bail!(
                    "--shapes {a:?} and {b:?} do not multiply: the MatMul contracts {} with {}\nhint: the first input's columns equal the second's {} (--transpose-b)",
                    a[1],
                    b[k_b],
                    if args.transpose_b { "columns" } else { "rows" }
                );
            }
        }
        for (i, shape) in shapes.into_iter().enumerate() {
            layouts.push(op.input_layout(i, &shape).with_context(|| format!("input {i} with shape {shape:?}"))?);
        }
    }
    if args.json {
        let out = serde_json::json!({
            "strategy": strategy.to_string(),
            "dev_matrix": op.dev_matrix.dims(),
            "repeat": op.repeat,
            "inputs": op.inputs.iter().map(|m| m.to_string()).collect::<Vec<_>>(),
            "output": op.output.to_string(),
            "input_slices": layouts.iter().map(|l| serde_json::json!({
                "shape": l.shape(),
                "slice_shape": l.slice_shape(),
                "placements": l.to_string(),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("strategy {strategy} on {devices} devices");
    println!("  dev_matrix {:?}  (repeated calculation x{})", op.dev_matrix.dims(), op.repeat);
    for (i, m) in op.inputs.iter().enumerate() {
        println!("  input {i}: tensor_map {m}");
    }
    println!("  output : tensor_map {}", op.output);
    for (i, l) in layouts.iter().enumerate() {
        println!();
        println!("input {i}:");
        print_layout(l, false)?;
    }
    Ok(ExitCode::SUCCESS)
}
