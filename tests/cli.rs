//! The real `curate` binary on pipeline files: exit codes and messages, snapshotted (insta).
//! One broken file per kind of configuration error (`tests/fixtures/configs/`); every error in
//! a file is reported at once, with file, line and a hint.

use std::process::Command;

fn curate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("curate runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn validate(file: &str, sets: &[&str]) -> String {
    let path = format!("tests/fixtures/configs/{file}");
    let mut args = vec!["validate", path.as_str()];
    for s in sets {
        args.extend(["--set", s]);
    }
    let (code, stdout, stderr) = curate(&args);
    assert!(stdout.is_empty(), "stdout carries data only");
    format!("exit code: {code}\n{stderr}")
}

#[test]
fn unknown_stage_type() {
    insta::assert_snapshot!(validate("unknown_stage_type.toml", &[]));
}

#[test]
fn unknown_keys_get_did_you_mean() {
    insta::assert_snapshot!(validate("unknown_key.toml", &[]));
}

#[test]
fn wrong_types_all_reported() {
    insta::assert_snapshot!(validate("wrong_type.toml", &[]));
}

#[test]
fn missing_columns() {
    insta::assert_snapshot!(validate("missing_column.toml", &[]));
}

#[test]
fn a_wrong_value_does_not_hide_missing_inputs() {
    insta::assert_snapshot!(validate("wrong_type_and_missing_input.toml", &[]));
}

#[test]
fn missing_input_file() {
    insta::assert_snapshot!(validate("missing_input.toml", &[]));
}

#[test]
fn only_mode_refuses_base_filters() {
    insta::assert_snapshot!(validate("only_mode_needs_no_base.toml", &[]));
}

#[test]
fn bow_stage_takes_pairs_rows_from_the_reader() {
    insta::assert_snapshot!(validate("bow_twice.toml", &[]));
}

#[test]
fn toml_syntax_error() {
    insta::assert_snapshot!(validate("syntax_error.toml", &[]));
}

/// Every syntax error of a file at once: an unclosed string, a header that does not parse and
/// the duplicate `seed` of its table (read alone), a duplicate key and a bare word where a value
/// goes, each once.
#[test]
fn every_toml_syntax_error_at_once() {
    insta::assert_snapshot!(validate("syntax_errors.toml", &[]));
}

