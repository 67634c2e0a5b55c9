//! `write` (reverse ETL): creates, updates and deletes subscribers.
//!
//! Only the `subscribers` object can be written, in four modes. Every mode
//! but insert first finds the existing subscriber by a key field: with
//! `email` (the default when no key field is given) the lookup is
//! `GET /email-lists/{list}/subscribers?filter[email]=<email>`; with `uuid`
//! the record's `uuid` is used directly, and the provider's 404 to the
//! `PATCH` or `DELETE` means "not found".
//!
//! - **insert**: `POST /email-lists/{list}/subscribers` for every record.
//! - **upsert**: `PATCH /subscribers/{uuid}` if found, otherwise create it
//!   as `insert` does.
//! - **update**: `PATCH /subscribers/{uuid}` if found; otherwise the record
//!   fails with "no subscriber matches this record". Never creates.
//! - **delete**: `DELETE /subscribers/{uuid}` if found. A subscriber that is
//!   not there counts as written, so repeating a delete is harmless. Only
//!   the record's key field is read; its other fields are ignored.
//!
//! `{list}` is the first of `email_list_uuids`; without one the write is
//! `invalid-config`. Records are sent one by one, because the provider has
//! no batch endpoint; only `email`, `first_name`, `last_name` and
//! `extra_attributes` are sent, whatever else the record carries (for
//! example the host's `_service_*` columns). Except for a delete, a record
//! needs a valid `email`, because it is sent.
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

/// The fields of a record that are sent to the provider; the subscriber
/// schema marks every other property `readOnly`.
pub(crate) const WRITABLE_FIELDS: [&str; 4] = ["email", "first_name", "last_name", "extra_attributes"];

/// Why an update fails when the subscriber is not there.
const NO_MATCH: &str = "no subscriber matches this record";

/// Writes one batch; see the module documentation.
pub fn write(request: WriteRequest<Config>) -> Result<WriteResult> {
    if StreamName::parse(&request.stream) != Some(StreamName::Subscribers) {
        return Err(Error::Unsupported(format!("only `subscribers` can be written, not `{}`", request.stream)));
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
            Ok(Outcome::Written) => result.record_written(),
            Ok(Outcome::Failed(why)) => result.record_failed(index, why),
            // `send` folds a client error that followed a retry into this.
            Err(Error::ProviderError(_)) => {
                result.record_failed(index, "the provider refused the record");
            }
            Err(error) if result.written == 0 => return Err(error),
            Err(error) => {
                log::warn(format_args!("subscribers: write stopped at record {index} of {}", request.records.len()));
                result.record_failed(index, batch_failure_message(&error, true));
                let rest = batch_failure_message(&error, false);
                for later in index + 1..request.records.len() {
                    result.record_failed(later, rest.clone());
                }
                break;
            }
        }
    }
    log::info(format_args!("subscribers: {} written, {} failed", result.written, result.failed));
    Ok(result)
}

/// How records are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// Create every record.
    Insert,
    /// Update the subscriber the key finds, or create it.
    Upsert(Key),
    /// Update the subscriber the key finds; fail the record without one.
    Update(Key),
    /// Delete the subscriber the key finds, if there is one.
    Delete(Key),
}

/// The record field that finds an existing subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// The email address, looked up in the list.
    Email,
    /// The subscriber's uuid, used as it is.
    Uuid,
}

impl WriteKind {
    fn of(mode: WriteMode, key_fields: &[String]) -> Result<Self> {
        Ok(match mode {
            WriteMode::Insert => WriteKind::Insert,
            WriteMode::Upsert => WriteKind::Upsert(Key::of("upserted", key_fields)?),
            WriteMode::Update => WriteKind::Update(Key::of("updated", key_fields)?),
            WriteMode::Delete => WriteKind::Delete(Key::of("deleted", key_fields)?),
        })
    }

    /// The key that finds the existing subscriber; none for an insert.
    fn key(self) -> Option<Key> {
        match self {
            WriteKind::Insert => None,
            WriteKind::Upsert(key) | WriteKind::Update(key) | WriteKind::Delete(key) => Some(key),
        }
    }
}

impl Key {
    /// The key the host's `key_fields` name: `email` when they name none.
    /// `verb` says what the mode does, for the message.
    fn of(verb: &str, key_fields: &[String]) -> Result<Self> {
        match key_fields {
            [] => Ok(Key::Email),
            [field] if field == "email" => Ok(Key::Email),
            [field] if field == "uuid" => Ok(Key::Uuid),
            _ => Err(Error::Unsupported(format!(
                "subscribers are {verb} by `email` or by `uuid`, not by {key_fields:?}"
            ))),
        }
    }
}

