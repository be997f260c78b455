#!/usr/bin/env bash
# Wheels that install DeepSpeed on a GPU machine that cannot reach a package index.
#
#   scripts/build_deepspeed_wheel.sh DIR [PYTHON]
#
# DeepSpeed's release on PyPI is a source archive. Built with DS_BUILD_OPS=0 it becomes a
# pure-Python wheel: its C++/CUDA ops are compiled on first use, and project02's use of it
# (ZeRO-3 with torch's AdamW as the client optimizer) compiles none. Beside it go the wheels of
# what DeepSpeed imports that a CUDA + PyTorch image commonly lacks (pydantic and its parts,
# hjson) or may lack (einops, msgpack, py-cpuinfo), for CPython 3.12 on x86-64 Linux. Left out
# on purpose: torch, numpy, packaging, psutil, tqdm and ninja (an image with PyTorch has them;
# a second numpy beside torch's is a hazard) and nvidia-ml-py (a dependency of this project).
#
# Versions: those installed in PYTHON's environment (default: the project's .venv, else
# python3), so the GPU machine runs what the tests here ran; pydantic-core at exactly the version
# that pydantic pins. A package that already has a wheel in DIR is kept, not downloaded again:
# one version of each, or `pip install DIR/*.whl` refuses the set. At the end every wheel's
# requirements are checked against the other wheels in DIR.
#
# On the GPU machine (Python 3.12, PyTorch installed):
#   python3 -m pip install --no-index --no-deps --target SITE DIR/*.whl
#   export PYTHONPATH=SITE
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" == -* ]]; then
  echo "usage: $0 DIR [PYTHON]   (DIR: where the wheels go; PYTHON: the environment whose versions to use)" >&2
  exit 2
fi
DIR=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${2:-}
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

# The installed version of a distribution in PY's environment (empty when not installed).
installed() {
  "$PY" - "$1" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print(version(sys.argv[1]))
except PackageNotFoundError:
    print("")
EOF
}

# The wheel(s) of distribution $1 already in DIR, by file name (wheel names spell the name in
# lower case with '_' for '-' and '.'); nothing when there is none.
existing() {
  local stem
  stem=$(echo "$1" | tr 'A-Z.-' 'a-z__')
  (cd "$DIR" && compgen -G "${stem}-*.whl") || true
}

pin() {  # NAME -> NAME==VERSION (the environment's), or NAME alone when it is not installed
  local v
  v=$(installed "$1")
  if [[ -n "$v" ]]; then echo "$1==$v"; else echo "$1"; fi
}

# 1. DeepSpeed itself, built from its source archive without ops.
DS=$(pin deepspeed)
if [[ -n "$(existing deepspeed)" ]]; then
  echo "kept: $(existing deepspeed)"
else
  echo "building $DS (DS_BUILD_OPS=0: pure Python)"
  # The build imports torch (for its version table), hence no build isolation: PY's torch.
  DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-cache-dir --no-deps --no-build-isolation \
    -w "$DIR" "$DS"
fi

# 2. What it needs at run time that the image may lack, as CPython 3.12 manylinux wheels.
PYDANTIC=$(pin pydantic)
CORE=$("$PY" - <<'EOF'
from importlib.metadata import PackageNotFoundError, requires
try:
    pins = [r.split(";")[0].replace(" ", "") for r in requires("pydantic") or []]
    print(next((p for p in pins if p.startswith("pydantic-core==")), "pydantic-core"))
except PackageNotFoundError:
    print("pydantic-core")
EOF
)
DEPS=("$PYDANTIC" "$CORE" "$(pin annotated-types)" "$(pin typing-inspection)"
      "$(pin typing-extensions)" "$(pin hjson)" "$(pin einops)" "$(pin msgpack)" "$(pin py-cpuinfo)")
for req in "${DEPS[@]}"; do
  name=${req%%==*}
  if [[ -n "$(existing "$name")" ]]; then
    echo "kept: $(existing "$name")"
    continue
  fi
  echo "downloading $req"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" "$req"
done

# 3. One wheel per distribution, and each requirement between the wheels here satisfied.
"$PY" - "$DIR" <<'EOF'
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

folder = Path(sys.argv[1])
wheels = {}
for whl in sorted(folder.glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(whl.name)
    if name in wheels:
        sys.exit(f"two wheels of {name} in {folder}: {wheels[name][1].name} and {whl.name}")
    wheels[name] = (version, whl)
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
bad = []
for name, (version, whl) in wheels.items():
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(z.read(meta).decode())
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        dep = canonicalize_name(req.name)
        if dep in wheels and not req.specifier.contains(wheels[dep][0], prereleases=True):
            bad.append(f"{name} {version} needs {req}, {folder.name} has {wheels[dep][0]}")
if bad:
    sys.exit("\n".join(bad))
total = sum(w.stat().st_size for _, w in wheels.values())
for name, (version, whl) in sorted(wheels.items()):
    print(f"{whl.stat().st_size / 2**20:8.2f} MiB  {whl.name}")
print(f"{total / 2**20:8.2f} MiB  in all, {len(wheels)} wheels, one per distribution")
EOF
