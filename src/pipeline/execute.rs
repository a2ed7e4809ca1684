//! Running a [`Plan`]: fit passes for the transforms that need them, then one streaming pass in
//! which a reader thread parses, chunks are transformed in parallel (rayon) and a writer thread
//! stores data and rejects in input order, saving a checkpoint at each finished data shard (see
//! [`super::checkpoint`]). Outputs: `config.json` (before any work), `data/part-*.parquet`,
//! `rejects/part-*.parquet`, `manifest.json`, and the report.

use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use serde::Serialize;
use serde_json::json;
use std::path::Path;

use super::checkpoint::{self, Checkpoint, Position, RunIdentity};
use super::plan::Plan;
use super::progress::Progress;
use crate::error::{Error, Result};
use crate::io::parquet::{ShardInfo, ShardedWriter};
use crate::io::write_atomic;
use crate::report;
use crate::schema::{self, Chunk};
use crate::stages::{write_parquet, ChunkIter, Reader, StageStats, Transform};

/// Chunks in flight between the reader and the writer (being transformed, or waiting for an
/// earlier one), and the reader's lead in the fit passes: enough to keep every core of the
/// machines we run on busy, fixed so memory use does not grow with the machine.
const GROUP: usize = 8;

/// Default for [`RunOptions::cache_bytes`]: 1 GiB keeps a CC3M-sized run in memory (2.9M
/// pairs; parsed, a CC TSV takes about 1.7–1.9× its size: ~0.8 GB for the 447 MB benchmark
/// file), under the 1.5 GB the BoW issue allows.
pub const DEFAULT_CACHE_BYTES: usize = 1 << 30;

/// Runtime knobs (flags, never in the pipeline file: they do not change the output).
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub progress: bool,
    /// Parsed input kept in memory between a fit pass and the passes after it, so the input is
    /// read and parsed once; an input that does not fit is read again for each pass. 0 = never.
    pub cache_bytes: usize,
    /// Start over even where a killed run of the same pipeline left a checkpoint to go on from.
    pub restart: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { progress: false, cache_bytes: DEFAULT_CACHE_BYTES, restart: false }
    }
}

/// The reader's chunks from the first fit pass, while they fit in the budget.
struct PassCache {
    budget: usize,
    bytes: usize,
    chunks: Option<Vec<Chunk>>,
    /// The input did not fit the budget: later passes read it again.
    over_budget: bool,
}

impl PassCache {
    fn new(budget: usize) -> Self {
        PassCache { budget, bytes: 0, chunks: (budget > 0).then(Vec::new), over_budget: false }
    }

    /// What became of the parsed input between passes, for the manifest.
    fn state(cache: &Option<PassCache>) -> &'static str {
        match cache {
            None => "not needed",
            Some(c) if c.budget == 0 => "off (read again)",
            Some(c) if c.over_budget => "over budget (read again)",
            Some(_) => "kept in memory",
        }
    }

    /// Keeps a copy of `chunk` (the batch's buffers are shared, not copied; see [`compacted`])
    /// or, past the budget, gives up caching for this run.
    fn keep(&mut self, chunk: &Chunk) {
        if let Some(v) = &mut self.chunks {
            let chunk = Chunk { batch: compacted(&chunk.batch), ..chunk.clone() };
            self.bytes += chunk.batch.get_array_memory_size() + chunk.rejects.bytes();
            if self.bytes > self.budget {
                self.chunks = None;
                self.over_budget = true;
                say!(
                    "note: the parsed input is larger than --cache-mib {}: each later pass reads the input again \
                     (a larger --cache-mib keeps it in memory)",
                    self.budget >> 20
                );
            } else {
                v.push(chunk);
            }
        }
    }
}

/// `batch`, copied into buffers of its size where it holds far less than they do. Readers size
/// a chunk's buffers for every line of its block; a reader that keeps few of them (YFCC with
/// the YFCC15M subset: 15%) would fill the cache's budget with space it never used.
fn compacted(batch: &RecordBatch) -> RecordBatch {
    let used: usize =
        batch.columns().iter().map(|c| c.to_data().get_slice_memory_size().unwrap_or(usize::MAX / 4)).sum();
    if batch.get_array_memory_size() <= used.saturating_mul(2) + (1 << 20) {
        return batch.clone();
    }
    let all = arrow_array::UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    let copied: std::result::Result<Vec<_>, _> =
        batch.columns().iter().map(|c| arrow_select::take::take(c.as_ref(), &all, None)).collect();
    copied.ok().and_then(|columns| RecordBatch::try_new(batch.schema(), columns).ok()).unwrap_or_else(|| batch.clone())
}

/// What a run did, for the summary on stderr and `manifest.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub rows_read: u64,
    pub rows_written: u64,
    pub rejects: BTreeMap<String, u64>,
    pub skipped: BTreeMap<String, u64>,
    pub data_shards: Vec<ShardInfo>,
    pub timings_s: BTreeMap<String, f64>,
}

impl RunSummary {
    pub fn rejected(&self) -> u64 {
        self.rejects.values().sum()
    }

    /// What the run's outcome says about its settings or input: a run that read no row, or
    /// wrote none of what it read (said on stderr, in the report and in the manifest).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.rows_read == 0 {
            out.push("no row was read: the input holds no rows (an empty file?)".to_owned());
        } else if self.rows_written == 0 {
            let top = self.rejects.iter().chain(&self.skipped).max_by_key(|(_, n)| **n);
            let top = top.map(|(reason, n)| format!("; most often `{reason}` ({n})")).unwrap_or_default();
            // Skipped rows (videos, photos outside a subset) are only counted: `rejects/` holds
            // rows only where some were rejected.
            let (what, kept) = match (self.rejected() > 0, self.skipped.values().sum::<u64>() > 0) {
                (true, false) => ("rejected", "; `rejects/` holds the rows and their reasons"),
                (true, true) => (
                    "rejected or skipped",
                    "; `rejects/` holds the rejected rows and their reasons, the report counts the skipped ones",
                ),
                _ => ("skipped", "; the report counts them by reason"),
            };
            out.push(format!("no row was written: the {} row(s) read were all {what}{top}{kept}", self.rows_read));
        }
        out
    }
}

/// Runs `plan`, writing everything under its `output_dir`. One run at a time writes to a folder
/// (a second one fails at once). A folder holds a whole run's output, with its manifest, or a
/// part of one: the shards of the last checkpoint of a run that was killed or failed (and
/// nothing else of it), which the next run of the same pipeline goes on from.
pub fn run(plan: Plan, opts: &RunOptions) -> Result<RunSummary> {
    let out = plan.output_dir.clone();
    std::fs::create_dir_all(&out).map_err(|e| Error::io("cannot create output folder", &out, e))?;
    let _lock = crate::io::lock_folder(&out)?;
    let shard_dirs = [out.join(&plan.write.dir), out.join("rejects")];
    let cleared = std::cell::Cell::new(false);
    let result = run_locked(plan, opts, &cleared);
    if result.is_err() && cleared.get() {
        // The shards a checkpoint lists stay (with it), so that the same command, run again
        // once the cause is fixed (a full disk), goes on from there; the others go.
        let keep = checkpoint::kept_files(&out, &shard_dirs[0], &shard_dirs[1]);
        if keep.is_empty() {
            checkpoint::remove(&out);
        }
        for dir in &shard_dirs {
            remove_run_shards(dir, &keep);
        }
        if !keep.is_empty() {
            let data = keep.iter().filter(|f| f.starts_with(&shard_dirs[0])).count();
            say!(
                "note: the run's last checkpoint and its {data} data and {} rejects shard(s) stay in `{}`: run the \
                 same command again once the cause is fixed, and it goes on from there (--restart starts over)",
                keep.len() - data,
                out.display()
            );
        }
    }
    result
}

