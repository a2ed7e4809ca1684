//! Benchmarks (`curate bench ...`): they print figures and assert nothing. `bench bow` times
//! the default BoW cascade (`curate run`) against the I/O floor — reading the same TSV and
//! writing its caption column to Parquet — each in a child process, alternating, so both see the
//! same machine state, and each starting with the input in the page cache; it reports
//! captions/s, CPU seconds, the ratio and the children's peak RSS, then the BoW stage alone on the
//! input parsed in memory (`bench bow-stage`), beside the time that 2× the floor leaves it.
//! `bench knn` times exact top-k search (`knn::exact_top_k`) on matrices from files, for
//! `benches/knn_bench.py` to compare with faiss.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::builder::StringBuilder;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use clap::Args;

use crate::error::{Error, Result};
use crate::io::lines::Lines;
use crate::io::parquet::ShardedWriter;

#[derive(Debug, Args)]
pub struct BowBenchArgs {
    /// A CC3M-format TSV (`caption<TAB>url`), e.g. made by `data/gen_cc3m_sample.py --rows 2900000`.
    #[arg(long)]
    pub input: PathBuf,
    /// Scratch folder for the outputs.
    #[arg(long, default_value = "out/bench")]
    pub out: PathBuf,
    /// Runs of each; the best wall time is reported (plus all runs).
    #[arg(long, default_value_t = 3, value_parser = positive)]
    pub repeat: usize,
}

/// Reads `input` and writes its caption column to Parquet with the pipelines' writer (same
/// settings; row groups compressed on the pool while reading goes on).
pub fn io_floor(input: &Path, output: &Path) -> Result<u64> {
    let schema = Arc::new(Schema::new(vec![Field::new("caption", DataType::Utf8, true)]));
    let mut w = ShardedWriter::new(output, "part", schema.clone(), 1_000_000, &[])?;
    let mut lines = Lines::open(input)?;
    let mut b = StringBuilder::new();
    let mut rows = 0u64;
    while let Some((_, line)) = lines.next_line()? {
        let caption = line.split(|&c| c == b'\t').next().unwrap_or(b"");
        b.append_value(String::from_utf8_lossy(caption));
        rows += 1;
        if rows.is_multiple_of(crate::stages::CHUNK_ROWS as u64) {
            w.write(&RecordBatch::try_new(schema.clone(), vec![Arc::new(b.finish()) as ArrayRef])?)?;
        }
    }
    w.write(&RecordBatch::try_new(schema, vec![Arc::new(b.finish()) as ArrayRef])?)?;
    w.finish()?;
    Ok(rows)
}

/// The BoW stage alone, on an input already parsed into memory (reading is not timed, nothing is
/// written): the fit passes, then `apply` on every chunk in parallel as the streaming pass runs
/// it. Prints the process's wall and CPU seconds (user + system) of each part, so that `bench bow`
/// can set the stage's own cost against the 2× budget.
pub fn bow_stage(pipeline: &Path) -> Result<()> {
    use rayon::prelude::*;
    let mut plan = crate::pipeline::plan::compile(pipeline, &[])?;
    if plan.transforms.len() != 1 {
        return Err(Error::data("`bench bow-stage` takes a pipeline of one reader and one transform"));
    }
    let chunks: Vec<crate::schema::Chunk> = plan.reader.open()?.collect::<Result<_>>()?;
    let firsts: Vec<u64> = chunks
        .iter()
        .scan(0u64, |acc, c| {
            let first = *acc;
            *acc += c.batch.num_rows() as u64;
            Some(first)
        })
        .collect();
    let cpu = || {
        // SAFETY: `rusage` is plain data that `getrusage` fills for this process.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
        cpu_seconds(&u)
    };
    let (t0, c0) = (Instant::now(), cpu());
    let stage = &mut plan.transforms[0].1;
    for pass in 0..stage.fit_passes() {
        if stage.wants_pass(pass) {
            for (c, &first) in chunks.iter().zip(&firsts) {
                stage.fit(pass, &c.batch, first)?;
            }
            stage.end_pass(pass)?;
        }
    }
    stage.start_stream()?;
    let (t1, c1) = (Instant::now(), cpu());
    let stage = &plan.transforms[0].1;
    let kept: u64 = chunks
        .into_par_iter()
        .zip(firsts)
        .map(|(c, first)| Ok(stage.apply(c, first)?.0.batch.num_rows() as u64))
        .sum::<Result<u64>>()?;
    let (t2, c2) = (Instant::now(), cpu());
    outln!(
        "fit {:.3} s wall {:.3} CPU-s; apply {:.3} s wall {:.3} CPU-s; {kept} rows kept",
        (t1 - t0).as_secs_f64(),
        c1 - c0,
        (t2 - t1).as_secs_f64(),
        c2 - c1
    );
    Ok(())
}