#[test]
fn a_training_file_with_a_syntax_error_gets_its_other_local_errors_too() {
    // The demo training file with `steps` broken (its line set aside: no "missing steps") and
    // an unknown key in `[model]`.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string("pipelines/train.toml").unwrap();
    assert!(text.contains("\nsteps = 600\n") && text.contains("\n[model]\n"));
    let text =
        text.replace("\nsteps = 600\n", "\nsteps = 600 600\n").replace("\n[model]\n", "\n[model]\nembed_dimm = 64\n");
    let path = dir.path().join("train.toml");
    std::fs::write(&path, text).unwrap();
    let (code, _, stderr) = curate(&["validate", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("invalid TOML") && stderr.contains("unknown key `embed_dimm` in `model`"), "{stderr}");
    assert!(stderr.contains("2 configuration errors") && !stderr.contains("`steps`"), "{stderr}");
}

#[test]
fn syntax_errors_and_the_problems_of_the_lines_that_stand_alone() {
    // Beside the syntax errors: the unknown top-level key, the wrong type, the unknown key, the
    // unknown value and the unknown stage type; not the reader's `path`, lost with its line.
    let out = validate("syntax_and_other_errors.toml", &[]);
    assert!(out.contains("7 configuration errors") && !out.contains("`path`"), "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn stage_order_and_unknown_top_level_key() {
    insta::assert_snapshot!(validate("stage_order.toml", &[]));
}

#[test]
fn output_places_and_input_files() {
    insta::assert_snapshot!(validate("output_places.toml", &[]));
}

#[test]
fn an_output_dir_that_is_a_file() {
    insta::assert_snapshot!(validate("output_places.toml", &["output_dir=Cargo.toml"]));
    // Or a folder that could not be made: a file stands where a parent folder should.
    insta::assert_snapshot!(validate("output_places.toml", &["output_dir=Cargo.toml/out"]));
    // Or a folder on the kernel's file systems, which no one (root neither) can make.
    if std::path::Path::new("/proc/self").exists() {
        let out = validate("output_places.toml", &["output_dir=/proc/curate-out"]);
        assert!(
            out.contains(
                "`output_dir` `/proc/curate-out` cannot be written: `/proc` is on the kernel's proc file system"
            ),
            "{out}"
        );
    }
}

#[test]
fn img2dataset_shards_given_as_a_folder_or_both_ways() {
    // The folder's hint names the reader's files, not a TSV.
    insta::assert_snapshot!(validate("img2dataset_shards.toml", &[]));
    // img2dataset writes `00000.parquet` beside `00000.tar`: `*` would read every sample twice.
    insta::assert_snapshot!(validate(
        "img2dataset_shards.toml",
        &["read_img2dataset.path=tests/fixtures/readers/img2dataset/*"]
    ));
    // One kind is fine.
    for kind in ["tar", "parquet"] {
        let set = format!("read_img2dataset.path=tests/fixtures/readers/img2dataset/*.{kind}");
        assert!(validate("img2dataset_shards.toml", &[&set]).starts_with("exit code: 0\n"), "{kind}");
    }
}

#[test]
fn a_training_file_given_to_run_and_a_pipeline_given_to_train_say_so() {
    // `validate` checks a training file as `curate train` does before it reads data.
    let (code, _, stderr) = curate(&["validate", "pipelines/train.toml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("is a valid training file: loss `infonce`, 600 steps"), "{stderr}");
    let (code, _, stderr) =
        curate(&["validate", "pipelines/train.toml", "--set", "optim.lr=-1", "--set", "loss.tmperature=1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown key `tmperature` in `loss`") && stderr.contains("`optim.lr`: -1 is not positive"));
    assert!(stderr.contains("2 configuration errors"), "{stderr}");
    // `run`: one error naming the right command, not one per unknown key.
    let (code, _, stderr) = curate(&["run", "pipelines/train.toml"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("error: `pipelines/train.toml` is a training file (it has `model`, `loss`"), "{stderr}");
    assert!(stderr.contains("hint: train with `curate train pipelines/train.toml`"), "{stderr}");
    assert!(stderr.contains("1 configuration error"), "{stderr}");
    // The files a run writes beside its data, given to `validate`: one error each.
    let dir = tempfile::tempdir().unwrap();
    for (name, text, what) in [
        ("manifest.json", r#"{"config_hash": "x", "curate_version": "0", "pipeline": "bow"}"#, "a run's manifest"),
        ("report.json", r#"{"pipeline": "bow", "rows": {}, "stages": {}}"#, "a run's report"),
        (
            "config.json",
            r#"{"command": "eval", "curate_version": "0", "similarity": "cosine"}"#,
            "an evaluation's config",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let (code, _, stderr) = curate(&["validate", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(&format!("looks like {what}")) && stderr.contains("not a pipeline"), "{stderr}");
        assert!(stderr.contains("1 configuration error"), "{stderr}");
    }
    let (code, _, stderr) = curate(&["train", "pipelines/bow.toml"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("error: `pipelines/bow.toml` is a pipeline file (it has `[[stage]]`)"), "{stderr}");
    assert!(stderr.contains("hint: run it with `curate run pipelines/bow.toml`"), "{stderr}");
    assert!(stderr.contains("1 configuration error"), "{stderr}");
}

#[test]
fn a_missing_model_or_folder_says_it_does_not_exist() {
    let (_, _, stderr) = curate(&[
        "validate",
        "pipelines/image_teacher.toml",
        "--set",
        "encode_image.model=tests/no_model.safetensors",
        "--set",
        "read_imagenet21k.root=data/no_folder",
    ]);
    assert!(stderr.contains("`tests/no_model.safetensors` does not exist"), "{stderr}");
    assert!(stderr.contains("`data/no_folder` does not exist"), "{stderr}");
    // Something of the other kind is there.
    let (_, _, stderr) = curate(&[
        "validate",
        "pipelines/image_teacher.toml",
        "--set",
        "encode_image.model=tests",
        "--set",
        "read_imagenet21k.root=Cargo.toml",
    ]);
    assert!(stderr.contains("`tests` is not a file") && stderr.contains("`Cargo.toml` is not a folder"), "{stderr}");
}

#[test]
fn inputs_that_are_pipes_or_devices_are_refused_without_being_opened() {
    // A FIFO with no writer would block `open` forever; a pipe or a device cannot be read twice.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("in.tsv");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let words = format!("read_imagenet21k.words={}", fifo.display());
    for (file, set) in [
        ("pipelines/bow.toml", format!("read_cc_tsv.path={}", fifo.display())),
        ("pipelines/bow.toml", "read_cc_tsv.path=/dev/null".to_owned()),
        ("pipelines/image_teacher.toml", words),
    ] {
        let (code, _, stderr) = curate(&["validate", file, "--set", &set]);
        assert_eq!(code, 2, "{stderr}");
        let what = if set.contains("/dev/null") { "a device" } else { "a pipe" };
        assert!(stderr.contains(&format!("is {what}, not a file")), "{stderr}");
        assert!(stderr.contains("hint: write it to a file first"), "{stderr}");
    }
}

#[test]
fn output_dirs_the_kernel_cannot_make_are_refused() {
    let long = "x".repeat(300);
    let out = validate("output_places.toml", &[&format!("output_dir=out/{long}")]);
    assert!(out.contains("the name `xxxx") && out.contains("` is 300 bytes long, over 255"), "{out}");
    // A folder whose own path fits, but not the files written in it.
    let deep = vec!["d"; 2000].join("/");
    let out = validate("output_places.toml", &[&format!("output_dir={deep}")]);
    assert!(out.contains("the path is 3999 bytes long: with the 128 bytes kept"), "{out}");
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let out = validate("output_places.toml", &[&format!("output_dir={}/out", a.display())]);
    assert!(out.contains(&format!("`{}` is a link in a loop of links", a.display())), "{out}");
}

#[test]
fn a_pipeline_file_is_read_up_to_16_mib_and_a_long_line_is_shown_in_part() {
    let (code, _, stderr) = curate(&["validate", "/dev/zero"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`/dev/zero` is over 16 MiB: not a pipeline or training file"), "{stderr}");
    // A syntax error on a line of a megabyte: 120 characters around it are shown.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("long.toml");
    std::fs::write(&file, format!("output_dir = \"{}\" oops {}\n", "a".repeat(500_000), "b".repeat(500_000))).unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.len() < 2000, "{} bytes of error", stderr.len());
    let shown = stderr.lines().find(|l| l.starts_with("1 | ")).expect("the line");
    assert!(shown.starts_with("1 | …aaa") && shown.contains("\" oops bbb") && shown.ends_with("b…"), "{shown}");
    // The caret stands under the error's column, the window's `…` counted.
    let caret = stderr.lines().skip_while(|l| !l.starts_with("1 | ")).nth(1).unwrap();
    let col = caret.find('^').unwrap();
    assert_eq!(shown.chars().nth(col), Some('o'), "{shown}\n{caret}");
}

#[test]
fn an_emptied_stage_list_is_placed_at_its_set() {
    let out = validate("output_places.toml", &["stage=[]"]);
    assert!(out.contains("error: the pipeline has no stages\n  --> --set stage=[]\n"), "{out}");
}

#[test]
fn a_json_pipeline_is_placed_by_line() {
    // A run's `config.json` is a pipeline too; its problems are placed by line and column.
    insta::assert_snapshot!(validate("config_json_errors.json", &[]));
    // And so is a slip in its syntax (a comma too many).
    insta::assert_snapshot!(validate("config_json_syntax_error.json", &[]));
    // Valid JSON that is not a table of settings has no place to show, but says what is wrong.
    let out = validate("config_json_not_an_object.json", &[]);
    assert!(out.contains("is JSON but not a pipeline: invalid type: array, expected an object"), "{out}");
    assert!(out.starts_with("exit code: 2\n"), "{out}");
}

#[test]
fn a_json_pipeline_gets_json_hints() {
    // Its hints are written as JSON (`"stage": [...]`, not `[[stage]]`).
    insta::assert_snapshot!(validate("config_json_stage_not_a_list.json", &[]));
}

#[test]
fn broken_stage_and_two_readers() {
    insta::assert_snapshot!(validate("broken_stage_and_two_readers.toml", &[]));
}

#[test]
fn overrides_are_checked_like_the_file() {
    insta::assert_snapshot!(validate(
        "only_mode_needs_no_base.toml",
        &["bow.keep_words=two", "bwo.shuffle=false", "bow.limit_to_base_vocab=false", "bow.rm_top_freq=0"]
    ));
}

#[test]
fn overrides_by_position_and_broken_values() {
    insta::assert_snapshot!(validate(
        "only_mode_needs_no_base.toml",
        &[
            "read_cc_tsv.source=\"unterminated",
            "write_parquet.columns=[caption, url]",
            "stage[7].x=1",
            "stage[1].type=\"x\"",
            "bow.name=\"seed\"",
            "read_cc_tsv.path=[]",
        ]
    ));
    // A stage's position reaches it as its name does.
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "stage[1].keep_words=\"two\""]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("error: `bow.keep_words`: wrong type"), "{stderr}");
    assert!(stderr.contains("--> --set stage[1].keep_words=\"two\""), "{stderr}");
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "stage[1].keep_words=2"]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn a_stage_given_a_table_takes_each_key() {
    // `--set 'bow={...}'` sets each key of the stage as one `--set` each would: the run's
    // resolved config has them, and a wrong one is named at the argument as given.
    let dir = tempfile::tempdir().unwrap();
    let out = format!("output_dir={}", dir.path().join("out").display());
    let table = "bow={mode = \"only\", limit_to_base_vocab = false, rm_top_freq = 0, keep_words = 2}";
    let (code, _, stderr) =
        curate(&["run", "pipelines/bow.toml", "--set", &out, "--set", table, "--progress", "never"]);
    assert_eq!(code, 0, "{stderr}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/config.json")).unwrap()).unwrap();
    let bow = &config["stage"][1];
    assert_eq!(
        (&bow["mode"], &bow["keep_words"], &bow["rm_top_freq"]),
        (&"only".into(), &2.into(), &0.into()),
        "{bow}"
    );
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "stage[1]={keep_words = \"x\"}"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`bow.keep_words`: wrong type") && stderr.contains("--> --set stage[1]={keep_words = \"x\"}"),
        "{stderr}"
    );
    // A `name` among the keys renames the stage; the keys after it still reach it.
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "bow={name = \"b2\", keep_words = 3}"]);
    assert_eq!(code, 0, "{stderr}");
    // A stage past the end is an error, even given an empty table.
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "stage[9]={}"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`stage` has 3 element(s), numbered from 0"), "{stderr}");
    // A name no stage has is still an unknown top-level key.
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "bwo={keep_words = 2}"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown top-level key `bwo`"), "{stderr}");
}

#[test]
fn overrides_fix_a_file() {
    // The ablation "only BoW + RmStopNalpha + Keep(4)" (F-T4) from one command line.
    let out = validate(
        "only_mode_needs_no_base.toml",
        &["bow.limit_to_base_vocab=false", "bow.rm_top_freq=0", "bow.base_fraction=0.1", "bow.stemmer=\"none\""],
    );
    assert!(out.starts_with("exit code: 0\nok:"), "{out}");
}

#[test]
fn bundled_pipeline_validates() {
    insta::assert_snapshot!(format!("{:?}", curate(&["validate", "pipelines/bow.toml"])));
}

#[test]
fn a_pipeline_or_training_file_from_a_pipe_is_read_once() {
    // `cat p.toml | curate validate /dev/stdin`: the file is read again as it is checked (its
    // kind, then the whole), and a pipe gives its text once; the second read found it empty.
    for (file, says) in
        [("pipelines/bow.toml", "is valid: 3 stage(s)"), ("pipelines/train.toml", "valid training file")]
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_curate"))
            .args(["validate", "/dev/stdin", "--set", "output_dir=out/from_a_pipe"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let text = std::fs::read(file).unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &text).unwrap();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{file}: {stderr}");
        // What `validate` says goes to stderr, as every message does.
        assert!(stderr.contains(says) && stdout.is_empty(), "{file}: {stderr}");
    }
}

#[test]
fn threads_beyond_a_sane_count_are_refused() {
    let (code, stdout, stderr) = curate(&["run", "pipelines/bow.toml", "--threads", "100000"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("100000 threads is more than 1024"), "{stderr}");
}

#[test]
fn a_closed_stderr_does_not_stop_a_run() {
    // `curate run ... 2>&1 | head -1`: progress and messages go to a pipe nobody reads. The run
    // goes on to its manifest and exits 0, without a panic.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_curate"))
        .args(["run", "pipelines/bow.toml", "--progress", "always", "--set"])
        .arg(format!("output_dir={}", out.display()))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("curate runs");
    // Closing the read ends makes every later write to them fail (EPIPE).
    drop(child.stdout.take());
    drop(child.stderr.take());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(out.join("manifest.json").is_file(), "the run finished");
}

#[test]
fn column_lists_that_lose_or_garble_data() {
    insta::assert_snapshot!(validate("columns_as_lists.toml", &[]));
    insta::assert_snapshot!(validate("missing_column.toml", &["write_parquet.columns=[]"]));
}

#[test]
fn names_must_be_usable() {
    // A blank pipeline name would title the report with nothing; a stage name is a key of
    // `--set NAME.key=value` and part of its plots' file names: letters, digits, `_`, `-`.
    for (set, want) in [
        ("name=\" \"", "the pipeline's `name` is empty"),
        ("bow.name=\"\"", "stage name \"\" cannot address the stage"),
        ("bow.name=\"a.b\"", "stage name \"a.b\" cannot address the stage"),
        ("bow.name=\"a/b\"", "stage name \"a/b\" cannot address the stage"),
        ("bow.name=\"x y\"", "stage name \"x y\" cannot address the stage"),
        (
            &format!("bow.name=\"{}\"", "b".repeat(232)),
            "is 232 characters long; plot files are named after it, and 231",
        ),
    ] {
        let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", set]);
        assert_eq!(code, 2, "{set}: {stderr}");
        assert!(stderr.contains(want), "{set}: {stderr}");
    }
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &format!("bow.name=\"{}\"", "b".repeat(231))]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn validate_takes_the_flags_of_run() {
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--threads", "2", "--progress", "always", "--cache-mib", "16"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.starts_with("ok: "), "{stderr}");
}

#[test]
fn slips_that_get_a_hint() {
    insta::assert_snapshot!(validate("stage_not_a_list.toml", &[]));
    insta::assert_snapshot!(validate("type_misspelt.toml", &[]));
    // A bare number for a text value, in `--set` as in a file.
    let out = validate("only_mode_needs_no_base.toml", &["output_dir=2024", "read_cc_tsv.source=12"]);
    assert!(out.contains("hint: quote text: `output_dir = \"2024\"`, or `--set 'output_dir=\"2024\"'`"), "{out}");
    assert!(out.contains("hint: quote text: `source = \"12\"`, or `--set 'read_cc_tsv.source=\"12\"'`"), "{out}");
}

#[test]
fn errors_of_the_whole_file_point_at_it() {
    insta::assert_snapshot!(validate("no_output_dir_no_stages.toml", &[]));
}

#[test]
fn a_wrong_header_hides_the_column_errors_it_causes() {
    insta::assert_snapshot!(validate("header_wrong_type.toml", &[]));
}

#[test]
fn an_output_dir_behind_a_link_to_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("scratch");
    std::os::unix::fs::symlink(dir.path().join("gone"), &link).unwrap();
    for out in [link.clone(), link.join("bow")] {
        let out = format!("output_dir={}", out.display());
        let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", &out]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(&format!("`{}` is a link to `", link.display())), "{stderr}");
    }
}

#[test]
fn numbers_past_tomls_range() {
    insta::assert_snapshot!(validate("number_out_of_range.toml", &[]));
}

#[test]
fn wrong_array_elements_and_stage_names() {
    insta::assert_snapshot!(validate("array_and_name_types.toml", &[]));
    // `--set` finds `write_parquet` (the second stage) although the first has no usable name,
    // and a table it creates on the way is placed at the `--set`, not in the file.
    let out = validate("array_and_name_types.toml", &["write_parquet.columns=[\"caption\", 7]", "write_parquet.x.y=1"]);
    assert!(out.contains("`write_parquet.columns[1]`: wrong type: invalid type: integer `7`"), "{out}");
    assert!(!out.contains("columns[3]"), "{out}");
    assert!(out.contains("unknown key `x` in stage `write_parquet`"), "{out}");
    assert!(out.contains("--> --set write_parquet.x.y=1"), "{out}");
}

#[test]
fn bench_bow_stage_applies_the_stage_as_a_run_does() {
    // `bench bow` sets the stage's own cost against the 2x budget with `bench bow-stage`, which
    // fits and applies the stage outside the executor: it must keep exactly the rows a run keeps.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let set = format!("output_dir={}", out.display());
    let (code, _, stderr) = curate(&["run", "pipelines/bow.toml", "--progress", "never", "--set", &set]);
    assert_eq!(code, 0, "{stderr}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let written = manifest["rows"]["written"].as_u64().expect("rows.written");
    assert!(written > 0);
    for f in ["config.json", "manifest.json", "report.json"] {
        assert!(std::fs::read_to_string(out.join(f)).unwrap().ends_with("}\n"), "{f} ends its last line");
    }
    // "mostly" mode: the rank plot draws before, after and the deformed captions alone.
    let rank = std::fs::read_to_string(out.join("plots/bow_word_rank.svg")).unwrap();
    assert_eq!(rank.matches("<path d=\"M").count(), 3 + 1, "three curves and the axes");
    assert!(rank.contains(">deformed only</text>"), "its legend");
    let (code, stdout, stderr) = curate(&["bench", "bow-stage", "pipelines/bow.toml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("fit ") && stdout.contains(" CPU-s; apply "), "{stdout}");
    assert!(stdout.trim_end().ends_with(&format!("; {written} rows kept")), "{stdout} vs {written} written");
}

#[test]
fn bench_counts_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    // A 3 x 2 pool and 2 queries, raw f32.
    let (q, p) = (dir.path().join("q.f32"), dir.path().join("p.f32"));
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    std::fs::write(&q, f32s(&[1.0, 0.0, 0.0, 1.0])).unwrap();
    std::fs::write(&p, f32s(&[1.0, 0.0, 0.0, 1.0, 0.5, 0.5])).unwrap();
    let (q, p) = (q.to_str().unwrap(), p.to_str().unwrap());
    let knn = |extra: &[&str]| {
        let mut args = vec!["bench", "knn", "--queries", q, "--pool", p, "--dim", "2"];
        args.extend(extra);
        if !extra.contains(&"--repeat") {
            args.extend(["--repeat", "1"]);
        }
        curate(&args)
    };
    let ids = dir.path().join("ids.u32");
    let (code, stdout, stderr) = knn(&["--k", "3", "--ids-out", ids.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("\"k\":3"), "{stdout}");
    assert_eq!(std::fs::read(&ids).unwrap().len(), 2 * 3 * 4, "[nq, k] u32");
    let (code, _, stderr) = knn(&["--k", "4"]);
    assert!(code != 0 && stderr.contains("`--k 4` is more than the pool's 3 rows"), "{stderr}");
    for flag in [["--k", "0"], ["--repeat", "0"], ["--query-block", "0"]] {
        let (code, _, stderr) = knn(&flag);
        assert!(code != 0 && stderr.contains("must be at least 1"), "{flag:?}: {stderr}");
    }
    let (code, _, stderr) = curate(&["bench", "bow", "--input", "data/cc3m_sample.tsv", "--repeat", "0"]);
    assert!(code != 0 && stderr.contains("must be at least 1"), "{stderr}");
    // A .npy cut short is not the array its header names; an empty one has no rows to time.
    let npy = |name: &str, rows: usize, values: &[f32]| {
        let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, 2), }}");
        let header = format!("{header:<117}\n");
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend((header.len() as u16).to_le_bytes());
        bytes.extend(header.as_bytes());
        bytes.extend(f32s(values));
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_string_lossy().into_owned()
    };
    let good = npy("good.npy", 2, &[1.0, 0.0, 0.0, 1.0]);
    let short = npy("short.npy", 3, &[1.0, 0.0, 0.0, 1.0]);
    let empty = npy("empty.npy", 0, &[]);
    let bench = |q: &str, p: &str| curate(&["bench", "knn", "--queries", q, "--pool", p, "--k", "1", "--repeat", "1"]);
    let (code, _, stderr) = bench(&good, &good);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = bench(&good, &short);
    assert!(code != 0 && stderr.contains("the header says 3 x 2 float32 (24 bytes), the file holds 16"), "{stderr}");
    let (code, _, stderr) = bench(&empty, &good);
    assert!(code != 0 && stderr.contains("no rows"), "{stderr}");
    // `bench text` without a caption in its column, and `bench bow` without its input, fail
    // (the latter leaving no `--out` folder behind).
    let (code, _, stderr) = curate(&[
        "bench",
        "text",
        "--model",
        "data/train_sample/text_model",
        "--input",
        "data/cc3m_sample.tsv",
        "--column",
        "7",
    ]);
    assert!(code != 0 && stderr.contains("has no caption in column 7"), "{stderr}");
    let out = dir.path().join("bench_out");
    let (code, _, stderr) =
        curate(&["bench", "bow", "--input", "nowhere.tsv", "--out", out.to_str().unwrap(), "--repeat", "1"]);
    assert!(code != 0 && !out.exists(), "{stderr}");
}

#[test]
fn bench_knn_on_a_device_finds_the_cpu_kernels_neighbours() {
    // `--device cpu` runs `knn::device_top_k` (burn's matmul and top-k, as on a GPU) in blocks
    // small enough that lists are merged across query blocks and across pool blocks of two
    // 1,024-score chunks (the two-stage top-k) and a rest; the ids must equal the CPU kernel's,
    // whose scores here have no near ties.
    let dir = tempfile::tempdir().unwrap();
    let (q, p) = (dir.path().join("q.f32"), dir.path().join("p.f32"));
    let mut state = 12345u64;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    };
    let (nq, np, dim, k) = (37, 5000, 16, 7);
    let f32s = |n: usize, next: &mut dyn FnMut() -> f32| (0..n).flat_map(|_| next().to_le_bytes()).collect::<Vec<u8>>();
    std::fs::write(&q, f32s(nq * dim, &mut next)).unwrap();
    std::fs::write(&p, f32s(np * dim, &mut next)).unwrap();
    let ids = |device: Option<&str>| {
        let out = dir.path().join(format!("ids_{}.u32", device.unwrap_or("kernel")));
        let mut args = vec!["bench", "knn", "--queries", q.to_str().unwrap(), "--pool", p.to_str().unwrap()];
        args.extend(["--dim", "16", "--k", "7", "--repeat", "1", "--ids-out", out.to_str().unwrap()]);
        if let Some(d) = device {
            args.extend(["--device", d, "--query-block", "10", "--pool-block", "2100"]);
        }
        let (code, stdout, stderr) = curate(&args);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.contains(&format!("\"device\":\"{}\"", device.unwrap_or("cpu kernel"))), "{stdout}");
        if device.is_some() {
            assert!(stdout.contains("\"pool_block\":2048"), "the pool block used: {stdout}");
        }
        std::fs::read(out).unwrap()
    };
    let kernel = ids(None);
    assert_eq!(kernel.len(), nq * k * 4);
    assert_eq!(ids(Some("cpu")), kernel);
}

#[cfg(feature = "cuda")]
#[test]
fn a_cuda_device_that_cannot_start_is_one_error() {
    // No driver (a CPU machine) or no GPU 99 (any machine): one error naming the cause, exit code
    // 2, instead of the CUDA runtime's panics on two threads.
    let (code, stdout, stderr) =
        curate(&["bench", "text", "--model", "nowhere", "--input", "nowhere", "--device", "cuda:99"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("`--device cuda:99`: CUDA device 99 cannot be started"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_device_this_build_lacks_says_which_feature_it_needs() {
    let mut lacking: Vec<(&str, &str)> = vec![("bogus", "unknown device `bogus`; use `cpu`, `ndarray` or `cuda[:N]`")];
    if !cfg!(feature = "ndarray") {
        lacking.push(("ndarray", "rebuild with `--features ndarray`, or use `cpu`"));
    }
    if !cfg!(feature = "cuda") {
        lacking.push(("cuda:1", "built without CUDA; rebuild with `--features cuda`"));
    }
    for (name, want) in lacking {
        let (code, stdout, stderr) = curate(&["run", "pipelines/bow.toml", "--device", name]);
        assert_eq!(code, 2, "{name}: {stderr}");
        assert!(stdout.is_empty());
        assert!(stderr.contains(want), "{name}: {stderr}");
    }
}

#[test]
fn a_large_subset_list_is_announced_before_it_is_read() {
    // YFCC15M's list is ~0.5 GB and takes a while to read: a list over 64 MB is announced.
    // Here 1,000 good lines (what `validate` checks) and then a sparse stretch of NUL bytes, so
    // the read fails at once, on line 1001, after the note.
    let dir = tempfile::tempdir().unwrap();
    let subset = dir.path().join("subset.tsv");
    let mut list = String::new();
    for i in 0..1000u64 {
        list.push_str(&format!("{i}\t{}\tabc\n", 9_000_000 + i));
    }
    std::fs::write(&subset, &list).unwrap();
    std::fs::OpenOptions::new().write(true).open(&subset).unwrap().set_len(65 << 20).unwrap();
    let pipeline = dir.path().join("p.toml");
    let data = format!("{}/tests/fixtures/readers/yfcc/yfcc100m_dataset_25.tsv", env!("CARGO_MANIFEST_DIR"));
    std::fs::write(
        &pipeline,
        format!(
            "output_dir = \"{}\"\n[[stage]]\ntype = \"read_yfcc\"\npath = \"{data}\"\nsubset = \"{}\"\n\
             [[stage]]\ntype = \"write_parquet\"\n",
            dir.path().join("out").display(),
            subset.display()
        ),
    )
    .unwrap();
    let (code, _, stderr) = curate(&["run", pipeline.to_str().unwrap(), "--progress", "never"]);
    assert_eq!(code, 2, "{stderr}");
    let note = stderr.find("reading the subset list (65 MB) ...").unwrap_or_else(|| panic!("{stderr}"));
    let error = stderr.find("subset.tsv` line 1001").unwrap_or_else(|| panic!("{stderr}"));
    assert!(note < error, "{stderr}");
}

/// A stage without a known type may be of any kind: the order is reported wrong only when no
/// kind there would make it right, so a misspelt reader or writer gets its own error alone.
#[test]
fn a_stage_of_unknown_type_does_not_make_the_order_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let read = "[[stage]]\ntype = \"read_cc_tsv\"\npath = \"tests/fixtures/readers/cc/cc_train.tsv\"\n";
    let (bow, write) = ("[[stage]]\ntype = \"bow\"\n", "[[stage]]\ntype = \"write_parquet\"\n");
    let check = |stages: &[&str], wrong_order: &[&str]| {
        let file = dir.path().join("p.toml");
        std::fs::write(&file, format!("output_dir = \"out/test\"\n{}", stages.concat())).unwrap();
        let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("unknown stage type `read_cc_tsvv`") || stderr.contains("has no `type`"), "{stderr}");
        for (want, what) in [("starts with exactly one read stage", "read"), ("ends with exactly one", "write")] {
            assert_eq!(stderr.contains(want), wrong_order.contains(&what), "{what}: {stderr}");
        }
    };
    let typo = "[[stage]]\ntype = \"read_cc_tsvv\"\n";
    let untyped = "[[stage]]\ntyp = \"write_parquet\"\n";
    check(&[typo, bow, write], &[]);
    check(&[read, bow, untyped], &[]);
    check(&[typo, bow, untyped], &[]);
    // No kind for the unknown stage helps: a transform first, or a second reader.
    check(&[bow, typo, write], &["read"]);
    check(&[typo, read, write], &["read"]);
    check(&[read, untyped, bow], &["write"]);
    check(&[read, write, untyped, write], &["write"]);
    // One stage alone cannot be both ends.
    check(&[typo], &["write"]);
}

/// A file where a run writes a folder (`data/`, `rejects/`, `plots/`), or a folder where it
/// writes a file (`manifest.json`), fails `validate`, not the run after its reading.
#[test]
fn output_places_held_by_the_wrong_kind_fail_validate() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("manifest.json")).unwrap();
    for f in ["shards", "rejects", "plots"] {
        std::fs::write(out.join(f), "x").unwrap();
    }
    let set = format!("output_dir={}", out.display());
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &set, "--set", "write_parquet.dir=shards"]);
    assert_eq!(code, 2, "{stderr}");
    for f in ["shards", "rejects", "plots"] {
        assert!(
            stderr.contains(&format!("out/{f}` is a file, where the run writes its folder `{f}`")),
            "{f}: {stderr}"
        );
    }
    assert!(
        stderr.contains("out/manifest.json` is a folder, where the run writes its file `manifest.json`"),
        "{stderr}"
    );
    assert!(stderr.contains("4 configuration errors"), "{stderr}");
    // The data folder's error points at the writer's `dir`.
    assert!(stderr.contains("--> --set write_parquet.dir=shards"), "{stderr}");
    // A file where a folder holding the data folder goes.
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &set, "--set", "write_parquet.dir=shards/data"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("out/shards` is a file, where the run writes its folder `shards/data`"), "{stderr}");
    // The same folder, cleared of them, validates.
    std::fs::remove_dir(out.join("manifest.json")).unwrap();
    for f in ["shards", "rejects", "plots"] {
        std::fs::remove_file(out.join(f)).unwrap();
    }
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &set, "--set", "write_parquet.dir=shards"]);
    assert_eq!(code, 0, "{stderr}");
}