/// What one record asks for, checked before anything is sent.
#[derive(Debug, Clone, PartialEq)]
struct Subscriber {
    /// The request body: the writable fields the record has. `Null` for a
    /// delete, which sends no body.
    body: Value,
    /// How to find the existing subscriber; `None` for an insert.
    target: Option<Target>,
}

/// The key value of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// The record's email address (trimmed).
    Email(String),
    /// The record's subscriber uuid.
    Uuid(String),
}

impl Target {
    fn of(key: Key, fields: &Map<String, Value>) -> Result<Self, String> {
        Ok(match key {
            Key::Email => Target::Email(email_of(fields)?.to_owned()),
            Key::Uuid => Target::Uuid(uuid_of(fields)?.to_owned()),
        })
    }
}

impl Subscriber {
    /// Checks a record and picks out what is sent. The error is a message
    /// for the record's entry in the write result; it names fields only.
    fn from_record(record: &Value, kind: WriteKind) -> Result<Self, String> {
        let Some(fields) = record.as_object() else {
            return Err("the record is not a JSON object".into());
        };
        if let WriteKind::Delete(key) = kind {
            // Nothing but the key is used, so nothing else is checked.
            return Ok(Self { body: Value::Null, target: Some(Target::of(key, fields)?) });
        }
        let email = email_of(fields)?;
        for name in ["first_name", "last_name"] {
            if !fields.get(name).is_none_or(|v| v.is_string() || v.is_null()) {
                return Err(format!("`{name}` must be a string or null"));
            }
        }
        if !fields.get("extra_attributes").is_none_or(|v| v.is_object() || v.is_null()) {
            return Err("`extra_attributes` must be an object".into());
        }
        let target = kind.key().map(|key| Target::of(key, fields)).transpose()?;
        let mut body = Map::new();
        for name in WRITABLE_FIELDS {
            if let Some(value) = fields.get(name) {
                body.insert(name.to_owned(), value.clone());
            }
        }
        body.insert("email".into(), Value::String(email.to_owned()));
        Ok(Self { body: Value::Object(body), target })
    }
}

/// The record's email address, trimmed, if it looks like one.
fn email_of(fields: &Map<String, Value>) -> Result<&str, String> {
    fields
        .get("email")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|e| looks_like_email(e))
        .ok_or_else(|| "`email` is missing or not an email address".to_owned())
}

/// The record's subscriber uuid, if it can be a path segment.
fn uuid_of(fields: &Map<String, Value>) -> Result<&str, String> {
    fields
        .get("uuid")
        .and_then(Value::as_str)
        .filter(|u| is_path_safe_id(u))
        .ok_or_else(|| "`uuid` is missing or not a subscriber uuid".to_owned())
}

/// A plausibility check only; the provider validates for real.
fn looks_like_email(text: &str) -> bool {
    match text.split_once('@') {
        Some((local, domain)) => !local.is_empty() && !domain.is_empty() && !text.chars().any(char::is_whitespace),
        None => false,
    }
}

/// What became of one record the provider was asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Count it as written.
    Written,
    /// Count it as failed, for this reason.
    Failed(String),
}

impl From<WriteAnswer> for Outcome {
    fn from(answer: WriteAnswer) -> Self {
        match answer {
            WriteAnswer::Accepted => Outcome::Written,
            WriteAnswer::Refused { status, fields } => Outcome::Failed(refusal_message(status, &fields)),
        }
    }
}

/// Applies one checked record.
fn write_one(api: &Api, list: &str, kind: WriteKind, subscriber: &Subscriber) -> Result<Outcome> {
    let existing = match &subscriber.target {
        None => None,
        Some(Target::Uuid(uuid)) => Some(uuid.clone()),
        Some(Target::Email(email)) => api.find_subscriber(list, email)?,
    };
    match kind {
        WriteKind::Insert => Ok(api.create_subscriber(list, &subscriber.body)?.into()),
        WriteKind::Upsert(_) => {
            if let Some(uuid) = existing {
                match api.update_subscriber(&uuid, &subscriber.body)? {
                    // Gone (or never there): create it instead.
                    WriteAnswer::Refused { status: 404, .. } => {}
                    answer => return Ok(answer.into()),
                }
            }
            Ok(api.create_subscriber(list, &subscriber.body)?.into())
        }
        WriteKind::Update(_) => {
            Ok(updated(existing.map(|uuid| api.update_subscriber(&uuid, &subscriber.body)).transpose()?))
        }
        WriteKind::Delete(_) => Ok(deleted(existing.map(|uuid| api.delete_subscriber(&uuid)).transpose()?)),
    }
}

