//! [`Method::Screen`](super::ranking::Method::Screen): ranks from 16-bit integer tiles, resolved
//! with exact scores only where a metric reads them (issue 5: the COCO 5K x 25K evaluation).
//!
//! The exact f32 tiles of [`super::ranking`] spend two thirds of an evaluation on the product.
//! Here the tiles hold integer products ([`super::quantized`], half the cost), and each
//! (query, target) pair has a proven bound ε: against the target's exact score `v`, an item
//! whose screen score exceeds `v + ε` ranks ahead of it for certain, one below `v − ε` after
//! it, and only the items in between — the *band* — are unknown. The counts give every rank
//! as an interval `[ahead for certain, + band]`; the band items are recorded as the tiles are
//! counted.
//!
//! A metric rarely needs all ranks exactly (`Need`): recall@K and the recall curve read the
//! best rank of each protocol's positives, ECCV's mAP@R the ranks below R. Ranks follow scores,
//! so a group's best is its highest-scoring target (ties: the lowest gallery index), known from
//! the exact target scores before any tile: only it is counted and resolved, and the group's
//! other members are reported at its rank (they rank after it). A pair with a `below` cut is
//! counted, and its band recorded while a worker's own count stays under the cut (a lower bound
//! of the final count); it is resolved if its certain rank ends under the cut. Resolving uses
//! the exact chain scores of [`super::product::chains`], the bits the exact methods rank, so
//! every rank a metric reads equals theirs, ties and their order included; the others come back
//! as lower bounds that provably change nothing. On the COCO 5K x 25K benchmark, ε is 3.3e-4,
//! ~230K band items are recorded and ~77K resolved, for 94K requested pairs.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rayon::prelude::*;

use super::embeddings::Matrix;
use super::product;
use super::product::{Panels, RowGroups};
use super::quantized::{self, Quantized, NR};
use super::ranking::{
    in_passes, in_units, row_blocks, subset_scores, target_pairs, unit_captions, Pairs, Ranks, Request, Tallies, Tally,
    MAX_TARGETS, UNIT_PANELS, W,
};

/// Band entries (pair, gallery item) recorded before the screen gives up for the exact method
/// (512 MB): scores this clustered leave the screen nothing to save.
const BAND_LIMIT: usize = 64 << 20;

/// Both directions' ranks, or `None` where the screen does not apply (a non-finite or zero
/// embedding set, norms that could overflow f32, or a band past `BAND_LIMIT`).
pub fn rank(
    images: &Matrix,
    captions: &Matrix,
    i2t: &[Request],
    t2i: &[Request],
    caption_subsets: &[Vec<u32>],
    image_subsets: &[Range<u32>],
) -> Option<(Vec<Ranks>, Vec<Ranks>)> {
    rank_limited(images, captions, i2t, t2i, caption_subsets, image_subsets, BAND_LIMIT)
}

/// [`rank`] giving up past `limit` band entries.
fn rank_limited(
    images: &Matrix,
    captions: &Matrix,
    i2t: &[Request],
    t2i: &[Request],
    caption_subsets: &[Vec<u32>],
    image_subsets: &[Range<u32>],
    limit: usize,
) -> Option<(Vec<Ranks>, Vec<Ranks>)> {
    assert_eq!(images.dim, captions.dim, "images and captions differ in width");
    assert_eq!((i2t.len(), t2i.len()), (images.rows, captions.rows), "one request per query");
    let (qi, qc) = rayon::join(|| Quantized::new(images), || Quantized::new(captions));
    let (qi, qc) = (qi?, qc?);
    if qi.max_norm * qc.max_norm > 1e30 {
        return None;
    }
    let (i2t_pairs, t2i_pairs) = target_pairs(images, captions, i2t, t2i);
    let c = qi.product_scale(&qc);
    let i2t_counted = Counted::new(i2t, &i2t_pairs, &|i, v| Quantized::thresholds(v, qi.bound(i, &qc), c));
    let t2i_counted = Counted::new(t2i, &t2i_pairs, &|j, v| Quantized::thresholds(v, qc.bound(j, &qi), c));
    let screen = Screen {
        images: quantized::row_groups(&qi, &row_blocks(images.rows, image_subsets)),
        captions: &qc,
        i2t,
        t2i,
        i2t_counted: &i2t_counted,
        t2i_counted: &t2i_counted,
        caption_subsets,
        image_subsets,
        recorded: AtomicUsize::new(0),
        limit,
        over: AtomicBool::new(false),
    };
    let (tallies, [i2t_items, t2i_items]) = screen.run(i2t_pairs.len(), t2i_pairs.len())?;
    let exact = |i: usize, c: usize| (images.row(i), captions.row(c));
    let a = resolve(i2t, &i2t_pairs, &i2t_counted, &tallies.i2t, i2t_items, &|q, j| exact(q, j), &|s, j| {
        caption_subsets[s as usize].binary_search(&j).is_ok()
    });
    let b = resolve(t2i, &t2i_pairs, &t2i_counted, &tallies.t2i, t2i_items, &|q, j| exact(j, q), &|s, j| {
        image_subsets[s as usize].contains(&j)
    });
    Some((a, b))
}

/// Everything the units share.
struct Screen<'a> {
    images: RowGroups<u32>,
    captions: &'a Quantized,
    i2t: &'a [Request],
    t2i: &'a [Request],
    i2t_counted: &'a Counted,
    t2i_counted: &'a Counted,
    caption_subsets: &'a [Vec<u32>],
    image_subsets: &'a [Range<u32>],
    /// Band entries recorded so far, all workers.
    recorded: AtomicUsize,
    limit: usize,
    over: AtomicBool,
}

