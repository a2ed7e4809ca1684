//! Golden tests of every reader on small real-format fixtures (`tests/fixtures/readers/`, made
//! by `make_fixtures.py`; its README lists each row and what a reader must do with it).

mod common;

use std::os::unix::ffi::OsStrExt;

use common::*;

#[test]
fn conceptual_captions_tsv() {
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", fixture("readers/cc/cc_train.tsv"))));
    let ids = strs(&data, "sample_id");
    let lines: Vec<u32> = vec![1, 2, 4, 5, 7, 9, 11, 13, 14, 15, 16, 17, 18];
    assert_eq!(ids, lines.iter().map(|l| format!("cc_train.tsv#{l}")).collect::<Vec<_>>());
    let caps = strs(&data, "caption");
    assert_eq!(caps[3], "the sign says \" open , come in \" on the door .", "kept verbatim, no quoting");
    assert_eq!(caps[8], "a cup of coffee on a wooden table . ", "trailing space kept");
    let urls = strs(&data, "url");
    assert_eq!(urls[2], "https://img.example.com/cc/0004.jpg?imgmax=800");
    assert_eq!(urls[12], "https://img.example.com/cc/0018.jpg", "last line without newline");
    assert_eq!(
        reasons(&rejects),
        [
            ("wrong_field_count".into(), 3),
            ("wrong_field_count".into(), 6),
            ("empty_caption".into(), 8),
            ("empty_caption".into(), 10),
            ("invalid_utf8".into(), 12)
        ]
    );
    // A rejected line's id is known all the same (`file#line`).
    assert_eq!(col(&rejects, "sample_id")[0].as_deref(), Some("cc_train.tsv#3"));
    // The raw line is kept byte for byte, invalid UTF-8 included.
    let raw = rejects[0].column_by_name("raw").unwrap();
    let raw = arrow_array::cast::AsArray::as_binary::<i32>(raw);
    assert!(raw.value(4).starts_with(b"caf\xe9 on the corner"));
    assert!(col(&data, "source").iter().all(|s| s.as_deref() == Some("conceptual_captions")));
}

#[test]
fn manifest_fingerprints_the_input_bytes() {
    // The fingerprint (taken on a thread of its own, beside the passes) is that of the input
    // file, and changes with one byte of it; the rows counted match the file.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cc.tsv");
    std::fs::copy(fixture("readers/cc/cc_train.tsv"), &input).unwrap();
    let run = || {
        let (d, _, _) =
            run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", input.to_string_lossy())));
        let m = json_file(&d.path().join("out/manifest.json"));
        (m["input_fingerprint"].as_str().unwrap().to_owned(), m["rows"]["read"].as_u64().unwrap(), m)
    };
    let (first, rows, m) = run();
    assert_eq!(first, curate::io::fingerprint(std::slice::from_ref(&input)).unwrap());
    // The layout of `schemas/pairs.md` (each file: name and a NUL, length as u64 LE, bytes),
    // hashed by Python's xxhash:
    // d = open("tests/fixtures/readers/cc/cc_train.tsv", "rb").read()
    // "%032x" % xxhash.xxh3_128_intdigest(b"cc.tsv\0" + struct.pack("<Q", len(d)) + d)
    assert_eq!(first, "xxh3-128:64f9a7a713d0c81f3cf41199b9d05816");
    assert_eq!(rows, 18);
    assert!(m["timings_s"]["fingerprint"].as_f64().is_some_and(f64::is_finite), "{m}");
    let mut bytes = std::fs::read(&input).unwrap();
    bytes[0] ^= 0x20;
    std::fs::write(&input, bytes).unwrap();
    let (second, _, _) = run();
    assert_ne!(first, second);
    assert_eq!(second, curate::io::fingerprint(std::slice::from_ref(&input)).unwrap());
}

#[test]
fn a_run_clears_what_an_earlier_run_left() {
    // An earlier, larger run stopped part-way: its manifest, report, plots, shards and an
    // unfinished temporary shard are still there, beside a file of the user's own.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let stale = [
        "manifest.json",
        "report.md",
        "report.json",
        "plots/bow_word_rank.svg",
        "data/part-00007.parquet",
        "data/.part-00008.parquet.tmp",
        "rejects/part-00003.parquet",
        // What a run killed while writing these left of them.
        "..curate-checkpoint.tmp",
        ".manifest.json.tmp",
        "plots/.bow_word_rank.svg.tmp",
    ];
    for f in stale.iter().chain(&["data/notes.txt", "plots/mine.svg"]) {
        let p = out.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"from an earlier run").unwrap();
    }
    run_toml(cc_pipeline(&out, "data", None)).unwrap();
    let mut left: Vec<String> = common::files_under(&out)
        .into_iter()
        .map(|p| p.strip_prefix(&out).unwrap().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // This run's files (no BoW stage, so no plots), and the user's file.
    assert_eq!(
        left,
        [
            "config.json",
            "data/notes.txt",
            "data/part-00000.parquet",
            "manifest.json",
            "plots/mine.svg",
            "rejects/part-00000.parquet",
            "report.json",
            "report.md"
        ]
    );
    assert_eq!(std::fs::read(out.join("data/notes.txt")).unwrap(), b"from an earlier run");
    assert_eq!(std::fs::read(out.join("plots/mine.svg")).unwrap(), b"from an earlier run");
    assert_ne!(std::fs::read(out.join("manifest.json")).unwrap(), b"from an earlier run");
}

#[test]
fn a_run_into_another_data_folder_clears_the_earlier_runs_shards() {
    // The first run writes `data/`, the second `shards/`: what is left is the second run's,
    // and the manifest says which folder holds the data.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = |data_dir: &str| run_toml(cc_pipeline(&out, data_dir, None)).unwrap();
    run("data");
    std::fs::write(out.join("data/notes.txt"), b"mine").unwrap();
    assert!(out.join("data/part-00000.parquet").exists());
    run("shards");
    assert!(!out.join("data/part-00000.parquet").exists(), "the earlier run's shard is gone");
    assert!(out.join("data/notes.txt").exists(), "other files stay");
    assert!(out.join("shards/part-00000.parquet").exists());
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["data_dir"], "shards");
    assert_eq!(m["data_shards"][0]["file"], "part-00000.parquet");
}

/// Compiles and runs the pipeline `toml` (its errors, config or run, as one result).
fn run_toml(toml: String) -> curate::error::Result<curate::pipeline::RunSummary> {
    let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
    curate::pipeline::plan::compile_doc(&doc).and_then(|p| curate::pipeline::run(p, &Default::default()))
}

/// The CC fixture read into `out`, data written to `data_dir`, with `bow` (TOML of the stage's
/// keys) between them when given.
fn cc_pipeline(out: &std::path::Path, data_dir: &str, bow: Option<&str>) -> String {
    let bow = bow.map(|b| format!("[[stage]]\ntype = \"bow\"\n{b}\n")).unwrap_or_default();
    format!(
        "output_dir = {:?}\nseed = 3\n[[stage]]\ntype = \"read_cc_tsv\"\npath = {:?}\n{bow}[[stage]]\ntype = \"write_parquet\"\ndir = {data_dir:?}\n",
        out.to_string_lossy(),
        fixture("readers/cc/cc_train.tsv")
    )
}

#[test]
fn img2dataset_parquet_metadata() {
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_img2dataset\"\npath = \"{}\"",
        fixture("readers/img2dataset/*.parquet")
    )));
    // Parquet alone cannot see the tar defects (README §2): keys 6, 7, 8 are emitted.
    let ids = strs(&data, "sample_id");
    assert_eq!(ids, ["000000000", "000000002", "000000005", "000000006", "000000007", "000000008"]);
    assert_eq!(strs(&data, "caption")[1], "crème brûlée on a white plate");
    assert_eq!(strs(&data, "url")[0], "https://img.example.com/i2d/bike.jpg");
    assert!(strs(&data, "shard").iter().all(|s| s == "00000"));
    assert_eq!(strs(&data, "key"), ids);
    assert_eq!(
        reasons(&rejects),
        [("download_failed".into(), 1), ("empty_caption".into(), 3), ("download_failed".into(), 4)]
    );

    // The same table re-saved as pandas/polars may: `status` categorical (a dictionary),
    // `caption` a large string, `url` a string view.
    use arrow_schema::DataType;
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_dir(fixture("readers/img2dataset"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    let batches = curate::io::parquet::read_file(&src).unwrap();
    let retyped: Vec<arrow_array::RecordBatch> = batches
        .iter()
        .map(|b| {
            let cols: Vec<(String, arrow_array::ArrayRef)> = b
                .schema()
                .fields()
                .iter()
                .zip(b.columns())
                .map(|(f, c)| {
                    let to = match f.name().as_str() {
                        "status" => DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
                        "caption" => DataType::LargeUtf8,
                        "url" => DataType::Utf8View,
                        _ => c.data_type().clone(),
                    };
                    (f.name().clone(), arrow_cast::cast(c, &to).unwrap())
                })
                .collect();
            arrow_array::RecordBatch::try_from_iter(cols).unwrap()
        })
        .collect();
    let path = dir.path().join("00000.parquet");
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), retyped[0].schema(), None).unwrap();
    for b in &retyped {
        w.write(b).unwrap();
    }
    w.close().unwrap();
    let (_d, again, again_rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(strs(&again, "sample_id"), ids);
    assert_eq!(strs(&again, "caption"), strs(&data, "caption"));
    assert_eq!(strs(&again, "url"), strs(&data, "url"));
    assert_eq!(reasons(&again_rejects), reasons(&rejects));
}

#[test]
fn img2dataset_webdataset_tar() {
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_img2dataset\"\npath = \"{}\"",
        fixture("readers/img2dataset/*.tar")
    )));
    assert_eq!(strs(&data, "sample_id"), ["000000000", "000000002", "000000005"]);
    assert_eq!(
        strs(&data, "caption"),
        [
            "a red bicycle leaning against a brick wall",
            "crème brûlée on a white plate",
            "a lighthouse on a rocky coast at dusk"
        ]
    );
    assert_eq!(strs(&data, "url")[2], "https://img.example.com/i2d/lighthouse.jpg");
    let r: Vec<String> = reasons(&rejects).into_iter().map(|x| x.0).collect();
    assert_eq!(r, ["empty_caption", "missing_caption", "missing_image", "bad_json"]);
    assert_eq!(col(&rejects, "sample_id")[3].as_deref(), Some("000000008"));
}

/// ids, captions, urls, rejects `(reason, line)`, and the run folder.
type YfccRun = (Vec<String>, Vec<String>, Vec<String>, Vec<(String, u64)>, tempfile::TempDir);

fn yfcc(file: &str, subset: Option<&str>) -> YfccRun {
    let subset = subset.map(|s| format!("subset = \"{}\"\n", fixture(s))).unwrap_or_default();
    let (d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_yfcc\"\npath = \"{}\"\n{subset}",
        fixture(&format!("readers/yfcc/{file}"))
    )));
    (strs(&data, "sample_id"), strs(&data, "caption"), strs(&data, "url"), reasons(&rejects), d)
}

#[test]
fn yfcc_both_layouts_decode_and_clean_text() {
    for file in ["yfcc100m_dataset_25.tsv", "yfcc100m_dataset_23.tsv"] {
        let (ids, caps, urls, rej, dir) = yfcc(file, None);
        assert_eq!(ids, ["5012345678", "5012345679", "5012345680", "5012345685"], "{file}");
        // Title, description, "title. description" (HTML stripped, newline collapsed), and
        // `%2B` decoded to a literal plus.
        assert_eq!(
            caps,
            [
                "Sunset at the beach",
                "café on the corner",
                "Birthday party. Bold cake with candles",
                "C++ meetup & pizza. Slides: http://example.com/slides"
            ],
            "{file}"
        );
        assert_eq!(urls[0], "http://farm5.staticflickr.com/4123/5012345678_a1b2c3d4e5.jpg");
        let r: Vec<(&str, u64)> = rej.iter().map(|(r, l)| (r.as_str(), *l)).collect();
        assert_eq!(r, [("empty_caption", 4), ("wrong_field_count", 6), ("invalid_utf8", 7)], "{file}");
        // Rejects carry the photo id wherever it reads (a line with the wrong field count has
        // none: which field is the id is not known).
        let rejects = read_dir(&dir.path().join("out/rejects"));
        assert_eq!(col(&rejects, "sample_id"), [Some("5012345681".into()), None, Some("5012345684".into())], "{file}");
        // The video is skipped and counted, not rejected.
        let manifest = json_file(&dir.path().join("out/manifest.json"));
        assert_eq!(manifest["skipped_by_reason"]["video"], 1, "{file}");
    }
}

#[test]
fn yfcc15m_subset_with_and_without_header() {
    for subset in ["readers/yfcc/yfcc100m_subset_data.tsv", "readers/yfcc/yfcc100m_subset_data_noheader.tsv"] {
        let (ids, _, _, _, dir) = yfcc("yfcc100m_dataset_25.tsv", Some(subset));
        assert_eq!(ids, ["5012345678", "5012345679", "5012345680"], "{subset}");
        let manifest = json_file(&dir.path().join("out/manifest.json"));
        assert_eq!(manifest["skipped_by_reason"]["not_in_subset"], 1);
        assert_eq!(manifest["rows"]["read"], 8, "every line accounted for");
        // The subset list changes the output: it is an input, fingerprinted with the data.
        let inputs: Vec<&str> = manifest["inputs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(inputs.len(), 2, "{inputs:?}");
        assert!(inputs[1].ends_with(subset), "{inputs:?}");
    }
}

#[test]
fn a_subset_list_is_checked_by_its_first_lines_and_read_whole_by_the_run() {
    // `validate` reads the first 1,000 lines of the list (YFCC15M's has 15M: reading it all
    // took 20-50 s); the run reads it all, and a bad line further on fails it.
    let dir = tempfile::tempdir().unwrap();
    let data = fixture("readers/yfcc/yfcc100m_dataset_25.tsv");
    let mut list = String::from("line_number\tphoto_id\thash\n");
    // Photos 5012345678 and 5012345679 of the fixture, and 1,498 others.
    for i in 0..1500u64 {
        list.push_str(&format!("{i}\t{}\tabc\n", if i < 2 { 5012345678 + i } else { 9_000_000 + i }));
    }
    let subset = dir.path().join("subset.tsv");
    let toml = format!(
        "output_dir = \"{}\"\n[[stage]]\ntype = \"read_yfcc\"\npath = \"{data}\"\nsubset = \"{}\"\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        dir.path().join("out").display(),
        subset.display()
    );
    let plan = || {
        let doc =
            curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml.clone(), &[]).unwrap();
        curate::pipeline::plan::compile_doc(&doc)
    };
    // Whole and good: read whole by the run.
    std::fs::write(&subset, &list).unwrap();
    curate::pipeline::run(plan().unwrap(), &Default::default()).unwrap();
    let manifest = json_file(&dir.path().join("out/manifest.json"));
    assert_eq!(manifest["rows"]["written"], 2);
    assert!(manifest["skipped_by_reason"]["not_in_subset"].as_u64().unwrap() > 0);
    // Bad further on: the run fails before it clears the earlier run's output.
    std::fs::write(&subset, format!("{list}1500\tnot a number\tabc\n")).unwrap();
    let plan_far = plan().unwrap_or_else(|e| panic!("line 1502 is not checked before the run: {e}"));
    let err = curate::pipeline::run(plan_far, &Default::default()).unwrap_err().to_string();
    assert!(err.contains("subset.tsv` line 1502: no photo id in the second field"), "{err}");
    assert!(err.contains("expected `line_number<TAB>photo_id<TAB>hash` lines"), "{err}");
    assert_eq!(json_file(&dir.path().join("out/manifest.json")), manifest, "the earlier run's output stays");
    assert_eq!(std::fs::read_dir(dir.path().join("out/data")).unwrap().count(), 1);
    // Among the first lines: a configuration error, with the file's line.
    std::fs::write(&subset, format!("0\t5012345678\tabc\n1\tx\tabc\n{list}")).unwrap();
    let err = plan().err().expect("refused").to_string();
    assert!(err.contains("subset.tsv` line 2: no photo id"), "{err}");
}

