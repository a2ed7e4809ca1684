//! Rankings for retrieval metrics (spec §4.2). The metrics read off the position of each
//! wanted gallery item in the query's full ranking — scores descending, ties broken by
//! ascending gallery position (a stable sort). Counting, for a target `t` with score `v`, the
//! items with `s_j > v` or (`s_j == v` and `j < t`) gives exactly its position in that sorted
//! list without sorting 25,000 scores per query, so no list is ever truncated (the reference's
//! top-50 lists under-count COCO 1K, spec §4.4). Counts are exact comparisons: the result does
//! not depend on the thread count, the blocking or the instruction set.
//!
//! Both directions count against one set of scores, bit-identical between i2t and t2i as with
//! the reference's one similarity matrix. Two ways to get there ([`Method`]):
//! - [`Method::Tiles`] (AVX-512): every (query, target) score is computed first as its own exact
//!   chain ([`product::chains`]), then image x caption tiles of 192 x 1,024 scores are made
//!   ([`product::tile`]) and counted while they sit in L2 — i2t along their rows, t2i
//!   down their columns — and dropped. The 500 MB COCO 5K x 25K matrix never exists: writing it
//!   cost ~120,000 page faults and reading it back twice a trip to memory per score, together as
//!   much time as the product itself.
//! - [`Method::Matrix`] (elsewhere): gemm scores the whole matrix ([`scores`]), then
//!   [`rank_rows`] (i2t) and [`rank_columns`] (t2i) count it.
//! - [`Method::Screen`] (AVX-512 VNNI, large inputs): 16-bit integer tiles at half the cost
//!   bound every score, and only the ranks a metric reads ([`Need`]) are resolved with exact
//!   scores ([`super::screen`]); they equal the exact methods' ranks.
//!
//! The counting kernels compare 16 scores at once (one AVX-512 register; AVX2 and portable
//! versions are picked at run time): along a row, up to 8 target scores per pass; down 16
//! adjacent columns, one 64-byte load per gallery row serves 16 queries, each lane with its own
//! target scores. Equal scores are counted alongside; only when a target shares its score with
//! another item are the equal items ahead of it located. The COCO 1K folds of the t2i direction
//! are ranges of image rows: the row blocks are cut at their boundaries, so that each block
//! counts for a query's fold entirely or not at all.

use std::ops::Range;

use rayon::prelude::*;

use super::embeddings::Matrix;
use super::product::{self, Panels, RowGroups, NR};
use super::{quantized, screen};

/// Multiply-adds (images x captions x width) from which [`rank`] screens: below it, the exact
/// tiles cost little and the screen's set-up would not pay (COCO 5K x 25K x 512 is 6.4e10).
const SCREEN_MIN_WORK: f64 = 1e9;

/// Lanes of the counting kernels: one AVX-512 register of f32 (two AVX2 ones).
pub(super) const W: usize = 16;

/// Target scores compared per pass: with AVX-512, 2 x 8 counters + 8 broadcast scores + the
/// data stay in the 32 vector registers.
pub(super) const MAX_TARGETS: usize = 8;

/// Gallery rows ahead of the current one fetched in [`rank_columns`]: its column reads jump a
/// whole score row (100 KB for 25K captions), past what the hardware prefetchers follow.
const PREFETCH_ROWS: usize = 16;

/// Caption panels per unit of work of [`Method::Tiles`] (1,024 captions); units run in
/// parallel.
pub(super) const UNIT_PANELS: usize = 16;

/// Image rows per tile: 192 x 1,024 scores (768 KB) stay in L2 while they are counted.
pub(super) const TILE_ROWS: usize = 192;

/// What to locate in the ranking of one query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Gallery indices whose ranks are wanted.
    pub targets: Vec<u32>,
    /// Index into the subsets passed to [`rank`]: also rank the targets within that part of the
    /// gallery alone (the COCO 1K fold of the query).
    pub subset: Option<u32>,
    /// Per target, which of its ranks a metric reads ([`Need`]); empty: all of them, exactly.
    pub need: Vec<Need>,
}

/// Which ranks of a target must be exact (both the full and the subset ranking); any other
/// rank may come back as a lower bound of the true one, which is then provably not one a
/// metric reads. [`Method::Screen`] resolves only these; the other methods are always exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Need {
    /// Groups (bits) in which the smallest rank is read (a protocol's best positive): exact
    /// for the target holding it; the others may be any lower bound not below it.
    pub best_of: u8,
    /// Exact when the rank is below this (ECCV's top-R and recall@K); otherwise a lower
    /// bound of at least this.
    pub below: u32,
}

impl Need {
    /// Both requirements.
    pub fn merge(self, o: Need) -> Need {
        Need { best_of: self.best_of | o.best_of, below: self.below.max(o.below) }
    }
}

/// Where the targets of one query landed, in the order of [`Request::targets`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranks {
    /// 0-based position in the full ranking.
    pub full: Vec<u32>,
    /// 0-based position in the ranking restricted to the subset (empty without one).
    pub subset: Vec<u32>,
    /// Targets whose score another gallery item shares exactly (order decided by position).
    pub tied: u32,
}

/// How [`rank_with`] gets the scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Exact tiles, counted as they are made; needs [`product::available`].
    Tiles,
    /// 16-bit integer tiles bound every score; only the ranks the [`Need`]s name are resolved
    /// with exact scores ([`super::screen`]). Falls back to the exact methods where the screen
    /// does not apply (non-finite or huge values).
    Screen,
    /// The whole matrix from gemm, then counted.
    Matrix,
}

/// [`rank_with`] the fastest method this CPU has.
pub fn rank(
    images: &Matrix,
    captions: &Matrix,
    i2t: &[Request],
    t2i: &[Request],
    caption_subsets: &[Vec<u32>],
    image_subsets: &[Range<u32>],
) -> (Vec<Ranks>, Vec<Ranks>) {
    let work = images.rows as f64 * captions.rows as f64 * images.dim as f64;
    let method = if product::available() && quantized::available() && work >= SCREEN_MIN_WORK {
        Method::Screen
    } else if product::available() {
        Method::Tiles
    } else {
        Method::Matrix
    };
    rank_with(method, images, captions, i2t, t2i, caption_subsets, image_subsets)
}

/// The ranks of both directions: i2t queries are the image rows, ranking the captions (their
/// subsets: ascending caption index lists); t2i queries are the caption rows, ranking the
/// images (their subsets: ranges of image rows).
///
/// # Shapes
/// `images`: `[m, d]`, `captions`: `[n, d]`; `i2t`: `[m]`, `t2i`: `[n]` -> (`[m]`, `[n]`).
pub fn rank_with(
    method: Method,
    images: &Matrix,
    captions: &Matrix,
    i2t: &[Request],
    t2i: &[Request],
    caption_subsets: &[Vec<u32>],
    image_subsets: &[Range<u32>],
) -> (Vec<Ranks>, Vec<Ranks>) {
    assert_eq!((i2t.len(), t2i.len()), (images.rows, captions.rows), "one request per query");
    match method {
        Method::Screen => {
            screen::rank(images, captions, i2t, t2i, caption_subsets, image_subsets).unwrap_or_else(|| {
                let exact = if product::available() { Method::Tiles } else { Method::Matrix };
                rank_with(exact, images, captions, i2t, t2i, caption_subsets, image_subsets)
            })
        }
        Method::Tiles => Tiles::new(images, captions, i2t, t2i, caption_subsets, image_subsets).run(),
        Method::Matrix => {
            let s = scores(images, captions);
            let a = rank_rows(&s, captions.rows, i2t, caption_subsets);
            let b = rank_columns(&s, images.rows, t2i, image_subsets);
            (a, b)
        }
    }
}