/// A pipeline file with a byte that is not UTF-8 is placed at that byte; a byte-order mark is
/// read past (TOML and JSON alike) and is no column; `.JSON` is JSON as `.json` is.
#[test]
fn encoding_slips_in_pipeline_files() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_string_lossy().into_owned()
    };
    let latin1 = write("latin1.toml", b"output_dir = \"out/p\"\n# r\xe9sum\xe9\n");
    let (code, _, stderr) = curate(&["validate", &latin1]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is not UTF-8 text: byte 0xE9") && stderr.contains("latin1.toml:2:4"), "{stderr}");
    assert!(stderr.contains("hint: save the file as UTF-8"), "{stderr}");
    // A mark, then a key at column 1.
    let toml = write("bom.toml", "\u{feff}output_dr = \"out/p\"\n".as_bytes());
    let (_, _, stderr) = curate(&["validate", &toml]);
    assert!(
        stderr.contains("unknown top-level key `output_dr`\n --> ") && stderr.contains("bom.toml:1:1\n"),
        "{stderr}"
    );
    let pipeline = std::fs::read_to_string("tests/fixtures/configs/output_places.toml").unwrap();
    let json = serde_json::to_string(&toml::from_str::<toml::Value>(&pipeline).unwrap()).unwrap();
    for name in ["bom.json", "BOM.JSON"] {
        let file = write(name, format!("\u{feff}{json}").as_bytes());
        let (code, _, stderr) = curate(&["validate", &file, "--set", "output_dir=out/test-json"]);
        let (code_plain, _, plain) =
            curate(&["validate", &write("plain.json", json.as_bytes()), "--set", "output_dir=out/test-json"]);
        assert_eq!((code, stderr.replace(name, "plain.json")), (code_plain, plain), "{name}");
    }
    // A JSON error on the mark's line is placed by the characters a reader sees.
    let bad = write("bad.json", "\u{feff}{\"seed\": }".as_bytes());
    let (code, _, stderr) = curate(&["validate", &bad]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("bad.json:1:10"), "{stderr}");
}

