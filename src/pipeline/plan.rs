//! Compiling a pipeline file into a [`Plan`]: every stage's config is parsed and checked, input
//! files located, column names resolved and the stage order verified — all before any data is
//! read — and every problem found is reported at once (STYLE.md "Config and runtime").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_schema::{Schema, SchemaRef};
use burn::tensor::Device;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use toml::Value;

use super::config::ConfigDoc;
use super::introspect::fields;
use crate::error::{column_hint, did_you_mean, list, Diagnostic, Error, Result};
use crate::schema;
use crate::stages::bow::BowConfig;
use crate::stages::encode_image::EncodeImageConfig;
use crate::stages::encode_text::EncodeTextConfig;
use crate::stages::mine_pseudo_bow::MinePseudoBowConfig;
use crate::stages::read_cc_tsv::ReadCcTsvConfig;
use crate::stages::read_imagenet21k::ReadImagenet21kConfig;
use crate::stages::read_img2dataset::ReadImg2datasetConfig;
use crate::stages::read_table::ReadTableConfig;
use crate::stages::read_yfcc::ReadYfccConfig;
use crate::stages::write_parquet::WriteParquetConfig;
use crate::stages::{
    bow, encode_image, encode_text, mine_pseudo_bow, read_cc_tsv, read_imagenet21k, read_img2dataset, read_table,
    read_yfcc, write_parquet,
};
use crate::stages::{ImageRefs, Problems, Reader, Transform};

/// Top-level keys of a pipeline file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Name shown in reports; default: the file's stem.
    #[serde(default)]
    pub name: Option<String>,
    /// Folder for every output of the run.
    pub output_dir: String,
    /// Seed of every random choice (stages may override).
    #[serde(default)]
    pub seed: u64,
    /// The stages, in order.
    #[serde(default)]
    pub stage: Vec<toml::Table>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Transform,
    Write,
}

