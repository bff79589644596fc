"""Renderers: one class per ``--format``, all behind :class:`Renderer` (see ``formats``)."""
