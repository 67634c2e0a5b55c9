//! Partition routers: a stream read once per value of a list
//! (`ListPartitionRouter`), once per record of a parent stream
//! (`SubstreamPartitionRouter`), or once per combination of several.

use serde_json::Value;

use super::node::{Node, Refusal, template_of};
use super::request::RequestOption;
use super::{Stream, read_stream};
use crate::interpolation::{Context, Template, Val};

/// One partition router.
#[derive(Debug, Clone, PartialEq)]
pub enum Router {
    List { values: Vec<Val>, cursor_field: String, option: Option<RequestOption> },
    Substream { parents: Vec<Parent> },
}

/// A `ParentStreamConfig`.
#[derive(Debug, Clone, PartialEq)]
pub struct Parent {
    pub stream: Box<Stream>,
    /// The parent record's field (a `/`-separated dpath).
    pub parent_key: String,
    pub partition_field: String,
    pub option: Option<RequestOption>,
    pub extra_fields: Vec<Vec<String>>,
}

impl Router {
    /// The routers of a retriever's `partition_router` (one, or a list
    /// combined as a cartesian product).
    pub(crate) fn read_all(node: &Node, config: &Val, ctx: &Context) -> Result<Vec<Router>, Refusal> {
        match node.get("partition_router") {
            None => Ok(Vec::new()),
            Some(Value::Array(_)) => {
                node.children("partition_router")?.iter().map(|r| Router::read(r, config, ctx)).collect()
            }
            Some(_) => {
                let router = node.child("partition_router").into_iter().next().transpose()?;
                router.map(|r| Router::read(&r, config, ctx)).into_iter().collect()
            }
        }
    }

    fn read(node: &Node, config: &Val, ctx: &Context) -> Result<Router, Refusal> {
        let ctx = ctx.clone().with("config", config.clone()).with("parameters", node.parameters_val());
        let text = |t: &Template, at: String| -> Result<String, Refusal> {
            t.eval_string(&ctx)
                .map(|v| v.to_text())
                .map_err(|e| Refusal::new(at, format!("cannot be read from the configuration: {e}")))
        };
        match node.kind() {
            "ListPartitionRouter" => {
                node.expect(&["ListPartitionRouter"], &[])?;
                let values = match node.get("values") {
                    Some(Value::Array(items)) => items.iter().map(Val::from).collect(),
                    Some(v @ Value::String(_)) => {
                        let t = template_of(v, &node.below("values"))?;
                        match t.eval_string(&ctx) {
                            Ok(Val::List(items)) => items,
                            Ok(other) => {
                                return Err(Refusal::new(
                                    node.below("values"),
                                    format!("the values must be a list, not {}", other.type_name()),
                                ));
                            }
                            Err(e) => {
                                return Err(Refusal::new(node.below("values"), format!("cannot be evaluated: {e}")));
                            }
                        }
                    }
                    _ => return Err(Refusal::new(node.below("values"), "expected a list or a template")),
                };
                let cursor_field = node
                    .template("cursor_field")?
                    .ok_or_else(|| Refusal::new(node.pointer(), "a ListPartitionRouter needs cursor_field"))?;
                let cursor_field = text(&cursor_field, node.below("cursor_field"))?;
                let option = node.child("request_option").transpose()?.map(|o| RequestOption::read(&o)).transpose()?;
                Ok(Router::List { values, cursor_field, option })
            }
            "SubstreamPartitionRouter" => {
                node.expect(&["SubstreamPartitionRouter"], &[])?;
                let parents = node
                    .children("parent_stream_configs")?
                    .iter()
                    .map(|p| {
                        p.expect(&["ParentStreamConfig"], &["incremental_dependency", "lazy_read_pointer"])?;
                        let stream = p
                            .child("stream")
                            .ok_or_else(|| Refusal::new(p.pointer(), "a ParentStreamConfig needs stream"))??;
                        let stream = read_stream(&stream, config, ctx.now)?;
                        let parent_key = p
                            .template("parent_key")?
                            .ok_or_else(|| Refusal::new(p.pointer(), "a ParentStreamConfig needs parent_key"))?;
                        let partition_field = p
                            .template("partition_field")?
                            .ok_or_else(|| Refusal::new(p.pointer(), "a ParentStreamConfig needs partition_field"))?;
                        let extra_fields = match p.get("extra_fields") {
                            None => Vec::new(),
                            Some(Value::Array(paths)) => paths
                                .iter()
                                .map(|path| match path {
                                    Value::Array(_) => Ok(path
                                        .as_array()
                                        .into_iter()
                                        .flatten()
                                        .map(|s| s.as_str().map(str::to_owned).unwrap_or_else(|| s.to_string()))
                                        .collect()),
                                    _ => Err(Refusal::new(p.below("extra_fields"), "expected lists of field names")),
                                })
                                .collect::<Result<_, _>>()?,
                            Some(_) => return Err(Refusal::new(p.below("extra_fields"), "expected a list")),
                        };
                        Ok(Parent {
                            stream: Box::new(stream),
                            parent_key: text(&parent_key, p.below("parent_key"))?,
                            partition_field: text(&partition_field, p.below("partition_field"))?,
                            option: p
                                .child("request_option")
                                .transpose()?
                                .map(|o| RequestOption::read(&o))
                                .transpose()?,
                            extra_fields,
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Router::Substream { parents })
            }
            _ => Err(node.unsupported_type()),
        }
    }
}