/// Wall seconds, peak RSS (MiB) and CPU seconds (user + system) of a child process.
fn measure(cmd: &mut std::process::Command) -> Result<(f64, f64, f64)> {
    let t = Instant::now();
    let child = cmd.stdout(std::process::Stdio::null()).spawn().map_err(|e| Error::io("cannot start", "curate", e))?;
    let mut status = 0;
    // SAFETY: `rusage` is plain data; `wait4` fills it for our own child, which we reap here
    // instead of through `Child::wait`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let secs = t.elapsed().as_secs_f64();
    if pid < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(Error::data(format!("benchmark child failed: {cmd:?}")));
    }
    Ok((secs, usage.ru_maxrss as f64 / 1024.0, cpu_seconds(&usage)))
}

/// User + system seconds of a `rusage`.
fn cpu_seconds(u: &libc::rusage) -> f64 {
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

pub fn bow(args: &BowBenchArgs) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::io("cannot find", "curate", e))?;
    // The input first: a missing one leaves nothing behind (not even the `--out` folder).
    let rows = Lines::open(&args.input).and_then(|mut l| {
        let mut n = 0u64;
        while l.next_line()?.is_some() {
            n += 1;
        }
        Ok(n)
    })?;
    std::fs::create_dir_all(&args.out).map_err(|e| Error::io("cannot create", &args.out, e))?;
    // The default cascade, and the same reader and writer without the BoW stage ("intact"):
    // the second separates the cost of the output's volume from the cost of the deformation.
    let write_pipeline = |name: &str, bow: bool| -> Result<PathBuf> {
        let file = args.out.join(format!("bench_{name}.toml"));
        let toml = format!(
            "# Written by `curate bench bow`.\noutput_dir = {:?}\nseed = 0\n\n[[stage]]\ntype = \"read_cc_tsv\"\npath = {:?}\n\n{}[[stage]]\ntype = \"write_parquet\"\n",
            args.out.join(name).to_string_lossy(),
            args.input.to_string_lossy(),
            if bow { "[[stage]]\ntype = \"bow\"\n\n" } else { "" }
        );
        std::fs::write(&file, toml).map_err(|e| Error::io("cannot write", &file, e))?;
        Ok(file)
    };
    let pipeline = write_pipeline("run", true)?;
    let intact = write_pipeline("intact", false)?;
    let floor_out = args.out.join("floor");
    let mut floor = Vec::new();
    let mut plain = Vec::new();
    let mut run = Vec::new();
    let curate_run = |file: &Path| -> Result<(f64, f64, f64)> {
        measure(
            std::process::Command::new(&exe)
                .args(["run", "--progress", "never"])
                .arg(file)
                .stderr(std::process::Stdio::null()),
        )
    };
    // Each job starts with the input in the page cache: on a machine that evicts it between
    // runs (the outputs are ~0.6 GB), whichever job came first would otherwise pay the disk.
    let warm = || -> Result<()> {
        let mut f = std::fs::File::open(&args.input).map_err(|e| Error::io("cannot open", &args.input, e))?;
        std::io::copy(&mut f, &mut std::io::sink()).map_err(|e| Error::io("cannot read", &args.input, e))?;
        Ok(())
    };
    for _ in 0..args.repeat {
        warm()?;
        floor.push(measure(
            std::process::Command::new(&exe).args(["bench", "io-floor"]).arg(&args.input).arg(&floor_out),
        )?);
        warm()?;
        plain.push(curate_run(&intact)?);
        warm()?;
        run.push(curate_run(&pipeline)?);
    }
    // The stage's own cost, on the input parsed in memory (not timed) and with nothing written.
    let stage = std::process::Command::new(&exe)
        .args(["bench", "bow-stage"])
        .arg(&pipeline)
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| Error::io("cannot start", "curate", e))?;
    if !stage.status.success() {
        return Err(Error::data("`curate bench bow-stage` failed"));
    }
    let stage = String::from_utf8_lossy(&stage.stdout).trim().to_owned();
    let best = |v: &[(f64, f64, f64)]| v.iter().map(|x| x.0).fold(f64::INFINITY, f64::min);
    let peak = |v: &[(f64, f64, f64)]| v.iter().map(|x| x.1).fold(0.0, f64::max);
    // CPU seconds of the run with the best wall time.
    let cpu =
        |v: &[(f64, f64, f64)]| v.iter().fold((f64::INFINITY, 0.0), |a, x| if x.0 < a.0 { (x.0, x.2) } else { a }).1;
    let (bf, bp, br) = (best(&floor), best(&plain), best(&run));
    outln!("input: {} ({rows} lines), {} threads", args.input.display(), rayon::current_num_threads());
    outln!("| job | best wall s | CPU s of that run | captions/s | peak RSS MiB | all runs s |");
    outln!("| --- | ---: | ---: | ---: | ---: | --- |");
    for (name, v, b) in [
        ("I/O floor (read TSV, write captions)", &floor, bf),
        ("curate run, intact (read, write all pairs columns)", &plain, bp),
        ("curate run (default BoW cascade)", &run, br),
    ] {
        let all: Vec<String> = v.iter().map(|x| format!("{:.2}", x.0)).collect();
        outln!("| {name} | {b:.2} | {:.2} | {:.0} | {:.0} | {} |", cpu(v), rows as f64 / b, peak(v), all.join(", "));
    }
    outln!(
        "ratio run / floor: {:.2}x (target <= 2x); in CPU seconds {:.2}x; run / intact run: {:.2}x; run peak RSS {:.0} MiB (target < 1536)",
        br / bf,
        cpu(&run) / cpu(&floor),
        br / bp,
        peak(&run)
    );
    outln!(
        "2x the floor leaves {:.2} s (about {:.2} CPU-s on {} threads) beyond the intact run for the BoW stage; \
         the stage alone, on the input parsed in memory and writing nothing: {stage}",
        2.0 * bf - bp,
        (2.0 * bf - bp) * rayon::current_num_threads() as f64,
        rayon::current_num_threads()
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct TextBenchArgs {
    /// Model folder (e.g. models/all-MiniLM-L6-v2).
    #[arg(long)]
    pub model: PathBuf,
    /// TSV with captions (e.g. Flickr8k's token file).
    #[arg(long)]
    pub input: PathBuf,
    /// 0-based column of the caption.
    #[arg(long, default_value_t = 1)]
    pub column: usize,
    /// Captions to embed (the first ones with that column).
    #[arg(long, default_value_t = 10_000, value_parser = positive)]
    pub rows: usize,
    #[arg(long, default_value_t = 64, value_parser = positive)]
    pub batch_size: usize,
    /// `cpu`, `ndarray`, `cuda[:N]`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Embeds `rows` captions in batches after one warm-up batch, batches spread over the worker
/// threads; prints sentences/s as JSON.
pub fn text(args: &TextBenchArgs, device: &burn::tensor::Device) -> Result<()> {
    let mut lines = Lines::open(&args.input)?;
    let mut captions = Vec::new();
    while captions.len() < args.rows {
        let Some((_, line)) = lines.next_line()? else { break };
        if let Some(c) = line.split(|&b| b == b'\t').nth(args.column) {
            captions.push(String::from_utf8_lossy(c).into_owned());
        }
    }
    if captions.is_empty() {
        return Err(Error::data(format!(
            "`{}` has no caption in column {} (0-based, tab-separated)",
            args.input.display(),
            args.column
        )));
    }
    let enc = crate::models::text_encoder::TextEncoder::load(&args.model, None, None, device)?;
    let refs: Vec<&str> = captions.iter().map(String::as_str).collect();
    let batch = args.batch_size;
    enc.encode(&refs[..batch.min(refs.len())])?;
    // Batches of similar length (sentence-transformers sorts by length too) run concurrently on
    // the worker threads, as `curate run` applies chunks; PyTorch spreads each batch over its
    // intra-op threads instead.
    let t = Instant::now();
    let n = enc.encode_many(&refs, batch, true)?.len() / enc.dim;
    let secs = t.elapsed().as_secs_f64();
    outln!(
        "{}",
        serde_json::json!({"sentences": n, "seconds": secs, "sentences_per_s": n as f64 / secs, "batch_size": batch, "device": args.device, "threads": rayon::current_num_threads()})
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct KnnBenchArgs {
    /// Queries, `[nq, dim]`: `.npy` (float32, C order, 2-D) or raw little-endian f32, row-major.
    #[arg(long)]
    pub queries: PathBuf,
    /// Pool, `[np, dim]`, in the same formats.
    #[arg(long)]
    pub pool: PathBuf,
    /// Row width of raw files (`.npy` files carry their own shape).
    #[arg(long)]
    pub dim: Option<usize>,
    /// Neighbours per query, at most the pool's rows.
    #[arg(long, default_value_t = 10, value_parser = positive)]
    pub k: usize,
    /// Timed runs; the best is reported (plus all runs).
    #[arg(long, default_value_t = 3, value_parser = positive)]
    pub repeat: usize,
    /// Write the ids of the last run here: raw little-endian u32, `[nq, k]` row-major.
    #[arg(long)]
    pub ids_out: Option<PathBuf>,
    /// Queries per matrix product (default: `knn::Blocking::default()`, with `--device`
    /// `knn::Blocking::device_default()`).
    #[arg(long, value_parser = positive)]
    pub query_block: Option<usize>,
    /// Pool rows per matrix product (defaults as `--query-block`; with `--device`, whole chunks of
    /// `knn::DEVICE_TOP_K_CHUNK` rows, the JSON says how many were used).
    #[arg(long, value_parser = positive)]
    pub pool_block: Option<usize>,
    /// Search on a burn device (`cpu`, `ndarray`, `cuda[:N]`) with `knn::device_top_k`, as
    /// `mine_pseudo_bow` does on a run that is not on the CPU; absent: the CPU kernel
    /// (`knn::exact_top_k`). Each timed run includes copying the pool to the device.
    #[arg(long)]
    pub device: Option<String>,
}

/// A count flag of at least 1 (`--repeat`, `--k`, block sizes).
fn positive(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(crate::error::whole_number_problem(s)),
    }
}

/// A row-major f32 matrix from a `.npy` file (float32, C order, 2-D) or from raw little-endian
/// f32 with `dim` columns; returns the values and the row width.
fn read_f32_matrix(path: &Path, dim: Option<usize>) -> Result<(Vec<f32>, usize)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("cannot read", path, e))?;
    let bad = |what: &str| Error::data(format!("`{}`: {what}", path.display()));
    let (body, width) = if bytes.starts_with(b"\x93NUMPY") && bytes.len() >= 10 {
        // Version 1 has a u16 header length at 8, versions 2 and 3 a u32.
        let (len, at) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            _ if bytes.len() >= 12 => (u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize, 12),
            _ => return Err(bad("truncated .npy header")),
        };
        let header = std::str::from_utf8(bytes.get(at..at + len).ok_or_else(|| bad("truncated .npy header"))?)
            .map_err(|_| bad("the .npy header is not text"))?;
        if !header.contains("'descr': '<f4'") || !header.contains("'fortran_order': False") {
            return Err(bad("expected a little-endian float32 array in C order (`<f4`)"));
        }
        let shape = header
            .split("'shape': (")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .ok_or_else(|| bad("no shape in the .npy header"))?;
        let dims: Vec<usize> =
            shape.split(',').filter(|s| !s.trim().is_empty()).filter_map(|s| s.trim().parse().ok()).collect();
        let [rows, width] = dims[..] else { return Err(bad("expected a 2-D array")) };
        let body = &bytes[at + len..];
        // A file cut short (or with bytes after the array) is not the array its header names.
        if rows.checked_mul(width).and_then(|n| n.checked_mul(4)) != Some(body.len()) {
            return Err(bad(&format!(
                "the header says {rows} x {width} float32 ({} bytes), the file holds {} bytes after it",
                rows.saturating_mul(width).saturating_mul(4),
                body.len()
            )));
        }
        (body, width)
    } else {
        (&bytes[..], dim.ok_or_else(|| bad("raw f32 input needs `--dim`"))?)
    };
    if width == 0 || width.checked_mul(4).is_none_or(|row| body.len() % row != 0) {
        return Err(bad(&format!("{} bytes do not make rows of {width} f32", body.len())));
    }
    if body.is_empty() {
        return Err(bad("no rows"));
    }
    Ok((body.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(), width))
}

