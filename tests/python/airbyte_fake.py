"""Differential reads of Airbyte manifests: a fake API made from a manifest,
and Airbyte's CDK reading it.

Serves plain HTTP on a loopback port (the test puts TLS in front of it for
the name in FAKE_HOST) and prints one JSON line {"port"}; then reads JSON
commands, one per line, and answers each with one line:

  {"load": PATH}   makes the fake API of the manifest at PATH: answers
                   {"manifest": the manifest with every url_base pointed at
                   https://FAKE_HOST/<its host>/…, "config": a configuration
                   (secrets included), "secrets": {pointer: value},
                   "streams": [names]}
  {"cdk": {"port": TLS_PORT, "ca": CA_FILE, "state": {stream: state},
           "limit": SECONDS}}
                   reads every stream of the loaded manifest with the CDK
                   (incremental where a stream has a cursor, from the
                   given states; clock frozen at NOW) through the TLS
                   front: {"records": {stream: [records]}, "states":
                   {stream: the last state}, "error": text or null,
                   "timed_out": whether the read passed its limit (the
                   fake refuses every request after it, which ends it)}
  {"requests": true}
                   the requests served since the last ask, each
                   {"method", "path", "query": [[k, v]…] sorted, "body"}

The fake API: each stream's path (its templates matched loosely) answers
pages of records made from the stream's schema, at the selector's field
path, for three pages (full, full, short or empty) as its paginator reads
them: counters from the request, cursors the fake hands out and finds
again in the next request, Link headers, next URLs. A stream whose
requester authenticates answers 401 unless a secret value of the
configuration is in the request (a header, the query, the body, Basic).
A stream with a DatetimeBasedCursor gives each record a cursor value in
the cursor's format: inside the window the request names (where the
manifest puts the window's bounds in requests), else a date before NOW
that depends on the record only.
"""

import base64
import datetime
import hashlib
import http.server
import importlib
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from unittest import mock

import requests
import yaml

sys.path.insert(0, os.path.dirname(__file__))
from airbyte_corpus import sample, spec_of  # noqa: E402
from airbyte_paginate import STEP, response_paths  # noqa: E402

from airbyte_cdk.sources.declarative.datetime.datetime_parser import DatetimeParser  # noqa: E402
from airbyte_cdk.sources.declarative.decoders import JsonDecoder  # noqa: E402
from airbyte_cdk.sources.declarative.interpolation import InterpolatedString  # noqa: E402
from airbyte_cdk.sources.declarative.parsers.manifest_component_transformer import (  # noqa: E402
    ManifestComponentTransformer,
)
from airbyte_cdk.sources.declarative.parsers.manifest_reference_resolver import (  # noqa: E402
    ManifestReferenceResolver,
)
from airbyte_cdk.sources.declarative.requesters.paginators.strategies import (  # noqa: E402
    CursorPaginationStrategy,
)
import airbyte_cdk.sources.declarative.interpolation.macros as macros  # noqa: E402

FAKE_HOST = "airbyte.fake.test"
NOW = datetime.datetime(2026, 11, 20, 12, 0, 0, 123456, tzinfo=datetime.timezone.utc)
PAGES = 3
PER_PAGE = 4
# A stream whose pages hold more records than this is served one short
# page (its parents would otherwise fan out to thousands of partitions).
BIG_PAGE = 25


class FrozenDateTime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW if tz in (None, datetime.timezone.utc) else NOW.astimezone(tz)


def point_at_fake(node):
    """The manifest with every url_base and url sent to the fake, the
    original host kept as the first path segment."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in ("url_base", "url", "token_refresh_endpoint") and isinstance(v, str):
                # Every URL the template may give (a default, either side
                # of a condition).
                v = re.sub(r"https?://", f"https://{FAKE_HOST}/", v.strip())
            if k == "$parameters" and isinstance(v, dict):
                # URLs handed down to a requester's `url_base`.
                v = {pk: re.sub(r"^https?://", f"https://{FAKE_HOST}/", pv.strip()) if isinstance(pv, str) else pv
                     for pk, pv in v.items()}
            out[k] = point_at_fake(v)
        return out
    if isinstance(node, list):
        return [point_at_fake(v) for v in node]
    return node


def point_consts_at_fake(spec):
    for node in walk(spec):
        if isinstance(node.get("const"), str):
            node["const"] = re.sub(r"^https?://", f"https://{FAKE_HOST}/", node["const"].strip())


def schema_at(spec, chain):
    """The spec's schema of the configuration field at `chain` (the first
    branch of a `oneOf` naming it), and whether it is required."""
    node, required = spec or {}, False
    for key in chain:
        branches = [node] + [b for k in ("oneOf", "anyOf") for b in node.get(k) or [] if isinstance(b, dict)]
        holder = next((b for b in branches if key in (b.get("properties") or {})), None)
        if holder is None:
            return {}, False
        required = key in (holder.get("required") or [])
        node = holder["properties"][key] if isinstance(holder["properties"][key], dict) else {}
    return node, required


def resolved(manifest):
    m = json.loads(json.dumps(manifest, default=str))
    m.setdefault("type", "DeclarativeSource")
    m = ManifestReferenceResolver().preprocess_manifest(m)
    return ManifestComponentTransformer().propagate_types_and_parameters("", m, {})


def secrets_of(spec, config, at=""):
    """The pointers of the secret fields `spec` marks that `config` can
    hold: an array's items' each item's."""
    out = []
    if not isinstance(spec, dict):
        return out
    if spec.get("airbyte_secret") and at:
        out.append(at)
    for k, v in (spec.get("properties") or {}).items():
        out.extend(secrets_of(v, config, f"{at}/{k}"))
    for key in ("oneOf", "anyOf", "allOf"):
        for b in spec.get(key) or []:
            out.extend(secrets_of(b, config, at))
    items = get_pointer(config, at) if isinstance(spec.get("items"), dict) else None
    for i in range(len(items) if isinstance(items, list) else 0):
        out.extend(secrets_of(spec["items"], config, f"{at}/{i}"))
    return out


