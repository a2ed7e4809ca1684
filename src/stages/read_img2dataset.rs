//! `read_img2dataset`: the output folder of img2dataset, either its per-shard metadata Parquet
//! (`00000.parquet`: `key, caption, url, status, error_message, ...`) or its webdataset tar
//! shards (`00000.tar`: `KEY.jpg` + `KEY.txt` + `KEY.json` per sample). The format follows
//! each file's extension.
//!
//! `sample_id` is img2dataset's `key` (unique within one img2dataset output); the image
//! reference is `shard` (the shard's file stem, e.g. `00000`) + `key`, and `url`. Parquet rows
//! whose `status` is not `success` are `download_failed` rejects; a tar sample lacking its
//! caption, image, or valid JSON is a reject with that reason.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde::{Deserialize, Serialize};

use super::{chunk_of, expand_inputs, has_words, ChunkIter, Problems, Reader};
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
        let files = expand_inputs(&self.path, problems, "path");
        for f in &files {
            match f.extension().and_then(|e| e.to_str()) {
                Some("tar") => {}
                Some("parquet") => match parquet::read_schema(f) {
                    Ok(schema) => {
                        for col in ["key", "caption", "url", "status"] {
                            match schema.field_with_name(col) {
                                Ok(field) if matches!(field.data_type(), DataType::Utf8 | DataType::LargeUtf8) => {}
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

    fn open(&self) -> Result<ChunkIter<'_>> {
        // One chunk per shard: img2dataset shards hold ~10k samples. Keys are the ids, so a key
        // seen before (a corrupt or twice-written shard) is a `duplicate_key` reject.
        let mut seen: HashSet<String> = HashSet::new();
        Ok(Box::new(self.files.iter().map(move |f| {
            if f.extension().is_some_and(|e| e == "tar") {
                read_tar(f, &self.source, &mut seen)
            } else {
                read_metadata(f, &self.source, &mut seen)
            }
        })))
    }
}

fn stem(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

const DUPLICATE: &str = "the key was already read (here or in an earlier shard)";

fn read_metadata(path: &Path, source: &str, seen: &mut HashSet<String>) -> Result<Chunk> {
    let shard = stem(path);
    let name = file_name(path);
    let mut out = PairsBuilder::new(source);
    let mut rejects = Vec::new();
    let mut row = 0u64;
    for batch in parquet::read_file(path)? {
        let col = |n: &str| string_values(&batch, n);
        let (keys, caps, urls, status) = (col("key")?, col("caption")?, col("url")?, col("status")?);
        let errors = string_values(&batch, "error_message").ok();
        for i in 0..batch.num_rows() {
            let reject = |reason: &'static str, detail: String| Reject {
                stage: TYPE,
                source_file: name.clone(),
                row: row + i as u64,
                sample_id: keys[i].map(str::to_owned),
                reason,
                detail: detail.into(),
                raw: row_json(&keys, &caps, &urls, &status, i).into_bytes(),
            };
            let Some(key) = keys[i] else {
                rejects.push(reject("missing_key", "key is null".into()));
                continue;
            };
            if status[i] != Some("success") {
                let err = errors.as_ref().and_then(|e| e[i]).unwrap_or("");
                rejects.push(reject("download_failed", format!("status {}: {err}", status[i].unwrap_or("null"))));
                continue;
            }
            match caps[i] {
                None => rejects.push(reject("missing_caption", "caption is null".into())),
                Some(c) if !has_words(c) => rejects.push(reject("empty_caption", "caption has no words".into())),
                Some(_) if !seen.insert(key.to_owned()) => rejects.push(reject("duplicate_key", DUPLICATE.into())),
                Some(c) => out.push(PairRow {
                    sample_id: key,
                    caption: Some(c),
                    url: urls[i],
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

fn string_values<'a>(batch: &'a RecordBatch, name: &str) -> Result<Vec<Option<&'a str>>> {
    let col = batch.column_by_name(name).ok_or_else(|| Error::data(format!("column `{name}` missing")))?;
    Ok(match col.data_type() {
        DataType::Utf8 => col.as_string::<i32>().iter().collect(),
        DataType::LargeUtf8 => col.as_string::<i64>().iter().collect(),
        _ if col.null_count() == col.len() => vec![None; col.len()],
        t => return Err(Error::data(format!("column `{name}` is {t}, expected a string"))),
    })
}

fn row_json(k: &[Option<&str>], c: &[Option<&str>], u: &[Option<&str>], s: &[Option<&str>], i: usize) -> String {
    serde_json::json!({"key": k[i], "caption": c[i], "url": u[i], "status": s[i]}).to_string()
}

fn read_tar(path: &Path, source: &str, seen: &mut HashSet<String>) -> Result<Chunk> {
    let shard = stem(path);
    let name = file_name(path);
    let mut out = PairsBuilder::new(source);
    let mut rejects = Vec::new();
    let (samples, cut) = tar_shards::read_samples(path)?;
    if let Some(cut) = cut {
        rejects.push(Reject {
            stage: TYPE,
            source_file: name.clone(),
            row: cut.member_index,
            sample_id: None,
            reason: "truncated_tar",
            detail: cut.detail.into(),
            raw: name.clone().into_bytes(),
        });
    }
    for s in samples {
        let reject = |reason: &'static str, detail: &str, raw: Vec<u8>| Reject {
            stage: TYPE,
            source_file: name.clone(),
            row: s.member_index,
            sample_id: Some(s.key.clone()),
            reason,
            detail: detail.to_owned().into(),
            raw,
        };
        let has_image = s.members.iter().any(|m| IMAGE_EXTS.contains(&m.ext.as_str()));
        let caption = s.member("txt").and_then(|m| m.data.clone());
        let json = s.member("json").and_then(|m| m.data.clone());
        let url = match json.as_deref().map(serde_json::from_slice::<serde_json::Value>) {
            Some(Ok(v)) => v.get("url").and_then(|u| u.as_str()).map(str::to_owned),
            Some(Err(_)) => {
                rejects.push(reject("bad_json", "KEY.json is not valid JSON", json.unwrap_or_default()));
                continue;
            }
            None => None,
        };
        let Some(caption) = caption else {
            rejects.push(reject("missing_caption", "no KEY.txt member", json.unwrap_or_default()));
            continue;
        };
        if !has_image {
            rejects.push(reject("missing_image", "no image member", caption));
            continue;
        }
        let Ok(text) = std::str::from_utf8(&caption) else {
            rejects.push(reject("invalid_utf8", "KEY.txt is not UTF-8", caption));
            continue;
        };
        if !has_words(text) {
            rejects.push(reject("empty_caption", "caption has no words", caption.clone()));
            continue;
        }
        if !seen.insert(s.key.clone()) {
            rejects.push(reject("duplicate_key", DUPLICATE, caption.clone()));
            continue;
        }
        out.push(PairRow {
            sample_id: &s.key,
            caption: Some(text),
            url: url.as_deref(),
            shard: Some(&shard),
            key: Some(&s.key),
            ..Default::default()
        });
    }
    Ok(chunk_of(out.finish(), rejects))
}