/// An unknown key inside an inline table is shown at the key, with its near miss, as a stage's
/// own unknown keys are.
#[test]
fn an_unknown_key_in_an_inline_table_gets_did_you_mean() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        "output_dir = \"out/test\"\n[[stage]]\ntype = \"read_table\"\npath = \"data/cc3m_sample.tsv\"\n\
         columns = { sample_id = \"id\", captoin = \"text\" }\n[[stage]]\ntype = \"write_parquet\"\n",
    )
    .unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("error: unknown key `captoin` in `read_table.columns`\n"), "{stderr}");
    assert!(stderr.contains("p.toml:5:31\n") && stderr.contains("hint: did you mean `caption`?"), "{stderr}");
}

/// A wrong value of the writer (`rows_per_shard`, `dir`) or of `bow` does not hide a column the
/// writer names that no stage makes: one `validate` reports them all.
#[test]
fn a_wrong_setting_does_not_hide_a_missing_column() {
    let cols = "write_parquet.columns=[\"sample_id\", \"captoin\"]";
    for set in ["write_parquet.rows_per_shard=0", "write_parquet.dir=rejects", "bow.base_fraction=2"] {
        let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", set, "--set", cols]);
        assert_eq!(code, 2, "{set}: {stderr}");
        assert!(
            stderr.contains("missing column `captoin`") && stderr.contains("did you mean `caption`?"),
            "{set}: {stderr}"
        );
        assert!(stderr.contains("2 configuration errors"), "{set}: {stderr}");
    }
}

