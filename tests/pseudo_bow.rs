//! Pseudo-BoW mining (`mine_pseudo_bow`, spec `bow-and-otter.md` §3) end to end on the bundled
//! sample: a tiny run trained for a few steps labels the uncaptioned images of
//! `data/train_sample/unaligned` (made by `data/gen_train_sample.py`). The words and counts of
//! every output row are recomputed here from the aligned table and the row's `neighbor_ids`;
//! the ranking rules themselves are unit-tested in `src/text/pseudo_bow.rs`, exact top-k in
//! `src/knn.rs`.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use curate::pipeline::{self, config::ConfigDoc, plan::compile_doc, RunOptions};
use curate::text::{is_content_word, Tokenizer};
use curate::train::data::TrainSet;
use curate::train::{train, TrainConfig, TrainOptions};

/// A finished tiny run, trained once per test binary (kept for the process's life).
fn trained_run() -> &'static Path {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        common::train_run(&dir, common::TINY_RUN)
    })
}

/// The width of the trained run's embeddings.
fn run_dim() -> usize {
    let config = std::fs::read_to_string(trained_run().join("config.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&config).unwrap()["model"]["embed_dim"].as_u64().unwrap() as usize
}

/// A pipeline reading `root` (ImageNet-21k layout) and mining with `stage_keys` added to the
/// `mine_pseudo_bow` stage; output in `out`.
fn pipeline(out: &Path, root: &str, aligned: &str, stage_keys: &str) -> String {
    format!(
        r#"output_dir = {out:?}
seed = 5
[[stage]]
type = "read_imagenet21k"
root = {root:?}
words = "data/train_sample/unaligned/words.txt"
[[stage]]
type = "mine_pseudo_bow"
run = {run:?}
aligned = [{aligned:?}]
{stage_keys}
[[stage]]
type = "write_parquet"
rows_per_shard = 50
"#,
        out = out.to_string_lossy(),
        run = trained_run().to_string_lossy(),
    )
}

fn run(toml: String, threads: usize) -> curate::pipeline::RunSummary {
    let doc = ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap_or_else(|d| panic!("{d:?}"));
    let plan = compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| pipeline::run(plan, &RunOptions::default())).unwrap_or_else(|e| panic!("{e}"))
}

/// `sample_id` → caption of the aligned table.
fn aligned_captions(path: &str) -> HashMap<String, String> {
    let batches = curate::io::parquet::read_file(Path::new(path)).unwrap();
    let ids = common::col(&batches, "sample_id");
    let caps = common::col(&batches, "caption");
    ids.into_iter().zip(caps).map(|(i, c)| (i.unwrap(), c.unwrap())).collect()
}

/// The distinct content words of a caption (§1.1 + RmStopNalpha).
fn content_words(caption: &str) -> HashSet<String> {
    Tokenizer::default().words(caption).into_iter().filter(|w| is_content_word(w)).collect()
}

#[test]
fn every_word_and_count_comes_from_the_retrieved_captions() {
    const ALIGNED: &str = "data/train_sample/train.parquet";
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let keys = "crops = 3\nneighbors = 4\nwords = 3\ntop_words = 2\nbatch_size = 7";
    let summary = run(pipeline(&out, "data/train_sample/unaligned", ALIGNED, keys), 2);
    assert_eq!(summary.rows_read, 120);
    let data = common::read_dir(&out.join("data"));
    let rows: usize = data.iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, 120, "every image has candidate words");

    let captions = aligned_captions(ALIGNED);
    let docs: Vec<HashSet<String>> = captions.values().map(|c| content_words(c)).collect();
    let df = |w: &str| docs.iter().filter(|d| d.contains(w)).count() as u64;
    let mut ids_in_order = Vec::new();
    for b in &data {
        let caption = b.column_by_name("caption").unwrap().as_string::<i32>();
        let strategy = b.column_by_name("strategy").unwrap().as_string::<i32>();
        let neighbors = b.column_by_name("neighbor_ids").unwrap().as_list::<i32>();
        let words = b.column_by_name("words").unwrap().as_list::<i32>();
        let ids = b.column_by_name("sample_id").unwrap().as_string::<i32>();
        for r in 0..b.num_rows() {
            ids_in_order.push(ids.value(r).to_owned());
            assert_eq!(strategy.value(r), "weighted_count", "the paper's default");
            let nn = neighbors.value(r);
            let nn = nn.as_any().downcast_ref::<StringArray>().unwrap();
            assert_eq!(nn.len(), 3 * 4, "c·k retrieved captions, repeats kept");
            let retrieved: Vec<HashSet<String>> =
                (0..nn.len()).map(|i| content_words(&captions[nn.value(i)])).collect();
            let w = words.value(r);
            let w = w.as_struct();
            let (word, count) = (w.column(0).as_string::<i32>(), w.column(1).as_primitive::<UInt32Type>());
            let (pool_count, score) =
                (w.column(2).as_primitive::<UInt64Type>(), w.column(3).as_primitive::<Float64Type>());
            assert!(!w.is_empty() && w.len() <= 3, "at most p words");
            let shown: Vec<&str> = (0..w.len()).map(|i| word.value(i)).collect();
            assert_eq!(caption.value(r), shown.join(" "), "the caption is the ranked words in rank order");
            let mut previous = f64::INFINITY;
            for i in 0..w.len() {
                let expected = retrieved.iter().filter(|d| d.contains(word.value(i))).count() as u32;
                assert_eq!(count.value(i), expected, "cnt({}, NN) of {}", word.value(i), ids.value(r));
                assert_eq!(pool_count.value(i), df(word.value(i)), "cnt({}, S_a)", word.value(i));
                assert_eq!(score.value(i), count.value(i) as f64 / pool_count.value(i) as f64);
                assert!(score.value(i) <= previous, "ranked by score");
                previous = score.value(i);
            }
            // No better-scoring candidate was left out.
            let floor = previous;
            let all: HashSet<&String> = retrieved.iter().flatten().collect();
            for cand in all.iter().filter(|c| !shown.contains(&c.as_str())) {
                let s = retrieved.iter().filter(|d| d.contains(cand.as_str())).count() as f64 / df(cand) as f64;
                assert!(s <= floor, "`{cand}` scores {s} > the last kept word's {floor}");
            }
        }
    }
    let mut sorted = ids_in_order.clone();
    sorted.sort();
    assert_eq!(ids_in_order, sorted, "input order kept");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let stage = &report["stages"]["mine_pseudo_bow"];
    assert_eq!(stage["labelled_images"], 120);
    assert_eq!((stage["top_words"].as_u64(), stage["frequency_candidates"].as_str()), (Some(2), Some("content")));
    assert_eq!(stage["strategies"].as_object().unwrap().len(), 4);
    for (_, s) in stage["strategies"].as_object().unwrap() {
        let rate = s["label_word_hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&rate));
    }
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("pseudo-BoW mining") && md.contains("](../../"), "examples link their images: {md}");
}