# Values tried, in order, for a field whose pattern the sample misses.
PATTERN_SAMPLES = ["2024-01-15", "2024-01-15T00:00:00Z", "2024-01-15T00:00:00.000Z", "2024-01-15T00:00:00",
                   "2024-01-15 00:00:00", "15-01-2024", "01/15/2024", "15/01/2024 00:00", "abc123", "sk_test_abc123",
                   "ABC123", "abc", "1", "en", "US", "https://example.com"]


def fit_patterns(config, spec):
    """Replaces sampled values a property's pattern refuses (an example
    such as "YYYY-MM-DD" is a placeholder) with one it accepts, and a
    number's example written as text with the number."""
    for name, schema in ((spec or {}).get("properties") or {}).items():
        if not isinstance(schema, dict) or name not in config:
            continue
        if isinstance(config[name], dict):
            fit_patterns(config[name], schema)
        if schema.get("type") == "integer" and isinstance(config[name], str) and re.fullmatch(r"-?\d+", config[name]):
            config[name] = int(config[name])
        pattern = schema.get("pattern")
        if pattern and isinstance(config[name], str) and not re.search(pattern, config[name]):
            config[name] = next((v for v in PATTERN_SAMPLES if re.search(pattern, v)), config[name])


# Start dates moved close to NOW (the same day of the year, as the sample
# wrote it): a cursor reads weeks of windows, not years of them.
RECENT_STARTS = [(r"^\d{4}-\d{2}-\d{2}", "2026-10-01"), (r"^\d{2}/\d{2}/\d{4}", "01/10/2026"),
                 (r"^\d{2}-\d{2}-\d{4}", "01-10-2026"), (r"^\d{8}$", "20261001")]


def recent_starts(config):
    for name, value in list(config.items()):
        if isinstance(value, dict):
            recent_starts(value)
        elif isinstance(value, str) and "YYYY" in value:
            # A placeholder the spec gives as its example.
            for token, digits in (("YYYY", "2026"), ("MM", "10"), ("DD", "01"), ("HH", "00"), ("mm", "00"), ("ss", "00")):
                value = value.replace(token, digits)
            config[name] = value
        elif isinstance(value, int) and not isinstance(value, bool) and "start" in name.lower() and value > 10**8:
            # Seconds since the epoch (or milliseconds).
            config[name] = 1790812800 * (1000 if value > 10**11 else 1)
        elif isinstance(value, str) and "start" in name.lower() and re.fullmatch(r"\d{9,10}", value):
            config[name] = "1790812800"
        elif isinstance(value, str) and "start" in name.lower():
            for pattern, recent in RECENT_STARTS:
                if re.match(pattern, value):
                    config[name] = re.sub(pattern, recent, value, count=1)
                    break
        elif isinstance(value, str) and name.lower() in ("end", "end_date", "enddate") and re.fullmatch(r"\d{8}", value):
            # An end beside such a start: after it, before NOW.
            config[name] = "20261110"


# Field names that carry secrets, as the server reads them (lower case,
# without `_` and `-`).
SECRET_NAMES = {"password", "passwd", "passphrase", "secret", "clientsecret", "token", "accesstoken", "refreshtoken",
                "idtoken", "apitoken", "authtoken", "bearertoken", "apikey", "privatekey", "secretkey",
                "authorization", "sessiontoken"}


def secret_named(config, at=""):
    for name, value in config.items():
        if isinstance(value, dict):
            yield from secret_named(value, f"{at}/{name}")
        elif isinstance(value, str) and name.lower().replace("_", "").replace("-", "") in SECRET_NAMES:
            yield f"{at}/{name}"


def get_pointer(config, pointer):
    node = config
    for part in pointer.split("/")[1:]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return node


def render(template, config, parameters, **kwargs):
    if not isinstance(template, str):
        return template
    return InterpolatedString.create(template, parameters=parameters or {}).eval(config, **kwargs)


