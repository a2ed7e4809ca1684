//! `curate eval RUN_DIR` (issue 5): evaluates a finished `curate train` run. Its model
//! ([`TrainedRun`]) embeds a retrieval set in the COCO layout ([`super::embeddings::ImageList`],
//! [`super::embeddings::CaptionList`]) — the `--images`/`--captions` flags, else the run
//! config's `[eval.retrieval]` — with images preprocessed as the trainer's zero-shot evaluation
//! does (the evaluation view of the run's `data.image_transform`: by default the whole image
//! resized to the model's square size; `otter` and `clip` resize and centre-crop). The galleries
//! then go through the same [`super::evaluate`] and [`super::report`] as precomputed
//! embeddings, so both forms of `curate eval` write the same files. When the run config has
//! zero-shot settings (`[eval]`), the trainer's zero-shot top-1/top-5
//! ([`crate::train::zeroshot`]) are added, and given `--uni-images`/`--sts`, CUSA's uni-modal
//! image retrieval and STS scores ([`super::unimodal`]); given `--probe`, the transfer linear
//! probe of its image tower ([`super::linear_probe`]); given `--compose`, OTTER's image-text
//! compositionality benchmark ([`super::compositionality`]). With a uni-modal, probe or
//! compositionality table the retrieval set is optional: the evaluation then scores what it has inputs for.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::Device;
use rayon::prelude::*;
use serde::Serialize;

use super::compositionality::{self, ComposeConfig, ComposeTable};
use super::embeddings::{self, Captions, Images};
use super::linear_probe::{self, ProbeConfig, ProbeTable};
use super::unimodal::{self, StsPairs, UniImages};
use super::{evaluate_scored, report, Annotations, Evaluation, Precision, Scoring, Similarity};
use crate::error::{Error, Result};
use crate::train::config::{TrainConfig, ZeroShotConfig};
use crate::train::data::{read_image, ImageSource};
use crate::train::trained::TrainedRun;
use crate::train::transform::ImageTransform;
use crate::train::zeroshot::ZeroShot;

/// Images per image-tower forward pass (the trainer's zero-shot batch). Embeddings do not depend
/// on it beyond float rounding.
pub const IMAGE_BATCH: usize = 64;

/// Captions per [`TrainedRun::embed_texts`] call between progress lines (a multiple of its
/// internal batch, so the batches are the same as one call over all captions).
const TEXT_CHUNK: usize = 4096;

/// `curate eval RUN_DIR`: what to evaluate and where to write.
#[derive(Debug, Clone, Default)]
pub struct RunEval {
    /// The `curate train` output directory (`config.json`, `model.bpk`).
    pub run: PathBuf,
    /// Image list (`coco_image_id`, `path`); with `captions`, replaces the run config's
    /// `eval.retrieval`.
    pub images: Option<PathBuf>,
    /// Caption list (`coco_caption_id`, `coco_image_id`, `caption`).
    pub captions: Option<PathBuf>,
    /// Folder the `path` column is relative to; overrides `eval.retrieval.image_root`.
    pub image_root: Option<PathBuf>,
    /// The eccv-caption package's `data/` folder (CxC and ECCV Caption).
    pub eccv_annotations: Option<PathBuf>,
    /// Output folder; default `run/eval`.
    pub out: Option<PathBuf>,
    /// Default: CSD for a PCME++ run (its log-variance heads), else cosine.
    pub similarity: Option<Similarity>,
    /// Default: float64 for CSD, else float32.
    pub precision: Option<Precision>,
    /// Score the run's SWA average (`model_swa.bpk`) instead of its final model.
    pub swa: bool,
    /// Score the model the run selected on its validation set (`model_best.bpk`).
    pub best: bool,
    /// Say on stderr what is being embedded (counts, then progress lines).
    pub progress: bool,
    /// CUSA's uni-modal image retrieval set ([`super::unimodal::UniImages`]: `path`, `label`,
    /// optional `split`); relative paths resolve against `uni_images_root`, else `image_root`,
    /// when given.
    pub uni_images: Option<PathBuf>,
    /// The folder of `uni_images`' relative paths, in place of `image_root`.
    pub uni_images_root: Option<PathBuf>,
    /// STS sentence pairs ([`super::unimodal::StsPairs`]: `sentence1`, `sentence2`, `score`).
    pub sts: Option<PathBuf>,
    /// The linear probe's image table ([`super::linear_probe::ProbeTable`]: `path`, `label`,
    /// `split`); relative paths resolve against `probe_image_root`, else `image_root`, when given.
    pub probe: Option<PathBuf>,
    /// The folder of `probe`'s relative paths, in place of `image_root`.
    pub probe_image_root: Option<PathBuf>,
    /// How the probe fits and chooses its classifier.
    pub probe_config: ProbeConfig,
    /// OTTER's compositionality gallery ([`super::compositionality::ComposeTable`]: `path`,
    /// `attributes`); relative paths resolve against `compose_image_root`, else `image_root`,
    /// when given.
    pub compose: Option<PathBuf>,
    /// The folder of `compose`'s relative paths, in place of `image_root`.
    pub compose_image_root: Option<PathBuf>,
    /// How many compositionality queries, and how they are drawn.
    pub compose_config: ComposeConfig,
}

