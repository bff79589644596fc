"""Per-architecture graph builders, one module each, registered by GGUF architecture name."""
from __future__ import annotations

from typing import Callable

from ..llm_graph import LlmGraph
from . import gemma3, llama

#: GGUF ``general.architecture`` -> builder; adding a family means adding an entry here.
BUILDERS: dict[str, Callable[[LlmGraph], None]] = {
    "llama": llama.build,
    "gemma3": gemma3.build,
}

SUPPORTED = tuple(sorted(BUILDERS))