#[test]
fn imagenet21k_folder() {
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_imagenet21k\"\nroot = \"{}\"\nwords = \"{}\"",
        fixture("readers/imagenet21k/train"),
        fixture("readers/imagenet21k/words.txt")
    )));
    assert_eq!(
        strs(&data, "sample_id"),
        [
            "n01440764/n01440764_10026.JPEG",
            "n01440764/n01440764_10027.JPEG",
            "n02102040/n02102040_1.JPEG",
            "n02102040/n02102040_2.JPEG"
        ]
    );
    assert!(col(&data, "caption").iter().all(Option::is_none), "uncaptioned images");
    assert_eq!(strs(&data, "label"), ["n01440764", "n01440764", "n02102040", "n02102040"]);
    assert_eq!(strs(&data, "label_text")[2], "English springer, English springer spaniel");
    assert!(strs(&data, "path").iter().all(|p| std::path::Path::new(p).is_file()));
    assert_eq!(reasons(&rejects).iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["unsupported_extension"]);
    // Extensions as torchvision spells them (with the dot) select the same files.
    let (_d, dotted, _) = run_pipeline(&read_only(&format!(
        "type = \"read_imagenet21k\"\nroot = \"{}\"\nextensions = [\".JPEG\", \".png\"]",
        fixture("readers/imagenet21k/train")
    )));
    assert_eq!(strs(&dotted, "sample_id"), strs(&data, "sample_id"));
}

#[test]
fn flickr8k_token_file_via_read_table() {
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nformat = \"tsv\"\ncolumns = {{ sample_id = 0, caption = 1, path = 0 }}\npath_cut_at = \"#\"\nimage_root = \"{}\"",
        fixture("readers/generic/flickr8k_token.txt"),
        fixture("readers/generic/Flicker8k_Dataset")
    )));
    let ids = strs(&data, "sample_id");
    assert_eq!(ids.len(), 15);
    assert_eq!(ids[0], "1000001111_0a1b2c3d4e.jpg#0");
    assert_eq!(strs(&data, "caption")[5], "A black dog and a white dog play in the snow .");
    assert!(strs(&data, "path")[0].ends_with("Flicker8k_Dataset/1000001111_0a1b2c3d4e.jpg"));
    assert_eq!(reasons(&rejects), [("wrong_field_count".into(), 9)]);
}

#[test]
fn csv_with_quoting_and_missing_files() {
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\", path = \"image\" }}",
        fixture("readers/generic/pairs.csv")
    )));
    assert_eq!(strs(&data, "sample_id"), ["1", "2", "5", "7"]);
    assert_eq!(
        strs(&data, "caption"),
        [
            "a dog, running on the grass",
            "a sign that says \"open\" in red letters",
            "first line\nsecond line",
            "a plain unquoted caption"
        ]
    );
    let r: Vec<String> = reasons(&rejects).into_iter().map(|x| x.0).collect();
    assert_eq!(r, ["empty_caption", "missing_file", "wrong_field_count"]);
}

#[test]
fn parquet_table_with_integer_ids_and_nulls() {
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\", path = \"image_path\" }}",
        fixture("readers/generic/pairs.parquet")
    )));
    assert_eq!(strs(&data, "sample_id"), ["1", "4"]);
    assert_eq!(strs(&data, "caption")[1], "café au lait in a tall glass");
    let r: Vec<String> = reasons(&rejects).into_iter().map(|x| x.0).collect();
    assert_eq!(r, ["missing_caption", "missing_file", "empty_caption"]);
}

#[test]
fn tables_map_columns_by_each_files_own_header() {
    // CSV: a quoted column name with a comma, a byte-order mark, CRLF ends, a blank line, a
    // quoted multi-line caption and a short record; the second file orders its columns the
    // other way round.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("h1.csv"),
        b"\xEF\xBB\xBFcaption,\"image, path\"\r\na dog,a.jpg\r\n\r\n\"two\r\nlines\",b.jpg\r\nshort\r\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("h2.csv"), b"\"image, path\",caption\nc.jpg,a cat\n").unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}/h*.csv\"\ncolumns = {{ caption = \"caption\", path = \"image, path\" }}\ncheck_files = false",
        dir.path().display()
    )));
    // Ids: the line each record starts on.
    assert_eq!(strs(&data, "sample_id"), ["h1.csv#2", "h1.csv#4", "h2.csv#2"]);
    assert_eq!(strs(&data, "caption"), ["a dog", "two\r\nlines", "a cat"]);
    let files: Vec<String> = strs(&data, "path").iter().map(|p| p.rsplit('/').next().unwrap().to_owned()).collect();
    assert_eq!(files, ["a.jpg", "b.jpg", "c.jpg"]);
    assert_eq!(reasons(&rejects), [("wrong_field_count".into(), 6)]);
    let raw = arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap());
    assert_eq!(raw.value(0), b"short", "the record's bytes, without its line end");
    assert_eq!(col(&rejects, "sample_id"), [Some("h1.csv#6".to_owned())]);

    // Parquet: `id, text` in one file, `text, id` in the next.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let write = |name: &str, cols: &[(&str, &str)]| {
        let batch = RecordBatch::try_from_iter(
            cols.iter().map(|(n, v)| (*n, std::sync::Arc::new(StringArray::from(vec![*v])) as ArrayRef)),
        )
        .unwrap();
        let f = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    write("p1.parquet", &[("id", "a"), ("text", "one dog")]);
    write("p2.parquet", &[("text", "two cats"), ("id", "b")]);
    let stage = |glob: &str| {
        format!(
            "type = \"read_table\"\npath = \"{}/{glob}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
            dir.path().display()
        )
    };
    let (_d, data, _) = run_pipeline(&read_only(&stage("p[12].parquet")));
    assert_eq!(strs(&data, "sample_id"), ["a", "b"]);
    assert_eq!(strs(&data, "caption"), ["one dog", "two cats"]);
    // A later file without a mapped column is a configuration error, found before any data.
    write("p3.parquet", &[("text", "three")]);
    let err = config_errors(read_only(&stage("p*.parquet")));
    assert!(err.contains("missing column `id` in `p3.parquet`"), "{err}");
}

#[test]
fn imagenet21k_entries_that_are_not_image_files() {
    let dir = tempfile::tempdir().unwrap();
    let synset = dir.path().join("n00000001");
    std::fs::create_dir_all(synset.join("sub.jpg")).unwrap();
    std::fs::write(synset.join("a.jpg"), b"\xff\xd8").unwrap();
    std::os::unix::fs::symlink("/nonexistent/x.jpg", synset.join("broken.jpg")).unwrap();
    // Beside the synset folders: a stray file and a folder that is no synset (counted as skipped).
    std::fs::write(dir.path().join("stray.jpg"), b"\xff\xd8").unwrap();
    std::fs::create_dir(dir.path().join("extra")).unwrap();
    let bad = std::ffi::OsStr::from_bytes(b"bad\xffname.jpg");
    std::fs::write(synset.join(bad), b"\xff\xd8").unwrap();
    // A macOS resource fork beside its image (AppleDouble metadata, named like an image).
    std::fs::write(synset.join("._a.jpg"), b"\x00\x05\x16\x07").unwrap();
    let (d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_imagenet21k\"\nroot = \"{}\"", dir.path().display())));
    assert_eq!(strs(&data, "sample_id"), ["n00000001/a.jpg"]);
    // In name order: ._a.jpg, a.jpg, bad\xffname.jpg, broken.jpg, sub.jpg.
    assert_eq!(
        reasons(&rejects),
        [("resource_fork".into(), 0), ("invalid_utf8".into(), 2), ("not_a_file".into(), 3), ("not_a_file".into(), 4)]
    );
    let raw = arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap());
    assert_eq!(raw.value(1), b"n00000001/bad\xffname.jpg");
    // The images are not read for the fingerprint (nor is the broken link followed).
    let m = json_file(&d.path().join("out/manifest.json"));
    assert!(m["input_fingerprint"].as_str().unwrap().starts_with("listing-xxh3-128:"), "{m}");
    assert_eq!(m["skipped_by_reason"], serde_json::json!({"outside_synset_folders": 2}));
}

#[test]
fn a_byte_order_mark_is_not_part_of_the_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("cc.tsv");
    std::fs::write(&tsv, b"\xEF\xBB\xBFa dog on a beach\thttp://x/1.jpg\nsecond\thttp://x/2.jpg\n").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", tsv.display())));
    assert_eq!(strs(&data, "caption"), ["a dog on a beach", "second"]);
}

#[test]
fn yfcc_urls_stay_as_they_are_and_ids_are_digits() {
    // 23-field lines: id 0, title 6, description 7, download URL 14, photo/video marker 22.
    let line = |id: &str, title: &str, url: &str| {
        let mut f = vec![""; 23];
        (f[0], f[6], f[14], f[22]) = (id, title, url, "0");
        f.join("\t")
    };
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("yfcc.tsv");
    let text = [
        line("114", "I+%3C3+NY+%3Cb%3Etoday%3C%2Fb%3E", "http://farm/a+b.jpg"),
        line("+5", "x", "http://farm/5.jpg"),
        // Blanks around an id are Python's (U+001C..U+001F too).
        line("\u{1c}7\u{1f}", "y", "http://farm/7.jpg"),
        line("8", "z", "http://farm/8-@.jpg"),
    ];
    // A download URL that is not UTF-8: the row has no image reference.
    let bytes = text.join("\n").replace("8-@", "8-\u{1}").into_bytes();
    let bytes: Vec<u8> = bytes.into_iter().map(|b| if b == 1 { 0xff } else { b }).collect();
    std::fs::write(&tsv, bytes).unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_yfcc\"\npath = \"{}\"\ncaption = \"title\"\nstrip_html = true",
        tsv.display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["114", "7"]);
    assert_eq!(strs(&data, "caption"), ["I <3 NY today", "y"], "a `<` that opens no tag stays");
    assert_eq!(strs(&data, "url"), ["http://farm/a+b.jpg", "http://farm/7.jpg"], "not form-decoded");
    assert_eq!(reasons(&rejects), [("bad_id".into(), 2), ("invalid_utf8".into(), 4)]);
    assert_eq!(strs(&rejects, "detail")[1], "the download URL is not UTF-8");
}

#[test]
fn yfcc_titles_of_many_unclosed_tags_read_as_python_reads_them() {
    // Python's parser reads each unclosed `<a` on to the end of the text, then as text: read so
    // one `<` at a time, this 90 kB title (`<b>x</b> &amp; <a <a <a …`) took seconds (a 240 kB
    // one over a minute). Its text is what Python 3.11.7's `html.parser` gives
    // (`benches/yfcc_html_check.py`'s `py_clean`).
    let n = 30_000;
    let title = format!("%3Cb%3Ex%3C%2Fb%3E+%26amp%3B+{}", "%3Ca+".repeat(n));
    let mut f = vec![""; 23];
    (f[0], f[6], f[14], f[22]) = ("1", &title, "http://farm/1.jpg", "0");
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("yfcc.tsv");
    std::fs::write(&tsv, f.join("\t")).unwrap();
    let (_d, data, _) =
        run_pipeline(&read_only(&format!("type = \"read_yfcc\"\npath = \"{}\"\ncaption = \"title\"", tsv.display())));
    assert_eq!(strs(&data, "caption"), [format!("x & {}", "<a ".repeat(n).trim_end())]);
}

#[test]
fn an_empty_headerless_table_is_a_table_of_no_rows() {
    // One shard of many may be empty (plain or compressed); with a header to map names by, an
    // empty file is an error.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.tsv"), b"").unwrap();
    std::fs::write(dir.path().join("b.tsv"), compressed(b"", "gzip", 1)).unwrap();
    std::fs::write(dir.path().join("c.tsv"), b"a dog\tu0\n").unwrap();
    std::fs::write(dir.path().join("d.csv"), b"").unwrap();
    let table = |path: &str, more: &str| {
        format!(
            "type = \"read_table\"\npath = \"{}/{path}\"\n{more}columns = {{ caption = 0, url = 1 }}",
            dir.path().display()
        )
    };
    let (_d, data, rejects) = run_pipeline(&read_only(&table("*.tsv", "")));
    assert_eq!((strs(&data, "sample_id"), rejects.iter().map(|b| b.num_rows()).sum()), (vec!["c.tsv#1".into()], 0));
    let (_d, data, _) = run_pipeline(&read_only(&table("d.csv", "header = false\n")));
    assert_eq!(data.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
    let err = config_errors(format!(
        "output_dir = \"{}/o\"\n[[stage]]\n{}\n[[stage]]\ntype = \"write_parquet\"\n",
        dir.path().display(),
        table("d.csv", "")
    ));
    assert!(err.contains("d.csv` is empty"), "{err}");
}

#[test]
fn yfcc_fields_the_caption_does_not_use_cannot_reject_a_row() {
    // 23-field lines: id 0, title 6, description 7, download URL 14, photo/video marker 22.
    let line = |id: &str, title: &str, desc: &str| {
        let mut f = vec![""; 23];
        (f[0], f[6], f[7], f[14], f[22]) = (id, title, desc, "http://farm/x.jpg", "0");
        f.join("\t")
    };
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("yfcc.tsv");
    // `%C3` alone and `%FF` decode to bytes that are not UTF-8.
    std::fs::write(&tsv, [line("1", "good", "bad%C3"), line("2", "bad%FF", "fine+text")].join("\n")).unwrap();
    let run = |caption: &str| {
        let toml = format!("type = \"read_yfcc\"\npath = \"{}\"\ncaption = \"{caption}\"", tsv.display());
        let (_d, data, rejects) = run_pipeline(&read_only(&toml));
        (strs(&data, "caption"), reasons(&rejects))
    };
    assert_eq!(run("title"), (vec!["good".to_string()], vec![("invalid_utf8".into(), 2)]));
    assert_eq!(run("description"), (vec!["fine text".to_string()], vec![("invalid_utf8".into(), 1)]));
    assert_eq!(run("title_and_description").1, [("invalid_utf8".into(), 1), ("invalid_utf8".into(), 2)]);
}

#[test]
fn parquet_text_that_is_not_utf8_rejects_its_row_only() {
    // Writers that do not check their strings (Spark, or pyarrow through a binary view) can
    // store bytes that are not UTF-8 in a text column; Arrow's reader would fail the file.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let s = |v: Vec<Option<&str>>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let values: [&[u8]; 3] = [b"a dog", b"bad \xff cap", b"a cat"];
    let offsets = arrow_buffer::OffsetBuffer::from_lengths(values.iter().map(|v| v.len()));
    // SAFETY (of the test's input only): the invalid bytes are the point; curate reads the
    // file back, never this array.
    let captions = unsafe { StringArray::new_unchecked(offsets, arrow_buffer::Buffer::from(values.concat()), None) };
    // A second bad value in the same row (img2dataset's `raw` keeps it as stored too).
    let values: [&[u8]; 3] = [b"success", b"succ\xfeess", b"success"];
    let offsets = arrow_buffer::OffsetBuffer::from_lengths(values.iter().map(|v| v.len()));
    let status = unsafe { StringArray::new_unchecked(offsets, arrow_buffer::Buffer::from(values.concat()), None) };
    let batch = RecordBatch::try_from_iter([
        ("caption", std::sync::Arc::new(captions) as ArrayRef),
        ("url", s(vec![Some("u0"), Some("u1"), Some("u2")])),
        ("key", s(vec![Some("k0"), Some("k1"), Some("k2")])),
        ("status", std::sync::Arc::new(status) as ArrayRef),
    ])
    .unwrap();
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let raw_of = |rejects: &[arrow_array::RecordBatch]| {
        arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap()).value(0).to_vec()
    };
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(strs(&data, "sample_id"), ["k0", "k2"]);
    assert_eq!(reasons(&rejects), [("invalid_utf8".into(), 1)]);
    assert_eq!(col(&rejects, "sample_id"), [Some("k1".into())]);
    assert_eq!(raw_of(&rejects), b"k1\tbad \xff cap\tu1\tsucc\xfeess");
    // A table reader: a mapped column rejects the row; a column it does not map is not read.
    let table = |columns: &str| {
        let toml = format!("type = \"read_table\"\npath = \"{}\"\ncolumns = {{ {columns} }}", path.display());
        let (_d, data, rejects) = run_pipeline(&read_only(&toml));
        (strs(&data, "sample_id"), reasons(&rejects), rejects)
    };
    let (ids, why, rejects) = table("sample_id = \"key\", caption = \"caption\"");
    assert_eq!((ids, why), (vec!["k0".to_string(), "k2".into()], vec![("invalid_utf8".into(), 1)]));
    assert_eq!(raw_of(&rejects), b"bad \xff cap");
    let (ids, why, _) = table("sample_id = \"key\", url = \"url\"");
    assert_eq!((ids.len(), why.len()), (3, 0));
}