/// Deletes the finished and unfinished shards in `dir` but those in `keep` (best effort: the
/// run has failed already, and its error is the one to report).
fn remove_run_shards(dir: &Path, keep: &[std::path::PathBuf]) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if is_run_shard(&entry.file_name().to_string_lossy()) && !keep.contains(&entry.path()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Size, modification time and inode of each input: a file replaced or written to while the
/// run reads it changes one of them.
fn stamps(inputs: &[std::path::PathBuf]) -> Vec<Option<(u64, Option<std::time::SystemTime>, u64)>> {
    use std::os::unix::fs::MetadataExt;
    inputs.iter().map(|p| std::fs::metadata(p).ok().map(|m| (m.len(), m.modified().ok(), m.ino()))).collect()
}

fn run_locked(mut plan: Plan, opts: &RunOptions, cleared: &std::cell::Cell<bool>) -> Result<RunSummary> {
    let started = Instant::now();
    let out = plan.output_dir.clone();
    let inputs_before = stamps(&plan.reader.inputs());
    let folders_before = plan.reader.folder_stamp();
    let data_dir = out.join(&plan.write.dir);
    let rejects_dir = out.join("rejects");
    // Nothing of an earlier run stays beside this one's files; the manifest, written last,
    // marks a finished run.
    // An earlier run may have written its data to another folder (`write_parquet.dir`): its
    // `config.json` (written first, so a killed run has one too) says where.
    let earlier_dir = previous_data_dir(&out).map(|d| out.join(d)).filter(|d| *d != data_dir);
    let mut shard_dirs = vec![data_dir.as_path(), rejects_dir.as_path()];
    shard_dirs.extend(earlier_dir.as_deref());
    // The hash names what made the data, so it leaves out where the data was written: the same
    // input and config give byte-identical files in any output folder.
    let mut hashed = plan.resolved.clone();
    if let Some(m) = hashed.as_object_mut() {
        m.remove("output_dir");
    }
    let config_hash = format!("xxh3-64:{:016x}", xxhash_rust::xxh3::xxh3_64(hashed.to_string().as_bytes()));
    let inputs = plan.reader.inputs();
    // Checkpoints also stamp the files the stages read beside the data (models, a training run,
    // aligned tables): loaded before the stream, so a change during the run mixes nothing, but
    // one before a resume would leave the kept shards made with the other file.
    let side_inputs: Vec<std::path::PathBuf> = plan.transforms.iter().flat_map(|(_, t)| t.side_inputs()).collect();
    let stamped: Vec<std::path::PathBuf> = inputs.iter().chain(&side_inputs).cloned().collect();
    let input_stamps = checkpoint::InputStamp::of(&stamped);
    // Their contents too (the data input has its own fingerprint, taken as it is read).
    let side_digest = checkpoint::content_digest(&side_inputs);
    let pipeline_name = plan.name.clone();
    let identity = RunIdentity {
        config_hash: &config_hash,
        pipeline: &pipeline_name,
        inputs: &input_stamps,
        folder_stamp: folders_before.map(checkpoint::hex),
        side_digest: &side_digest,
        chunk_split: plan.chunk_split,
        data_dir: &data_dir,
        rejects_dir: &rejects_dir,
    };
    let resume: Option<Checkpoint> = if opts.restart {
        if out.join(checkpoint::FILE).exists() {
            say!("note: --restart: the checkpoint of a killed run in `{}` is not used", out.display());
        }
        None
    } else {
        checkpoint::load(&out, &identity)
    };
    // Side files read whole (a subset list, the pool mining retrieves from): a bad one fails the
    // run before it clears anything.
    let t = Instant::now();
    plan.reader.prepare()?;
    for (_, stage) in plan.transforms.iter_mut() {
        stage.prepare()?;
    }
    let prepare_seconds = t.elapsed().as_secs_f64();
    // Re-reading an earlier run's shards in place would delete them before they are read.
    if let Some(f) = inputs_a_run_clears(&out, &shard_dirs, &plan.reader.inputs()).first() {
        return Err(Error::data(format!(
            "input `{}` is a file this run writes or clears in `{}`: it would be replaced or deleted before it \
             is read; write to another `output_dir`",
            f.display(),
            out.display()
        )));
    }
    cleared.set(true);
    let mut kept: Vec<std::path::PathBuf> = Vec::new();
    match &resume {
        Some(c) => {
            kept.extend(c.data_shards.iter().map(|s| data_dir.join(&s.info.file)));
            kept.extend(c.reject_shards.iter().map(|s| rejects_dir.join(&s.info.file)));
            say!(
                "resuming the run that stopped in `{}`: its {} data shard(s) ({} rows) and {} rejects shard(s) \
                 stay; {}the input is read again up to where it stopped (--restart starts over)",
                out.display(),
                c.data_shards.len(),
                c.data_shards.iter().map(|s| s.info.rows).sum::<u64>(),
                c.reject_shards.len(),
                if plan.transforms.iter().any(|(_, t)| t.fit_passes() > 0) {
                    "the fit passes run again, and "
                } else {
                    ""
                }
            );
        }
        None => {
            // A run killed before its first full shard leaves no checkpoint: say why its shards go.
            let unfinished = !opts.restart
                && !out.join(checkpoint::FILE).exists()
                && !out.join("manifest.json").exists()
                && std::fs::read_dir(&data_dir)
                    .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| is_run_shard(&e.file_name().to_string_lossy()))));
            if unfinished {
                say!(
                    "note: `{}` holds shards of a run that stopped before its first checkpoint: starting over",
                    out.display()
                );
            }
            checkpoint::remove(&out)
        }
    }
    let clearing = clear_previous_run(&out, &shard_dirs, &kept)?;
    let config_json = serde_json::to_string_pretty(&plan.resolved).expect("JSON value serializes") + "\n";
    write_atomic(&out.join("config.json"), config_json.as_bytes())?;

    let mut timings = BTreeMap::from([("prepare".to_owned(), prepare_seconds)]);
    // The fingerprint reads every input byte once more: on a thread of its own, beside the
    // passes, so it costs no wall time while a core is free.
    // Checkpoints save it once it is known, so that a resumed run can tell an input whose
    // content changed though its size and time did not.
    let fingerprint_known = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
    let fingerprinting = {
        let fingerprint = plan.reader.fingerprinter();
        let known = fingerprint_known.clone();
        std::thread::Builder::new()
            .name("curate-fingerprint".into())
            .spawn(move || {
                let t = Instant::now();
                let f = fingerprint();
                if let Ok(f) = &f {
                    let _ = known.set(f.clone());
                }
                f.map(|f| (f, t.elapsed().as_secs_f64()))
            })
            .map_err(|e| Error::io("cannot start a thread", "curate-fingerprint", e))?
    };

    let total_passes = plan.transforms.iter().map(|(_, t)| t.fit_passes()).sum::<usize>() + 1;
    let progress = Progress::new(opts.progress, total_passes);
    let Fitted { cache, total_rows, passes, read_digest: fit_read_digest } =
        fit_passes(&mut plan, opts, &progress, &mut timings)?;
    TestHooks::from_env().after_fit();
    // What the stages learned shows in the kept shards: it must come from the rows the killed
    // run's fit passes read (a table's image files, which `check_files` looks up but no
    // fingerprint covers, may have come or gone since).
    if let Some(c) = &resume {
        if c.fit_read_digest != fit_read_digest.map(checkpoint::hex) {
            return Err(stream_mismatch(
                &out,
                "the fit passes read other rows than the killed run's did: an image file that `check_files` looks \
                 up came or went, or the input changed",
            ));
        }
    }
    let input_cache = PassCache::state(&cache);
    // Each stage gets ready for the stream.
    let t = Instant::now();
    for (_, stage) in plan.transforms.iter_mut() {
        stage.start_stream()?;
    }
    timings.insert("start_stream".to_owned(), t.elapsed().as_secs_f64());

    // The streaming pass.
    let t = Instant::now();
    let bar = progress.pass(passes + 1, "transform + write", total_rows);
    let mut metadata = vec![
        ("curate.version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
        ("curate.config_hash".to_owned(), config_hash.clone()),
        ("curate.pipeline".to_owned(), plan.name.clone()),
    ];
    let stage_metadata: Vec<(String, String)> = plan.transforms.iter().flat_map(|(_, t)| t.metadata()).collect();
    metadata.extend(stage_metadata.iter().cloned());
    let (kept_data, kept_rejects) = match &resume {
        Some(c) => (
            c.data_shards.iter().map(|s| s.info.clone()).collect(),
            c.reject_shards.iter().map(|s| s.info.clone()).collect(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let mut data = ShardedWriter::after(
        &data_dir,
        "part",
        plan.output_schema.clone(),
        plan.write.rows_per_shard,
        &metadata,
        kept_data,
    )?;
    let mut rejects = ShardedWriter::after(
        &rejects_dir,
        "part",
        schema::rejects(),
        plan.write.rows_per_shard,
        &metadata,
        kept_rejects,
    )?;
    let columns: Option<Vec<usize>> = plan.write.columns.as_ref().map(|cols| {
        let last = plan.transforms.last().map_or_else(schema::pairs, |(_, t)| t.output_schema());
        cols.iter().map(|c| last.index_of(c).expect("checked at plan time")).collect()
    });
    let reader: &dyn Reader = plan.reader.as_ref();
    let reader_name = schema::stage_name(&plan.reader_name);
    let cached: Option<Vec<Chunk>> = cache.and_then(|c| c.chunks);
    let transforms: &[(String, Box<dyn Transform>)] = &plan.transforms;
    let start = StreamStart {
        chunk: resume.as_ref().map_or(0, |c| c.chunk),
        first_rows: resume.as_ref().map_or_else(|| vec![0; transforms.len()], |c| c.first_rows.clone()),
    };
    let resumed_fingerprint = resume.as_ref().and_then(|c| c.input_fingerprint.clone());
    let mut resumed_read_digest = resume.as_ref().and_then(|c| c.read_digest.clone());
    let resumed = resume.as_ref().map(|c| {
        json!({
            "data_shards_kept": c.data_shards.len(),
            "reject_shards_kept": c.reject_shards.len(),
            "chunks_skipped": c.chunk,
        })
    });
    let mut o = WriterOutcome::default();
    if let Some(c) = resume {
        o.earlier_rejects = c.rejects;
        o.skipped = c.skipped;
        o.stats = c.stats;
        o.rows_into_first = c.rows_into_chunk;
    } else {
        o.stats = vec![StageStats::None; transforms.len()];
    }
    let (out_dir, identity, fingerprint_known) = (&out, &identity, &fingerprint_known);
    let resumed_fingerprint = &resumed_fingerprint;

    let streamed = std::thread::scope(|s| -> Result<(u64, WriterOutcome)> {
        // `None` says the stream ended well: without it (a reader or transform failed) the
        // writer removes what it wrote since its last checkpoint instead of finishing shards
        // that look complete.
        let (wtx, wrx) = sync_channel::<Option<Finished>>(GROUP);
        let spawn_writer = std::thread::Builder::new().name("curate-write".into());
        let first_chunk = start.chunk;
        let hooks = TestHooks::from_env();
        let writer = spawn_writer
            .spawn_scoped(s, move || -> Result<WriterOutcome> {
                let (mut saved, mut last_saved) = (0, Instant::now());
                // Shards of the last checkpoint (the resumed one's, to begin with): a failure keeps them.
                let mut checkpointed = (data.shards().len(), rejects.shards().len());
                let mut chunk_no = first_chunk;
                let stream = || -> Result<bool> {
                    for message in wrx {
                        let Some(f) = message else {
                            // A resumed stream has the chunk the checkpoint names, at least.
                            if chunk_no == first_chunk && first_chunk > 0 {
                                return Err(stream_mismatch(
                                    out_dir,
                                    &format!("it ends before chunk {}", first_chunk + 1),
                                ));
                            }
                            return Ok(true);
                        };
                        let batch = match &columns {
                            Some(idx) => f.chunk.batch.project(idx)?,
                            None => f.chunk.batch,
                        };
                        // Resuming: the chunks before were read again as the killed run read them?
                        if let Some(want) = resumed_read_digest.take() {
                            if checkpoint::hex(f.read_digest) != want {
                                let what = format!(
                                    "its rows up to chunk {} are not those the killed run read: an image file that \
                                     `check_files` looks up came or went, or the input changed",
                                    chunk_no + 1
                                );
                                return Err(stream_mismatch(out_dir, &what));
                            }
                        }
                        // Resuming: the rows of the first chunk a killed run wrote already.
                        let done_before = std::mem::take(&mut o.rows_into_first) as usize;
                        if done_before > batch.num_rows() {
                            let what =
                                format!("chunk {} has {} rows, not over {done_before}", chunk_no + 1, batch.num_rows());
                            return Err(stream_mismatch(out_dir, &what));
                        }
                        let batch = batch.slice(done_before, batch.num_rows() - done_before);
                        // Written up to each shard's end, where the rejects shard ends too and a
                        // checkpoint may be saved: every chunk before this one is then in finished
                        // shards, and `done_before + offset` rows of this one.
                        let mut offset = 0;
                        while offset < batch.num_rows() {
                            let take = data.room().min(batch.num_rows() - offset);
                            data.write(&batch.slice(offset, take))?;
                            offset += take;
                            if data.room() == 0 {
                                data.end_shard()?;
                                rejects.end_shard()?;
                                if last_saved.elapsed() < hooks.checkpoint_gap() {
                                    continue;
                                }
                                let at = Position {
                                    chunk: chunk_no,
                                    rows_into_chunk: (done_before + offset) as u64,
                                    first_rows: &f.first_rows,
                                    data_shards: data.shards(),
                                    reject_shards: rejects.shards(),
                                    rejects: o.reject_counts(),
                                    skipped: &o.skipped,
                                    stats: &o.stats,
                                    // The content the kept shards came from: a resumed run's
                                    // is its checkpoint's, whatever it finds now (its end
                                    // compares the two), so that a chain of resumes cannot
                                    // launder a change.
                                    input_fingerprint: resumed_fingerprint
                                        .clone()
                                        .or_else(|| fingerprint_known.get().cloned()),
                                    read_digest: f.read_digest,
                                    fit_read_digest,
                                };
                                checkpoint::save(out_dir, identity, at)?;
                                checkpointed = (data.shards().len(), rejects.shards().len());
                                last_saved = Instant::now();
                                saved += 1;
                                hooks.after_checkpoint(saved)?;
                            }
                        }
                        if !f.chunk.rejects.is_empty() {
                            for key in f.chunk.rejects.reasons() {
                                *o.rejects.entry(key).or_insert(0) += 1;
                            }
                            rejects.write(&f.rejects.unwrap_or_else(|| f.chunk.rejects.to_batch()))?;
                        }
                        for (k, v) in f.chunk.skipped {
                            *o.skipped.entry(k.to_owned()).or_insert(0) += v;
                        }
                        for (all, one) in o.stats.iter_mut().zip(f.stats) {
                            all.merge(one);
                        }
                        o.read_digest = Some(f.read_digest);
                        chunk_no += 1;
                    }
                    Ok(false)
                };
                let ended = stream();
                if !matches!(ended, Ok(true)) {
                    data.abort(checkpointed.0);
                    rejects.abort(checkpointed.1);
                    return Err(ended.err().unwrap_or_else(|| Error::data("the run stopped before its end")));
                }
                o.data_shards = data.finish()?;
                o.reject_shards = rejects.finish()?;
                Ok(o)
            })
            .map_err(|e| Error::io("cannot start a thread", "curate-write", e))?;
        let writer_gone = std::cell::Cell::new(false);
        let read = transform_stream(s, reader, reader_name, cached, transforms, &start, &bar, |f| {
            wtx.send(Some(f)).map_err(|_| {
                writer_gone.set(true);
                Error::data("the writer stopped")
            })
        });
        if read.is_ok() {
            // The writer may have stopped on an error of its own: it is reported below.
            let _ = wtx.send(None);
        }
        drop(wtx);
        let written = writer.join().expect("writer thread does not panic");
        first_failure(read, written, writer_gone.get())
    });
    let (rows_read, w) = streamed?;
    bar.finish();
    clearing.join().expect("clearing thread does not panic")?;
    timings.insert("transform_write".to_owned(), t.elapsed().as_secs_f64());

    // It reads every input byte (a folder input: lists every file) once more, beside the
    // passes; a large folder of small images can outlast them.
    if opts.progress && !fingerprinting.is_finished() {
        say!("written; waiting for the input's fingerprint (for the manifest) ...");
    }
    let (input_fingerprint, secs) = fingerprinting.join().expect("fingerprint thread does not panic")?;
    timings.insert("fingerprint".to_owned(), secs);
    if resumed_fingerprint.as_ref().is_some_and(|f| *f != input_fingerprint) {
        checkpoint::remove(&out);
        return Err(Error::data(
            "the input's content changed since the killed run this one resumed (its fingerprint differs, though \
             what the resume checked first did not: the input files' sizes and modification times, and an image \
             folder's listed folders): the shards kept from that run come from the other content, so this run's \
             output is removed; run again to start over"
                .to_owned(),
        ));
    }
    // The stream read its rows again (no cache, or one too small) and got others than the fit
    // passes learned from: an image file that `check_files` looks up came or went meanwhile.
    if fit_read_digest.is_some() && w.read_digest.is_some() && fit_read_digest != w.read_digest {
        checkpoint::remove(&out);
        return Err(Error::data(
            "the input gave the stream other rows than the fit passes: an image file that `check_files` looks up came \
             or went while the run read it, or the input changed; the output would mix two versions of it; run \
             again once it is final"
                .to_owned(),
        ));
    }
    // The passes and the fingerprint must all have seen the same bytes.
    let inputs_now = stamps(&inputs);
    let changed = (0..inputs.len()).find(|&i| inputs_before[i] != inputs_now[i]);
    // An image folder's first input is its root.
    let changed = changed.or_else(|| (plan.reader.folder_stamp() != folders_before).then_some(0));
    if let Some(i) = changed {
        // No run can go on from this one's checkpoint.
        checkpoint::remove(&out);
        return Err(Error::data(format!(
            "input `{}` changed while the run read it (size, modification time or file; of an image folder, also \
             the folders it lists): the output would mix two versions of it; run again once it is final",
            inputs[i].display()
        )));
    }

    let t = Instant::now();
    let stage_reports: Vec<(String, serde_json::Value)> =
        plan.transforms.iter().zip(&w.stats).map(|((name, t), stats)| (name.clone(), t.report(stats))).collect();
    let summary = RunSummary {
        rows_read,
        rows_written: w.data_shards.iter().map(|s| s.rows).sum(),
        rejects: w.reject_counts(),
        skipped: w.skipped,
        data_shards: w.data_shards,
        timings_s: BTreeMap::new(),
    };
    report::write(&out, &plan, &summary, &stage_reports)?;
    timings.insert("report".to_owned(), t.elapsed().as_secs_f64());
    timings.insert("total".to_owned(), started.elapsed().as_secs_f64());
    let summary = RunSummary { timings_s: timings, ..summary };

    let manifest = json!({
        "curate_version": env!("CARGO_PKG_VERSION"),
        "pipeline": plan.name,
        "pipeline_file": plan.pipeline_file,
        "metadata": stage_metadata.into_iter().collect::<BTreeMap<String, String>>(),
        "config_hash": config_hash,
        "inputs": inputs,
        "input_fingerprint": input_fingerprint,
        "rows": {
            "read": summary.rows_read,
            "written": summary.rows_written,
            "rejected": summary.rejected(),
            "skipped": summary.skipped.values().sum::<u64>(),
        },
        "warnings": report::warnings(&summary, &stage_reports),
        "rejects_by_reason": summary.rejects,
        "skipped_by_reason": summary.skipped,
        "data_dir": plan.write.dir,
        "data_shards": summary.data_shards,
        "reject_shards": w.reject_shards,
        "input_cache": input_cache,
        "resumed": resumed,
        "timings_s": summary.timings_s,
    });
    let text = serde_json::to_string_pretty(&manifest).expect("JSON value serializes") + "\n";
    write_atomic(&out.join("manifest.json"), text.as_bytes())?;
    checkpoint::remove(&out);
    Ok(summary)
}

/// What the fit passes leave for the streaming pass.
struct Fitted {
    /// The parsed input, when the first pass kept it (see [`PassCache`]).
    cache: Option<PassCache>,
    /// The rows of one pass over the input, once a pass has run (for the progress bars).
    total_rows: Option<u64>,
    /// Passes counted so far, run or skipped.
    passes: usize,
    /// [`checkpoint::chain_read_digest`] of the whole input, as the first fit pass read it
    /// (none without fit passes).
    read_digest: Option<u128>,
}

/// The fit passes, stage by stage: transform `i` fits on the stream through transforms `0..i`
/// (so their `apply` runs here too; see [`Transform::start_stream`]). The first pass over the
/// input fills the cache that later passes and the streaming pass read.
fn fit_passes(
    plan: &mut Plan,
    opts: &RunOptions,
    progress: &Progress,
    timings: &mut BTreeMap<String, f64>,
) -> Result<Fitted> {
    let mut total_rows: Option<u64> = None;
    let mut pass_no = 0;
    let mut cache: Option<PassCache> = None;
    let mut read_digest: Option<u128> = None;
    for i in 0..plan.transforms.len() {
        let (before, rest) = plan.transforms.split_at_mut(i);
        let (name, stage) = &mut rest[0];
        for pass in 0..stage.fit_passes() {
            pass_no += 1;
            if !stage.wants_pass(pass) {
                // No timing: a pass that did not run is not a pass that took no time.
                progress.skipped(pass_no, &format!("{name}: fit pass {}", pass + 1), "learned in an earlier pass");
                continue;
            }
            let t = Instant::now();
            let bar = progress.pass(pass_no, &format!("{name}: fit pass {}", pass + 1), total_rows);
            let mut offsets = vec![0u64; i + 1];
            let mut rows = 0;
            // The first pass over the input fills the cache; later passes read from it.
            let filling = cache.is_none();
            let cached: Option<Vec<Chunk>> = cache.as_ref().and_then(|c| c.chunks.clone());
            if filling {
                cache = Some(PassCache::new(opts.cache_bytes));
            }
            let reader: &dyn Reader = plan.reader.as_ref();
            std::thread::scope(|s| -> Result<()> {
                // Reading and parsing run on their own thread, ahead of the fitting here.
                let rx = spawn_reader(s, reader, cached)?;
                for chunk in rx {
                    let chunk = chunk?;
                    if filling {
                        cache.as_mut().expect("set above").keep(&chunk);
                        read_digest = Some(checkpoint::chain_read_digest(read_digest.unwrap_or(0), &chunk));
                    }
                    let n_read =
                        chunk.batch.num_rows() + chunk.rejects.len() + chunk.skipped.values().sum::<u64>() as usize;
                    rows += n_read as u64;
                    let mut c = chunk;
                    for (j, (_, earlier)) in before.iter().enumerate() {
                        let n = c.batch.num_rows() as u64;
                        // Its statistics are of the streaming pass's only.
                        c = earlier.apply(c, offsets[j])?.0;
                        offsets[j] += n;
                    }
                    stage.fit(pass, &c.batch, offsets[i])?;
                    offsets[i] += c.batch.num_rows() as u64;
                    bar.inc(n_read as u64);
                }
                Ok(())
            })?;
            stage.end_pass(pass)?;
            bar.finish();
            total_rows = Some(rows);
            timings.insert(format!("{name}.fit_pass_{}", pass + 1), t.elapsed().as_secs_f64());
        }
    }
    Ok(Fitted { cache, total_rows, passes: pass_no, read_digest })
}

/// Whether a file named `name` in a shard folder is one a run writes, finished or not (and so
/// clears before it starts): `part-NNNNN.parquet`, or `.part-NNNNN.parquet.tmp` while it is
/// written. Other tools' shards (Spark's `part-00000-<uuid>.snappy.parquet`) are not the run's.
pub fn is_run_shard(name: &str) -> bool {
    let number = |n: &str| n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit());
    name.strip_prefix("part-").and_then(|n| n.strip_suffix(".parquet")).is_some_and(number)
        || name.strip_prefix(".part-").and_then(|n| n.strip_suffix(".parquet.tmp")).is_some_and(number)
}

/// Whether a file named `name` in the output folder is one a run writes there (and so clears
/// or replaces before it starts).
fn is_run_file(name: &str) -> bool {
    RUN_FILES.contains(&name)
}

/// The files a run writes in its output folder beside the data.
pub const RUN_FILES: [&str; 5] = ["config.json", "manifest.json", "report.json", "report.md", checkpoint::FILE];

/// Whether a file named `name` in the output folder's `plots/` is a plot a run draws (and so
/// clears before it starts); other files there are the user's.
fn is_run_plot(name: &str) -> bool {
    crate::report::PLOT_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The files among `inputs` that a run writing to `out` and clearing `shard_dirs` would delete
/// or replace before reading them.
pub fn inputs_a_run_clears(out: &Path, shard_dirs: &[&Path], inputs: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    let dirs: Vec<std::path::PathBuf> = shard_dirs.iter().filter_map(|d| d.canonicalize().ok()).collect();
    let (out, plots) = (out.canonicalize().ok(), out.join("plots").canonicalize().ok());
    inputs
        .iter()
        .filter(|f| {
            let Some(c) = f.canonicalize().ok() else { return false };
            let (Some(parent), Some(name)) = (c.parent(), c.file_name()) else { return false };
            let name = name.to_string_lossy();
            (is_run_shard(&name) && dirs.iter().any(|d| d == parent))
                || (is_run_file(&name) && out.as_deref() == Some(parent))
                || (is_run_plot(&name) && plots.as_deref() == Some(parent))
        })
        .cloned()
        .collect()
}

/// The data folder named by the `config.json` an earlier run left in `out`, if it is a folder
/// a run may write (a hand-edited file cannot send the clearing outside `out`).
pub fn previous_data_dir(out: &Path) -> Option<String> {
    let text = std::fs::read_to_string(out.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let writer = config["stage"].as_array()?.iter().find(|s| s["type"] == write_parquet::TYPE)?;
    let dir = writer["dir"].as_str()?.to_owned();
    let w = write_parquet::WriteParquetConfig { dir, rows_per_shard: 1, columns: None };
    w.dir_problem().is_none().then_some(w.dir)
}

/// Streams `cached` chunks, or else the reader's, from a thread of their own, at most [`GROUP`]
/// ahead of the receiver.
fn spawn_reader<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    reader: &'s dyn Reader,
    cached: Option<Vec<Chunk>>,
) -> Result<Receiver<Result<Chunk>>> {
    let (tx, rx) = sync_channel::<Result<Chunk>>(GROUP);
    read_on_thread(s, reader, cached, move |c| c.is_some_and(|c| tx.send(c).is_ok()))?;
    Ok(rx)
}

/// Runs `cached` chunks, or else the reader's, through `send` on a thread of its own, then
/// `send(None)`; an error ends the stream, as does `send` returning `false`.
fn read_on_thread<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    reader: &'s dyn Reader,
    cached: Option<Vec<Chunk>>,
    mut send: impl FnMut(Option<Result<Chunk>>) -> bool + Send + 's,
) -> Result<()> {
    std::thread::Builder::new()
        .name("curate-read".into())
        .spawn_scoped(s, move || {
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let source: Result<ChunkIter<'_>> =
                    cached.map_or_else(|| reader.open(), |c| Ok(Box::new(c.into_iter().map(Ok))));
                match source {
                    Ok(chunks) => {
                        for c in chunks {
                            if !send(Some(c)) {
                                return;
                            }
                        }
                        send(None);
                    }
                    Err(e) => {
                        send(Some(Err(e)));
                    }
                }
            }));
            // A reader that panicked sent no end: the run would wait for it forever.
            if let Err(panic) = read {
                send(Some(Err(internal_error("the reader", panic.as_ref()))));
            }
        })
        .map_err(|e| Error::io("cannot start a thread", "curate-read", e))?;
    Ok(())
}

