"""Spec statements, one module per family of constructs (:mod:`.core`: those most
architectures use). Every module here is imported, and so registers its statements in
:data:`graphcost.graph.spec_builder.STATEMENTS`, when this package is imported."""
from __future__ import annotations

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
