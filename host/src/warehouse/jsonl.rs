//! JSON-lines warehouses: one file per stream in the destination's folder,
//! each line a record with the metadata fields, appended and flushed per
//! batch.

use std::io::Write;

use super::shape::Shaped;

/// A batch's records as JSON lines: the record's fields as the provider
/// wrote them (bar reserved ones), then the metadata fields.
pub(super) fn lines(shaped: Vec<Shaped<'_>>, bytes: usize, now: i64, meta: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(bytes + shaped.len() * (96 + meta.len()));
    for record in shaped {
        out.push(b'{');
        for (name, raw) in record.fields.iter().filter(|(name, _)| !name.starts_with("_service_")) {
            serde_json::to_writer(&mut out, name.as_ref()).map_err(|e| e.to_string())?;
            out.push(b':');
            out.extend_from_slice(raw.get().as_bytes());
            out.push(b',');
        }
        let _ = write!(out, "\"_service_raw_id\":\"{}\",\"_service_extracted_at\":{now},\"_service_meta\":{meta}}}", record.raw_id);
        out.push(b'\n');
    }
    Ok(out)
}

/// Appends lines to the stream's file and makes them durable.
pub(super) fn append(dir: &cap_std::fs::Dir, table: &str, out: &[u8]) -> std::io::Result<()> {
    let mut options = cap_std::fs::OpenOptions::new();
    options.create(true).append(true);
    let mut file = dir.open_with(format!("{table}.jsonl"), &options)?;
    file.write_all(out)?;
    file.sync_data()
}
