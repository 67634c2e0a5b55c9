//! `preview`: the metrics of the most recently sent campaigns, sanitised for
//! display.
//!
//! One request, `GET /campaigns?filter[status]=sent&sort=-sent&per_page=10`,
//! and this answer:
//!
//! ```json
//! {
//!   "campaigns": [
//!     { "campaign_id": "<uuid>", "name": "...", "status": "sent",
//!       "sent_at": "...", "metrics": { "sent": 1000, "delivered": 980, ... } }
//!   ],
//!   "totals": { "sent": ..., "delivered": ..., ..., "complaint_rate": ... },
//!   "field_coverage": { "sent": "provided", "delivered": "derived",
//!                       "complaints": "not_provided", ... },
//!   "attribution_required": ["website_sessions", "website_conversions", "revenue", "orders"]
//! }
//! ```
//!
//! `metrics` and `totals` follow [`crate::metrics`]. The preview is built
//! field by field from what it needs, never by copying provider objects, so
//! no raw payload, body HTML, sender address, token or header can reach it.
//!
//! The provider knows about email engagement only. Website traffic and sales
//! (sessions, conversions, revenue, orders) need a join with other sources,
//! so the preview names them in `attribution_required` and leaves them out
//! instead of inventing values.

use connector_sdk::{Result, Value, json};

use crate::api::Api;
use crate::config::Config;
use crate::metrics::{CampaignCounts, Metrics, field_coverage};

/// How many campaigns a preview shows.
pub const PREVIEW_CAMPAIGNS: u32 = 10;

/// Metrics this provider cannot supply: they need external attribution.
pub const ATTRIBUTION_REQUIRED: [&str; 4] = ["website_sessions", "website_conversions", "revenue", "orders"];

/// Fetches the recent sent campaigns and builds the preview.
pub fn preview(config: &Config) -> Result<Value> {
    config.validate()?;
    let campaigns = Api::new(config)?.recent_sent_campaigns(PREVIEW_CAMPAIGNS)?;
    Ok(build(&campaigns))
}

/// The preview of these campaign objects (newest first, as fetched).
/// Campaigns whose status says they are not sent are left out, in case a
/// provider ignores the status filter.
pub fn build(campaigns: &[Value]) -> Value {
    let sent: Vec<&Value> = campaigns
        .iter()
        .filter(|c| c.get("status").and_then(Value::as_str).is_none_or(|s| s == "sent"))
        .take(PREVIEW_CAMPAIGNS as usize)
        .collect();
    let counts: Vec<CampaignCounts> = sent.iter().map(|c| CampaignCounts::from_campaign(c)).collect();
    let rows: Vec<Value> = sent
        .iter()
        .zip(&counts)
        .map(|(campaign, counts)| {
            json!({
                "campaign_id": string_field(campaign, "uuid"),
                "name": string_field(campaign, "name"),
                "status": string_field(campaign, "status"),
                "sent_at": string_field(campaign, "sent_at"),
                "metrics": Metrics::of_campaign(counts).to_json(),
            })
        })
        .collect();
    json!({
        "campaigns": rows,
        "totals": Metrics::total(&counts).to_json(),
        "field_coverage": field_coverage(&counts),
        "attribution_required": ATTRIBUTION_REQUIRED,
    })
}

/// A string field of a provider object, or `null` for anything else (so an
/// unexpected nested object is never passed on).
fn string_field(object: &Value, field: &str) -> Value {
    object.get(field).filter(|v| v.is_string()).cloned().unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn campaign(uuid: &str, sent: u64, unique_opens: u64) -> Value {
        json!({
            "uuid": uuid,
            "name": format!("Campaign {uuid}"),
            "status": "sent",
            "sent_at": "2024-03-01T09:00:00.000000Z",
            "updated_at": "2024-03-02T09:00:00.000000Z",
            "from_email": "news@example.com",
            "html": "<html>secret-looking body</html>",
            "sent_to_number_of_subscribers": sent,
            "unique_open_count": unique_opens,
            "open_count": unique_opens * 2,
            "bounce_count": 0,
        })
    }

    #[test]
    fn the_preview_has_exactly_the_documented_top_level_fields() {
        let preview = build(&[campaign("c1", 100, 40)]);
        let mut keys: Vec<&String> = preview.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["attribution_required", "campaigns", "field_coverage", "totals"]);
        assert_eq!(
            preview["attribution_required"],
            json!(["website_sessions", "website_conversions", "revenue", "orders"])
        );
    }

    #[test]
    fn each_campaign_shows_identity_and_normalised_metrics_only() {
        let preview = build(&[campaign("c1", 100, 40)]);
        let row = &preview["campaigns"][0];
        let mut keys: Vec<&String> = row.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["campaign_id", "metrics", "name", "sent_at", "status"]);
        assert_eq!(row["campaign_id"], json!("c1"));
        assert_eq!(row["metrics"]["open_rate"], json!(0.4));
        assert_eq!(row["metrics"]["delivered"], json!(100));
    }

    #[test]
    fn no_raw_provider_content_reaches_the_preview() {
        let text = build(&[campaign("c1", 100, 40)]).to_string();
        assert!(!text.contains("news@example.com"));
        assert!(!text.contains("<html>"));
        assert!(!text.contains("updated_at"));
    }

    #[test]
    fn totals_sum_the_previewed_campaigns_and_recompute_rates() {
        let preview = build(&[campaign("c1", 100, 40), campaign("c2", 300, 20)]);
        assert_eq!(preview["totals"]["sent"], json!(400));
        assert_eq!(preview["totals"]["unique_opens"], json!(60));
        assert_eq!(preview["totals"]["open_rate"], json!(0.15));
    }

    #[test]
    fn field_coverage_reflects_what_the_campaigns_carry() {
        let preview = build(&[campaign("c1", 100, 40)]);
        let coverage = &preview["field_coverage"];
        assert_eq!(coverage["sent"], json!("provided"));
        assert_eq!(coverage["open_rate"], json!("derived"));
        assert_eq!(coverage["clicks"], json!("not_provided"));
        assert_eq!(coverage["complaints"], json!("not_provided"));
        assert_eq!(coverage.as_object().unwrap().len(), 15);
    }

    #[test]
    fn campaigns_that_are_not_sent_are_left_out_and_at_most_ten_shown() {
        let mut campaigns: Vec<Value> = (0..12).map(|i| campaign(&format!("c{i}"), 10, 1)).collect();
        campaigns[0]["status"] = json!("draft");
        let preview = build(&campaigns);
        let rows = preview["campaigns"].as_array().unwrap();
        assert_eq!(rows.len(), 10);
        assert_eq!(rows[0]["campaign_id"], json!("c1"));
    }

    #[test]
    fn an_account_without_sent_campaigns_gets_an_empty_but_complete_preview() {
        let preview = build(&[]);
        assert_eq!(preview["campaigns"], json!([]));
        assert!(preview["totals"].as_object().unwrap().values().all(Value::is_null));
        assert_eq!(preview["field_coverage"]["sent"], json!("not_provided"));
    }
}