#[test]
fn same_output_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let files = |threads: usize| {
        let out = dir.path().join(format!("out{threads}"));
        // (`raw` Top_t candidates too: the stage takes the `bow` stage's key.)
        let keys = "strategy = \"rm_top_rand\"\nshuffle_words = true\ntop_words = 3\nfrequency_candidates = \"raw\"\nbatch_size = 5";
        run(pipeline(&out, "data/train_sample/unaligned", "data/train_sample/train.parquet", keys), threads);
        let mut v: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(out.join("data"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .map(|p| (p.file_name().unwrap().into(), std::fs::read(&p).unwrap()))
            .collect();
        v.sort();
        v
    };
    let one = files(1);
    assert!(one.len() >= 2, "several shards");
    assert!(one == files(3), "the data files differ between 1 and 3 threads");
}

/// Writes a one-column-caption aligned table.
fn write_aligned(path: &Path, captions: &[&str]) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("sample_id", DataType::Utf8, false),
        Field::new("caption", DataType::Utf8, false),
    ]));
    let ids: Vec<String> = (0..captions.len()).map(|i| format!("a{i}")).collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(StringArray::from(ids)), Arc::new(StringArray::from(captions.to_vec()))],
    )
    .unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn unusable_images_and_images_without_candidates_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    std::fs::create_dir_all(root.join("n90000001")).unwrap();
    for k in 0..2 {
        std::fs::copy(
            format!("data/train_sample/unaligned/n90000001/n90000001_{k}.png"),
            root.join(format!("n90000001/n90000001_{k}.png")),
        )
        .unwrap();
    }
    // Between the two (names sort `_0`, `_05`, `_1`): rejects come in row order, whichever the
    // stage found first.
    std::fs::write(root.join("n90000001/n90000001_05.png"), b"\x89PNG not really").unwrap();
    // Only stopwords and punctuation: nothing survives RmStopNalpha.
    let aligned = dir.path().join("aligned.parquet");
    write_aligned(&aligned, &["a the of .", "on it , 3d", "and then"]);
    let out = dir.path().join("out");
    let summary = run(pipeline(&out, &root.to_string_lossy(), &aligned.to_string_lossy(), "neighbors = 2"), 2);
    assert_eq!(summary.rows_read, 3);
    assert_eq!(summary.rows_written, 0);
    let rejects = common::read_dir(&out.join("rejects"));
    let reasons: Vec<String> = common::col(&rejects, "reason").into_iter().flatten().collect();
    assert_eq!(reasons, ["no_candidate_word", "undecodable_image", "no_candidate_word"]);
    // Nothing mined: the mean words per caption is undefined, not 0.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    let stage = report["stages"].as_object().unwrap().values().next().unwrap();
    assert_eq!((stage["images_mined"].as_u64(), stage["no_candidate_word"].as_u64()), (Some(0), Some(2)));
    assert_eq!(stage["mean_words"], serde_json::Value::Null);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("no candidate word: 2; mean words per caption n/a"), "{md}");
}

