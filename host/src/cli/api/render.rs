//! How answers are shown: tables and records for people, the answer's
//! `data` as JSON for scripts (`--json`), and writes that became proposals
//! with the approval to decide. Results go to standard output; notes (more
//! pages, what to run next) to standard error.

use serde_json::Value;

use crate::cli::client::Answer;

/// A column of a table: its title and the dotted path of its value in an
/// item (`progress.records`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Column<'a>(pub &'a str, pub &'a str);

/// The widest a table cell gets before it is cut.
const CELL: usize = 48;

/// Shows answers for people or for scripts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Printer {
    pub json: bool,
}

impl Printer {
    /// A page of a list (`{items, next_cursor}`) as a table.
    pub(crate) fn list(&self, data: &Value, columns: &[Column<'_>]) {
        if self.json {
            return self.print_json(data);
        }
        let empty = Vec::new();
        let items = data.get("items").and_then(Value::as_array).unwrap_or(&empty);
        if items.is_empty() {
            eprintln!("(none)");
        } else {
            print!("{}", table(items, columns));
        }
        if let Some(cursor) = data.get("next_cursor").and_then(Value::as_str) {
            eprintln!("more: repeat with --cursor {cursor}");
        }
    }

    /// One record, field by field (nested objects one level deep).
    pub(crate) fn record(&self, data: &Value) {
        if self.json {
            return self.print_json(data);
        }
        print!("{}", record(data));
    }

    /// The answer of a write: `done` for a write that ran (given its
    /// `data`), else the proposal it became.
    pub(crate) fn write(&self, answer: &Answer, done: impl FnOnce(&Value) -> String) {
        if let Some(approval) = answer.proposal() {
            let id = approval.get("approval_id").and_then(Value::as_str).unwrap_or("?");
            if self.json {
                self.print_json(&answer.data);
            } else {
                println!("Proposed, not run: approval {id} awaits a decision");
                println!("  {}", text(approval.get("summary").unwrap_or(&Value::Null)));
            }
            eprintln!("decide it with: service approvals approve {id} (or reject {id})");
            return;
        }
        if self.json {
            return self.print_json(&answer.data);
        }
        println!("{}", done(&answer.data));
    }

    pub(crate) fn print_json(&self, data: &Value) {
        println!("{}", serde_json::to_string_pretty(data).unwrap_or_default());
    }
}

/// The value at a dotted path.
pub(crate) fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, key| v.get(key).unwrap_or(&Value::Null))
}

/// The text at a dotted path (empty when absent).
pub(crate) fn text_at(v: &Value, path: &str) -> String {
    text(at(v, path))
}

/// A value as a person reads it: text as is, times to the second, lists
/// of plain values joined, anything else as compact JSON; absent is `-`.
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => match chrono::DateTime::parse_from_rfc3339(s) {
            Ok(t) => t.with_timezone(&chrono::Utc).format("%Y-%m-%d %H:%M:%S").to_string(),
            Err(_) => s.clone(),
        },
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            if items.is_empty() {
                "-".into()
            } else {
                items.iter().map(text).collect::<Vec<_>>().join(", ")
            }
        }
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

/// Cuts `s` to `max` characters, marking the cut.
fn cut(s: &str, max: usize) -> String {
    let s = s.replace(['\n', '\r', '\t'], " ");
    if s.chars().count() <= max { s } else { format!("{}…", s.chars().take(max - 1).collect::<String>()) }
}

/// Rows of `items` under the columns' titles, aligned.
pub(crate) fn table(items: &[Value], columns: &[Column<'_>]) -> String {
    let rows: Vec<Vec<String>> =
        items.iter().map(|item| columns.iter().map(|c| cut(&text_at(item, c.1), CELL)).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| rows.iter().map(|r| r[i].chars().count()).chain([c.0.len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(columns.iter().map(|c| c.0.to_owned()).collect());
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

/// `name: value` lines of an object's fields; an object's own fields are
/// shown as `name.field` one level down.
pub(crate) fn record(data: &Value) -> String {
    let Some(fields) = data.as_object() else { return text(data) + "\n" };
    let mut lines: Vec<(String, String)> = Vec::new();
    for (k, v) in fields {
        match v.as_object() {
            Some(inner) if !inner.is_empty() => {
                for (k2, v2) in inner {
                    lines.push((format!("{k}.{k2}"), text(v2)));
                }
            }
            _ => lines.push((k.clone(), text(v))),
        }
    }
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    lines.into_iter().map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:"))).collect()
}

/// A byte count as a person reads it (`1.5 MiB`).
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

/// A count with thousands separated (`12,345`).
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_cut_and_show_absent_values_as_dashes() {
        let items = [
            json!({ "id": "src_1", "name": "Newsletters", "created_at": "2026-11-24T18:21:41.123Z", "tags": ["a", "b"] }),
            json!({ "id": "src_22", "name": "x".repeat(60), "progress": { "records": 5 } }),
        ];
        let t = table(
            &items,
            &[
                Column("ID", "id"),
                Column("NAME", "name"),
                Column("RECORDS", "progress.records"),
                Column("CREATED", "created_at"),
                Column("TAGS", "tags"),
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], format!("ID      NAME{}  RECORDS  CREATED              TAGS", " ".repeat(44)));
        assert!(lines[1].starts_with("src_1   Newsletters "), "{t}");
        assert!(lines[1].ends_with("-        2026-11-24 18:21:41  a, b"), "{t}");
        assert!(lines[2].contains(&format!("{}…", "x".repeat(47))), "{t}");
        assert!(lines[2].contains("  5  "), "{t}");
    }

    #[test]
    fn records_open_one_level_and_numbers_read_well() {
        // Keys in alphabetical order, as the answer may or may not keep its own.
        let r = record(
            &json!({ "a_id": "src_1", "configuration": { "base_url": "https://m.example", "ids": [1, 2] }, "empty": {} }),
        );
        assert_eq!(
            r,
            "a_id:                   src_1\nconfiguration.base_url: https://m.example\nconfiguration.ids:      1, 2\nempty:                  {}\n"
        );
        assert_eq!(
            (count(0), count(999), count(1234), count(1_234_567)),
            ("0".into(), "999".into(), "1,234".into(), "1,234,567".into())
        );
        assert_eq!(
            (bytes(512), bytes(1536), bytes(3 * 1024 * 1024)),
            ("512 B".into(), "1.5 KiB".into(), "3.0 MiB".into())
        );
    }
}
