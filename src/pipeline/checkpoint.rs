//! Resuming a killed run: the checkpoint a run keeps in its `output_dir` while it streams, and
//! the check that a later run of the same pipeline may go on from it.
//!
//! Each time a data shard is finished, the writer also ends the rejects shard it is filling and
//! saves (atomically, at most once a second) where the stream stands: the reader chunk being
//! written and how many of its output rows are in finished shards, each transform's first row for
//! that chunk, the shards finished, the reject and skip counts and each stage's report statistics
//! of the chunks before it. A run started on a folder holding an unaltered checkpoint (its digest
//! line checks) with the same config hash, pipeline name, curate version and inputs (paths, sizes,
//! modification times, as they were before the killed run read them), whose shards are all there
//! with their sizes, keeps those shards: it runs the fit passes again (they are deterministic),
//! reads the input again without transforming the chunks already written, and writes on from the
//! checkpoint. The output is byte-identical to an uninterrupted run's. A finished run removes its
//! checkpoint after writing `manifest.json`; `--restart` ignores one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::io::parquet::ShardInfo;
use crate::io::write_atomic;
use crate::stages::StageStats;

/// The checkpoint's file name in `output_dir`: a digest line, then JSON.
pub const FILE: &str = ".curate-checkpoint";

/// An input file as the checkpoint saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputStamp {
    pub path: PathBuf,
    pub bytes: u64,
    /// Modification time, nanoseconds since the Unix epoch (0 where the file system has none).
    pub modified_ns: u128,
}

impl InputStamp {
    /// The stamps of `inputs` now (`None` for one that cannot be read).
    pub fn of(inputs: &[PathBuf]) -> Vec<Option<InputStamp>> {
        inputs
            .iter()
            .map(|p| {
                let m = std::fs::metadata(p).ok()?;
                let modified_ns = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                Some(InputStamp { path: p.clone(), bytes: m.len(), modified_ns })
            })
            .collect()
    }
}

/// A digest of the contents of `files` (the stages' model and table files), hex: a file
/// replaced by another of the same size and time, which its stamp cannot tell, changes it. Read
/// in 1 MiB pieces (a model can be gigabytes); a file that cannot be read counts as such.
pub fn content_digest(files: &[PathBuf]) -> String {
    use std::io::Read;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    for path in files {
        h.update(path.as_os_str().as_encoded_bytes());
        h.update(&[0]);
        let Ok(mut f) = std::fs::File::open(path) else {
            h.update(b"unreadable");
            continue;
        };
        let mut len = 0u64;
        loop {
            match f.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    h.update(&buf[..n]);
                    len += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    h.update(b"unreadable");
                    break;
                }
            }
        }
        h.update(&len.to_le_bytes());
    }
    hex(h.digest128())
}

/// A finished shard and its size, to recognize it on resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptShard {
    #[serde(flatten)]
    pub info: ShardInfo,
    pub bytes: u64,
}

impl KeptShard {
    fn list(dir: &Path, shards: &[ShardInfo]) -> Vec<KeptShard> {
        shards
            .iter()
            .map(|info| KeptShard {
                info: info.clone(),
                bytes: std::fs::metadata(dir.join(&info.file)).map_or(0, |m| m.len()),
            })
            .collect()
    }

    /// Why `shards` in `dir` are not as saved, if they are not: each must be there, with its
    /// size, and a Parquet file (its footer read) of its rows.
    fn missing(dir: &Path, shards: &[KeptShard]) -> Option<String> {
        shards.iter().find_map(|s| {
            let path = dir.join(&s.info.file);
            match std::fs::metadata(&path) {
                Ok(m) if m.len() != s.bytes => Some(format!("`{}` changed size", path.display())),
                Ok(_) => match crate::io::parquet::row_count(&path) {
                    Ok(rows) if rows == s.info.rows => None,
                    Ok(rows) => Some(format!("`{}` has {rows} rows, not {}", path.display(), s.info.rows)),
                    Err(_) => Some(format!("`{}` is no longer a readable Parquet file", path.display())),
                },
                Err(_) => Some(format!("`{}` is gone", path.display())),
            }
        })
    }
}

