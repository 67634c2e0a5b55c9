"""An S3-compatible store for the tests: moto's server on loopback.

Starts moto in server mode on a free loopback port with request
authentication on: after the four set-up calls below, every request must
carry a valid AWS Signature Version 4 of an access key moto issued, and
the key's user may use S3 only. Creates the user, its key and the bucket
named on the command line, prints one JSON line
{"port", "access_key_id", "secret_access_key"}, and serves until its
standard input closes.

Usage: moto_s3.py <bucket>
"""

import json
import logging
import os
import sys

# Read by moto when it is imported: requests after the first four are
# authenticated and authorised as IAM says.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

S3_ONLY = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
)


def main():
    bucket = sys.argv[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    endpoint = f"http://127.0.0.1:{port}"
    setup = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    setup.update(aws_access_key_id="setup", aws_secret_access_key="setup")
    iam = boto3.client("iam", **setup)
    iam.create_user(UserName="lakehouse")
    key = iam.create_access_key(UserName="lakehouse")["AccessKey"]
    iam.put_user_policy(UserName="lakehouse", PolicyName="s3", PolicyDocument=S3_ONLY)
    boto3.client("s3", **setup).create_bucket(Bucket=bucket)
    print(
        json.dumps(
            {"port": port, "access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}
        ),
        flush=True,
    )
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
