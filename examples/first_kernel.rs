//! A kernel author's first tiled kernel: written with `#[kernel]`, run through the block
//! simulator against a CPU reference, printed as PTX, and launched when a GPU is present.
//!
//! `cargo run --release --example first_kernel`
//!
//! The kernel normalizes each row of an `[R, 128]` matrix to unit length: one block per 16 rows,
//! the rows loaded into a register fragment, squared, summed along the row, and scaled.

// `#[kernel]` expands to calls into `kda_dsl`: a crate that writes kernels depends on
// kda-dsl too (as this package does).
use kda::kernel;
use kda_dsl::DType;

/// What the kernel is specialized for (host values: they shape the kernel, not its data).
struct RowNorm {
    rows_per_block: usize,
}

/// `y[i] = x[i] / sqrt(sum_j x[i][j]^2 + 1e-6)` for every row `i` of `x [R, 128]`.
#[kernel]
fn row_norm(cfg: &RowNorm, x: Global<(R, C), F32>, y: GlobalMut<(R, C), F32>) {
    let (bx,) = launch(grid = [ceil_div(R, cfg.rows_per_block)], threads = 128);
    assume_extent(C, 128);
    let r0 = bx * cfg.rows_per_block;
    let f = fragment([cfg.rows_per_block, 128], F32);
    let sq = fragment([cfg.rows_per_block, 128], F32);
    let norms = fragment([cfg.rows_per_block], F32);
    // Rows past R read as zero and are not written back.
    copy(x.tile_at([r0, 0], [cfg.rows_per_block, 128]).bounded([R, 128]), f);
    for (i, j) in parallel(f) {
        sq[i][j] = f[i][j] * f[i][j];
    }
    reduce_sum(sq, norms, 1);
    for (i, j) in parallel(f) {
        f[i][j] = f[i][j] * rsqrt(norms[i] + 1e-6);
    }
    copy(f, y.tile_at([r0, 0], [cfg.rows_per_block, 128]).bounded([R, 128]));
}

fn reference(x: &[f64], rows: usize) -> Vec<f64> {
    let mut y = x.to_vec();
    for row in y.chunks_mut(128).take(rows) {
        let n = (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        row.iter_mut().for_each(|v| *v /= n);
    }
    y
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    use kda::kernels::reference::{from_bytes, rel_err, to_bytes, Rng};
    use kda_dsl::sim::SimArg;
    let cfg = RowNorm { rows_per_block: 16 };
    let rows = 37; // not a multiple of 16: the last block's bounded copies mask it
    let mut rng = Rng::new(1);
    let x: Vec<f64> = (0..rows * 128).map(|_| rng.normal()).collect();
    let want = reference(&x, rows);

    // 1. The kernel definition: a tile program, checked at its spans.
    let def = row_norm(&cfg)?;

    // 2. The simulator runs the thread IR the PTX printer prints, block by block.
    let mut args = vec![
        ("x".to_string(), SimArg::Tensor(to_bytes(&x, DType::F32))),
        ("y".to_string(), SimArg::Tensor(to_bytes(&vec![f64::NAN; rows * 128], DType::F32))),
        ("R".to_string(), SimArg::I32(rows as i32)),
        ("C".to_string(), SimArg::I32(128)),
    ];
    kda::kernels::check::simulate(&def, &mut args)?;
    let got = kda::kernels::check::tensor_values(&args, "y", DType::F32);
    println!("simulator: relative error {:.2e} against the f64 reference", rel_err(&got, &want));

    // 3. PTX for sm_80 (the driver JITs it for newer GPUs).
    let compiled = kda_dsl::compile(def, kda_dsl::Target::Sm80)?;
    let first: Vec<&str> =
        compiled.ptx.lines().filter(|l| l.contains(".entry") || l.contains("shfl")).take(3).collect();
    println!("PTX: {} lines, e.g.\n  {}", compiled.ptx.lines().count(), first.join("\n  "));

    // 4. On a GPU: launch it through the runtime's binding (shapes give R and C).
    if !kda::gpu_available() {
        println!("no GPU here: skipping the launch");
        return Ok(());
    }
    use kda::runtime::{launch, DeviceTensor, KernelArg, ModuleCache};
    let gpu = kda::Gpu::new(0)?;
    let stream = gpu.new_stream()?;
    let xs: Vec<f32> = x.iter().map(|v| *v as f32).collect();
    let xd = DeviceTensor::from_f32(&gpu, &stream, &[rows, 128], DType::F32, &xs)?;
    let yd = DeviceTensor::zeros(&gpu, &stream, &[rows, 128], DType::F32)?;
    let bound = [("x", KernelArg::Tensor(xd.view())), ("y", KernelArg::Tensor(yd.view()))];
    launch(&gpu, &ModuleCache::new(), &stream, &compiled, "row_norm", &bound)?;
    let gpu_y = from_bytes(&yd.to_bytes(&stream)?, DType::F32);
    println!("GPU ({}): relative error {:.2e}", gpu.name(), rel_err(&gpu_y, &want));
    Ok(())
}
