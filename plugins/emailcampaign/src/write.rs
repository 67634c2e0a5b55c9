//! `write` (reverse ETL): creates and updates subscribers.
//!
//! Only the `subscribers` object can be written, in two modes:
//!
//! - **insert**: `POST /email-lists/{list}/subscribers` for every record.
//! - **upsert**: find the subscriber, `PATCH /subscribers/{uuid}` if found,
//!   otherwise create it as `insert` does. With key field `email` (the
//!   default when no key field is given) the lookup is
//!   `GET /email-lists/{list}/subscribers?filter[email]=<email>`; with key
//!   field `uuid` the record's `uuid` is patched directly and a 404 means
//!   "create".
//!
//! `{list}` is the first of `email_list_uuids`; without one the write is
//! `invalid-config`. Records are sent one by one, because the provider has
//! no batch endpoint; only `email`, `first_name`, `last_name` and
//! `extra_attributes` are sent, whatever else the record carries (for
//! example the host's `_service_*` columns).
//!
//! A record the provider refuses (validation, conflict) fails alone, with a
//! message naming at most the offending *field names*, never their values.
//! A failure that concerns every record (rejected credential, missing
//! permission, rate limit outlasting the retries, provider outage, unknown
//! list) stops the batch: if nothing has been written yet the whole write
//! returns that error, so the host can retry it later; otherwise the records
//! not yet written are reported failed with the reason, and the records
//! already written are counted as written.

use connector_sdk::{Error, Result, Value, WriteMode, WriteRequest, WriteResult, log};
use serde_json::Map;

use crate::api::{Api, WriteAnswer};
use crate::config::{Config, is_path_safe_id};
use crate::streams::StreamName;

/// The fields of a record that are sent to the provider.
const WRITABLE_FIELDS: [&str; 4] = ["email", "first_name", "last_name", "extra_attributes"];

/// Writes one batch; see the module documentation.
pub fn write(request: WriteRequest<Config>) -> Result<WriteResult> {
    if StreamName::parse(&request.stream) != Some(StreamName::Subscribers) {
        return Err(Error::Unsupported(format!(
            "only `subscribers` can be written, not `{}`",
            request.stream
        )));
    }
    let mode = WriteKind::of(request.mode, &request.key_fields)?;
    let config = &request.config;
    config.validate()?;
    let list = config.email_lists()?.into_iter().next().ok_or_else(|| {
        Error::InvalidConfig(
            "email_list_uuids: writing subscribers needs an email list; \
             they are created in the first list given"
                .into(),
        )
    })?;
    let api = Api::new(config)?;

    let mut result = WriteResult::default();
    for (index, record) in request.records.iter().enumerate() {
        let subscriber = match Subscriber::from_record(record, mode) {
            Ok(subscriber) => subscriber,
            Err(why) => {
                result.record_failed(index, why);
                continue;
            }
        };
        match write_one(&api, &list, mode, &subscriber) {
            Ok(WriteAnswer::Accepted) => result.record_written(),
            Ok(WriteAnswer::Refused { status, fields }) => {
                result.record_failed(index, refusal_message(status, &fields));
            }
            // `send` folds a client error that followed a retry into this.
            Err(Error::ProviderError(_)) => {
                result.record_failed(index, "the provider refused the record");
            }
            Err(error) if result.written == 0 => return Err(error),
            Err(error) => {
                log::warn(format_args!(
                    "subscribers: write stopped at record {index} of {}",
                    request.records.len()
                ));
                result.record_failed(index, batch_failure_message(&error, true));
                let rest = batch_failure_message(&error, false);
                for later in index + 1..request.records.len() {
                    result.record_failed(later, rest.clone());
                }
                break;
            }
        }
    }
    log::info(format_args!(
        "subscribers: {} written, {} failed",
        result.written, result.failed
    ));
    Ok(result)
}

/// How records are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// Create every record.
    Insert,
    /// Update the subscriber with the record's email address, or create it.
    UpsertByEmail,
    /// Update the subscriber with the record's uuid, or create it.
    UpsertByUuid,
}

impl WriteKind {
    fn of(mode: WriteMode, key_fields: &[String]) -> Result<Self> {
        match mode {
            WriteMode::Insert => Ok(WriteKind::Insert),
            WriteMode::Upsert => match key_fields {
                [] => Ok(WriteKind::UpsertByEmail),
                [field] if field == "email" => Ok(WriteKind::UpsertByEmail),
                [field] if field == "uuid" => Ok(WriteKind::UpsertByUuid),
                _ => Err(Error::Unsupported(format!(
                    "subscribers are upserted by `email` or by `uuid`, not by {key_fields:?}"
                ))),
            },
            WriteMode::Update | WriteMode::Delete => Err(Error::Unsupported(
                "subscribers support the insert and upsert write modes only".into(),
            )),
        }
    }
}

