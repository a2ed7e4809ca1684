//! A killed `curate run` goes on from its last checkpoint: the real binary, killed (SIGKILL) by
//! its own test hook right after its Nth checkpoint, then run again. The resumed output must be
//! byte-identical to an uninterrupted run's; a changed pipeline, input or shard, or
//! `--restart`, starts over.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Rows of the generated input, in files of `FILE_ROWS`: the reader makes a chunk of each (a
/// TSV chunk is up to 8 MB of one file), so that the checkpoints, every 15,000 output rows,
/// fall inside the first, second, ... chunk.
const ROWS: usize = 70_000;
const FILE_ROWS: usize = 14_000;

/// CC-format TSV files of `ROWS` lines in all with every kind of reject: lines with three fields
/// (reader `wrong_field_count`), empty captions (reader `empty_caption`), and captions of
/// stopwords only, which the BoW cascade empties (`empty_after_bow`, when deformed). Returns
/// the files.
fn write_input(dir: &Path) -> Vec<PathBuf> {
    let words = [
        "dog", "cat", "park", "red", "beach", "tree", "runs", "city", "car", "boat", "sky", "girl", "man", "ball",
        "river", "sunset", "house", "bird", "flower", "road", "the", "a", "of", "in", "on", "with", "and", "is",
    ];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut text = String::with_capacity(ROWS * 48);
    for i in 0..ROWS {
        let caption = if i % 89 == 5 {
            "the of and a".to_owned()
        } else if i % 1231 == 7 {
            " ".to_owned()
        } else {
            let n = 3 + next() % 9;
            (0..n).map(|_| words[(next() % words.len() as u64) as usize]).collect::<Vec<_>>().join(" ")
        };
        if i % 997 == 3 {
            text.push_str(&format!("{caption}\thttp://img/{i}.jpg\textra\n"));
        } else {
            text.push_str(&format!("{caption}\thttp://img/{i}.jpg\n"));
        }
    }
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut files = Vec::new();
    for (k, part) in lines.chunks(FILE_ROWS).enumerate() {
        let path = dir.join(format!("captions{k}.tsv"));
        std::fs::write(&path, part.concat()).unwrap();
        files.push(path);
    }
    files
}

struct Case {
    dir: tempfile::TempDir,
    pipeline: PathBuf,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        let inputs: Vec<String> =
            write_input(dir.path()).iter().map(|p| format!("{:?}", p.to_string_lossy())).collect();
        let pipeline = dir.path().join("resume.toml");
        let toml = format!(
            "output_dir = \"out\"\nseed = 3\n\n[[stage]]\ntype = \"read_cc_tsv\"\npath = [{}]\n\n[[stage]]\ntype = \"bow\"\nrm_top_freq = 3\n\n[[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 15000\n",
            inputs.join(", ")
        );
        std::fs::write(&pipeline, toml).unwrap();
        Case { dir, pipeline }
    }

    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `curate run` into `out/<name>` with `args`, killed after checkpoint `kill_after`;
    /// returns whether it exited well and its stderr.
    fn run(&self, name: &str, kill_after: Option<usize>, args: &[&str]) -> (bool, String) {
        self.run_file(&self.pipeline, name, kill_after, args)
    }

    /// [`Case::run`] of another pipeline file.
    fn run_file(&self, pipeline: &Path, name: &str, kill_after: Option<usize>, args: &[&str]) -> (bool, String) {
        let hook = kill_after.map(|n| ("CURATE_KILL_AFTER_CHECKPOINTS", n));
        self.run_hooked(pipeline, name, hook, args)
    }

    /// [`Case::run_file`] with one of the test hooks (`CURATE_*_AFTER_CHECKPOINTS`) set to `N`.
    fn run_hooked(&self, pipeline: &Path, name: &str, hook: Option<(&str, usize)>, args: &[&str]) -> (bool, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_curate"));
        cmd.arg("run").arg(pipeline).arg("--set").arg(format!("output_dir={:?}", self.out(name)));
        cmd.args(args).env("NO_COLOR", "1");
        cmd.env_remove("CURATE_KILL_AFTER_CHECKPOINTS").env_remove("CURATE_FAIL_AFTER_CHECKPOINTS");
        if let Some((var, n)) = hook {
            cmd.env(var, n.to_string());
        }
        let out = cmd.output().expect("curate runs");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Every file under `dir` by relative path: its bytes, with `dir` itself written as `<out>` in
/// the text files (config, report), and `manifest.json` without what differs between runs
/// (timings) or says how this run came about (`resumed`).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let mut bytes = std::fs::read(&p).unwrap();
            if !rel.ends_with(".parquet") {
                let text = String::from_utf8(bytes).unwrap();
                bytes = text.replace(&*dir.to_string_lossy(), "<out>").into_bytes();
            }
            if rel == "manifest.json" {
                let mut m: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let m = m.as_object_mut().unwrap();
                m.remove("timings_s");
                m.remove("resumed");
                bytes = serde_json::to_vec_pretty(m).unwrap();
            }
            out.insert(rel, bytes);
        }
    }
    out
}

