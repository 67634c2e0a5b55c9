"""Differential check of the interpolation against Airbyte's CDK.

Every Jinja string of every manifest in the development corpus
(`../shared/airbyte-manifests`) is evaluated by the CDK's
`JinjaInterpolation` and by our `declarative` crate (its `interpolate`
example), with the same context and a frozen clock, and the values are
compared. The context: a configuration made from each manifest's spec
(`airbyte_corpus.py`), and fixed `stream_slice` (which `stream_partition` and `stream_interval`
name too), `next_page_token`, `response`, `last_record`, `record`,
`headers` and `parameters`.

    python tests/python/airbyte_interpolation.py ../shared/airbyte-manifests \\
        plugins/target/x86_64-unknown-linux-gnu/debug/examples/interpolate

prints a summary and every difference; exits 1 when a value differs.
Needs `airbyte-cdk` (7.39.1) in the running Python.
"""

import datetime
import json
import os
import subprocess
import sys
from unittest import mock

from airbyte_cdk.sources.declarative.interpolation.jinja import JinjaInterpolation
import airbyte_cdk.sources.declarative.interpolation.macros as macros

sys.path.insert(0, os.path.dirname(__file__))
from airbyte_corpus import manifests  # noqa: E402

NOW = datetime.datetime(2026, 11, 20, 12, 0, 0, 123456, tzinfo=datetime.timezone.utc)


class FrozenDateTime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW if tz in (None, datetime.timezone.utc) else NOW.astimezone(tz)


def templates(node, out):
    if isinstance(node, dict):
        for v in node.values():
            templates(v, out)
    elif isinstance(node, list):
        for v in node:
            templates(v, out)
    elif isinstance(node, str) and ("{{" in node or "{%" in node):
        out.append(node)


CONTEXT = {
    "stream_slice": {"start_time": "2024-01-01T00:00:00Z", "end_time": "2024-01-31T23:59:59Z",
                     "parent_slice": {}, "id": 42, "parent_id": 42},
    "next_page_token": {"next_page_token": "token-2"},
    "response": {"data": [{"id": 1}], "next": "https://api.example.com/next", "has_more": True,
                 "meta": {"next_page": 3, "total": 10}, "page": 2, "cursor": "c-2"},
    "last_record": {"id": 9, "updated_at": "2024-01-20T00:00:00Z"},
    "record": {"id": 9, "updated_at": "2024-01-20T00:00:00Z", "name": "Nine"},
    "headers": {"link": "<https://api.example.com/items?page=2>; rel=\"next\""},
    "parameters": {"name": "items", "path": "items", "primary_key": "id", "data_field": "data"},
}


def main():
    corpus, runner = sys.argv[1], sys.argv[2]
    cases = []
    for name, manifest, config in manifests(corpus):
        found = []
        templates(manifest, found)
        for t in dict.fromkeys(found):
            cases.append((name, t, config))
    interpolation = JinjaInterpolation()
    ours_input = []
    theirs = []
    with mock.patch.object(macros.datetime, "datetime", FrozenDateTime):
        for _, t, config in cases:
            try:
                value = interpolation.eval(t, config, **CONTEXT)
                theirs.append({"value": json.loads(json.dumps(value, default=str))})
            except Exception as e:  # the CDK's own failure is an answer too
                theirs.append({"error": type(e).__name__})
            ours_input.append(json.dumps({"template": t, "context": dict(CONTEXT, config=config),
                                          "now": NOW.isoformat()}, default=str))
    done = subprocess.run([runner], input="\n".join(ours_input) + "\n", capture_output=True, text=True, check=True)
    ours = [json.loads(line) for line in done.stdout.splitlines()]
    same = differ = unsupported = both_failed = 0
    for (name, t, _), mine, cdk in zip(cases, ours, theirs):
        if "error" in mine and mine["error"] == "unsupported":
            unsupported += 1
            print(f"UNSUPPORTED {name}: {t!r}: {mine['message']}")
        elif "error" in mine and "error" in cdk:
            both_failed += 1
        elif "value" in mine and "value" in cdk and mine["value"] == cdk["value"] and type(mine["value"]) is type(cdk["value"]):
            same += 1
        else:
            differ += 1
            print(f"DIFFERENT {name}: {t!r}\n    cdk:  {cdk}\n    ours: {mine}")
    total = len(cases)
    print(f"{total} templates: {same} identical, {both_failed} failing on both sides, "
          f"{unsupported} refused as unsupported, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
