//! Word statistics: document frequency (DF) over a caption set, the base vocabulary `V_base`,
//! and the top-`t` list that `RmTopFreq(t)` removes (spec §1.2).
//!
//! `Top_t` = the `t` candidate words with the largest DF, ties broken by word in byte order
//! ascending. Candidates are content words (alphabetical, not a stopword; spec §7 A1) or every
//! word (`raw`). Counts merge commutatively, so chunks can be counted in parallel in any order.

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::is_content_word;

/// Which words may enter a top-frequency list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Candidates {
    /// Alphabetical non-stopwords only, so `t` counts content words (recommended, §7 A1).
    #[default]
    Content,
    /// Every word, punctuation and stopwords included.
    Raw,
}

impl Candidates {
    pub fn admits(self, word: &str) -> bool {
        match self {
            Candidates::Content => is_content_word(word),
            Candidates::Raw => true,
        }
    }
}

/// Word counts over a set of captions: either occurrences or documents containing the word.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Counts {
    map: FxHashMap<Box<str>, u64>,
    /// Calls to [`Counts::add_occurrences`] and [`Counts::add_document`] (and what merged
    /// counts had): the captions counted, where each call is one caption.
    pub docs: u64,
}

impl Counts {
    /// Counts every occurrence (multiset), e.g. for a rank-frequency plot.
    pub fn add_occurrences<'a>(&mut self, words: impl IntoIterator<Item = &'a str>) {
        self.docs += 1;
        for w in words {
            self.bump(w, 1);
        }
    }

    /// Counts each distinct word of one caption once (document frequency).
    pub fn add_document(&mut self, words: &[&str]) {
        self.docs += 1;
        let mut distinct = words.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        for w in distinct {
            self.bump(w, 1);
        }
    }

    /// Adds `by` to `word`'s count (documents are counted by the caller).
    pub fn add(&mut self, word: &str, by: u64) {
        self.bump(word, by);
    }

    fn bump(&mut self, word: &str, by: u64) {
        if let Some(c) = self.map.get_mut(word) {
            *c += by;
        } else {
            self.map.insert(word.into(), by);
        }
    }

    pub fn merge(&mut self, other: Counts) {
        self.docs += other.docs;
        if self.map.is_empty() {
            self.map = other.map;
            return;
        }
        for (w, c) in other.map {
            *self.map.entry(w).or_insert(0) += c;
        }
    }

    pub fn get(&self, word: &str) -> u64 {
        self.map.get(word).copied().unwrap_or(0)
    }

    /// Number of distinct words.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.map.iter().map(|(w, c)| (&**w, *c))
    }

    /// The `t` admitted words with the largest count; ties by word, byte order ascending.
    pub fn top(&self, t: usize, candidates: Candidates) -> Vec<(String, u64)> {
        let mut all: Vec<(&str, u64)> = self.iter().filter(|(w, _)| candidates.admits(w)).collect();
        let by_rank = |a: &(&str, u64), b: &(&str, u64)| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0));
        if t < all.len() {
            all.select_nth_unstable_by(t, by_rank);
            all.truncate(t);
        }
        all.sort_unstable_by(by_rank);
        all.into_iter().map(|(w, c)| (w.to_owned(), c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn df(captions: &[&str]) -> Counts {
        let mut c = Counts::default();
        for cap in captions {
            let words: Vec<&str> = cap.split_whitespace().collect();
            c.add_document(&words);
        }
        c
    }

    #[test]
    fn document_frequency_counts_a_word_once_per_caption() {
        // Python: Counter(w for c in caps for w in set(c.split()))
        let c = df(&["dog dog park", "dog cat", "cat ."]);
        assert_eq!((c.get("dog"), c.get("cat"), c.get("park"), c.get(".")), (2, 2, 1, 1));
        assert_eq!(c.docs, 3);
    }

    #[test]
    fn top_breaks_ties_by_word_and_filters_candidates() {
        // DF: dog 2, cat 2, the 3, park 1, . 1  -> content words by (DF desc, word asc):
        // cat, dog, park. Raw: the, cat, dog, ., park ('.' < 'park' in byte order).
        let c = df(&["the dog park .", "the dog cat", "the cat"]);
        let content: Vec<String> = c.top(2, Candidates::Content).into_iter().map(|x| x.0).collect();
        assert_eq!(content, ["cat", "dog"]);
        let raw: Vec<String> = c.top(10, Candidates::Raw).into_iter().map(|x| x.0).collect();
        assert_eq!(raw, ["the", "cat", "dog", ".", "park"]);
        assert_eq!(c.top(0, Candidates::Raw).len(), 0);
    }

    #[test]
    fn merge_is_a_sum() {
        let mut a = df(&["dog cat"]);
        a.merge(df(&["dog"]));
        assert_eq!((a.get("dog"), a.get("cat"), a.docs), (2, 1, 2));
    }
}