/// The error for a panic in `what` (a bug in curate; the panic message was printed already).
fn internal_error(what: &str, panic: &(dyn std::any::Any + Send)) -> Error {
    let message =
        panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
    Error::data(format!("{what} stopped on an internal error (a bug in curate): {}", message.unwrap_or_default()))
}

#[derive(Default)]
struct WriterOutcome {
    /// By (stage, reason): no string is made per reject.
    rejects: BTreeMap<(&'static str, &'static str), u64>,
    /// Resuming: the rejects counted by the killed run, by `stage/reason`.
    earlier_rejects: BTreeMap<String, u64>,
    skipped: BTreeMap<String, u64>,
    /// Each transform's report statistics, merged in input order.
    stats: Vec<StageStats>,
    /// Resuming: rows of the first chunk the killed run wrote already.
    rows_into_first: u64,
    /// [`checkpoint::chain_read_digest`] through the last chunk written: of the whole input.
    read_digest: Option<u128>,
    data_shards: Vec<ShardInfo>,
    reject_shards: Vec<ShardInfo>,
}

impl WriterOutcome {
    /// Rejects counted so far, by `stage/reason`.
    fn reject_counts(&self) -> BTreeMap<String, u64> {
        let mut all = self.earlier_rejects.clone();
        for ((stage, reason), n) in &self.rejects {
            *all.entry(format!("{stage}/{reason}")).or_insert(0) += n;
        }
        all
    }
}

