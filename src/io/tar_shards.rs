//! Webdataset tar shards (img2dataset's `output_format = "webdataset"`): members are grouped
//! into samples by key, the member path up to the first `.` of its file name
//! (`000000012.jpg`, `000000012.txt`, `000000012.json` form sample `000000012`). Consecutive
//! members with the same key form one sample, as the webdataset format defines.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// One member of a sample: its extension (`jpg`, `txt`, `json`, ...) and, for small text
/// members, its bytes. Image bytes are not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub ext: String,
    pub data: Option<Vec<u8>>,
}

/// One sample of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub key: String,
    /// 0-based index of the sample's first member in the tar.
    pub member_index: u64,
    pub members: Vec<Member>,
}

impl Sample {
    pub fn member(&self, ext: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.ext == ext)
    }
}

/// Extensions whose bytes are loaded (metadata, not images).
fn loads(ext: &str) -> bool {
    matches!(ext, "txt" | "json" | "cls" | "caption")
}

/// A member name's sample key — its path up to the first `.` of the file name — and the rest
/// of the file name after that `.` (the extension, `""` if none), as webdataset defines them:
/// `a/b/0001.seg.json` is key `a/b/0001`, extension `seg.json`.
pub fn member_key(name: &str) -> (String, &str) {
    let (dir, base) = name.rsplit_once('/').map_or(("", name), |(d, b)| (d, b));
    let (stem, ext) = base.split_once('.').unwrap_or((base, ""));
    let key = if dir.is_empty() { stem.to_owned() } else { format!("{dir}/{stem}") };
    (key, ext)
}

/// Reads the samples of one shard, image bytes skipped.
pub fn read_samples(path: &Path) -> Result<Vec<Sample>> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut archive = tar::Archive::new(file);
    let entries = archive.entries_with_seek().map_err(|e| Error::io("cannot read tar", path, e))?;
    let mut out: Vec<Sample> = Vec::new();
    for (i, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| Error::io("corrupt tar member in", path, e))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(|e| Error::io("bad member name in", path, e))?.to_string_lossy().into_owned();
        let (key, ext) = member_key(&name);
        let ext = ext.to_ascii_lowercase();
        let data = if loads(&ext) {
            let mut buf = Vec::new();
            entry.read_to_end(&mut buf).map_err(|e| Error::io("cannot read tar member in", path, e))?;
            Some(buf)
        } else {
            None
        };
        match out.last_mut() {
            Some(s) if s.key == key => s.members.push(Member { ext, data }),
            _ => out.push(Sample { key, member_index: i as u64, members: vec![Member { ext, data }] }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_keys_follow_webdataset() {
        assert_eq!(member_key("0001.jpg"), ("0001".to_owned(), "jpg"));
        assert_eq!(member_key("a/b.c/0001.seg.json"), ("a/b.c/0001".to_owned(), "seg.json"));
        assert_eq!(member_key("dir/README"), ("dir/README".to_owned(), ""));
    }

    #[test]
    fn groups_members_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.tar");
        let mut b = tar::Builder::new(File::create(&p).unwrap());
        for (name, data) in [("a.jpg", &b"\xff\xd8"[..]), ("a.txt", b"a dog"), ("a.json", b"{}"), ("b.txt", b"x")] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        b.finish().unwrap();
        drop(b);
        let s = read_samples(&p).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].key.as_str(), s[0].members.len(), s[1].member_index), ("a", 3, 3));
        assert_eq!(s[0].member("txt").unwrap().data.as_deref(), Some(&b"a dog"[..]));
        assert_eq!(s[0].member("jpg").unwrap().data, None);
    }
}
