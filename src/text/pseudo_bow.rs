//! Pseudo-BoW word ranking ("A Fistful of Words" §3, spec `bow-and-otter.md` §3 steps 4–7).
//! The words of the `k·c` captions retrieved for one uncaptioned image are counted and ranked
//! with one of four strategies, and the first `p` make its pseudo-caption.
//!
//! - Words: §1.1 tokenisation, then RmStopNalpha (§7 A5). With a stemmer, words are counted by
//!   stem and shown as the stem's most frequent surface form in `S_a` (ties: byte order).
//! - `cnt(w, NN_i)`: how many of the retrieved captions contain `w`, each retrieval counted
//!   (the same caption retrieved twice counts twice); `cnt(w, S_a)`: document frequency of `w`
//!   over the whole aligned set; `Top_t(S_a)`: the `t` words of largest `cnt(w, S_a)`, ties by
//!   word (§1.2's rule; 1000 in the paper), among content words or, with `raw` candidates, all
//!   words (a stopword in `Top_t` then takes a place and removes nothing, as in `RmTopFreq`).
//! - Order (first = best), ties always broken by `cnt(w, NN_i)` desc, then `cnt(w, S_a)` asc,
//!   then word asc:
//!   `max_count` — `cnt(w, NN_i)` desc over all words; `rm_top_max_count` — the same without
//!   `Top_t`; `rm_top_rand` — a uniformly random order (seeded per image) without `Top_t`;
//!   `weighted_count` — `cnt(w, NN_i) / cnt(w, S_a)` desc, compared exactly (cross products).

use std::cmp::Ordering;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::vocab::Candidates;
use super::{is_content_word, lowercase, Stemmer, Tokenizer};
use crate::rng::RowRng;

/// How the candidate words of one image are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    MaxCount,
    RmTopMaxCount,
    RmTopRand,
    WeightedCount,
}

impl Strategy {
    pub const ALL: [Strategy; 4] =
        [Strategy::MaxCount, Strategy::RmTopMaxCount, Strategy::RmTopRand, Strategy::WeightedCount];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::MaxCount => "max_count",
            Strategy::RmTopMaxCount => "rm_top_max_count",
            Strategy::RmTopRand => "rm_top_rand",
            Strategy::WeightedCount => "weighted_count",
        }
    }

    /// Whether the strategy leaves out the `Top_t(S_a)` words.
    pub fn removes_top(self) -> bool {
        matches!(self, Strategy::RmTopMaxCount | Strategy::RmTopRand)
    }
}

/// The content words of every aligned caption, interned, with the statistics the strategies
/// need. Word ids are assigned in first-seen order; nothing depends on them but lookups.
#[derive(Debug, Default)]
pub struct PoolWords {
    /// Caption `i`'s distinct words are `ids[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<usize>,
    ids: Vec<u32>,
    /// Match form (the word, or its stem) per id: what is counted and compared.
    keys: Vec<Box<str>>,
    /// What a pseudo-caption shows per id (the word; with a stemmer, its most frequent form).
    surface: Vec<Box<str>>,
    /// `cnt(w, S_a)` per id.
    df: Vec<u64>,
    /// Whether the id is in `Top_t(S_a)`.
    top: Vec<bool>,
}