/// What an update means for the record: `answer` is the provider's answer
/// to the `PATCH`, `None` when the lookup found nobody to patch.
fn updated(answer: Option<WriteAnswer>) -> Outcome {
    match answer {
        None | Some(WriteAnswer::Refused { status: 404, .. }) => Outcome::Failed(NO_MATCH.into()),
        Some(answer) => answer.into(),
    }
}

/// What a delete means for the record: `answer` is the provider's answer to
/// the `DELETE`, `None` when the lookup found nobody to delete. A subscriber
/// that is not there is as good as deleted.
fn deleted(answer: Option<WriteAnswer>) -> Outcome {
    match answer {
        None | Some(WriteAnswer::Refused { status: 404, .. }) => Outcome::Written,
        Some(answer) => answer.into(),
    }
}

/// The message for a record the provider refused.
fn refusal_message(status: u16, fields: &[String]) -> String {
    if fields.is_empty() {
        format!("the provider refused the record (HTTP {status})")
    } else {
        format!("the provider refused the record (HTTP {status}); fields in question: {}", fields.join(", "))
    }
}

/// The message for records a batch-wide failure left unwritten: `current`
/// for the record being written when it happened, else for the ones after.
/// Fixed texts, so no provider answer or URL ends up in a record error.
fn batch_failure_message(error: &Error, current: bool) -> String {
    let reason = match error {
        Error::InvalidCredentials(_) => "the provider rejected the credential".to_owned(),
        Error::PermissionDenied(_) => "the credential may not write subscribers".to_owned(),
        Error::RateLimited { retry_after: Some(seconds) } => {
            format!("the provider is rate-limiting; retry after {seconds}s")
        }
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

    fn keyed(mode: WriteMode, fields: &[&str]) -> Result<WriteKind> {
        WriteKind::of(mode, &fields.iter().map(|f| f.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn every_mode_is_supported() {
        assert_eq!(WriteKind::of(WriteMode::Insert, &[]).unwrap(), WriteKind::Insert);
        assert_eq!(WriteKind::of(WriteMode::Upsert, &[]).unwrap(), WriteKind::Upsert(Key::Email));
        assert_eq!(WriteKind::of(WriteMode::Update, &[]).unwrap(), WriteKind::Update(Key::Email));
        assert_eq!(WriteKind::of(WriteMode::Delete, &[]).unwrap(), WriteKind::Delete(Key::Email));
    }

    #[test]
    fn keyed_modes_match_by_email_unless_the_key_is_uuid() {
        type Case = (WriteMode, fn(Key) -> WriteKind, &'static str);
        let modes: [Case; 3] = [
            (WriteMode::Upsert, WriteKind::Upsert, "upserted"),
            (WriteMode::Update, WriteKind::Update, "updated"),
            (WriteMode::Delete, WriteKind::Delete, "deleted"),
        ];
        for (mode, kind, verb) in modes {
            assert_eq!(keyed(mode, &[]).unwrap(), kind(Key::Email));
            assert_eq!(keyed(mode, &["email"]).unwrap(), kind(Key::Email));
            assert_eq!(keyed(mode, &["uuid"]).unwrap(), kind(Key::Uuid));
            for bad in [&["first_name"][..], &["email", "uuid"][..]] {
                match keyed(mode, bad) {
                    Err(Error::Unsupported(message)) => {
                        assert!(message.contains(verb), "{message}");
                    }
                    other => panic!("{mode:?} by {bad:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn the_keys_are_those_the_subscriber_schema_advertises() {
        let [default, other] = crate::streams::SUBSCRIBER_WRITE_KEYS;
        assert_eq!(Key::of("updated", &[]).unwrap(), Key::Email);
        assert_eq!(Key::of("updated", &[default.to_owned()]).unwrap(), Key::Email);
        assert_eq!(Key::of("updated", &[other.to_owned()]).unwrap(), Key::Uuid);
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
            (json!({ "email": "a@b.c", "extra_attributes": "plan=pro" }), "`extra_attributes`"),
        ] {
            let message = checked(record.clone()).unwrap_err();
            assert!(message.contains(field), "{record}: {message}");
            assert!(!message.contains("not-an-address") && !message.contains("plan=pro"));
        }
    }

    #[test]
    fn an_upsert_by_uuid_needs_a_usable_uuid() {
        let kind = WriteKind::Upsert(Key::Uuid);
        let record = json!({ "email": "a@b.c", "uuid": "../x" });
        assert!(Subscriber::from_record(&record, kind).is_err());
        let record = json!({ "email": "a@b.c", "uuid": "2a0c72d9-f91a" });
        let s = Subscriber::from_record(&record, kind).unwrap();
        assert_eq!(s.target, Some(Target::Uuid("2a0c72d9-f91a".into())));
        assert!(!s.body.as_object().unwrap().contains_key("uuid"));
    }

    #[test]
    fn an_update_checks_the_record_as_an_upsert_does() {
        for key in [Key::Email, Key::Uuid] {
            let (update, upsert) = (WriteKind::Update(key), WriteKind::Upsert(key));
            for record in [
                json!({ "email": "a@b.c", "uuid": "s1", "first_name": "Ada" }),
                json!({ "email": "a@b.c", "uuid": "s1", "first_name": 7 }),
                json!({ "uuid": "s1", "first_name": "Ada" }),
            ] {
                assert_eq!(
                    Subscriber::from_record(&record, update),
                    Subscriber::from_record(&record, upsert),
                    "{record}"
                );
            }
        }
        let record = json!({ "email": " a@b.c ", "last_name": "Lovelace" });
        let s = Subscriber::from_record(&record, WriteKind::Update(Key::Email)).unwrap();
        assert_eq!(s.target, Some(Target::Email("a@b.c".into())));
        assert_eq!(s.body, json!({ "email": "a@b.c", "last_name": "Lovelace" }));
    }

    #[test]
    fn a_delete_needs_only_its_key_field() {
        let by_email = WriteKind::Delete(Key::Email);
        let by_uuid = WriteKind::Delete(Key::Uuid);
        let record = json!({
            "email": " ada@example.com ",
            "first_name": 7,
            "extra_attributes": "plan=pro"
        });
        let s = Subscriber::from_record(&record, by_email).unwrap();
        assert_eq!(s.target, Some(Target::Email("ada@example.com".into())));
        assert_eq!(s.body, Value::Null);

        let s = Subscriber::from_record(&json!({ "uuid": "2a0c72d9" }), by_uuid).unwrap();
        assert_eq!(s.target, Some(Target::Uuid("2a0c72d9".into())));

        for (record, kind, field) in [
            (json!({ "uuid": "2a0c72d9" }), by_email, "`email`"),
            (json!({ "email": "not-an-address" }), by_email, "`email`"),
            (json!({ "email": "a@b.c" }), by_uuid, "`uuid`"),
            (json!({ "email": "a@b.c", "uuid": "a/b" }), by_uuid, "`uuid`"),
            (json!(["a@b.c"]), by_email, "JSON object"),
        ] {
            let message = Subscriber::from_record(&record, kind).unwrap_err();
            assert!(message.contains(field), "{record}: {message}");
            assert!(!message.contains("not-an-address") && !message.contains("a/b"));
        }
    }

    #[test]
    fn an_update_without_a_subscriber_fails_the_record() {
        let no_match = Outcome::Failed("no subscriber matches this record".into());
        assert_eq!(updated(None), no_match);
        assert_eq!(updated(Some(WriteAnswer::Refused { status: 404, fields: vec![] })), no_match);
        assert_eq!(updated(Some(WriteAnswer::Accepted)), Outcome::Written);
        assert_eq!(
            updated(Some(WriteAnswer::Refused { status: 422, fields: vec!["email".into()] })),
            Outcome::Failed(refusal_message(422, &["email".into()]))
        );
    }

    #[test]
    fn deleting_a_missing_subscriber_counts_as_written() {
        assert_eq!(deleted(None), Outcome::Written);
        assert_eq!(deleted(Some(WriteAnswer::Refused { status: 404, fields: vec![] })), Outcome::Written);
        assert_eq!(deleted(Some(WriteAnswer::Accepted)), Outcome::Written);
        assert_eq!(
            deleted(Some(WriteAnswer::Refused { status: 409, fields: vec![] })),
            Outcome::Failed("the provider refused the record (HTTP 409)".into())
        );
    }

    #[test]
    fn refusals_name_the_status_and_fields() {
        assert_eq!(
            refusal_message(422, &["email".into()]),
            "the provider refused the record (HTTP 422); fields in question: email"
        );
        assert_eq!(refusal_message(409, &[]), "the provider refused the record (HTTP 409)");
    }

    #[test]
    fn batch_failures_use_fixed_texts() {
        let error = Error::InvalidCredentials("HTTP 401 from POST https://x/api/...: ada@example.com".into());
        let message = batch_failure_message(&error, false);
        assert_eq!(message, "not written: the provider rejected the credential");
        assert_eq!(
            batch_failure_message(&Error::RateLimited { retry_after: Some(30) }, false),
            "not written: the provider is rate-limiting; retry after 30s"
        );
        assert!(batch_failure_message(&Error::ProviderUnavailable("x".into()), true).contains("may or may not"));
    }
}