#[test]
fn more_neighbors_than_aligned_captions_is_noted() {
    // Each crop then retrieves the whole aligned set: said, not silently capped. Blank captions
    // are not in that set (they have no word to give, as `encode_text` has no text to embed).
    let dir = tempfile::tempdir().unwrap();
    let aligned = dir.path().join("aligned.parquet");
    write_aligned(&aligned, &["a red square", "", "a blue circle", " \t\u{3000}", "a green star"]);
    let file = dir.path().join("mine.toml");
    let toml =
        pipeline(&dir.path().join("out"), "data/train_sample/unaligned", &aligned.to_string_lossy(), "neighbors = 5");
    std::fs::write(&file, toml).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(["run", "--progress", "never"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("`neighbors = 5` is more than the 3 aligned captions"), "{stderr}");
    assert!(
        stderr.contains("2 aligned row(s) left out of the pool: a null `sample_id`, or a null or blank"),
        "{stderr}"
    );
}

/// Pseudo-BoW captions are for uncaptioned images: mining rows that have captions is allowed
/// (the pseudo captions can be compared with them), and said to replace them.
#[test]
fn mining_captioned_rows_says_their_captions_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mine.toml");
    let aligned = "data/train_sample/train.parquet";
    let reader = format!(
        "type = \"read_table\"\npath = {aligned:?}\ncolumns = {{ sample_id = \"sample_id\", caption = \"caption\", path = \"path\" }}"
    );
    let toml = pipeline(&dir.path().join("out"), "data/train_sample/unaligned", aligned, "");
    let toml = toml.replace(
        "type = \"read_imagenet21k\"\nroot = \"data/train_sample/unaligned\"\nwords = \"data/train_sample/unaligned/words.txt\"",
        &reader,
    );
    assert!(toml.contains("read_table"), "{toml}");
    std::fs::write(&file, &toml).unwrap();
    let validate = |file: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_curate")).arg("validate").arg(file).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, stderr) = validate(&file);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("note: stage `mine_pseudo_bow` replaces the captions its rows have"), "{stderr}");
    // Uncaptioned images: nothing to say.
    std::fs::write(&file, pipeline(&dir.path().join("out"), "data/train_sample/unaligned", aligned, "")).unwrap();
    let (ok, stderr) = validate(&file);
    assert!(ok && !stderr.contains("replaces the captions"), "{stderr}");
}

