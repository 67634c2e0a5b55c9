//! Rows a stream's contract kept aside in a lakehouse, read back: the
//! table beside the stream's (`<stream>__rejected`) only appends, so a
//! record kept aside again (by a retry that read it again, by a later
//! sync) adds a row under the same rejection. Readers take one row per
//! pipeline and rejection: the one kept aside last (by `rejected_at`,
//! then by when the row was written).

use std::collections::HashMap;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use futures_util::TryStreamExt as _;
use iceberg::table::Table;
use serde_json::{Map, Value};

use super::super::WriteError;
use super::super::contract::REJECTION_ID;

/// The column a row's pipeline and stream are told apart by.
const META: &str = "_service_meta";
/// When a row was written.
const WRITTEN_AT: &str = "_service_extracted_at";
/// When its record was kept aside.
const REJECTED_AT: &str = "rejected_at";

/// One rejected row: the pipeline and stream it belongs to (its
/// `_service_meta`, as written) and its columns, as text (as a
/// database gives them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AsideRow {
    pub meta: String,
    pub fields: Map<String, Value>,
}

impl AsideRow {
    /// The rejection the row keeps aside.
    pub(crate) fn rejection(&self) -> &str {
        self.fields.get(REJECTION_ID).and_then(Value::as_str).unwrap_or_default()
    }
}

/// Which of a table's rejected rows a read takes: up to `limit` of
/// pipeline and stream `meta`'s (its `_service_meta`), after rejection
/// `after`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Page<'a> {
    pub meta: &'a str,
    pub after: &'a str,
    pub limit: usize,
}

/// Every rejected row of `table` as of its current snapshot, one per
/// pipeline and rejection, each with `columns` (and the rejection), in
/// the order of their rejections. A table with no column of rejections
/// holds no rejected rows: refused.
pub(crate) async fn read(table: &Table, columns: &[&str]) -> Result<Vec<AsideRow>, WriteError> {
    read_where(table, columns, None).await
}

/// A page of `table`'s rejected rows, as [`read`] gives them, read in two
/// scans whose row filter drops the rows of other pipelines and of
/// rejections up to the cursor before their records are read: the
/// rejections alone first, to find the page's last, then the page's rows
/// with `columns`. A page holds no more than its own rows' records in
/// memory, however large the table.
pub(crate) async fn read_page(table: &Table, columns: &[&str], page: Page<'_>) -> Result<Vec<AsideRow>, WriteError> {
    use iceberg::expr::Reference;
    use iceberg::spec::Datum;
    if page.limit == 0 {
        return Ok(Vec::new());
    }
    let after = Reference::new(META)
        .equal_to(Datum::string(page.meta))
        .and(Reference::new(REJECTION_ID).greater_than(Datum::string(page.after)));
    let ours = |row: &AsideRow| row.meta == page.meta && row.rejection() > page.after;
    let rejections = read_where(table, &[], Some(after.clone())).await?;
    let first: Vec<&str> = rejections.iter().filter(|r| ours(r)).map(AsideRow::rejection).take(page.limit).collect();
    let Some(last) = first.last().map(|id| (*id).to_owned()) else { return Ok(Vec::new()) };
    let within = after.and(Reference::new(REJECTION_ID).less_than_or_equal_to(Datum::string(&last)));
    let rows = read_where(table, columns, Some(within)).await?;
    Ok(rows.into_iter().filter(|r| ours(r) && r.rejection() <= last.as_str()).take(page.limit).collect())
}

/// [`read`] of the rows `filter` keeps (`None`: all of them).
async fn read_where(
    table: &Table,
    columns: &[&str],
    filter: Option<iceberg::expr::Predicate>,
) -> Result<Vec<AsideRow>, WriteError> {
    let failed = |e: iceberg::Error| WriteError::Destination(format!("cannot read {}: {e}", table.identifier().name()));
    let schema = table.metadata().current_schema();
    if schema.field_by_name(REJECTION_ID).is_none() {
        return Err(WriteError::Refused(format!(
            "{} holds no rejected rows: a lakehouse's tables are read back only for those",
            table.identifier().name()
        )));
    }
    let mut wanted: Vec<&str> = vec![META, WRITTEN_AT, REJECTION_ID];
    wanted.extend(columns.iter().copied().filter(|c| schema.field_by_name(c).is_some()));
    if schema.field_by_name(REJECTED_AT).is_some() {
        wanted.push(REJECTED_AT);
    }
    // In the table's order: a scan's batches name the columns selected
    // in another order wrongly (iceberg 0.10).
    let position = |c: &str| schema.as_struct().fields().iter().position(|f| f.name == c);
    wanted.sort_by_key(|c| position(c));
    wanted.dedup();
    let mut scan = table.scan().select(wanted.iter().copied());
    if let Some(filter) = filter {
        scan = scan.with_filter(filter);
    }
    let scan = scan.build().map_err(failed)?;
    let batches: Vec<RecordBatch> = scan.to_arrow().await.map_err(failed)?.try_collect().await.map_err(failed)?;
    // The last kept aside of each pipeline's rejection, by when.
    let mut latest: HashMap<(String, String), (String, i64, AsideRow)> = HashMap::new();
    for batch in &batches {
        for row in 0..batch.num_rows() {
            let mut fields = Map::new();
            for name in columns.iter().chain([&REJECTION_ID]) {
                let value = batch.column_by_name(name).map_or(Ok(Value::Null), |c| text(c.as_ref(), row))?;
                fields.insert((*name).to_owned(), value);
            }
            let meta = batch.column_by_name(META).map_or(Ok(Value::Null), |c| text(c.as_ref(), row))?;
            let meta = meta.as_str().unwrap_or_default().to_owned();
            let rejected_at = batch.column_by_name(REJECTED_AT).map_or(Ok(Value::Null), |c| text(c.as_ref(), row))?;
            let rejected_at = rejected_at.as_str().unwrap_or_default().to_owned();
            let written_at = batch
                .column_by_name(WRITTEN_AT)
                .and_then(|c| c.as_primitive_opt::<TimestampMicrosecondType>().map(|a| a.value(row)))
                .unwrap_or_default();
            let row = AsideRow { meta: meta.clone(), fields };
            let key = (meta, row.rejection().to_owned());
            match latest.get(&key) {
                Some((at, written, _)) if (at, *written) > (&rejected_at, written_at) => {}
                _ => {
                    latest.insert(key, (rejected_at, written_at, row));
                }
            }
        }
    }
    let mut rows: Vec<AsideRow> = latest.into_values().map(|(_, _, row)| row).collect();
    rows.sort_by(|a, b| (a.rejection(), &a.meta).cmp(&(b.rejection(), &b.meta)));
    Ok(rows)
}

/// A cell as text, as a database gives it: text as it is, numbers
/// written out, null as null.
fn text(column: &dyn Array, row: usize) -> Result<Value, WriteError> {
    if column.is_null(row) {
        return Ok(Value::Null);
    }
    let value = match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().value(row).to_owned(),
        DataType::LargeUtf8 => column.as_string::<i64>().value(row).to_owned(),
        DataType::Utf8View => column.as_string_view().value(row).to_owned(),
        DataType::Int64 => column.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::Int32 => column.as_primitive::<Int32Type>().value(row).to_string(),
        other => {
            return Err(WriteError::Destination(format!("a rejected row's column of type {other} cannot be read")));
        }
    };
    Ok(Value::String(value))
}
