//! Secrets a manifest names, kept out of the guest. The configuration the
//! runtime evaluates holds, for every secret field, a marker instead of a
//! value; a rendered request part that is exactly a marker is where the
//! host puts the secret (a header, a query parameter, a body field, a
//! Basic password). A marker with other text around it, or one a template
//! transformed (encoded, sliced, put into a record), would need the value
//! itself: refused, by the JSON pointer of the template.
//!
//! Which fields are secret: those the spec marks `airbyte_secret` (in an
//! array's items too: each item's field, `/apps/0/key`), and any field an
//! authenticator's token or password reads, marked or not.

use serde_json::Value;

use crate::interpolation::Val;

/// The marker that stands for secret number `index`.
fn marker(index: usize, salt: &str) -> String {
    format!("\u{1}secret{salt}{index}\u{1}")
}

/// The secret fields of a configuration, as JSON pointers
/// (`/credentials/api_key`), in a fixed order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Secrets {
    pub pointers: Vec<String>,
}

/// A rendered value's relation to the secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// No secret.
    Nothing,
    /// Exactly the secret at this pointer.
    Secret(String),
    /// `Bearer ` and the secret (an `Authorization` header).
    BearerSecret(String),
    /// One secret, once, with fixed text before or after it: the host
    /// may write it so (`Token token="<secret>"`).
    Around { pointer: String, prefix: String, suffix: String },
    /// A secret with other text: the guest would have to write it.
    Mixed(String),
}

impl Secrets {
    /// The secret fields a spec's connection specification marks, found
    /// through `properties`, `oneOf`/`anyOf`/`allOf` branches included,
    /// and in an array's `items` each item of `config` has.
    pub fn of_spec(spec: &Value, config: &Val) -> Secrets {
        let mut found = Vec::new();
        walk_spec(spec, "", &mut found);
        let mut pointers = Vec::new();
        for pointer in found {
            expand(config, "", &segments(&pointer).collect::<Vec<_>>(), &mut pointers);
        }
        pointers.sort();
        pointers.dedup();
        Secrets { pointers }
    }

    /// Adds a field (a pointer) if it is not there yet.
    pub fn add(&mut self, pointer: &str) {
        if !self.pointers.iter().any(|p| p == pointer) {
            self.pointers.push(pointer.to_owned());
        }
    }

    /// `config` with a marker at each secret field `given` names (the
    /// fields a credential is given for; objects on the way are made), and
    /// at every other secret field whose object the configuration has (a
    /// secret the manifest uses and no credential is given for is then
    /// found, and refused by name, rather than read as missing).
    pub fn mark(&self, config: &Val, given: &[String]) -> Val {
        self.mark_with(config, given, "")
    }

    fn mark_with(&self, config: &Val, given: &[String], salt: &str) -> Val {
        let mut marked = config.clone();
        for (i, pointer) in self.pointers.iter().enumerate() {
            let parent = &pointer[..pointer.rfind('/').unwrap_or(0)];
            if given.contains(pointer)
                || parent.is_empty()
                || get(config, parent).is_some_and(|p| matches!(p, Val::Dict(_) | Val::List(_)))
            {
                set(&mut marked, pointer, Val::Str(marker(i, salt)));
            }
        }
        marked
    }

    /// The same configuration with other markers: a template whose
    /// rendering differs between the two reads a secret.
    pub fn mark_again(&self, config: &Val, given: &[String]) -> Val {
        self.mark_with(config, given, "'")
    }

    /// What a rendered text holds of the secrets.
    pub fn holds(&self, text: &str) -> Holds {
        if !text.contains('\u{1}') {
            return Holds::Nothing;
        }
        for (i, pointer) in self.pointers.iter().enumerate() {
            for m in [marker(i, ""), marker(i, "'")] {
                if text == m {
                    return Holds::Secret(pointer.clone());
                }
                if text.strip_prefix("Bearer ") == Some(m.as_str()) {
                    return Holds::BearerSecret(pointer.clone());
                }
                if let Some((prefix, suffix)) = text.split_once(m.as_str())
                    && !prefix.contains('\u{1}')
                    && !suffix.contains('\u{1}')
                {
                    return Holds::Around {
                        pointer: pointer.clone(),
                        prefix: prefix.to_owned(),
                        suffix: suffix.to_owned(),
                    };
                }
                if text.contains(&m) {
                    return Holds::Mixed(pointer.clone());
                }
            }
        }
        Holds::Mixed(String::new())
    }

