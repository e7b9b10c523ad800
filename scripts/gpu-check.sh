#!/usr/bin/env bash
# The checks that need a CUDA device, in one run of a few minutes.
#
# Usage (from the repository root, on a machine with a CUDA GPU and torch):
#   scripts/gpu-check.sh [OUT_DIR]
#
# 1. tests/optim/test_optim_cuda.py: every optimizer of the table on the device
#    against torch.optim there; torch's fused CUDA kernels bit for bit, with a
#    number and a tensor `lr`; strided entries.
# 2. scripts/profile_steps.py: where the time of one step goes on the device
#    (host time, kernel launches, synchronizations) for a few optimizers.
# 3. The optimizer sections of the benchmarks on the device (`--device cuda`):
#    `optim` (160 x 64 and the other small sizes) and `optim-scale` (50 x 400,000,
#    GPT-2 small, the scheduled AdamW and the nanoGPT recipe, peak memory from the
#    CUDA allocator), without the compiled steps (`--no-compile`: each compiles
#    for minutes on a GPU), in five groups of optimizers (ONLY="fused small"
#    picks some; Muon, the slowest, runs last).
#
# The working tree's `paramdict` runs from PYTHONPATH with the machine's own torch
# (no install). Each step has its own time limit, so one that overruns leaves the
# others' results. Everything goes to OUT_DIR (default: gpu-results): env.log,
# tests.log, GROUP.log and GROUP/results.{md,json} per group, and all of it again
# in gpu-check.tgz. DEVICE=cpu runs the same steps on the CPU (a dry run).
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
python=${PYTHON:-python3}

"$python" - <<'EOF' 2>&1 | tee "$out/env.log"
import platform, torch
print("torch", torch.__version__, "python", platform.python_version())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "cuda", torch.version.cuda)
EOF

# torch releases warn about their own deprecations: shown, not failing the run
timeout "${TESTS_LIMIT:-100}" "$python" -m pytest -q -p no:cacheprovider -W default \
    tests/optim/test_optim_cuda.py 2>&1 | tee "$out/tests.log" | tail -n 25

timeout "${PROFILE_LIMIT:-60}" "$python" scripts/profile_steps.py --device "${DEVICE:-cuda}" \
    --names "${PROFILED:-NAdam,RMSprop,Lion,Adam,AdamW warm-up + cosine}" 2>&1 | grep -v "^USDT" >"$out/profile.log"
echo "profile: exit ${PIPESTATUS[0]}"

# name | sections | optimizers | seconds allowed: a group that overruns or fails
# leaves the others' results
groups=(
    "fused|optim-scale|Adam,AdamW,SGD momentum,Adagrad,AdamW warm-up + cosine,nanoGPT recipe|150"
    "small|optim|SGD momentum,Adam,AdamW,RMSprop,Adagrad,Adafactor,NAdam,RAdam,Adamax,Adadelta,Rprop,ASGD,Lion|100"
    "lbfgs|optim,optim-scale|LBFGS|150"
    "others|optim-scale|RMSprop,Adafactor,NAdam,RAdam,Adamax,Adadelta,Rprop,ASGD,Lion|100"
    "muon|optim,optim-scale|Muon|180"
)
for group in "${groups[@]}"; do
    IFS="|" read -r name sections picked limit <<<"$group"
    [[ " ${ONLY:-fused small lbfgs others muon} " == *" $name "* ]] || continue
    timeout "$limit" "$python" -m benchmarks --only "$sections" --device "${DEVICE:-cuda}" \
        --no-compile --rounds "${ROUNDS:-15}" --optimizers "$picked" \
        --out "$out/$name" >"$out/$name.log" 2>&1
    echo "$name ($sections): exit $?"
    grep -h "^| .*within\|^| .*as fast" "$out/$name/results.md" 2>/dev/null
done
tar czf "$out.tgz" -C "$out" . && mv "$out.tgz" "$out/gpu-check.tgz"