/// Every stage type: name, kind and accepted keys.
/// A stage type: its name, its kind and its config keys.
type StageType = (&'static str, Kind, &'static [&'static str]);

fn stage_types() -> Vec<StageType> {
    vec![
        (read_cc_tsv::TYPE, Kind::Read, fields::<ReadCcTsvConfig>()),
        (read_img2dataset::TYPE, Kind::Read, fields::<ReadImg2datasetConfig>()),
        (read_yfcc::TYPE, Kind::Read, fields::<ReadYfccConfig>()),
        (read_imagenet21k::TYPE, Kind::Read, fields::<ReadImagenet21kConfig>()),
        (read_table::TYPE, Kind::Read, fields::<ReadTableConfig>()),
        (bow::TYPE, Kind::Transform, fields::<BowConfig>()),
        (encode_text::TYPE, Kind::Transform, fields::<EncodeTextConfig>()),
        (encode_image::TYPE, Kind::Transform, fields::<EncodeImageConfig>()),
        (mine_pseudo_bow::TYPE, Kind::Transform, fields::<MinePseudoBowConfig>()),
        (write_parquet::TYPE, Kind::Write, fields::<WriteParquetConfig>()),
    ]
}

/// A checked pipeline, ready to run.
pub struct Plan {
    pub name: String,
    pub pipeline_file: PathBuf,
    pub seed: u64,
    pub output_dir: PathBuf,
    pub reader: Box<dyn Reader>,
    /// The reader stage's name (its type unless the file names it).
    pub reader_name: String,
    pub transforms: Vec<(String, Box<dyn Transform>)>,
    /// The rows per chunk `reader` is cut to (`None`: the reader's own chunks): a model stage's
    /// pipeline streams smaller chunks ([`crate::stages::split_chunks`]).
    pub chunk_split: Option<usize>,
    pub write: WriteParquetConfig,
    /// Schema of the written table (after column selection).
    pub output_schema: SchemaRef,
    /// The resolved configuration: every key with its default filled in (`config.json`).
    pub resolved: serde_json::Value,
}

/// One stage of the file, compiled.
struct Compiled {
    name: String,
    kind: Kind,
    /// `None` if its config had problems.
    stage: Option<Built>,
    /// Its config with every default filled in.
    resolved: serde_json::Value,
    /// Its position in the file (`stage[index]`).
    index: usize,
}

enum Built {
    Reader(Box<dyn Reader>),
    Transform(Box<dyn Transform>),
    Write(WriteParquetConfig),
}

/// Loads, overrides and compiles `path`; models load on the CPU.
pub fn compile(path: &Path, overrides: &[String]) -> Result<Plan> {
    compile_on(path, overrides, &Device::flex())
}

/// [`compile`] with models on `device` (`--device`).
pub fn compile_on(path: &Path, overrides: &[String], device: &Device) -> Result<Plan> {
    let doc = ConfigDoc::load(path, overrides).map_err(|mut diags| {
        // Syntax errors: the rest of the file is checked too, as far as it stands alone.
        if let Some((doc, lines)) = ConfigDoc::load_recovered(path, overrides) {
            if let Err(Error::Config(more)) = compile_doc_on(&doc, device) {
                diags.extend(more.into_iter().filter(|d| crate::pipeline::config::survives_recovery(d, &lines)));
            }
        }
        Error::Config(diags)
    })?;
    compile_doc_on(&doc, device)
}

pub fn compile_doc(doc: &ConfigDoc) -> Result<Plan> {
    compile_doc_on(doc, &Device::flex())
}

fn compile_doc_on(doc: &ConfigDoc, device: &Device) -> Result<Plan> {
    let mut diags = doc.override_errors.clone();
    let top = check_top(doc, &mut diags);
    let seed = top.as_ref().map_or(0, |t| t.seed);

    let types = stage_types();
    let mut built: Vec<Compiled> = Vec::new();
    // Whether every stage so far built, so `schema` is what really reaches the next stage (after
    // a broken stage, column checks would report columns it might have produced).
    let mut schema_known = true;
    let mut names: Vec<String> = Vec::new();
    // Stages without a known type (already reported): for the order check, any kind.
    let mut untyped: Vec<usize> = Vec::new();
    // The schema flowing into the next stage, so each transform is checked against its input.
    let mut schema = schema::pairs();
    let mut dropped: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for (i, table) in doc.indexed_stages() {
        let at = format!("stage[{i}]");
        let Some(ty) = table.get("type") else {
            schema_known = false;
            untyped.push(i);
            // A misspelt `type` key (`typ = "bow"`) is what is most often behind a missing one.
            let misspelt = did_you_mean_key(table.keys().map(String::as_str));
            diags.push(Diagnostic::new(format!("`{at}` has no `type`")).at(doc.location(&at)).hint(
                misspelt.unwrap_or_else(|| {
                    format!("stage types: {}", list(&types.iter().map(|t| t.0).collect::<Vec<_>>()))
                }),
            ));
            continue;
        };
        let Some(ty) = ty.as_str() else {
            schema_known = false;
            untyped.push(i);
            diags.push(
                Diagnostic::new(format!("`{at}.type` must be a string"))
                    .at(doc.location(&format!("{at}.type")))
                    .hint(format!("quote the stage type: `type = \"{}\"`", ty.to_string().trim_matches('"'))),
            );
            continue;
        };
        let Some(&(ty, kind, keys)) = types.iter().find(|t| t.0 == ty) else {
            schema_known = false;
            untyped.push(i);
            let hint = did_you_mean(ty, types.iter().map(|t| t.0))
                .or_else(|| Some(format!("stage types: {}", list(&types.iter().map(|t| t.0).collect::<Vec<_>>()))));
            diags.push(
                Diagnostic::new(format!("unknown stage type `{ty}`"))
                    .at(doc.location(&format!("{at}.type")))
                    .maybe_hint(hint),
            );
            continue;
        };
        if let Some(n) = table.get("name").filter(|n| !n.is_str()) {
            diags.push(
                Diagnostic::new(format!("`{at}.name` must be a string, not {}", n.type_str()))
                    .at(doc.location(&format!("{at}.name")))
                    .hint(format!("quote it: `name = \"{}\"` (names address stages in `--set NAME.key=value`)", n)),
            );
        }
        let name = ConfigDoc::stage_name(table).unwrap_or(ty).to_owned();
        // Names are keys of `--set` and parts of plot file names.
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            diags.push(
                Diagnostic::new(format!("stage name {name:?} cannot address the stage"))
                    .at(doc.location(&format!("{at}.name")))
                    .hint("names address stages in `--set NAME.key=value`: use letters, digits, `_` or `-`"),
            );
        }
        // The longest file named after a stage: `plots/.NAME_caption_length.svg.tmp`.
        let longest = 1 + crate::report::PLOT_SUFFIXES.iter().map(|s| s.len()).max().unwrap_or(0) + ".tmp".len();
        if name.len() + longest > 255 {
            diags.push(
                Diagnostic::new(format!(
                    "stage name `{name}` is {} characters long; plot files are named after it, and {} is the most a \
                     file name leaves",
                    name.len(),
                    255 - longest
                ))
                .at(doc.location(&format!("{at}.name")))
                .hint("choose a shorter name"),
            );
        }
        if ["name", "output_dir", "seed", "stage"].contains(&name.as_str()) {
            diags.push(
                Diagnostic::new(format!("stage name `{name}` is a top-level key"))
                    .at(doc.location(&format!("{at}.name")))
                    .hint(format!("`--set {name}.key=value` would set the top-level `{name}`: choose another name")),
            );
        }
        if names.contains(&name) {
            diags.push(
                Diagnostic::new(format!("two stages are named `{name}`"))
                    .at(doc.location(&at))
                    .hint("give one of them a distinct `name = \"...\"` (names address stages in `--set`)"),
            );
        }
        names.push(name.clone());
        let mut body = table.clone();
        body.remove("type");
        body.remove("name");
        for key in table.keys().filter(|k| *k != "type" && *k != "name") {
            if !keys.contains(&key.as_str()) {
                let hint =
                    did_you_mean(key, keys.iter().copied()).or_else(|| Some(format!("`{ty}` takes {}", list(keys))));
                diags.push(
                    Diagnostic::new(format!("unknown key `{key}` in stage `{name}` ({ty})"))
                        .at(doc.key_location(&format!("{at}.{key}")))
                        .maybe_hint(hint),
                );
                body.remove(key);
            }
        }
        let body = Value::Table(body);
        let mut problems = Problems::default();
        let (stage, resolved) = match ty {
            read_cc_tsv::TYPE => build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &ReadCcTsvConfig| {
                c.build(p).map(|r| Built::Reader(Box::new(r)))
            }),
            read_img2dataset::TYPE => {
                build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &ReadImg2datasetConfig| {
                    c.build(p).map(|r| Built::Reader(Box::new(r)))
                })
            }
            read_yfcc::TYPE => build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &ReadYfccConfig| {
                c.build(p).map(|r| Built::Reader(Box::new(r)))
            }),
            read_imagenet21k::TYPE => {
                build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &ReadImagenet21kConfig| {
                    c.build(p).map(|r| Built::Reader(Box::new(r)))
                })
            }
            read_table::TYPE => build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &ReadTableConfig| {
                c.build(p).map(|r| Built::Reader(Box::new(r)))
            }),
            bow::TYPE => build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &BowConfig| {
                c.build(seed, &schema, p).map(|t| Built::Transform(Box::new(t)))
            }),
            encode_text::TYPE => build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &EncodeTextConfig| {
                c.build(&schema, device, p).map(|t| Built::Transform(Box::new(t)))
            }),
            encode_image::TYPE => {
                build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &EncodeImageConfig| {
                    c.build(&schema, device, p).map(|t| Built::Transform(Box::new(t)))
                })
            }
            mine_pseudo_bow::TYPE => {
                build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &MinePseudoBowConfig| {
                    c.build(seed, &schema, device, p).map(|t| Built::Transform(Box::new(t)))
                })
            }
            write_parquet::TYPE => {
                build(doc, &at, &name, &body, &mut diags, &mut problems, |p, c: &WriteParquetConfig| {
                    if c.rows_per_shard == 0 {
                        p.push(
                            "rows_per_shard",
                            "rows_per_shard must be at least 1",
                            Some("rows per output file; the default is 1000000".into()),
                        );
                    }
                    if let Some(problem) = c.dir_problem() {
                        p.push("dir", problem, Some("the default is `data`".into()));
                    }
                    // Built whatever its problems (reported, so nothing runs): its `columns` are
                    // still checked against what reaches it.
                    Some(Built::Write(c.clone()))
                })
            }
            _ => unreachable!("every registered type is handled"),
        };
        for (key, message, hint) in problems.0 {
            let path = format!("{at}.{key}");
            diags.push(Diagnostic::new(format!("stage `{name}`: {message}")).at(doc.location(&path)).maybe_hint(hint));
        }
        // A reader's `source` names its rows' data set in the `source` column: blank, it names none.
        if resolved.get("source").and_then(serde_json::Value::as_str).is_some_and(|s| s.trim().is_empty()) {
            diags.push(
                Diagnostic::new(format!("stage `{name}`: `source` is blank"))
                    .at(doc.location(&format!("{at}.source")))
                    .maybe_hint(Some(
                        "leave it out for the reader's default, or name the data set: `source = \"cc3m\"`".into(),
                    )),
            );
        }
        let mut resolved = resolved;
        if let serde_json::Value::Object(m) = &mut resolved {
            // A stage seed left out is the pipeline's, and stays left out: `curate run
            // config.json --set seed=N` then reseeds the stage as it would the pipeline file.
            if m.get("seed").is_some_and(serde_json::Value::is_null) {
                m.remove("seed");
            }
            let mut with_type = serde_json::Map::new();
            with_type.insert("type".into(), json!(ty));
            with_type.insert("name".into(), json!(name));
            with_type.extend(std::mem::take(m));
            *m = with_type;
        }
        match &stage {
            Some(Built::Transform(t)) => {
                let next = t.output_schema();
                // Columns this stage does not pass on, for the writer's `missing column` message.
                for f in schema.fields() {
                    if next.field_with_name(f.name()).is_err() {
                        dropped.insert(f.name().clone(), name.clone());
                    }
                }
                for f in next.fields() {
                    dropped.remove(f.name());
                }
                schema = next;
            }
            // `bow` writes the same columns whatever its settings: the writer's `columns` are
            // still checked when a setting of it is wrong.
            None if ty == bow::TYPE => schema = bow::output_schema(),
            None if kind == Kind::Transform => schema_known = false,
            _ => {}
        }
        built.push(Compiled { name, kind, stage, resolved, index: i });
    }

    check_order(doc, &built, &untyped, &types, &mut diags);
    check_text_is_filled(doc, &built, &mut diags);
    check_images_can_be_found(doc, &built, &mut diags);
    let output_schema =
        if schema_known { written_schema(doc, &built, &schema, &dropped, &mut diags) } else { schema.clone() };
    check_inputs_are_not_cleared(doc, &built, top.as_ref(), &mut diags);
    check_output_places(doc, &built, top.as_ref(), &mut diags);

    if !diags.is_empty() {
        return Err(Error::Config(doc.in_file_syntax(diags)));
    }
    let top = top.expect("no diagnostics, so the top level parsed");
    let mut reader = None;
    let mut reader_name = String::new();
    let mut transforms = Vec::new();
    let mut write = None;
    let mut stages_json = Vec::new();
    for Compiled { name, stage, resolved, .. } in built {
        stages_json.push(resolved);
        match stage.expect("no diagnostics, so every stage built") {
            Built::Reader(r) => (reader, reader_name) = (Some(r), name),
            Built::Transform(t) => transforms.push((name, t)),
            Built::Write(w) => write = Some(w),
        }
    }
    let name = top
        .name
        .clone()
        .unwrap_or_else(|| doc.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
    let resolved = json!({
        "name": name,
        "output_dir": top.output_dir,
        "seed": top.seed,
        "stage": stages_json,
    });
    let chunk_split =
        transforms.iter().any(|(_, t)| t.parallel_inside()).then_some(crate::stages::split_chunks::MODEL_CHUNK_ROWS);
    let reader = reader.expect("order checked");
    let reader: Box<dyn crate::stages::Reader> = match chunk_split {
        Some(rows) => Box::new(crate::stages::split_chunks::SplitChunks::new(reader, rows)),
        None => reader,
    };
    Ok(Plan {
        name,
        pipeline_file: doc.path.clone(),
        seed: top.seed,
        output_dir: PathBuf::from(&top.output_dir),
        reader,
        reader_name,
        transforms,
        chunk_split,
        write: write.expect("order checked"),
        output_schema,
        resolved,
    })
}

