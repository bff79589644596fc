"""graphcost: what one llama.cpp step costs, from a GGUF header alone.

Data flows one way: GGUF header (:mod:`gguf_reader`) -> model metadata (:mod:`model`)
-> graph (:mod:`build`, :mod:`spec_builder` over `specs/arch/*.yaml`) -> costs (:mod:`costs`, :mod:`analysis`) -> reports
(:mod:`report`).
"""
__version__ = "0.1.0"
