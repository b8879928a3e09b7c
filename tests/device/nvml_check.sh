#!/usr/bin/env bash
# One-off check of the NVML exporter against a real NVIDIA GPU. Run from the repository root:
#     bash tests/device/nvml_check.sh
# It starts exporters/nvml_exporter.py for ~$SECS seconds on 127.0.0.1:$PORT, reads /metrics
# twice (GPM ratios need two samples), prints a summary of the exposition and copies
# everything to $OUT (default: a temp dir). Dependencies (nvidia-ml-py, prometheus-client):
# used if importable; else unzipped from tests/device/wheels/*.whl (or $WHEELS_DIR; fill it
# with `pip download --no-deps nvidia-ml-py prometheus-client -d tests/device/wheels`); else
# pip-installed into a temp dir. Needs only python3 (>= 3.8) and no network when wheels are there.
set -u
OUT=${OUT:-$(mktemp -d)}
PORT=${PORT:-19412}
SECS=${SECS:-20}
PY=${PYTHON:-python3}
WHEELS=${WHEELS_DIR:-tests/device/wheels}
TMP=$(mktemp -d)
mkdir -p "$OUT"
exec > >(tee "$OUT/nvml_check.txt") 2>&1

echo "== machine"; uname -a; $PY --version
command -v nvidia-smi >/dev/null && nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,power.draw,temperature.gpu,utilization.gpu --format=csv

echo "== dependencies"
if $PY -c "import pynvml, prometheus_client" 2>/dev/null; then
  echo "already importable"
else
  mkdir -p "$TMP/py"
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    for w in "$WHEELS"/*.whl; do $PY -m zipfile -e "$w" "$TMP/py" && echo "unzipped $(basename "$w")"; done
  else
    $PY -m pip install -q --target "$TMP/py" nvidia-ml-py prometheus-client || echo "pip install failed"
  fi
fi
export PYTHONPATH="$TMP/py:$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import pynvml, prometheus_client; print('pynvml', getattr(pynvml, '__version__', '?'))" || { echo "FAIL: dependencies"; exit 1; }

echo "== exporter (port $PORT, ${SECS}s)"
$PY - "$PORT" > "$OUT/exporter.log" 2>&1 <<'PYEOF' &
import logging, sys, threading
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
from exporters.nvml_exporter import NvmlUnavailable, serve
try:
    serve(int(sys.argv[1]), "127.0.0.1", None, threading.Event())
except NvmlUnavailable as exc:
    print("NO GPU:", exc); sys.exit(2)
PYEOF
PID=$!

fetch() {  # $1 = output file
  $PY - "$PORT" "$1" <<'PYEOF'
import sys, time, urllib.request
for _ in range(50):
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read()
        open(sys.argv[2], "wb").write(body); sys.exit(0)
    except Exception as exc:  # not up yet
        err = exc; time.sleep(0.2)
print("fetch failed:", err); sys.exit(1)
PYEOF
}
sleep 3
fetch "$OUT/metrics1.txt"; RC1=$?
sleep $((SECS > 5 ? SECS - 5 : 2))
fetch "$OUT/metrics2.txt"; RC2=$?
kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; EXP_RC=$?
echo "exporter exit status after SIGTERM: $EXP_RC (fetches: $RC1 $RC2)"
echo "== exporter log"; cat "$OUT/exporter.log"

echo "== summary of the second scrape"
$PY - "$OUT/metrics2.txt" <<'PYEOF' | tee "$OUT/summary.txt"
import os, sys
from prometheus_client.parser import text_string_to_metric_families
if not os.path.exists(sys.argv[1]):
    print("RESULT: FAIL (no /metrics could be read; see the exporter log above)"); sys.exit(1)
fams = list(text_string_to_metric_families(open(sys.argv[1]).read()))
dcgm = [f for f in fams if f.name.startswith("DCGM")]
print(f"{len(dcgm)} DCGM families, {sum(len(f.samples) for f in dcgm)} samples")
for f in dcgm:
    s0 = [s for s in f.samples if s.labels.get("gpu") == "0"]
    vals = ", ".join(f"{s.value:g}" + (f" (xid {s.labels['xid']})" if "xid" in s.labels else "") for s in s0[:3])
    print(f"  {f.name:45s} gpus={len(f.samples):2d} gpu0={vals}")
if dcgm and dcgm[0].samples:
    print("labels of gpu 0:", {k: v for k, v in dcgm[0].samples[0].labels.items()})
missing = [n for n in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
                       "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS") if n not in {f.name for f in fams}]
gpm = [f.name for f in fams if f.name.startswith("DCGM_FI_PROF_")]
print("GPM (Hopper+) families:", gpm or "none")
cpu = [s for f in fams if f.name == "goodput_gpu_process_cpu_seconds" for s in f.samples]
print("host CPU of the GPUs' processes:", {s.labels["gpu"]: s.value for s in cpu} or
      "none (no process held a GPU, or none was visible in this PID namespace)")
print("RESULT:", "OK" if dcgm and not missing else f"MISSING {missing}")
PYEOF
echo "outputs in $OUT"