/// The error for a resumed stream that is not the one the checkpoint in `out` was saved from
/// (`what` says how); the checkpoint is removed, so that the next run starts over rather than
/// failing the same way.
fn stream_mismatch(out: &Path, what: &str) -> Error {
    checkpoint::remove(out);
    Error::data(format!(
        "the checkpoint in `{}` does not match the stream ({what}): the output is removed; run again to start over",
        out.display()
    ))
}

/// The least time between two checkpoints: a checkpoint lists every shard so far and is
/// flushed to disk, so small shards (say `rows_per_shard = 100`) would make saving them all
/// quadratic. At most one a second costs nothing next to any work worth resuming. (The first
/// comes a second into the stream too: a run killed before that loses less than a second of
/// writing, since a resumed run makes its fit passes again anyway.)
const CHECKPOINT_GAP: Duration = Duration::from_secs(1);

/// For the resume tests, from the environment: `CURATE_KILL_AFTER_CHECKPOINTS=N` makes a run kill
/// itself (SIGKILL, as a user, a scheduler or the out-of-memory killer would) right after its
/// `N`th checkpoint, and `CURATE_FAIL_AFTER_CHECKPOINTS=N` makes its writer fail there (as on a
/// full disk). With either, a checkpoint is saved at every full data shard, however soon.
#[derive(Debug, Default, Clone, Copy)]
struct TestHooks {
    kill_after: Option<usize>,
    fail_after: Option<usize>,
    /// `CURATE_PAUSE_AFTER_FIT_MS=N`: a pause between the fit passes and the stream, said on
    /// stderr, in which a test changes the input.
    pause_after_fit: Option<u64>,
}