#[test]
fn img2dataset_shards_as_pandas_and_python_write_them() {
    // pandas writes a column of Nones as Arrow type `null`; Python's `json.dumps` writes NaN
    // and infinities, which `json.loads` reads; a `KEY.json` may start with a byte-order mark.
    use arrow_array::{ArrayRef, NullArray, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let s = |v: Vec<Option<&str>>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("caption", std::sync::Arc::new(NullArray::new(2)) as ArrayRef),
        ("url", s(vec![Some("u0"), Some("u1")])),
        ("key", s(vec![Some("k0"), Some("k1")])),
        ("status", s(vec![Some("success"); 2])),
    ])
    .unwrap();
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!((data.iter().map(|b| b.num_rows()).sum::<usize>(), reasons(&rejects).len()), (0, 2));
    assert!(reasons(&rejects).iter().all(|(r, _)| r == "missing_caption"), "{:?}", reasons(&rejects));

    let (file, img) = (tar::EntryType::Regular, &b"\xff\xd8"[..]);
    raw_shard(
        &dir.path().join("00001.tar"),
        &[
            (b"0.jpg", img, file),
            (b"0.json", b"{\"punsafe\": NaN, \"url\": \"u0\", \"w\": [Infinity, -Infinity], \"t\": \"NaN\"}", file),
            (b"0.txt", b"a dog", file),
            (b"1.jpg", img, file),
            (b"1.json", b"\xef\xbb\xbf{\"url\": \"u1\"}", file),
            (b"1.txt", b"a cat", file),
            (b"2.jpg", img, file),
            (b"2.json", b"{\"url\": \"u2\", \"x\": NaNa}", file),
            (b"2.txt", b"a bird", file),
        ],
    );
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_img2dataset\"\npath = \"{}\"",
        dir.path().join("00001.tar").display()
    )));
    assert_eq!(col(&data, "url"), [Some("u0".into()), Some("u1".into())]);
    assert_eq!(reasons(&rejects), [("bad_json".into(), 6)], "`NaNa` is not JSON (the sample starts at member 6)");
}