/// Counts for one (query, target) pair: gallery items scoring higher than the target, scoring
/// equal (the target included), and equal ones ahead of it in gallery order. Its position is
/// `higher + ahead`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Tally {
    pub(super) higher: u32,
    pub(super) equal: u32,
    pub(super) ahead: u32,
}

impl Tally {
    pub(super) fn add(&mut self, o: Tally) {
        self.higher += o.higher;
        self.equal += o.equal;
        self.ahead += o.ahead;
    }

    /// The counts of one stretch of the gallery whose items all have indices in `span`:
    /// `higher` and `equal` from a kernel, and the equal items ahead of target `t` — all of
    /// them when the stretch lies before `t`, none after it, and where `t` falls inside, the
    /// ones `equal_ahead()` finds (called only when an item besides the target ties).
    fn of(
        span: Range<usize>,
        t: usize,
        [higher, equal]: [u32; 2],
        has_t: bool,
        equal_ahead: impl FnOnce() -> u32,
    ) -> Tally {
        let ahead = if t >= span.end {
            equal
        } else if t < span.start || equal <= has_t as u32 {
            0
        } else {
            equal_ahead()
        };
        Tally { higher, equal, ahead }
    }
}

/// The (query, target) pairs of one direction, flattened, with their exact scores.
pub(super) struct Pairs {
    /// Pairs of query `q`: `offsets[q]..offsets[q + 1]`.
    pub(super) offsets: Vec<usize>,
    pub(super) scores: Vec<f32>,
}

impl Pairs {
    /// `vectors(q, t)`: the (image, caption) embeddings of query `q` and target `t`;
    /// `known(q, t)`: the score where it has been computed already (the other direction).
    fn new<'a>(
        reqs: &[Request],
        vectors: impl Fn(usize, usize) -> (&'a [f32], &'a [f32]) + Sync,
        known: impl Fn(usize, usize) -> Option<f32>,
    ) -> Pairs {
        let mut offsets = Vec::with_capacity(reqs.len() + 1);
        offsets.push(0);
        let mut scores = Vec::new();
        // (slot, query, target) of the scores still to compute.
        let mut todo = Vec::new();
        for (q, r) in reqs.iter().enumerate() {
            for &t in &r.targets {
                let t = t as usize;
                scores.push(known(q, t).unwrap_or_else(|| {
                    todo.push((scores.len(), q, t));
                    0.0
                }));
            }
            offsets.push(scores.len());
        }
        // Eight independent chains at a time; a short chunk repeats its first pair.
        let computed: Vec<[f32; 8]> = todo
            .par_chunks(8)
            .map(|chunk| {
                product::chains(std::array::from_fn(|j| {
                    let (_, q, t) = chunk.get(j).copied().unwrap_or(chunk[0]);
                    vectors(q, t)
                }))
            })
            .collect();
        for (chunk, v) in todo.chunks(8).zip(&computed) {
            for (&(slot, _, _), &x) in chunk.iter().zip(v) {
                scores[slot] = x;
            }
        }
        Pairs { offsets, scores }
    }

    pub(super) fn of(&self, q: usize) -> Range<usize> {
        self.offsets[q]..self.offsets[q + 1]
    }

    pub(super) fn len(&self) -> usize {
        self.scores.len()
    }
}

/// Per-pair tallies of both directions: the full galleries and the queries' subsets.
#[derive(Clone)]
pub(super) struct Tallies {
    pub(super) i2t: [Vec<Tally>; 2],
    pub(super) t2i: [Vec<Tally>; 2],
}

impl Tallies {
    pub(super) fn merge(mut self, o: Tallies) -> Tallies {
        for (a, b) in self.i2t.iter_mut().chain(self.t2i.iter_mut()).zip(o.i2t.iter().chain(o.t2i.iter())) {
            for (x, y) in a.iter_mut().zip(b) {
                x.add(*y);
            }
        }
        self
    }
}

/// The exact scores of every requested (query, target) pair of both directions.
pub(super) fn target_pairs(images: &Matrix, captions: &Matrix, i2t: &[Request], t2i: &[Request]) -> (Pairs, Pairs) {
    let i2t_pairs = Pairs::new(i2t, |i, c| (images.row(i), captions.row(c)), |_, _| None);
    // The COCO pairs (and most CxC ones) are wanted both ways: scored once.
    let t2i_pairs = Pairs::new(
        t2i,
        |c, i| (images.row(i), captions.row(c)),
        |c, i| {
            let k = i2t[i].targets.iter().position(|&x| x as usize == c)?;
            Some(i2t_pairs.scores[i2t_pairs.offsets[i] + k])
        },
    );
    (i2t_pairs, t2i_pairs)
}

/// The image rows in tile blocks of at most [`TILE_ROWS`], cut at every subset boundary so
/// that each block lies inside a subset or outside it.
pub(super) fn row_blocks(m: usize, image_subsets: &[Range<u32>]) -> Vec<Range<usize>> {
    let mut cuts = vec![0, m];
    for s in image_subsets {
        assert!(s.start <= s.end && s.end as usize <= m, "subset {s:?} outside {m} image rows");
        cuts.extend([s.start as usize, s.end as usize]);
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2).flat_map(|w| (w[0]..w[1]).step_by(TILE_ROWS).map(move |a| a..(a + TILE_ROWS).min(w[1]))).collect()
}

/// The items of subset `list` (ascending gallery indices) among the gallery items `span`, and
/// their scores, taken from `row` (the span's scores): a slice of it when they are one range
/// (the COCO 1K folds in the package's caption order), else gathered into `gather`. `None`
/// when none is in the span.
pub(super) fn subset_scores<'a, T: Copy>(
    list: &'a [u32],
    span: Range<usize>,
    row: &'a [T],
    gather: &'a mut Vec<T>,
) -> Option<(&'a [u32], &'a [T])> {
    let lo = list.partition_point(|&j| (j as usize) < span.start);
    let hi = list.partition_point(|&j| (j as usize) < span.end);
    let idx = &list[lo..hi];
    let (&first, &last) = (idx.first()?, idx.last()?);
    let c0 = span.start;
    if (last - first) as usize + 1 == idx.len() {
        return Some((idx, &row[first as usize - c0..=last as usize - c0]));
    }
    gather.clear();
    gather.extend(idx.iter().map(|&j| row[j as usize - c0]));
    Some((idx, gather))
}

