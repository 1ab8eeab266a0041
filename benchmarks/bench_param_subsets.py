r"""Memory and time of a random plane over a LoRA adapter (``params="trainable"``) against the full model.

A GPT-2-small-sized model (``transformers.GPT2Config()`` defaults: 124M parameters, random
weights, nothing downloaded) with a ``peft`` LoRA adapter of rank 8 on ``c_attn`` (its
``lora_B`` set to small random values, as after fine-tuning: a zero ``lora_B`` gives a zero
filter-normalised direction), evaluated with ``loss="causal_lm"`` on a few sequences of random
token ids. Each case runs in its own process; its peak extra memory is the largest resident
set size (sampled every 5 ms with psutil) above the process's size after the model and the
Evaluator were built, so the fixed base, the Evaluator's module copies and the data are not
counted.

* ``subset RxR``: ``random_plane(..., params="trainable")`` on an R x R grid;
* ``full RxR``: the same plane over every entry (``params=None``) on a small grid;
* ``full directions only``: the set-up of the full plane's two filter-normalised directions
  (two float64 vectors of the model's size), without evaluating a point.

    .venv/bin/python benchmarks/bench_param_subsets.py --resolution 21 --full-resolution 3
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

import psutil
import torch

import landscape

CASES = ("subset", "full", "full-directions")


def build(sequences: int, tokens: int):
    """The LoRA GPT-2 model and its Evaluator."""
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["c_attn"], fan_in_fan_out=True)).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=gen)
    ids = torch.randint(0, model.config.vocab_size, (sequences, tokens), generator=gen)
    rows = [{"input_ids": ids[i], "labels": ids[i]} for i in range(sequences)]
    data = torch.utils.data.DataLoader(rows, batch_size=sequences)
    ev = landscape.Evaluator(model, data, loss="causal_lm", output="logits", progress=False)
    return model, ev


class PeakRSS:
    """Largest resident set size while the block runs, sampled every 5 ms."""

    def __enter__(self) -> "PeakRSS":
        self.proc = psutil.Process()
        self.start = self.peak = self.proc.memory_info().rss
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def run_case(case: str, resolution: int, sequences: int, tokens: int) -> dict:
    """One measurement (in this process)."""
    from landscape.geometry.planes import random_direction

    model, ev = build(sequences, tokens)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    vc = ev.vector(model)
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        if case == "full-directions":
            gen = torch.Generator().manual_seed(0)
            dirs = [random_direction(ev.space, vc, gen) for _ in range(2)]
            points, size = 0, dirs[0].numel()
        else:
            plane = landscape.random_plane(model, ev, resolution=resolution, span=0.5,
                                           params="trainable" if case == "subset" else None)
            points, size = plane.loss.size, plane.u.size
    return {"case": case, "resolution": resolution if points else 0, "points": points, "direction_size": size,
            "model_size": ev.space.size, "adapter_size": trainable, "seconds": time.perf_counter() - t0,
            "peak_extra_mb": (mem.peak - mem.start) / 2 ** 20}


def main() -> None:
    """Run each case in its own process and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=21, help="grid of the subset plane")
    parser.add_argument("--full-resolution", type=int, default=3, help="grid of the full-model plane")
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        resolution = args.resolution if args.case == "subset" else args.full_resolution
        print(json.dumps(run_case(args.case, resolution, args.sequences, args.tokens)))
        return
    runs = [("subset", args.full_resolution), ("subset", args.resolution), ("full", args.full_resolution),
            ("full-directions", 0)]
    rows = []
    for case, resolution in runs:
        out = subprocess.run([sys.executable, __file__, "--case", case, "--resolution", str(resolution),
                              "--full-resolution", str(resolution), "--sequences", str(args.sequences),
                              "--tokens", str(args.tokens)], check=True, capture_output=True, text=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = rows[0]
    print(f"GPT-2 small ({first['model_size']:,} float entries), LoRA r=8 on c_attn ({first['adapter_size']:,} "
          f"trainable), {args.sequences} x {args.tokens} random tokens, causal_lm, torch threads "
          f"{torch.get_num_threads()}")
    print("| plane | points | direction length | wall s | s/point | peak extra MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        name = {"subset": "LoRA subset (`params=\"trainable\"`)", "full": "full model (`params=None`)",
                "full-directions": "full model, two directions only (set-up, no point)"}[r["case"]]
        grid = f"{r['resolution']}x{r['resolution']}" if r["points"] else "-"
        per = f"{r['seconds'] / r['points']:.2f}" if r["points"] else "-"
        print(f"| {name} {grid} | {r['points']} | {r['direction_size']:,} | {r['seconds']:.1f} | {per} | "
              f"{r['peak_extra_mb']:,.0f} |")


if __name__ == "__main__":
    main()
