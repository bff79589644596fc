"""The analysis as plain data (dicts, lists, ints, strs): the JSON/YAML document.

A data contract, not a renderer: ``analyze --format json|yaml`` print it and ``check``
reads it back. :data:`SCHEMA` versions it and the profile document
(graphcost.report.profile); it is bumped whenever a field changes meaning or is removed.
"""
from __future__ import annotations

import json
import math

from graphcost.cost.analysis import Analysis
from graphcost.errors import GraphcostError
from graphcost.cost.experts import expert_weights
from graphcost.format.ggml_types import type_name

SCHEMA = 1


def node_dict(nc, live: int | None = None) -> dict:
    n = nc.node
    d = {
        "index": nc.index,
        "name": n.name,
        "op": n.op,
        "type": type_name(n.type),
        "ne": list(n.ne),
        "nbytes": 0 if n.is_view else n.nbytes,
        "view": n.is_view,
        "src": [s.name for s in n.src],
        "layer": n.layer,
        "block": n.block,
        "cost": nc.cost.to_dict() if nc.cost is not None else None,
        "live_bytes": live,
    }
    return d


def _rollup(items) -> list[dict]:
    return [{"key": k, **c.to_dict()} for k, c in items]


def document(a: Analysis, hardware=None, cpu_features=None) -> dict:
    """Everything ``analyze --format json|yaml`` writes, in a stable order; with a
    hardware profile (``--hardware``) also ``roofline`` and each node's
    ``roofline_seconds`` (graphcost.cost.roofline), and ``llama_cpp_cpu``, the step on
    llama.cpp's CPU backend (weights placed with ``cpu_features``: see
    graphcost.cost.speed_model.step_estimate)."""
    bg = a.graph
    m = bg.model
    run = bg.run
    layers = sorted((k for k in a.by_layer if k is not None))
    by_layer = [{"layer": k, **a.by_layer[k].to_dict()} for k in layers]
    if None in a.by_layer:
        by_layer.append({"layer": None, **a.by_layer[None].to_dict()})
    mem = a.require_memory()
    step = mem.step
    doc = {
        "schema": SCHEMA,
        "model": {
            "path": str(m.header.path),
            "name": m.name,
            "architecture": m.arch,
            "n_layer": m.n_layer,
            "n_embd": m.n_embd,
            "n_head": list(m.n_head) if len(set(m.n_head)) > 1 else m.n_head[0],
            "n_head_kv": list(m.n_head_kv) if len(set(m.n_head_kv)) > 1 else m.n_head_kv[0],
            "head_dim": m.head_dim_k,
            "n_ff": list(m.n_ff) if len(set(m.n_ff)) > 1 else m.n_ff[0],
            "n_vocab": m.n_vocab,
            "n_ctx_train": m.n_ctx_train,
            "sliding_window": m.n_swa,
            "weights_bytes": m.weights_bytes,
            "n_params": m.n_params,
            "n_tensors": len(m.tensors),
            "has_tensor_data": m.header.has_data,
            "shards": len(m.header.shards),
        },
        "run": run.to_dict(),
        "notes": list(run.notes) + ([m.header.data_note] if m.header.data_note else []),
        "totals": {"nodes": len(a.nodes), **a.total.to_dict()},
        "by_op": _rollup(sorted(a.by_op.items(), key=lambda kv: -kv[1].flops)),
        "by_layer": by_layer,
        "by_block": _rollup(sorted(a.by_block.items())),
        "memory": {
            "weights_bytes": m.weights_bytes,
            "kv_cache_bytes": a.kv_cache_bytes,
            "kv_caches": [
                {"name": c.name, "cells": c.size, "streams": c.n_stream, "n_kv": c.n_kv,
                 "layers": len(c.layers),
                 "type_k": type_name(run.type_k), "type_v": type_name(run.type_v),
                 "bytes": c.bytes()}
                for c in bg.caches
            ],
            # recurrent/hybrid models: llama_memory_recurrent's R and S buffers (F32)
            "recurrent_state_bytes": a.recurrent_state_bytes,
            "recurrent_states": [
                {"cells": st.size, "layers": len(st.layers), "r_bytes": r.r_bytes,
                 "s_bytes": r.s_bytes, "bytes": r.bytes}
                for st, r in zip(bg.states, mem.states)
            ],
            # start-up buffers llama.cpp allocates for these settings (graphcost.memory.plan)
            "compute_buffer_bytes": mem.compute_buffer_bytes,
            "output_buffer_bytes": mem.output_buffer_bytes,
            "reserve_graphs": [
                {"graph": r.label, "n_tokens": r.n_tokens, "n_outputs": r.n_outputs,
                 "buffer_bytes": r.alloc.buffer_bytes, "peak_live_bytes": r.alloc.peak_bytes,
                 "peak_node": {"index": r.alloc.peak_index, "name": r.peak_node.name}}
                for r in mem.reserves
            ],
            # this graph's nodes: bytes live in the compute buffer (nodes[].live_bytes)
            "peak_live_bytes": step.peak_bytes,
            "peak_node": {"index": step.peak_index, "name": bg.nodes[step.peak_index].name},
            # the tensors holding those bytes (aligned block sizes), largest first
            "peak_tensors": [{"name": t.name, "op": t.op, "bytes": n}
                             for t, n in step.peak_tensors],
        },
        # mixture of experts: expert weights in total, per token, read (null when dense)
        "experts": _experts(a),
        "unmodelled": [{"index": nc.index, "name": nc.node.name, "op": nc.node.op,
                        "reason": nc.why}
                       for nc in a.unmodelled],
        "nodes": [node_dict(nc, live) for nc, live in zip(a.nodes, step.live)],
    }
    if a.schedule is not None:
        # analyze --device: the backend scheduler's splits, the bytes copied between
        # devices in this step, and each node's device (graphcost.memory.sched)
        from graphcost.memory.sched import schedule_dict
        doc["devices"] = schedule_dict(a.schedule)
        for nd, i in zip(doc["nodes"], range(len(doc["nodes"]))):
            nd["device"] = a.schedule.device_of(i)
    if hardware is not None:
        from graphcost.cost.roofline import estimate
        est = estimate(a, hardware)
        doc["roofline"] = est.to_dict(run.n_tokens)
        from graphcost.cost.speed_model import step_estimate
        doc["llama_cpp_cpu"] = step_estimate(a, hardware, features=cpu_features)
        for nd, sec in zip(doc["nodes"], est.per_node):
            nd["roofline_seconds"] = sec
    return doc


