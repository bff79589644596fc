"""Spec statements beyond the core set in :mod:`graphcost.spec_builder`, one module per
family of constructs. Every module here is imported (and so registered) on first use."""
from __future__ import annotations

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
