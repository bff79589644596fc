"""graphcost's executor and llama.cpp on the same tokens (graphcost/judge/oracle.py
``run_model``, cb_eval): a prompt then one-token decodes, the logits of every step and the
nodes captured at the prompt step, compared in one place for the per-family numerics tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphcost.execute.executor import Executor
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import run_model

F32 = np.float32


def rel_l2(ours: np.ndarray, theirs: np.ndarray) -> float:
    """||ours - theirs|| / ||theirs|| (L2 over every element)."""
    return float(np.linalg.norm(ours - theirs) / np.linalg.norm(theirs))


@dataclass
class Compared:
    #: per step: max |logit difference| of the last token over llama.cpp's max |logit|
    errs: list[float]
    #: per node captured at the prompt step: its worst relative L2 (:func:`rel_l2`)
    nodes: dict[str, float]
    #: our executor after the steps (its KV cache and recurrent state)
    executor: Executor


def compare_steps(path, ids: list[int], n_prompt: int, nodes: list[str], *, fa: bool,
                  n_ctx: int) -> Compared:
    """Run ``ids[:n_prompt]`` as one prompt, then each further token as a decode step, on
    llama.cpp and on graphcost's executor (``numerics="ggml"``) with the same context
    settings, capturing ``nodes`` at the prompt step; every captured record must be the
    node of the same index and name in our graph."""
    theirs = run_model(path, prompt=ids[:n_prompt], decode=ids[n_prompt:], flash_attn=fa,
                       n_ctx=n_ctx, capture=nodes, capture_steps=[0])
    ex = Executor(path, RunSettings(ctx_size=n_ctx, flash_attn="on" if fa else "off"),
                  numerics="ggml")
    ours = [ex.step(ids[:n_prompt], capture=nodes)] + [ex.step([t]) for t in ids[n_prompt:]]
    assert len(ours) == len(theirs["logits"]) == 1 + len(ids) - n_prompt
    errs = [float(np.abs(o.logits[-1] - t).max() / np.abs(t).max())
            for o, t in zip(ours, theirs["logits"])]
    worst: dict[str, float] = {}
    for rec in theirs["captures"][0]:
        mine = np.asarray(ours[0].captured[rec["index"]], F32).reshape(rec["value"].shape)
        assert ours[0].graph.nodes[rec["index"]].name == rec["name"]
        worst[rec["name"]] = max(worst.get(rec["name"], 0.0), rel_l2(mine, rec["value"]))
    return Compared(errs, worst, ex)


def profile_steps(path, out, greedy: int) -> list[dict]:
    """``graphcost profile`` run as a command (ggml numerics, one timed repeat, the
    raspberry-pi-5 profile, ``-c 256``) on the prompt 3, 10, 17, 24 and ``greedy`` greedy
    tokens, its JSON written to ``out``: the steps, each with its timed nodes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([sys.executable, "-m", "graphcost", "profile", str(path),
                        "--token-ids", "3,10,17,24", "--greedy", str(greedy), "--repeat", "1",
                        "--numerics", "ggml", "--hardware", "raspberry-pi-5", "-c", "256",
                        "-f", "json", "-o", str(out)],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(Path(out).read_text())["steps"]
