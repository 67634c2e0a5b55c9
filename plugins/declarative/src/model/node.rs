//! Reading one component of a resolved manifest: its type, its fields and
//! its templates, each refusal naming the JSON pointer of what it refuses.

use serde_json::{Map, Value};

use crate::interpolation::{Template, Val};

/// Why a manifest cannot run here: the JSON pointer of the component or
/// field (in the manifest with its references resolved), and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub pointer: String,
    pub reason: String,
}

impl Refusal {
    pub fn new(pointer: impl Into<String>, reason: impl Into<String>) -> Refusal {
        Refusal { pointer: pointer.into(), reason: reason.into() }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pointer = if self.pointer.is_empty() { "/" } else { &self.pointer };
        write!(f, "{pointer}: {}", self.reason)
    }
}

impl std::error::Error for Refusal {}

/// One component: its fields, its pointer, and the `$parameters` it sees.
#[derive(Debug, Clone)]
pub(crate) struct Node<'a> {
    pub fields: &'a Map<String, Value>,
    pointer: String,
}

static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();

impl<'a> Node<'a> {
    /// The component at `pointer`, which must be an object.
    pub fn at(value: &'a Value, pointer: impl Into<String>) -> Result<Node<'a>, Refusal> {
        let pointer = pointer.into();
        match value {
            Value::Object(fields) => Ok(Node { fields, pointer }),
            _ => Err(Refusal::new(pointer, "expected a component (an object)")),
        }
    }

    pub fn pointer(&self) -> &str {
        &self.pointer
    }

    /// The pointer of `field` below this component.
    pub fn below(&self, field: &str) -> String {
        format!("{}/{}", self.pointer, field.replace('~', "~0").replace('/', "~1"))
    }

    /// The component's type.
    pub fn kind(&self) -> &'a str {
        self.fields.get("type").and_then(Value::as_str).unwrap_or("")
    }

    /// The `$parameters` the component sees (already handed down).
    pub fn parameters(&self) -> &'a Map<String, Value> {
        match self.fields.get("$parameters") {
            Some(Value::Object(p)) => p,
            _ => EMPTY.get_or_init(Map::new),
        }
    }

    /// The parameters as a template variable.
    pub fn parameters_val(&self) -> Val {
        crate::interpolation::value::dict(self.parameters())
    }

    /// Refuses a type outside `types`, and any field of `refused` (fields
    /// the CDK's schema defines and this runtime does not do yet) that is
    /// set. Fields outside the schema are ignored, as the CDK ignores them
    /// (a parameter handed down lands in every component).
    pub fn expect(&self, types: &[&str], refused: &[&str]) -> Result<(), Refusal> {
        let kind = self.kind();
        if !types.contains(&kind) {
            return Err(self.unsupported_type());
        }
        let parameters = self.parameters();
        for key in refused {
            let Some(value) = self.fields.get(*key) else { continue };
            if parameters.get(*key) == Some(value) || is_off(value) {
                continue;
            }
            return Err(Refusal::new(self.below(key), format!("{kind}.{key} is not supported yet")));
        }
        Ok(())
    }

    /// The refusal of this component's type.
    pub fn unsupported_type(&self) -> Refusal {
        let kind = self.kind();
        if kind.starts_with("Custom") || self.fields.contains_key("class_name") {
            let class = self.fields.get("class_name").and_then(Value::as_str).unwrap_or("");
            return Refusal::new(
                self.pointer.clone(),
                format!("{kind} {class} runs Python code, which never runs here").replace("  ", " "),
            );
        }
        if kind.is_empty() {
            return Refusal::new(self.pointer.clone(), "a component without a type");
        }
        Refusal::new(self.pointer.clone(), format!("{kind} is not supported yet"))
    }

    /// A field's value, if present and not null.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.fields.get(key).filter(|v| !v.is_null())
    }

    /// A child component.
    pub fn child(&self, key: &str) -> Option<Result<Node<'a>, Refusal>> {
        self.get(key).map(|v| Node::at(v, self.below(key)))
    }

    /// The components of a list field, each with its pointer.
    pub fn children(&self, key: &str) -> Result<Vec<Node<'a>>, Refusal> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => {
                items.iter().enumerate().map(|(i, v)| Node::at(v, format!("{}/{i}", self.below(key)))).collect()
            }
            Some(_) => Err(Refusal::new(self.below(key), "expected a list")),
        }
    }

    /// A string field.
    pub fn text(&self, key: &str) -> Result<Option<&'a str>, Refusal> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(Refusal::new(self.below(key), "expected a string")),
        }
    }

    /// A boolean field (absent is false).
    pub fn flag(&self, key: &str) -> Result<bool, Refusal> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Refusal::new(self.below(key), "expected true or false")),
        }
    }

    /// A string field parsed as a template; a number or boolean is read
    /// as its text, as the CDK's `InterpolatedString` does.
    pub fn template(&self, key: &str) -> Result<Option<Template>, Refusal> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => template_of(value, &self.below(key)).map(Some),
        }
    }
}

/// A value read as a template, refused by `pointer` where it cannot be.
pub(crate) fn template_of(value: &Value, pointer: &str) -> Result<Template, Refusal> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        _ => return Err(Refusal::new(pointer, "expected a string")),
    };
    Template::parse(&text).map_err(|e| Refusal::new(pointer, format!("the template is {e}")))
}

/// A field whose value does nothing: absent, null, false, empty.
fn is_off(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}
