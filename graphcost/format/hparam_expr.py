"""The hyperparameter expressions of architecture specs (``1/sqrt(head_dim)``,
``a if n_layer == 62 else b``, ``(il + 1) % step == 0``): a small safe evaluator over
:mod:`ast`, shared by the header reader (:mod:`graphcost.format.model`: per-layer flags
such as sliding-window patterns) and the spec interpreter (:mod:`graphcost.graph`).
"""
from __future__ import annotations

import ast
import math
import operator
from typing import Any

from graphcost.errors import GraphcostError

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Pow: operator.pow, ast.Mod: operator.mod}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.Gt: operator.gt,
        ast.LtE: operator.le, ast.GtE: operator.ge}
_FUNCS = {"sqrt": math.sqrt}


def evaluate(expr: Any, names: dict[str, float], where: str) -> float:
    """A number, or an arithmetic expression over hyperparameter names (``1/sqrt(head_dim)``,
    ``a if n_layer == 62 else b``, ``(il + 1) % step == 0``, ``is_swa or n_swa == 0``). No other
    Python is accepted."""
    if isinstance(expr, (int, float)) and not isinstance(expr, bool):
        return float(expr)
    try:
        tree = ast.parse(str(expr), mode="eval")
    except SyntaxError:
        raise GraphcostError(f"{where}: cannot parse expression {expr!r}") from None

    def ev(n: ast.AST) -> float:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in names:
                raise GraphcostError(f"{where}: unknown name {n.id!r} in {expr!r}")
            return names[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
            return _BIN[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return float(not ev(n.operand))
        if isinstance(n, ast.BoolOp):  # and / or, over truth values (non-zero is true)
            vals = [bool(ev(v)) for v in n.values]
            return float(all(vals) if isinstance(n.op, ast.And) else any(vals))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _FUNCS \
                and len(n.args) == 1:
            return _FUNCS[n.func.id](ev(n.args[0]))
        if isinstance(n, ast.IfExp):
            return ev(n.body) if ev(n.test) else ev(n.orelse)
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMP:
            return _CMP[type(n.ops[0])](ev(n.left), ev(n.comparators[0]))
        raise GraphcostError(f"{where}: unsupported expression {expr!r}")

    try:
        return float(ev(tree))
    except ZeroDivisionError:
        raise GraphcostError(f"{where}: {expr!r} divides by zero with this model's "
                             f"hyperparameters") from None
