"""A job for tests/test_forkserver.py: the fork server's children run ``main`` here instead of ``harness.cli.main``.

``main(argv)``, argv = [command, action, *values]: ``show CODE`` prints what the child is (directory, arguments,
environment, process group) as JSON to stdout, a line to stderr, and returns CODE; ``exit VALUE`` raises SystemExit
with VALUE (an int when it is digits); ``sleep`` prints its pid and sleeps until killed.
"""

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    action, values = argv[1], argv[2:]
    if action == "show":
        print(json.dumps({"cwd": os.getcwd(), "argv": sys.argv[1:], "path": os.environ.get("PATH"),
                          "own_group": os.getpgid(0) == os.getpid(), "pid": os.getpid()}))
        print("probe stderr", file=sys.stderr)
        return int(values[0])
    if action == "exit":
        raise SystemExit(int(values[0]) if values[0].isdigit() else values[0])
    print(os.getpid(), flush=True)
    time.sleep(120)
    return 0
