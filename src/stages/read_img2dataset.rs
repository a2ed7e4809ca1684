//! `read_img2dataset`: the output folder of img2dataset, either its per-shard metadata Parquet
//! (`00000.parquet`: `key, caption, url, status, error_message, ...`) or its webdataset tar
//! shards (`00000.tar`: `KEY.jpg` + `KEY.txt` + `KEY.json` per sample). The format follows
//! each file's extension.
//!
//! `sample_id` is img2dataset's `key` (unique within one img2dataset output); the image
//! reference is `shard` (the shard's file stem, e.g. `00000`) + `key`, and `url`. Parquet rows
//! whose `status` is not `success` are `download_failed` rejects; a tar sample lacking its
//! caption, image, or valid JSON is a reject with that reason. A tar shard cut short or with a
//! corrupt header (`io::tar_shards`) keeps the samples before the damage and adds one
//! `truncated_tar` or `corrupt_tar` reject; a member repeating its sample's extension is a
//! `duplicate_member` reject, so that every member read is in the data or the rejects.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde::{Deserialize, Serialize};

use super::{chunk_of, expand_inputs_known_by, has_words, ChunkIter, Problems, Reader, UniqueIds};
use crate::error::{Error, Result};
use crate::io::{file_name, parquet, tar_shards, PathPatterns};
use crate::schema::{Chunk, PairRow, PairsBuilder, Reject};

pub const TYPE: &str = "read_img2dataset";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadImg2datasetConfig {
    /// Shard files: `*.parquet` (metadata) or `*.tar` (webdataset), e.g. `out/{00000..00099}.tar`
    /// written as `out/*.tar`.
    pub path: PathPatterns,
    #[serde(default = "default_source")]
    pub source: String,
}

fn default_source() -> String {
    "img2dataset".into()
}

const IMAGE_EXTS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];

impl ReadImg2datasetConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadImg2dataset> {
        let files = expand_inputs_known_by(
            &self.path,
            problems,
            "path",
            "*.parquet",
            Some(
                "rejects name a shard by its file name, and img2dataset numbers the shards and keys of every run alike",
            ),
        );
        for f in &files {
            match shard_kind(f) {
                Some(ShardKind::Tar) => {
                    if let Some(kind) = compressed_tar(f) {
                        problems.push(
                            "path",
                            format!("`{}` is {kind}, not a plain tar shard", f.display()),
                            Some(
                                "img2dataset writes plain tar shards: decompress it first (e.g. `gzip -dc A > B.tar`)"
                                    .into(),
                            ),
                        );
                    }
                }
                Some(ShardKind::Parquet) => match parquet::read_schema(f) {
                    Ok(schema) => {
                        for col in COLUMNS {
                            let copies = schema.fields().iter().filter(|field| field.name() == col).count();
                            if copies > 1 {
                                problems.push(
                                    "path",
                                    format!("`{}` has {copies} columns named `{col}`", f.display()),
                                    Some("which one holds the data is unknown: write the shard with one".into()),
                                );
                                continue;
                            }
                            match schema.field_with_name(col) {
                                // (pandas writes a column of Nones as type `null`: all nulls.)
                                Ok(field) if is_text(field.data_type()) || field.data_type().is_null() => {}
                                Ok(field) => problems.push(
                                    "path",
                                    format!("`{}`: column `{col}` is {}, expected a string", f.display(), field.data_type()),
                                    None,
                                ),
                                Err(_) => problems.push(
                                    "path",
                                    format!("`{}` has no column `{col}`", f.display()),
                                    Some("img2dataset metadata has `key, caption, url, status`; for other tables use `read_table`".into()),
                                ),
                            }
                        }
                    }
                    Err(e) => problems.push("path", format!("cannot read `{}`: {e}", f.display()), None),
                },
                _ => problems.push(
                    "path",
                    format!("`{}` is neither a .parquet nor a .tar shard", f.display()),
                    Some("point `path` at img2dataset's `*.parquet` or `*.tar` files".into()),
                ),
            }
        }
        // img2dataset writes each shard twice, `00000.parquet` and `00000.tar`: reading both
        // would read every sample twice (the second copies all `duplicate_key` rejects).
        let tars: std::collections::HashMap<PathBuf, &Path> = files
            .iter()
            .filter(|f| shard_kind(f) == Some(ShardKind::Tar))
            .map(|f| (f.with_extension(""), f.as_path()))
            .collect();
        let both: Vec<(&PathBuf, &Path)> = files
            .iter()
            .filter(|f| shard_kind(f) == Some(ShardKind::Parquet))
            .filter_map(|f| tars.get(&f.with_extension("")).map(|tar| (f, *tar)))
            .collect();
        if let Some((first, tar)) = both.first() {
            let folder = first.parent().unwrap_or(Path::new(""));
            problems.push(
                "path",
                format!(
                    "`{}` and `{}` are one img2dataset shard, its metadata and its images ({} shard(s) given both \
                     ways): every sample would be read twice",
                    first.display(),
                    tar.display(),
                    both.len()
                ),
                Some(format!(
                    "read one kind: `{}` (with the images) or `{}` (the metadata)",
                    folder.join("*.tar").display(),
                    folder.join("*.parquet").display()
                )),
            );
        }
        problems.is_empty().then(|| ReadImg2dataset { files, source: self.source.clone() })
    }
}

