//! `read_imagenet21k`: an ImageNet-21k style folder of synset directories
//! (`ROOT/nXXXXXXXX/*.JPEG`) with an optional `synset<TAB>words` file. Rows have no caption:
//! these are the "unaligned" images that pseudo-BoW mining labels (Fistful §3); `label` is the
//! synset and `label_text` its words, kept aside for evaluation.
//!
//! `sample_id` is the path below the root (`n01440764/n01440764_10026.JPEG`); `path` is the
//! file's path as reachable from where curate runs. Files are listed in sorted order. A file
//! that is not an image (by extension) is an `unsupported_extension` reject, and a macOS
//! resource fork (`._name.JPEG`, which copies from a Mac leave beside each image) a
//! `resource_fork` one; a folder, a broken link, a pipe or a device where an image should be is `not_a_file`; a
//! name that is not UTF-8 is `invalid_utf8` (raw: the name's bytes). Entries of the root that are not synset folders (the
//! words file aside) are counted as skipped (`outside_synset_folders`).
//!
//! The manifest's fingerprint of this input is of its listing as this reader sees it (the synset
//! folders, each one's entries with their kind and the size of each file, the count of other
//! entries of the root) and of the words file's bytes, not of every image's bytes: the reader
//! never reads them, and ImageNet-21k is over a terabyte.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{chunk_of, split_tabs, ChunkIter, LoadError, Problems, Reader, CHUNK_ROWS};
use crate::error::{Error, Result};
use crate::io::lines::Lines;
use crate::schema::{PairRow, PairsBuilder, Reject};

pub const TYPE: &str = "read_imagenet21k";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadImagenet21kConfig {
    /// Folder holding the synset directories (e.g. `imagenet21k/train`).
    pub root: String,
    /// `synset<TAB>words` file (ImageNet's `words.txt`).
    #[serde(default)]
    pub words: Option<String>,
    /// Image file extensions, case-insensitive, with or without the dot (`jpeg`, `.JPEG`).
    #[serde(default = "default_extensions")]
    pub extensions: Vec<String>,
    #[serde(default = "default_source")]
    pub source: String,
}

fn default_extensions() -> Vec<String> {
    ["jpeg", "jpg", "png"].map(String::from).to_vec()
}
fn default_source() -> String {
    "imagenet21k".into()
}

/// Whether `a` and `b` name the same file.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Whether a folder of the root named `name` is one the reader lists (`nXXXXXXXX`).
pub fn is_synset(name: &str) -> bool {
    name.len() == 9 && name.starts_with('n') && name[1..].bytes().all(|b| b.is_ascii_digit())
}

impl ReadImagenet21kConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadImagenet21k> {
        let root = PathBuf::from(&self.root);
        if !root.is_dir() {
            problems.push(
                "root",
                format!("`{}` {}", self.root, crate::io::not_a(&root, "folder")),
                Some("point `root` at the folder holding the `nXXXXXXXX` directories".into()),
            );
        }
        let mut words = HashMap::new();
        if let Some(w) = &self.words {
            let path = PathBuf::from(w);
            if !super::refuse_non_text(std::slice::from_ref(&path), problems, "words", false) {
                match load_words(&path) {
                    Ok(m) => words = m,
                    // A file that cannot be read gets no hint about its lines.
                    Err(LoadError::Io(e)) => problems.push("words", e, None),
                    Err(LoadError::Format(e)) => {
                        problems.push("words", e, Some("expected `synset<TAB>words` lines".into()))
                    }
                }
            }
        }
        if self.extensions.is_empty() {
            problems.push(
                "extensions",
                "no extension is listed: every file would be rejected (`unsupported_extension`)",
                Some("leave `extensions` out (`jpeg`, `jpg`, `png`), or list some: `extensions = [\"jpeg\"]`".into()),
            );
        }
        for e in &self.extensions {
            let bare = e.strip_prefix('.').unwrap_or(e);
            if bare.is_empty() || !bare.chars().all(|c| c.is_alphanumeric()) {
                problems.push(
                    "extensions",
                    format!("`{e}` is not a file extension"),
                    Some("write extensions as `jpeg` or `.jpeg` (no wildcards)".into()),
                );
            }
        }
        problems.is_empty().then(|| ReadImagenet21k {
            folder: Folder { root, words_file: self.words.as_ref().map(PathBuf::from) },
            words,
            // `.jpeg` (torchvision's spelling) and `jpeg` are one extension.
            extensions: self.extensions.iter().map(|e| e.strip_prefix('.').unwrap_or(e).to_ascii_lowercase()).collect(),
            source: self.source.clone(),
        })
    }
}

