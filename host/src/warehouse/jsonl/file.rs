//! A stream's file, `{table}.jsonl`: lines appended under the file's lock,
//! read back by position or by key, and rewritten under the lock.
//!
//! Every append locks the file (an advisory lock, across processes), and
//! so does a rewrite, which writes the lines it keeps to a new file and
//! renames it over the old one: an append that waited for the lock finds
//! the name holding another file and appends to that one, so no line
//! appended during a rewrite is lost with the old file.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};

use cap_std::fs::MetadataExt;

/// A line read back.
pub(in crate::warehouse) type Row = serde_json::Map<String, serde_json::Value>;

/// The file's name.
fn name(table: &str) -> String {
    format!("{table}.jsonl")
}

/// The stream's file opened with `options` and locked, once the name
/// holds the file locked (a rewrite may have replaced it while this one
/// waited). `None` when there is no file and `options` create none.
fn locked(
    dir: &cap_std::fs::Dir,
    table: &str,
    options: &cap_std::fs::OpenOptions,
) -> std::io::Result<Option<std::fs::File>> {
    loop {
        let file = match dir.open_with(name(table), options) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let held = file.metadata()?;
        let file = file.into_std();
        file.lock()?;
        match dir.metadata(name(table)) {
            Ok(now) if (now.dev(), now.ino()) == (held.dev(), held.ino()) => return Ok(Some(file)),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Appends lines to the stream's file and makes them durable. A last line
/// a killed process left without its end (a write cut short) is ended
/// first, so the new lines are never glued to it.
pub(in crate::warehouse) fn append(dir: &cap_std::fs::Dir, table: &str, out: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut options = cap_std::fs::OpenOptions::new();
    options.create(true).append(true).read(true);
    let mut file = locked(dir, table, &options)?.ok_or_else(|| std::io::Error::other("the file vanished"))?;
    let len = file.metadata()?.len();
    let mut last = [b'\n'];
    if len > 0 {
        file.read_exact_at(&mut last, len - 1)?;
    }
    if last != [b'\n'] {
        file.write_all(b"\n")?;
    }
    file.write_all(out)?;
    file.sync_data()
}

/// Where a page of lines ended: the offset where its last line starts,
/// how many lines the reading kept up to it (that one too), and its key.
/// Written as `{offset}-{kept}-{key}` (a cursor of the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::warehouse) struct Position {
    offset: u64,
    kept: u64,
    key: String,
}

impl Position {
    /// The position a text of [`Position::to_string`] names; `None` for any
    /// other text (reading then starts at the first line).
    pub(in crate::warehouse) fn parse(text: &str) -> Option<Position> {
        let (offset, rest) = text.split_once('-')?;
        let (kept, key) = rest.split_once('-')?;
        let offset = offset.parse().ok().filter(|o| i64::try_from(*o).is_ok())?;
        Some(Position { offset, kept: kept.parse().ok()?, key: key.to_owned() })
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.offset, self.kept, self.key)
    }
}

/// Up to `limit` lines of the stream's file after `after` that `keep`
/// keeps, each parsed, with its position; from the first line when
/// `after` is `None`, and none when there is no file. A line that is no
/// JSON object (a write cut short) is never kept.
///
/// Reading resumes at the byte where the last page's line starts, so a
/// file is read once however many pages it takes. Another pipeline's
/// rewrite may have moved that line meanwhile (its own lines left out, or
/// made longer or shorter): the lines `keep` keeps are not its, so the
/// reading counts them from the first line again and resumes after as
/// many as it had kept. When those lines changed too (fewer are left, or
/// the one counted to holds another key), it starts over from the first
/// line: a line may come twice, none is passed over.
pub(in crate::warehouse) fn lines_after(
    dir: &cap_std::fs::Dir,
    table: &str,
    after: Option<&Position>,
    limit: usize,
    keep: impl Fn(&Row) -> bool,
) -> std::io::Result<Vec<(Position, Row)>> {
    use std::io::{Seek, SeekFrom};
    let mut file = match dir.open(name(table)) {
        Ok(file) => std::io::BufReader::new(file.into_std()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut line = Vec::new();
    let (mut offset, mut counted) = (0, 0);
    if let Some(after) = after {
        let read = match file.seek(SeekFrom::Start(after.offset)) {
            Ok(_) => file.read_until(b'\n', &mut line)?,
            Err(_) => 0,
        };
        if read > 0 && line_key(&line) == after.key {
            (offset, counted) = (after.offset + read as u64, after.kept);
        } else {
            file.seek(SeekFrom::Start(0))?;
            offset = resume_after(&mut file, after, &keep)?;
            counted = if offset == 0 { 0 } else { after.kept };
            file.seek(SeekFrom::Start(offset))?;
        }
    }
    let mut kept = Vec::new();
    while kept.len() < limit {
        line.clear();
        let read = file.read_until(b'\n', &mut line)?;
        if read == 0 {
            break;
        }
        let at = offset;
        offset += read as u64;
        if let Some(row) = kept_row(&line, &keep) {
            counted += 1;
            let key = line_key(&line).to_owned();
            kept.push((Position { offset: at, kept: counted, key }, row));
        }
    }
    Ok(kept)
}

/// A line parsed, if it is an object `keep` keeps.
fn kept_row(line: &[u8], keep: &impl Fn(&Row) -> bool) -> Option<Row> {
    serde_json::from_slice::<Row>(line).ok().filter(|row| keep(row))
}

/// The offset just past the line `after` names, found again as the
/// `after.kept`-th line `keep` keeps, counted from the first line; 0 (the
/// first line) when there are fewer, or that line is another (the kept
/// lines themselves changed).
fn resume_after(file: &mut impl BufRead, after: &Position, keep: &impl Fn(&Row) -> bool) -> std::io::Result<u64> {
    let (mut offset, mut counted) = (0, 0);
    let mut line = Vec::new();
    while counted < after.kept {
        line.clear();
        let read = file.read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(0);
        }
        offset += read as u64;
        if kept_row(&line, keep).is_some() {
            counted += 1;
        }
    }
    Ok(if line_key(&line) == after.key { offset } else { 0 })
}

/// [`key_of`] a line as read, with its end; empty for a line without one.
fn line_key(line: &[u8]) -> &str {
    std::str::from_utf8(line).ok().and_then(key_of).unwrap_or_default()
}

/// The key a line of ours ends with (its `_service_raw_id`), found without
/// parsing the line: keys are written last but two, and never escaped.
fn key_of(line: &str) -> Option<&str> {
    const KEY: &str = "\"_service_raw_id\":\"";
    let start = line.rfind(KEY)? + KEY.len();
    line[start..].split('"').next()
}

/// The last line of the stream's file with each of `keys` (a file keeps
/// every version of a key, the last is its row), by key. Reads the whole
/// file: the lines are told apart by their key before any is parsed.
pub(in crate::warehouse) fn lines_with_keys(
    dir: &cap_std::fs::Dir,
    table: &str,
    keys: &[String],
) -> std::io::Result<HashMap<String, Row>> {
    let wanted: HashSet<&str> = keys.iter().map(String::as_str).collect();
    let mut found = HashMap::new();
    if wanted.is_empty() {
        return Ok(found);
    }
    let file = match dir.open(name(table)) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line?;
        let Ok(text) = std::str::from_utf8(&line) else { continue };
        if let Some(key) = key_of(text).filter(|k| wanted.contains(k))
            && let Ok(row) = serde_json::from_str::<Row>(text)
        {
            found.insert(key.to_owned(), row);
        }
    }
    Ok(found)
}

/// What a rewrite did: lines changed, and lines left out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rewritten {
    pub(crate) changed: u64,
    pub(crate) removed: u64,
}