/// A number out of range (dropped as it is read) hides nothing: an `output_dir` that is a file is
/// still reported, and a later wrong element of the same array is placed at itself.
#[test]
fn a_number_out_of_range_hides_no_other_problem() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    let taken = dir.path().join("a_file");
    std::fs::write(&taken, "x").unwrap();
    std::fs::write(
        &file,
        format!(
            "output_dir = {:?}\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"data/cc3m_sample.tsv\"\n[[stage]]\n\
             type = \"bow\"\nkeep_words = 1e999\n[[stage]]\ntype = \"write_parquet\"\n\
             columns = [\"sample_id\", 1e999, \"caption\", 5]\n",
            taken.to_string_lossy()
        ),
    )
    .unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("a_file` is a file"), "{stderr}");
    assert!(stderr.contains("`write_parquet.columns[3]`: wrong type") && stderr.contains("p.toml:10:43"), "{stderr}");
    assert!(stderr.contains("4 configuration errors"), "{stderr}");
}

/// A misspelt `arch` of `encode_image` does not hide a missing model (both are reported), and
/// an `arch` left out is named as the required key it is.
#[test]
fn encode_image_reports_a_wrong_arch_and_a_missing_model_together() {
    let (code, _, stderr) = curate(&[
        "validate",
        "pipelines/image_teacher.toml",
        "--set",
        "encode_image.arch=resnet5",
        "--set",
        "encode_image.model=nowhere.safetensors",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown value `resnet5`") && stderr.contains("did you mean `resnet50`?"), "{stderr}");
    assert!(stderr.contains("`nowhere.safetensors` does not exist"), "{stderr}");
    assert!(stderr.contains("2 configuration errors"), "{stderr}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    let text = std::fs::read_to_string("pipelines/image_teacher.toml").unwrap();
    let no_arch: String = text.lines().filter(|l| !l.starts_with("arch")).map(|l| format!("{l}\n")).collect();
    assert_ne!(no_arch, text, "the pipeline sets `arch`");
    std::fs::write(&file, no_arch).unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("missing required key `arch`") && stderr.contains("hint: add `arch = ...`"), "{stderr}");
}

/// A wrong element of an input list does not hide that another element is missing; a list
/// emptied by its wrong elements reports those only.
#[test]
fn a_wrong_element_of_a_path_list_does_not_hide_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    let check = |path: &str, missing: bool| {
        std::fs::write(
            &file,
            format!("output_dir = \"out/test\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = {path}\n[[stage]]\ntype = \"write_parquet\"\n"),
        )
        .unwrap();
        let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("wrong type: invalid type: integer `2`"), "{path}: {stderr}");
        assert_eq!(stderr.contains("`missing.tsv` does not exist"), missing, "{path}: {stderr}");
    };
    check("[\"missing.tsv\", 2]", true);
    check("[2, \"missing.tsv\"]", true);
    check("[2]", false);
}