fn load_words(path: &std::path::Path) -> std::result::Result<HashMap<String, String>, LoadError> {
    let io = |e: crate::error::Error| LoadError::Io(e.to_string());
    let mut lines = Lines::open(path).map_err(io)?;
    let mut out = HashMap::new();
    while let Some((no, line)) = lines.next_line().map_err(io)? {
        if line.is_empty() {
            continue;
        }
        let fields = split_tabs(line);
        if fields.count != 2 {
            return Err(LoadError::Format(format!("`{}` line {no}: expected 2 tab-separated fields", path.display())));
        }
        // The words become `label_text`: a line that is not UTF-8 is refused, not made text
        // with U+FFFD in it.
        let text = |b: &[u8]| match std::str::from_utf8(b) {
            Ok(t) => Ok(t.trim_matches(crate::text::is_python_whitespace).to_owned()),
            Err(_) => Err(LoadError::Format(format!("`{}` line {no}: not UTF-8", path.display()))),
        };
        let synset = text(fields[0])?;
        // Another file (a class list, a header line) would name no folder at all.
        if !is_synset(&synset) {
            let e = format!("`{}` line {no}: `{synset}` is not a synset id (`n` and 8 digits)", path.display());
            return Err(LoadError::Format(e));
        }
        if let Some((first, _)) = out.get(&synset) {
            let e = format!("`{}` line {no}: synset `{synset}` is already on line {first}", path.display());
            return Err(LoadError::Format(e));
        }
        out.insert(synset, (no, text(fields[1])?));
    }
    Ok(out.into_iter().map(|(synset, (_, words))| (synset, words)).collect())
}

pub struct ReadImagenet21k {
    folder: Folder,
    words: HashMap<String, String>,
    extensions: Vec<String>,
    source: String,
}

/// The folder read: its root and the words file (which may sit in the root).
#[derive(Clone)]
struct Folder {
    root: PathBuf,
    words_file: Option<PathBuf>,
}

/// One entry of a synset folder.
#[derive(Debug, Clone)]
enum Listed {
    /// A file, or a link to one; its size when asked for (the fingerprint).
    File(String, Option<u64>),
    /// A folder, or a link to nothing.
    NotAFile(String),
    /// A name that is not UTF-8: its bytes.
    BadName(Vec<u8>),
}

impl Listed {
    fn sort_key(&self) -> &[u8] {
        match self {
            Listed::File(n, _) | Listed::NotAFile(n) => n.as_bytes(),
            Listed::BadName(b) => b,
        }
    }
}

fn entries(p: &std::path::Path) -> Result<Vec<std::fs::DirEntry>> {
    Ok(std::fs::read_dir(p).map_err(|e| Error::io("cannot list", p, e))?.filter_map(|e| e.ok()).collect())
}

impl Folder {
    /// The synset folders of the root, sorted, and the number of its entries that are not
    /// synset folders (the words file aside).
    fn synsets(&self) -> Result<(Vec<String>, u64)> {
        let (mut synsets, mut outside) = (Vec::new(), 0u64);
        for e in entries(&self.root)? {
            match e.file_name().to_str() {
                Some(s) if is_synset(s) && e.path().is_dir() => synsets.push(s.to_owned()),
                _ if self.words_file.as_ref().is_some_and(|w| same_file(w, &e.path())) => {}
                _ => outside += 1,
            }
        }
        synsets.sort();
        Ok((synsets, outside))
    }

