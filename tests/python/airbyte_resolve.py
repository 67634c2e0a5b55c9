"""Differential check of manifest resolution against Airbyte's CDK.

Each manifest of the development corpus (`../shared/airbyte-manifests`)
is resolved by the CDK (`ManifestReferenceResolver`, then
`ManifestComponentTransformer.propagate_types_and_parameters`) and by our
`declarative` crate (its `resolve` example), and the results compared.

    python tests/python/airbyte_resolve.py ../shared/airbyte-manifests \\
        plugins/target/x86_64-unknown-linux-gnu/debug/examples/resolve

prints a summary and each difference (its JSON path); exits 1 on any.
Needs `airbyte-cdk` (7.39.1) in the running Python.
"""

import json
import os
import subprocess
import sys

from airbyte_cdk.sources.declarative.parsers.manifest_component_transformer import ManifestComponentTransformer
from airbyte_cdk.sources.declarative.parsers.manifest_reference_resolver import ManifestReferenceResolver

sys.path.insert(0, os.path.dirname(__file__))
from airbyte_corpus import manifests  # noqa: E402


def first_difference(a, b, path=""):
    if type(a) is not type(b):
        return f"{path or '/'}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}/{k}: only on {'ours' if k in a else 'the CDK'}"
            d = first_difference(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}/{i}")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r} vs {b!r}"


def main():
    corpus, runner = sys.argv[1], sys.argv[2]
    same = differ = both_failed = 0
    for name, manifest, _ in manifests(corpus):
        manifest = json.loads(json.dumps(manifest, default=str))
        try:
            resolved = ManifestReferenceResolver().preprocess_manifest(manifest)
            theirs = ManifestComponentTransformer().propagate_types_and_parameters("", resolved, {})
            theirs = json.loads(json.dumps(theirs, default=str))
        except Exception as e:  # the CDK's refusal is an answer too
            theirs = {"error": type(e).__name__}
        done = subprocess.run([runner], input=json.dumps(manifest), capture_output=True, text=True, check=True)
        ours = json.loads(done.stdout)
        if "error" in theirs and "error" in ours:
            both_failed += 1
            continue
        d = first_difference(ours, theirs)
        if d is None:
            same += 1
        else:
            differ += 1
            print(f"DIFFERENT {name}: {d}")
    print(f"{same + differ + both_failed} manifests: {same} resolved identically, "
          f"{both_failed} refused on both sides, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
