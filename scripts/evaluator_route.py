"""The route of the evaluator through one call of ``landscape.interpolate`` (a structure measure).

Profiles a call on a tiny MLP with ``sys.setprofile`` and counts the calls into ``landscape``
whose frame holds the evaluator (as a local, or as an attribute of a local such as a runner):
calls, distinct functions, modules, returns to a module already left, and visits to
``evaluation/evaluator.py``. ``-v`` lists the calls::

    .venv/bin/python scripts/evaluator_route.py [-v]
"""
import sys
from pathlib import Path
from typing import Any

import torch

import landscape

ROOT = Path(landscape.__file__).resolve().parent
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
other = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
data = (torch.randn(32, 4), torch.randint(3, (32,)))
ev = landscape.Evaluator(model, data, progress=False)
landscape.interpolate(model, other, ev, alphas=5)  # warm: lazy imports, strategy choice
events = []


def holds_evaluator(local_vars: dict) -> bool:
    """The evaluator is a local, or an attribute of one (a runner or strategy holding it)."""
    for v in local_vars.values():
        if v is ev:
            return True
        try:
            if any(a is ev for a in vars(v).values()):
                return True
        except TypeError:
            continue
    return False


def prof(frame: Any, event: str, arg: Any) -> None:
    """Record a call into the package whose frame holds the evaluator."""
    if event == "call":
        f = Path(frame.f_code.co_filename)
        if ROOT in f.parents and holds_evaluator(frame.f_locals):
            events.append((str(f.relative_to(ROOT.parent)), frame.f_code.co_name))


sys.setprofile(prof)
landscape.interpolate(model, other, ev, alphas=5)
sys.setprofile(None)
calls = [e for e in events if not e[1].startswith("<")]
modules = [m for m, _ in calls]
seq = [m for i, m in enumerate(modules) if i == 0 or m != modules[i - 1]]
seen, returns = set(), 0
for m in seq:
    if m in seen:
        returns += 1
    seen.add(m)
print(f"calls {len(calls)}, distinct functions {len(set(calls))}, modules {len(set(modules))}, "
      f"returns to a module already left {returns}, visits to evaluator.py "
      f"{sum(1 for m in seq if m.endswith('evaluation/evaluator.py'))}")
if "-v" in sys.argv:
    for c in calls:
        print(*c)