/// Stages that would reject every row, or lose an earlier stage's work, are refused at compile
/// time: images read from rows that name them by URL only or not at all, captions embedded from
/// rows that have none, a second encoder's `embedding` over the first's.
#[test]
fn pipelines_that_would_reject_every_row_or_replace_an_embedding_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    let check = |stages: &str, want: &[&str]| {
        let text =
            format!("output_dir = \"{}/out\"\n{stages}[[stage]]\ntype = \"write_parquet\"\n", dir.path().display());
        std::fs::write(&file, text).unwrap();
        let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{stderr}");
        for w in want {
            assert!(stderr.contains(w), "`{w}` in: {stderr}");
        }
    };
    let image = "[[stage]]\ntype = \"encode_image\"\nmodel = \"tests/fixtures/models/tiny_resnet.safetensors\"\narch = \"tiny_resnet\"\n";
    let text = "[[stage]]\ntype = \"encode_text\"\nmodel = \"tests/fixtures/models/tiny_bert\"\n";
    let cc = "[[stage]]\ntype = \"read_cc_tsv\"\npath = \"data/cc3m_sample.tsv\"\n";
    check(&format!("{cc}{image}"), &["name their image by URL only", "download the images first"]);
    let table = "[[stage]]\ntype = \"read_table\"\npath = \"data/train_sample/train.parquet\"\ncolumns = { sample_id = \"sample_id\", caption = \"caption\" }\n";
    check(&format!("{table}{image}"), &["name no image", "map a `path` column"]);
    let imagenet = "[[stage]]\ntype = \"read_imagenet21k\"\nroot = \"data/imagenet21k_sample\"\n";
    check(&format!("{imagenet}{text}"), &["embeds captions, but the rows it gets have none"]);
    check(&format!("{cc}{text}{text}"), &["have an `embedding` already", "one encoder per pipeline"]);
    // A text column the reader never fills: Conceptual Captions has no label, a table only the
    // columns it maps, an image folder a label text only with its words file.
    let label_text = format!("{text}column = \"label_text\"\n");
    let unfilled = ["embeds `label_text`, but the rows it gets have none", "map a `label_text` column"];
    check(&format!("{cc}{label_text}"), &[unfilled[0], unfilled[1], "the reader fills `caption`, `url`;"]);
    check(&format!("{table}{label_text}"), &[unfilled[0], "the reader fills `caption`;"]);
    check(&format!("{imagenet}{label_text}"), &[unfilled[0], "the reader fills `path`, `label`;"]);
    // `stages` then `writer`, validated: the exit code and stderr.
    let validate = |stages: &str, writer: &str| {
        std::fs::write(&file, format!("output_dir = \"{}/out\"\n{stages}{writer}", dir.path().display())).unwrap();
        let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
        (code, stderr)
    };
    // A column an earlier stage made and the encoder does not pass on is named as such.
    let writer = "[[stage]]\ntype = \"write_parquet\"\ncolumns = [\"caption\", \"embedding\"]\n";
    let (code, stderr) = validate(&format!("{imagenet}{image}"), writer);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("missing column `caption`: stage `encode_image` does not pass it on"), "{stderr}");
    // The same stages with what they need compile.
    let writer = "[[stage]]\ntype = \"write_parquet\"\n";
    let (code, stderr) = validate(&format!("{imagenet}{image}"), writer);
    assert_eq!(code, 0, "{stderr}");
    let words = "words = \"data/imagenet21k_sample/words.txt\"\n";
    let (code, stderr) = validate(&format!("{imagenet}{words}{label_text}"), writer);
    assert_eq!(code, 0, "{stderr}");
}

