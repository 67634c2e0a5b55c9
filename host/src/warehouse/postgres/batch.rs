//! PostgreSQL batches: rows in the binary `COPY` format, copied straight in
//! or through a staging table when keys may exist already.

use std::borrow::Cow;

use crate::warehouse::shape::Row;
use crate::warehouse::{METADATA_COLUMNS, WriteError};

/// Appends one field of a `COPY ... (FORMAT binary)` row: its length and
/// its bytes, or length -1 for NULL. Binary rather than text: the server
/// takes each value as it comes instead of scanning every byte twice for
/// line ends, delimiters and escapes, which was most of its CPU time per
/// row (about 1 KB each). A NUL character is refused: PostgreSQL text
/// cannot hold one, and retrying would fail the same way.
pub(in crate::warehouse) fn copy_field(out: &mut Vec<u8>, value: Option<&str>) -> Result<(), WriteError> {
    let Some(value) = value.map(str::as_bytes) else {
        out.extend_from_slice(&(-1i32).to_be_bytes());
        return Ok(());
    };
    if memchr::memchr(0, value).is_some() {
        return Err(WriteError::BadRecord(
            "a record holds a NUL character (\\u0000), which PostgreSQL text cannot store".into(),
        ));
    }
    let len = i32::try_from(value.len())
        .map_err(|_| WriteError::BadRecord("a value is larger than PostgreSQL allows".into()))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// The signature, flags and header extension length that open binary
/// `COPY` data.
pub(in crate::warehouse) const COPY_BINARY_HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// Rows in `COPY ... (FORMAT binary)` form, for the columns `names`: the
/// key, the extraction time (`BIGINT`), the metadata, then the fields (all
/// `TEXT`).
pub(in crate::warehouse) fn copy_data(
    names: &[String],
    rows: &[Row<'_>],
    now: i64,
    meta: &str,
) -> Result<Vec<u8>, WriteError> {
    let count = i16::try_from(names.len())
        .map_err(|_| WriteError::BadRecord("a record has more fields than a PostgreSQL table can hold".into()))?;
    let size = |v: &Option<Cow<'_, str>>| 4 + v.as_ref().map_or(0, |c| c.len());
    let mut data = Vec::with_capacity(
        COPY_BINARY_HEADER.len()
            + 2
            + rows
                .iter()
                .map(|row| 2 + 4 + row.key.len() + 12 + 4 + meta.len() + row.values.iter().map(size).sum::<usize>())
                .sum::<usize>(),
    );
    data.extend_from_slice(COPY_BINARY_HEADER);
    for row in rows {
        data.extend_from_slice(&count.to_be_bytes());
        copy_field(&mut data, Some(&row.key))?;
        data.extend_from_slice(&8i32.to_be_bytes());
        data.extend_from_slice(&row.read_at.unwrap_or(now).to_be_bytes());
        copy_field(&mut data, Some(meta))?;
        for j in 0..names.len() - METADATA_COLUMNS.len() {
            copy_field(&mut data, row.values.get(j).and_then(|v| v.as_deref()))?;
        }
    }
    // The trailer: a row of -1 fields.
    data.extend_from_slice(&(-1i16).to_be_bytes());
    Ok(data)
}

/// `COPY` data in one format or the other.
pub(in crate::warehouse) enum CopyData {
    Binary(Vec<u8>),
    Text(Vec<u8>),
}

/// Rewrites binary `COPY` data made by [`copy_data`] in `COPY ... (FORMAT
/// text)` form: tab-separated, `\N` for NULL, with backslash, tab, newline
/// and carriage return escaped, and the extraction time (the second field)
/// as a decimal number.
pub(in crate::warehouse) fn copy_text_from_binary(data: &[u8]) -> Result<Vec<u8>, WriteError> {
    let corrupt = || WriteError::Destination("the prepared batch is corrupt".into());
    let mut at = COPY_BINARY_HEADER.len();
    let mut take = |n: usize| -> Result<&[u8], WriteError> {
        let bytes: &[u8] = data.get(at..at + n).ok_or_else(corrupt)?;
        at += n;
        Ok(bytes)
    };
    let mut out = Vec::with_capacity(data.len());
    loop {
        let fields = i16::from_be_bytes(take(2)?.try_into().map_err(|_| corrupt())?);
        if fields < 0 {
            return Ok(out);
        }
        for i in 0..fields {
            if i > 0 {
                out.push(b'\t');
            }
            let len = i32::from_be_bytes(take(4)?.try_into().map_err(|_| corrupt())?);
            let Ok(len) = usize::try_from(len) else {
                out.extend_from_slice(b"\\N");
                continue;
            };
            let value = take(len)?;
            if i == 1 {
                let ms = i64::from_be_bytes(value.try_into().map_err(|_| corrupt())?);
                out.extend_from_slice(ms.to_string().as_bytes());
                continue;
            }
            let mut copied = 0;
            for (j, b) in value.iter().enumerate() {
                let escaped: &[u8] = match b {
                    b'\\' => b"\\\\",
                    b'\t' => b"\\t",
                    b'\n' => b"\\n",
                    b'\r' => b"\\r",
                    _ => continue,
                };
                out.extend_from_slice(&value[copied..j]);
                out.extend_from_slice(escaped);
                copied = j + 1;
            }
            out.extend_from_slice(&value[copied..]);
        }
        out.push(b'\n');
    }
}

/// One PostgreSQL transaction: `COPY` the rows in, into a staging table
/// first when they must upsert. Returns the rows PostgreSQL stored (copied
/// in, or inserted and updated by the upsert).
pub(in crate::warehouse) async fn copy_rows(
    pool: &sqlx::PgPool,
    target: &str,
    names: &[String],
    upsert: Option<&str>,
    data: CopyData,
) -> Result<u64, sqlx::Error> {
    let columns = names.join(", ");
    let mut tx = pool.begin().await?;
    let into = match upsert {
        Some(_) => {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE TEMP TABLE \"_service_staging\" (LIKE {target}) ON COMMIT DROP"
            )))
            .execute(&mut *tx)
            .await?;
            "\"_service_staging\"".to_owned()
        }
        None => target.to_owned(),
    };
    let (format, data) = match data {
        CopyData::Binary(data) => ("binary", data),
        CopyData::Text(data) => ("text", data),
    };
    let mut copy = tx.copy_in_raw(&format!("COPY {into} ({columns}) FROM STDIN (FORMAT {format})")).await?;
    copy.send(data).await?;
    let mut stored = copy.finish().await?;
    if let Some(upsert) = upsert {
        let sql = format!("INSERT INTO {target} ({columns}) SELECT {columns} FROM \"_service_staging\"{upsert}");
        stored = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *tx).await?.rows_affected();
    }
    tx.commit().await?;
    Ok(stored)
}