pub struct ReadImg2dataset {
    files: Vec<PathBuf>,
    source: String,
}

impl Reader for ReadImg2dataset {
    fn inputs(&self) -> Vec<PathBuf> {
        self.files.clone()
    }

    fn fills(&self, column: &str) -> bool {
        use crate::schema::{CAPTION, KEY, SAMPLE_ID, SHARD, SOURCE, URL};
        [SAMPLE_ID, SOURCE, CAPTION, URL, SHARD, KEY].contains(&column)
    }

    fn image_refs(&self) -> super::ImageRefs {
        super::ImageRefs::ShardKeys
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        // One chunk per shard: img2dataset shards hold ~10k samples. Keys are the ids, so a key
        // seen before (a corrupt or twice-written shard) is a `duplicate_key` reject.
        let mut seen = UniqueIds::default();
        Ok(Box::new(self.files.iter().map(move |f| {
            if shard_kind(f) == Some(ShardKind::Tar) {
                read_tar(f, &self.source, &mut seen)
            } else {
                read_metadata(f, &self.source, &mut seen)
            }
        })))
    }
}

/// The two kinds of img2dataset shard, by file extension (in any case, as elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ShardKind {
    Tar,
    Parquet,
}

fn shard_kind(path: &Path) -> Option<ShardKind> {
    let ext = path.extension()?.to_str()?;
    if ext.eq_ignore_ascii_case("tar") {
        Some(ShardKind::Tar)
    } else if ext.eq_ignore_ascii_case("parquet") {
        Some(ShardKind::Parquet)
    } else {
        None
    }
}

/// What a `.tar` shard is compressed with, by its first bytes, if it is (`.tar.gz` renamed, or
/// written by a tool that compresses): read as tar, its first header would be a `corrupt_tar`.
fn compressed_tar(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut head = Vec::new();
    std::fs::File::open(path).ok()?.take(512).read_to_end(&mut head).ok()?;
    super::inputs::compression_of(&head)
}

/// img2dataset's metadata columns that curate reads (`error_message` too, where there).
const COLUMNS: [&str; 4] = ["key", "caption", "url", "status"];

