//! Minimal SVG plots for reports (no plotting dependency, no fonts needed to write them):
//! a grouped histogram, a log–log rank–frequency plot and log-x line curves (recall@K), each
//! with axes, ticks and a legend.

use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
pub const COLORS: [&str; 4] = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"];

/// The plot's frame: its title, a smaller second line under it (`subtitle`, where not empty:
/// the settings that made the data) and the axis labels.
fn header(title: &str, subtitle: &str, xlabel: &str, ylabel: &str) -> String {
    let mut s = String::new();
    let title_y = if subtitle.is_empty() { 22.0 } else { 17.0 };
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="{title_y}" text-anchor="middle" font-size="15">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>
"#,
        W / 2.0,
        esc(title),
        LEFT + (W - LEFT - RIGHT) / 2.0,
        H - 12.0,
        esc(xlabel),
        TOP + (H - TOP - BOTTOM) / 2.0,
        esc(ylabel)
    );
    if !subtitle.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="33" text-anchor="middle" font-size="11" fill="#555">{}</text>"##,
            W / 2.0,
            esc(subtitle)
        );
    }
    s
}

/// A power of ten as an axis label: `1`, `10`, `100`, `1k` ... `100M`, then `1e9` ...
fn decade_label(d: i32) -> String {
    match d {
        0..=2 => 10u64.pow(d as u32).to_string(),
        3..=5 => format!("{}k", 10u64.pow(d as u32 - 3)),
        6..=8 => format!("{}M", 10u64.pow(d as u32 - 6)),
        _ => format!("1e{d}"),
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn legend(s: &mut String, labels: &[&str]) {
    for (i, l) in labels.iter().enumerate() {
        let y = TOP + 8.0 + 18.0 * i as f64;
        let x = W - RIGHT - 150.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/>"#,
            y - 10.0,
            COLORS[i % COLORS.len()]
        );
        let _ = writeln!(s, r#"<text x="{}" y="{y}">{}</text>"#, x + 18.0, esc(l));
    }
}

/// `what` in the middle of the plot area, for a plot with no data.
fn nothing_to_plot(s: &mut String, what: &str) {
    let (x, y) = (LEFT + (W - LEFT - RIGHT) / 2.0, TOP + (H - TOP - BOTTOM) / 2.0);
    let _ = writeln!(s, r##"<text x="{x}" y="{y}" text-anchor="middle" fill="#888">{}</text>"##, esc(what));
}

fn axes(s: &mut String) {
    let _ = writeln!(s, r#"<path d="M{LEFT},{TOP} V{} H{}" fill="none" stroke="black"/>"#, H - BOTTOM, W - RIGHT);
}

/// A "nice" tick step for a linear axis spanning `0..max` with about `n` ticks.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    mag * if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    }
}

/// Grouped histogram of `series` (counts per bin, bin i = i words), shown as fractions of each
/// series' total so series of different sizes compare. The last bin is labelled `last_label`.
/// Bars of the fraction of each series' counts per bin; `open_bin` is the bin that also counts
/// everything above it (labelled `N+`, and always labelled when drawn).
pub fn histogram(
    title: &str,
    subtitle: &str,
    xlabel: &str,
    series: &[(&str, &[u64])],
    open_bin: Option<usize>,
) -> String {
    let mut s = header(title, subtitle, xlabel, "fraction of captions");
    let bins = series.iter().map(|(_, c)| c.iter().rposition(|&v| v > 0).map_or(1, |p| p + 1)).max().unwrap_or(1);
    let fracs: Vec<Vec<f64>> = series
        .iter()
        .map(|(_, c)| {
            let tot: u64 = c.iter().sum();
            (0..bins).map(|i| if tot == 0 { 0.0 } else { *c.get(i).unwrap_or(&0) as f64 / tot as f64 }).collect()
        })
        .collect();
    let top = fracs.iter().flatten().cloned().fold(0.0, f64::max);
    // No caption at all: an axis from 0 to 1 and a word saying so, not ticks of 0.00. Else the
    // axis ends on the first tick above the tallest bar.
    let top = if top > 0.0 { top } else { 1.0 };
    if fracs.iter().flatten().all(|&f| f == 0.0) {
        nothing_to_plot(&mut s, "no captions");
    }
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let bw = pw / bins as f64;
    let step = nice_step(top * 1.05, 5.0);
    let ticks = (top * 1.05 / step).ceil() as usize;
    let ymax = step * ticks as f64;
    // Enough decimals to tell the ticks apart (a step of 0.005 needs three).
    let decimals = (-step.log10().floor()).max(2.0) as usize;
    for t in 0..=ticks {
        let y = step * t as f64;
        let py = TOP + ph * (1.0 - y / ymax);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{py}" y2="{py}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{:.*}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            decimals,
            y
        );
    }
    for (k, f) in fracs.iter().enumerate() {
        let w = bw * 0.8 / series.len() as f64;
        for (i, v) in f.iter().enumerate() {
            let x = LEFT + bw * i as f64 + bw * 0.1 + w * k as f64;
            let h = ph * v / ymax;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.2}" y="{:.2}" width="{w:.2}" height="{h:.2}" fill="{}"/>"#,
                TOP + ph - h,
                COLORS[k % COLORS.len()]
            );
        }
    }
    let tick = (nice_step(bins as f64, 12.0) as usize).max(1);
    let open = open_bin.filter(|&b| b < bins);
    // Regular ticks up to the open bin (one too close would overlap its label), then the open bin.
    let ticks = (0..bins).step_by(tick).filter(|&i| open.is_none_or(|b| i + tick / 2 < b));
    for i in ticks.chain(open) {
        let x = LEFT + bw * (i as f64 + 0.5);
        let label = if Some(i) == open { format!("{i}+") } else { i.to_string() };
        let _ =
            writeln!(s, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#, H - BOTTOM + 16.0, esc(&label));
    }
    axes(&mut s);
    legend(&mut s, &series.iter().map(|x| x.0).collect::<Vec<_>>());
    s.push_str("</svg>\n");
    s
}

/// Log–log rank–frequency plot: each series is a list of counts sorted descending. The count
/// axis starts at 0.5, so that words seen once are drawn above the axis, not on it.
pub fn rank_frequency(title: &str, subtitle: &str, series: &[(&str, &[u64])]) -> String {
    let mut s = header(title, subtitle, "word rank", "occurrences");
    let max_rank = series.iter().map(|(_, c)| c.len()).max().unwrap_or(1).max(2) as f64;
    let max_count = series.iter().flat_map(|(_, c)| c.first().copied()).max().unwrap_or(1).max(2) as f64;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let xmax = max_rank.log10().ceil().max(1.0);
    let ymax = max_count.log10().ceil().max(1.0);
    let ymin = 0.5f64.log10();
    let px = |rank: f64| LEFT + pw * rank.log10() / xmax;
    let py = |count: f64| TOP + ph * (1.0 - (count.log10() - ymin) / (ymax - ymin));
    if series.iter().all(|(_, c)| c.is_empty()) {
        nothing_to_plot(&mut s, "no words");
    }
    for d in 0..=xmax as i32 {
        let x = px(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{x}" x2="{x}" y1="{TOP}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            decade_label(d)
        );
    }
    for d in 0..=ymax as i32 {
        let y = py(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            decade_label(d)
        );
    }
    for (k, (_, counts)) in series.iter().enumerate() {
        let mut d = String::new();
        for (j, rank) in log_ranks(counts.len()).into_iter().enumerate() {
            let c = counts[rank - 1].max(1) as f64;
            let _ = write!(d, "{}{:.1},{:.1} ", if j == 0 { "M" } else { "L" }, px(rank as f64), py(c));
        }
        let _ = writeln!(s, r#"<path d="{d}" fill="none" stroke="{}" stroke-width="2"/>"#, COLORS[k % COLORS.len()]);
    }
    axes(&mut s);
    legend(&mut s, &series.iter().map(|x| x.0).collect::<Vec<_>>());
    s.push_str("</svg>\n");
    s
}

/// Lines over a log-scaled x axis (`x >= 1`) and a linear y axis from 0 to 1: recall@K curves.
/// Series with an even index are drawn solid, odd ones dashed, colours cycling per pair (an
/// i2t/t2i pair shares a colour).
pub fn log_x_lines(title: &str, xlabel: &str, ylabel: &str, series: &[(&str, Vec<(f64, f64)>)]) -> String {
    let mut s = header(title, "", xlabel, ylabel);
    let max_x = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)).fold(10.0, f64::max);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let xmax = max_x.log10().ceil().max(1.0);
    let px = |x: f64| LEFT + pw * x.max(1.0).log10() / xmax;
    let py = |y: f64| TOP + ph * (1.0 - y.clamp(0.0, 1.0));
    for d in 0..=xmax as i32 {
        let x = px(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{x}" x2="{x}" y1="{TOP}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            10u64.pow(d as u32)
        );
    }
    for t in 0..=5 {
        let v = t as f64 / 5.0;
        let y = py(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{v:.1}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0
        );
    }
    for (k, (label, points)) in series.iter().enumerate() {
        let mut d = String::new();
        for (j, &(x, y)) in points.iter().enumerate() {
            let _ = write!(d, "{}{:.1},{:.1} ", if j == 0 { "M" } else { "L" }, px(x), py(y));
        }
        let color = COLORS[(k / 2) % COLORS.len()];
        let dash = if k % 2 == 1 { r#" stroke-dasharray="6,4""# } else { "" };
        let _ = writeln!(s, r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#);
        let ly = TOP + ph - 12.0 - 18.0 * (series.len() - 1 - k) as f64;
        let lx = W - RIGHT - 150.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{}" y1="{}" y2="{}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{ly}">{}</text>"#,
            lx + 24.0,
            ly - 4.0,
            ly - 4.0,
            lx + 30.0,
            esc(label)
        );
    }
    axes(&mut s);
    s.push_str("</svg>\n");
    s
}

/// 1-based ranks spaced evenly in log scale (about 40 per decade), always including 1 and `n`.
pub fn log_ranks(n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let mut r = 1.0f64;
    while (r as usize) < n {
        let ri = r as usize;
        if out.last() != Some(&ri) {
            out.push(ri);
        }
        r *= 10f64.powf(1.0 / 40.0);
    }
    out.push(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_svg_with_one_shape_per_bar_and_series() {
        let h = histogram("t", "", "words", &[("before", &[0, 2, 2]), ("after", &[0, 4])], Some(2));
        assert!(h.starts_with("<svg") && h.trim_end().ends_with("</svg>"));
        assert_eq!(h.matches("<rect x=").count(), 2 * 3 + 2, "3 bins x 2 series + 2 legend boxes");
        assert!(h.contains(">2+</text>") && h.contains(">1</text>"), "{h}");
        let r = rank_frequency("t", "", &[("a", &[100, 10, 1])]);
        assert_eq!(r.matches("<path d=\"M").count(), 2, "one series line + the axes");
        let c = log_x_lines("t", "K", "recall", &[("a", vec![(1.0, 0.5), (100.0, 1.0)]), ("b", vec![(1.0, 0.2)])]);
        assert!(c.trim_end().ends_with("</svg>"));
        assert_eq!(c.matches("<path d=\"M").count(), 3, "two series lines + the axes");
    }

    #[test]
    fn plots_of_nothing_say_so() {
        let h = histogram("t", "", "words", &[("before", &[]), ("after", &[0, 0])], Some(64));
        assert!(h.contains(">no captions</text>"), "{h}");
        assert!(h.contains(">1.00</text>") && h.matches(">0.00</text>").count() == 1, "an axis from 0 to 1: {h}");
        let r = rank_frequency("t", "", &[("before", &[]), ("after", &[])]);
        assert!(r.contains(">no words</text>"), "{r}");
        // With data, no such note.
        assert!(!histogram("t", "", "words", &[("before", &[1, 2])], None).contains("no captions"));
    }

    #[test]
    fn only_the_open_bin_is_labelled_n_plus() {
        let label = |counts: &[u64]| {
            let h = histogram("t", "", "words", &[("a", counts)], Some(64));
            h.matches("+</text>").count()
        };
        // Captions of at most 30 words: no bar is the open bin.
        let mut short = vec![1u64; 31];
        assert_eq!(label(&short), 0);
        // A caption of 64 words or more: the open bin is drawn and labelled `64+`, once.
        short.resize(65, 0);
        short[64] = 1;
        let h = histogram("t", "", "words", &[("a", &short)], Some(64));
        assert_eq!(h.matches(">64+</text>").count(), 1, "{h}");
        assert_eq!(label(&short), 1);
    }

    #[test]
    fn axes_reach_past_the_data_and_say_their_numbers_plainly() {
        // Three captions of 8, 10 and 11 words: bars of 1/3; the count axis ends at a tick
        // above them (it ended at 0.30).
        let mut counts = vec![0u64; 12];
        (counts[8], counts[10], counts[11]) = (1, 1, 1);
        let h = histogram("t", "mostly: Keep(4)", "words", &[("a", &counts)], Some(64));
        assert!(h.contains(">0.40</text>") && !h.contains(">0.50</text>"), "{h}");
        assert!(h.contains(">mostly: Keep(4)</text>"), "the subtitle: {h}");
        // 64 bins of 1/64: ticks 0.005 apart, labelled with three decimals.
        let flat = histogram("t", "", "words", &[("a", &[1u64; 64])], Some(64));
        assert!(flat.contains(">0.005</text>") && flat.contains(">0.020</text>"), "{flat}");
        // Counts of 1 are drawn above the axis line (y = H - BOTTOM), ranks and counts labelled
        // 1, 10, 100, 1k.
        let mut words = vec![2000u64, 100, 10];
        words.extend([1; 997]);
        let r = rank_frequency("t", "", &[("a", &words)]);
        let last = r.split("<path d=\"").nth(1).unwrap().split('"').next().unwrap();
        let y: f64 = last.trim().rsplit(',').next().unwrap().parse().unwrap();
        assert!(y < H - BOTTOM - 20.0, "a count of 1 at y {y}");
        for label in [">1</text>", ">10</text>", ">100</text>", ">1k</text>"] {
            assert!(r.contains(label), "{label}: {r}");
        }
        assert!(!r.contains(">1e"), "{r}");
        assert_eq!((decade_label(6), decade_label(9)), ("1M".to_owned(), "1e9".to_owned()));
    }

    #[test]
    fn log_ranks_cover_the_range() {
        let r = log_ranks(1000);
        assert_eq!((r[0], *r.last().unwrap()), (1, 1000));
        assert!(r.windows(2).all(|w| w[0] < w[1]) && r.len() < 200);
        assert_eq!(log_ranks(1), vec![1]);
    }
}