    /// Whether a record (JSON) holds any marker anywhere, walked in place.
    pub fn touches_json(&self, v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\u{1}'),
            Value::Array(items) => items.iter().any(|i| self.touches_json(i)),
            Value::Object(map) => map.iter().any(|(k, v)| k.contains('\u{1}') || self.touches_json(v)),
            _ => false,
        }
    }

    /// Whether a value holds any marker anywhere.
    pub fn touches(&self, v: &Val) -> bool {
        match v {
            Val::Str(s) => s.contains('\u{1}'),
            Val::List(items) => items.iter().any(|i| self.touches(i)),
            Val::Dict(entries) => entries.iter().any(|(k, v)| k.contains('\u{1}') || self.touches(v)),
            _ => false,
        }
    }

    /// Whether `config` has a value at a secret's pointer (a secret given
    /// in the clear).
    pub fn given_in(&self, config: &Val) -> Option<&str> {
        self.pointers.iter().find(|p| get(config, p).is_some_and(|v| !matches!(v, Val::None))).map(String::as_str)
    }
}

fn walk_spec(schema: &Value, at: &str, out: &mut Vec<String>) {
    let Some(obj) = schema.as_object() else { return };
    if obj.get("airbyte_secret").and_then(Value::as_bool) == Some(true) && !at.is_empty() {
        out.push(at.to_owned());
    }
    if let Some(Value::Object(props)) = obj.get("properties") {
        for (k, v) in props {
            walk_spec(v, &format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
        }
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(Value::Array(branches)) = obj.get(key) {
            for b in branches {
                walk_spec(b, at, out);
            }
        }
    }
    if let Some(items @ Value::Object(_)) = obj.get("items") {
        walk_spec(items, &format!("{at}/{ITEMS}"), out);
    }
}

/// The segment that stands for every item of an array.
const ITEMS: &str = "\u{1}items";

/// The pointers `rest` names below `at`: each item of an array `config`
/// holds where `rest` names every item (none where it holds none).
fn expand(config: &Val, at: &str, rest: &[String], out: &mut Vec<String>) {
    let Some((first, rest)) = rest.split_first() else {
        out.push(at.to_owned());
        return;
    };
    if first == ITEMS {
        if let Some(Val::List(items)) = get(config, at) {
            for i in 0..items.len() {
                expand(config, &format!("{at}/{i}"), rest, out);
            }
        }
        return;
    }
    expand(config, &format!("{at}/{}", first.replace('~', "~0").replace('/', "~1")), rest, out);
}

fn segments(pointer: &str) -> impl Iterator<Item = String> + '_ {
    pointer.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~"))
}

/// An array index as a JSON pointer writes it (RFC 6901: `0`, or digits
/// without a leading zero), so one item has one pointer.
fn index(segment: &str) -> Option<usize> {
    let canonical = segment == "0" || (!segment.starts_with('0') && segment.bytes().all(|b| b.is_ascii_digit()));
    if canonical { segment.parse().ok() } else { None }
}

fn get<'a>(v: &'a Val, pointer: &str) -> Option<&'a Val> {
    let mut at = v;
    for s in segments(pointer) {
        at = match at {
            Val::List(items) => items.get(index(&s)?)?,
            _ => at.get(&s)?,
        };
    }
    Some(at)
}

