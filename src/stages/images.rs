//! Where a `pairs` row's image lives and reading its bytes, for the stages that look at images
//! (`encode_image`, `mine_pseudo_bow`): `path` (a file reachable from where curate runs) or,
//! for img2dataset webdataset rows, `<shards_dir>/<shard>.tar` member `<key>.<jpg|png|webp|bmp>`.
//! A row whose image cannot be found fails with reason `missing_image`.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, SchemaRef};

use super::Problems;
use crate::error::{Error, Result};
use crate::schema::{self, str_col};

/// Reference columns, in output order, as far as the input has them.
pub const REFERENCE_COLUMNS: [&str; 3] = [schema::PATH, schema::SHARD, schema::KEY];

/// Extensions of image members in webdataset shards: those `read_img2dataset` takes.
const TAR_IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];

/// Why a row's image could not be used: reject reason and detail.
pub type Failure = (&'static str, String);

/// Plan-time check: the input's image reference columns (`path`, or `shard` + `key`), and a
/// `sample_id`; `stage` names the stage in messages.
pub fn reference_columns(input: &SchemaRef, stage: &str, problems: &mut Problems) -> Vec<&'static str> {
    let mut references = Vec::new();
    for col in REFERENCE_COLUMNS {
        match input.field_with_name(col) {
            Ok(f) if f.data_type() == &DataType::Utf8 => references.push(col),
            Ok(f) => problems.push("type", format!("column `{col}` is {}, expected text", f.data_type()), None),
            Err(_) => {}
        }
    }
    let by_path = references.contains(&schema::PATH);
    let by_tar = references.contains(&schema::SHARD) && references.contains(&schema::KEY);
    if !by_path && !by_tar {
        let names: Vec<&str> = input.fields().iter().map(|f| f.name().as_str()).collect();
        problems.push(
            "type",
            format!("the input has no image reference: `{stage}` needs a `path` column, or `shard` and `key`"),
            Some(format!("columns here: {}", names.join(", "))),
        );
    }
    if input.field_with_name(schema::SAMPLE_ID).is_err() {
        problems.push("type", "the input has no `sample_id` column", None);
    }
    references
}

/// Plan-time check of a `shards_dir` key.
pub fn check_shards_dir(dir: &Option<String>, problems: &mut Problems) {
    if let Some(dir) = dir {
        if !Path::new(dir).is_dir() {
            problems.push(
                "shards_dir",
                format!("`{dir}` {}", crate::io::not_a(Path::new(dir), "folder")),
                Some("point `shards_dir` at the folder of img2dataset's `.tar` shards".into()),
            );
        }
    }
}

/// Where one row's image lives.
enum Source<'a> {
    File(&'a str),
    Tar { shard: &'a str, key: &'a str },
    Nowhere,
}

/// The images of one chunk's rows. Tar members are read when the chunk is opened (each shard
/// once, keeping only the members asked for); files when [`ImageRows::bytes`] is called.
pub struct ImageRows<'a> {
    /// The reference columns present (`path`, `shard`, `key` order), for copying to outputs.
    pub columns: Vec<&'a StringArray>,
    sources: Vec<Source<'a>>,
    tar: HashMap<(String, String), std::result::Result<Vec<u8>, String>>,
    has_shards_dir: bool,
}

