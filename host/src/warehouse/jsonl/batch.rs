//! JSON-lines batches: each record a line with the metadata fields
//! (appending them is [`super::file`]'s).

use std::io::Write;

use crate::warehouse::WriteError;
use crate::warehouse::shape::Shaped;

/// What a line adds to its record's text (`bytes` in all) besides the
/// key and the metadata: the metadata fields' names and punctuation
/// ([`lines`] writes the record's own fields in no more bytes than the
/// record took), the extraction time's digits at most (20, `i64::MIN`),
/// and the line's end. A line takes exactly this much more than a compact
/// record at the longest time, and less otherwise.
const LINE_OVERHEAD: usize = r#""_service_raw_id":"","_service_extracted_at":,"_service_meta":}"#.len() + 20 + 1;

/// A batch's records as JSON lines: the record's fields as the provider
/// wrote them (bar reserved ones), then the metadata fields. Sized once,
/// for at most what the batch takes: growing a buffer of megabytes copies
/// it into memory the kernel must first clear.
pub(in crate::warehouse) fn lines(
    shaped: Vec<Shaped<'_>>,
    bytes: usize,
    now: i64,
    meta: &str,
) -> Result<Vec<u8>, WriteError> {
    let capacity = bytes + shaped.iter().map(|r| r.raw_id.len() + meta.len() + LINE_OVERHEAD).sum::<usize>();
    let mut out = Vec::with_capacity(capacity);
    for record in shaped {
        out.push(b'{');
        for (name, raw) in record.fields.iter().filter(|(name, _)| !name.starts_with("_service_")) {
            serde_json::to_writer(&mut out, name.as_ref()).map_err(|e| WriteError::BadRecord(e.to_string()))?;
            out.push(b':');
            out.extend_from_slice(raw.get().as_bytes());
            out.push(b',');
        }
        let _ = write!(
            out,
            "\"_service_raw_id\":\"{}\",\"_service_extracted_at\":{},\"_service_meta\":{meta}}}",
            record.raw_id,
            record.read_at.unwrap_or(now)
        );
        out.push(b'\n');
    }
    debug_assert!(out.len() <= capacity, "{} bytes of lines in room for {capacity}", out.len());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pipelines::StreamSyncMode;
    use crate::warehouse::shape::shape;

    /// Every line is its record with the metadata fields: keys of both
    /// kinds, the longest times, a read time of a record's own, records with spaces and escapes that are
    /// written back shorter, and reserved fields replaced. A batch fits the
    /// room [`lines`] sized for it (its `debug_assert` fails otherwise).
    #[test]
    fn lines_are_the_records_with_their_metadata_in_the_room_sized_for_them() {
        let records = [
            r#"{}"#,
            r#"{"id":1}"#,
            r#"{ "id" : "k\n2" , "b" : [1, 2] , "c" : {"d": null} }"#,
            r#"{"id":3,"\u00e9t\u00e9":"x","\/":"y","_service_meta":"theirs"}"#,
        ];
        let meta = r#"{"pipeline_id":"p","stream":"s"}"#;
        let bytes = records.iter().map(|r| r.len()).sum();
        for mode in [StreamSyncMode::IncrementalAppend, StreamSyncMode::IncrementalDeduped] {
            for now in [0, 1_700_000_000_000, i64::MIN] {
                let mut shaped =
                    records.iter().map(|r| shape(r, mode, &["id".to_owned()])).collect::<Result<Vec<_>, _>>().unwrap();
                // A replayed record keeps the time it was read.
                shaped[1].read_at = Some(42);
                let keys: Vec<String> = shaped.iter().map(|s| s.raw_id.clone()).collect();
                let out = lines(shaped, bytes, now, meta).unwrap();
                assert!(!String::from_utf8_lossy(&out).contains("theirs"), "a record's own reserved field is dropped");
                let parsed: Vec<serde_json::Value> = out
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(|l| serde_json::from_slice(l).unwrap())
                    .collect();
                assert_eq!(parsed.len(), records.len(), "a line per record");
                for (i, (line, key)) in parsed.iter().zip(&keys).enumerate() {
                    assert_eq!(line["_service_raw_id"], key.as_str());
                    assert_eq!(line["_service_extracted_at"], if i == 1 { 42 } else { now });
                    assert_eq!(line["_service_meta"]["stream"], "s");
                }
                assert_eq!(parsed[2]["id"], "k\n2");
                assert_eq!(parsed[2]["c"]["d"], serde_json::Value::Null);
                assert_eq!((parsed[3]["été"].as_str(), parsed[3]["/"].as_str()), (Some("x"), Some("y")));
            }
        }
    }

    /// The room is no smaller than a line: a compact record at the longest
    /// time takes exactly its text, its key, the metadata and
    /// [`LINE_OVERHEAD`], with either kind of key.
    #[test]
    fn a_compact_record_at_the_longest_time_takes_exactly_the_room_of_its_line() {
        let meta = r#"{"pipeline_id":"p","stream":"s"}"#;
        for record in [r#"{"id":1}"#, r#"{"id":"a","n":[1,{"m":null}],"t":"x"}"#] {
            for mode in [StreamSyncMode::IncrementalAppend, StreamSyncMode::IncrementalDeduped] {
                let shaped = shape(record, mode, &["id".to_owned()]).unwrap();
                let room = record.len() + shaped.raw_id.len() + meta.len() + LINE_OVERHEAD;
                let out = lines(vec![shaped], record.len(), i64::MIN, meta).unwrap();
                assert_eq!(out.len(), room, "{}", String::from_utf8_lossy(&out));
            }
        }
    }
}
