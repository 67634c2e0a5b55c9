"""Differential check of record selection against Airbyte's CDK.

For every `DpathExtractor` field path in the development corpus (its
segments interpolated with the manifest's sample configuration,
`airbyte_corpus.py`), pages of several shapes are given
to the CDK's `DpathExtractor` and to our `declarative` crate (its
`extract` example), and the records compared.

    python tests/python/airbyte_extract.py ../shared/airbyte-manifests \\
        plugins/target/x86_64-unknown-linux-gnu/debug/examples/extract

Needs `airbyte-cdk` (7.39.1) in the running Python.
"""

import json
import os
import subprocess
import sys

import requests
from airbyte_cdk.sources.declarative.decoders import JsonDecoder
from airbyte_cdk.sources.declarative.extractors import DpathExtractor
from airbyte_cdk.sources.declarative.interpolation.interpolated_string import InterpolatedString

sys.path.insert(0, os.path.dirname(__file__))
from airbyte_corpus import manifests  # noqa: E402


def field_paths(node, out):
    if isinstance(node, dict):
        if node.get("type") == "DpathExtractor" or ("field_path" in node and isinstance(node["field_path"], list)):
            out.append(node.get("field_path") or [])
        for v in node.values():
            field_paths(v, out)
    elif isinstance(node, list):
        for v in node:
            field_paths(v, out)


def bodies(path):
    """Pages shaped for `path`: records where it points (a list, one
    object, several under a wildcard), and pages where it points at
    nothing, null, or an empty object."""
    def build(segments, leaf):
        if not segments:
            return leaf
        head, rest = segments[0], segments[1:]
        if head == "*":
            return {"a": build(rest, leaf), "b": build(rest, leaf)}
        if head.isdigit():
            return [build(rest, leaf) for _ in range(int(head) + 1)]
        return {head: build(rest, leaf), "other": 1}
    records = [{"id": 1, "name": "one"}, {"id": 2, "name": "two"}]
    return [build(path, records), build(path, records[0]), build(path, None), build(path, {}),
            {"unrelated": True}, build(path, "text")]


def main():
    corpus, runner = sys.argv[1], sys.argv[2]
    cases = []
    for name, manifest, config in manifests(corpus):
        found = []
        field_paths(manifest, found)
        for raw in found:
            try:
                path = [str(InterpolatedString.create(str(p), parameters={}).eval(config)) for p in raw]
            except Exception:
                continue
            for body in bodies(path):
                cases.append((name, raw, path, body))
    theirs = []
    for _, _, path, body in cases:
        response = requests.Response()
        response._content = json.dumps(body).encode()
        response.status_code = 200
        extractor = DpathExtractor(field_path=path, config={}, parameters={}, decoder=JsonDecoder(parameters={}))
        theirs.append(list(extractor.extract_records(response)))
    lines = "\n".join(json.dumps({"body": b, "path": p}) for _, _, p, b in cases) + "\n"
    done = subprocess.run([runner], input=lines, capture_output=True, text=True, check=True)
    ours = [json.loads(line)["records"] for line in done.stdout.splitlines()]
    differ = 0
    for (name, raw, path, body), mine, cdk in zip(cases, ours, theirs):
        if mine != cdk:
            differ += 1
            print(f"DIFFERENT {name} {raw} on {json.dumps(body)}:\n    cdk:  {cdk}\n    ours: {mine}")
    print(f"{len(cases)} pages over {len({tuple(map(str, c[1])) for c in cases})} field paths: "
          f"{len(cases) - differ} selected identically, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
