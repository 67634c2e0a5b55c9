//! Campaign metrics in one provider-independent shape.
//!
//! The provider stores counts on each campaign (`open_count`,
//! `bounce_count`, ...) and rates as integers in hundredths of a percent
//! (`open_rate: 4523` means 45.23 %). Older instances lack some of them, and
//! `complaint_count` is often missing altogether. This module turns what a
//! campaign carries into [`Metrics`], used by the `campaign_statistics`
//! stream and by the preview, and sums several campaigns into totals.
//!
//! # Rules
//!
//! | metric | from |
//! |---|---|
//! | `sent` | `sent_to_number_of_subscribers` |
//! | `opens`, `unique_opens` | `open_count`, `unique_open_count` |
//! | `clicks`, `unique_clicks` | `click_count`, `unique_click_count` |
//! | `bounces` | `bounce_count` |
//! | `unsubscribes` | `unsubscribe_count` |
//! | `complaints` | `complaint_count` (often not reported) |
//! | `delivered` | `sent - bounces` (never below 0), when both are known |
//!
//! Every rate is a fraction in `0..=1` with **`sent` as the denominator**:
//!
//! | rate | numerator |
//! |---|---|
//! | `delivery_rate` | `delivered` |
//! | `open_rate` | `unique_opens` |
//! | `click_rate` | `unique_clicks` |
//! | `bounce_rate` | `bounces` |
//! | `unsubscribe_rate` | `unsubscribes` |
//! | `complaint_rate` | `complaints` |
//!
//! One denominator for all rates keeps them comparable with each other and
//! with the provider's own `open_rate`/`click_rate`/`bounce_rate`/
//! `unsubscribe_rate`, which are computed over the recipients as well. Open
//! and click rates use unique counts, so one reader opening five times counts
//! once. A rate is `null` when its numerator is unknown or `sent` is unknown
//! or zero; it is rounded to four decimals (the provider's own precision) and
//! capped at 1 should inconsistent counts exceed the recipients.
//!
//! Rates are always computed from counts, never copied from the provider's
//! rate fields, so a campaign's rates and the totals' rates follow the same
//! rule. (The provider's raw rates remain in the `campaigns` stream.)
//!
//! Totals sum each count over the campaigns that report it (`null` if none
//! does). A total rate is `Σ numerator / Σ sent` over the campaigns that
//! report both, so a campaign that lacks, say, bounce counts does not dilute
//! the bounce rate of the others.

use std::collections::BTreeMap;

use connector_sdk::{Value, json};
use serde::Serialize;

/// The counts one campaign reports, as found in the provider's campaign
/// object; `None` where the field is absent, null or not a count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CampaignCounts {
    /// `sent_to_number_of_subscribers`.
    pub sent: Option<u64>,
    /// `open_count`.
    pub opens: Option<u64>,
    /// `unique_open_count`.
    pub unique_opens: Option<u64>,
    /// `click_count`.
    pub clicks: Option<u64>,
    /// `unique_click_count`.
    pub unique_clicks: Option<u64>,
    /// `bounce_count`.
    pub bounces: Option<u64>,
    /// `unsubscribe_count`.
    pub unsubscribes: Option<u64>,
    /// `complaint_count`.
    pub complaints: Option<u64>,
}

impl CampaignCounts {
    /// Picks the counts out of a campaign object.
    pub fn from_campaign(campaign: &Value) -> Self {
        let count = |field: &str| campaign.get(field).and_then(as_count);
        Self {
            sent: count("sent_to_number_of_subscribers"),
            opens: count("open_count"),
            unique_opens: count("unique_open_count"),
            clicks: count("click_count"),
            unique_clicks: count("unique_click_count"),
            bounces: count("bounce_count"),
            unsubscribes: count("unsubscribe_count"),
            complaints: count("complaint_count"),
        }
    }