/// What one record asks for, checked before anything is sent.
#[derive(Debug, Clone, PartialEq)]
struct Subscriber {
    /// The request body: the writable fields the record has.
    body: Value,
    /// The email address, for an upsert by email.
    email: String,
    /// The uuid, for an upsert by uuid.
    uuid: Option<String>,
}

impl Subscriber {
    /// Checks a record and picks out what is sent. The error is a message
    /// for the record's entry in the write result; it names fields only.
    fn from_record(record: &Value, kind: WriteKind) -> Result<Self, String> {
        let Some(fields) = record.as_object() else {
            return Err("the record is not a JSON object".into());
        };
        let email = fields
            .get("email")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|e| looks_like_email(e))
            .ok_or("`email` is missing or not an email address")?;
        for name in ["first_name", "last_name"] {
            if !fields
                .get(name)
                .is_none_or(|v| v.is_string() || v.is_null())
            {
                return Err(format!("`{name}` must be a string or null"));
            }
        }
        if !fields
            .get("extra_attributes")
            .is_none_or(|v| v.is_object() || v.is_null())
        {
            return Err("`extra_attributes` must be an object".into());
        }
        let uuid = match kind {
            WriteKind::UpsertByUuid => Some(
                fields
                    .get("uuid")
                    .and_then(Value::as_str)
                    .filter(|u| is_path_safe_id(u))
                    .ok_or("`uuid` is missing or not a subscriber uuid")?
                    .to_owned(),
            ),
            _ => None,
        };
        let mut body = Map::new();
        for name in WRITABLE_FIELDS {
            if let Some(value) = fields.get(name) {
                body.insert(name.to_owned(), value.clone());
            }
        }
        body.insert("email".into(), Value::String(email.to_owned()));
        Ok(Self {
            body: Value::Object(body),
            email: email.to_owned(),
            uuid,
        })
    }
}

/// A plausibility check only; the provider validates for real.
fn looks_like_email(text: &str) -> bool {
    match text.split_once('@') {
        Some((local, domain)) => {
            !local.is_empty() && !domain.is_empty() && !text.chars().any(char::is_whitespace)
        }
        None => false,
    }
}

/// Applies one checked record.
fn write_one(
    api: &Api,
    list: &str,
    kind: WriteKind,
    subscriber: &Subscriber,
) -> Result<WriteAnswer> {
    let existing = match kind {
        WriteKind::Insert => None,
        WriteKind::UpsertByUuid => subscriber.uuid.clone(),
        WriteKind::UpsertByEmail => api.find_subscriber(list, &subscriber.email)?,
    };
    if let Some(uuid) = existing {
        match api.update_subscriber(&uuid, &subscriber.body)? {
            // Gone (or never there): create it instead.
            WriteAnswer::Refused { status: 404, .. } => {}
            answer => return Ok(answer),
        }
    }
    api.create_subscriber(list, &subscriber.body)
}

/// The message for a record the provider refused.
fn refusal_message(status: u16, fields: &[String]) -> String {
    if fields.is_empty() {
        format!("the provider refused the record (HTTP {status})")
    } else {
        format!(
            "the provider refused the record (HTTP {status}); fields in question: {}",
            fields.join(", ")
        )
    }
}