/// Units of work: 1,024 captions (16 panels) each, every tile of their columns.
pub(super) fn unit_captions(u: usize, captions: usize) -> Range<usize> {
    u * UNIT_PANELS * NR..((u + 1) * UNIT_PANELS * NR).min(captions)
}

/// Runs `work(worker, u)` for the units `0..units`: one worker per thread takes the next unit
/// until none is left (or `stop()` says so) — balanced, and one worker's state per thread,
/// returned for the caller to merge.
pub(super) fn in_units<W: Send>(
    units: usize,
    worker: impl Fn() -> W + Sync,
    work: impl Fn(&mut W, usize) + Sync,
    stop: impl Fn() -> bool + Sync,
) -> std::vec::IntoIter<W> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers: Vec<W> = (0..rayon::current_num_threads().min(units))
        .into_par_iter()
        .map(|_| {
            let mut w = worker();
            loop {
                let u = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if u >= units || stop() {
                    break w;
                }
                work(&mut w, u);
            }
        })
        .collect();
    workers.into_iter()
}

/// [`Method::Tiles`]: everything the units share.
struct Tiles<'a> {
    /// The images in row blocks, cut at every subset boundary.
    images: RowGroups,
    captions: &'a Matrix,
    i2t: &'a [Request],
    t2i: &'a [Request],
    i2t_pairs: Pairs,
    t2i_pairs: Pairs,
    caption_subsets: &'a [Vec<u32>],
    image_subsets: &'a [Range<u32>],
}

/// One worker's tallies and scratch space.
struct Worker {
    tallies: Tallies,
    /// The captions of the current unit.
    panels: Panels,
    tile: Vec<f32>,
    gather: Vec<f32>,
    counts: Vec<[u32; 2]>,
}

impl<'a> Tiles<'a> {
    fn new(
        images: &'a Matrix,
        captions: &'a Matrix,
        i2t: &'a [Request],
        t2i: &'a [Request],
        caption_subsets: &'a [Vec<u32>],
        image_subsets: &'a [Range<u32>],
    ) -> Tiles<'a> {
        assert_eq!(images.dim, captions.dim, "images and captions differ in width");
        let (i2t_pairs, t2i_pairs) = target_pairs(images, captions, i2t, t2i);
        let blocks = row_blocks(images.rows, image_subsets);
        Tiles {
            images: RowGroups::new(images, &blocks),
            captions,
            i2t,
            t2i,
            i2t_pairs,
            t2i_pairs,
            caption_subsets,
            image_subsets,
        }
    }

    fn worker(&self) -> Worker {
        let zeros = |n: usize| [vec![Tally::default(); n], vec![Tally::default(); n]];
        Worker {
            tallies: Tallies { i2t: zeros(self.i2t_pairs.len()), t2i: zeros(self.t2i_pairs.len()) },
            panels: Panels::default(),
            tile: vec![0.0; TILE_ROWS * UNIT_PANELS * NR],
            gather: Vec::new(),
            counts: Vec::new(),
        }
    }

    fn run(self) -> (Vec<Ranks>, Vec<Ranks>) {
        let units = self.t2i.len().div_ceil(UNIT_PANELS * NR);
        let tallies = in_units(units, || self.worker(), |w, u| self.unit(w, u), || false)
            .map(|w| w.tallies)
            .reduce(Tallies::merge)
            .unwrap_or_else(|| self.worker().tallies);
        (finish(self.i2t, &self.i2t_pairs, &tallies.i2t), finish(self.t2i, &self.t2i_pairs, &tallies.t2i))
    }

    /// Captions `1024 u..`: every tile of their columns, counted both ways.
    fn unit(&self, w: &mut Worker, u: usize) {
        let captions = unit_captions(u, self.t2i.len());
        w.panels.pack(self.captions, captions.clone());
        let width = w.panels.len() * NR;
        for b in 0..self.images.len() {
            let rows = self.images.rows(b);
            product::tile(&self.images, b, &w.panels, &mut w.tile);
            self.count_i2t(w, rows.clone(), captions.clone(), width);
            self.count_t2i(w, rows, captions.clone(), width);
        }
    }

    /// The tile's rows: image `i` against `captions`, for its targets and within its subset.
    fn count_i2t(&self, w: &mut Worker, rows: Range<usize>, captions: Range<usize>, width: usize) {
        let c0 = captions.start;
        for i in rows.clone() {
            let req = &self.i2t[i];
            if req.targets.is_empty() {
                continue;
            }
            let at = (i - rows.start) * width;
            let row = &w.tile[at..at + captions.len()];
            let pairs = self.i2t_pairs.of(i);
            let v = &self.i2t_pairs.scores[pairs.clone()];
            count_targets(row, v, &mut w.counts);
            for (k, &t) in req.targets.iter().enumerate() {
                let (t, v) = (t as usize, v[k]);
                let tally = Tally::of(captions.clone(), t, w.counts[k], captions.contains(&t), || {
                    row[..t - c0].iter().filter(|&&x| x == v).count() as u32
                });
                w.tallies.i2t[0][pairs.start + k].add(tally);
            }
            let Some(s) = req.subset else { continue };
            let Some((idx, sub)) =
                subset_scores(&self.caption_subsets[s as usize], captions.clone(), row, &mut w.gather)
            else {
                continue;
            };
            count_targets(sub, v, &mut w.counts);
            for (k, &t) in req.targets.iter().enumerate() {
                let (t, v) = (t as usize, v[k]);
                let has_t = captions.contains(&t) && idx.binary_search(&(t as u32)).is_ok();
                let tally = Tally::of(captions.clone(), t, w.counts[k], has_t, || {
                    sub.iter().zip(idx).filter(|&(&x, &j)| x == v && (j as usize) < t).count() as u32
                });
                w.tallies.i2t[1][pairs.start + k].add(tally);
            }
        }
    }

    /// The tile's columns: 16 captions at a time against the images of `rows`.
    fn count_t2i(&self, w: &mut Worker, rows: Range<usize>, captions: Range<usize>, width: usize) {
        let tile = &w.tile;
        let src = |g: usize| Lanes { data: tile, stride: width, offset: g * W };
        for g in 0..captions.len().div_ceil(W) {
            let cg = captions.start + g * W;
            let reqs = &self.t2i[cg..(cg + W).min(captions.end)];
            let slots = reqs.iter().map(|r| r.targets.len()).max().unwrap_or(0);
            in_passes(slots, |k0, n| {
                let mut v = [[f32::INFINITY; W]; MAX_TARGETS];
                for (l, r) in reqs.iter().enumerate() {
                    let pairs = self.t2i_pairs.of(cg + l);
                    for k in k0..(k0 + n).min(r.targets.len()) {
                        v[k - k0][l] = self.t2i_pairs.scores[pairs.start + k];
                    }
                }
                let rows_here = 0..rows.len();
                let mut counts = [[[0u32; W]; MAX_TARGETS]; 2];
                match n {
                    1 => put_lanes(&mut counts, count_lanes::<1>(src(g), rows_here, &[v[0]])),
                    2 => put_lanes(&mut counts, count_lanes::<2>(src(g), rows_here, &[v[0], v[1]])),
                    4 => put_lanes(&mut counts, count_lanes::<4>(src(g), rows_here, &[v[0], v[1], v[2], v[3]])),
                    _ => put_lanes(&mut counts, count_lanes::<MAX_TARGETS>(src(g), rows_here, &v)),
                }
                for (l, r) in reqs.iter().enumerate() {
                    let pairs = self.t2i_pairs.of(cg + l);
                    let within = r.subset.map(|s| &self.image_subsets[s as usize]);
                    let inside = within.is_some_and(|s| s.start as usize <= rows.start && rows.end <= s.end as usize);
                    for k in k0..(k0 + n).min(r.targets.len()) {
                        let (t, v) = (r.targets[k] as usize, v[k - k0][l]);
                        let c = [counts[0][k - k0][l], counts[1][k - k0][l]];
                        let tally = Tally::of(rows.clone(), t, c, rows.contains(&t), || {
                            (rows.start..t).filter(|&i| tile[(i - rows.start) * width + g * W + l] == v).count() as u32
                        });
                        w.tallies.t2i[0][pairs.start + k].add(tally);
                        if inside {
                            w.tallies.t2i[1][pairs.start + k].add(tally);
                        }
                    }
                }
            });
        }
    }
}

