//! `read_imagenet21k`: an ImageNet-21k style folder of synset directories
//! (`ROOT/nXXXXXXXX/*.JPEG`) with an optional `synset<TAB>words` file. Rows have no caption:
//! these are the "unaligned" images that pseudo-BoW mining labels (Fistful §3); `label` is the
//! synset and `label_text` its words, kept aside for evaluation.
//!
//! `sample_id` is the path below the root (`n01440764/n01440764_10026.JPEG`); `path` is the
//! file's path as reachable from where curate runs. Files are listed in sorted order. A file
//! that is not an image (by extension) is an `unsupported_extension` reject.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{chunk_of, split_tabs, ChunkIter, Problems, Reader, CHUNK_ROWS};
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
    /// Image file extensions, case-insensitive.
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

fn is_synset(name: &str) -> bool {
    name.len() == 9 && name.starts_with('n') && name[1..].bytes().all(|b| b.is_ascii_digit())
}

impl ReadImagenet21kConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadImagenet21k> {
        let root = PathBuf::from(&self.root);
        if !root.is_dir() {
            problems.push(
                "root",
                format!("`{}` is not a folder", self.root),
                Some("point `root` at the folder holding the `nXXXXXXXX` directories".into()),
            );
        }
        let mut words = HashMap::new();
        if let Some(w) = &self.words {
            match load_words(&PathBuf::from(w)) {
                Ok(m) => words = m,
                Err(e) => problems.push("words", e, Some("expected `synset<TAB>words` lines".into())),
            }
        }
        problems.is_empty().then(|| ReadImagenet21k {
            root,
            words_file: self.words.as_ref().map(PathBuf::from),
            words,
            extensions: self.extensions.iter().map(|e| e.to_ascii_lowercase()).collect(),
            source: self.source.clone(),
        })
    }
}

fn load_words(path: &std::path::Path) -> std::result::Result<HashMap<String, String>, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let mut out = HashMap::new();
    while let Some((no, line)) = lines.next_line().map_err(|e| e.to_string())? {
        if line.is_empty() {
            continue;
        }
        let fields = split_tabs(line);
        if fields.count != 2 {
            return Err(format!("`{}` line {no}: expected 2 tab-separated fields", path.display()));
        }
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
        out.insert(text(fields[0]), text(fields[1]));
    }
    Ok(out)
}

pub struct ReadImagenet21k {
    root: PathBuf,
    words_file: Option<PathBuf>,
    words: HashMap<String, String>,
    extensions: Vec<String>,
    source: String,
}

impl ReadImagenet21k {
    /// `(synset, file name)` of every file, sorted.
    fn listing(&self) -> Result<Vec<(String, String)>> {
        let read = |p: &PathBuf| -> Result<Vec<String>> {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .map_err(|e| Error::io("cannot list", p, e))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            Ok(v)
        };
        let mut out = Vec::new();
        for synset in read(&self.root)?.into_iter().filter(|s| is_synset(s) && self.root.join(s).is_dir()) {
            for file in read(&self.root.join(&synset))? {
                out.push((synset.clone(), file));
            }
        }
        Ok(out)
    }
}

impl Reader for ReadImagenet21k {
    fn inputs(&self) -> Vec<PathBuf> {
        let mut v = vec![self.root.clone()];
        v.extend(self.words_file.clone());
        v
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        let listing = self.listing()?;
        let root_name = crate::io::file_name(&self.root);
        let chunks: Vec<Vec<(String, String)>> = listing.chunks(CHUNK_ROWS).map(<[_]>::to_vec).collect();
        let mut index = 0u64;
        Ok(Box::new(chunks.into_iter().map(move |files| {
            let mut out = PairsBuilder::new(&self.source);
            let mut rejects = Vec::new();
            for (synset, file) in files {
                let id = format!("{synset}/{file}");
                let ext = file.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
                if !self.extensions.contains(&ext) {
                    rejects.push(Reject {
                        stage: TYPE,
                        source_file: root_name.clone(),
                        row: index,
                        sample_id: Some(id.clone()),
                        reason: "unsupported_extension",
                        detail: format!("`.{ext}` is not one of {:?}", self.extensions).into(),
                        raw: id.into_bytes(),
                    });
                } else {
                    let path = self.root.join(&synset).join(&file).to_string_lossy().into_owned();
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
            Ok(chunk_of(out.finish(), rejects))
        })))
    }
}
