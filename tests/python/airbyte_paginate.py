"""Differential check of the pagination strategies against Airbyte's CDK.

Every `CursorPagination`, `PageIncrement` and `OffsetIncrement` of the
development corpus (as resolved, so with their `$parameters`) computes
the next page's token on pages made for it: for a cursor, bodies holding
the fields its templates read (filled, null, false, missing) and a Link
header; for the counters, full, short and empty pages after no token and
after one. The CDK's strategy and our `declarative` crate (its `paginate`
example) must give the same tokens (and the same first token).

    python tests/python/airbyte_paginate.py ../shared/airbyte-manifests \\
        plugins/target/x86_64-unknown-linux-gnu/debug/examples/paginate

Needs `airbyte-cdk` (7.39.1) in the running Python.
"""

import datetime
import json
import os
import re
import subprocess
import sys
from unittest import mock

import requests
from airbyte_cdk.sources.declarative.decoders import JsonDecoder
from airbyte_cdk.sources.declarative.parsers.manifest_component_transformer import ManifestComponentTransformer
from airbyte_cdk.sources.declarative.parsers.manifest_reference_resolver import ManifestReferenceResolver
from airbyte_cdk.sources.declarative.requesters.paginators.strategies import (
    CursorPaginationStrategy,
    OffsetIncrement,
    PageIncrement,
)
import airbyte_cdk.sources.declarative.interpolation.macros as macros

sys.path.insert(0, os.path.dirname(__file__))
from airbyte_corpus import manifests  # noqa: E402

NOW = datetime.datetime(2026, 11, 20, 12, 0, 0, 123456, tzinfo=datetime.timezone.utc)
TYPES = ("CursorPagination", "PageIncrement", "OffsetIncrement")
LINK = '<https://api.example.com/items?page=2>; rel="next", <https://api.example.com/items?page=9>; rel="last"'


class FrozenDateTime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW if tz in (None, datetime.timezone.utc) else NOW.astimezone(tz)


def strategies(node, out):
    if isinstance(node, dict):
        if node.get("type") in TYPES:
            out.append(node)
        for v in node.values():
            strategies(v, out)
    elif isinstance(node, list):
        for v in node:
            strategies(v, out)


ACCESS = re.compile(r"""response((?:\.[A-Za-z_]\w*|\[\s*['"][^'"]+['"]\s*\]|\[\s*\d+\s*\]|\.get\(\s*['"][^'"]+['"][^)]*\))+)""")
STEP = re.compile(r"""\.get\(\s*['"]([^'"]+)['"]|\[\s*['"]([^'"]+)['"]\s*\]|\[\s*(\d+)\s*\]|\.([A-Za-z_]\w*)""")


def response_paths(text):
    paths = []
    for m in ACCESS.finditer(text or ""):
        path = []
        for s in STEP.finditer(m.group(1)):
            key = s.group(1) or s.group(2) or s.group(4)
            path.append(int(s.group(3)) if s.group(3) is not None else key)
        path = [p for p in path if p not in ("get", "keys", "values", "items")]
        if path:
            paths.append(path)
    return paths


def body_with(paths, leaf):
    body = {}
    for path in paths:
        node = body
        for i, key in enumerate(path):
            last = i == len(path) - 1
            if isinstance(key, int):
                continue
            if last:
                node[key] = leaf
            else:
                node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node
    return body


def pages(component):
    if component["type"] == "CursorPagination":
        paths = response_paths(str(component.get("cursor_value")) + " " + str(component.get("stop_condition")))
        for leaf in ("token-2", None, False, True, 0, 3, [{"id": 1}]):
            for size in (3, 0):
                yield {"response": body_with(paths, leaf), "link": LINK, "last_record": {"id": 9, "cursor": "c-9"},
                       "last_page_size": size, "last_token": None}
        yield {"response": {}, "link": "", "last_record": None, "last_page_size": 3, "last_token": None}
    else:
        for size in (0, 1, 2, 3, 10, 50, 100, 1000):
            for last in (None, 0, 1, 7, 100):
                yield {"response": {"total": 1000}, "link": "", "last_record": {"id": 9},
                       "last_page_size": size, "last_token": last}


def cdk_token(component, config, parameters, page):
    kind = component["type"]
    if kind == "CursorPagination":
        strategy = CursorPaginationStrategy(
            cursor_value=component["cursor_value"], config=config, parameters=parameters,
            stop_condition=component.get("stop_condition"), page_size=component.get("page_size"),
            decoder=JsonDecoder(parameters={}))
    elif kind == "PageIncrement":
        strategy = PageIncrement(config=config, page_size=component.get("page_size"), parameters=parameters,
                                 start_from_page=component.get("start_from_page", 0),
                                 inject_on_first_request=component.get("inject_on_first_request", False))
    else:
        strategy = OffsetIncrement(config=config, page_size=component.get("page_size"), parameters=parameters,
                                   inject_on_first_request=component.get("inject_on_first_request", False),
                                   decoder=JsonDecoder(parameters={}))
    response = requests.Response()
    response._content = json.dumps(page["response"]).encode()
    response.status_code = 200
    response.headers["content-type"] = "application/json"
    if page["link"]:
        response.headers["link"] = page["link"]
    token = strategy.next_page_token(response, page["last_page_size"], page["last_record"], page["last_token"])
    return {"token": token, "initial": strategy.initial_token}


def main():
    corpus, runner = sys.argv[1], sys.argv[2]
    cases = []
    for name, manifest, config in manifests(corpus):
        resolved = ManifestComponentTransformer().propagate_types_and_parameters(
            "", ManifestReferenceResolver().preprocess_manifest(json.loads(json.dumps(manifest, default=str))), {})
        found = []
        strategies(resolved, found)
        for component in {json.dumps(c, sort_keys=True): c for c in found}.values():
            parameters = component.get("$parameters", {})
            for page in pages(component):
                cases.append((name, component, config, parameters, page))
    theirs = []
    with mock.patch.object(macros.datetime, "datetime", FrozenDateTime):
        for _, component, config, parameters, page in cases:
            try:
                theirs.append(json.loads(json.dumps(cdk_token(component, config, parameters, page), default=str)))
            except Exception as e:  # the CDK's failure is an answer too
                theirs.append({"error": type(e).__name__})
    lines = "\n".join(json.dumps({"strategy": c, "config": cfg, "parameters": p, "page": pg, "now": NOW.isoformat()},
                                 default=str) for _, c, cfg, p, pg in cases) + "\n"
    done = subprocess.run([runner], input=lines, capture_output=True, text=True, check=True)
    ours = [json.loads(line) for line in done.stdout.splitlines()]
    same = differ = both_failed = 0
    for (name, component, _, _, page), mine, cdk in zip(cases, ours, theirs):
        if "error" in mine and "error" in cdk:
            both_failed += 1
        elif mine == cdk:
            same += 1
        else:
            differ += 1
            print(f"DIFFERENT {name} {json.dumps(component)[:300]}\n    page: {json.dumps(page)[:300]}\n"
                  f"    cdk:  {cdk}\n    ours: {mine}")
    strategies_seen = len({json.dumps(c[1], sort_keys=True) for c in cases})
    print(f"{len(cases)} pages over {strategies_seen} strategies: {same} identical tokens, "
          f"{both_failed} failing on both sides, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