/// Asserts that `got` and `want` hold the same files with the same bytes (naming the first that
/// differs, not printing bytes).
fn same_files(got: &BTreeMap<String, Vec<u8>>, want: &BTreeMap<String, Vec<u8>>, case: &str) {
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{case}");
    for (file, bytes) in want {
        assert!(got[file] == *bytes, "{case}: `{file}` differs");
    }
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

fn shards(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("part-"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_killed_run_resumes_to_the_same_bytes_as_an_uninterrupted_one() {
    let case = Case::new();
    let (ok, _) = case.run("whole", None, &[]);
    assert!(ok);
    let whole = files(&case.out("whole"));
    let m = manifest(&case.out("whole"));
    assert_eq!(m["resumed"], serde_json::Value::Null);
    // The input has rejects of the reader and of the BoW stage, and 4+ data shards.
    let reasons = m["rejects_by_reason"].as_object().unwrap();
    for r in ["read_cc_tsv/wrong_field_count", "read_cc_tsv/empty_caption", "bow/empty_after_bow"] {
        assert!(reasons.get(r).and_then(|n| n.as_u64()).unwrap_or(0) > 0, "{r}: {reasons:?}");
    }
    // A checkpoint at each full shard: 4 at least.
    let full = m["data_shards"].as_array().unwrap().iter().filter(|s| s["rows"] == 15000).count();
    assert!(full >= 4, "{full} full shards");
    assert!(!case.out("whole").join(".curate-checkpoint").exists(), "a finished run removes its checkpoint");

    // Killed after its 1st, 2nd, ... checkpoint: inside its 2nd, 3rd, ... chunk.
    for kill_after in 1..=full {
        let name = format!("killed{kill_after}");
        let out = case.out(&name);
        let (ok, _) = case.run(&name, Some(kill_after), &[]);
        assert!(!ok, "killed");
        assert!(!out.join("manifest.json").exists(), "a killed run has no manifest");
        // A digest line, then the JSON.
        let text = std::fs::read_to_string(out.join(".curate-checkpoint")).unwrap();
        let checkpoint: serde_json::Value = serde_json::from_str(text.split_once('\n').unwrap().1).unwrap();
        assert_eq!(checkpoint["chunk"], kill_after, "{kill_after}");
        assert!(checkpoint["chunk_split"].is_null(), "no model stage, no cut: {checkpoint}");
        assert!(checkpoint["rows_into_chunk"].as_u64().unwrap() > 0, "{kill_after}");
        assert_eq!(shards(&out.join("data")).len(), kill_after, "its finished shards stay");
        assert_eq!(shards(&out.join("rejects")).len(), kill_after, "a rejects shard ends with each data shard");

        let (ok, stderr) = case.run(&name, None, &[]);
        assert!(ok, "{stderr}");
        assert!(stderr.contains("resuming the run that stopped"), "{stderr}");
        let resumed = manifest(&out);
        assert_eq!(resumed["resumed"]["data_shards_kept"], kill_after, "{resumed}");
        same_files(&files(&out), &whole, &format!("killed after checkpoint {kill_after}"));
    }
}

#[test]
fn a_changed_pipeline_input_or_shard_or_restart_starts_over() {
    let case = Case::new();
    let kill = |name: &str| {
        let (ok, _) = case.run(name, Some(2), &[]);
        assert!(!ok);
        assert!(case.out(name).join(".curate-checkpoint").exists());
    };
    let starts_over = |name: &str, args: &[&str], why: &str| {
        let (ok, stderr) = case.run(name, None, args);
        assert!(ok, "{stderr}");
        assert!(!stderr.contains("resuming"), "{name}: {stderr}");
        assert!(stderr.contains(why), "{name}: wanted `{why}` in: {stderr}");
        assert_eq!(manifest(&case.out(name))["resumed"], serde_json::Value::Null);
        assert!(!case.out(name).join(".curate-checkpoint").exists());
    };

    // Other settings: the hash differs.
    kill("settings");
    starts_over("settings", &["--set", "bow.rm_top_freq=4"], "the pipeline's settings changed since");
    let (ok, _) = case.run("settings_fresh", None, &["--set", "bow.rm_top_freq=4"]);
    assert!(ok);
    same_files(&files(&case.out("settings")), &files(&case.out("settings_fresh")), "other settings");

    // A kept shard deleted, or overwritten with as many zeros.
    kill("shard");
    std::fs::remove_file(case.out("shard").join("data/part-00001.parquet")).unwrap();
    starts_over("shard", &[], "is gone");
    kill("zeros");
    let shard = case.out("zeros").join("rejects/part-00000.parquet");
    std::fs::write(&shard, vec![0u8; std::fs::metadata(&shard).unwrap().len() as usize]).unwrap();
    starts_over("zeros", &[], "is no longer a readable Parquet file");

    // The checkpoint edited by hand (a chunk further on).
    kill("edited");
    let path = case.out("edited").join(".curate-checkpoint");
    let text = std::fs::read_to_string(&path).unwrap().replace("\"chunk\":2", "\"chunk\":4");
    std::fs::write(&path, text).unwrap();
    starts_over("edited", &[], "it was changed or damaged since it was saved");

    // A checkpoint edited and signed again (its digest line made anew), naming a chunk past the
    // input's end: the stream cannot match it, so the run fails, removes its output and the
    // checkpoint, and the next run starts over.
    kill("signed");
    let path = case.out("signed").join(".curate-checkpoint");
    let text = std::fs::read_to_string(&path).unwrap();
    let json = text.split_once('\n').unwrap().1.replace("\"chunk\":2", "\"chunk\":99");
    let digest = format!("xxh3-64:{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes()));
    std::fs::write(&path, format!("{digest}\n{json}")).unwrap();
    let (ok, stderr) = case.run("signed", None, &[]);
    assert!(!ok && stderr.contains("does not match the stream (it ends before chunk 100)"), "{stderr}");
    assert!(shards(&case.out("signed").join("data")).is_empty() && !path.exists());
    starts_over("signed", &[], "");

    // `--restart`, with nothing else changed.
    kill("restart");
    starts_over("restart", &["--restart"], "--restart: the checkpoint of a killed run");

    // The same settings under another pipeline name (the file's, without a `name`): the shards'
    // metadata would differ.
    kill("renamed");
    let renamed = case.dir.path().join("renamed.toml");
    std::fs::copy(&case.pipeline, &renamed).unwrap();
    let (ok, stderr) = case.run_file(&renamed, "renamed", None, &[]);
    assert!(ok && stderr.contains("it is of pipeline `resume`, not `renamed`"), "{stderr}");
    assert!(!stderr.contains("resuming"), "{stderr}");

    // An input's content changed, its size and modification time kept: the resumed run finds
    // another fingerprint at its end and fails, removing its output; the next run starts over.
    kill("content");
    let text = std::fs::read_to_string(case.out("content").join(".curate-checkpoint")).unwrap();
    let saved: serde_json::Value = serde_json::from_str(text.split_once('\n').unwrap().1).unwrap();
    assert!(saved["input_fingerprint"].is_string(), "the fingerprint was known by the 2nd checkpoint");
    let input = case.dir.path().join("captions1.tsv");
    let (bytes, modified) = (std::fs::read(&input).unwrap(), std::fs::metadata(&input).unwrap().modified().unwrap());
    let swapped: Vec<u8> = bytes.iter().map(|&b| if b == b'd' { b'D' } else { b }).collect();
    std::fs::write(&input, &swapped).unwrap();
    std::fs::File::options().write(true).open(&input).unwrap().set_modified(modified).unwrap();
    let (ok, stderr) = case.run("content", None, &[]);
    assert!(!ok && stderr.contains("the input's content changed since the killed run"), "{stderr}");
    assert!(shards(&case.out("content").join("data")).is_empty());
    assert!(!case.out("content").join(".curate-checkpoint").exists());
    // The same change between two kills: the resumed run, killed in turn, keeps in its own
    // checkpoint the fingerprint of the content the kept shards came from, so the run after it
    // still finds the change.
    std::fs::write(&input, &bytes).unwrap();
    std::fs::File::options().write(true).open(&input).unwrap().set_modified(modified).unwrap();
    kill("chain");
    let saved = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(case.out(name).join(".curate-checkpoint")).unwrap();
        serde_json::from_str(text.split_once('\n').unwrap().1).unwrap()
    };
    let first = saved("chain");
    std::fs::write(&input, &swapped).unwrap();
    std::fs::File::options().write(true).open(&input).unwrap().set_modified(modified).unwrap();
    let (ok, stderr) = case.run("chain", Some(1), &[]);
    assert!(!ok && stderr.contains("resuming"), "{stderr}");
    let second = saved("chain");
    assert!(second["chunk"].as_u64() > first["chunk"].as_u64(), "the second run went further: {second}");
    assert_eq!(second["input_fingerprint"], first["input_fingerprint"]);
    let (ok, stderr) = case.run("chain", None, &[]);
    assert!(!ok && stderr.contains("the input's content changed since the killed run"), "{stderr}");
    std::fs::write(&input, &bytes).unwrap();
    std::fs::File::options().write(true).open(&input).unwrap().set_modified(modified).unwrap();

    // A checkpoint saved before the fingerprint was known (here: its fingerprint taken out, and
    // the checkpoint signed again) cannot tell such a change: not resumed.
    kill("unknown");
    let path = case.out("unknown").join(".curate-checkpoint");
    let mut json = saved("unknown");
    json["input_fingerprint"] = serde_json::Value::Null;
    let json = serde_json::to_string(&json).unwrap();
    let digest = format!("xxh3-64:{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes()));
    std::fs::write(&path, format!("{digest}\n{json}")).unwrap();
    starts_over("unknown", &[], "it was saved before the input's fingerprint was taken");

    // A checkpoint of a curate from before the row digests (here: its digest taken out, and
    // the checkpoint signed again): not resumed, and said why.
    kill("older");
    let path = case.out("older").join(".curate-checkpoint");
    let mut json = saved("older");
    json.as_object_mut().unwrap().remove("read_digest").expect("saved with a row digest");
    let json = serde_json::to_string(&json).unwrap();
    let digest = format!("xxh3-64:{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes()));
    std::fs::write(&path, format!("{digest}\n{json}")).unwrap();
    starts_over("older", &[], "it holds no digest of the rows read (saved by an earlier curate)");

    // Killed before its first checkpoint: its shards go, and the run says why.
    kill("none");
    std::fs::remove_file(case.out("none").join(".curate-checkpoint")).unwrap();
    starts_over("none", &[], "holds shards of a run that stopped before its first checkpoint");

    // The input rewritten (other size and time): last, since it changes the input for all.
    kill("input");
    let input = case.dir.path().join("captions3.tsv");
    let mut text = std::fs::read_to_string(&input).unwrap();
    text.push_str("one more caption\thttp://img/x.jpg\n");
    std::fs::write(&input, text).unwrap();
    starts_over("input", &[], "the input files, or the stages' model and table files, changed since");
}

#[test]
fn a_failed_run_keeps_its_last_checkpoint_and_the_next_run_goes_on_from_it() {
    let case = Case::new();
    let (ok, _) = case.run("whole", None, &[]);
    assert!(ok);
    // The writer fails right after its 2nd checkpoint, as on a full disk: the shards that
    // checkpoint lists stay (2 data, 2 rejects), the rest go.
    let out = case.out("failed");
    let (ok, stderr) = case.run_hooked(&case.pipeline, "failed", Some(("CURATE_FAIL_AFTER_CHECKPOINTS", 2)), &[]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("a write failed after checkpoint 2"), "{stderr}");
    assert!(stderr.contains("last checkpoint and its 2 data and 2 rejects shard(s) stay"), "{stderr}");
    assert_eq!((shards(&out.join("data")).len(), shards(&out.join("rejects")).len()), (2, 2));
    assert!(out.join(".curate-checkpoint").exists() && !out.join("manifest.json").exists());
    // The resumed run fails too, at its own 1st checkpoint (the output's 3rd): 3 and 3 stay.
    let (ok, stderr) = case.run_hooked(&case.pipeline, "failed", Some(("CURATE_FAIL_AFTER_CHECKPOINTS", 1)), &[]);
    assert!(!ok && stderr.contains("resuming the run"), "{stderr}");
    assert!(stderr.contains("last checkpoint and its 3 data and 3 rejects shard(s) stay"), "{stderr}");
    assert_eq!((shards(&out.join("data")).len(), shards(&out.join("rejects")).len()), (3, 3));
    // Run again (the cause fixed): it goes on, to the same bytes as the uninterrupted run.
    let (ok, stderr) = case.run("failed", None, &[]);
    assert!(ok && stderr.contains("resuming the run"), "{stderr}");
    same_files(&files(&out), &files(&case.out("whole")), "after failures at checkpoints 2 and 3");
}

#[test]
fn an_image_added_to_a_synset_folder_since_the_kill_starts_over() {
    // ImageNet-21k's root changes only when a synset folder comes or goes; its synset folders
    // change when an image (or anything else) is added to one. A resumed run that missed that
    // would shift every later row by one, writing one twice.
    let case = Case::new();
    let root = case.dir.path().join("imagenet");
    for synset in ["n00000001", "n00000002", "n00000003"] {
        std::fs::create_dir_all(root.join(synset)).unwrap();
        for i in 0..1500 {
            std::fs::write(root.join(synset).join(format!("{synset}_{i:05}.JPEG")), b"").unwrap();
        }
    }
    let pipeline = case.dir.path().join("imagenet.toml");
    let toml = format!(
        "output_dir = \"out\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n\n[[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 1000\n",
        root.to_string_lossy()
    );
    std::fs::write(&pipeline, toml).unwrap();
    let (ok, _) = case.run_file(&pipeline, "killed", Some(1), &[]);
    assert!(!ok, "killed");
    assert!(case.out("killed").join(".curate-checkpoint").exists());
    std::thread::sleep(std::time::Duration::from_millis(30)); // file times move by ticks
    std::fs::create_dir(root.join("n00000001/0_empty_folder")).unwrap();
    let (ok, stderr) = case.run_file(&pipeline, "killed", None, &[]);
    assert!(ok, "{stderr}");
    assert!(!stderr.contains("resuming"), "{stderr}");
    assert!(stderr.contains("the input files, or the stages' model and table files, changed since"), "{stderr}");
    let (ok, _) = case.run_file(&pipeline, "fresh", None, &[]);
    assert!(ok);
    let m = manifest(&case.out("fresh"));
    assert_eq!(
        (m["rows"]["written"].as_u64(), m["rejects_by_reason"]["read_imagenet21k/not_a_file"].as_u64()),
        (Some(4500), Some(1))
    );
    same_files(&files(&case.out("killed")), &files(&case.out("fresh")), "after a folder was added");
}

/// Tables in `dir`, `files` CSV files of 6,000 rows each (a chunk each), whose rows name the
/// images of `dir/images`: table `k` names `img{200k}.jpg` .. `img{200k + 199}.jpg`, each 30
/// times. Returns the pipeline file, with a BoW stage when `bow` is set.
fn table_with_images(dir: &Path, files: usize, bow: bool) -> PathBuf {
    std::fs::create_dir_all(dir.join("images")).unwrap();
    for i in 0..200 * files {
        std::fs::write(dir.join(format!("images/img{i}.jpg")), b"x").unwrap();
    }
    let words = ["dog", "cat", "park", "red", "beach", "tree", "sky"];
    for k in 0..files {
        let mut csv = String::from("sample_id,caption,url,path\n");
        for i in k * 6000..(k + 1) * 6000 {
            let caption = format!("a {} in the {} {i}", words[i % 7], words[(i / 7) % 7]);
            csv.push_str(&format!("id{i},{caption},http://x/{i}.jpg,img{}.jpg\n", 200 * k + i % 200));
        }
        std::fs::write(dir.join(format!("t{k}.csv")), csv).unwrap();
    }
    let bow = if bow { "[[stage]]\ntype = \"bow\"\nrm_top_freq = 2\n\n" } else { "" };
    let toml = format!(
        "output_dir = \"out\"\n[[stage]]\ntype = \"read_table\"\npath = {:?}\n\
         columns = {{ sample_id = \"sample_id\", caption = \"caption\", url = \"url\", path = \"path\" }}\n\
         image_root = {:?}\n\n{bow}[[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 1000\n",
        format!("{}/t*.csv", dir.display()),
        dir.join("images").to_string_lossy()
    );
    let pipeline = dir.join("table.toml");
    std::fs::write(&pipeline, toml).unwrap();
    pipeline
}

#[test]
fn an_image_file_that_came_back_since_the_kill_fails_the_resume_instead_of_shifting_rows() {
    // `check_files` looks image files up; no fingerprint covers them. An image missing while
    // the killed run read its table (a `missing_file` reject) and back since: the resumed
    // stream would go on by row counts one row off, writing one row twice and losing another.
    let case = Case::new();
    let pipeline = table_with_images(case.dir.path(), 1, false);
    let image = case.dir.path().join("images/img7.jpg");
    std::fs::remove_file(&image).unwrap();
    let (ok, _) = case.run_file(&pipeline, "killed", Some(1), &[]);
    assert!(!ok, "killed");
    std::fs::write(&image, b"x").unwrap();
    resume_fails_then_starts_over(&case, &pipeline, "its rows up to chunk 1 are not those the killed run read");
    assert_eq!(manifest(&case.out("fresh"))["rows"]["written"], 6000);
}

/// The resumption of the run killed in `out/killed` fails saying `why` and drops the
/// checkpoint; the next run starts over and writes what a run from the start (`out/fresh`)
/// writes.
fn resume_fails_then_starts_over(case: &Case, pipeline: &Path, why: &str) {
    let (ok, stderr) = case.run_file(pipeline, "killed", None, &[]);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("resuming"), "{stderr}");
    assert!(stderr.contains(why), "{stderr}");
    assert!(!case.out("killed").join(".curate-checkpoint").exists());
    let (ok, stderr) = case.run_file(pipeline, "killed", None, &[]);
    assert!(ok && !stderr.contains("resuming"), "{stderr}");
    let (ok, _) = case.run_file(pipeline, "fresh", None, &[]);
    assert!(ok);
    same_files(&files(&case.out("killed")), &files(&case.out("fresh")), why);
}

#[test]
fn an_image_file_gone_past_the_kept_chunks_fails_a_resume_whose_stages_learned_from_it() {
    // The change lies in the last table, past every chunk the killed run wrote: those read as
    // before, but the BoW stage's fit pass (its base statistics) saw another input, and the
    // kept shards show what it learned.
    let case = Case::new();
    let pipeline = table_with_images(case.dir.path(), 3, true);
    let (ok, _) = case.run_file(&pipeline, "killed", Some(1), &[]);
    assert!(!ok, "killed");
    let text = std::fs::read_to_string(case.out("killed").join(".curate-checkpoint")).unwrap();
    let checkpoint: serde_json::Value = serde_json::from_str(text.split_once('\n').unwrap().1).unwrap();
    assert_eq!(checkpoint["chunk"], 0, "killed in the first table");
    std::fs::remove_file(case.dir.path().join("images/img407.jpg")).unwrap();
    resume_fails_then_starts_over(&case, &pipeline, "the fit passes read other rows than the killed run's did");
    assert_eq!(manifest(&case.out("fresh"))["rejects_by_reason"]["read_table/missing_file"], 30);
}

#[test]
fn an_image_file_gone_between_the_fit_passes_and_the_stream_fails_the_run() {
    // Without the cache, the stream reads the tables again: rows other than those the BoW
    // stage learned from would mix two versions of the input.
    use std::io::BufRead;
    let case = Case::new();
    let pipeline = table_with_images(case.dir.path(), 1, true);
    let mut child = Command::new(env!("CARGO_BIN_EXE_curate"))
        .arg("run")
        .arg(&pipeline)
        .args(["--cache-mib", "0", "--set"])
        .arg(format!("output_dir={:?}", case.out("run")))
        .env("CURATE_PAUSE_AFTER_FIT_MS", "3000")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("paused after the fit passes") {
        assert!(stderr.read_line(&mut said).unwrap() > 0, "no pause: {said}");
    }
    std::fs::remove_file(case.dir.path().join("images/img7.jpg")).unwrap();
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    assert!(!child.wait().unwrap().success(), "{said}");
    assert!(said.contains("the input gave the stream other rows than the fit passes"), "{said}");
    assert!(!case.out("run").join("manifest.json").exists());
    assert!(shards(&case.out("run").join("data")).is_empty(), "its shards are removed");
    // With the input as it is now, the run goes through.
    let (ok, stderr) = case.run_file(&pipeline, "run", None, &["--cache-mib", "0"]);
    assert!(ok, "{stderr}");
    assert_eq!(manifest(&case.out("run"))["rejects_by_reason"]["read_table/missing_file"], 30);
}

#[test]
fn a_model_stage_pipeline_streams_2048_row_pieces_and_resumes_from_one() {
    // A model stage cuts the reader's chunks into 2,048-row pieces: the TSV's one chunk (5,000
    // lines) reaches the writer, and its 1,000-row shards and checkpoints, piece by piece, and a
    // killed run goes on from the checkpoint's piece (skipping the first, not transformed
    // again), to the bytes of an uninterrupted run.
    let case = Case::new();
    let lines: String = std::fs::read_to_string(case.dir.path().join("captions0.tsv"))
        .unwrap()
        .split_inclusive('\n')
        .take(5000)
        .collect();
    let tsv = case.dir.path().join("five_thousand.tsv");
    std::fs::write(&tsv, lines).unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny_bert");
    let pipeline = case.dir.path().join("encode.toml");
    std::fs::write(
        &pipeline,
        format!(
            "output_dir = \"out\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = {:?}\n[[stage]]\ntype = \"encode_text\"\n\
             model = {:?}\nbatch_size = 64\n[[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 1000\n",
            tsv.to_string_lossy(),
            model.to_string_lossy()
        ),
    )
    .unwrap();
    let (ok, stderr) = case.run_file(&pipeline, "whole", None, &[]);
    assert!(ok, "{stderr}");
    let whole = files(&case.out("whole"));
    let checkpoint = |out: &Path| -> serde_json::Value {
        let text = std::fs::read_to_string(out.join(".curate-checkpoint")).unwrap();
        serde_json::from_str(text.split_once('\n').unwrap().1).unwrap()
    };
    let out = case.out("killed");
    let (ok, _) = case.run_file(&pipeline, "killed", Some(3), &[]);
    assert!(!ok, "killed");
    // 3,000 output rows written: the 2,048 of the first piece and 952 of the second.
    let c = checkpoint(&out);
    assert_eq!((c["chunk_split"].as_u64(), c["chunk"].as_u64()), (Some(2048), Some(1)), "{c}");
    assert_eq!(c["rows_into_chunk"], 952, "{c}");
    let (ok, stderr) = case.run_file(&pipeline, "killed", None, &[]);
    assert!(ok && stderr.contains("resuming the run that stopped"), "{stderr}");
    assert_eq!(manifest(&out)["resumed"]["chunks_skipped"], 1);
    same_files(&files(&out), &whole, "a model stage's run killed after checkpoint 3");

    // A checkpoint saved by a curate that did not cut the chunks (no `chunk_split`), or cut
    // them to another size, numbers chunks otherwise: the run starts over, saying why.
    for (split, why) in [
        (None, "the reader's own chunks, saved by an earlier curate; this run streams 2048-row pieces"),
        (Some(1024), "1024-row pieces; this run streams 2048-row pieces"),
    ] {
        let (ok, _) = case.run_file(&pipeline, "other", Some(2), &[]);
        assert!(!ok, "killed");
        let path = case.out("other").join(".curate-checkpoint");
        let mut c = checkpoint(&case.out("other"));
        match split {
            None => c.as_object_mut().unwrap().remove("chunk_split"),
            Some(n) => c.as_object_mut().unwrap().insert("chunk_split".into(), n.into()),
        };
        let json = serde_json::to_vec(&c).unwrap();
        let mut file = format!("xxh3-64:{:016x}\n", xxhash_rust::xxh3::xxh3_64(&json)).into_bytes();
        file.extend_from_slice(&json);
        std::fs::write(&path, file).unwrap();
        let (ok, stderr) = case.run_file(&pipeline, "other", None, &[]);
        assert!(ok && !stderr.contains("resuming"), "{stderr}");
        assert!(stderr.contains(&format!("its chunks were cut to another size ({why})")), "{stderr}");
        same_files(&files(&case.out("other")), &whole, "started over");
    }
}