IF_BLOCK = re.compile(r"\{%-?\s*if\b.*?%\}(.*?)\{%-?\s*endif\s*-?%\}", re.S)
ELSE = re.compile(r"\{%-?\s*else\s*-?%\}")


def loose(template, blocks_required=False):
    """A regex matching what a path template renders to (without its
    query, so a value may hold `?`). A `{% if %}` block may render to
    nothing unless `blocks_required` (or it has an `{% else %}`)."""
    out, at = [], 0
    template = template or ""
    for block in IF_BLOCK.finditer(template):
        out.append(loose_text(template[at:block.start()]))
        branches = [loose_text(b) for b in ELSE.split(block.group(1))]
        if len(branches) == 1 and not blocks_required:
            branches.append("")
        out.append("(?:" + "|".join(branches) + ")")
        at = block.end()
    out.append(loose_text(template[at:]))
    return "".join(out)


def loose_text(template):
    parts = re.split(r"(\{\{.*?\}\}|\{%.*?%\})", template, flags=re.S)
    return "".join(".*?" if p.startswith("{") else re.escape(p) for p in parts)


def value_for(name, schema, seed, depth=0):
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    h = int(hashlib.sha256(seed.encode()).hexdigest()[:8], 16)
    if kind == "integer":
        return h % 100000
    if kind == "number":
        return (h % 100000) / 100
    if kind == "boolean":
        return h % 2 == 0
    if kind == "object":
        # Its own properties, a level or two deep, where the schema names them.
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if properties and depth < 2:
            return {k: value_for(k, v, f"{seed}/{k}", depth + 1) for k, v in list(properties.items())[:12]}
        return {"k": f"v{h % 1000}"}
    if kind == "array":
        return [f"a{h % 1000}"]
    fmt = schema.get("format") if isinstance(schema, dict) else None
    if fmt == "date-time":
        return (NOW - datetime.timedelta(hours=h % 5000)).strftime("%Y-%m-%dT%H:%M:%SZ")
    if fmt == "date":
        return (NOW - datetime.timedelta(days=h % 500)).strftime("%Y-%m-%d")
    return f"{name}-{h % 100000}"


def set_path(record, path, value):
    node = record
    for p in path[:-1]:
        node = node.setdefault(p, {}) if isinstance(node.get(p), dict) or p not in node else node
    node[path[-1]] = value


