#!/usr/bin/env bash
# The GPU checks in one short call: the CUDA tests, then the GPU benchmarks at sizes that fit
# a few minutes (per-point and per-round times scale to the full GPU targets of run_all.py).
# Runs with the machine's own python3 and PyTorch and this checkout on PYTHONPATH; packages
# the machine lacks come as wheels in .whl/ (mnist1d, plotly). Logs go to $OUT (or ./gpu-logs).
set -u
out=${OUT:-gpu-logs}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
torch.cuda.get_device_name(), 'tf32 matmul', torch.backends.cuda.matmul.allow_tf32,
'tf32 cudnn', torch.backends.cudnn.allow_tf32)" | tee -a "$out/gpu.txt"
timeout "${TEST_S:-120}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -rA 2>&1 | tee "$out/tests.log"
timeout "${FL_S:-100}" python3 benchmarks/bench_fl.py --device cuda --clients 50 --cases mlp:64:500,fedgucci_cnn:3x32x32:500 --run-clients 50 \
  2>&1 | tee "$out/fl.log"
plane_args=${PLANE_ARGS:-"--resolution 11 --samples 10000 --batch-size 10000 --max-points 16 --repeats 2"}
# shellcheck disable=SC2086  # the arguments are meant to split
timeout "${PLANE_S:-260}" python3 benchmarks/bench_plane.py --models resnet20 --device cuda --bf16 --compile \
  $plane_args 2>&1 | tee "$out/plane.log"
