"""Verifies received webhook messages with the Standard Webhooks reference
library, unmodified.

Usage: verify_webhooks.py MESSAGES.json

MESSAGES.json is a list of {"secret", "headers", "body"}: the secret as the
server showed it (whsec_...), the headers as received, the body as
received (text). Prints one line per message; exits 1 if any fails.
"""

import json
import sys

from standardwebhooks.webhooks import Webhook


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        messages = json.load(f)
    failed = 0
    for m in messages:
        try:
            Webhook(m["secret"]).verify(m["body"], m["headers"])
            print("ok", m["headers"].get("webhook-id"))
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failed += 1
            print("FAILED", m["headers"].get("webhook-id"), type(e).__name__, e)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
