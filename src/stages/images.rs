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
pub(crate) const TAR_IMAGE_EXTENSIONS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "bmp"];

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

    /// Per row, the first earlier row of the chunk with the same image reference (the same
    /// path, or the same shard and key), if any: COCO-style tables repeat an image for each of
    /// its captions, and it needs reading and encoding once.
    pub fn earlier_same(&self) -> Vec<Option<usize>> {
        let mut first: HashMap<(&str, &str), usize> = HashMap::new();
        self.sources
            .iter()
            .enumerate()
            .map(|(r, s)| {
                let key = match s {
                    Source::File(p) => ("", *p),
                    Source::Tar { shard, key } => (*shard, *key),
                    Source::Nowhere => return None,
                };
                match first.entry(key) {
                    std::collections::hash_map::Entry::Occupied(e) => Some(*e.get()),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(r);
                        None
                    }
                }
            })
            .collect()
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
        let (mut found, mut ambiguous) = (HashMap::new(), HashSet::new());
        let fault = read_tar_images(&path, &keys, &mut found, &mut ambiguous).err();
        for k in keys {
            let at = (shard.to_owned(), k.to_owned());
            // A key asked for by two rows: its first answer stands.
            if out.contains_key(&at) {
                continue;
            }
            if ambiguous.contains(k) {
                let e = format!(
                    "`{shard}.tar` holds images of key `{k}` in more than one sample: which is this row's is unknown"
                );
                out.insert(at, Err(e));
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
/// `out`; an error stops the reading and leaves in `out` what was read before it. A key with
/// different images in two samples of the shard (runs of consecutive members with that key, as
/// the tar reader groups them) goes into `ambiguous`: which sample a row came from cannot be
/// told by its key, and the first image may be that of a sample the reader left out. The same
/// bytes again (a shard written twice over) are no ambiguity.
fn read_tar_images(
    path: &Path,
    keys: &[&str],
    out: &mut HashMap<String, Vec<u8>>,
    ambiguous: &mut HashSet<String>,
) -> Result<()> {
    let file = std::fs::File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut archive = tar::Archive::new(file);
    let wanted: HashSet<&str> = keys.iter().copied().collect();
    // The sample each member belongs to (a new one where the key changes), and the sample each
    // key's image was taken from.
    let (mut sample, mut previous_key) = (0usize, None::<String>);
    let mut taken_from: HashMap<String, usize> = HashMap::new();
    for entry in archive.entries().map_err(|e| Error::io("cannot read tar", path, e))? {
        let mut entry = entry.map_err(|e| Error::io("corrupt tar member in", path, e))?;
        // Regular and contiguous files, as the tar reader counts them.
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        let name = entry.path().map_err(|e| Error::io("bad member name in", path, e))?.to_string_lossy().into_owned();
        let (key, ext) = crate::io::tar_shards::member_key(&name);
        if previous_key.as_deref() != Some(key.as_str()) {
            sample += 1;
            previous_key = Some(key.clone());
        }
        if !TAR_IMAGE_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()) || !wanted.contains(key.as_str()) {
            continue;
        }
        if let Some(&first) = taken_from.get(&key) {
            // Another sample's image, unless it is the same bytes (a shard written twice).
            if first != sample && !ambiguous.contains(&key) {
                let mut again = Vec::new();
                entry.read_to_end(&mut again).map_err(|e| Error::io("cannot read tar member in", path, e))?;
                if out.get(&key) != Some(&again) {
                    ambiguous.insert(key);
                }
            }
            continue;
        }
        taken_from.insert(key.clone(), sample);
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
    fn a_key_with_images_in_two_samples_is_ambiguous_and_contiguous_members_are_files() {
        // `k` is an image-only sample (the tar reader leaves it out: no caption), then a kept
        // sample of its own with another image; `k2` has two images in one sample (the first
        // stands); `c` is stored as a contiguous file (type '7'), which tar tools read as a
        // regular one; `m` comes twice with the same bytes (a shard written twice over).
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let members: [(&str, &[u8], tar::EntryType); 11] = [
            ("k.jpg", b"first k", tar::EntryType::Regular),
            ("m.jpg", b"m image", tar::EntryType::Regular),
            ("m.txt", b"m caption", tar::EntryType::Regular),
            ("k.png", b"second k", tar::EntryType::Regular),
            ("k.txt", b"k caption", tar::EntryType::Regular),
            ("k2.jpg", b"k2 jpg", tar::EntryType::Regular),
            ("k2.png", b"k2 png", tar::EntryType::Regular),
            ("c.jpg", b"c image", tar::EntryType::Continuous),
            ("c.txt", b"c caption", tar::EntryType::Regular),
            // `m` written again, the same bytes: not ambiguous.
            ("m.jpg", b"m image", tar::EntryType::Regular),
            ("m.txt", b"m caption", tar::EntryType::Regular),
        ];
        for (name, data, kind) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(kind);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        std::fs::write(dir.path().join("00000.tar"), b.into_inner().unwrap()).unwrap();
        let got = tar_images(dir.path(), &[("00000", "k"), ("00000", "m"), ("00000", "k2"), ("00000", "c")]);
        let of = |k: &str| got.get(&("00000".to_owned(), k.to_owned())).cloned().unwrap();
        let e = of("k").unwrap_err();
        assert!(e.contains("key `k` in more than one sample"), "{e}");
        assert_eq!(of("m"), Ok(b"m image".to_vec()));
        assert_eq!(of("k2"), Ok(b"k2 jpg".to_vec()));
        assert_eq!(of("c"), Ok(b"c image".to_vec()));
    }

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
