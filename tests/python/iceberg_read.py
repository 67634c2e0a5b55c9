"""Reads a lakehouse table the way an engine outside the service does.

Opens the table through pyiceberg's SQL catalog on the service's control
database, scans it with pyiceberg (Arrow) and again with DuckDB over the
same snapshot, and prints one JSON document with what each saw: the
table's snapshots and, per row, the values as exact text (decimals as
written, timestamps to the microsecond) and the pipeline that wrote it.

Usage: iceberg_read.py <catalog-uri> <catalog-name> <namespace.table>, or
iceberg_read.py --serve: one JSON array of those three per line of
standard input, one JSON document per line of output (a test reading many
times pays for the imports once). A fourth element of the array, an
object, holds the catalog's properties (an object store's `s3.endpoint`,
`s3.access-key-id`, `s3.secret-access-key`, `s3.region`); a fifth, a list,
names more columns each row shows as text.
"""

import datetime
import decimal
import json
import sys

from pyiceberg.catalog.sql import SqlCatalog


def text(value):
    if value is None:
        return None
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime.datetime):
        return value.isoformat(timespec="microseconds")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def read(uri, name, ident, properties=None, extra_columns=None):
    catalog = SqlCatalog(name, uri=uri, **(properties or {}))
    table = catalog.load_table(ident)
    arrow = table.scan().to_arrow()
    wanted = ("id", "amount", "updated_at", "day", "note") + tuple(extra_columns or ())
    columns = [c for c in wanted if c in arrow.column_names]
    rows = []
    for record in arrow.to_pylist():
        row = {c: text(record[c]) for c in columns}
        payload = record.get("payload")
        row["payload_n"] = None if payload is None else payload.get("n")
        meta = record.get("_service_meta")
        row["pipeline"] = None if meta is None else json.loads(meta)["pipeline_id"]
        rows.append(row)
    con = table.scan().to_duckdb(table_name="t")
    # The columns where the table has them (a REST source's rows have
    # neither a decimal nor a timestamp column, a mail source's no id).
    types = {f.name: str(f.field_type) for f in table.schema().fields}
    amount = "CAST(amount AS VARCHAR)" if "amount" in types else "NULL"
    updated = "epoch_us(updated_at)" if types.get("updated_at", "").startswith("timestamp") else "NULL"
    ident_column = "id" if "id" in types else "NULL"
    duck = con.execute(f"SELECT {ident_column}, {amount}, {updated} FROM t").fetchall()
    files = list(table.scan().plan_files())
    partitions = {json.dumps([text(v) for v in task.file.partition]) for task in files}
    return json.dumps(
        {
            "snapshots": len(table.metadata.snapshots),
            "snapshot_ids": [snapshot.snapshot_id for snapshot in table.metadata.snapshots],
            "spec": [[f.name, str(f.transform)] for f in table.spec().fields],
            "partitions": len(partitions),
            "files": len(files),
            "columns": [f.name for f in table.schema().fields],
            "types": {f.name: str(f.field_type) for f in table.schema().fields},
            "rows": rows,
            "duckdb": [[r[0], r[1], r[2]] for r in duck],
        }
    )


def main():
    if sys.argv[1:] == ["--serve"]:
        for line in sys.stdin:
            print(read(*json.loads(line)), flush=True)
    else:
        print(read(*sys.argv[1:4]))


if __name__ == "__main__":
    main()