impl TestHooks {
    fn from_env() -> Self {
        let n = |name: &str| std::env::var(name).ok().and_then(|n| n.trim().parse::<u64>().ok());
        TestHooks {
            kill_after: n("CURATE_KILL_AFTER_CHECKPOINTS").map(|n| n as usize),
            fail_after: n("CURATE_FAIL_AFTER_CHECKPOINTS").map(|n| n as usize),
            pause_after_fit: n("CURATE_PAUSE_AFTER_FIT_MS"),
        }
    }

    fn after_fit(self) {
        if let Some(ms) = self.pause_after_fit {
            say!("(test hook) paused after the fit passes");
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    fn checkpoint_gap(self) -> Duration {
        if self.kill_after.is_some() || self.fail_after.is_some() {
            Duration::ZERO
        } else {
            CHECKPOINT_GAP
        }
    }

    fn after_checkpoint(self, saved: usize) -> Result<()> {
        if self.kill_after == Some(saved) {
            // SAFETY: signals this process; no memory is touched.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if self.fail_after == Some(saved) {
            return Err(Error::data(format!(
                "a write failed after checkpoint {saved} (CURATE_FAIL_AFTER_CHECKPOINTS)"
            )));
        }
        Ok(())
    }
}

/// The stream's result from the reading side's and the writer's: where both failed, the first
/// failure explains the other — a reader or transform error stops the writer, and a writer
/// error (a full disk) stops the stream, which then only knows that the writer is `gone`.
fn first_failure<R, W>(read: Result<R>, written: Result<W>, writer_gone: bool) -> Result<(R, W)> {
    match (read, written) {
        (Ok(r), Ok(w)) => Ok((r, w)),
        (Err(_), Err(w)) if writer_gone => Err(w),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// Moves what an earlier run left in `out` out of the way before this run writes anything: its
/// manifest and report (so a folder whose run stopped part-way has no manifest), its plots, and
/// its shards and unfinished temporary shards in `shard_dirs` but those in `keep` (a killed
/// run's, which this run goes on from; other files there stay too). The
/// shards go to a folder that a thread deletes beside the run: deleting a large file frees its
/// cached pages, which takes time better spent while the first pass reads.
fn clear_previous_run(
    out: &Path,
    shard_dirs: &[&Path],
    keep: &[std::path::PathBuf],
) -> Result<std::thread::JoinHandle<Result<()>>> {
    let remove = |p: &Path| match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("cannot remove", p, e)),
        _ => Ok(()),
    };
    for name in ["manifest.json", "report.json", "report.md"] {
        remove(&out.join(name))?;
    }
    // What a run killed while writing a file left of it (best effort: whatever is in the way
    // shows when that file is written).
    for name in RUN_FILES {
        let _ = std::fs::remove_file(crate::io::tmp_path(&out.join(name)));
    }
    let list = |dir: &Path| -> Result<Vec<(String, std::path::PathBuf)>> {
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                Ok(entries.flatten().map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())).collect())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::io("cannot list", dir, e)),
        }
    };
    for (name, path) in list(&out.join("plots"))? {
        if is_run_plot(&name) {
            remove(&path)?;
        } else if name.starts_with('.') && name.strip_suffix(".tmp").is_some_and(is_run_plot) {
            let _ = std::fs::remove_file(&path);
        }
    }
    let trash = out.join(crate::stages::write_parquet::STALE_DIR);
    for (i, dir) in shard_dirs.iter().enumerate() {
        for (name, path) in list(dir)? {
            if is_run_shard(&name) && !keep.contains(&path) {
                std::fs::create_dir_all(&trash).map_err(|e| Error::io("cannot create folder", &trash, e))?;
                let to = trash.join(format!("{i}-{name}"));
                // A data folder on another file system (a link to scratch space) cannot rename
                // into `out`: its shards are deleted where they are.
                if let Err(e) = std::fs::rename(&path, &to).or_else(|_| std::fs::remove_file(&path)) {
                    // What was moved aside is stale all the same: deleted, not left behind.
                    let _ = std::fs::remove_dir_all(&trash);
                    return Err(Error::io("cannot move aside or remove", &path, e));
                }
            }
        }
    }
    std::thread::Builder::new()
        .name("curate-clear".into())
        .spawn(move || match std::fs::remove_dir_all(&trash) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("cannot remove", &trash, e)),
            _ => Ok(()),
        })
        .map_err(|e| Error::io("cannot start a thread", "curate-clear", e))
}