/// The top-level keys: known ones only, a stage list, and an `output_dir` that can be made.
fn check_top(doc: &ConfigDoc, diags: &mut Vec<Diagnostic>) -> Option<PipelineConfig> {
    // A training file given to `run` / `validate`: one error that says so, not one per key.
    let training: Vec<&str> =
        ["model", "loss", "optim", "steps", "epochs"].into_iter().filter(|k| doc.root.contains_key(*k)).collect();
    if doc.root.get("stage").is_none() && !training.is_empty() {
        let keys = training.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        diags.push(
            Diagnostic::new(format!("`{}` is a training file (it has {keys}), not a pipeline", doc.path.display()))
                .at(doc.location(""))
                .hint(format!("train with `curate train {}`", doc.path.display())),
        );
        return None;
    }
    // A file a run wrote beside its data (`manifest.json`, `report.json`, an evaluation's
    // `config.json`): likewise one error.
    let replay = "a pipeline file lists `[[stage]]`s; the `config.json` beside a run's manifest replays that run";
    let written = [
        ("config_hash", "a run's manifest", replay),
        ("rows", "a run's report", replay),
        ("command", "an evaluation's config", "`curate eval` wrote it; a pipeline file lists `[[stage]]`s"),
    ]
    .into_iter()
    .find(|(k, ..)| doc.root.contains_key(*k));
    if let (None, Some((key, what, hint))) = (doc.root.get("stage"), written) {
        diags.push(
            Diagnostic::new(format!("`{}` looks like {what} (it has `{key}`), not a pipeline", doc.path.display()))
                .at(doc.location(""))
                .hint(hint),
        );
        return None;
    }
    let known_top = fields::<PipelineConfig>();
    for key in doc.root.keys() {
        if !known_top.iter().any(|t| t == key) {
            let hint = did_you_mean(key, known_top.iter().copied())
                .or_else(|| Some(format!("top-level keys are {}; stage keys go under `[[stage]]`", list(known_top))));
            diags.push(
                Diagnostic::new(format!("unknown top-level key `{key}`")).at(doc.key_location(key)).maybe_hint(hint),
            );
        }
    }
    let mut top = doc.root.clone();
    top.retain(|k, _| known_top.contains(&k));
    let top: Option<PipelineConfig> = doc.extract("", &Value::Table(top), diags);
    if doc.root.get("stage").is_some_and(|s| !matches!(s, Value::Array(a) if a.iter().all(Value::is_table))) {
        // Reported by `extract` as a type error already.
    } else if doc.stages().is_empty() {
        // At an empty `stage = []` (in the file or a `--set`), else at the file.
        let at = if doc.root.contains_key("stage") { "stage" } else { "" };
        diags.push(
            Diagnostic::new("the pipeline has no stages")
                .at(doc.location(at))
                .hint("add `[[stage]]` tables: a read stage, transforms, then `write_parquet`"),
        );
    }
    if let Some(t) = &top {
        if Path::new(&t.output_dir).is_file() {
            diags.push(
                Diagnostic::new(format!("`output_dir` `{}` is a file", t.output_dir))
                    .at(doc.location("output_dir"))
                    .hint("name a folder (it is created if it does not exist)"),
            );
        } else if let Some(why) = unwritable(Path::new(&t.output_dir)) {
            diags.push(
                Diagnostic::new(format!("`output_dir` `{}` cannot be written: {why}", t.output_dir))
                    .at(doc.location("output_dir"))
                    .hint("name a folder you can write, or one inside such a folder"),
            );
        }
        if t.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            diags.push(
                Diagnostic::new("the pipeline's `name` is empty")
                    .at(doc.location("name"))
                    .hint("leave `name` out to use the file's name, or give one for the report's title"),
            );
        }
        if t.output_dir.trim().is_empty() {
            diags.push(
                Diagnostic::new("`output_dir` is empty")
                    .at(doc.location("output_dir"))
                    .hint("name the folder for this run's outputs, e.g. `output_dir = \"out/bow\"`"),
            );
        }
    }
    top
}

