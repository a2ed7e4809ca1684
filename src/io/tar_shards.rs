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

/// Where a shard that was cut short (a copy or download that stopped) ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// 0-based index of the member cut short, or of the first missing one.
    pub member_index: u64,
    pub detail: String,
}

/// Reads the samples of one shard, image bytes skipped. A shard cut short keeps the samples
/// before the cut; the sample the cut falls in is left out, and the cut is returned.
pub fn read_samples(path: &Path) -> Result<(Vec<Sample>, Option<Truncated>)> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io("cannot read", path, e))?.len();
    let mut archive = tar::Archive::new(file);
    let entries = archive.entries_with_seek().map_err(|e| Error::io("cannot read tar", path, e))?;
    let mut out: Vec<Sample> = Vec::new();
    // Where the last member's data (padded to 512-byte blocks) ends.
    let mut end = 0u64;
    let mut members = 0u64;
    for (i, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| Error::io("corrupt tar member in", path, e))?;
        members = i as u64 + 1;
        let data_end = entry.raw_file_position() + entry.size();
        if data_end > file_len {
            let name = entry.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let (key, _) = member_key(&name);
            // The sample the cut member belongs to is incomplete.
            if out.last().is_some_and(|s| s.key == key) {
                out.pop();
            }
            let detail = format!("the file ends inside member {i} (`{name}`): {file_len} of {data_end} bytes");
            return Ok((out, Some(Truncated { member_index: i as u64, detail })));
        }
        end = data_end.div_ceil(512) * 512;
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
    // A whole archive ends with two zero blocks; without them, members may be missing.
    let mut tail = [0u8; 1024];
    let complete = {
        use std::io::{Seek, SeekFrom};
        let mut f = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
        f.seek(SeekFrom::Start(end)).is_ok() && f.read_exact(&mut tail).is_ok() && tail.iter().all(|&b| b == 0)
    };
    if !complete {
        let detail =
            format!("no end-of-archive blocks after member {}: the file may have been cut short", members.max(1) - 1);
        return Ok((out, Some(Truncated { member_index: members, detail })));
    }
    Ok((out, None))
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
        let (s, cut) = read_samples(&p).unwrap();
        assert_eq!(cut, None);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].key.as_str(), s[0].members.len(), s[1].member_index), ("a", 3, 3));
        assert_eq!(s[0].member("txt").unwrap().data.as_deref(), Some(&b"a dog"[..]));
        assert_eq!(s[0].member("jpg").unwrap().data, None);
        // Cut inside `b.txt`'s data: `a` is whole; `b` is left out and the cut reported.
        let bytes = std::fs::read(&p).unwrap();
        let cut_at = 3 * 1024 + 512; // each member here is a header block and a data block
        std::fs::write(&p, &bytes[..cut_at]).unwrap();
        let (s, cut) = read_samples(&p).unwrap();
        assert_eq!((s.len(), s[0].key.as_str()), (1, "a"));
        assert_eq!(cut.map(|c| c.member_index), Some(3));
        // Cut where a header would start: nothing is half-read, but the end blocks are missing.
        std::fs::write(&p, &bytes[..3 * 1024]).unwrap();
        let (s, cut) = read_samples(&p).unwrap();
        assert_eq!(s.len(), 1);
        assert!(cut.is_some_and(|c| c.detail.contains("cut short")));
    }
}
