//! Webdataset tar shards (img2dataset's `output_format = "webdataset"`): members are grouped
//! into samples by key, the member path up to the first `.` of its file name
//! (`000000012.jpg`, `000000012.txt`, `000000012.json` form sample `000000012`). Consecutive
//! members with the same key form one sample, as the webdataset format defines.
//!
//! A shard that ends early or has a damaged header is read up to the damage and never stops a
//! run: the samples known to be whole before it come back with a [`Damage`] saying where and
//! what, which `read_img2dataset` makes a `truncated_tar` or `corrupt_tar` reject
//! (`schemas/rejects.md`). The `tar` crate reads the members; where it fails, [`diagnose`]
//! walks the header blocks itself to tell a cut from a corrupt header. What counts as a member
//! and where the archive ends follow Python's `tarfile` and GNU tar.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Error, Result};

/// Tar's unit: headers are one block, member data is padded to whole blocks.
const BLOCK: u64 = 512;

/// One member of a sample: its extension (`jpg`, `txt`, `json`, ...) and, for small text
/// members, its bytes. Image bytes are not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub ext: String,
    pub data: Option<Vec<u8>>,
}

/// A member whose extension its sample already has (a writer that retried a sample, two `.txt`
/// for one key). The first copy is the one used; this one is listed so that it can be reported
/// rather than lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeat {
    /// 0-based index of the member in the tar.
    pub member_index: u64,
    /// The member's name, byte for byte.
    pub name: Vec<u8>,
    /// Lower-cased, as in [`Member::ext`].
    pub ext: String,
}

/// One sample of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The key (see [`member_key`]); for a member whose name is not UTF-8, its name made text
    /// with U+FFFD for the bad bytes (see `bad_name`).
    pub key: String,
    /// The name, byte for byte, of a member whose name is not UTF-8. Such a member is a sample
    /// of its own: its key is unknown, so it joins no other member, and lossy decoding would
    /// let two different names share a key.
    pub bad_name: Option<Vec<u8>>,
    /// 0-based index of the sample's first member in the tar.
    pub member_index: u64,
    pub members: Vec<Member>,
    /// Members repeating an extension of `members`, in tar order.
    pub repeats: Vec<Repeat>,
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

/// What ended a shard before its end-of-archive blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageKind {
    /// The file ends early (a copy or download that stopped): inside a member's data or header
    /// blocks, or without the end-of-archive blocks.
    Cut,
    /// A header inside the file cannot be read (a checksum mismatch, a bad size field): where
    /// the next member starts is unknown, so the shard is read no further.
    Corrupt,
}

/// Where and why a shard's reading stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub kind: DamageKind,
    /// 0-based index of the member cut short or with the bad header, or of the first missing one.
    pub member_index: u64,
    /// The key of the last sample before the damage, when it is left out because it may lack
    /// members (see [`read_samples`]).
    pub left_out: Option<String>,
    pub detail: String,
}