/// Order: one reader first, transforms, one writer last.
fn check_order(
    doc: &ConfigDoc,
    built: &[Compiled],
    untyped: &[usize],
    types: &[StageType],
    diags: &mut Vec<Diagnostic>,
) {
    // Every stage in file order with its kind; `None` for one without a known type, which may
    // be of any kind (its own error says what is wrong): the order is wrong only if no kind
    // there would make it right.
    let mut slots: Vec<(usize, Option<Kind>)> =
        built.iter().map(|b| (b.index, Some(b.kind))).chain(untyped.iter().map(|&i| (i, None))).collect();
    slots.sort_by_key(|s| s.0);
    let (Some(first), Some(last)) = (slots.first(), slots.last()) else { return };
    // The end that holds another kind, or else a stage of `kind` placed where it cannot be.
    let misplaced = |kind: Kind, end: (usize, Option<Kind>)| {
        if end.1.is_some_and(|k| k != kind) {
            return Some(end.0);
        }
        slots.iter().find(|s| s.1 == Some(kind) && s.0 != end.0).map(|s| s.0)
    };
    if let Some(at) = misplaced(Kind::Read, *first) {
        diags.push(
            Diagnostic::new("a pipeline starts with exactly one read stage")
                .at(doc.location(&format!("stage[{at}]")))
                .hint(format!(
                    "read stages: {}",
                    list(&types.iter().filter(|t| t.1 == Kind::Read).map(|t| t.0).collect::<Vec<_>>())
                )),
        );
    }
    // One stage alone cannot be both ends: if its type is unknown, at least the writer is missing.
    let alone = slots.len() == 1 && last.1.is_none();
    if alone || misplaced(Kind::Write, *last).is_some() {
        diags.push(
            Diagnostic::new("a pipeline ends with exactly one `write_parquet` stage")
                .at(doc.location(&format!("stage[{}]", last.0)))
                .hint("end the file with a `[[stage]]` of `type = \"write_parquet\"`"),
        );
    }
}

