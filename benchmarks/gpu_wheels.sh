#!/usr/bin/env bash
# Prepare what benchmarks/gpu_checks.sh needs on a GPU machine that has Python 3.12, torch, pytest and the
# scientific stack but no network and no Ray (the lent GPU machine): Ray's wheel for
# cp312, repacked without what tunekit never loads (its Java jars, RLlib, Serve, LLM, the dashboard's source
# maps: 76 MB -> 26 MB as .tar.xz, under the device's 64 MiB), and the wheels Ray and tunekit need beside it.
#
#     bash benchmarks/gpu_wheels.sh [DIR]      # here, with network; DIR defaults to .whl (ignored by git)
#
# Then, on the machine, from the repository root:
#     mkdir -p /tmp/site && tar xJf .whl/ray.tar.xz -C /tmp/site
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
#     bash benchmarks/gpu_checks.sh
set -euo pipefail
out=${1:-.whl}
ray_version=$(python3 -c "import ray; print(ray.__version__)")
platform=(--python-version 3.12 --implementation cp --only-binary=:all:
          --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
python3 -m pip download -q "${platform[@]}" --no-deps -d "$work" "ray==$ray_version"
(cd "$work" && unzip -q ray-*.whl && rm -rf ray-*.whl ray/jars ray/rllib ray/llm ray/serve \
    ray/dashboard/client/build/static/js/*.map && tar cf - ray ray-*.dist-info | xz -9 -T0 > ray.tar.xz)
mv "$work/ray.tar.xz" "$out/"
# Ray's own needs the image lacks (Train V2 needs pydantic: with its own needs, versions that fit), and tunekit's
python3 -m pip download -q "${platform[@]}" --no-deps -d "$out" jsonschema jsonschema-specifications referencing rpds-py \
    tensorboardX orjson
python3 -m pip download -q "${platform[@]}" -d "$out" pydantic
du -sh "$out"