/// The pairs counted against the tiles, per query: every pair of a request without needs, else
/// the group bests ([`group_bests`]) and the pairs with a `below` cut. Another member of a
/// group ranks after the group's best: its rank is never read, and is reported as the best's.
///
/// Also which band items are recorded: those of pairs that may be resolved. A group's best
/// always is; a `below` cut needs the band only while the certain rank — a worker's own count
/// so far is a lower bound of it — stays under the cut.
struct Counted {
    /// Query `q`'s counted pairs: `start[q]..start[q + 1]` of the lists below.
    start: Vec<usize>,
    /// The pair (index into the direction's flattened targets) and its target's position in
    /// the request.
    pair: Vec<(u32, u32)>,
    /// The pair's integer band `(lo, hi)` ([`Quantized::thresholds`]).
    band: Vec<(i32, i32)>,
    /// Per pair of the direction: counted or not.
    counted: Vec<bool>,
    /// Per pair: a group's best, or a request that needs every rank (always resolved).
    always: Vec<bool>,
    /// Per pair: its `below` cut.
    below: Vec<u32>,
}

impl Counted {
    /// `thresholds(q, v)`: the band of query `q`'s pair with exact score `v`.
    fn new(reqs: &[Request], pairs: &Pairs, thresholds: &(dyn Fn(usize, f32) -> (i32, i32) + Sync)) -> Counted {
        let mut always = vec![false; pairs.len()];
        let mut below = vec![0; pairs.len()];
        for (q, r) in reqs.iter().enumerate() {
            let p0 = pairs.of(q).start;
            if r.need.is_empty() {
                always[p0..p0 + r.targets.len()].fill(true);
                continue;
            }
            for (k, n) in r.need.iter().enumerate() {
                below[p0 + k] = n.below;
            }
            for (_, k) in group_bests(r, &pairs.scores[pairs.of(q)]) {
                always[p0 + k] = true;
            }
        }
        let counted: Vec<bool> = always.iter().zip(&below).map(|(&a, &b)| a || b > 0).collect();
        let (mut start, mut pair) = (Vec::with_capacity(reqs.len() + 1), Vec::new());
        start.push(0);
        for q in 0..reqs.len() {
            let ps = pairs.of(q);
            pair.extend(ps.clone().filter(|&p| counted[p]).map(|p| (p as u32, (p - ps.start) as u32)));
            start.push(pair.len());
        }
        let owner: Vec<usize> = (0..reqs.len()).flat_map(|q| std::iter::repeat_n(q, start[q + 1] - start[q])).collect();
        let band = pair.par_iter().zip(&owner).map(|(&(p, _), &q)| thresholds(q, pairs.scores[p as usize])).collect();
        Counted { start, pair, band, counted, always, below }
    }

    fn of(&self, q: usize) -> Range<usize> {
        self.start[q]..self.start[q + 1]
    }

    /// Whether pair `p` records its band, given the worker's certain counts so far (full
    /// gallery and subset): lower bounds of the final ones, which [`Query::ranks`] compares
    /// with the same cut.
    fn record(&self, p: usize, full: u32, subset: Option<u32>) -> bool {
        self.always[p] || full < self.below[p] || subset.is_some_and(|s| s < self.below[p])
    }
}

/// Per best-of group of `r` (its bit), the target with the best rank: the highest score, ties
/// (`==`, so -0 and +0 too) to the lowest gallery index, as ranks are ordered.
fn group_bests(r: &Request, scores: &[f32]) -> Vec<(u8, usize)> {
    let ahead = |a: usize, b: usize| scores[a] > scores[b] || (scores[a] == scores[b] && r.targets[a] < r.targets[b]);
    let mut out = Vec::new();
    for g in 0..8 {
        let bit = 1u8 << g;
        let mut best: Option<usize> = None;
        for k in (0..r.targets.len()).filter(|&k| r.need.get(k).is_some_and(|n| n.best_of & bit != 0)) {
            if best.is_none_or(|b| ahead(k, b)) {
                best = Some(k);
            }
        }
        out.extend(best.map(|k| (bit, k)));
    }
    out
}

/// One worker's counts, band entries and scratch space.
struct Worker {
    /// Per pair: `higher` = items ahead for certain, `equal` = items in the band (the target
    /// included where it is in the gallery).
    tallies: Tallies,
    /// (pair, gallery item) of every band item other than the target: i2t, t2i.
    band: [Vec<(u32, u32)>; 2],
    panels: Panels<u32>,
    tile: Vec<i32>,
    gather: Vec<i32>,
    counts: Vec<[u32; 2]>,
}