class Stream:
    """One stream of the fake API."""

    def __init__(self, component, config, keys):
        self.name = component.get("name")
        retriever = component.get("retriever") or {}
        requester = retriever.get("requester") or {}
        self.parameters = requester.get("$parameters", {})
        # Parameters that write the page token themselves (`STARTPOSITION
        # {{ next_page_token.next_page_token + 1 }}`), with no token option.
        self.token_templates = {k: v for k, v in (requester.get("request_parameters") or {}).items()
                                if isinstance(v, str) and "next_page_token" in v}
        self.config = config
        base = re.sub(r"^https?://[^/]*", "", (requester.get("url_base") or requester.get("url") or "").strip())
        # A path may hold a query of its own (`content?type=page`): the
        # route is the part before, the query tells streams apart.
        path, _, fixed = (requester.get("path") or "").partition("?")
        self.route = re.compile(loose(base.rstrip("/")) + "/?" + loose(path.lstrip("/")) + "$", re.S)
        # A path whose `{% if %}` renders nothing (a list read to its end)
        # is answered with no records.
        self.whole_route = re.compile(loose(base.rstrip("/")) + "/?" + loose(path.lstrip("/"), True) + "$", re.S)
        self.fixed_query = [q for q in urllib.parse.parse_qsl(fixed, keep_blank_values=True)
                            if not re.search(r"[{}]", q[0] + q[1])]
        self.literal = len(re.sub(r"\{\{.*?\}\}", "", (requester.get("url_base") or "") + (requester.get("path") or "")))
        auth = requester.get("authenticator")
        self.authenticates = isinstance(auth, dict) and auth.get("type") not in (None, "NoAuth")
        selector = retriever.get("record_selector") or {}
        extractor = selector.get("extractor") or {}
        self.field_path = [str(render(p, config, extractor.get("$parameters"))) for p in extractor.get("field_path") or []]
        schema = (component.get("schema_loader") or {}).get("schema") or {}
        self.properties = schema.get("properties") or {} if isinstance(schema, dict) else {}
        self.keys = keys
        paginator = retriever.get("paginator") or {}
        self.strategy = paginator.get("pagination_strategy") if paginator.get("type") == "DefaultPaginator" else None
        self.token_option = paginator.get("page_token_option")
        kind = (self.strategy or {}).get("type")
        self.page_size = None
        if kind in ("PageIncrement", "OffsetIncrement", "CursorPagination") and self.strategy.get("page_size") is not None:
            try:
                self.page_size = int(render(self.strategy["page_size"], config, self.strategy.get("$parameters")))
            except (TypeError, ValueError):
                self.page_size = None
        self.pages = 1 if self.page_size is not None and self.page_size > BIG_PAGE else PAGES
        self.tokens = {}
        incremental = component.get("incremental_sync") or {}
        self.cursor = None
        if incremental.get("type") == "DatetimeBasedCursor":
            fmt = incremental.get("datetime_format")
            params = incremental.get("$parameters")
            options = {}
            for which in ("start_time_option", "end_time_option"):
                o = incremental.get(which) or {}
                if o.get("field_name") is not None:
                    options[which] = (o.get("inject_into"), str(render(o["field_name"], config, o.get("$parameters"))))
            self.cursor = {"field": str(render(incremental.get("cursor_field"), config, params)), "format": fmt,
                           "record_format": (incremental.get("cursor_datetime_formats") or [fmt])[0], "options": options}

    def window(self, query, headers, body):
        """The window a request names, as (start, end) dates, or None."""
        if not self.cursor:
            return None
        bounds = []
        for which in ("start_time_option", "end_time_option"):
            where, name = self.cursor["options"].get(which, (None, None))
            value = find_option(where, name, query, headers, body)
            try:
                bounds.append(DatetimeParser().parse(value, self.cursor["format"]) if value is not None else None)
            except (ValueError, TypeError, OverflowError):
                bounds.append(None)
        if bounds[0] is None:
            return None
        return bounds[0], bounds[1] if bounds[1] is not None else NOW

    def cursor_value(self, seed, i, count, window):
        if window is not None:
            start, end = window
            at = start + (end - start) * (i + 1) / (count + 1) if end > start else start
        else:
            h = int(hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()[:8], 16)
            at = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(
                days=h % 1000, seconds=h % 86400)
        at = at.replace(microsecond=0)
        return DatetimeParser().format(at, self.cursor["record_format"])

    def records(self, seed, count, window=None):
        out = []
        for i in range(count):
            r = {}
            for name, schema in list(self.properties.items())[:12]:
                r[name] = value_for(name, schema, f"{seed}/{i}/{name}")
            r["id"] = f"{self.name}-{seed}-{i}"
            for path in self.keys:
                set_path(r, path, f"{'.'.join(path)}-{seed}-{i}")
            if self.cursor:
                r[self.cursor["field"]] = self.cursor_value(seed, i, count, window)
            out.append(r)
        return out

    def page_index(self, query, headers, body, path):
        kind = (self.strategy or {}).get("type")
        if kind in ("PageIncrement", "OffsetIncrement"):
            value = self.option_value(query, headers, body)
            if value is None:
                return self.index_written(query, kind)
            try:
                n = int(value)
            except ValueError:
                return self.pages
            if kind == "PageIncrement":
                start = int(self.strategy.get("start_from_page") or 0)
                return n - start if self.strategy.get("inject_on_first_request") else n - start
            size = self.page_size or PER_PAGE
            return n // size
        if kind == "CursorPagination":
            page = dict(query).get("__page")
            if page is not None:
                return int(page)
            haystack = [v for _, v in query] + list(headers.values()) + [json.dumps(body), path]
            for token, index in self.tokens.items():
                if any(token == h or (len(token) > 3 and token in h) for h in haystack):
                    return index
        return 0

    def index_written(self, query, kind):
        """The page a parameter writing the page token names: its token
        expressions rendered for each page until one reads as sent."""
        values = dict(query)
        for name, template in self.token_templates.items():
            parts = re.split(r"(\{\{.*?\}\})", template.strip(), flags=re.S)
            pattern = "".join(("(.*?)" if "next_page_token" in p else ".*?") if p.startswith("{{") else re.escape(p)
                              for p in parts)
            sent = re.fullmatch(pattern, values.get(name, "").strip(), re.S)
            if sent is None:
                continue
            written = [p for p in parts if p.startswith("{{") and "next_page_token" in p]
            for index in range(self.pages + 1):
                if index == 0:
                    token = None
                elif kind == "PageIncrement":
                    token = {"next_page_token": int(self.strategy.get("start_from_page") or 0) + index}
                else:
                    token = {"next_page_token": index * (self.page_size or PER_PAGE)}
                try:
                    rendered = [str(render(t, self.config, self.parameters, next_page_token=token)) for t in written]
                except Exception:
                    break
                if list(sent.groups()) == rendered:
                    return index
        return 0

    def option_value(self, query, headers, body):
        option = self.token_option or {}
        return find_option(option.get("inject_into"), option.get("field_name"), query, headers, body)

    def page(self, index, seed, full_url, window=None):
        """The body and headers of page `index` (0-based)."""
        kind = (self.strategy or {}).get("type")
        size = self.page_size or PER_PAGE
        last = index >= self.pages - 1
        if kind is None:
            return self.wrap(self.records(seed, PER_PAGE, window)), {}
        if kind in ("PageIncrement", "OffsetIncrement"):
            if index < 0 or index >= self.pages:
                return self.wrap([]), {}
            count = size if not last else (min(size - 1, PER_PAGE) if self.page_size else 0)
            return self.wrap(self.records(f"{seed}/p{index}", count, window)), {}
        # A cursor: the fake finds a body that makes the CDK's strategy
        # continue (not on the last page) or stop (on it).
        count = size if not last else max(min(size - 1, PER_PAGE), 0)
        records = self.records(f"{seed}/p{index}", count, window)
        paths = response_paths(str(self.strategy.get("cursor_value")) + " " + str(self.strategy.get("stop_condition")))
        nxt = f"{FAKE_HOST}-{self.name}-{index + 1}-{hashlib.sha256(seed.encode()).hexdigest()[:6]}"
        url = re.sub(r"__page=\d+&?", "", full_url).rstrip("?&")
        next_url = url + ("&" if "?" in url else "?") + f"__page={index + 1}"
        leaves = [next_url if self.token_option and self.token_option.get("type") == "RequestPath" else nxt,
                  True, 1, False, None, 0, "", []]
        link = f'<{next_url}>; rel="next"'
        # A cursor read from the page's last record (`last_record['next']`)
        # is set there too.
        on_last = last_record_paths(str(self.strategy.get("cursor_value")) + " " + str(self.strategy.get("stop_condition")))
        # The records' own place is never overwritten (`response['entries'][-1]`
        # reads into it).
        paths = [p for p in paths if [str(k) for k in p] != list(self.field_path[:len(p)])]
        targets = [("body", p) for p in paths] + [("last", p) for p in on_last]
        # A body on which the strategy stops cleanly, where none goes on
        # (a manifest that reads one page: `page > pages_to_fetch - 1`).
        stop = None
        for assignment in itertools.product(leaves, repeat=min(len(targets), 3)):
            body = self.wrap(records)
            for (where, p), leaf in zip(targets, assignment):
                if where == "body" and isinstance(body, dict):
                    put(body, p, leaf)
                elif where == "last" and records:
                    put(records[-1], p, leaf)
            for headers in ({"link": link}, {}):
                token = self.cdk_token(body, headers, records)
                if token is FAILED:
                    continue
                if token is None and stop is None:
                    stop = body, headers
                if (token is None) == last:
                    if token is not None:
                        self.tokens[str(token)] = index + 1
                    return body, headers
        return stop if stop is not None else (self.wrap(records if not last else []), {})

    def cdk_token(self, body, headers, records):
        strategy = CursorPaginationStrategy(
            cursor_value=self.strategy["cursor_value"], config=self.config,
            parameters=self.strategy.get("$parameters", {}), stop_condition=self.strategy.get("stop_condition"),
            page_size=self.page_size, decoder=JsonDecoder(parameters={}))
        response = requests.Response()
        response._content = json.dumps(body).encode()
        response.status_code = 200
        response.headers["content-type"] = "application/json"
        response.headers.update(headers)
        try:
            return strategy.next_page_token(response, len(records), records[-1] if records else None, None)
        except Exception:
            return FAILED

    def wrap(self, records):
        """The body holding `records` where the extractor finds them: a
        `*` is a list whose every item leads to one record."""
        return wrap_at(records, list(self.field_path or []))


