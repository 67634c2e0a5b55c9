//! `POST /reverse-etl/prepare`: a model's columns and sample rows, a
//! suggested primary key and, for a destination, suggested mappings.
//! Nothing is created.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::mapping::suggest;
use super::model::PREVIEW_ROWS;
use super::targets::Target;
use crate::error::ApiResult;
use crate::state::AppState;
use crate::store::reverse_etl::{FieldMapping, RetlDestination};
use crate::warehouse::query::Column;

/// What a model would give.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Preview {
    pub columns: Vec<Column>,
    /// Up to 100 rows, each an object of column to value. A value larger
    /// than the preview's cell size (64 KiB unless the operator set
    /// another) is shown as `{"$service_oversize": <bytes>}`.
    #[schema(value_type = Vec<Object>)]
    pub sample_rows: Vec<Value>,
    /// How many values were replaced by their size.
    pub oversize_values: u64,
    /// Whether rows were left out to keep the answer within its size
    /// (4 MiB unless the operator set another).
    pub sample_truncated: bool,
    /// A column whose sampled values are all present and distinct.
    pub suggested_primary_key: Option<String>,
    /// The destination's writable fields, when a destination was given
    /// (absent for a webhook, which takes any field).
    pub destination_fields: Option<Vec<String>>,
    /// The field the destination matches records by.
    pub match_field: Option<String>,
    /// Each destination field with the column of the same name.
    pub suggested_mappings: Vec<FieldMapping>,
}

/// Runs the model for a preview.
pub(crate) async fn preview(
    state: &AppState,
    workspace_id: &str,
    warehouse_id: &str,
    query: &str,
    destination: Option<&RetlDestination>,
) -> ApiResult<Preview> {
    let mut rows =
        super::model::open(state, workspace_id, warehouse_id, query, super::model::preview_bounds(state)).await?;
    let budget = state.config.limits.reverse_etl.preview_response_bytes;
    let mut sample: Vec<Vec<Value>> = Vec::new();
    let (mut bytes, mut sample_truncated) = (0usize, false);
    // Stops at the preview's rows whatever the query does to its LIMIT,
    // and at the answer's size.
    'reading: while sample.len() < PREVIEW_ROWS as usize {
        let Some(batch) = rows.next_batch().await.map_err(super::model::query_error)? else { break };
        for row in batch {
            let size: usize = row.iter().map(|v| serde_json::to_string(v).map_or(0, |t| t.len())).sum();
            if bytes + size > budget {
                sample_truncated = true;
                break 'reading;
            }
            bytes += size;
            sample.push(row);
        }
    }
    let mut columns = rows.columns.clone();
    drop(rows);
    sample.truncate(PREVIEW_ROWS as usize);
    let oversize_values =
        sample.iter().flatten().filter(|v| crate::warehouse::query::oversize(v).is_some()).count() as u64;
    for (i, c) in columns.iter_mut().enumerate() {
        if c.type_name.is_empty() || c.type_name.eq_ignore_ascii_case("NULL") {
            c.type_name = sample.iter().find_map(|r| r.get(i).and_then(json_type)).unwrap_or("null").to_owned();
        }
    }
    let suggested_primary_key = columns
        .iter()
        .enumerate()
        .find(|(i, _)| {
            let values: Vec<&Value> = sample.iter().filter_map(|r| r.get(*i)).collect();
            !values.is_empty()
                && values.iter().all(|v| !v.is_null())
                && values.iter().map(|v| v.to_string()).collect::<std::collections::HashSet<_>>().len() == values.len()
        })
        .map(|(_, c)| c.name.clone());
    let sample_rows = sample
        .iter()
        .map(|r| Value::Object(columns.iter().zip(r).map(|(c, v)| (c.name.clone(), v.clone())).collect()))
        .collect();
    let (mut destination_fields, mut match_field, mut suggested_mappings) = (None, None, Vec::new());
    if let Some(d) = destination {
        let target = Target::open(state, workspace_id, d).await?;
        match_field = target.match_field().map(str::to_owned);
        if let Some(fields) = target.fields() {
            suggested_mappings = suggest(fields, &columns);
            destination_fields = Some(fields.to_vec());
        } else {
            suggested_mappings = columns
                .iter()
                .map(|c| FieldMapping { field: c.name.clone(), column: Some(c.name.clone()), value: None })
                .collect();
        }
    }
    Ok(Preview {
        columns,
        sample_rows,
        oversize_values,
        sample_truncated,
        suggested_primary_key,
        destination_fields,
        match_field,
        suggested_mappings,
    })
}

fn json_type(v: &Value) -> Option<&'static str> {
    match v {
        Value::Null => None,
        Value::Bool(_) => Some("boolean"),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some("integer"),
        Value::Number(_) => Some("real"),
        Value::String(_) => Some("text"),
        _ => Some("json"),
    }
}