/// Where a killed run's stream stood when it last finished a data shard.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub curate_version: String,
    pub config_hash: String,
    /// The pipeline's name (in the shards' metadata, beside the config hash).
    pub pipeline: String,
    pub inputs: Vec<InputStamp>,
    /// [`crate::stages::Reader::folder_stamp`], hex.
    #[serde(default)]
    pub folder_stamp: Option<String>,
    /// [`content_digest`] of the stages' model and table files (`None`: saved by an earlier
    /// curate, which took none).
    #[serde(default)]
    pub side_digest: Option<String>,
    /// The rows per chunk the reader's chunks were cut to ([`crate::pipeline::plan::Plan::chunk_split`];
    /// `None`: the reader's own chunks, or saved by an earlier curate, which did not cut them).
    #[serde(default)]
    pub chunk_split: Option<usize>,
    /// The reader chunk (0-based; a piece of one, with `chunk_split`) being written: every chunk
    /// before it is in finished shards, data and rejects.
    pub chunk: usize,
    /// Output rows of that chunk already in finished data shards (its rejects are not written).
    pub rows_into_chunk: u64,
    /// The index of that chunk's first row in each transform's input.
    pub first_rows: Vec<u64>,
    pub data_shards: Vec<KeptShard>,
    pub reject_shards: Vec<KeptShard>,
    /// Rejects of the chunks before `chunk`, by `stage/reason`.
    pub rejects: BTreeMap<String, u64>,
    /// Skipped rows of the chunks before `chunk`, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Each transform's report statistics of the chunks before `chunk`.
    pub stats: Vec<StageStats>,
    /// The inputs' fingerprint (as in the manifest) of the content the kept shards came from:
    /// the run that resumes keeps it in its own checkpoints and fails at its end if it finds
    /// another, so content changed under an unchanged size and time is caught. A checkpoint
    /// saved before the run had it is not resumed.
    #[serde(default)]
    pub input_fingerprint: Option<String>,
    /// [`chain_read_digest`] of the reader's chunks up to and including `chunk`, hex: the rows a
    /// resumed run reads again must be these.
    #[serde(default)]
    pub read_digest: Option<String>,
    /// [`chain_read_digest`] of the whole input as the fit passes read it (none without fit
    /// passes): what the stages learned, which the kept shards show, came from those rows.
    #[serde(default)]
    pub fit_read_digest: Option<String>,
}

/// A digest as a checkpoint writes it: 32 hex digits.
pub fn hex(digest: u128) -> String {
    format!("{digest:032x}")
}

/// What the reader gave, chunk after chunk, as a running digest: `before` (that of the chunks
/// before) and `chunk`'s sample ids, rejects (file, row, stage, reason) and skip counts. The input
/// fingerprint covers the input's bytes, not what a reader looks up beside them: a table's
/// image files (`check_files`) can come or go between a killed run and its resumption, and a
/// row that became a `missing_file` reject, or stopped being one, would shift every later row
/// of a stream that goes on by row counts.
pub fn chain_read_digest(before: u128, chunk: &crate::schema::Chunk) -> u128 {
    use arrow_array::cast::AsArray;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&before.to_le_bytes());
    h.update(&(chunk.batch.num_rows() as u64).to_le_bytes());
    // Readers give `pairs` rows, which have ids (a test's batch may not).
    let ids = chunk.batch.column_by_name(crate::schema::SAMPLE_ID).and_then(|c| c.as_string_opt::<i32>());
    if let Some(ids) = ids {
        let offsets = ids.value_offsets();
        let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
        // Each id's end, from the first id's start (a chunk may be a slice of a larger batch).
        let mut ends = [0u8; 4096];
        for part in offsets[1..].chunks(ends.len() / 4) {
            for (e, o) in ends.chunks_exact_mut(4).zip(part) {
                e.copy_from_slice(&(o - first).to_le_bytes());
            }
            h.update(&ends[..part.len() * 4]);
        }
        h.update(&ids.value_data()[first as usize..last as usize]);
    }
    chunk.rejects.digest_into(&mut h);
    for (reason, n) in &chunk.skipped {
        h.update(reason.as_bytes());
        h.update(b"\0");
        h.update(&n.to_le_bytes());
    }
    h.digest128()
}