/// `bow` deforms captions and `encode_text` embeds a text column (`caption` by default): after a
/// reader that never fills it (an image folder has no caption, a table only the columns it maps,
/// Conceptual Captions no label), with no `mine_pseudo_bow` to make captions, every row would be
/// rejected. A `mine_pseudo_bow` that replaces captions the rows have is noted (not refused: the
/// pseudo captions may be compared with the real ones).
fn check_text_is_filled(doc: &ConfigDoc, built: &[Compiled], diags: &mut Vec<Diagnostic>) {
    use crate::schema::{CAPTION, ORIGINAL_CAPTION};
    let mut reader: Option<&dyn Reader> = None;
    let mut captions = true;
    for b in built {
        let t = b.resolved["type"].as_str();
        if let Some(Built::Reader(r)) = &b.stage {
            reader = Some(r.as_ref());
            captions = r.fills(CAPTION);
        }
        if t == Some(mine_pseudo_bow::TYPE) {
            // Pseudo-BoW captions are for uncaptioned images: a caption the rows have is replaced.
            if captions {
                say!(
                    "note: stage `{}` replaces the captions its rows have (the reader's) with pseudo-BoW ones; the \
                     output keeps no other caption column",
                    b.name
                );
            }
            captions = true;
        }
        let column = match t {
            Some(bow::TYPE) => CAPTION,
            Some(encode_text::TYPE) => b.resolved["column"].as_str().unwrap_or(CAPTION),
            _ => continue,
        };
        // `original_caption` is the caption `bow` kept; a column no stage makes has its own error.
        let filled = match column {
            CAPTION | ORIGINAL_CAPTION => captions,
            c => schema::pairs().field_with_name(c).is_err() || reader.is_none_or(|r| r.fills(c)),
        };
        if filled {
            continue;
        }
        let (what, hint) = if column == CAPTION {
            (
                format!("{} captions", if t == Some(bow::TYPE) { "deforms" } else { "embeds" }),
                "map a caption column (`read_table`), or make pseudo-BoW captions first with a \
                 `mine_pseudo_bow` stage (uncaptioned images, e.g. `read_imagenet21k`)"
                    .to_string(),
            )
        } else {
            let pairs = schema::pairs();
            let texts: Vec<&str> = pairs
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .filter(|c| ![schema::SAMPLE_ID, schema::SOURCE].contains(c) && reader.is_some_and(|r| r.fills(c)))
                .collect();
            (
                format!("embeds `{column}`"),
                format!("the reader fills {}; or map a `{column}` column (`read_table`)", list(&texts)),
            )
        };
        diags.push(
            Diagnostic::new(format!(
                "stage `{}` {what}, but the rows it gets have none: every row would be rejected",
                b.name
            ))
            .at(doc.location(&format!("stage[{}]", b.index)))
            .hint(hint),
        )
    }
}

/// The image stages after a reader whose rows do not name their image by path: by a shard and a
/// key (`read_img2dataset`: without `shards_dir`), by URL only (images not downloaded) or not at
/// all; every row would be rejected (`missing_image`).
fn check_images_can_be_found(doc: &ConfigDoc, built: &[Compiled], diags: &mut Vec<Diagnostic>) {
    let Some(reader) = built.iter().find_map(|b| match &b.stage {
        Some(Built::Reader(r)) => Some(r),
        _ => None,
    }) else {
        return;
    };
    let refs = reader.image_refs();
    for b in built {
        let image_stage = matches!(b.resolved["type"].as_str(), Some(encode_image::TYPE | mine_pseudo_bow::TYPE));
        if !image_stage || b.stage.is_none() {
            continue;
        }
        let (what, hint) = match refs {
            ImageRefs::Paths => continue,
            ImageRefs::ShardKeys if !b.resolved["shards_dir"].is_null() => continue,
            ImageRefs::ShardKeys => (
                "name a tar shard and a key, not a path: without `shards_dir`",
                "set `shards_dir` to the folder of img2dataset's `.tar` shards",
            ),
            ImageRefs::UrlsOnly => (
                "name their image by URL only, and curate reads image files:",
                "download the images first (e.g. with img2dataset) and read its output with \
                 `read_img2dataset`, or map a `path` column with `read_table`",
            ),
            ImageRefs::Nothing => ("name no image:", "map a `path` column (`read_table`)"),
        };
        diags.push(
            Diagnostic::new(format!(
                "stage `{}` reads images, but the rows it gets {what} every row would be rejected (`missing_image`)",
                b.name
            ))
            .at(doc.location(&format!("stage[{}]", b.index)))
            .hint(hint),
        );
    }
}

