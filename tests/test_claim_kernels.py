"""paper_claims.kernels: the pinned CPU kernels give the same bits whatever the process started with.

A tiny training (the MNIST-1D CNN, 8 SGD steps with momentum: convolutions, GEMMs, their
gradients) runs in fresh interpreters that pin themselves as ``python -m paper_claims`` does
(``reexec`` before torch is imported, then ``apply``). Started from an environment asking for
other kernels (ATen's scalar ``default``, MKL's AUTO branch) and limiting the instruction sets
MKL and oneDNN may use, as an older host does, the pinned runs are bit-identical; the same
training on ATen's scalar kernels (``--kernels native``) is not, so the comparison sees a
kernel change. What one machine cannot show (another vendor's MKL, another cache size) is
argued in the module's docstring.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from landscape import ConfigError
from paper_claims import kernels as claim_kernels

ROOT = Path(__file__).resolve().parents[1]

TRAIN = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from paper_claims import kernels as claim_kernels
claim_kernels.reexec(sys.argv)
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from fl.models import build_model
torch.set_num_threads(1)
claim_kernels.apply(claim_kernels.requested(sys.argv[2:]))
model = build_model("mnist1d_cnn", num_classes=10, input_shape=(1, 40), seed=0)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(256, 1, 40, generator=g), torch.randint(0, 10, (256,), generator=g)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(8):
    idx = slice(32 * step, 32 * step + 32)
    opt.zero_grad()
    F.cross_entropy(model(x[idx]), y[idx]).backward()
    opt.step()
save_file({{k: v.contiguous() for k, v in model.state_dict().items()}}, sys.argv[1])
open(sys.argv[1] + ".json", "w").write(json.dumps(claim_kernels.record()))
"""


def train(tmp_path: Path, name: str, kernels: str, **env: str) -> tuple[dict[str, torch.Tensor], dict, str]:
    """The tiny training in a fresh interpreter started with ``env``: its tensors, kernel record and stdout."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ATEN_", "MKL_", "ONEDNN_", "DNNL_"))}
    out = tmp_path / f"{name}.safetensors"
    done = subprocess.run([sys.executable, str(script), str(out), "--kernels", kernels], capture_output=True,
                          text=True, timeout=300, env={**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
                                                       **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return load_file(out), json.loads(Path(f"{out}.json").read_text()), done.stdout


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"), reason="needs an AVX2 CPU")
def test_pinned_training_is_bit_identical_whatever_the_process_started_with(tmp_path):
    ref, rec, stdout = train(tmp_path, "pinned", "pinned", MKL_VERBOSE="1")
    assert rec["pinned"] and rec["aten"] == "AVX2" and not rec["onednn"] and rec["threads"] == 1
    assert rec["env"]["MKL_CBWR"] == "COMPATIBLE" and rec["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    if torch.backends.mkl.is_available():  # every GEMM ran in MKL's reproducible COMPATIBLE branch
        gemms = [line for line in stdout.splitlines() if "GEMM" in line]
        assert gemms and all("CNR:COMPATIBLE" in line for line in gemms)
    other, rec2, _ = train(tmp_path, "asked-otherwise", "pinned", ATEN_CPU_CAPABILITY="default", MKL_CBWR="AUTO",
                           ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="SSE4_2")
    assert rec2["aten"] == "AVX2" and rec2["env"]["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    assert ref.keys() == other.keys() and all(torch.equal(ref[k], other[k]) for k in ref)
    scalar, rec3, _ = train(tmp_path, "native-scalar", "native", ATEN_CPU_CAPABILITY="default")
    assert rec3["aten"] == "DEFAULT" and not rec3["pinned"] and not claim_kernels.same_kernels(rec, rec3)
    assert not all(torch.equal(ref[k], scalar[k]) for k in ref)  # other kernels: other bits


def test_the_kernels_flag_and_the_pinned_environment():
    assert claim_kernels.requested([]) == "pinned"
    assert claim_kernels.requested(["--seeds", "0", "--kernels", "native"]) == "native"
    assert claim_kernels.requested(["--kernels=native"]) == "native"
    assert claim_kernels.pinned(claim_kernels.PIN) and not claim_kernels.pinned({**claim_kernels.PIN,
                                                                                  "MKL_CBWR": "AVX2"})


def test_a_folder_trained_with_other_kernels_is_refused(tmp_path):
    claim_kernels.stamp(tmp_path)  # records this process's kernels
    stored = json.loads((tmp_path / claim_kernels.RECORD).read_text())
    assert claim_kernels.same_kernels(stored, claim_kernels.record())
    claim_kernels.check(tmp_path)
    (tmp_path / claim_kernels.RECORD).write_text(json.dumps({**stored, "aten": "AVX512" if stored["aten"] != "AVX512"
                                                             else "AVX2"}))
    with pytest.raises(ConfigError, match=f"{tmp_path} was trained with other kernels"):
        claim_kernels.stamp(tmp_path)
    claim_kernels.check(tmp_path / "absent")  # no record: nothing to compare