/// The digest line that heads the checkpoint file, of the JSON after it: a file edited or
/// damaged by hand does not steer a run.
fn digest(json: &[u8]) -> String {
    format!("xxh3-64:{:016x}", xxhash_rust::xxh3::xxh3_64(json))
}

/// What stays the same between a run and the run that resumes it.
pub struct RunIdentity<'a> {
    pub config_hash: &'a str,
    pub pipeline: &'a str,
    /// The inputs as the run found them before reading any (an input changed while the run
    /// reads it fails the run at its end, and must not look unchanged to the next one).
    pub inputs: &'a [Option<InputStamp>],
    /// [`crate::stages::Reader::folder_stamp`] as the run found it before reading, hex.
    pub folder_stamp: Option<String>,
    /// [`content_digest`] of the stages' model and table files.
    pub side_digest: &'a str,
    /// [`crate::pipeline::plan::Plan::chunk_split`]: chunk numbers mean other rows under another.
    pub chunk_split: Option<usize>,
    pub data_dir: &'a Path,
    pub rejects_dir: &'a Path,
}

/// Where the stream stands, as the writer sees it, for [`save`].
pub struct Position<'a> {
    pub chunk: usize,
    pub rows_into_chunk: u64,
    pub first_rows: &'a [u64],
    pub data_shards: &'a [ShardInfo],
    pub reject_shards: &'a [ShardInfo],
    pub rejects: BTreeMap<String, u64>,
    pub skipped: &'a BTreeMap<String, u64>,
    pub stats: &'a [StageStats],
    pub input_fingerprint: Option<String>,
    /// [`chain_read_digest`] through `chunk`.
    pub read_digest: u128,
    /// [`chain_read_digest`] of the whole input as the fit passes read it.
    pub fit_read_digest: Option<u128>,
}

/// Saves `at` in `out` (atomically: a run killed while saving keeps the checkpoint before).
pub fn save(out: &Path, run: &RunIdentity<'_>, at: Position<'_>) -> Result<()> {
    let checkpoint = Checkpoint {
        curate_version: env!("CARGO_PKG_VERSION").to_owned(),
        config_hash: run.config_hash.to_owned(),
        pipeline: run.pipeline.to_owned(),
        inputs: run.inputs.iter().flatten().cloned().collect(),
        folder_stamp: run.folder_stamp.clone(),
        side_digest: Some(run.side_digest.to_owned()),
        chunk_split: run.chunk_split,
        chunk: at.chunk,
        rows_into_chunk: at.rows_into_chunk,
        first_rows: at.first_rows.to_vec(),
        data_shards: KeptShard::list(run.data_dir, at.data_shards),
        reject_shards: KeptShard::list(run.rejects_dir, at.reject_shards),
        rejects: at.rejects,
        skipped: at.skipped.clone(),
        stats: at.stats.to_vec(),
        input_fingerprint: at.input_fingerprint,
        read_digest: Some(hex(at.read_digest)),
        fit_read_digest: at.fit_read_digest.map(hex),
    };
    let json = serde_json::to_vec(&checkpoint).expect("a checkpoint serializes");
    let mut file = format!("{}\n", digest(&json)).into_bytes();
    file.extend_from_slice(&json);
    write_atomic(&out.join(FILE), &file)
}

/// The checkpoint in `out` this run can go on from, if there is one: else `None`, with a note
/// on stderr saying why one that is there does not serve.
pub fn load(out: &Path, run: &RunIdentity<'_>) -> Option<Checkpoint> {
    let why_not = read(out)?.and_then(|c| usable(&c, run).map(|()| c));
    match why_not {
        Ok(c) => Some(c),
        Err(why) => {
            say!("note: `{}` holds a killed run's checkpoint, but {why}: starting over", out.display());
            None
        }
    }
}