impl Screen<'_> {
    fn worker(&self, i2t_pairs: usize, t2i_pairs: usize) -> Worker {
        let zeros = |n: usize| [vec![Tally::default(); n], vec![Tally::default(); n]];
        Worker {
            tallies: Tallies { i2t: zeros(i2t_pairs), t2i: zeros(t2i_pairs) },
            band: [Vec::new(), Vec::new()],
            panels: Panels::default(),
            tile: vec![0; super::ranking::TILE_ROWS * UNIT_PANELS * NR],
            gather: Vec::new(),
            counts: Vec::new(),
        }
    }

    /// The counts and band entries of all units, or `None` past [`BAND_LIMIT`].
    #[allow(clippy::type_complexity)]
    fn run(self, i2t_pairs: usize, t2i_pairs: usize) -> Option<(Tallies, [Vec<(u32, u32)>; 2])> {
        let units = self.t2i.len().div_ceil(UNIT_PANELS * NR);
        let work = |w: &mut Worker, u: usize| {
            let before = w.band[0].len() + w.band[1].len();
            self.unit(w, u);
            let added = w.band[0].len() + w.band[1].len() - before;
            if self.recorded.fetch_add(added, Ordering::Relaxed) + added > self.limit {
                self.over.store(true, Ordering::Relaxed);
            }
        };
        let stop = || self.over.load(Ordering::Relaxed);
        let done = in_units(units, || self.worker(i2t_pairs, t2i_pairs), work, stop)
            .map(|w| (w.tallies, w.band))
            .reduce(|(ta, [a0, a1]), (tb, [b0, b1])| (ta.merge(tb), [concat(a0, b0), concat(a1, b1)]))
            .unwrap_or_else(|| (self.worker(i2t_pairs, t2i_pairs).tallies, [Vec::new(), Vec::new()]));
        (!self.over.load(Ordering::Relaxed)).then_some(done)
    }

    /// Captions `1024 u..`: every tile of their columns, counted both ways.
    fn unit(&self, w: &mut Worker, u: usize) {
        let captions = unit_captions(u, self.t2i.len());
        quantized::pack(&mut w.panels, self.captions, captions.clone());
        let width = w.panels.len() * NR;
        for b in 0..self.images.len() {
            let rows = self.images.rows(b);
            quantized::tile(&self.images, b, &w.panels, &mut w.tile);
            self.count_i2t(w, rows.clone(), captions.clone(), width);
            self.count_t2i(w, rows, captions.clone(), width);
        }
    }

    /// The tile's rows: image `i` against `captions`, for its targets and within its subset.
    fn count_i2t(&self, w: &mut Worker, rows: Range<usize>, captions: Range<usize>, width: usize) {
        let c0 = captions.start;
        for i in rows.clone() {
            let req = &self.i2t[i];
            let cs = self.i2t_counted.of(i);
            if cs.is_empty() {
                continue;
            }
            let at = (i - rows.start) * width;
            let row = &w.tile[at..at + captions.len()];
            let (pairs, band) = (&self.i2t_counted.pair[cs.clone()], &self.i2t_counted.band[cs]);
            count_targets(row, band, &mut w.counts);
            for (x, &(p, k)) in pairs.iter().enumerate() {
                let [gt, ge] = w.counts[x];
                let (p, t) = (p as usize, req.targets[k as usize]);
                let has_t = captions.contains(&(t as usize));
                // Recorded while it may be resolved (the count so far is before this tile's).
                let sub = req.subset.map(|_| w.tallies.i2t[1][p].higher);
                let keep = self.i2t_counted.record(p, w.tallies.i2t[0][p].higher, sub);
                w.tallies.i2t[0][p].add(Tally { higher: gt, equal: ge - gt, ahead: 0 });
                if keep && ge - gt > has_t as u32 {
                    let (lo, hi) = band[x];
                    band_items(row, lo, hi, |j| {
                        if c0 + j != t as usize {
                            w.band[0].push((p as u32, (c0 + j) as u32));
                        }
                    });
                }
            }
            let Some(s) = req.subset else { continue };
            let Some((_, sub)) = subset_scores(&self.caption_subsets[s as usize], captions.clone(), row, &mut w.gather)
            else {
                continue;
            };
            count_targets(sub, band, &mut w.counts);
            for (x, &(p, _)) in pairs.iter().enumerate() {
                let [gt, ge] = w.counts[x];
                w.tallies.i2t[1][p as usize].add(Tally { higher: gt, equal: ge - gt, ahead: 0 });
            }
        }
    }

    /// The tile's columns: 16 captions at a time against the images of `rows`.
    fn count_t2i(&self, w: &mut Worker, rows: Range<usize>, captions: Range<usize>, width: usize) {
        for g in 0..captions.len().div_ceil(W) {
            let cg = captions.start + g * W;
            let reqs = &self.t2i[cg..(cg + W).min(captions.end)];
            let counted = |l: usize| {
                let cs = self.t2i_counted.of(cg + l);
                (&self.t2i_counted.pair[cs.clone()], &self.t2i_counted.band[cs])
            };
            let slots = (0..reqs.len()).map(|l| counted(l).0.len()).max().unwrap_or(0);
            let lanes = Lanes { data: &w.tile, stride: width, offset: g * W };
            in_passes(slots, |k0, n| {
                // Empty slots: a band no score reaches (|q_a·q_b| < 2^31 - 1).
                let mut lo = [[i32::MAX; W]; MAX_TARGETS];
                let mut hi = [[i32::MAX; W]; MAX_TARGETS];
                for l in 0..reqs.len() {
                    let band = counted(l).1;
                    for x in k0..(k0 + n).min(band.len()) {
                        (lo[x - k0][l], hi[x - k0][l]) = band[x];
                    }
                }
                let counts = count_lanes(lanes, 0..rows.len(), n, &lo, &hi);
                // Lanes per slot whose band is recorded: it may be resolved and holds an item
                // other than the target.
                let mut scan = [0u16; MAX_TARGETS];
                for (l, r) in reqs.iter().enumerate() {
                    let pairs = counted(l).0;
                    let within = r.subset.map(|s| &self.image_subsets[s as usize]);
                    let inside = within.is_some_and(|s| s.start as usize <= rows.start && rows.end <= s.end as usize);
                    for x in k0..(k0 + n).min(pairs.len()) {
                        let (p, k) = (pairs[x].0 as usize, pairs[x].1 as usize);
                        let (gt, ge) = (counts[0][x - k0][l], counts[1][x - k0][l]);
                        let sub = r.subset.map(|_| w.tallies.t2i[1][p].higher);
                        let keep = self.t2i_counted.record(p, w.tallies.t2i[0][p].higher, sub);
                        let tally = Tally { higher: gt, equal: ge - gt, ahead: 0 };
                        w.tallies.t2i[0][p].add(tally);
                        if inside {
                            w.tallies.t2i[1][p].add(tally);
                        }
                        if keep && ge - gt > rows.contains(&(r.targets[k] as usize)) as u32 {
                            scan[x - k0] |= 1 << l;
                        }
                    }
                }
                if scan.iter().any(|&m| m != 0) {
                    let (t2i, out) = (self.t2i, &mut w.band[1]);
                    band_lanes(lanes, rows.len(), &lo, &hi, &scan, |x, l, i| {
                        let (c, gi) = (cg + l, rows.start + i);
                        let (p, k) = counted(l).0[k0 + x];
                        if t2i[c].targets[k as usize] as usize != gi {
                            out.push((p, gi as u32));
                        }
                    });
                }
            });
        }
    }
}

