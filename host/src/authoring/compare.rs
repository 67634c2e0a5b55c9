//! What a replay returned against what the cassette expects, as readable
//! line diffs per file.

use std::collections::BTreeSet;

use serde_json::Value;

use super::cassette::{Observations, stream_file};

/// One file whose expectation the replay did not meet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Difference {
    /// The file in the cassette, e.g. `streams/posts.jsonl`.
    pub file: String,
    /// The diff: `-` expected, `+` replayed, two lines of context.
    pub diff: String,
}

/// Lines of diff shown per file at most.
const SHOWN: usize = 40;
/// Characters of a line shown at most.
const WIDTH: usize = 240;

/// Every file where `observed` differs from `expected`.
pub(crate) fn differences(expected: &Observations, observed: &Observations) -> Vec<Difference> {
    let mut found = Vec::new();
    for ((file, want), (_, got)) in expected.files().into_iter().zip(observed.files()) {
        if want != got {
            let lines = |v: Option<&Value>| match v {
                Some(v) => serde_json::to_string_pretty(v).unwrap_or_default().lines().map(str::to_owned).collect(),
                None => vec!["(no such call)".to_owned()],
            };
            found.push(Difference { file: file.to_owned(), diff: render(&lines(want), &lines(got)) });
        }
    }
    let names: BTreeSet<&String> = expected.streams.keys().chain(observed.streams.keys()).collect();
    for name in names {
        let lines = |v: Option<&Vec<Value>>| match v {
            Some(lines) => lines.iter().map(|l| serde_json::to_string(l).unwrap_or_default()).collect(),
            None => vec!["(stream not read)".to_owned()],
        };
        let (want, got) = (lines(expected.streams.get(name)), lines(observed.streams.get(name)));
        if want != got {
            found.push(Difference { file: format!("streams/{}", stream_file(name)), diff: render(&want, &got) });
        }
    }
    found
}

/// One step of an edit script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Same(usize, usize),
    Removed(usize),
    Added(usize),
}

/// The edit script from `a` to `b`: common ends trimmed, the middle by
/// longest common subsequence when it is small enough, replaced whole
/// otherwise.
fn script(a: &[String], b: &[String]) -> Vec<Step> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suffix = a[prefix..].iter().rev().zip(b[prefix..].iter().rev()).take_while(|(x, y)| x == y).count();
    let (mid_a, mid_b) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut steps: Vec<Step> = (0..prefix).map(|i| Step::Same(i, i)).collect();
    if mid_a.len().saturating_mul(mid_b.len()) <= 1_000_000 {
        // lcs[i][j]: the longest common subsequence of mid_a[i..], mid_b[j..].
        let (n, m) = (mid_a.len(), mid_b.len());
        let mut lcs = vec![vec![0u32; m + 1]; n + 1];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                lcs[i][j] = if mid_a[i] == mid_b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n || j < m {
            if i < n && j < m && mid_a[i] == mid_b[j] {
                steps.push(Step::Same(prefix + i, prefix + j));
                i += 1;
                j += 1;
            } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
                steps.push(Step::Removed(prefix + i));
                i += 1;
            } else {
                steps.push(Step::Added(prefix + j));
                j += 1;
            }
        }
    } else {
        steps.extend((0..mid_a.len()).map(|i| Step::Removed(prefix + i)));
        steps.extend((0..mid_b.len()).map(|j| Step::Added(prefix + j)));
    }
    steps.extend((0..suffix).map(|k| Step::Same(a.len() - suffix + k, b.len() - suffix + k)));
    steps
}

/// The diff of `a` (expected) and `b` (replayed), with line numbers of
/// `a` and at most [`SHOWN`] changed lines.
fn render(a: &[String], b: &[String]) -> String {
    let steps = script(a, b);
    let changed: Vec<usize> =
        steps.iter().enumerate().filter(|(_, s)| !matches!(s, Step::Same(..))).map(|(i, _)| i).collect();
    let near = |i: usize| changed.iter().any(|c| c.abs_diff(i) <= 2);
    let clip = |line: &str| {
        if line.chars().count() > WIDTH {
            format!("{}…", line.chars().take(WIDTH).collect::<String>())
        } else {
            line.to_owned()
        }
    };
    let mut out = String::new();
    let mut shown = 0;
    let mut last: Option<usize> = None;
    for (i, step) in steps.iter().enumerate() {
        if !near(i) {
            continue;
        }
        if last.is_none_or(|l| l + 1 != i) {
            let line = match *step {
                Step::Same(x, _) | Step::Removed(x) => x + 1,
                Step::Added(y) => y + 1,
            };
            out.push_str(&format!("  @@ line {line} @@\n"));
        }
        last = Some(i);
        match *step {
            Step::Same(x, _) => out.push_str(&format!("    {}\n", clip(&a[x]))),
            Step::Removed(x) => {
                shown += 1;
                out.push_str(&format!("  - {}\n", clip(&a[x])));
            }
            Step::Added(y) => {
                shown += 1;
                out.push_str(&format!("  + {}\n", clip(&b[y])));
            }
        }
        if shown >= SHOWN {
            let rest = changed.len().saturating_sub(shown);
            if rest > 0 {
                out.push_str(&format!("  ... and {rest} more changed line(s)\n"));
            }
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(text: &str) -> Vec<String> {
        text.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn a_changed_line_shows_as_removed_and_added_with_context() {
        let diff = render(&lines("a b c d e f g"), &lines("a b c X e f g"));
        assert_eq!(diff, "  @@ line 2 @@\n    b\n    c\n  - d\n  + X\n    e\n    f\n");
    }

    #[test]
    fn a_missing_tail_is_shown_as_removed() {
        let diff = render(&lines("1 2 3 4"), &lines("1 2"));
        assert!(diff.contains("  - 3\n  - 4\n"), "{diff}");
    }

    #[test]
    fn equal_observations_have_no_differences() {
        let mut a = Observations { check: Some(json!({ "ok": { "ok": true } })), ..Default::default() };
        a.streams.insert("s".into(), vec![json!({ "record": { "id": 1 } }), json!({ "end": "complete" })]);
        assert!(differences(&a, &a.clone()).is_empty());
        let mut b = a.clone();
        b.streams.get_mut("s").unwrap()[0] = json!({ "record": { "id": 2 } });
        b.check = None;
        let found = differences(&a, &b);
        assert_eq!(found.iter().map(|d| d.file.as_str()).collect::<Vec<_>>(), vec!["check.json", "streams/s.jsonl"]);
        assert!(found[0].diff.contains("+ (no such call)"), "{}", found[0].diff);
    }
}