/// The checkpoint in `out` (`None`: there is none), or why it cannot be read.
fn read(out: &Path) -> Option<std::result::Result<Checkpoint, String>> {
    let text = std::fs::read(out.join(FILE)).ok()?;
    let (head, json) = text.split_at(text.iter().position(|&b| b == b'\n').unwrap_or(text.len()));
    let json = json.get(1..).unwrap_or_default();
    Some(if head != digest(json).as_bytes() {
        Err("it was changed or damaged since it was saved".to_owned())
    } else {
        serde_json::from_slice::<Checkpoint>(json).map_err(|e| format!("it cannot be read ({e})"))
    })
}

/// Whether this run may go on from `c`, or why not.
fn usable(c: &Checkpoint, run: &RunIdentity<'_>) -> std::result::Result<(), String> {
    if c.curate_version != env!("CARGO_PKG_VERSION") {
        return Err(format!("it was made by curate {}", c.curate_version));
    }
    if c.pipeline != run.pipeline {
        return Err(format!(
            "it is of pipeline `{}`, not `{}` (the pipeline's `name`, or its file's name without one)",
            c.pipeline, run.pipeline
        ));
    }
    if c.config_hash != run.config_hash {
        return Err("the pipeline's settings changed since".to_owned());
    }
    if c.chunk_split != run.chunk_split {
        let pieces =
            |split: Option<usize>| split.map_or("the reader's own chunks".to_owned(), |n| format!("{n}-row pieces"));
        let earlier = if c.chunk_split.is_none() { ", saved by an earlier curate" } else { "" };
        return Err(format!(
            "its chunks were cut to another size ({}{earlier}; this run streams {})",
            pieces(c.chunk_split),
            pieces(run.chunk_split)
        ));
    }
    if c.read_digest.is_none() {
        return Err("it holds no digest of the rows read (saved by an earlier curate)".to_owned());
    }
    let now = run.inputs;
    let changed = now.len() != c.inputs.len() || now.iter().zip(&c.inputs).any(|(a, b)| a.as_ref() != Some(b));
    if changed || c.folder_stamp != run.folder_stamp {
        return Err(
            "the input files, or the stages' model and table files, changed since (paths, sizes or modification times)"
                .to_owned(),
        );
    }
    // A model or table replaced by another of the same size and time (`cp -p`): the kept shards
    // were made with the other.
    if c.side_digest.as_deref() != Some(run.side_digest) {
        return Err("the stages' model and table files changed since (their contents)".to_owned());
    }
    // Without it, content changed under an unchanged size and time could not be told.
    if c.input_fingerprint.is_none() {
        return Err("it was saved before the input's fingerprint was taken".to_owned());
    }
    if c.stats.len() != c.first_rows.len() {
        return Err("it does not match the pipeline's stages".to_owned());
    }
    if let Some(why) = KeptShard::missing(run.data_dir, &c.data_shards)
        .or_else(|| KeptShard::missing(run.rejects_dir, &c.reject_shards))
    {
        return Err(format!("a shard it kept is not as it was: {why}"));
    }
    Ok(())
}

/// The shard files the checkpoint in `out` lists, if it is intact (none else): what a failed
/// run leaves for the next one to go on from.
pub fn kept_files(out: &Path, data_dir: &Path, rejects_dir: &Path) -> Vec<PathBuf> {
    let Some(c) = read(out).and_then(|r| r.ok()) else { return Vec::new() };
    let data = c.data_shards.iter().map(|s| data_dir.join(&s.info.file));
    data.chain(c.reject_shards.iter().map(|s| rejects_dir.join(&s.info.file))).collect()
}

/// Removes the checkpoint of `out` (best effort: the run is over, finished or failed).
pub fn remove(out: &Path) {
    let _ = std::fs::remove_file(out.join(FILE));
}
