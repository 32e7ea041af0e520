#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run (each of them skips or refuses where no GPU is visible):
# bit-exact save/restore of TrainingState across cpu/cuda, `tunekit check --device cuda` of a class and a
# function trainable, multi-worker trials on NCCL (DDP and FSDP2, killed mid-epoch and inside a write),
# Lightning and the HF Trainer resumed bit-exactly on the GPU, and the GPU pause/resume benchmark.
#
#     bash benchmarks/gpu_checks.sh        # from the repository root, tunekit and its test extras installed
#
# Each step is printed with its outcome and seconds; the exit status is 1 when any step failed.
set -u
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
failed=()
step() {  # step SECONDS COMMAND...: run it under a time limit of its own, so one hang spends no more
    local limit=$1; shift
    echo "=== $*"
    local t0=$SECONDS
    timeout "$limit" "$@" || failed+=("$*")
    echo "=== $((SECONDS - t0)) s"
}
nvidia-smi -L || true
$PY -c "import torch, ray; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), '| ray', ray.__version__)"
step 90 $PY -m pytest -q -rs -p no:cacheprovider tests/tunekit/test_state.py -k "another"
step 240 $PY -m pytest -q -rs -p no:cacheprovider tests/tunekit/test_multiworker.py -k gpu
step 150 $PY benchmarks/pbt_gpu.py
step 90 $PY -m tunekit.cli check tunekit.trainables:DigitsTrainable --device cuda
step 90 $PY -m tunekit.cli check tunekit.trainables:train_digits --device cuda
step 180 $PY -m pytest -q -rs -p no:cacheprovider tests/integrations/test_frameworks.py -k gpu
if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "every GPU check passed"