/// Copies `n`-slot lane counts into the 8-slot array.
fn put_lanes<const N: usize>(out: &mut [[[u32; W]; MAX_TARGETS]; 2], c: [[[u32; W]; N]; 2]) {
    for h in 0..2 {
        out[h][..N].copy_from_slice(&c[h]);
    }
}

/// Counts in `MAX_TARGETS`-wide passes (narrower for the rest) of `row` against each score of
/// `v`: `out[k]` = [higher, equal].
fn count_targets(row: &[f32], v: &[f32], out: &mut Vec<[u32; 2]>) {
    out.clear();
    out.resize(v.len(), [0, 0]);
    in_passes(v.len(), |k0, n| {
        let mut t = [f32::INFINITY; MAX_TARGETS];
        for (slot, &x) in t.iter_mut().zip(&v[k0..(k0 + n).min(v.len())]) {
            *slot = x;
        }
        let mut put = |c: [&[u32]; 2]| {
            for (k, slot) in out[k0..].iter_mut().take(n).enumerate() {
                *slot = [c[0][k], c[1][k]];
            }
        };
        match n {
            1 => {
                let c = count_row::<1>(row, &[t[0]]);
                put([&c[0], &c[1]]);
            }
            2 => {
                let c = count_row::<2>(row, &[t[0], t[1]]);
                put([&c[0], &c[1]]);
            }
            4 => {
                let c = count_row::<4>(row, &[t[0], t[1], t[2], t[3]]);
                put([&c[0], &c[1]]);
            }
            _ => {
                let c = count_row::<MAX_TARGETS>(row, &t);
                put([&c[0], &c[1]]);
            }
        }
    });
}

/// The ranks from the tallies of one direction.
fn finish(reqs: &[Request], pairs: &Pairs, tallies: &[Vec<Tally>; 2]) -> Vec<Ranks> {
    reqs.iter()
        .enumerate()
        .map(|(q, r)| {
            let (full, sub) = (&tallies[0][pairs.of(q)], &tallies[1][pairs.of(q)]);
            Ranks {
                full: full.iter().map(|t| t.higher + t.ahead).collect(),
                subset: if r.subset.is_some() { sub.iter().map(|t| t.higher + t.ahead).collect() } else { Vec::new() },
                tied: full.iter().filter(|t| t.equal > 1).count() as u32,
            }
        })
        .collect()
}

/// Scores of `queries` against `gallery` (dot products), row-major, on the rayon pool.
///
/// # Shapes
/// `queries`: `[m, d]`, `gallery`: `[n, d]` -> `[m * n]` (row `i` = query `i`).
pub fn scores(queries: &Matrix, gallery: &Matrix) -> Vec<f32> {
    assert_eq!(queries.dim, gallery.dim, "queries and gallery differ in width");
    let (m, n, d) = (queries.rows, gallery.rows, gallery.dim);
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 || d == 0 {
        return out;
    }
    // SAFETY: the three buffers hold exactly m x d, d x n (the gallery read transposed: column j
    // is gallery row j) and m x n elements, and the strides address them within bounds; `out`
    // is written only (read_dst = false).
    unsafe {
        gemm::gemm(
            m,
            n,
            d,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            queries.data.as_ptr(),
            1,
            d as isize,
            gallery.data.as_ptr(),
            d as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
    out
}

/// Calls `$f::<N>($args)` with the instruction set chosen at run time: the same exact
/// comparisons whichever runs.
macro_rules! dispatch {
    ($portable:ident, $avx512:ident, $avx2:ident, $n:ident, ($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { x86::$avx512::<$n>($($arg),*) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                return unsafe { x86::$avx2::<$n>($($arg),*) };
            }
        }
        $portable::<$n>($($arg),*)
    }};
}

/// Per target score `v[k]`: the items of `row` scoring strictly higher (`[0][k]`) and exactly
/// equal (`[1][k]`).
fn count_row<const N: usize>(row: &[f32], v: &[f32; N]) -> [[u32; N]; 2] {
    dispatch!(count_row_portable, count_row_avx512, count_row_avx2, N, (row, v))
}

fn count_row_portable<const N: usize>(row: &[f32], v: &[f32; N]) -> [[u32; N]; 2] {
    let mut out = [[0u32; N]; 2];
    for &x in row {
        for k in 0..N {
            out[0][k] += (x > v[k]) as u32;
            out[1][k] += (x == v[k]) as u32;
        }
    }
    out
}

/// Scores of a column block: 16 consecutive columns of each row of `data`, read at `stride`
/// (the row length) from `offset`.
#[derive(Clone, Copy)]
struct Lanes<'a> {
    data: &'a [f32],
    stride: usize,
    offset: usize,
}

impl Lanes<'_> {
    fn at(&self, r: usize) -> &[f32; W] {
        let at = r * self.stride + self.offset;
        self.data[at..at + W].try_into().expect("16 lanes")
    }
}

/// Per lane `l` and target slot `k`: the rows of `rows` whose lane-`l` score is strictly higher
/// than `v[k][l]` (`[0][k][l]`) and exactly equal (`[1][k][l]`).
fn count_lanes<const N: usize>(src: Lanes, rows: Range<usize>, v: &[[f32; W]; N]) -> [[[u32; W]; N]; 2] {
    dispatch!(count_lanes_portable, count_lanes_avx512, count_lanes_avx2, N, (src, rows, v))
}

