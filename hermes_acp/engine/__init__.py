"""The synchronous agent engine; it never imports Twisted.

``agent`` runs the turn loop (``AIAgent``), ``model`` streams from an
OpenAI-compatible endpoint, ``guard`` and ``edits`` decide what needs the
user's approval, ``workspace`` is the seam for file and command I/O, and
``tools`` holds the tools the model can call.
"""