/// Reads the samples of one shard, image bytes skipped. A shard cut short or with a corrupt
/// header keeps the samples before the damage, and the damage is returned. A sample is known to
/// be whole only once a member of another key, or the end-of-archive marker, follows it (there
/// is no member count in a webdataset shard), so the sample the damage falls in is left out —
/// as is the one before it when the damaged member's name cannot be read.
pub fn read_samples(path: &Path) -> Result<(Vec<Sample>, Option<Damage>)> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io("cannot read", path, e))?.len();
    let mut archive = tar::Archive::new(file);
    let entries = archive.entries_with_seek().map_err(|e| Error::io("cannot read tar", path, e))?;
    let mut out: Vec<Sample> = Vec::new();
    // Where the next member's header blocks start: after the last member's data, padded.
    let mut end = 0u64;
    let mut members = 0u64;
    // The extensions of the last sample, for the repeat check: a sample may have many members
    // (`frame.000001.png`, ... share a key), and a scan of its list per member is quadratic.
    let mut last_exts: HashSet<String> = HashSet::new();
    for entry in entries {
        // Member indexes count members only (see the PAX global header below).
        let i = members;
        let mut entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                let (kind, name, detail) = diagnose(path, end, file_len, i, &e)?;
                return Ok(stop(out, kind, i, name.as_deref(), detail));
            }
        };
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        // (A negative base-256 size the crate reads as a number past any file's end; it fails
        // the crate first, and `diagnose` names it.)
        let data_end = entry.raw_file_position().saturating_add(entry.size());
        if data_end > file_len {
            let detail = format!("the file ends inside member {i} (`{name}`): {file_len} of {data_end} bytes");
            return Ok(stop(out, DamageKind::Cut, i, Some(&entry.path_bytes()), detail));
        }
        end = data_end.div_ceil(BLOCK) * BLOCK;
        // A PAX global header (type `g`, as `git archive` and Python's `tarfile` with
        // `pax_headers` write) sets defaults for the members after it: the `tar` crate hands
        // it out as an entry, but Python's `tarfile` and GNU tar do not count it as a member,
        // so a reject's `row` after it would be off by one from theirs.
        if entry.header().entry_type().is_pax_global_extensions() {
            continue;
        }
        members = i + 1;
        // Regular files; type `7` (contiguous file) is one too, as Python's `tarfile` and GNU
        // tar read it.
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        if std::str::from_utf8(&entry.path_bytes()).is_err() {
            let bad_name = Some(entry.path_bytes().into_owned());
            out.push(Sample { key: name, bad_name, member_index: i, members: Vec::new(), repeats: Vec::new() });
            continue;
        }
        let (key, ext) = member_key(&name);
        let ext = ext.to_ascii_lowercase();
        // A member joins the sample before it when it has its key (and a new extension).
        match out.last_mut().filter(|s| s.bad_name.is_none() && s.key == key) {
            Some(s) if last_exts.contains(&ext) => {
                s.repeats.push(Repeat { member_index: i, name: entry.path_bytes().into_owned(), ext });
            }
            Some(s) => {
                let data = load(&mut entry, &ext, path)?;
                last_exts.insert(ext.clone());
                s.members.push(Member { ext, data });
            }
            None => {
                let data = load(&mut entry, &ext, path)?;
                last_exts.clear();
                last_exts.insert(ext.clone());
                let members = vec![Member { ext, data }];
                out.push(Sample { key, bad_name: None, member_index: i, members, repeats: Vec::new() });
            }
        }
    }
    // The `tar` crate stops at the first zero block or at the end of the file. A whole archive
    // ends with two zero blocks.
    let mut tail = Vec::with_capacity(2 * BLOCK as usize);
    let mut f = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    f.seek(SeekFrom::Start(end))
        .and_then(|_| f.take(2 * BLOCK).read_to_end(&mut tail))
        .map_err(|e| Error::io("cannot read", path, e))?;
    if tail.len() < BLOCK as usize {
        // The file ends where a header would start: the next member may be of the last sample.
        let detail = match members {
            0 => "the file holds no member and no end-of-archive blocks: it may have been cut short".to_owned(),
            n => format!("no end-of-archive blocks after member {}: the file may have been cut short", n - 1),
        };
        return Ok(stop(out, DamageKind::Cut, members, None, detail));
    }
    if tail.len() == 2 * BLOCK as usize && tail.iter().all(|&b| b == 0) {
        return Ok((out, None));
    }
    // One zero block, then the file ends: the end-of-archive marker was cut short, and the
    // samples are whole (the marker follows the last member).
    if tail.len() < 2 * BLOCK as usize {
        let detail = format!("the end-of-archive blocks are cut short: {} of 1024 bytes", tail.len());
        return Ok((out, Some(Damage { kind: DamageKind::Cut, member_index: members, left_out: None, detail })));
    }
    // One zero block, then more data: Python's `tarfile` ends the archive there, but a header
    // zeroed in the middle of a shard looks the same, so the last sample may lack members.
    let after = file_len - end - BLOCK;
    let detail = format!(
        "a lone zero block at byte {end}: the archive ends there, as Python's `tarfile` reads it, and the {after} \
         bytes after it are not read"
    );
    Ok(stop(out, DamageKind::Corrupt, members, None, detail))
}