def _experts(a: Analysis) -> dict | None:
    ew = expert_weights(a)
    return None if ew is None else ew.to_dict()


def memory_document(plan, sweep: tuple[str, list[int], list] | None = None) -> dict:
    """``graphcost memory`` as plain data (the HTML report's): the start-up breakdown,
    each reserve graph with its live bytes per node, the tensors live at the peak, and
    the sweep rows when ``sweep`` = (key, values, plans) is given. Bytes throughout."""
    from graphcost.report.memory import describe_tensor
    m, run = plan.model, plan.run
    w = plan.worst
    doc = {
        "schema": SCHEMA,
        "model": {"path": str(m.header.path), "name": m.name, "architecture": m.arch,
                  "n_layer": m.n_layer, "weights_bytes": m.weights_bytes},
        "run": run.to_dict(),
        "breakdown": {
            "weights_bytes": plan.weights_bytes,
            "kv_caches": [{"name": c.name, "cells": c.cells, "streams": c.streams,
                           "layers": c.layers,
                           "type_k": c.type_k, "type_v": c.type_v, "k_bytes": c.k_bytes,
                           "v_bytes": c.v_bytes, "bytes": c.bytes} for c in plan.caches],
            "kv_cache_bytes": plan.kv_cache_bytes,
            # recurrent/hybrid models: llama_memory_recurrent's R and S buffers (F32)
            "recurrent_states": [{"cells": s.cells, "layers": s.layers, "r_bytes": s.r_bytes,
                                  "s_bytes": s.s_bytes, "bytes": s.bytes} for s in plan.states],
            "recurrent_state_bytes": plan.recurrent_state_bytes,
            "compute_buffer_bytes": plan.compute_buffer_bytes,
            "output_buffer_bytes": plan.output_buffer_bytes,
            "total_bytes": plan.total_bytes,
        },
        "reserve_graphs": [
            {"graph": r.label, "n_tokens": r.n_tokens, "n_outputs": r.n_outputs,
             "buffer_bytes": r.alloc.buffer_bytes, "peak_live_bytes": r.alloc.peak_bytes,
             "peak_node": {"index": r.alloc.peak_index, "name": r.peak_node.name},
             "nodes": [{"index": i, "name": n.name, "op": n.op, "live_bytes": live}
                       for i, (n, live) in enumerate(zip(r.graph.nodes, r.alloc.live))]}
            for r in plan.reserves],
        "worst_graph": w.label,
        "peak_tensors": [{"name": t.name, "op": t.op, "ne": list(t.ne), "type": type_name(t.type),
                          "bytes": n, "what": describe_tensor(t, run)}
                         for t, n in w.alloc.peak_tensors],
    }
    if sweep is not None:
        key, values, plans = sweep
        doc["sweep"] = {"key": key, "rows": [
            {key: v, "kv_cache_bytes": p.kv_cache_bytes,
             "compute_buffer_bytes": p.compute_buffer_bytes,
             "output_buffer_bytes": p.output_buffer_bytes, "total_bytes": p.total_bytes,
             "peak_tensor": (p.worst.alloc.peak_tensors[0][0].name
                             if p.worst.alloc.peak_tensors else None)}
            for v, p in zip(values, plans)]}
    return doc


def non_finite(doc, where: str = "") -> list[str]:
    """Dotted paths of the NaN/infinite floats in a plain-data document."""
    if isinstance(doc, float):
        return [] if math.isfinite(doc) else [where or "(document)"]
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in non_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(doc, (list, tuple)):
        return [p for i, v in enumerate(doc) for p in non_finite(v, f"{where}[{i}]")]
    return []


def to_json(doc: dict) -> str:
    """``doc`` as JSON; a NaN or infinity (not JSON: json.dumps would write ``NaN``) is an
    error naming the field."""
    bad = non_finite(doc)
    if bad:
        raise GraphcostError(f"the document holds a non-finite number at {bad[0]}"
                             f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}; "
                             "JSON cannot hold it")
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"