impl RunEval {
    /// The folders the uni-modal, probe and compositionality tables' relative paths resolve
    /// against: each table's own, else `--image-root` (never the run config's
    /// `eval.retrieval.image_root`, another set's folder).
    fn table_roots(&self) -> [Option<&Path>; 3] {
        let shared = self.image_root.as_deref();
        [&self.uni_images_root, &self.probe_image_root, &self.compose_image_root].map(|own| own.as_deref().or(shared))
    }

    /// The output folder: `out`, or `RUN_DIR/eval` (`RUN_DIR/eval_swa` for the SWA average).
    pub fn out_dir(&self) -> PathBuf {
        let name = match (self.swa, self.best) {
            (true, _) => "eval_swa",
            (_, true) => "eval_best",
            _ => "eval",
        };
        self.out.clone().unwrap_or_else(|| self.run.join(name))
    }
}

/// The inputs as resolved, written to `config.json` once the evaluation is done.
#[derive(Debug, Clone, Serialize)]
pub struct Resolved {
    pub run: PathBuf,
    /// Where the retrieval set came from: `flags`, `run config` (`eval.retrieval`), or `none`
    /// (only uni-modal tables were given).
    pub retrieval_from: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captions: Option<PathBuf>,
    pub image_root: Option<PathBuf>,
    /// `--uni-images` (its relative paths resolve against `--uni-images-root`, else
    /// `--image-root`, else as stored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uni_images: Option<PathBuf>,
    /// Each table's own image folder, when given (`--uni-images-root`, `--probe-image-root`,
    /// `--compose-image-root`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uni_images_root: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_image_root: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compose_image_root: Option<PathBuf>,
    /// `--sts`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sts: Option<PathBuf>,
    /// `--probe` and how its classifier was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_config: Option<ProbeConfig>,
    /// `--compose` and how its queries were drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compose: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compose_config: Option<ComposeConfig>,
    pub eccv_annotations: Option<PathBuf>,
    /// The run's zero-shot settings (without `retrieval`), when it has them.
    pub zeroshot: Option<ZeroShotConfig>,
    pub image_size_px: usize,
    pub out: PathBuf,
    pub similarity: Similarity,
    pub precision: Precision,
    /// Whether the SWA average (`model_swa.bpk`) was scored.
    pub swa: bool,
    /// Whether the selected model (`model_best.bpk`) was scored.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub best: bool,
}