/// The bytes of a metadata member ([`loads`]); images are not read.
fn load(entry: &mut impl Read, ext: &str, path: &Path) -> Result<Option<Vec<u8>>> {
    if !loads(ext) {
        return Ok(None);
    }
    let mut buf = Vec::new();
    entry.read_to_end(&mut buf).map_err(|e| Error::io("cannot read tar member in", path, e))?;
    Ok(Some(buf))
}

/// Ends a shard's reading at damage to member `index`, named `next` (byte for byte) when a
/// whole header gave its name. The last sample read is kept only when `next` starts another
/// sample: a member of the same key, or one whose name is unknown, may belong to it, and a
/// sample missing a member must not pass as whole (a `jpg, txt` without its `json` would lose
/// its url silently). A name that is not UTF-8 starts a sample of its own, with no key.
fn stop(
    mut out: Vec<Sample>,
    kind: DamageKind,
    index: u64,
    next: Option<&[u8]>,
    mut detail: String,
) -> (Vec<Sample>, Option<Damage>) {
    // The damaged member's name: `Some(None)` when it is known but not UTF-8.
    let next = next.map(|n| std::str::from_utf8(n).ok());
    let last_whole = match (out.last(), next) {
        (None, _) => true,
        // A member whose name is not UTF-8 is a sample of its own, whole once read.
        (Some(s), _) if s.bad_name.is_some() => true,
        (Some(_), Some(None)) => true,
        (Some(s), Some(Some(next))) => member_key(next).0 != s.key,
        (Some(_), None) => false,
    };
    // The sample left out: the last one read, or, when that one is whole, the sample of the
    // damaged member (its first member), when its name is known and UTF-8.
    let left_out = match last_whole {
        true => next.flatten().map(|n| member_key(n).0),
        false => out.pop().map(|s| s.key),
    };
    if let Some(key) = &left_out {
        let why = match next {
            Some(_) => "the damage falls in it",
            None => "what follows it cannot be read, so it may be incomplete",
        };
        detail.push_str(&format!("; sample `{key}` is left out: {why}"));
    }
    (out, Some(Damage { kind, member_index: index, left_out, detail }))
}