fn concat<T>(mut a: Vec<T>, mut b: Vec<T>) -> Vec<T> {
    if a.len() < b.len() {
        std::mem::swap(&mut a, &mut b);
    }
    a.extend(b);
    a
}

/// Ranks of one direction from the screen's counts, resolving what the [`Need`](super::ranking::Need)s ask for.
/// `exact(q, j)`: the (image, caption) embeddings of query `q` and gallery item `j`;
/// `in_subset(s, j)`: whether item `j` is in subset `s`.
#[allow(clippy::type_complexity)]
fn resolve<'v>(
    reqs: &[Request],
    pairs: &Pairs,
    counted: &Counted,
    tallies: &[Vec<Tally>; 2],
    band: Vec<(u32, u32)>,
    exact: &(dyn Fn(usize, usize) -> (&'v [f32], &'v [f32]) + Sync),
    in_subset: &(dyn Fn(u32, u32) -> bool + Sync),
) -> Vec<Ranks> {
    // Band items grouped by pair (a counting sort).
    let mut start = vec![0usize; pairs.len() + 1];
    for &(p, _) in &band {
        start[p as usize + 1] += 1;
    }
    for p in 0..pairs.len() {
        start[p + 1] += start[p];
    }
    let mut items = vec![0u32; band.len()];
    let mut fill = start.clone();
    for (p, j) in band {
        items[fill[p as usize]] = j;
        fill[p as usize] += 1;
    }
    reqs.par_iter()
        .enumerate()
        .map(|(q, r)| {
            let ps = pairs.of(q);
            let query = Query {
                q,
                req: r,
                scores: &pairs.scores[ps.clone()],
                counted: &counted.counted[ps.clone()],
                full: &tallies[0][ps.clone()],
                sub: &tallies[1][ps.clone()],
                items: &items,
                start: &start[ps.start..=ps.end],
                exact,
                in_subset,
            };
            query.ranks()
        })
        .collect()
}

/// One query's screen counts and band items.
struct Query<'a, 'v> {
    q: usize,
    req: &'a Request,
    scores: &'a [f32],
    /// Per target: counted against the tiles ([`Counted`]).
    counted: &'a [bool],
    full: &'a [Tally],
    sub: &'a [Tally],
    /// Band items of every pair; this query's target `k` has `items[start[k]..start[k + 1]]`.
    items: &'a [u32],
    start: &'a [usize],
    exact: &'a (dyn Fn(usize, usize) -> (&'v [f32], &'v [f32]) + Sync),
    in_subset: &'a (dyn Fn(u32, u32) -> bool + Sync),
}

/// A target's ranks: `exact` once resolved (or when nothing shares its band).
#[derive(Clone, Copy)]
struct Slot {
    full: u32,
    subset: u32,
    exact: bool,
    tied: bool,
}

impl Query<'_, '_> {
    fn ranks(&self) -> Ranks {
        let r = self.req;
        let has_subset = r.subset.is_some();
        let mut slots: Vec<Slot> = (0..r.targets.len())
            .map(|k| {
                let t = r.targets[k];
                let (f, s) = (self.full[k], self.sub[k]);
                if !self.counted[k] {
                    // Never read: raised to its group's best below.
                    return Slot { full: 0, subset: 0, exact: false, tied: false };
                }
                assert!(f.equal >= 1, "the screen bound failed: a target outside its own band");
                let in_sub = r.subset.is_some_and(|g| (self.in_subset)(g, t));
                let exact = f.equal == 1 && (!has_subset || s.equal == in_sub as u32);
                Slot { full: f.higher, subset: s.higher, exact, tied: false }
            })
            .collect();
        let everything = r.need.is_empty();
        for (k, slot) in slots.iter_mut().enumerate() {
            let need = r.need.get(k).copied().unwrap_or_default();
            let low = slot.full < need.below || (has_subset && slot.subset < need.below);
            if everything || low {
                self.resolve(k, slot);
            }
        }
        // Best-of groups: the best rank is the highest-scoring target's ([`group_bests`]);
        // another target ranks after it, so its lower bound may be raised to that rank,
        // which keeps every group minimum exact.
        if !everything {
            let bests = group_bests(r, self.scores);
            for &(_, best) in &bests {
                self.resolve(best, &mut slots[best]);
            }
            // Only once every resolution is done (they start from the certain counts).
            for &(bit, best) in &bests {
                let (f, sub) = (slots[best].full, slots[best].subset);
                for (slot, need) in slots.iter_mut().zip(&r.need) {
                    if need.best_of & bit != 0 && !slot.exact {
                        slot.full = slot.full.max(f);
                        slot.subset = slot.subset.max(sub);
                    }
                }
            }
        }
        Ranks {
            full: slots.iter().map(|s| s.full).collect(),
            subset: if has_subset { slots.iter().map(|s| s.subset).collect() } else { Vec::new() },
            tied: slots.iter().filter(|s| s.tied).count() as u32,
        }
    }

    /// Exact ranks of target `k` from the exact scores of its band items.
    fn resolve(&self, k: usize, slot: &mut Slot) {
        if slot.exact {
            return;
        }
        let (t, v) = (self.req.targets[k], self.scores[k]);
        let items = &self.items[self.start[k]..self.start[k + 1]];
        let (mut full, mut sub) = (0u32, 0u32);
        for chunk in items.chunks(8) {
            let s = product::chains::<8>(std::array::from_fn(|x| {
                (self.exact)(self.q, chunk[x.min(chunk.len() - 1)] as usize)
            }));
            for (&j, &x) in chunk.iter().zip(&s) {
                let ahead = x > v || (x == v && j < t);
                slot.tied |= x == v;
                if ahead {
                    full += 1;
                    if self.req.subset.is_some_and(|g| (self.in_subset)(g, j)) {
                        sub += 1;
                    }
                }
            }
        }
        slot.full += full;
        slot.subset += sub;
        slot.exact = true;
    }
}

