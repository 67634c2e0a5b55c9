"""The development corpus of Airbyte manifests, as the manifest checks
(`airbyte_*.py`) read it: each manifest, and a configuration made from its
spec (defaults, examples, else a sample of the declared type and format).
"""

import glob
import json
import os

import yaml


def manifests(corpus):
    """Each manifest of the corpus: its file name, its content, and a
    configuration made from its spec."""
    for path in sorted(glob.glob(os.path.join(corpus, "manifests", "*.yaml"))):
        manifest = yaml.safe_load(open(path))
        yield os.path.basename(path), manifest, sample("config", spec_of(path, manifest))


def sample(name, schema):
    """A value for a spec property: its default, an example, or one of its type."""
    if not isinstance(schema, dict):
        return "sample"
    if "default" in schema:
        default = schema["default"]
        # A default written as a schema (an object's properties): its sample.
        if isinstance(default, dict) and default.get("type") == "object" and "properties" in default:
            return sample(name, default)
        return default
    if schema.get("examples"):
        example = schema["examples"][0]
        # An array's example is sometimes one of its items, a string's a
        # number or a boolean as JSON writes it.
        if schema.get("type") == "array" and not isinstance(example, list):
            return [example]
        if schema.get("type") == "string" and not isinstance(example, str):
            return json.dumps(example)
        return example
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("oneOf", "anyOf"):
        if schema.get(key):
            return sample(name, schema[key][0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or "properties" in schema:
        return {k: sample(k, v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        item = sample(name, schema.get("items") or {"type": "string"})
        return [item, item]
    if kind == "integer":
        return 7
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if schema.get("airbyte_secret"):
        return f"secret-{name}"
    pattern = schema.get("pattern", "")
    # A date whose form only the description gives.
    description = schema.get("description") or ""
    if "YYYYMMDD" in description:
        return "20240115"
    if "YYYY-MM-DD" in description and kind in (None, "string"):
        return "2024-01-15"
    if schema.get("format") == "date-time" or "T" in pattern and "[0-9]{4}" in pattern:
        return "2024-01-15T00:00:00Z"
    if schema.get("format") == "date" or "date" in name or "[0-9]{4}-[0-9]{2}-[0-9]{2}" in pattern:
        return "2024-01-15"
    return f"sample-{name}"


def spec_of(path, manifest):
    spec = (manifest.get("spec") or {}).get("connection_specification")
    if spec:
        return spec
    name = os.path.basename(path)[: -len(".yaml")]
    extras = os.path.join(os.path.dirname(os.path.dirname(path)), "extras", name)
    for candidate in ("spec.yaml", "spec.json"):
        p = os.path.join(extras, candidate)
        if os.path.exists(p):
            loaded = yaml.safe_load(open(p))
            return loaded.get("connectionSpecification") or loaded.get("connection_specification") or {}
    return {}