#[test]
fn webdataset_keys_seen_twice_and_shards_cut_short() {
    let dir = tempfile::tempdir().unwrap();
    let shard = |name: &str, members: &[(&str, &[u8])]| {
        let p = dir.path().join(name);
        let mut b = tar::Builder::new(std::fs::File::create(&p).unwrap());
        for (member, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, member, *data).unwrap();
        }
        b.finish().unwrap();
        p
    };
    let img: &[u8] = b"\xff\xd8";
    shard("00000.tar", &[("0.jpg", img), ("0.txt", b"a dog"), ("1.jpg", img), ("1.txt", b"a cat")]);
    // Key `1` again, then a shard whose last sample is cut inside its caption.
    shard("00001.tar", &[("1.jpg", img), ("1.txt", b"a cat again"), ("2.jpg", img), ("2.txt", b"a bird")]);
    let third = shard("00002.tar", &[("3.jpg", img), ("3.txt", b"a fish"), ("4.jpg", img), ("4.txt", b"a horse")]);
    let bytes = std::fs::read(&third).unwrap();
    // Members are a header block and a data block each: cut inside `4.txt`'s data block.
    std::fs::write(&third, &bytes[..3 * 1024 + 512 + 3]).unwrap();
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}/*.tar\"", dir.path().display())));
    assert_eq!(strs(&data, "sample_id"), ["0", "1", "2", "3"]);
    let r: Vec<(String, String)> =
        col(&rejects, "source_file").into_iter().flatten().zip(strs(&rejects, "reason")).collect();
    assert_eq!(r, [("00001.tar".into(), "duplicate_key".into()), ("00002.tar".into(), "truncated_tar".into())]);
}

#[test]
fn dictionary_encoded_bytes_that_are_not_utf8_reject_as_plain_bytes_do() {
    // A categorical byte column (pyarrow's `dictionary_encode`, pandas' `category`) with a value
    // that is not UTF-8: img2dataset rejected the caption as `missing_caption` (raw null) and
    // kept the url as a null; a table gave an empty `raw`. Both must match plain bytes.
    use arrow_array::types::Int32Type;
    use arrow_array::{ArrayRef, BinaryArray, DictionaryArray, Int32Array, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let dict = |v: Vec<&[u8]>| -> ArrayRef {
        let keys = Int32Array::from((0..v.len() as i32).collect::<Vec<_>>());
        std::sync::Arc::new(
            DictionaryArray::<Int32Type>::try_new(keys, std::sync::Arc::new(BinaryArray::from(v))).unwrap(),
        )
    };
    let s = |v: Vec<&str>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("key", s(vec!["0", "1", "2"])),
        ("caption", dict(vec![b"a dog", b"caf\xe9 latin-1", b"a cat"])),
        ("url", dict(vec![b"http://a", b"http://b", b"http://c/\xff"])),
        ("status", s(vec!["success"; 3])),
    ])
    .unwrap();
    assert!(matches!(batch.column(1).data_type(), arrow_schema::DataType::Dictionary(..)));
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(strs(&data, "sample_id"), ["0"]);
    assert_eq!(reasons(&rejects), [("invalid_utf8".into(), 1), ("invalid_utf8".into(), 2)]);
    let raw = |rejects: &[RecordBatch], i: usize| {
        arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap()).value(i).to_vec()
    };
    assert_eq!(raw(&rejects, 0), b"1\tcaf\xe9 latin-1\thttp://b\tsuccess");
    assert_eq!(raw(&rejects, 1), b"2\ta cat\thttp://c/\xff\tsuccess");
    // The table reader: the value's bytes as they were.
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"key\", caption = \"caption\" }}",
        path.display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["0", "2"]);
    assert_eq!(reasons(&rejects), [("invalid_utf8".into(), 1)]);
    assert_eq!(raw(&rejects, 0), b"caf\xe9 latin-1");
}

#[test]
fn parquet_binary_captions_that_are_not_utf8() {
    use arrow_array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let ids: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["b1", "b2"]));
    let text: ArrayRef = std::sync::Arc::new(BinaryArray::from(vec![&b"a dog"[..], &b"caf\xe9"[..]]));
    let batch = RecordBatch::try_from_iter([("id", ids), ("text", text)]).unwrap();
    let f = std::fs::File::create(dir.path().join("bin.parquet")).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}/bin.parquet\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
        dir.path().display()
    )));
    assert_eq!(strs(&data, "caption"), ["a dog"]);
    assert_eq!(reasons(&rejects), [("invalid_utf8".into(), 1)]);
    let raw = arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap());
    assert_eq!(raw.value(0), b"caf\xe9", "the value's bytes as they were");
}

#[test]
fn tables_with_their_own_ids_reject_repeated_and_missing_ids() {
    // CSV (read in order), TSV (blocks parsed in parallel, checked in order) and Parquet: the
    // first row with an id stays, a later one is `duplicate_id`; an empty or null id is
    // `missing_id`; rejects carry the id that was read.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("t.csv"),
        "id,text,url\n,first caption,u1\n  ,second caption,u2\na,third,u3\nb,,u4\na,fourth,u5\nb,fifth,u6\nc,,u7\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("t.tsv"),
        "id\ttext\turl\n\tfirst caption\tu1\n  \tsecond caption\tu2\na\tthird\tu3\nb\t\tu4\na\tfourth\tu5\nb\tfifth\tu6\nc\t\tu7\n",
    )
    .unwrap();
    for (file, format) in [("t.csv", "csv"), ("t.tsv", "tsv")] {
        let (_d, data, rejects) = run_pipeline(&read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\nformat = \"{format}\"\nheader = true\n\
             columns = {{ sample_id = \"id\", caption = \"text\", url = \"url\" }}",
            dir.path().join(file).display()
        )));
        assert_eq!(strs(&data, "sample_id"), ["a", "b"], "{format}");
        assert_eq!(strs(&data, "caption"), ["third", "fifth"], "{format}");
        let got: Vec<(String, Option<String>, String)> = strs(&rejects, "reason")
            .into_iter()
            .zip(col(&rejects, "sample_id"))
            .zip(raws(&rejects))
            .map(|((r, id), raw)| (r, id, raw))
            .collect();
        let sep = if format == "csv" { "," } else { "\t" };
        let want = [
            ("missing_id", None, format!("{sep}first caption{sep}u1")),
            ("missing_id", None, format!("  {sep}second caption{sep}u2")),
            ("empty_caption", Some("b"), format!("b{sep}{sep}u4")),
            ("duplicate_id", Some("a"), format!("a{sep}fourth{sep}u5")),
            ("empty_caption", Some("c"), format!("c{sep}{sep}u7")),
        ];
        let want: Vec<(String, Option<String>, String)> =
            want.into_iter().map(|(r, id, raw)| (r.to_owned(), id.map(str::to_owned), raw)).collect();
        // In line order: the repeat found after the parse sits between the parse's rejects.
        assert_eq!(got, want, "{format}");
        let rows: Vec<u64> = reasons(&rejects).into_iter().map(|(_, row)| row).collect();
        assert_eq!(rows, [2, 3, 5, 6, 8], "{format}: 1-based lines");
    }
}

#[test]
fn parquet_tables_and_yfcc_reject_repeated_ids() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let ids: ArrayRef = std::sync::Arc::new(StringArray::from(vec![Some("x"), None, Some("x"), Some("y")]));
    let text: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a dog", "a cat", "a bird", "a fish"]));
    let batch = RecordBatch::try_from_iter([("id", ids), ("text", text)]).unwrap();
    let path = dir.path().join("t.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
        path.display()
    )));
    assert_eq!(strs(&data, "caption"), ["a dog", "a fish"]);
    // (reason, row): Parquet rows count from 0.
    assert_eq!(reasons(&rejects), [("missing_id".into(), 1), ("duplicate_id".into(), 2)]);
    assert_eq!(col(&rejects, "sample_id").into_iter().flatten().collect::<Vec<_>>(), ["x"]);

    // YFCC: the same photo in two files (23 fields: id 0, title 6, marker 22).
    let line = |id: &str, title: &str| {
        let mut f = vec![""; 23];
        (f[0], f[6], f[22]) = (id, title, "0");
        f.join("\t")
    };
    std::fs::write(dir.path().join("a.tsv"), [line("7", "a+dog"), line("8", "")].join("\n")).unwrap();
    std::fs::write(dir.path().join("b.tsv"), [line("7", "a+dog+again"), line("9", "a+cat")].join("\n")).unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_yfcc\"\npath = [\"{0}/a.tsv\", \"{0}/b.tsv\"]\ncaption = \"title\"",
        dir.path().display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["7", "9"]);
    let r: Vec<(String, Option<String>, Option<String>)> = strs(&rejects, "reason")
        .into_iter()
        .zip(col(&rejects, "sample_id"))
        .zip(col(&rejects, "source_file"))
        .map(|((r, id), f)| (r, id, f))
        .collect();
    assert_eq!(
        r,
        [
            ("empty_caption".into(), Some("8".into()), Some("a.tsv".into())),
            ("duplicate_id".into(), Some("7".into()), Some("b.tsv".into()))
        ]
    );
}

fn raws(rejects: &[arrow_array::RecordBatch]) -> Vec<String> {
    use arrow_array::cast::AsArray;
    let mut out = Vec::new();
    for b in rejects {
        let raw = b.column_by_name("raw").unwrap().as_binary::<i32>();
        out.extend((0..b.num_rows()).map(|i| String::from_utf8_lossy(raw.value(i)).into_owned()));
    }
    out
}

#[test]
fn an_old_shard_that_cannot_be_moved_aside_is_deleted_in_place() {
    // Moving an old shard aside fails (here a folder of that name is in the way, left by a run
    // that was killed while deleting; a data folder on another file system fails the same way):
    // it is deleted where it is, and `.curate-stale/` goes with the run's clearing.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_toml(cc_pipeline(&out, "data", None)).unwrap();
    let first = std::fs::read(out.join("data/part-00000.parquet")).unwrap();
    std::fs::create_dir_all(out.join(".curate-stale/0-part-00000.parquet/x")).unwrap();
    run_toml(cc_pipeline(&out, "data", None)).unwrap();
    assert!(!out.join(".curate-stale").exists());
    assert_eq!(std::fs::read(out.join("data/part-00000.parquet")).unwrap(), first, "this run's shard");
}

#[test]
fn a_pipeline_cannot_read_the_shards_its_run_would_clear() {
    // Re-reading an earlier run's output in the same folder: refused, and the shard is kept.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let first = |data_dir: &str| run_toml(cc_pipeline(&out, data_dir, None)).unwrap();
    let again = |input: &str| {
        run_toml(format!(
            "output_dir = {:?}\n[[stage]]\ntype = \"read_table\"\npath = {:?}\nformat = \"parquet\"\ncolumns = {{ sample_id = \"sample_id\", caption = \"caption\" }}\n[[stage]]\ntype = \"write_parquet\"\n",
            out.to_string_lossy(),
            out.join(input).to_string_lossy()
        ))
    };
    first("data");
    let err = again("data/part-00000.parquet").unwrap_err().to_string();
    assert!(err.contains("a run replaces or clears it before reading"), "{err}");
    assert!(out.join("data/part-00000.parquet").exists());
    // So are the files a run writes beside its shards (a table saved there by hand under one of
    // their names), and the plots it draws; other plots are the user's, and may be read.
    for name in ["report.md", "config.json", "manifest.json", "plots/bow_word_rank.svg", "plots/mine.svg"] {
        let kept = std::fs::read(out.join("data/part-00000.parquet")).unwrap();
        std::fs::create_dir_all(out.join("plots")).unwrap();
        std::fs::write(out.join(name), &kept).unwrap();
        let result = again(name);
        assert_eq!(std::fs::read(out.join(name)).unwrap(), kept, "{name} is not touched before it is read");
        if name == "plots/mine.svg" {
            result.unwrap();
        } else {
            let err = result.unwrap_err().to_string();
            assert!(err.contains("a run replaces or clears it before reading"), "{name}: {err}");
        }
    }
    // The shards of the folder an earlier run wrote to are cleared too: also refused (at run time,
    // where the earlier `config.json` is read).
    first("d2");
    let err = again("d2/part-00000.parquet").unwrap_err().to_string();
    assert!(err.contains("would be replaced or deleted before it is read"), "{err}");
    assert!(out.join("d2/part-00000.parquet").exists());
}

#[test]
fn a_runs_config_json_runs_again_to_the_same_bytes() {
    // `curate run out/x/config.json` repeats a run: every setting is in it, resolved.
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    run_toml(cc_pipeline(&a, "data", Some("base_fraction = 0.5\nkeep_words = 2"))).unwrap();
    let set = [format!("output_dir={}", b.display())];
    let plan = curate::pipeline::compile(&a.join("config.json"), &set).unwrap();
    curate::pipeline::run(plan, &Default::default()).unwrap();
    for f in ["data/part-00000.parquet", "rejects/part-00000.parquet"] {
        assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap(), "{f}");
    }
    let config = |d: &std::path::Path| -> serde_json::Value {
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
        c.as_object_mut().unwrap().remove("output_dir");
        c
    };
    assert_eq!(config(&a), config(&b));
}

#[test]
fn the_manifest_says_whether_the_input_was_kept_between_passes() {
    // The BoW stage's fit pass and the streaming pass: with the input in memory, or, past the
    // cache budget, read again (same bytes either way).
    let dir = tempfile::tempdir().unwrap();
    let cases = [(usize::MAX, "kept in memory"), (1, "over budget (read again)"), (0, "off (read again)")];
    let mut outputs = Vec::new();
    for (i, (budget, state)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("o{i}"));
        let doc = curate::pipeline::config::ConfigDoc::parse(
            std::path::Path::new("t.toml"),
            cc_pipeline(&out, "data", Some("base_fraction = 0.5")),
            &[],
        )
        .unwrap();
        let opts = curate::pipeline::RunOptions { cache_bytes: budget, ..Default::default() };
        curate::pipeline::run(curate::pipeline::plan::compile_doc(&doc).unwrap(), &opts).unwrap();
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
        assert_eq!(m["input_cache"], state, "budget {budget}");
        outputs.push(std::fs::read(out.join("data/part-00000.parquet")).unwrap());
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]));
    // Without a stage that needs a fit pass, nothing is kept.
    let out = dir.path().join("intact");
    run_toml(cc_pipeline(&out, "data", None)).unwrap();
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["input_cache"], "not needed");
}

#[test]
fn parquet_inputs_in_every_common_codec_are_read() {
    // polars writes ZSTD by default, pyarrow Snappy; GZIP and Brotli are options of both.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
    let dir = tempfile::tempdir().unwrap();
    let ids: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["p", "q"]));
    let text: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a red kite", "two dogs on grass"]));
    let batch = RecordBatch::try_from_iter([("id", ids), ("text", text)]).unwrap();
    for codec in [
        Compression::ZSTD(ZstdLevel::default()),
        Compression::GZIP(GzipLevel::default()),
        Compression::BROTLI(BrotliLevel::default()),
        Compression::SNAPPY,
        Compression::LZ4,
        Compression::LZ4_RAW,
        Compression::UNCOMPRESSED,
    ] {
        let path = dir.path().join(format!("{codec:?}.parquet").replace(['(', ')', ' ', '{', '}', ':'], "_"));
        let props = parquet::file::properties::WriterProperties::builder().set_compression(codec).build();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), Some(props))
                .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let (_d, data, rejects) = run_pipeline(&read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
            path.display()
        )));
        assert_eq!(strs(&data, "caption"), ["a red kite", "two dogs on grass"], "{codec:?}");
        assert!(rejects.iter().all(|b| b.num_rows() == 0), "{codec:?}");
    }
}

#[test]
fn a_run_that_fails_part_way_leaves_no_shards() {
    // Two input files, the second not Parquet past its footer check: the run fails, the error
    // names the file, and neither the first file's rows nor empty shards are left in `data/`
    // or `rejects/` to be read by a glob as if complete (1 row per shard: the first file's
    // rows are finished shards before the failure).
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let text: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a red kite", "two dogs", "", "a cat"]));
    let batch = RecordBatch::try_from_iter([("text", text)]).unwrap();
    let good = dir.path().join("a.parquet");
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&good).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    // A valid footer over data pages that are garbage: the schema reads, the data does not.
    let mut bytes = std::fs::read(&good).unwrap();
    for b in &mut bytes[4..40] {
        *b = 0xff;
    }
    let bad = dir.path().join("b.parquet");
    std::fs::write(&bad, bytes).unwrap();
    let out = dir.path().join("out");
    let toml = format!(
        "output_dir = \"{}\"\n[[stage]]\ntype = \"read_table\"\npath = [\"{}\", \"{}\"]\n\
         columns = {{ caption = \"text\" }}\n[[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 1\n",
        out.display(),
        good.display(),
        bad.display()
    );
    let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
    let plan = curate::pipeline::plan::compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
    let err = curate::pipeline::run(plan, &curate::pipeline::RunOptions::default()).unwrap_err().to_string();
    assert!(err.contains("b.parquet"), "the error names the file: {err}");
    for sub in ["data", "rejects"] {
        let left: Vec<String> = std::fs::read_dir(out.join(sub))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "{sub}/ after a failed run: {left:?}");
    }
    assert!(!out.join("manifest.json").exists());
}

/// A CC TSV pipeline into `out` with one row per shard, compiled.
fn cc_plan(input: &std::path::Path, out: &std::path::Path) -> curate::pipeline::plan::Plan {
    let toml = format!(
        "output_dir = \"{}\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"{}\"\n\
         [[stage]]\ntype = \"write_parquet\"\nrows_per_shard = 1\n",
        out.display(),
        input.display()
    );
    let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
    curate::pipeline::plan::compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"))
}

/// The run shards (`part-*`, `.part-*.tmp`) in `dir`.
fn shards_in(dir: &std::path::Path) -> Vec<String> {
    let names =
        std::fs::read_dir(dir).into_iter().flatten().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
    names.filter(|n| n.contains("part-")).collect()
}

/// A reader that appends a line to its input each time it opens it, as a download still
/// going on would.
struct Growing(Box<dyn curate::stages::Reader>);

impl curate::stages::Reader for Growing {
    fn inputs(&self) -> Vec<std::path::PathBuf> {
        self.0.inputs()
    }
    fn open(&self) -> curate::Result<curate::stages::ChunkIter<'_>> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&self.0.inputs()[0]).unwrap();
        f.write_all(b"one more\thttp://more\n").unwrap();
        self.0.open()
    }
}

#[test]
fn an_input_that_changes_during_the_run_fails_it_and_leaves_no_shards() {
    // The data would mix two versions of the file, and the manifest would fingerprint neither:
    // the run fails, and the shards it had finished go.
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("cc.tsv"), dir.path().join("out"));
    std::fs::write(&input, "a dog\thttp://a\na cat\thttp://b\n").unwrap();
    let mut plan = cc_plan(&input, &out);
    plan.reader = Box::new(Growing(plan.reader));
    let err = curate::pipeline::run(plan, &curate::pipeline::RunOptions::default()).unwrap_err().to_string();
    assert!(err.contains("cc.tsv` changed while the run read it"), "{err}");
    assert_eq!(shards_in(&out.join("data")), Vec::<String>::new());
    assert_eq!(shards_in(&out.join("rejects")), Vec::<String>::new());
    assert!(!out.join("manifest.json").exists());
    // Unchanged, the same input runs.
    curate::pipeline::run(cc_plan(&input, &out), &Default::default()).unwrap();
    assert_eq!(shards_in(&out.join("data")).len(), 3);
}

#[test]
fn a_run_that_fails_at_its_report_leaves_no_shards() {
    // The data shards are finished when the report cannot be written (here a folder stands
    // where its temporary file goes; a full disk does the same): they go, with no manifest.
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("cc.tsv"), dir.path().join("out"));
    std::fs::write(&input, "a dog\thttp://a\n").unwrap();
    std::fs::create_dir_all(out.join(".report.md.tmp")).unwrap();
    let err = curate::pipeline::run(cc_plan(&input, &out), &Default::default()).unwrap_err().to_string();
    assert!(err.contains(".report.md.tmp"), "{err}");
    assert_eq!(shards_in(&out.join("data")), Vec::<String>::new());
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn one_run_at_a_time_writes_to_a_folder() {
    use std::os::unix::io::AsRawFd;
    let dir = tempfile::tempdir().unwrap();
    let (input, out) = (dir.path().join("cc.tsv"), dir.path().join("out"));
    std::fs::write(&input, "a dog\thttp://a\n").unwrap();
    std::fs::create_dir_all(&out).unwrap();
    // Another run holds the folder.
    let held = std::fs::File::open(&out).unwrap();
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let err = curate::pipeline::run(cc_plan(&input, &out), &Default::default()).unwrap_err().to_string();
    assert!(err.contains("another curate run is writing to"), "{err}");
    drop(held);
    curate::pipeline::run(cc_plan(&input, &out), &Default::default()).unwrap();
    assert!(out.join("manifest.json").exists());
}

#[test]
fn table_rows_must_have_the_tables_width() {
    // A tab inside a caption shifts the columns after it: with a header the header's width is
    // the rule, without one the usual width of the first lines (here 3; one 2-field line).
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "h.tsv",
            "tsv",
            true,
            "caption\turl\tlicense\na dog\thttp://h/1\tCC\ncap with\ttab\thttp://h/2\tCC\nshort\thttp://h/3\n",
        ),
        (
            "n.tsv",
            "tsv",
            false,
            "a dog\thttp://h/1\tCC\ncap with\ttab\thttp://h/2\tCC\nshort\thttp://h/3\nok\thttp://h/4\tCC\n",
        ),
        (
            "h.csv",
            "csv",
            true,
            "caption,url,license\na dog,http://h/1,CC\ncap with,comma,http://h/2,CC\nshort,http://h/3\n",
        ),
        (
            "n.csv",
            "csv",
            false,
            "a dog,http://h/1,CC\ncap with,comma,http://h/2,CC\nshort,http://h/3\nok,http://h/4,CC\n",
        ),
    ];
    for (file, format, header, text) in cases {
        std::fs::write(dir.path().join(file), text).unwrap();
        let (_d, data, rejects) = run_pipeline(&read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\nformat = \"{format}\"\nheader = {header}\n\
             columns = {{ caption = 0, url = 1 }}",
            dir.path().join(file).display()
        )));
        let want_data: &[&str] = if header { &["a dog"] } else { &["a dog", "ok"] };
        assert_eq!(strs(&data, "caption"), want_data, "{file}");
        assert_eq!(strs(&data, "url")[0], "http://h/1", "{file}");
        let first = u64::from(header) + 2;
        assert_eq!(
            reasons(&rejects),
            [("wrong_field_count".into(), first), ("wrong_field_count".into(), first + 1)],
            "{file}"
        );
        assert_eq!(strs(&rejects, "detail"), ["4 fields, expected 3", "2 fields, expected 3"], "{file}");
    }
}

#[test]
fn csv_lines_may_end_in_a_lone_cr() {
    // Old Mac exports ("CSV (Macintosh)") end lines with CR alone: each record has its own line
    // number, as Python's csv module counts them, so `file#line` ids stay unique.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mac.csv"), "id_col,caption,url\r1,a dog,u1\r2,a cat,u2\r\r3,a bird,u3\r").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ caption = \"caption\", url = \"url\" }}",
        dir.path().join("mac.csv").display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["mac.csv#2", "mac.csv#3", "mac.csv#5"]);
    assert_eq!(strs(&data, "caption"), ["a dog", "a cat", "a bird"]);
}

#[test]
fn invalid_utf8_rejects_carry_an_id_that_reads() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), b"id,text\n1,caf\xe9 au lait\n\xff,bad id\n2,fine\n").unwrap();
    std::fs::write(dir.path().join("t.tsv"), b"id\ttext\n1\tcaf\xe9 au lait\n\xff\tbad id\n2\tfine\n").unwrap();
    for file in ["t.csv", "t.tsv"] {
        let (_d, data, rejects) = run_pipeline(&read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\nheader = true\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
            dir.path().join(file).display()
        )));
        assert_eq!(strs(&data, "sample_id"), ["2"], "{file}");
        assert_eq!(reasons(&rejects), [("invalid_utf8".into(), 2), ("invalid_utf8".into(), 3)], "{file}");
        assert_eq!(col(&rejects, "sample_id"), [Some("1".to_owned()), None], "{file}");
    }
}

#[test]
fn a_line_without_its_separator_has_no_id() {
    // A space typed for the tab (as on three Flickr8k lines): the one field is the whole line,
    // not an id. A line with too many fields still has its id field.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.tsv"), "id1\tcap one\nid3 cap three\nid4\tcap\textra\nid5\tcap five\n").unwrap();
    std::fs::write(dir.path().join("t.csv"), "id1,cap one\nid3 cap three\nid4,cap,extra\nid5,cap five\n").unwrap();
    for file in ["t.tsv", "t.csv"] {
        let (_d, data, rejects) = run_pipeline(&read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\nheader = false\ncolumns = {{ sample_id = 0, caption = 1 }}",
            dir.path().join(file).display()
        )));
        assert_eq!(strs(&data, "sample_id"), ["id1", "id5"], "{file}");
        assert_eq!(reasons(&rejects), [("wrong_field_count".into(), 2), ("wrong_field_count".into(), 3)], "{file}");
        assert_eq!(col(&rejects, "sample_id"), [None, Some("id4".to_owned())], "{file}");
    }
}

#[test]
fn rejects_name_their_stage_as_the_pipeline_file_does() {
    // A named stage's rejects, by-reason counts and report all use its name.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("c.tsv");
    std::fs::write(&input, "a dog on grass\thttp://a\nbad line\n. . .\thttp://c\n").unwrap();
    let (d, _data, rejects) = run_pipeline(&format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_cc_tsv\"\nname = \"cc\"\npath = \"{}\"\n\
         [[stage]]\ntype = \"bow\"\nname = \"deform\"\nmode = \"only\"\nlimit_to_base_vocab = false\nrm_top_freq = 0\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        input.display()
    ));
    assert_eq!(strs(&rejects, "stage"), ["cc", "deform"]);
    let manifest = json_file(&d.path().join("out/manifest.json"));
    let keys: Vec<&String> = manifest["rejects_by_reason"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["cc/wrong_field_count", "deform/empty_after_bow"]);
    let report = json_file(&d.path().join("out/report.json"));
    assert!(report["stages"]["deform"].is_object());
}

#[test]
fn imagenet21k_extensions_must_be_extensions() {
    let toml = format!(
        "output_dir = \"out/never\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = \"{}\"\n\
         extensions = [\"*.jpeg\", \"\", \".png\"]\n[[stage]]\ntype = \"write_parquet\"\n",
        fixture("readers/imagenet21k/train")
    );
    let err = config_errors(toml.clone());
    assert!(err.contains("`*.jpeg` is not a file extension"), "{err}");
    assert!(err.contains("`` is not a file extension"), "{err}");
    assert!(!err.contains("`.png`"), "`.png` is one: {err}");
    // No extension at all would reject every file.
    let err = config_errors(toml.replace("[\"*.jpeg\", \"\", \".png\"]", "[]"));
    assert!(err.contains("no extension is listed: every file would be rejected"), "{err}");
}

#[test]
fn img2dataset_keys_must_not_be_blank() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let col = |v: Vec<Option<&str>>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("key", col(vec![Some(""), Some("000000001"), None, Some(" ")])),
        ("caption", col(vec![Some("a dog"), Some("a cat"), Some("a bird"), Some("a fish")])),
        ("url", col(vec![Some("u0"), Some("u1"), Some("u2"), Some("u3")])),
        ("status", col(vec![Some("success"); 4])),
    ])
    .unwrap();
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(strs(&data, "sample_id"), ["000000001"]);
    assert_eq!(reasons(&rejects), [("missing_key".into(), 0), ("missing_key".into(), 2), ("missing_key".into(), 3)]);
    assert_eq!(common::col(&rejects, "sample_id"), [None, None, None], "a blank key names no sample");
}

/// Writes `members` (name bytes, data, tar entry type) as a tar shard at `path`.
fn raw_shard(path: &std::path::Path, members: &[(&[u8], &[u8], tar::EntryType)]) {
    use std::os::unix::ffi::OsStrExt;
    let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, data, kind) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(*kind);
        h.set_path(std::ffi::OsStr::from_bytes(name)).unwrap();
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.finish().unwrap();
}

#[test]
fn webdataset_json_member_names_and_types() {
    let dir = tempfile::tempdir().unwrap();
    let file = tar::EntryType::Regular;
    let img: &[u8] = b"\xff\xd8";
    let deep = format!("{{\"url\": \"u0\", \"x\": {}1{}}}", "[".repeat(300), "]".repeat(300));
    raw_shard(
        &dir.path().join("00000.tar"),
        &[
            // Valid JSON however deep or large its numbers: only `url` is read.
            (b"0.jpg", img, file),
            (b"0.json", deep.as_bytes(), file),
            (b"0.txt", b"a dog", file),
            (b"1.jpg", img, file),
            (b"1.json", b"{\"n\": 1e400, \"url\": \"u1\"}", file),
            (b"1.txt", b"a cat", file),
            // Not UTF-8: not JSON.
            (b"2.jpg", img, file),
            (b"2.json", b"{\"url\": \"\xff\"}", file),
            (b"2.txt", b"a bird", file),
            // Names that are not UTF-8 have no key: each is its own reject, never merged.
            (b"d\xff.jpg", img, file),
            (b"d\xfe.txt", b"a fish", file),
            // No key before the extension.
            (b".jpg", img, file),
            (b".txt", b"a horse", file),
            // A byte-order mark is not part of the caption; type `7` is a regular file.
            (b"3.jpg", img, tar::EntryType::Continuous),
            (b"3.txt", b"\xef\xbb\xbfa cow", file),
        ],
    );
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}/*.tar\"", dir.path().display())));
    assert_eq!(strs(&data, "sample_id"), ["0", "1", "3"]);
    assert_eq!(col(&data, "url"), [Some("u0".into()), Some("u1".into()), None]);
    assert_eq!(strs(&data, "caption"), ["a dog", "a cat", "a cow"]);
    assert_eq!(
        reasons(&rejects),
        [("bad_json".into(), 6), ("invalid_utf8".into(), 9), ("invalid_utf8".into(), 10), ("missing_key".into(), 11)]
    );
    assert_eq!(col(&rejects, "sample_id"), [Some("2".into()), None, None, None], "no key, no id");
    let raw = arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap());
    assert_eq!((raw.value(1), raw.value(2)), (&b"d\xff.jpg"[..], &b"d\xfe.txt"[..]), "the names' bytes");
}

#[test]
fn a_damaged_member_whose_name_is_not_utf8_starts_a_sample_of_its_own() {
    // `d\xff.txt`, cut short, has no key: it cannot belong to sample `d\u{FFFD}` before it (whose
    // name is that text, in UTF-8), which is whole and kept. A caption of a byte-order mark and
    // whitespace is empty; `raw` keeps its stored bytes.
    let dir = tempfile::tempdir().unwrap();
    let (file, img) = (tar::EntryType::Regular, &b"\xff\xd8"[..]);
    let shard = dir.path().join("00000.tar");
    let cat = "a cat ".repeat(80);
    raw_shard(
        &shard,
        &[
            (b"b.jpg", img, file),
            (b"b.txt", b"\xef\xbb\xbf \t", file),
            ("d\u{FFFD}.jpg".as_bytes(), img, file),
            ("d\u{FFFD}.txt".as_bytes(), b"a dog", file),
            (b"d\xff.txt", cat.as_bytes(), file),
        ],
    );
    // Into the last member's data: past the end-of-archive blocks and its one data block.
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&shard).unwrap().set_len(len - 1024 - 512 + 100).unwrap();
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", shard.display())));
    assert_eq!(strs(&data, "sample_id"), ["d\u{FFFD}"]);
    assert_eq!(strs(&data, "caption"), ["a dog"]);
    assert_eq!(reasons(&rejects), [("empty_caption".into(), 0), ("truncated_tar".into(), 4)]);
    assert_eq!(col(&rejects, "sample_id"), [Some("b".into()), None]);
    let raw = arrow_array::cast::AsArray::as_binary::<i32>(rejects[0].column_by_name("raw").unwrap());
    assert_eq!(raw.value(0), b"\xef\xbb\xbf \t");
}

#[test]
fn img2dataset_parquet_blank_keys_and_failed_downloads() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let s = |v: Vec<Option<&str>>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("key", s(vec![Some("\u{1c}"), Some("k1"), Some("k2"), Some("k3")])),
        ("caption", s(vec![Some("a dog"), Some("a cat"), Some("a bird"), Some("a fish")])),
        ("url", s(vec![Some("u"), Some("u"), Some("u"), Some("u")])),
        ("status", s(vec![Some("success"), Some("failed_to_download"), Some("failed_to_download"), Some("success")])),
        ("error_message", s(vec![None, None, Some("timeout"), None])),
    ])
    .unwrap();
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(strs(&data, "sample_id"), ["k3"]);
    // U+001C is whitespace for keys as for captions (Python's `str.split`).
    assert_eq!(
        reasons(&rejects),
        [("missing_key".into(), 0), ("download_failed".into(), 1), ("download_failed".into(), 2)]
    );
    assert_eq!(strs(&rejects, "detail")[1..], ["status failed_to_download", "status failed_to_download: timeout"]);
}

#[test]
fn table_rows_are_checked_in_one_order_in_every_format() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    // A repeated id with an empty caption is `empty_caption` (the repeat check comes last, and
    // only kept rows claim their id); a line too wide that is also not UTF-8 is
    // `wrong_field_count`; an id of U+001C only is blank.
    let rows: [&[u8]; 5] = [b"1,a", b"1,", b"2,\xff,x", b"\x1c,b", b"3,c"];
    std::fs::write(dir.path().join("t.csv"), rows.join(&b"\n"[..])).unwrap();
    let tsv: Vec<Vec<u8>> =
        rows.iter().map(|r| r.iter().map(|&b| if b == b',' { b'\t' } else { b }).collect()).collect();
    std::fs::write(dir.path().join("t.tsv"), tsv.join(&b"\n"[..])).unwrap();
    let expected = [("empty_caption".to_string(), 2), ("wrong_field_count".into(), 3), ("missing_id".into(), 4)];
    for (file, header) in [("t.csv", "false"), ("t.tsv", "false")] {
        let (_d, data, rejects) = run_pipeline(&read_only(&format!(
            "type = \"read_table\"\npath = \"{}/{file}\"\nheader = {header}\ncolumns = {{ sample_id = 0, caption = 1 }}",
            dir.path().display()
        )));
        assert_eq!(strs(&data, "sample_id"), ["1", "3"], "{file}");
        assert_eq!(reasons(&rejects), expected, "{file}");
    }
    let s = |v: Vec<&str>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch =
        RecordBatch::try_from_iter([("id", s(vec!["1", "1", "\u{1c}", "3"])), ("text", s(vec!["a", "", "b", "c"]))])
            .unwrap();
    let path = dir.path().join("t.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
        path.display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["1", "3"]);
    assert_eq!(reasons(&rejects), [("empty_caption".into(), 1), ("missing_id".into(), 2)]);
}

#[test]
fn table_cells_timestamps_paths_and_an_open_quote_at_the_end() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray, TimestampSecondArray};
    let dir = tempfile::tempdir().unwrap();
    // Timestamps with a time zone (named or an offset) read as their UTC instant, RFC 3339.
    let text: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a dog", "a cat"]));
    let utc: ArrayRef = std::sync::Arc::new(TimestampSecondArray::from(vec![1577934245, 0]).with_timezone("UTC"));
    let paris: ArrayRef =
        std::sync::Arc::new(TimestampSecondArray::from(vec![1577934245, 0]).with_timezone("Europe/Paris"));
    let batch = RecordBatch::try_from_iter([("text", text), ("utc", utc), ("paris", paris)]).unwrap();
    let path = dir.path().join("t.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ caption = \"text\", label = \"utc\", label_text = \"paris\" }}",
        path.display()
    )));
    assert_eq!(strs(&data, "label"), ["2020-01-02T03:04:05Z", "1970-01-01T00:00:00Z"]);
    assert_eq!(strs(&data, "label_text"), ["2020-01-02T03:04:05Z", "1970-01-01T00:00:00Z"]);
    // A column of type Null (pyarrow's all-None column) is nulls, not a reject per row.
    let text: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a dog", "a cat"]));
    let none: ArrayRef = std::sync::Arc::new(arrow_array::NullArray::new(2));
    let batch = RecordBatch::try_from_iter([("text", text), ("none", none)]).unwrap();
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ caption = \"text\", url = \"none\" }}",
        path.display()
    )));
    assert_eq!((col(&data, "url"), reasons(&rejects)), (vec![None, None], vec![]));

    // An empty path or url cell is no path or url; the last record's open quote keeps its line
    // end in `raw`.
    std::fs::write(dir.path().join("p.csv"), "text,img,n\na dog,,1\na cat,x.jpg,2\n\"a bird,y.jpg\n").unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}/p.csv\"\ncolumns = {{ caption = \"text\", path = \"img\", url = \"img\" }}\ncheck_files = false",
        dir.path().display()
    )));
    assert_eq!(col(&data, "path"), [None, Some(dir.path().join("x.jpg").to_string_lossy().into_owned())]);
    assert_eq!(col(&data, "url"), [None, Some("x.jpg".into())]);
    assert_eq!(reasons(&rejects), [("wrong_field_count".into(), 4)]);
    assert_eq!(raws(&rejects), ["\"a bird,y.jpg\n"]);
}

#[test]
fn parquet_dates_out_of_range_reject_their_row_only() {
    // Nanoseconds stored in a millisecond column, or a day count past the calendar, cannot be
    // read as text; Arrow's cast of the column failed and stopped the whole run.
    use arrow_array::{ArrayRef, Date32Array, RecordBatch, StringArray, TimestampMillisecondArray};
    let dir = tempfile::tempdir().unwrap();
    let ms = 1_700_000_000_000;
    let id: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
    let text: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a dog", "a cat", "a cow", "a hen"]));
    let taken: ArrayRef =
        std::sync::Arc::new(TimestampMillisecondArray::from(vec![Some(ms), Some(ms * 1_000_000), None, Some(0)]));
    let utc: ArrayRef = std::sync::Arc::new(
        TimestampMillisecondArray::from(vec![Some(ms), Some(0), Some(0), Some(i64::MAX)]).with_timezone("UTC"),
    );
    let day: ArrayRef = std::sync::Arc::new(Date32Array::from(vec![Some(0), Some(0), Some(i32::MAX), None]));
    let batch =
        RecordBatch::try_from_iter([("id", id), ("text", text), ("taken", taken), ("utc", utc), ("day", day)]).unwrap();
    let path = dir.path().join("t.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\", label = \"taken\", label_text = \"utc\", url = \"day\" }}",
        path.display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["a"]);
    assert_eq!(col(&data, "label"), [Some("2023-11-14T22:13:20".into())]);
    assert_eq!(col(&data, "label_text"), [Some("2023-11-14T22:13:20Z".into())]);
    let why = "unreadable_value".to_string();
    assert_eq!(reasons(&rejects), [(why.clone(), 1), (why.clone(), 2), (why, 3)]);
    assert_eq!(col(&rejects, "sample_id"), [Some("b".into()), Some("c".into()), Some("d".into())]);
    // `raw` is the number as stored; `detail` names the column.
    assert_eq!(raws(&rejects), ["1700000000000000000", "2147483647", "9223372036854775807"]);
    let details = common::col(&rejects, "detail");
    for (d, name) in details.iter().zip(["taken", "day", "utc"]) {
        let d = d.as_deref().unwrap();
        assert!(d.starts_with(&format!("column `{name}`: the value cannot be read as text")), "{d}");
    }
}

#[test]
fn table_files_of_different_formats_need_format_set() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.tsv"), "1\ta dog\n").unwrap();
    std::fs::write(dir.path().join("b.CSV"), "id,text\n2,a cat\n").unwrap();
    let stage = |files: &str| {
        format!("type = \"read_table\"\npath = [{files}]\ncolumns = {{ sample_id = 0, caption = 1 }}\nheader = false")
    };
    let p = |f: &str| format!("\"{}\"", dir.path().join(f).display());
    let err = config_errors(read_only(&stage(&format!("{}, {}", p("a.tsv"), p("b.CSV")))));
    assert!(err.contains("by their extensions: `b.CSV` reads as csv, `a.tsv` as tsv"), "{err}");
    // Only that: each file checked as the first one's format would add errors of that alone (a
    // Parquet file "is not text", a TSV header missing the CSV's columns).
    std::fs::write(dir.path().join("c.tsv"), "id\ttext\n3\ta cow\n").unwrap();
    let named = |files: &str| {
        format!("type = \"read_table\"\npath = [{files}]\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}")
    };
    let err = config_errors(read_only(&named(&format!("{}, {}", p("b.CSV"), p("c.tsv")))));
    assert!(err.contains("reads as tsv") && !err.contains("missing column"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    // The extension's case does not matter.
    let (_d, data, _) = run_pipeline(&read_only(&stage(&p("b.CSV"))));
    assert_eq!(strs(&data, "caption"), ["text", "a cat"]);
}

#[test]
fn yfcc_ids_are_numbers_however_written() {
    // 23 fields: id 0, title 6, marker 22. `007` is photo 7: a repeat, and kept as `7`.
    let line = |id: &str, title: &str| {
        let mut f = vec![""; 23];
        (f[0], f[6], f[22]) = (id, title, "0");
        f.join("\t")
    };
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("y.tsv");
    std::fs::write(&tsv, [line("007", "a+dog"), line("7", "a+cat"), line("8", "&#128;+&#1;x+&amp+y")].join("\n"))
        .unwrap();
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_yfcc\"\npath = \"{}\"\ncaption = \"title\"", tsv.display())));
    assert_eq!(strs(&data, "sample_id"), ["7", "8"]);
    assert_eq!(strs(&data, "caption"), ["a dog", "\u{20ac} x & y"], "references as html.unescape reads them");
    assert_eq!(reasons(&rejects), [("duplicate_id".into(), 2)]);
    // The empty-caption detail names the field asked for.
    let (_d, _, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_yfcc\"\npath = \"{}\"\ncaption = \"description\"",
        tsv.display()
    )));
    assert_eq!(strs(&rejects, "detail")[..2], ["no description", "no description"]);
}

#[test]
fn headerless_tables_refuse_a_column_past_their_usual_width() {
    // Quoted commas are not separators: most of these CSV records have 2 fields, one has 3, so
    // column #2 is past the usual width, as in the TSV.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("q.csv"), "\"a dog, on grass\",http://h/1\nx,y,z\n\"two, cats\",http://h/2\n")
        .unwrap();
    std::fs::write(dir.path().join("t.tsv"), "a dog\thttp://h/1\nx\ty\tz\nb\thttp://h/2\n").unwrap();
    for file in ["q.csv", "t.tsv"] {
        let err = config_errors(read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\nheader = false\ncolumns = {{ caption = 0, url = 1, sample_id = 2 }}",
            dir.path().join(file).display()
        )));
        assert!(err.contains(&format!("column #2 is mapped, but most of the first lines of `{file}` have 2")), "{err}");
    }
    // Within the width, the quoted commas stay in the caption.
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nheader = false\ncolumns = {{ caption = 0, url = 1 }}",
        dir.path().join("q.csv").display()
    )));
    assert_eq!(strs(&data, "caption"), ["a dog, on grass", "two, cats"]);
    assert_eq!(reasons(&rejects), [("wrong_field_count".into(), 2)]);
}

#[test]
fn a_header_line_ending_in_a_lone_cr_names_its_last_column() {
    // A header-only TSV whose one line ends in CR and no LF: `text`, not `text\r`.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("h.tsv"), "id\ttext\r").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nheader = true\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
        dir.path().join("h.tsv").display()
    )));
    assert!(data.iter().all(|b| b.num_rows() == 0));
}

/// The configuration errors of pipeline `toml` (panics if it compiles). Nothing is written:
/// an `{out}` output folder stays a name.
fn config_errors(toml: String) -> String {
    let toml = toml.replace("{out}", "out/never");
    let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
    curate::pipeline::plan::compile_doc(&doc).err().expect("refused").to_string()
}

#[test]
fn compressed_and_parquet_files_are_not_read_as_text() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    // zstd and xz are not read (gzip and bzip2 are: `compressed_text_inputs_read_as_their_text`).
    let zst = dir.path().join("cc.tsv.zst");
    std::fs::write(&zst, b"\x28\xb5\x2f\xfd\x04\x58\x00\x00").unwrap();
    let err = config_errors(read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", zst.display())));
    assert!(err.contains("is zstd-compressed, not text") && err.contains("decompress it first"), "{err}");
    // UTF-16 (here as Windows writes "Unicode" text: little-endian, with a byte-order mark).
    let utf16 = dir.path().join("cc16.tsv");
    let text: Vec<u8> = "\u{feff}a dog\thttp://x/1.jpg\n".encode_utf16().flat_map(u16::to_le_bytes).collect();
    std::fs::write(&utf16, text).unwrap();
    let err = config_errors(read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", utf16.display())));
    assert!(err.contains("is UTF-16 text (its byte-order mark), not UTF-8") && err.contains("iconv"), "{err}");
    // A Parquet file read as TSV (its format set by hand).
    let pq = dir.path().join("t.parquet");
    let col: ArrayRef = std::sync::Arc::new(StringArray::from(vec!["a dog"]));
    common::write_parquet(&pq, &RecordBatch::try_from_iter([("text", col)]).unwrap());
    let err = config_errors(read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nformat = \"tsv\"\ncolumns = {{ caption = 0 }}",
        pq.display()
    )));
    assert!(err.contains("is a Parquet file, not text"), "{err}");
    // Lines ending in a lone CR would read as one line in a TSV (CSV reads them as lines).
    let cr = dir.path().join("cr.tsv");
    std::fs::write(&cr, "1\ta dog\r2\ta cat\r").unwrap();
    let table = |path: &std::path::Path, format: &str| {
        read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\nformat = \"{format}\"\nheader = false\ncolumns = {{ sample_id = 0, caption = 1 }}",
            path.display()
        ))
    };
    let err = config_errors(table(&cr, "tsv"));
    assert!(err.contains("cr.tsv` end in a lone CR (no LF)"), "{err}");
    let cr_csv = dir.path().join("cr.csv");
    std::fs::write(&cr_csv, "1,a dog\r2,a cat\r").unwrap();
    let (_d, data, _) = run_pipeline(&table(&cr_csv, "csv"));
    assert_eq!(strs(&data, "caption"), ["a dog", "a cat"]);
    // A plain text file passes, even one that starts as a bzip2 file does.
    std::fs::write(dir.path().join("ok.tsv"), "BZh9 dogs\thttp://u\n").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_cc_tsv\"\npath = \"{}\"",
        dir.path().join("ok.tsv").display()
    )));
    assert_eq!(strs(&data, "caption"), ["BZh9 dogs"]);
}

#[test]
fn bow_needs_a_reader_that_gives_captions() {
    let bow = |reader: &str| {
        format!(
            "output_dir = \"{{out}}\"\n[[stage]]\n{reader}\n[[stage]]\ntype = \"bow\"\n[[stage]]\ntype = \"write_parquet\"\n"
        )
    };
    let images = format!("type = \"read_imagenet21k\"\nroot = \"{}\"", fixture("readers/imagenet21k/train"));
    let err = config_errors(bow(&images));
    assert!(err.contains("stage `bow` deforms captions, but the rows it gets have none"), "{err}");
    let no_caption = format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", path = \"image\" }}",
        fixture("readers/generic/pairs.csv")
    );
    assert!(config_errors(bow(&no_caption)).contains("deforms captions"));
}

#[test]
fn a_run_that_writes_nothing_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("c.tsv");
    std::fs::write(&input, "no tab here\nnor here\n").unwrap();
    let (d, data, _) = run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", input.display())));
    assert!(data.iter().all(|b| b.num_rows() == 0));
    let manifest = json_file(&d.path().join("out/manifest.json"));
    let w = manifest["warnings"][0].as_str().unwrap();
    assert!(
        w.starts_with("no row was written: the 2 row(s) read") && w.contains("`read_cc_tsv/wrong_field_count` (2)"),
        "{w}"
    );
    let report = std::fs::read_to_string(d.path().join("out/report.md")).unwrap();
    assert!(report.contains("**Warning:** no row was written"), "{report}");
    let report = json_file(&d.path().join("out/report.json"));
    assert_eq!(report["warnings"], manifest["warnings"]);
    // An empty input, and a stage's own warning (one caption: no base set), go there too.
    std::fs::write(&input, "").unwrap();
    let (d, _, _) = run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", input.display())));
    let manifest = json_file(&d.path().join("out/manifest.json"));
    assert!(manifest["warnings"][0].as_str().unwrap().starts_with("no row was read"), "{manifest}");
    std::fs::write(&input, "a dog\thttp://u\n").unwrap();
    let (d, _, _) = run_pipeline(&format!(
        "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"{}\"\n[[stage]]\ntype = \"bow\"\n\
         [[stage]]\ntype = \"write_parquet\"\n",
        input.display()
    ));
    let manifest = json_file(&d.path().join("out/manifest.json"));
    let all: Vec<&str> = manifest["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    assert!(all[0].starts_with("no row was written") && all[1].starts_with("stage `bow`: base_fraction"), "{all:?}");
    // A run that writes rows has none.
    std::fs::write(&input, "a dog\thttp://u\n").unwrap();
    let (d, _, _) = run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", input.display())));
    let manifest = json_file(&d.path().join("out/manifest.json"));
    assert_eq!(manifest["warnings"], serde_json::json!([]));
}

#[test]
fn the_bow_report_says_what_it_cannot_measure() {
    // No caption: no Δ dataset size nor mean (`null` in the JSON, "n/a" in the Markdown). "only" mode has no
    // base set: no line about one.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("c.tsv");
    let bow = |mode: &str| {
        format!(
            "output_dir = \"{{out}}\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"{}\"\n[[stage]]\ntype = \"bow\"\n{mode}\
             [[stage]]\ntype = \"write_parquet\"\n",
            input.display()
        )
    };
    std::fs::write(&input, "").unwrap();
    let (d, _, _) = run_pipeline(&bow(""));
    let md = std::fs::read_to_string(d.path().join("out/report.md")).unwrap();
    assert!(md.contains("- Δ dataset size: **n/a**") && md.contains("| mean words per caption | n/a | n/a |"), "{md}");
    let report = json_file(&d.path().join("out/report.json"));
    for key in ["delta_dataset_size", "mean_words_before", "mean_words_after", "mean_words_deformed_after"] {
        assert_eq!(report["stages"]["bow"][key], serde_json::Value::Null, "{key}");
    }
    std::fs::write(&input, "a dog in the park\thttp://u\nthe a\thttp://v\n").unwrap();
    let (d, _, _) =
        run_pipeline(&bow("mode = \"only\"\nlimit_to_base_vocab = false\nrm_top_freq = 0\nshuffle = false\n"));
    let md = std::fs::read_to_string(d.path().join("out/report.md")).unwrap();
    assert!(!md.contains("base captions") && !md.contains("base vocabulary"), "{md}");
    assert!(md.contains("- deformed: 2 in, 1 out (1 emptied and dropped)"), "{md}");
    assert!(md.contains("- Δ dataset size: **-50.0%**"), "{md}");
    assert!(md.contains("Operators: only: RmStopNalpha, Keep(4); seed 0.\n"), "{md}");
    assert!(!md.contains("not comparable to the paper's") && !md.contains("64+"), "{md}");
    // "mostly" mode on a few captions: the operators with the base share, the note that a small
    // base set is not the paper's, the removed words with their base counts; a caption of 70
    // words draws the 64+ bin, and the note about it comes.
    let long = vec!["dog"; 70].join(" ");
    let lines: Vec<String> = (0..40).map(|i| format!("a dog in the park {i}\thttp://u{i}")).collect();
    std::fs::write(&input, format!("{}\n{long}\thttp://w\n", lines.join("\n"))).unwrap();
    let (d, _, _) = run_pipeline(&bow("base_fraction = 0.5\nrm_top_freq = 1\n"));
    let md = std::fs::read_to_string(d.path().join("out/report.md")).unwrap();
    let ops = "Operators: mostly: Shuffle, RmStopNalpha, LimitToBaseVocab, RmTopFreq(1), Keep(4) (50% base); seed 0.";
    assert!(md.contains(ops), "{md}");
    assert!(md.contains("with 20 base captions (CC3M's: ~290,000) Δ and words per caption are not comparable"), "{md}");
    assert!(md.contains("- removed top-1 words, most frequent first (base captions holding it): `dog` ("), "{md}");
    assert!(md.contains("(The last bin, 64+, counts captions of 64 words or more.)"), "{md}");
    let plot = std::fs::read_to_string(d.path().join("out/plots/bow_word_rank.svg")).unwrap();
    assert!(plot.contains(&format!(">{}</text>", &ops["Operators: ".len()..ops.len() - "; seed 0.".len()])), "{plot}");
}

/// The JSON file at `path` (a manifest, a report).
fn json_file(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `bytes` compressed as gzip (`members` gzip members, as `cat a.gz b.gz` makes) or bzip2.
fn compressed(bytes: &[u8], kind: &str, members: usize) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::new();
    let cut = bytes.len() / members.max(1);
    for (i, part) in bytes.chunks(cut.max(1)).enumerate().take(members) {
        let part = if i + 1 == members { &bytes[i * cut.max(1)..] } else { part };
        match kind {
            "gz" => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(part).unwrap();
                out.extend(e.finish().unwrap());
            }
            _ => {
                let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
                e.write_all(part).unwrap();
                out.extend(e.finish().unwrap());
            }
        }
    }
    out
}

#[test]
fn compressed_text_inputs_read_as_their_text() {
    // Text inputs as published (YFCC100M, the YFCC15M list: `.bz2`; tables: `.gz`) give what
    // their text gives: rows, rejects, line numbers and ids, whatever the file is named.
    let dir = tempfile::tempdir().unwrap();
    let cc = std::fs::read(fixture("readers/cc/cc_train.tsv")).unwrap();
    let plain =
        run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", fixture("readers/cc/cc_train.tsv"))));
    let with_bom = [b"\xEF\xBB\xBF".as_slice(), &cc].concat();
    for (kind, members, text) in [("gz", 1, &cc), ("gz", 3, &cc), ("bz2", 1, &cc), ("bz2", 2, &with_bom)] {
        let sub = dir.path().join(format!("{kind}{members}"));
        std::fs::create_dir(&sub).unwrap();
        // The same file name, so the ids (`file#line`) are the same too.
        let path = sub.join("cc_train.tsv");
        std::fs::write(&path, compressed(text, kind, members)).unwrap();
        let (_d, data, rejects) =
            run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", path.display())));
        assert_eq!(strs(&data, "sample_id"), strs(&plain.1, "sample_id"), "{kind} x{members}");
        assert_eq!(strs(&data, "caption"), strs(&plain.1, "caption"), "{kind} x{members}");
        assert_eq!(reasons(&rejects), reasons(&plain.2), "{kind} x{members}");
        assert_eq!(raws(&rejects), raws(&plain.2), "{kind} x{members}");
    }

    // YFCC100M and its YFCC15M list, both bzip2-compressed.
    let yfcc = dir.path().join("yfcc100m_dataset.bz2");
    let subset = dir.path().join("yfcc100m_subset_data.tsv.bz2");
    std::fs::write(
        &yfcc,
        compressed(&std::fs::read(fixture("readers/yfcc/yfcc100m_dataset_25.tsv")).unwrap(), "bz2", 1),
    )
    .unwrap();
    let list = std::fs::read(fixture("readers/yfcc/yfcc100m_subset_data.tsv")).unwrap();
    std::fs::write(&subset, compressed(&list, "bz2", 1)).unwrap();
    let (d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_yfcc\"\npath = \"{}\"\nsubset = \"{}\"",
        yfcc.display(),
        subset.display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["5012345678", "5012345679", "5012345680"]);
    assert_eq!(strs(&data, "caption")[1], "café on the corner");
    let r: Vec<(String, u64)> = reasons(&rejects);
    assert_eq!(
        r.iter().map(|(r, l)| (r.as_str(), *l)).collect::<Vec<_>>(),
        [("empty_caption", 4), ("wrong_field_count", 6), ("invalid_utf8", 7)]
    );
    let manifest = json_file(&d.path().join("out/manifest.json"));
    assert_eq!(manifest["skipped_by_reason"]["not_in_subset"], 1);

    // A CSV table with a header (`.csv.gz` is CSV: the compression's extension is not the
    // format), and a headerless TSV whose width is found from its first lines.
    let csv = std::fs::read(fixture("readers/generic/pairs.csv")).unwrap();
    let csv_gz = dir.path().join("pairs.csv.gz");
    std::fs::write(&csv_gz, compressed(&csv, "gz", 2)).unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
        csv_gz.display()
    )));
    assert_eq!(strs(&data, "sample_id"), ["1", "2", "4", "5", "7"]);
    assert_eq!(strs(&data, "caption")[3], "first line\nsecond line");
    assert_eq!(reasons(&rejects).len(), 2);
    let tsv_bz2 = dir.path().join("t.tsv.bz2");
    std::fs::write(&tsv_bz2, compressed(b"1\ta dog\thttp://u/1\n2\ta cat\n3\ta bird\thttp://u/3\n", "bz2", 1)).unwrap();
    let (_d, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nheader = false\ncolumns = {{ sample_id = 0, caption = 1, url = 2 }}",
        tsv_bz2.display()
    )));
    assert_eq!(strs(&data, "caption"), ["a dog", "a bird"]);
    assert_eq!(reasons(&rejects), [("wrong_field_count".into(), 2)]);
}

#[test]
fn a_damaged_compressed_input_fails_the_run_naming_the_file() {
    // Cut short, or a flipped byte: the run stops with an error that says so (the text after
    // the damage cannot be read), and leaves no shards.
    let dir = tempfile::tempdir().unwrap();
    let text: Vec<u8> =
        (0..20_000).flat_map(|i| format!("caption number {i} of a dog\thttp://u/{i}.jpg\n").into_bytes()).collect();
    for (kind, damage) in [("gz", "cut"), ("bz2", "cut"), ("gz", "flip"), ("bz2", "flip")] {
        let mut bytes = compressed(&text, kind, 1);
        match damage {
            "cut" => bytes.truncate(bytes.len() * 2 / 3),
            _ => {
                let at = bytes.len() / 2;
                bytes[at] ^= 0x55;
            }
        }
        let input = dir.path().join(format!("{kind}_{damage}.tsv"));
        std::fs::write(&input, &bytes).unwrap();
        let out = dir.path().join(format!("out_{kind}_{damage}"));
        let err = curate::pipeline::run(cc_plan(&input, &out), &Default::default()).unwrap_err().to_string();
        let name = if kind == "gz" { "gzip" } else { "bzip2" };
        assert!(
            err.contains(&format!("{kind}_{damage}.tsv`"))
                && err.contains(&format!("its {name} data is damaged or cut short")),
            "{kind} {damage}: {err}"
        );
        assert_eq!(shards_in(&out.join("data")), Vec::<String>::new(), "{kind} {damage}");
        assert!(!out.join("manifest.json").exists());
    }
    // A CSV table streams through its parser: the error is still the file's.
    let csv: Vec<u8> = (0..20_000).flat_map(|i| format!("{i},a dog {i},http://u/{i}\n").into_bytes()).collect();
    let mut bytes = compressed(&csv, "gz", 1);
    bytes.truncate(bytes.len() / 2);
    let input = dir.path().join("t.csv.gz");
    std::fs::write(&input, &bytes).unwrap();
    let toml = read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nheader = false\ncolumns = {{ caption = 1, url = 2 }}",
        input.display()
    ))
    .replace("{out}", &dir.path().join("out_csv").to_string_lossy());
    let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
    let plan = curate::pipeline::plan::compile_doc(&doc).unwrap();
    let err = curate::pipeline::run(plan, &Default::default()).unwrap_err().to_string();
    assert!(err.contains("cannot read `") && err.contains("t.csv.gz`: its gzip data is damaged or cut short"), "{err}");
}

#[test]
fn a_cc_url_of_python_whitespace_is_missing() {
    // Blank means Python's whitespace, for the url as for the caption: U+001F and U+00A0 alike.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cc.tsv");
    std::fs::write(&input, "a dog\thttp://u/1\na cat\t\u{1f}\na bird\t\u{a0} \nan owl\t \n").unwrap();
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", input.display())));
    assert_eq!(strs(&data, "caption"), ["a dog"]);
    let r: Vec<(String, u64)> =
        ["missing_url", "missing_url", "missing_url"].iter().zip(2..).map(|(r, l)| (r.to_string(), l)).collect();
    assert_eq!(reasons(&rejects), r);
}

#[test]
fn large_parquet_and_csv_tables_stream_in_chunks() {
    // A table is read a chunk of `CHUNK_ROWS` rows at a time, whatever its format, so a large
    // file is never held parsed whole and the chunks are deformed in parallel; the rows and
    // the ids across chunks are those of the file.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let n = 2 * curate::stages::CHUNK_ROWS + 5;
    let ids: Vec<String> = (0..n).map(|i| format!("id{}", i % (n - 1))).collect();
    let caps: Vec<String> = (0..n).map(|i| format!("caption {i}")).collect();
    let (id_col, cap_col): (ArrayRef, ArrayRef) =
        (std::sync::Arc::new(StringArray::from(ids.clone())), std::sync::Arc::new(StringArray::from(caps.clone())));
    common::write_parquet(
        &dir.path().join("t.parquet"),
        &RecordBatch::try_from_iter([("id", id_col), ("text", cap_col)]).unwrap(),
    );
    let csv: String = std::iter::once("id,text\n".to_owned())
        .chain(ids.iter().zip(&caps).map(|(i, c)| format!("{i},{c}\n")))
        .collect();
    std::fs::write(dir.path().join("t.csv"), csv).unwrap();
    for file in ["t.parquet", "t.csv"] {
        let toml = read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}",
            dir.path().join(file).display()
        ))
        .replace("{out}", "out/never");
        let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
        let plan = curate::pipeline::plan::compile_doc(&doc).unwrap();
        let chunks: Vec<curate::schema::Chunk> = plan.reader.open().unwrap().map(|c| c.unwrap()).collect();
        assert!(chunks.len() >= 3, "{file}: {} chunk(s)", chunks.len());
        assert!(chunks.iter().all(|c| c.batch.num_rows() <= curate::stages::CHUNK_ROWS), "{file}");
        let rows: usize = chunks.iter().map(|c| c.batch.num_rows()).sum();
        assert_eq!(rows, n - 1, "{file}: the one repeated id is a reject");
        let last = chunks.iter().rev().find(|c| !c.rejects.is_empty()).expect("a reject");
        assert_eq!(last.rejects.len(), 1, "{file}");
        assert_eq!(curate::schema::str_col(&chunks[2].batch, "caption").value(0), caps[2 * curate::stages::CHUNK_ROWS]);
    }
}

#[test]
fn a_csv_file_streams_with_each_records_line_and_raw_bytes() {
    // A CSV file streams (its text is let go of behind the parser, 1 MiB at a time): over
    // 2 MiB of CRLF, LF and lone-CR line ends, blank lines and captions quoted over two
    // lines, every reject still has its exact line and raw bytes, from either end of the file.
    let dir = tempfile::tempdir().unwrap();
    let mut text = b"id,caption,url\r\n".to_vec();
    let (mut line, mut want_rejects, mut rows) = (2u64, Vec::new(), 0);
    for i in 0..60_000u64 {
        let end: &[u8] = [&b"\r\n"[..], b"\n", b"\r"][(i % 3) as usize];
        if i % 997 == 0 {
            text.extend_from_slice(end);
            line += 1;
        }
        let record = if i % 1009 == 0 {
            format!("{i},\"a caption{}over two lines\",http://u/{i}", ["\r\n", "\n"][(i % 2) as usize])
        } else if i % 1013 == 0 {
            format!("{i},too few fields")
        } else {
            format!("{i},\"a dog, {i}\",http://u/{i}")
        };
        if i % 1013 == 0 && i % 1009 != 0 {
            want_rejects.push((line, record.clone()));
        } else {
            rows += 1;
        }
        line += 1 + record.matches('\n').count() as u64;
        text.extend_from_slice(record.as_bytes());
        text.extend_from_slice(end);
    }
    assert!(text.len() > 2 << 20);
    let path = dir.path().join("big.csv");
    std::fs::write(&path, &text).unwrap();
    let (_out, data, rejects) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"caption\", url = \"url\" }}",
        path.display()
    )));
    let ids = strs(&data, "sample_id");
    assert_eq!(ids.len(), rows);
    let captions = strs(&data, "caption");
    assert_eq!(captions[1009], "a caption\nover two lines");
    assert_eq!(captions[1010], "a dog, 1010");
    // The last row: one reject (1013 x k) for each multiple of 1013 that is not one of 1009.
    let rejected = (1..60_000u64).filter(|i| i % 1013 == 0 && i % 1009 != 0).count();
    assert_eq!(captions[rows - 1], format!("a dog, {}", 59_999));
    assert_eq!(rows, 60_000 - rejected);
    let raws: Vec<String> = rejects
        .iter()
        .flat_map(|b| {
            let r = arrow_array::cast::AsArray::as_binary::<i32>(b.column_by_name("raw").unwrap());
            (0..b.num_rows()).map(|i| String::from_utf8(r.value(i).to_vec()).unwrap()).collect::<Vec<_>>()
        })
        .collect();
    let got: Vec<(u64, String)> = reasons(&rejects).into_iter().map(|(_, row)| row).zip(raws).collect();
    assert_eq!(got.len(), want_rejects.len());
    assert_eq!(got, want_rejects);
    let two_lines = strs(&data, "caption").into_iter().filter(|c| c.contains("over two lines")).count();
    assert_eq!(two_lines, 60_000usize.div_ceil(1009));
}

#[test]
fn archives_and_files_compressed_twice_are_not_read_as_text() {
    // Inside gzip or bzip2, a zstd file, a zip or a tar archive (a webdataset shard) is refused
    // as it is outside: read as text, its bytes would become rows.
    let dir = tempfile::tempdir().unwrap();
    let zst = b"\x28\xb5\x2f\xfd\x04\x58\x00\x00".to_vec();
    let mut tar = Vec::new();
    {
        let mut b = tar::Builder::new(&mut tar);
        let mut h = tar::Header::new_ustar();
        h.set_size(6);
        h.set_cksum();
        b.append_data(&mut h, "000.txt", &b"a dog\n"[..]).unwrap();
        b.finish().unwrap();
    }
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("zst.tsv", compressed(&zst, "gz", 1), "is zstd-compressed inside gzip, not text"),
        (
            "gz2.tsv",
            compressed(&compressed(b"a dog\thttp://u\n", "gz", 1), "bz2", 1),
            "is gzip-compressed inside bzip2",
        ),
        ("zip.tsv", compressed(b"PK\x03\x04rest of a zip", "bz2", 1), "is a zip archive inside bzip2"),
        ("shard.tar", tar.clone(), "is a tar archive, not text"),
        ("shard.tar.gz", compressed(&tar, "gz", 1), "is a tar archive inside gzip"),
    ];
    for (name, bytes, want) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let err = config_errors(read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", path.display())));
        assert!(err.contains(want), "{name}: {err}");
    }
    // The side files too: a zstd `words` file is refused as zstd, and a damaged bzip2 subset
    // list says so, without a hint about its lines.
    let words = dir.path().join("words.txt");
    std::fs::write(&words, &zst).unwrap();
    let err = config_errors(read_only(&format!(
        "type = \"read_imagenet21k\"\nroot = \"{}\"\nwords = \"{}\"",
        fixture("readers/imagenet21k/train"),
        words.display()
    )));
    assert!(err.contains("words.txt` is zstd-compressed, not text"), "{err}");
    let subset = dir.path().join("subset.tsv.bz2");
    let mut list = compressed(&std::fs::read(fixture("readers/yfcc/yfcc100m_subset_data.tsv")).unwrap(), "bz2", 1);
    list.truncate(list.len() / 2);
    std::fs::write(&subset, list).unwrap();
    let err = config_errors(read_only(&format!(
        "type = \"read_yfcc\"\npath = \"{}\"\nsubset = \"{}\"",
        fixture("readers/yfcc/yfcc100m_dataset_25.tsv"),
        subset.display()
    )));
    assert!(err.contains("its bzip2 data is damaged or cut short") && !err.contains("expected `line_number"), "{err}");
}

/// One CC TSV line as the spec reads it, written independently of the reader: a row
/// `(caption, url)`, or the reason it is rejected.
fn cc_line_model(line: &[u8]) -> Result<(String, String), &'static str> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b'\t').collect();
    if fields.len() != 2 {
        return Err("wrong_field_count");
    }
    let (Ok(caption), Ok(url)) = (std::str::from_utf8(fields[0]), std::str::from_utf8(fields[1])) else {
        return Err("invalid_utf8");
    };
    // Python's `str.isspace` for the characters the strategy below writes.
    let blank = |s: &str| s.chars().all(|c| matches!(c, ' ' | '\r' | '\u{1c}' | '\u{3000}'));
    if blank(caption) {
        return Err("empty_caption");
    }
    if blank(url) {
        return Err("missing_url");
    }
    Ok((caption.to_owned(), url.to_owned()))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Nothing is lost: on any text — tabs anywhere, CRs mid-line and before the LF, invalid
    /// UTF-8, Unicode blanks, empty lines, with or without a last LF — every line is a row or a
    /// reject, in order, with the reason and the raw bytes the spec gives it.
    #[test]
    fn cc_tsv_accounts_for_every_line(
        lines in proptest::collection::vec(
            proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", "é", " ", "\t", "\r", "\u{1c}", "\u{3000}", "\u{ff}"]),
                0..7,
            ),
            2..12,
        ),
        crlf in proptest::bool::ANY,
        last_lf in proptest::bool::ANY,
    ) {
        // "\u{ff}" stands for the invalid byte 0xFF.
        let lines: Vec<Vec<u8>> = lines
            .iter()
            .map(|l| l.iter().flat_map(|t| if *t == "\u{ff}" { vec![0xff] } else { t.as_bytes().to_vec() }).collect())
            .collect();
        let end: &[u8] = if crlf { b"\r\n" } else { b"\n" };
        let mut text = lines.join(end);
        if last_lf {
            text.extend_from_slice(end);
        }
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("t.tsv");
        std::fs::write(&input, &text).unwrap();
        let (_d, data, rejects) =
            run_pipeline(&read_only(&format!("type = \"read_cc_tsv\"\npath = \"{}\"", input.to_string_lossy())));

        // The model reads the lines as stored: LF-separated, one CR before the LF dropped.
        let mut stored: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
        if text.ends_with(b"\n") {
            stored.pop();
        }
        let (mut rows, mut rejected) = (Vec::new(), Vec::new());
        for (i, line) in stored.iter().enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            match cc_line_model(line) {
                Ok((caption, url)) => rows.push((format!("t.tsv#{}", i + 1), caption, url)),
                Err(reason) => rejected.push((reason.to_owned(), i as u64 + 1, line.to_vec())),
            }
        }
        let got_rows: Vec<(String, String, String)> = strs(&data, "sample_id")
            .into_iter()
            .zip(strs(&data, "caption"))
            .zip(strs(&data, "url"))
            .map(|((id, c), u)| (id, c, u))
            .collect();
        proptest::prop_assert_eq!(got_rows, rows);
        let mut raws = Vec::new();
        for b in &rejects {
            let raw = arrow_array::cast::AsArray::as_binary::<i32>(b.column_by_name("raw").unwrap());
            raws.extend((0..b.num_rows()).map(|i| raw.value(i).to_vec()));
        }
        let got_rejects: Vec<(String, u64, Vec<u8>)> =
            reasons(&rejects).into_iter().zip(raws).map(|((r, n), raw)| (r, n, raw)).collect();
        proptest::prop_assert_eq!(got_rejects, rejected);
    }
}

#[test]
fn a_tables_folder_is_fingerprinted_when_its_image_paths_start_there() {
    // Without `image_root`, a table's image paths start at its own folder, so the same table in
    // another folder gives another `path` column: another fingerprint. With `image_root` set (in
    // the config hash), or no `path` mapped, the folder does not show, and the fingerprint is the
    // table's name and bytes alone.
    let dir = tempfile::tempdir().unwrap();
    for d in ["d1", "d2"] {
        std::fs::create_dir_all(dir.path().join(d)).unwrap();
        std::fs::write(dir.path().join(d).join("t.csv"), "sample_id,caption,path\na,a dog,img1.jpg\n").unwrap();
    }
    let print = |folder: &str, more: &str| {
        let toml = format!(
            "output_dir = \"{}\"\n[[stage]]\ntype = \"read_table\"\npath = \"{}\"\ncheck_files = false\n{more}\n\
             [[stage]]\ntype = \"write_parquet\"\n",
            dir.path().join("out").display(),
            dir.path().join(folder).join("t.csv").display()
        );
        let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
        curate::pipeline::run(curate::pipeline::plan::compile_doc(&doc).unwrap(), &Default::default()).unwrap();
        json_file(&dir.path().join("out/manifest.json"))["input_fingerprint"].as_str().unwrap().to_owned()
    };
    let with_path = "columns = { sample_id = \"sample_id\", caption = \"caption\", path = \"path\" }";
    assert_ne!(print("d1", with_path), print("d2", with_path));
    let rooted = format!("{with_path}\nimage_root = \"/images\"");
    assert_eq!(print("d1", &rooted), print("d2", &rooted));
    let no_path = "columns = { sample_id = \"sample_id\", caption = \"caption\" }";
    assert_eq!(print("d1", no_path), print("d2", no_path));
    assert_eq!(print("d1", no_path), print("d1", &rooted), "the table's name and bytes alone");
}

#[test]
fn an_imagenet_run_may_write_its_output_inside_the_root() {
    // The run's own files (in a folder of the root that is no synset folder) are not a change
    // of its input: it succeeds, and again.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("inet");
    std::fs::create_dir_all(root.join("n00000001")).unwrap();
    std::fs::write(root.join("n00000001/a.JPEG"), b"x").unwrap();
    let toml = format!(
        "output_dir = \"{}\"\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = \"{}\"\n[[stage]]\ntype = \"write_parquet\"\n",
        root.join("curated").display(),
        root.display()
    );
    for run in 0..2 {
        let doc =
            curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml.clone(), &[]).unwrap();
        curate::pipeline::run(curate::pipeline::plan::compile_doc(&doc).unwrap(), &Default::default())
            .unwrap_or_else(|e| panic!("run {run}: {e}"));
        let manifest = json_file(&root.join("curated/manifest.json"));
        assert_eq!(manifest["rows"]["written"], 1, "run {run}");
        // The output folder counts as one entry of the root beside the synset folders.
        assert_eq!(manifest["skipped_by_reason"]["outside_synset_folders"], 1, "run {run}");
    }
}

#[test]
fn an_empty_img2dataset_url_is_a_null_url_as_in_every_reader() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let s = |v: Vec<&str>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("key", s(vec!["k1", "k2"])),
        ("caption", s(vec!["a dog", "a cat"])),
        ("url", s(vec!["", "http://x/k2.jpg"])),
        ("status", s(vec!["success", "success"])),
    ])
    .unwrap();
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, _) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(col(&data, "url"), [None, Some("http://x/k2.jpg".into())]);
    // The same in a webdataset shard's KEY.json.
    let (file, img) = (tar::EntryType::Regular, &b"\xff\xd8"[..]);
    let shard = dir.path().join("00001.tar");
    raw_shard(
        &shard,
        &[
            (b"a.jpg", img, file),
            (b"a.json", br#"{"url": ""}"#, file),
            (b"a.txt", b"a bird", file),
            (b"b.jpg", img, file),
            (b"b.json", br#"{"url": "http://x/b.jpg"}"#, file),
            (b"b.txt", b"a fish", file),
        ],
    );
    let (_d, data, _) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", shard.display())));
    assert_eq!(col(&data, "url"), [None, Some("http://x/b.jpg".into())]);
}

#[test]
fn a_tsv_header_names_columns_byte_for_byte_quotes_included() {
    // A TSV has no quoting: `"id"` is the name of the first column, quotes and all.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("q.tsv"), "\"id\"\ttext\"\n1\thello\n").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\nheader = true\ncolumns = {{ sample_id = '\"id\"', caption = 'text\"' }}",
        dir.path().join("q.tsv").display()
    )));
    assert_eq!((strs(&data, "sample_id"), strs(&data, "caption")), (vec!["1".to_string()], vec!["hello".to_string()]));
}

#[test]
fn a_column_named_twice_in_a_header_is_refused_and_can_be_named_by_position() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    std::fs::write(&input, "id,caption,caption\n1,first,second\n").unwrap();
    let stage = |caption: &str| {
        read_only(&format!(
            "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = {caption} }}",
            input.display()
        ))
    };
    let err = config_errors(stage("\"caption\""));
    assert!(err.contains("column `caption` is named twice in the header of `t.csv` (columns #1 and #2)"), "{err}");
    assert!(err.contains("name it by position: `caption = 1`"), "{err}");
    // By position, either one is read; a name given once is not concerned.
    let (_d, data, _) = run_pipeline(&stage("2"));
    assert_eq!(strs(&data, "caption"), ["second"]);
}

#[test]
fn a_blank_url_is_a_null_url_in_tables_and_img2dataset_shards() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.csv");
    std::fs::write(&input, "id,caption,url\n1,a dog,  \n2,a cat,http://u/2\n").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"caption\", url = \"url\" }}",
        input.display()
    )));
    assert_eq!(col(&data, "url"), [None, Some("http://u/2".into())]);
    let s = |v: Vec<&str>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("key", s(vec!["k0", "k1"])),
        ("caption", s(vec!["a dog", "a cat"])),
        ("url", s(vec![" \t", "http://u/1"])),
        ("status", s(vec!["success"; 2])),
    ])
    .unwrap();
    let path = dir.path().join("00000.parquet");
    common::write_parquet(&path, &batch);
    let (_d, data, _) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", path.display())));
    assert_eq!(col(&data, "url"), [None, Some("http://u/1".into())]);
}

#[test]
fn an_imagenet_file_without_an_extension_is_said_to_have_none() {
    let dir = tempfile::tempdir().unwrap();
    let synset = dir.path().join("n01440764");
    std::fs::create_dir(&synset).unwrap();
    std::fs::copy(
        format!("{}/n01440764/n01440764_10026.JPEG", fixture("readers/imagenet21k/train")),
        synset.join("a.JPEG"),
    )
    .unwrap();
    std::fs::write(synset.join("README"), "x").unwrap();
    std::fs::write(synset.join("b.txt"), "x").unwrap();
    let (_d, data, rejects) =
        run_pipeline(&read_only(&format!("type = \"read_imagenet21k\"\nroot = \"{}\"", dir.path().display())));
    assert_eq!(strs(&data, "sample_id"), ["n01440764/a.JPEG"]);
    let details = strs(&rejects, "detail");
    assert!(details[0].starts_with("the name has no extension, not one of"), "{details:?}");
    assert!(details[1].starts_with("`.txt` is not one of"), "{details:?}");
}

#[test]
fn keep_where_keeps_the_rows_a_column_allows_in_every_format() {
    // A WIT-like table (OTTER trains on WIT's English rows): `language` says which rows to keep.
    // A non-English row with an empty caption is skipped, not rejected (the filter comes first);
    // an English one is an `empty_caption` reject; a null language (Parquet) is not kept.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    type Row<'a> = (&'a str, Option<&'a str>, &'a str);
    let rows: [Row; 7] = [
        ("a", Some("en"), "a red tram in the snow"),
        ("b", Some("de"), "eine rote Straßenbahn"),
        ("c", Some("fr"), ""),
        ("d", Some("en"), ""),
        ("e", Some("en-GB"), "a lighthouse at dusk"),
        ("f", None, "no language given"),
        ("g", Some("en"), "two dogs on a beach"),
    ];
    let tsv: String = std::iter::once("id\tlanguage\tcaption_reference_description\timage_url".to_owned())
        .chain(rows.iter().map(|(id, l, c)| format!("{id}\t{}\t{c}\thttp://x/{id}.jpg", l.unwrap_or(""))))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.path().join("wit.tsv"), format!("{tsv}\n")).unwrap();
    // CSV: quoted fields, one caption over two lines.
    let csv: String = std::iter::once("id,language,caption_reference_description,image_url".to_owned())
        .chain(rows.iter().map(|(id, l, c)| {
            let c = if *id == "g" { "two dogs\non a beach" } else { c };
            format!("{id},{},\"{c}\",http://x/{id}.jpg", l.unwrap_or(""))
        }))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.path().join("wit.csv"), format!("{csv}\n")).unwrap();
    let strings =
        |f: &dyn Fn(&Row) -> Option<String>| -> ArrayRef { Arc::new(rows.iter().map(f).collect::<StringArray>()) };
    let batch = RecordBatch::try_from_iter([
        ("id", strings(&|r| Some(r.0.to_owned()))),
        ("language", strings(&|r| r.1.map(str::to_owned))),
        ("caption_reference_description", strings(&|r| Some(r.2.to_owned()))),
        ("image_url", strings(&|r| Some(format!("http://x/{}.jpg", r.0)))),
    ])
    .unwrap();
    write_parquet(&dir.path().join("wit.parquet"), &batch);
    for (file, header, keep) in [
        ("wit.tsv", "header = true\n", "keep_where = { language = \"en\" }"),
        ("wit.csv", "", "keep_where = { language = [\"en\"] }"),
        ("wit.parquet", "", "keep_where = { language = \"en\" }"),
        ("wit.parquet", "", "keep_where = { language = [\"en\", \"en-GB\"] }"),
    ] {
        let stage = format!(
            "type = \"read_table\"\npath = \"{}\"\n{header}columns = {{ sample_id = \"id\", caption = \
             \"caption_reference_description\", url = \"image_url\" }}\n{keep}",
            dir.path().join(file).display()
        );
        let (out, data, rejects) = run_pipeline(&read_only(&stage));
        let gb = keep.contains("en-GB");
        let want: Vec<&str> = if gb { vec!["a", "e", "g"] } else { vec!["a", "g"] };
        assert_eq!(strs(&data, "sample_id"), want, "{file} {keep}");
        assert_eq!(col(&rejects, "sample_id"), [Some("d".to_owned())], "{file}");
        let r: Vec<String> = reasons(&rejects).into_iter().map(|x| x.0).collect();
        assert_eq!(r, ["empty_caption"], "{file}");
        let manifest = json_file(&out.path().join("out/manifest.json"));
        assert_eq!(manifest["skipped_by_reason"]["keep_where"], if gb { 3 } else { 4 }, "{file} {keep}");
        if file == "wit.csv" {
            assert_eq!(strs(&data, "caption")[1], "two dogs\non a beach");
        }
    }
}

#[test]
fn keep_where_comes_before_every_check_of_a_row_but_its_field_count() {
    // TSV and CSV: a row not kept is skipped even when its caption is not UTF-8 (a WIT file's
    // other languages must not fill `rejects/`); a filter cell that is not UTF-8 is no value, so
    // not kept; a line of the wrong width is rejected (its fields cannot be trusted). Also: an
    // empty headerless shard beside a filtered one is a table of no rows, and a header naming a
    // column with digits is matched by name.
    let dir = tempfile::tempdir().unwrap();
    let run = |stage: String| {
        let (out, data, rejects) = run_pipeline(&read_only(&stage));
        let manifest = json_file(&out.path().join("out/manifest.json"));
        (strs(&data, "sample_id"), reasons(&rejects).into_iter().map(|x| x.0).collect::<Vec<_>>(), manifest)
    };
    let lines: Vec<&[u8]> = vec![
        b"a\ten\ta tram",
        b"b\tde\tbad \xff byte",
        b"c\t\xffn\tbad filter cell",
        b"d\ten\tbad \xfe kept row",
        b"e\ten",
        b"f\ten\ttwo dogs",
    ];
    for (file, sep) in [("u.tsv", b'\t'), ("u.csv", b',')] {
        let text: Vec<u8> = lines
            .iter()
            .flat_map(|l| l.iter().map(|&b| if b == b'\t' { sep } else { b }).chain(std::iter::once(b'\n')))
            .collect();
        std::fs::write(dir.path().join(file), text).unwrap();
        let (ids, rejects, manifest) = run(format!(
            "type = \"read_table\"\npath = \"{}\"\nheader = false\ncolumns = {{ sample_id = 0, caption = 2 }}\n\
             keep_where = {{ \"1\" = \"en\" }}",
            dir.path().join(file).display()
        ));
        assert_eq!(ids, ["a", "f"], "{file}");
        assert_eq!(rejects, ["invalid_utf8", "wrong_field_count"], "{file}");
        assert_eq!(manifest["skipped_by_reason"]["keep_where"], 2, "{file}");
    }
    std::fs::write(dir.path().join("empty.tsv"), "").unwrap();
    let (ids, _, _) = run(format!(
        "type = \"read_table\"\npath = [\"{}\", \"{}\"]\nheader = false\ncolumns = {{ sample_id = 0 }}\n\
         keep_where = {{ \"2\" = \"a tram\" }}",
        dir.path().join("u.tsv").display(),
        dir.path().join("empty.tsv").display()
    ));
    assert_eq!(ids, ["a"]);
    std::fs::write(dir.path().join("digits.csv"), "id,text,2024\n1,a,en\n2,b,de\n").unwrap();
    let (ids, _, _) = run(format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}\n\
         keep_where = {{ \"2024\" = \"en\" }}",
        dir.path().join("digits.csv").display()
    ));
    assert_eq!(ids, ["1"], "a header's `2024` is that column, not position 2024");
}

#[test]
fn keep_where_columns_are_checked_like_mapped_ones() {
    let stage = |keep: &str| {
        format!(
            "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ sample_id = \"id\", caption = \"text\" }}\n{keep}",
            fixture("readers/generic/pairs.csv")
        )
    };
    let check = |keep: &str| -> String {
        let toml = read_only(&stage(keep)).replace("{out}", "/tmp/never");
        let doc = curate::pipeline::config::ConfigDoc::parse(std::path::Path::new("t.toml"), toml, &[]).unwrap();
        curate::pipeline::plan::compile_doc(&doc).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let e = check("keep_where = { txet = \"en\" }");
    assert!(
        e.contains("keep_where = { txet") && e.contains("missing column `txet`") && e.contains("did you mean `text`"),
        "{e}"
    );
    let e = check("keep_where = { text = [] }");
    assert!(e.contains("no value is listed"), "{e}");
    for keep in ["keep_where = { text = 3 }", "keep_where = { text = [\"a\", 3] }"] {
        let e = check(keep);
        assert!(e.contains("a string or a list of strings") && e.contains("quote numbers"), "{keep}: {e}");
    }
    // `"03"` is not position 3 (two spellings of one column would both have to match).
    let e = check("keep_where = { \"03\" = \"x\" }");
    assert!(e.contains("missing column `03`"), "{e}");
}

#[test]
fn img2dataset_shards_in_any_case_and_compressed_or_ambiguous_ones_refused() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let fixture_tar = std::fs::read(fixture("readers/img2dataset/00000.tar")).unwrap();
    // `.TAR` is a tar shard, as a `.tar` one: read, not refused as "neither".
    let upper = dir.path().join("00000.TAR");
    std::fs::write(&upper, &fixture_tar).unwrap();
    let (_d, data, _) =
        run_pipeline(&read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", upper.display())));
    assert_eq!(strs(&data, "sample_id"), ["000000000", "000000002", "000000005"]);
    // ... and `00000.TAR` beside `00000.parquet` is one shard given both ways.
    let pq = dir.path().join("00000.parquet");
    std::fs::copy(fixture("readers/img2dataset/00000.parquet"), &pq).unwrap();
    let err = config_errors(read_only(&format!(
        "type = \"read_img2dataset\"\npath = [\"{}\", \"{}\"]",
        pq.display(),
        upper.display()
    )));
    assert!(err.contains("are one img2dataset shard") && err.contains("00000.TAR"), "{err}");
    // A gzip-compressed tar under a `.tar` name: refused before any work, naming gzip.
    let gz = dir.path().join("00001.tar");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, &fixture_tar).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let err = config_errors(read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", gz.display())));
    assert!(err.contains("is gzip-compressed, not a plain tar shard") && err.contains("decompress"), "{err}");
    // Two `caption` columns: which holds the data is unknown.
    let twice = dir.path().join("00002.parquet");
    let text = |v: &str| -> ArrayRef { std::sync::Arc::new(StringArray::from(vec![v])) };
    let batch = RecordBatch::try_from_iter([
        ("key", text("k")),
        ("caption", text("a dog")),
        ("caption", text("a cat")),
        ("url", text("http://x/k.jpg")),
        ("status", text("success")),
    ])
    .unwrap();
    common::write_parquet(&twice, &batch);
    let err = config_errors(read_only(&format!("type = \"read_img2dataset\"\npath = \"{}\"", twice.display())));
    assert!(err.contains("has 2 columns named `caption`"), "{err}");
    // Two shards of one name in two folders: the hint speaks of shards, not of `file#row` ids.
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for d in [&a, &b] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("00000.tar"), &fixture_tar).unwrap();
    }
    let err = config_errors(read_only(&format!(
        "type = \"read_img2dataset\"\npath = [\"{}/00000.tar\", \"{}/00000.tar\"]",
        a.display(),
        b.display()
    )));
    assert!(
        err.contains("have the same file name") && err.contains("numbers the shards") && !err.contains("#1"),
        "{err}"
    );
}

#[test]
fn a_missing_column_hint_shows_the_header_as_toml_would_spell_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = |f: &str| dir.path().join(f);
    let err_of = |file: &str, rest: &str| {
        config_errors(read_only(&format!("type = \"read_table\"\npath = \"{}\"\n{rest}", p(file).display())))
    };
    // A quoted CSV name holding a line break: the hint escapes it, as a TOML string would.
    std::fs::write(p("nl.csv"), "id,\"cap\ntion\"\n1,a dog\n").unwrap();
    let err = err_of("nl.csv", "columns = { caption = \"caption\" }");
    assert!(err.contains("did you mean `cap\\ntion`?"), "{err}");
    let err = err_of("nl.csv", "columns = { caption = \"text\" }");
    assert!(err.contains("`nl.csv` has 2 column(s): `id`, `cap\\ntion`"), "{err}");
    // A header line that is blank is said to be, not listed as one empty name.
    std::fs::write(p("blank.tsv"), "\nid\tcaption\n1\ta dog\n").unwrap();
    let err = err_of("blank.tsv", "header = true\ncolumns = { caption = \"caption\" }");
    assert!(err.contains("the header of `blank.tsv`, its first line, is blank"), "{err}");
    // A headerless TSV of blank lines only: one error, not a missing column beside it.
    std::fs::write(p("blanks.tsv"), "\n\n\n").unwrap();
    let err = err_of("blanks.tsv", "columns = { caption = 1 }");
    assert!(err.contains("has only empty lines (3)") && !err.contains("missing column"), "{err}");
    // Blank lines do not count towards a headerless file's width: column #1 is there.
    std::fs::write(p("gaps.tsv"), "\n\na dog\thttp://x/1.jpg\n").unwrap();
    let (_d, data, _) = run_pipeline(&read_only(&format!(
        "type = \"read_table\"\npath = \"{}\"\ncolumns = {{ caption = 0, url = 1 }}",
        p("gaps.tsv").display()
    )));
    assert_eq!(strs(&data, "caption"), ["a dog"]);
}