/// A column block of a tile: 16 consecutive columns of each row, read at `stride` from
/// `offset`.
#[derive(Clone, Copy)]
struct Lanes<'a> {
    data: &'a [i32],
    stride: usize,
    offset: usize,
}

impl Lanes<'_> {
    fn at(&self, r: usize) -> &[i32; W] {
        let at = r * self.stride + self.offset;
        self.data[at..at + W].try_into().expect("16 lanes")
    }
}

/// Per target band `(lo, hi)`: `out[k] = [#(x > hi), #(x >= lo)]` over `row`, in passes of up
/// to 8 targets.
fn count_targets(row: &[i32], targets: &[(i32, i32)], out: &mut Vec<[u32; 2]>) {
    out.clear();
    out.resize(targets.len(), [0, 0]);
    in_passes(targets.len(), |k0, n| {
        let mut lo = [i32::MAX; MAX_TARGETS];
        let mut hi = [i32::MAX; MAX_TARGETS];
        for (k, &(a, b)) in targets[k0..(k0 + n).min(targets.len())].iter().enumerate() {
            (lo[k], hi[k]) = (a, b);
        }
        let c = count_row(row, n, &lo, &hi);
        for (k, slot) in out[k0..].iter_mut().take(n).enumerate() {
            *slot = [c[0][k], c[1][k]];
        }
    });
}

/// `[#(x > hi[k]), #(x >= lo[k])]` for the first `n` slots (1, 2, 4 or 8; empty slots have
/// `lo = hi = i32::MAX`, which no product reaches).
fn count_row(row: &[i32], n: usize, lo: &[i32; MAX_TARGETS], hi: &[i32; MAX_TARGETS]) -> [[u32; MAX_TARGETS]; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe {
                match n {
                    1 => x86::count_row::<1>(row, lo, hi),
                    2 => x86::count_row::<2>(row, lo, hi),
                    4 => x86::count_row::<4>(row, lo, hi),
                    _ => x86::count_row::<MAX_TARGETS>(row, lo, hi),
                }
            };
        }
    }
    count_row_portable(row, n, lo, hi)
}

fn count_row_portable(
    row: &[i32],
    n: usize,
    lo: &[i32; MAX_TARGETS],
    hi: &[i32; MAX_TARGETS],
) -> [[u32; MAX_TARGETS]; 2] {
    let mut out = [[0u32; MAX_TARGETS]; 2];
    for &x in row {
        for k in 0..n {
            out[0][k] += (x > hi[k]) as u32;
            out[1][k] += (x >= lo[k]) as u32;
        }
    }
    out
}

/// `[#(x > hi), #(x >= lo)]` per slot and lane over `rows` of a column block.
fn count_lanes(
    src: Lanes,
    rows: Range<usize>,
    n: usize,
    lo: &[[i32; W]; MAX_TARGETS],
    hi: &[[i32; W]; MAX_TARGETS],
) -> [[[u32; W]; MAX_TARGETS]; 2] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe {
                match n {
                    1 => x86::count_lanes::<1>(src, rows, lo, hi),
                    2 => x86::count_lanes::<2>(src, rows, lo, hi),
                    4 => x86::count_lanes::<4>(src, rows, lo, hi),
                    _ => x86::count_lanes::<MAX_TARGETS>(src, rows, lo, hi),
                }
            };
        }
    }
    count_lanes_portable(src, rows, n, lo, hi)
}

fn count_lanes_portable(
    src: Lanes,
    rows: Range<usize>,
    n: usize,
    lo: &[[i32; W]; MAX_TARGETS],
    hi: &[[i32; W]; MAX_TARGETS],
) -> [[[u32; W]; MAX_TARGETS]; 2] {
    let mut out = [[[0u32; W]; MAX_TARGETS]; 2];
    for r in rows {
        let x = src.at(r);
        for k in 0..n {
            for l in 0..W {
                out[0][k][l] += (x[l] > hi[k][l]) as u32;
                out[1][k][l] += (x[l] >= lo[k][l]) as u32;
            }
        }
    }
    out
}

/// Calls `f(j)` for each `j` with `lo <= row[j] <= hi`, in order.
fn band_items(row: &[i32], lo: i32, hi: i32, mut f: impl FnMut(usize)) {
    let mut j0 = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            j0 = unsafe { x86::band_items(row, lo, hi, &mut f) };
        }
    }
    band_items_portable(row, j0, lo, hi, f);
}

/// [`band_items`] from index `j0` on.
fn band_items_portable(row: &[i32], j0: usize, lo: i32, hi: i32, mut f: impl FnMut(usize)) {
    for (j, &x) in row.iter().enumerate().skip(j0) {
        if lo <= x && x <= hi {
            f(j);
        }
    }
}

/// Calls `f(k, l, i)` for each row `i < rows` whose lane `l` lies in slot `k`'s band
/// `lo[k][l]..=hi[k][l]`, for the lanes set in `lanes[k]`.
fn band_lanes(
    src: Lanes,
    rows: usize,
    lo: &[[i32; W]; MAX_TARGETS],
    hi: &[[i32; W]; MAX_TARGETS],
    lanes: &[u16; MAX_TARGETS],
    mut f: impl FnMut(usize, usize, usize),
) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            unsafe { x86::band_lanes(src, rows, lo, hi, lanes, &mut f) };
            return;
        }
    }
    band_lanes_portable(src, rows, lo, hi, lanes, f);
}