fn stem(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

const DUPLICATE: &str = "the key was already read (here or in an earlier shard)";

fn read_metadata(path: &Path, source: &str, seen: &mut UniqueIds) -> Result<Chunk> {
    let shard = stem(path);
    let name = file_name(path);
    let mut out = PairsBuilder::new(source);
    let mut rejects = Vec::new();
    let mut row = 0u64;
    // Text columns come as bytes, so that a value that is not UTF-8 rejects its row only.
    for batch in parquet::read_batches_text_unchecked(path, 1 << 16)? {
        let batch = batch?;
        let text = |k: usize| text_column(&batch, COLUMNS[k]);
        let columns = [text(0)?, text(1)?, text(2)?, text(3)?];
        let fields = columns.each_ref().map(|c| c.iter().collect::<Vec<Option<&str>>>());
        let [keys, caps, urls, status] = &fields;
        let error_column = text_column(&batch, "error_message").ok();
        let errors: Option<Vec<Option<&str>>> = error_column.as_ref().map(|c| c.iter().collect());
        // Each column as stored, where it is bytes (text columns are read so): a value there
        // that the cast to text made a null is not UTF-8, and rejects its row with the four
        // values, as stored, joined by tabs.
        let bytes: [Option<arrow_array::BinaryArray>; 4] = COLUMNS.map(|n| {
            let col = batch.column_by_name(n)?;
            let cast = is_bytes(col.data_type()).then(|| arrow_cast::cast(col, &DataType::Binary).ok()).flatten()?;
            Some(cast.as_binary::<i32>().clone())
        });
        let raw_bytes = |i: usize| -> Option<(&'static str, Vec<u8>)> {
            let bad = (0..4).find(|&k| bytes[k].as_ref().is_some_and(|b| b.is_valid(i)) && fields[k][i].is_none())?;
            let mut line = Vec::new();
            for k in 0..4 {
                if k > 0 {
                    line.push(b'\t');
                }
                // Every value as stored (each of several bad ones too); a null is nothing.
                match (&bytes[k], fields[k][i]) {
                    (Some(b), _) if b.is_valid(i) => line.extend_from_slice(b.value(i)),
                    (_, Some(v)) => line.extend_from_slice(v.as_bytes()),
                    _ => {}
                }
            }
            Some((COLUMNS[bad], line))
        };
        for i in 0..batch.num_rows() {
            let reject = |reason: &'static str, detail: String| Reject {
                stage: TYPE,
                source_file: name.clone(),
                row: row + i as u64,
                // A blank key names no sample (as a blank mapped id in `read_table`).
                sample_id: keys[i].filter(|k| has_words(k)).map(str::to_owned),
                reason,
                detail: detail.into(),
                raw: row_json(keys, caps, urls, status, i).into_bytes(),
            };
            if let Some((column, raw)) = raw_bytes(i) {
                rejects.push(Reject {
                    raw,
                    ..reject(
                        "invalid_utf8",
                        format!("`{column}` is not UTF-8 text (raw: key, caption, url, status by tabs)"),
                    )
                });
                continue;
            }
            let Some(key) = keys[i].filter(|k| has_words(k)) else {
                rejects.push(reject("missing_key", "key is null or blank".into()));
                continue;
            };
            if status[i] != Some("success") {
                let status = status[i].unwrap_or("null");
                let detail = match errors.as_ref().and_then(|e| e[i]).filter(|e| !e.is_empty()) {
                    Some(err) => format!("status {status}: {err}"),
                    None => format!("status {status}"),
                };
                rejects.push(reject("download_failed", detail));
                continue;
            }
            match caps[i] {
                None => rejects.push(reject("missing_caption", "caption is null".into())),
                Some(c) if !has_words(c) => rejects.push(reject("empty_caption", "caption has no words".into())),
                Some(_) if !seen.first_time(key) => rejects.push(reject("duplicate_key", DUPLICATE.into())),
                Some(c) => out.push(PairRow {
                    sample_id: key,
                    caption: Some(c),
                    // An empty or blank url is a null url, as in every reader.
                    url: urls[i].filter(|u| !u.trim().is_empty()),
                    shard: Some(&shard),
                    key: Some(key),
                    ..Default::default()
                }),
            }
        }
        row += batch.num_rows() as u64;
    }
    Ok(chunk_of(out.finish(), rejects))
}

/// Strings, large strings, string views, and dictionaries of them (a table re-saved by pandas
/// or polars often has a categorical `status`).
fn is_text(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        // How the shard's text columns are read (`read_batches_text_unchecked`).
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => true,
        DataType::Dictionary(_, values) => is_text(values),
        _ => false,
    }
}

/// Bytes, and dictionaries of them: a categorical byte column (pandas' `category` of `bytes`,
/// pyarrow's `dictionary_encode`) holds a value that is not UTF-8 as well as a plain one does,
/// and must reject its row as `invalid_utf8` the same way, not read as a null.
fn is_bytes(t: &DataType) -> bool {
    match t {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => true,
        DataType::Dictionary(_, values) => is_bytes(values),
        _ => false,
    }
}

