"""dlt, as a peer to measure against: the email-campaign pages the
benchmark serves, read from files, loaded by dlt's filesystem destination
as Parquet. Prints the records loaded and the seconds the run took
(extract, normalize and load).

Usage: dlt_parquet.py <pages-folder> <output-folder>
"""

import json
import os
import shutil
import sys
import time

os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")

import dlt  # noqa: E402


def main():
    folder, out = (os.path.abspath(p) for p in sys.argv[1:3])
    shutil.rmtree(out, ignore_errors=True)
    records = 0

    def campaigns():
        nonlocal records
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as page:
                data = json.load(page)["data"]
            records += len(data)
            yield data

    pipeline = dlt.pipeline(
        pipeline_name="bench",
        destination=dlt.destinations.filesystem(bucket_url="file://" + out),
        dataset_name="bench",
        pipelines_dir=os.path.join(out, ".dlt"),
    )
    started = time.perf_counter()
    pipeline.run(campaigns(), table_name="campaigns", loader_file_format="parquet", write_disposition="replace")
    print(records, time.perf_counter() - started)


if __name__ == "__main__":
    main()
