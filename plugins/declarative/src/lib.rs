//! Airbyte's declarative ("low-code") source manifests, as the platform
//! reads them.
//!
//! A manifest's strings may hold Jinja expressions over the source's
//! configuration, the stream's slice, the page token, the last response
//! and a handful of macros. Airbyte's CDK renders them with Jinja2 in a
//! Python process; here they are parsed once and evaluated by
//! [`interpolation`], a subset of Jinja2 with Airbyte's macros, filters
//! and the Python methods manifests call, giving the values the CDK
//! gives (a rendered string that reads as a Python literal becomes that
//! literal, as the CDK's `literal_eval` does). Anything outside the
//! subset is refused when parsed, by name.
//!
//! Values read from JSON keep their keys in the order written
//! ([`interpolation::Val`] deserialises directly), as Python's dicts do: a
//! record rendered into a string reads as the CDK renders it.
//!
//! Pure: no I/O, and no clock of its own (`now_utc()` is the instant the
//! caller gives), so the server and the plugin evaluate alike.
//!
//! # Layout
//!
//! | module | holds |
//! |---|---|
//! | [`datetime`] | dates read and written as Python and the CDK do, ISO 8601 durations |
//! | [`interpolation`] | templates: parsing, evaluation, values, macros, filters, methods |
//! | [`resolve`] | references, default types and `$parameters`, as the CDK applies them |
//! | [`extract`] | a page's records at a `DpathExtractor`'s field path, left as the page's text, and the parts of it templates read |
//! | [`paginate`] | the next page's token (cursor, page and offset strategies), Link headers |
//! | [`model`] | the manifest's components read into types, anything unsupported refused by JSON pointer |
//! | [`secrets`] | the configuration's secret fields, markers in their place, and where a request may carry one |
//! | [`retrieve`] | reading a stream: slices, requests, pages, records, through a transport |

pub mod datetime;
pub mod extract;
pub mod interpolation;
pub mod model;
pub mod paginate;
pub mod resolve;
pub mod retrieve;
pub mod secrets;