/// Column `name` as plain strings (see [`is_text`]); an all-null column of another type is
/// all nulls.
fn text_column(batch: &RecordBatch, name: &str) -> Result<arrow_array::StringArray> {
    let col = batch.column_by_name(name).ok_or_else(|| Error::data(format!("column `{name}` missing")))?;
    // (A `NullArray` counts no nulls in its buffer: its logical count is the one.)
    if !is_text(col.data_type()) && col.logical_null_count() != col.len() {
        return Err(Error::data(format!("column `{name}` is {}, expected a string", col.data_type())));
    }
    let cast = if is_text(col.data_type()) {
        arrow_cast::cast(col, &DataType::Utf8)?
    } else {
        arrow_array::new_null_array(&DataType::Utf8, col.len())
    };
    Ok(cast.as_string::<i32>().clone())
}

fn row_json(k: &[Option<&str>], c: &[Option<&str>], u: &[Option<&str>], s: &[Option<&str>], i: usize) -> String {
    serde_json::json!({"key": k[i], "caption": c[i], "url": u[i], "status": s[i]}).to_string()
}

fn read_tar(path: &Path, source: &str, seen: &mut UniqueIds) -> Result<Chunk> {
    let shard = stem(path);
    let name = file_name(path);
    let mut out = PairsBuilder::new(source);
    let mut rejects = Vec::new();
    let (samples, damage) = tar_shards::read_samples(path)?;
    for s in &samples {
        let reject = |reason: &'static str, row: u64, detail: String, raw: Vec<u8>| Reject {
            stage: TYPE,
            source_file: name.clone(),
            row,
            sample_id: (s.bad_name.is_none() && has_words(&s.key)).then(|| s.key.clone()),
            reason,
            detail: detail.into(),
            raw,
        };
        match judge(s, seen) {
            Ok((caption, url)) => out.push(PairRow {
                sample_id: &s.key,
                caption: Some(&caption),
                url: url.as_deref(),
                shard: Some(&shard),
                key: Some(&s.key),
                ..Default::default()
            }),
            Err((reason, detail, raw)) => rejects.push(reject(reason, s.member_index, detail.to_owned(), raw)),
        }
        // Rows are members here: the first copy stands for the sample, each repeat is a reject.
        for r in &s.repeats {
            let detail = format!("sample `{}` has a `.{}` member already; the first one is kept", s.key, r.ext);
            rejects.push(reject("duplicate_member", r.member_index, detail, r.name.clone()));
        }
    }
    // The damage is after every sample kept, so its reject comes last (input order).
    if let Some(d) = damage {
        rejects.push(Reject {
            stage: TYPE,
            source_file: name.clone(),
            row: d.member_index,
            // The sample left out at the damage, if any (a blank key names none).
            sample_id: d.left_out.filter(|k| has_words(k)),
            reason: match d.kind {
                tar_shards::DamageKind::Cut => "truncated_tar",
                tar_shards::DamageKind::Corrupt => "corrupt_tar",
            },
            detail: d.detail.into(),
            raw: name.clone().into_bytes(),
        });
    }
    Ok(chunk_of(out.finish(), rejects))
}

/// A kept tar sample's caption and url, or its reject's `(reason, detail, raw)`.
type Verdict = std::result::Result<(String, Option<String>), (&'static str, &'static str, Vec<u8>)>;

/// Whether a tar sample is kept. A key is marked seen only when its sample is.
fn judge(s: &tar_shards::Sample, seen: &mut UniqueIds) -> Verdict {
    if let Some(name) = &s.bad_name {
        return Err(("invalid_utf8", "the member name is not UTF-8, so its key is unknown", name.clone()));
    }
    // `.jpg`, `dir/.txt`: a member name with nothing before the extension; ` .jpg`: a blank
    // key, as a blank `key` in img2dataset's Parquet.
    let no_key = s.key.is_empty() || s.key.ends_with('/');
    if no_key || !has_words(&s.key) {
        let raw = s.member("txt").and_then(|m| m.data.clone()).unwrap_or_default();
        let detail = if no_key { "the member name has no key before its extension" } else { "the key is blank" };
        return Err(("missing_key", detail, raw));
    }
    let has_image = s.members.iter().any(|m| IMAGE_EXTS.contains(&m.ext.as_str()));
    let caption = s.member("txt").and_then(|m| m.data.clone());
    let json = s.member("json").and_then(|m| m.data.clone());
    let url = match json.as_deref().map(json_url) {
        // An empty or blank url is a null url, as in every reader.
        Some(Ok(url)) => url.filter(|u| !u.trim().is_empty()),
        Some(Err(())) => return Err(("bad_json", "KEY.json is not valid JSON", json.unwrap_or_default())),
        None => None,
    };
    let Some(caption) = caption else {
        return Err(("missing_caption", "no KEY.txt member", json.unwrap_or_default()));
    };
    if !has_image {
        return Err(("missing_image", "no image member", caption));
    }
    // A byte-order mark is not part of a text file's text (as for the text readers); `raw`
    // keeps the bytes as stored.
    let text = match std::str::from_utf8(caption.strip_prefix(crate::io::lines::BOM).unwrap_or(&caption)) {
        Ok(text) => text.to_owned(),
        Err(_) => return Err(("invalid_utf8", "KEY.txt is not UTF-8", caption)),
    };
    if !has_words(&text) {
        return Err(("empty_caption", "caption has no words", caption));
    }
    if !seen.first_time(&s.key) {
        return Err(("duplicate_key", DUPLICATE, caption));
    }
    Ok((text, url))
}