#[test]
fn a_missing_run_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let toml = std::fs::read_to_string("pipelines/pseudo_bow.toml").unwrap();
    let sets = [format!("mine_pseudo_bow.run={}", dir.path().display())];
    let doc = ConfigDoc::parse(Path::new("pipelines/pseudo_bow.toml"), toml.clone(), &sets).unwrap();
    let err = compile_doc(&doc).err().expect("no run there").to_string();
    assert!(err.contains("is not a `curate train` run") && err.contains("--set mine_pseudo_bow.run="), "{err}");
    // The run's hint comes below the problem's place, as every hint does.
    let (place, hint) = (err.find("--> --set mine_pseudo_bow.run="), err.find("hint: train it first"));
    assert!(place.is_some() && hint.is_some() && place < hint, "{err}");
    // The shipped pipeline compiles against a finished run.
    let sets = [format!("mine_pseudo_bow.run={}", trained_run().display())];
    let doc = ConfigDoc::parse(Path::new("pipelines/pseudo_bow.toml"), toml, &sets).unwrap();
    compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
}

/// A features table for the aligned set's ids: `dim`-d vectors, each row times `scale(row)`.
fn write_features(path: &Path, dim: usize, scale: impl Fn(usize) -> f32) {
    use arrow_array::{ArrayRef, FixedSizeListArray, Float32Array};
    let batches = curate::io::parquet::read_file(Path::new("data/train_sample/train.parquet")).unwrap();
    let ids = common::strs(&batches, "sample_id");
    let mut values = Vec::with_capacity(ids.len() * dim);
    for r in 0..ids.len() {
        // A hash of (row, j) in [-1, 1): no two rows alike, so no ties that rounding could turn.
        let row: Vec<f32> = (0..dim)
            .map(|j| {
                let h = ((r * dim + j) as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        values.extend(row.iter().map(|v| v * scale(r)));
    }
    let field = Arc::new(Field::new("item", DataType::Float32, false));
    let list = FixedSizeListArray::new(field, dim as i32, Arc::new(Float32Array::from(values)), None);
    let batch = RecordBatch::try_from_iter([
        ("sample_id", Arc::new(StringArray::from(ids)) as ArrayRef),
        ("embedding", Arc::new(list) as ArrayRef),
    ])
    .unwrap();
    common::write_parquet(path, &batch);
}

#[test]
fn given_caption_features_are_compared_by_cosine() {
    // Spec §3: e_y = norm(g(y)) and a cosine search. Scaling each feature row by a positive
    // factor must change nothing (it changed every row's neighbours when rows were used as read).
    let dir = tempfile::tempdir().unwrap();
    let dim = run_dim();
    let mine = |name: &str, scale: &dyn Fn(usize) -> f32| {
        let features = dir.path().join(format!("{name}.parquet"));
        write_features(&features, dim, scale);
        let out = dir.path().join(name);
        let keys = format!("aligned_features = [{:?}]", features.to_string_lossy());
        run(pipeline(&out, "data/train_sample/unaligned", "data/train_sample/train.parquet", &keys), 2);
        let data = common::read_dir(&out.join("data"));
        let neighbors: Vec<String> = data
            .iter()
            .flat_map(|b| {
                let list = b.column_by_name("neighbor_ids").unwrap().as_list::<i32>();
                (0..list.len()).map(|i| format!("{:?}", list.value(i))).collect::<Vec<_>>()
            })
            .collect();
        (common::strs(&data, "caption"), neighbors)
    };
    let plain = mine("plain", &|_| 1.0);
    let scaled = mine("scaled", &|r| 0.2 + (r % 7) as f32 * 0.8);
    assert_eq!(plain.0.len(), 120);
    assert_eq!(plain, scaled);
    // Rows whose squared norm leaves f32's range (it overflows for ~1e20s and underflows for
    // ~1e-25s) normalised to zeros, and every image got the same neighbours.
    let far = mine("far", &|r| if r % 2 == 0 { 1e20 } else { 3e-25 });
    assert_eq!(plain, far);
}

#[test]
fn checkpoints_stamp_every_file_the_stage_loads() {
    // A resume compares these files' stamps (tests/encode_image.rs changes a model's time): the
    // run's config and model, its text tower's tokenizer (outside the run folder), the aligned
    // tables and the features found when the file was compiled.
    let dir = tempfile::tempdir().unwrap();
    let features = dir.path().join("features");
    std::fs::create_dir_all(&features).unwrap();
    // Tables `validate` accepts (a `sample_id` and an `embedding` column of the run's width),
    // and a file the pattern leaves out.
    for f in ["b.parquet", "a.parquet"] {
        write_features(&features.join(f), run_dim(), |_| 1.0);
    }
    std::fs::write(features.join("notes.txt"), b"x").unwrap();
    let keys = format!("aligned_features = {:?}", features.join("*.parquet").to_string_lossy());
    let toml =
        pipeline(&dir.path().join("out"), "data/train_sample/unaligned", "data/train_sample/train.parquet", &keys);
    let doc = ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap_or_else(|d| panic!("{d:?}"));
    let plan = compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
    // Files added after compiling are not the stage's: it reads the list it compiled.
    std::fs::write(features.join("c.parquet"), b"x").unwrap();
    let (_, stage) = &plan.transforms[0];
    let text = Path::new("data/train_sample/text_model");
    let expected = vec![
        trained_run().join("config.json"),
        trained_run().join("model.bpk"),
        text.join("tokenizer.json"),
        text.join("config.json"),
        PathBuf::from("data/train_sample/train.parquet"),
        features.join("a.parquet"),
        features.join("b.parquet"),
    ];
    assert_eq!(stage.side_inputs(), expected);
}

#[test]
fn semi_aligned_training_takes_aligned_and_pseudo_captioned_tables() {
    let dir = tempfile::tempdir().unwrap();
    let mined = dir.path().join("mined");
    run(pipeline(&mined, "data/train_sample/unaligned", "data/train_sample/train.parquet", "crops = 2"), 2);
    // The shipped file, pointed at this test's mined table.
    let tables = format!("data.tables=[\"data/train_sample/train.parquet\", \"{}/data/*.parquet\"]", mined.display());
    let out = dir.path().join("semi");
    let config = TrainConfig::load(
        Path::new("pipelines/train_semi_aligned.toml"),
        &[
            tables,
            format!("output_dir={}", out.display()),
            "model.image_size_px=16".into(),
            "batch_size=32".into(),
            "eval.every_steps=1000".into(),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.epochs, Some(10), "the paper's 10 epochs");
    let set = TrainSet::load(&config).unwrap();
    assert_eq!(set.samples.len(), 576 + 120);
    let pseudo: Vec<_> = set.samples.iter().filter(|s| s.sample_id.starts_with("n9000")).collect();
    assert_eq!(pseudo.len(), 120);
    assert!(pseudo.iter().all(|s| !s.caption.is_empty()));
    // A short run on the mixed set: two steps instead of ten epochs, no zero-shot.
    let mut short = config;
    short.epochs = None;
    short.steps = Some(2);
    short.eval = None;
    let s = train(&short, &TrainOptions { progress: false, ..Default::default() }).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((s.rows, s.steps), (696, 2));
    assert!(s.last_loss.is_finite());
    assert!(out.join("model.bpk").is_file());
}

/// `validate` finds what the run would find only after embedding its input: a label column
/// named by hand that the input lacks, an aligned or features table that is no Parquet or
/// lacks a column; and a missing run beside another key's problem.
#[test]
fn validate_checks_the_tables_and_columns_the_stage_will_read() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let root = "data/train_sample/unaligned";
    let aligned = "data/train_sample/train.parquet";
    let compile = |toml: String| compile_doc(&ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap()).err();
    assert!(compile(pipeline(&out, root, aligned, "")).is_none(), "the bundled tables serve");
    let err = compile(pipeline(&out, root, aligned, "label_column = \"label_txt\"")).expect("no such column");
    let err = err.to_string();
    assert!(
        err.contains("the stage's input has no column `label_txt`") && err.contains("did you mean `label_text`?"),
        "{err}"
    );
    // A TSV named as the aligned set, and a table without the caption column.
    let tsv = dir.path().join("aligned.tsv");
    std::fs::write(&tsv, "a dog\thttp://x\n").unwrap();
    let err = compile(pipeline(&out, root, &tsv.to_string_lossy(), "")).expect("not Parquet").to_string();
    assert!(err.contains("aligned.tsv") && err.contains("--> t.toml:"), "{err}");
    let err = compile(pipeline(&out, root, aligned, "caption_column = \"text\"")).expect("no column").to_string();
    assert!(err.contains("train.parquet` has no column `text` (its columns: "), "{err}");
    let err = compile(pipeline(&out, root, aligned, &format!("aligned_features = [{aligned:?}]")))
        .expect("no embeddings")
        .to_string();
    assert!(err.contains("has no column `embedding`"), "{err}");
    // Features of another width than the run's embeddings (a fixed width is in the footer).
    let dim = run_dim();
    let wide = dir.path().join("wide.parquet");
    write_features(&wide, dim + 1, |_| 1.0);
    let err = compile(pipeline(&out, root, aligned, &format!("aligned_features = [{wide:?}]")))
        .expect("another width")
        .to_string();
    let want = format!(
        "wide.parquet` holds {}-d embeddings; the run `{}` embeds to {dim}-d",
        dim + 1,
        trained_run().display()
    );
    assert!(err.contains(&want) && err.contains("--> t.toml:"), "{err}");
    // A wrong `crops` and a missing run: both reported by one compile.
    let toml = pipeline(&out, root, aligned, "crops = 0").replace(
        &format!("run = {:?}", trained_run().to_string_lossy()),
        &format!("run = {:?}", dir.path().join("no_run").to_string_lossy()),
    );
    let err = compile(toml).expect("two problems").to_string();
    assert!(err.contains("crops") && err.contains("is not a `curate train` run"), "{err}");
    // Crops past what a batch can hold in memory (a capacity overflow, or an abort allocating).
    let err = compile(pipeline(&out, root, aligned, "crops = 9223372036854775807")).expect("too many").to_string();
    assert!(err.contains("crops must be from 1 to 1024, got 9223372036854775807"), "{err}");
    // A second mining stage would write `words`, `neighbor_ids` and `strategy` twice.
    let twice = pipeline(&out, root, aligned, "").replace(
        "[[stage]]\ntype = \"write_parquet\"",
        &format!(
            "[[stage]]\ntype = \"mine_pseudo_bow\"\nname = \"again\"\nrun = {:?}\naligned = [{aligned:?}]\n[[stage]]\ntype = \"write_parquet\"",
            trained_run().to_string_lossy()
        ),
    );
    assert_eq!(twice.matches("mine_pseudo_bow").count(), 2, "{twice}");
    let err = compile(twice).expect("columns twice").to_string();
    assert!(
        err.contains("the stage's input already has `words`, `neighbor_ids`, `strategy`")
            && err.contains("mine once per pipeline"),
        "{err}"
    );
}

/// What only the tables' rows show (an aligned caption without features) fails the run before
/// it clears an earlier run's output.
#[test]
fn a_bad_features_table_leaves_the_earlier_output_intact() {
    let dir = tempfile::tempdir().unwrap();
    let dim = run_dim();
    let features = dir.path().join("features.parquet");
    write_features(&features, dim, |_| 1.0);
    let out = dir.path().join("out");
    let keys = format!("aligned_features = [{features:?}]\ncrops = 1");
    let toml = pipeline(&out, "data/train_sample/unaligned", "data/train_sample/train.parquet", &keys);
    run(toml.clone(), 2);
    let before = common::read_dir(&out.join("data"));
    assert!(!before.is_empty());
    // The same features without their first row.
    let batches = curate::io::parquet::read_file(&features).unwrap();
    let all = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
    let missing = common::strs(&[all.slice(0, 1)], "sample_id")[0].clone();
    common::write_parquet(&features, &all.slice(1, all.num_rows() - 1));
    let doc = ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap();
    let plan = compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
    let e = pipeline::run(plan, &RunOptions::default()).expect_err("refused").to_string();
    assert!(e.contains(&format!("aligned caption `{missing}` has no row in `aligned_features`")), "{e}");
    assert_eq!(common::read_dir(&out.join("data")), before, "the earlier output is kept");
    assert!(out.join("manifest.json").exists());
}

/// An aligned set listing one id twice (the same table given twice) is refused by the id:
/// neither `neighbor_ids` nor the features join could tell the two rows apart.
#[test]
fn an_aligned_set_with_a_repeated_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let aligned = "data/train_sample/train.parquet";
    let toml = pipeline(&dir.path().join("out"), "data/train_sample/unaligned", aligned, "crops = 1")
        .replace(&format!("aligned = [{aligned:?}]"), &format!("aligned = [{aligned:?}, {aligned:?}]"));
    let doc = ConfigDoc::parse(Path::new("t.toml"), toml, &[]).unwrap();
    let plan = compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
    let e = pipeline::run(plan, &RunOptions::default()).expect_err("refused").to_string();
    assert!(e.contains("the aligned set has two captioned rows with `sample_id`"), "{e}");
}

#[test]
fn crops_are_normalised_as_the_runs_image_transform() {
    // The same weights, its config saying `image_transform = "clip"` (CLIP's mean/std) instead
    // of the default (ImageNet's): other inputs, so other neighbours.
    let clip = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.bpk"] {
        std::fs::copy(trained_run().join(f), clip.path().join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(clip.path().join("config.json")).unwrap()).unwrap();
    let data = config["data"].as_object_mut().unwrap();
    assert_eq!(data.insert("image_transform".into(), "clip".into()), Some("random_resized_crop".into()));
    data.remove("crop_scale");
    data.remove("crop_ratio");
    data.insert("flip".into(), false.into());
    std::fs::write(clip.path().join("config.json"), config.to_string()).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let neighbours = |name: &str, run_dir: &Path| {
        let out = dir.path().join(name);
        let toml = pipeline(&out, "data/train_sample/unaligned", "data/train_sample/train.parquet", "batch_size = 16")
            .replace(
                &format!("run = {:?}", trained_run().to_string_lossy()),
                &format!("run = {:?}", run_dir.to_string_lossy()),
            );
        run(toml, 2);
        let mut ids = Vec::new();
        for b in common::read_dir(&out.join("data")) {
            let col = b.column_by_name("neighbor_ids").unwrap().as_list::<i32>();
            for r in 0..b.num_rows() {
                ids.push(format!("{:?}", col.value(r)));
            }
        }
        ids
    };
    let (imagenet, clipped) = (neighbours("imagenet", trained_run()), neighbours("clip", clip.path()));
    assert_eq!(imagenet.len(), clipped.len());
    assert!(imagenet != clipped, "mining ignored the run's normalisation");
}