/// The schema written: the writer's `columns` (each produced by an earlier stage, once) out of
/// `schema`, the one the stages produce; all of it without `columns`.
/// `dropped` names, for a column an earlier stage made, the stage that did not pass it on.
fn written_schema(
    doc: &ConfigDoc,
    built: &[Compiled],
    schema: &SchemaRef,
    dropped: &std::collections::HashMap<String, String>,
    diags: &mut Vec<Diagnostic>,
) -> SchemaRef {
    let mut output_schema = schema.clone();
    let writer_index = built.iter().position(|b| b.kind == Kind::Write);
    if let Some(wi) = writer_index {
        let wi_file = built[wi].index;
        if let Some(Built::Write(w)) = &built[wi].stage {
            if let Some(cols) = &w.columns {
                let available: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                let mut picked: Vec<arrow_schema::FieldRef> = Vec::new();
                if cols.is_empty() {
                    diags.push(
                        Diagnostic::new("`columns` is empty: no column would be written")
                            .at(doc.location(&format!("stage[{wi_file}].columns")))
                            .hint(format!("leave `columns` out to write all of them: {}", list(&available))),
                    );
                }
                for (j, c) in cols.iter().enumerate() {
                    match schema.field_with_name(c) {
                        // Parquet readers (pyarrow, polars) refuse a file with two columns of a name.
                        Ok(_) if cols[..j].contains(c) => diags.push(
                            Diagnostic::new(format!("column `{c}` is listed twice"))
                                .at(doc.location(&format!("stage[{wi_file}].columns[{j}]")))
                                .hint("list each column once"),
                        ),
                        Ok(f) => picked.push(Arc::new(f.clone())),
                        Err(_) => diags.push(
                            Diagnostic::new(match dropped.get(c) {
                                Some(stage) => format!("missing column `{c}`: stage `{stage}` does not pass it on"),
                                None => format!("missing column `{c}`: no earlier stage produces it"),
                            })
                            .at(doc.location(&format!("stage[{wi_file}].columns[{j}]")))
                            .hint(column_hint(c, &available)),
                        ),
                    }
                }
                output_schema = Arc::new(Schema::new(picked));
            }
        }
    }

    output_schema
}

/// An input among the shards a run into `output_dir` clears first would be deleted unread.
/// What a run makes in `output_dir` that something of another kind holds already (a file
/// where it writes a folder, a folder where it writes a file): the run would fail there only
/// after reading everything.
fn check_output_places(doc: &ConfigDoc, built: &[Compiled], top: Option<&PipelineConfig>, diags: &mut Vec<Diagnostic>) {
    let Some(top) = top else { return };
    let out = Path::new(&top.output_dir);
    let data = built.iter().find_map(|b| match &b.stage {
        Some(Built::Write(w)) if w.dir_problem().is_none() => Some((w.dir.as_str(), b.index)),
        _ => None,
    });
    let folders = data
        .iter()
        .map(|&(dir, i)| (dir, format!("stage[{i}].dir")))
        .chain(["rejects", "plots", crate::stages::write_parquet::STALE_DIR].map(|d| (d, "output_dir".to_owned())));
    for (name, key) in folders {
        // The folder, or a folder it is made in (`dir = "x/data"`), below `output_dir`.
        let blocked = Path::new(name)
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .map(|a| out.join(a))
            .filter(|p| p.exists() && !p.is_dir())
            .last();
        if let Some(place) = blocked {
            diags.push(
                Diagnostic::new(format!("`{}` is a file, where the run writes its folder `{name}`", place.display()))
                    .at(doc.location(&key))
                    .hint("move or delete it, or write to another `output_dir` (e.g. `--set output_dir=...`)"),
            );
        }
    }
    for name in crate::pipeline::execute::RUN_FILES {
        let place = out.join(name);
        if place.is_dir() {
            diags.push(
                Diagnostic::new(format!("`{}` is a folder, where the run writes its file `{name}`", place.display()))
                    .at(doc.location("output_dir"))
                    .hint("move or delete it, or write to another `output_dir` (e.g. `--set output_dir=...`)"),
            );
        }
    }
    // Files a run replaces, in a folder that holds no earlier pipeline run (a training run's
    // `config.json` and `model.bpk`, someone's `report.md`): they are not a run's to replace.
    let data_dir = out.join(data.map_or("data", |(dir, _)| dir));
    if let Some(foreign) = foreign_files(out, &data_dir) {
        diags.push(
            Diagnostic::new(format!(
                "`{}` holds {foreign} but no earlier pipeline run (its `config.json` has no `[[stage]]`, or there is none): \
                 a run would replace them",
                out.display()
            ))
            .at(doc.location("output_dir"))
            .hint("write to another `output_dir` (e.g. `--set output_dir=out/bow`)"),
        );
    }
    // Folders a run clears and writes in: one it cannot write in would fail the run only after it
    // had removed the earlier run's manifest and report.
    // (`output_dir` itself is checked with the other keys.)
    // The earlier run's data folder too, where its `config.json` names another: its shards go.
    let mut places: Vec<PathBuf> = vec![out.join("rejects"), out.join("plots")];
    places.extend(data.map(|(dir, _)| out.join(dir)));
    places
        .extend(crate::pipeline::execute::previous_data_dir(out).map(|d| out.join(d)).filter(|d| !places.contains(d)));
    for place in places {
        if let Some(why) = place.is_dir().then(|| unwritable(&place)).flatten() {
            diags.push(
                Diagnostic::new(format!("the run clears and writes `{}`: {why}", place.display()))
                    .at(doc.location("output_dir"))
                    .hint("make it writable (`chmod u+w`), or write to another `output_dir`"),
            );
        }
    }
}