/// Where the streaming pass starts: at the input's start, or after the chunks a killed run
/// wrote (see [`super::checkpoint`]).
#[derive(Debug, Clone, Default)]
struct StreamStart {
    /// Reader chunks before this one are read (for the reader's state: ids seen, line numbers)
    /// but not transformed.
    chunk: usize,
    /// The index of that chunk's first row in each transform's input.
    first_rows: Vec<u64>,
}

/// A chunk on its way through the transforms, and out of them, to the writer.
struct Finished {
    chunk: Chunk,
    /// Its rejects in columns (built on a worker thread), once through the last transform, when
    /// it has any.
    rejects: Option<RecordBatch>,
    /// Each transform's statistics of the chunk, so far.
    stats: Vec<StageStats>,
    /// The index of the chunk's first row in each transform's input, so far.
    first_rows: Vec<u64>,
    /// [`checkpoint::chain_read_digest`] of the reader's chunks up to and including this one.
    read_digest: u128,
}

/// Chunks in a transform that is [parallel inside](Transform::parallel_inside), at most. With
/// two, the pool, which steals work while a chunk waits for its batches, again finished the
/// older chunk last, and shards came only at the end. On the 2-core machine, 20k captions
/// through all-MiniLM-L6-v2 took 55.2 s one at a time against 63.6 s side by side; 260k through
/// the tiny test BERT, whose batches are too small to fill both cores, 13.3–15.0 s against
/// 9.9–12.0 s.
const SERIAL_AT_ONCE: usize = 1;