/// A run replaces `config.json` and the report in its folder: in a folder that holds no earlier
/// pipeline run (a training run, someone's own report) it is refused before anything is touched.
#[test]
fn a_folder_of_another_kind_is_not_written_over() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("trainrun");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("config.json"), r#"{"name": "t", "loss": {"type": "infonce"}}"#).unwrap();
    std::fs::write(out.join("model.bpk"), b"weights").unwrap();
    let set = format!("output_dir={}", out.display());
    for cmd in ["validate", "run"] {
        let (code, _, stderr) = curate(&[cmd, "pipelines/bow.toml", "--set", &set]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("holds `config.json`, `model.bpk (a `curate train` run)`"), "{stderr}");
        assert!(stderr.contains("no earlier pipeline run"), "{stderr}");
    }
    assert_eq!(std::fs::read(out.join("model.bpk")).unwrap(), b"weights");
    assert!(std::fs::read_to_string(out.join("config.json")).unwrap().contains("infonce"), "not replaced");
    // Someone's own report, with no config at all.
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("report.md"), "# my notes\n").unwrap();
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &format!("output_dir={}", mine.display())]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("holds `report.md`"), "{stderr}");
    // An image folder's root as the output folder would change the listing the run reads.
    let (code, _, stderr) =
        curate(&["validate", "pipelines/image_teacher.toml", "--set", "output_dir=data/imagenet21k_sample"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`output_dir` is the input folder `data/imagenet21k_sample`"), "{stderr}");
    // So would a synset folder, or a folder below one (its files read as images); a folder of the
    // root that is no synset folder is not read.
    for inside in ["n01440764", "n01440764/out/x"] {
        let set = format!("output_dir=data/imagenet21k_sample/{inside}");
        let (code, _, stderr) = curate(&["validate", "pipelines/image_teacher.toml", "--set", &set]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("`output_dir` is within `n01440764`, a folder of the input"), "{stderr}");
    }
    let (code, _, stderr) = curate(&[
        "validate",
        "pipelines/image_teacher.toml",
        "--set",
        "output_dir=data/imagenet21k_sample/../imagenet21k_sample/curated",
    ]);
    assert!(!stderr.contains("`output_dir` is within"), "{stderr}");
    assert_eq!(code, 0, "{stderr}");
    // An earlier pipeline run's folder is the run's to replace.
    let earlier = dir.path().join("earlier");
    std::fs::create_dir(&earlier).unwrap();
    std::fs::write(earlier.join("config.json"), r#"{"output_dir": "x", "stage": [{"type": "read_cc_tsv"}]}"#).unwrap();
    std::fs::write(earlier.join("report.md"), "# report\n").unwrap();
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &format!("output_dir={}", earlier.display())]);
    assert_eq!(code, 0, "{stderr}");
    // Its data folder is cleared too where its `config.json` names another than this run's:
    // one the run cannot write in (here a link onto the kernel's proc file system) is named.
    std::fs::write(
        earlier.join("config.json"),
        r#"{"output_dir": "x", "stage": [{"type": "read_cc_tsv"}, {"type": "write_parquet", "dir": "d1"}]}"#,
    )
    .unwrap();
    std::os::unix::fs::symlink("/proc/self", earlier.join("d1")).unwrap();
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", &format!("output_dir={}", earlier.display())]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("the run clears and writes `") && stderr.contains("d1`: ") && stderr.contains("proc"),
        "{stderr}"
    );
}

/// An unquoted date or time is a TOML type of its own, which no key takes: refused, not read as
/// a rewritten string (`1979-05-27 07:32:00` as `1979-05-27T07:32:00`) nor called a string where
/// a number goes. On the command line a date is the text as written.
#[test]
fn unquoted_dates_and_times_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        "output_dir = 2024-01-02\nseed = 1979-05-27\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"data/cc3m_sample.tsv\"\n\
         source = 1979-05-27 07:32:00.5+01:00\n[[stage]]\ntype = \"write_parquet\"\ndir = 07:32:00\n",
    )
    .unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    for (key, written, line) in [
        ("output_dir", "2024-01-02", 1),
        ("seed", "1979-05-27", 2),
        ("stage[0].source", "1979-05-27 07:32:00.5+01:00", 6),
        ("stage[1].dir", "07:32:00", 9),
    ] {
        let want = format!("`{key}` is an unquoted TOML date-time ({written}); no key takes one\n --> ");
        assert!(stderr.contains(&want), "{want}: {stderr}");
        assert!(stderr.contains(&format!("p.toml:{line}:")), "{line}: {stderr}");
    }
    assert!(stderr.contains("4 configuration errors") && !stderr.contains("invalid type: string"), "{stderr}");
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "name=2024-01-02"]);
    assert_eq!(code, 0, "{stderr}");
}