/// What in `out` a run would replace although no earlier pipeline run made it: `None` when `out`
/// holds an earlier run (a `config.json` with stages, or shards in `data_dir` or `rejects/`),
/// none of the files a run writes beside its data, or is not a folder.
fn foreign_files(out: &Path, data_dir: &Path) -> Option<String> {
    let config = std::fs::read_to_string(out.join("config.json")).ok();
    let pipeline_config = config
        .as_deref()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
        .is_some_and(|v| v["stage"].is_array());
    let has_shards = |dir: &Path| {
        std::fs::read_dir(dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| crate::pipeline::execute::is_run_shard(&e.file_name().to_string_lossy())))
        })
    };
    if pipeline_config || has_shards(data_dir) || has_shards(&out.join("rejects")) {
        return None;
    }
    let mut names: Vec<&str> =
        crate::pipeline::execute::RUN_FILES.iter().copied().filter(|n| out.join(n).is_file()).collect();
    if names.is_empty() {
        return None;
    }
    if out.join("model.bpk").is_file() {
        names.push("model.bpk (a `curate train` run)");
    }
    Some(names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", "))
}

/// `path` made absolute with its symbolic links resolved, as far as it exists (the rest, which a
/// run creates, appended as written).
fn resolved(path: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut at = std::path::absolute(path).ok()?;
    loop {
        if let Ok(real) = at.canonicalize() {
            return Some(rest.iter().rev().fold(real, |p, c: &std::ffi::OsString| p.join(c)));
        }
        rest.push(at.file_name()?.to_owned());
        at = at.parent()?.to_owned();
    }
}

fn check_inputs_are_not_cleared(
    doc: &ConfigDoc,
    built: &[Compiled],
    top: Option<&PipelineConfig>,
    diags: &mut Vec<Diagnostic>,
) {
    let reader = built.iter().find_map(|b| match &b.stage {
        Some(Built::Reader(r)) => Some((r, b.index)),
        _ => None,
    });
    let writer = built.iter().find_map(|b| match &b.stage {
        Some(Built::Write(w)) if w.dir_problem().is_none() => Some(w),
        _ => None,
    });
    if let (Some((r, _)), Some(t)) = (reader, &top) {
        // An input folder (an image folder's root) that is the output folder: the run's own files
        // would change the listing it reads, and every run would stop as "changed while read".
        // Within a folder the reader lists (a synset folder), they would be read as images too.
        let out = resolved(Path::new(&t.output_dir));
        for input in r.inputs().iter().filter(|p| p.is_dir()) {
            let Some(below) =
                input.canonicalize().ok().and_then(|i| Some(out.as_ref()?.strip_prefix(i).ok()?.to_owned()))
            else {
                continue;
            };
            let first = below.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned());
            let (message, hint) = match first {
                None => (
                    format!("`output_dir` is the input folder `{}`", input.display()),
                    "write to a folder inside it (e.g. `curated`) or elsewhere",
                ),
                Some(f) if crate::stages::read_imagenet21k::is_synset(&f) => (
                    format!(
                        "`output_dir` is within `{f}`, a folder of the input `{}` that the reader lists (the run's \
                         files would be read as images)",
                        input.display()
                    ),
                    "write to a folder of the input root that is no synset folder (e.g. `curated`) or elsewhere",
                ),
                Some(_) => continue,
            };
            diags.push(
                Diagnostic::new(format!("{message}: the run's files would change the listing it reads"))
                    .at(doc.location("output_dir"))
                    .hint(hint),
            );
        }
    }
    if let (Some((r, ri)), Some(w), Some(t)) = (reader, writer, &top) {
        let out = PathBuf::from(&t.output_dir);
        let (data, rejects) = (out.join(&w.dir), out.join("rejects"));
        for f in crate::pipeline::execute::inputs_a_run_clears(&out, &[&data, &rejects], &r.inputs()) {
            diags.push(
                Diagnostic::new(format!(
                    "input `{}` is a file of this pipeline's own output: a run replaces or clears it before reading",
                    f.display()
                ))
                .at(doc.location(&format!("stage[{ri}].path")))
                .hint("write to another `output_dir` (e.g. `--set output_dir=...`)"),
            );
        }
    }
}

