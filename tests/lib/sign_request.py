#!/usr/bin/env python3
"""sign_request.py KEYFILE NODE PATH BODY [TS_MS]: prints an X-Strata-Signature value for
POST PATH with BODY, signed for NODE with the cluster key in KEYFILE (cluster/signed_request.h),
written apart from the C code so the tests check one against the other. TS_MS defaults to now."""
import hashlib
import hmac
import os
import sys
import time

key = bytes.fromhex(open(sys.argv[1]).read().strip())
node, path, body = int(sys.argv[2]), sys.argv[3], sys.argv[4].encode()
ts = int(sys.argv[5]) if len(sys.argv) > 5 else int(time.time() * 1000)
nonce = os.urandom(16).hex()
k = hashlib.blake2b(b"strata operator v1", key=key, digest_size=32).digest()
msg = b"strata-signed-v1\nPOST\n%s\n%d\n%d\n%s\n" % (path.encode(), node, ts, nonce.encode()) + body
mac = hmac.new(k, msg, hashlib.sha512).digest()[:32].hex()
print(f"v1 node={node} ts={ts} nonce={nonce} mac={mac}")