    /// The entries of one synset folder, sorted by the bytes of their names; with `sizes`, each
    /// file's size.
    fn synset_entries(&self, synset: &str, sizes: bool) -> Result<Vec<Listed>> {
        let mut files: Vec<Listed> = entries(&self.root.join(synset))?
            .into_iter()
            .map(|e| {
                let name = e.file_name();
                let Some(name) = name.to_str().map(str::to_owned) else {
                    return Listed::BadName(name.as_encoded_bytes().to_vec());
                };
                // `file_type` comes with the listing; only a link needs a look at its target.
                let size = |m: std::io::Result<std::fs::Metadata>| sizes.then(|| m.map_or(0, |m| m.len()));
                match e.file_type() {
                    Ok(t) if t.is_file() => Listed::File(name, size(e.metadata())),
                    Ok(t) if t.is_symlink() && e.path().is_file() => Listed::File(name, size(e.path().metadata())),
                    _ => Listed::NotAFile(name),
                }
            })
            .collect();
        files.sort_by(|a, b| a.sort_key().cmp(b.sort_key()));
        Ok(files)
    }

    /// The synset folders' names, modification times and inodes, as a digest: an image added
    /// to, removed from or renamed in one changes its time, where the root's own time (the
    /// input's stamp) changes only with the root's entries. Other folders of the root are left
    /// out: what they hold is not read (an output folder may sit there). `None`: the root
    /// cannot be listed.
    fn stamp(&self) -> Option<u128> {
        use std::os::unix::fs::MetadataExt;
        let (synsets, _) = self.synsets().ok()?;
        let dirs = synsets.into_iter().filter_map(|name| {
            // A link counts as the folder it points to, as in `synsets`.
            let m = std::fs::metadata(self.root.join(&name)).ok()?;
            Some((name, m.mtime(), m.mtime_nsec(), m.ino()))
        });
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for (name, secs, nanos, ino) in dirs {
            h.update(name.as_bytes());
            h.update(&secs.to_le_bytes());
            h.update(&nanos.to_le_bytes());
            h.update(&ino.to_le_bytes());
        }
        Some(h.digest128())
    }

    /// The input's fingerprint: what [`Folder::synsets`] and [`Folder::synset_entries`] see,
    /// with each file's size (an image replaced by another of another size changes it), and
    /// the words file's name and bytes. One synset folder is listed at a time, and nothing
    /// below a synset folder's entries is visited: a folder there is a `not_a_file` reject,
    /// whatever it holds (a link to a folder above it included).
    fn fingerprint(&self) -> Result<String> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let (synsets, outside) = self.synsets()?;
        h.update(&outside.to_le_bytes());
        for synset in &synsets {
            h.update(synset.as_bytes());
            h.update(b"/\0");
            for entry in self.synset_entries(synset, true)? {
                match entry {
                    Listed::File(name, size) => {
                        h.update(b"f");
                        h.update(name.as_bytes());
                        h.update(b"\0");
                        h.update(&size.unwrap_or(0).to_le_bytes());
                    }
                    Listed::NotAFile(name) => {
                        h.update(b"d");
                        h.update(name.as_bytes());
                        h.update(b"\0");
                    }
                    Listed::BadName(bytes) => {
                        h.update(b"b");
                        h.update(&bytes);
                        h.update(b"\0");
                    }
                }
            }
            // The end of a folder's entries, so that they cannot run into the next folder's name.
            h.update(b"\0");
        }
        if let Some(w) = &self.words_file {
            crate::io::hash_named_file(&mut h, w)?;
        }
        Ok(format!("listing-xxh3-128:{:032x}", h.digest128()))
    }
}

impl Reader for ReadImagenet21k {
    fn inputs(&self) -> Vec<PathBuf> {
        let mut v = vec![self.folder.root.clone()];
        v.extend(self.folder.words_file.clone());
        v
    }

    fn folder_stamp(&self) -> Option<u128> {
        self.folder.stamp()
    }

    fn fingerprinter(&self) -> super::Fingerprinter {
        let folder = self.folder.clone();
        Box::new(move || folder.fingerprint())
    }

