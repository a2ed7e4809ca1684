//! Files: input path patterns, text inputs (plain or compressed; bzip2 decoded in parallel by
//! [`bzip2_blocks`]), Parquet inputs and output shards, tar shards, atomic writes, input
//! fingerprints, output-folder locks, and waiting on the rayon pool from inside it. Stages use these; nothing here
//! knows about stages.

pub mod bzip2_blocks;
pub mod lines;
pub mod parquet;
pub mod tar_shards;

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One path pattern or a list of them, as written in a pipeline file. Patterns may use `*`,
/// `?` and `[...]` (`shards/*.parquet`); matches are sorted so the order is stable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct PathPatterns(pub Vec<String>);

impl<'de> Deserialize<'de> for PathPatterns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PathPatterns;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a path string or a list of path strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<PathPatterns, E> {
                Ok(PathPatterns(vec![v.to_owned()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<PathPatterns, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(PathPatterns(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl PathPatterns {
    /// Expands the patterns into existing files, in pattern order then sorted matches.
    /// The error says which patterns matched nothing: every one of them, `; `-separated.
    pub fn expand(&self) -> std::result::Result<Vec<PathBuf>, String> {
        if self.0.is_empty() {
            return Err("no path given".into());
        }
        let mut out = Vec::new();
        let mut errors = Vec::new();
        for pat in &self.0 {
            match expand_one(pat) {
                Ok(files) => out.extend(files),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors.join("; "))
        }
    }
}

/// The files one pattern names: itself, or its sorted matches.
fn expand_one(pat: &str) -> std::result::Result<Vec<PathBuf>, String> {
    if !pat.contains(['*', '?', '[']) {
        let p = PathBuf::from(pat);
        return if p.exists() { Ok(vec![p]) } else { Err(format!("`{pat}` does not exist")) };
    }
    let mut matches = Vec::new();
    let mut hidden = false;
    for entry in glob::glob(pat).map_err(|e| format!("bad pattern `{pat}`: {e}"))? {
        // A folder the pattern goes through that cannot be read (no permission) would leave its
        // files out without a word.
        let path = entry.map_err(|e| {
            format!("`{pat}`: cannot read `{}` ({}), so its files would be left out", e.path().display(), e.error())
        })?;
        // As a shell's `*`: a hidden name (`.x.tsv`, macOS's `._00001.tar` beside each file
        // copied from a Mac) is matched only by a part of the pattern that starts with `.`.
        // (glob's own `require_literal_leading_dot` panics on a name that is not UTF-8.)
        if is_hidden_match(pat, &path) {
            hidden = true;
        } else {
            matches.push(path);
        }
    }
    // A file named with `[` (`shard[1].tsv`) is itself, not a pattern matching nothing.
    if matches.is_empty() && Path::new(pat).exists() {
        matches.push(PathBuf::from(pat));
    }
    if let Some(name) = unmatchable_name(pat) {
        return Err(format!(
            "`{pat}`: the file name `{name}` is not UTF-8, so no pattern can match it and its rows would be \
             left out; rename it"
        ));
    }
    if matches.is_empty() {
        return Err(if hidden {
            format!(
                "`{pat}` matches only hidden files (names that start with `.`); name them with a `.` in the pattern"
            )
        } else {
            format!("`{pat}` matches no file")
        });
    }
    matches.sort();
    Ok(matches)
}

/// Whether `path`, a match of `pat`, goes through a hidden name (one that starts with `.`) that
/// no part of the pattern starting with `.` matches: a wildcard matched it, where a shell's would
/// not.
fn is_hidden_match(pat: &str, path: &Path) -> bool {
    let dotted: Vec<glob::Pattern> = pat
        .split('/')
        .filter(|part| part.starts_with('.') && !matches!(*part, "." | ".."))
        .filter_map(|part| glob::Pattern::new(part).ok())
        .collect();
    path.components().any(|c| {
        let name = c.as_os_str().to_string_lossy();
        name.starts_with('.') && !matches!(&*name, "." | "..") && !dotted.iter().any(|p| p.matches(&name))
    })
}

/// A file of the pattern's folder whose name is not UTF-8 but, made text, matches the
/// pattern's last part: the glob crate cannot match such a name, and would leave it out
/// without a word. Only checked where the folder part has no wildcard.
fn unmatchable_name(pat: &str) -> Option<String> {
    let (dir, file) = pat.rsplit_once('/').unwrap_or((".", pat));
    let dir = if dir.is_empty() { "/" } else { dir };
    if dir.contains(['*', '?', '[']) {
        return None;
    }
    let file = glob::Pattern::new(file).ok()?;
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name();
        let lossy = name.to_string_lossy();
        (name.to_str().is_none() && file.matches(&lossy)).then(|| lossy.into_owned())
    })
}

/// The file name of `p` as text (what `sample_id`s and rejects record, so ids do not depend on
/// where a data set is mounted).
pub fn file_name(p: &Path) -> String {
    p.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so a
/// reader never sees a half-written file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    let mut f = File::create(&tmp).map_err(|e| Error::io("cannot create", &tmp, e))?;
    // Synced before it gets its name: a full disk can first show at the sync.
    let written = f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| Error::io("cannot write", &tmp, e));
    drop(f);
    let done =
        written.and_then(|_| std::fs::rename(&tmp, path).map_err(|e| Error::io("cannot rename into place", path, e)));
    if done.is_err() {
        // A full disk must not keep the half-written file too.
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Holds `dir` for this run of `curate run` or `curate train` (an advisory `flock`, released when
/// the handle drops or the process ends, killed or not), or says that another run has it. A file
/// system without locks (some network and cluster mounts) runs unlocked, with a note.
///
/// A lock held elsewhere is tried again for up to [`LOCK_PATIENCE`] before the run is refused:
/// a lock outlives its handle in a child process forked before the handle dropped, until that
/// child's `exec` closes it (a program that runs curate in-process and also starts processes,
/// as the tests do, drops a run's lock and takes it again for the next run).
pub fn lock_folder(dir: &Path) -> Result<std::fs::File> {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::File::open(dir).map_err(|e| Error::io("cannot open", dir, e))?;
    let started = std::time::Instant::now();
    // SAFETY: a valid open descriptor; `flock` touches no memory.
    let try_lock = || unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let mut held = try_lock();
    while held != 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
        && started.elapsed() < LOCK_PATIENCE
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
        held = try_lock();
    }
    if held != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(Error::data(format!(
                "another curate run is writing to `{}`; wait for it, or write to another `output_dir`",
                dir.display()
            )));
        }
        say!("note: cannot lock `{}` ({e}): make sure no other run writes there at the same time", dir.display());
    }
    Ok(f)
}

/// How long [`lock_folder`] waits for a lock held elsewhere.
pub const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// `dir/name.ext` -> `dir/.name.ext.tmp`
pub fn tmp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// The next message on `rx`, or `None` once every sender is gone. On a thread of a rayon pool
/// (inside `install`, or a job), jobs this thread is waiting for may be queued behind it: it
/// runs pool work while it waits instead of blocking, which with one thread would wait forever.
pub fn recv_in_pool<T>(rx: &std::sync::mpsc::Receiver<T>) -> Option<T> {
    use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
    const NAP: std::time::Duration = std::time::Duration::from_micros(200);
    if rayon::current_thread_index().is_none() {
        return rx.recv().ok();
    }
    loop {
        match rx.try_recv() {
            Ok(t) => return Some(t),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        if rayon::yield_now() != Some(rayon::Yield::Executed) {
            match rx.recv_timeout(NAP) {
                Ok(t) => return Some(t),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }
}

/// Content fingerprint of input files: xxh3-128 over (name, length, bytes) of each file. The
/// name is what the data sees of it (sample ids are `file#row`): a file's own name, or a path
/// relative to the folder given; not the path as written, so `data/x.tsv`, `./data/x.tsv` and
/// a copy elsewhere fingerprint alike. Not cryptographic; it identifies which bytes a data set
/// was built from.
pub fn fingerprint(paths: &[PathBuf]) -> Result<String> {
    fingerprint_with(paths, &[])
}

/// [`fingerprint`], with `also` first: what else the data sees of its inputs (a table's folders,
/// where its image paths start). With nothing in `also`, the same as [`fingerprint`].
pub fn fingerprint_with(paths: &[PathBuf], also: &[String]) -> Result<String> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for a in also {
        h.update(a.as_bytes());
        h.update(b"\0");
    }
    let mut buf = vec![0u8; 1 << 20];
    for p in paths {
        walk_files(p, &mut |f| {
            h.update(input_name(p, f).as_bytes());
            hash_file(&mut h, f, &mut buf)
        })?;
    }
    Ok(format!("xxh3-128:{:032x}", h.digest128()))
}

/// Adds a file given directly to a fingerprint as [`fingerprint`] does: its name, length and
/// bytes (an image folder's words list, beside the folder's listing).
pub fn hash_named_file(h: &mut xxhash_rust::xxh3::Xxh3, f: &Path) -> Result<()> {
    h.update(input_name(f, f).as_bytes());
    hash_file(h, f, &mut vec![0u8; 1 << 20])
}

/// The name a fingerprint gives file `f` of input `root`: `f`'s path under the folder `root`,
/// or the file name of `root` itself; NUL-terminated so that names and bytes cannot run into
/// each other.
fn input_name(root: &Path, f: &Path) -> String {
    let rel = match f.strip_prefix(root) {
        Ok(r) if !r.as_os_str().is_empty() => r.to_string_lossy().into_owned(),
        _ => f.file_name().map_or_else(|| f.to_string_lossy().into_owned(), |n| n.to_string_lossy().into_owned()),
    };
    rel + "\0"
}

/// Adds `f`'s length and bytes to `h`.
fn hash_file(h: &mut xxhash_rust::xxh3::Xxh3, f: &Path, buf: &mut [u8]) -> Result<()> {
    let mut file = File::open(f).map_err(|e| Error::io("cannot open", f, e))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    h.update(&len.to_le_bytes());
    loop {
        let n = file.read(buf).map_err(|e| Error::io("cannot read", f, e))?;
        if n == 0 {
            return Ok(());
        }
        h.update(&buf[..n]);
    }
}

/// What is wrong with `p` where a `kind` ("file", "folder") was expected: "does not exist", or
/// "is not a file" when something else is there. For messages: "`x` does not exist".
pub fn not_a(p: &Path, kind: &str) -> String {
    if p.exists() {
        format!("is not a {kind}")
    } else {
        "does not exist".to_owned()
    }
}

/// The files a stage reads from `p`: `p` itself if it is a file, else those of `names` that the
/// folder `p` has (a model folder's `config.json`, `model.safetensors`, ...). For the stamps of
/// a run's checkpoints; nothing else in the folder is looked at (an evaluation's output there,
/// say).
pub fn model_files(p: &Path, names: &[&str]) -> Vec<PathBuf> {
    if !p.is_dir() {
        return vec![p.to_owned()];
    }
    names.iter().map(|n| p.join(n)).filter(|f| f.is_file()).collect()
}

/// Calls `visit` on every file under `p` (itself if a file), in sorted order (by name within
/// each folder, depth first). Holds the listing of one folder at a time per level, not of the
/// whole tree.
fn walk_files(p: &Path, visit: &mut dyn FnMut(&Path) -> Result<()>) -> Result<()> {
    if !p.is_dir() {
        return visit(p);
    }
    let mut entries: Vec<(PathBuf, Option<std::fs::FileType>)> = std::fs::read_dir(p)
        .map_err(|e| Error::io("cannot list", p, e))?
        .filter_map(|e| e.ok())
        .map(|e| (e.path(), e.file_type().ok()))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (path, kind) in entries {
        // The listing's type, without a look at the file; a link counts as what it points to.
        let dir = match kind {
            Some(k) if k.is_symlink() => path.is_dir(),
            Some(k) => k.is_dir(),
            None => path.is_dir(),
        };
        if dir {
            walk_files(&path, visit)?;
        } else {
            visit(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_left_in_a_forked_child_for_a_moment_is_waited_for() {
        use std::os::unix::io::{AsRawFd, FromRawFd};
        let dir = tempfile::tempdir().unwrap();
        let lock = lock_folder(dir.path()).unwrap();
        // A child forked while the lock was held has a copy of its descriptor, which holds the
        // lock after the run drops its own, until the child's `exec` closes it.
        // SAFETY: `dup` of a valid descriptor; the copy is owned by `child` alone.
        let child = unsafe { std::fs::File::from_raw_fd(libc::dup(lock.as_raw_fd())) };
        drop(lock);
        let exec = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(30));
            drop(child);
        });
        let again = lock_folder(dir.path());
        exec.join().unwrap();
        assert!(again.is_ok(), "{:?}", again.err());
        // A lock held on (another run) is refused once the patience runs out.
        let started = std::time::Instant::now();
        let e = lock_folder(dir.path()).unwrap_err().to_string();
        assert!(e.contains("another curate run is writing to"), "{e}");
        assert!(started.elapsed() >= LOCK_PATIENCE);
    }

    #[test]
    fn fingerprint_sees_names_and_bytes_not_how_the_path_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(a.join("sub")).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("x.tsv"), b"dog\thttp://u\n").unwrap();
        std::fs::write(b.join("x.tsv"), b"dog\thttp://u\n").unwrap();
        let f = |p: PathBuf| fingerprint(&[p]).unwrap();
        let first = f(a.join("x.tsv"));
        assert!(first.starts_with("xxh3-128:"));
        // Another spelling of the path, or a copy in another folder: the same bytes and name.
        assert_eq!(f(a.join("sub/../x.tsv")), first);
        assert_eq!(f(a.join(".").join("x.tsv")), first);
        assert_eq!(f(b.join("x.tsv")), first);
        // Another name (the sample ids would differ) or other bytes: another fingerprint.
        std::fs::rename(b.join("x.tsv"), b.join("y.tsv")).unwrap();
        assert_ne!(f(b.join("y.tsv")), first);
        std::fs::write(b.join("x.tsv"), b"cat\thttp://u\n").unwrap();
        assert_ne!(f(b.join("x.tsv")), first);
        // A folder input: names relative to it.
        std::fs::write(a.join("sub/z.tsv"), b"z").unwrap();
        std::fs::create_dir_all(b.join("c/sub")).unwrap();
        std::fs::copy(a.join("x.tsv"), b.join("c/x.tsv")).unwrap();
        std::fs::copy(a.join("sub/z.tsv"), b.join("c/sub/z.tsv")).unwrap();
        assert_eq!(f(a.clone()), f(b.join("c")));
    }

    #[test]
    fn model_files_are_the_named_files_a_stage_reads_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir_all(model.join("eval")).unwrap();
        for f in ["config.json", "model.safetensors", "eval/metrics.json", "notes.txt"] {
            std::fs::write(model.join(f), b"x").unwrap();
        }
        // A loop of links in the folder is never walked.
        std::os::unix::fs::symlink(&model, model.join("loop")).unwrap();
        let names = ["config.json", "model.safetensors", "tokenizer.json"];
        assert_eq!(model_files(&model, &names), [model.join("config.json"), model.join("model.safetensors")]);
        let file = model.join("model.safetensors");
        assert_eq!(model_files(&file, &names), std::slice::from_ref(&file));
    }

    #[test]
    fn patterns_expand_sorted_and_report_misses() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["b.tsv", "a.tsv", "c.txt"] {
            std::fs::write(dir.path().join(n), "x").unwrap();
        }
        let pat = format!("{}/*.tsv", dir.path().display());
        let got = PathPatterns(vec![pat]).expand().unwrap();
        assert_eq!(got.iter().map(|p| file_name(p)).collect::<Vec<_>>(), ["a.tsv", "b.tsv"]);
        let miss = PathPatterns(vec![format!("{}/*.parquet", dir.path().display())]).expand().unwrap_err();
        assert!(miss.contains("matches no file"));
        assert!(PathPatterns(vec!["/nonexistent/x".into()]).expand().unwrap_err().contains("does not exist"));
        // Every miss is named, not only the first.
        let a = dir.path().join("a.tsv").display().to_string();
        let both = PathPatterns(vec!["/nonexistent/x".into(), a, format!("{}/*.csv", dir.path().display())]);
        let err = both.expand().unwrap_err();
        assert!(
            err.starts_with("`/nonexistent/x` does not exist; `") && err.ends_with("*.csv` matches no file"),
            "{err}"
        );
    }

    #[test]
    fn patterns_keep_names_with_brackets_and_refuse_names_no_pattern_matches() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("shard[1].tsv"), "x").unwrap();
        let literal = format!("{}/shard[1].tsv", dir.path().display());
        assert_eq!(PathPatterns(vec![literal]).expand().unwrap().len(), 1, "the file itself");
        // `caf\xe9.tsv` (Latin-1) would match `*.tsv` but the glob crate skips it: refused, named.
        std::fs::write(dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9.tsv")), "x").unwrap();
        let err = PathPatterns(vec![format!("{}/*.tsv", dir.path().display())]).expand().unwrap_err();
        assert!(err.contains("the file name `caf\u{FFFD}.tsv` is not UTF-8"), "{err}");
        // A pattern it does not match is not concerned.
        assert!(PathPatterns(vec![format!("{}/s*.tsv", dir.path().display())]).expand().is_ok());
    }

