"""dlt's side of the drift suite (tests/integration/drift.rs): the same
syncs of the same fake provider's pages, through dlt's REST-style resources
and its schema contracts, into DuckDB.

    dlt_drift.py HOST PORT CA_FILE

HOST is answered by 127.0.0.1:PORT (the suite's fake provider, whose
certificate CA_FILE signs). Prints {"ready": true}, then reads commands, a
JSON line each, and answers each with a JSON line:

    {"dir": ..., "pipeline": ..., "token": ..., "page_size": 4,
     "contract": "evolve" | "strict",
     "streams": [{"name", "path", "primary_key", "write_disposition",
                  "columns": {name: dlt column hint}}]}

runs one sync of those streams (incremental on `updated_at`, which the
provider filters by `since`), and answers per stream the records read,
the rows dlt's normalizer kept, the rows in the table afterwards, its
columns and its rows' declared fields (`values`); or the error that
stopped the run.
"""

import json
import os
import sys

os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")

import dlt  # noqa: E402
import requests  # noqa: E402
import urllib3.util.connection as connection  # noqa: E402

# What "strict" means for dlt: its nearest to keeping bad rows aside is
# dropping them; new tables still evolve.
CONTRACTS = {
    "evolve": "evolve",
    "strict": {"tables": "evolve", "columns": "discard_row", "data_type": "discard_row"},
}


def route_to(host, port):
    original = connection.create_connection

    def to_provider(address, *args, **kwargs):
        if address[0] != host:
            raise ConnectionRefusedError(f"{address[0]} is not the suite's provider")
        return original(("127.0.0.1", port), *args, **kwargs)

    connection.create_connection = to_provider


def resource(stream, base, token, page_size, read, contract):
    def pages(updated_at=dlt.sources.incremental("updated_at")):
        # Where the last run ended; `last_value` moves as pages are read.
        since = updated_at.start_value
        cursor = None
        while True:
            params = {"limit": page_size}
            if cursor is not None:
                params["cursor"] = cursor
            if since is not None:
                params["since"] = since
            answer = requests.get(
                base + stream["path"], params=params, headers={"Authorization": f"Bearer {token}"}, timeout=30
            )
            answer.raise_for_status()
            body = answer.json()
            read[stream["name"]] += len(body["data"])
            yield body["data"]
            cursor = body.get("next_cursor")
            if cursor is None:
                return

    return dlt.resource(
        pages,
        name=stream["name"],
        primary_key=stream["primary_key"],
        write_disposition=stream["write_disposition"],
        columns=stream["columns"],
        schema_contract=CONTRACTS[contract],
    )


def plain(value):
    """A value read back from DuckDB, as JSON holds it."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def sync(command, base):
    read = {s["name"]: 0 for s in command["streams"]}
    resources = [
        resource(s, base, command["token"], command["page_size"], read, command["contract"])
        for s in command["streams"]
    ]
    pipeline = dlt.pipeline(
        pipeline_name=command["pipeline"],
        destination=dlt.destinations.duckdb(os.path.join(command["dir"], command["pipeline"] + ".duckdb")),
        dataset_name="drift",
        pipelines_dir=os.path.join(command["dir"], ".dlt"),
    )
    answer = {"streams": {}, "error": None}
    try:
        pipeline.run(resources)
        kept = pipeline.last_trace.last_normalize_info.row_counts
    except Exception as error:  # the run's failure is the answer
        answer["error"] = str(error).splitlines()[0][:300]
        kept = {}
    tables = pipeline.default_schema.tables
    for s in command["streams"]:
        name = s["name"]
        columns = sorted(c for c in tables.get(name, {}).get("columns", {}) if not c.startswith("_dlt"))
        declared = [c for c in s["columns"] if c in columns]
        values = None
        try:
            with pipeline.sql_client() as client:
                listed = ", ".join(f'"{c}"' for c in declared)
                values = [dict(zip(declared, map(plain, row))) for row in client.execute_sql(f'SELECT {listed} FROM "{name}"')]
        except Exception:  # no table yet
            values = None
        rows = None if values is None else len(values)
        answer["streams"][name] = {
            "read": read[name],
            "kept": kept.get(name, 0),
            "rows": rows,
            "columns": columns,
            "values": values,
        }
    return answer


def main():
    host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.environ["REQUESTS_CA_BUNDLE"] = ca
    route_to(host, port)
    base = f"https://{host}"
    # Answers go to the real standard output; whatever dlt prints there
    # itself goes to standard error.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    print(json.dumps({"ready": True}), file=answers, flush=True)
    for line in sys.stdin:
        print(json.dumps(sync(json.loads(line), base)), file=answers, flush=True)


if __name__ == "__main__":
    main()