/// Rewrites the stream's file under its lock: each line `change` gives a
/// verdict on (parsed; `None` for a line that is no object) is left out
/// (`Some(None)`) or replaced by the row given (`Some(Some(row))`); every
/// other line stays as it was, in its place. The new file replaces the old
/// at once, durably; until then the old one stands whole.
pub(in crate::warehouse) fn rewrite(
    dir: &cap_std::fs::Dir,
    table: &str,
    mut change: impl FnMut(&Row) -> Option<Option<Row>>,
) -> std::io::Result<Rewritten> {
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true);
    let Some(file) = locked(dir, table, &options)? else { return Ok(Rewritten::default()) };
    let temporary = format!("{}.rewrite", name(table));
    let mut out = std::io::BufWriter::new(dir.create(&temporary)?.into_std());
    let mut done = Rewritten::default();
    for line in std::io::BufReader::new(&file).split(b'\n') {
        let line = line?;
        let verdict = serde_json::from_slice::<Row>(&line).ok().and_then(|row| change(&row));
        match verdict {
            None => {
                out.write_all(&line)?;
                out.write_all(b"\n")?;
            }
            Some(None) => done.removed += 1,
            Some(Some(row)) => {
                serde_json::to_writer(&mut out, &row)?;
                out.write_all(b"\n")?;
                done.changed += 1;
            }
        }
    }
    let out = out.into_inner().map_err(std::io::IntoInnerError::into_error)?;
    out.sync_all()?;
    dir.rename(&temporary, dir, name(table))?;
    dir.open(".")?.into_std().sync_all()?;
    drop(file);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> (tempfile::TempDir, cap_std::fs::Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = cap_std::fs::Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority()).unwrap();
        (tmp, dir)
    }

    fn line(key: &str, n: u64) -> String {
        format!("{{\"n\":{n},\"_service_raw_id\":\"{key}\",\"_service_extracted_at\":1,\"_service_meta\":{{}}}}\n")
    }

    /// A line's key is found without parsing it, and the last line of a
    /// key is its row.
    #[test]
    fn lines_are_found_by_their_last_key() {
        let (_tmp, dir) = folder();
        assert!(lines_with_keys(&dir, "t", &["a".into()]).unwrap().is_empty(), "no file");
        let text = [line("a", 1), line("b", 2), line("a", 3), "{\"cut".into()].concat();
        append(&dir, "t", text.as_bytes()).unwrap();
        let found = lines_with_keys(&dir, "t", &["a".into(), "c".into()]).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found["a"]["n"], 3);
        assert_eq!(key_of(r#"{"x":"\"_service_raw_id\":\"no","_service_raw_id":"yes","m":1}"#), Some("yes"));
    }

    /// Pages of lines follow each other from the byte where the last one
    /// ended; a rewrite between two pages that moves the lines (another
    /// pipeline's, left out) passes over none of them, and a page whose
    /// last line is gone starts over rather than skip any.
    #[test]
    fn pages_resume_where_they_ended_even_across_a_rewrite() {
        let (_tmp, dir) = folder();
        let n = |rows: &[(Position, Row)]| rows.iter().map(|(_, r)| r["n"].as_u64().unwrap()).collect::<Vec<_>>();
        let ours = |row: &Row| row["n"].as_u64().unwrap().is_multiple_of(2);
        let text: String = (1..=8).map(|i| line(&format!("k{i}"), i)).collect();
        append(&dir, "t", text.as_bytes()).unwrap();
        let first = lines_after(&dir, "t", None, 2, ours).unwrap();
        assert_eq!(n(&first), [2, 4]);
        let at = first[1].0.clone();
        assert_eq!(Position::parse(&at.to_string()), Some(at.clone()));
        assert_eq!(n(&lines_after(&dir, "t", Some(&at), 10, ours).unwrap()), [6, 8]);

        // Another pipeline's line before the position grows (a new
        // reason), so the page's last line starts later.
        rewrite(&dir, "t", |row| {
            (row["n"] == 1).then(|| {
                let mut row = row.clone();
                row.insert("reason".into(), "x".repeat(500).into());
                Some(row)
            })
        })
        .unwrap();
        assert_eq!(n(&lines_after(&dir, "t", Some(&at), 10, ours).unwrap()), [6, 8], "moved later");
        // Another pipeline's lines before and after the position go.
        rewrite(&dir, "t", |row| (!row["n"].as_u64().unwrap().is_multiple_of(2)).then_some(None)).unwrap();
        let next = lines_after(&dir, "t", Some(&at), 1, ours).unwrap();
        assert_eq!(n(&next), [6], "moved earlier: found again, nothing passed over");
        assert_eq!(n(&lines_after(&dir, "t", Some(&next[0].0), 10, ours).unwrap()), [8]);

        // The page's own last line gone: from the start again.
        rewrite(&dir, "t", |row| (row["n"] == 4).then_some(None)).unwrap();
        assert_eq!(n(&lines_after(&dir, "t", Some(&at), 10, ours).unwrap()), [2, 6, 8]);
        assert_eq!(Position::parse("12"), None, "a line number of before reads from the start");
        let far = Position::parse(&format!("{}-1-k2", u64::MAX));
        assert_eq!(far, None, "an offset no file reaches is no position");
        let beyond = Position { offset: i64::MAX as u64, kept: 1, key: "k2".into() };
        assert_eq!(n(&lines_after(&dir, "t", Some(&beyond), 10, ours).unwrap()), [6, 8], "found by counting");
    }

    /// A rewrite changes and leaves out the lines it is told to and keeps
    /// the rest as they were, in their places.
    #[test]
    fn a_rewrite_keeps_every_line_it_is_not_told_to_change() {
        let (tmp, dir) = folder();
        assert_eq!(rewrite(&dir, "t", |_| Some(None)).unwrap(), Rewritten::default(), "no file");
        let text = [line("a", 1), line("b", 2), "not json\n".into(), line("c", 3)].concat();
        append(&dir, "t", text.as_bytes()).unwrap();
        let done = rewrite(&dir, "t", |row| match row["n"].as_u64() {
            Some(1) => Some(None),
            Some(2) => {
                let mut row = row.clone();
                row.insert("n".into(), 20.into());
                Some(Some(row))
            }
            _ => None,
        })
        .unwrap();
        assert_eq!(done, Rewritten { changed: 1, removed: 1 });
        let text = std::fs::read_to_string(tmp.path().join("t.jsonl")).unwrap();
        let ns: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<Row>(l).map(|r| r["n"].to_string()).unwrap_or_else(|_| l.to_owned()))
            .collect();
        assert_eq!(ns, ["20", "not json", "3"], "{text}");
        assert!(!tmp.path().join("t.jsonl.rewrite").exists());
    }

    /// A last line a killed process left without its end (cut inside a
    /// character, even) is ended before the next lines are appended: they
    /// stay whole, and every read passes over the fragment.
    #[test]
    fn a_line_cut_short_is_ended_before_the_next_append() {
        let (tmp, dir) = folder();
        let mut torn = line("a", 1).into_bytes();
        torn.extend_from_slice(&"{\"n\":\"caf\u{e9}".as_bytes()[..10]);
        std::fs::write(tmp.path().join("t.jsonl"), &torn).unwrap();
        append(&dir, "t", line("b", 2).as_bytes()).unwrap();
        let read = lines_after(&dir, "t", None, 10, |_| true).unwrap();
        let ns: Vec<(u64, u64)> = read.iter().map(|(at, r)| (at.offset, r["n"].as_u64().unwrap())).collect();
        let second = torn.len() as u64 + 1;
        assert_eq!(ns, [(0, 1), (second, 2)], "the fragment, ended, is passed over");
        assert_eq!(lines_with_keys(&dir, "t", &["b".into()]).unwrap()["b"]["n"], 2);
        let done = rewrite(&dir, "t", |row| (row["n"] == 1).then_some(None)).unwrap();
        assert_eq!(done.removed, 1);
        let after = std::fs::read(tmp.path().join("t.jsonl")).unwrap();
        assert_eq!(after, [&torn[line("a", 1).len()..], b"\n", line("b", 2).as_bytes()].concat(), "kept as it was");
    }

    /// An append waits for the lock, and when the file it waited on was
    /// replaced meanwhile (as a rewrite replaces it), appends to the new
    /// one: its line is not lost with the old file.
    #[test]
    fn an_append_that_waited_for_a_rewrite_lands_in_the_new_file() {
        let (tmp, dir) = folder();
        append(&dir, "t", line("a", 1).as_bytes()).unwrap();
        let held = locked(&dir, "t", cap_std::fs::OpenOptions::new().read(true)).unwrap().unwrap();
        let appender = std::thread::spawn({
            let dir = dir.try_clone().unwrap();
            move || append(&dir, "t", line("c", 3).as_bytes()).unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!appender.is_finished(), "the append waits for the lock");
        std::fs::write(tmp.path().join("new"), line("b", 2)).unwrap();
        std::fs::rename(tmp.path().join("new"), tmp.path().join("t.jsonl")).unwrap();
        drop(held);
        appender.join().unwrap();
        let text = std::fs::read_to_string(tmp.path().join("t.jsonl")).unwrap();
        assert_eq!(text, [line("b", 2), line("c", 3)].concat());
    }
}