    /// `sent - bounces`, when both are known.
    fn delivered(&self) -> Option<u64> {
        Some(self.sent?.saturating_sub(self.bounces?))
    }
}

/// A count as the provider may write it: a non-negative integer, a float
/// with no fractional part, or a string of digits (some PHP setups serialise
/// numeric columns as strings).
fn as_count(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            let f = n.as_f64()?;
            (f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64).then_some(f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The normalised metrics of one campaign, or of several summed.
/// Serialises with every field present, unknown ones as `null`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Metrics {
    /// Recipients the campaign was sent to.
    pub sent: Option<u64>,
    /// `sent - bounces`.
    pub delivered: Option<u64>,
    /// All opens, repeated ones included.
    pub opens: Option<u64>,
    /// Recipients who opened at least once.
    pub unique_opens: Option<u64>,
    /// All clicks, repeated ones included.
    pub clicks: Option<u64>,
    /// Recipients who clicked at least once.
    pub unique_clicks: Option<u64>,
    /// Bounced messages.
    pub bounces: Option<u64>,
    /// Recipients who unsubscribed through the campaign.
    pub unsubscribes: Option<u64>,
    /// Spam complaints; `None` when the provider does not report them.
    pub complaints: Option<u64>,
    /// `delivered / sent`.
    pub delivery_rate: Option<f64>,
    /// `unique_opens / sent`.
    pub open_rate: Option<f64>,
    /// `unique_clicks / sent`.
    pub click_rate: Option<f64>,
    /// `bounces / sent`.
    pub bounce_rate: Option<f64>,
    /// `unsubscribes / sent`.
    pub unsubscribe_rate: Option<f64>,
    /// `complaints / sent`.
    pub complaint_rate: Option<f64>,
}

/// Reads one count of a campaign.
type CountOf = fn(&CampaignCounts) -> Option<u64>;

/// The counts the provider reports, by their name in [`Metrics`].
const PROVIDED_COUNTS: [(&str, CountOf); 8] = [
    ("sent", |c| c.sent),
    ("opens", |c| c.opens),
    ("unique_opens", |c| c.unique_opens),
    ("clicks", |c| c.clicks),
    ("unique_clicks", |c| c.unique_clicks),
    ("bounces", |c| c.bounces),
    ("unsubscribes", |c| c.unsubscribes),
    ("complaints", |c| c.complaints),
];

/// A rate: which count is the numerator. The denominator is always `sent`.
#[derive(Debug, Clone, Copy)]
struct RateRule {
    /// The rate's name in [`Metrics`] and in field coverage.
    name: &'static str,
    /// The numerator, read from one campaign.
    numerator: CountOf,
    /// The provided counts the rate is computed from.
    needs: &'static [&'static str],
    /// Where the result goes.
    slot: fn(&mut Metrics) -> &mut Option<f64>,
}

/// The rates, in the order of [`Metrics`].
const RATES: [RateRule; 6] = [
    RateRule {
        name: "delivery_rate",
        numerator: CampaignCounts::delivered,
        needs: &["sent", "bounces"],
        slot: |m| &mut m.delivery_rate,
    },
    RateRule {
        name: "open_rate",
        numerator: |c| c.unique_opens,
        needs: &["sent", "unique_opens"],
        slot: |m| &mut m.open_rate,
    },
    RateRule {
        name: "click_rate",
        numerator: |c| c.unique_clicks,
        needs: &["sent", "unique_clicks"],
        slot: |m| &mut m.click_rate,
    },
    RateRule {
        name: "bounce_rate",
        numerator: |c| c.bounces,
        needs: &["sent", "bounces"],
        slot: |m| &mut m.bounce_rate,
    },
    RateRule {
        name: "unsubscribe_rate",
        numerator: |c| c.unsubscribes,
        needs: &["sent", "unsubscribes"],
        slot: |m| &mut m.unsubscribe_rate,
    },
    RateRule {
        name: "complaint_rate",
        numerator: |c| c.complaints,
        needs: &["sent", "complaints"],
        slot: |m| &mut m.complaint_rate,
    },
];

