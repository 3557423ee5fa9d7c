"""Whether a process that left something behind still lives (``training.processes``): the
abandoned MLflow runs close what ``process_alive`` calls gone; the trials sweep removes only what
``process_gone`` calls gone, which is narrower (never another host's, never this process's)."""

import os
import platform
import subprocess
import sys

from training.processes import process_alive, process_gone


def test_alive_and_gone_for_every_kind_of_owner():
    here = platform.node()
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            dead = subprocess.Popen([sys.executable, "-c", "pass"])
            dead.wait()
            owners = {
                "a live process here": (here, live.pid, True, False),
                "an ended process here": (here, dead.pid, False, True),
                "this process": (here, os.getpid(), False, False),
                "another host's": ("elsewhere", live.pid, False, False),
                "no pid": (here, None, False, False),
                "a pid that is no number": (here, "12a", False, False),
            }
            for what, (host, pid, alive, gone) in owners.items():
                assert process_alive(host, pid) is alive, what
                assert process_gone(host, pid) is gone, what
                assert process_alive(host, str(pid) if pid is not None else pid) is alive, what  # a tag
        finally:
            live.kill()
