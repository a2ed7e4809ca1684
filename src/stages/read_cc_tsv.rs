//! `read_cc_tsv`: Conceptual Captions as published — `caption<TAB>url` per line, no header
//! (CC3M `Train_GCC-training.tsv`, `Validation_GCC-1.1.0-Validation.tsv`; CC12M's
//! `cc12m.tsv` is `url<TAB>caption`, see `url_first`).
//!
//! Rows have no id in the file, so `sample_id` is `<file name>#<line number>` (1-based), stable
//! as long as the published file is unchanged. The caption and URL are kept byte for byte. A
//! line with another field count, invalid UTF-8, an empty or whitespace-only caption or an empty
//! URL is a reject.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{expand_inputs, has_words, split_tabs, ChunkIter, LineChunks, LineOutcome, Problems, Reader};
use crate::error::Result;
use crate::io::PathPatterns;
use crate::schema::PairRow;

pub const TYPE: &str = "read_cc_tsv";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadCcTsvConfig {
    /// TSV file(s); patterns allowed (`cc3m/*.tsv`).
    pub path: PathPatterns,
    /// Value of the `source` column.
    #[serde(default = "default_source")]
    pub source: String,
    /// Fields are `url<TAB>caption` (CC12M) instead of `caption<TAB>url` (CC3M).
    #[serde(default)]
    pub url_first: bool,
}

fn default_source() -> String {
    "conceptual_captions".into()
}

impl ReadCcTsvConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadCcTsv> {
        let files = expand_inputs(&self.path, problems, "path", "*.tsv");
        super::refuse_non_text(&files, problems, "path", false);
        problems.is_empty().then(|| ReadCcTsv { files, source: self.source.clone(), url_first: self.url_first })
    }
}

pub struct ReadCcTsv {
    files: Vec<PathBuf>,
    source: String,
    url_first: bool,
}

impl Reader for ReadCcTsv {
    fn image_refs(&self) -> super::ImageRefs {
        super::ImageRefs::UrlsOnly
    }

    fn inputs(&self) -> Vec<PathBuf> {
        self.files.clone()
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        let (ci, ui) = if self.url_first { (1, 0) } else { (0, 1) };
        let chunks = LineChunks::new(self.files.clone(), &self.source, TYPE, 0, move |line, out, id| {
            let fields = split_tabs(line.bytes);
            let n = fields.count;
            if n != 2 {
                return LineOutcome::Reject {
                    reason: "wrong_field_count",
                    detail: format!("{n} fields, expected 2").into(),
                };
            }
            let (Some(caption), Some(url)) = (line.text(fields[ci]), line.text(fields[ui])) else {
                return LineOutcome::Reject { reason: "invalid_utf8", detail: "line is not valid UTF-8".into() };
            };
            if !has_words(caption) {
                return LineOutcome::Reject { reason: "empty_caption", detail: "caption has no words".into() };
            }
            if !has_words(url) {
                return LineOutcome::Reject { reason: "missing_url", detail: "url field is blank".into() };
            }
            id.clear();
            id.push_str(line.file);
            id.push('#');
            id.push_str(itoa::Buffer::new().format(line.no));
            out.push(PairRow { sample_id: id, caption: Some(caption), url: Some(url), ..Default::default() });
            LineOutcome::Row
        });
        Ok(Box::new(chunks.with_line_ids()))
    }
}
