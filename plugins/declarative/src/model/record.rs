//! What becomes of a page: the `RecordSelector` (its `DpathExtractor`
//! and `RecordFilter`), and the stream's transformations (`AddFields`,
//! `RemoveFields`).

use serde_json::Value;

use super::node::{Node, Refusal, template_of};
use crate::interpolation::{Template, Val};

/// The record selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    /// The extractor's field path, each segment a template over the
    /// configuration and the extractor's parameters.
    pub field_path: Vec<Template>,
    pub extractor_parameters: Val,
    pub filter: Option<Template>,
    pub filter_parameters: Val,
    /// Whether records are transformed before the filter sees them (unset:
    /// only for a client-side incremental stream, as in the CDK).
    pub transform_before_filtering: Option<bool>,
}

impl Selector {
    pub(crate) fn read(node: &Node) -> Result<Selector, Refusal> {
        node.expect(&["RecordSelector"], &[])?;
        let transform_before_filtering = match node.get("transform_before_filtering") {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(Refusal::new(node.below("transform_before_filtering"), "expected true or false")),
        };
        match node.get("schema_normalization") {
            None => {}
            Some(Value::String(s)) if s == "None" => {}
            Some(_) => {
                return Err(Refusal::new(
                    node.below("schema_normalization"),
                    "schema normalization is not supported yet",
                ));
            }
        }
        let extractor = node
            .child("extractor")
            .ok_or_else(|| Refusal::new(node.pointer(), "a RecordSelector needs an extractor"))??;
        extractor.expect(&["DpathExtractor"], &["record_expander"])?;
        let field_path = match extractor.get("field_path") {
            None => Vec::new(),
            Some(Value::Array(path)) => path
                .iter()
                .enumerate()
                .map(|(i, s)| template_of(s, &format!("{}/{i}", extractor.below("field_path"))))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(Refusal::new(extractor.below("field_path"), "expected a list")),
        };
        let (filter, filter_parameters) = match node.child("record_filter") {
            None => (None, Val::Dict(Vec::new())),
            Some(f) => {
                let f = f?;
                f.expect(&["RecordFilter"], &[])?;
                (f.template("condition")?.filter(|t| !t.source().is_empty()), f.parameters_val())
            }
        };
        Ok(Selector {
            field_path,
            extractor_parameters: extractor.parameters_val(),
            filter,
            filter_parameters,
            transform_before_filtering,
        })
    }
}

/// A type an added field's value must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    String,
    Integer,
    Number,
    Boolean,
}

impl ValueType {
    /// Whether `v` is of this type, as Python's `isinstance` answers.
    pub fn admits(self, v: &Val) -> bool {
        match self {
            ValueType::String => matches!(v, Val::Str(_)),
            // bool is an int in Python.
            ValueType::Integer => matches!(v, Val::Int(_) | Val::Bool(_)),
            ValueType::Number => matches!(v, Val::Float(_)),
            ValueType::Boolean => matches!(v, Val::Bool(_)),
        }
    }
}

/// A field `AddFields` sets.
#[derive(Debug, Clone, PartialEq)]
pub struct AddedField {
    pub path: Vec<String>,
    pub value: Template,
    pub value_type: Option<ValueType>,
}

/// A record transformation.
#[derive(Debug, Clone, PartialEq)]
pub enum Transformation {
    AddFields { fields: Vec<AddedField>, condition: Option<Template>, parameters: Val },
    RemoveFields { pointers: Vec<Vec<String>>, condition: Option<Template>, parameters: Val },
}

impl Transformation {
    pub(crate) fn read(node: &Node) -> Result<Transformation, Refusal> {
        match node.kind() {
            "AddFields" => {
                node.expect(&["AddFields"], &[])?;
                let fields = node
                    .children("fields")?
                    .iter()
                    .map(|f| {
                        f.expect(&["AddedFieldDefinition"], &[])?;
                        let path = strings(f, "path")?;
                        if path.is_empty() {
                            return Err(Refusal::new(f.below("path"), "an added field needs a path"));
                        }
                        let value = f
                            .template("value")?
                            .ok_or_else(|| Refusal::new(f.pointer(), "an added field needs a value"))?;
                        let value_type = match f.text("value_type")? {
                            None => None,
                            Some("string") => Some(ValueType::String),
                            Some("integer") => Some(ValueType::Integer),
                            Some("number") => Some(ValueType::Number),
                            Some("boolean") => Some(ValueType::Boolean),
                            Some(other) => {
                                return Err(Refusal::new(
                                    f.below("value_type"),
                                    format!("the type {other} is not one"),
                                ));
                            }
                        };
                        Ok(AddedField { path, value, value_type })
                    })
                    .collect::<Result<_, _>>()?;
                let condition = node.template("condition")?.filter(|t| !t.source().is_empty());
                Ok(Transformation::AddFields { fields, condition, parameters: node.parameters_val() })
            }
            "RemoveFields" => {
                node.expect(&["RemoveFields"], &[])?;
                let pointers = node
                    .get("field_pointers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|p| match p {
                        Value::Array(segments) => Ok(segments
                            .iter()
                            .map(|s| s.as_str().map(str::to_owned).unwrap_or_else(|| s.to_string()))
                            .collect()),
                        _ => Err(Refusal::new(node.below("field_pointers"), "expected lists of field names")),
                    })
                    .collect::<Result<_, _>>()?;
                let condition = node.template("condition")?.filter(|t| !t.source().is_empty());
                Ok(Transformation::RemoveFields { pointers, condition, parameters: node.parameters_val() })
            }
            _ => Err(node.unsupported_type()),
        }
    }
}

/// A list of strings.
pub(crate) fn strings(node: &Node, key: &str) -> Result<Vec<String>, Refusal> {
    match node.get(key) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| match s {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                _ => Err(Refusal::new(node.below(key), "expected a list of strings")),
            })
            .collect(),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(_) => Err(Refusal::new(node.below(key), "expected a list of strings")),
    }
}
