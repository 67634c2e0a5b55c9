"""Airbyte's CDK reading a declarative manifest as Airbyte runs a source:
its entrypoint's `read`, every message serialised as the platform reads it
from the connector (written to /dev/null here), full refresh.

    airbyte_cdk_read.py MANIFEST.json CONFIG.json HOST PORT CA_FILE

HOST is answered by 127.0.0.1:PORT (the benchmark's fake provider, whose
certificate CA_FILE signs). Prints "<records> <seconds>".
"""

import json
import os
import sys
import tempfile
import time
from unittest import mock

import urllib3.util.connection as connection
from airbyte_cdk.entrypoint import AirbyteEntrypoint
from airbyte_cdk.sources.declarative.concurrent_declarative_source import ConcurrentDeclarativeSource


def main():
    manifest_path, config_path, host, port, ca = sys.argv[1:6]
    # The figures go to the real standard output; whatever the CDK prints
    # there itself (its log messages) goes nowhere.
    figures = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    manifest = json.load(open(manifest_path))
    config = json.load(open(config_path))
    os.environ["REQUESTS_CA_BUNDLE"] = ca
    original = connection.create_connection

    def to_provider(address, *args, **kwargs):
        if address[0] != host:
            raise ConnectionRefusedError(f"{address[0]} is not the benchmark's provider")
        return original(("127.0.0.1", int(port)), *args, **kwargs)

    streams = [s["name"] for s in manifest["streams"]]
    catalog = {"streams": [{"stream": {"name": s, "json_schema": {}, "supported_sync_modes": ["full_refresh"]},
                            "sync_mode": "full_refresh", "destination_sync_mode": "overwrite"} for s in streams]}
    work = tempfile.mkdtemp()
    config_file, catalog_file = os.path.join(work, "config.json"), os.path.join(work, "catalog.json")
    json.dump(config, open(config_file, "w"))
    json.dump(catalog, open(catalog_file, "w"))
    records = 0
    with mock.patch.object(connection, "create_connection", to_provider), open(os.devnull, "w") as out:
        started = time.monotonic()
        source = ConcurrentDeclarativeSource(catalog=None, config=config, state=None, source_config=manifest)
        entrypoint = AirbyteEntrypoint(source)
        args = entrypoint.parse_args(["read", "--config", config_file, "--catalog", catalog_file])
        for message in entrypoint.run(args):
            out.write(message)
            out.write("\n")
            if message.startswith('{"type":"RECORD"'):
                records += 1
        seconds = time.monotonic() - started
    print(records, seconds, file=figures, flush=True)


if __name__ == "__main__":
    main()