def wrap_at(records, path):
    if not path:
        return records
    head, rest = path[0], path[1:]
    if head == "*":
        return [one_at(r, rest) for r in records]
    return {head: wrap_at(records, rest)}


def one_at(record, path):
    if not path:
        return record
    head, rest = path[0], path[1:]
    return [one_at(record, rest)] if head == "*" else {head: one_at(record, rest)}


def find_option(where, name, query, headers, body):
    """The value a request option put into a request, or None."""
    if name is None:
        return None
    if where == "request_parameter":
        return dict(query).get(name)
    if where == "header":
        return next((v for k, v in headers.items() if k.lower() == str(name).lower()), None)
    if isinstance(body, dict):
        return body.get(name)
    if isinstance(body, list):
        return dict(body).get(name)
    return None


LAST_RECORD = re.compile(r"""last_record((?:\.[A-Za-z_]\w*|\[\s*['"][^'"]+['"]\s*\]|\.get\(\s*['"][^'"]+['"][^)]*\))+)""")


def last_record_paths(text):
    """The key paths a template reads of `last_record`."""
    paths = []
    for m in LAST_RECORD.finditer(text or ""):
        path = [s.group(1) or s.group(2) or s.group(4) for s in STEP.finditer(m.group(1))]
        path = [p for p in path if p and p not in ("get", "keys", "values", "items")]
        if path:
            paths.append(path)
    return paths


def put(body, path, leaf):
    node = body
    for i, key in enumerate(path):
        if isinstance(key, int) or not isinstance(node, dict):
            return
        if i == len(path) - 1:
            node[key] = leaf
        else:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]


# The access token every OAuth token endpoint of the fake issues, and the
# session token every session login answers with.
ACCESS_TOKEN = "fake-access-token-0123456789abcdef"
SESSION_TOKEN = "fake-session-token-0123456789abcdef"
# What a cursor strategy's next token is when the body makes it fail.
FAILED = object()