/// `numerator / denominator` as a fraction rounded to four decimals and
/// capped at 1; `None` for a zero denominator.
fn rate(numerator: u64, denominator: u64) -> Option<f64> {
    if denominator == 0 {
        return None;
    }
    let fraction = (numerator as f64 / denominator as f64).min(1.0);
    Some((fraction * 10_000.0).round() / 10_000.0)
}

impl Metrics {
    /// The metrics of one campaign.
    pub fn of_campaign(counts: &CampaignCounts) -> Self {
        Self::total(std::slice::from_ref(counts))
    }

    /// The metrics of several campaigns together (see the module
    /// documentation for how unknown values are treated). For one campaign
    /// this is exactly [`Metrics::of_campaign`].
    pub fn total(campaigns: &[CampaignCounts]) -> Self {
        let sum = |count: CountOf| {
            campaigns
                .iter()
                .filter_map(count)
                .fold(None, |total: Option<u64>, n| Some(total.unwrap_or(0).saturating_add(n)))
        };
        let mut metrics = Self {
            sent: sum(|c| c.sent),
            delivered: sum(CampaignCounts::delivered),
            opens: sum(|c| c.opens),
            unique_opens: sum(|c| c.unique_opens),
            clicks: sum(|c| c.clicks),
            unique_clicks: sum(|c| c.unique_clicks),
            bounces: sum(|c| c.bounces),
            unsubscribes: sum(|c| c.unsubscribes),
            complaints: sum(|c| c.complaints),
            ..Self::default()
        };
        for rule in RATES {
            let (numerator, denominator) = campaigns
                .iter()
                .filter_map(|c| Some(((rule.numerator)(c)?, c.sent?)))
                .fold((0u64, 0u64), |(n, d), (cn, cd)| (n.saturating_add(cn), d.saturating_add(cd)));
            *(rule.slot)(&mut metrics) = rate(numerator, denominator);
        }
        metrics
    }

    /// The metrics as a JSON object with every field present.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({}))
    }
}

/// Where a metric comes from, as shown in the preview's `field_coverage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coverage {
    /// The provider reports it directly.
    Provided,
    /// Computed here from counts the provider reports.
    Derived,
    /// Not reported, or not computable from what is reported.
    NotProvided,
}