impl<'a> ImageRows<'a> {
    /// `references` as returned by [`reference_columns`].
    pub fn new(batch: &'a RecordBatch, references: &[&str], shards_dir: Option<&str>) -> ImageRows<'a> {
        let col = |name: &str| references.contains(&name).then(|| str_col(batch, name));
        let cols = [col(schema::PATH), col(schema::SHARD), col(schema::KEY)];
        let sources: Vec<Source> = (0..batch.num_rows())
            .map(|r| {
                let get = |i: usize| cols[i].filter(|c| c.is_valid(r)).map(|c| c.value(r));
                match (get(0), get(1), get(2)) {
                    (Some(p), _, _) => Source::File(p),
                    (None, Some(shard), Some(key)) => Source::Tar { shard, key },
                    _ => Source::Nowhere,
                }
            })
            .collect();
        let wanted: Vec<(&str, &str)> = sources
            .iter()
            .filter_map(|s| match s {
                Source::Tar { shard, key } => Some((*shard, *key)),
                _ => None,
            })
            .collect();
        let tar = match shards_dir {
            Some(dir) if !wanted.is_empty() => tar_images(Path::new(dir), &wanted),
            _ => HashMap::new(),
        };
        ImageRows { columns: cols.into_iter().flatten().collect(), sources, tar, has_shards_dir: shards_dir.is_some() }
    }

    /// The bytes of row `r`'s image.
    pub fn bytes(&self, r: usize) -> std::result::Result<Vec<u8>, Failure> {
        match &self.sources[r] {
            Source::File(p) => std::fs::read(p).map_err(|e| ("missing_image", format!("`{p}`: {e}"))),
            Source::Tar { shard, key } => match self.tar.get(&((*shard).to_owned(), (*key).to_owned())) {
                Some(Ok(b)) => Ok(b.clone()),
                Some(Err(e)) => Err(("missing_image", e.clone())),
                None if !self.has_shards_dir => {
                    Err(("missing_image", format!("`{shard}`/`{key}` is in a tar shard, and no `shards_dir` is set")))
                }
                None => Err(("missing_image", format!("no image member `{key}.*` in `{shard}.tar`"))),
            },
            Source::Nowhere => Err(("missing_image", "no `path`, and no `shard` + `key`".to_owned())),
        }
    }

    /// Row `r`'s image for messages: `` `path` `` or `` `shard.tar` member `key` ``.
    pub fn describe(&self, r: usize) -> String {
        match &self.sources[r] {
            Source::File(p) => format!("`{p}`"),
            Source::Tar { shard, key } => format!("`{shard}.tar` member `{key}`"),
            Source::Nowhere => String::new(),
        }
    }
}

/// Image bytes by `(shard, key)`. A shard that cannot be read to its end keeps the members
/// read before the fault, and each key not found by then gets the error.
fn tar_images(dir: &Path, wanted: &[(&str, &str)]) -> HashMap<(String, String), std::result::Result<Vec<u8>, String>> {
    let mut by_shard: HashMap<&str, Vec<&str>> = HashMap::new();
    for (shard, key) in wanted {
        by_shard.entry(shard).or_default().push(key);
    }
    let mut out = HashMap::new();
    for (shard, keys) in by_shard {
        let path = PathBuf::from(dir).join(format!("{shard}.tar"));
        let mut found = HashMap::new();
        let fault = read_tar_images(&path, &keys, &mut found).err();
        for k in keys {
            let at = (shard.to_owned(), k.to_owned());
            // A key asked for by two rows: its first answer stands.
            if out.contains_key(&at) {
                continue;
            }
            match (found.remove(k), &fault) {
                (Some(bytes), _) => out.insert(at, Ok(bytes)),
                (None, Some(e)) => out.insert(at, Err(e.to_string())),
                (None, None) => None,
            };
        }
    }
    out
}

/// The image members of `path` whose key is in `keys` (first image member per key), into
/// `out`; an error stops the reading and leaves in `out` what was read before it.
fn read_tar_images(path: &Path, keys: &[&str], out: &mut HashMap<String, Vec<u8>>) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut archive = tar::Archive::new(file);
    let wanted: HashSet<&str> = keys.iter().copied().collect();
    for entry in archive.entries().map_err(|e| Error::io("cannot read tar", path, e))? {
        let mut entry = entry.map_err(|e| Error::io("corrupt tar member in", path, e))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(|e| Error::io("bad member name in", path, e))?.to_string_lossy().into_owned();
        let (key, ext) = crate::io::tar_shards::member_key(&name);
        if !TAR_IMAGE_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str())
            || !wanted.contains(key.as_str())
            || out.contains_key(&key)
        {
            continue;
        }
        let mut buf = Vec::new();
        entry.read_to_end(&mut buf).map_err(|e| Error::io("cannot read tar member in", path, e))?;
        // The tar crate ends a member cut short by the file's end without an error.
        if (buf.len() as u64) < entry.size() {
            let cut = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("member `{name}` is cut short ({} of {} bytes)", buf.len(), entry.size()),
            );
            return Err(Error::io("cannot read tar member in", path, cut));
        }
        out.insert(key, buf);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_shard_gives_the_images_before_the_cut_and_a_key_asked_twice_one_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in [("k0.jpg", &[1u8; 600][..]), ("k1.jpg", &[2u8; 600][..])] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        let whole = b.into_inner().unwrap();
        // Cut 100 bytes into k1's data (k0: a 512-byte header and 1,024 bytes of data).
        std::fs::write(dir.path().join("00000.tar"), &whole[..1536 + 512 + 100]).unwrap();
        let got = tar_images(dir.path(), &[("00000", "k0"), ("00000", "k1"), ("00000", "k0"), ("00000", "k9")]);
        let of = |k: &str| got.get(&("00000".to_owned(), k.to_owned())).cloned();
        assert_eq!(of("k0"), Some(Ok(vec![1u8; 600])), "read before the cut, asked twice");
        for k in ["k1", "k9"] {
            let e = of(k).unwrap().unwrap_err();
            assert!(e.contains("00000.tar"), "{k}: {e}");
        }
        assert_eq!(got.len(), 3);
    }
}