/// Writes a batch with `COPY` (binary, or text into columns someone gave
/// another type: JSONB, say, takes text, which the server converts, and
/// binary it would refuse), finishing with `upsert` when keys may exist;
/// the rows stored.
pub(crate) async fn apply(
    pool: &sqlx::PgPool,
    table: &str,
    names: &[String],
    upsert: Option<&str>,
    data: Vec<u8>,
    binary: bool,
) -> Result<u64, WriteError> {
    let data = if binary { CopyData::Binary(data) } else { CopyData::Text(copy_text_from_binary(&data)?) };
    copy_rows(pool, &crate::warehouse::quote(table), names, upsert, data)
        .await
        .map_err(|e| WriteError::Destination(format!("cannot write to {table}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::warehouse::quote;
    #[test]
    fn copy_rows_are_length_prefixed_fields_between_a_header_and_a_trailer() {
        let names: Vec<String> =
            ["_service_raw_id", "_service_extracted_at", "_service_meta", "a", "b"].iter().map(|n| quote(n)).collect();
        let rows = vec![Row { key: "k".into(), read_at: None, values: vec![Some("a\tb\\".into()), None] }];
        let data = copy_data(&names, &rows, 258, "{}").unwrap();
        let mut expected = b"PGCOPY\n\xff\r\n\0".to_vec();
        expected.extend_from_slice(&[0; 8]); // no flags, no header extension
        expected.extend_from_slice(&[0, 5]); // five fields
        expected.extend_from_slice(&[0, 0, 0, 1, b'k']);
        expected.extend_from_slice(&[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 1, 2]); // BIGINT 258
        expected.extend_from_slice(&[0, 0, 0, 2, b'{', b'}']);
        expected.extend_from_slice(&[0, 0, 0, 4, b'a', b'\t', b'b', b'\\']); // as it is, nothing escaped
        expected.extend_from_slice(&[0xff; 4]); // NULL
        expected.extend_from_slice(&[0xff; 2]); // the trailer
        assert_eq!(data, expected);
    }

    #[test]
    fn binary_copy_rows_convert_to_the_text_format_for_typed_columns() {
        let names: Vec<String> = ["_service_raw_id", "_service_extracted_at", "_service_meta", "a", "b", "c"]
            .iter()
            .map(|n| quote(n))
            .collect();
        let rows = vec![
            Row {
                key: "k1".into(),
                read_at: None,
                values: vec![Some("tab\there, newline\n, cr\r, backslash\\".into()), None, Some(r#"{"n":1}"#.into())],
            },
            // A replayed row keeps the time it was read.
            Row { key: "k2".into(), read_at: Some(42), values: vec![Some("plain".into())] },
        ];
        let text = copy_text_from_binary(&copy_data(&names, &rows, 1_700_000_000_123, "{}").unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "k1\t1700000000123\t{}\ttab\\there, newline\\n, cr\\r, backslash\\\\\t\\N\t{\"n\":1}\n\
             k2\t42\t{}\tplain\t\\N\t\\N\n"
        );
        assert!(
            copy_text_from_binary(&copy_data(&names, &rows, 0, "{}").unwrap()[..40]).is_err(),
            "cut short: refused, not misread"
        );
    }
}