/// Extracts a stage config and builds it; returns the stage and its resolved JSON.
fn build<C, F>(
    doc: &ConfigDoc,
    at: &str,
    name: &str,
    body: &Value,
    diags: &mut Vec<Diagnostic>,
    problems: &mut Problems,
    f: F,
) -> (Option<Built>, serde_json::Value)
where
    C: DeserializeOwned + Serialize,
    F: FnOnce(&mut Problems, &C) -> Option<Built>,
{
    match doc.extract_shown::<C>(at, name, body, diags) {
        (Some(c), dropped) if dropped.is_empty() => {
            let resolved = serde_json::to_value(&c).unwrap_or(serde_json::Value::Null);
            (f(problems, &c), resolved)
        }
        // Wrong keys were dropped (and reported): the rest is still checked, so one `validate`
        // reports a bad value and a missing input file together, but nothing runs, and
        // problems of the dropped keys (now at their defaults), or of the tables holding them,
        // are left out.
        (Some(c), dropped) => {
            let stage = f(problems, &c);
            let related = |a: &str, b: &str| a == b || [".", "["].iter().any(|s| a.starts_with(&format!("{b}{s}")));
            // Keys whose meaning depends on another's: a table's columns are named against
            // its header, which its format decides (`header = "yes"` dropped leaves the default,
            // and names would then be "without a header").
            let depends =
                |problem: &str, d: &str| DEPENDS_ON.iter().any(|(key, on)| related(problem, key) && related(d, on));
            // A list that kept some of its elements (`path = ["a.tsv", 2]`): its problems are
            // the kept elements' (a missing `a.tsv`), not a follow-on of the dropped one.
            let kept_some = |list: &str| {
                let gone = dropped.iter().filter(|d| d.strip_prefix(list).is_some_and(|r| r.starts_with('['))).count();
                body.get(list).and_then(Value::as_array).is_some_and(|a| a.len() > gone)
            };
            let element_of =
                |d: &str, key: &str| d.strip_prefix(key).is_some_and(|r| r.starts_with('[') && !r.contains('.'));
            problems.0.retain(|(key, ..)| {
                !dropped.iter().any(|d| {
                    related(key, d) || (related(d, key) && !(element_of(d, key) && kept_some(key))) || depends(key, d)
                })
            });
            // The writer is kept (nothing runs: its wrong keys are reported): its `columns`, if
            // not among them, are still checked against what reaches it.
            let writer = match stage {
                Some(Built::Write(w)) if !dropped.iter().any(|d| related(d, "columns")) => Some(Built::Write(w)),
                _ => None,
            };
            (writer, serde_json::Value::Null)
        }
        (None, _) => (None, serde_json::Value::Null),
    }
}

/// (key, key it depends on) in a stage: problems of the first are left out when the second
/// had a wrong value (dropped, its default in its place).
const DEPENDS_ON: [(&str, &str); 3] = [("columns", "header"), ("columns", "format"), ("header", "format")];

/// `did you mean `type`?` for a key of a stage with no `type` that is a near miss of it.
fn did_you_mean_key<'a>(keys: impl Iterator<Item = &'a str>) -> Option<String> {
    keys.filter(|k| *k != "type")
        .find(|k| did_you_mean(k, ["type"]).is_some())
        .map(|k| format!("`{k}`: did you mean `type`?"))
}

/// Why the folder `dir` could not be created or written, if so: checked on the folder, or, when
/// it does not exist yet, on its nearest existing ancestor (which must be a folder the user may
/// write in). `validate` then catches what `run` would fail on only after reading.
fn unwritable(dir: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    // Names and paths the kernel refuses (NAME_MAX, PATH_MAX on Linux).
    if let Some(long) = dir.components().map(|c| c.as_os_str()).find(|c| c.len() > 255) {
        return Some(format!("the name `{}` is {} bytes long, over 255", long.to_string_lossy(), long.len()));
    }
    // The run writes paths longer than the folder's own (`rejects/.part-00000.parquet.tmp`,
    // `plots/` files named after stages): room is kept for them.
    const ROOM: usize = 128;
    if dir.as_os_str().len() + ROOM > 4095 {
        return Some(format!(
            "the path is {} bytes long: with the {ROOM} bytes kept for the names written in it, over the 4,095 \
             a path may have",
            dir.as_os_str().len()
        ));
    }
    // A link to nothing is not there to `exists`, but no folder can be made in its place; nor
    // in place of a loop of links.
    let dangling = dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).find_map(|a| {
        let to = std::fs::read_link(a).ok()?;
        let looped = std::fs::metadata(a).is_err_and(|e| e.raw_os_error() == Some(libc::ELOOP));
        Some(match looped {
            true => format!("`{}` is a link in a loop of links", a.display()),
            false => format!("`{}` is a link to `{}`, which does not exist", a.display(), to.display()),
        })
    });
    if dangling.is_some() {
        return dangling;
    }
    let existing = dir.ancestors().find(|a| a.as_os_str().is_empty() || a.exists())?;
    let existing = if existing.as_os_str().is_empty() { Path::new(".") } else { existing };
    if !existing.is_dir() {
        return Some(format!("`{}` is not a folder", existing.display()));
    }
    let c = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    // The kernel's own file systems: `access` lets root through, but shards cannot be written there.
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `c` is a NUL-terminated path; `fs` is written by the call before it is read.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(c.as_ptr(), &mut fs) } == 0 {
            let kind = match fs.f_type as i64 {
                0x9fa0 => Some("proc"),
                0x6265_6572 => Some("sysfs"),
                0x6367_7270 | 0x0027_e0eb => Some("cgroup"),
                0x6462_6720 => Some("debugfs"),
                _ => None,
            };
            if let Some(kind) = kind {
                return Some(format!("`{}` is on the kernel's {kind} file system", existing.display()));
            }
        }
    }
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let ok = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0;
    let read_only = !ok && std::io::Error::last_os_error().raw_os_error() == Some(libc::EROFS);
    (!ok).then(|| match (read_only, existing == dir) {
        (true, _) => format!("`{}` is on a read-only file system", existing.display()),
        (false, true) => "no permission to write in it".to_owned(),
        (false, false) => format!("no permission to create folders in `{}`", existing.display()),
    })
}