/// Errors without a near name to suggest still say what to write: `--set` into a key that holds
/// a value, and a stage type that is no string.
#[test]
fn errors_without_a_near_name_get_a_hint() {
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "output_dir.x=1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`--set output_dir.x`: `output_dir` is not a table"), "{stderr}");
    assert!(
        stderr.contains("hint: `output_dir` holds a value, not keys: set it whole, `--set output_dir=VALUE`"),
        "{stderr}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(&file, "output_dir = \"o\"\n[[stage]]\ntype = 3\n[[stage]]\ntype = \"write_parquet\"\n").unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`stage[0].type` must be a string")
            && stderr.contains("hint: quote the stage type: `type = \"3\"`"),
        "{stderr}"
    );
}

#[test]
fn a_duplicate_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(&file, "output_dir = \"x\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"a\"\npath = \"b\"\n")
        .unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("invalid TOML: duplicate key `path`") && stderr.contains("p.toml:5:1"), "{stderr}");
}

#[test]
fn a_choice_given_a_number_lists_its_names() {
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "bow.mode=1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`bow.mode`: wrong type: expected a name (quoted text)"), "{stderr}");
    assert!(stderr.contains("hint: one of `\"mostly\"`, `\"only\"`"), "{stderr}");
}

#[test]
fn set_addresses_one_element_of_an_array() {
    let cols = "write_parquet.columns=[\"sample_id\", \"caption\"]";
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", cols, "--set", "write_parquet.columns[1]=captoin"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("missing column `captoin`") && stderr.contains("--set write_parquet.columns[1]=captoin"));
    assert!(stderr.contains("did you mean `caption`?"), "{stderr}");
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", cols, "--set", "write_parquet.columns[1]=split"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) =
        curate(&["validate", "pipelines/bow.toml", "--set", cols, "--set", "write_parquet.columns[2]=split"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`columns` has 2 element(s), numbered from 0"), "{stderr}");
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "bow.keep_words[0]=3"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("there is no array `keep_words`"), "{stderr}");
}

#[test]
fn a_wrong_writer_key_does_not_hide_its_columns_problems() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("w.toml");
    std::fs::write(
        &file,
        "output_dir = \"out/w\"\n[[stage]]\ntype = \"read_cc_tsv\"\npath = \"data/cc3m_sample.tsv\"\n[[stage]]\n\
         type = \"write_parquet\"\nrows_per_shard = \"1000\"\ncolumns = [\"sample_id\", \"captoin\", \"sample_id\"]\n",
    )
    .unwrap();
    let (code, _, stderr) = curate(&["validate", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`write_parquet.rows_per_shard`: wrong type"), "{stderr}");
    assert!(stderr.contains("missing column `captoin`") && stderr.contains("column `sample_id` is listed twice"));
    assert!(stderr.contains("3 configuration errors"), "{stderr}");
}

/// `--progress always` into a log (stderr not a terminal): lines, since a bar would draw nothing.
#[test]
fn training_progress_in_a_log_is_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = format!("output_dir={}", dir.path().join("t").display());
    let (code, _, stderr) = curate(&[
        "train",
        "pipelines/train.toml",
        "--set",
        "steps=3",
        "--set",
        "optim.warmup_steps=0",
        "--set",
        &out,
        "--progress",
        "always",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("step 3/3 loss "), "{stderr}");
}

#[test]
fn reading_a_checkpoints_moving_average_is_said() {
    // mobile-vision's model zoo form holds `model_ema` beside `state_dict`: the run says which
    // one it read; a plain state dict gets no such note.
    let dir = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = |model: &str, out: &str| {
        let file = dir.path().join(format!("{out}.toml"));
        std::fs::write(
            &file,
            format!(
                "output_dir = {:?}\n[[stage]]\ntype = \"read_imagenet21k\"\nroot = {:?}\n[[stage]]\n\
                 type = \"encode_image\"\nmodel = {:?}\narch = \"tiny_fbnet\"\n[[stage]]\ntype = \"write_parquet\"\n",
                dir.path().join(out),
                repo.join("data/imagenet21k_sample"),
                repo.join("tests/fixtures/models/fbnet").join(model)
            ),
        )
        .unwrap();
        curate(&["run", file.to_str().unwrap()])
    };
    let (code, _, stderr) = run("tiny_fbnet_model.pth", "ema");
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("tiny_fbnet_model.pth`: the weights' moving average (its `model_ema`) is read"),
        "{stderr}"
    );
    let (code, _, stderr) = run("tiny_fbnet.safetensors", "plain");
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("moving average"), "{stderr}");
}

#[test]
fn an_out_file_that_cannot_be_written_is_refused_before_the_work() {
    // `curate probe` and `curate noise` write one JSON file: a folder, or a path under a file,
    // is refused at once (the inputs named here do not exist, and are never read).
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().to_str().unwrap();
    for command in
        [["probe", "no_features.parquet", "no_labels.parquet"], ["noise", "no_images.parquet", "no_texts.parquet"]]
    {
        let (code, _, stderr) = curate(&[command[0], command[1], command[2], "--out", folder]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("is a folder; give the file to write, e.g."), "{stderr}");
    }
    let file = dir.path().join("a_file");
    std::fs::write(&file, b"").unwrap();
    let under = file.join("x/result.json");
    let (code, _, stderr) =
        curate(&["probe", "no_features.parquet", "no_labels.parquet", "--out", under.to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&format!("`{}` is not a folder", file.display())), "{stderr}");
}

#[cfg(unix)]
#[test]
fn eval_refuses_a_path_that_is_not_utf8_before_the_work() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ev");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("metrics.json"), "earlier").unwrap();
    let bad = std::ffi::OsStr::from_bytes(b"img\xff.parquet");
    let o = Command::new(env!("CARGO_BIN_EXE_curate"))
        .arg("eval")
        .arg("--image-embeddings")
        .arg(bad)
        .args(["--caption-embeddings", "captions.parquet", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`img\u{fffd}.parquet` is not valid UTF-8"), "{stderr}");
    assert_eq!(std::fs::read_to_string(out.join("metrics.json")).unwrap(), "earlier");
}

#[test]
fn a_blank_source_is_refused() {
    for blank in ["", "  "] {
        let set = format!("read_cc_tsv.source={blank}");
        let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", &set]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("stage `read_cc_tsv`: `source` is blank") && stderr.contains("1 configuration error"),
            "{stderr}"
        );
    }
    let (code, _, stderr) = curate(&["validate", "pipelines/bow.toml", "--set", "read_cc_tsv.source=cc3m"]);
    assert_eq!(code, 0, "{stderr}");
}