/// Why the `tar` crate failed (`err`) to read member `index`, whose header blocks start at
/// `pos`. Walks them as Python's `tarfile` does — extension headers (PAX `x`, GNU long names
/// `L`/`K`) and their data, then the member's own header — and returns the damage's kind, the
/// member's name (bytes) when whole, checksummed headers give it, and a detail. The file ending inside
/// these blocks is a cut; a whole block that is not a valid header is corruption.
fn diagnose(
    path: &Path,
    mut pos: u64,
    file_len: u64,
    index: u64,
    err: &std::io::Error,
) -> Result<(DamageKind, Option<Vec<u8>>, String)> {
    let mut f = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut read_at = |pos: u64, buf: &mut [u8]| {
        f.seek(SeekFrom::Start(pos)).and_then(|_| f.read_exact(buf)).map_err(|e| Error::io("cannot read", path, e))
    };
    let corrupt = |name: Option<Vec<u8>>, what: String| {
        (DamageKind::Corrupt, name, format!("member {index}: {what}; the shard is not read past it"))
    };
    let (mut name, mut pax_size, mut extended) = (None::<Vec<u8>>, None::<u64>, false);
    loop {
        if pos + BLOCK > file_len {
            let detail = if pos < file_len {
                format!("the file ends inside a header block of member {index}: {} of 512 bytes", file_len - pos)
            } else if extended {
                format!("the file ends after the extended header of member {index}, before its own header")
            } else {
                format!("the file ends before member {index}")
            };
            return Ok((DamageKind::Cut, name, detail));
        }
        let mut block = [0u8; BLOCK as usize];
        read_at(pos, &mut block)?;
        if block.iter().all(|&b| b == 0) {
            // The crate takes a zero block for the end; one here follows an extension header.
            return Ok(corrupt(
                name,
                format!("its extended header is followed by a zero block at byte {pos}, not a header"),
            ));
        }
        let header = tar::Header::from_byte_slice(&block);
        // As the `tar` crate (and POSIX) sums a header: the checksum field counts as spaces.
        let sum = block[..148].iter().chain(&block[156..]).map(|&b| u32::from(b)).sum::<u32>() + 8 * u32::from(b' ');
        match header.cksum() {
            Ok(stored) if stored == sum => {}
            Ok(stored) => {
                let what = format!("header checksum mismatch at byte {pos} (stored {stored}, computed {sum})");
                return Ok(corrupt(name, what));
            }
            Err(_) => return Ok(corrupt(name, format!("the header at byte {pos} has no valid checksum field"))),
        }
        let kind = header.entry_type();
        let recognized = header.as_ustar().is_some() || header.as_gnu().is_some();
        let extension =
            recognized && (kind.is_pax_local_extensions() || kind.is_gnu_longname() || kind.is_gnu_longlink());
        // A size past i64::MAX is a negative base-256 one (first byte 0xff), which the crate
        // reads as an unsigned number: no file is that long.
        let Some(size) = header.entry_size().ok().filter(|&size| size <= i64::MAX as u64) else {
            // A checksummed member header names its member, even with a bad size field.
            let name = if extension { name } else { name.or_else(|| Some(header_name(header))) };
            let negative = if header.entry_size().is_ok() { " (negative)" } else { "" };
            return Ok(corrupt(name, format!("the header at byte {pos} has no valid size field{negative}")));
        };
        let data = pos + BLOCK;
        if extension {
            if data.saturating_add(size) > file_len {
                let detail = format!("the file ends inside the extended header of member {index}");
                return Ok((DamageKind::Cut, name, detail));
            }
            let mut ext = vec![0u8; size as usize];
            read_at(data, &mut ext)?;
            if kind.is_pax_local_extensions() {
                for e in tar::PaxExtensions::new(&ext).flatten() {
                    match e.key() {
                        Ok("path") => name = Some(e.value_bytes().to_vec()),
                        Ok("size") => pax_size = e.value().ok().and_then(|v| v.parse().ok()),
                        _ => {}
                    }
                }
            } else if kind.is_gnu_longname() {
                let end = ext.iter().position(|&b| b == 0).unwrap_or(ext.len());
                name = Some(ext[..end].to_vec());
            }
            extended = true;
            pos = data + size.div_ceil(BLOCK) * BLOCK;
            continue;
        }
        let name = name.unwrap_or_else(|| header_name(header));
        let shown = String::from_utf8_lossy(&name);
        let size = pax_size.unwrap_or(size);
        if data.saturating_add(size) > file_len {
            let detail = format!(
                "the file ends inside member {index} (`{shown}`): {file_len} of {} bytes",
                data.saturating_add(size)
            );
            return Ok((DamageKind::Cut, Some(name), detail));
        }
        let what =
            format!("`{shown}`{} cannot be read: {err}", if extended { " (after an extended header)" } else { "" });
        return Ok(corrupt(Some(name), what));
    }
}