/// The retrieval set: the flags, else the run config's `eval.retrieval`, else none when a
/// uni-modal table is given (an error without one: there would be nothing to evaluate).
fn resolve(args: &RunEval, config: &TrainConfig, has_uncertainty: bool) -> Result<Resolved> {
    let similarity = args.similarity.unwrap_or(if has_uncertainty { Similarity::Csd } else { Similarity::Cosine });
    if similarity == Similarity::Csd && !has_uncertainty {
        return Err(Error::Data {
            message: format!(
                "`--similarity csd` needs PCME++'s log-variance heads, and `{}` has none (it was trained with `loss.type = \"{}\"`)",
                args.run.display(),
                config.loss.loss_type().name()
            ),
            hint: Some("score it by `cosine` (the default for such a run)".into()),
        });
    }
    let precision = resolve_precision(similarity, args.precision)?;
    let (retrieval_from, images, captions, image_root) = match (&args.images, &args.captions) {
        (Some(i), Some(c)) => ("flags", Some(i.clone()), Some(c.clone()), args.image_root.clone()),
        (None, None) => match config.eval.as_ref().and_then(|e| e.retrieval.as_ref()) {
            Some(r) => (
                "run config",
                Some(r.images.clone()),
                Some(r.captions.clone()),
                args.image_root.clone().or_else(|| r.image_root.clone()),
            ),
            None if args.uni_images.is_some()
                || args.sts.is_some()
                || args.probe.is_some()
                || args.compose.is_some() =>
            {
                ("none", None, None, args.image_root.clone())
            }
            None => {
                return Err(Error::Data {
                    message: format!(
                        "no retrieval set to evaluate `{}` on: neither `--images`/`--captions` nor \
                         `eval.retrieval` in its config.json (nor a uni-modal `--uni-images`/`--sts` table, nor \
                         `--probe` or `--compose`)",
                        args.run.display()
                    ),
                    hint: Some(
                        "pass `--images IMAGES.parquet --captions CAPTIONS.parquet` (`coco_image_id` + `path`; \
                         `coco_caption_id`, `coco_image_id` + `caption`), or add `[eval.retrieval]` with `images` \
                         and `captions` to the training file"
                            .into(),
                    ),
                })
            }
        },
        _ => return Err(Error::data("`--images` and `--captions` go together")),
    };
    if images.is_none() && args.eccv_annotations.is_some() {
        return Err(Error::Data {
            message: "`--eccv-annotations` annotate a retrieval set, and there is none to evaluate".into(),
            hint: Some(
                "add `--images`/`--captions` (the COCO 5K test split), or leave out `--eccv-annotations`".into(),
            ),
        });
    }
    let zeroshot = config.eval.clone().filter(|z| z.images.is_some()).map(|mut z| {
        z.retrieval = None;
        z
    });
    Ok(Resolved {
        run: args.run.clone(),
        retrieval_from,
        images,
        captions,
        image_root,
        uni_images: args.uni_images.clone(),
        uni_images_root: args.uni_images_root.clone(),
        probe_image_root: args.probe_image_root.clone(),
        compose_image_root: args.compose_image_root.clone(),
        sts: args.sts.clone(),
        probe: args.probe.clone(),
        probe_config: args.probe.as_ref().map(|_| args.probe_config.clone()),
        compose: args.compose.clone(),
        compose_config: args.compose.as_ref().map(|_| args.compose_config.clone()),
        eccv_annotations: args.eccv_annotations.clone(),
        zeroshot,
        image_size_px: config.model.image_size_px,
        out: args.out_dir(),
        similarity,
        precision,
        swa: args.swa,
        best: args.best,
    })
}

/// `--precision` given `--similarity`: CSD is float64 (its reference's); the others default to
/// float32 (eccv-caption's).
pub fn resolve_precision(similarity: Similarity, precision: Option<Precision>) -> Result<Precision> {
    match (similarity, precision) {
        (Similarity::Csd, Some(Precision::F32)) => Err(Error::Data {
            message: "`--similarity csd` is computed in float64, as PCME++'s reference computes it".into(),
            hint: Some("leave out `--precision`, or give `--precision f64`".into()),
        }),
        (Similarity::Csd, _) => Ok(Precision::F64),
        (_, p) => Ok(p.unwrap_or_default()),
    }
}