fn count_lanes_portable<const N: usize>(src: Lanes, rows: Range<usize>, v: &[[f32; W]; N]) -> [[[u32; W]; N]; 2] {
    let mut out = [[[0u32; W]; N]; 2];
    for r in rows {
        let x = src.at(r);
        for k in 0..N {
            for l in 0..W {
                out[0][k][l] += (x[l] > v[k][l]) as u32;
                out[1][k][l] += (x[l] == v[k][l]) as u32;
            }
        }
    }
    out
}

/// The counting kernels with AVX-512F (16 lanes, counts in mask-added registers) and AVX2 (two
/// 8-lane halves, compare results subtracted as -1). `>` and `==` are the ordered, quiet
/// predicates: Rust's own operators.
// AVX-512 target features and intrinsics are stable since Rust 1.89, which the crate needs
// anyway through gemm's `x86-v4` feature (pulp's AVX-512 kernels); `rust-version` predates it.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Lanes, PREFETCH_ROWS, W};

    fn sum_avx2(v: __m256i) -> u32 {
        let mut a = [0u32; 8];
        // SAFETY: `a` holds 8 u32.
        unsafe { _mm256_storeu_si256(a.as_mut_ptr() as *mut __m256i, v) };
        a.iter().sum()
    }

    #[target_feature(enable = "avx512f")]
    pub fn count_row_avx512<const N: usize>(row: &[f32], v: &[f32; N]) -> [[u32; N]; 2] {
        let one = _mm512_set1_epi32(1);
        let vb: [__m512; N] = std::array::from_fn(|k| _mm512_set1_ps(v[k]));
        let (mut gt, mut eq) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
        let blocks = row.chunks_exact(16);
        let tail = blocks.remainder();
        for x in blocks {
            // SAFETY: `x` holds 16 f32.
            let x = unsafe { _mm512_loadu_ps(x.as_ptr()) };
            for k in 0..N {
                gt[k] = _mm512_mask_add_epi32(gt[k], _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, vb[k]), gt[k], one);
                eq[k] = _mm512_mask_add_epi32(eq[k], _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, vb[k]), eq[k], one);
            }
        }
        let mut out = super::count_row_portable(tail, v);
        for k in 0..N {
            out[0][k] += _mm512_reduce_add_epi32(gt[k]) as u32;
            out[1][k] += _mm512_reduce_add_epi32(eq[k]) as u32;
        }
        out
    }

    #[target_feature(enable = "avx2")]
    pub fn count_row_avx2<const N: usize>(row: &[f32], v: &[f32; N]) -> [[u32; N]; 2] {
        let vb: [__m256; N] = std::array::from_fn(|k| _mm256_set1_ps(v[k]));
        let (mut gt, mut eq) = ([_mm256_setzero_si256(); N], [_mm256_setzero_si256(); N]);
        let blocks = row.chunks_exact(8);
        let tail = blocks.remainder();
        for x in blocks {
            // SAFETY: `x` holds 8 f32.
            let x = unsafe { _mm256_loadu_ps(x.as_ptr()) };
            for k in 0..N {
                gt[k] = _mm256_sub_epi32(gt[k], _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, vb[k])));
                eq[k] = _mm256_sub_epi32(eq[k], _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(x, vb[k])));
            }
        }
        let mut out = super::count_row_portable(tail, v);
        for k in 0..N {
            out[0][k] += sum_avx2(gt[k]);
            out[1][k] += sum_avx2(eq[k]);
        }
        out
    }

    /// Fetches the lanes `PREFETCH_ROWS` rows ahead (a prefetch never faults, so the address
    /// may lie past the end).
    #[inline(always)]
    fn prefetch(src: &Lanes, r: usize) {
        let p = src.data.as_ptr().wrapping_add((r + PREFETCH_ROWS) * src.stride + src.offset);
        // SAFETY: a prefetch only hints the cache; it reads nothing and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
    }

    #[target_feature(enable = "avx512f")]
    pub fn count_lanes_avx512<const N: usize>(src: Lanes, rows: Range<usize>, v: &[[f32; W]; N]) -> [[[u32; W]; N]; 2] {
        let one = _mm512_set1_epi32(1);
        // SAFETY: each `v[k]` holds 16 f32.
        let vb: [__m512; N] = std::array::from_fn(|k| unsafe { _mm512_loadu_ps(v[k].as_ptr()) });
        let (mut gt, mut eq) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
        for r in rows {
            prefetch(&src, r);
            // SAFETY: `at` returns 16 f32.
            let x = unsafe { _mm512_loadu_ps(src.at(r).as_ptr()) };
            for k in 0..N {
                gt[k] = _mm512_mask_add_epi32(gt[k], _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, vb[k]), gt[k], one);
                eq[k] = _mm512_mask_add_epi32(eq[k], _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, vb[k]), eq[k], one);
            }
        }
        let mut out = [[[0u32; W]; N]; 2];
        for k in 0..N {
            // SAFETY: each destination holds 16 u32.
            unsafe {
                _mm512_storeu_si512(out[0][k].as_mut_ptr() as *mut __m512i, gt[k]);
                _mm512_storeu_si512(out[1][k].as_mut_ptr() as *mut __m512i, eq[k]);
            }
        }
        out
    }

    #[target_feature(enable = "avx2")]
    pub fn count_lanes_avx2<const N: usize>(src: Lanes, rows: Range<usize>, v: &[[f32; W]; N]) -> [[[u32; W]; N]; 2] {
        let mut out = [[[0u32; W]; N]; 2];
        // Two passes of 8 lanes: 4 x N counters + N scores per pass.
        for half in 0..2 {
            // SAFETY: each `v[k]` holds 16 f32, read from lane 8 * half.
            let vb: [__m256; N] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(v[k].as_ptr().add(8 * half)) });
            let (mut gt, mut eq) = ([_mm256_setzero_si256(); N], [_mm256_setzero_si256(); N]);
            for r in rows.clone() {
                prefetch(&src, r);
                // SAFETY: `at` returns 16 f32, read from lane 8 * half.
                let x = unsafe { _mm256_loadu_ps(src.at(r).as_ptr().add(8 * half)) };
                for k in 0..N {
                    gt[k] = _mm256_sub_epi32(gt[k], _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(x, vb[k])));
                    eq[k] = _mm256_sub_epi32(eq[k], _mm256_castps_si256(_mm256_cmp_ps::<_CMP_EQ_OQ>(x, vb[k])));
                }
            }
            for k in 0..N {
                // SAFETY: each destination holds 8 u32 from lane 8 * half.
                unsafe {
                    _mm256_storeu_si256(out[0][k].as_mut_ptr().add(8 * half) as *mut __m256i, gt[k]);
                    _mm256_storeu_si256(out[1][k].as_mut_ptr().add(8 * half) as *mut __m256i, eq[k]);
                }
            }
        }
        out
    }
}

/// Counts for `targets` (any number) in `MAX_TARGETS`-wide passes, narrower for the rest:
/// `f(first, slots)` fills counts of the slots `first..first + slots`.
pub(super) fn in_passes(targets: usize, mut f: impl FnMut(usize, usize)) {
    let mut k = 0;
    while k < targets {
        let n = match targets - k {
            1 => 1,
            2 => 2,
            3 | 4 => 4,
            _ => MAX_TARGETS,
        };
        f(k, n);
        k += n;
    }
}

