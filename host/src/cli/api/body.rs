//! Request bodies from the command line: a whole body as JSON (`--data`,
//! inline, `@file` or `-` for standard input), fields one by one (`--set
//! name=value`, dotted names for nested fields), and the commands' own
//! options set over both. JSON that does not parse is a usage error.

use serde_json::{Map, Value};

use crate::cli::client::CliFailure;

/// The body options every writing command shares.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Fields {
    /// The request body as JSON: inline, `@FILE`, or `-` for standard input.
    /// The command's own options are set over it.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    pub data: Option<Value>,
    /// One body field, `NAME=VALUE`: the value is read as JSON when it is
    /// JSON (`limit=3`, `paused=true`, `ids=["a"]`), else as text; a
    /// dotted name sets a nested field (`configuration.base_url=https://…`).
    /// Repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = assignment)]
    pub set: Vec<(String, Value)>,
}

impl Fields {
    /// The body: `--data`, then each `--set`.
    pub fn body(&self) -> Body {
        let mut body = Body(match &self.data {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        });
        for (name, value) in &self.set {
            body.set_path(name, value.clone());
        }
        body
    }
}

/// A JSON object being put together.
#[derive(Debug, Clone, Default)]
pub struct Body(pub Map<String, Value>);

impl Body {
    /// Sets `name` when the option was given.
    pub(crate) fn opt(&mut self, name: &str, value: Option<impl Into<Value>>) -> &mut Body {
        if let Some(v) = value {
            self.0.insert(name.to_owned(), v.into());
        }
        self
    }

    /// Sets a dotted path, making objects on the way.
    pub fn set_path(&mut self, path: &str, value: Value) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap_or_default();
        let mut here = &mut self.0;
        for p in parts {
            let slot = here.entry(p.to_owned()).or_insert_with(|| Value::Object(Map::new()));
            if !slot.is_object() {
                *slot = Value::Object(Map::new());
            }
            here = slot.as_object_mut().expect("made an object above");
        }
        here.insert(last.to_owned(), value);
    }

    /// Fails with a usage error unless every field is set; each is named
    /// with the option that sets it.
    pub fn require(&self, fields: &[(&str, &str)]) -> Result<(), CliFailure> {
        let missing: Vec<&str> =
            fields.iter().filter(|(name, _)| !self.0.contains_key(*name)).map(|(_, option)| *option).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CliFailure::Usage(format!("missing {} (or give it in --data or --set)", missing.join(", "))))
        }
    }

    pub(crate) fn into_value(self) -> Value {
        Value::Object(self.0)
    }
}

/// JSON text, `@FILE` or `-` (standard input), parsed.
pub(crate) fn json_value(arg: &str) -> Result<Value, String> {
    let text = if arg == "-" {
        std::io::read_to_string(std::io::stdin()).map_err(|e| format!("standard input: {e}"))?
    } else if let Some(file) = arg.strip_prefix('@') {
        std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?
    } else {
        arg.to_owned()
    };
    serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))
}

/// Like [`json_value`], and it must be an object.
pub(crate) fn json_object(arg: &str) -> Result<Value, String> {
    let v = json_value(arg)?;
    if v.is_object() { Ok(v) } else { Err("must be a JSON object".into()) }
}

/// `NAME=VALUE`, the value JSON when it parses as JSON, else text.
fn assignment(arg: &str) -> Result<(String, Value), String> {
    let (name, value) = arg.split_once('=').ok_or("must be NAME=VALUE")?;
    if name.is_empty() || name.split('.').any(str::is_empty) {
        return Err("the name must not be empty".into());
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    Ok((name.to_owned(), value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_merge_data_then_assignments_then_options() {
        let fields = Fields {
            data: Some(json!({ "name": "from data", "configuration": { "a": 1 } })),
            set: vec![
                assignment("configuration.base_url=https://m.example").unwrap(),
                assignment("paused=true").unwrap(),
                assignment("n=3").unwrap(),
            ],
        };
        let mut body = fields.body();
        body.opt("name", Some("from option"));
        body.opt("label", None::<String>);
        assert_eq!(
            body.clone().into_value(),
            json!({ "name": "from option", "configuration": { "a": 1, "base_url": "https://m.example" }, "paused": true, "n": 3 })
        );
        assert!(body.require(&[("name", "--name"), ("configuration", "--config")]).is_ok());
        let e = body.require(&[("source_id", "--source"), ("name", "--name")]).unwrap_err();
        assert_eq!(e.to_string(), "missing --source (or give it in --data or --set)");
        assert_eq!(e.exit_code(), 2);
        assert!(assignment("novalue").is_err() && assignment("=1").is_err() && assignment("a..b=1").is_err());
        assert!(json_object("[1]").is_err() && json_value("{").is_err());
    }
}
