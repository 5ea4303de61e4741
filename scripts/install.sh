#!/usr/bin/env bash
# Install sglang-pask and what it needs into a virtual environment (default: .venv).
#
#   scripts/install.sh serve   # the server: SGLang 0.5.23 + this package
#   scripts/install.sh test    # the server, plus pytest, the BFCL data/checker and bench tools
#
# The hardware decides the SGLang install: with an NVIDIA GPU (nvidia-smi works) the full SGLang
# dependency set (`pip install -e .[gpu]`: CUDA torch, flashinfer, sgl-kernel); without one, the
# minimal CPU recipe (CPU torch, sglang --no-deps plus the modules it really imports; see
# requirements/cpu.txt). Force one with SGLANG_PASK_DEVICE=cpu|gpu.
# Re-running is cheap: a stamp of the requirement files skips what is already installed.
set -euo pipefail

what="${1:-serve}"
case "$what" in serve|test) ;; *) echo "usage: $0 serve|test" >&2; exit 2;; esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${SGLANG_PASK_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

device="${SGLANG_PASK_DEVICE:-}"
if [ -z "$device" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=gpu; else device=cpu; fi
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "[install] creating virtual environment $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --progress-bar on)

files=(pyproject.toml requirements/cpu.txt requirements/cpu-nodeps.txt)
[ "$what" = test ] && files+=(requirements/test.txt requirements/bench.txt requirements/bench-nodeps.txt requirements/bfcl-nodeps.txt)
stamp="$venv/.sglang_pask-$what-$device"
digest="$(cat "${files[@]}" 2>/dev/null | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  echo "[install] $what ($device) already installed in $venv"
  exit 0
fi

echo "[install] installing for $device into $venv"
if [ "$device" = cpu ]; then
  "${pip[@]}" -r requirements/cpu.txt
  "${pip[@]}" --no-deps -r requirements/cpu-nodeps.txt
  "${pip[@]}" --no-deps -e .
else
  "${pip[@]}" -e ".[gpu]"
fi

# Every SGLang process (the scheduler is spawned) must see the CPU stand-ins before sglang imports
# sgl_kernel or torchvision: a .pth file runs at interpreter start. On a GPU machine it finds the real
# modules and does nothing else.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import sglang_pask.compat.standins as _s; _s.install()" > "$site/sglang_pask_standins.pth"

if [ "$what" = test ]; then
  "${pip[@]}" -r requirements/test.txt
  [ -f requirements/bench.txt ] && "${pip[@]}" -r requirements/bench.txt
  [ -f requirements/bench-nodeps.txt ] && "${pip[@]}" --no-deps -r requirements/bench-nodeps.txt
  [ -f requirements/bfcl-nodeps.txt ] && "${pip[@]}" --no-deps -r requirements/bfcl-nodeps.txt
fi
echo "$digest" > "$stamp"
echo "[install] done"