/// Positions in the stable descending order of `row` of targets given as (score, gallery index,
/// whether the target is itself an item of `row`), pushed to `out`; returns how many targets
/// share their score with another item. `index(j)` is the gallery index of `row[j]` (`row` may
/// be a subset in ascending gallery order); an equal item ranks ahead of a target when its
/// gallery index is smaller.
fn positions(row: &[f32], targets: &[(f32, usize, bool)], index: impl Fn(usize) -> usize, out: &mut Vec<u32>) -> u32 {
    let v: Vec<f32> = targets.iter().map(|t| t.0).collect();
    let mut counts = Vec::new();
    count_targets(row, &v, &mut counts);
    let mut tied = 0;
    for (&(score, key, in_row), &[gt, eq]) in targets.iter().zip(&counts) {
        let mut p = gt;
        if eq > in_row as u32 {
            tied += 1;
            p += row.iter().enumerate().filter(|&(j, &x)| x == score && index(j) < key).count() as u32;
        }
        out.push(p);
    }
    tied
}

/// Position of target `t` in the stable descending order of `row`, and whether another item has
/// exactly its score.
#[cfg(test)]
fn position(row: &[f32], t: usize) -> (u32, bool) {
    let mut p = Vec::new();
    let tied = positions(row, &[(row[t], t, true)], |j| j, &mut p);
    (p[0], tied > 0)
}

/// The ranks of one query's targets in its score row; `gather` is scratch space for a subset
/// that is not one range of the gallery.
fn rank_row(row: &[f32], r: &Request, subsets: &[Vec<u32>], gather: &mut Vec<f32>) -> Ranks {
    let mut out = Ranks::default();
    let targets: Vec<(f32, usize, bool)> = r.targets.iter().map(|&t| (row[t as usize], t as usize, true)).collect();
    out.tied = positions(row, &targets, |j| j, &mut out.full);
    if let Some(k) = r.subset {
        let subset = &subsets[k as usize];
        let targets: Vec<(f32, usize, bool)> =
            r.targets.iter().map(|&t| (row[t as usize], t as usize, subset.binary_search(&t).is_ok())).collect();
        match (subset.first(), subset.last()) {
            // One range (the COCO 1K folds of the package's caption order): a slice of the row.
            (Some(&a), Some(&b)) if (b - a) as usize + 1 == subset.len() => {
                positions(&row[a as usize..=b as usize], &targets, |j| j + a as usize, &mut out.subset);
            }
            _ => {
                gather.clear();
                gather.extend(subset.iter().map(|&j| row[j as usize]));
                positions(gather, &targets, |j| subset[j] as usize, &mut out.subset);
            }
        }
    }
    out
}

/// Queries are the rows of `scores` (`cols` gallery items each): the positions of each query's
/// requested targets in its full ranking (and within its subset, if any).
///
/// # Shapes
/// `scores`: `[requests.len() * cols]`; `subsets`: ascending gallery index lists.
pub fn rank_rows(scores: &[f32], cols: usize, requests: &[Request], subsets: &[Vec<u32>]) -> Vec<Ranks> {
    assert_eq!(scores.len(), requests.len() * cols, "one request per score row");
    if cols == 0 {
        return vec![Ranks::default(); requests.len()];
    }
    requests
        .par_iter()
        .zip(scores.par_chunks(cols))
        .map_init(Vec::new, |gather, (r, row)| rank_row(row, r, subsets, gather))
        .collect()
}

/// Queries are the columns of `scores` (`rows x requests.len()`): as [`rank_rows`] on its
/// transpose, without materialising it. Here each subset is a range of rows (the COCO 1K folds
/// are consecutive image rows).
///
/// # Shapes
/// `scores`: `[rows * requests.len()]`.
pub fn rank_columns(scores: &[f32], rows: usize, requests: &[Request], subsets: &[Range<u32>]) -> Vec<Ranks> {
    let cols = requests.len();
    assert_eq!(scores.len(), rows * cols, "one request per score column");
    // The sweep over the rows stops at every subset boundary, so that each subset's counts are
    // a sum of whole segments.
    let mut cuts: Vec<usize> = vec![0, rows];
    for s in subsets {
        assert!(s.start <= s.end && s.end as usize <= rows, "subset {s:?} outside {rows} rows");
        cuts.extend([s.start as usize, s.end as usize]);
    }
    cuts.sort_unstable();
    cuts.dedup();
    let segments: Vec<Range<usize>> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
    let blocks: Vec<Vec<Ranks>> = requests
        .par_chunks(W)
        .enumerate()
        .map(|(b, reqs)| rank_column_block(scores, rows, b * W, reqs, subsets, &segments))
        .collect();
    blocks.into_iter().flatten().collect()
}

/// [`rank_columns`] for the queries `c0..c0 + reqs.len()` (at most 16).
fn rank_column_block(
    scores: &[f32],
    rows: usize,
    c0: usize,
    reqs: &[Request],
    subsets: &[Range<u32>],
    segments: &[Range<usize>],
) -> Vec<Ranks> {
    let cols = scores.len() / rows.max(1);
    let slots = reqs.iter().map(|r| r.targets.len()).max().unwrap_or(0);
    if slots == 0 {
        return vec![Ranks::default(); reqs.len()];
    }
    // The last block may be narrower than 16 columns: its scores are copied, padded.
    let padded: Vec<f32>;
    let src = if reqs.len() == W {
        Lanes { data: scores, stride: cols, offset: c0 }
    } else {
        let mut p = vec![0.0f32; rows * W];
        for r in 0..rows {
            p[r * W..r * W + reqs.len()].copy_from_slice(&scores[r * cols + c0..r * cols + c0 + reqs.len()]);
        }
        padded = p;
        Lanes { data: &padded, stride: W, offset: 0 }
    };
    let score = |r: usize, c: usize| scores[r * cols + c];
    // counts[segment][slot][lane] = [higher, equal].
    let mut counts = vec![vec![[[0u32; 2]; W]; slots]; segments.len()];
    in_passes(slots, |k0, n| {
        let mut v = [[f32::INFINITY; W]; MAX_TARGETS];
        for (l, r) in reqs.iter().enumerate() {
            for (k, &t) in r.targets.iter().enumerate().skip(k0).take(n) {
                v[k - k0][l] = score(t as usize, c0 + l);
            }
        }
        for (s, seg) in segments.iter().enumerate() {
            let mut put = |c: &[&[[u32; W]]; 2]| {
                for (k, slot) in counts[s][k0..].iter_mut().take(n).enumerate() {
                    for l in 0..W {
                        slot[l] = [c[0][k][l], c[1][k][l]];
                    }
                }
            };
            match n {
                1 => {
                    let c = count_lanes::<1>(src, seg.clone(), &[v[0]]);
                    put(&[&c[0], &c[1]]);
                }
                2 => {
                    let c = count_lanes::<2>(src, seg.clone(), &[v[0], v[1]]);
                    put(&[&c[0], &c[1]]);
                }
                4 => {
                    let c = count_lanes::<4>(src, seg.clone(), &[v[0], v[1], v[2], v[3]]);
                    put(&[&c[0], &c[1]]);
                }
                _ => {
                    let c = count_lanes::<MAX_TARGETS>(src, seg.clone(), &v);
                    put(&[&c[0], &c[1]]);
                }
            }
        }
    });
    reqs.iter()
        .enumerate()
        .map(|(l, r)| {
            let c = c0 + l;
            let mut out = Ranks::default();
            let sum = |k: usize, within: &Range<usize>| {
                segments
                    .iter()
                    .zip(&counts)
                    .filter(|(seg, _)| within.start <= seg.start && seg.end <= within.end)
                    .fold([0u32; 2], |acc, (_, cs)| [acc[0] + cs[k][l][0], acc[1] + cs[k][l][1]])
            };
            // Equal items ahead of target `t` (score `v`) among the rows `within`.
            let ahead =
                |t: usize, v: f32, within: Range<usize>| within.filter(|&j| j < t && score(j, c) == v).count() as u32;
            for (k, &t) in r.targets.iter().enumerate() {
                let (t, v) = (t as usize, score(t as usize, c));
                let [gt, eq] = sum(k, &(0..rows));
                let mut p = gt;
                if eq > 1 {
                    out.tied += 1;
                    p += ahead(t, v, 0..t);
                }
                out.full.push(p);
                if let Some(s) = r.subset {
                    let range = subsets[s as usize].start as usize..subsets[s as usize].end as usize;
                    let [gt, eq] = sum(k, &range);
                    let mut p = gt;
                    if eq > range.contains(&t) as u32 {
                        p += ahead(t, v, range);
                    }
                    out.subset.push(p);
                }
            }
            out
        })
        .collect()
}