/// Loads the run, embeds the retrieval set, evaluates (plus zero-shot when configured) and
/// writes the report into [`RunEval::out_dir`]: `config.json`, then `metrics.json`,
/// `metrics.md`, `recall_at_k.svg`, all once the evaluation is done (a failed one leaves an
/// earlier one as it was). Inputs are checked (tables, annotations, zero-shot set, an output
/// folder that is no evaluation's) before anything is embedded.
pub fn run_trained(args: &RunEval, device: &Device) -> Result<Evaluation> {
    let note = |msg: String| {
        if args.progress {
            say!("{msg}");
        }
    };
    let t0 = Instant::now();
    let run = if args.best {
        TrainedRun::load_best(&args.run, device)?
    } else {
        TrainedRun::load_weights(&args.run, device, args.swa)?
    };
    let r = resolve(args, &run.config, run.has_uncertainty())?;
    let t_load = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let set = match (&r.images, &r.captions) {
        (Some(images), Some(captions)) => {
            Some(RetrievalSet::read(images, captions, r.image_root.as_deref(), run.config.data.pre_caption)?)
        }
        _ => None,
    };
    let uni_images = r.uni_images.as_deref().map(UniImages::read).transpose()?;
    let sts = r.sts.as_deref().map(|f| StsPairs::read(f, run.config.data.pre_caption)).transpose()?;
    let probe = r.probe.as_deref().map(|f| ProbeTable::read(f, "path")).transpose()?;
    let compose = r.compose.as_deref().map(ComposeTable::read).transpose()?;
    // The queries are drawn and every image is looked for before anything is embedded.
    let drawn = match (&compose, &r.compose_config) {
        (Some(t), Some(c)) => Some(compositionality::draw_queries(t, c)?),
        _ => None,
    };
    let [uni_root, probe_root, compose_root] = args.table_roots();
    if let Some(t) = &uni_images {
        check_images(&t.file, &t.paths, uni_root)?;
    }
    if let Some(t) = &probe {
        check_images(&t.file, &t.keys, probe_root)?;
    }
    if let Some(t) = &compose {
        check_images(&t.file, &t.paths, compose_root)?;
    }
    let annotations = r.eccv_annotations.as_deref().map(Annotations::read_dir).transpose()?;
    let zeroshot =
        r.zeroshot.as_ref().map(|z| ZeroShot::load(z, &run.transform(), run.config.data.pre_caption)).transpose()?;

    let t_read = t1.elapsed().as_secs_f64();
    report::check_out(&r.out)?;

    let mut ev = match &set {
        Some(set) => set.evaluate(&run, r.similarity, r.precision, annotations.as_ref(), &note)?,
        // Only uni-modal tables: no retrieval metrics.
        None => Evaluation::default(),
    };
    // The validation set of `select_best`, whether named by the run config or by the flags.
    let same = |a: &Path, b: &Path| a == b || a.canonicalize().ok().is_some_and(|a| b.canonicalize().ok() == Some(a));
    ev.counts.selection_set = match (&r.images, &r.captions) {
        (Some(images), Some(captions)) => run
            .config
            .eval
            .as_ref()
            .filter(|e| e.select_best)
            .and_then(|e| e.retrieval.as_ref())
            .is_some_and(|v| same(&v.images, images) && same(&v.captions, captions)),
        _ => false,
    };
    for (i, (k, v)) in [("load", t_load), ("read", t_read)].into_iter().enumerate() {
        ev.timings_s.insert(i, (k.to_owned(), v));
    }
    if let Some(z) = zeroshot {
        note(format!("zero-shot classification over {} classes", z.classes));
        if z.skipped > 0 {
            note(format!("{} zero-shot row(s) left out: their image path or label is null", z.skipped));
        }
        if let Some(note_text) = crate::train::zeroshot::shared_names_note(&z.shared_names) {
            note(note_text);
        }
        let t4 = Instant::now();
        ev.zeroshot = Some(z.evaluate(&run.model, &run.tokenizer)?.into());
        ev.timings_s.push(("zeroshot".to_owned(), t4.elapsed().as_secs_f64()));
    }
    if uni_images.is_some() || sts.is_some() {
        let t5 = Instant::now();
        let images = uni_images.as_ref().map(|t| (t, uni_root));
        ev.unimodal = Some(unimodal::evaluate(&run, images, sts.as_ref(), &note)?);
        ev.timings_s.push(("unimodal".to_owned(), t5.elapsed().as_secs_f64()));
    }
    if let (Some(table), Some(c)) = (&probe, &r.probe_config) {
        let t6 = Instant::now();
        ev.linear_probe = Some(linear_probe::evaluate(&run, table, probe_root, c, &note)?);
        ev.timings_s.push(("linear_probe".to_owned(), t6.elapsed().as_secs_f64()));
    }
    if let (Some(table), Some(c), Some(drawn)) = (&compose, &r.compose_config, &drawn) {
        let t7 = Instant::now();
        ev.compositionality = Some(compositionality::evaluate(&run, table, drawn, compose_root, c, &note)?);
        ev.timings_s.push(("compositionality".to_owned(), t7.elapsed().as_secs_f64()));
    }
    // Only now, with everything read, embedded and scored: an evaluation that fails (a missing or
    // undecodable image) leaves an earlier one in `out` as it was.
    report::write_config(&r.out, &r)?;
    report::write(&r.out, &ev)?;
    Ok(ev)
}