/// Sets the value at `pointer`, making the objects on the way.
fn set(v: &mut Val, pointer: &str, value: Val) {
    let parts: Vec<String> = segments(pointer).collect();
    let Some((last, parents)) = parts.split_last() else { return };
    let mut at = v;
    for p in parents {
        // An array's item is set where the array has it, never made.
        if let Val::List(items) = at {
            match index(p).and_then(|i| items.get_mut(i)) {
                Some(item) => {
                    at = item;
                    continue;
                }
                None => return,
            }
        }
        let Val::Dict(entries) = at else { return };
        let index = match entries.iter().position(|(k, _)| k == p) {
            Some(i) => i,
            None => {
                entries.push((p.clone(), Val::Dict(Vec::new())));
                entries.len() - 1
            }
        };
        at = &mut entries[index].1;
    }
    // An array's item that is itself the secret.
    if let Val::List(items) = at {
        if let Some(slot) = index(last).and_then(|i| items.get_mut(i)) {
            *slot = value;
        }
        return;
    }
    if let Val::Dict(entries) = at {
        match entries.iter_mut().find(|(k, _)| k == last) {
            Some((_, slot)) => *slot = value,
            None => entries.push((last.clone(), value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_spec_marks_the_secrets_and_markers_are_found() {
        let spec = json!({ "properties": {
            "api_key": { "type": "string", "airbyte_secret": true },
            "start": { "type": "string" },
            "credentials": { "oneOf": [
                { "properties": { "access_token": { "airbyte_secret": true } } },
                { "properties": { "client_secret": { "airbyte_secret": true }, "client_id": {} } } ] } } });
        let config = Val::from(&json!({ "start": "2024", "credentials": { "access_token": null } }));
        let secrets = Secrets::of_spec(&spec, &config);
        assert_eq!(secrets.pointers, ["/api_key", "/credentials/access_token", "/credentials/client_secret"]);
        assert_eq!(secrets.given_in(&config), None);
        let given = ["/api_key".to_owned(), "/credentials/access_token".to_owned()];
        let marked = secrets.mark(&config, &given);
        let key = marked.get("api_key").unwrap().to_text();
        assert_eq!(secrets.holds(&key), Holds::Secret("/api_key".into()));
        assert_eq!(secrets.holds(&format!("Bearer {key}")), Holds::BearerSecret("/api_key".into()));
        assert_eq!(
            secrets.holds(&format!("Token token=\"{key}\"")),
            Holds::Around { pointer: "/api_key".into(), prefix: "Token token=\"".into(), suffix: "\"".into() }
        );
        assert_eq!(secrets.holds(&format!("{key}:{key}")), Holds::Mixed("/api_key".into()), "twice");
        assert_eq!(secrets.holds("plain"), Holds::Nothing);
        let token = marked.get("credentials").unwrap().get("access_token").unwrap().to_text();
        assert_eq!(secrets.holds(&token), Holds::Secret("/credentials/access_token".into()));
        assert_ne!(secrets.mark_again(&config, &given), marked);
        // Marked too, its object being there: a use of it is found.
        assert!(marked.get("credentials").unwrap().get("client_secret").is_some());
        let bare = secrets.mark(&Val::from(&json!({})), &[]);
        assert!(bare.get("api_key").is_some() && bare.get("credentials").is_none());
        let given = Val::from(&json!({ "api_key": "xyz" }));
        assert_eq!(secrets.given_in(&given), Some("/api_key"));
    }

    #[test]
    fn a_secret_in_an_array_s_items_is_each_item_s_field() {
        let spec = json!({ "properties": { "apps": { "type": "array", "items": { "type": "object",
            "properties": { "id": { "type": "string" }, "key": { "type": "string", "airbyte_secret": true } } } } } });
        let config = Val::from(&json!({ "apps": [{ "id": "a" }, { "id": "b" }] }));
        let secrets = Secrets::of_spec(&spec, &config);
        assert_eq!(secrets.pointers, ["/apps/0/key", "/apps/1/key"]);
        assert_eq!(secrets.given_in(&config), None);
        let clear = Val::from(&json!({ "apps": [{ "id": "a" }, { "id": "b", "key": "xyz" }] }));
        assert_eq!(secrets.given_in(&clear), Some("/apps/1/key"));
        let marked = secrets.mark(&config, &["/apps/1/key".to_owned()]);
        let apps = marked.get("apps").unwrap();
        let Val::List(items) = apps else { panic!("{apps:?}") };
        assert_eq!(secrets.holds(&items[1].get("key").unwrap().to_text()), Holds::Secret("/apps/1/key".into()));
        assert_eq!(items[1].get("id").unwrap().to_text(), "b");
        // Each item's object being there, its field is marked too.
        assert_eq!(secrets.holds(&items[0].get("key").unwrap().to_text()), Holds::Secret("/apps/0/key".into()));
        // One item, one pointer: `01` names none.
        assert_eq!(secrets.given_in(&Val::from(&json!({ "apps": [{}, { "key": "x" }] }))), Some("/apps/1/key"));
        let marked = secrets.mark(&config, &["/apps/01/key".to_owned()]);
        let Val::List(items) = marked.get("apps").unwrap() else { panic!() };
        assert_eq!(secrets.holds(&items[1].get("key").unwrap().to_text()), Holds::Secret("/apps/1/key".into()));
        // Items that are themselves the secret.
        let keys = json!({ "properties": { "keys": { "type": "array", "items": { "type": "string", "airbyte_secret": true } } } });
        let config = Val::from(&json!({ "keys": [null, null] }));
        let secrets = Secrets::of_spec(&keys, &config);
        assert_eq!(secrets.pointers, ["/keys/0", "/keys/1"]);
        let marked = secrets.mark(&config, &["/keys/1".to_owned()]);
        let Val::List(items) = marked.get("keys").unwrap() else { panic!() };
        assert_eq!(secrets.holds(&items[1].to_text()), Holds::Secret("/keys/1".into()));
        // No array, no item: nothing is made.
        assert!(Secrets::of_spec(&spec, &Val::from(&json!({}))).pointers.is_empty());
    }
}
