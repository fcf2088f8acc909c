"""How tools/run_e2e.py runs its steps: each command under the part's
deadline with its output in LOGS/NAME.log and a line in the summary, lanes of
steps side by side on a GPU each, and the headline numbers of the logs."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

# A step with less time than this before its deadline is skipped.
MIN_STEP_S = 20
# A step still running this long after its SIGTERM is killed, as `timeout -k 15`.
KILL_AFTER_S = 15
# The last training log line of a run: its time: field is the seconds per iteration.
LAST_ITERATION = re.compile(r"Epoch\(train\).*\]\[[0-9/]*\].* data_time: [0-9.]*")


class Summary:
    """OUT/PART.log, appended to line by line from every lane."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        path.write_text("")

    def add(self, line: str) -> None:
        with self._lock, self.path.open("a") as out:
            out.write(line + "\n")


@dataclass(frozen=True)
class Steps:
    """Runs steps before ``deadline`` (time.monotonic()) with ``env``."""
    logs: Path
    summary: Summary
    deadline: float
    env: dict

    def on_gpu(self, gpu: str | None) -> Steps:
        """These steps on one GPU (all the visible ones for None)."""
        return self if gpu is None else replace(self, env={**self.env, "CUDA_VISIBLE_DEVICES": gpu})

    def run(self, name: str, reserve_s: float, command: list[str], **env: str) -> int | None:
        """Run ``command`` (output in LOGS/NAME.log), stopped at the deadline
        less ``reserve_s`` (what the steps after it in its lane need): exit
        code 124 then, as `timeout`'s.  None if there is not time to start it."""
        start = time.monotonic()
        limit = int(self.deadline - start - reserve_s)
        line = " ".join(command)
        if limit < MIN_STEP_S:
            self.summary.add(f"{name:<22} skipped ({limit}s left)  {line}")
            return None
        with (self.logs / f"{name}.log").open("w") as log:
            # A process group of its own: the signals reach its children too
            # (loader workers, torchrun's ranks).
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       env={**self.env, **env}, start_new_session=True)
            try:
                rc = process.wait(limit)
            except subprocess.TimeoutExpired:
                rc = stop(process)
        self.summary.add(f"{name:<22} rc={rc:<3} {round(time.monotonic() - start):4}s  {line}")
        return rc


def stop(process: subprocess.Popen) -> int:
    """SIGTERM to the process's group, SIGKILL KILL_AFTER_S later; `timeout`'s exit code."""
    # Its group lives on while the process is not waited for.
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(KILL_AFTER_S)
        return 124
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return 137


def side_by_side(jobs: list[Callable[[], object]]) -> None:
    """Run ``jobs`` at once; re-raises the first failure after all have ended."""
    with ThreadPoolExecutor(max(len(jobs), 1)) as pool:
        futures = [pool.submit(job) for job in jobs]
    for future in futures:
        future.result()


def lanes(steps: Steps, gpus: tuple[str, ...], *lane: Callable[[Steps], object]) -> None:
    """Each lane on a GPU of its own given as many, else one after the other."""
    if len(gpus) >= len(lane):
        side_by_side([lambda job=job, gpu=gpu: job(steps.on_gpu(gpu))
                      for job, gpu in zip(lane, gpus)])
    else:
        for job in lane:
            job(steps)


def headlines(logs: Path, pattern: str) -> list[str]:
    """The lines of every log matching ``pattern`` (LOG.log:line), then the
    last iteration line of each training (logs *train* and single_*)."""
    found = []
    headline = re.compile(pattern)
    for log in sorted(logs.glob("*.log")):
        found += [f"{log.name}:{line}" for line in read_lines(log) if headline.search(line)]
    for log in sorted(logs.glob("*train*.log")) + sorted(logs.glob("single_*.log")):
        matches = [match.group(0) for match in map(LAST_ITERATION.search, read_lines(log))
                   if match]
        if matches:
            found.append(f"{log.name}:{matches[-1]}")
    return found


def read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()