fn band_lanes_portable(
    src: Lanes,
    rows: usize,
    lo: &[[i32; W]; MAX_TARGETS],
    hi: &[[i32; W]; MAX_TARGETS],
    lanes: &[u16; MAX_TARGETS],
    mut f: impl FnMut(usize, usize, usize),
) {
    for i in 0..rows {
        let x = src.at(i);
        for k in (0..MAX_TARGETS).filter(|&k| lanes[k] != 0) {
            for l in (0..W).filter(|&l| lanes[k] & (1 << l) != 0) {
                if lo[k][l] <= x[l] && x[l] <= hi[k][l] {
                    f(k, l, i);
                }
            }
        }
    }
}

// AVX-512 target features and intrinsics are stable since Rust 1.89 (see `product.rs`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Lanes, MAX_TARGETS, W};

    /// Rows ahead fetched in [`count_lanes`] (their reads jump a whole tile row).
    const PREFETCH_ROWS: usize = 16;

    #[target_feature(enable = "avx512f")]
    pub fn count_row<const N: usize>(
        row: &[i32],
        lo: &[i32; MAX_TARGETS],
        hi: &[i32; MAX_TARGETS],
    ) -> [[u32; MAX_TARGETS]; 2] {
        let one = _mm512_set1_epi32(1);
        let lb: [__m512i; N] = std::array::from_fn(|k| _mm512_set1_epi32(lo[k]));
        let hb: [__m512i; N] = std::array::from_fn(|k| _mm512_set1_epi32(hi[k]));
        let (mut gt, mut ge) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
        let blocks = row.chunks_exact(16);
        let tail = blocks.remainder();
        for x in blocks {
            // SAFETY: `x` holds 16 i32.
            let x = unsafe { _mm512_loadu_si512(x.as_ptr() as *const _) };
            for k in 0..N {
                gt[k] = _mm512_mask_add_epi32(gt[k], _mm512_cmpgt_epi32_mask(x, hb[k]), gt[k], one);
                ge[k] = _mm512_mask_add_epi32(ge[k], _mm512_cmpge_epi32_mask(x, lb[k]), ge[k], one);
            }
        }
        let mut out = super::count_row_portable(tail, N, lo, hi);
        for k in 0..N {
            out[0][k] += _mm512_reduce_add_epi32(gt[k]) as u32;
            out[1][k] += _mm512_reduce_add_epi32(ge[k]) as u32;
        }
        out
    }

    #[target_feature(enable = "avx512f")]
    pub fn count_lanes<const N: usize>(
        src: Lanes,
        rows: Range<usize>,
        lo: &[[i32; W]; MAX_TARGETS],
        hi: &[[i32; W]; MAX_TARGETS],
    ) -> [[[u32; W]; MAX_TARGETS]; 2] {
        let one = _mm512_set1_epi32(1);
        // SAFETY: each `lo[k]` / `hi[k]` holds 16 i32.
        let lb: [__m512i; N] = std::array::from_fn(|k| unsafe { _mm512_loadu_si512(lo[k].as_ptr() as *const _) });
        let hb: [__m512i; N] = std::array::from_fn(|k| unsafe { _mm512_loadu_si512(hi[k].as_ptr() as *const _) });
        let (mut gt, mut ge) = ([_mm512_setzero_si512(); N], [_mm512_setzero_si512(); N]);
        for r in rows {
            let p = src.data.as_ptr().wrapping_add((r + PREFETCH_ROWS) * src.stride + src.offset);
            // A prefetch only hints the cache; it reads nothing and cannot fault.
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            // SAFETY: `at` returns 16 i32.
            let x = unsafe { _mm512_loadu_si512(src.at(r).as_ptr() as *const _) };
            for k in 0..N {
                gt[k] = _mm512_mask_add_epi32(gt[k], _mm512_cmpgt_epi32_mask(x, hb[k]), gt[k], one);
                ge[k] = _mm512_mask_add_epi32(ge[k], _mm512_cmpge_epi32_mask(x, lb[k]), ge[k], one);
            }
        }
        let mut out = [[[0u32; W]; MAX_TARGETS]; 2];
        for k in 0..N {
            // SAFETY: each destination holds 16 u32.
            unsafe {
                _mm512_storeu_si512(out[0][k].as_mut_ptr() as *mut _, gt[k]);
                _mm512_storeu_si512(out[1][k].as_mut_ptr() as *mut _, ge[k]);
            }
        }
        out
    }

    #[target_feature(enable = "avx512f")]
    pub fn band_lanes(
        src: Lanes,
        rows: usize,
        lo: &[[i32; W]; MAX_TARGETS],
        hi: &[[i32; W]; MAX_TARGETS],
        lanes: &[u16; MAX_TARGETS],
        f: &mut impl FnMut(usize, usize, usize),
    ) {
        let mut slots = [(0usize, 0u16, _mm512_setzero_si512(), _mm512_setzero_si512()); MAX_TARGETS];
        let mut n = 0;
        for k in (0..MAX_TARGETS).filter(|&k| lanes[k] != 0) {
            // SAFETY: each `lo[k]` / `hi[k]` holds 16 i32.
            let (a, b) = unsafe {
                (_mm512_loadu_si512(lo[k].as_ptr() as *const _), _mm512_loadu_si512(hi[k].as_ptr() as *const _))
            };
            slots[n] = (k, lanes[k], a, b);
            n += 1;
        }
        for i in 0..rows {
            // SAFETY: `at` returns 16 i32.
            let x = unsafe { _mm512_loadu_si512(src.at(i).as_ptr() as *const _) };
            for &(k, mask, a, b) in &slots[..n] {
                let mut m = _mm512_mask_cmpge_epi32_mask(mask, x, a) & _mm512_cmple_epi32_mask(x, b);
                while m != 0 {
                    f(k, m.trailing_zeros() as usize, i);
                    m &= m - 1;
                }
            }
        }
    }

    /// The whole 16-blocks of [`super::band_items`]; returns where the tail starts.
    #[target_feature(enable = "avx512f")]
    pub fn band_items(row: &[i32], lo: i32, hi: i32, f: &mut impl FnMut(usize)) -> usize {
        let (lb, hb) = (_mm512_set1_epi32(lo), _mm512_set1_epi32(hi));
        for (b, x) in row.chunks_exact(16).enumerate() {
            // SAFETY: `x` holds 16 i32.
            let x = unsafe { _mm512_loadu_si512(x.as_ptr() as *const _) };
            let mut m = _mm512_cmpge_epi32_mask(x, lb) & _mm512_cmple_epi32_mask(x, hb);
            while m != 0 {
                f(16 * b + m.trailing_zeros() as usize);
                m &= m - 1;
            }
        }
        row.len() / 16 * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::ranking::tests::sorted_ranks;
    use crate::eval::ranking::{rank_with, Method, Need};

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

    /// `rows x dim` values: coarse integers (exact ties everywhere) or fine random floats, plus
    /// a few rows copied from others (exact duplicates).
    fn matrix(rng: &mut Rng, rows: usize, dim: usize, coarse: bool) -> Matrix {
        let mut v: Vec<f32> = (0..rows * dim)
            .map(
                |_| if coarse { rng.below(5) as f32 - 2.0 } else { rng.below(1 << 20) as f32 / (1 << 20) as f32 - 0.5 },
            )
            .collect();
        for r in (7..rows).step_by(11) {
            let from = rng.below(r);
            v.copy_within(from * dim..(from + 1) * dim, r * dim);
        }
        Matrix::new(rows, dim, v)
    }

    /// Random requests: 0..=max distinct targets each, each with a random need (best of group
    /// 1 or 2, or a `below` cut) unless `exact`.
    fn requests(
        rng: &mut Rng,
        queries: usize,
        gallery: usize,
        max: usize,
        exact: bool,
        subsets: usize,
    ) -> Vec<Request> {
        (0..queries)
            .map(|q| {
                let mut r = Request { subset: (q % 3 != 0).then(|| (q % subsets) as u32), ..Request::default() };
                for _ in 0..rng.below(max + 1) {
                    let t = rng.below(gallery) as u32;
                    if r.targets.contains(&t) {
                        continue;
                    }
                    r.targets.push(t);
                    if !exact {
                        r.need.push(match rng.below(4) {
                            0 => Need { best_of: 1, below: 0 },
                            1 => Need { best_of: 2, below: 0 },
                            2 => Need { best_of: 0, below: rng.below(30) as u32 },
                            _ => Need { best_of: 3, below: rng.below(5) as u32 },
                        });
                    }
                }
                r
            })
            .collect()
    }

    /// What a metric reads agrees with the exact ranks `want`: each group's best (full and
    /// subset), each rank under its cut; every screened rank is at most the exact one.
    fn check(got: &[Ranks], want: &[Ranks], reqs: &[Request]) {
        for ((g, w), r) in got.iter().zip(want).zip(reqs) {
            assert_eq!((g.full.len(), g.subset.len()), (w.full.len(), w.subset.len()));
            if r.need.is_empty() {
                assert_eq!(g, w, "a request without needs gets exact ranks");
                continue;
            }
            for k in 0..r.targets.len() {
                assert!(
                    g.full[k] <= w.full[k] && (g.subset.is_empty() || g.subset[k] <= w.subset[k]),
                    "lower bounds: {g:?} {w:?} {r:?} k {k}"
                );
                let below = r.need[k].below;
                if w.full[k] < below {
                    assert_eq!(g.full[k], w.full[k], "rank under the cut");
                } else {
                    assert!(g.full[k] >= below, "a rank at or past the cut stays there");
                }
                if !w.subset.is_empty() {
                    if w.subset[k] < below {
                        assert_eq!(g.subset[k], w.subset[k], "subset rank under the cut");
                    } else {
                        assert!(g.subset[k] >= below);
                    }
                }
            }
            for bit in [1u8, 2] {
                let members: Vec<usize> = (0..r.targets.len()).filter(|&k| r.need[k].best_of & bit != 0).collect();
                let best = |v: &Vec<u32>| members.iter().map(|&k| v[k]).min();
                assert_eq!(best(&g.full), best(&w.full), "group {bit} best");
                if !w.subset.is_empty() {
                    assert_eq!(best(&g.subset), best(&w.subset), "group {bit} best within the subset");
                }
            }
        }
    }

    #[test]
    fn screened_ranks_equal_the_exact_ones_where_read() {
        // 450 images in five 90-row folds (row blocks cut at them), 1,100 captions (two units
        // and a partial panel), depth 37 (an odd width: a padded pair). Coarse integer values
        // tie everywhere; fine ones exercise the bound.
        let (mi, nc, d) = (450, 1100, 37);
        for (seed, coarse) in [(1, true), (2, false)] {
            let mut rng = Rng(seed);
            let (im, cap) = (matrix(&mut rng, mi, d, coarse), matrix(&mut rng, nc, d, coarse));
            let mut lists: Vec<Vec<u32>> = (0..5).map(|f| (0..nc as u32).filter(|c| c % 5 == f).collect()).collect();
            lists.push((100..400).collect());
            let ranges: Vec<Range<u32>> = (0..5).map(|f| 90 * f..90 * (f + 1)).collect();
            for exact in [true, false] {
                let i2t = requests(&mut rng, mi, nc, 12, exact, 6);
                let t2i = requests(&mut rng, nc, mi, 6, exact, 5);
                // The exact ranks by brute force: a stable sort of each query's chain scores.
                let s: Vec<f32> =
                    (0..mi * nc).map(|x| product::chains([(im.row(x / nc), cap.row(x % nc))])[0]).collect();
                let want = (
                    sorted_ranks(&i2t, nc, |i, c| s[i * nc + c], |k, c| lists[k as usize].contains(&(c as u32))),
                    sorted_ranks(&t2i, mi, |c, i| s[i * nc + c], |k, i| ranges[k as usize].contains(&(i as u32))),
                );
                let (a, b) = rank(&im, &cap, &i2t, &t2i, &lists, &ranges).expect("the screen applies");
                check(&a, &want.0, &i2t);
                check(&b, &want.1, &t2i);
                if exact {
                    assert!(want.0.iter().map(|r| r.tied).sum::<u32>() > 0 || !coarse, "the coarse case has ties");
                }
            }
        }
    }

    #[test]
    fn kernels_equal_plain_comparisons() {
        // The dispatched kernels (AVX-512 here when present) against the portable loops and
        // against plain comparisons: lengths around the 16-lane blocks, values on a coarse grid
        // (equal to the thresholds often), empty slots (i32::MAX), empty bands (lo > hi).
        let mut rng = Rng(11);
        for len in [0usize, 1, 15, 16, 17, 40, 333] {
            let row: Vec<i32> = (0..len).map(|_| rng.below(9) as i32 - 4).collect();
            let lo: [i32; MAX_TARGETS] = [-1, 0, 3, -4, 2, 5, i32::MAX, i32::MIN];
            let hi: [i32; MAX_TARGETS] = [1, 0, 2, 4, 2, 9, i32::MAX, -3];
            for n in [1, 2, 4, 8] {
                let c = count_row(&row, n, &lo, &hi);
                assert_eq!(c, count_row_portable(&row, n, &lo, &hi));
                for k in 0..n {
                    assert_eq!(c[0][k], row.iter().filter(|&&x| x > hi[k]).count() as u32);
                    assert_eq!(c[1][k], row.iter().filter(|&&x| x >= lo[k]).count() as u32);
                }
            }
            for k in 0..MAX_TARGETS {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                band_items(&row, lo[k], hi[k], |j| a.push(j));
                band_items_portable(&row, 0, lo[k], hi[k], |j| b.push(j));
                let want: Vec<usize> = (0..len).filter(|&j| lo[k] <= row[j] && row[j] <= hi[k]).collect();
                assert_eq!((a, b), (want.clone(), want), "length {len}, band {}..={}", lo[k], hi[k]);
            }
            let rows = len / W;
            let src = Lanes { data: &row, stride: W, offset: 0 };
            let lo2: [[i32; W]; MAX_TARGETS] = std::array::from_fn(|k| std::array::from_fn(|l| lo[(k + l) % 8]));
            let hi2: [[i32; W]; MAX_TARGETS] = std::array::from_fn(|k| std::array::from_fn(|l| hi[(k + l) % 8]));
            for n in [1, 2, 4, 8] {
                let c = count_lanes(src, 0..rows, n, &lo2, &hi2);
                assert_eq!(c, count_lanes_portable(src, 0..rows, n, &lo2, &hi2));
                for k in 0..n {
                    for l in 0..W {
                        let col = (0..rows).map(|r| row[r * W + l]);
                        assert_eq!(c[0][k][l], col.clone().filter(|&x| x > hi2[k][l]).count() as u32);
                        assert_eq!(c[1][k][l], col.filter(|&x| x >= lo2[k][l]).count() as u32);
                    }
                }
            }
            let lanes: [u16; MAX_TARGETS] = [0xffff, 0, 0x8001, 0x00f0, 0, 0x1234, 0xffff, 1];
            let (mut a, mut b) = (Vec::new(), Vec::new());
            band_lanes(src, rows, &lo2, &hi2, &lanes, |k, l, i| a.push((i, k, l)));
            band_lanes_portable(src, rows, &lo2, &hi2, &lanes, |k, l, i| b.push((i, k, l)));
            let mut want = Vec::new();
            for i in 0..rows {
                for k in 0..MAX_TARGETS {
                    for l in 0..W {
                        let x = row[i * W + l];
                        if lanes[k] & (1 << l) != 0 && lo2[k][l] <= x && x <= hi2[k][l] {
                            want.push((i, k, l));
                        }
                    }
                }
            }
            assert_eq!((a, b), (want.clone(), want), "length {len}");
        }
    }

    #[test]
    fn the_screen_steps_aside_where_it_cannot_bound() {
        let mut rng = Rng(3);
        let (im, mut cap) = (matrix(&mut rng, 20, 8, false), matrix(&mut rng, 30, 8, false));
        let i2t = requests(&mut rng, 20, 30, 4, false, 1);
        let t2i = requests(&mut rng, 30, 20, 3, false, 1);
        let lists = vec![(0..30).collect::<Vec<u32>>()];
        let ranges: Vec<Range<u32>> = std::iter::once(0..20).collect();
        assert!(rank(&im, &cap, &i2t, &t2i, &lists, &ranges).is_some());
        cap.data[5] = f32::INFINITY;
        assert!(rank(&im, &cap, &i2t, &t2i, &lists, &ranges).is_none(), "a non-finite value");
        let exact = if product::available() { Method::Tiles } else { Method::Matrix };
        let want = rank_with(exact, &im, &cap, &i2t, &t2i, &lists, &ranges);
        assert_eq!(rank_with(Method::Screen, &im, &cap, &i2t, &t2i, &lists, &ranges), want, "falls back to exact");
        let zero = Matrix::new(30, 8, vec![0.0; 240]);
        assert!(rank(&im, &zero, &i2t, &t2i, &lists, &ranges).is_none(), "all zero");
        // Every caption the same vector: every item of a query ties, all in every band.
        let same = Matrix::new(30, 8, (0..240).map(|i| (i % 8) as f32).collect());
        let exact: Vec<Request> = t2i.iter().map(|r| Request { need: Vec::new(), ..r.clone() }).collect();
        assert!(rank_limited(&im, &same, &i2t, &exact, &lists, &ranges, 100).is_none(), "past the band limit");
        assert!(rank_limited(&im, &same, &i2t, &exact, &lists, &ranges, 100_000).is_some());
    }
}