class Fake:
    def __init__(self):
        self.lock = threading.Lock()
        self.token_paths = set()
        self.session_paths = {}
        self.streams = []
        self.secrets = {}
        self.log = []
        self.manifest = None
        self.config = None
        self.served = {}
        self.deadline = None

    def load(self, path):
        manifest = yaml.safe_load(open(path))
        spec = spec_of(path, manifest)
        # A spec the wheel keeps beside the manifest goes into it, as the
        # CDK reads one from the manifest or the package.
        if not (manifest.get("spec") or {}).get("connection_specification"):
            manifest["spec"] = {"type": "Spec", "connection_specification": spec}
        # A base URL the spec fixes (`const`) is the fake's, as every
        # URL the manifest names is.
        point_consts_at_fake(spec)
        config = sample("config", spec)
        fit_patterns(config, spec)
        recent_starts(config)
        # The spec's secrets, and fields named as secrets are (the server
        # takes neither in the clear: a user gives a credential for each).
        pointers = sorted(set(secrets_of(spec, config)) | set(secret_named(config)))
        secrets = {}
        for p in pointers:
            v = get_pointer(config, p)
            if isinstance(v, str) and v:
                secrets[p] = f"{v}{hashlib.sha256(p.encode()).hexdigest()[:8]}"
                node = config
                parts = p.split("/")[1:]
                for part in parts[:-1]:
                    node = node[int(part)] if isinstance(node, list) else node[part]
                node[parts[-1]] = secrets[p]
        # A base URL read from the configuration points at the fake there.
        for node in walk(manifest):
            for key in ("url_base", "url"):
                text = node.get(key) if isinstance(node, dict) else None
                if isinstance(text, str):
                    m = re.match(r"\s*\{\{\s*config((?:\.get\(['\"]\w+['\"]|\[['\"]\w+['\"]\]|\.\w+)+)", text)
                    if m:
                        # The chain of keys (`config['region']['url_base']`).
                        found = re.findall(r"\.get\(['\"](\w+)['\"]|\[['\"](\w+)['\"]\]|\.(\w+)", m.group(1))
                        chain = [a or b or c for a, b, c in found]
                        node = config
                        for k in chain[:-1]:
                            node = node.setdefault(k, {}) if isinstance(node.get(k, {}), dict) else {}
                        if str(node.get(chain[-1], "")).startswith(f"https://{FAKE_HOST}/"):
                            continue
                        fake = f"https://{FAKE_HOST}/{chain[-1]}-base"
                        field, required = schema_at(spec, chain)
                        if re.search(field.get("pattern") or "", fake) or required:
                            node[chain[-1]] = fake
                        else:
                            # A URL of the form its pattern asks for cannot
                            # name the fake: left out, the template's own
                            # default (pointed at the fake) is read.
                            node.pop(chain[-1], None)
        schemas = self.package(path)
        pointed = point_at_fake(manifest)
        r = resolved(pointed)
        keys = []
        for node in walk(r):
            if node.get("type") == "ParentStreamConfig" and isinstance(node.get("parent_key"), str):
                keys.append([k for k in str(render(node["parent_key"], config, node.get("$parameters"))).split("/") if k])
        keys.extend([[m] for m in re.findall(r"last_record\[['\"](\w+)['\"]\]", json.dumps(r))])
        # Nested fields a transformation reads (`record["attributes"]["id"]`).
        for chain in re.findall(r"record((?:\[\\?['\"]\w+\\?['\"]\]){2,})", json.dumps(r)):
            path = re.findall(r"(\w+)", chain)
            if path not in keys:
                keys.append(path)
        # A key read as an object too (`last_record['meta']` beside
        # `last_record['meta']['pagination']`) is that object.
        keys = [k for k in keys if not any(len(o) > len(k) and o[:len(k)] == k for o in keys)]
        streams = [Stream(s, config, keys) for s in r.get("streams") or []]
        # OAuth token endpoints: a token for a request that carries a
        # secret (the client's), which then opens the API.
        tokens = set()
        for node in walk(r):
            if node.get("type") == "OAuthAuthenticator" and isinstance(node.get("token_refresh_endpoint"), str):
                try:
                    url = render(node["token_refresh_endpoint"], config, node.get("$parameters"))
                except Exception:
                    continue
                tokens.add(urllib.parse.urlsplit(str(url)).path)
        # Session logins: the token at the manifest's path, which then
        # opens the API.
        sessions = {}
        for node in walk(r):
            login = node.get("login_requester") if node.get("type") == "SessionTokenAuthenticator" else None
            if isinstance(login, dict) and isinstance(node.get("session_token_path"), list):
                try:
                    base = str(render(login.get("url_base") or login.get("url") or "", config, login.get("$parameters")))
                    path = str(render(login.get("path") or "", config, login.get("$parameters")))
                except Exception:
                    continue
                login_path = urllib.parse.urlsplit(base).path.rstrip("/") + ("/" + path.lstrip("/") if path else "")
                sessions[login_path.rstrip("/")] = [str(k) for k in node["session_token_path"]]
        with self.lock:
            self.session_paths = sessions
            self.token_paths = tokens
            self.streams = sorted(streams, key=lambda s: -s.literal)
            self.secrets = secrets
            self.log = []
            self.served = {}
            self.manifest = pointed
            self.config = config
        return {"manifest": pointed, "config": config, "secrets": secrets, "streams": [s.name for s in streams],
                "incremental": [s.name for s in streams if s.cursor], "schemas": schemas}

    def package(self, path):
        """The connector's package as the CDK finds it (a module named
        after it, its schema files beside the manifest in extras/), and
        those files by their path in it."""
        name = os.path.basename(path).rsplit(".", 1)[0]
        module = name.replace("-", "_")
        for loaded in [m for m in sys.modules if m.startswith("source_")]:
            del sys.modules[loaded]
        files = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "extras", name, "schemas")
        if not os.path.isdir(files):
            return {}
        root = tempfile.mkdtemp(prefix="airbyte-package-")
        shutil.copytree(files, os.path.join(root, module, "schemas"))
        open(os.path.join(root, module, "__init__.py"), "w").close()
        sys.path.insert(0, root)
        importlib.import_module(module)
        schemas = {}
        for file in sorted(os.listdir(files)):
            if file.endswith(".json"):
                with open(os.path.join(files, file)) as f:
                    schemas[f"schemas/{file}"] = json.load(f)
        # A source takes so much configuration; past it, the streams'
        # schemas are open (their records are the same).
        return schemas if len(json.dumps(schemas)) <= 256 * 1024 else {}

    def serve(self, method, target, headers, body):
        parsed = urllib.parse.urlsplit(target)
        query = sorted(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        try:
            decoded = json.loads(body) if body else None
        except ValueError:
            decoded = sorted(urllib.parse.parse_qsl(body.decode(errors="replace"), keep_blank_values=True))
        if self.deadline is not None and time.monotonic() > self.deadline:
            return 400, {}, {"error": "the read passed its time limit"}
        with self.lock:
            self.log.append({"method": method, "path": parsed.path, "query": [list(q) for q in query if q[0] != "__page"],
                             "page": dict(query).get("__page"), "body": decoded,
                             "token": method == "POST" and parsed.path in self.token_paths})
            if method == "POST" and parsed.path in self.token_paths:
                if not self.carries_secret(parsed, headers, body):
                    return 401, {}, {"error": "invalid_client"}
                return 200, {}, {"access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer"}
            token_path = self.session_paths.get(parsed.path.rstrip("/"))
            if token_path is not None:
                answer = {}
                put(answer, token_path, SESSION_TOKEN)
                return 200, {}, answer
            routed = [s for s in self.streams if s.route.match(urllib.parse.unquote(parsed.path))
                      and all(list(q) in [list(x) for x in query] for q in s.fixed_query)]
            stream = max(routed, key=lambda s: (bool(s.whole_route.match(urllib.parse.unquote(parsed.path))),
                                                len(s.fixed_query)), default=None)
            if stream is None:
                print(f"the fake: no stream serves {method} {target}", file=sys.stderr)
                return 404, {}, {"error": f"no stream serves {parsed.path}"}
            if stream.authenticates and (self.secrets or self.session_paths) \
                    and not self.carries_secret(parsed, headers, body):
                return 401, {}, {"error": "no credential"}
            if not stream.whole_route.match(urllib.parse.unquote(parsed.path)):
                return 200, {}, stream.wrap([])
            index = stream.page_index(query, headers, decoded, target)
            window = stream.window(query, headers, decoded)
            # Each window its own records.
            # Records name the path they came from, a secret in it by its
            # field (a provider does not echo an account's secret id into
            # every record; the host would scrub it if it did).
            seed = parsed.path
            for pointer, value in self.secrets.items():
                seed = seed.replace(value, pointer.replace("/", "."))
            if window is not None:
                seed = f"{seed}@{window[0].isoformat()}"
            # Pages end, whatever a client sends: the same request answered
            # a few dozen times gets the last page.
            key = f"{method} {target} {body!r}"
            served = self.served.get(key, 0) + 1
            self.served[key] = served
            if served > PAGES * 8:
                index = stream.pages - 1
            full_url = f"https://{FAKE_HOST}{target}"
            body, headers = stream.page(index, seed, full_url, window)
            return 200, headers, body

    def carries_secret(self, parsed, headers, body):
        haystack = [urllib.parse.unquote_plus(parsed.query), body.decode(errors="replace")]
        for k, v in headers.items():
            haystack.append(v)
            if v.lower().startswith("basic "):
                try:
                    haystack.append(base64.b64decode(v[6:]).decode(errors="replace"))
                except ValueError:
                    pass
        accepted = list(self.secrets.values()) + ([ACCESS_TOKEN] if self.token_paths else []) \
            + ([SESSION_TOKEN] if self.session_paths else [])
        return any(s in h for s in accepted for h in haystack)

    def take_requests(self):
        with self.lock:
            log, self.log = self.log, []
            self.served = {}
        return log

    def cdk(self, port, ca, state=None, limit=None):
        self.deadline = time.monotonic() + limit if limit else None
        try:
            answer = self.cdk_read(port, ca, state)
        finally:
            timed_out = self.deadline is not None and time.monotonic() > self.deadline
            self.deadline = None
        answer["timed_out"] = timed_out
        return answer

    def cdk_read(self, port, ca, state):
        from airbyte_cdk.models import SyncMode
        from airbyte_cdk.sources.declarative.concurrent_declarative_source import ConcurrentDeclarativeSource
        from airbyte_cdk.test.catalog_builder import CatalogBuilder, ConfiguredAirbyteStreamBuilder
        from airbyte_cdk.test.entrypoint_wrapper import read
        import urllib3.util.connection as connection

        original = connection.create_connection

        def to_front(address, *args, **kwargs):
            # The fake is the only host there is.
            if address[0] != FAKE_HOST:
                raise ConnectionRefusedError(f"{address[0]} is not the fake API")
            return original(("127.0.0.1", port), *args, **kwargs)

        from airbyte_cdk.test.state_builder import StateBuilder
        import airbyte_cdk.sources.streams.concurrent.state_converters.datetime_stream_state_converter as converters
        from airbyte_cdk.utils.datetime_helpers import AirbyteDateTime

        builder = CatalogBuilder()
        for s in self.streams:
            mode = SyncMode.incremental if s.cursor else SyncMode.full_refresh
            builder.with_stream(ConfiguredAirbyteStreamBuilder().with_name(s.name).with_sync_mode(mode))
        catalog = builder.build()
        states = StateBuilder()
        for name, value in (state or {}).items():
            states.with_stream_state(name, value)
        states = states.build()
        os.environ["REQUESTS_CA_BUNDLE"] = ca
        records = {s.name: [] for s in self.streams}
        last_states = {}
        error = None
        # Retries wait no time: a fake that answers wrong fails at once.
        with mock.patch.object(connection, "create_connection", to_front), \
                mock.patch.object(macros.datetime, "datetime", FrozenDateTime), \
                mock.patch("time.sleep", lambda seconds: None), \
                mock.patch.object(converters, "ab_datetime_now", lambda: AirbyteDateTime.from_datetime(NOW)):
            try:
                source = ConcurrentDeclarativeSource(catalog=catalog, config=self.config, state=states or None,
                                                     source_config=json.loads(json.dumps(self.manifest, default=str)))
                output = read(source, self.config, catalog, states or None)
                for m in output.records:
                    records.setdefault(m.record.stream, []).append(m.record.data)
                for m in output.state_messages:
                    stream_state = m.state.stream
                    if stream_state is not None and stream_state.stream_state is not None:
                        last_states[stream_state.stream_descriptor.name] = json.loads(
                            json.dumps(stream_state.stream_state.__dict__, default=str))
                errors = [m.trace.error.message for m in output.errors] if output.errors else []
                # The connector's own account of an unexpected failure.
                stacks = [m.trace.error.stack_trace for m in output.errors if m.trace.error.stack_trace]
                if stacks:
                    errors.append(stacks[0].strip().splitlines()[-1])
                    if os.environ.get("AIRBYTE_CDK_TRACE"):
                        print(stacks[0], file=sys.stderr)
                error = "; ".join(errors) or None
            except Exception as e:  # the CDK's failure is an answer too
                error = f"{type(e).__name__}: {e}"
        return {"records": records, "states": last_states, "error": error}


def walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def main():
    # Answers go to the real standard output; whatever the CDK prints (its
    # messages, its logs) goes nowhere.
    answers = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    fake = Fake()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The head and the body are two writes: with Nagle's algorithm the
        # second waits for the peer's delayed ACK of the first, 40 ms a
        # request on a kept-alive connection.
        disable_nagle_algorithm = True

        def handle_any(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                status, headers, payload = fake.serve(self.command, self.path, dict(self.headers.items()), body)
            except Exception as e:  # a fake's own failure: refused at once, never retried
                print(f"the fake failed on {self.path}: {type(e).__name__}: {e}", file=sys.stderr)
                status, headers, payload = 404, {}, {"error": f"the fake failed: {type(e).__name__}: {e}"}
            data = json.dumps(payload, default=str).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = handle_any

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), file=answers, flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            if "load" in command:
                answer = fake.load(command["load"])
            elif "cdk" in command:
                answer = fake.cdk(command["cdk"]["port"], command["cdk"]["ca"], command["cdk"].get("state"),
                                  command["cdk"].get("limit"))
            else:
                answer = {"requests": fake.take_requests()}
        except Exception as e:
            answer = {"failed": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer, default=str), file=answers, flush=True)


if __name__ == "__main__":
    main()
