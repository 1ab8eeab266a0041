"""A killed plane loses at most ``flush_interval`` seconds of work, whatever the chunk size.

The loop strategy sizes its runs so that each finishes within ``flush_interval`` seconds (from
the time per point measured on the previous run), and the cache writes finished points at
least that often. A worker process evaluates a plane with the default chunk size, each point
slowed to a known duration, and is SIGKILLed after a known number of points; the resumed run
must compute only the points that were missing, up to one flush interval's worth.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from landscape import Cache, Evaluator, plane

from conftest import make_mlp

TESTS = Path(__file__).parent
RESOLUTION = 12  # 144 points
POINT_SECONDS = 0.02
FLUSH = 0.2  # about 10 points per run

WORKER = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
import torch
from conftest import make_mlp
from landscape import Cache, Evaluator, plane

data = torch.load({data!r}, weights_only=True)
kill_after = int(sys.argv[1])
ev = Evaluator(make_mlp(0), (data["x"], data["y"]), device="cpu", strategy="loop", flush_interval={flush},
               cache=Cache({cache!r}, flush_interval={flush}))
sums = ev.loop.sums
done = 0

def slow(vecs, coeffs, index=None):
    global done
    for _ in range(len(vecs)):
        time.sleep({point_seconds})
        done += 1
        if done > kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    return sums(vecs, coeffs, index)

ev.loop.sums = slow
plane(*{models!r}, ev, resolution={resolution})
"""


def test_a_killed_plane_resumes_losing_at_most_one_flush_interval(tmp_path, digits):
    x, y = digits
    torch.save({"x": x[:64], "y": y[:64]}, tmp_path / "data.pt")
    models = []
    for seed in (1, 2, 3):
        path = tmp_path / f"m{seed}.pt"
        torch.save(make_mlp(seed).state_dict(), path)
        models.append(str(path))
    script = tmp_path / "worker.py"
    cache = tmp_path / "cache"
    script.write_text(WORKER.format(tests=str(TESTS), data=str(tmp_path / "data.pt"), cache=str(cache),
                                    flush=FLUSH, point_seconds=POINT_SECONDS, models=models, resolution=RESOLUTION))
    kill_after = 70
    proc = subprocess.run([sys.executable, str(script), str(kill_after)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    ev = Evaluator(make_mlp(0), (x[:64], y[:64]), device="cpu", cache=Cache(cache))
    resumed = plane(*models, ev, resolution=RESOLUTION)
    total = RESOLUTION ** 2
    lost = ev.points_evaluated - (total - kill_after)
    # at most one run of about FLUSH / POINT_SECONDS points (plus the first short probe run) is lost
    assert 0 <= lost <= 2 * FLUSH / POINT_SECONDS + 4, (ev.points_evaluated, lost)
    reference = plane(*models, Evaluator(make_mlp(0), (x[:64], y[:64]), device="cpu"), resolution=RESOLUTION)
    # resumed points take the uninterrupted run's code path: the same bits
    torch.testing.assert_close(torch.from_numpy(resumed.loss), torch.from_numpy(reference.loss), rtol=0, atol=0)
