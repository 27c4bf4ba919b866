"""The reader of test_hosts.py's removed-host test: reads two owners'
buffers (rdmabuf serve's seq pattern: byte i is i mod 251) over and over,
concurrently, and prints one line per read: "OWNER ok" or "OWNER failed
ERROR SECONDS". Stops reading an owner after its first failure; exits
after ROUNDS_AFTER more reads of the other, or 0 when both failed.

    reader_job.py SIZE ROUNDS_AFTER NAME=HANDLE NAME=HANDLE"""

import sys
import time
import warnings

import numpy as np

import rdmabuf

warnings.simplefilter("ignore", rdmabuf.RDMATcpFallbackWarning)
size, rounds_after = int(sys.argv[1]), int(sys.argv[2])
owners = {}
for arg in sys.argv[3:]:
    name, text = arg.split("=", 1)
    owners[name] = rdmabuf.RDMABuffer.from_text(text)
expected = (np.arange(size, dtype=np.int64) % 251).astype(np.uint8)
dst = {name: np.zeros(size, np.uint8) for name in owners}
failed: set = set()
left = None
while left is None or left > 0:
    started = time.monotonic()
    futures = {n: b.read_into(dst[n], timeout=20) for n, b in owners.items() if n not in failed}
    if not futures:
        break
    for name, future in futures.items():
        try:
            future.get()
            assert (dst[name] == expected).all(), f"{name}: wrong bytes"
            dst[name][:] = 0
            print(f"{name} ok", flush=True)
        except rdmabuf.Error as e:
            print(f"{name} failed {type(e).__name__} {time.monotonic() - started:.1f} {e}", flush=True)
            failed.add(name)
    if failed and left is None:
        left = rounds_after
    elif left is not None:
        left -= 1