/// The message for records a batch-wide failure left unwritten: `current`
/// for the record being written when it happened, else for the ones after.
/// Fixed texts, so no provider answer or URL ends up in a record error.
fn batch_failure_message(error: &Error, current: bool) -> String {
    let reason = match error {
        Error::InvalidCredentials(_) => "the provider rejected the credential".to_owned(),
        Error::PermissionDenied(_) => "the credential may not write subscribers".to_owned(),
        Error::RateLimited {
            retry_after: Some(seconds),
        } => format!("the provider is rate-limiting; retry after {seconds}s"),
        Error::RateLimited { retry_after: None } => "the provider is rate-limiting".to_owned(),
        Error::ProviderUnavailable(_) if current => {
            return "the provider failed while this record was being written; \
                    it may or may not have been stored"
                .to_owned();
        }
        Error::ProviderUnavailable(_) => "the provider is unavailable".to_owned(),
        Error::EgressDenied(_) => "the host's egress policy refused the request".to_owned(),
        Error::InvalidConfig(_) => "the configuration is invalid".to_owned(),
        _ => "an unexpected error stopped the batch".to_owned(),
    };
    format!("not written: {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use connector_sdk::json;

    fn checked(record: Value) -> Result<Subscriber, String> {
        Subscriber::from_record(&record, WriteKind::Insert)
    }

    #[test]
    fn insert_and_upsert_are_the_only_modes() {
        assert_eq!(
            WriteKind::of(WriteMode::Insert, &[]).unwrap(),
            WriteKind::Insert
        );
        assert!(matches!(
            WriteKind::of(WriteMode::Update, &[]),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            WriteKind::of(WriteMode::Delete, &[]),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn upserts_match_by_email_unless_the_key_is_uuid() {
        let key = |fields: &[&str]| {
            WriteKind::of(
                WriteMode::Upsert,
                &fields.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(key(&[]).unwrap(), WriteKind::UpsertByEmail);
        assert_eq!(key(&["email"]).unwrap(), WriteKind::UpsertByEmail);
        assert_eq!(key(&["uuid"]).unwrap(), WriteKind::UpsertByUuid);
        assert!(matches!(key(&["first_name"]), Err(Error::Unsupported(_))));
        assert!(matches!(
            key(&["email", "uuid"]),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn only_writable_fields_are_sent() {
        let s = checked(json!({
            "email": " ada@example.com ",
            "first_name": "Ada",
            "last_name": null,
            "extra_attributes": { "plan": "pro" },
            "tags": ["x"],
            "_service_raw_id": "r1",
            "uuid": "s1"
        }))
        .unwrap();
        assert_eq!(
            s.body,
            json!({
                "email": "ada@example.com",
                "first_name": "Ada",
                "last_name": null,
                "extra_attributes": { "plan": "pro" }
            })
        );
    }

    #[test]
    fn absent_optional_fields_are_not_sent_so_updates_keep_them() {
        let s = checked(json!({ "email": "ada@example.com" })).unwrap();
        assert_eq!(s.body, json!({ "email": "ada@example.com" }));
    }

    #[test]
    fn bad_records_fail_with_messages_naming_fields_not_values() {
        for (record, field) in [
            (json!("ada@example.com"), "JSON object"),
            (json!({ "first_name": "Ada" }), "`email`"),
            (json!({ "email": "not-an-address" }), "`email`"),
            (json!({ "email": "a@b.c", "first_name": 7 }), "`first_name`"),
            (
                json!({ "email": "a@b.c", "extra_attributes": "plan=pro" }),
                "`extra_attributes`",
            ),
        ] {
            let message = checked(record.clone()).unwrap_err();
            assert!(message.contains(field), "{record}: {message}");
            assert!(!message.contains("not-an-address") && !message.contains("plan=pro"));
        }
    }

    #[test]
    fn an_upsert_by_uuid_needs_a_usable_uuid() {
        let record = json!({ "email": "a@b.c", "uuid": "../x" });
        assert!(Subscriber::from_record(&record, WriteKind::UpsertByUuid).is_err());
        let record = json!({ "email": "a@b.c", "uuid": "2a0c72d9-f91a" });
        let s = Subscriber::from_record(&record, WriteKind::UpsertByUuid).unwrap();
        assert_eq!(s.uuid.as_deref(), Some("2a0c72d9-f91a"));
        assert!(!s.body.as_object().unwrap().contains_key("uuid"));
    }

    #[test]
    fn refusals_name_the_status_and_fields() {
        assert_eq!(
            refusal_message(422, &["email".into()]),
            "the provider refused the record (HTTP 422); fields in question: email"
        );
        assert_eq!(
            refusal_message(409, &[]),
            "the provider refused the record (HTTP 409)"
        );
    }

    #[test]
    fn batch_failures_use_fixed_texts() {
        let error = Error::InvalidCredentials(
            "HTTP 401 from POST https://x/api/...: ada@example.com".into(),
        );
        let message = batch_failure_message(&error, false);
        assert_eq!(message, "not written: the provider rejected the credential");
        assert_eq!(
            batch_failure_message(
                &Error::RateLimited {
                    retry_after: Some(30)
                },
                false
            ),
            "not written: the provider is rate-limiting; retry after 30s"
        );
        assert!(
            batch_failure_message(&Error::ProviderUnavailable("x".into()), true)
                .contains("may or may not")
        );
    }
}