/// A retrieval set in the COCO layout, read once and embedded by a model as often as asked:
/// `curate eval RUN_DIR`, and the trainer's model selection (`eval.select_best`).
pub struct RetrievalSet {
    images: embeddings::ImageList,
    captions: embeddings::CaptionList,
    /// The captions as the text tower sees them (after `pre_caption` for a run trained so).
    texts: Vec<String>,
    image_root: Option<PathBuf>,
    images_path: PathBuf,
    captions_path: PathBuf,
}

impl RetrievalSet {
    /// Reads the image and caption lists (checked against each other); `pre_caption`: the
    /// run's `data.pre_caption` (CUSA's evaluation data applies it too).
    pub fn read(images: &Path, captions: &Path, image_root: Option<&Path>, pre_caption: bool) -> Result<RetrievalSet> {
        let image_list = embeddings::read_image_list(images)?;
        let caption_list = embeddings::read_caption_list(captions)?;
        embeddings::check_ids(&image_list.ids, &caption_list.ids, &caption_list.image_ids, images, captions)?;
        let texts: Vec<String> = if pre_caption {
            caption_list
                .texts
                .iter()
                .zip(&caption_list.ids)
                .map(|(t, id)| {
                    crate::text::pre_caption(t, crate::text::PRE_CAPTION_WORDS).ok_or_else(|| {
                        Error::data(format!(
                            "caption {id} of `{}` has nothing left after `pre_caption` (the run's `data.pre_caption`)",
                            captions.display()
                        ))
                    })
                })
                .collect::<Result<_>>()?
        } else {
            caption_list.texts.clone()
        };
        Ok(RetrievalSet {
            images: image_list,
            captions: caption_list,
            texts,
            image_root: image_root.map(Path::to_owned),
            images_path: images.to_owned(),
            captions_path: captions.to_owned(),
        })
    }

    /// Embeds the set with `run`'s model (images through the evaluation view of its transform)
    /// and scores it; `note` hears the progress.
    pub fn evaluate(
        &self,
        run: &TrainedRun,
        similarity: Similarity,
        precision: Precision,
        annotations: Option<&Annotations>,
        note: &dyn Fn(String),
    ) -> Result<Evaluation> {
        let (images, captions) = (&self.images, &self.captions);
        let size = run.image_size();
        let transform = run.transform();
        note(format!(
            "embedding {} images (`{}`, {size}×{size} px) and {} captions (`{}`) with `{}`",
            images.ids.len(),
            self.images_path.display(),
            captions.ids.len(),
            self.captions_path.display(),
            run.dir.display()
        ));
        let t2 = Instant::now();
        let texts: Vec<&str> = self.texts.iter().map(String::as_str).collect();
        let csd = similarity == Similarity::Csd;
        let mut caption_rows = Vec::with_capacity(texts.len() * run.dim());
        let (mut caption_uncertainty, mut image_uncertainty) = (Vec::new(), Vec::new());
        for chunk in texts.chunks(TEXT_CHUNK) {
            if csd {
                let (e, u) = run.embed_texts_uncertain(chunk)?;
                caption_rows.extend(e);
                caption_uncertainty.extend(u);
            } else {
                caption_rows.extend(run.embed_texts(chunk)?);
            }
            if texts.len() > TEXT_CHUNK {
                note(format!("  captions {}/{}", caption_rows.len() / run.dim(), texts.len()));
            }
        }
        let t_captions = t2.elapsed().as_secs_f64();

        let t3 = Instant::now();
        let root = self.image_root.as_deref();
        let batches = images.paths.len().div_ceil(IMAGE_BATCH);
        let every = (batches / 10).max(1);
        let mut image_rows = Vec::with_capacity(images.ids.len() * run.dim());
        for (b, chunk) in images.paths.chunks(IMAGE_BATCH).enumerate() {
            let pixels = preprocess_batch(chunk, root, &transform)?;
            if csd {
                let (e, u) = run.embed_images_uncertain(pixels, chunk.len())?;
                image_rows.extend(e);
                image_uncertainty.extend(u);
            } else {
                image_rows.extend(run.embed_images(pixels, chunk.len())?);
            }
            if batches > 1 && ((b + 1) % every == 0 || b + 1 == batches) {
                note(format!("  images {}/{}", image_rows.len() / run.dim(), images.ids.len()));
            }
        }
        let t_images = t3.elapsed().as_secs_f64();
        note(format!("embedded captions in {t_captions:.1} s, images in {t_images:.1} s"));

        let image_gallery = Images::from_rows(images.ids.clone(), run.dim(), image_rows);
        let caption_gallery =
            Captions::from_rows(captions.ids.clone(), captions.image_ids.clone(), run.dim(), caption_rows);
        let scoring = Scoring {
            similarity,
            precision,
            uncertainty: csd.then_some((&image_uncertainty[..], &caption_uncertainty[..])),
        };
        let mut ev = evaluate_scored(&image_gallery, &caption_gallery, annotations, &scoring)?;
        ev.timings_s.insert(0, ("embed_captions".to_owned(), t_captions));
        ev.timings_s.insert(1, ("embed_images".to_owned(), t_images));
        Ok(ev)
    }
}

