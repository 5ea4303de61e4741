"""One-off diagnosis: answers of chosen BFCL items under calibration drop probes, at full KV otherwise.

Starts a full-KV server (4 layer groups, ``--kv-decode keep``, radix cache off) and sends every item
once per probe (``custom_params.pask_probe``, as ``python -m sglang_pask.calibrate`` does), greedy,
with the harness's loose EBNF grammar; prints item, dropped role, AST verdict and answer. Usage::

    .venv/bin/python bench/results/pask_failure_diagnosis_calib76_2026-12-02/drop_probes.py IDS_FILE PROBES_JSON
"""
import sys, json, tempfile
from pathlib import Path
sys.path.insert(0, '/work/main')
import requests
from transformers import AutoTokenizer
from sglang_pask.bfcl.checker import check
from sglang_pask.bfcl.data import AST_CATEGORIES, load_items
from sglang_pask.bfcl.constraints import answer_constraint
from sglang_pask.bfcl.prompt import build_messages
from sglang_pask.default_model import ensure_default_model
from sglang_pask.server_process import ServerProcess
ids = [l.strip() for l in open(sys.argv[1]) if l.strip()]
probes = json.loads(sys.argv[2])
model = str(ensure_default_model())
tok = AutoTokenizer.from_pretrained(model)
items = {it.id: it for it in load_items(AST_CATEGORIES) if it.id in set(ids)}
flags = ["--model-path", model, "--kv-policy", "full", "--kv-layer-groups", "4", "--kv-decode", "keep", "--disable-radix-cache"]
with ServerProcess(flags, Path(tempfile.mkdtemp()) / "log") as server:
    server.wait_ready(timeout_s=900)
    for pid in ids:
        it = items[pid]
        prompt = tok.apply_chat_template(build_messages(it), tokenize=False, add_generation_prompt=True)
        for probe in probes:
            sp = {"temperature": 0, "max_new_tokens": 128, **answer_constraint(it, "ebnf")}
            if probe: sp["custom_params"] = {"pask_probe": probe}
            r = requests.post(f"{server.url}/generate", json={"text": prompt, "sampling_params": sp}, timeout=600).json()
            print(pid, probe.get("drop_role", "none") if probe else "none", check(it, r["text"]).valid, r["text"][:110], flush=True)