/// A header's own name (ustar: `prefix/name`), byte for byte.
fn header_name(header: &tar::Header) -> Vec<u8> {
    header.path_bytes().into_owned()
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

    /// The samples of a shard made of `bytes`.
    fn read(bytes: &[u8]) -> (Vec<Sample>, Option<Damage>) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00000.tar");
        std::fs::write(&p, bytes).unwrap();
        read_samples(&p).unwrap()
    }

    /// A shard as `webdataset.TarWriter` (Python `tarfile`, PAX format) writes it: each member
    /// behind a PAX extended header for its float `mtime` (and its `path` when not ASCII), so
    /// 1,536 bytes of header blocks each. Returns the bytes and, per member, where its header
    /// blocks start, where its data starts, and where its padded data ends.
    fn pax_shard(members: &[(&str, &[u8])]) -> (Vec<u8>, Vec<[u64; 3]>) {
        let mut b = tar::Builder::new(Vec::new());
        let mut at = Vec::new();
        for (name, data) in members {
            let start = b.get_ref().len() as u64;
            let mut pax = vec![("mtime", &b"1700000000.25"[..])];
            if !name.is_ascii() {
                pax.push(("path", name.as_bytes()));
            }
            b.append_pax_extensions(pax).unwrap();
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
            let end = b.get_ref().len() as u64;
            at.push([start, end - (data.len() as u64).div_ceil(BLOCK) * BLOCK, end]);
        }
        (b.into_inner().unwrap(), at)
    }

    /// Three-member samples, one per key, members in `order`; an image is 700 bytes.
    fn samples(keys: &[&str], order: [&str; 3]) -> Vec<(String, Vec<u8>)> {
        let data = |ext: &str, key: &str| match ext {
            "txt" => format!("a caption of {key}").into_bytes(),
            "json" => format!("{{\"url\": \"http://x/{key}.jpg\"}}").into_bytes(),
            _ => vec![0xff; 700],
        };
        keys.iter().flat_map(|k| order.map(|e| (format!("{k}.{e}"), data(e, k)))).collect()
    }

    fn members(s: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
        s.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect()
    }

    #[test]
    fn a_sample_of_many_extensions_keeps_each_once_and_lists_its_repeats() {
        // `clip.000000.png`, `clip.000001.png`, ... all have key `clip` (up to the first `.`).
        let mut names: Vec<String> = vec!["clip.jpg".into(), "clip.txt".into()];
        names.extend((0..3000).map(|i| format!("clip.{i:06}.png")));
        // Repeats of a first and a late extension, then a new key that may use them again.
        names.extend(["clip.000000.png", "clip.002999.png", "next.000000.png", "next.jpg"].map(String::from));
        let data: Vec<(String, Vec<u8>)> = names.into_iter().map(|n| (n, b"x".to_vec())).collect();
        let (s, cut) = read(&pax_shard(&members(&data)).0);
        assert_eq!(cut, None);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].key.as_str(), s[0].members.len()), ("clip", 3002));
        let repeats: Vec<(u64, &str)> = s[0].repeats.iter().map(|r| (r.member_index, r.ext.as_str())).collect();
        assert_eq!(repeats, [(3002, "000000.png"), (3003, "002999.png")]);
        assert_eq!((s[1].key.as_str(), s[1].members.len(), s[1].repeats.len()), ("next", 2, 0));
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
        // Cut inside `b.txt`'s data: `a` is whole; `b` is left out, named, and the cut reported.
        let bytes = std::fs::read(&p).unwrap();
        let cut_at = 3 * 1024 + 512; // each member here is a header block and a data block
        std::fs::write(&p, &bytes[..cut_at]).unwrap();
        let (s, cut) = read_samples(&p).unwrap();
        assert_eq!((s.len(), s[0].key.as_str()), (1, "a"));
        let cut = cut.unwrap();
        assert_eq!((cut.kind, cut.member_index, cut.left_out.as_deref()), (DamageKind::Cut, 3, Some("b")));
        // Cut where a header would start: the next member might have been `a`'s, so `a` is not
        // known to be whole.
        std::fs::write(&p, &bytes[..3 * 1024]).unwrap();
        let (s, cut) = read_samples(&p).unwrap();
        assert_eq!(s.len(), 0);
        let cut = cut.unwrap();
        assert_eq!((cut.kind, cut.left_out.as_deref()), (DamageKind::Cut, Some("a")));
        assert!(cut.detail.contains("cut short"), "{}", cut.detail);
    }

    #[test]
    fn a_pax_global_header_is_not_a_member() {
        // `git archive`, and Python's `tarfile` with `pax_headers`, start the archive with a
        // global header (type `g`). Python's `tarfile` lists `a.jpg` as member 0, so a reject's
        // `row` must too: counting the header put every index after it one too high.
        let mut b = tar::Builder::new(Vec::new());
        let mut g = tar::Header::new_ustar();
        let record = b"19 comment=shard 0\n";
        g.set_entry_type(tar::EntryType::XGlobalHeader);
        g.set_size(record.len() as u64);
        g.set_mode(0o644);
        g.set_cksum();
        b.append_data(&mut g, "pax_global_header", &record[..]).unwrap();
        for (name, data) in [("a.jpg", &b"\xff\xd8"[..]), ("a.txt", b"a dog"), ("b.txt", b"x"), ("b.txt", b"y")] {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        let bytes = b.into_inner().unwrap();
        let (s, damage) = read(&bytes);
        assert_eq!(damage, None);
        let keys: Vec<(&str, u64)> = s.iter().map(|s| (s.key.as_str(), s.member_index)).collect();
        assert_eq!(keys, [("a", 0), ("b", 2)]);
        assert_eq!(s[1].repeats.iter().map(|r| r.member_index).collect::<Vec<_>>(), [3]);
        // Cut where the last member's data starts (a header and a data block each, the global
        // header first): member 3 is cut.
        let (_, damage) = read(&bytes[..4 * 1024 + 512]);
        assert_eq!(damage.map(|d| (d.kind, d.member_index)), Some((DamageKind::Cut, 3)));
    }

    #[test]
    fn a_cut_anywhere_keeps_exactly_the_samples_known_whole() {
        // Python's `tarfile` lists the members before a cut in a header and stops without an
        // error, and webdataset then yields the last, maybe partial, sample. Here a sample is
        // kept once the whole header of a member of the next key, or a zero block, follows it.
        let keys = ["000000000", "000000001", "000000002"];
        for order in [["jpg", "txt", "json"], ["json", "jpg", "txt"], ["jpg", "json", "txt"]] {
            let s = samples(&keys, order);
            let (full, at) = pax_shard(&members(&s));
            let (whole, cut) = read(&full);
            assert_eq!((whole.len(), cut), (3, None));
            // Sample j is known whole from the data start of the next sample's first member, the
            // last one from the end of the first end-of-archive block.
            let known_whole = [at[3][1], at[6][1], at[8][2] + BLOCK];
            for c in (0..full.len() as u64).filter(|c| [0, 1, 100, 300, 511].contains(&(c % BLOCK))) {
                let (s, damage) = read(&full[..c as usize]);
                let damage = damage.unwrap_or_else(|| panic!("{order:?} cut at {c}: no damage"));
                let kept = known_whole.iter().filter(|&&w| c >= w).count();
                assert_eq!(s[..], whole[..kept], "{order:?} cut at {c}: {}", damage.detail);
                assert_eq!(damage.kind, DamageKind::Cut, "{order:?} cut at {c}: {}", damage.detail);
                // A sample all in the file but not known whole is named as left out.
                if kept < 3 && c >= at[3 * kept + 2][2] {
                    assert_eq!(damage.left_out.as_deref(), Some(keys[kept]), "{order:?} cut at {c}");
                }
            }
        }
    }

    #[test]
    fn a_corrupt_header_ends_the_shard_with_the_samples_before_it() {
        // Python's `tarfile` stops listing at a header whose checksum does not match; GNU tar
        // says "Skipping to next header" and exits 2.
        let s = samples(&["000000000", "000000001", "000000002"], ["jpg", "json", "txt"]);
        let (full, at) = pax_shard(&members(&s));
        let (whole, _) = read(&full);
        // One bit of member 3's name (the first of sample 1), in its PAX or its own header; and
        // a bad size field in member 6's own header.
        // Member 6's size field set to `field`, its checksum mended.
        let sized = |field: &[u8; 12]| {
            let mut size = full.clone();
            size[at[6][1] as usize - 512 + 124..][..12].copy_from_slice(field);
            let sum = size[at[6][1] as usize - 512..][..512]
                .iter()
                .enumerate()
                .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u32::from(b) })
                .sum::<u32>();
            size[at[6][1] as usize - 512 + 148..][..8].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
            size
        };
        // Not octal; and base-256 -1 (all 0xff), which is no size, not a member past the end.
        // Member 3's name is not known: it might have been sample 0's, which is left out. Member
        // 6's header is checksummed, so its name is: it starts sample 2, so sample 1 is whole and
        // sample 2 is the one left out.
        for (b, member, what, kept, left_out) in [
            (flip(&full, at[3][0] + 3), 3, "checksum mismatch", 0, Some("000000000")),
            (flip(&full, at[3][1] - 512 + 3), 3, "checksum mismatch", 0, Some("000000000")),
            (sized(b"0000000zz00\0"), 6, "size", 2, Some("000000002")),
            (sized(&[0xff; 12]), 6, "no valid size field (negative)", 2, Some("000000002")),
        ] {
            let (s, damage) = read(&b);
            let d = damage.unwrap();
            assert_eq!((d.kind, d.member_index), (DamageKind::Corrupt, member), "{}", d.detail);
            assert!(d.detail.contains(what), "{}", d.detail);
            assert_eq!(s[..], whole[..kept], "{}", d.detail);
            assert_eq!(d.left_out.as_deref(), left_out, "{}", d.detail);
        }
        // A name from a whole PAX `path` record tells that member 3 starts another sample: that
        // one is left out, the one before it kept.
        let s = samples(&["café_0", "café_1"], ["jpg", "json", "txt"]);
        let (full, at) = pax_shard(&members(&s));
        let (whole, _) = read(&full);
        let (s, damage) = read(&flip(&full, at[3][1] - 512 + 3));
        let left_out = Some("café_1".to_owned());
        assert_eq!(
            (&s[..], damage.map(|d| (d.kind, d.left_out))),
            (&whole[..1], Some((DamageKind::Corrupt, left_out)))
        );
    }

    fn flip(bytes: &[u8], at: u64) -> Vec<u8> {
        let mut b = bytes.to_vec();
        b[at as usize] ^= 1;
        b
    }

    #[test]
    fn the_end_of_archive_marker() {
        let s = samples(&["a", "b"], ["jpg", "json", "txt"]);
        let (full, at) = pax_shard(&members(&s));
        let (whole, _) = read(&full);
        let end = at[5][2] as usize;
        // Both zero blocks: whole. More zeros (a tar padded to its record size): whole.
        assert_eq!(read(&[&full[..], &[0; 8192]].concat()), (whole.clone(), None));
        // One zero block, then the file ends: every sample is whole, the marker cut short.
        let (s, d) = read(&full[..end + 512]);
        assert_eq!((s, d.map(|d| (d.kind, d.left_out))), (whole.clone(), Some((DamageKind::Cut, None))));
        // One zero block, then more members: Python's `tarfile` stops at the block; that the
        // rest is not read is reported, and, since a header zeroed mid-shard looks the same, the
        // last sample is not known whole.
        let (s, d) = read(&[&full[..end + 512], &full[..]].concat());
        let d = d.unwrap();
        let last = whole.last().unwrap().key.clone();
        assert_eq!((&s[..], d.kind, d.left_out), (&whole[..whole.len() - 1], DamageKind::Corrupt, Some(last)));
        assert!(d.detail.contains("lone zero block"), "{}", d.detail);
        // An empty file.
        let (s, d) = read(b"");
        assert_eq!((s.len(), d.map(|d| (d.kind, d.member_index))), (0, Some((DamageKind::Cut, 0))));
    }

    #[test]
    fn repeated_members_are_listed_and_the_first_copy_kept() {
        // webdataset raises `ValueError: a.jpg: duplicate file name in tar file`; `tar -x` keeps
        // the last copy.
        let img: &[u8] = b"\xff\xd8";
        let (bytes, _) = pax_shard(&[
            ("a.jpg", img),
            ("a.txt", b"first"),
            ("a.json", b"{}"),
            ("a.jpg", img),
            ("a.txt", b"second"),
            ("a.json", b"{}"),
            ("b.jpg", img),
            ("b.txt", b"b one"),
            ("b.TXT", b"b two"),
        ]);
        let (s, cut) = read(&bytes);
        assert_eq!((s.len(), cut), (2, None));
        assert_eq!(s[0].members.len(), 3);
        assert_eq!(s[0].member("txt").unwrap().data.as_deref(), Some(&b"first"[..]));
        let repeats =
            |s: &Sample| s.repeats.iter().map(|r| (r.member_index, r.name.clone(), r.ext.clone())).collect::<Vec<_>>();
        let r = |i, name: &str, ext: &str| (i, name.as_bytes().to_vec(), ext.to_owned());
        assert_eq!(repeats(&s[0]), [r(3, "a.jpg", "jpg"), r(4, "a.txt", "txt"), r(5, "a.json", "json")]);
        assert_eq!(s[1].member("txt").unwrap().data.as_deref(), Some(&b"b one"[..]));
        assert_eq!(repeats(&s[1]), [r(8, "b.TXT", "txt")]);
    }
}
