#!/usr/bin/env bash
# Device diagnosis still to do (issue: the GPU run). Built ON the device (GCC 13.3, torch 2.11+cu130,
# Python 3.12), the extension died with SIGSEGV on every C++ exception it threw, CPU ops included;
# the same sources built with GCC 12 (scripts/build_gpu_extension.sh) ran there with no crash. This
# builds on the device (sm_90 only: about a minute since CMakeLists drops torch's own -gencode
# list), raises one error, and keeps a native backtrace (cuda-gdb; the image has no gdb) and the
# facts an unwinder depends on. Device call: bash scripts/gpu_diag_throw.sh (timeout_s=300).
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-220} STAGES=build bash scripts/gpu_run.sh
D="$OUT/diag.log"
cat > /tmp/t_ours.py <<'PY'
import torch, specdecode
p = torch.rand(2, 4, 7); q = torch.rand(2, 3, 7)
try:
    torch.ops.specdecode.verify_probs(p, q, torch.zeros(2, 3, dtype=torch.long), torch.full((2,), 3), torch.rand(2, 4), "nope", [])
except Exception as e:
    print("ours raised", type(e).__name__, str(e)[:80])
PY
echo "== t_ours" >> "$D"; timeout 60 python3 /tmp/t_ours.py >> "$D" 2>&1; echo "rc=$?" >> "$D"
SO=$(python3 -c "import specdecode._C as c; print(c.__file__)" 2>/dev/null)
{ echo "== $SO"; ldd "$SO"; readelf -lW "$SO" | grep -i eh_frame; readelf -SW "$SO" | grep -E "eh_frame|gcc_except";
  readelf -dW "$SO" | grep -E "NEEDED|RUNPATH"; nm -D --undefined-only "$SO" | grep -i -E "unwind|cxa_throw";
  gcc --version | head -1; ld --version | head -1; nvcc --version | tail -1; } >> "$D" 2>&1
timeout 90 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt -ex "x/4i \$pc" --args python3 /tmp/t_ours.py \
  > "$OUT/gdb.log" 2>&1
grep -E "^#|SIG" "$OUT/gdb.log" | head -40; cat "$D"