impl PoolWords {
    /// Counts the words of `captions` (the aligned set, intact) and marks the `top_t` most
    /// frequent.
    pub fn build<'a>(
        captions: impl IntoIterator<Item = &'a str>,
        tokenizer: Tokenizer,
        stemmer: Option<&Stemmer>,
        top_t: usize,
        candidates: Candidates,
    ) -> PoolWords {
        let mut p = PoolWords { offsets: vec![0], ..Default::default() };
        let mut index: FxHashMap<Box<str>, u32> = FxHashMap::default();
        // With a stemmer: occurrences of each (stem id, surface form).
        let mut forms: FxHashMap<(u32, Box<str>), u64> = FxHashMap::default();
        // `raw` candidates: the DF of the match forms no content word has (stopwords,
        // punctuation, numbers), which compete for `Top_t` without ever being pseudo-words.
        let mut other_df: FxHashMap<Box<str>, u64> = FxHashMap::default();
        let mut other_keys: Vec<Box<str>> = Vec::new();
        let mut caption_ids = Vec::new();
        for caption in captions {
            let lowered = lowercase(caption);
            let mut words = Vec::new();
            tokenizer.split_into(&lowered, &mut words);
            caption_ids.clear();
            for &w in words.iter().filter(|w| is_content_word(w)) {
                let key = match stemmer {
                    Some(s) => s.stem(w),
                    None => w.into(),
                };
                let id = match index.get(key.as_ref()) {
                    Some(&id) => id,
                    None => {
                        let id = p.keys.len() as u32;
                        index.insert(key.as_ref().into(), id);
                        p.keys.push(key.as_ref().into());
                        p.df.push(0);
                        id
                    }
                };
                if stemmer.is_some() {
                    *forms.entry((id, w.into())).or_insert(0) += 1;
                }
                caption_ids.push(id);
            }
            caption_ids.sort_unstable();
            caption_ids.dedup();
            for &id in &caption_ids {
                p.df[id as usize] += 1;
            }
            if candidates == Candidates::Raw {
                other_keys.clear();
                for &w in words.iter().filter(|w| !is_content_word(w)) {
                    other_keys.push(match stemmer {
                        Some(s) => s.stem(w).as_ref().into(),
                        None => w.into(),
                    });
                }
                other_keys.sort_unstable();
                other_keys.dedup();
                // Counted here only where no content word of this caption has the same form:
                // a caption counts once per form.
                for k in &other_keys {
                    let held = index.get(&**k).is_some_and(|id| caption_ids.binary_search(id).is_ok());
                    if !held {
                        *other_df.entry(k.clone()).or_insert(0) += 1;
                    }
                }
            }
            p.ids.extend_from_slice(&caption_ids);
            p.offsets.push(p.ids.len());
        }
        p.surface = if stemmer.is_some() {
            let mut best: Vec<Option<(u64, Box<str>)>> = vec![None; p.keys.len()];
            for ((id, form), n) in forms {
                let slot = &mut best[id as usize];
                let better = match slot {
                    None => true,
                    Some((m, f)) => n > *m || (n == *m && form < *f),
                };
                if better {
                    *slot = Some((n, form));
                }
            }
            best.into_iter().map(|b| b.expect("every stem has a form").1).collect()
        } else {
            p.keys.clone()
        };
        // Top_t over the candidates' match forms: DF descending, then the form in byte order
        // (§1.2). A form both a content word and another word have (a stopword sharing a
        // stem) is one candidate, its DF counted over the captions holding either.
        let mut ranked: Vec<(u64, &str, Option<u32>)> =
            (0..p.keys.len() as u32).map(|id| (p.df[id as usize], &*p.keys[id as usize], Some(id))).collect();
        if candidates == Candidates::Raw {
            for r in ranked.iter_mut() {
                r.0 += other_df.get(r.1).copied().unwrap_or(0);
            }
            ranked.extend(other_df.iter().filter(|(k, _)| !index.contains_key(&***k)).map(|(k, &n)| (n, &**k, None)));
        }
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let top: Vec<u32> = ranked.iter().take(top_t).filter_map(|r| r.2).collect();
        p.top = vec![false; p.keys.len()];
        for id in top {
            p.top[id as usize] = true;
        }
        p
    }

    /// Number of captions counted.
    pub fn captions(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Distinct words (or stems).
    pub fn vocabulary(&self) -> usize {
        self.keys.len()
    }

    /// The distinct word ids of caption `i`.
    pub fn caption_words(&self, i: usize) -> &[u32] {
        &self.ids[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The word a pseudo-caption shows for `id`.
    pub fn surface(&self, id: u32) -> &str {
        &self.surface[id as usize]
    }

    /// `cnt(w, S_a)`.
    pub fn df(&self, id: u32) -> u64 {
        self.df[id as usize]
    }

    pub fn is_top(&self, id: u32) -> bool {
        self.top[id as usize]
    }

    /// `(word id, cnt(w, NN_i))` for the retrieved captions `neighbors` (pool rows, with
    /// repeats), sorted by word id.
    pub fn count_neighbors(&self, neighbors: &[u32]) -> Vec<(u32, u32)> {
        let mut all: Vec<u32> = neighbors.iter().flat_map(|&n| self.caption_words(n as usize)).copied().collect();
        all.sort_unstable();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for id in all {
            match out.last_mut() {
                Some((last, n)) if *last == id => *n += 1,
                _ => out.push((id, 1)),
            }
        }
        out
    }

    /// The candidate words of one image ranked by `strategy`, best first (all of them: the
    /// caller keeps `p`). `rng` orders `rm_top_rand`; it is not used by the other strategies.
    pub fn rank(&self, counts: &[(u32, u32)], strategy: Strategy, rng: &mut RowRng) -> Vec<RankedWord> {
        let mut out: Vec<RankedWord> = counts
            .iter()
            .filter(|(id, _)| !(strategy.removes_top() && self.is_top(*id)))
            .map(|&(id, count)| {
                let pool_count = self.df(id);
                let score = match strategy {
                    Strategy::WeightedCount => count as f64 / pool_count as f64,
                    _ => count as f64,
                };
                RankedWord { id, count, pool_count, score }
            })
            .collect();
        // The spec's tie-break, shared by every strategy.
        let ties = |a: &RankedWord, b: &RankedWord| {
            b.count
                .cmp(&a.count)
                .then(a.pool_count.cmp(&b.pool_count))
                .then_with(|| self.keys[a.id as usize].cmp(&self.keys[b.id as usize]))
        };
        match strategy {
            Strategy::MaxCount | Strategy::RmTopMaxCount => out.sort_unstable_by(ties),
            Strategy::WeightedCount => out.sort_unstable_by(|a, b| weighted_desc(a, b).then_with(|| ties(a, b))),
            Strategy::RmTopRand => {
                // A fixed starting order (the tie order), then a seeded Fisher–Yates shuffle.
                out.sort_unstable_by(ties);
                rng.shuffle(&mut out);
            }
        }
        out
    }
}

/// `a.count / a.pool_count` against `b`'s, larger first, exactly (`u128` cross products).
fn weighted_desc(a: &RankedWord, b: &RankedWord) -> Ordering {
    let lhs = a.count as u128 * b.pool_count as u128;
    let rhs = b.count as u128 * a.pool_count as u128;
    rhs.cmp(&lhs)
}

/// One ranked candidate word of an image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankedWord {
    pub id: u32,
    /// `cnt(w, NN_i)`.
    pub count: u32,
    /// `cnt(w, S_a)`.
    pub pool_count: u64,
    /// What the strategy ranks by: `cnt(w, NN_i)`, or `cnt(w, NN_i) / cnt(w, S_a)` for
    /// `weighted_count` (`rm_top_rand` keeps `cnt(w, NN_i)` and orders at random).
    pub score: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The aligned set of the hand-computed cases below.
    ///
    /// cnt(w, S_a): dog 4, red 3, ball 2, park 2, cat 1, grass 1, frisbee 1 (`a`, `the`, `on`
    /// are stopwords; `.` and `3d` are not alphabetical).
    const POOL: [&str; 6] = [
        "a dog on the grass .",        // 0: dog grass
        "the red dog with a red ball", // 1: red dog ball (red once per caption)
        "red cat",                     // 2: red cat
        "dog in the park",             // 3: dog park
        "a dog and a frisbee 3d",      // 4: dog frisbee
        "red ball in the park",        // 5: red ball park
    ];

    fn pool(top_t: usize) -> PoolWords {
        PoolWords::build(POOL, Tokenizer::default(), None, top_t, Candidates::Content)
    }

    fn words(p: &PoolWords, r: &[RankedWord]) -> Vec<String> {
        r.iter().map(|w| p.surface(w.id).to_owned()).collect()
    }

    fn rank(p: &PoolWords, neighbors: &[u32], s: Strategy) -> Vec<RankedWord> {
        p.rank(&p.count_neighbors(neighbors), s, &mut RowRng::new(0, "t", "img"))
    }

    #[test]
    fn pool_statistics_are_document_frequencies_of_content_words() {
        let p = pool(2);
        assert_eq!(p.captions(), 6);
        assert_eq!(p.vocabulary(), 7);
        let df = |w: &str| (0..p.vocabulary() as u32).find(|&i| p.surface(i) == w).map(|i| p.df(i));
        assert_eq!(df("dog"), Some(4));
        assert_eq!(df("red"), Some(3));
        assert_eq!(df("ball"), Some(2));
        assert_eq!(df("the"), None);
        assert_eq!(df("3d"), None);
        // Top_2: dog (4), red (3).
        let top: Vec<&str> = (0..7).filter(|&i| p.is_top(i)).map(|i| p.surface(i)).collect();
        assert_eq!(top.len(), 2);
        assert!(top.contains(&"dog") && top.contains(&"red"));
    }

    #[test]
    fn neighbours_are_counted_with_multiplicity() {
        let p = pool(0);
        // Captions 1, 1, 5: red 3, ball 3, dog 2, park 1.
        let c = p.count_neighbors(&[1, 1, 5]);
        let named: Vec<(&str, u32)> = c.iter().map(|&(id, n)| (p.surface(id), n)).collect();
        for (w, n) in [("red", 3), ("ball", 3), ("dog", 2), ("park", 1)] {
            assert!(named.contains(&(w, n)), "{w}: {named:?}");
        }
        assert_eq!(named.len(), 4);
    }

    #[test]
    fn max_count_breaks_ties_by_pool_count_then_word() {
        let p = pool(0);
        // Neighbours 1, 1, 5: red 3 (df 3), ball 3 (df 2), dog 2, park 1.
        // red and ball tie on 3; ball has the smaller cnt(w, S_a) and comes first.
        let r = rank(&p, &[1, 1, 5], Strategy::MaxCount);
        assert_eq!(words(&p, &r), ["ball", "red", "dog", "park"]);
        assert_eq!(r[0].score, 3.0);
        // Neighbours 0, 4: dog 2, then grass and frisbee (1 each, both df 1): word order.
        let r = rank(&p, &[0, 4], Strategy::MaxCount);
        assert_eq!(words(&p, &r), ["dog", "frisbee", "grass"]);
    }

    #[test]
    fn rm_top_max_count_drops_the_top_words() {
        let p = pool(2); // Top_2 = dog, red
        let r = rank(&p, &[1, 1, 5], Strategy::RmTopMaxCount);
        assert_eq!(words(&p, &r), ["ball", "park"]);
        // Only top words retrieved: no candidate left.
        assert!(rank(&p, &[2, 2], Strategy::RmTopMaxCount).iter().all(|w| p.surface(w.id) == "cat"));
    }

    #[test]
    fn weighted_count_demotes_frequent_words() {
        let p = pool(0);
        // Neighbours 1, 3, 5: red 2/3, dog 2/4, ball 2/2, park 2/2.
        // ball = park = 1 (tie on count 2 and df 2: word order), then red 0.667, dog 0.5.
        let r = rank(&p, &[1, 3, 5], Strategy::WeightedCount);
        assert_eq!(words(&p, &r), ["ball", "park", "red", "dog"]);
        assert_eq!(r[2].score, 2.0 / 3.0);
        // Equal ratios with different counts: cat 1/1 vs ball 2/2 — the higher count first.
        let r = rank(&p, &[2, 1, 5], Strategy::WeightedCount);
        // red 3/3 = 1, ball 2/2 = 1, cat 1/1 = 1, dog 1/4, park 1/2.
        assert_eq!(words(&p, &r), ["red", "ball", "cat", "park", "dog"]);
    }

    #[test]
    fn rm_top_rand_is_a_seeded_permutation_of_the_non_top_words() {
        // df: alpha 3, bravo 2, the rest 1; Top_1 = alpha.
        let pool = ["alpha bravo charlie delta echo foxtrot golf hotel", "alpha", "alpha", "bravo"];
        let p = PoolWords::build(pool, Tokenizer::default(), None, 1, Candidates::Content);
        let counts = p.count_neighbors(&[0]);
        let draw = |id: &str| words(&p, &p.rank(&counts, Strategy::RmTopRand, &mut RowRng::new(0, "pseudo_bow", id)));
        let a = draw("img1");
        assert_eq!(a, draw("img1"), "same image, same order");
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, ["bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"], "alpha is Top_1");
        assert!((2..40).any(|i| draw(&format!("img{i}")) != a), "other images get other orders");
    }

    #[test]
    fn stems_are_counted_together_and_shown_in_their_most_frequent_form() {
        let stemmer = Stemmer::english();
        let p = PoolWords::build(
            ["dogs running", "dog runs", "dogs"],
            Tokenizer::default(),
            Some(&stemmer),
            0,
            Candidates::Content,
        );
        let r = rank(&p, &[0, 1, 2], Strategy::MaxCount);
        // dog(s): 3 captions, shown as "dogs" (2 occurrences vs 1); run: 2, forms tie 1-1 ->
        // byte order: "running" < "runs".
        assert_eq!(words(&p, &r), ["dogs", "running"]);
        assert_eq!(r[0].count, 3);
    }
    #[test]
    fn raw_candidates_let_stopwords_take_places_in_top_t() {
        // Raw document frequencies of POOL: dog 4, the 4, a 3, red 3, ball 2, in 2, park 2, ...
        // Ranked (ties by word): dog, the, a, red, ball, in, park.
        let raw = |t: usize| PoolWords::build(POOL, Tokenizer::default(), None, t, Candidates::Raw);
        let top = |p: &PoolWords| -> Vec<String> {
            let mut w: Vec<String> =
                (0..p.vocabulary() as u32).filter(|&id| p.is_top(id)).map(|id| p.surface(id).to_owned()).collect();
            w.sort();
            w
        };
        assert_eq!(top(&raw(3)), ["dog"]);
        assert_eq!(top(&raw(4)), ["dog", "red"]);
        assert_eq!(top(&raw(6)), ["ball", "dog", "red"]);
        assert_eq!(top(&raw(7)), ["ball", "dog", "park", "red"]);
        // Content candidates: the same t takes more content words.
        assert_eq!(top(&pool(3)), ["ball", "dog", "red"]);
        // The words and their DFs are those of content candidates: only Top_t differs.
        let (a, b) = (pool(3), raw(3));
        assert_eq!((a.vocabulary(), a.captions()), (b.vocabulary(), b.captions()));
        assert!((0..a.vocabulary() as u32).all(|id| a.df(id) == b.df(id)));

        // With a stemmer a stopword can share a content word's stem ("having" and "haves" are
        // both `have`): the form counts each caption holding either once. Content only: fun 3,
        // have 2; raw: have 4 (captions 0, 1, 2, 5), fun 3.
        let stemmer = Stemmer::english();
        let pool = ["haves", "having fun", "having haves", "fun", "fun", "having"];
        let build = |c| PoolWords::build(pool, Tokenizer::default(), Some(&stemmer), 1, c);
        assert_eq!(top(&build(Candidates::Content)), ["fun"]);
        assert_eq!(top(&build(Candidates::Raw)), ["haves"]);
        // A caption holding both forms counts once: have 2, fun 3 (counted twice, have would be 4).
        let pool = ["having haves", "having haves", "fun", "fun", "fun"];
        let p = PoolWords::build(pool, Tokenizer::default(), Some(&stemmer), 1, Candidates::Raw);
        assert_eq!(top(&p), ["fun"]);
    }
}
