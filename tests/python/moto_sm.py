"""AWS Secrets Manager for the tests: moto's server on loopback.

Starts moto in server mode on a free loopback port with request
authentication on. Creates two IAM users: `reader`, allowed
secretsmanager:GetSecretValue only (its key is the server's), and `writer`,
which this script uses to write secrets. Prints one JSON line
{"port", "access_key_id", "secret_access_key"} (the reader's key), then
reads JSON lines {"name", "value"} from standard input, writes each as the
current value of that secret (creating it the first time) and answers
"ok" on a line of its own. Stops when standard input closes.

Usage: moto_sm.py
"""

import json
import logging
import os
import sys

# Read by moto when it is imported: requests after the first six (the
# IAM set-up below) are authenticated and authorised as IAM says.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "6"

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402


def policy(action):
    return json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": action, "Resource": "*"}]})


def main():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    endpoint = f"http://127.0.0.1:{port}"
    setup = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    iam = boto3.client("iam", aws_access_key_id="setup", aws_secret_access_key="setup", **setup)
    keys = {}
    for user, action in (("reader", "secretsmanager:GetSecretValue"), ("writer", "secretsmanager:*")):
        iam.create_user(UserName=user)
        keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
        iam.put_user_policy(UserName=user, PolicyName="secrets", PolicyDocument=policy(action))
    writer = boto3.client(
        "secretsmanager",
        aws_access_key_id=keys["writer"]["AccessKeyId"],
        aws_secret_access_key=keys["writer"]["SecretAccessKey"],
        **setup,
    )
    reader = keys["reader"]
    print(
        json.dumps(
            {"port": port, "access_key_id": reader["AccessKeyId"], "secret_access_key": reader["SecretAccessKey"]}
        ),
        flush=True,
    )
    written = set()
    for line in sys.stdin:
        secret = json.loads(line)
        if secret["name"] in written:
            writer.put_secret_value(SecretId=secret["name"], SecretString=secret["value"])
        else:
            writer.create_secret(Name=secret["name"], SecretString=secret["value"])
            written.add(secret["name"])
        print("ok", flush=True)
    server.stop()


if __name__ == "__main__":
    main()