    #[test]
    fn patterns_skip_hidden_names_as_a_shell_does_and_refuse_folders_they_cannot_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        for n in ["a.tar", "._a.tar", ".b.tar"] {
            std::fs::write(dir.path().join(n), "x").unwrap();
        }
        let names =
            |pat: String| PathPatterns(vec![pat]).expand().map(|v| v.iter().map(|p| file_name(p)).collect::<Vec<_>>());
        assert_eq!(names(format!("{d}/*.tar")).unwrap(), ["a.tar"]);
        assert_eq!(names(format!("{d}/.*.tar")).unwrap(), ["._a.tar", ".b.tar"]);
        // (The temporary folder's own name starts with `.`: a literal part of the pattern.)
        let err = names(format!("{d}/?b.tar")).unwrap_err();
        assert!(err.contains("matches only hidden files (names that start with `.`)"), "{err}");
        // A folder the pattern walks through but cannot read: refused, not left out. (Root
        // reads it anyway; there the part below cannot be checked.)
        for sub in ["x", "y"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
            std::fs::write(dir.path().join(sub).join("p.tsv"), "x").unwrap();
        }
        let locked = dir.path().join("y");
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let readable = std::fs::read_dir(&locked).is_ok();
        let got = names(format!("{d}/*/p.tsv"));
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        if readable {
            assert_eq!(got.unwrap(), ["p.tsv", "p.tsv"]);
        } else {
            let err = got.unwrap_err();
            assert!(err.contains(&format!("cannot read `{}`", locked.display())), "{err}");
            assert!(err.contains("so its files would be left out"), "{err}");
        }
    }

    #[test]
    fn atomic_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.json");
        write_atomic(&p, b"{}").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"{}");
        assert!(!tmp_path(&p).exists());
    }
}