/// The sum of R@1, R@5 and R@10 in both directions over the whole gallery (the `coco_5k_*`
/// metrics), in percent as the papers write it (0 to 600): PCME++'s and CUSA's model
/// selection, "RSUM".
pub fn rsum(ev: &Evaluation) -> f64 {
    super::report::rsum_of(ev, "coco_5k")
}

/// One image as the image tower takes it: decoded, then the evaluation view of the run's
/// `data.image_transform` ([`ImageTransform::test`]; the default resizes the whole image to
/// `size × size`), CHW — what [`ZeroShot`] does with its images.
///
/// # Shapes
/// returns `[3 * size * size]`
pub fn preprocess(path: &Path, transform: &ImageTransform) -> Result<Vec<f32>> {
    let img = read_image(&ImageSource::File(path.to_owned()))?;
    let mut out = Vec::with_capacity(3 * transform.size * transform.size);
    transform.test(&img, &mut out);
    Ok(out)
}

/// The images at `paths` (under `root` when given) through the evaluation view of `run`'s
/// transform, [`IMAGE_BATCH`] at a time, each batch's pixels given to `embed` (with its count)
/// and the rows it returns put one after the other: the uni-modal, probe and compositionality
/// tables are embedded so.
pub fn embed_image_paths(
    run: &TrainedRun,
    paths: &[String],
    root: Option<&Path>,
    mut embed: impl FnMut(Vec<f32>, usize) -> Result<Vec<f32>>,
) -> Result<Vec<f32>> {
    let transform = run.transform();
    let mut rows = Vec::new();
    for chunk in paths.chunks(IMAGE_BATCH) {
        rows.extend(embed(preprocess_batch(chunk, root, &transform)?, chunk.len())?);
    }
    Ok(rows)
}

/// Refuses a table (`file`) some of whose images (`paths`, under `root` when given) are not
/// files, naming how many and the first three, before anything is embedded.
pub fn check_images(file: &Path, paths: &[String], root: Option<&Path>) -> Result<()> {
    let missing: Vec<PathBuf> = paths
        .par_iter()
        .map(|p| root.map_or_else(|| PathBuf::from(p), |d| d.join(p)))
        .filter(|p| !p.is_file())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = missing.iter().take(3).map(|p| format!("`{}`", p.display())).collect();
    Err(Error::Data {
        message: format!(
            "{} of the {} images of `{}` are not files (e.g. {})",
            missing.len(),
            paths.len(),
            file.display(),
            shown.join(", ")
        ),
        hint: Some(
            "relative paths resolve against the table's own root when given (`--uni-images-root`, \
             `--probe-image-root`, `--compose-image-root`), else `--image-root`, else the working folder"
                .into(),
        ),
    })
}

/// [`preprocess`] of a batch of images at `paths` (under `root` when given), decoded in
/// parallel, one after the other in one buffer.
///
/// # Shapes
/// returns `[paths.len() * 3 * size * size]`
pub fn preprocess_batch(paths: &[String], root: Option<&Path>, transform: &ImageTransform) -> Result<Vec<f32>> {
    let pixels = paths
        .par_iter()
        .map(|p| preprocess(&root.map_or_else(|| PathBuf::from(p), |d| d.join(p)), transform))
        .collect::<Result<Vec<Vec<f32>>>>()?;
    Ok(pixels.concat())
}