/// Times `knn::exact_top_k` (or, with a `device`, `knn::device_top_k` on it) on the queries and
/// pool of `args` (after loading, excluded); prints queries/s of the best run as JSON and
/// optionally writes the ids.
pub fn knn(args: &KnnBenchArgs, device: Option<&burn::tensor::Device>) -> Result<()> {
    let (queries, dim) = read_f32_matrix(&args.queries, args.dim)?;
    let (pool, pool_dim) = read_f32_matrix(&args.pool, args.dim)?;
    if pool_dim != dim {
        return Err(Error::data(format!("queries have {dim} columns, the pool {pool_dim}")));
    }
    let (nq, np) = (queries.len() / dim, pool.len() / dim);
    if args.k > np {
        return Err(Error::data(format!("`--k {}` is more than the pool's {np} rows", args.k)));
    }
    let default =
        if device.is_some() { crate::knn::Blocking::device_default() } else { crate::knn::Blocking::default() };
    let mut blocking = crate::knn::Blocking {
        queries: args.query_block.unwrap_or(default.queries),
        pool: args.pool_block.unwrap_or(default.pool),
    };
    if device.is_some() {
        blocking.pool = crate::knn::device_pool_block_used(blocking.pool);
    }
    let mut runs = Vec::new();
    let mut result = None;
    for _ in 0..args.repeat {
        let t = Instant::now();
        result = Some(match device {
            Some(d) => crate::knn::device_top_k_with(&queries, &pool, dim, args.k, d, blocking),
            None => crate::knn::exact_top_k_with(&queries, &pool, dim, args.k, blocking),
        });
        runs.push(t.elapsed().as_secs_f64());
    }
    let best = runs.iter().copied().fold(f64::INFINITY, f64::min);
    if let (Some(path), Some(r)) = (&args.ids_out, &result) {
        let bytes: Vec<u8> = r.ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        std::fs::write(path, bytes).map_err(|e| Error::io("cannot write", path, e))?;
    }
    outln!(
        "{}",
        serde_json::json!({"queries": nq, "pool": np, "dim": dim, "k": args.k, "device": args.device.as_deref().unwrap_or("cpu kernel"),
            "threads": rayon::current_num_threads(),
            "query_block": blocking.queries, "pool_block": blocking.pool, "best_s": best,
            "queries_per_s": nq as f64 / best, "runs_s": runs})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_f32_rows_of_a_width_past_memory_are_an_error() {
        // `4 · width` wrapped to 0 for `--dim 2^62`, and `len % 0` panicked.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.f32");
        std::fs::write(&path, [1.0f32, 2.0, 3.0, 4.0].map(f32::to_le_bytes).concat()).unwrap();
        assert_eq!(read_f32_matrix(&path, Some(2)).unwrap(), (vec![1.0, 2.0, 3.0, 4.0], 2));
        let e = read_f32_matrix(&path, Some(1 << 62)).unwrap_err().to_string();
        assert!(e.contains("16 bytes do not make rows of 4611686018427387904 f32"), "{e}");
    }
}