    fn fills(&self, column: &str) -> bool {
        use crate::schema::{LABEL, LABEL_TEXT, PATH, SAMPLE_ID, SOURCE};
        [SAMPLE_ID, SOURCE, PATH, LABEL].contains(&column) || (column == LABEL_TEXT && self.folder.words_file.is_some())
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        // One synset folder is listed at a time (ImageNet-21k: 21,841 folders, 14M files), its
        // entries taken `CHUNK_ROWS` at a time, a chunk running on into the next folders.
        let (synsets, outside) = self.folder.synsets()?;
        let root_name = crate::io::file_name(&self.folder.root);
        let mut synsets = synsets.into_iter();
        let mut folder: (String, std::vec::IntoIter<Listed>) = (String::new(), Vec::new().into_iter());
        let mut index = 0u64;
        let mut first = true;
        // Counted once, with the first chunk: not images of the data set, but not lost either.
        let mut outside = Some(outside).filter(|&n| n > 0);
        let mut failed = false;
        Ok(Box::new(std::iter::from_fn(move || {
            if failed {
                return None;
            }
            let mut files: Vec<(String, Listed)> = Vec::new();
            while files.len() < CHUNK_ROWS {
                if let Some(entry) = folder.1.next() {
                    files.push((folder.0.clone(), entry));
                    continue;
                }
                let Some(synset) = synsets.next() else { break };
                match self.folder.synset_entries(&synset, false) {
                    Ok(listed) => folder = (synset, listed.into_iter()),
                    Err(e) => {
                        failed = true;
                        return Some(Err(e));
                    }
                }
            }
            // An empty root still gives one (empty) chunk, with its skips.
            if files.is_empty() && !std::mem::take(&mut first) {
                return None;
            }
            first = false;
            let mut out = PairsBuilder::new(&self.source);
            let mut rejects = Vec::new();
            for (synset, entry) in files {
                let reject = |id: Option<String>, reason, detail: String, raw: Vec<u8>| Reject {
                    stage: TYPE,
                    source_file: root_name.clone(),
                    row: index,
                    sample_id: id,
                    reason,
                    detail: detail.into(),
                    raw,
                };
                let file = match entry {
                    Listed::File(f, _) => f,
                    Listed::NotAFile(f) => {
                        let id = format!("{synset}/{f}");
                        let detail =
                            "not a regular file (a folder, a broken link, a pipe or a device), so not an image"
                                .to_owned();
                        rejects.push(reject(Some(id.clone()), "not_a_file", detail, id.into_bytes()));
                        index += 1;
                        continue;
                    }
                    Listed::BadName(raw) => {
                        let mut bytes = format!("{synset}/").into_bytes();
                        bytes.extend(raw);
                        rejects.push(reject(None, "invalid_utf8", "the file name is not UTF-8".into(), bytes));
                        index += 1;
                        continue;
                    }
                };
                let id = format!("{synset}/{file}");
                let ext = file.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
                if file.starts_with("._") {
                    // macOS's AppleDouble companion of `file[2..]`: its metadata, not an image.
                    let detail = "a macOS resource fork (`._` file), not an image".to_owned();
                    rejects.push(reject(Some(id.clone()), "resource_fork", detail, id.into_bytes()));
                } else if !self.extensions.contains(&ext) {
                    let detail = match file.rsplit_once('.') {
                        Some(_) => format!("`.{ext}` is not one of {:?}", self.extensions),
                        None => format!("the name has no extension, not one of {:?}", self.extensions),
                    };
                    rejects.push(reject(Some(id.clone()), "unsupported_extension", detail, id.into_bytes()));
                } else {
                    let path = self.folder.root.join(&synset).join(&file).to_string_lossy().into_owned();
                    out.push(PairRow {
                        sample_id: &id,
                        path: Some(&path),
                        label: Some(&synset),
                        label_text: self.words.get(&synset).map(String::as_str),
                        ..Default::default()
                    });
                }
                index += 1;
            }
            let mut chunk = chunk_of(out.finish(), rejects);
            if let Some(n) = outside.take() {
                chunk.skipped.insert("outside_synset_folders", n);
            }
            Some(Ok(chunk))
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::{default_extensions, default_source, load_words, Folder, LoadError, ReadImagenet21k, CHUNK_ROWS};
    use crate::stages::Reader;
    use std::collections::HashMap;

    fn format_error(r: Result<std::collections::HashMap<String, String>, LoadError>) -> String {
        match r {
            Err(LoadError::Format(e)) => e,
            Err(LoadError::Io(e)) => panic!("an I/O error: {e}"),
            Ok(_) => panic!("loaded"),
        }
    }

    fn words_file(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("words.txt");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    /// The reader over `root`, with no words file.
    fn reader(root: &std::path::Path) -> ReadImagenet21k {
        ReadImagenet21k {
            folder: Folder { root: root.to_owned(), words_file: None },
            words: HashMap::new(),
            extensions: default_extensions(),
            source: default_source(),
        }
    }

    #[test]
    fn chunks_run_on_across_synset_folders_and_an_empty_root_gives_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stray.txt"), b"").unwrap();
        let r = reader(dir.path());
        let chunks: Vec<_> = r.open().unwrap().map(|c| c.unwrap()).collect();
        assert_eq!(chunks.len(), 1, "one chunk, for the skips");
        assert_eq!((chunks[0].batch.num_rows(), chunks[0].skipped["outside_synset_folders"]), (0, 1));
        // Three folders of 0, CHUNK_ROWS - 1 and 2 files: the first chunk ends one file into
        // the third folder, and the second holds the last file.
        for (synset, n) in [("n00000001", 0), ("n00000002", CHUNK_ROWS - 1), ("n00000003", 2)] {
            std::fs::create_dir(dir.path().join(synset)).unwrap();
            for i in 0..n {
                std::fs::write(dir.path().join(synset).join(format!("{synset}_{i:05}.JPEG")), b"").unwrap();
            }
        }
        let chunks: Vec<_> = r.open().unwrap().map(|c| c.unwrap()).collect();
        let rows: Vec<usize> = chunks.iter().map(|c| c.batch.num_rows()).collect();
        assert_eq!(rows, [CHUNK_ROWS, 1]);
        let ids = crate::schema::str_col(&chunks[1].batch, "sample_id");
        assert_eq!(ids.value(0), "n00000003/n00000003_00001.JPEG");
        let ids = crate::schema::str_col(&chunks[0].batch, "sample_id");
        assert_eq!(ids.value(CHUNK_ROWS - 2), format!("n00000002/n00000002_{:05}.JPEG", CHUNK_ROWS - 2));
        assert_eq!(ids.value(CHUNK_ROWS - 1), "n00000003/n00000003_00000.JPEG");
    }

    #[test]
    fn the_fingerprint_sees_what_the_reader_lists_and_sizes_not_image_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (root, words) = (dir.path().join("root"), dir.path().join("words.txt"));
        std::fs::create_dir_all(root.join("n00000001")).unwrap();
        std::fs::write(root.join("n00000001/a.jpg"), b"abc").unwrap();
        std::fs::write(&words, b"n00000001\tdog").unwrap();
        let folder = Folder { root: root.clone(), words_file: Some(words.clone()) };
        let print = || {
            let r = ReadImagenet21k { folder: folder.clone(), ..reader(&root) };
            r.fingerprinter()().unwrap()
        };
        let first = print();
        assert!(first.starts_with("listing-xxh3-128:"));
        // Same name and size: the same listing (image bytes are not read).
        std::fs::write(root.join("n00000001/a.jpg"), b"xyz").unwrap();
        assert_eq!(print(), first);
        let mut seen = vec![first];
        let mut changes = |what: &str, change: &dyn Fn()| {
            change();
            let now = print();
            assert!(!seen.contains(&now), "{what}: the fingerprint did not change");
            seen.push(now);
        };
        changes("another size", &|| std::fs::write(root.join("n00000001/a.jpg"), b"abcd").unwrap());
        changes("another name", &|| {
            std::fs::rename(root.join("n00000001/a.jpg"), root.join("n00000001/b.jpg")).unwrap()
        });
        // An empty folder where images are (a `not_a_file` reject), and one beside the synset
        // folders (an `outside_synset_folders` skip): rows that the output has.
        changes("a folder in a synset folder", &|| std::fs::create_dir(root.join("n00000001/sub")).unwrap());
        changes("a folder in the root", &|| std::fs::create_dir(root.join("other")).unwrap());
        changes("an empty synset folder", &|| std::fs::create_dir(root.join("n00000002")).unwrap());
        changes("the words", &|| std::fs::write(&words, b"n00000001\tcat").unwrap());
        changes("a broken link", &|| {
            std::os::unix::fs::symlink(root.join("nowhere"), root.join("n00000001/l.jpg")).unwrap()
        });
        changes("a name that is not UTF-8", &|| {
            use std::os::unix::ffi::OsStrExt;
            let name = std::ffi::OsStr::from_bytes(b"bad\xff.jpg");
            std::fs::write(root.join("n00000001").join(name), b"x").unwrap()
        });
        // Nothing below a synset folder's entries is visited: not a file in a folder there, and
        // not a link to a folder above it (which a walk of the tree would follow round and round).
        let before = print();
        std::fs::write(root.join("n00000001/sub/x.jpg"), b"x").unwrap();
        std::os::unix::fs::symlink(&root, root.join("n00000001/sub/up")).unwrap();
        assert_eq!(print(), before);
        std::os::unix::fs::symlink(&root, root.join("n00000001/up")).unwrap();
        assert_ne!(print(), before, "a link to a folder is a `not_a_file` entry");
    }

    #[test]
    fn the_stamp_sees_images_come_and_go_in_synset_folders_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        std::fs::create_dir_all(root.join("n00000001")).unwrap();
        std::fs::create_dir_all(root.join("curated/data")).unwrap();
        let folder = Folder { root: root.clone(), words_file: None };
        // The kernel's file times move by ticks of a few milliseconds.
        let tick = || std::thread::sleep(std::time::Duration::from_millis(30));
        let first = folder.stamp().unwrap();
        assert_eq!(folder.stamp(), Some(first));
        tick();
        // The root's own time does not change when an image is added to a synset folder.
        let root_time = std::fs::metadata(&root).unwrap().modified().unwrap();
        std::fs::write(root.join("n00000001/a.jpg"), b"x").unwrap();
        assert_eq!(std::fs::metadata(&root).unwrap().modified().unwrap(), root_time);
        let added = folder.stamp().unwrap();
        assert_ne!(added, first);
        tick();
        std::fs::remove_file(root.join("n00000001/a.jpg")).unwrap();
        let removed = folder.stamp().unwrap();
        assert_ne!(removed, added);
        // What another folder of the root holds is not read: a run writing its output there
        // does not change the stamp.
        tick();
        std::fs::write(root.join("curated/data/part-00000.parquet"), b"x").unwrap();
        std::fs::write(root.join("curated/config.json"), b"{}").unwrap();
        assert_eq!(folder.stamp(), Some(removed));
        assert_eq!(Folder { root: root.join("gone"), words_file: None }.stamp(), None);
    }

    #[test]
    fn the_words_file_maps_synsets_to_their_words() {
        let (_dir, path) = words_file(b"n01440764\ttench, Tinca tinca\r\n\nn01443537\t goldfish \n");
        let Ok(words) = load_words(&path) else { panic!("not loaded") };
        assert_eq!(words.len(), 2);
        assert_eq!(words["n01440764"], "tench, Tinca tinca");
        assert_eq!(words["n01443537"], "goldfish");
    }

    #[test]
    fn a_words_line_that_is_not_utf8_or_repeats_a_synset_is_refused_with_its_line() {
        let (_dir, path) = words_file(b"n01440764\ttench\nn01443537\tgold\xfffish\n");
        let e = format_error(load_words(&path));
        assert!(e.ends_with("line 2: not UTF-8"), "{e}");
        let (_dir, path) = words_file(b"n01440764\ttench\nn01443537\tgoldfish\nn01440764\tanother tench\n");
        let e = format_error(load_words(&path));
        assert!(e.ends_with("line 3: synset `n01440764` is already on line 1"), "{e}");
        let (_dir, path) = words_file(b"n01440764\ttench\tTinca tinca\n");
        let e = format_error(load_words(&path));
        assert!(e.ends_with("line 1: expected 2 tab-separated fields"), "{e}");
        // A header, or a class list of other ids, names no synset folder.
        let (_dir, path) = words_file(b"synset\twords\nn01440764\ttench\n");
        let e = format_error(load_words(&path));
        assert!(e.ends_with("line 1: `synset` is not a synset id (`n` and 8 digits)"), "{e}");
        // Blanks around a synset are Python's (U+001C..U+001F too).
        let (_dir, path) = words_file(b"\x1cn01440764\x1f\ttench\n");
        assert!(load_words(&path).is_ok_and(|w| w["n01440764"] == "tench"));
    }
}