/// The first `k` gallery indices of one query's ranking (scores descending, ties by ascending
/// index): the list the reference package is given.
pub fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let k = k.min(idx.len());
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn m(rows: usize, dim: usize, v: &[f32]) -> Matrix {
        Matrix::new(rows, dim, v.to_vec())
    }

    /// xorshift: reproducible pseudo-random numbers below `n`.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 33) as usize % n
        }
    }

    /// Up to `max` distinct indices below `n`, in random order.
    fn targets(rng: &mut Rng, n: usize, max: usize) -> Vec<u32> {
        let mut t = Vec::new();
        for _ in 0..rng.below(max + 1) {
            let x = rng.below(n) as u32;
            if !t.contains(&x) {
                t.push(x);
            }
        }
        t
    }

    /// The ranks by brute force: a full stable sort of each query's scores (`score(q, j)`), the
    /// position of each target, and within the subset the subset items sorted ahead of it.
    pub(in crate::eval) fn sorted_ranks(
        reqs: &[Request],
        gallery: usize,
        score: impl Fn(usize, usize) -> f32,
        in_subset: impl Fn(u32, usize) -> bool,
    ) -> Vec<Ranks> {
        reqs.iter()
            .enumerate()
            .map(|(q, r)| {
                let row: Vec<f32> = (0..gallery).map(|j| score(q, j)).collect();
                let order = top_k(&row, gallery);
                let mut at = vec![0usize; gallery];
                for (p, &j) in order.iter().enumerate() {
                    at[j as usize] = p;
                }
                let tie = |t: u32| row.iter().enumerate().any(|(j, &x)| j != t as usize && x == row[t as usize]);
                Ranks {
                    full: r.targets.iter().map(|&t| at[t as usize] as u32).collect(),
                    subset: match r.subset {
                        Some(s) => r
                            .targets
                            .iter()
                            .map(|&t| {
                                order[..at[t as usize]].iter().filter(|&&j| in_subset(s, j as usize)).count() as u32
                            })
                            .collect(),
                        None => Vec::new(),
                    },
                    tied: r.targets.iter().filter(|&&t| tie(t)).count() as u32,
                }
            })
            .collect()
    }

    #[test]
    fn blocked_scores_equal_naive_dot_products() {
        // 70 queries span two blocks; odd sizes exercise the kernels' edges.
        let (qn, gn, d) = (70, 13, 7);
        let q: Vec<f32> = (0..qn * d).map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0).collect();
        let g: Vec<f32> = (0..gn * d).map(|i| ((i * 11 % 13) as f32 - 6.0) / 4.0).collect();
        let s = scores(&m(qn, d, &q), &m(gn, d, &g));
        for i in 0..qn {
            for j in 0..gn {
                let naive: f32 = (0..d).map(|k| q[i * d + k] * g[j * d + k]).sum();
                assert_eq!(s[i * gn + j], naive, "({i}, {j})");
            }
        }
    }

    #[test]
    fn positions_follow_a_stable_descending_sort() {
        // np.argsort(-row, kind="stable") = [1, 3, 0, 2, 4]
        let row = [0.5f32, 0.9, 0.5, 0.7, 0.1];
        let order = top_k(&row, 5);
        assert_eq!(order, vec![1, 3, 0, 2, 4]);
        for (p, &t) in order.iter().enumerate() {
            assert_eq!(position(&row, t as usize).0, p as u32);
        }
        assert!(position(&row, 0).1 && position(&row, 2).1 && !position(&row, 1).1);
        // Within the subset {0, 2, 4}: [0, 2, 4]; target 3 (not in it) would come first.
        let r = rank_row(
            &row,
            &Request { targets: vec![2, 0, 4, 3], subset: Some(0), ..Request::default() },
            &[vec![0, 2, 4]],
            &mut Vec::new(),
        );
        assert_eq!((r.full, r.subset, r.tied), (vec![3, 2, 4, 1], vec![1, 0, 2, 0], 2));
        assert_eq!(top_k(&row, 2), vec![1, 3]);
    }

    #[test]
    fn counting_kernels_equal_plain_comparisons() {
        // Lengths around the 16-lane blocks, scores on a coarse grid (ties), thresholds among
        // them, above all of them (+inf padding) and NaN (never higher, never equal).
        // Also thresholds above most scores, all-NaN thresholds, and rows holding NaN scores.
        let mut rng = Rng(7);
        for len in [0, 1, 15, 16, 17, 40, 333] {
            for with_nan in [false, true] {
                let row: Vec<f32> = (0..len)
                    .map(|i| if with_nan && i % 5 == 3 { f32::NAN } else { rng.below(9) as f32 / 4.0 - 1.0 })
                    .collect();
                for v in [
                    [0.0f32, -1.0, 1.0, 0.25, f32::INFINITY, f32::NAN, -0.0, 0.5],
                    [0.75, 1.0, f32::INFINITY, f32::NAN, 0.75, 1.0, 0.75, 1.0],
                    [f32::NAN; 8],
                ] {
                    let c = count_row::<8>(&row, &v);
                    for (k, &x) in v.iter().enumerate() {
                        let want = [
                            row.iter().filter(|&&y| y > x).count() as u32,
                            row.iter().filter(|&&y| y == x).count() as u32,
                        ];
                        assert_eq!([c[0][k], c[1][k]], want, "length {len}, threshold {x}");
                    }
                    assert_eq!(count_row::<1>(&row, &[v[3]]), [[c[0][3]], [c[1][3]]]);
                }
                let rows = len / W;
                let lanes = Lanes { data: &row, stride: W, offset: 0 };
                for shift in [-1.5f32, 0.5] {
                    let v: [[f32; W]; 2] =
                        std::array::from_fn(|k| std::array::from_fn(|l| (l + k) as f32 / 4.0 + shift));
                    let c = count_lanes::<2>(lanes, 0..rows, &v);
                    for k in 0..2 {
                        for l in 0..W {
                            let col = (0..rows).map(|r| row[r * W + l]);
                            assert_eq!(c[0][k][l], col.clone().filter(|&y| y > v[k][l]).count() as u32);
                            assert_eq!(c[1][k][l], col.filter(|&y| y == v[k][l]).count() as u32);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn rows_and_columns_match_a_full_sort() {
        let (qn, gn, d) = (130, 40, 3);
        // Coarse values: many exact ties.
        let q: Vec<f32> = (0..qn * d).map(|i| ((i * 7 % 5) as f32 - 2.0) / 2.0).collect();
        let g: Vec<f32> = (0..gn * d).map(|i| ((i * 3 % 4) as f32 - 1.0) / 2.0).collect();
        let (qm, gm) = (m(qn, d, &q), m(gn, d, &g));
        // Rows: a scattered subset (gathered) and a range (sliced); columns: ranges only.
        let lists = vec![(0..gn as u32).filter(|j| j % 3 == 0).collect::<Vec<u32>>(), (5..20).collect()];
        let ranges = vec![0..13, 13..40];
        let reqs: Vec<Request> = (0..qn)
            .map(|i| Request {
                targets: vec![(i % gn) as u32, 0, 39],
                subset: (i % 3 != 2).then_some((i % 2) as u32),
                ..Request::default()
            })
            .collect();
        let s = scores(&qm, &gm);
        let rows = rank_rows(&s, gn, &reqs, &lists);
        assert_eq!(rows, sorted_ranks(&reqs, gn, |i, j| s[i * gn + j], |k, j| lists[k as usize].contains(&(j as u32))));
        // The same scores read by columns: the transpose, computed the other way round.
        let st = scores(&gm, &qm);
        let cols = rank_columns(&st, gn, &reqs, &ranges);
        assert_eq!(
            cols,
            sorted_ranks(&reqs, gn, |i, j| s[i * gn + j], |k, j| ranges[k as usize].contains(&(j as u32)))
        );
    }

    #[test]
    fn tiles_and_matrix_match_a_full_sort() {
        // Integer embeddings: every product and sum is exact, so gemm and the chains agree bit
        // for bit, and scores tie everywhere. 450 images: five 90-row folds, row blocks cut at
        // them; 1,100 captions: two units (1,024 + 76) and a partial panel; 0 to 20 targets per
        // query (several passes of 8, and queries with none).
        let (mi, nc, d) = (450, 1100, 4);
        let mut rng = Rng(42);
        let mut vals = |n: usize| (0..n).map(|_| rng.below(5) as f32 - 2.0).collect::<Vec<f32>>();
        let (im, cap) = (m(mi, d, &vals(mi * d)), m(nc, d, &vals(nc * d)));
        let mut rng = Rng(3);
        // i2t subsets: captions `c % 5 == f` (scattered) for folds 0..5, and 100..400 (a range).
        let mut lists: Vec<Vec<u32>> = (0..5).map(|f| (0..nc as u32).filter(|c| c % 5 == f).collect()).collect();
        lists.push((100..400).collect());
        let ranges: Vec<Range<u32>> = (0..5).map(|f| 90 * f..90 * (f + 1)).collect();
        let i2t: Vec<Request> = (0..mi)
            .map(|i| Request {
                targets: targets(&mut rng, nc, 20),
                subset: [Some((i / 90) as u32), Some(5), None][i % 3],
                ..Request::default()
            })
            .collect();
        let t2i: Vec<Request> = (0..nc)
            .map(|c| Request {
                targets: targets(&mut rng, mi, 12),
                subset: (c % 4 != 0).then_some((c % 5) as u32),
                ..Request::default()
            })
            .collect();
        let s = scores(&im, &cap);
        let (a, b) = rank_with(Method::Matrix, &im, &cap, &i2t, &t2i, &lists, &ranges);
        assert_eq!(a, sorted_ranks(&i2t, nc, |i, c| s[i * nc + c], |k, c| lists[k as usize].contains(&(c as u32))));
        assert_eq!(b, sorted_ranks(&t2i, mi, |c, i| s[i * nc + c], |k, i| ranges[k as usize].contains(&(i as u32))));
        assert!(a.iter().map(|r| r.tied).sum::<u32>() > 1000, "the case has ties");
        if !product::tiles_missing("tiles_and_matrix_match_a_full_sort") {
            assert_eq!(rank_with(Method::Tiles, &im, &cap, &i2t, &t2i, &lists, &ranges), (a, b));
        }
    }

    #[test]
    fn tiles_rank_the_exact_chain_scores() {
        // Random floats, depth 150 (two depth blocks of the tile kernel): the tiles count the
        // same scores as the pairs' own chains.
        if product::tiles_missing("tiles_rank_the_exact_chain_scores") {
            return;
        }
        let (mi, nc, d) = (40, 150, 150);
        let mut rng = Rng(9);
        let mut vals =
            |n: usize| (0..n).map(|_| rng.below(1 << 20) as f32 / (1 << 20) as f32 - 0.5).collect::<Vec<f32>>();
        let (im, cap) = (m(mi, d, &vals(mi * d)), m(nc, d, &vals(nc * d)));
        let s: Vec<f32> = (0..mi * nc).map(|x| product::chains([(im.row(x / nc), cap.row(x % nc))])[0]).collect();
        let mut rng = Rng(5);
        let i2t: Vec<Request> = (0..mi)
            .map(|_| Request { targets: targets(&mut rng, nc, 9), subset: Some(0), ..Request::default() })
            .collect();
        let t2i: Vec<Request> = (0..nc)
            .map(|_| Request { targets: targets(&mut rng, mi, 3), subset: Some(0), ..Request::default() })
            .collect();
        let lists = vec![(0..nc as u32).step_by(2).collect::<Vec<u32>>()];
        let ranges: Vec<Range<u32>> = std::iter::once(10..30).collect();
        let (a, b) = rank_with(Method::Tiles, &im, &cap, &i2t, &t2i, &lists, &ranges);
        assert_eq!(a, sorted_ranks(&i2t, nc, |i, c| s[i * nc + c], |_, c| c % 2 == 0));
        assert_eq!(b, sorted_ranks(&t2i, mi, |c, i| s[i * nc + c], |_, i| (10..30).contains(&i)));
    }
}