/// Runs every transform on the chunks from the reader and hands each chunk, with its rejects
/// already in columns, to `sink` in input order, from the chunk `start` says on. Returns the
/// number of input rows (of every chunk, skipped or not).
///
/// Each (chunk, transform) is one rayon job, started as soon as the chunk has come out of the
/// transform before and the chunks ahead of it have been through this one (which fixes its
/// first row index), so a slow chunk never holds the others back. At most [`GROUP`] chunks are
/// between the reader and `sink` at once: the reader waits for a credit before each chunk.
#[allow(clippy::too_many_arguments)]
fn transform_stream<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    reader: &'s dyn Reader,
    reader_name: &'static str,
    cached: Option<Vec<Chunk>>,
    transforms: &[(String, Box<dyn Transform>)],
    start: &StreamStart,
    bar: &super::progress::PassBar,
    mut sink: impl FnMut(Finished) -> Result<()>,
) -> Result<u64> {
    enum Event {
        Input(Result<Chunk>),
        InputEnd,
        /// Chunk `idx` went through transform `stage - 1` (with its rejects in columns once
        /// `stage` is the last).
        Done {
            stage: usize,
            idx: usize,
            result: Result<Finished>,
        },
    }
    let (events, inbox) = std::sync::mpsc::channel::<Event>();
    let (credit, credits) = sync_channel::<()>(GROUP);
    for _ in 0..GROUP {
        credit.send(()).expect("room for every credit");
    }
    let input = events.clone();
    read_on_thread(s, reader, cached, move |c| {
        // No credit: the stream stopped.
        credits.recv().is_ok() && input.send(c.map_or(Event::InputEnd, Event::Input)).is_ok()
    })?;

    // With no transform there is still one step: the rejects into columns.
    let steps = transforms.len().max(1);
    // `ready[j]`: chunks waiting for step `j`, by index; `next[j]`: the next index it takes.
    let mut ready: Vec<BTreeMap<usize, Finished>> = (0..steps).map(|_| BTreeMap::new()).collect();
    let mut finished: BTreeMap<usize, Finished> = BTreeMap::new();
    let mut next = vec![start.chunk; steps];
    // Steps whose transform takes chunks one at a time, and how many are in each now.
    let serial: Vec<bool> = (0..steps).map(|j| transforms.get(j).is_some_and(|(_, t)| t.parallel_inside())).collect();
    let mut busy = vec![0usize; steps];
    let mut offsets = start.first_rows.clone();
    offsets.resize(steps, 0);
    // Input rows of each chunk not yet handed to `sink`, in order.
    let mut pending_rows = std::collections::VecDeque::new();
    let (mut read, mut sunk, mut rows, mut input_done) = (0usize, 0usize, 0u64, false);
    let mut read_digest = 0u128;
    rayon::in_place_scope(|scope| -> Result<u64> {
        let start_ready = |j: usize,
                           ready: &mut Vec<BTreeMap<usize, Finished>>,
                           next: &mut Vec<usize>,
                           offsets: &mut Vec<u64>,
                           busy: &mut Vec<usize>| {
            while !(serial[j] && busy[j] >= SERIAL_AT_ONCE) {
                let Some(mut f) = ready[j].remove(&next[j]) else { break };
                busy[j] += 1;
                let (idx, first_row) = (next[j], offsets[j]);
                next[j] += 1;
                offsets[j] += f.chunk.batch.num_rows() as u64;
                let done = events.clone();
                scope.spawn(move |_| {
                    // A panic would leave the loop below waiting for this chunk forever.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if let Some((name, t)) = transforms.get(j) {
                            let before = f.chunk.rejects.len();
                            let (mut chunk, stats) = t.apply(f.chunk, first_row)?;
                            chunk.rejects.name_stage_from(before, schema::stage_name(name));
                            f = Finished { chunk, rejects: None, ..f };
                            f.stats.push(stats);
                            f.first_rows.push(first_row);
                        }
                        if j + 1 == steps && !f.chunk.rejects.is_empty() {
                            f.rejects = Some(f.chunk.rejects.to_batch());
                        }
                        Ok(f)
                    }))
                    .unwrap_or_else(|p| {
                        let stage = transforms.get(j).map_or("writing", |(name, _)| name.as_str());
                        Err(internal_error(&format!("stage `{stage}`"), p.as_ref()))
                    });
                    let _ = done.send(Event::Done { stage: j + 1, idx, result });
                });
            }
        };
        while !(input_done && sunk == read) {
            match crate::io::recv_in_pool(&inbox).expect("the caller holds a sender") {
                Event::Input(chunk) => {
                    let mut chunk = chunk?;
                    let n = (chunk.batch.num_rows() + chunk.rejects.len()) as u64 + chunk.skipped.values().sum::<u64>();
                    rows += n;
                    read_digest = checkpoint::chain_read_digest(read_digest, &chunk);
                    if read < start.chunk {
                        // Written by the killed run this one resumes.
                        read += 1;
                        sunk += 1;
                        bar.inc(n);
                        if read == start.chunk {
                            bar.rate_from_here();
                        }
                        let _ = credit.try_send(());
                        continue;
                    }
                    chunk.rejects.name_stage_from(0, reader_name);
                    pending_rows.push_back(n);
                    let f = Finished { chunk, rejects: None, stats: Vec::new(), first_rows: Vec::new(), read_digest };
                    ready[0].insert(read, f);
                    read += 1;
                    start_ready(0, &mut ready, &mut next, &mut offsets, &mut busy);
                }
                Event::InputEnd => input_done = true,
                Event::Done { stage, idx, result } => {
                    let f = result?;
                    // Step `stage - 1` has room for its next chunk.
                    busy[stage - 1] -= 1;
                    start_ready(stage - 1, &mut ready, &mut next, &mut offsets, &mut busy);
                    if stage < steps {
                        ready[stage].insert(idx, f);
                        start_ready(stage, &mut ready, &mut next, &mut offsets, &mut busy);
                    } else {
                        finished.insert(idx, f);
                        while let Some(done) = finished.remove(&sunk) {
                            sink(done)?;
                            sunk += 1;
                            bar.inc(pending_rows.pop_front().expect("one per chunk read"));
                            // The reader may be gone already (end of input).
                            let _ = credit.try_send(());
                        }
                    }
                }
            }
        }
        Ok(rows)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[test]
    fn a_run_that_wrote_nothing_points_at_rejects_only_where_rows_were_rejected() {
        let summary = |rejects: &[(&str, u64)], skipped: &[(&str, u64)]| super::RunSummary {
            rows_read: rejects.iter().chain(skipped).map(|r| r.1).sum(),
            rows_written: 0,
            rejects: rejects.iter().map(|&(k, n)| (k.to_owned(), n)).collect(),
            skipped: skipped.iter().map(|&(k, n)| (k.to_owned(), n)).collect(),
            data_shards: Vec::new(),
            timings_s: Default::default(),
        };
        let w = summary(&[], &[("read_imagenet21k/outside_synset_folders", 2)]).warnings();
        assert_eq!(
            w,
            ["no row was written: the 2 row(s) read were all skipped; most often \
              `read_imagenet21k/outside_synset_folders` (2); the report counts them by reason"]
        );
        let w = summary(&[("read_cc_tsv/wrong_field_count", 3)], &[]).warnings();
        assert!(w[0].ends_with("all rejected; most often `read_cc_tsv/wrong_field_count` (3); `rejects/` holds the rows and their reasons"), "{w:?}");
        let w = summary(&[("read_yfcc/bad_id", 1)], &[("read_yfcc/video", 4)]).warnings();
        assert!(
            w[0].contains("all rejected or skipped; most often `read_yfcc/video` (4); `rejects/` holds the rejected"),
            "{w:?}"
        );
    }

    #[test]
    fn a_chunk_that_fills_little_of_its_buffers_is_cached_in_buffers_of_its_size() {
        use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
        let mut b = arrow_array::builder::StringBuilder::with_capacity(100_000, 8 << 20);
        b.append_value("kept");
        b.append_null();
        let sparse: ArrayRef = Arc::new(b.finish());
        let batch = RecordBatch::try_from_iter([("caption", sparse)]).unwrap();
        let small = super::compacted(&batch);
        assert!(batch.get_array_memory_size() > 8 << 20);
        assert!(small.get_array_memory_size() < 4096, "{}", small.get_array_memory_size());
        assert_eq!(small, batch, "the same values and nulls");
        // 8 MiB of room: 5 MiB used is shared, not copied; 3 MiB is copied (past 2 × used + 1 MiB).
        let value = "x".repeat(1024);
        let filled = |mib: usize| {
            let mut b = arrow_array::builder::StringBuilder::with_capacity(8 << 10, 8 << 20);
            for _ in 0..mib << 10 {
                b.append_value(&value);
            }
            let column: ArrayRef = Arc::new(b.finish());
            RecordBatch::try_from_iter([("caption", column)]).unwrap()
        };
        let values = |b: &RecordBatch| b.column(0).to_data().buffers()[1].as_ptr();
        let mostly = filled(5);
        assert!(values(&super::compacted(&mostly)) == values(&mostly), "shared");
        let partly = filled(3);
        let copied = super::compacted(&partly);
        assert!(values(&copied) != values(&partly), "copied");
        assert!(copied.get_array_memory_size() < partly.get_array_memory_size() / 2);
        assert_eq!(copied, partly);
        // A small, full batch stays shared too.
        let full: ArrayRef = Arc::new(StringArray::from(vec!["a"; 1000]));
        let batch = RecordBatch::try_from_iter([("caption", full)]).unwrap();
        assert!(values(&super::compacted(&batch)) == values(&batch));
    }

    #[test]
    fn the_first_failure_is_the_one_reported() {
        let e = |m: &str| Err::<(), _>(crate::error::Error::data(m));
        let msg = |r: crate::error::Result<((), ())>| r.unwrap_err().to_string();
        // The reader failed; the writer then stopped for want of its end.
        assert_eq!(msg(super::first_failure(e("bad input"), e("stopped before its end"), false)), "bad input");
        // The writer failed (disk full); the stream then found it gone.
        assert_eq!(msg(super::first_failure(e("the writer stopped"), e("disk full"), true)), "disk full");
        assert_eq!(msg(super::first_failure(Ok(()), e("disk full"), false)), "disk full");
        assert!(super::first_failure(Ok(()), Ok::<(), crate::error::Error>(()), false).is_ok());
    }

    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    use arrow_array::{BooleanArray, UInt64Array};
    use arrow_schema::{DataType, Field, Schema, SchemaRef};

    use super::*;

    /// Only the run's own shard names are cleared from a shard folder; another tool's files
    /// there stay.
    #[test]
    fn only_files_named_as_the_run_names_its_shards_are_its_shards() {
        for ours in ["part-00000.parquet", "part-123456.parquet", ".part-00007.parquet.tmp"] {
            assert!(is_run_shard(ours), "{ours}");
        }
        for theirs in [
            "part-00000-9f1c2d3e-c000.snappy.parquet",
            "part-0.parquet",
            "part-abcde.parquet",
            "part-00000.parquet.bak",
            "00000.parquet",
            ".part-00000.parquet",
        ] {
            assert!(!is_run_shard(theirs), "{theirs}");
        }
    }
    use crate::stages::ChunkIter;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("i", DataType::UInt64, false)]))
    }

    /// Chunks of the numbers `0..n`, of uneven sizes.
    struct Numbers(Vec<usize>);

    impl Reader for Numbers {
        fn inputs(&self) -> Vec<std::path::PathBuf> {
            Vec::new()
        }
        fn open(&self) -> Result<ChunkIter<'_>> {
            let mut start = 0u64;
            let chunks: Vec<Result<Chunk>> = self
                .0
                .iter()
                .map(|&len| {
                    let col = UInt64Array::from_iter_values(start..start + len as u64);
                    start += len as u64;
                    let batch = RecordBatch::try_new(schema(), vec![Arc::new(col)]).unwrap();
                    Ok(Chunk { batch, rejects: Default::default(), skipped: Default::default() })
                })
                .collect();
            Ok(Box::new(chunks.into_iter()))
        }
    }

    /// Drops the rows whose index in this stage's input stream is a multiple of `k`, so it is
    /// only right if `first_row` is; some chunks are slow, so chunks finish out of order.
    struct DropEvery(u64);

    impl Transform for DropEvery {
        fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
            let n = chunk.batch.num_rows() as u64;
            if (first_row / 7).is_multiple_of(3) {
                std::thread::sleep(std::time::Duration::from_millis(3));
            }
            let keep: BooleanArray = (first_row..first_row + n).map(|i| Some(i % self.0 != 0)).collect();
            let batch = arrow_select::filter::filter_record_batch(&chunk.batch, &keep)?;
            Ok((Chunk { batch, ..chunk }, StageStats::None))
        }
        fn output_schema(&self) -> SchemaRef {
            schema()
        }
        fn report(&self, _: &StageStats) -> serde_json::Value {
            serde_json::Value::Null
        }
    }

    /// A chunk out of the stream: its first rows (one per transform) and its values.
    type ChunkOut = (Vec<u64>, Vec<u64>);

    /// The rows out of the stream, chunk by chunk.
    fn stream_from(
        sizes: &[usize],
        transforms: &[(String, Box<dyn Transform>)],
        start: &StreamStart,
    ) -> (u64, Vec<ChunkOut>) {
        let reader = Numbers(sizes.to_vec());
        let bar = super::super::progress::Progress::new(false, 1).pass(1, "test", None);
        let mut out = Vec::new();
        let rows = std::thread::scope(|s| {
            transform_stream(s, &reader, "numbers", None, transforms, start, &bar, |f| {
                let values = f.chunk.batch.column(0).as_primitive::<UInt64Type>().values().to_vec();
                out.push((f.first_rows, values));
                Ok(())
            })
        })
        .unwrap();
        (rows, out)
    }

    fn stream(sizes: &[usize], transforms: &[(String, Box<dyn Transform>)]) -> (u64, Vec<u64>) {
        let (rows, chunks) = stream_from(sizes, transforms, &StreamStart::default());
        (rows, chunks.into_iter().flat_map(|(_, v)| v).collect())
    }

    #[test]
    fn chunks_go_through_every_transform_with_their_row_offsets_and_come_out_in_order() {
        let sizes: Vec<usize> = (0..40).map(|i| 1 + (i * 37) % 23).collect();
        let total: usize = sizes.iter().sum();
        // Sequentially: drop every 3rd row, then every 2nd of what is left.
        let first: Vec<u64> = (0..total as u64).filter(|i| i % 3 != 0).collect();
        let want: Vec<u64> = first.iter().enumerate().filter(|(j, _)| j % 2 != 0).map(|(_, &v)| v).collect();
        let transforms: Vec<(String, Box<dyn Transform>)> =
            vec![("a".into(), Box::new(DropEvery(3))), ("b".into(), Box::new(DropEvery(2)))];
        for threads in [1, 4] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            // Inside the pool (as the tests' thread-count runs do) and from outside it.
            assert_eq!(pool.install(|| stream(&sizes, &transforms)), (total as u64, want.clone()), "{threads}");
        }
        assert_eq!(stream(&sizes, &transforms), (total as u64, want));
        // No transform: the chunks pass through.
        assert_eq!(stream(&sizes, &[]).1, (0..total as u64).collect::<Vec<_>>());
    }

    /// An encoder stand-in: parallel inside; records how many chunks were in it at once and
    /// in which order they came.
    #[derive(Default)]
    struct OneAtATime {
        inside: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        order: std::sync::Mutex<Vec<u64>>,
    }

    impl Transform for OneAtATime {
        fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.inside.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            self.order.lock().unwrap().push(first_row);
            std::thread::sleep(std::time::Duration::from_millis(2));
            self.inside.fetch_sub(1, SeqCst);
            Ok((chunk, StageStats::None))
        }
        fn parallel_inside(&self) -> bool {
            true
        }
        fn output_schema(&self) -> SchemaRef {
            schema()
        }
        fn report(&self, _: &StageStats) -> serde_json::Value {
            serde_json::Value::Null
        }
    }

    #[test]
    fn a_transform_parallel_inside_gets_one_chunk_at_a_time() {
        // Between two transforms that run chunks side by side, and on a pool of 4 threads.
        let sizes: Vec<usize> = (0..20).map(|i| 1 + (i * 37) % 23).collect();
        let total: usize = sizes.iter().sum();
        let encoder = Arc::new(OneAtATime::default());
        struct Shared(Arc<OneAtATime>);
        impl Transform for Shared {
            fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
                self.0.apply(chunk, first_row)
            }
            fn parallel_inside(&self) -> bool {
                self.0.parallel_inside()
            }
            fn output_schema(&self) -> SchemaRef {
                schema()
            }
            fn report(&self, _: &StageStats) -> serde_json::Value {
                serde_json::Value::Null
            }
        }
        let transforms: Vec<(String, Box<dyn Transform>)> = vec![
            ("a".into(), Box::new(DropEvery(3))),
            ("enc".into(), Box::new(Shared(encoder.clone()))),
            ("b".into(), Box::new(DropEvery(2))),
        ];
        let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        let (rows, values) = pool.install(|| stream(&sizes, &transforms));
        let first: Vec<u64> = (0..total as u64).filter(|i| i % 3 != 0).collect();
        let want: Vec<u64> = first.iter().enumerate().filter(|(j, _)| j % 2 != 0).map(|(_, &v)| v).collect();
        assert_eq!((rows, values), (total as u64, want));
        let most = encoder.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!((1..=SERIAL_AT_ONCE).contains(&most), "{most} chunks in it at once");
        // Each chunk once (the rows above come out in input order).
        let mut order = encoder.order.lock().unwrap().clone();
        order.sort_unstable();
        let mut firsts: Vec<u64> = Vec::new();
        let mut at = 0u64;
        for (i, &n) in sizes.iter().enumerate() {
            firsts.push(at);
            // What the first transform keeps of chunk `i`: rows not a multiple of 3.
            let start: u64 = sizes[..i].iter().sum::<usize>() as u64;
            at += (start..start + n as u64).filter(|r| r % 3 != 0).count() as u64;
        }
        assert_eq!(order, firsts);
    }

    #[test]
    fn a_stream_started_at_a_chunk_gives_the_rest_of_the_whole_stream() {
        let sizes: Vec<usize> = (0..30).map(|i| 1 + (i * 37) % 23).collect();
        let transforms: Vec<(String, Box<dyn Transform>)> =
            vec![("a".into(), Box::new(DropEvery(3))), ("b".into(), Box::new(DropEvery(2)))];
        let (rows, whole) = stream_from(&sizes, &transforms, &StreamStart::default());
        for k in [0, 1, 13, 29, 30] {
            // Where a killed run's checkpoint would put it: chunk `k` and its first rows.
            let first_rows = whole.get(k).map_or_else(Vec::new, |(f, _)| f.clone());
            let start = StreamStart { chunk: k, first_rows };
            let (rows_k, rest) = stream_from(&sizes, &transforms, &start);
            assert_eq!(rows_k, rows, "every input row is counted, skipped or not");
            assert_eq!(rest, whole[k..], "from chunk {k}");
        }
        // The first rows are each transform's running input count.
        assert_eq!(whole[0].0, [0, 0]);
        assert_eq!(whole[1].0, [sizes[0] as u64, (sizes[0] - sizes[0].div_ceil(3)) as u64]);
    }

    /// A stage that panics on its third chunk, and a reader that panics after two chunks.
    struct PanicsAt(u64);

    impl Transform for PanicsAt {
        fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
            assert!(first_row < self.0, "stage bug");
            Ok((chunk, StageStats::None))
        }
        fn output_schema(&self) -> SchemaRef {
            schema()
        }
        fn report(&self, _: &StageStats) -> serde_json::Value {
            serde_json::Value::Null
        }
    }

    struct PanickyReader;

    impl Reader for PanickyReader {
        fn inputs(&self) -> Vec<std::path::PathBuf> {
            Vec::new()
        }
        fn open(&self) -> Result<ChunkIter<'_>> {
            let chunks: Vec<Result<Chunk>> = Numbers(vec![5, 5]).open()?.collect();
            Ok(Box::new(chunks.into_iter().chain(std::iter::from_fn(|| panic!("reader bug")))))
        }
    }

    #[test]
    fn a_panic_in_a_stage_or_the_reader_ends_the_stream_with_an_error() {
        let bar = super::super::progress::Progress::new(false, 1).pass(1, "test", None);
        let transforms: Vec<(String, Box<dyn Transform>)> = vec![("p".into(), Box::new(PanicsAt(10)))];
        let run = |reader: &dyn Reader, transforms: &[(String, Box<dyn Transform>)]| {
            std::thread::scope(|s| {
                transform_stream(s, reader, "numbers", None, transforms, &StreamStart::default(), &bar, |_| Ok(()))
            })
            .expect_err("the panic is an error")
            .to_string()
        };
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let e = pool.install(|| run(&Numbers(vec![5; 6]), &transforms));
            assert!(e.contains("stage `p` stopped on an internal error") && e.contains("stage bug"), "{e}");
            let e = pool.install(|| run(&PanickyReader, &[]));
            assert!(e.contains("the reader stopped on an internal error") && e.contains("reader bug"), "{e}");
        }
    }
}