/// `text` with Python's `NaN`, `Infinity` and `-Infinity` outside strings written as `null`:
/// img2dataset writes `KEY.json` with Python's `json.dumps`, which writes them for a float
/// column that has them (a missing score, say), and `json.loads` reads them back.
fn python_json(text: &str) -> std::borrow::Cow<'_, str> {
    let b = text.as_bytes();
    let (mut out, mut last, mut i, mut in_string) = (String::new(), 0, 0, false);
    while i < b.len() {
        match b[i] {
            b'\\' if in_string => i += 1,
            b'"' => in_string = !in_string,
            b'N' | b'I' | b'-' if !in_string => {
                let word = ["NaN", "Infinity", "-Infinity"].into_iter().find(|w| b[i..].starts_with(w.as_bytes()));
                if let Some(w) = word {
                    out.push_str(&text[last..i]);
                    out.push_str("null");
                    i += w.len();
                    last = i;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    if last == 0 {
        return std::borrow::Cow::Borrowed(text);
    }
    out.push_str(&text[last..]);
    std::borrow::Cow::Owned(out)
}

/// The `url` of a `KEY.json`: a string `url` at the top of an object, else none. Any valid JSON
/// is accepted, however deep its nesting or large its numbers (only `url` is used); invalid
/// JSON is an error.
fn json_url(bytes: &[u8]) -> std::result::Result<Option<String>, ()> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    // Validation without a depth limit or number ranges: serde_json skips an ignored value
    // iteratively.
    let text = std::str::from_utf8(bytes).map_err(|_| ())?;
    let text = python_json(text.strip_prefix('\u{feff}').unwrap_or(text));
    let text = text.as_ref();
    serde_json::from_str::<IgnoredAny>(text).map_err(|_| ())?;

    /// The top-level value: an object's `url` (the last one, if repeated), else none.
    struct UrlVisitor;
    impl<'de> Visitor<'de> for UrlVisitor {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> std::result::Result<Option<String>, A::Error> {
            let mut url = None;
            while let Some(key) = a.next_key::<String>()? {
                match key == "url" {
                    true => url = a.next_value::<serde_json::Value>()?.as_str().map(str::to_owned),
                    false => drop(a.next_value::<IgnoredAny>()?),
                }
            }
            Ok(url)
        }
    }
    // Not an object, or a `url` that is a number beyond f64: no url.
    let mut de = serde_json::Deserializer::from_str(text);
    Ok(de.deserialize_any(UrlVisitor).ok().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard as `webdataset.TarWriter` (img2dataset) writes it: each member behind a PAX
    /// extended header for its float `mtime`, so 1,536 bytes of header blocks each. Returns the
    /// bytes and where each member's header blocks start.
    fn pax_shard(members: &[(&str, &[u8])]) -> (Vec<u8>, Vec<usize>) {
        let mut b = tar::Builder::new(Vec::new());
        let mut starts = Vec::new();
        for (name, data) in members {
            starts.push(b.get_ref().len());
            b.append_pax_extensions([("mtime", &b"1700000000.25"[..])]).unwrap();
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        (b.into_inner().unwrap(), starts)
    }

    /// Samples `0`, `1`, ... with a 700-byte image, a caption and a url, members in `order`.
    fn shard(n: usize, order: [&str; 3]) -> (Vec<u8>, Vec<usize>) {
        let members: Vec<(String, Vec<u8>)> = (0..n)
            .flat_map(|k| {
                order.map(|ext| {
                    let data = match ext {
                        "txt" => format!("caption {k}").into_bytes(),
                        "json" => format!("{{\"url\": \"http://x/{k}.jpg\"}}").into_bytes(),
                        _ => vec![0xff; 700],
                    };
                    (format!("{k}.{ext}"), data)
                })
            })
            .collect();
        pax_shard(&members.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect::<Vec<_>>())
    }

    /// A reject as `(row, sample_id, reason, detail, raw)`.
    type Rejected = (u64, Option<String>, String, String, Vec<u8>);

    /// Reads `bytes` as shard `00001.tar`: the ids and urls kept, and the rejects.
    fn read(bytes: &[u8]) -> (Vec<(String, Option<String>)>, Vec<Rejected>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00001.tar");
        std::fs::write(&p, bytes).unwrap();
        let chunk = read_tar(&p, "img2dataset", &mut UniqueIds::default()).unwrap();
        let ids = crate::schema::str_col(&chunk.batch, "sample_id");
        let urls = crate::schema::str_col(&chunk.batch, "url");
        let rows =
            (0..ids.len()).map(|i| (ids.value(i).to_owned(), urls.is_valid(i).then(|| urls.value(i).to_owned())));
        let rejects = chunk
            .rejects
            .iter()
            .map(|r| (r.row, r.sample_id.map(str::to_owned), r.reason.to_owned(), r.detail.to_owned(), r.raw.to_vec()));
        (rows.collect(), rejects.collect())
    }

    #[test]
    fn a_shard_cut_in_its_header_blocks_keeps_the_samples_before_the_cut() {
        // The reviewer's `repro/trunc`: rc 2 ("failed to read entire block", "members found
        // describing a future member but no future member found") before.
        let (full, starts) = shard(3, ["jpg", "json", "txt"]);
        // Into member 6's PAX header (the first of sample 2), its PAX data, right after that, and
        // into its own header: sample 2 is cut, and sample 1 is not known whole (member 6's name
        // is not known).
        for cut in [300, 512, 700, 1024, 1100] {
            let (rows, rejects) = read(&full[..starts[6] + cut]);
            assert_eq!(rows, [("0".to_owned(), Some("http://x/0.jpg".to_owned()))], "cut {cut}");
            assert_eq!(rejects.len(), 1, "cut {cut}: {rejects:?}");
            let (row, id, reason, detail, raw) = &rejects[0];
            assert_eq!((*row, id.as_deref(), reason.as_str()), (6, Some("1"), "truncated_tar"), "{detail}");
            assert!(detail.contains("member 6") && detail.contains("sample `1` is left out"), "{detail}");
            assert_eq!(raw, b"00001.tar");
        }
        // Into the first end-of-archive block: the last sample is not known whole either.
        let end = full.len() - 1024;
        let (rows, rejects) = read(&full[..end + 256]);
        assert_eq!((rows.len(), rejects[0].1.as_deref(), rejects[0].2.as_str()), (2, Some("2"), "truncated_tar"));
        // Into the second: every sample is.
        let (rows, rejects) = read(&full[..end + 768]);
        assert_eq!((rows.len(), rejects[0].1.as_deref(), rejects[0].2.as_str()), (3, None, "truncated_tar"));
    }

    #[test]
    fn a_blank_tar_key_is_a_missing_key_and_names_no_id_when_cut() {
        // As every reject of a blank key: no `sample_id` (before, an id of one space).
        let img = [0xffu8; 700];
        let members: [(&str, &[u8]); 4] =
            [("0.jpg", &img), ("0.txt", b"caption 0"), (" .jpg", &img), (" .txt", b"caption")];
        let (full, starts) = pax_shard(&members);
        let (rows, rejects) = read(&full[..starts[2] + 1536 + 100]);
        assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["0"]);
        let got: Vec<_> = rejects.iter().map(|r| (r.1.as_deref(), r.2.as_str())).collect();
        assert_eq!(got, [(None, "truncated_tar")], "{rejects:?}");
        // Whole, the blank key is a `missing_key`, as a blank `key` in img2dataset's Parquet.
        let (rows, rejects) = read(&full);
        assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["0"]);
        let got: Vec<_> = rejects.iter().map(|r| (r.1.as_deref(), r.2.as_str(), r.3.as_str())).collect();
        assert_eq!(got, [(None, "missing_key", "the key is blank")], "{rejects:?}");
    }

    #[test]
    fn a_cut_between_the_members_of_one_sample_keeps_no_part_of_it() {
        // Cut where the third member's header blocks start, and into them: before, `jpg, txt |
        // json` gave a row without its url, and `json, jpg | txt` a `missing_caption` reject.
        for order in [["jpg", "txt", "json"], ["json", "jpg", "txt"], ["jpg", "json", "txt"]] {
            let (full, starts) = shard(2, order);
            for cut in [starts[5], starts[5] + 300, starts[5] + 1024] {
                let (rows, rejects) = read(&full[..cut]);
                assert_eq!(rows, [("0".to_owned(), Some("http://x/0.jpg".to_owned()))], "{order:?} cut at {cut}");
                let reasons: Vec<_> = rejects.iter().map(|r| (r.1.as_deref(), r.2.as_str())).collect();
                assert_eq!(reasons, [(Some("1"), "truncated_tar")], "{order:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn a_corrupt_header_is_a_corrupt_tar_reject_and_the_run_goes_on() {
        // The reviewer's `repro/trunc/bitrot`: "archive header checksum mismatch", rc 2 before.
        let (full, starts) = shard(3, ["jpg", "json", "txt"]);
        let mut bad = full.clone();
        bad[starts[6] + 1024 + 3] ^= 1; // member 6's own header, past its PAX header
        let (rows, rejects) = read(&bad);
        assert_eq!(rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["0"]);
        assert_eq!(rejects.len(), 1, "{rejects:?}");
        let (row, id, reason, detail, _) = &rejects[0];
        assert_eq!((*row, id.as_deref(), reason.as_str()), (6, Some("1"), "corrupt_tar"));
        assert!(detail.contains("checksum mismatch") && detail.contains("not read past it"), "{detail}");
    }

    #[test]
    fn repeated_members_are_rejected_and_every_member_is_accounted_for() {
        // The reviewer's `repro/dupmember`: sample 2 written twice in a row, sample 3 with two
        // `.txt`. Before, the second copies were dropped with no reject and no count.
        let img: &[u8] = b"\xff\xd8\xff";
        let sample = |key: &str, cap: &str| {
            let json = format!("{{\"url\": \"http://x/{cap}\"}}").into_bytes();
            [(format!("{key}.jpg"), img.to_vec()), (format!("{key}.json"), json), (format!("{key}.txt"), cap.into())]
        };
        let odd = [("3.jpg", img), ("3.txt", b"txt a"), ("3.TXT", b"txt b")].map(|(n, d)| (n.to_owned(), d.to_vec()));
        let members =
            [sample("1", "one"), sample("2", "first copy"), sample("2", "second copy"), odd, sample("4", "four")];
        let members: Vec<(String, Vec<u8>)> = members.into_iter().flatten().collect();
        let (bytes, _) = pax_shard(&members.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect::<Vec<_>>());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00000.tar");
        std::fs::write(&p, &bytes).unwrap();
        let chunk = read_tar(&p, "img2dataset", &mut UniqueIds::default()).unwrap();
        let caps: Vec<&str> = crate::schema::str_col(&chunk.batch, "caption").iter().flatten().collect();
        assert_eq!(caps, ["one", "first copy", "txt a", "four"]);
        let rejects: Vec<_> = chunk.rejects.iter().map(|r| (r.row, r.sample_id.unwrap(), r.reason, r.raw)).collect();
        assert_eq!(
            rejects,
            [
                (6, "2", "duplicate_member", &b"2.jpg"[..]),
                (7, "2", "duplicate_member", b"2.json"),
                (8, "2", "duplicate_member", b"2.txt"),
                (11, "3", "duplicate_member", b"3.TXT"),
            ]
        );
        assert!(chunk.rejects.get(3).detail.contains("`3`") && chunk.rejects.get(3).detail.contains("`.txt`"));
        // The run counts rows read as data + rejects + skipped: one per sample and one per repeat,
        // so read = written + rejected holds with the repeats in it.
        assert_eq!((chunk.batch.num_rows(), chunk.rejects.len(), chunk.skipped.len()), (4, 4, 0));
    }
}