/// Says, for every metric of [`Metrics`], whether the given campaigns
/// provide it, allow deriving it, or neither.
///
/// A count is `provided` when at least one campaign reports it. `delivered`
/// is `derived` when `sent` and `bounces` are provided, and each rate when
/// its numerator and `sent` are. With no campaigns at all nothing can be
/// vouched for, so everything is `not_provided`.
pub fn field_coverage(campaigns: &[CampaignCounts]) -> BTreeMap<&'static str, Coverage> {
    let mut coverage: BTreeMap<&'static str, Coverage> = PROVIDED_COUNTS
        .iter()
        .map(|(name, count)| {
            let reported = campaigns.iter().any(|c| count(c).is_some());
            let coverage = if reported { Coverage::Provided } else { Coverage::NotProvided };
            (*name, coverage)
        })
        .collect();
    // A derived value is derivable when every count it needs is provided.
    let derivable = |needs: &[&str], coverage: &BTreeMap<&str, Coverage>| {
        if needs.iter().all(|n| coverage[n] == Coverage::Provided) { Coverage::Derived } else { Coverage::NotProvided }
    };
    let delivered = derivable(&["sent", "bounces"], &coverage);
    coverage.insert("delivered", delivered);
    for rule in RATES {
        let rate = derivable(rule.needs, &coverage);
        coverage.insert(rule.name, rate);
    }
    coverage
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A campaign object as a modern instance sends it.
    fn campaign() -> Value {
        json!({
            "uuid": "c1",
            "sent_to_number_of_subscribers": 1000,
            "open_count": 620,
            "unique_open_count": 450,
            "click_count": 130,
            "unique_click_count": 95,
            "unsubscribe_count": 4,
            "bounce_count": 20,
            "complaint_count": 1,
            "open_rate": 4500,
            "click_rate": 950,
        })
    }

    #[test]
    fn counts_map_one_to_one_and_delivered_is_sent_minus_bounces() {
        let m = Metrics::of_campaign(&CampaignCounts::from_campaign(&campaign()));
        assert_eq!(m.sent, Some(1000));
        assert_eq!(m.delivered, Some(980));
        assert_eq!((m.opens, m.unique_opens, m.clicks, m.unique_clicks), (Some(620), Some(450), Some(130), Some(95)));
        assert_eq!((m.bounces, m.unsubscribes, m.complaints), (Some(20), Some(4), Some(1)));
    }

    #[test]
    fn rates_are_fractions_over_sent_using_unique_counts() {
        let m = Metrics::of_campaign(&CampaignCounts::from_campaign(&campaign()));
        assert_eq!(m.delivery_rate, Some(0.98));
        assert_eq!(m.open_rate, Some(0.45));
        assert_eq!(m.click_rate, Some(0.095));
        assert_eq!(m.bounce_rate, Some(0.02));
        assert_eq!(m.unsubscribe_rate, Some(0.004));
        assert_eq!(m.complaint_rate, Some(0.001));
    }

    #[test]
    fn derived_open_rate_agrees_with_the_providers_hundredths_of_a_percent() {
        let c = CampaignCounts::from_campaign(&campaign());
        let provider = campaign()["open_rate"].as_f64().unwrap() / 10_000.0;
        assert_eq!(Metrics::of_campaign(&c).open_rate, Some(provider));
    }

    #[test]
    fn rates_are_rounded_to_four_decimals() {
        let c = CampaignCounts { sent: Some(3), unique_opens: Some(1), ..Default::default() };
        assert_eq!(Metrics::of_campaign(&c).open_rate, Some(0.3333));
    }

    #[test]
    fn missing_or_null_statistics_stay_null() {
        let c = CampaignCounts::from_campaign(&json!({
            "sent_to_number_of_subscribers": 500,
            "open_count": null,
            "bounce_count": 5,
        }));
        let m = Metrics::of_campaign(&c);
        assert_eq!(m.opens, None);
        assert_eq!(m.unique_opens, None);
        assert_eq!(m.open_rate, None);
        assert_eq!(m.complaints, None);
        assert_eq!(m.complaint_rate, None);
        assert_eq!(m.delivered, Some(495));
        assert_eq!(m.bounce_rate, Some(0.01));
    }

    #[test]
    fn delivered_needs_both_sent_and_bounces() {
        let only_sent = CampaignCounts { sent: Some(10), ..Default::default() };
        let only_bounces = CampaignCounts { bounces: Some(1), ..Default::default() };
        for c in [only_sent, only_bounces] {
            let m = Metrics::of_campaign(&c);
            assert_eq!((m.delivered, m.delivery_rate), (None, None));
        }
    }

    #[test]
    fn nothing_sent_means_no_rates() {
        let c = CampaignCounts::from_campaign(&json!({
            "sent_to_number_of_subscribers": 0,
            "unique_open_count": 0,
            "bounce_count": 0,
        }));
        let m = Metrics::of_campaign(&c);
        assert_eq!(m.delivered, Some(0));
        assert_eq!((m.open_rate, m.bounce_rate, m.delivery_rate), (None, None, None));
    }

    #[test]
    fn inconsistent_counts_never_give_a_rate_above_one_or_negative_delivered() {
        let c = CampaignCounts { sent: Some(10), unique_opens: Some(12), bounces: Some(15), ..Default::default() };
        let m = Metrics::of_campaign(&c);
        assert_eq!(m.open_rate, Some(1.0));
        assert_eq!(m.delivered, Some(0));
        assert_eq!(m.delivery_rate, Some(0.0));
    }

    #[test]
    fn counts_written_as_strings_or_whole_floats_are_accepted() {
        let c = CampaignCounts::from_campaign(&json!({
            "sent_to_number_of_subscribers": "200",
            "open_count": 50.0,
            "click_count": 1.5,
            "bounce_count": -3,
            "unsubscribe_count": true,
        }));
        assert_eq!(c.sent, Some(200));
        assert_eq!(c.opens, Some(50));
        assert_eq!((c.clicks, c.bounces, c.unsubscribes), (None, None, None));
    }

    #[test]
    fn totals_sum_counts_and_recompute_rates_from_the_sums() {
        let a = CampaignCounts { sent: Some(100), unique_opens: Some(50), bounces: Some(10), ..Default::default() };
        let b = CampaignCounts { sent: Some(300), unique_opens: Some(30), bounces: Some(2), ..Default::default() };
        let t = Metrics::total(&[a, b]);
        assert_eq!(t.sent, Some(400));
        assert_eq!(t.unique_opens, Some(80));
        assert_eq!(t.delivered, Some(388));
        // 80 / 400, not the mean of 0.5 and 0.1.
        assert_eq!(t.open_rate, Some(0.2));
        assert_eq!(t.bounce_rate, Some(0.03));
        assert_eq!(t.delivery_rate, Some(0.97));
    }

    #[test]
    fn total_rates_only_use_campaigns_that_report_the_numerator() {
        let with_complaints = CampaignCounts { sent: Some(1000), complaints: Some(2), ..Default::default() };
        let without = CampaignCounts { sent: Some(9000), ..Default::default() };
        let t = Metrics::total(&[with_complaints, without]);
        assert_eq!(t.sent, Some(10_000));
        assert_eq!(t.complaints, Some(2));
        assert_eq!(t.complaint_rate, Some(0.002));
    }

    #[test]
    fn totals_of_nothing_are_all_null() {
        assert_eq!(Metrics::total(&[]), Metrics::default());
    }

    #[test]
    fn metrics_serialise_with_every_field_present() {
        let json = Metrics::default().to_json();
        let object = json.as_object().unwrap();
        assert_eq!(object.len(), 15);
        assert!(object.values().all(Value::is_null));
    }

    #[test]
    fn coverage_marks_counts_provided_and_derivations_derived() {
        let without_complaints = campaign()
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "complaint_count")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<serde_json::Map<_, _>>();
        let c = CampaignCounts::from_campaign(&Value::Object(without_complaints));
        let coverage = field_coverage(&[c]);
        assert_eq!(coverage.len(), 15);
        assert_eq!(coverage["sent"], Coverage::Provided);
        assert_eq!(coverage["unique_clicks"], Coverage::Provided);
        assert_eq!(coverage["delivered"], Coverage::Derived);
        assert_eq!(coverage["open_rate"], Coverage::Derived);
        assert_eq!(coverage["complaints"], Coverage::NotProvided);
        assert_eq!(coverage["complaint_rate"], Coverage::NotProvided);
    }

    #[test]
    fn coverage_names_match_the_metric_fields() {
        let coverage = field_coverage(&[]);
        let metrics = Metrics::default().to_json();
        let fields: Vec<&str> = metrics.as_object().unwrap().keys().map(String::as_str).collect();
        let names: Vec<&str> = coverage.keys().copied().collect();
        let mut fields = fields;
        fields.sort_unstable();
        assert_eq!(names, fields);
        assert!(coverage.values().all(|c| *c == Coverage::NotProvided));
    }

    #[test]
    fn coverage_serialises_in_snake_case() {
        assert_eq!(serde_json::to_value(Coverage::NotProvided).unwrap(), json!("not_provided"));
    }
}
